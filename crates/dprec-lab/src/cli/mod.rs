//! The `dprec-lab` command line: evaluation and synthetic data.

use clap::{Parser, Subcommand};

pub mod eval;
pub mod synth;

/// dprec-lab: evaluate dprec's trainers offline and generate synthetic rating sets.
#[derive(Debug, Parser)]
#[command(name = "dprec-lab", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Cross-validate trainers: RMSE, MAE, ranking metrics and training time per fold,
    /// JSON and SVG output.
    Eval(Box<eval::EvalArgs>),
    /// Seeded synthetic ratings (low rank + biases + noise, power-law popularity) as a
    /// MovieLens-style CSV.
    Synth(synth::SynthArgs),
}

/// Entry point of the binary: parses arguments, runs the command, maps errors to exit codes.
pub fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Eval(args) => eval::run(*args),
        Command::Synth(args) => synth::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", dprec::cli::error_chain(&e));
            std::process::ExitCode::FAILURE
        }
    }
}
