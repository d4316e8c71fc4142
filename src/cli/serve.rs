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
        let app = Application::build(settings, None, Hooks::default()).await?;
        log::info!("dprec listening on port {}", app.port());
        app.run_until_stopped().await?;
        Ok(())
    })
}
