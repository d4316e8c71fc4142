//! Spawns the real service on 127.0.0.1:0 over SQLite (temp file) or PostgreSQL (a
//! uniquely named database created and dropped by the test), and talks to it over HTTP.
//! Every response goes through [`TestApp::send`], which checks it against the committed
//! openapi/openapi.json (`helpers/spec.rs`); the typed helpers (`app.audit(user, "")`,
//! `app.retrain()`, ...) return the API's own response types.

use std::sync::Arc;
use std::time::Duration;

use dprec::config::{ApiKey, Role, Settings};
use dprec::retrain::Hooks;
use dprec::startup::Application;
use dprec::store::Store;
use dprec::train::Trainer;
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use dprec::api::admin::{CreatedKey, Job, KeyList};
pub use dprec::api::models::{CurrentModel, ItemProfiles, ReleaseList};
pub use dprec::api::recommend::{Recommendations, SimilarItems};
pub use dprec::api::users::{Audit, UserSettings};
pub use dprec::api::Problem;

mod spec;
mod tastes;
pub use tastes::{tastes, topn_settings, Tastes};

pub const ADMIN: &str = "test-admin-key-0123456789";
pub const WRITER: &str = "test-writer-key-0123456789";
pub const READER: &str = "test-reader-key-0123456789";
pub const PUBLIC: &str = "test-public-key-0123456789";

/// The release noise seed of every test app (through [`Hooks::seed`], test-only).
pub const TEST_SEED: u64 = 7;

/// The PostgreSQL server the tests create their databases on (`DPREC_TEST_PG_URL`
/// overrides; it must name a database the tests can connect to, e.g. `postgres`).
fn pg_admin_url() -> String {
    std::env::var("DPREC_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// `pg_admin_url()` with the database name replaced.
fn pg_url_for(db: &str) -> String {
    let base = pg_admin_url();
    match base.rfind('/') {
        Some(i) if i > "postgres://".len() => format!("{}/{db}", &base[..i]),
        _ => format!("{base}/{db}"),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Sqlite,
    Postgres,
}

/// A database for one test; dropped (PostgreSQL) or deleted (SQLite) at the end.
pub struct TestDb {
    pub url: String,
    pg_name: Option<String>,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    /// `None` (with a visible SKIPPED message) when PostgreSQL is unreachable and not
    /// required (`DPREC_REQUIRE_POSTGRES=1` makes it mandatory).
    pub async fn new(kind: Kind, test: &str) -> Option<Self> {
        match kind {
            Kind::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let url = format!("sqlite://{}", dir.path().join("dprec.sqlite").display());
                Some(Self {
                    url,
                    pg_name: None,
                    _dir: Some(dir),
                })
            }
            Kind::Postgres => {
                use sqlx::Connection;
                let conn = tokio::time::timeout(
                    Duration::from_secs(5),
                    sqlx::PgConnection::connect(&pg_admin_url()),
                )
                .await;
                let mut conn = match conn {
                    Ok(Ok(c)) => c,
                    other => {
                        let why = match other {
                            Ok(Err(e)) => e.to_string(),
                            _ => "timeout".into(),
                        };
                        if std::env::var("DPREC_REQUIRE_POSTGRES").as_deref() == Ok("1") {
                            panic!("{test}: PostgreSQL unreachable ({why}) and DPREC_REQUIRE_POSTGRES=1");
                        }
                        // Written to the real stderr (not the captured test output),
                        // so a skipped backend is visible in a plain `cargo test`.
                        use std::io::Write;
                        let _ = writeln!(
                            std::io::stderr(),
                            "SKIPPED {test} [postgres]: PostgreSQL unreachable at {} ({why})",
                            pg_admin_url()
                        );
                        return None;
                    }
                };
                let name = format!(
                    "dprec_test_{}_{:08x}",
                    std::process::id(),
                    rand::random::<u32>()
                );
                sqlx::query(&format!("CREATE DATABASE {name}"))
                    .execute(&mut conn)
                    .await
                    .unwrap();
                Some(Self {
                    url: pg_url_for(&name),
                    pg_name: Some(name),
                    _dir: None,
                })
            }
        }
    }
}

/// The page-link secret file of a PostgreSQL test database: in the temporary directory,
/// named after the database (the service's default, `dprec.link-secret` in the working
/// directory, would land in the source tree); `None` for SQLite (beside its file).
pub fn link_secret_file(url: &str) -> Option<std::path::PathBuf> {
    let db = url.strip_prefix("postgres://")?.rsplit('/').next()?;
    Some(std::env::temp_dir().join(format!("{db}.link-secret")))
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(file) = link_secret_file(&self.url) {
            let _ = std::fs::remove_file(file);
        }
        if let Some(name) = self.pg_name.take() {
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    use sqlx::Connection;
                    if let Ok(mut c) = sqlx::PgConnection::connect(&pg_admin_url()).await {
                        let _ =
                            sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                                .execute(&mut c)
                                .await;
                    }
                });
            })
            .join();
        }
    }
}

