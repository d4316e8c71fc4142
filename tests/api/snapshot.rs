//! The release snapshot (`Store::snapshot`, issue 22 item 2) reads the ratings grouped by
//! user, with budget states by number and values as text: it must hold exactly what a
//! plain row-by-row read of the same store holds, on both backends (ids, names, exact
//! budget states, values, origins; deleted ratings and users left out).

use dprec::store::{Defaults, NewRating, Store};
use sqlx::Row;

use crate::both_backends;

const DEFAULTS: Defaults = Defaults {
    rating_eps: 1.0,
    user_eps: 10.0,
    user_delta: 1e-6,
};

/// `(id, user, item, value as f32, eps bits, spent bits, rho bits, ldp)`, by id.
type Row8 = (i64, String, String, u32, u64, u64, u64, bool);

/// The reference: one row per live rating of a live user, read one by one.
async fn plain_read(store: &Store) -> Vec<Row8> {
    let rows = sqlx::query(
        "SELECT r.id, r.user_id, r.item_id, r.value, r.eps, r.spent, r.rho, r.origin \
         FROM ratings r JOIN users u ON u.id = r.user_id \
         WHERE r.value IS NOT NULL AND u.deleted = 0 ORDER BY r.id",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    rows.iter()
        .map(|r| {
            let f = |k: usize| r.try_get::<f64, _>(k).unwrap();
            (
                r.try_get(0).unwrap(),
                r.try_get(1).unwrap(),
                r.try_get(2).unwrap(),
                (f(3) as f32).to_bits(),
                f(4).to_bits(),
                f(5).to_bits(),
                f(6).to_bits(),
                r.try_get::<String, _>(7).unwrap() == "ldp",
            )
        })
        .collect()
}

async fn snapshot_matches_a_plain_read(url: &str) {
    let store = Store::connect(url, 4).await.unwrap();
    // Item ids with commas, spaces and non-ASCII letters; users likewise.
    let items: Vec<String> = (0..40)
        .map(|j| match j % 4 {
            0 => format!("item,{j}"),
            1 => format!("é {j}"),
            _ => format!("i{j}"),
        })
        .collect();
    store.register_items(&items).await.unwrap();
    let mut batch = Vec::new();
    for u in 0..60usize {
        let user = if u % 3 == 0 {
            format!("ü,{u}")
        } else {
            format!("user {u}")
        };
        for j in (u % 7..40).step_by(1 + u % 5) {
            batch.push(NewRating {
                user: user.clone(),
                item: items[j].clone(),
                value: 0.5 + ((u * 7 + j) % 10) as f64 * 0.45,
                // Several eps per user, some that print with 17 digits.
                eps: match (u + j) % 3 {
                    0 => None,
                    1 => Some(0.1 + 0.2),
                    _ => Some(2.0 / 3.0),
                },
                ldp: None,
            });
        }
    }
    for chunk in batch.chunks(500) {
        store.upsert_ratings(chunk, DEFAULTS).await.unwrap();
    }
    // Spends and Gaussian parts that only survive an exact (binary) read.
    sqlx::query("UPDATE ratings SET spent = 0.1 + 0.2, rho = 1.0 / 3.0 WHERE id % 4 = 1")
        .execute(store.pool())
        .await
        .unwrap();
    sqlx::query("UPDATE ratings SET spent = 0.7 / 3.0 WHERE id % 4 = 2")
        .execute(store.pool())
        .await
        .unwrap();
    sqlx::query("UPDATE ratings SET origin = 'ldp' WHERE id % 9 = 0")
        .execute(store.pool())
        .await
        .unwrap();
    assert!(store.delete_rating("user 1", &items[1]).await.unwrap());
    assert!(store.delete_user("user 2").await.unwrap());

    let want = plain_read(&store).await;
    assert!(want.len() > 400, "{}", want.len());
    let snap = store.snapshot().await.unwrap();
    let got: Vec<Row8> = snap
        .iter()
        .map(|r| {
            (
                r.id,
                r.user.to_string(),
                r.item.to_string(),
                (r.value as f32).to_bits(),
                r.eps.to_bits(),
                r.spent.to_bits(),
                r.rho.to_bits(),
                r.ldp,
            )
        })
        .collect();
    assert_eq!(got, want);
    // The other way of numbering the states reads the same.
    let joined = store.snapshot_joining_states().await.unwrap();
    assert_eq!(joined.ratings, snap.ratings);
    assert_eq!(joined.states, snap.states);
    assert!(snap.states.len() >= 6, "{} states", snap.states.len());
    assert!(!snap.users.contains_key("user 2"), "deleted user");
    assert_eq!(snap.items.len(), items.len());
    store.close().await;
}
both_backends!(snapshot_matches_a_plain_read);

/// Users' consumed curves are read exactly, one parsed curve shared by the users whose
/// stored curves are the same text (the snapshot's users and `user_budgets` alike).
async fn users_with_the_same_curve_share_it(url: &str) {
    use dprec_dp::accountant::{default_orders, RdpCurve};
    let store = Store::connect(url, 4).await.unwrap();
    store.register_items(&["i".to_string()]).await.unwrap();
    let batch: Vec<NewRating> = (0..12)
        .map(|u| NewRating {
            user: format!("u{u}"),
            item: "i".into(),
            value: 3.0,
            eps: None,
            ldp: None,
        })
        .collect();
    store.upsert_ratings(&batch, DEFAULTS).await.unwrap();
    let curve = |k: f64| RdpCurve::from_fn(default_orders(), |a| k * a / 3.0).unwrap();
    let text = |k: f64| serde_json::to_string(&curve(k)).unwrap();
    for (users, k) in [("('u1', 'u2', 'u3')", 0.1), ("('u4', 'u5')", 0.7)] {
        sqlx::query(&format!(
            "UPDATE users SET rdp_consumed = $1 WHERE id IN {users}"
        ))
        .bind(text(k))
        .execute(store.pool())
        .await
        .unwrap();
    }
    let snap = store.snapshot().await.unwrap();
    for users in [snap.users, store.user_budgets().await.unwrap()] {
        let of = |u: &str| users[u].consumed.clone();
        assert_eq!(of("u1"), curve(0.1));
        assert_eq!(of("u4"), curve(0.7));
        assert_eq!(of("u0"), RdpCurve::zeros_default());
        assert!(of("u1").shares_storage_with(&of("u3")));
        assert!(of("u4").shares_storage_with(&of("u5")));
        assert!(of("u0").shares_storage_with(&of("u11")));
        assert!(!of("u1").shares_storage_with(&of("u4")));
    }
    store.close().await;
}
both_backends!(users_with_the_same_curve_share_it);
