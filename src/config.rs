//! Typed service configuration: a TOML file plus environment overrides.
//!
//! Precedence (lowest to highest): built-in defaults, the TOML file, `DPREC_<SECTION>__<KEY>`
//! environment variables (e.g. `DPREC_SERVER__BIND=0.0.0.0:8080`,
//! `DPREC_TRAINER__NAME=dp-alt`), and `DATABASE_URL` for `database.url`. Every key is
//! documented in docs/SERVICE.md, "Configuration reference".

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use crate::data::RatingScale;
use dprec_dp::defaults;
use dprec_dp::ledger::{SharePolicy, SHARE_POLICY_FORMAT};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    pub server: ServerSettings,
    pub database: DatabaseSettings,
    pub auth: AuthSettings,
    pub trainer: TrainerSettings,
    pub budget: BudgetSettings,
    pub ratings: RatingSettings,
    pub scheduler: SchedulerSettings,
    pub retrain: RetrainSettings,
    pub release: ReleaseSettings,
    pub pages: PageSettings,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSettings {
    /// Address to listen on.
    pub bind: String,
    /// Largest accepted request body in bytes.
    pub max_body_bytes: usize,
    /// Largest number of ratings in one batch.
    pub max_batch: usize,
    /// Most users whose ratings and ready lists the serving cache holds (a random entry
    /// makes room beyond; docs/BENCHMARKS.md says what a cached user costs).
    pub cache_users: usize,
    /// Most ratings the serving cache holds over all its users (about 24 bytes each,
    /// plus the users' ready lists).
    pub cache_ratings: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseSettings {
    /// `sqlite://FILE` (created if missing) or `postgres://...`.
    pub url: String,
    pub max_connections: u32,
    /// SQLite only: `"normal"` (default; acknowledged writes survive a process crash, the
    /// last ones may be lost on power loss) or `"full"` (fsync at every commit; they
    /// survive power loss too). See docs/RELIABILITY.md.
    pub sqlite_synchronous: SqliteSync,
}

/// SQLite's `PRAGMA synchronous` in WAL mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SqliteSync {
    #[default]
    Normal,
    Full,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuthMode {
    /// API keys required (the default).
    Keys,
    /// No authentication: development only, loopback addresses only, logged loudly.
    Disabled,
}

/// Key roles, lowest first (DESIGN 6; the scopes are listed in `api::auth`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// A Prometheus scraper: the full `/metrics` (request counts, latencies and the
    /// data-dependent series) and nothing else. Lowest, so every other route refuses it.
    Metrics,
    /// The published DP model and the release list only.
    Public,
    /// A user token: bound to one user id (created with `POST /v1/admin/keys` or
    /// `dprec keys create --role user --user ID`, never in the config file).
    User,
    /// Service reader: the curator's backend, which shows u's answers only to u.
    Reader,
    Writer,
    Admin,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKey {
    pub key: String,
    pub role: Role,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSettings {
    pub mode: AuthMode,
    /// Keys from the config file. With none configured (and none stored), the first start
    /// generates an admin key, stores its SHA-256 and prints the key once.
    pub keys: Vec<ApiKey>,
    /// The file holding the secret that signs page links (`api::pages::secret`), kept out
    /// of the database. Default: `<database file>.link-secret` beside a SQLite file,
    /// `dprec.link-secret` in the working directory for PostgreSQL. Created (mode 0600) on
    /// first start when missing; `dprec keys rotate-link-secret` replaces it.
    pub link_secret_file: Option<String>,
    /// The link secret itself, 64 hex digits, instead of a file (container deployments:
    /// `DPREC_AUTH__LINK_SECRET`); takes precedence over `link_secret_file`.
    pub link_secret: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainerSettings {
    /// Registry name of the trainer (`dprec::train::build`).
    pub name: String,
    /// Trainer parameters as strings (`key = "value"`).
    pub params: BTreeMap<String, String>,
    /// Serve trainers whose guarantee is not `proven` (e.g. `baseline`); such releases are
    /// labelled "non-private" and charge nothing.
    pub allow_non_private: bool,
    /// Rating-level mode (DESIGN 3; off by default): serve a trainer whose proof covers
    /// only one rating (`pdp-pmf`, `dp-pmf`: guarantee `rating-level`). Its releases are
    /// labelled `"guarantee": "rating-level"` in every response, charge each rating's
    /// eps_ij as always, charge nothing to the user-level Renyi ledger, and each user's
    /// audit shows the group-privacy bound they imply (shown, not enforced). Refused with
    /// a trainer that has a user-level guarantee ([`rating_level_misapplied`]); without
    /// it a rating-level trainer is refused ([`rating_level_refused`]).
    pub allow_rating_level: bool,
    /// Refused when set (issue 8 finding 8): a fixed seed replays the same noise in every
    /// release, so two releases can be differenced. Seeds are for `dprec-lab eval --seed` and
    /// for tests (`release::Hooks::seed`). Kept as a key only to name it in the error.
    pub seed: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetSettings {
    /// eps_ij of a rating sent without eps, for a user without a default.
    pub default_rating_eps: f64,
    /// Largest accepted eps_ij.
    pub max_rating_eps: f64,
    /// Share of eps_ij one release may spend: `fraction:F` or `split:K` (parsed when the
    /// configuration is loaded).
    pub share: SharePolicy,
    /// A rating whose remaining budget is below this is exhausted.
    pub min_release_eps: f64,
    /// Per-user RDP budget (eps_u, delta_u) of new users.
    pub default_user_eps: f64,
    pub default_user_delta: f64,
    /// Largest eps_u / delta_u a user's settings may hold (`PUT /v1/users/{user}/settings`
    /// answers 422 above them). A budget may be lowered at any time but never raised once
    /// the user has been charged (409).
    pub max_user_eps: f64,
    pub max_user_delta: f64,
    /// eps of the DP popularity counts of each release (charged to each counted rating),
    /// before the lifetime plan's calibration.
    pub popularity_eps: f64,
    /// Lifetime plan (DESIGN 3): the number of releases every user takes part in within
    /// (default_user_eps, default_user_delta). The per-release noise is calibrated from it
    /// before any data is seen (`train::units::calibrate_release`); 0 = no calibration
    /// (the trainer's parameters as configured).
    pub planned_releases: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RatingSettings {
    pub min: f64,
    pub max: f64,
    pub step: f64,
    /// Longest accepted user or item id (bytes).
    pub max_id_len: usize,
    /// Longest accepted item title in the catalogue (characters).
    pub max_title_chars: usize,
    /// Most labels one catalogue item may carry.
    pub max_labels: usize,
    /// Longest accepted item label (characters).
    pub max_label_chars: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerSettings {
    pub enabled: bool,
    /// Seconds between scheduled releases: a fixed schedule, whatever the data (a trigger
    /// on the number of new ratings would leak that number; issue 8 finding 7). Default a
    /// week, so the 52 planned releases cover a year.
    pub retrain_interval_secs: u64,
    /// Lifetime of the trainer lease in seconds.
    pub lease_secs: u64,
    /// Seconds between checks for releases published by another instance (replicas
    /// sharing one database serve the newest release); 0 disables.
    pub reload_secs: u64,
    /// A name for this instance that stays the same across restarts (e.g. the host name
    /// of a single-node deployment). A restarted instance takes over the trainer lease its
    /// previous run left behind (after kill -9 or a crash) and marks that run's jobs
    /// failed, instead of waiting `lease_secs`. Two live instances must never share it.
    /// Default: the host name and the bind address (two processes cannot bind the same
    /// address), or none when the port is 0 (then a dead lease simply expires).
    pub instance_id: Option<String>,
}

/// The HTML pages (the receipt and the operator overview).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PageSettings {
    /// A `dprec-lab eval --out` JSON report whose mean figures the operator overview shows
    /// (read at each request; none: the overview says it is not configured).
    pub eval_report: Option<String>,
}

/// Operator safety of releases (issue 11).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetrainSettings {
    /// A release whose DP input total (the sum of its published DP item counts) is below
    /// this fraction of the served release's is refused (not served; its charges stand)
    /// unless the admin retrain says `"force": true`; scheduled retrains never force.
    /// In [0, 1]; 0 turns the check off. See docs/LEDGER.md, "Refused releases".
    pub min_input_ratio: f64,
}

/// How releases are made (issue 23).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReleaseMode {
    /// Every release is an independent mechanism; the plan composes `planned_releases`
    /// of them (the trainer's model is served).
    Independent,
    /// Every release is a tick of a continual series: DP popularity counts by tree
    /// aggregation over `budget.planned_releases` ticks, charged per level
    /// (docs/privacy/dp-topn.md section 4).
    Continual,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReleaseSettings {
    /// `independent` (default) or `continual`.
    pub mode: ReleaseMode,
    /// Continual mode: distinct items counted per user over a series (arrival order).
    pub continual_cap: usize,
    /// Seconds after its job's start at which a release becomes visible (served, listed,
    /// in `/readyz`): a public deadline, so that when a release appears does not depend
    /// on how long it took to compute and commit (which grows with the data). A release
    /// that is not committed by then appears at the next multiple of this delay after
    /// its start. 0: at its commit (a time that grows with the data).
    pub publish_delay_secs: u64,
}

impl Default for ReleaseSettings {
    fn default() -> Self {
        Self {
            mode: ReleaseMode::Independent,
            continual_cap: crate::train::topn::continual::DEFAULT_CAP,
            publish_delay_secs: 10,
        }
    }
}

impl Default for RetrainSettings {
    fn default() -> Self {
        Self {
            min_input_ratio: 0.5,
        }
    }
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            bind: "127.0.0.1:8080".into(),
            max_body_bytes: 4 * 1024 * 1024,
            max_batch: 10_000,
            cache_users: 1_000_000,
            cache_ratings: 20_000_000,
        }
    }
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self {
            url: "sqlite://dprec.sqlite".into(),
            max_connections: 8,
            sqlite_synchronous: SqliteSync::Normal,
        }
    }
}

impl Default for AuthSettings {
    fn default() -> Self {
        Self {
            mode: AuthMode::Keys,
            keys: Vec::new(),
            link_secret_file: None,
            link_secret: None,
        }
    }
}

impl Default for TrainerSettings {
    fn default() -> Self {
        Self {
            name: crate::train::SERVED_DEFAULT.into(),
            params: BTreeMap::new(),
            allow_non_private: false,
            allow_rating_level: false,
            seed: None,
        }
    }
}

impl TrainerSettings {
    /// The rating-level switch against the configured trainer's guarantee: a rating-level
    /// trainer needs `allow_rating_level` ([`rating_level_refused`]), and the switch is
    /// refused with any other trainer ([`rating_level_misapplied`]).
    pub fn check_rating_level(
        &self,
        trainer: &str,
        guarantee: crate::train::Guarantee,
    ) -> anyhow::Result<()> {
        let rating_level = guarantee == crate::train::Guarantee::RatingLevel;
        match (rating_level, self.allow_rating_level) {
            (true, false) => bail!("{}", rating_level_refused(trainer)),
            (false, true) => bail!("{}", rating_level_misapplied(trainer, guarantee)),
            _ => Ok(()),
        }
    }
}

/// Why a rating-level trainer is not served without the operator's opt-in: said the same
/// at start-up and by every release that would publish it.
pub fn rating_level_refused(trainer: &str) -> String {
    format!(
        "trainer {trainer} is proven for one rating only (guarantee rating-level: no \
         user-level bound fits the release plan), so it is served only in the rating-level \
         mode: set trainer.allow_rating_level = true (env DPREC_TRAINER__ALLOW_RATING_LEVEL=true) \
         to opt in; every response is then labelled \"rating-level\", each rating's eps_ij is \
         enforced, the user-level budget is not, and each user's audit shows the \
         group-privacy bound (docs/privacy/guarantee.md)"
    )
}

/// Why `trainer.allow_rating_level = true` is refused with a trainer that is not
/// rating-level (the switch would label nothing and weaken nothing: a configuration
/// mistake, e.g. left over from a previous trainer).
pub fn rating_level_misapplied(trainer: &str, guarantee: crate::train::Guarantee) -> String {
    format!(
        "trainer.allow_rating_level = true applies only to trainers proven for one rating \
         (guarantee rating-level: pdp-pmf, dp-pmf); trainer {trainer} has guarantee \
         {guarantee}: remove trainer.allow_rating_level (or DPREC_TRAINER__ALLOW_RATING_LEVEL)"
    )
}

impl Default for BudgetSettings {
    fn default() -> Self {
        Self {
            // Why these values: `dprec_dp::defaults`.
            default_rating_eps: defaults::RATING_EPS,
            max_rating_eps: 100.0,
            share: defaults::SHARE,
            min_release_eps: defaults::MIN_RELEASE_EPS,
            default_user_eps: defaults::USER_EPS,
            default_user_delta: defaults::USER_DELTA,
            max_user_eps: 10.0,
            max_user_delta: 1e-5,
            popularity_eps: 0.05,
            planned_releases: dprec_dp::accountant::DEFAULT_PLANNED_RELEASES,
        }
    }
}

impl Default for RatingSettings {
    fn default() -> Self {
        Self {
            min: 1.0,
            max: 5.0,
            step: 0.5,
            max_id_len: 128,
            max_title_chars: 200,
            max_labels: 32,
            max_label_chars: 64,
        }
    }
}

impl Default for SchedulerSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            retrain_interval_secs: 7 * 24 * 3600,
            lease_secs: 900,
            reload_secs: 10,
            instance_id: None,
        }
    }
}

