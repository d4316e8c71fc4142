//! `dp-topn`'s sums computed by PostgreSQL versus in process (issue 22 item 3,
//! docs/SCALING.md): time of each, and a check that they agree.
//!
//! ```text
//! cargo run --example suffstats_bench -- --url postgres://postgres@127.0.0.1:5432/DB \
//!     --csv ratings.csv [--table r] [--partitions rp_ 4] [--cap 256] [--k 200]
//! ```
//!
//! The ratings are read from the MovieLens-style CSV (`dprec-lab synth`) for the in-process
//! side and from `--table` (a `(user_id, item_id, value)` table holding the same CSV) for the
//! database side; with `--partitions PREFIX S` also from the S partitions `PREFIX0 ..`
//! of a table hash-partitioned by user, one query per partition, run concurrently and
//! merged. The candidates are the `k` items of largest exact count sum (a benchmark of
//! the aggregation, not a release: no noise is drawn). Prints one line per step.

use std::time::Instant;

use dprec::data::{Interactions, RatingScale, Ratings};
use dprec::store::suffstats_pg::{PgSource, PgStats};
use dprec::store::Store;
use dprec::train::topn::contribution::Contribution;
use dprec::train::topn::dp_topn::sample_ratings;
use dprec::train::topn::suffstats::{GramSums, InProcess, StatsSource, SubsetKey};
use dprec::train::{Labels, TrainData};

struct Args {
    url: String,
    csv: String,
    table: String,
    partitions: Option<(String, u32)>,
    cap: usize,
    k: usize,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        url: String::new(),
        csv: String::new(),
        table: "r".into(),
        partitions: None,
        cap: 256,
        k: 200,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut next = || {
            it.next()
                .ok_or_else(|| anyhow::anyhow!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--url" => a.url = next()?,
            "--csv" => a.csv = next()?,
            "--table" => a.table = next()?,
            "--partitions" => a.partitions = Some((next()?, next()?.parse()?)),
            "--cap" => a.cap = next()?.parse()?,
            "--k" => a.k = next()?.parse()?,
            other => anyhow::bail!("unknown flag {other}"),
        }
    }
    anyhow::ensure!(
        !a.url.is_empty() && !a.csv.is_empty(),
        "--url and --csv are required"
    );
    Ok(a)
}

/// The CSV's ratings by index, with the ids as labels (sorted, as the store's).
fn read_csv(path: &str) -> anyhow::Result<(Ratings, Vec<String>, Vec<String>)> {
    let text = std::fs::read_to_string(path)?;
    let pairs: Vec<(&str, &str)> = text
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut f = l.split(',');
            Some((f.next()?, f.next()?))
        })
        .collect();
    let mut users: Vec<String> = pairs.iter().map(|p| p.0.to_owned()).collect();
    let mut items: Vec<String> = pairs.iter().map(|p| p.1.to_owned()).collect();
    for v in [&mut users, &mut items] {
        v.sort();
        v.dedup();
    }
    let mut r = Ratings::with_dims(users.len(), items.len());
    for (u, j) in pairs {
        let u = users.binary_search_by(|x| x.as_str().cmp(u)).unwrap();
        let j = items.binary_search_by(|x| x.as_str().cmp(j)).unwrap();
        r.push(u as u32, j as u32, 4.0);
    }
    Ok((r, users, items))
}

fn main() -> anyhow::Result<()> {
    let a = args()?;
    let rt = tokio::runtime::Runtime::new()?;
    let shards = a.partitions.as_ref().map_or(1, |p| p.1);
    let store = rt.block_on(Store::connect(&a.url, shards + 1))?;
    let (r, users, items) = read_csv(&a.csv)?;
    let c = Contribution {
        cap: a.cap,
        count_clip: 4.0,
        gram_clip: 1.0,
        liked_min: None,
        unliked_weight: 1.0,
    };
    let key = SubsetKey::new([7; 32]);
    let t = Instant::now();
    let m = Interactions::new(&r);
    let mut data = TrainData::new(&r, &m, RatingScale::ONE_TO_FIVE);
    data.labels = Some(Labels {
        users: &users,
        items: &items,
    });
    let sample = sample_ratings(
        &data,
        dprec::train::PerRating::Same {
            value: f64::INFINITY,
            len: r.len(),
        },
        1.0,
        1e-6,
        a.cap,
        None,
        &key,
    )?;
    let one = InProcess::one(&sample.rows, &key, items.len());
    println!(
        "in process: {} ratings, {} users, {} items; sparse views and capped rows {:.2} s",
        r.len(),
        users.len(),
        items.len(),
        t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    let counts = one.count_sums(&key, &c, 16)?;
    println!("in process: count sums {:.3} s", t.elapsed().as_secs_f64());
    let mut cands: Vec<u32> = (0..items.len() as u32).collect();
    cands.sort_by_key(|&j| std::cmp::Reverse(counts.units[j as usize]));
    cands.truncate(a.k);
    let t = Instant::now();
    let gram = one.gram_sums(&key, &c, &cands)?;
    println!(
        "in process: Gram sums over {} candidates {:.3} s",
        cands.len(),
        t.elapsed().as_secs_f64()
    );
    let mut sources = vec![(
        format!("table {}", a.table),
        vec![PgSource::Table(a.table.clone())],
    )];
    if let Some((prefix, s)) = &a.partitions {
        let parts = (0..*s).map(|p| PgSource::Table(format!("{prefix}{p}")));
        sources.push((format!("{s} partitions {prefix}*"), parts.collect()));
    }
    for (name, shards) in sources {
        let pg = PgStats {
            pool: store.pool(),
            shards,
            items: &items,
            handle: rt.handle().clone(),
        };
        let t = Instant::now();
        let db_counts = pg.count_sums(&key, &c, 16)?;
        let tc = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let db_gram = pg.gram_sums(&key, &c, &cands)?;
        let tg = t.elapsed().as_secs_f64();
        let worst = (gram.upper.iter().zip(&db_gram.upper))
            .map(|(x, y)| (x - y).abs() / GramSums::tolerance(gram.users, x.max(*y)).max(1e-300))
            .fold(0.0f64, f64::max);
        println!(
            "PostgreSQL {name}: count sums {tc:.3} s (equal: {}), Gram sums and trace {tg:.3} s \
             (largest difference {worst:.3} of the tolerance; users {} vs {})",
            db_counts == counts,
            db_gram.users,
            gram.users
        );
    }
    Ok(())
}
