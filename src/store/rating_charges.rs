//! A release's rating charges as the commit writes them: grouped by user, then by charge,
//! each group one charge with the ids of its ratings. At 20M charged ratings a row per
//! rating (id, user, three charges: 48 bytes) was 960 MB and set the release's peak
//! (issue 22, lab note bench-02); grouped, a charged rating is its 8-byte id.

use std::sync::Arc;

/// One rating's charge in a release.
#[derive(Debug, Clone, PartialEq)]
pub struct RatingChargeRow {
    pub rating_id: i64,
    /// Shared with the user's other rows (one allocation per user).
    pub user: Arc<str>,
    /// Pure eps the trainer charged.
    pub eps_train: f64,
    pub eps_popularity: f64,
    /// Gaussian part the trainer charged (zCDP `rho`, [`dprec_dp::ledger::rating_loss`]).
    pub rho: f64,
}

impl RatingChargeRow {
    /// The pure eps of the charge (the Gaussian part is `rho`).
    pub fn total(&self) -> f64 {
        self.eps_train + self.eps_popularity
    }
}

/// What one rating is charged: pure eps (trainer, popularity) and a Gaussian part.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Charge {
    pub eps_train: f64,
    pub eps_popularity: f64,
    pub rho: f64,
}

impl Charge {
    /// Exact identity (bit patterns), the key ratings are grouped by.
    pub fn bits(&self) -> [u64; 3] {
        [self.eps_train, self.eps_popularity, self.rho].map(f64::to_bits)
    }

    /// Whether anything is charged.
    pub fn is_charge(&self) -> bool {
        self.eps_train + self.eps_popularity > 0.0 || self.rho > 0.0
    }
}

/// The ledger state a charged rating was planned from (the snapshot's, pending charges
/// folded in): with it the commit re-checks a charge without reading the rating's row
/// when nothing has been committed since the snapshot (`store::releases`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Before {
    pub eps: f64,
    pub spent: f64,
    pub rho: f64,
}

/// One user's ratings charged the same (from the same planned state, where known).
#[derive(Debug, Clone, PartialEq)]
struct Group {
    user: Arc<str>,
    charge: Charge,
    before: Option<Before>,
    /// End of the group's ids in [`RatingCharges::ids`] (its start is the previous end).
    end: usize,
}

/// A release's rating charges in user order (then charge, then as pushed): the order the
/// commit locks in. Two rows of one user with the same charge share a group only when
/// pushed one after the other; [`RatingCharges::from_rows`] sorts first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RatingCharges {
    groups: Vec<Group>,
    ids: Vec<i64>,
}

impl RatingCharges {
    /// Room for `ratings` charged ratings.
    pub fn with_capacity(ratings: usize) -> Self {
        Self {
            groups: Vec::new(),
            ids: Vec::with_capacity(ratings),
        }
    }

    /// The rows grouped: sorted by (user, charge, rating id).
    pub fn from_rows(rows: impl IntoIterator<Item = RatingChargeRow>) -> Self {
        let mut rows: Vec<RatingChargeRow> = rows.into_iter().collect();
        rows.sort_by(|a, b| {
            let charge = |c: &RatingChargeRow| [c.eps_train, c.eps_popularity, c.rho];
            (&a.user, charge(a).map(f64::to_bits), a.rating_id).cmp(&(
                &b.user,
                charge(b).map(f64::to_bits),
                b.rating_id,
            ))
        });
        let mut out = Self::with_capacity(rows.len());
        for r in rows {
            let charge = Charge {
                eps_train: r.eps_train,
                eps_popularity: r.eps_popularity,
                rho: r.rho,
            };
            out.push(&r.user, charge, r.rating_id);
        }
        out
    }

    /// Charged ratings that come in any user order, grouped without a row per rating:
    /// `entries()` yields each charged rating's (user index into `users`, rating id, index
    /// into `charges`) and is called twice (count, then place: a counting sort by user,
    /// stable, so a user's ratings keep their order within a charge). `users` must be
    /// sorted (the lock order).
    pub fn by_user<F, I, S>(users: &[S], charges: &[Charge], entries: F) -> Self
    where
        S: AsRef<str>,
        F: Fn() -> I,
        I: Iterator<Item = (u32, i64, u32)>,
    {
        Self::by_user_from(users, charges, &[], entries)
    }