impl Settings {
    /// Defaults, then `file` (if given), then the environment.
    pub fn load(file: Option<&Path>) -> anyhow::Result<Self> {
        let mut tree = toml::Table::new();
        if let Some(path) = file {
            tree = Self::read_tree(path)?;
        }
        Self::from_tree_and_env(tree, std::env::vars())
    }

    /// [`Settings::load`] for `dprec serve --dev-no-auth`: auth is off before validation,
    /// so the keys of a shared config file are not checked (they are not used).
    pub fn load_without_auth(file: Option<&Path>) -> anyhow::Result<Self> {
        let mut tree = toml::Table::new();
        if let Some(path) = file {
            tree = Self::read_tree(path)?;
        }
        let off = [("DPREC_AUTH__MODE".to_string(), "disabled".to_string())];
        Self::from_tree_and_env(tree, std::env::vars().chain(off))
    }

    fn read_tree(path: &Path) -> anyhow::Result<toml::Table> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config {}", path.display()))?;
        text.parse::<toml::Table>()
            .with_context(|| format!("parsing config {}", path.display()))
    }

    /// The file's tree with environment overrides applied, deserialised and validated;
    /// errors about a value set from the environment name the variable.
    pub fn from_tree_and_env(
        mut tree: toml::Table,
        vars: impl Iterator<Item = (String, String)>,
    ) -> anyhow::Result<Self> {
        let from_env = apply_env(&mut tree, vars)?;
        // The error names the key (`budget.share: ...`).
        let s: Settings = serde_path_to_error::deserialize(toml::Value::Table(tree))
            .map_err(|e| with_env_hint(anyhow::Error::new(e), &from_env))
            .context("invalid configuration")?;
        s.validate().map_err(|e| with_env_hint(e, &from_env))?;
        Ok(s)
    }

    /// Checks the values that the types alone do not.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.bind_addr()?;
        self.scale()?;
        let b = &self.budget;
        let pos = |name: &str, v: f64| -> anyhow::Result<()> {
            if !(v.is_finite() && v > 0.0) {
                bail!("budget.{name} must be finite and > 0, got {v}");
            }
            Ok(())
        };
        pos("default_rating_eps", b.default_rating_eps)?;
        pos("max_rating_eps", b.max_rating_eps)?;
        pos("min_release_eps", b.min_release_eps)?;
        pos("default_user_eps", b.default_user_eps)?;
        pos("popularity_eps", b.popularity_eps)?;
        if b.default_rating_eps > b.max_rating_eps {
            bail!("budget.default_rating_eps exceeds budget.max_rating_eps");
        }
        if !(b.default_user_delta > 0.0 && b.default_user_delta < 1.0) {
            bail!("budget.default_user_delta must be in (0, 1)");
        }
        pos("max_user_eps", b.max_user_eps)?;
        if !(b.max_user_delta > 0.0 && b.max_user_delta < 1.0) {
            bail!("budget.max_user_delta must be in (0, 1)");
        }
        if b.default_user_eps > b.max_user_eps {
            bail!(
                "budget.default_user_eps ({}) exceeds budget.max_user_eps ({})",
                b.default_user_eps,
                b.max_user_eps
            );
        }
        if b.default_user_delta > b.max_user_delta {
            bail!(
                "budget.default_user_delta ({}) exceeds budget.max_user_delta ({})",
                b.default_user_delta,
                b.max_user_delta
            );
        }
        if let Some(seed) = self.trainer.seed {
            bail!(
                "trainer.seed = {seed} is refused: a fixed seed replays the same noise in every \
                 release, so releases could be differenced (seeds are for `dprec-lab eval --seed` \
                 and tests); remove trainer.seed"
            );
        }
        if self.server.max_batch == 0 || self.server.max_body_bytes < 1024 {
            bail!("server.max_batch must be >= 1 and server.max_body_bytes >= 1024");
        }
        if self.server.cache_users == 0 || self.server.cache_ratings == 0 {
            bail!(
                "server.cache_users and server.cache_ratings must be >= 1 (got {} and {})",
                self.server.cache_users,
                self.server.cache_ratings
            );
        }
        let r = &self.ratings;
        if r.max_id_len == 0 || r.max_title_chars == 0 || r.max_label_chars == 0 {
            bail!(
                "ratings.max_id_len, ratings.max_title_chars and ratings.max_label_chars must \
                 be >= 1"
            );
        }
        if self.scheduler.retrain_interval_secs == 0 || self.scheduler.lease_secs == 0 {
            bail!("scheduler.retrain_interval_secs and scheduler.lease_secs must be >= 1");
        }
        let r = self.retrain.min_input_ratio;
        if !(r.is_finite() && (0.0..=1.0).contains(&r)) {
            bail!("retrain.min_input_ratio must be in [0, 1] (0 turns the check off), got {r}");
        }
        self.validate_release()?;
        if let Some(id) = &self.scheduler.instance_id {
            if id.is_empty() || id.contains('#') || id.chars().any(char::is_control) {
                bail!("scheduler.instance_id must be non-empty, without '#' or control characters");
            }
        }
        self.validate_keys()
    }

    /// `release.*`: continual mode needs a plan (its ticks), a trainer whose release is
    /// DP popularity, and a sane cap.
    fn validate_release(&self) -> anyhow::Result<()> {
        if self.release.mode != ReleaseMode::Continual {
            return Ok(());
        }
        if self.budget.planned_releases == 0 {
            bail!(
                "release.mode = \"continual\" needs budget.planned_releases >= 1 (the \
                 series' number of ticks)"
            );
        }
        if !matches!(self.trainer.name.as_str(), "dp-topn" | "dp-popularity") {
            bail!(
                "release.mode = \"continual\" serves DP popularity by tree aggregation, \
                 the release of trainer dp-topn or dp-popularity; trainer.name = {:?} is \
                 not one of them",
                self.trainer.name
            );
        }
        if !(1..=1 << 16).contains(&self.release.continual_cap) {
            bail!(
                "release.continual_cap must be in [1, 65536], got {}",
                self.release.continual_cap
            );
        }
        if self.release.publish_delay_secs > 86_400 {
            bail!(
                "release.publish_delay_secs must be at most 86400 (one day), got {}",
                self.release.publish_delay_secs
            );
        }
        Ok(())
    }

    /// Keys: long enough, not a placeholder, no user token in the file, no key with two
    /// roles. Without auth (`--dev-no-auth`) the keys are not used and not checked.
    fn validate_keys(&self) -> anyhow::Result<()> {
        if let Some(s) = &self.auth.link_secret {
            crate::link_secret::LinkSecret::parse(s)
                .map_err(|e| anyhow::anyhow!("auth.link_secret: {e}"))?;
        }
        if self.auth.link_secret_file.as_deref() == Some("") {
            bail!("auth.link_secret_file: empty path (remove the key for the default)");
        }
        if self.auth.mode == AuthMode::Disabled {
            return Ok(());
        }
        let mut roles: BTreeMap<&str, (usize, Role)> = BTreeMap::new();
        for (n, k) in self.auth.keys.iter().enumerate() {
            if k.key.len() < 16 {
                bail!("auth.keys: every key must be at least 16 characters");
            }
            if let Some(why) = placeholder_key(&k.key) {
                bail!(
                    "auth.keys: entry {} (role {:?}) is a placeholder ({why}); replace it with a \
                     random key (e.g. `openssl rand -hex 32`) or delete it and use `dprec keys \
                     create`; `dprec serve --dev-no-auth` runs without keys on loopback",
                    n + 1,
                    k.role
                );
            }
            if k.role == Role::User {
                bail!(
                    "auth.keys: role \"user\" is a token bound to one user; create it with \
                     `dprec keys create --role user --user ID` or POST /v1/admin/keys"
                );
            }
            // A key listed twice with different roles would silently get one of them.
            match roles.insert(&k.key, (n, k.role)) {
                Some((first, role)) if role != k.role => bail!(
                    "auth.keys: entries {} and {} are the same key with different roles ({role:?} and {:?}); list each key once",
                    first + 1,
                    n + 1,
                    k.role
                ),
                _ => {}
            }
        }
        Ok(())
    }

    /// The instance name of the trainer lease (see `scheduler.instance_id`).
    pub fn instance_id(&self) -> Option<String> {
        if let Some(id) = &self.scheduler.instance_id {
            return Some(id.clone());
        }
        let addr = self.bind_addr().ok()?;
        if addr.port() == 0 {
            return None;
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".into());
        Some(format!("{host}/{addr}").replace('#', "_"))
    }

    pub fn bind_addr(&self) -> anyhow::Result<SocketAddr> {
        self.server.bind.parse().with_context(|| {
            format!(
                "server.bind {:?} is not an IP:port (expected e.g. 127.0.0.1:8080)",
                self.server.bind
            )
        })
    }

    pub fn scale(&self) -> anyhow::Result<RatingScale> {
        RatingScale::new(self.ratings.min, self.ratings.max, self.ratings.step)
            .map_err(|e| anyhow::anyhow!("ratings: {e}"))
    }
}

