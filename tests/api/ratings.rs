//! POST /v1/ratings and DELETE /v1/users/{user}/ratings/{item}: the bad-input table
//! (status, field, store unchanged), upsert keeping the budget slot, deletion.

use dprec::retrain::Hooks;
use serde_json::json;

use crate::api::fake::FakeDp;
use crate::api::helpers::*;
use crate::both_backends;

fn good(i: usize) -> serde_json::Value {
    json!({"user": format!("u{i}"), "item": format!("i{i}"), "rating": 4.0, "eps": 0.5})
}

/// Every kind of bad input gets a 4xx with the offending field and changes nothing.
/// Columns: case, content type, body, expected status, expected field.
async fn bad_input_table(url: &str) {
    let (t, _) = FakeDp::gaussian(5.0);
    let app = TestApp::spawn(settings(url), t, Hooks::default()).await;
    app.ingest(&[("u0", "i0", 3.0, Some(1.0))]).await;
    let before = app.store.fingerprint().await.unwrap();
    let with = |k: &str, v: serde_json::Value| {
        let mut r = good(1);
        r[k] = v;
        json!({"ratings": [good(0), r]}).to_string()
    };
    let long = "x".repeat(129);
    let batch51: Vec<_> = (0..51).map(good).collect();
    let big_body = format!(
        "{{\"ratings\": [{{\"user\": \"{}\", \"item\": \"i\", \"rating\": 3.0}}]}}",
        "u".repeat(20_000)
    );
    let cases: Vec<(&str, &str, String, u16, Option<&str>)> = vec![
        (
            "malformed JSON",
            "application/json",
            "{\"ratings\": [".into(),
            400,
            None,
        ),
        (
            "trailing garbage",
            "application/json",
            format!("{} x", json!({"ratings": [good(0)]})),
            400,
            None,
        ),
        (
            "NaN literal",
            "application/json",
            "{\"ratings\": [{\"user\": \"u\", \"item\": \"i\", \"rating\": NaN}]}".into(),
            400,
            Some("ratings[0].rating"),
        ),
        (
            "infinite number",
            "application/json",
            "{\"ratings\": [{\"user\": \"u\", \"item\": \"i\", \"rating\": 1e999}]}".into(),
            400,
            None,
        ),
        (
            "wrong content type",
            "text/plain",
            json!({"ratings": [good(0)]}).to_string(),
            415,
            None,
        ),
        (
            "no content type",
            "",
            json!({"ratings": [good(0)]}).to_string(),
            415,
            None,
        ),
        (
            "rating as string",
            "application/json",
            with("rating", json!("five")),
            422,
            Some("ratings[1].rating"),
        ),
        (
            "user as number",
            "application/json",
            with("user", json!(7)),
            422,
            Some("ratings[1].user"),
        ),
        (
            "unknown field",
            "application/json",
            with("colour", json!("red")),
            422,
            Some("ratings[1].colour"),
        ),
        (
            "missing rating",
            "application/json",
            json!({"ratings": [{"user": "u", "item": "i"}]}).to_string(),
            422,
            Some("ratings[0]"),
        ),
        (
            "top-level array",
            "application/json",
            "[]".into(),
            422,
            Some("body"),
        ),
        (
            "unknown top-level field",
            "application/json",
            json!({"ratings": [good(0)], "x": 1}).to_string(),
            422,
            Some("x"),
        ),
        (
            "rating above scale",
            "application/json",
            with("rating", json!(6.0)),
            422,
            Some("ratings[1].rating"),
        ),
        (
            "rating below scale",
            "application/json",
            with("rating", json!(0.5)),
            422,
            Some("ratings[1].rating"),
        ),
        (
            "rating off step",
            "application/json",
            with("rating", json!(3.3)),
            422,
            Some("ratings[1].rating"),
        ),
        (
            "eps zero",
            "application/json",
            with("eps", json!(0.0)),
            422,
            Some("ratings[1].eps"),
        ),
        (
            "eps negative",
            "application/json",
            with("eps", json!(-1.0)),
            422,
            Some("ratings[1].eps"),
        ),
        (
            "eps above max",
            "application/json",
            with("eps", json!(10.5)),
            422,
            Some("ratings[1].eps"),
        ),
        (
            "eps as string",
            "application/json",
            with("eps", json!("1")),
            422,
            Some("ratings[1].eps"),
        ),
        (
            "empty user id",
            "application/json",
            with("user", json!("")),
            422,
            Some("ratings[1].user"),
        ),
        (
            "oversize item id",
            "application/json",
            with("item", json!(long)),
            422,
            Some("ratings[1].item"),
        ),
        (
            "control char in id",
            "application/json",
            with("item", json!("a\u{7}b")),
            422,
            Some("ratings[1].item"),
        ),
        (
            "padded id",
            "application/json",
            with("user", json!(" u1")),
            422,
            Some("ratings[1].user"),
        ),
        (
            "duplicate pair",
            "application/json",
            json!({"ratings": [good(0), good(0)]}).to_string(),
            422,
            Some("ratings[1]"),
        ),
        (
            "empty batch",
            "application/json",
            json!({"ratings": []}).to_string(),
            422,
            Some("ratings"),
        ),
        (
            "oversize batch",
            "application/json",
            json!({"ratings": batch51}).to_string(),
            413,
            Some("ratings"),
        ),
        ("oversize body", "application/json", big_body, 413, None),
    ];
    for (case, ct, body, status, field) in cases {
        let mut req = app
            .client
            .post(app.url("/v1/ratings"))
            .bearer_auth(WRITER)
            .body(body);
        if !ct.is_empty() {
            req = req.header("content-type", ct);
        }
        let r = app.send(req).await;
        let got = r.status;
        let ctype = r.content_type.clone();
        let (_, p) = r.status_json();
        assert_eq!(got, status, "{case}: {p}");
        assert_eq!(ctype.as_deref(), Some("application/problem+json"), "{case}");
        assert_eq!(p["status"].as_u64(), Some(status as u64), "{case}: {p}");
        assert_eq!(p["field"].as_str(), field, "{case}: {p}");
        assert!(
            p["title"].is_string() && p["detail"].is_string(),
            "{case}: {p}"
        );
        assert_eq!(
            app.store.fingerprint().await.unwrap(),
            before,
            "{case} changed the store"
        );
    }
    // Bad settings and bad paths are 422 with the field too.
    for (body, field) in [
        (json!({"budget_eps": -1.0}), "budget_eps"),
        (json!({"budget_delta": 1.0}), "budget_delta"),
        (json!({"default_eps": 100.0}), "default_eps"),
        (json!({"budget": 1.0}), "budget"),
    ] {
        let (st, p) = app.put("/v1/users/u0/settings", WRITER, &body).await;
        assert_eq!((st, p["field"].as_str()), (422, Some(field)), "{p}");
    }
    let (st, p) = app.get("/v1/users/u0/budget?limit=0", READER).await;
    assert_eq!((st, p["field"].as_str()), (422, Some("limit")), "{p}");
    let (st, p) = app.get("/v1/users/u0/recommendations?n=abc", READER).await;
    assert_eq!((st, p["field"].as_str()), (422, Some("n")), "{p}");
    assert_eq!(app.store.fingerprint().await.unwrap(), before);
    app.stop().await;
}
both_backends!(bad_input_table);

