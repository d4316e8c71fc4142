//! Issue 8 finding 1: no membership oracle. The catalogue is public and registered (not
//! created by ratings); what a public caller sees is a function of the catalogue and the
//! DP outputs only.

use dprec::retrain::Hooks;
use serde_json::{json, Value};

use crate::api::helpers::*;
use crate::both_backends;

/// Items of the catalogue: two tastes `a0..a9`, `b0..b9` that users rate, and `c0..c4`
/// that nobody rates in D.
pub(super) fn catalogue() -> Vec<String> {
    let mut v = Vec::new();
    for p in ["a", "b", "c"] {
        let n = if p == "c" { 5 } else { 10 };
        v.extend((0..n).map(|j| format!("{p}{j}")));
    }
    v
}

/// D: 120 users, each rating 6 items of its taste (5 stars) and one of the other (2 stars),
/// eps_ij 10 (full participation). Deterministic (an LCG).
pub(super) fn data_d() -> Vec<(String, String, f64, Option<f64>)> {
    tastes(0x9e37_79b9_7f4a_7c15, 120, 10, 6, false, 2.0)
        .train
        .into_iter()
        .map(|(u, i, v)| (u, i, v, Some(10.0)))
        .collect()
}

/// Timestamps are not data, and there is no injected clock: `created_at` and
/// `age_seconds` are set to 0 wherever they occur. Nothing else is touched.
pub(super) fn without_timestamps(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                if k == "created_at" || k == "age_seconds" {
                    *x = json!(0);
                } else {
                    without_timestamps(x);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(without_timestamps),
        _ => {}
    }
}

