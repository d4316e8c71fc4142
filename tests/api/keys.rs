//! Issue 8, the API parts of findings 1, 5, 8 and 9: scoped keys (admin, writer, reader,
//! user token, public) created through `/v1/admin/keys`; deleted users' profiles; user
//! budgets that are never raised once charged; no exact counts in model listings,
//! mechanism records or unauthenticated /metrics.

use dprec::retrain::Hooks;
use serde_json::json;

use crate::api::fake::FakeDp;
use crate::api::helpers::*;
use crate::both_backends;

/// The published DP model: any key reads it.
const MODEL_PATHS: [&str; 4] = [
    "/v1/models",
    "/v1/models/current",
    "/v1/models/current/items",
    "/v1/items/a/similar",
];

/// What only `user`'s token (or a service key) reads.
fn user_paths(user: &str) -> Vec<String> {
    ["recommendations", "budget", "settings"]
        .iter()
        .map(|p| format!("/v1/users/{user}/{p}"))
        .chain([format!("/v1/models/current/users/{user}")])
        .collect()
}

/// GETs each path with `key`; each must answer `status` (problem+json when an error).
async fn expect_status(app: &TestApp, key: &str, paths: &[impl AsRef<str>], status: u16) {
    for path in paths {
        let path = path.as_ref();
        let (st, body) = if status >= 400 {
            let (st, p) = app.get_problem(path, key).await;
            (st, format!("{p:?}"))
        } else {
            let (st, v) = app.get(path, key).await;
            (st, v.to_string())
        };
        assert_eq!(st, status, "{path}: {body}");
    }
}

/// Finding 5: a user token for u1 reaches u1's recommendations, budget, settings and
/// profile, and gets 403 for u2's; a public key reads only the DP model and the release
/// list. Keys are created, listed and revoked by an admin over HTTP. (Fails on the code
/// before scoped keys: there is no /v1/admin/keys.)
async fn scoped_keys(url: &str) {
    let (t, _) = FakeDp::gaussian(20.0);
    let app = TestApp::spawn(settings(url), t, Hooks::default()).await;
    app.ingest(&[
        ("u1", "a", 4.0, None),
        ("u1", "b", 2.0, None),
        ("u2", "a", 5.0, None),
        ("u2", "c", 3.0, None),
    ])
    .await;
    assert_eq!(app.retrain().await.status, "succeeded");

    let token = app.create_key("user", Some("u1")).await;
    assert_eq!(token.stored.role, dprec::config::Role::User);
    assert_eq!(token.stored.user.as_deref(), Some("u1"));
    let tok = token.key.as_str();
    let own = user_paths("u1");
    expect_status(&app, tok, &own, 200).await;
    expect_status(&app, tok, &MODEL_PATHS, 200).await;
    expect_status(&app, tok, &user_paths("u2"), 403).await;
    // Whether another user exists does not change the answer.
    let others = [
        "/v1/users/nobody/budget",
        "/v1/admin/keys",
        "/v1/admin/jobs/1",
    ];
    expect_status(&app, tok, &others, 403).await;
    // The token changes its own settings (lowering its budget), not another user's,
    // and does not ingest.
    let (st, body) = app
        .put("/v1/users/u1/settings", tok, &json!({"budget_eps": 9.0}))
        .await;
    assert_eq!(st, 200, "{body}");
    let (st, _) = app
        .put("/v1/users/u2/settings", tok, &json!({"budget_eps": 9.0}))
        .await;
    assert_eq!(st, 403);
    let (st, _) = app
        .post(
            "/v1/ratings",
            tok,
            &json!({"ratings": [{"user": "u1", "item": "z", "rating": 3.0}]}),
        )
        .await;
    assert_eq!(st, 403);

    // Public: the DP model and the release list only.
    let public = app.create_key("public", None).await;
    for key in [PUBLIC, public.key.as_str()] {
        expect_status(&app, key, &MODEL_PATHS, 200).await;
        expect_status(&app, key, &own, 403).await;
    }

    // Listing shows ids, roles and users, never a key.
    let list: KeyList = app.get_ok("/v1/admin/keys", ADMIN).await;
    let row = list
        .keys
        .iter()
        .find(|k| k.id == token.stored.id)
        .expect("the token is listed");
    assert_eq!(row.user.as_deref(), Some("u1"));
    assert_eq!(row.source, "database");
    assert!(list.keys.iter().any(|k| k.source == "config"));
    let listed = serde_json::to_string(&list).unwrap();
    assert!(!listed.contains(tok) && !listed.contains(ADMIN), "{listed}");
    // Only admins manage keys.
    let (st, _) = app
        .post("/v1/admin/keys", WRITER, &json!({"role": "reader"}))
        .await;
    assert_eq!(st, 403);
    // A user token needs its user; other roles take none; unknown roles are refused.
    for (body, field) in [
        (json!({"role": "user"}), "user"),
        (json!({"role": "reader", "user": "u1"}), "user"),
        (json!({"role": "root"}), "role"),
    ] {
        let (st, p) = app.post("/v1/admin/keys", ADMIN, &body).await;
        assert_eq!((st, p["field"].as_str()), (422, Some(field)), "{body}: {p}");
    }
    // Revocation takes effect at once; a second revocation finds nothing.
    let revoke = format!("/v1/admin/keys/{}", token.stored.id);
    let (st, body) = app.delete(&revoke, ADMIN).await;
    assert_eq!(st, 204, "{body}");
    let (st, _) = app.get("/v1/users/u1/budget", tok).await;
    assert_eq!(st, 401);
    let (st, body) = app.delete(&revoke, ADMIN).await;
    assert_eq!(st, 404, "{body}");
    app.stop().await;
}
both_backends!(scoped_keys);