    /// [`RatingCharges::by_user`] with the planned state of each charge index
    /// (`befores[c]` for `charges[c]`; none where `befores` is shorter).
    pub fn by_user_from<F, I, S>(
        users: &[S],
        charges: &[Charge],
        befores: &[Before],
        entries: F,
    ) -> Self
    where
        S: AsRef<str>,
        F: Fn() -> I,
        I: Iterator<Item = (u32, i64, u32)>,
    {
        let mut start = vec![0usize; users.len() + 1];
        for (u, _, _) in entries() {
            start[u as usize + 1] += 1;
        }
        for u in 0..users.len() {
            start[u + 1] += start[u];
        }
        let n = start[users.len()];
        let (mut ids, mut codes) = (vec![0i64; n], vec![0u32; n]);
        let mut next = start.clone();
        for (u, id, c) in entries() {
            let slot = &mut next[u as usize];
            (ids[*slot], codes[*slot]) = (id, c);
            *slot += 1;
        }
        let mut groups = Vec::new();
        let mut pairs: Vec<(u32, i64)> = Vec::new();
        for (u, name) in users.iter().enumerate() {
            let (a, b) = (start[u], start[u + 1]);
            if a == b {
                continue;
            }
            let user: Arc<str> = Arc::from(name.as_ref());
            let (seg_ids, seg_codes) = (&mut ids[a..b], &mut codes[a..b]);
            if seg_codes.windows(2).any(|w| w[0] != w[1]) {
                // Several charges for this user: by charge, stable (one user's few ratings).
                pairs.clear();
                pairs.extend(seg_codes.iter().copied().zip(seg_ids.iter().copied()));
                pairs.sort_by_key(|&(c, _)| c);
                for (k, &(c, id)) in pairs.iter().enumerate() {
                    (seg_codes[k], seg_ids[k]) = (c, id);
                }
            }
            for k in a..b {
                if k + 1 == b || codes[k + 1] != codes[k] {
                    groups.push(Group {
                        user: user.clone(),
                        charge: charges[codes[k] as usize],
                        before: befores.get(codes[k] as usize).copied(),
                        end: k + 1,
                    });
                }
            }
        }
        Self { groups, ids }
    }

    /// Appends a charged rating; it joins the last group if that is the same user's with
    /// the same charge. Users must come in order (not checked here: the commit's lock
    /// order relies on it, so builders sort).
    pub fn push(&mut self, user: &Arc<str>, charge: Charge, rating_id: i64) {
        self.ids.push(rating_id);
        match self.groups.last_mut() {
            Some(g)
                if g.user == *user && g.charge.bits() == charge.bits() && g.before.is_none() =>
            {
                g.end += 1
            }
            _ => self.groups.push(Group {
                user: user.clone(),
                charge,
                before: None,
                end: self.ids.len(),
            }),
        }
    }

    /// Charged ratings.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Whether the users come in order (each user's groups together): the commit's lock
    /// order relies on it and refuses charges that are not.
    pub fn users_in_order(&self) -> bool {
        self.groups.windows(2).all(|w| w[0].user <= w[1].user)
    }

    /// Distinct (user, charge) groups.
    pub fn groups(&self) -> usize {
        self.groups.len()
    }

    /// The Gaussian part all the charges add up to (zCDP `rho`).
    pub fn total_rho(&self) -> f64 {
        let mut start = 0;
        let mut sum = 0.0;
        for g in &self.groups {
            sum += g.charge.rho * (g.end - start) as f64;
            start = g.end;
        }
        sum
    }

    /// The pure eps all the charges add up to.
    pub fn total_eps(&self) -> f64 {
        let mut start = 0;
        let mut sum = 0.0;
        for g in &self.groups {
            sum += (g.charge.eps_train + g.charge.eps_popularity) * (g.end - start) as f64;
            start = g.end;
        }
        sum
    }

