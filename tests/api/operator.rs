//! Operator safety (issue 11): a release whose DP input total is far below the served
//! release's is refused unless forced, with its charges committed; and (issue 12) a real
//! PostgreSQL deadlock maps to 503 + Retry-After.

use dprec::retrain::Hooks;

use crate::api::fake::FakeDp;
use crate::api::helpers::*;
use crate::both_backends;

/// Every rating's lifetime eps: with `share = fraction:0.4` a release takes 2.0 of it
/// (training 1.5 + popularity 0.5), the third one the 1.0 left.
const RATING_EPS: f64 = 5.0;
const POPULARITY_EPS: f64 = 0.5;

/// Test settings with the rating and popularity eps above and a user budget large enough
/// for several releases (each costs a user `PureDp(10 items x 0.5)` for the popularity).
fn operator_settings(url: &str) -> dprec::config::Settings {
    let mut s = settings(url);
    s.budget.popularity_eps = POPULARITY_EPS;
    s.budget.default_user_eps = 100.0;
    s.budget.max_user_eps = 100.0;
    s
}

/// `keep` rates 3 items; 40 other users rate all 10 items (403 ratings).
async fn good_store(app: &TestApp) {
    let mut ratings: Vec<(String, String, f64)> = Vec::new();
    for u in 0..40 {
        for i in 0..10 {
            ratings.push((format!("u{u}"), format!("i{i}"), (1 + (u + i) % 5) as f64));
        }
    }
    for i in 0..3 {
        ratings.push(("keep".into(), format!("i{i}"), 4.0));
    }
    let refs: Vec<(&str, &str, f64, Option<f64>)> = ratings
        .iter()
        .map(|(u, i, r)| (u.as_str(), i.as_str(), *r, Some(RATING_EPS)))
        .collect();
    app.ingest(&refs).await;
}

/// The served release's DP total (sum of its DP item counts).
fn served_total(app: &TestApp) -> (i64, i64) {
    let p = app.app_registry.current().expect("a served release");
    (p.release_id, p.popularity.iter().sum())
}

/// `keep`'s rating spends, in item order.
async fn keep_spent(app: &TestApp) -> Vec<f64> {
    let a = app.audit("keep", "").await;
    a.ratings.entries.iter().map(|r| r.spent).collect()
}

async fn post_retrain(app: &TestApp, body: Option<serde_json::Value>) -> Job {
    let mut req = app
        .client
        .post(app.url("/v1/admin/retrain"))
        .bearer_auth(ADMIN);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = app.send(req).await;
    assert_eq!(r.status, 202, "{}", r.text);
    let job: Job = serde_json::from_str(&r.text).unwrap();
    app.wait_job(job.id).await
}

