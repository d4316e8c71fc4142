//! Bulk rating ingestion (issue 22 item 1): batches of thousands of ratings through
//! `Store::upsert_ratings`, written by chunked multi-row statements on SQLite and by one
//! array-bound statement per step on PostgreSQL, must store the same rows: every new pair
//! once, re-ratings replacing the value and keeping the budget slot, a pair sent twice in
//! one batch stored once with its last value, the same ledger; and a batch with an
//! unregistered item stores nothing (422 through the API).

use std::collections::BTreeMap;

use dprec::release::Hooks;
use dprec::store::{Defaults, NewRating, Store, StoreError};
use serde_json::json;
use sqlx::Row;

use crate::api::fake::FakeDp;
use crate::api::helpers::*;
use crate::api::ledger::assert_ledger_invariants;
use crate::both_backends;

const DEFAULTS: Defaults = Defaults {
    rating_eps: 1.0,
    user_eps: 10.0,
    user_delta: 1e-6,
};

fn rating(user: String, item: String, value: f64, eps: Option<f64>) -> NewRating {
    NewRating {
        user,
        item,
        value,
        eps,
        ldp: None,
    }
}

/// Batch A: 4,000 distinct pairs of 150 users over 400 items (every third without its
/// own eps), then pair 10 sent again with another value (the last one wins).
fn batch_a() -> Vec<NewRating> {
    let mut out: Vec<NewRating> = (0..4000)
        .map(|k| {
            let eps = (k % 3 != 0).then_some(0.5 + (k % 5) as f64 * 0.25);
            let item = (k / 150 * 13 + k % 150) % 400;
            let value = 1.0 + (k % 9) as f64 * 0.5;
            rating(format!("u{}", k % 150), format!("i{item}"), value, eps)
        })
        .collect();
    let again = rating(out[10].user.clone(), out[10].item.clone(), 0.5, Some(3.0));
    out.push(again);
    out
}

/// Batch B: re-ratings of 1,200 of batch A's pairs (new value, a different eps that
/// must be ignored), 1,800 new pairs (30 new users, and new items of old users), a
/// re-rated pair and a new pair each sent twice.
fn batch_b(a: &[NewRating]) -> Vec<NewRating> {
    let mut out: Vec<NewRating> = a[..3600]
        .iter()
        .step_by(3)
        .map(|r| {
            rating(
                r.user.clone(),
                r.item.clone(),
                5.0 - r.value / 2.0,
                Some(9.0),
            )
        })
        .collect();
    for k in 0..1800 {
        let user = format!("u{}", 120 + k % 60);
        let item = format!("i{}", (k / 60 * 11 + 7) % 400 + 400);
        out.push(rating(user, item, 2.5, (k % 2 == 0).then_some(0.75)));
    }
    let (re, new) = (out[5].clone(), out[1300].clone());
    out.insert(0, rating(re.user.clone(), re.item.clone(), 1.0, None));
    out.push(rating(new.user.clone(), new.item.clone(), 4.5, Some(2.0)));
    out
}

