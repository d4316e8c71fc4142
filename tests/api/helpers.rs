//! Spawns the real service on 127.0.0.1:0 over SQLite (temp file) or PostgreSQL (a
//! uniquely named database created and dropped by the test).

use std::sync::Arc;
use std::time::Duration;

use dprec::config::{ApiKey, Role, Settings};
use dprec::retrain::Hooks;
use dprec::startup::Application;
use dprec::store::Store;
use dprec::train::Trainer;
use serde_json::Value;

pub const ADMIN: &str = "test-admin-key-0123456789";
pub const WRITER: &str = "test-writer-key-0123456789";
pub const READER: &str = "test-reader-key-0123456789";

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

impl Drop for TestDb {
    fn drop(&mut self) {
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

/// Test settings: three keys, scheduler off, seeded noise, small limits.
pub fn settings(url: &str) -> Settings {
    let mut s = Settings::default();
    s.server.bind = "127.0.0.1:0".into();
    s.server.max_batch = 50;
    s.server.max_body_bytes = 16 * 1024;
    s.database.url = url.into();
    s.database.max_connections = 5;
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
    ];
    s.scheduler.enabled = false;
    s.trainer.seed = Some(7);
    s.budget.share = "fraction:0.4".into();
    s.budget.popularity_eps = 0.01;
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
        hooks: Hooks,
    ) -> anyhow::Result<TestApp> {
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

    pub async fn get(&self, path: &str, key: &str) -> (u16, Value) {
        let r = self
            .client
            .get(self.url(path))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        status_json(r).await
    }

    pub async fn post(&self, path: &str, key: &str, body: &Value) -> (u16, Value) {
        let r = self
            .client
            .post(self.url(path))
            .bearer_auth(key)
            .json(body)
            .send()
            .await
            .unwrap();
        status_json(r).await
    }

    pub async fn put(&self, path: &str, key: &str, body: &Value) -> (u16, Value) {
        let r = self
            .client
            .put(self.url(path))
            .bearer_auth(key)
            .json(body)
            .send()
            .await
            .unwrap();
        status_json(r).await
    }

    pub async fn delete(&self, path: &str, key: &str) -> (u16, Value) {
        let r = self
            .client
            .delete(self.url(path))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        status_json(r).await
    }

    /// Ingests `(user, item, rating, eps)` tuples; panics unless 200.
    pub async fn ingest(&self, ratings: &[(&str, &str, f64, Option<f64>)]) {
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
    pub async fn retrain(&self) -> Value {
        let (st, job) = self
            .post("/v1/admin/retrain", ADMIN, &serde_json::json!({}))
            .await;
        assert_eq!(st, 202, "{job}");
        let id = job["id"].as_i64().unwrap();
        self.wait_job(id).await
    }

    pub async fn wait_job(&self, id: i64) -> Value {
        for _ in 0..600 {
            let (st, job) = self.get(&format!("/v1/admin/jobs/{id}"), ADMIN).await;
            assert_eq!(st, 200);
            if job["status"] != "running" {
                return job;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("job {id} did not finish");
    }
}

pub async fn status_json(r: reqwest::Response) -> (u16, Value) {
    let st = r.status().as_u16();
    let text = r.text().await.unwrap();
    let v = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    };
    (st, v)
}

/// Runs a test body once per backend. The body gets the database URL.
#[macro_export]
macro_rules! both_backends {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                let db =
                    $crate::helpers::TestDb::new($crate::helpers::Kind::Sqlite, stringify!($name))
                        .await
                        .unwrap();
                super::$name(&db.url).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                if let Some(db) =
                    $crate::helpers::TestDb::new($crate::helpers::Kind::Postgres, stringify!($name))
                        .await
                {
                    super::$name(&db.url).await;
                }
            }
        }
    };
}
