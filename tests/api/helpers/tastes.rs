//! Two-taste rating data and the short-plan `dp-topn` settings shared by the API tests
//! of the served default (topn, catalogue) and of the neighbourhood model (nbm).

use std::collections::BTreeMap;

use dprec::config::Settings;

/// Ratings `(user, item, value)` for training, and one held-out `(user, item)` per user.
pub struct Tastes {
    pub train: Vec<(String, String, f64)>,
    pub test: Vec<(String, String)>,
}

/// Two tastes over `2 * n_items` items: even users like `a0..`, odd users `b0..`. User u
/// (`user000`, ...) rates `liked` distinct items of its own taste 5 and one item of the
/// other taste `low`; with `held_out`, one more item of its own taste is drawn and kept
/// as its test item. Deterministic: an LCG started at `seed`.
pub fn tastes(
    seed: u64,
    n_users: usize,
    n_items: usize,
    liked: usize,
    held_out: bool,
    low: f64,
) -> Tastes {
    let mut state = seed;
    let mut next = |m: usize| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((state >> 33) as usize) % m
    };
    let (mut train, mut test) = (Vec::new(), Vec::new());
    for u in 0..n_users {
        let (own, other) = if u % 2 == 0 { ("a", "b") } else { ("b", "a") };
        let user = format!("user{u:03}");
        let mut picked: Vec<usize> = Vec::new();
        while picked.len() < liked + usize::from(held_out) {
            let j = next(n_items);
            if !picked.contains(&j) {
                picked.push(j);
            }
        }
        for &j in &picked[..liked] {
            train.push((user.clone(), format!("{own}{j}"), 5.0));
        }
        train.push((user.clone(), format!("{other}{}", next(n_items)), low));
        if held_out {
            test.push((user, format!("{own}{}", picked[liked])));
        }
    }
    Tastes { train, test }
}

/// The served default `dp-topn` with a short lifetime plan (4 releases, user eps 20), so
/// that a few hundred users give DP candidates and a model with structure.
pub fn topn_settings(url: &str) -> Settings {
    let mut s = super::settings(url);
    s.trainer.name = "dp-topn".into();
    s.budget.planned_releases = 4;
    s.budget.default_user_eps = 20.0;
    s.budget.max_user_eps = 20.0;
    s.budget.share = "fraction:1".parse().unwrap();
    s.trainer.params = BTreeMap::from([
        ("releases".to_string(), "4".to_string()),
        ("eps".to_string(), "20".to_string()),
        ("count_clip".to_string(), "1".to_string()),
        ("k".to_string(), "20".to_string()),
        // These services test the Gram path (personal lists, Gram neighbours); at 200
        // users the default selecting split would serve counts
        // (`default_split_on_a_small_store_serves_dp_popularity`).
        ("split".to_string(), "gram".to_string()),
    ]);
    s
}
