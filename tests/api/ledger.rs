//! Ledger invariants (DESIGN 4), each on both backends:
//! - no rating's spend exceeds its eps_ij;
//! - no user's admitted RDP exceeds the filter;
//! - no served model lacks its committed charges;
//! - a trainer crash or a failure between training and commit (or inside the commit)
//!   leaves no charges without a release and no model without charges;
//! - two trainers at once (two service instances on one database) never overspend;
//! - exhausted ratings and users are excluded and fall back; the audit says why;
//! - a release committed in many short ledger transactions: a crash between two leaves
//!   nothing served and a conservative ledger, and ingestion is not held up by it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dprec::release::Hooks;
use dprec::store::Store;
use dprec::store::{
    commit_release as commit, CommitError, CommitPoint, RatingChargeRow, RatingCharges,
    ReleaseRecord,
};
use dprec_dp::accountant::{PrivacyEvent, RenyiFilter};
use dprec_dp::charges::{Guarantee, Neighbour, PrivacyUnit};
use serde_json::json;
use sqlx::Row;

use crate::api::fake::{self, FakeDp};
use crate::api::helpers::*;
use crate::both_backends;

/// Checks every stored invariant directly in the database.
pub async fn assert_ledger_invariants(store: &Store) {
    let pool = store.pool();
    // Spend per rating within eps_ij, and equal to the sum of its charges (the charge
    // sets expanded to their ratings).
    let charged = store.charged_per_rating().await.unwrap();
    let mut listed = 0;
    for (id, eps, spend) in store.rating_spends().await.unwrap() {
        let spent = spend.spent;
        let charged = charged.get(&id).copied().unwrap_or(0.0);
        listed += usize::from(charged > 0.0);
        assert!(spent <= eps, "rating {id}: spent {spent} > eps {eps}");
        assert!(
            (spent - charged).abs() <= 1e-9,
            "rating {id}: spent {spent} != charges {charged}"
        );
    }
    // Every charged id is a stored rating (ratings are soft-deleted, never removed).
    assert_eq!(
        listed,
        charged.values().filter(|&&e| e > 0.0).count(),
        "charges of unknown ratings"
    );
    // Every user's consumed curve is admitted by the filter at some order.
    for r in sqlx::query("SELECT id, budget_eps, budget_delta, rdp_consumed FROM users")
        .fetch_all(pool)
        .await
        .unwrap()
    {
        let (id, eps, delta, curve): (String, f64, f64, String) =
            (r.get(0), r.get(1), r.get(2), r.get(3));
        // '' is how the store writes a new user's zero curve.
        let consumed: dprec_dp::accountant::RdpCurve = if curve.is_empty() {
            dprec_dp::accountant::RdpCurve::zeros_default()
        } else {
            serde_json::from_str(&curve).unwrap()
        };
        let f = RenyiFilter::with_default_orders(eps, delta).unwrap();
        let zero = dprec_dp::accountant::RdpCurve::zeros_default();
        assert!(
            f.admits(&consumed, &zero).unwrap(),
            "user {id}: consumed RDP exceeds the filter at every order"
        );
    }
    // No charge without a release; no model without its release; every proven release
    // with a model that used ratings has charges (one that admitted none is noise only).
    let orphan: i64 = sqlx::query(
        "SELECT (SELECT COUNT(*) FROM rating_charges c WHERE NOT EXISTS \
         (SELECT 1 FROM releases r WHERE r.id = c.release_id)) + \
         (SELECT COUNT(*) FROM rating_charge_sets c WHERE NOT EXISTS \
         (SELECT 1 FROM releases r WHERE r.id = c.release_id))",
    )
    .fetch_one(pool)
    .await
    .unwrap()
    .get(0);
    assert_eq!(orphan, 0, "charges without a release");
    let orphan: i64 = sqlx::query(
        "SELECT COUNT(*) FROM user_charges c WHERE NOT EXISTS \
         (SELECT 1 FROM releases r WHERE r.id = c.release_id)",
    )
    .fetch_one(pool)
    .await
    .unwrap()
    .get(0);
    assert_eq!(orphan, 0, "user charges without a release");
    let uncharged: i64 = sqlx::query(
        "SELECT COUNT(*) FROM models m JOIN releases r ON r.id = m.release_id \
         WHERE r.guarantee = 'proven' AND r.n_ratings > 0 AND NOT EXISTS \
         (SELECT 1 FROM rating_charges c WHERE c.release_id = r.id) AND NOT EXISTS \
         (SELECT 1 FROM rating_charge_sets c WHERE c.release_id = r.id)",
    )
    .fetch_one(pool)
    .await
    .unwrap()
    .get(0);
    assert_eq!(uncharged, 0, "a proven model without charges");
    let modelless: i64 = sqlx::query(
        "SELECT COUNT(*) FROM models m WHERE NOT EXISTS \
         (SELECT 1 FROM releases r WHERE r.id = m.release_id)",
    )
    .fetch_one(pool)
    .await
    .unwrap()
    .get(0);
    assert_eq!(modelless, 0);
}

/// Ledger rows hold no rating values: no column named like one, and each row states the
/// unit and neighbour relation.
async fn assert_ledger_rows_hold_no_values(store: &Store) {
    use sqlx::Column;
    for table in ["rating_charge_sets", "user_charges"] {
        let row = sqlx::query(&format!("SELECT * FROM {table} LIMIT 1"))
            .fetch_one(store.pool())
            .await
            .unwrap();
        let names: Vec<&str> = row.columns().iter().map(|c| c.name()).collect();
        assert!(
            !names.iter().any(|n| n.contains("value") || *n == "rating"),
            "{names:?}"
        );
        let unit: String = row.get("unit");
        let neighbour: String = row.get("neighbour");
        assert!(!unit.is_empty() && !neighbour.is_empty());
    }
}