    /// The charges of positions `range` (in order) as rows.
    pub fn rows(
        &self,
        range: std::ops::Range<usize>,
    ) -> impl Iterator<Item = RatingChargeRow> + '_ {
        self.rows_from(range).map(|(row, _)| row)
    }

    /// [`RatingCharges::rows`] with each one's planned state, where known.
    pub fn rows_from(
        &self,
        range: std::ops::Range<usize>,
    ) -> impl Iterator<Item = (RatingChargeRow, Option<Before>)> + '_ {
        // The group holding `range.start`: the first whose end is past it.
        let mut g = self.groups.partition_point(|g| g.end <= range.start);
        range.map(move |k| {
            while self.groups[g].end <= k {
                g += 1;
            }
            let group = &self.groups[g];
            let row = RatingChargeRow {
                rating_id: self.ids[k],
                user: group.user.clone(),
                eps_train: group.charge.eps_train,
                eps_popularity: group.charge.eps_popularity,
                rho: group.charge.rho,
            };
            (row, group.before)
        })
    }

    /// The users of the charges of positions `range`, in order, each once.
    pub fn users_of(&self, range: std::ops::Range<usize>) -> impl Iterator<Item = &str> + '_ {
        let first = self.groups.partition_point(|g| g.end <= range.start);
        let last = self.groups.partition_point(|g| g.end < range.end);
        let groups = if range.is_empty() {
            &self.groups[0..0]
        } else {
            &self.groups[first..=last]
        };
        let mut previous: Option<&str> = None;
        groups.iter().filter_map(move |g| {
            let user = &*g.user;
            (previous.replace(user) != Some(user)).then_some(user)
        })
    }

    /// Every charge as a row, in order.
    pub fn all_rows(&self) -> impl Iterator<Item = RatingChargeRow> + '_ {
        self.rows(0..self.len())
    }
}

