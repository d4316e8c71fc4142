//! A `dp-topn` release's sums computed in parts (issue 22 item 3, docs/SCALING.md): over
//! shards of the users merged (both backends), and by PostgreSQL's SQL aggregates over
//! a hash-partitioned table, one query per partition, merged (PostgreSQL). Each must equal the trainer's in-process sums: the counts exactly
//! (integers), the Gram and its trace within `GramSums::tolerance` (floats added in
//! another order); and a whole release from those sums must equal the in-process release
//! drawn with the same generator.

use dprec::data::{Interactions, RatingScale, Ratings};
use dprec::store::suffstats_pg::{PgSource, PgStats};
use dprec::store::{Defaults, NewRating, Store};
use dprec::train::topn::contribution::Contribution;
use dprec::train::topn::dp_topn::{sample_ratings, DpTopN, GramRelease};
use dprec::train::topn::suffstats::{GramSums, InProcess, StatsSource, SubsetKey};
use dprec::train::{Labels, Params, TrainData};
use rand::{Rng, SeedableRng};

use crate::both_backends;

const DEFAULTS: Defaults = Defaults {
    rating_eps: 1.0,
    user_eps: 10.0,
    user_delta: 1e-6,
};

/// 300 users (some with non-ASCII ids, of many lengths), 120 items, 1 to 60 ratings each:
/// the cap of 24 binds for about half of them.
fn new_ratings() -> (Vec<String>, Vec<NewRating>) {
    let mut g = rand_chacha::ChaCha8Rng::seed_from_u64(22);
    let items: Vec<String> = (0..120)
        .map(|j| {
            if j % 7 == 0 {
                format!("é{j}")
            } else {
                format!("item-{j}")
            }
        })
        .collect();
    let mut out = Vec::new();
    for u in 0..300 {
        let user = if u % 5 == 0 {
            format!("ü{}", "x".repeat(u % 13)) + &u.to_string()
        } else {
            format!("u{u}")
        };
        let n = g.random_range(1..=60);
        let mut js: Vec<usize> = (0..120).collect();
        rand::seq::SliceRandom::shuffle(js.as_mut_slice(), &mut g);
        for &j in &js[..n] {
            out.push(NewRating {
                user: user.clone(),
                item: items[j].clone(),
                // Every value of the scale: the count rows weigh those below 4 by 1/2.
                value: (1 + (j + u) % 5) as f64,
                eps: Some(1000.0),
                ldp: None,
            });
        }
    }
    (items, out)
}

/// The store's live ratings as the trainer's indices, with their ids.
struct Loaded {
    ratings: Ratings,
    users: Vec<String>,
    items: Vec<String>,
}

async fn load(store: &Store) -> Loaded {
    let snap = store.snapshot().await.unwrap();
    let users: Vec<String> = snap.users.keys().cloned().collect();
    let items = snap.items.clone();
    let mut r = Ratings::with_dims(users.len(), items.len());
    for row in snap.iter() {
        let u = users
            .binary_search_by(|x| x.as_str().cmp(row.user))
            .unwrap();
        let j = items
            .binary_search_by(|x| x.as_str().cmp(row.item))
            .unwrap();
        r.push(u as u32, j as u32, row.value as f32);
    }
    Loaded {
        ratings: r,
        users,
        items,
    }
}

const C: Contribution = Contribution {
    cap: 24,
    count_clip: 3.0,
    gram_clip: 1.5,
    liked_min: Some(4.0),
    unliked_weight: 0.5,
};

fn trainer() -> DpTopN {
    let p = [
        "eps=5",
        "releases=1",
        "cap=24",
        "count_clip=3",
        "gram_clip=1.5",
        "k=40",
        "threshold=0",
        "split=gram",
        // Every rating takes full part: the database path counts every rating at rate 1
        // (RSM rates are not in the database; docs/SCALING.md, "What is left").
        "eps_r=none",
    ];
    DpTopN::from_params(&Params::parse(&p).unwrap()).unwrap()
}

