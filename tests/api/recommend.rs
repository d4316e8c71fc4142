//! GET /v1/users/{user}/recommendations and /v1/items/{item}/similar.

use dprec::retrain::Hooks;
use serde_json::json;

use crate::api::fake::FakeDp;
use crate::api::helpers::*;
use crate::both_backends;

/// End to end with the non-private baseline (explicit flag): ingest, retrain,
/// recommend (excluding rated items unless asked, paginated), cold-start fallback.
async fn baseline_end_to_end(url: &str) {
    let mut s = settings(url);
    s.trainer.name = "baseline".into();
    s.trainer.allow_non_private = true;
    let app = TestApp::try_spawn(s, None, Hooks::default()).await.unwrap();
    let (st, p) = app.get("/v1/users/a/recommendations", READER).await;
    assert_eq!(st, 503, "{p}");
    // Item "top" is loved by everyone, "meh" is mediocre, "bad" is hated.
    let mut r = Vec::new();
    let users: Vec<String> = (0..6).map(|u| format!("user{u}")).collect();
    for u in &users {
        r.push((u.as_str(), "top", 5.0, None));
        r.push((u.as_str(), "bad", 1.0, None));
    }
    r.push(("user0", "meh", 3.0, None));
    r.push(("user1", "meh", 3.0, None));
    app.ingest(&r).await;
    app.ingest(&[("alice", "meh", 4.0, None)]).await;
    let job = app.retrain().await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    let release = job.release_id.unwrap();

    let (st, rec) = app.get("/v1/users/alice/recommendations?n=2", READER).await;
    assert_eq!(st, 200, "{rec}");
    assert_eq!(rec["fallback"], false);
    assert_eq!(rec["source"], "profile");
    assert_eq!(rec["model_version"].as_i64(), Some(release));
    assert_eq!(rec["guarantee"], "non-private");
    let items: Vec<&str> = rec["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["item"].as_str().unwrap())
        .collect();
    assert_eq!(items, ["top", "bad"], "rated item excluded: {rec}");
    let (_, rec) = app
        .get(
            "/v1/users/alice/recommendations?n=3&include_rated=true",
            READER,
        )
        .await;
    let items: Vec<&str> = rec["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["item"].as_str().unwrap())
        .collect();
    assert_eq!(items, ["top", "meh", "bad"]);
    let (_, rec) = app
        .get("/v1/users/alice/recommendations?n=1&offset=1", READER)
        .await;
    assert_eq!(rec["items"][0]["item"], "bad");
    let scores: Vec<f64> = rec["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["score"].as_f64().unwrap())
        .collect();
    assert!(scores.iter().all(|s| s.is_finite()));

    // Cold start: no profile, DP popularity answers.
    let (st, rec) = app
        .get("/v1/users/newcomer/recommendations?n=3", READER)
        .await;
    assert_eq!(st, 200);
    assert_eq!(rec["fallback"], true);
    assert_eq!(rec["source"], "popularity");
    assert_eq!(rec["items"].as_array().unwrap().len(), 3);

    for (q, field) in [("n=0", "n"), ("n=5000", "n"), ("bogus=1", "bogus")] {
        let (st, p) = app
            .get(&format!("/v1/users/alice/recommendations?{q}"), READER)
            .await;
        assert_eq!((st, p["field"].as_str()), (422, Some(field)), "{q}: {p}");
    }
    // The baseline has no item factors: similar items is the DP popularity (fallback),
    // items outside the catalogue 404.
    let (st, sim) = app.get("/v1/items/top/similar", READER).await;
    assert_eq!(st, 200, "{sim}");
    assert_eq!(
        (&sim["fallback"], &sim["source"]),
        (&json!(true), &json!("popularity"))
    );
    assert!(
        sim["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["item"] != "top"),
        "{sim}"
    );
    let (st, _) = app.get("/v1/items/nope/similar", READER).await;
    assert_eq!(st, 404);
    app.stop().await;
}
both_backends!(baseline_end_to_end);

/// Similar items from the DP item profiles of a (fake) DP trainer; deleted users fall
/// back to popularity.
async fn similar_items_and_deleted_users(url: &str) {
    let (t, _) = FakeDp::gaussian(20.0);
    let app = TestApp::spawn(settings(url), t, Hooks::default()).await;
    app.ingest(&[
        ("u1", "a", 5.0, None),
        ("u2", "a", 5.0, None),
        ("u3", "a", 5.0, None),
        ("u1", "b", 5.0, None),
        ("u2", "b", 5.0, None),
        ("u1", "c", 1.0, None),
    ])
    .await;
    let job = app.retrain().await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    let sim = app.similar("a", 2).await;
    assert_eq!(sim.items.len(), 2);
    assert_eq!(sim.items[0].item, "b", "{sim:?}");
    let rec = app.recommendations("u3", "").await;
    assert!(!rec.fallback, "{rec:?}");
    let (st, _) = app.delete("/v1/users/u3", WRITER).await;
    assert_eq!(st, 204);
    // The raw data is gone; the budget slots and ledger rows stay.
    use sqlx::Row;
    let live: i64 =
        sqlx::query("SELECT COUNT(*) FROM ratings WHERE user_id = 'u3' AND value IS NOT NULL")
            .fetch_one(app.store.pool())
            .await
            .unwrap()
            .get(0);
    assert_eq!(live, 0);
    let rec = app.recommendations("u3", "").await;
    assert!(rec.fallback, "{rec:?}");
    let audit = app.audit("u3", "").await;
    assert!(audit.deleted);
    assert!(audit.note.as_deref().unwrap().contains("deleted"));
    assert_eq!(audit.releases.total, 1, "ledger kept: {audit:?}");
    let (st, _) = app.delete("/v1/users/ghost", WRITER).await;
    assert_eq!(st, 404);
    // The deleted user's data is not used by the next release.
    let job = app.retrain().await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    // (The API publishes no exact counts; the store keeps them.)
    let rel = app.stored_release(&job).await;
    assert_eq!(rel.n_users, 2);
    app.stop().await;
}
both_backends!(similar_items_and_deleted_users);