/// A configuration value set from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvOverride {
    /// The variable, e.g. `DPREC_SERVER__BIND`.
    pub var: String,
    /// The key it sets, e.g. `server.bind`.
    pub key: String,
    pub value: String,
}

/// The sections of the configuration file (for `DPREC_<SECTION>__<KEY>`).
const SECTIONS: [&str; 10] = [
    "server",
    "database",
    "auth",
    "trainer",
    "budget",
    "ratings",
    "scheduler",
    "retrain",
    "release",
    "pages",
];

/// Settings whose value is a secret: errors name the variable, never the value.
const SECRET_KEYS: [&str; 1] = ["auth.link_secret"];

/// Why a configured key is a placeholder rather than a secret: a sample file's marker
/// word, or a run of 8 equal characters (a random 32-hex-digit key has one with
/// probability about 4e-7).
fn placeholder_key(key: &str) -> Option<&'static str> {
    let lower = key.to_ascii_lowercase();
    for marker in [
        "change-me",
        "changeme",
        "placeholder",
        "example",
        "replace-me",
    ] {
        if lower.contains(marker) {
            return Some("it contains a sample file's marker word");
        }
    }
    let bytes = key.as_bytes();
    if bytes.windows(8).any(|w| w.iter().all(|&b| b == w[0])) {
        return Some("it has 8 equal characters in a row");
    }
    None
}

