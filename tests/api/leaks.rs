//! What a caller without a key (or with a public key) can read must not depend on the
//! data: request counts and statuses on /metrics, the times a release is published at,
//! and whether a release exists at all on an almost empty store.

use dprec::retrain::Hooks;
use serde_json::json;

use crate::api::catalogue::{catalogue, data_d, metrics_without_clock};
use crate::api::helpers::*;
use crate::both_backends;

/// A fresh second database of the backend of `url`, for a two-server test.
async fn second_db(url: &str, test: &str) -> TestDb {
    let kind = if url.starts_with("sqlite:") {
        Kind::Sqlite
    } else {
        Kind::Postgres
    };
    TestDb::new(kind, test)
        .await
        .expect("the first database of this backend was created")
}

/// Waits for job `id` in the store (no HTTP request, so both servers of a two-server test
/// see the same requests).
async fn wait_in_store(app: &TestApp, id: i64) -> dprec::store::JobRow {
    loop {
        let j = app.store.job(id).await.unwrap().unwrap();
        if j.status != "running" {
            return j;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Posts a retrain (admin key) and waits for its job in the store.
async fn release_in_store(app: &TestApp) -> dprec::store::JobRow {
    let (st, job) = app.post("/v1/admin/retrain", ADMIN, &json!({})).await;
    assert_eq!(st, 202, "{job}");
    wait_in_store(app, job["id"].as_i64().unwrap()).await
}

/// `GET /metrics` with `key` (none when empty).
async fn metrics(app: &TestApp, key: &str) -> Raw {
    let mut req = app.client.get(app.url("/metrics"));
    if !key.is_empty() {
        req = req.bearer_auth(key);
    }
    app.send(req).await
}

/// D: the catalogue data; D' sends one more rating, of a new user, in a request of its
/// own, and deletes a rating that exists where D deletes one that does not. Then one
/// release each. Returns the key-less /metrics (clock readings normalised).
async fn keyless_metrics_after(url: &str, neighbour: bool) -> String {
    let app = TestApp::try_spawn(topn_settings(url), None, Hooks::default())
        .await
        .unwrap();
    app.register(&catalogue()).await;
    let d = data_d();
    let rows: Vec<(&str, &str, f64, Option<f64>)> = d
        .iter()
        .map(|(u, i, v, e)| (u.as_str(), i.as_str(), *v, *e))
        .collect();
    app.ingest_registered(&rows).await;
    let (user, rated) = (&d[0].0, &d[0].1);
    let deleted = if neighbour {
        app.ingest_registered(&[("zz-new", "c3", 4.0, Some(0.05))])
            .await;
        rated.as_str()
    } else {
        "c4"
    };
    let (st, _) = app
        .delete(&format!("/v1/users/{user}/ratings/{deleted}"), WRITER)
        .await;
    assert_eq!(st, if neighbour { 204 } else { 404 });
    assert_eq!(release_in_store(&app).await.status, "succeeded");
    let r = metrics(&app, "").await;
    assert_eq!(r.status, 200);
    app.stop().await;
    metrics_without_clock(&r.text)
}

/// Key-less /metrics carries no request count, status or latency of a data-bearing
/// route: one more ingest request and a delete that finds its rating (204, where the
/// other server answers 404) leave it byte-identical.
async fn keyless_metrics_count_no_requests(url: &str) {
    let other = second_db(url, "keyless_metrics_count_no_requests").await;
    let a = keyless_metrics_after(url, false).await;
    let b = keyless_metrics_after(&other.url, true).await;
    assert_eq!(a, b, "key-less /metrics differs between D and D'");
    assert!(a.contains("dprec_model_release_id 1"), "{a}");
}
both_backends!(keyless_metrics_count_no_requests);

/// The full series (request counts, latencies, data-dependent counters) reach a
/// `metrics` key and the admin key; no other key, and no key, sees any of them. A
/// metrics key reads /metrics only.
async fn metrics_key_reads_the_full_series(url: &str) {
    let app = TestApp::try_spawn(topn_settings(url), None, Hooks::default())
        .await
        .unwrap();
    app.register(&catalogue()).await;
    app.ingest_registered(&[("u1", "a0", 4.0, None)]).await;
    let scraper = app.create_key("metrics", None).await;
    let token = app.create_key("user", Some("u1")).await;
    let full = [
        "dprec_http_requests_total",
        "dprec_http_request_duration_seconds",
        "dprec_ratings_ingested_total 1",
        "dprec_store_errors_total",
    ];
    for key in [ADMIN, scraper.key.as_str()] {
        let r = metrics(&app, key).await;
        assert_eq!(r.status, 200);
        for name in full {
            assert!(r.text.contains(name), "{name} missing: {}", r.text);
        }
    }
    for key in ["", PUBLIC, token.key.as_str(), READER, WRITER] {
        let r = metrics(&app, key).await;
        assert_eq!(r.status, 200, "{key:?}");
        for name in full {
            let name = name.split(' ').next().unwrap();
            assert!(
                !r.text.contains(name),
                "{name} shown to {key:?}: {}",
                r.text
            );
        }
        assert!(r.text.contains("dprec_model_release_id"), "{}", r.text);
    }
    for path in ["/v1/models", "/v1/items", "/v1/users/u1/budget"] {
        let (st, p) = app.get(path, &scraper.key).await;
        assert_eq!(st, 403, "{path}: {p}");
    }
    app.stop().await;
}
both_backends!(metrics_key_reads_the_full_series);

/// The public times of a release (`created_at` in the release list and the current
/// model, `dprec_model_published_timestamp_seconds` on key-less /metrics) with a fit
/// that takes `delay_ms` longer: they are the job's start, whatever the fit took.
async fn public_times_after(url: &str, delay_ms: u64) -> (i64, i64) {
    let hooks = Hooks {
        before_commit: Some(std::sync::Arc::new(move || {
            std::thread::sleep(std::time::Duration::from_millis(delay_ms));
            Ok(())
        })),
        ..Hooks::default()
    };
    let app = TestApp::try_spawn(topn_settings(url), None, hooks)
        .await
        .unwrap();
    app.register(&catalogue()).await;
    app.ingest_registered(&[("u1", "a0", 4.0, None), ("u2", "b0", 3.0, None)])
        .await;
    let job = release_in_store(&app).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.reason);
    let finished = job.finished_at.unwrap();
    assert!(finished - job.created_at >= delay_ms as i64, "{job:?}");
    let (_, list) = app.get("/v1/models", PUBLIC).await;
    let (_, current) = app.get("/v1/models/current", PUBLIC).await;
    for created in [
        &list["releases"][0]["created_at"],
        &current["release"]["created_at"],
    ] {
        assert_eq!(created.as_i64(), Some(job.created_at), "{list}");
    }
    let text = metrics(&app, "").await.text;
    let published: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("dprec_model_published_timestamp_seconds "))
        .expect("the publication time is key-less")
        .parse()
        .unwrap();
    assert_eq!(
        (published * 1000.0).round() as i64,
        job.created_at,
        "{text}"
    );
    app.stop().await;
    (job.created_at, finished)
}

/// A release whose fit takes 600 ms longer and one without delay both publish the job's
/// start as their time (before, the times were written after the fit and the ledger
/// commit, so their distance from the job's start grew with the data).
async fn public_times_are_the_job_start(url: &str) {
    let other = second_db(url, "public_times_are_the_job_start").await;
    public_times_after(url, 0).await;
    let (start, end) = public_times_after(&other.url, 600).await;
    assert!(end - start >= 600);
}
both_backends!(public_times_are_the_job_start);

/// What a key-less or public caller reads after one release on `ratings`: the release
/// list, the current release, key-less /metrics and the probes (times normalised: they
/// are the job's start, checked by [`public_times_are_the_job_start`]).
async fn tick_and_view(url: &str, ratings: &[(&str, &str, f64, Option<f64>)]) -> Vec<String> {
    let app = TestApp::try_spawn(topn_settings(url), None, Hooks::default())
        .await
        .unwrap();
    app.register(&catalogue()).await;
    if !ratings.is_empty() {
        app.ingest_registered(ratings).await;
    }
    let job = release_in_store(&app).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.reason);
    let mut view = Vec::new();
    for path in ["/v1/models", "/v1/models/current"] {
        let (st, mut v) = app.get(path, PUBLIC).await;
        crate::api::catalogue::without_timestamps(&mut v);
        view.push(format!("{path} {st} {v}"));
    }
    for path in ["/healthz", "/readyz"] {
        let r = app.send(app.client.get(app.url(path))).await;
        view.push(format!("{path} {} {}", r.status, r.text));
    }
    view.push(metrics_without_clock(&metrics(&app, "").await.text));
    // Nobody's data was used on the empty store, so nobody is charged.
    let charged: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM user_charges")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert_eq!(charged > 0, !ratings.is_empty(), "user charges: {charged}");
    app.stop().await;
    view
}