/// Test settings: three keys, scheduler off, small limits (the noise is seeded through
/// [`Hooks::seed`] by [`TestApp::try_spawn`]: the configuration refuses `trainer.seed`).
pub fn settings(url: &str) -> Settings {
    let mut s = Settings::default();
    s.server.bind = "127.0.0.1:0".into();
    s.server.max_batch = 50;
    s.server.max_body_bytes = 16 * 1024;
    s.database.url = url.into();
    s.database.max_connections = 5;
    s.auth.link_secret_file = link_secret_file(url).map(|p| p.display().to_string());
    s.auth.keys = vec![
        ApiKey {
            key: ADMIN.into(),
            role: Role::Admin,
        },
        ApiKey {
            key: WRITER.into(),
            role: Role::Writer,
        },
        ApiKey {
            key: READER.into(),
            role: Role::Reader,
        },
        ApiKey {
            key: PUBLIC.into(),
            role: Role::Public,
        },
    ];
    s.scheduler.enabled = false;
    // The ledger tests were written for small eps_ij (exhaustion within a few releases).
    s.budget.default_rating_eps = 1.0;
    s.budget.max_rating_eps = 10.0;
    s.budget.share = dprec_dp::ledger::SharePolicy::Fraction(0.4);
    s.budget.popularity_eps = 0.01;
    // Releases visible at their commit (the public deadline has its own test).
    s.release.publish_delay_secs = 0;
    s
}

pub struct TestApp {
    pub base: String,
    pub client: reqwest::Client,
    pub store: Store,
    pub app_registry: Arc<dprec::serve::Registry>,
    pub bootstrap_key: Option<String>,
    handle: actix_web::dev::ServerHandle,
}

impl TestApp {
    pub async fn spawn(s: Settings, trainer: Arc<dyn Trainer>, hooks: Hooks) -> TestApp {
        Self::try_spawn(s, Some(trainer), hooks)
            .await
            .expect("app builds")
    }

    pub async fn try_spawn(
        s: Settings,
        trainer: Option<Arc<dyn Trainer>>,
        mut hooks: Hooks,
    ) -> anyhow::Result<TestApp> {
        hooks.seed = hooks.seed.or(Some(TEST_SEED));
        let app = Application::build(s, trainer, hooks).await?;
        let base = format!("http://127.0.0.1:{}", app.port());
        let store = app.store.clone();
        let registry = app.registry.clone();
        let bootstrap_key = app.bootstrap_key.clone();
        let handle = app.handle();
        tokio::spawn(app.run_until_stopped());
        Ok(TestApp {
            base,
            client: reqwest::Client::new(),
            store,
            app_registry: registry,
            bootstrap_key,
            handle,
        })
    }

    pub async fn stop(&self) {
        self.handle.stop(true).await;
        self.store.close().await;
    }

