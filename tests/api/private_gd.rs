//! Private-GD rounds through the real server: open a schedule, clients built with the
//! crate's client report one bit each, the admin closes the round; replayed, stale and
//! malformed reports are refused with nothing stored; the charges appear in the audit.

use dprec::ldp::private_gd::{client_report, PublishedRound};
use dprec::retrain::Hooks;
use dprec_dp::rng::seeded;
use serde_json::{json, Value};

use crate::api::fake::FakeDp;
use crate::api::helpers::*;
use crate::both_backends;

fn report_json(user: &str, r: &dprec::ldp::private_gd::Report) -> Value {
    json!({"user": user, "round": r.round, "rows": r.rows, "rank": r.rank,
           "row": r.row, "col": r.col, "bit": r.bit})
}

async fn local_reports(app: &TestApp, user: &str) -> (u16, Value) {
    app.get(&format!("/v1/users/{user}/budget"), READER).await
}

async fn private_gd_round(url: &str) {
    let (t, _) = FakeDp::gaussian(20.0);
    let app = TestApp::spawn(settings(url), t, Hooks::default()).await;
    // The catalogue: six items, registered by ingestion.
    let items = ["i0", "i1", "i2", "i3", "i4", "i5"];
    let seed: Vec<(&str, &str, f64, Option<f64>)> =
        items.iter().map(|i| ("seed-user", *i, 3.0, None)).collect();
    app.ingest(&seed).await;

    let (st, _) = app.get("/v1/private-gd/round", READER).await;
    assert_eq!(st, 404);
    let (st, t) = app
        .post(
            "/v1/admin/private-gd/rounds",
            WRITER,
            &json!({"eps_total": 2.0, "rounds": 2, "rank": 2, "dim": 3}),
        )
        .await;
    assert_eq!(st, 403, "{t}");
    let (st, t) = app
        .post(
            "/v1/admin/private-gd/rounds",
            ADMIN,
            &json!({"eps_total": 2.0, "rounds": 2, "rank": 2, "dim": 3}),
        )
        .await;
    assert_eq!(st, 201, "{t}");
    assert_eq!(t["open"], 1);

    // The round state, for a client of the protocol.
    let (st, body) = app.get("/v1/private-gd/round", READER).await;
    assert_eq!(st, 200, "{body}");
    let published: PublishedRound = serde_json::from_value(body).unwrap();
    assert_eq!(published.round, 1);
    assert_eq!(published.items, items);
    assert_eq!(published.report_rows, 3);
    assert!((published.eps_round - 1.0).abs() < 1e-12);
    let state = published.state().unwrap();

    // Three clients report with the crate's client.
    let users: [(&str, Vec<(&str, f64)>); 3] = [
        (
            "alice",
            vec![("i0", 5.0), ("i1", 4.0), ("unknown-item", 1.0)],
        ),
        ("bob", vec![("i2", 1.0), ("i3", 2.0), ("i5", 5.0)]),
        ("carol", vec![]),
    ];
    let mut sent = Vec::new();
    for (k, (user, ratings)) in users.iter().enumerate() {
        let mine = published.ratings_by_index(ratings);
        let r = client_report(&state, &mine, &mut seeded(k as u64)).unwrap();
        let (st, receipt) = app
            .post("/v1/private-gd/reports", WRITER, &report_json(user, &r))
            .await;
        assert_eq!(st, 201, "{receipt}");
        assert!((receipt["eps_charged"].as_f64().unwrap() - 1.0).abs() < 1e-12);
        sent.push(r);
    }
    let (_, a) = local_reports(&app, "alice").await;
    let spent_after_one = a["spent"]["eps"].as_f64().unwrap();
    assert!(spent_after_one > 0.0, "{a}");
    assert_eq!(a["local_reports"].as_array().unwrap().len(), 1, "{a}");
    assert_eq!(a["local_reports"][0]["round"], 1);
    assert_eq!(a["local_reports"][0]["unit"], "user");

    // A replayed report is refused and changes nothing.
    let (st, p) = app
        .post(
            "/v1/private-gd/reports",
            WRITER,
            &report_json("alice", &sent[0]),
        )
        .await;
    assert_eq!(st, 409, "{p}");
    let (_, a) = local_reports(&app, "alice").await;
    assert_eq!(a["local_reports"].as_array().unwrap().len(), 1);
    assert_eq!(a["spent"]["eps"].as_f64().unwrap(), spent_after_one);

    // Bad reports from a new user: 4xx and nothing stored (the user is not even created).
    let good = report_json("mallory", &sent[1]);
    let bad = |f: &dyn Fn(&mut Value)| {
        let mut v = good.clone();
        f(&mut v);
        v
    };
    let cases: Vec<(Value, u16, &str)> = vec![
        (bad(&|v| v["round"] = json!(99)), 404, "round"),
        (bad(&|v| v["rows"] = json!(6)), 422, "rows"),
        (bad(&|v| v["rank"] = json!(3)), 422, "rank"),
        (bad(&|v| v["row"] = json!(3)), 422, "row"),
        (bad(&|v| v["col"] = json!(2)), 422, "col"),
        (bad(&|v| v["bit"] = json!(0)), 422, "bit"),
        (bad(&|v| v["bit"] = json!(0.5)), 422, "bit"),
        (bad(&|v| v["bit"] = json!("NaN")), 422, "bit"),
        (bad(&|v| v["extra"] = json!(1)), 422, "extra"),
    ];
    for (body, status, field) in cases {
        let (st, p) = app.post("/v1/private-gd/reports", WRITER, &body).await;
        assert_eq!(st, status, "{body} -> {p}");
        assert!(
            p["field"].as_str().unwrap_or("").contains(field)
                || p["detail"].as_str().unwrap_or("").contains(field),
            "{body} -> {p}"
        );
    }
    let (st, _) = app.get("/v1/users/mallory/budget", READER).await;
    assert_eq!(st, 404, "a refused report must not create the user");
    let (st, _) = app.post("/v1/private-gd/reports", READER, &good).await;
    assert_eq!(st, 403);

    // Schedule parameters are fixed while a schedule runs.
    let (st, _) = app
        .post("/v1/admin/private-gd/rounds", ADMIN, &json!({"rounds": 5}))
        .await;
    assert_eq!(st, 422);
    // Close round 1: three reports aggregated, round 2 opens with new item profiles.
    let (st, t) = app
        .post("/v1/admin/private-gd/rounds", ADMIN, &json!({}))
        .await;
    assert_eq!(st, 201, "{t}");
    assert_eq!(
        (t["closed"].clone(), t["reports"].clone(), t["open"].clone()),
        (json!(1), json!(3), json!(2))
    );
    let (_, body) = app.get("/v1/private-gd/round", READER).await;
    let next: PublishedRound = serde_json::from_value(body).unwrap();
    assert_eq!(next.round, 2);
    assert_ne!(next.item_factors, published.item_factors);
    assert_eq!(next.schedule, published.schedule);

    // A report for the closed round is refused; round 2 accepts alice again.
    let (st, p) = app
        .post(
            "/v1/private-gd/reports",
            WRITER,
            &report_json("bob", &sent[1]),
        )
        .await;
    assert_eq!(st, 409, "{p}");
    let st2 = next.state().unwrap();
    let r = client_report(&st2, &next.ratings_by_index(&users[0].1), &mut seeded(7)).unwrap();
    let (st, p) = app
        .post("/v1/private-gd/reports", WRITER, &report_json("alice", &r))
        .await;
    assert_eq!(st, 201, "{p}");
    let (_, a) = local_reports(&app, "alice").await;
    assert_eq!(a["local_reports"].as_array().unwrap().len(), 2);
    assert_eq!(a["local_reports"][0]["round"], 2);
    assert!(a["spent"]["eps"].as_f64().unwrap() > spent_after_one);
    app.stop().await;
}
both_backends!(private_gd_round);