/// A release on the empty store and on a store with one rating: both publish (an
/// empty-data release is a DP release of noise), with the same public answers; before,
/// the empty store skipped, so whether release 1 existed told the two apart.
async fn a_release_exists_on_an_empty_store(url: &str) {
    let other = second_db(url, "a_release_exists_on_an_empty_store").await;
    let empty = tick_and_view(url, &[]).await;
    let one = tick_and_view(&other.url, &[("u1", "a0", 4.0, None)]).await;
    for (a, b) in empty.iter().zip(&one) {
        assert_eq!(a, b, "a tick on {{}} and on {{r}} differ");
    }
    assert!(empty[0].contains("\"id\":1"), "{}", empty[0]);
    // Job ids count skipped and failed jobs too: a public key sees none.
    assert!(empty[0].contains("\"job_id\":null"), "{}", empty[0]);
    assert!(empty[1].contains("\"job_id\":null"), "{}", empty[1]);
}
both_backends!(a_release_exists_on_an_empty_store);

/// The scheduler's jobs start at their scheduled ticks: a release that outlasts the
/// 1 s interval (1.5 s here) does not shift the next job's public time, which would
/// otherwise publish how long the release took (a function of the data).
async fn scheduled_times_are_the_ticks(url: &str) {
    let mut s = topn_settings(url);
    s.scheduler.enabled = true;
    s.scheduler.retrain_interval_secs = 1;
    let hooks = Hooks {
        before_commit: Some(std::sync::Arc::new(|| {
            std::thread::sleep(std::time::Duration::from_millis(1500));
            Ok(())
        })),
        ..Hooks::default()
    };
    let app = TestApp::try_spawn(s, None, hooks).await.unwrap();
    app.register(&catalogue()).await;
    let mut jobs = Vec::new();
    for id in 1..=2 {
        for _ in 0..200 {
            if app.store.job(id).await.unwrap().is_some() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        jobs.push(wait_in_store(&app, id).await);
    }
    app.stop().await;
    assert_eq!(jobs[0].status, "succeeded", "{:?}", jobs[0]);
    let gap = jobs[1].created_at - jobs[0].created_at;
    assert!((gap - 1000).abs() <= 5, "ticks {gap} ms apart: {jobs:?}");
}
both_backends!(scheduled_times_are_the_ticks);

/// A release becomes visible at its public deadline, its job's start plus
/// `release.publish_delay_secs` (or a later multiple of it), not when its commit ends: a
/// release whose commit is slowed (as a large store's is) and a quick one are both
/// visible `delay` after their start when both committed in time, and until then the
/// key-less `/readyz` and the public release list show the previous release although the
/// new one is committed.
async fn releases_appear_at_a_public_deadline(url: &str) {
    const DELAY_MS: i64 = 3_000;
    let slow = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let s2 = slow.clone();
    let hooks = Hooks {
        before_commit: Some(std::sync::Arc::new(move || {
            let ms = s2.load(std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(ms));
            Ok(())
        })),
        ..Hooks::default()
    };
    let mut s = settings(url);
    s.release.publish_delay_secs = (DELAY_MS / 1000) as u64;
    let (t, _) = crate::api::fake::FakeDp::gaussian(20.0);
    let app = TestApp::spawn(s, t, hooks).await;
    app.ingest(&[("a", "i1", 4.0, None), ("b", "i2", 3.0, None)])
        .await;
    let mut previous: Option<i64> = None;
    for slow_ms in [0u64, 1_200] {
        slow.store(slow_ms, std::sync::atomic::Ordering::SeqCst);
        let (st, job) = app.post("/v1/admin/retrain", ADMIN, &json!({})).await;
        assert_eq!(st, 202, "{job}");
        let id = job["id"].as_i64().unwrap();
        let started = app.job(id).await.created_at;
        // Until the model is stored (the commit's end), then read what the public sees.
        let (release, visible_at) = loop {
            let row = sqlx::query(
                "SELECT m.release_id, r.visible_at FROM models m \
                 JOIN releases r ON r.id = m.release_id ORDER BY m.release_id DESC LIMIT 1",
            )
            .fetch_optional(app.store.pool())
            .await
            .unwrap();
            let got = row.map(|r| {
                use sqlx::Row;
                (
                    r.try_get::<i64, _>(0).unwrap(),
                    r.try_get::<i64, _>(1).unwrap(),
                )
            });
            if let Some((rid, at)) = got.filter(|(rid, _)| Some(*rid) != previous) {
                break (rid, at);
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        };
        let committed = dprec::store::now_ms();
        let waited = visible_at - started;
        assert!(
            waited >= DELAY_MS && waited % DELAY_MS == 0,
            "slow {slow_ms}: visible {waited} ms after the start"
        );
        if committed + 1_000 < started + DELAY_MS {
            // Committed in time: the deadline is the first one, whatever the commit took.
            assert_eq!(waited, DELAY_MS, "slow {slow_ms}");
        }
        if dprec::store::now_ms() + 200 < visible_at {
            let (_, ready) = app.get("/readyz", "").await;
            assert_eq!(ready["model_version"].as_i64(), previous, "{ready}");
            let (_, list) = app.get("/v1/models", PUBLIC).await;
            let listed: Vec<i64> = list["releases"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["id"].as_i64().unwrap())
                .collect();
            assert!(!listed.contains(&release), "{list}");
        }
        let job = app.wait_job(id).await;
        assert_eq!(job.status, "succeeded", "{job:?}");
        assert!(dprec::store::now_ms() >= visible_at);
        let (_, ready) = app.get("/readyz", "").await;
        assert_eq!(ready["model_version"].as_i64(), Some(release), "{ready}");
        previous = Some(release);
    }
    app.stop().await;
}
both_backends!(releases_appear_at_a_public_deadline);
