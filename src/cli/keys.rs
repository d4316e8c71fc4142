//! `dprec keys`: API keys stored in the database (hashed), managed without the server,
//! so a lost admin key can always be replaced by whoever can reach the database.
//!
//! A key is shown once, when created; only its SHA-256 is stored. Its id is the first 12
//! hex digits of that digest (derived from the hash, not the key, so it can be printed).
//! Keys from the config file (`[[auth.keys]]`) are listed but managed in the file.
//! A running server picks up created and revoked keys within `scheduler.reload_secs`.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};

use crate::api::auth;
use crate::config::{Role, Settings};
use crate::store::Store;

/// Length of a key id (hex digits of the key's SHA-256).
pub const KEY_ID_LEN: usize = 12;

#[derive(Debug, Args)]
pub struct KeysArgs {
    /// TOML configuration file (its database.url; DATABASE_URL and DPREC_* override it).
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: KeysCommand,
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Create a key with a role and print it once.
    Create {
        /// admin, writer or reader.
        #[arg(long, value_parser = ["admin", "writer", "reader"])]
        role: String,
    },
    /// List the keys: id, role, creation time, where it comes from.
    List,
    /// Revoke a stored key by its id (as printed by `list` or `create`).
    Revoke {
        /// The key id (at least 6 hex digits of it).
        id: String,
    },
}

/// The id shown for a key hash.
pub fn key_id(hash: &str) -> &str {
    &hash[..KEY_ID_LEN.min(hash.len())]
}

fn role_name(r: Role) -> &'static str {
    match r {
        Role::Admin => "admin",
        Role::Writer => "writer",
        Role::Reader => "reader",
    }
}

fn time_utc(ms: i64) -> String {
    // Days since the epoch to a civil date (Howard Hinnant's algorithm).
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

pub fn run(args: KeysArgs) -> anyhow::Result<()> {
    let settings = Settings::load(args.config.as_deref())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let store = Store::connect(&settings.database.url, 1).await?;
        let out = match args.command {
            KeysCommand::Create { role } => create(&store, &role).await,
            KeysCommand::List => list(&store, &settings).await,
            KeysCommand::Revoke { id } => revoke(&store, &id).await,
        };
        store.close().await;
        out
    })
}

async fn create(store: &Store, role: &str) -> anyhow::Result<()> {
    let key = auth::generate_key();
    let hash = auth::hash_key(&key);
    store
        .insert_api_key(&hash, role)
        .await
        .context("storing the key")?;
    eprintln!(
        "created {role} key {} (shown once; only its SHA-256 is stored):",
        key_id(&hash)
    );
    println!("{key}");
    Ok(())
}

async fn list(store: &Store, settings: &Settings) -> anyhow::Result<()> {
    println!("{:<12}  {:<6}  {:<23}  source", "id", "role", "created");
    for k in store.api_key_rows().await? {
        println!(
            "{:<12}  {:<6}  {:<23}  database",
            key_id(&k.hash),
            k.role,
            time_utc(k.created_at)
        );
    }
    for k in &settings.auth.keys {
        let h = auth::hash_key(&k.key);
        println!(
            "{:<12}  {:<6}  {:<23}  config file (edit [[auth.keys]] to change)",
            key_id(&h),
            role_name(k.role),
            "-"
        );
    }
    Ok(())
}

async fn revoke(store: &Store, id: &str) -> anyhow::Result<()> {
    let id = id.trim().to_ascii_lowercase();
    if id.len() < 6 || !id.chars().all(|c| c.is_ascii_hexdigit()) {
        bail!("key id {id:?}: expected at least 6 hex digits, as printed by `dprec keys list`");
    }
    let matching: Vec<_> = store
        .api_key_rows()
        .await?
        .into_iter()
        .filter(|k| k.hash.starts_with(&id))
        .collect();
    match matching.as_slice() {
        [] => bail!(
            "no stored key has id {id} (`dprec keys list` shows the ids; keys from the config \
             file are removed from the file)"
        ),
        [k] => {
            store.delete_api_key(&k.hash).await?;
            eprintln!(
                "revoked {} key {} (a running server drops it within scheduler.reload_secs)",
                k.role,
                key_id(&k.hash)
            );
            Ok(())
        }
        many => bail!("key id {id} matches {} keys; give more digits", many.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_times() {
        assert_eq!(time_utc(0), "1970-01-01 00:00:00 UTC");
        // 2026-11-22 21:10:05 UTC.
        assert_eq!(time_utc(1_795_381_805_000), "2026-11-22 21:10:05 UTC");
        assert_eq!(time_utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
    }
}
