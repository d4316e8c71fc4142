//! /healthz, /readyz, /metrics, /docs, /openapi.json and the committed spec.

use std::sync::Arc;

use dprec::retrain::Hooks;

use crate::api::fake::FakeDp;
use crate::api::helpers::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_metrics_docs_and_unknown_routes() {
    let db = TestDb::new(Kind::Sqlite, "probes").await.unwrap();
    let (t, _) = FakeDp::gaussian(5.0);
    let app = TestApp::spawn(settings(&db.url), t, Hooks::default()).await;
    let (st, body) = app.get("/healthz", "").await;
    assert_eq!((st, body["status"].as_str()), (200, Some("ok")));
    let (st, body) = app.get("/readyz", "").await;
    assert_eq!((st, body["backend"].as_str()), (200, Some("sqlite")));
    app.ingest(&[("u1", "i1", 4.0, None)]).await;
    // The data-dependent metrics need an admin key (tests/api/keys.rs).
    let r = app
        .send(app.client.get(app.url("/metrics")).bearer_auth(ADMIN))
        .await;
    assert_eq!(r.status, 200);
    let text = r.text;
    for name in [
        "dprec_http_requests_total",
        "dprec_http_request_duration_seconds",
        "dprec_ratings_ingested_total 1",
        "dprec_model_release_id",
        "dprec_store_errors_total",
    ] {
        assert!(text.contains(name), "missing {name}");
    }
    assert!(text.contains("route=\"/v1/ratings\""), "{text}");
    // /docs: one HTML document rendered on the server, loading nothing (no script, no
    // external URL, a CSP that allows nothing else), descriptions rendered (no literal
    // backtick), schemas resolved; it names the HTML pages but links no page a browser
    // would be refused (the overview needs a link minted by an admin).
    let docs = reqwest::Client::new()
        .get(app.url("/docs"))
        .send()
        .await
        .unwrap();
    assert_eq!(docs.status(), 200);
    let csp = docs.headers()["content-security-policy"].to_str().unwrap();
    assert!(csp.starts_with("default-src 'none'"), "{csp}");
    let html = docs.text().await.unwrap();
    for bad in ["http://", "https://", "<script", "src=", "`", "$ref"] {
        assert!(!html.contains(bad), "/docs contains {bad:?}");
    }
    assert!(html.contains("href=\"/openapi.json\"") && html.contains("/v1/users/{user}/receipt"));
    assert!(html.contains("<h2 id=\"tag-pages\">") && html.contains("id=\"schema-Audit\""));
    assert!(
        !html.contains("href=\"/v1/admin/overview\""),
        "a link that answers 403"
    );
    // `/` redirects to /docs.
    let no_follow = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let root = no_follow.get(app.url("/")).send().await.unwrap();
    assert_eq!(root.status(), 307);
    assert_eq!(root.headers()["location"], "/docs");

    let (st, spec) = app.get("/openapi.json", "").await;
    assert_eq!(st, 200);
    assert!(spec["paths"]["/v1/ratings"]["post"].is_object());
    for page in ["/v1/users/{user}/receipt", "/v1/admin/overview"] {
        let ok = &spec["paths"][page]["get"]["responses"]["200"]["content"];
        assert!(ok["text/html"].is_object(), "{page}: {ok}");
    }
    let r = app.send(app.client.get(app.url("/v1/ratings"))).await;
    assert_eq!(r.status, 405);
    assert_eq!(r.content_type.as_deref(), Some("application/problem+json"));
    let r = app.send(app.client.get(app.url("/v2/nothing"))).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.content_type.as_deref(), Some("application/problem+json"));
    app.stop().await;
}

/// The committed openapi/openapi.json is what the code generates (regenerate:
/// `cargo run -- openapi > openapi/openapi.json`, or run this test with
/// `DPREC_BLESS_OPENAPI=1`, which writes the file instead of comparing).
#[test]
fn committed_openapi_matches_code() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi/openapi.json");
    if std::env::var_os("DPREC_BLESS_OPENAPI").is_some() {
        std::fs::write(&path, dprec::api::openapi::spec_json()).expect("write openapi.json");
    }
    let committed = std::fs::read_to_string(&path).expect("openapi/openapi.json exists");
    let generated = dprec::api::openapi::spec_json();
    assert!(
        committed == generated,
        "openapi/openapi.json is stale: run `cargo run -- openapi > openapi/openapi.json`"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_fails_when_store_is_gone() {
    let db = TestDb::new(Kind::Sqlite, "readyz").await.unwrap();
    let (t, _) = FakeDp::gaussian(5.0);
    let app = TestApp::spawn(settings(&db.url), t as Arc<_>, Hooks::default()).await;
    app.store.close().await;
    let (st, body) = app.get("/readyz", "").await;
    assert_eq!(st, 503, "{body}");
    app.handle_stop().await;
}

/// A metric's value in a Prometheus text page.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

/// Issue 44 (2, 7): the served default charges its ratings a Gaussian part only, so the
/// pure-eps counter stays 0 after a release; the rho counter counts what it charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_metrics_count_the_default_release() {
    let db = TestDb::new(Kind::Sqlite, "budget_metrics").await.unwrap();
    let mut s = settings(&db.url);
    let d = dprec::config::Settings::default();
    (s.trainer, s.budget) = (d.trainer, d.budget);
    let app = TestApp::try_spawn(s, None, Hooks::default()).await.unwrap();
    let mut ratings = Vec::new();
    for u in 0..30 {
        for i in 0..8 {
            ratings.push((format!("u{u}"), format!("i{i}"), (1 + (u + i) % 5) as f64));
        }
    }
    let refs: Vec<(&str, &str, f64, Option<f64>)> = ratings
        .iter()
        .map(|(u, i, r)| (u.as_str(), i.as_str(), *r, None))
        .collect();
    app.ingest(&refs).await;
    let page = || async {
        let r = app
            .send(app.client.get(app.url("/metrics")).bearer_auth(ADMIN))
            .await;
        r.text
    };
    assert_eq!(metric(&page().await, "dprec_budget_spent_rho_total"), 0.0);
    let job = app.retrain().await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    let text = page().await;
    assert_eq!(metric(&text, "dprec_budget_spent_eps_total"), 0.0);
    let rho = metric(&text, "dprec_budget_spent_rho_total");
    assert!(rho > 0.0, "{text}");
    app.stop().await;
}