/// A re-rating replaces the value but keeps eps_ij and what was spent.
async fn rerating_keeps_budget_slot(url: &str) {
    let (t, _) = FakeDp::gaussian(20.0);
    let app = TestApp::spawn(settings(url), t, Hooks::default()).await;
    app.ingest(&[("u1", "i1", 4.0, Some(1.0)), ("u1", "i2", 2.0, Some(1.0))])
        .await;
    let job = app.retrain().await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    let (_, a) = app.get("/v1/users/u1/budget", READER).await;
    let spent = a["ratings"]["entries"][0]["spent"].as_f64().unwrap();
    assert!(spent > 0.0);
    // Re-rate with a different eps: the slot stays.
    app.ingest(&[("u1", "i1", 5.0, Some(9.0))]).await;
    let (_, b) = app.get("/v1/users/u1/budget", READER).await;
    assert_eq!(b["ratings"]["entries"][0]["spent"].as_f64(), Some(spent));
    assert_eq!(b["ratings"]["entries"][0]["eps"].as_f64(), Some(1.0));
    // Delete, then 404 on a second delete; the slot stays visible in the audit.
    let (st, _) = app.delete("/v1/users/u1/ratings/i1", WRITER).await;
    assert_eq!(st, 204);
    let (st, p) = app.delete("/v1/users/u1/ratings/i1", WRITER).await;
    assert_eq!(st, 404, "{p}");
    let (_, c) = app.get("/v1/users/u1/budget", READER).await;
    assert_eq!(c["ratings"]["entries"][0]["status"], "deleted");
    assert_eq!(c["ratings"]["entries"][0]["spent"].as_f64(), Some(spent));
    // Re-rating after deletion restores the value into the same slot.
    app.ingest(&[("u1", "i1", 3.0, None)]).await;
    let (_, d) = app.get("/v1/users/u1/budget", READER).await;
    assert_eq!(d["ratings"]["entries"][0]["status"], "active");
    assert_eq!(d["ratings"]["entries"][0]["spent"].as_f64(), Some(spent));
    app.stop().await;
}
both_backends!(rerating_keeps_budget_slot);
