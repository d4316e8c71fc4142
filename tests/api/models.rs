//! /v1/models, /v1/models/current, profile downloads, restart without retraining,
//! admin job status.

use dprec::retrain::Hooks;

use crate::api::fake::FakeDp;
use crate::api::helpers::*;
use crate::both_backends;

async fn releases_downloads_and_restart(url: &str) {
    let (t, _) = FakeDp::gaussian(20.0);
    let app = TestApp::spawn(settings(url), t.clone(), Hooks::default()).await;
    let (st, _) = app.get("/v1/models/current", READER).await;
    assert_eq!(st, 404);
    app.ingest(&[
        ("u1", "a", 4.0, None),
        ("u2", "b", 3.0, None),
        ("u2", "a", 5.0, None),
    ])
    .await;
    let j1 = app.retrain().await;
    let j2 = app.retrain().await;
    assert_eq!(
        (j1.status.as_str(), j2.status.as_str()),
        ("succeeded", "succeeded")
    );
    let list = app.models("limit=10").await;
    let rel = &list.releases;
    assert_eq!(rel.len(), 2);
    assert_eq!(Some(rel[0].id), j2.release_id);
    assert_eq!(rel[0].guarantee, dprec::train::Guarantee::Proven);
    assert_eq!(rel[0].trainer, "fake-dp");
    let page = app.models("limit=1&offset=1").await;
    assert_eq!(Some(page.releases[0].id), j1.release_id);
    let cur = app.current_model().await;
    assert_eq!(Some(cur.release.id), j2.release_id);
    let items = app.item_profiles().await;
    assert_eq!(items.rank, 2);
    assert_eq!(items.items.len(), 2);
    assert_eq!(items.items[0].factors.len(), 2);
    let (st, prof) = app.get("/v1/models/current/users/u2", READER).await;
    assert_eq!(st, 200, "{prof}");
    assert_eq!(prof["factors"].as_array().unwrap().len(), 2);
    let (st, _) = app
        .get_problem("/v1/models/current/users/nobody", READER)
        .await;
    assert_eq!(st, 404);
    let job = app.job(j1.id).await;
    assert_eq!(job.kind, "admin");
    let (st, _) = app.get_problem("/v1/admin/jobs/99999", ADMIN).await;
    assert_eq!(st, 404);
    let (_, rec_before) = app.get("/v1/users/u1/recommendations", READER).await;
    app.stop().await;

    // A restart serves the last published model without retraining.
    let again = TestApp::spawn(settings(url), t, Hooks::default()).await;
    let cur = again.current_model().await;
    assert_eq!(Some(cur.release.id), j2.release_id);
    let (_, rec_after) = again.get("/v1/users/u1/recommendations", READER).await;
    assert_eq!(rec_before, rec_after);
    again.stop().await;
}
both_backends!(releases_downloads_and_restart);

/// Two replicas on one database: a release published by one is served by the other.
async fn replicas_serve_the_newest_release(url: &str) {
    let mut s = settings(url);
    s.scheduler.reload_secs = 1;
    let (t, _) = FakeDp::gaussian(20.0);
    let a = TestApp::spawn(s.clone(), t.clone(), Hooks::default()).await;
    let b = TestApp::spawn(s, t, Hooks::default()).await;
    a.ingest(&[("u1", "a", 4.0, None), ("u2", "b", 3.0, None)])
        .await;
    let job = a.retrain().await;
    let id = job.release_id.unwrap();
    let mut seen = None;
    for _ in 0..50 {
        seen = b.app_registry.current().map(|p| p.release_id);
        if seen == Some(id) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(seen, Some(id));
    let (_, rec) = b.get("/v1/users/u1/recommendations", READER).await;
    assert_eq!(rec["model_version"].as_i64(), Some(id));
    a.stop().await;
    b.stop().await;
}
both_backends!(replicas_serve_the_newest_release);
