//! `dprec keys`: API keys stored in the database (hashed), managed without the server,
//! so a lost admin key can always be replaced by whoever can reach the database.
//!
//! A key is shown once, when created; only its SHA-256 is stored. Its id is the first 12
//! hex digits of that digest (derived from the hash, not the key, so it can be printed).
//! Keys from the config file (`[[auth.keys]]`) are listed but managed in the file.
//! A running server picks up created and revoked keys within `scheduler.reload_secs`.
//! Roles (DESIGN 6, `api::auth`): admin, writer, reader (service reader), user (a token
//! bound to one user id: `--role user --user ID`) and public (the DP model only). The
//! same keys are managed over HTTP by `POST/GET /v1/admin/keys` and
//! `DELETE /v1/admin/keys/{id}`.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};

use crate::api::auth;
use crate::api::keyring::{check_role_user, find_by_id, key_id, time_utc};
use crate::config::Settings;
use crate::store::Store;

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
        /// admin, writer, reader, user (with --user), public or metrics (a Prometheus
        /// scraper: the full /metrics and nothing else).
        #[arg(long, value_parser = ["admin", "writer", "reader", "user", "public", "metrics"])]
        role: String,
        /// The user a `user` token is bound to (required with --role user, refused otherwise).
        #[arg(long)]
        user: Option<String>,
    },
    /// List the keys: id, role, user, creation time, where it comes from.
    List,
    /// Revoke a stored key by its id (as printed by `list` or `create`).
    Revoke {
        /// The key id (at least 6 hex digits of it).
        id: String,
    },
    /// Replace the page-link secret file (auth.link_secret_file, default beside the
    /// SQLite database) with a fresh one: every receipt and overview link minted before
    /// is void. Running servers re-read it within scheduler.reload_secs (and at
    /// restart). Refused when the secret is given directly (auth.link_secret).
    RotateLinkSecret,
}

pub fn run(args: KeysArgs) -> anyhow::Result<()> {
    let settings = Settings::load(args.config.as_deref())?;
    if let KeysCommand::RotateLinkSecret = args.command {
        return rotate_link_secret(&settings);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let store = Store::connect(&settings.database.url, 1).await?;
        let out = match args.command {
            KeysCommand::Create { role, user } => {
                create(&store, &role, user.as_deref(), settings.ratings.max_id_len).await
            }
            KeysCommand::List => list(&store, &settings).await,
            KeysCommand::Revoke { id } => revoke(&store, &id).await,
            KeysCommand::RotateLinkSecret => unreachable!("handled without the store"),
        };
        store.close().await;
        out
    })
}

/// `dprec keys rotate-link-secret`: a fresh page-link secret in its file.
pub fn rotate_link_secret(settings: &Settings) -> anyhow::Result<()> {
    let path = crate::api::pages::secret::rotate_file(settings)?;
    println!(
        "wrote a new page-link secret to {} (mode 0600): every link minted before is void; \
         running servers use the new secret within scheduler.reload_secs ({} s) or at restart",
        path.display(),
        settings.scheduler.reload_secs
    );
    Ok(())
}

async fn create(
    store: &Store,
    role: &str,
    user: Option<&str>,
    max_id_len: usize,
) -> anyhow::Result<()> {
    let user = check_role_user(role, user, max_id_len).map_err(|e| anyhow::anyhow!("{e}"))?;
    let key = auth::generate_key();
    let hash = auth::hash_key(&key);
    store
        .insert_api_key(&hash, role, user.as_deref())
        .await
        .context("storing the key")?;
    let bound = user
        .as_deref()
        .map(|u| format!(" for user {u:?}"))
        .unwrap_or_default();
    eprintln!(
        "created {role} key {}{bound} (shown once; only its SHA-256 is stored):",
        key_id(&hash)
    );
    println!("{key}");
    Ok(())
}

async fn list(store: &Store, settings: &Settings) -> anyhow::Result<()> {
    println!(
        "{:<12}  {:<6}  {:<16}  {:<23}  source",
        "id", "role", "user", "created"
    );
    for k in store.api_key_rows().await? {
        println!(
            "{:<12}  {:<6}  {:<16}  {:<23}  database",
            key_id(&k.hash),
            k.role,
            k.user.as_deref().unwrap_or("-"),
            time_utc(k.created_at)
        );
    }
    for k in &settings.auth.keys {
        let h = auth::hash_key(&k.key);
        println!(
            "{:<12}  {:<6}  {:<16}  {:<23}  config file (edit [[auth.keys]] to change)",
            key_id(&h),
            auth::role_name(k.role),
            "-",
            "-"
        );
    }
    Ok(())
}

async fn revoke(store: &Store, id: &str) -> anyhow::Result<()> {
    let k = match find_by_id(store.api_key_rows().await?, id) {
        Ok(k) => k,
        Err(e) => bail!("{e}"),
    };
    store.delete_api_key(&k.hash).await?;
    eprintln!(
        "revoked {} key {} (a running server drops it within scheduler.reload_secs)",
        k.role,
        key_id(&k.hash)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_and_user_pairs() {
        assert_eq!(
            check_role_user("user", Some("u1"), 128),
            Ok(Some("u1".into()))
        );
        assert!(check_role_user("user", None, 128).is_err());
        assert!(check_role_user("reader", Some("u1"), 128).is_err());
        assert!(check_role_user("user", Some(""), 128).is_err());
        assert!(check_role_user("root", None, 128).is_err());
        assert_eq!(check_role_user("public", None, 128), Ok(None));
    }

    #[test]
    fn utc_times() {
        assert_eq!(time_utc(0), "1970-01-01 00:00:00 UTC");
        // 2026-11-22 21:10:05 UTC.
        assert_eq!(time_utc(1_795_381_805_000), "2026-11-22 21:10:05 UTC");
        assert_eq!(time_utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
    }
}
