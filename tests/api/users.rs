//! GET/PUT /v1/users/{user}/settings, default eps of new ratings, the audit's shape.

use dprec::retrain::Hooks;
use serde_json::json;

use crate::api::fake::FakeDp;
use crate::api::helpers::*;
use crate::both_backends;

async fn settings_and_audit(url: &str) {
    let (t, _) = FakeDp::gaussian(20.0);
    let app = TestApp::spawn(settings(url), t, Hooks::default()).await;
    let s = app.user_settings("carol").await;
    assert_eq!(s.budget_eps, 10.0);
    assert!(s.default_eps.is_none());
    let (st, s) = app
        .put(
            "/v1/users/carol/settings",
            WRITER,
            &json!({"default_eps": 0.5, "budget_eps": 4.0}),
        )
        .await;
    assert_eq!(st, 200, "{s}");
    assert_eq!(s["budget_delta"].as_f64(), Some(1e-6));
    let (st, _) = app
        .put("/v1/users/carol/settings", READER, &json!({}))
        .await;
    assert_eq!(st, 403);
    // Rating eps: explicit, else the user's default, else the service default.
    app.ingest(&[
        ("carol", "x", 4.0, Some(2.0)),
        ("carol", "y", 3.0, None),
        ("dave", "x", 2.0, None),
    ])
    .await;
    let (st, a) = app.get("/v1/users/carol/budget", READER).await;
    assert_eq!(st, 200);
    let eps: Vec<f64> = a["ratings"]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["eps"].as_f64().unwrap())
        .collect();
    assert_eq!(eps, [2.0, 0.5]);
    let (_, d) = app.get("/v1/users/dave/budget", READER).await;
    assert_eq!(d["ratings"]["entries"][0]["eps"].as_f64(), Some(1.0));
    assert_eq!(a["budget"]["eps"].as_f64(), Some(4.0));
    let eps0 = a["spent"]["eps"].as_f64().unwrap();
    assert_eq!(a["releases"]["total"], 0);
    // After a release the audit shows the charge and the RDP spent.
    let job = app.retrain().await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    let (_, a) = app.get("/v1/users/carol/budget?limit=1", READER).await;
    assert_eq!(a["ratings"]["total"], 2);
    assert_eq!(a["ratings"]["entries"].as_array().unwrap().len(), 1);
    let e = &a["ratings"]["entries"][0];
    assert_eq!(e["releases"], 1);
    assert!((e["spent"].as_f64().unwrap() - 0.8).abs() < 1e-12, "{e}");
    assert!(
        (e["remaining"].as_f64().unwrap() - 1.2).abs() < 1e-12,
        "{e}"
    );
    let r = &a["releases"]["entries"][0];
    assert_eq!(r["ratings_charged"], 2);
    assert!(
        (r["rating_eps_total"].as_f64().unwrap() - 1.0).abs() < 1e-12,
        "{r}"
    );
    assert!(r["events"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["mechanism"] == "gaussian"));
    assert!(a["spent"]["eps"].as_f64().unwrap() > eps0);
    assert!(a["spent"]["remaining_eps"].as_f64().unwrap() < 4.0);
    assert_eq!(a["exhausted"], false);
    let (st, _) = app.get("/v1/users/nobody/budget", READER).await;
    assert_eq!(st, 404);
    app.stop().await;
}
both_backends!(settings_and_audit);
