//! What continual release (tree aggregation, `dprec_dp::privacy::tree`) buys for the DP
//! popularity counts: MovieLens-100K replayed by time in `T` periods, the DP counts of
//! everything so far released at the end of every period, at user level
//! (eps_u, delta_u) over the whole stream.
//!
//! ```text
//! cargo run --example continual_bench -- [--data ../shared/datasets/ml-100k/u.data]
//!     [--periods 12,52,365] [--seeds 3] [--eps 10] [--delta 1e-6] [--cap 16] [--clip 4]
//!     [--plot crates/dprec-lab/notes/figures/continual-release.svg] [--gram K] [--gram-cap 16]
//!     [--gram-freeze 8]
//! ```
//!
//! `--gram K` adds a second table: EASE on a continual (tree) Gram over `K` frozen
//! candidates against EASE on the independent releases' averaged Gram ([`gram`]).
//!
//! Methods (all user level, the same plan):
//! - `service rule, independent`: what `dp-popularity` does now, release by release: the
//!   user's current ratings (a random subset of at most 256), row clipped to L2 norm 4,
//!   `N(0, (z_T 4)^2)` fresh per release, `z_T` for `T` composed releases;
//! - `arrival cap, independent`: the lifetime rule of `privacy::tree::ArrivalCap` (first
//!   `cap` distinct items in arrival order, fixed weight `min(1, clip / sqrt cap)`),
//!   fresh noise per release with the same `z_T`;
//! - `arrival cap, tree`: the same counts through `TreeCounter`, node multiplier
//!   `z_L` for `L = levels(T)` composed Gaussians;
//! - `service rule, independent, combined`: the first method's releases, each served as
//!   the counts filter's combination with the earlier ones
//!   (`dprec::model::history`, drift `1 / T`; post-processing, the same charges).
//!
//! Reported per `T`, mean (± sd) over seeds: the MSE per item of the released counts
//! against the method's own exact counts, averaged over periods; and the ranking quality
//! of the DP popularity list released at the end of period `t` for the users who rate in
//! period `t + 1` (relevant = their period-`t+1` ratings >= 4; items they rated before
//! excluded): NDCG@10 and P@10 averaged over users in a period, then over periods.

use std::path::PathBuf;

mod gram;

use dprec::model::history::{drift_for, CountHistory};
use dprec::train::topn::dp_topn::{DpTopN, ReleasePlan};
use dprec_dp::privacy::tree::{levels, ArrivalCap, TreeCounter};
use dprec_dp::rng::{seeded, split, DpRng};
use dprec_lab::eval::ranking::list_metrics;
use rand::seq::SliceRandom;

/// One rating of u.data (0-based ids).
#[derive(Clone, Copy)]
struct Event {
    user: u32,
    item: u32,
    value: f32,
    ts: u64,
}

struct Args {
    data: PathBuf,
    periods: Vec<u64>,
    seeds: u64,
    eps: f64,
    delta: f64,
    cap: usize,
    clip: f64,
    plot: Option<PathBuf>,
    gram: usize,
    gram_cap: usize,
    gram_freeze: usize,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut a = Args {
        data: "../shared/datasets/ml-100k/u.data".into(),
        periods: vec![12, 52, 365],
        seeds: 3,
        eps: 10.0,
        delta: 1e-6,
        cap: 16,
        clip: 4.0,
        plot: None,
        gram: 0,
        gram_cap: 16,
        gram_freeze: 8,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_default();
        match k.as_str() {
            "--data" => a.data = v.into(),
            "--periods" => {
                a.periods = v.split(',').map(str::parse).collect::<Result<_, _>>()?;
            }
            "--seeds" => a.seeds = v.parse()?,
            "--eps" => a.eps = v.parse()?,
            "--delta" => a.delta = v.parse()?,
            "--cap" => a.cap = v.parse()?,
            "--clip" => a.clip = v.parse()?,
            "--plot" => a.plot = Some(v.into()),
            "--gram" => a.gram = v.parse()?,
            "--gram-cap" => a.gram_cap = v.parse()?,
            "--gram-freeze" => a.gram_freeze = v.parse::<usize>()?.max(1),
            other => anyhow::bail!("unknown argument {other:?} (see the example's doc comment)"),
        }
    }
    Ok(a)
}

