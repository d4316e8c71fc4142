//! Replicas and restarts (issue 12): servers starting together on a fresh PostgreSQL
//! database, a restarted instance taking over its own dead trainer lease, the lease renewed
//! during a release longer than its lifetime.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dprec::retrain::Hooks;
use dprec::store::Store;
use dprec::train::{Fitted, Guarantee, TrainData, TrainError, Trainer};
use dprec_dp::accountant::PrivacyEvent;
use dprec_dp::rng::DpRng;

use crate::api::fake::FakeDp;
use crate::api::helpers::*;
use crate::both_backends;

/// [`FakeDp`] whose fit takes `delay` (training longer than the lease).
struct Slow {
    inner: Arc<FakeDp>,
    delay: Duration,
}

impl Trainer for Slow {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn params(&self) -> serde_json::Value {
        self.inner.params()
    }
    fn guarantee(&self) -> Guarantee {
        self.inner.guarantee()
    }
    fn planned_user_event(&self) -> Option<PrivacyEvent> {
        self.inner.planned_user_event()
    }
    fn user_level_event(&self, max_ratings: u64) -> Option<PrivacyEvent> {
        self.inner.user_level_event(max_ratings)
    }
    fn rating_cap(&self) -> Option<f64> {
        self.inner.rating_cap()
    }
    fn fit(&self, data: &TrainData<'_>, rng: &mut DpRng) -> Result<Fitted, TrainError> {
        std::thread::sleep(self.delay);
        self.inner.fit(data, rng)
    }
}

/// Two servers started at the same instant on a fresh PostgreSQL database both come up
/// (the migrations, including the creation of their own table, run under one advisory
/// lock). Three rounds, each on a new database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_start_together_on_fresh_postgres() {
    for round in 0..3 {
        let Some(db) = TestDb::new(Kind::Postgres, &format!("together{round}")).await else {
            return;
        };
        let (t1, _) = FakeDp::gaussian(5.0);
        let (t2, _) = FakeDp::gaussian(5.0);
        let (a, b) = tokio::join!(
            TestApp::try_spawn(settings(&db.url), Some(t1 as Arc<_>), Hooks::default()),
            TestApp::try_spawn(settings(&db.url), Some(t2 as Arc<_>), Hooks::default()),
        );
        let a = a.unwrap_or_else(|e| panic!("round {round}: first server: {e:#}"));
        let b = b.unwrap_or_else(|e| panic!("round {round}: second server: {e:#}"));
        for app in [&a, &b] {
            let (st, _) = app.get("/readyz", "").await;
            assert_eq!(st, 200);
        }
        a.handle_stop().await;
        b.stop().await;
    }
}

fn ratings() -> Vec<(String, String, f64)> {
    (0..12)
        .flat_map(|u| {
            (0..4).map(move |i| (format!("u{u}"), format!("i{i}"), (1 + (u + i) % 5) as f64))
        })
        .collect()
}

async fn ingest(app: &TestApp) {
    let r = ratings();
    let refs: Vec<(&str, &str, f64, Option<f64>)> = r
        .iter()
        .map(|(u, i, v)| (u.as_str(), i.as_str(), *v, None))
        .collect();
    app.ingest(&refs).await;
}

/// kill -9 during a release leaves a `running` job and the dead process's lease. Another
/// instance must still wait for the lease to expire; the same instance, restarted, takes
/// it over at once, marks the old job failed and can retrain immediately.
async fn restart_takes_over_own_dead_lease(url: &str) {
    let store = Store::connect(url, 2).await.unwrap();
    let old_job = store.create_job("admin").await.unwrap();
    assert!(store
        .acquire_lease("node-a#4242-1-00000000deadbeef", 900)
        .await
        .unwrap());
    store.close().await;

    let (t, _) = FakeDp::gaussian(5.0);
    let mut s = settings(url);
    s.scheduler.instance_id = Some("node-b".into());
    let b = TestApp::spawn(s, t as Arc<_>, Hooks::default()).await;
    ingest(&b).await;
    let job = b.retrain().await;
    assert_ne!(job.status, "succeeded", "{job:?}");
    assert!(
        job.reason
            .as_deref()
            .unwrap_or("")
            .contains("another instance"),
        "{job:?}"
    );
    let (_, old) = b.get(&format!("/v1/admin/jobs/{old_job}"), ADMIN).await;
    assert_eq!(
        old["status"], "running",
        "another instance must not sweep it: {old}"
    );
    b.stop().await;

    let (t, _) = FakeDp::gaussian(5.0);
    let mut s = settings(url);
    s.scheduler.instance_id = Some("node-a".into());
    let a = TestApp::spawn(s, t as Arc<_>, Hooks::default()).await;
    let (_, old) = a.get(&format!("/v1/admin/jobs/{old_job}"), ADMIN).await;
    assert_eq!(old["status"], "failed", "{old}");
    assert!(
        old["reason"].as_str().unwrap_or("").contains("abandoned"),
        "{old}"
    );
    let job = a.retrain().await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    a.stop().await;
}
both_backends!(restart_takes_over_own_dead_lease);

/// With a 1 s lease and a 3 s training run, the lease is renewed: another holder cannot
/// take it at any point of the run (without renewal it could from 1 s on), and can once
/// the release is over.
async fn lease_renewed_during_long_release(url: &str) {
    let (fake, _) = FakeDp::gaussian(5.0);
    let slow = Arc::new(Slow {
        inner: fake,
        delay: Duration::from_millis(3000),
    });
    let mut s = settings(url);
    s.scheduler.lease_secs = 1;
    let app = TestApp::spawn(s, slow as Arc<_>, Hooks::default()).await;
    ingest(&app).await;
    let (st, job) = app
        .post("/v1/admin/retrain", ADMIN, &serde_json::json!({}))
        .await;
    assert_eq!(st, 202, "{job}");
    let id = job["id"].as_i64().unwrap();
    let start = Instant::now();
    let mut checks = 0;
    tokio::time::sleep(Duration::from_millis(300)).await;
    while start.elapsed() < Duration::from_millis(2700) {
        let took = app.store.acquire_lease("intruder#1", 1).await.unwrap();
        assert!(
            !took,
            "lease taken at {:?} of a 3 s release",
            start.elapsed()
        );
        checks += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(checks >= 8, "{checks}");
    let job = app.wait_job(id).await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    assert!(app.store.acquire_lease("intruder#1", 1).await.unwrap());
    app.stop().await;
}
both_backends!(lease_renewed_during_long_release);