    /// Stops the server only (the store may already be closed).
    pub async fn handle_stop(&self) {
        self.handle.stop(true).await;
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Sends a request built on `self.client` and checks the response against the
    /// committed OpenAPI document ([`spec::check_response`]): every response a test
    /// receives goes through here.
    pub async fn send(&self, req: reqwest::RequestBuilder) -> Raw {
        let req = req.build().expect("request builds");
        let method = req.method().to_string();
        let path = match req.url().query() {
            Some(q) => format!("{}?{q}", req.url().path()),
            None => req.url().path().to_string(),
        };
        let r = self.client.execute(req).await.expect("request sent");
        let status = r.status().as_u16();
        let content_type = r
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let text = r.text().await.expect("response body");
        spec::check_response(&method, &path, status, content_type.as_deref(), &text);
        Raw {
            status,
            content_type,
            text,
        }
    }

    /// `key` empty: no Authorization header.
    fn with_key(req: reqwest::RequestBuilder, key: &str) -> reqwest::RequestBuilder {
        if key.is_empty() {
            req
        } else {
            req.bearer_auth(key)
        }
    }

    pub async fn get(&self, path: &str, key: &str) -> (u16, Value) {
        let req = Self::with_key(self.client.get(self.url(path)), key);
        self.send(req).await.status_json()
    }

    pub async fn post(&self, path: &str, key: &str, body: &Value) -> (u16, Value) {
        let req = Self::with_key(self.client.post(self.url(path)), key).json(body);
        self.send(req).await.status_json()
    }

    pub async fn put(&self, path: &str, key: &str, body: &Value) -> (u16, Value) {
        let req = Self::with_key(self.client.put(self.url(path)), key).json(body);
        self.send(req).await.status_json()
    }

    pub async fn delete(&self, path: &str, key: &str) -> (u16, Value) {
        let req = Self::with_key(self.client.delete(self.url(path)), key);
        self.send(req).await.status_json()
    }

    /// GET that must answer 200; the body as the API's own response type.
    pub async fn get_ok<T: DeserializeOwned>(&self, path: &str, key: &str) -> T {
        let req = Self::with_key(self.client.get(self.url(path)), key);
        self.send(req).await.ok()
    }

    /// GET that must fail; the status and the problem document.
    pub async fn get_problem(&self, path: &str, key: &str) -> (u16, Problem) {
        let req = Self::with_key(self.client.get(self.url(path)), key);
        self.send(req).await.problem()
    }

    /// `GET /v1/users/{user}/budget` (reader key); `query` e.g. `"limit=1"` or `""`.
    pub async fn audit(&self, user: &str, query: &str) -> Audit {
        self.get_ok(
            &with_query(&format!("/v1/users/{user}/budget"), query),
            READER,
        )
        .await
    }

    /// `GET /v1/users/{user}/recommendations` (reader key); `query` e.g. `"n=5"`.
    pub async fn recommendations(&self, user: &str, query: &str) -> Recommendations {
        self.get_ok(
            &with_query(&format!("/v1/users/{user}/recommendations"), query),
            READER,
        )
        .await
    }

    /// `GET /v1/items/{item}/similar?n=N` (reader key).
    pub async fn similar(&self, item: &str, n: usize) -> SimilarItems {
        self.get_ok(&format!("/v1/items/{item}/similar?n={n}"), READER)
            .await
    }

    /// `GET /v1/users/{user}/settings` (reader key).
    pub async fn user_settings(&self, user: &str) -> UserSettings {
        self.get_ok(&format!("/v1/users/{user}/settings"), READER)
            .await
    }

    /// `GET /v1/models` (reader key); `query` e.g. `"limit=1&offset=1"`.
    pub async fn models(&self, query: &str) -> ReleaseList {
        self.get_ok(&with_query("/v1/models", query), READER).await
    }

    /// `GET /v1/models/current` (reader key).
    pub async fn current_model(&self) -> CurrentModel {
        self.get_ok("/v1/models/current", READER).await
    }

    /// `GET /v1/models/current/items` (reader key).
    pub async fn item_profiles(&self) -> ItemProfiles {
        self.get_ok("/v1/models/current/items", READER).await
    }

    /// `GET /v1/admin/jobs/{id}` (admin key).
    pub async fn job(&self, id: i64) -> Job {
        self.get_ok(&format!("/v1/admin/jobs/{id}"), ADMIN).await
    }

    /// `POST /v1/admin/keys` (admin key): a new key with `role`, bound to `user` for a
    /// user token; panics unless 201.
    pub async fn create_key(&self, role: &str, user: Option<&str>) -> CreatedKey {
        let mut body = serde_json::json!({"role": role});
        if let Some(u) = user {
            body["user"] = serde_json::json!(u);
        }
        let req = self
            .client
            .post(self.url("/v1/admin/keys"))
            .bearer_auth(ADMIN)
            .json(&body);
        let r = self.send(req).await;
        assert_eq!(r.status, 201, "{}", r.text);
        serde_json::from_str(&r.text).expect("a created key")
    }

    /// Registers `items` in the public catalogue (`POST /v1/admin/items`, writer key, 50
    /// per request); panics unless 200.
    pub async fn register<S: AsRef<str>>(&self, items: &[S]) {
        let ids: Vec<&str> = items.iter().map(AsRef::as_ref).collect();
        for chunk in ids.chunks(50) {
            let (st, body) = self
                .post(
                    "/v1/admin/items",
                    WRITER,
                    &serde_json::json!({"items": chunk}),
                )
                .await;
            assert_eq!(st, 200, "{body}");
        }
    }

    /// Registers the items of `ratings` that are not registered yet (items are never
    /// created by ratings), then ingests the ratings ([`Self::ingest_registered`]).
    pub async fn ingest(&self, ratings: &[(&str, &str, f64, Option<f64>)]) {
        let items: std::collections::BTreeSet<&str> = ratings.iter().map(|r| r.1).collect();
        let mut new = Vec::new();
        for i in items {
            if !self.store.in_catalogue(i).await.unwrap() {
                new.push(i);
            }
        }
        if !new.is_empty() {
            self.register(&new).await;
        }
        self.ingest_registered(ratings).await;
    }

    /// Ingests `(user, item, rating, eps)` tuples of registered items; panics unless 200.
    pub async fn ingest_registered(&self, ratings: &[(&str, &str, f64, Option<f64>)]) {
        let items: Vec<Value> = ratings
            .iter()
            .map(|(u, i, r, e)| {
                let mut v = serde_json::json!({"user": u, "item": i, "rating": r});
                if let Some(e) = e {
                    v["eps"] = serde_json::json!(e);
                }
                v
            })
            .collect();
        for chunk in items.chunks(50) {
            let (st, body) = self
                .post(
                    "/v1/ratings",
                    WRITER,
                    &serde_json::json!({"ratings": chunk}),
                )
                .await;
            assert_eq!(st, 200, "{body}");
        }
    }

    /// Triggers a retrain and waits for the job to finish; returns the job.
    pub async fn retrain(&self) -> Job {
        let req = self
            .client
            .post(self.url("/v1/admin/retrain"))
            .bearer_auth(ADMIN)
            .json(&serde_json::json!({}));
        let r = self.send(req).await;
        assert_eq!(r.status, 202, "{}", r.text);
        let job: Job = serde_json::from_str(&r.text).expect("a job");
        self.wait_job(job.id).await
    }

    /// The stored row of a job's release, with the exact counts the API does not publish.
    pub async fn stored_release(&self, job: &Job) -> dprec::store::ReleaseRow {
        self.store
            .release(job.release_id.expect("the job published a release"))
            .await
            .unwrap()
            .expect("the release is stored")
    }

    /// Polls a job until it is no longer `running`.
    pub async fn wait_job(&self, id: i64) -> Job {
        for _ in 0..600 {
            let job = self.job(id).await;
            if job.status != "running" {
                return job;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("job {id} did not finish");
    }
}

/// `path?query`, or `path` when `query` is empty.
fn with_query(path: &str, query: &str) -> String {
    if query.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{query}")
    }
}

/// A response, already checked against the spec.
pub struct Raw {
    pub status: u16,
    pub content_type: Option<String>,
    pub text: String,
}

impl Raw {
    /// The body as JSON (`Null` when empty, a JSON string when not JSON).
    pub fn json(&self) -> Value {
        if self.text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&self.text).unwrap_or(Value::String(self.text.clone()))
        }
    }

