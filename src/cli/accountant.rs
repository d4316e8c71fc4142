//! `dprec accountant`.

/// Arguments of `dprec accountant`.
#[derive(Debug, clap::Args)]
pub struct AccountantArgs {}

pub fn run(_args: AccountantArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