fn ratings_for(users: usize, items: usize) -> Vec<(String, String, f64)> {
    let mut v = Vec::new();
    for u in 0..users {
        for i in 0..items {
            if (u + i) % 3 != 0 {
                v.push((
                    format!("u{u}"),
                    format!("i{i}"),
                    (1 + (u * 7 + i) % 5) as f64,
                ));
            }
        }
    }
    v
}

async fn ingest_grid(app: &TestApp, users: usize, items: usize, eps: f64) {
    let r = ratings_for(users, items);
    let t: Vec<(&str, &str, f64, Option<f64>)> = r
        .iter()
        .map(|(u, i, v)| (u.as_str(), i.as_str(), *v, Some(eps)))
        .collect();
    app.ingest(&t).await;
}

/// fraction:0.4 of eps: releases spend 0.4, 0.4, then the remaining 0.2; the fourth
/// finds no rating left: it publishes noise and charges no rating (a skip would tell an
/// exhausted store from one with a rating left), while the user is charged its
/// user-level event as on every release (no rating decides whether a user is charged).
/// Spend never exceeds eps_ij; the audit shows it.
async fn spend_never_exceeds_eps(url: &str) {
    let (t, _) = FakeDp::gaussian(50.0);
    let app = TestApp::spawn(settings(url), t, Hooks::default()).await;
    ingest_grid(&app, 4, 6, 1.0).await;
    let mut releases = Vec::new();
    for _ in 0..3 {
        let job = app.retrain().await;
        assert_eq!(job.status, "succeeded", "{job:?}");
        releases.push(job.release_id.unwrap());
        assert_ledger_invariants(&app.store).await;
    }
    let job = app.retrain().await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    assert_eq!(app.stored_release(&job).await.n_ratings, 0);
    assert_ledger_invariants(&app.store).await;
    let (_, a) = app.get("/v1/users/u1/budget", READER).await;
    for e in a["ratings"]["entries"].as_array().unwrap() {
        assert_eq!(e["status"], "exhausted", "{e}");
        assert_eq!(e["releases"], 3);
        assert!(e["spent"].as_f64().unwrap() <= e["eps"].as_f64().unwrap());
    }
    assert_eq!(
        a["releases"]["total"], 4,
        "user-level events of all four releases"
    );
    assert_ledger_rows_hold_no_values(&app.store).await;
    let rel = &a["releases"]["entries"][0];
    assert!(rel["mechanisms"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["name"] == "popularity-discrete-laplace"));
    assert_eq!(rel["mechanisms"][0]["unit"], "rating");
    assert_eq!(rel["mechanisms"][0]["neighbour"], "add-remove");
    // New ratings still take part; exhausted ones do not.
    app.ingest(&[("u1", "fresh", 4.0, Some(1.0))]).await;
    let job = app.retrain().await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    // The API publishes no exact counts; the store keeps them.
    let rel = app.stored_release(&job).await;
    assert_eq!(rel.n_ratings, 1);
    assert_ledger_invariants(&app.store).await;
    app.stop().await;
}
both_backends!(spend_never_exceeds_eps);

/// A user with a small RDP budget is admitted until the filter is full, then excluded
/// (their ratings too), falls back to popularity, and the audit says why.
async fn user_filter_is_never_exceeded(url: &str) {
    let (t, _) = FakeDp::gaussian(10.0);
    let mut s = settings(url);
    s.budget.share = dprec_dp::ledger::SharePolicy::Split(20);
    let app = TestApp::spawn(s, t, Hooks::default()).await;
    ingest_grid(&app, 3, 5, 1.0).await;
    let (st, _) = app
        .put(
            "/v1/users/u1/settings",
            WRITER,
            &json!({"budget_eps": 1.6, "budget_delta": 1e-5}),
        )
        .await;
    assert_eq!(st, 200);
    let mut admitted = 0;
    for _ in 0..15 {
        let job = app.retrain().await;
        assert_eq!(job.status, "succeeded", "{job:?}");
        assert_ledger_invariants(&app.store).await;
        let (_, a) = app.get("/v1/users/u1/budget", READER).await;
        let filter_eps = a["spent"]["filter_eps"].as_f64().unwrap();
        assert!(filter_eps <= 1.6 + 1e-12, "{a}");
        if a["releases"]["total"].as_i64().unwrap() > admitted {
            admitted += 1;
        } else {
            break;
        }
    }
    assert!((1..15).contains(&admitted), "admitted {admitted}");
    let (_, rec) = app.get("/v1/users/u1/recommendations", READER).await;
    assert_eq!(rec["fallback"], true, "{rec}");
    let (_, rec0) = app.get("/v1/users/u0/recommendations", READER).await;
    assert_eq!(rec0["fallback"], false, "{rec0}");
    let (_, a) = app.get("/v1/users/u1/budget", READER).await;
    assert!(a["note"].as_str().unwrap().contains("no DP profile"), "{a}");
    let (st, _) = app.get("/v1/models/current/users/u1", READER).await;
    assert_eq!(st, 404);
    app.stop().await;
}
both_backends!(user_filter_is_never_exceeded);

