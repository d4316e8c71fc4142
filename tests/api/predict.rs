//! The joint-DP rating predictor `dp-alt` served: predicted ratings and the user's
//! profile come from the published DP item side and the user's own current ratings, under
//! the recommendation scopes, equal what eval computes, follow new ratings without a
//! retrain, and charge nothing.

use std::collections::BTreeMap;

use dprec::retrain::Hooks;
use dprec::serve::StoredModel;
use serde_json::Value;

use crate::api::helpers::*;
use crate::both_backends;

fn alt_settings(url: &str) -> dprec::config::Settings {
    let mut s = topn_settings(url);
    s.trainer.name = "dp-alt".into();
    s.budget.default_rating_eps = 10.0;
    s.trainer.params = BTreeMap::from([
        ("releases".to_string(), "4".to_string()),
        ("eps".to_string(), "20".to_string()),
        ("d".to_string(), "2".to_string()),
    ]);
    s
}

/// A service with `settings`, loaded with the two-taste fixture's training ratings of
/// `users` users (each at `eps`, or the service default).
async fn spawn_with_tastes(
    settings: dprec::config::Settings,
    users: usize,
    eps: Option<f64>,
) -> (TestApp, Tastes) {
    let data = tastes(0x2545_f491_4f6c_dd1d, users, 10, 6, true, 2.0);
    let app = TestApp::try_spawn(settings, None, Hooks::default())
        .await
        .unwrap();
    let rows: Vec<(&str, &str, f64, Option<f64>)> = data
        .train
        .iter()
        .map(|(u, i, v)| (u.as_str(), i.as_str(), *v, eps))
        .collect();
    app.ingest(&rows).await;
    (app, data)
}

async fn predictions(app: &TestApp, user: &str, items: &str, key: &str) -> (u16, Value) {
    app.get(&format!("/v1/users/{user}/predictions?items={items}"), key)
        .await
}

