//! A release in flight holds its user-level charge (`store::holds`, docs/LEDGER.md
//! "Releases in flight"): a budget lowered, LDP ratings sent, or a Private-GD report sent
//! between a release's snapshot and its commit is refused with 409 when it would leave
//! the user too little for that charge, and accepted when it leaves enough. Either way
//! the release publishes, and every user's audit counts exactly the published releases.
//! Each trigger is raced from inside the release (its `before_commit` hook, after the
//! snapshot and the fit).

use std::sync::{Arc, Mutex};

use dprec::data::RatingScale;
use dprec::ldp::private_gd::{client_report, PublishedRound};
use dprec::ldp::RatingPerturber;
use dprec::retrain::Hooks;
use dprec_dp::accountant::PrivacyEvent;
use dprec_dp::ledger::UserBudget;
use serde_json::{json, Value};
use sqlx::Row;

use crate::api::fake::FakeDp;
use crate::api::helpers::*;
use crate::both_backends;

type Action = Box<dyn FnOnce() -> (u16, Value) + Send>;

/// A `before_commit` hook that runs the armed request, if any, while the release waits
/// (on a thread of its own with its own runtime: the hook runs on the release's thread),
/// and keeps its answer.
#[derive(Clone, Default)]
struct Race {
    armed: Arc<Mutex<Option<Action>>>,
    answer: Arc<Mutex<Option<(u16, Value)>>>,
}

impl Race {
    fn hooks(&self) -> Hooks {
        let me = self.clone();
        Hooks {
            before_commit: Some(Arc::new(move || {
                if let Some(action) = me.armed.lock().unwrap().take() {
                    let answer = std::thread::spawn(action).join().unwrap();
                    *me.answer.lock().unwrap() = Some(answer);
                }
                Ok(())
            })),
            ..Hooks::default()
        }
    }

    /// Runs a release with `method path body` (as `key`) sent inside it; returns the
    /// release's job and the request's answer.
    async fn release_racing(
        &self,
        app: &TestApp,
        method: reqwest::Method,
        path: &str,
        key: &str,
        body: Value,
    ) -> (Job, (u16, Value)) {
        let (url, key) = (app.url(path), key.to_owned());
        *self.armed.lock().unwrap() = Some(Box::new(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let r = reqwest::Client::new()
                    .request(method, url)
                    .bearer_auth(key)
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                (status, r.json().await.unwrap_or(Value::Null))
            })
        }));
        let job = app.retrain().await;
        let answer = self.answer.lock().unwrap().take().expect("the request ran");
        (job, answer)
    }
}

/// Four users with four ratings each (eps_ij 1).
async fn store_with_users(app: &TestApp) {
    let mut r = Vec::new();
    for u in 0..4 {
        for i in 0..4 {
            r.push((format!("u{u}"), format!("i{i}"), 1.0 + ((u + i) % 5) as f64));
        }
    }
    let t: Vec<(&str, &str, f64, Option<f64>)> = r
        .iter()
        .map(|(u, i, v)| (u.as_str(), i.as_str(), *v, Some(1.0)))
        .collect();
    app.ingest(&t).await;
}

/// The user-level events release `id` charged (the same for every user it charged).
async fn release_events(app: &TestApp, id: i64) -> Vec<PrivacyEvent> {
    let row = sqlx::query("SELECT events FROM user_charges WHERE release_id = $1 LIMIT 1")
        .bind(id)
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    serde_json::from_str(&row.try_get::<String, _>(0).unwrap()).unwrap()
}

/// A user's budget and consumed curve as stored.
async fn stored_budget(app: &TestApp, user: &str) -> UserBudget {
    let u = app.store.user(user).await.unwrap().unwrap();
    UserBudget {
        eps: u.budget_eps,
        delta: u.budget_delta,
        consumed: u.consumed,
    }
}

/// The smallest `x` in `[0, hi]` (to 1e-6 relative) with `ok(x)`, for `ok` false at 0
/// and true at `hi`, monotone.
fn smallest(hi: f64, ok: impl Fn(f64) -> bool) -> f64 {
    assert!(ok(hi) && !ok(0.0));
    let (mut lo, mut hi) = (0.0, hi);
    while hi - lo > 1e-6 * hi {
        let mid = (lo + hi) / 2.0;
        if ok(mid) {
            hi = mid
        } else {
            lo = mid
        }
    }
    hi
}