/// Finding 5: a deleted user's profile is 404 from the moment of deletion (it was
/// downloadable until the next release before), and the user is in no later release.
async fn deleted_users_leave_every_answer(url: &str) {
    let (t, _) = FakeDp::gaussian(20.0);
    let app = TestApp::spawn(settings(url), t, Hooks::default()).await;
    app.ingest(&[
        ("u1", "a", 4.0, None),
        ("u2", "a", 5.0, None),
        ("u2", "b", 3.0, None),
    ])
    .await;
    assert_eq!(app.retrain().await.status, "succeeded");
    let (st, body) = app.get("/v1/models/current/users/u1", READER).await;
    assert_eq!(st, 200, "{body}");
    let (st, _) = app.delete("/v1/users/u1", WRITER).await;
    assert_eq!(st, 204);
    let (st, p) = app.get_problem("/v1/models/current/users/u1", ADMIN).await;
    assert_eq!(st, 404, "{p:?}");
    for _ in 0..2 {
        app.ingest(&[("u3", "c", 2.0, None)]).await;
        assert_eq!(app.retrain().await.status, "succeeded");
        let served = app.app_registry.current().expect("a release");
        assert!(!served.has_profile("u1"), "u1 in a release after deletion");
        assert!(served.has_profile("u2"));
        let (st, _) = app.get_problem("/v1/models/current/users/u1", ADMIN).await;
        assert_eq!(st, 404);
    }
    app.stop().await;
}
both_backends!(deleted_users_leave_every_answer);

