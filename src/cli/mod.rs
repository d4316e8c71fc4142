//! The `dprec` command line.

use clap::{Parser, Subcommand};

pub mod accountant;
pub mod eval;
pub mod import;
pub mod openapi;
pub mod perturb;
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
    /// Client-side local DP: perturb a ratings file with the bounded Laplace mechanism and
    /// write the perturbed-rating JSON form (or `POST /v1/ratings` bodies).
    Perturb(perturb::PerturbArgs),
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
        Command::Perturb(args) => perturb::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