    pub fn status_json(self) -> (u16, Value) {
        (self.status, self.json())
    }

    /// Asserts 200 and decodes the body as `T`.
    pub fn ok<T: DeserializeOwned>(self) -> T {
        assert_eq!(self.status, 200, "{}", self.text);
        serde_json::from_str(&self.text).unwrap_or_else(|e| {
            panic!(
                "decoding {}: {e}: {}",
                std::any::type_name::<T>(),
                self.text
            )
        })
    }

    /// Asserts a problem+json error and decodes it.
    pub fn problem(self) -> (u16, Problem) {
        assert!(
            self.status >= 400,
            "expected an error, got {}: {}",
            self.status,
            self.text
        );
        assert_eq!(
            self.content_type.as_deref(),
            Some("application/problem+json"),
            "{}",
            self.text
        );
        let p: Problem = serde_json::from_str(&self.text).expect("a problem document");
        assert_eq!(p.status, self.status, "{}", self.text);
        (self.status, p)
    }
}

/// Runs a test body once per backend. The body gets the database URL.
#[macro_export]
macro_rules! both_backends {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                let db = $crate::api::helpers::TestDb::new(
                    $crate::api::helpers::Kind::Sqlite,
                    stringify!($name),
                )
                .await
                .unwrap();
                super::$name(&db.url).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                if let Some(db) = $crate::api::helpers::TestDb::new(
                    $crate::api::helpers::Kind::Postgres,
                    stringify!($name),
                )
                .await
                {
                    super::$name(&db.url).await;
                }
            }
        }
    };
}
