//! Pinned digests of seeded default releases: what a restructuring of the code must not
//! change. Each case runs the service's default configuration (SQLite, the noise seeded
//! through `Hooks::seed`) over one data set, publishes one release of `dp-topn` (the
//! served default) or `dp-alt`, and hashes what the release decided:
//!
//! - `charges`: every user's consumed Renyi curve and every rating's charged eps;
//! - `model`: the published model, its user and item ids and its DP counts (popularity);
//! - `release`: the stored guarantee, mechanisms, popularity eps and sizes;
//! - `params`: the parameters the release recorded;
//! - `lists`: the served top-10 lists (items and scores) of a few users.
//!
//! The digests live in `tests/data/release_digests.json`; a mismatch names the case and
//! the part. After an intended change, rewrite them with
//! `DPREC_BLESS_DIGESTS=1 cargo test --test tests api::digests` and say why in the commit.

use std::collections::BTreeMap;
use std::path::PathBuf;

use dprec::data::RatingScale;
use dprec::retrain::Hooks;
use dprec::store::{Defaults, NewRating};
use dprec_lab::synthetic::{self, SyntheticConfig};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::api::helpers::*;

/// Users whose served lists are pinned (ids present in every data set below).
const LIST_USERS: [&str; 4] = ["1", "2", "3", "10"];

/// A data set as the service receives it: public item ids and rated `(user, item,
/// value)` triples, with its rating scale.
struct Input {
    items: Vec<String>,
    ratings: Vec<(String, String, f64)>,
    scale: RatingScale,
}

fn ml100k_u1() -> Option<Input> {
    let dir = crate::common::ml100k_dir("api::digests")?;
    let text = std::fs::read_to_string(dir.join("u1.base")).unwrap();
    let mut ratings = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        ratings.push((f[0].to_string(), f[1].to_string(), f[2].parse().unwrap()));
    }
    // The catalogue is every item of u.item (1..=1682), rated in u1.base or not.
    let items = (1..=1682).map(|i| i.to_string()).collect();
    Some(Input {
        items,
        ratings,
        scale: RatingScale::ONE_TO_FIVE,
    })
}

/// A synthetic shape, with external ids `1..` for users and items.
fn shape(cfg: &SyntheticConfig) -> Input {
    let d = synthetic::generate(cfg).unwrap();
    let id = |ix: u32| (ix + 1).to_string();
    let ratings = (0..d.ratings.len())
        .map(|k| {
            let (u, i) = (d.ratings.users[k], d.ratings.items[k]);
            (id(u), id(i), d.ratings.values[k] as f64)
        })
        .collect();
    Input {
        items: (0..cfg.n_items as u32).map(id).collect(),
        ratings,
        scale: d.scale,
    }
}

