//! The server secret that keys page links ([`super::links`]): 32 bytes from the operating
//! system's CSPRNG, kept OUT of the database, so a backup of the database (which holds
//! every key's SHA-256) cannot mint links.
//!
//! Where it comes from ([`LinkSecretSource::of`]), first match wins:
//! - `auth.link_secret` (64 hex digits; meant for `DPREC_AUTH__LINK_SECRET` in container
//!   deployments): used as given, no file is read or written;
//! - `auth.link_secret_file` (`DPREC_AUTH__LINK_SECRET_FILE`), or by default the file
//!   `<database file>.link-secret` beside a SQLite database, or `dprec.link-secret` in the
//!   working directory for PostgreSQL: read at start, created on first start when missing
//!   (mode 0600, written to a temporary file and renamed into place);
//! - an in-memory SQLite database: a fresh secret held in memory (links die with the
//!   process, as does the data).
//!
//! Rotating the secret (`dprec keys rotate-link-secret`, [`rotate_file`]) voids every link
//! minted before; a running server re-reads the file with its API keys, every
//! `scheduler.reload_secs`, and at restart.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use anyhow::{bail, Context};

use crate::config::Settings;

pub use crate::link_secret::{LinkSecret, SECRET_LEN};

/// Where the secret of a configuration lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkSecretSource {
    /// `auth.link_secret`, given directly.
    Given,
    /// A file, created on first start.
    File(PathBuf),
    /// In memory only (an in-memory SQLite database).
    Ephemeral,
}

impl LinkSecretSource {
    /// The source for `settings` (see the module documentation).
    pub fn of(settings: &Settings) -> Self {
        if settings.auth.link_secret.is_some() {
            return Self::Given;
        }
        if let Some(p) = &settings.auth.link_secret_file {
            return Self::File(PathBuf::from(p));
        }
        match default_file(&settings.database.url) {
            Some(p) => Self::File(p),
            None => Self::Ephemeral,
        }
    }
}

/// The default secret file of a database URL: `<file>.link-secret` beside a SQLite file,
/// `dprec.link-secret` in the working directory otherwise; `None` for in-memory SQLite.
pub fn default_file(db_url: &str) -> Option<PathBuf> {
    let Some(rest) = db_url
        .strip_prefix("sqlite://")
        .or_else(|| db_url.strip_prefix("sqlite:"))
    else {
        return Some(PathBuf::from("dprec.link-secret"));
    };
    let path = rest.split('?').next().unwrap_or("");
    if path.is_empty() || path == ":memory:" || rest.contains("mode=memory") {
        return None;
    }
    Some(PathBuf::from(format!("{path}.link-secret")))
}

/// Reads the secret file at `path`.
pub fn read_file(path: &Path) -> anyhow::Result<LinkSecret> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the link secret {}", path.display()))?;
    LinkSecret::parse(&text).map_err(|e| anyhow::anyhow!("link secret {}: {e}", path.display()))
}