/// Finding 9: eps_u / delta_u are bounded by budget.max_user_eps / max_user_delta (422
/// naming the field), may be raised before the first charge, lowered at any time, and
/// never raised once charged (409 naming the field). (Fails on the old code, which
/// accepted budget_eps up to 1e6 and raises after spending.)
async fn budgets_are_never_raised_once_charged(url: &str) {
    let (t, _) = FakeDp::gaussian(20.0);
    let app = TestApp::spawn(settings(url), t, Hooks::default()).await;
    let put = |body: serde_json::Value| {
        let app = &app;
        async move { app.put("/v1/users/u1/settings", WRITER, &body).await }
    };
    for (body, field) in [
        (json!({"budget_eps": 1e6}), "budget_eps"),
        (json!({"budget_eps": 10.5}), "budget_eps"),
        (json!({"budget_delta": 1e-4}), "budget_delta"),
    ] {
        let (st, p) = put(body.clone()).await;
        assert_eq!((st, p["field"].as_str()), (422, Some(field)), "{body}: {p}");
        assert!(p["detail"].as_str().unwrap().contains("max_user"), "{p}");
    }
    // Before any charge: lower, then raise again (up to the maximum).
    let (st, p) = put(json!({"budget_eps": 5.0})).await;
    assert_eq!(st, 200, "{p}");
    let (st, p) = put(json!({"budget_eps": 8.0, "budget_delta": 5e-6})).await;
    assert_eq!(st, 200, "{p}");
    app.ingest(&[("u1", "a", 4.0, None), ("u2", "a", 3.0, None)])
        .await;
    // Still uncharged after ingestion.
    let (st, p) = put(json!({"budget_eps": 9.0})).await;
    assert_eq!(st, 200, "{p}");
    assert_eq!(app.retrain().await.status, "succeeded");
    assert_eq!(app.audit("u1", "").await.releases.total, 1);
    for (body, field) in [
        (json!({"budget_eps": 9.5}), "budget_eps"),
        (json!({"budget_delta": 1e-5}), "budget_delta"),
    ] {
        let (st, p) = put(body.clone()).await;
        assert_eq!((st, p["field"].as_str()), (409, Some(field)), "{body}: {p}");
    }
    // Lowering stays possible, and the lowered value then bounds later raises.
    let (st, p) = put(json!({"budget_eps": 7.0, "budget_delta": 2e-6})).await;
    assert_eq!(st, 200, "{p}");
    let (st, _) = put(json!({"budget_eps": 8.0})).await;
    assert_eq!(st, 409);
    let s = app.user_settings("u1").await;
    assert_eq!((s.budget_eps, s.budget_delta), (7.0, 2e-6));
    // Re-sending the current values (or other fields) is not a raise.
    let (st, p) = put(json!({"budget_eps": 7.0, "default_eps": 0.5})).await;
    assert_eq!(st, 200, "{p}");
    app.stop().await;
}
both_backends!(budgets_are_never_raised_once_charged);

/// Finding 1 (API parts): model listings carry no exact n_ratings / n_users / n_items,
/// mechanism records no `offered` count, and /metrics shows data-dependent values only
/// to an admin key (or a metrics key, tests/api/leaks.rs). (Fails on the old code, which published all three.)
async fn no_exact_counts_in_public_answers(url: &str) {
    let (t, _) = FakeDp::gaussian(20.0);
    let app = TestApp::spawn(settings(url), t, Hooks::default()).await;
    app.ingest(&[("u1", "a", 4.0, None), ("u2", "b", 3.0, None)])
        .await;
    assert_eq!(app.retrain().await.status, "succeeded");
    let count_keys = ["n_ratings", "n_users", "n_items", "offered"];
    let no_counts = |v: &serde_json::Value, what: &str| {
        let text = v.to_string();
        for k in count_keys {
            assert!(
                !text.contains(&format!("\"{k}\"")),
                "{what} has {k}: {text}"
            );
        }
    };
    let (_, list) = app.get("/v1/models", PUBLIC).await;
    no_counts(&list, "/v1/models");
    assert!(!list["releases"][0]["mechanisms"]
        .as_array()
        .unwrap()
        .is_empty());
    let (_, cur) = app.get("/v1/models/current", PUBLIC).await;
    no_counts(&cur, "/v1/models/current");
    let (_, audit) = app.get("/v1/users/u1/budget", READER).await;
    no_counts(&audit["releases"], "the audit's releases");
    assert_eq!(audit["releases"]["entries"][0]["guarantee"], "proven");

    let data_metrics = [
        "dprec_ratings_ingested_total",
        "dprec_training_runs_total",
        "dprec_budget_spent_eps_total",
        "dprec_budget_spent_rho_total",
        "dprec_ratings_exhausted",
        "dprec_users_excluded",
    ];
    for key in ["", PUBLIC, READER, WRITER] {
        let mut req = app.client.get(app.url("/metrics"));
        if !key.is_empty() {
            req = req.bearer_auth(key);
        }
        let r = app.send(req).await;
        assert_eq!(r.status, 200);
        for name in data_metrics {
            assert!(!r.text.contains(name), "{name} shown to {key:?}");
        }
        // Request counts are behind the key too (tests/api/leaks.rs).
        assert!(!r.text.contains("dprec_http_requests_total"));
        assert!(r.text.contains("dprec_model_release_id"));
    }
    let r = app
        .send(app.client.get(app.url("/metrics")).bearer_auth(ADMIN))
        .await;
    for name in data_metrics {
        assert!(r.text.contains(name), "{name} missing for admin");
    }
    assert!(
        r.text.contains("dprec_ratings_ingested_total 2"),
        "{}",
        r.text
    );
    app.stop().await;
}
both_backends!(no_exact_counts_in_public_answers);