/// A charged user's consumed curve (156 orders of JSON, about 3 kB) is stored whole in
/// its row. On PostgreSQL the `users` table keeps rows up to 8,160 bytes in its own pages
/// (migration 0017): by default a row over 2 kB is toasted (its curve compressed, or moved
/// to the TOAST table), at every release's rewrite of the curve
/// (crates/dprec-lab/notes/bench-04-release-under-a-minute.md).
/// Checked by removing the migration: "users' curves were compressed".
async fn users_curves_stay_in_their_rows(url: &str) {
    let (t, _) = FakeDp::gaussian(10.0);
    let app = TestApp::spawn(settings(url), t, Hooks::default()).await;
    ingest_grid(&app, 3, 5, 1.0).await;
    let job = app.retrain().await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    let pool = app.store.pool();
    let longest: i64 = scalar(pool, "SELECT MAX(LENGTH(rdp_consumed)) FROM users").await;
    assert!(longest > 2_100, "a curve of {longest} bytes tests nothing");
    if app.store.backend() == dprec::store::Backend::Postgres {
        let toast: String = scalar(
            pool,
            "SELECT CAST(CAST(reltoastrelid AS regclass) AS TEXT) FROM pg_class \
             WHERE relname = 'users'",
        )
        .await;
        let chunks: i64 = scalar(pool, &format!("SELECT COUNT(*) FROM {toast}")).await;
        assert_eq!(chunks, 0, "users' curves were moved to the TOAST table");
        // Compressed in the row (pglz) would also mean a rewrite compresses it.
        let compressed: i64 = scalar(
            pool,
            "SELECT COUNT(*) FROM users \
             WHERE pg_column_size(rdp_consumed) < octet_length(rdp_consumed)",
        )
        .await;
        assert_eq!(compressed, 0, "users' curves were compressed");
    }
    app.stop().await;
}

/// The first column of the one row `sql` returns.
async fn scalar<T>(pool: &sqlx::AnyPool, sql: &str) -> T
where
    T: for<'r> sqlx::Decode<'r, sqlx::Any> + sqlx::Type<sqlx::Any>,
{
    sqlx::query(sql)
        .fetch_one(pool)
        .await
        .unwrap()
        .try_get(0)
        .unwrap()
}
both_backends!(users_curves_stay_in_their_rows);

/// A panicking or failing trainer, a failure between training and commit, a failure
/// inside the commit transaction, and a trainer that overcharges: each leaves nothing
/// (no release, no charges, no model, no spend) and the old model keeps being served.
async fn crashes_leave_nothing_behind(url: &str) {
    let (t, mode) = FakeDp::gaussian(20.0);
    let fail_before = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let fail_inside = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (fb, fi) = (fail_before.clone(), fail_inside.clone());
    let hooks = Hooks {
        before_commit: Some(Arc::new(move || {
            if fb.load(Ordering::SeqCst) {
                Err("simulated crash before commit".into())
            } else {
                Ok(())
            }
        })),
        inside_commit: Some(Arc::new(move |_| {
            if fi.load(Ordering::SeqCst) {
                Err("simulated crash inside the commit".into())
            } else {
                Ok(())
            }
        })),
        ..Hooks::default()
    };
    let app = TestApp::spawn(settings(url), t, hooks).await;
    ingest_grid(&app, 3, 4, 1.0).await;
    let job = app.retrain().await;
    assert_eq!(job.status, "succeeded");
    let first = job.release_id.unwrap();
    let counts = app.store.counts().await.unwrap();
    let print = app.store.fingerprint().await.unwrap();
    type Arm<'a> = Box<dyn Fn() + 'a>;
    let scenarios: Vec<(&str, Arm)> = vec![
        (
            "trainer panic",
            Box::new(|| mode.store(fake::PANIC, Ordering::SeqCst)),
        ),
        (
            "trainer error",
            Box::new(|| mode.store(fake::FAIL, Ordering::SeqCst)),
        ),
        (
            "overcharging trainer",
            Box::new(|| mode.store(fake::OVERCHARGE, Ordering::SeqCst)),
        ),
        (
            "failure before commit",
            Box::new(|| fail_before.store(true, Ordering::SeqCst)),
        ),
        (
            "failure inside commit",
            Box::new(|| fail_inside.store(true, Ordering::SeqCst)),
        ),
    ];
    for (name, arm) in scenarios {
        mode.store(fake::OK, Ordering::SeqCst);
        fail_before.store(false, Ordering::SeqCst);
        fail_inside.store(false, Ordering::SeqCst);
        arm();
        let job = app.retrain().await;
        assert_eq!(job.status, "failed", "{name}: {job:?}");
        assert!(job.reason.is_some(), "{name}");
        assert_eq!(app.store.counts().await.unwrap(), counts, "{name}");
        assert_eq!(app.store.fingerprint().await.unwrap(), print, "{name}");
        assert_eq!(
            app.app_registry.current().unwrap().release_id,
            first,
            "{name}"
        );
        assert_ledger_invariants(&app.store).await;
    }
    mode.store(fake::OK, Ordering::SeqCst);
    fail_before.store(false, Ordering::SeqCst);
    fail_inside.store(false, Ordering::SeqCst);
    let job = app.retrain().await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    app.stop().await;
}
both_backends!(crashes_leave_nothing_behind);

/// Two service instances on one database, retraining at the same time, repeatedly:
/// the lease lets one train at a time, and whatever runs, nothing is overspent.
async fn two_instances_never_overspend(url: &str) {
    let (t1, _) = FakeDp::gaussian(30.0);
    let (t2, _) = FakeDp::gaussian(30.0);
    let a = TestApp::spawn(settings(url), t1, Hooks::default()).await;
    let b = TestApp::spawn(settings(url), t2, Hooks::default()).await;
    ingest_grid(&a, 4, 5, 1.0).await;
    let mut published = 0;
    for _ in 0..4 {
        let (ja, jb) = tokio::join!(a.retrain(), b.retrain());
        for j in [&ja, &jb] {
            assert_ne!(j.status, "failed", "{j:?}");
            if j.status == "succeeded" {
                published += 1;
            }
        }
        assert_ledger_invariants(&a.store).await;
    }
    // Past the third charged release the ratings are exhausted: a release then
    // publishes noise and charges nothing, so at most three releases used ratings.
    assert!(published >= 1, "published {published}");
    let used: i64 = sqlx::query("SELECT COUNT(*) FROM releases WHERE n_ratings > 0")
        .fetch_one(a.store.pool())
        .await
        .unwrap()
        .get(0);
    assert!((1..=3).contains(&used), "{used} releases used ratings");
    a.stop().await;
    b.stop().await;
}
both_backends!(two_instances_never_overspend);

