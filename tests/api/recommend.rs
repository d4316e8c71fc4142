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

/// The items of `user`'s list of `n`.
async fn list(app: &TestApp, user: &str, n: usize) -> Vec<String> {
    let rec = app.recommendations(user, &format!("n={n}")).await;
    rec.items.into_iter().map(|i| i.item).collect()
}

/// Polls `user`'s list until it is `want` (the check for other processes' writes runs
/// every `reload_secs`, 1 s here); returns the last list seen.
async fn list_becomes(app: &TestApp, user: &str, want: &[&str]) -> Vec<String> {
    let mut got = Vec::new();
    for _ in 0..50 {
        got = list(app, user, 3).await;
        if got == want {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    got
}

/// A cached user's facts stay fresh: a rating through this server changes the next list
/// at once, and ratings written to the same database by another process (a replica; here
/// the store directly) reach the list within `reload_secs`, without the entry expiring.
async fn cached_facts_follow_writes_of_this_and_other_processes(url: &str) {
    let mut s = settings(url);
    s.trainer.name = "baseline".into();
    s.trainer.allow_non_private = true;
    s.scheduler.reload_secs = 1;
    let app = TestApp::try_spawn(s, None, Hooks::default()).await.unwrap();
    let mut r = Vec::new();
    let users: Vec<String> = (0..6).map(|u| format!("user{u}")).collect();
    for u in &users {
        r.push((u.as_str(), "top", 5.0, None));
        r.push((u.as_str(), "bad", 1.0, None));
        r.push((u.as_str(), "meh", 3.0, None));
    }
    r.push(("alice", "meh", 4.0, None));
    app.ingest(&r).await;
    let job = app.retrain().await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    assert_eq!(list(&app, "alice", 3).await, ["top", "bad"]);
    // Through this server: the very next list.
    app.ingest(&[("alice", "bad", 2.0, None)]).await;
    assert_eq!(list(&app, "alice", 3).await, ["top"]);
    // Another process rates and deletes: merged within reload_secs.
    let rating = |item: &str| dprec::store::NewRating {
        user: "alice".into(),
        item: item.into(),
        value: 5.0,
        eps: None,
        ldp: None,
    };
    let defaults = dprec::store::Defaults {
        rating_eps: 1.0,
        user_eps: 10.0,
        user_delta: 1e-6,
    };
    app.store
        .upsert_ratings(&[rating("top")], defaults)
        .await
        .unwrap();
    assert!(app.store.delete_rating("alice", "meh").await.unwrap());
    let got = list_becomes(&app, "alice", &["meh"]).await;
    assert_eq!(
        got,
        ["meh"],
        "another process's writes reach the cached facts"
    );
    // A user deleted by another process: the popularity fallback.
    assert!(app.store.delete_user("alice").await.unwrap());
    let mut fallback = false;
    for _ in 0..50 {
        fallback = app.recommendations("alice", "").await.fallback;
        if fallback {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(fallback, "a user deleted by another process falls back");
    app.stop().await;
}
both_backends!(cached_facts_follow_writes_of_this_and_other_processes);

/// The serving read of a user's ratings gives every value back bit for bit, ordered by
/// item (on SQLite it comes packed as text, `Store::serving_facts`).
async fn serving_facts_read_every_value_exactly(url: &str) {
    use rand::{Rng, SeedableRng};
    let app = TestApp::spawn(settings(url), FakeDp::gaussian(5.0).0, Hooks::default()).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(47);
    let items: Vec<String> = (0..300).map(|k| format!("item-{k}")).collect();
    app.register(&items).await;
    let ratings: Vec<dprec::store::NewRating> = items
        .iter()
        .map(|i| dprec::store::NewRating {
            user: "u".into(),
            item: i.clone(),
            value: match rng.random_range(0..4) {
                0 => f64::from(rng.random_range(1..=10)) / 2.0,
                1 => 0.1 + f64::from(rng.random_range(0..40)) / 10.0,
                2 => 1.0 + 4.0 * rng.random::<f64>(),
                _ => 1.0 + 4.0 * f64::from(rng.random::<f32>()),
            },
            eps: None,
            ldp: None,
        })
        .collect();
    let defaults = dprec::store::Defaults {
        rating_eps: 1.0,
        user_eps: 10.0,
        user_delta: 1e-6,
    };
    app.store.upsert_ratings(&ratings, defaults).await.unwrap();
    let (deleted, got) = app.store.serving_facts("u").await.unwrap();
    assert!(!deleted);
    let mut want: Vec<(String, u64)> = ratings
        .iter()
        .map(|r| (r.item.clone(), r.value.to_bits()))
        .collect();
    want.sort();
    let got: Vec<(String, u64)> = got.into_iter().map(|(i, v)| (i, v.to_bits())).collect();
    assert_eq!(got, want);
    assert_eq!(
        app.store.serving_facts("nobody").await.unwrap(),
        (false, Vec::new())
    );
    app.stop().await;
}
both_backends!(serving_facts_read_every_value_exactly);
