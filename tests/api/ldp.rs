//! POST /v1/ratings with locally perturbed (LDP) ratings: a valid batch is stored as
//! origin `ldp`, its local eps is charged once at ingestion (rating and user ledger,
//! visible in the budget audit) and never again by a release; every inconsistent claim
//! is a 4xx naming the field, with nothing stored.

use dprec::data::RatingScale;
use dprec::ldp::RatingPerturber;
use dprec::retrain::Hooks;
use serde_json::{json, Value};

use crate::api::fake::FakeDp;
use crate::api::helpers::*;
use crate::both_backends;

/// Perturbed ratings in their JSON form, produced by the client library.
fn perturbed(user: &str, items: &[(&str, f64)], eps: f64, seed: u64) -> Vec<Value> {
    let p = RatingPerturber::new(eps, RatingScale::new(1.0, 5.0, 0.5).unwrap()).unwrap();
    let mut rng = dprec_dp::rng::seeded(seed);
    items
        .iter()
        .map(|(item, v)| {
            serde_json::to_value(p.perturb(user, item, *v, &mut rng).unwrap()).unwrap()
        })
        .collect()
}

fn rdp_at(audit: &Value, order: f64) -> f64 {
    audit["spent"]["curve"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["order"].as_f64() == Some(order))
        .and_then(|p| p["rdp"].as_f64())
        .unwrap()
}

async fn ldp_batch_accepted_and_charged_once(url: &str) {
    let (t, _) = FakeDp::gaussian(20.0);
    let app = TestApp::spawn(settings(url), t, Hooks::default()).await;
    // A raw rating of another user, so a release has something to train on.
    app.ingest(&[("raw", "i1", 4.0, Some(1.0)), ("raw", "i2", 2.0, Some(1.0))])
        .await;
    app.register(&["i3"]).await;
    let mut batch = perturbed("alice", &[("i1", 5.0), ("i2", 1.0)], 1.0, 1);
    batch.extend(perturbed("alice", &[("i3", 3.0)], 0.5, 2));
    let (st, body) = app
        .post("/v1/ratings", WRITER, &json!({"ratings": batch}))
        .await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(body["created"], 3);

    let (st, a) = app.get("/v1/users/alice/budget", READER).await;
    assert_eq!(st, 200, "{a}");
    let entries = a["ratings"]["entries"].as_array().unwrap().clone();
    assert_eq!(entries.len(), 3);
    for (e, eps) in entries.iter().zip([1.0, 1.0, 0.5]) {
        assert_eq!(e["origin"], "ldp", "{e}");
        assert_eq!(e["eps"].as_f64(), Some(eps), "{e}");
        assert_eq!(e["spent"].as_f64(), Some(eps), "{e}");
        assert_eq!(e["releases"].as_i64(), Some(0), "{e}");
    }
    // User level: the composition of the three local eps, as pure DP in RDP form.
    let want = |order: f64| {
        [1.0f64, 1.0, 0.5]
            .iter()
            .map(|e| e.min(order * e * e / 2.0))
            .sum::<f64>()
    };
    for order in [2.0, 8.0] {
        let got = rdp_at(&a, order);
        assert!((got - want(order)).abs() < 1e-9, "order {order}: {got} {a}");
    }

    // A release charges the raw ratings and never the LDP ones. At user level it charges
    // its one constant event to every registered user with a live budget, alice too
    // (whether a user is charged never depends on which of its ratings take part).
    let job = app.retrain().await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    let (_, b) = app.get("/v1/users/alice/budget", READER).await;
    assert_eq!(b["ratings"]["entries"], Value::Array(entries), "{b}");
    assert_eq!(b["releases"]["total"], 1, "{b}");
    let (_, r) = app.get("/v1/users/raw/budget", READER).await;
    assert_eq!(r["releases"]["total"], 1, "{r}");
    let event = rdp_at(&r, 2.0);
    assert!(event > 0.0, "{r}");
    assert!((rdp_at(&b, 2.0) - want(2.0) - event).abs() < 1e-9, "{b}");
    assert!(
        r["ratings"]["entries"][0]["spent"].as_f64().unwrap() > 0.0,
        "{r}"
    );
    assert_eq!(r["ratings"]["entries"][0]["origin"], "raw", "{r}");
    app.stop().await;
}
both_backends!(ldp_batch_accepted_and_charged_once);