/// The round state reveals the exact number of reports of the closed round (the update
/// is a sum of one-bit reports over `n`), so it is read only with a key a client of the
/// protocol holds: a user token (any user's), a reader, writer or admin. No key is 401, a
/// public or metrics key 403, whether a round is open or not.
async fn round_needs_a_protocol_key(url: &str) {
    let (t, _) = FakeDp::gaussian(20.0);
    let app = TestApp::spawn(settings(url), t, Hooks::default()).await;
    app.ingest(&[
        ("seed-user", "i0", 3.0, None),
        ("seed-user", "i1", 3.0, None),
    ])
    .await;
    let token = app.create_key("user", Some("alice")).await;
    let scraper = app.create_key("metrics", None).await;
    let refused = [("", 401), (PUBLIC, 403), (scraper.key.as_str(), 403)];
    for (key, status) in refused {
        let (st, p) = app.get("/v1/private-gd/round", key).await;
        assert_eq!(st, status, "{key:?} before any round: {p}");
    }
    let (st, t) = app
        .post(
            "/v1/admin/private-gd/rounds",
            ADMIN,
            &json!({"eps_total": 2.0, "rounds": 2, "rank": 2, "dim": 0}),
        )
        .await;
    assert_eq!(st, 201, "{t}");
    for (key, status) in refused {
        let (st, p) = app.get("/v1/private-gd/round", key).await;
        assert_eq!(st, status, "{key:?}: {p}");
    }
    for key in [token.key.as_str(), READER, WRITER, ADMIN] {
        let (st, p) = app.get("/v1/private-gd/round", key).await;
        assert_eq!(st, 200, "{key:?}: {p}");
        assert_eq!(p["round"], 1);
    }
    app.stop().await;
}
both_backends!(round_needs_a_protocol_key);