/// u.data: `user \t item \t rating \t timestamp`, 1-based ids; sorted by time (ties by
/// user, item: the arrival order).
fn load(path: &PathBuf) -> anyhow::Result<(Vec<Event>, usize, usize)> {
    let text = std::fs::read_to_string(path)?;
    let mut ev = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split('\t').collect();
        anyhow::ensure!(f.len() == 4, "bad line {line:?}");
        ev.push(Event {
            user: f[0].parse::<u32>()? - 1,
            item: f[1].parse::<u32>()? - 1,
            value: f[2].parse()?,
            ts: f[3].parse()?,
        });
    }
    ev.sort_by_key(|e| (e.ts, e.user, e.item));
    let n_users = ev.iter().map(|e| e.user as usize + 1).max().unwrap_or(0);
    let n_items = ev.iter().map(|e| e.item as usize + 1).max().unwrap_or(0);
    Ok((ev, n_users, n_items))
}

/// The ratings of each of `t_count` equal-width time periods (index 0 = period 1).
fn split_periods(ev: &[Event], t_count: u64) -> Vec<Vec<Event>> {
    let (t0, t1) = (ev[0].ts, ev[ev.len() - 1].ts);
    let width = (t1 - t0 + 1) as f64 / t_count as f64;
    let mut out = vec![Vec::new(); t_count as usize];
    for e in ev {
        let p = (((e.ts - t0) as f64 / width) as usize).min(t_count as usize - 1);
        out[p].push(*e);
    }
    out
}

/// Exact counts of the service rule at the end of a period: each user's ratings so far,
/// a uniformly random subset of at most `cap`, weight `min(1, count_clip / sqrt(n))`, with
/// `dp-topn`'s default contribution bounds.
fn service_exact(rows: &[Vec<u32>], n_items: usize, rng: &mut DpRng) -> Vec<f64> {
    let bounds = DpTopN::default().contribution;
    let mut c = vec![0.0; n_items];
    for row in rows.iter().filter(|r| !r.is_empty()) {
        let mut r = row.clone();
        if r.len() > bounds.cap {
            r.shuffle(rng);
            r.truncate(bounds.cap);
        }
        let w = (bounds.count_clip / (r.len() as f64).sqrt()).min(1.0);
        for &j in &r {
            c[j as usize] += w;
        }
    }
    c
}

/// The released counts of the four methods at the end of every period, with the exact
/// counts each estimates: `[(released, exact)]` per method, each a `T x n_items` list.
type Releases = Vec<(Vec<Vec<f64>>, Vec<Vec<f64>>)>;

fn release_all(
    periods: &[Vec<Event>],
    dims: (usize, usize),
    sig: (f64, f64, f64),
    a: &Args,
    seed: u64,
) -> anyhow::Result<Releases> {
    let (n_users, n_items) = dims;
    let (sig_service, sig_indep, sig_tree) = sig;
    let mut root = seeded(seed);
    let (mut r_cap, mut r_svc, mut r_ind, mut r_tree) = (
        split(&mut root),
        split(&mut root),
        split(&mut root),
        split(&mut root),
    );
    let mut rule = ArrivalCap::new(a.cap, a.clip)?;
    let mut tree = TreeCounter::new(periods.len() as u64, n_items, sig_tree)?;
    let mut rows = vec![Vec::new(); n_users];
    let mut capped = vec![0.0; n_items];
    let mut out: Releases = vec![(Vec::new(), Vec::new()); 3];
    for p in periods {
        let mut inc = vec![0.0; n_items];
        for e in p {
            rows[e.user as usize].push(e.item);
            inc[e.item as usize] += rule.admit(e.user, e.item);
        }
        capped.iter_mut().zip(&inc).for_each(|(c, x)| *c += x);
        let svc = service_exact(&rows, n_items, &mut r_cap);
        let noisy = |x: &[f64], s: f64, r: &mut DpRng| -> anyhow::Result<Vec<f64>> {
            x.iter()
                .map(|v| Ok(v + dprec_dp::privacy::gaussian(s, r)?))
                .collect()
        };
        out[0].0.push(noisy(&svc, sig_service, &mut r_svc)?);
        out[0].1.push(svc);
        out[1].0.push(noisy(&capped, sig_indep, &mut r_ind)?);
        out[1].1.push(capped.clone());
        out[2].0.push(tree.step(&inc, &mut r_tree)?);
        out[2].1.push(capped.clone());
    }
    let combined = combine(&out[0].0, sig_service, periods.len() as u64)?;
    out.push((combined, out[0].1.clone()));
    Ok(out)
}