/// Every inconsistent claim: 4xx with the field, and the store unchanged.
async fn ldp_bad_inputs(url: &str) {
    let (t, _) = FakeDp::gaussian(20.0);
    let mut s = settings(url);
    s.budget.default_user_eps = 3.0;
    let app = TestApp::spawn(s, t, Hooks::default()).await;
    app.ingest(&[("bob", "raw1", 4.0, Some(1.0))]).await;
    let mut catalogue = vec!["l1".to_string(), "i9".to_string(), "i1".to_string()];
    catalogue.extend((0..6).map(|k| format!("x{k}")));
    app.register(&catalogue).await;
    let first = perturbed("bob", &[("l1", 4.0)], 1.0, 3);
    let (st, body) = app
        .post("/v1/ratings", WRITER, &json!({"ratings": first}))
        .await;
    assert_eq!(st, 200, "{body}");
    let before = app.store.fingerprint().await.unwrap();

    let good = perturbed("bob", &[("i9", 2.0)], 1.0, 4).remove(0);
    let with = |path: &[&str], v: Value| {
        let mut r = good.clone();
        let mut slot = &mut r;
        for k in path {
            slot = &mut slot[*k];
        }
        *slot = v;
        json!({"ratings": [perturbed("carol", &[("i1", 3.0)], 1.0, 5)[0].clone(), r]}).to_string()
    };
    let without = |k: &str| {
        let mut r = good.clone();
        r["ldp"].as_object_mut().unwrap().remove(k);
        json!({"ratings": [r]}).to_string()
    };
    let cases: Vec<(&str, String, u16, Option<&str>)> = vec![
        ("lower off the scale", with(&["ldp", "lower"], json!(0.0)), 422, Some("ratings[1].ldp.lower")),
        ("upper off the scale", with(&["ldp", "upper"], json!(10.0)), 422, Some("ratings[1].ldp.upper")),
        ("eps zero", with(&["ldp", "eps"], json!(0.0)), 422, Some("ratings[1].ldp.eps")),
        ("eps negative", with(&["ldp", "eps"], json!(-1.0)), 422, Some("ratings[1].ldp.eps")),
        ("eps above max", with(&["ldp", "eps"], json!(11.0)), 422, Some("ratings[1].ldp.eps")),
        ("scale not the calibrated one", with(&["ldp", "scale"], json!(4.4)), 422, Some("ratings[1].ldp.scale")),
        ("eps and scale disagree", with(&["ldp", "eps"], json!(2.0)), 422, Some("ratings[1].ldp.scale")),
        ("value above the bounds", with(&["rating"], json!(5.5)), 422, Some("ratings[1].rating")),
        ("value below the bounds", with(&["rating"], json!(0.9)), 422, Some("ratings[1].rating")),
        ("eps beside ldp", with(&["eps"], json!(1.0)), 422, Some("ratings[1].eps")),
        ("unknown mechanism", with(&["ldp", "mechanism"], json!("laplace")), 422, Some("ratings[1].ldp.mechanism")),
        ("unknown claim field", with(&["ldp", "delta"], json!(0.0)), 422, Some("ratings[1].ldp.delta")),
        ("missing scale", without("scale"), 422, Some("ratings[0].ldp")),
        ("eps as string", with(&["ldp", "eps"], json!("1")), 422, Some("ratings[1].ldp.eps")),
        (
            "NaN literal",
            format!(
                "{{\"ratings\": [{{\"user\": \"u\", \"item\": \"i\", \"rating\": NaN, \"ldp\": {}}}]}}",
                good["ldp"]
            ),
            400,
            Some("ratings[0].rating"),
        ),
        // State conflicts: 409, nothing stored (the carol rating in the batch neither).
        ("LDP over a raw rating", with(&["item"], json!("raw1")), 409, Some("ratings")),
        ("LDP re-rating", with(&["item"], json!("l1")), 409, Some("ratings")),
        // Items are registered, never created by a rating (LDP or raw).
        ("LDP on an unregistered item", with(&["item"], json!("nowhere")), 422, Some("ratings[1].item")),
    ];
    for (case, body, status, field) in cases {
        let (got, p) = app
            .send(
                app.client
                    .post(app.url("/v1/ratings"))
                    .bearer_auth(WRITER)
                    .header("content-type", "application/json")
                    .body(body),
            )
            .await
            .status_json();
        assert_eq!(got, status, "{case}: {p}");
        assert_eq!(p["field"].as_str(), field, "{case}: {p}");
        assert_eq!(
            app.store.fingerprint().await.unwrap(),
            before,
            "{case} changed the store"
        );
    }
    // A raw re-rating of an LDP pair is refused too.
    let (st, p) = app
        .post(
            "/v1/ratings",
            WRITER,
            &json!({"ratings": [{"user": "bob", "item": "l1", "rating": 1.0}]}),
        )
        .await;
    assert_eq!(st, 409, "{p}");
    // A user whose budget cannot take the local eps: 409, nothing stored.
    let many: Vec<(String, f64)> = (0..6).map(|k| (format!("x{k}"), 3.0)).collect();
    let items: Vec<(&str, f64)> = many.iter().map(|(i, v)| (i.as_str(), *v)).collect();
    let (st, p) = app
        .post(
            "/v1/ratings",
            WRITER,
            &json!({"ratings": perturbed("bob", &items, 1.0, 6)}),
        )
        .await;
    assert_eq!(st, 409, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("budget"), "{p}");
    assert_eq!(app.store.fingerprint().await.unwrap(), before);
    app.stop().await;
}
both_backends!(ldp_bad_inputs);