/// A release record made by hand from a snapshot: every rating charged `eps`, the users
/// charged `users`, an empty model.
fn manual_record(
    snap: &dprec::store::Snapshot,
    eps: f64,
    users: std::collections::BTreeMap<String, Vec<PrivacyEvent>>,
) -> ReleaseRecord {
    ReleaseRecord {
        trainer: "manual".into(),
        params: json!({}),
        guarantee: Guarantee::Proven,
        mechanisms: json!([]),
        popularity_eps: 0.0,
        n_ratings: snap.ratings.len() as i64,
        n_users: snap.users.len() as i64,
        n_items: snap.items.len() as i64,
        job_id: None,
        started_at: 0,
        rating_unit: PrivacyUnit::Rating,
        rating_neighbour: Neighbour::AddRemove,
        rating_charges: snap
            .iter()
            .map(|r| RatingChargeRow {
                rating_id: r.id,
                user: r.user.clone(),
                eps_train: eps,
                eps_popularity: 0.0,
                rho: 0.0,
            })
            .collect(),
        user_charges: users,
        model_json: "{}".into(),
        users_json: "[]".into(),
        items_json: "[]".into(),
        popularity_json: "{}".into(),
        snapshot_clock: None,
        publish_delay_ms: 0,
    }
}

/// How the losing one of two concurrent commits is refused: by the rating re-check (the
/// other charged the ratings first) or by the ledger-order check (`LedgerMoved`: a later
/// release took the users' locks and charged them first).
fn lost_the_race(e: &CommitError) -> bool {
    matches!(
        e,
        CommitError::RatingOverspend { .. } | CommitError::LedgerMoved(_)
    )
}

/// The commit re-checks the stored state: two releases planned from the same snapshot
/// (as two trainers without a lease would), committed concurrently, cannot both spend
/// a rating's last budget; the loser is aborted whole, by the rating re-check or, when
/// the later release took the user's lock first, by the ledger-order check.
async fn commit_rechecks_stored_state(url: &str) {
    let (t, _) = FakeDp::gaussian(30.0);
    let app = TestApp::spawn(settings(url), t, Hooks::default()).await;
    app.ingest(&[("u1", "i1", 4.0, Some(1.0)), ("u1", "i2", 3.0, Some(1.0))])
        .await;
    let snap = app.store.snapshot().await.unwrap();
    let record = |eps: f64| {
        let users = [(
            "u1".to_string(),
            vec![PrivacyEvent::pure_dp(eps, 2).unwrap()],
        )];
        manual_record(&snap, eps, users.into())
    };
    let (r1, r2) = (record(0.6), record(0.6));
    let (x, y) = tokio::join!(commit(&app.store, &r1, None), commit(&app.store, &r2, None));
    let ok = [x.is_ok(), y.is_ok()];
    assert_eq!(ok.iter().filter(|&&b| b).count(), 1, "{x:?} {y:?}");
    let err = if x.is_err() { x } else { y }.unwrap_err();
    assert!(lost_the_race(&err), "{err}");
    let c = app.store.counts().await.unwrap();
    assert_eq!((c.releases, c.rating_charges, c.user_charges), (1, 2, 1));
    assert_ledger_invariants(&app.store).await;
    // A user charge the filter rejects aborts the release too, ratings included.
    let mut big = record(0.1);
    big.user_charges = [(
        "u1".to_string(),
        vec![PrivacyEvent::gaussian(0.01, 1).unwrap()],
    )]
    .into();
    let err = commit(&app.store, &big, None).await.unwrap_err();
    assert!(matches!(err, CommitError::UserRejected(_)), "{err}");
    assert_eq!(app.store.counts().await.unwrap(), c);
    // Charges out of user order (the lock order) are refused before anything is written.
    let mut unordered = record(0.1);
    let rows: Vec<RatingChargeRow> = unordered.rating_charges.all_rows().collect();
    let mut charges = RatingCharges::default();
    for (k, mut r) in rows.into_iter().enumerate() {
        r.user = if k == 0 { "u2" } else { "u1" }.into();
        charges.push(&r.user.clone(), charge_of(&r), r.rating_id);
    }
    unordered.rating_charges = charges;
    let err = commit(&app.store, &unordered, None).await.unwrap_err();
    assert!(err.to_string().contains("user order"), "{err}");
    assert_eq!(app.store.counts().await.unwrap(), c);
    // A later release that settled the user, or charged it, first (releases committing
    // at once) refuses the commit: its charges would be folded out of order or never.
    let settled_later = "INSERT INTO rating_settlements (user_id, release_id) \
         VALUES ('u1', 1000000) ON CONFLICT (user_id) DO UPDATE SET release_id = 1000000";
    let charged_later = "INSERT INTO rating_charge_sets (release_id, user_id, n, eps_train, \
         eps_popularity, rho, eps, unit, neighbour, rating_ids) \
         VALUES (1000000, 'u1', 0, 0, 0, 0, 0, 'rating', 'add-remove', '')";
    for (sql, undo) in [
        (
            settled_later,
            "DELETE FROM rating_settlements WHERE user_id = 'u1'",
        ),
        (
            charged_later,
            "DELETE FROM rating_charge_sets WHERE release_id = 1000000",
        ),
    ] {
        sqlx::query(sql).execute(app.store.pool()).await.unwrap();
        let err = commit(&app.store, &record(0.1), None).await.unwrap_err();
        assert!(matches!(err, CommitError::LedgerMoved(_)), "{err}");
        assert_eq!(app.store.counts().await.unwrap(), c);
        sqlx::query(undo).execute(app.store.pool()).await.unwrap();
    }
    commit(&app.store, &record(0.1), None).await.unwrap();
    assert_ledger_invariants(&app.store).await;
    app.stop().await;
}
both_backends!(commit_rechecks_stored_state);