/// Every release served as the counts filter's state after it (what the service serves
/// since the filter was added).
fn combine(released: &[Vec<f64>], sigma: f64, t_count: u64) -> anyhow::Result<Vec<Vec<f64>>> {
    let mut state: Option<CountHistory> = None;
    let mut out = Vec::with_capacity(released.len());
    for y in released {
        let next = CountHistory::update(state.as_ref(), "service", y, sigma, drift_for(t_count))?;
        out.push(next.mean.clone());
        state = Some(next);
    }
    Ok(out)
}

/// Mean over periods of the per-item mean squared error.
fn mse(released: &[Vec<f64>], exact: &[Vec<f64>]) -> f64 {
    let per: Vec<f64> = released
        .iter()
        .zip(exact)
        .map(|(r, e)| r.iter().zip(e).map(|(a, b)| (a - b).powi(2)).sum::<f64>() / r.len() as f64)
        .collect();
    per.iter().sum::<f64>() / per.len() as f64
}

/// What the ranking evaluation needs per period `t + 1`: each active user's relevant
/// items and the items that user rated in periods `<= t`.
struct NextPeriod {
    users: Vec<(Vec<usize>, Vec<bool>)>,
    /// How many of them had no rating before (cold start: the list is the bare DP list).
    cold: usize,
}

fn next_periods(periods: &[Vec<Event>], n_users: usize, n_items: usize) -> Vec<NextPeriod> {
    let mut seen = vec![vec![false; n_items]; n_users];
    let mut any = vec![false; n_users];
    let mut out = Vec::new();
    for (t, p) in periods.iter().enumerate() {
        if t > 0 {
            let mut rel: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
            for e in p.iter().filter(|e| e.value >= 4.0) {
                rel.entry(e.user).or_default().push(e.item as usize);
            }
            let cold = rel.keys().filter(|&&u| !any[u as usize]).count();
            let users = rel
                .into_iter()
                .map(|(u, r)| (r, seen[u as usize].clone()))
                .collect();
            out.push(NextPeriod { users, cold });
        }
        for e in p {
            seen[e.user as usize][e.item as usize] = true;
            any[e.user as usize] = true;
        }
    }
    out
}

/// NDCG@10 and P@10 of the lists from `released[t]` for the users of period `t + 1`,
/// mean over users, then over the periods with at least one such user.
fn ranking(released: &[Vec<f64>], next: &[NextPeriod]) -> (f64, f64) {
    let (mut ndcg, mut prec, mut n) = (0.0, 0.0, 0usize);
    for (scores, np) in released.iter().zip(next) {
        if np.users.is_empty() {
            continue;
        }
        let mut order: Vec<usize> = (0..scores.len()).collect();
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        let (mut g, mut p) = (0.0, 0.0);
        for (rel, seen) in &np.users {
            let list: Vec<usize> = order
                .iter()
                .copied()
                .filter(|&j| !seen[j])
                .take(10)
                .collect();
            let (pr, _, nd) = list_metrics(&list, rel, 10);
            g += nd;
            p += pr;
        }
        ndcg += g / np.users.len() as f64;
        prec += p / np.users.len() as f64;
        n += 1;
    }
    (ndcg / n as f64, prec / n as f64)
}

/// Mean and sample sd.
fn mean_sd(x: &[f64]) -> (f64, f64) {
    let m = x.iter().sum::<f64>() / x.len() as f64;
    let v = x.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (x.len().max(2) - 1) as f64;
    (m, v.sqrt())
}

const METHODS: [&str; 4] = [
    "service rule (cap 256, clip 4), independent",
    "arrival cap, independent",
    "arrival cap, tree",
    "service rule, independent, combined across releases",
];

/// One row of the results: per method (mse, ndcg, p10) mean and sd over seeds.
struct Row {
    t: u64,
    levels: u32,
    z_t: f64,
    z_l: f64,
    stats: Vec<[(f64, f64); 3]>,
    exact: [(f64, f64); 2],
}