/// Writes `secret` to `path` atomically: a temporary file in the same directory with mode
/// 0600, flushed to disk, then renamed over `path`.
pub fn write_file(path: &Path, secret: &LinkSecret) -> anyhow::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .with_context(|| format!("link secret path {} names no file", path.display()))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}-{:08x}",
        name.to_string_lossy(),
        std::process::id(),
        rand::random::<u32>()
    ));
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let written = (|| -> std::io::Result<()> {
        let mut f = opts.open(&tmp)?;
        f.write_all(format!("{}\n", secret.to_hex()).as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        // The rename itself survives a crash once the directory is on disk.
        if let Ok(d) = std::fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(
            anyhow::Error::new(e).context(format!("writing the link secret {}", path.display()))
        );
    }
    Ok(())
}

/// The secret in the file at `path`, created (fresh, mode 0600) when the file is missing;
/// `true` when it was created.
pub fn load_or_create(path: &Path) -> anyhow::Result<(LinkSecret, bool)> {
    match std::fs::metadata(path) {
        Ok(_) => Ok((read_file(path)?, false)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let s = LinkSecret::generate()?;
            write_file(path, &s)?;
            Ok((s, true))
        }
        Err(e) => {
            Err(anyhow::Error::new(e)
                .context(format!("reading the link secret {}", path.display())))
        }
    }
}

/// Replaces the secret file of `settings` with a fresh secret (`dprec keys
/// rotate-link-secret`): every link minted before is void. Returns the file.
pub fn rotate_file(settings: &Settings) -> anyhow::Result<PathBuf> {
    match LinkSecretSource::of(settings) {
        LinkSecretSource::File(p) => {
            write_file(&p, &LinkSecret::generate()?)?;
            Ok(p)
        }
        LinkSecretSource::Given => bail!(
            "the link secret is given by auth.link_secret (DPREC_AUTH__LINK_SECRET): rotate it \
             by setting a new value (`openssl rand -hex 32`) and restarting the servers"
        ),
        LinkSecretSource::Ephemeral => {
            bail!("an in-memory database keeps its link secret in memory only: restart the server")
        }
    }
}

/// The secret a server checks links with, and where it came from; shared by the request
/// handlers and the reload loop.
#[derive(Debug, Clone)]
pub struct LinkKeys {
    source: LinkSecretSource,
    current: Arc<RwLock<LinkSecret>>,
}

impl LinkKeys {
    /// The secret of `settings`, read or (first start) created.
    pub fn load(settings: &Settings) -> anyhow::Result<Self> {
        let source = LinkSecretSource::of(settings);
        let secret = match &source {
            LinkSecretSource::Given => {
                let text = settings.auth.link_secret.as_deref().unwrap_or_default();
                LinkSecret::parse(text).map_err(|e| anyhow::anyhow!("auth.link_secret: {e}"))?
            }
            LinkSecretSource::File(p) => {
                let (s, created) = load_or_create(p)?;
                if created {
                    log::info!(
                        "created the page-link secret {} (mode 0600; not in the database: \
                         back it up with the configuration)",
                        p.display()
                    );
                }
                s
            }
            LinkSecretSource::Ephemeral => LinkSecret::generate()?,
        };
        Ok(Self::new(source, secret))
    }

    pub fn new(source: LinkSecretSource, secret: LinkSecret) -> Self {
        Self {
            source,
            current: Arc::new(RwLock::new(secret)),
        }
    }

    pub fn source(&self) -> &LinkSecretSource {
        &self.source
    }

    /// The secret links are checked and minted with now.
    pub fn current(&self) -> LinkSecret {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Re-reads the secret file (a file source only); `true` when the secret changed
    /// (`dprec keys rotate-link-secret` ran). A missing or unreadable file keeps the
    /// current secret (and is an error to log).
    pub fn reload(&self) -> anyhow::Result<bool> {
        let LinkSecretSource::File(p) = &self.source else {
            return Ok(false);
        };
        let s = read_file(p)?;
        let mut cur = self.current.write().unwrap_or_else(|e| e.into_inner());
        if *cur == s {
            return Ok(false);
        }
        *cur = s;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_files_follow_the_database() {
        assert_eq!(
            default_file("sqlite://data/dprec.sqlite"),
            Some(PathBuf::from("data/dprec.sqlite.link-secret"))
        );
        assert_eq!(
            default_file("sqlite:///var/lib/dprec/dprec.sqlite?mode=rwc"),
            Some(PathBuf::from("/var/lib/dprec/dprec.sqlite.link-secret"))
        );
        assert_eq!(default_file("sqlite::memory:"), None);
        assert_eq!(default_file("sqlite://x?mode=memory"), None);
        assert_eq!(
            default_file("postgres://u@h/db"),
            Some(PathBuf::from("dprec.link-secret"))
        );
    }

    #[test]
    fn a_missing_secret_file_is_created_private_and_then_reused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite.link-secret");
        let (s, created) = load_or_create(&path).unwrap();
        assert!(created);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{mode:o}");
        }
        // No temporary file is left beside it.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        let (again, created) = load_or_create(&path).unwrap();
        assert!(!created);
        assert_eq!(again, s);
        assert_ne!(s, LinkSecret::generate().unwrap());
    }

    #[test]
    fn secrets_parse_from_hex_only() {
        let s = LinkSecret::generate().unwrap();
        assert_eq!(
            LinkSecret::parse(&format!(" {}\n", s.to_hex())),
            Ok(s.clone())
        );
        assert!(LinkSecret::parse(&s.to_hex()[1..]).is_err());
        assert!(LinkSecret::parse(&"g".repeat(64)).is_err());
        assert_eq!(format!("{s:?}"), "LinkSecret(..)");
    }

    #[test]
    fn a_rotated_file_is_picked_up_by_reload() {
        let dir = tempfile::tempdir().unwrap();
        let mut settings = Settings::default();
        let path = dir.path().join("s");
        settings.auth.link_secret_file = Some(path.display().to_string());
        let keys = LinkKeys::load(&settings).unwrap();
        let before = keys.current();
        assert!(!keys.reload().unwrap());
        assert_eq!(rotate_file(&settings).unwrap(), path);
        assert!(keys.reload().unwrap());
        assert_ne!(keys.current(), before);
        settings.auth.link_secret = Some(before.to_hex());
        assert!(rotate_file(&settings).is_err());
        assert_eq!(LinkKeys::load(&settings).unwrap().current(), before);
    }
}