/// A release planned from a snapshot carries each charge's planned state and the
/// snapshot's ledger clock: while nothing else has been committed since, the commit
/// re-checks the charges against those states without reading the rows, and it still
/// refuses a charge beyond eps_ij; once anything was committed since, it reads the rows.
async fn a_commit_rechecks_planned_states_while_the_ledger_is_untouched(url: &str) {
    let (t, _) = FakeDp::gaussian(30.0);
    let app = TestApp::spawn(settings(url), t, Hooks::default()).await;
    app.ingest(&[("u1", "i1", 4.0, Some(1.0)), ("u2", "i2", 3.0, Some(1.0))])
        .await;
    let planned = |snap: &dprec::store::Snapshot, eps: f64| {
        let mut rec = manual_record(snap, eps, Default::default());
        let charge = dprec::store::Charge {
            eps_train: eps,
            eps_popularity: 0.0,
            rho: 0.0,
        };
        let befores: Vec<dprec::store::Before> = snap
            .iter()
            .map(|r| dprec::store::Before {
                eps: r.eps,
                spent: r.spent,
                rho: r.rho,
            })
            .collect();
        let charges = vec![charge; befores.len()];
        let users: Vec<&str> = snap.user_names.iter().map(|u| &**u).collect();
        rec.rating_charges = RatingCharges::by_user_from(&users, &charges, &befores, || {
            snap.ratings
                .iter()
                .enumerate()
                .map(|(k, r)| (r.user, r.id, k as u32))
        });
        rec.snapshot_clock = snap.ledger_clock;
        rec
    };
    let snap = app.store.snapshot().await.unwrap();
    assert!(snap.ledger_clock.is_some());
    // Beyond eps_ij against the planned state: refused without reading the rows.
    let err = commit(&app.store, &planned(&snap, 1.5), None)
        .await
        .unwrap_err();
    assert!(matches!(err, CommitError::RatingOverspend { .. }), "{err}");
    let done = commit(&app.store, &planned(&snap, 0.6), None)
        .await
        .unwrap();
    assert!(!done.rows_reread, "{done:?}");
    assert_ledger_invariants(&app.store).await;
    // The same snapshot again: the clock has moved, the rows are read, the spend of 0.6
    // is found and 0.6 more refused.
    let err = commit(&app.store, &planned(&snap, 0.6), None)
        .await
        .unwrap_err();
    assert!(matches!(err, CommitError::RatingOverspend { .. }), "{err}");
    // A fresh snapshot plans from the spend: 0.3 more fits, without reading the rows.
    let snap = app.store.snapshot().await.unwrap();
    assert!(snap.iter().all(|r| r.spent == 0.6));
    let done = commit(&app.store, &planned(&snap, 0.3), None)
        .await
        .unwrap();
    assert!(!done.rows_reread, "{done:?}");
    assert_ledger_invariants(&app.store).await;
    app.stop().await;
}
both_backends!(a_commit_rechecks_planned_states_while_the_ledger_is_untouched);