/// Issue 11: a good release, then the store loses all but `keep`'s 3 ratings. The next
/// admin retrain is refused (job `refused`, both DP totals in the reason), the good
/// release stays served and listed alone, and the refused release's charges stand
/// (spent 2.0 -> 4.0 on each of `keep`'s ratings, audited under the refused release).
async fn small_input_is_refused_unless_forced(url: &str) {
    let s = operator_settings(url);
    assert_eq!(s.retrain.min_input_ratio, 0.5, "the default");
    let (t, _) = FakeDp::gaussian(20.0);
    let app = TestApp::spawn(s, t, Hooks::default()).await;
    good_store(&app).await;
    let good = app.retrain().await;
    assert_eq!(good.status, "succeeded", "{good:?}");
    let good_id = good.release_id.unwrap();
    let (_, good_total) = served_total(&app);
    assert!(good_total > 300, "DP total of 403 ratings: {good_total}");
    assert_eq!(keep_spent(&app).await, vec![2.0; 3]);

    for u in 0..40 {
        let (st, body) = app.delete(&format!("/v1/users/u{u}"), WRITER).await;
        assert_eq!(st, 204, "{body}");
    }
    // No body at all (as a generated client sends it) is the default: not forced.
    let refused = post_retrain(&app, None).await;
    assert_eq!(refused.status, "refused", "{refused:?}");
    let reason = refused.reason.clone().unwrap();
    assert!(
        reason.contains(&format!(
            "DP input total {good_total} of the served release {good_id}"
        )),
        "{reason}"
    );
    assert!(reason.contains("retrain.min_input_ratio 0.5"), "{reason}");
    assert!(reason.contains("\"force\": true"), "{reason}");
    let refused_id = refused.release_id.expect("the release holding the charges");
    assert!(refused_id > good_id);
    // The good release is still the one served, loaded at start and listed.
    assert_eq!(served_total(&app), (good_id, good_total));
    assert_eq!(app.current_model().await.release.id, good_id);
    assert_eq!(app.store.latest_model_id().await.unwrap(), Some(good_id));
    let list = app.models("").await;
    assert_eq!(list.releases.len(), 1);
    assert_eq!(list.releases[0].id, good_id);
    // Its charges stand: the mechanisms ran and the refusal reveals their output.
    assert_eq!(keep_spent(&app).await, vec![4.0; 3]);
    let a = app.audit("keep", "").await;
    assert_eq!(a.releases.total, 2);
    let charge = &a.releases.entries[0];
    assert_eq!(charge.release_id, refused_id);
    assert_eq!(charge.ratings_charged, 3);
    assert!(
        (charge.rating_eps_total - 3.0 * 2.0).abs() < 1e-12,
        "{charge:?}"
    );
    assert!(!charge.mechanisms.is_empty() && charge.events.is_array());
    // Training 1.5 and popularity 0.5 on each of the 3 ratings, as a published release.
    let rows = sqlx::query(
        "SELECT eps_train, eps_popularity, n FROM rating_charge_sets WHERE release_id = $1",
    )
    .bind(refused_id)
    .fetch_all(app.store.pool())
    .await
    .unwrap();
    let split: Vec<(f64, f64, i64)> = rows
        .iter()
        .map(|r| {
            use sqlx::Row;
            (r.get(0), r.get(1), r.get(2))
        })
        .collect();
    assert_eq!(split, vec![(1.5, POPULARITY_EPS, 3)]);

    // Retrying without force is refused again, and charged again (spent 5.0: every
    // rating exhausted, so a forced retrain now admits nothing: it publishes noise and
    // charges nothing).
    // (A JSON `null` body, which the spec allows, is the default too.)
    let again = post_retrain(&app, Some(serde_json::Value::Null)).await;
    assert_eq!(again.status, "refused", "{again:?}");
    assert_eq!(keep_spent(&app).await, vec![RATING_EPS; 3]);
    let forced = post_retrain(&app, Some(serde_json::json!({"force": true}))).await;
    assert_eq!(forced.status, "succeeded", "{forced:?}");
    assert_eq!(served_total(&app).0, forced.release_id.unwrap());
    assert_eq!(keep_spent(&app).await, vec![RATING_EPS; 3]);
    app.stop().await;
}
both_backends!(small_input_is_refused_unless_forced);

/// Issue 11: `{"force": true}` publishes a release the rule refuses, with a `forced:`
/// note in the job; the charges are those of a published release.
async fn forced_retrain_publishes(url: &str) {
    let s = operator_settings(url);
    let (t, _) = FakeDp::gaussian(20.0);
    let app = TestApp::spawn(s, t, Hooks::default()).await;
    good_store(&app).await;
    let good = app.retrain().await;
    let good_id = good.release_id.unwrap();
    for u in 0..40 {
        app.delete(&format!("/v1/users/u{u}"), WRITER).await;
    }
    let forced = post_retrain(&app, Some(serde_json::json!({"force": true}))).await;
    assert_eq!(forced.status, "succeeded", "{forced:?}");
    let id = forced.release_id.unwrap();
    assert!(id > good_id);
    let note = forced.reason.clone().unwrap();
    assert!(note.starts_with("forced: published although"), "{note}");
    assert!(
        note.contains(&format!("served release {good_id}")),
        "{note}"
    );
    assert_eq!(served_total(&app).0, id);
    assert_eq!(app.store.latest_model_id().await.unwrap(), Some(id));
    assert_eq!(keep_spent(&app).await, vec![4.0; 3]);
    // `force: false` in the body is the default; an unknown field is refused.
    let (st, p) = app
        .post(
            "/v1/admin/retrain",
            ADMIN,
            &serde_json::json!({"forced": true}),
        )
        .await;
    assert_eq!(st, 422, "{p}");
    app.stop().await;
}
both_backends!(forced_retrain_publishes);