/// The expected format of values whose type alone does not say it.
fn expected_format(key: &str) -> Option<&'static str> {
    Some(match key {
        "server.bind" => "HOST:PORT with an IP address, e.g. 127.0.0.1:8080 or 0.0.0.0:8080",
        "budget.share" => SHARE_POLICY_FORMAT,
        "database.url" => "sqlite://FILE or postgres://USER@HOST:PORT/DB",
        "auth.mode" => "keys or disabled",
        "auth.link_secret" => "64 hex digits, e.g. from `openssl rand -hex 32`",
        _ => return None,
    })
}

/// Adds, to a configuration error about a key that an environment variable set, the
/// variable, its value and the expected format.
fn with_env_hint(e: anyhow::Error, from_env: &[EnvOverride]) -> anyhow::Error {
    let msg = format!("{e:#}");
    let Some(o) = from_env.iter().find(|o| {
        let field = o.key.rsplit('.').next().unwrap_or(&o.key);
        msg.contains(&o.key)
            || msg.contains(&format!("`{field}`"))
            || msg.contains(&format!("{:?}", o.value))
            || msg.contains(&format!("`{}`", o.value))
    }) else {
        return e;
    };
    // Said once: the parser's own message may already carry the expected form.
    let format = expected_format(&o.key)
        .filter(|f| !msg.contains(f))
        .map(|f| format!("; expected {f}"))
        .unwrap_or_default();
    if SECRET_KEYS.contains(&o.key.as_str()) {
        return e.context(format!(
            "{} (sets {}; value not shown){format}",
            o.var, o.key
        ));
    }
    e.context(format!("{}={:?} (sets {}){format}", o.var, o.value, o.key))
}