/// Every stored row that ingestion writes or a release charges, created/updated times
/// left out; ids included (both backends assign them in the batch's sorted order).
/// Formatted in Rust: the backends print floats differently in SQL.
async fn dump(store: &Store) -> Vec<String> {
    let pool = store.pool();
    let all = |sql: &'static str| async move { sqlx::query(sql).fetch_all(pool).await.unwrap() };
    let mut out = Vec::new();
    for r in all(
        "SELECT id, user_id, item_id, value, eps, spent, releases, origin, rho \
                  FROM ratings ORDER BY id",
    )
    .await
    {
        let (id, u, i, o): (i64, String, String, String) = (r.get(0), r.get(1), r.get(2), r.get(7));
        let (v, e, sp, n, rho): (Option<f64>, f64, f64, i64, f64) =
            (r.get(3), r.get(4), r.get(5), r.get(6), r.get(8));
        out.push(format!("r {id} {u} {i} {v:?} {e:?} {sp:?} {n} {o} {rho:?}"));
    }
    for r in all(
        "SELECT id, default_eps, budget_eps, deleted, rdp_consumed FROM users \
                  ORDER BY id",
    )
    .await
    {
        let (id, d, b, del, c): (String, Option<f64>, f64, i64, String) =
            (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
        out.push(format!("u {id} {d:?} {b:?} {del} {c}"));
    }
    for r in all(
        "SELECT release_id, user_id, n, eps, rating_ids FROM rating_charge_sets \
                  ORDER BY release_id, user_id, rating_ids",
    )
    .await
    {
        let (rel, u, n, e, ids): (i64, String, i64, f64, String) =
            (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
        out.push(format!("c {rel} {u} {n} {e:?} {ids}"));
    }
    let uc: i64 = all("SELECT COUNT(*) FROM user_charges").await[0].get(0);
    out.push(format!("user charges {uc}"));
    out
}

/// Stored ratings as `(user, item) -> (value, eps, spent, releases)`.
type Stored = BTreeMap<(String, String), (Option<f64>, f64, f64, i64)>;

/// The stored ratings ([`Stored`]).
async fn ratings(store: &Store) -> Stored {
    sqlx::query("SELECT user_id, item_id, value, eps, spent, releases FROM ratings")
        .fetch_all(store.pool())
        .await
        .unwrap()
        .iter()
        .map(|r| {
            let key = (r.get(0), r.get(1));
            (key, (r.get(2), r.get(3), r.get(4), r.get(5)))
        })
        .collect()
}

/// What each batch should leave, computed without a database: the last value per pair;
/// a new pair's eps is its own or the service default (user u3's default is 2.5).
fn expected(before: &Stored, batch: &[NewRating]) -> Stored {
    let mut out = before.clone();
    for r in batch {
        let key = (r.user.clone(), r.item.clone());
        let default = if r.user == "u3" { 2.5 } else { 1.0 };
        let slot =
            before
                .get(&key)
                .map(|s| (s.1, s.2, s.3))
                .unwrap_or((r.eps.unwrap_or(default), 0.0, 0));
        out.insert(key, (Some(r.value), slot.0, slot.1, slot.2));
    }
    out
}

/// Two bulk batches around a release and a user deletion; checks each batch's stored
/// rows and created count against [`expected`]; returns the final [`dump`].
async fn bulk_scenario(url: &str) -> Vec<String> {
    let (t, _) = FakeDp::gaussian(5.0);
    let mut s = settings(url);
    s.budget.default_user_eps = 10.0;
    let app = TestApp::spawn(s, t, Hooks::default()).await;
    let store = &app.store;
    let items: Vec<String> = (0..800).map(|i| format!("i{i}")).collect();
    store.register_items(&items).await.unwrap();
    assert_eq!(
        store
            .put_user_settings("u3", Some(2.5), 10.0, 1e-6)
            .await
            .unwrap(),
        dprec::store::SettingsWrite::Applied
    );
    let a = batch_a();
    let want = expected(&ratings(store).await, &a);
    assert_eq!(store.upsert_ratings(&a, DEFAULTS).await.unwrap(), 4000);
    assert_eq!(ratings(store).await, want, "batch A");
    let job = app.retrain().await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    assert!(store.delete_user("u9").await.unwrap());
    let before = ratings(store).await;
    assert!(
        before.values().any(|s| s.2 > 0.0),
        "the release charged ratings"
    );
    let b = batch_b(&a);
    let want = expected(&before, &b);
    assert_eq!(store.upsert_ratings(&b, DEFAULTS).await.unwrap(), 1800);
    let got = ratings(store).await;
    assert_eq!(got.len(), 5800, "one row per pair");
    assert_eq!(got, want, "batch B");
    let live = want.values().filter(|s| s.0.is_some()).count();
    assert!(live < 5800, "u9's ratings not re-rated stay deleted");
    assert_eq!(store.counts().await.unwrap().ratings, live as i64);
    let revived = store.user("u9").await.unwrap().unwrap();
    assert!(!revived.deleted, "a rating revives a deleted user");
    assert_ledger_invariants(store).await;
    let out = dump(store).await;
    app.stop().await;
    out
}

async fn bulk_batches_store_every_pair_once(url: &str) {
    bulk_scenario(url).await;
}
both_backends!(bulk_batches_store_every_pair_once);

/// PostgreSQL's array-bound path leaves exactly what SQLite's chunked path leaves: the
/// same rating rows (ids, values, budget slots), users, rating charges and user charges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_ingest_same_on_both_backends() {
    let test = "bulk_ingest_same_on_both_backends";
    let Some(pg) = TestDb::new(Kind::Postgres, test).await else {
        return;
    };
    let lite = TestDb::new(Kind::Sqlite, test).await.unwrap();
    let on_sqlite = bulk_scenario(&lite.url).await;
    let on_postgres = bulk_scenario(&pg.url).await;
    assert_eq!(on_sqlite.len(), on_postgres.len());
    for (s, p) in on_sqlite.iter().zip(&on_postgres) {
        assert_eq!(s, p);
    }
}

/// A bulk batch (new users, re-ratings, thousands of rows) with unregistered items
/// anywhere stores nothing; the error names the first missing item in sorted order on
/// both backends, and the API answers 422 at that rating's index.
async fn bulk_batch_with_unregistered_item_stores_nothing(url: &str) {
    let (t, _) = FakeDp::gaussian(5.0);
    let app = TestApp::spawn(settings(url), t, Hooks::default()).await;
    let store = &app.store;
    let items: Vec<String> = (0..400).map(|i| format!("i{i}")).collect();
    store.register_items(&items).await.unwrap();
    let a = batch_a();
    store.upsert_ratings(&a[..1000], DEFAULTS).await.unwrap();
    let before = store.fingerprint().await.unwrap();
    let counts = store.counts().await.unwrap();
    let mut bad = a.clone();
    bad[2500].item = "zz-missing".into();
    bad[3100].item = "aa-missing".into();
    match store.upsert_ratings(&bad, DEFAULTS).await {
        Err(StoreError::NotInCatalogue(item)) => assert_eq!(item, "aa-missing"),
        other => panic!("expected NotInCatalogue, got {other:?}"),
    }
    assert_eq!(store.fingerprint().await.unwrap(), before);
    assert_eq!(store.counts().await.unwrap(), counts);
    let batch: Vec<_> = (0..50)
        .map(|k| {
            let item = if k == 37 {
                "missing".into()
            } else {
                format!("i{k}")
            };
            json!({"user": format!("new{k}"), "item": item, "rating": 3.0})
        })
        .collect();
    let (st, p) = app
        .post("/v1/ratings", WRITER, &json!({ "ratings": batch }))
        .await;
    assert_eq!(
        (st, p["field"].as_str()),
        (422, Some("ratings[37].item")),
        "{p}"
    );
    assert_eq!(store.fingerprint().await.unwrap(), before);
    app.stop().await;
}
both_backends!(bulk_batch_with_unregistered_item_stores_nothing);