/// /metrics without a key: the publication time of the model and the request latencies
/// (histogram buckets and sums) are clock readings, replaced by `T`; every other line
/// (request counts, model version, store errors) is compared as is.
pub(super) fn metrics_without_clock(text: &str) -> String {
    text.lines()
        .map(|l| {
            let clock = l.starts_with("dprec_model_published_timestamp_seconds")
                || l.starts_with("dprec_http_request_duration_seconds_bucket")
                || l.starts_with("dprec_http_request_duration_seconds_sum");
            match (clock, l.rsplit_once(' ')) {
                (true, Some((name, _))) => format!("{name} T"),
                _ => l.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every public answer of a server, in a fixed order: (what, status, normalised body).
pub(super) async fn public_view(app: &TestApp, users: &[&str]) -> Vec<(String, u16, String)> {
    let mut paths = vec![
        "/v1/models".to_string(),
        "/v1/models/current".to_string(),
        "/v1/models/current/items".to_string(),
        "/v1/items?limit=1000".to_string(),
    ];
    for i in catalogue() {
        paths.push(format!("/v1/items/{i}/similar?n=5"));
    }
    // A public key reaches no user: the same 403 for a user in the model and one who is not.
    for u in users {
        paths.push(format!("/v1/models/current/users/{u}"));
        paths.push(format!("/v1/users/{u}/recommendations"));
    }
    let mut out = Vec::new();
    for p in paths {
        let r = app
            .send(app.client.get(app.url(&p)).bearer_auth(PUBLIC))
            .await;
        let mut v = r.json();
        without_timestamps(&mut v);
        out.push((p, r.status, v.to_string()));
    }
    for p in ["/healthz", "/readyz"] {
        let r = app.send(app.client.get(app.url(p))).await;
        out.push((p.to_string(), r.status, r.text));
    }
    let r = app.send(app.client.get(app.url("/metrics"))).await;
    out.push((
        "/metrics".to_string(),
        r.status,
        metrics_without_clock(&r.text),
    ));
    out
}

/// Registers the catalogue, ingests `ratings`, runs one release (waiting on the job in the
/// store, so both servers see the same HTTP requests), and returns the public view.
async fn release_and_view(
    url: &str,
    ratings: &[(String, String, f64, Option<f64>)],
) -> Vec<(String, u16, String)> {
    let app = TestApp::try_spawn(topn_settings(url), None, Hooks::default())
        .await
        .unwrap();
    let rows: Vec<(&str, &str, f64, Option<f64>)> = ratings
        .iter()
        .map(|(u, i, v, e)| (u.as_str(), i.as_str(), *v, *e))
        .collect();
    app.register(&catalogue()).await;
    app.ingest_registered(&rows).await;
    let (st, job) = app.post("/v1/admin/retrain", ADMIN, &json!({})).await;
    assert_eq!(st, 202, "{job}");
    let id = job["id"].as_i64().unwrap();
    let job = loop {
        let j = app.store.job(id).await.unwrap().unwrap();
        if j.status != "running" {
            break j;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(job.status, "succeeded", "{:?}", job.reason);
    let view = public_view(&app, &["user000", "user001", "zz-new"]).await;
    app.stop().await;
    view
}

/// THE regression test of finding 1: releases on D and on D plus one rating by a new
/// user on a catalogue item nobody rated, same catalogue, same seed (`Hooks::seed`, the
/// test apps' TEST_SEED), give byte-identical public answers (timestamps normalised, see
/// [`without_timestamps`] and [`metrics_without_clock`]).
///
/// The new rating has a small eps_ij (0.05): the release samples it (RSM, a coin flip
/// from the release's randomness), so a trainer whose noise is drawn from the same
/// stream as its sampling would shift every noise draw after it. The new item `c3` gets
/// the new user's count (0 or 1) plus its count noise, drawn identically on D and D':
/// that it stays below the candidate threshold at this seed (2 count-noise standard
/// deviations, sd = z_c * count_clip > 1) is the DP mechanism working, not a property of
/// the code; the assertion would then fail on the candidate list, which is what a DP
/// output is allowed to do with small probability. The data were not tuned to the seed
/// beyond checking that.
async fn public_answers_do_not_reveal_a_new_user(url: &str) {
    let d = data_d();
    let mut d2 = d.clone();
    d2.push(("zz-new".into(), "c3".into(), 4.0, Some(0.05)));
    // The same number of ingest requests on both servers (50 ratings per request).
    assert_eq!(d.len().div_ceil(50), d2.len().div_ceil(50));
    // Two fresh servers, each on its own fresh database of the same backend.
    let kind = if url.starts_with("sqlite:") {
        Kind::Sqlite
    } else {
        Kind::Postgres
    };
    let other = TestDb::new(kind, "public_answers_do_not_reveal_a_new_user")
        .await
        .expect("the first database of this backend was created");
    let a = release_and_view(url, &d).await;
    let b = release_and_view(&other.url, &d2).await;
    assert_eq!(a.len(), b.len());
    for ((pa, sa, ba), (pb, sb, bb)) in a.iter().zip(&b) {
        assert_eq!(pa, pb);
        if ba != bb {
            let la: Vec<&str> = ba.lines().collect();
            let lb: Vec<&str> = bb.lines().collect();
            let only_a: Vec<&&str> = la.iter().filter(|l| !lb.contains(l)).collect();
            let only_b: Vec<&&str> = lb.iter().filter(|l| !la.contains(l)).collect();
            eprintln!("{pa}: only on D: {only_a:?}; only on D': {only_b:?}");
        }
        assert_eq!(
            (sa, ba),
            (sb, bb),
            "{pa} differs between D and D + one rating"
        );
    }
}
both_backends!(public_answers_do_not_reveal_a_new_user);

/// The catalogue's own endpoints: registration is a writer's, validated and idempotent;
/// the list is public and paginated; a rating (raw) of an unregistered item is refused
/// with the field and the way to register it, and changes nothing; similar items is 404
/// only outside the catalogue; a public key reads no user, existing or not.
async fn catalogue_endpoints(url: &str) {
    let app = TestApp::try_spawn(topn_settings(url), None, Hooks::default())
        .await
        .unwrap();
    for (key, status) in [(READER, 403), (PUBLIC, 403), ("", 401)] {
        let r = app
            .send(
                app.client
                    .post(app.url("/v1/admin/items"))
                    .bearer_auth(key)
                    .json(&json!({"items": ["x"]})),
            )
            .await;
        assert_eq!(r.status, status, "{key}: {}", r.text);
    }
    for (body, field) in [
        (json!({"items": []}), "items"),
        (json!({"items": ["ok", " padded"]}), "items[1]"),
        (json!({"items": ["ok", ""]}), "items[1]"),
        (json!({"items": "a0"}), "items"),
    ] {
        let (st, p) = app.post("/v1/admin/items", WRITER, &body).await;
        assert_eq!((st, p["field"].as_str()), (422, Some(field)), "{body}: {p}");
    }
    let (st, r) = app
        .post(
            "/v1/admin/items",
            WRITER,
            &json!({"items": ["b", "a", "c", "a"]}),
        )
        .await;
    assert_eq!(
        (st, &r["accepted"], &r["created"]),
        (200, &json!(3), &json!(3)),
        "{r}"
    );
    let (st, r) = app
        .post("/v1/admin/items", ADMIN, &json!({"items": ["a", "d"]}))
        .await;
    assert_eq!((st, &r["created"]), (200, &json!(1)), "{r}");
    let (st, page) = app.get("/v1/items?limit=2&offset=1", PUBLIC).await;
    assert_eq!(st, 200, "{page}");
    assert_eq!(page["items"], json!(["b", "c"]));
    assert_eq!(page["total"], 4);
    let (st, p) = app.get("/v1/items?limit=0", PUBLIC).await;
    assert_eq!((st, p["field"].as_str()), (422, Some("limit")));

    let before = app.store.fingerprint().await.unwrap();
    let batch = json!({"ratings": [
        {"user": "u1", "item": "a", "rating": 4.0},
        {"user": "u1", "item": "nowhere", "rating": 4.0},
    ]});
    let (st, p) = app.post("/v1/ratings", WRITER, &batch).await;
    assert_eq!(
        (st, p["field"].as_str()),
        (422, Some("ratings[1].item")),
        "{p}"
    );
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("POST /v1/admin/items"),
        "{p}"
    );
    assert_eq!(
        app.store.fingerprint().await.unwrap(),
        before,
        "nothing stored"
    );
    let (st, p) = app.get("/v1/items", PUBLIC).await;
    assert_eq!(
        (st, &p["total"]),
        (200, &json!(4)),
        "a refused rating created no item"
    );

    let rows: Vec<(String, String, f64, Option<f64>)> = (0..30)
        .flat_map(|u| ["a", "b", "c"].map(|i| (format!("u{u}"), i.to_string(), 5.0, Some(10.0))))
        .collect();
    let rows: Vec<(&str, &str, f64, Option<f64>)> = rows
        .iter()
        .map(|(u, i, v, e)| (u.as_str(), i.as_str(), *v, *e))
        .collect();
    app.ingest_registered(&rows).await;
    let job = app.retrain().await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    app.register(&["late"]).await;
    // "late" (registered after the release) answers like a catalogue item without a DP
    // profile; "d" (nobody rated it) like any item of the release: by its DP profile if
    // its noisy count made it a candidate (a DP output), else by DP popularity. An id
    // outside the catalogue is 404.
    let (st, s) = app.get("/v1/items/late/similar?n=2", PUBLIC).await;
    assert_eq!(st, 200, "{s}");
    assert_eq!(
        (&s["fallback"], &s["source"]),
        (&json!(true), &json!("popularity"))
    );
    let profiles = app.item_profiles().await;
    let d = profiles.items.iter().find(|p| p.item == "d").unwrap();
    let (st, s) = app.get("/v1/items/d/similar?n=2", PUBLIC).await;
    assert_eq!(st, 200, "{s}");
    let candidate = d.factors.iter().any(|&f| f != 0.0);
    assert_eq!(s["fallback"], json!(!candidate), "{s} {d:?}");
    let (st, _) = app.get("/v1/items/nowhere/similar", PUBLIC).await;
    assert_eq!(st, 404);
    // A user's profile and recommendations: the same 403 to a public key and to another
    // user's token, whether or not the user exists.
    let other = app.create_key("user", Some("u2")).await;
    for key in [PUBLIC, other.key.as_str()] {
        let mut answers = Vec::new();
        for u in ["u1", "ghost"] {
            for path in [
                format!("/v1/models/current/users/{u}"),
                format!("/v1/users/{u}/recommendations"),
            ] {
                let (st, p) = app.get(&path, key).await;
                assert_eq!(st, 403, "{path}: {p}");
                answers.push(p["detail"].as_str().unwrap().replace(u, "U"));
            }
        }
        assert_eq!(answers[..2], answers[2..]);
    }
    app.stop().await;
}
both_backends!(catalogue_endpoints);