/// The smallest budget eps (at the user's delta) that admits `events` on top of what
/// the user consumed.
fn smallest_budget(b: &UserBudget, events: &[PrivacyEvent]) -> f64 {
    smallest(b.eps, |eps| {
        UserBudget { eps, ..b.clone() }
            .admits(events)
            .unwrap_or(false)
    })
}

/// Every user's audit counts exactly the releases that were published.
async fn audits_count_published(app: &TestApp, users: &[&str]) {
    let published = app.models("").await.releases.len() as i64;
    for u in users {
        let a = app.audit(u, "").await;
        assert_eq!(a.releases.total, published, "user {u}: {:?}", a.releases);
    }
}

const USERS: [&str; 4] = ["u0", "u1", "u2", "u3"];

/// Settings: a lowering below what the release in flight will charge is refused (409,
/// field budget_eps); one that covers it is applied. Today's code applied both, and the
/// first made the release fail after charging the users of its first ledger transactions.
async fn a_lowered_budget_never_cancels_a_release(url: &str) {
    let (t, _) = FakeDp::gaussian(5.0);
    let race = Race::default();
    let mut s = settings(url);
    // One user charge a ledger transaction: a failure at a later user leaves the earlier
    // users charged for nothing (what today's code did).
    s.budget.default_user_eps = 10.0;
    let app = TestApp::spawn(s, t, race.hooks()).await;
    app.store.set_commit_rows(32);
    store_with_users(&app).await;
    let first = app.retrain().await;
    assert_eq!(first.status, "succeeded", "{first:?}");
    let event = release_events(&app, first.release_id.unwrap()).await;
    let b = stored_budget(&app, "u3").await;
    // Between what the user consumed and that plus one more release.
    let (fits_consumed, fits_next) = (smallest_budget(&b, &[]), smallest_budget(&b, &event));
    assert!(fits_consumed < fits_next, "{fits_consumed} {fits_next}");
    let low = (fits_consumed + fits_next) / 2.0;
    let path = "/v1/users/u3/settings";
    let (job, (status, body)) = race
        .release_racing(
            &app,
            reqwest::Method::PUT,
            path,
            WRITER,
            json!({"budget_eps": low}),
        )
        .await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["field"], "budget_eps", "{body}");
    assert_eq!(app.user_settings("u3").await.budget_eps, b.eps);
    // A lowering that leaves room for one more release is applied during one.
    let b = stored_budget(&app, "u3").await;
    let covers = smallest_budget(&b, &[&event[..], &event[..]].concat()) * 1.01;
    let (job, (status, body)) = race
        .release_racing(
            &app,
            reqwest::Method::PUT,
            path,
            WRITER,
            json!({"budget_eps": covers}),
        )
        .await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    assert_eq!(status, 200, "{body}");
    assert_eq!(app.user_settings("u3").await.budget_eps, covers);
    audits_count_published(&app, &USERS).await;
    app.stop().await;
}
both_backends!(a_lowered_budget_never_cancels_a_release);

/// LDP ratings whose local eps fits what the user has left, but not together with the
/// charge of the release in flight, are refused (409, nothing stored); smaller ones are
/// stored. Today's code stored them and the release failed.
async fn ldp_ratings_never_cancel_a_release(url: &str) {
    let (t, _) = FakeDp::gaussian(5.0);
    let race = Race::default();
    let mut s = settings(url);
    s.budget.default_user_eps = 4.0;
    let app = TestApp::spawn(s, t, race.hooks()).await;
    app.store.set_commit_rows(32);
    store_with_users(&app).await;
    app.register(&["i8", "i9"]).await;
    let first = app.retrain().await;
    assert_eq!(first.status, "succeeded", "{first:?}");
    let event = release_events(&app, first.release_id.unwrap()).await;
    let b = stored_budget(&app, "u3").await;
    let pure = |eps: f64| PrivacyEvent::PureDp { eps, count: 1 };
    // The largest local eps alone, and with one more release.
    let admits = |events: &[PrivacyEvent]| b.admits(events).unwrap();
    let alone = smallest(b.eps, |y| !admits(&[pure(y)]));
    let with_release = smallest(b.eps, |y| !admits(&[pure(y), event[0].clone()]));
    assert!(with_release < alone, "{with_release} {alone}");
    let eps = (alone + with_release) / 2.0;
    let scale = RatingScale::new(1.0, 5.0, 0.5).unwrap();
    let rating = |item: &str, eps: f64| {
        let p = RatingPerturber::new(eps, scale).unwrap();
        let r = p
            .perturb("u3", item, 4.0, &mut dprec_dp::rng::seeded(3))
            .unwrap();
        json!({"ratings": [serde_json::to_value(r).unwrap()]})
    };
    let (job, (status, body)) = race
        .release_racing(
            &app,
            reqwest::Method::POST,
            "/v1/ratings",
            WRITER,
            rating("i8", eps),
        )
        .await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    assert_eq!(status, 409, "{body}");
    let a = app.audit("u3", "").await;
    assert_eq!(a.ratings.total, 4, "nothing stored: {:?}", a.ratings);
    let small = with_release / 4.0;
    let (job, (status, body)) = race
        .release_racing(
            &app,
            reqwest::Method::POST,
            "/v1/ratings",
            WRITER,
            rating("i9", small),
        )
        .await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    assert_eq!(status, 200, "{body}");
    audits_count_published(&app, &USERS).await;
    app.stop().await;
}
both_backends!(ldp_ratings_never_cancel_a_release);