/// A local-DP release (issue 9: `blp-mog-mf` served like any trainer): it trains on the
/// client-perturbed ratings only, charges nothing (their local eps was charged at
/// ingestion), is recorded `local-dp`, answers an LDP user from the model, and leaves
/// the raw ratings untouched; without any LDP rating the job is skipped with the reason.
async fn ldp_release_serves_blp_mog_mf(url: &str) {
    // A central model is served first: a local-DP release publishes no DP counts, so
    // the operator-safety rule (DP total against the served model's) must not refuse it.
    let mut s = settings(url);
    s.budget.popularity_eps = 1.0;
    let (fake, _) = FakeDp::gaussian(20.0);
    let central = TestApp::spawn(s.clone(), fake, Hooks::default()).await;
    let raw: Vec<(String, String)> = (0..12)
        .flat_map(|u| (0..5).map(move |i| (format!("r{u}"), format!("i{i}"))))
        .collect();
    let rows: Vec<(&str, &str, f64, Option<f64>)> = raw
        .iter()
        .map(|(u, i)| (u.as_str(), i.as_str(), 4.0, Some(1.0)))
        .collect();
    central.ingest(&rows).await;
    assert_eq!(central.retrain().await.status, "succeeded");
    let served = central.app_registry.current().unwrap();
    assert!(
        served.popularity.iter().sum::<i64>() > 0,
        "{:?}",
        served.popularity
    );
    central.stop().await;

    let params = dprec::train::Params::parse(&["em_iters=3"]).unwrap();
    let trainer: std::sync::Arc<dyn dprec::train::Trainer> =
        dprec::train::build("blp-mog-mf", &params).unwrap().into();
    let app = TestApp::spawn(s, trainer, Hooks::default()).await;
    let job = app.retrain().await;
    assert_eq!(job.status, "skipped", "{job:?}");
    assert!(
        job.reason
            .as_deref()
            .unwrap_or("")
            .contains("perturbed on the client"),
        "{job:?}"
    );

    let items: Vec<(String, f64)> = (0..8)
        .map(|j| (format!("i{j}"), 1.0 + (j % 5) as f64))
        .collect();
    let ids: Vec<&str> = items.iter().map(|(i, _)| i.as_str()).collect();
    app.register(&ids).await;
    let mut batch = Vec::new();
    for (k, user) in ["alice", "bob", "carol"].iter().enumerate() {
        let own: Vec<(&str, f64)> = items
            .iter()
            .skip(k)
            .take(5)
            .map(|(i, v)| (i.as_str(), *v))
            .collect();
        batch.extend(perturbed(user, &own, 1.0, 10 + k as u64));
    }
    let (st, body) = app
        .post("/v1/ratings", WRITER, &json!({"ratings": batch}))
        .await;
    assert_eq!(st, 200, "{body}");
    let (_, before_raw) = app.get("/v1/users/r0/budget", READER).await;
    let (_, before_alice) = app.get("/v1/users/alice/budget", READER).await;

    let job = app.retrain().await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    let (st, m) = app.get("/v1/models/current", PUBLIC).await;
    assert_eq!(st, 200, "{m}");
    assert_eq!(m["release"]["trainer"], "blp-mog-mf", "{m}");
    assert_eq!(m["release"]["guarantee"], "local-dp", "{m}");
    let mech = &m["release"]["mechanisms"][0];
    assert_eq!(
        (&mech["unit"], &mech["neighbour"]),
        (&json!("rating"), &json!("replace")),
        "{m}"
    );
    // Nothing was charged: both users' audits are as before the release (but for the
    // explanatory note, which now speaks of the served release).
    for (user, before) in [("r0", before_raw), ("alice", before_alice)] {
        let (_, mut after) = app.get(&format!("/v1/users/{user}/budget"), READER).await;
        let mut before = before;
        after["note"].take();
        before["note"].take();
        assert_eq!(after, before, "{user}");
    }
    // The raw user took no part: the model has a profile for LDP users only.
    let stored = app.stored_release(&job).await;
    assert_eq!((stored.n_users, stored.n_ratings), (3, 15), "{stored:?}");
    assert_eq!(stored.guarantee.to_string(), "local-dp");

    let r = app.recommendations("alice", "n=3").await;
    assert_eq!(r.guarantee.to_string(), "local-dp");
    assert!(!r.fallback, "{r:?}");
    assert!(!r.items.is_empty());
    app.stop().await;
}
both_backends!(ldp_release_serves_blp_mog_mf);