/// Applies `DPREC_SECTION__KEY=value` and `DATABASE_URL` to the TOML tree. Values are
/// parsed as TOML scalars when possible (`true`, `3`, `0.5`), else taken as strings.
/// Returns what was set, so errors can name the variable. A variable that looks like a
/// setting with a single underscore (`DPREC_SERVER_BIND`) is an error, not ignored.
pub fn apply_env(
    tree: &mut toml::Table,
    vars: impl Iterator<Item = (String, String)>,
) -> anyhow::Result<Vec<EnvOverride>> {
    let mut set = Vec::new();
    for (k, v) in vars {
        let (section, key) = if k == "DATABASE_URL" {
            ("database".to_string(), "url".to_string())
        } else if let Some(rest) = k.strip_prefix("DPREC_") {
            match rest.split_once("__") {
                Some((s, key)) => (s.to_ascii_lowercase(), key.to_ascii_lowercase()),
                None => {
                    let lower = rest.to_ascii_lowercase();
                    if let Some(section) = SECTIONS
                        .iter()
                        .find(|s| lower.starts_with(&format!("{s}_")))
                    {
                        let key = &rest[section.len() + 1..];
                        bail!(
                            "environment variable {k} is not a setting: overrides use a double \
                             underscore between section and key, e.g. DPREC_{}__{key}",
                            section.to_ascii_uppercase()
                        );
                    }
                    continue;
                }
            }
        } else {
            continue;
        };
        if !SECTIONS.contains(&section.as_str()) {
            bail!(
                "environment variable {k}: unknown configuration section {section:?} \
                 (sections: {})",
                SECTIONS.join(", ")
            );
        }
        let value = parse_scalar(&v);
        let entry = tree
            .entry(section.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        match entry {
            toml::Value::Table(t) => {
                t.insert(key.clone(), value);
            }
            _ => bail!("{k}: config section {section} is not a table"),
        }
        set.push(EnvOverride {
            var: k,
            key: format!("{section}.{key}"),
            value: v,
        });
    }
    Ok(set)
}

fn parse_scalar(v: &str) -> toml::Value {
    if let Ok(b) = v.parse::<bool>() {
        return toml::Value::Boolean(b);
    }
    if let Ok(i) = v.parse::<i64>() {
        return toml::Value::Integer(i);
    }
    if let Ok(f) = v.parse::<f64>() {
        if f.is_finite() {
            return toml::Value::Float(f);
        }
    }
    toml::Value::String(v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_overrides_file_values() {
        let mut t: toml::Table = "[server]\nbind = \"127.0.0.1:1\"\n".parse().unwrap();
        let vars = vec![
            ("DPREC_SERVER__BIND".to_string(), "127.0.0.1:2".to_string()),
            ("DPREC_TRAINER__ALLOW_NON_PRIVATE".into(), "true".into()),
            ("DATABASE_URL".into(), "postgres://x".into()),
            ("DPREC_IGNORED".into(), "1".into()),
        ];
        apply_env(&mut t, vars.into_iter()).unwrap();
        let s: Settings = toml::Value::Table(t).try_into().unwrap();
        assert_eq!(s.server.bind, "127.0.0.1:2");
        assert!(s.trainer.allow_non_private);
        assert_eq!(s.database.url, "postgres://x");
        assert_eq!(s.trainer.name, "dp-topn");
    }

    /// The sample production config in deploy/ parses and validates.
    #[test]
    fn sample_config_is_valid() {
        let t: toml::Table = include_str!("../deploy/dprec.toml").parse().unwrap();
        let s: Settings = toml::Value::Table(t).try_into().unwrap();
        s.validate().unwrap();
        assert!(
            s.auth.keys.is_empty(),
            "the first start generates the admin key"
        );
        assert_eq!(s.trainer.name, "dp-topn");
    }

    /// Environment errors name the variable, its value and the expected format; a
    /// single-underscore setting is reported, not ignored.
    #[test]
    fn env_errors_name_the_variable() {
        let env = |pairs: &[(&str, &str)]| {
            let mut t = toml::Table::new();
            let vars = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string()));
            apply_env(&mut t, vars).map(|set| (t, set))
        };
        let e = env(&[("DPREC_SERVER_BIND", "0.0.0.0:1")]).unwrap_err();
        assert!(format!("{e:#}").contains("DPREC_SERVER__BIND"), "{e:#}");
        let e = env(&[("DPREC_SEVRER__BIND", "0.0.0.0:1")]).unwrap_err();
        assert!(
            format!("{e:#}").contains("unknown configuration section"),
            "{e:#}"
        );
        // Not settings: other DPREC_ variables are left alone.
        assert!(env(&[("DPREC_ML100K_DIR", "/x"), ("DPREC_REQUIRE_DATA", "1")]).is_ok());

        let load = |k: &str, v: &str| {
            let vars = [(k.to_string(), v.to_string())].into_iter();
            format!(
                "{:#}",
                Settings::from_tree_and_env(toml::Table::new(), vars).unwrap_err()
            )
        };
        let e = load("DPREC_SERVER__BIND", "localhost");
        assert!(
            e.contains("DPREC_SERVER__BIND=\"localhost\"") && e.contains("HOST:PORT"),
            "{e}"
        );
        let e = load("DPREC_BUDGET__SHARE", "0.25");
        assert!(
            e.contains("DPREC_BUDGET__SHARE") && e.contains("fraction:F"),
            "{e}"
        );
        let e = load("DPREC_BUDGET__SHARE", "half");
        assert!(
            e.contains("DPREC_BUDGET__SHARE") && e.contains("fraction:F"),
            "{e}"
        );
        assert_eq!(
            e.matches("fraction:F").count(),
            1,
            "the form is said once: {e}"
        );
        let e = load("DPREC_SERVER__MAX_BATCH", "many");
        assert!(e.contains("DPREC_SERVER__MAX_BATCH=\"many\""), "{e}");
    }

    #[test]
    fn a_bad_link_secret_is_refused_without_echoing_it() {
        let v = "abcd".repeat(15);
        let vars = [("DPREC_AUTH__LINK_SECRET".to_string(), v.clone())].into_iter();
        let e = Settings::from_tree_and_env(toml::Table::new(), vars).unwrap_err();
        let e = format!("{e:#}");
        assert!(
            e.contains("DPREC_AUTH__LINK_SECRET") && e.contains("64 hex digits"),
            "{e}"
        );
        assert!(!e.contains(&v), "{e}");
        let ok = "ab".repeat(32);
        let vars = [("DPREC_AUTH__LINK_SECRET".to_string(), ok.clone())].into_iter();
        let s = Settings::from_tree_and_env(toml::Table::new(), vars).unwrap();
        assert_eq!(s.auth.link_secret.as_deref(), Some(ok.as_str()));
    }

    #[test]
    fn unknown_keys_and_bad_values_are_rejected() {
        let t: toml::Table = "[server]\nbindd = \"x\"\n".parse().unwrap();
        assert!(toml::Value::Table(t).try_into::<Settings>().is_err());
        // A bad share policy fails when the file is loaded, naming the key and the form.
        for bad in ["\"half\"", "\"fraction:1.5\"", "\"split:0\"", "0.25"] {
            let t: toml::Table = format!("[budget]\nshare = {bad}\n").parse().unwrap();
            let e = Settings::from_tree_and_env(t, std::iter::empty()).unwrap_err();
            let e = format!("{e:#}");
            assert!(
                e.contains("budget.share") && e.contains("fraction:F (0 < F <= 1)"),
                "{bad}: {e}"
            );
        }
        let t: toml::Table = "[budget]\nshare = \"split:4\"\n".parse().unwrap();
        let s = Settings::from_tree_and_env(t, std::iter::empty()).unwrap();
        assert_eq!(s.budget.share, SharePolicy::Split(4));
        let mut s = Settings::default();
        s.budget.default_user_delta = 1.0;
        assert!(s.validate().is_err());
        assert!(Settings::default().validate().is_ok());
    }

    /// The rating-level switch: off by default, set from the file or the environment (a
    /// value that is not a boolean names the variable); a rating-level trainer without it
    /// and the switch with any other trainer are refused, naming the switch.
    #[test]
    fn rating_level_switch_is_off_by_default_and_checked_against_the_trainer() {
        use crate::train::Guarantee;
        assert!(!Settings::default().trainer.allow_rating_level);
        let t: toml::Table = "[trainer]\nallow_rating_level = true\n".parse().unwrap();
        let s = Settings::from_tree_and_env(t, std::iter::empty()).unwrap();
        assert!(s.trainer.allow_rating_level);
        let var = |v: &str| {
            let vars = [(
                "DPREC_TRAINER__ALLOW_RATING_LEVEL".to_string(),
                v.to_string(),
            )];
            Settings::from_tree_and_env(toml::Table::new(), vars.into_iter())
        };
        assert!(var("true").unwrap().trainer.allow_rating_level);
        let e = format!("{:#}", var("yes").unwrap_err());
        assert!(e.contains("DPREC_TRAINER__ALLOW_RATING_LEVEL"), "{e}");

        let off = Settings::default().trainer;
        let on = s.trainer;
        let e = off
            .check_rating_level("pdp-pmf", Guarantee::RatingLevel)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("trainer.allow_rating_level = true")
                && e.contains("DPREC_TRAINER__ALLOW_RATING_LEVEL=true")
                && e.contains("pdp-pmf"),
            "{e}"
        );
        on.check_rating_level("pdp-pmf", Guarantee::RatingLevel)
            .unwrap();
        for g in [Guarantee::Proven, Guarantee::NonPrivate, Guarantee::LocalDp] {
            off.check_rating_level("dp-topn", g).unwrap();
            let e = on.check_rating_level("dp-topn", g).unwrap_err().to_string();
            assert!(
                e.contains("trainer.allow_rating_level") && e.contains(g.as_str()),
                "{e}"
            );
        }
    }

    /// Issue 8 finding 8: a configured trainer.seed is refused with an error naming the
    /// key (it used to be accepted and replayed the same noise in every release).
    #[test]
    fn trainer_seed_is_refused() {
        let t: toml::Table = "[trainer]\nseed = 7\n".parse().unwrap();
        let e = Settings::from_tree_and_env(t, std::iter::empty()).unwrap_err();
        assert!(format!("{e:#}").contains("trainer.seed"), "{e:#}");
        let vars = [("DPREC_TRAINER__SEED".to_string(), "7".to_string())].into_iter();
        let e = Settings::from_tree_and_env(toml::Table::new(), vars).unwrap_err();
        assert!(format!("{e:#}").contains("DPREC_TRAINER__SEED"), "{e:#}");
    }

    /// The serving cache's bounds: defaults, set from the environment, 0 refused naming
    /// the key.
    #[test]
    fn cache_bounds_are_settings() {
        let d = Settings::default();
        assert_eq!(
            (d.server.cache_users, d.server.cache_ratings),
            (1_000_000, 20_000_000)
        );
        let vars = [("DPREC_SERVER__CACHE_USERS".to_string(), "5000".to_string())];
        let s = Settings::from_tree_and_env(toml::Table::new(), vars.into_iter()).unwrap();
        assert_eq!(s.server.cache_users, 5000);
        let t: toml::Table = "[server]\ncache_ratings = 0\n".parse().unwrap();
        let e = Settings::from_tree_and_env(t, std::iter::empty()).unwrap_err();
        assert!(format!("{e:#}").contains("server.cache_ratings"), "{e:#}");
    }

    /// Issue 11: `retrain.min_input_ratio` defaults to 0.5, is settable from the
    /// environment, and values outside [0, 1] (or not numbers) are refused at load.
    #[test]
    fn min_input_ratio_is_validated() {
        assert_eq!(Settings::default().retrain.min_input_ratio, 0.5);
        let vars = [(
            "DPREC_RETRAIN__MIN_INPUT_RATIO".to_string(),
            "0".to_string(),
        )];
        let s = Settings::from_tree_and_env(toml::Table::new(), vars.into_iter()).unwrap();
        assert_eq!(s.retrain.min_input_ratio, 0.0);
        for bad in ["1.5", "-0.1", "\"half\""] {
            let t: toml::Table = format!("[retrain]\nmin_input_ratio = {bad}\n")
                .parse()
                .unwrap();
            let e = Settings::from_tree_and_env(t, std::iter::empty()).unwrap_err();
            assert!(format!("{e:#}").contains("min_input_ratio"), "{bad}: {e:#}");
        }
    }

    /// Issue 23: `release.mode` defaults to independent, `continual` is set from the
    /// environment, and is refused without a plan, with a trainer whose release is not
    /// DP popularity, or with a cap of 0; an unknown mode names the key.
    #[test]
    fn release_mode_is_validated() {
        assert_eq!(Settings::default().release.mode, ReleaseMode::Independent);
        let vars = [("DPREC_RELEASE__MODE".to_string(), "continual".to_string())];
        let s = Settings::from_tree_and_env(toml::Table::new(), vars.into_iter()).unwrap();
        assert_eq!(s.release.mode, ReleaseMode::Continual);
        for (toml, key) in [
            ("[budget]\nplanned_releases = 0", "planned_releases"),
            ("[trainer]\nname = \"dp-alt\"", "trainer.name"),
            ("[release]\ncontinual_cap = 0", "continual_cap"),
        ] {
            let t: toml::Table = format!("{toml}\n").parse().unwrap();
            let vars = [("DPREC_RELEASE__MODE".to_string(), "continual".to_string())];
            let e = Settings::from_tree_and_env(t, vars.into_iter()).unwrap_err();
            assert!(format!("{e:#}").contains(key), "{toml}: {e:#}");
        }
        let t: toml::Table = "[release]\nmode = \"daily\"\n".parse().unwrap();
        let e = Settings::from_tree_and_env(t, std::iter::empty()).unwrap_err();
        assert!(format!("{e:#}").contains("release.mode"), "{e:#}");
    }

    /// Issue 8 finding 9: the bounds on user budgets are validated at load.
    #[test]
    fn user_budget_bounds_are_validated() {
        let mut s = Settings::default();
        s.budget.max_user_eps = 5.0;
        let e = s.validate().unwrap_err();
        assert!(format!("{e:#}").contains("budget.max_user_eps"), "{e:#}");
        let mut s = Settings::default();
        s.budget.max_user_delta = 1e-7;
        let e = s.validate().unwrap_err();
        assert!(format!("{e:#}").contains("budget.max_user_delta"), "{e:#}");
        let mut s = Settings::default();
        s.budget.max_user_delta = 1.0;
        assert!(s.validate().is_err());
        let mut s = Settings::default();
        s.auth.keys.push(ApiKey {
            key: "a-user-token-in-the-file".into(),
            role: Role::User,
        });
        assert!(format!("{:#}", s.validate().unwrap_err()).contains("--role user"));
    }

    /// A key listed twice with different roles is refused at load, naming both entries
    /// (the key itself is not printed); the same key twice with one role is harmless.
    #[test]
    fn a_key_with_two_roles_is_refused() {
        let key = |k: &str, role| ApiKey {
            key: k.into(),
            role,
        };
        let mut s = Settings::default();
        s.auth.keys = vec![
            key("reader-key-0123456789", Role::Reader),
            key("shared-key-0123456789", Role::Reader),
            key("shared-key-0123456789", Role::Admin),
        ];
        let e = s.validate().unwrap_err().to_string();
        assert!(
            e.contains("entries 2 and 3") && e.contains("different roles"),
            "{e}"
        );
        assert!(!e.contains("shared-key"), "{e}");
        s.auth.keys[2].role = Role::Reader;
        s.validate().unwrap();
    }

    /// The sample file's placeholder keys (and other obvious non-secrets) stop start-up
    /// with keys on; with auth off (`--dev-no-auth`) the same file loads.
    #[test]
    fn placeholder_keys_are_refused_unless_auth_is_off() {
        let sample = include_str!("../deploy/dprec.toml");
        let tree: toml::Table = sample.parse().unwrap();
        let keys = |k: &str| -> toml::Value {
            let mut t = toml::Table::new();
            t.insert("key".into(), k.into());
            t.insert("role".into(), "admin".into());
            toml::Value::Array(vec![toml::Value::Table(t)])
        };
        let with_key = |k: &str| {
            let mut t = tree.clone();
            let auth = t.get_mut("auth").unwrap().as_table_mut().unwrap();
            auth.insert("keys".into(), keys(k));
            t
        };
        for bad in ["CHANGE-ME-admin-0000000000000000", "abcd0000000000001234"] {
            let e = Settings::from_tree_and_env(with_key(bad), std::iter::empty()).unwrap_err();
            let e = format!("{e:#}");
            assert!(e.contains("entry 1") && e.contains("placeholder"), "{e}");
            assert!(!e.contains(bad), "the key itself is not printed: {e}");
            let off = [("DPREC_AUTH__MODE".to_string(), "disabled".to_string())];
            Settings::from_tree_and_env(with_key(bad), off.into_iter()).unwrap();
        }
        let random = "9f8e2c41d07b5a36e1c8f04b72d9a5e3";
        Settings::from_tree_and_env(with_key(random), std::iter::empty()).unwrap();
    }
}