/// `got`'s sums equal `want`'s: counts exactly, Gram and trace within the tolerance.
fn assert_same_sums(
    what: &str,
    want: &dyn StatsSource,
    got: &dyn StatsSource,
    key: &SubsetKey,
    cands: &[u32],
) {
    for bits in [8, 16] {
        let (a, b) = (
            want.count_sums(key, &C, bits).unwrap(),
            got.count_sums(key, &C, bits).unwrap(),
        );
        assert!(
            a.units.iter().filter(|&&x| x > 0).count() > 100,
            "{what}: counts are not trivial"
        );
        assert_eq!(a, b, "{what}: count sums at 2^-{bits}");
    }
    let (a, b) = (
        want.gram_sums(key, &C, cands).unwrap(),
        got.gram_sums(key, &C, cands).unwrap(),
    );
    assert!(
        a.users > 200,
        "{what}: the Gram is not trivial ({} users)",
        a.users
    );
    assert_eq!(a.users, b.users, "{what}: users with a candidate");
    for (i, (x, y)) in a.upper.iter().zip(&b.upper).enumerate() {
        let tol = GramSums::tolerance(a.users, x.max(*y));
        assert!((x - y).abs() <= tol, "{what}: Gram entry {i}: {x} vs {y}");
    }
    let t = got.trace(key, &C, cands).unwrap();
    for t in [t, b.trace] {
        let tol = GramSums::tolerance(a.users, a.trace);
        assert!(
            (a.trace - t).abs() <= tol,
            "{what}: trace {} vs {t}",
            a.trace
        );
    }
}

/// Two releases drawn with the same generator from sums that agree: the same counts and
/// candidates, the same branch, and the Gram within the sums' tolerance plus the rounding
/// of adding the same noise draw. Both are bounded with `scale` = the largest clean
/// Gram entry plus the largest noisy one (`|S| + |S + e|` bounds `|e|`): the sums'
/// tolerance at `scale` and 4 ulp of it for the addition.
fn assert_same_release(what: &str, a: &GramRelease, b: &GramRelease, clean: &GramSums) {
    let top = |g: &[f64]| g.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let scale = top(&clean.upper) + top(&a.gram);
    let tol = GramSums::tolerance(clean.users, scale) + 4.0 * f64::EPSILON * scale;
    assert_eq!(a.noisy_counts, b.noisy_counts, "{what}: noisy counts");
    assert_eq!(a.candidates, b.candidates, "{what}: candidates");
    assert_eq!(a.gram.len(), b.gram.len(), "{what}: the branch");
    for (x, y) in a.gram.iter().zip(&b.gram) {
        assert!((x - y).abs() <= tol, "{what}: noisy Gram {x} vs {y}");
    }
    let names = |r: &GramRelease| -> Vec<(String, serde_json::Value)> {
        let m = &r.charges.mechanisms;
        m.iter()
            .map(|m| (m.name.clone(), m.params["spent_on"].clone()))
            .collect()
    };
    assert_eq!(names(a), names(b), "{what}: mechanisms");
    assert_eq!(a.charges.users, b.charges.users, "{what}: user charges");
}