/// `retrain.min_input_ratio = 0` turns the rule off: the small release publishes.
async fn zero_ratio_turns_the_rule_off(url: &str) {
    let mut s = operator_settings(url);
    s.retrain.min_input_ratio = 0.0;
    let (t, _) = FakeDp::gaussian(20.0);
    let app = TestApp::spawn(s, t, Hooks::default()).await;
    good_store(&app).await;
    assert_eq!(app.retrain().await.status, "succeeded");
    for u in 0..40 {
        app.delete(&format!("/v1/users/u{u}"), WRITER).await;
    }
    let job = app.retrain().await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    assert_eq!(job.reason, None);
    assert_eq!(served_total(&app).0, job.release_id.unwrap());
    app.stop().await;
}
both_backends!(zero_ratio_turns_the_rule_off);

/// Scheduled retrains never force: after a good scheduled release, the store loses all
/// but 3 ratings and the next scheduled job is `refused`; a large release stays served.
async fn scheduled_retrains_never_force(url: &str) {
    let mut s = operator_settings(url);
    s.scheduler.enabled = true;
    s.scheduler.retrain_interval_secs = 1;
    let (t, _) = FakeDp::gaussian(20.0);
    let app = TestApp::spawn(s, t, Hooks::default()).await;
    good_store(&app).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while app
        .app_registry
        .current()
        .is_none_or(|p| p.popularity.iter().sum::<i64>() < 300)
    {
        assert!(std::time::Instant::now() < deadline, "no scheduled release");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    for u in 0..40 {
        app.delete(&format!("/v1/users/u{u}"), WRITER).await;
    }
    let mut id = 1;
    let refused = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "no refused scheduled job"
        );
        let (st, j) = app.get(&format!("/v1/admin/jobs/{id}"), ADMIN).await;
        if st == 404 || j["status"] == "running" {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        }
        if j["status"] == "refused" {
            break j;
        }
        id += 1;
    };
    assert_eq!(refused["kind"], "scheduled", "{refused}");
    assert!(
        served_total(&app).1 > 300,
        "a large release is still served"
    );
    app.stop().await;
}
both_backends!(scheduled_retrains_never_force);

/// Issue 12: a real lock-order deadlock on PostgreSQL (two transactions each holding one
/// row and waiting for the other's) aborts one of them with 40P01; through the API's
/// error mapping it is a 503 with Retry-After, not a 500. Deterministic: PostgreSQL
/// always detects the cycle (after `deadlock_timeout`, set to 100 ms here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_deadlock_is_503() {
    use actix_web::ResponseError;
    let Some(db) = TestDb::new(Kind::Postgres, "deadlock").await else {
        return;
    };
    let (t, _) = FakeDp::gaussian(20.0);
    let app = TestApp::spawn(settings(&db.url), t, Hooks::default()).await;
    app.ingest(&[("a", "i1", 4.0, None), ("b", "i1", 3.0, None)])
        .await;
    let pool = app.store.pool();
    let lock = "UPDATE users SET updated_at = updated_at WHERE id = $1";
    let mut first = pool.begin().await.unwrap();
    let mut second = pool.begin().await.unwrap();
    for tx in [&mut first, &mut second] {
        sqlx::query("SET LOCAL deadlock_timeout = '100ms'")
            .execute(&mut **tx)
            .await
            .unwrap();
    }
    sqlx::query(lock)
        .bind("a")
        .execute(&mut *first)
        .await
        .unwrap();
    sqlx::query(lock)
        .bind("b")
        .execute(&mut *second)
        .await
        .unwrap();
    let (r1, r2) = tokio::join!(sqlx::query(lock).bind("b").execute(&mut *first), async {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        sqlx::query(lock).bind("a").execute(&mut *second).await
    });
    let errors: Vec<sqlx::Error> = [r1.err(), r2.err()].into_iter().flatten().collect();
    assert_eq!(errors.len(), 1, "exactly one side is aborted: {errors:?}");
    let e = errors.into_iter().next().unwrap();
    let code = match &e {
        sqlx::Error::Database(d) => d.code().map(|c| c.to_string()),
        _ => None,
    };
    assert_eq!(code.as_deref(), Some("40P01"), "{e}");
    let api: dprec::api::ApiError = dprec::store::StoreError::Db(e).into();
    let res = api.error_response();
    assert_eq!(res.status(), 503);
    assert_eq!(res.headers().get("retry-after").unwrap(), "1");
    drop((first, second));
    app.stop().await;
}
