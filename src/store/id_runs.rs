//! Sets of rating ids as runs of consecutive ids: the stored form of a charge set
//! (`rating_charge_sets.rating_ids`, "4-9,12,15-20"). Ratings imported together get
//! consecutive ids, so a user's charged ratings are usually one or a few runs.

/// Inclusive runs of consecutive ids, ascending.
pub type Runs = Vec<(i64, i64)>;

/// The maximal runs of `ids` (any order, duplicates allowed).
pub fn runs_of(ids: impl IntoIterator<Item = i64>) -> Runs {
    let mut ids: Vec<i64> = ids.into_iter().collect();
    ids.sort_unstable();
    ids.dedup();
    let mut out: Runs = Vec::new();
    for id in ids {
        match out.last_mut() {
            Some((_, b)) if *b + 1 == id => *b = id,
            _ => out.push((id, id)),
        }
    }
    out
}

/// How many ids `runs` holds.
pub fn count(runs: &[(i64, i64)]) -> i64 {
    runs.iter().map(|(a, b)| b - a + 1).sum()
}

/// The stored text: `a-b` for a run, `a` for a single id, comma-separated.
pub fn encode(runs: &[(i64, i64)]) -> String {
    let mut out = String::with_capacity(runs.len() * 12);
    for (k, &(a, b)) in runs.iter().enumerate() {
        if k > 0 {
            out.push(',');
        }
        if a == b {
            out.push_str(&a.to_string());
        } else {
            out.push_str(&format!("{a}-{b}"));
        }
    }
    out
}

/// Parses [`encode`]'s text; `None` on anything else (ids are positive).
pub fn decode(text: &str) -> Option<Runs> {
    if text.is_empty() {
        return Some(Vec::new());
    }
    text.split(',')
        .map(|part| {
            let (a, b) = match part.split_once('-') {
                Some((a, b)) => (a.parse().ok()?, b.parse().ok()?),
                None => {
                    let a: i64 = part.parse().ok()?;
                    (a, a)
                }
            };
            (a <= b).then_some((a, b))
        })
        .collect()
}

/// Every id of `runs`, ascending.
pub fn ids(runs: &[(i64, i64)]) -> impl Iterator<Item = i64> + '_ {
    runs.iter().flat_map(|&(a, b)| a..=b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_maximal_and_exact() {
        let r = runs_of([9, 4, 5, 6, 12, 7, 8, 15, 16, 4]);
        assert_eq!(r, vec![(4, 9), (12, 12), (15, 16)]);
        assert_eq!(count(&r), 9);
        assert_eq!(
            ids(&r).collect::<Vec<_>>(),
            vec![4, 5, 6, 7, 8, 9, 12, 15, 16]
        );
        assert!(runs_of([]).is_empty());
    }

    #[test]
    fn text_round_trips_and_rejects_garbage() {
        let r = vec![(4, 9), (12, 12), (15, 20)];
        assert_eq!(encode(&r), "4-9,12,15-20");
        assert_eq!(decode("4-9,12,15-20"), Some(r));
        assert_eq!(decode(""), Some(vec![]));
        for bad in ["4-", "x", "9-4", "1,,2", "1-2-3"] {
            assert_eq!(decode(bad), None, "{bad}");
        }
    }
}