/// A Private-GD report that fits the user's budget alone, but not with the charge of the
/// release in flight, is refused (409, not stored); another user's report is accepted.
/// Today's code accepted it and the release failed.
async fn private_gd_reports_never_cancel_a_release(url: &str) {
    let (t, _) = FakeDp::gaussian(5.0);
    let race = Race::default();
    let app = TestApp::spawn(settings(url), t, race.hooks()).await;
    app.store.set_commit_rows(32);
    store_with_users(&app).await;
    let first = app.retrain().await;
    assert_eq!(first.status, "succeeded", "{first:?}");
    let (st, body) = app
        .post(
            "/v1/admin/private-gd/rounds",
            ADMIN,
            &json!({"eps_total": 2.0, "rounds": 2, "rank": 2, "dim": 3}),
        )
        .await;
    assert_eq!(st, 201, "{body}");
    let (_, body) = app.get("/v1/private-gd/round", READER).await;
    let round: PublishedRound = serde_json::from_value(body).unwrap();
    let report = |user: &str| {
        let state = round.state().unwrap();
        let mine = round.ratings_by_index(&[("i0", 4.0)]);
        let r = client_report(&state, &mine, &mut dprec_dp::rng::seeded(5)).unwrap();
        json!({"user": user, "round": r.round, "rows": r.rows, "rank": r.rank,
               "row": r.row, "col": r.col, "bit": r.bit})
    };
    // u3's budget lowered (no release in flight) to between one report and one report
    // plus one more release.
    let event = release_events(&app, first.release_id.unwrap()).await;
    let b = stored_budget(&app, "u3").await;
    let one = [PrivacyEvent::PureDp {
        eps: round.eps_round,
        count: 1,
    }];
    let low =
        (smallest_budget(&b, &one) + smallest_budget(&b, &[&one[..], &event[..]].concat())) / 2.0;
    let (st, body) = app
        .put("/v1/users/u3/settings", WRITER, &json!({"budget_eps": low}))
        .await;
    assert_eq!(st, 200, "{body}");
    let path = "/v1/private-gd/reports";
    let (job, (status, body)) = race
        .release_racing(&app, reqwest::Method::POST, path, WRITER, report("u3"))
        .await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    assert_eq!(status, 409, "{body}");
    assert!(app.audit("u3", "").await.local_reports.is_empty());
    let (job, (status, body)) = race
        .release_racing(&app, reqwest::Method::POST, path, WRITER, report("u2"))
        .await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    assert_eq!(status, 201, "{body}");
    audits_count_published(&app, &USERS).await;
    app.stop().await;
}
both_backends!(private_gd_reports_never_cancel_a_release);

/// Without a release in flight nothing is held; a hold counts only while its holder's
/// trainer lease is live (a release whose process died holds nothing).
async fn a_hold_lives_with_its_lease(url: &str) {
    let (t, _) = FakeDp::gaussian(5.0);
    let app = TestApp::spawn(settings(url), t, Hooks::default()).await;
    let store = &app.store;
    assert!(store.held_events().await.unwrap().is_empty());
    let event = [PrivacyEvent::gaussian(2.0, 1).unwrap()];
    store.set_hold("gone", &event).await.unwrap();
    assert!(store.held_events().await.unwrap().is_empty(), "no lease");
    assert!(store.acquire_lease("gone", 60).await.unwrap());
    assert_eq!(store.held_events().await.unwrap(), event);
    store.clear_hold("other").await.unwrap();
    assert_eq!(
        store.held_events().await.unwrap(),
        event,
        "not the holder's"
    );
    store.clear_hold("gone").await.unwrap();
    assert!(store.held_events().await.unwrap().is_empty());
    app.stop().await;
}
both_backends!(a_hold_lives_with_its_lease);