fn ratings(v: &Value) -> Vec<f64> {
    v["predictions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["rating"].as_f64().unwrap())
        .collect()
}

/// Scopes, equality with the stored model's prediction from the user's own ratings (what
/// eval computes), the solved profile, and top-N by predicted rating.
async fn predictions_are_served_under_the_recommendation_scopes(url: &str) {
    let (app, data) = spawn_with_tastes(alt_settings(url), 200, None).await;
    assert_eq!(app.retrain().await.status, "succeeded");

    let own = app.create_key("user", Some("user001")).await.key;
    let (st, body) = predictions(&app, "user001", "a1,b1,a2", &own).await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(body["guarantee"], "proven");
    let got = ratings(&body);
    assert_eq!(got.len(), 3);
    assert!(got.iter().all(|r| (1.0..=5.0).contains(r)), "{got:?}");
    let (st, by_reader) = predictions(&app, "user001", "a1,b1,a2", READER).await;
    assert_eq!((st, ratings(&by_reader)), (200, got.clone()));
    // Another user's, an unknown user's, and a public key: 403 alike.
    for (user, key) in [("user002", &own), ("nobody", &own)] {
        assert_eq!(predictions(&app, user, "a1", key).await.0, 403, "{user}");
    }
    assert_eq!(predictions(&app, "user001", "a1", PUBLIC).await.0, 403);
    assert_eq!(predictions(&app, "user001", "zz-none", READER).await.0, 404);
    assert_eq!(predictions(&app, "user001", "", READER).await.0, 422);

    // The stored item side and the user's own ratings give the same numbers (eval's path).
    let row = app.store.latest_model().await.unwrap().unwrap();
    let stored: StoredModel = serde_json::from_str(&row.model).unwrap();
    assert_eq!(stored.factors.user_bias.len(), 0, "no user rows are stored");
    let ranker = stored
        .ranker
        .expect("dp-alt stores its item side")
        .into_ranker();
    let items: Vec<String> = serde_json::from_str(&row.items).unwrap();
    let index = |i: &str| items.iter().position(|x| x == i).unwrap();
    let mine: Vec<(usize, f64)> = data
        .train
        .iter()
        .filter(|(u, _, _)| u == "user001")
        .map(|(_, i, v)| (index(i), *v))
        .collect();
    for (k, i) in ["a1", "b1", "a2"].iter().enumerate() {
        let want = ranker.predict(None, &mine, index(i)).unwrap();
        assert!((got[k] - want).abs() < 1e-9, "{i}: {} vs {want}", got[k]);
    }

    // The profile: solved, not stored; own token only among user keys.
    let (st, prof) = app.get("/v1/models/current/users/user001", &own).await;
    assert_eq!(st, 200, "{prof}");
    assert_eq!(prof["source"], "own-ratings");
    assert_eq!(prof["factors"].as_array().unwrap().len(), 2);
    assert_eq!(
        app.get("/v1/models/current/users/user002", &own).await.0,
        403
    );

    // Top-N by predicted rating: personal, best first.
    let rec = app.recommendations("user001", "n=5").await;
    assert!(!rec.fallback);
    let scores: Vec<f64> = rec.items.iter().map(|i| i.score).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    app.stop().await;
}
both_backends!(predictions_are_served_under_the_recommendation_scopes);

/// The item statistics a `dp-alt` release combines across releases, as stored with it
/// (`dprec::model::history`), by item id.
async fn stored_item_state(
    app: &TestApp,
) -> (BTreeMap<String, usize>, dprec::model::history::CountHistory) {
    let row = app.store.latest_model().await.unwrap().unwrap();
    let items: Vec<String> = serde_json::from_str(&row.items).unwrap();
    let index = items.into_iter().enumerate().map(|(j, i)| (i, j)).collect();
    let stored: StoredModel = serde_json::from_str(&row.model).unwrap();
    match stored.ranker.expect("dp-alt stores its item side") {
        dprec::train::StoredRanker::JointAls { model } => {
            let h = model.history.expect("the default combines releases");
            assert_eq!(
                h.mean, model.popularity,
                "the served counts are the combination's"
            );
            assert!(h.item_side.is_some());
            (index, h)
        }
        other => panic!("dp-alt serves its item side, not {other:?}"),
    }
}

/// A `dp-alt` release after a `dp-alt` release continues its item statistics (a state of
/// two releases, every earlier item's noise variance lower, by id), also after a restart
/// and with an item new in the catalogue (which starts from its own statistics); a
/// release of another basis (another residual clip) starts anew.
async fn item_side_combines_releases(url: &str) {
    // Rating budgets that carry several releases (half of what is left offered to each).
    let settings = |url: &str| {
        let mut s = alt_settings(url);
        s.budget.max_rating_eps = 100.0;
        s.budget.share = "fraction:0.5".parse().unwrap();
        s
    };
    let (app, _) = spawn_with_tastes(settings(url), 120, Some(50.0)).await;
    assert_eq!(app.retrain().await.status, "succeeded");
    let (ids1, first) = stored_item_state(&app).await;
    assert_eq!(first.releases, 1);
    app.stop().await;

    let again = TestApp::try_spawn(settings(url), None, Hooks::default())
        .await
        .unwrap();
    // An item first rated now: before every other id, so every index moves.
    again
        .ingest(&[
            ("user000", "0-new", 5.0, Some(50.0)),
            ("user001", "0-new", 4.0, Some(50.0)),
        ])
        .await;
    let job = again.retrain().await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    let (ids2, second) = stored_item_state(&again).await;
    assert_eq!(second.releases, 2);
    let (s1, s2) = (
        first.item_side.as_deref().unwrap(),
        second.item_side.as_deref().unwrap(),
    );
    for (id, &j) in &ids2 {
        match ids1.get(id) {
            Some(&i) => {
                assert!(second.var[j] < first.var[i], "{id}");
                assert!(s2.noise_rhs[j] < s1.noise_rhs[i], "{id}");
            }
            None => assert_eq!(s2.noise_rhs[j], s1.noise_rhs[0], "{id} starts anew"),
        }
    }
    assert!(ids2.contains_key("0-new") && !ids1.contains_key("0-new"));
    again.stop().await;

    let mut other = settings(url);
    other
        .trainer
        .params
        .insert("clip_y".to_string(), "2".to_string());
    let third = TestApp::try_spawn(other, None, Hooks::default())
        .await
        .unwrap();
    let job = third.retrain().await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    assert_eq!(stored_item_state(&third).await.1.releases, 1);
    third.stop().await;
}
both_backends!(item_side_combines_releases);

/// A new rating moves the user's next prediction and profile without a retrain (the solve
/// is refreshed), and serving charges nothing: every audited ledger is the same before and
/// after prediction, profile and list requests.
async fn user_side_serving_charges_nothing(url: &str) {
    let (app, _) = spawn_with_tastes(alt_settings(url), 120, None).await;
    assert_eq!(app.retrain().await.status, "succeeded");
    let users = ["user000", "user001", "user002"];
    let mut before = Vec::new();
    for u in users {
        before.push(app.get(&format!("/v1/users/{u}/budget"), READER).await);
    }
    let release = app.store.latest_model().await.unwrap().unwrap();

    for u in users {
        assert_eq!(predictions(&app, u, "a1,b2", READER).await.0, 200);
        assert_eq!(
            app.get(&format!("/v1/models/current/users/{u}"), READER)
                .await
                .0,
            200
        );
        app.recommendations(u, "n=3").await;
    }
    let (_, cold) = predictions(&app, "user000", "a3", READER).await;
    let (_, cold_profile) = app.get("/v1/models/current/users/user000", READER).await;
    app.ingest(&[("user000", "a3", 1.0, None)]).await;
    let (_, warm) = predictions(&app, "user000", "a3", READER).await;
    let (_, warm_profile) = app.get("/v1/models/current/users/user000", READER).await;
    assert!(ratings(&warm)[0] < ratings(&cold)[0], "{cold} -> {warm}");
    assert_ne!(cold_profile["bias"], warm_profile["bias"]);

    for (k, u) in users.iter().enumerate() {
        let after = app.get(&format!("/v1/users/{u}/budget"), READER).await;
        if *u != "user000" {
            assert_eq!(after, before[k], "{u}: serving changed the ledger");
        } else {
            // The new rating is a new ledger row; the spent totals are unchanged.
            assert_eq!(after.1["spent"], before[k].1["spent"], "{u}");
            assert_eq!(after.1["releases"], before[k].1["releases"], "{u}");
        }
    }
    let again = app.store.latest_model().await.unwrap().unwrap();
    assert_eq!(
        again.release.id, release.release.id,
        "serving made no release"
    );
    app.stop().await;
}
both_backends!(user_side_serving_charges_nothing);

/// A top-N release (dp-topn) ranks without predicting ratings: 409.
async fn a_ranking_release_refuses_predictions(url: &str) {
    let (app, _) = spawn_with_tastes(topn_settings(url), 120, Some(10.0)).await;
    assert_eq!(app.retrain().await.status, "succeeded");
    assert_eq!(predictions(&app, "user001", "a1", READER).await.0, 409);
    app.stop().await;
}
both_backends!(a_ranking_release_refuses_predictions);
