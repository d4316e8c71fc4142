//! The `dprec` command line.

use clap::{Parser, Subcommand};

pub mod accountant;
pub mod import;
pub mod keys;
pub mod openapi;
pub mod perturb;
pub mod serve;

/// dprec: differentially private recommendations with an honest privacy ledger.
#[derive(Debug, Parser)]
#[command(name = "dprec", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the recommendation service (REST API, scheduler, ledger).
    Serve(serve::ServeArgs),
    /// Load MovieLens ratings into a running service through the batch endpoint.
    Import(import::ImportArgs),
    /// Manage the API keys stored in the database: create (printed once), list, revoke.
    Keys(keys::KeysArgs),
    /// Print the OpenAPI document of the service.
    Openapi,
    /// Renyi-DP accountant: RDP curve and (eps, delta) for mechanism parameters.
    Accountant(accountant::AccountantArgs),
    /// Client-side local DP: perturb a ratings file with the bounded Laplace mechanism and
    /// write the perturbed-rating JSON form (or `POST /v1/ratings` bodies).
    Perturb(perturb::PerturbArgs),
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

/// The error and its causes, `: `-separated, each cause printed once: many errors (sqlx,
/// std::io wrappers) repeat their source in their own message, which `{:#}` would print
/// twice.
pub fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if s.is_empty() || out.contains(&s) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&s);
    }
    out
}

/// Entry point of the binary: parses arguments, runs the command, maps errors to exit codes.
pub fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Accountant(args) => accountant::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Import(args) => import::run(args),
        Command::Openapi => openapi::run(),
        Command::Keys(args) => keys::run(args),
        Command::Perturb(args) => perturb::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error that repeats its source in its own message, like sqlx's.
    #[derive(Debug)]
    struct Wrapping(std::io::Error);

    impl std::fmt::Display for Wrapping {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "error communicating with database: {}", self.0)
        }
    }

    impl std::error::Error for Wrapping {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn os_errors_are_printed_once() {
        let io = std::io::Error::from_raw_os_error(111);
        let os = io.to_string();
        let e = anyhow::Error::new(Wrapping(io)).context("connecting to the postgres database");
        let text = error_chain(&e);
        assert_eq!(text.matches(&os).count(), 1, "{text}");
        assert!(
            text.starts_with("connecting to the postgres database: "),
            "{text}"
        );
        assert_eq!(error_chain(&anyhow::anyhow!("a").context("b")), "b: a");
    }
}