async fn shard_and_database_sums_equal_the_in_process_sums(url: &str) {
    let store = Store::connect(url, 6).await.unwrap();
    let (items, batch) = new_ratings();
    store.register_items(&items).await.unwrap();
    for chunk in batch.chunks(2000) {
        store.upsert_ratings(chunk, DEFAULTS).await.unwrap();
    }
    let l = load(&store).await;
    let m = Interactions::new(&l.ratings);
    let mut data = TrainData::new(&l.ratings, &m, RatingScale::ONE_TO_FIVE);
    data.labels = Some(Labels {
        users: &l.users,
        items: &l.items,
    });
    // The key the release below draws first from its generator (seeded 9).
    let key = SubsetKey::draw(&mut dprec_dp::rng::split(&mut dprec_dp::rng::seeded(9)));
    let sample = sample_ratings(
        &data,
        dprec::train::PerRating::Same {
            value: f64::INFINITY,
            len: l.ratings.len(),
        },
        1.0,
        1e-6,
        C.cap,
        C.liked_min,
        &key,
    )
    .unwrap();
    assert!(
        sample.rows.iter().filter(|r| r.len() == C.cap).count() > 100,
        "the cap binds"
    );
    assert!(
        (sample.liked.iter().zip(&sample.rows))
            .filter(|(&l, r)| (l as usize) < r.len())
            .count()
            > 100,
        "ratings below the liked threshold"
    );
    let one = InProcess {
        liked: &sample.liked,
        ..InProcess::one(&sample.rows, &key, l.items.len())
    };
    let cands: Vec<u32> = (0..l.items.len() as u32).step_by(3).collect();
    for shards in [2, 5] {
        let sharded = InProcess {
            shards,
            labels: &l.users,
            liked: &sample.liked,
            ..InProcess::one(&sample.rows, &key, l.items.len())
        };
        assert_same_sums(&format!("{shards} shards"), &one, &sharded, &key, &cands);
    }
    let t = trainer();
    let release_with = |source: Option<&dyn StatsSource>| {
        let mut rng = dprec_dp::rng::seeded(9);
        match source {
            None => t.release(&data, &mut rng).unwrap(),
            Some(s) => t.release_with_source(&data, s, &mut rng).unwrap(),
        }
    };
    let base = release_with(None);
    assert!(!base.gram.is_empty(), "the release reached the Gram branch");
    let clean = one.gram_sums(&key, &C, &base.candidates).unwrap();
    let sharded = InProcess {
        shards: 3,
        labels: &l.users,
        liked: &sample.liked,
        ..InProcess::one(&sample.rows, &key, l.items.len())
    };
    assert_same_release("3 shards", &base, &release_with(Some(&sharded)), &clean);
    if !url.starts_with("postgres") {
        return;
    }
    // PostgreSQL: a hash-partitioned copy by user, one query per partition (what a Citus worker runs on its shards), merged by the service.
    let pool = store.pool();
    sqlx::query("CREATE TABLE rp (user_id TEXT NOT NULL, item_id TEXT NOT NULL, value FLOAT8 NOT NULL) PARTITION BY HASH (user_id)")
        .execute(pool).await.unwrap();
    for p in 0..4 {
        sqlx::query(&format!(
            "CREATE TABLE rp_{p} PARTITION OF rp FOR VALUES WITH (MODULUS 4, REMAINDER {p})"
        ))
        .execute(pool)
        .await
        .unwrap();
    }
    sqlx::query(
        "INSERT INTO rp SELECT user_id, item_id, value FROM ratings WHERE value IS NOT NULL",
    )
    .execute(pool)
    .await
    .unwrap();
    let handle = tokio::runtime::Handle::current();
    let parts = PgStats {
        pool,
        shards: (0..4).map(|p| PgSource::Table(format!("rp_{p}"))).collect(),
        items: &l.items,
        handle,
    };
    tokio::task::block_in_place(|| {
        assert_same_sums("PostgreSQL, 4 partitions", &one, &parts, &key, &cands);
        assert_same_release(
            "PostgreSQL, 4 partitions",
            &base,
            &release_with(Some(&parts)),
            &clean,
        );
    });
    // A table name that is not a plain identifier is refused, not spliced into SQL.
    let bad = PgStats {
        pool,
        shards: vec![PgSource::Table("rp; DROP TABLE rp".into())],
        items: &l.items,
        handle: tokio::runtime::Handle::current(),
    };
    let err = tokio::task::block_in_place(|| bad.count_sums(&key, &C, 8).unwrap_err());
    assert!(err.to_string().contains("plain table name"), "{err}");
}

both_backends!(shard_and_database_sums_equal_the_in_process_sums);
