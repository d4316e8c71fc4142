//! The `dprec` command line.

use clap::{Parser, Subcommand};

pub mod accountant;
pub mod eval;
pub mod import;
pub mod openapi;
pub mod serve;
pub mod synth;

/// dprec: differentially private recommendations with an honest privacy ledger.
#[derive(Debug, Parser)]
#[command(name = "dprec", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Cross-validate trainers: RMSE, MAE and training time per fold, JSON and SVG output.
    Eval(Box<eval::EvalArgs>),
    /// Renyi-DP accountant: RDP curve and (eps, delta) for mechanism parameters.
    Accountant(accountant::AccountantArgs),
    /// Seeded synthetic ratings (low rank + biases + noise, power-law popularity) as a
    /// MovieLens-style CSV.
    Synth(synth::SynthArgs),
    /// Run the recommendation service (REST API, scheduler, ledger).
    Serve(serve::ServeArgs),
    /// Load MovieLens ratings into a running service through the batch endpoint.
    Import(import::ImportArgs),
    /// Print the OpenAPI document of the service.
    Openapi,
}

/// Fails with a message that says where a relative input path was looked for, when it
/// does not exist (a new user's most common first error).
pub fn require_input(path: &std::path::Path, what: &str) -> anyhow::Result<()> {
    if path.exists() {
        return Ok(());
    }
    let cwd = std::env::current_dir()
        .map(|d| d.display().to_string())
        .unwrap_or_else(|_| "?".into());
    let resolved = if path.is_absolute() {
        String::new()
    } else {
        format!(" (relative to the working directory {cwd})")
    };
    anyhow::bail!(
        "{what} {} does not exist{resolved}; pass the MovieLens directory or ratings file, \
         e.g. ../shared/datasets/ml-100k from the repository root",
        path.display()
    )
}

/// Creates the parent directory of an output file, if missing.
pub fn create_parent(path: &std::path::Path) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| anyhow::anyhow!("creating {}: {e}", dir.display()))?;
    }
    Ok(())
}

/// Entry point of the binary: parses arguments, runs the command, maps errors to exit codes.
pub fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Eval(args) => eval::run(*args),
        Command::Accountant(args) => accountant::run(args),
        Command::Synth(args) => synth::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Import(args) => import::run(args),
        Command::Openapi => openapi::run(),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
