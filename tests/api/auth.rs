//! API keys and roles; start-up refusals (unknown trainer, non-private without the flag,
//! no-auth mode off loopback); the first-start admin key.

use dprec::config::AuthMode;
use dprec::retrain::Hooks;
use serde_json::json;

use crate::both_backends;
use crate::fake::FakeDp;
use crate::helpers::*;

async fn keys_and_roles(url: &str) {
    let (t, _) = FakeDp::gaussian(5.0);
    let app = TestApp::spawn(settings(url), t, Hooks::default()).await;
    let body = json!({"ratings": [{"user": "u", "item": "i", "rating": 3.0}]});
    // No key, bad key: 401 with problem+json.
    let r = app
        .send(app.client.post(app.url("/v1/ratings")).json(&body))
        .await;
    let (st, p) = r.problem();
    assert_eq!(st, 401, "{p:?}");
    let (st, _) = app.post("/v1/ratings", "wrong-key-wrong-key", &body).await;
    assert_eq!(st, 401);
    // Reader cannot write, writer cannot administer.
    let (st, p) = app.post("/v1/ratings", READER, &body).await;
    assert_eq!(st, 403, "{p}");
    let (st, _) = app.post("/v1/admin/retrain", WRITER, &json!({})).await;
    assert_eq!(st, 403);
    let (st, _) = app.get("/v1/admin/jobs/1", READER).await;
    assert_eq!(st, 403);
    // X-Api-Key works too; higher roles include lower ones.
    let r = app
        .send(
            app.client
                .post(app.url("/v1/ratings"))
                .header("X-Api-Key", ADMIN)
                .json(&body),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let (st, _) = app.get("/v1/users/u/budget", WRITER).await;
    assert_eq!(st, 200);
    let (st, _) = app.get("/v1/users/u/budget", "").await;
    assert_eq!(st, 401);
    app.stop().await;
}
both_backends!(keys_and_roles);

/// Zero-setup start: no keys configured generates one admin key, stored hashed, shown
/// once; a second start on the same database does not generate another.
async fn first_start_generates_admin_key_once(url: &str) {
    let mut s = settings(url);
    s.auth.keys.clear();
    let (t, _) = FakeDp::gaussian(5.0);
    let app = TestApp::spawn(s.clone(), t.clone(), Hooks::default()).await;
    let key = app.bootstrap_key.clone().expect("a generated key");
    let (st, _) = app.get("/v1/models", &key).await;
    assert_eq!(st, 200);
    let (st, _) = app.get("/v1/models", "").await;
    assert_eq!(st, 401);
    app.stop().await;
    let again = TestApp::spawn(s, t, Hooks::default()).await;
    assert!(again.bootstrap_key.is_none());
    let (st, _) = again.get("/v1/models", &key).await;
    assert_eq!(st, 200);
    again.stop().await;
}
both_backends!(first_start_generates_admin_key_once);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_refusals() {
    let db = TestDb::new(Kind::Sqlite, "refusals").await.unwrap();
    // Unknown trainer name.
    let mut s = settings(&db.url);
    s.trainer.name = "no-such-trainer".into();
    let e = TestApp::try_spawn(s, None, Hooks::default())
        .await
        .err()
        .unwrap();
    assert!(format!("{e:#}").contains("unknown trainer"), "{e:#}");
    // Non-private trainer without the explicit flag.
    let mut s = settings(&db.url);
    s.trainer.name = "baseline".into();
    let e = TestApp::try_spawn(s, None, Hooks::default())
        .await
        .err()
        .unwrap();
    assert!(format!("{e:#}").contains("allow_non_private"), "{e:#}");
    // No-auth mode off loopback.
    let mut s = settings(&db.url);
    s.auth.mode = AuthMode::Disabled;
    s.server.bind = "0.0.0.0:0".into();
    let (t, _) = FakeDp::gaussian(5.0);
    let e = TestApp::try_spawn(s.clone(), Some(t.clone()), Hooks::default())
        .await
        .err()
        .unwrap();
    assert!(format!("{e:#}").contains("loopback"), "{e:#}");
    // ... allowed on loopback, where no key is needed.
    s.server.bind = "127.0.0.1:0".into();
    let app = TestApp::spawn(s, t, Hooks::default()).await;
    let (st, _) = app.get("/v1/models", "").await;
    assert_eq!(st, 200);
    app.stop().await;
}