fn run_t(ev: &[Event], dims: (usize, usize), t_count: u64, a: &Args) -> anyhow::Result<Row> {
    let plan = ReleasePlan {
        eps_u: a.eps,
        delta_u: a.delta,
        releases: t_count,
    };
    let (z_t, z_l) = (plan.noise_multiplier()?, plan.tree_noise_multiplier()?);
    let sig = (z_t * 4.0, z_t * a.clip, z_l * a.clip);
    let periods = split_periods(ev, t_count);
    let next = next_periods(&periods, dims.0, dims.1);
    let mut per_seed: Vec<Vec<[f64; 3]>> = vec![Vec::new(); METHODS.len()];
    let mut exact = [(0.0, 0.0); 2];
    for seed in 0..a.seeds {
        let rel = release_all(&periods, dims, sig, a, seed)?;
        for (m, (released, ex)) in rel.iter().enumerate() {
            let (nd, p) = ranking(released, &next);
            per_seed[m].push([mse(released, ex), nd, p]);
        }
        // Noise-free references: the service rule's and the arrival cap's exact counts.
        exact = [ranking(&rel[0].1, &next), ranking(&rel[1].1, &next)];
    }
    let stats = per_seed
        .iter()
        .map(|s| {
            let col = |k: usize| mean_sd(&s.iter().map(|r| r[k]).collect::<Vec<_>>());
            [col(0), col(1), col(2)]
        })
        .collect();
    let users: usize = next.iter().map(|n| n.users.len()).sum();
    let cold: usize = next.iter().map(|n| n.cold).sum();
    let active = periods.iter().filter(|p| !p.is_empty()).count();
    println!(
        "T = {t_count}: {active} periods with ratings; {users} (period, user) pairs evaluated, \
         {cold} of them ({:.0}%) with no earlier rating",
        100.0 * cold as f64 / users.max(1) as f64
    );
    Ok(Row {
        t: t_count,
        levels: levels(t_count)?,
        z_t,
        z_l,
        stats,
        exact,
    })
}

fn print_rows(rows: &[Row], a: &Args) {
    println!(
        "\neps_u {}, delta_u {}, arrival cap {} (weight {:.3}), clip {}, seeds 0..{}\n",
        a.eps,
        a.delta,
        a.cap,
        (a.clip / (a.cap as f64).sqrt()).min(1.0),
        a.clip,
        a.seeds
    );
    println!("| T | method | multiplier | MSE per item (± sd) | NDCG@10 (± sd) | P@10 |");
    println!("| --- | --- | --- | --- | --- | --- |");
    for r in rows {
        for (m, s) in r.stats.iter().enumerate() {
            let z = if m == 2 {
                format!("z_L = {:.3} (L = {})", r.z_l, r.levels)
            } else {
                format!("z_T = {:.3}", r.z_t)
            };
            println!(
                "| {} | {} | {z} | {:.1} ± {:.1} | {:.4} ± {:.4} | {:.4} |",
                r.t, METHODS[m], s[0].0, s[0].1, s[1].0, s[1].1, s[2].0
            );
        }
        for (name, (nd, p)) in ["service rule", "arrival cap"].iter().zip(r.exact) {
            println!(
                "| {} | {name}, exact counts (no noise) | | 0 | {nd:.4} | {p:.4} |",
                r.t
            );
        }
    }
}

fn main() -> anyhow::Result<()> {
    let a = parse_args()?;
    let (ev, n_users, n_items) = load(&a.data)?;
    println!("{} ratings, {n_users} users, {n_items} items", ev.len());
    let rows = a
        .periods
        .iter()
        .map(|&t| run_t(&ev, (n_users, n_items), t, &a))
        .collect::<anyhow::Result<Vec<_>>>()?;
    print_rows(&rows, &a);
    if let Some(path) = &a.plot {
        plot(&rows, path)?;
        println!("\nplot: {}", path.display());
    }
    if a.gram > 0 {
        gram_table(&ev, (n_users, n_items), &a)?;
    }
    Ok(())
}

