//! `dprec openapi`: prints the OpenAPI document.

pub fn run() -> anyhow::Result<()> {
    print!("{}", crate::api::openapi::spec_json());
    Ok(())
}
