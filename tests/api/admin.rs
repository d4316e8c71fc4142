//! The scheduler (a release every interval, on a fixed schedule) and
//! `dprec import` against a running server.

use std::time::Duration;

use dprec::retrain::Hooks;

use crate::api::fake::FakeDp;
use crate::api::helpers::*;
use crate::both_backends;

/// Issue 8 finding 7: the scheduler releases on its fixed schedule, whatever the number
/// of new ratings (before the fix, 2 new ratings below `min_new_ratings = 3` gave no
/// release: the release times published that count).
async fn scheduler_releases_on_a_fixed_schedule(url: &str) {
    let mut s = settings(url);
    s.scheduler.enabled = true;
    s.scheduler.retrain_interval_secs = 1;
    let (t, _) = FakeDp::gaussian(20.0);
    let app = TestApp::spawn(s, t, Hooks::default()).await;
    app.ingest(&[("u1", "a", 4.0, None), ("u2", "a", 3.0, None)])
        .await;
    let mut published = None;
    for _ in 0..60 {
        if let Some(p) = app.app_registry.current() {
            published = Some(p.release_id);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let id = published.expect("the scheduler published a release");
    let (_, list) = app.get("/v1/models", READER).await;
    assert_eq!(list["releases"][0]["id"].as_i64(), Some(id));
    let job = list["releases"][0]["job_id"].as_i64().unwrap();
    let (_, j) = app.get(&format!("/v1/admin/jobs/{job}"), ADMIN).await;
    assert_eq!(j["kind"], "scheduled");
    app.stop().await;
}
both_backends!(scheduler_releases_on_a_fixed_schedule);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_loads_movielens_files_in_batches() {
    let db = TestDb::new(Kind::Sqlite, "import").await.unwrap();
    let (t, _) = FakeDp::gaussian(20.0);
    let app = TestApp::spawn(settings(&db.url), t, Hooks::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("u.data");
    let mut text = String::new();
    for u in 1..=12 {
        for i in 1..=10 {
            text.push_str(&format!("{u}\t{i}\t{}\t88125000{u}\n", 1 + (u + i) % 5));
        }
    }
    std::fs::write(&file, text).unwrap();
    let args = dprec::cli::import::ImportArgs {
        url: app.base.clone(),
        api_key: Some(WRITER.into()),
        eps: Some(0.7),
        batch: 50,
        limit: None,
        path: file,
    };
    tokio::task::spawn_blocking(move || dprec::cli::import::run(args))
        .await
        .unwrap()
        .unwrap();
    let c = app.store.counts().await.unwrap();
    assert_eq!((c.ratings, c.users, c.items), (120, 12, 10));
    let (_, a) = app.get("/v1/users/3/budget", READER).await;
    assert_eq!(a["ratings"]["entries"][0]["eps"].as_f64(), Some(0.7));
    // A reader key is refused and the error is reported.
    let args = dprec::cli::import::ImportArgs {
        url: app.base.clone(),
        api_key: Some(READER.into()),
        eps: None,
        batch: 50,
        limit: None,
        path: dir.path().join("u.data"),
    };
    let err = tokio::task::spawn_blocking(move || dprec::cli::import::run(args))
        .await
        .unwrap()
        .unwrap_err();
    assert!(format!("{err:#}").contains("403"), "{err:#}");
    app.stop().await;
}

/// Issue 44 (2.8): `dprec import` checks its arguments before any request: a bad
/// `--eps` is an error naming the flag and the rule, and nothing is registered.
async fn import_checks_its_arguments_first(url: &str) {
    let (t, _) = FakeDp::gaussian(20.0);
    let app = TestApp::spawn(settings(url), t, Hooks::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("u.data");
    std::fs::write(&file, "1\t1\t4\t881250001\n2\t2\t3\t881250002\n").unwrap();
    for eps in [-1.0, 0.0, f64::NAN, f64::INFINITY] {
        let args = dprec::cli::import::ImportArgs {
            url: app.base.clone(),
            api_key: Some(WRITER.into()),
            eps: Some(eps),
            batch: 50,
            limit: None,
            path: file.clone(),
        };
        let err = tokio::task::spawn_blocking(move || dprec::cli::import::run(args))
            .await
            .unwrap()
            .unwrap_err();
        let err = format!("{err:#}");
        assert!(
            err.contains("--eps must be a finite number >="),
            "{eps}: {err}"
        );
    }
    let c = app.store.counts().await.unwrap();
    assert_eq!((c.ratings, c.users, c.items), (0, 0, 0));
    app.stop().await;
}
both_backends!(import_checks_its_arguments_first);

/// A job left `running` by a stopped process is marked failed at the next start.
async fn abandoned_jobs_are_failed_at_start(url: &str) {
    let (t, _) = FakeDp::gaussian(20.0);
    let app = TestApp::spawn(settings(url), t.clone(), Hooks::default()).await;
    let id = app.store.create_job("admin").await.unwrap();
    sqlx::query("UPDATE jobs SET created_at = 0 WHERE id = $1")
        .bind(id)
        .execute(app.store.pool())
        .await
        .unwrap();
    app.stop().await;
    let again = TestApp::spawn(settings(url), t, Hooks::default()).await;
    let job = again.job(id).await;
    assert_eq!(job.status, "failed", "{job:?}");
    assert!(job.reason.as_deref().unwrap().contains("abandoned"));
    again.stop().await;
}
both_backends!(abandoned_jobs_are_failed_at_start);