/// Rating spends are written lazily (`store::pending`): a release settles the users it is
/// due to (one release in 8 by a hash of the user) and writes no other rating row. After
/// 20 releases some rows are settled and some users have charges pending, and every
/// reader agrees with the charges: `rating_spends` (the invariants), the snapshot's
/// states (bit for bit), the audit.
async fn lazy_spends_agree_in_every_reader(url: &str) {
    let (t, _) = FakeDp::gaussian(500.0);
    let mut s = settings(url);
    s.budget.share = dprec_dp::ledger::SharePolicy::Split(40);
    let app = TestApp::spawn(s, t, Hooks::default()).await;
    ingest_grid(&app, 12, 5, 1.0).await;
    for _ in 0..20 {
        let job = app.retrain().await;
        assert_eq!(job.status, "succeeded", "{job:?}");
    }
    assert_ledger_invariants(&app.store).await;
    let spends = app.store.rating_spends().await.unwrap();
    assert!(
        spends.iter().all(|(_, _, s)| s.releases == 20),
        "{spends:?}"
    );
    let rows: Vec<i64> = sqlx::query("SELECT releases FROM ratings")
        .fetch_all(app.store.pool())
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(rows.iter().any(|&n| n > 0), "no row settled: {rows:?}");
    assert!(rows.iter().any(|&n| n < 20), "nothing pending: {rows:?}");
    assert!(
        rows.iter().all(|&n| n >= 20 - 15),
        "settled too rarely: {rows:?}"
    );
    let snap = app.store.snapshot().await.unwrap();
    assert_eq!(snap.len(), spends.len());
    for r in snap.iter() {
        let (_, eps, s) = spends.iter().find(|x| x.0 == r.id).unwrap();
        assert_eq!(r.eps.to_bits(), eps.to_bits());
        assert_eq!(r.spent.to_bits(), s.spent.to_bits(), "rating {}", r.id);
        assert_eq!(r.rho.to_bits(), s.rho.to_bits(), "rating {}", r.id);
    }
    let (_, a) = app.get("/v1/users/u1/budget", READER).await;
    let entries = a["ratings"]["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 4, "u1 rates 4 of the 5 items");
    for e in entries {
        assert_eq!(e["releases"], 20, "{e}");
        assert!(e["spent"].as_f64().unwrap() > 0.0, "{e}");
    }
    app.stop().await;
}
both_backends!(lazy_spends_agree_in_every_reader);

fn charge_of(r: &RatingChargeRow) -> dprec::store::Charge {
    dprec::store::Charge {
        eps_train: r.eps_train,
        eps_popularity: r.eps_popularity,
        rho: r.rho,
    }
}

/// A release whose commit is split into many short ledger transactions (issue 12: the
/// SQLite write lock is held for one chunk at a time) and fails in the middle, as a crash
/// between two chunks would: the release is not served or listed, every rating's spend
/// still equals its charges and stays within eps_ij (the committed chunks are an
/// over-charge), and a restarted instance serves the old model and releases again.
async fn crash_between_commit_chunks(url: &str) {
    let (t, _) = FakeDp::gaussian(20.0);
    let fail_at = Arc::new(AtomicUsize::new(usize::MAX));
    let chunks_seen = Arc::new(AtomicUsize::new(0));
    let (fa, seen) = (fail_at.clone(), chunks_seen.clone());
    let hooks = Hooks {
        seed: None,
        before_commit: None,
        inside_commit: Some(Arc::new(move |p: CommitPoint| {
            seen.store(p.chunks, Ordering::SeqCst);
            if p.chunk == fa.load(Ordering::SeqCst) {
                Err(format!("simulated crash in ledger transaction {}", p.chunk))
            } else {
                Ok(())
            }
        })),
    };
    let app = TestApp::spawn(settings(url), t, hooks).await;
    app.store.set_commit_rows(5);
    ingest_grid(&app, 4, 6, 1.0).await;
    let job = app.retrain().await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    let first = job.release_id.unwrap();
    // 4 users (one per transaction at weight 8) and 16 ratings (5 per transaction).
    let chunks = chunks_seen.load(Ordering::SeqCst);
    assert_eq!(chunks, 4 + 4);
    assert_ledger_invariants(&app.store).await;
    let before = app.store.counts().await.unwrap();
    let spent_before = spent_by_rating(&app.store).await;

    // Fail in the last transaction before the publishing one: all users and 10 of the
    // 16 ratings are charged and committed, nothing is published.
    fail_at.store(chunks - 2, Ordering::SeqCst);
    let job = app.retrain().await;
    assert_eq!(job.status, "failed", "{job:?}");
    let reason = job.reason.unwrap();
    assert!(reason.contains("not published"), "{reason}");
    let after = app.store.counts().await.unwrap();
    assert_eq!(after.models, before.models);
    assert_eq!(after.releases, before.releases + 1);
    assert_eq!(after.user_charges, before.user_charges + 4);
    assert_eq!(after.rating_charges, before.rating_charges + 10);
    assert_eq!(app.app_registry.current().unwrap().release_id, first);
    let listed = app.models("").await;
    assert_eq!(listed.releases.len() as i64, before.models, "{listed:?}");
    assert_eq!(app.current_model().await.release.id, first);
    // Conservative: spend only grew, by exactly the committed charges, within eps_ij.
    let spent_after = spent_by_rating(&app.store).await;
    let grew = spent_before
        .iter()
        .zip(&spent_after)
        .filter(|(a, b)| b.1 > a.1)
        .count();
    assert_eq!(grew, 10);
    assert!(spent_before
        .iter()
        .zip(&spent_after)
        .all(|(a, b)| b.1 >= a.1));
    assert_ledger_invariants(&app.store).await;
    app.stop().await;

    // Restart (a new instance on the same database): the old model is served, and the
    // next release commits and publishes.
    let (t, _) = FakeDp::gaussian(20.0);
    let app = TestApp::spawn(settings(url), t, Hooks::default()).await;
    assert_eq!(app.app_registry.current().unwrap().release_id, first);
    app.store.set_commit_rows(5);
    let job = app.retrain().await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    assert_eq!(
        app.current_model().await.release.id,
        job.release_id.unwrap()
    );
    assert_eq!(
        app.models("").await.releases.len() as i64,
        before.models + 1
    );
    assert_ledger_invariants(&app.store).await;
    app.stop().await;
}
both_backends!(crash_between_commit_chunks);

async fn spent_by_rating(store: &Store) -> Vec<(i64, f64)> {
    let spends = store.rating_spends().await.unwrap();
    spends.iter().map(|(id, _, s)| (*id, s.spent)).collect()
}

/// Ingestion during a release commit waits for one ledger transaction, not the whole
/// commit (issue 12, SQLite). Each transaction of the commit is held 150 ms by the hook;
/// a batch sent during the commit is acknowledged while the commit still has
/// transactions to go. Before chunking (one transaction for the whole commit, the hook
/// once inside it) the batch was acknowledged only after the commit.
async fn ingestion_is_not_held_up_by_a_commit(url: &str) {
    let (t, _) = FakeDp::gaussian(20.0);
    let calls = Arc::new(AtomicUsize::new(0));
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (c, a) = (calls.clone(), armed.clone());
    let hooks = Hooks {
        seed: None,
        before_commit: None,
        inside_commit: Some(Arc::new(move |_: CommitPoint| {
            if a.load(Ordering::SeqCst) {
                c.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(150));
            }
            Ok(())
        })),
    };
    let app = TestApp::spawn(settings(url), t, hooks).await;
    app.store.set_commit_rows(4);
    ingest_grid(&app, 4, 6, 1.0).await;
    armed.store(true, Ordering::SeqCst);
    let (st, job) = app.post("/v1/admin/retrain", ADMIN, &json!({})).await;
    assert_eq!(st, 202, "{job}");
    // 4 user transactions and 4 rating transactions: about 1.2 s of commit.
    let entered = tokio::time::timeout(Duration::from_secs(20), async {
        while calls.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(entered.is_ok(), "the commit did not start");
    app.ingest(&[("u9", "i1", 4.0, Some(1.0)), ("u2", "i0", 5.0, None)])
        .await;
    let done_when_acknowledged = calls.load(Ordering::SeqCst);
    let job = app.wait_job(job["id"].as_i64().unwrap()).await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    let total = calls.load(Ordering::SeqCst);
    assert_eq!(total, 8);
    assert!(
        done_when_acknowledged < total,
        "the batch waited for the whole commit ({done_when_acknowledged} of {total})"
    );
    assert_ledger_invariants(&app.store).await;
    app.stop().await;
}
both_backends!(ingestion_is_not_held_up_by_a_commit);

/// A service holding a 3 x 6 grid of ratings (eps_ij 1) that commits in transactions of
/// 3 ledger rows, and a record charging each rating `eps` and each user pure 0.1.
async fn grid_in_small_commits(url: &str, eps: f64) -> (TestApp, ReleaseRecord) {
    let (t, _) = FakeDp::gaussian(30.0);
    let app = TestApp::spawn(settings(url), t, Hooks::default()).await;
    ingest_grid(&app, 3, 6, 1.0).await;
    app.store.set_commit_rows(3);
    let snap = app.store.snapshot().await.unwrap();
    let users = snap
        .users
        .keys()
        .map(|u| (u.clone(), vec![PrivacyEvent::pure_dp(0.1, 1).unwrap()]))
        .collect();
    let record = manual_record(&snap, eps, users);
    (app, record)
}

/// Two releases planned from the same snapshot and committed concurrently in many small
/// transactions (as two trainers without a lease would): transactions of the two
/// interleave, but each re-checks its rows under the lock, so no rating is overspent
/// and exactly one release is published; the other is aborted (with at most its
/// committed chunks charged). Which check refuses the loser depends on which release
/// takes the first users' locks first: the rating re-check (the earlier release charged
/// them) or the ledger-order check (`LedgerMoved`: the later release charged them first).
async fn chunked_commits_never_overspend(url: &str) {
    let (app, record) = grid_in_small_commits(url, 0.6).await;
    for _ in 0..3 {
        let (x, y) = tokio::join!(
            commit(&app.store, &record, None),
            commit(&app.store, &record, None)
        );
        assert_ledger_invariants(&app.store).await;
        let ok = [&x, &y].iter().filter(|r| r.is_ok()).count();
        assert!(ok <= 1, "{x:?} {y:?}");
        for r in [x, y] {
            match r {
                Ok(_) => {}
                Err(CommitError::Aborted { source, .. }) => {
                    assert!(lost_the_race(&source), "{source}")
                }
                Err(e) => assert!(lost_the_race(&e), "{e}"),
            }
        }
    }
    let c = app.store.counts().await.unwrap();
    assert_eq!(c.models, 1, "{c:?}");
    app.stop().await;
}
both_backends!(chunked_commits_never_overspend);

/// A commit in many transactions steps aside between two of them only for requests: with
/// none it runs them back to back but for a short gap every 8; while a request is in
/// flight it pauses after every
/// transaction but the last (the pauses keep concurrent requests within their targets,
/// crates/dprec-lab/notes/bench-02-release-at-20m.md); a request that started during a
/// stretch makes one pause.
async fn a_commit_pauses_only_for_requests(url: &str) {
    let (app, record) = grid_in_small_commits(url, 0.1).await;
    app.store.set_commit_rows(1);
    let quiet = commit(&app.store, &record, None).await.unwrap();
    assert!(quiet.transactions >= 9, "{quiet:?}");
    assert_eq!(quiet.pauses, 0, "{quiet:?}");
    // A short gap every 8 transactions, for writers in other processes.
    assert_eq!(quiet.gaps, (quiet.transactions - 1) / 8, "{quiet:?}");
    let request = app.store.foreground().request();
    let busy = commit(&app.store, &record, None).await.unwrap();
    drop(request);
    assert_eq!(busy.transactions, quiet.transactions);
    assert_eq!(busy.pauses, busy.transactions - 1, "{busy:?}");
    assert_eq!(busy.gaps, 0, "{busy:?}");
    // One request that starts and ends inside the first transaction: one pause.
    let fg = app.store.foreground().clone();
    let hook: Arc<dyn Fn(CommitPoint) -> Result<(), String> + Send + Sync> =
        Arc::new(move |p: CommitPoint| {
            if p.chunk == 0 {
                drop(fg.request());
            }
            Ok(())
        });
    let once = commit(&app.store, &record, Some(&*hook)).await.unwrap();
    assert_eq!(once.pauses, 1, "{once:?}");
    // The HTTP layer is what counts requests.
    let mark = app.store.foreground().mark();
    assert!(!app.store.foreground().busy_since(mark));
    let (st, _) = app.get("/v1/models", ADMIN).await;
    assert_eq!(st, 200);
    assert!(app.store.foreground().busy_since(mark));
    assert_ledger_invariants(&app.store).await;
    app.stop().await;
}
both_backends!(a_commit_pauses_only_for_requests);

/// Charges are stored as sets of rating-id runs per (user, charge): with ids interleaved
/// between users (one rating ingested at a time), charges that differ between ratings and
/// users split across transactions, every rating's history still equals its spend, the
/// audit counts and sums each user's charges, and a rating outside the release is
/// untouched.
async fn charge_sets_record_every_rating(url: &str) {
    let (t, _) = FakeDp::gaussian(30.0);
    let app = TestApp::spawn(settings(url), t, Hooks::default()).await;
    for i in 0..5 {
        for u in ["u1", "u2", "u3"] {
            app.ingest(&[(u, &format!("i{i}"), 3.0, Some(1.0))]).await;
        }
    }
    let snap = app.store.snapshot().await.unwrap();
    app.ingest(&[("u2", "i9", 3.0, Some(1.0))]).await;
    app.store.set_commit_rows(4);
    let users: std::collections::BTreeMap<String, Vec<PrivacyEvent>> = snap
        .users
        .keys()
        .map(|u| (u.clone(), vec![PrivacyEvent::pure_dp(0.1, 1).unwrap()]))
        .collect();
    let mut record = manual_record(&snap, 0.0, users);
    // u1's ratings alternate two charges; u2's have a popularity part; u3's i0 is skipped.
    let mut expected = std::collections::BTreeMap::new();
    let skipped: Vec<i64> = snap
        .iter()
        .filter(|r| &**r.user == "u3" && &**r.item == "i0")
        .map(|r| r.id)
        .collect();
    assert_eq!(skipped.len(), 1);
    let mut rows: Vec<RatingChargeRow> = record.rating_charges.all_rows().collect();
    rows.retain(|c| !skipped.contains(&c.rating_id));
    for (k, c) in rows.iter_mut().enumerate() {
        c.eps_train = if k % 2 == 0 { 0.125 } else { 0.25 };
        if &*c.user == "u2" {
            c.eps_popularity = 0.0625;
        }
        expected.insert(c.rating_id, c.total());
    }
    record.rating_charges = RatingCharges::from_rows(rows);
    for round in 1..=2 {
        commit(&app.store, &record, None).await.unwrap();
        assert_ledger_invariants(&app.store).await;
        let charged = app.store.charged_per_rating().await.unwrap();
        let want: std::collections::BTreeMap<i64, f64> = expected
            .iter()
            .map(|(&id, &e)| (id, e * f64::from(round)))
            .collect();
        assert_eq!(charged, want, "round {round}");
    }
    let sets: i64 = sqlx::query("SELECT COUNT(*) FROM rating_charge_sets")
        .fetch_one(app.store.pool())
        .await
        .unwrap()
        .get(0);
    // Per release at most one set per (user, charge) and chunk: far fewer than ratings.
    assert!(sets < 2 * expected.len() as i64, "{sets} sets");
    for (user, n) in [("u1", 5), ("u2", 5), ("u3", 4)] {
        let (_, a) = app.get(&format!("/v1/users/{user}/budget"), READER).await;
        let latest = &a["releases"]["entries"][0];
        assert_eq!(latest["ratings_charged"], n, "{user}: {a}");
        let sum: f64 = expected
            .iter()
            .filter(|(id, _)| snap.iter().any(|r| r.id == **id && &**r.user == user))
            .map(|(_, e)| e)
            .sum();
        let got = latest["rating_eps_total"].as_f64().unwrap();
        assert!((got - sum).abs() < 1e-12, "{user}: {got} != {sum}");
    }
    app.stop().await;
}
both_backends!(charge_sets_record_every_rating);

/// A non-private trainer (explicit flag) is recorded as a "non-private" release without
/// charges.
async fn non_private_release_charges_nothing(url: &str) {
    let mut s = settings(url);
    s.trainer.name = "baseline".into();
    s.trainer.allow_non_private = true;
    let app = TestApp::try_spawn(s, None, Hooks::default()).await.unwrap();
    ingest_grid(&app, 3, 4, 1.0).await;
    let job = app.retrain().await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    let (_, cur) = app.get("/v1/models/current", READER).await;
    assert_eq!(cur["release"]["guarantee"], "non-private");
    let c = app.store.counts().await.unwrap();
    assert_eq!((c.rating_charges, c.user_charges), (0, 0));
    let (_, rec) = app.get("/v1/users/u1/recommendations", READER).await;
    assert_eq!(rec["guarantee"], "non-private");
    assert_ledger_invariants(&app.store).await;
    app.stop().await;
}
both_backends!(non_private_release_charges_nothing);

/// Timing of a release over ML-100K-sized data (100k ratings, 943 users): run with
/// `cargo test --test api -- --ignored large_release --nocapture`.
async fn large_release(url: &str) {
    let (t, _) = FakeDp::new(None);
    let mut s = settings(url);
    s.budget.max_user_eps = 1e6;
    s.budget.default_user_eps = 1e6;
    let app = TestApp::spawn(s, t, Hooks::default()).await;
    let batch: Vec<dprec::store::NewRating> = (0..100_000)
        .map(|k| dprec::store::NewRating {
            user: format!("u{}", k % 943),
            item: format!("i{}", (k * 7 + k / 943) % 1682),
            value: 3.0,
            eps: Some(1.0),
            ldp: None,
        })
        .collect();
    let defaults = dprec::store::Defaults {
        rating_eps: 1.0,
        user_eps: 1e6,
        user_delta: 1e-6,
    };
    let catalogue: Vec<String> = (0..1682).map(|i| format!("i{i}")).collect();
    app.store.register_items(&catalogue).await.unwrap();
    let started = std::time::Instant::now();
    let mut unique = std::collections::HashSet::new();
    let batch: Vec<_> = batch
        .into_iter()
        .filter(|r| unique.insert((r.user.clone(), r.item.clone())))
        .collect();
    for chunk in batch.chunks(10_000) {
        app.store.upsert_ratings(chunk, defaults).await.unwrap();
    }
    let ingest = started.elapsed();
    let started = std::time::Instant::now();
    // The commit logs its ledger transactions (count, total, longest) at info level.
    let _ = env_logger::builder()
        .is_test(true)
        .filter_module("dprec::store", log::LevelFilter::Info)
        .try_init();
    let (st, job) = app.post("/v1/admin/retrain", ADMIN, &json!({})).await;
    assert_eq!(st, 202, "{job}");
    let id = job["id"].as_i64().unwrap();
    let mut job = app.job(id).await;
    while job.status == "running" {
        tokio::time::sleep(Duration::from_millis(100)).await;
        job = app.job(id).await;
    }
    assert_eq!(job.status, "succeeded", "{job:?}");
    eprintln!(
        "large_release [{}]: {} ratings ingested in {:.1} s, release in {:.1} s",
        app.store.backend().name(),
        batch.len(),
        ingest.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    assert_ledger_invariants(&app.store).await;
    app.stop().await;
}

mod large_release_timing {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "timing run"]
    async fn sqlite() {
        let db =
            crate::api::helpers::TestDb::new(crate::api::helpers::Kind::Sqlite, "large_release")
                .await
                .unwrap();
        super::large_release(&db.url).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "timing run"]
    async fn postgres() {
        if let Some(db) =
            crate::api::helpers::TestDb::new(crate::api::helpers::Kind::Postgres, "large_release")
                .await
        {
            super::large_release(&db.url).await;
        }
    }
}