impl FromIterator<RatingChargeRow> for RatingCharges {
    fn from_iter<I: IntoIterator<Item = RatingChargeRow>>(rows: I) -> Self {
        Self::from_rows(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, user: &str, rho: f64) -> RatingChargeRow {
        RatingChargeRow {
            rating_id: id,
            user: user.into(),
            eps_train: 0.0,
            eps_popularity: if id % 3 == 0 { 0.5 } else { 0.0 },
            rho,
        }
    }

    /// Grouping keeps every charge once, in (user, charge, id) order, with as many groups
    /// as distinct (user, charge) pairs; any range reads back the same rows.
    #[test]
    fn grouped_charges_read_back_every_row() {
        let rows = vec![
            row(9, "b", 0.1),
            row(1, "a", 0.1),
            row(3, "a", 0.1),
            row(4, "b", 0.2),
            row(2, "a", 0.1),
            row(7, "c", 0.1),
            row(5, "b", 0.1),
        ];
        let c = RatingCharges::from_rows(rows.clone());
        assert_eq!(c.len(), 7);
        // By (eps_train, eps_popularity, rho): a: {1, 2} rho 0.1, {3} rho 0.1 + 0.5
        // popularity; b: {5} rho 0.1, {4} rho 0.2, {9} rho 0.1 + 0.5 popularity; c: {7}.
        assert_eq!(c.groups(), 6);
        let ids: Vec<i64> = c.all_rows().map(|r| r.rating_id).collect();
        assert_eq!(ids, vec![1, 2, 3, 5, 4, 9, 7]);
        let mut want = rows.clone();
        want.sort_by_key(|r| r.rating_id);
        let mut got: Vec<RatingChargeRow> = c.all_rows().collect();
        got.sort_by_key(|r| r.rating_id);
        assert_eq!(got, want);
        for a in 0..=c.len() {
            for b in a..=c.len() {
                let part: Vec<RatingChargeRow> = c.rows(a..b).collect();
                let whole: Vec<RatingChargeRow> = c.all_rows().skip(a).take(b - a).collect();
                assert_eq!(part, whole, "{a}..{b}");
                let mut users: Vec<String> = part.iter().map(|r| r.user.to_string()).collect();
                users.dedup();
                assert_eq!(c.users_of(a..b).collect::<Vec<_>>(), users, "{a}..{b}");
            }
        }
        let total: f64 = rows.iter().map(RatingChargeRow::total).sum();
        assert_eq!(c.total_eps(), total);
        assert!(RatingCharges::default().all_rows().next().is_none());
    }

    /// Grouping by user index equals sorting the rows, whatever order they come in.
    #[test]
    fn grouping_by_user_index_equals_sorting_the_rows() {
        let users: Vec<Arc<str>> = ["a", "b", "c", "d"].map(Arc::from).to_vec();
        let g = |rho| Charge {
            eps_train: 0.0,
            eps_popularity: 0.25,
            rho,
        };
        let charges = [g(0.1), g(0.3), g(0.2)];
        // (user, id, charge) in id order, users interleaved, user "c" charged nothing.
        let entries = [
            (1, 1, 0),
            (0, 2, 0),
            (3, 3, 2),
            (1, 4, 1),
            (0, 5, 0),
            (1, 6, 0),
            (3, 7, 0),
            (1, 8, 1),
        ];
        let grouped = RatingCharges::by_user(&users, &charges, || entries.iter().copied());
        let rows = entries.iter().map(|&(u, id, c)| RatingChargeRow {
            rating_id: id,
            user: users[u as usize].clone(),
            eps_train: 0.0,
            eps_popularity: 0.25,
            rho: charges[c as usize].rho,
        });
        let sorted = RatingCharges::from_rows(rows);
        // b's charges 0.1 then 0.3 (`from_rows` sorts by value; `by_user` by first use:
        // equal here), d's 0.2 (code 2) after 0.1 (code 0) in code order.
        let key = |c: &RatingCharges| {
            let mut v: Vec<(String, i64, u64)> = c
                .all_rows()
                .map(|r| (r.user.to_string(), r.rating_id, r.rho.to_bits()))
                .collect();
            v.sort();
            v
        };
        assert_eq!(key(&grouped), key(&sorted));
        assert_eq!(grouped.groups(), sorted.groups());
        assert_eq!(grouped.groups(), 5, "a 0.1, b 0.1, b 0.3, d 0.1, d 0.2");
        let users_in_order: Vec<String> = grouped.all_rows().map(|r| r.user.to_string()).collect();
        let mut sorted_users = users_in_order.clone();
        sorted_users.sort();
        assert_eq!(users_in_order, sorted_users, "user order (the lock order)");
        assert!(grouped.users_in_order() && sorted.users_in_order());
        let d: Vec<i64> = grouped
            .all_rows()
            .filter(|r| &*r.user == "d")
            .map(|r| r.rating_id)
            .collect();
        assert_eq!(d, vec![7, 3], "by charge code, then as they came");
        assert!(RatingCharges::by_user(&users, &charges, std::iter::empty).is_empty());
    }

    /// A push joins the last group only for the same user and exactly the same charge.
    #[test]
    fn a_push_joins_only_the_same_users_same_charge() {
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let g = |rho| Charge {
            eps_train: 0.0,
            eps_popularity: 0.0,
            rho,
        };
        let mut c = RatingCharges::default();
        c.push(&a, g(0.1), 1);
        c.push(&a, g(0.1), 2);
        assert_eq!(c.groups(), 1);
        c.push(&a, g(0.2), 3);
        c.push(&a, g(0.1), 4);
        c.push(&b, g(0.1), 5);
        assert_eq!(
            c.groups(),
            4,
            "a 0.1 {{1, 2}}, a 0.2 {{3}}, a 0.1 {{4}}, b 0.1 {{5}}"
        );
        assert_eq!(c.len(), 5);
        assert!(c.users_in_order());
        c.push(&a, g(0.1), 6);
        assert!(!c.users_in_order(), "a after b");
        assert!(!g(0.0).is_charge() && g(1e-300).is_charge());
    }
}