fn sha(v: &Value) -> String {
    let bytes = serde_json::to_vec(v).unwrap();
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The service's defaults (budgets, plan, trainer parameters), with the test server's
/// keys and a public deadline of 0 s.
fn default_settings(url: &str, trainer: &str, scale: RatingScale) -> dprec::config::Settings {
    let defaults = dprec::config::Settings::default();
    let mut s = settings(url);
    s.budget = defaults.budget.clone();
    s.server.max_batch = defaults.server.max_batch;
    s.server.max_body_bytes = defaults.server.max_body_bytes;
    s.trainer.name = trainer.into();
    s.ratings.min = scale.min;
    s.ratings.max = scale.max;
    s.ratings.step = scale.step;
    s
}

/// One seeded release of `trainer` over `input`; the digest of each part.
async fn release_digests(trainer: &str, input: &Input) -> BTreeMap<String, String> {
    let db = TestDb::new(Kind::Sqlite, "api::digests").await.unwrap();
    let s = default_settings(&db.url, trainer, input.scale);
    let budget = s.budget.clone();
    let app = TestApp::try_spawn(s, None, Hooks::default()).await.unwrap();
    app.store.register_items(&input.items).await.unwrap();
    let defaults = Defaults {
        rating_eps: budget.default_rating_eps,
        user_eps: budget.default_user_eps,
        user_delta: budget.default_user_delta,
    };
    let rows: Vec<NewRating> = input
        .ratings
        .iter()
        .map(|(u, i, v)| NewRating {
            user: u.clone(),
            item: i.clone(),
            value: *v,
            eps: None,
            ldp: None,
        })
        .collect();
    for chunk in rows.chunks(10_000) {
        app.store.upsert_ratings(chunk, defaults).await.unwrap();
    }
    let job = app.retrain().await;
    assert_eq!(job.status, "succeeded", "{job:?}");

    let mut parts = BTreeMap::new();
    let users = app.store.user_budgets().await.unwrap();
    let curves: BTreeMap<&String, Value> = users
        .iter()
        .map(|(u, b)| (u, json!([b.eps, b.delta, b.consumed.values()])))
        .collect();
    let per_rating = app.store.charged_per_rating().await.unwrap();
    parts.insert("charges", json!({"users": curves, "ratings": per_rating}));

    let row = app.store.latest_model().await.unwrap().expect("a model");
    let model = json!({
        "model": row.model, "users": row.users, "items": row.items,
        "popularity": row.popularity,
    });
    parts.insert("model", model);
    let r = &row.release;
    parts.insert(
        "release",
        json!({
            "trainer": r.trainer, "guarantee": serde_json::to_value(r.guarantee).unwrap(),
            "mechanisms": r.mechanisms, "popularity_eps": r.popularity_eps,
            "sizes": [r.n_ratings, r.n_users, r.n_items],
        }),
    );
    parts.insert("params", r.params.clone());

    let mut lists = BTreeMap::new();
    for u in LIST_USERS {
        let (st, rec) = app
            .get(&format!("/v1/users/{u}/recommendations?n=10"), READER)
            .await;
        assert_eq!(st, 200, "{rec}");
        lists.insert(u, rec);
    }
    parts.insert("lists", json!(lists));
    app.stop().await;
    parts
        .into_iter()
        .map(|(k, v)| (k.to_string(), sha(&v)))
        .collect()
}

fn digest_file() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/release_digests.json")
}

/// The two synthetic shapes: a small store with strong tastes on the 1..5 scale, and
/// few heavy raters over a wide catalogue on the half-star scale (scaled to 30,000
/// ratings so the test stays quick).
fn shapes() -> [(&'static str, SyntheticConfig); 2] {
    [
        ("small_store", SyntheticConfig::small_store()),
        (
            "heavy_raters_30k",
            SyntheticConfig::heavy_raters().scaled(30_000),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_default_releases_are_pinned() {
    let mut inputs: Vec<(String, Input)> = Vec::new();
    if let Some(ml) = ml100k_u1() {
        inputs.push(("ml100k_u1".into(), ml));
    }
    for (name, cfg) in shapes() {
        inputs.push((name.into(), shape(&cfg)));
    }
    let mut got: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (name, input) in &inputs {
        for trainer in ["dp-topn", "dp-alt"] {
            let parts = release_digests(trainer, input).await;
            got.insert(format!("{name}/{trainer}"), parts);
        }
    }
    let path = digest_file();
    if std::env::var("DPREC_BLESS_DIGESTS").as_deref() == Ok("1") {
        let mut text = serde_json::to_string_pretty(&got).unwrap();
        text.push('\n');
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        return;
    }
    let pinned: BTreeMap<String, BTreeMap<String, String>> =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut differ = Vec::new();
    for (case, parts) in &got {
        let Some(want) = pinned.get(case) else {
            differ.push(format!("{case}: not pinned"));
            continue;
        };
        for (part, digest) in parts {
            if want.get(part) != Some(digest) {
                differ.push(format!("{case}: {part}"));
            }
        }
    }
    assert!(
        differ.is_empty(),
        "seeded releases differ from tests/data/release_digests.json in: {differ:?} \
         (rewrite with DPREC_BLESS_DIGESTS=1 only for an intended change)"
    );
}