/// The `--gram` comparison per `T`, mean ± sd over the seeds.
fn gram_table(ev: &[Event], dims: (usize, usize), a: &Args) -> anyhow::Result<()> {
    println!(
        "\n--gram {}: EASE over {} candidates frozen at period ceil(T / {}), counts share 0.3, \
         gram cap {}\n",
        a.gram, a.gram, a.gram_freeze, a.gram_cap
    );
    println!(
        "| T | tree: counts + Gram | independent: counts + averaged Gram | exact Gram (tree's set) \
         | exact Gram, set re-chosen each period | tree counts alone | independent counts alone |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for &t in &a.periods {
        let plan = ReleasePlan {
            eps_u: a.eps,
            delta_u: a.delta,
            releases: t,
        };
        let z = (plan.noise_multiplier()?, plan.tree_noise_multiplier()?);
        let periods = split_periods(ev, t);
        let rows = (0..a.seeds)
            .map(|s| {
                gram::run(
                    &periods,
                    dims,
                    a.gram,
                    z,
                    a.cap,
                    a.clip,
                    a.gram_cap,
                    a.gram_freeze,
                    s,
                )
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let col = |f: fn(&gram::GramRow) -> f64| {
            let (m, sd) = mean_sd(&rows.iter().map(f).collect::<Vec<_>>());
            format!("{m:.4} ± {sd:.4}")
        };
        println!(
            "| {t} | {} | {} | {} | {} | {} | {} |",
            col(|r| r.tree),
            col(|r| r.independent),
            col(|r| r.exact),
            col(|r| r.exact_rechosen),
            col(|r| r.tree_counts_only),
            col(|r| r.independent_counts_only)
        );
    }
    Ok(())
}

const COLORS: [plotters::style::RGBColor; 4] = [
    plotters::style::RGBColor(31, 119, 180),
    plotters::style::RGBColor(214, 39, 40),
    plotters::style::RGBColor(44, 160, 44),
    plotters::style::RGBColor(148, 103, 189),
];

/// One line per method with ± 1 sd error bars, into chart `$c`, metric column `$k`.
macro_rules! draw_lines {
    ($c:ident, $rows:expr, $k:expr) => {
        for (m, name) in METHODS.iter().enumerate() {
            let color = COLORS[m];
            let pts: Vec<(f64, f64, f64)> = $rows
                .iter()
                .map(|r| (r.t as f64, r.stats[m][$k].0, r.stats[m][$k].1))
                .collect();
            $c.draw_series(LineSeries::new(
                pts.iter().map(|p| (p.0, p.1)),
                color.stroke_width(2),
            ))?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            $c.draw_series(pts.iter().map(|p| {
                ErrorBar::new_vertical(p.0, p.1 - p.2, p.1, p.1 + p.2, color.filled(), 6)
            }))?;
            $c.draw_series(
                pts.iter()
                    .map(|p| Circle::new((p.0, p.1), 3, color.filled())),
            )?;
        }
    };
}

/// Two panels against T (log scale): MSE per item (log scale) and NDCG@10, one line per
/// method, ± 1 sd over seeds as error bars.
fn plot(rows: &[Row], path: &PathBuf) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1000, 450)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(500);
    let (t0, t1) = (rows[0].t as f64 * 0.7, rows[rows.len() - 1].t as f64 * 1.4);
    for (panel, k) in [(left, 0usize), (right, 1usize)] {
        let ys = rows.iter().flat_map(|r| r.stats.iter().map(move |s| s[k]));
        let lo = ys.clone().map(|(m, s)| m - s).fold(f64::INFINITY, f64::min);
        let hi = ys.map(|(m, s)| m + s).fold(f64::NEG_INFINITY, f64::max);
        let mut b = ChartBuilder::on(&panel);
        b.caption(
            ["MSE per item vs exact", "NDCG@10, next period"][k],
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60);
        let desc = [
            "MSE (log scale, mean ± sd over seeds)",
            "NDCG@10 (mean ± sd over seeds)",
        ][k];
        if k == 0 {
            let mut c =
                b.build_cartesian_2d((t0..t1).log_scale(), (lo * 0.7..hi * 1.5).log_scale())?;
            c.configure_mesh()
                .x_desc("periods T (log scale)")
                .y_desc(desc)
                .draw()?;
            draw_lines!(c, rows, k);
            c.configure_series_labels()
                .background_style(WHITE)
                .border_style(BLACK)
                .draw()?;
        } else {
            let pad = (hi - lo) * 0.15;
            let mut c = b.build_cartesian_2d((t0..t1).log_scale(), (lo - pad)..(hi + 4.0 * pad))?;
            c.configure_mesh()
                .x_desc("periods T (log scale)")
                .y_desc(desc)
                .draw()?;
            draw_lines!(c, rows, k);
        }
    }
    root.present()?;
    Ok(())
}
