//! `dprec serve`: runs the HTTP service.

use std::path::PathBuf;

use clap::Args;

use crate::config::{AuthMode, Settings};
use crate::release::Hooks;
use crate::startup::Application;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML configuration file (defaults apply without one; DPREC_* and DATABASE_URL
    /// environment variables override both).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Address to listen on (overrides server.bind).
    #[arg(long)]
    pub bind: Option<String>,
    /// Development mode without API keys (loopback addresses only).
    #[arg(long)]
    pub dev_no_auth: bool,
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let mut settings = if args.dev_no_auth {
        Settings::load_without_auth(args.config.as_deref())?
    } else {
        Settings::load(args.config.as_deref())?
    };
    if let Some(b) = args.bind {
        settings.server.bind = b;
    }
    debug_assert!(!args.dev_no_auth || settings.auth.mode == AuthMode::Disabled);
    // Training's parallel loops yield the CPU to requests (crate::lanes).
    crate::lanes::background_rayon_pool();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let app = Application::build(settings, None, fault_hooks()?).await?;
        log::info!("dprec listening on port {}", app.port());
        app.run_until_stopped().await?;
        Ok(())
    })
}

/// Crash tests' pause point (test `a_killed_tick_reuses_its_node_noise`): with
/// `DPREC_FAULT_PAUSE_BEFORE_COMMIT=SECS` every release logs `fault: paused before commit`
/// and waits SECS seconds right before its ledger commit (a continual tick: after its node
/// noise is stored), so that a test can kill -9 the process there. Unset: no hook.
fn fault_hooks() -> anyhow::Result<Hooks> {
    const VAR: &str = "DPREC_FAULT_PAUSE_BEFORE_COMMIT";
    let Ok(v) = std::env::var(VAR) else {
        return Ok(Hooks::default());
    };
    let secs: u64 = v
        .parse()
        .map_err(|_| anyhow::anyhow!("{VAR}={v:?}: expected whole seconds"))?;
    log::warn!("{VAR} is set: every release pauses {secs} s before its ledger commit");
    Ok(Hooks {
        before_commit: Some(std::sync::Arc::new(move || {
            log::warn!("fault: paused before commit");
            std::thread::sleep(std::time::Duration::from_secs(secs));
            Ok(())
        })),
        ..Hooks::default()
    })
}
