//! The privacy ledger (DESIGN 3-4).
//!
//! This module is the pure budget arithmetic (no I/O): the per-release share of a
//! rating's eps_ij ([`SharePolicy`], [`release_share`]), the exact spend check
//! ([`fits`]), the per-user RDP cost of a release ([`user_cost`]) and the admission plan
//! of a release ([`plan`]). The transaction that records a release re-checks these with the
//! stored state; its SQL lives with the store (`crate::store::commit_release`).
//! The semantics are written down in docs/LEDGER.md.

use std::collections::BTreeMap;

use crate::accountant::{
    compose_events, default_orders, AccountantError, PrivacyEvent, RdpCurve, RenyiFilter,
};

/// How much of a rating's lifetime eps_ij one release may spend.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SharePolicy {
    /// `F * eps_ij` per release (capped by what remains), `0 < F <= 1`.
    Fraction(f64),
    /// `eps_ij / K` per release: at most K releases.
    Split(u32),
}

impl SharePolicy {
    /// Parses `fraction:F` or `split:K`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let (kind, arg) = s
            .split_once(':')
            .ok_or_else(|| format!("{s:?}: expected fraction:F or split:K"))?;
        match kind.trim() {
            "fraction" => {
                let f: f64 = arg
                    .trim()
                    .parse()
                    .map_err(|_| format!("{arg:?} is not a number"))?;
                if !(f > 0.0 && f <= 1.0) {
                    return Err(format!("fraction {f} must be in (0, 1]"));
                }
                Ok(Self::Fraction(f))
            }
            "split" => {
                let k: u32 = arg
                    .trim()
                    .parse()
                    .map_err(|_| format!("{arg:?} is not a positive integer"))?;
                if k == 0 {
                    return Err("split:K needs K >= 1".into());
                }
                Ok(Self::Split(k))
            }
            other => Err(format!("unknown share policy {other:?}")),
        }
    }

    /// The share one release wants of a rating with lifetime budget `eps`.
    pub fn want(&self, eps: f64) -> f64 {
        match *self {
            Self::Fraction(f) => f * eps,
            Self::Split(k) => eps / k as f64,
        }
    }
}

/// Whether charging `charge` on top of `spent` keeps the rating within `eps`, in the
/// floating-point arithmetic that the ledger stores (no tolerance).
pub fn fits(eps: f64, spent: f64, charge: f64) -> bool {
    charge.is_finite() && charge >= 0.0 && spent + charge <= eps
}

/// The share of a rating this release may spend: the policy's share capped by what
/// remains, rounded down until `spent + share <= eps` holds exactly. `None` when less
/// than `min_eps` remains (the rating is exhausted and takes no part).
pub fn release_share(policy: SharePolicy, eps: f64, spent: f64, min_eps: f64) -> Option<f64> {
    let remaining = eps - spent;
    if remaining.is_nan() || remaining < min_eps {
        return None;
    }
    let mut share = policy.want(eps).min(remaining);
    while share > 0.0 && !fits(eps, spent, share) {
        share = f64::from_bits(share.to_bits() - 1);
    }
    (share >= min_eps).then_some(share)
}

/// The pure-DP charges of one user's ratings as privacy events, equal amounts grouped.
pub fn pure_events(charges: impl IntoIterator<Item = f64>) -> Vec<PrivacyEvent> {
    let mut by_bits: BTreeMap<u64, u64> = BTreeMap::new();
    for c in charges {
        if c > 0.0 {
            *by_bits.entry(c.to_bits()).or_default() += 1;
        }
    }
    by_bits
        .into_iter()
        .map(|(bits, count)| PrivacyEvent::PureDp {
            eps: f64::from_bits(bits),
            count,
        })
        .collect()
}

/// The largest share among a user's admitted ratings (none when no share is positive).
fn max_share(admitted: &[Admitted]) -> Option<f64> {
    admitted
        .iter()
        .map(|a| a.share)
        .filter(|s| *s > 0.0)
        .max_by(f64::total_cmp)
}

/// Completes one user's charges of a release (unit: one rating). `events` are the
/// trainer's events for the user; `max_train` is the largest trainer charge among the
/// user's ratings, `popularity` the popularity eps if any of them was counted (0 if not).
///
/// The trainer's pure-DP user events must add up to at least `max_train` (the
/// `ReleaseCharges` contract); if they do not, that rating's amount is charged as one more
/// `PureDp` rather than trusting them. The popularity release is charged once: each rating
/// is in at most one count.
pub fn complete_user_events(events: &mut Vec<PrivacyEvent>, max_train: f64, popularity: f64) {
    let reported: f64 = events
        .iter()
        .map(|e| match e {
            PrivacyEvent::PureDp { eps, count } => eps * *count as f64,
            _ => 0.0,
        })
        .sum();
    if reported + 1e-12 < max_train {
        events.extend(pure_events([max_train]));
    }
    events.extend(pure_events([popularity]));
}

/// The RDP curve of `events` on the default grid (zero for no events).
pub fn user_cost(events: &[PrivacyEvent]) -> Result<RdpCurve, AccountantError> {
    compose_events(events, &default_orders())
}

/// A rating as the planner sees it (no value needed to plan).
#[derive(Debug, Clone, PartialEq)]
pub struct RatingBudget {
    pub id: i64,
    pub user: String,
    pub eps: f64,
    pub spent: f64,
}

/// A user's RDP budget and what it has consumed.
#[derive(Debug, Clone)]
pub struct UserBudget {
    pub eps: f64,
    pub delta: f64,
    pub consumed: RdpCurve,
}

/// Why a rating or user takes no part in a release.
#[derive(Debug, Clone, PartialEq)]
pub enum Exclusion {
    /// Less than `min_release_eps` of eps_ij remains.
    RatingExhausted,
    /// The user's Renyi filter would not admit the planned cost of this release.
    UserFilterFull,
    /// The user's budget is unusable (e.g. invalid stored values).
    UserInvalid(String),
}

/// A rating admitted to a release.
#[derive(Debug, Clone, PartialEq)]
pub struct Admitted {
    /// Index into the planner's input.
    pub index: usize,
    /// The share of eps_ij this release may spend in total.
    pub share: f64,
    /// Whether the rating is counted in the DP popularity (charged `popularity_eps`).
    pub popularity: bool,
    /// What the trainer may spend: `share - popularity_eps` if counted, else `share`.
    pub train_budget: f64,
}

/// The admission plan of one release.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub admitted: Vec<Admitted>,
    pub ratings_exhausted: usize,
    /// Users left out, with the reason.
    pub users_excluded: BTreeMap<String, Exclusion>,
}

/// Parameters of [`plan`].
#[derive(Debug, Clone)]
pub struct PlanParams {
    pub policy: SharePolicy,
    pub min_release_eps: f64,
    pub popularity_eps: f64,
    /// The per-user event the trainer plans (`Trainer::planned_user_event`).
    pub planned_user_event: Option<PrivacyEvent>,
    /// Apply the users' Renyi filters (false only for non-private releases, which
    /// charge nothing).
    pub check_user_filter: bool,
}

/// Decides which ratings take part in a release and with which shares.
///
/// 1. Each rating gets [`release_share`]; exhausted ratings are left out.
/// 2. A rating is counted in the popularity release iff its share is at least twice
///    `popularity_eps` (eps preferences are public metadata, so this selection is too).
/// 3. Each user's planned cost is the trainer's planned user event composed with
///    `PureDp(max share)` over the user's admitted ratings. The unit of privacy is one
///    rating (DESIGN 3): the user's RDP ledger bounds the loss of any single rating of
///    the user, whose pure-DP charges in this release (trainer plus popularity) are at
///    most its share, and the RDP of pure DP is superadditive in eps, so one
///    `PureDp(max share)` bounds the pure-DP events of any one rating. Users whose Renyi
///    filter would not admit it are left out with all their ratings (skipped for
///    non-private releases, which charge nothing). The commit re-checks the filter with
///    the charges actually made.
pub fn plan(
    params: &PlanParams,
    ratings: &[RatingBudget],
    users: &BTreeMap<String, UserBudget>,
) -> Plan {
    let mut out = Plan::default();
    let mut by_user: BTreeMap<&str, Vec<Admitted>> = BTreeMap::new();
    for (index, r) in ratings.iter().enumerate() {
        match release_share(params.policy, r.eps, r.spent, params.min_release_eps) {
            None => out.ratings_exhausted += 1,
            Some(share) => {
                let popularity = share >= 2.0 * params.popularity_eps;
                let train_budget = if popularity {
                    share - params.popularity_eps
                } else {
                    share
                };
                by_user.entry(&r.user).or_default().push(Admitted {
                    index,
                    share,
                    popularity,
                    train_budget,
                });
            }
        }
    }
    for (user, admitted) in by_user {
        if !params.check_user_filter {
            out.admitted.extend(admitted);
            continue;
        }
        let Some(budget) = users.get(user) else {
            out.users_excluded
                .insert(user.to_string(), Exclusion::UserInvalid("no budget".into()));
            continue;
        };
        let mut events: Vec<PrivacyEvent> = params.planned_user_event.iter().cloned().collect();
        // The unit is one rating: the user's ledger bounds the loss of any single rating of
        // the user, so the pure-DP part of the plan is the largest share, not their sum.
        events.extend(pure_events(max_share(&admitted)));
        let verdict = RenyiFilter::with_default_orders(budget.eps, budget.delta)
            .and_then(|f| f.admits(&budget.consumed, &user_cost(&events)?))
            .map_err(|e| e.to_string());
        match verdict {
            Ok(true) => out.admitted.extend(admitted),
            Ok(false) => {
                out.users_excluded
                    .insert(user.to_string(), Exclusion::UserFilterFull);
            }
            Err(e) => {
                out.users_excluded
                    .insert(user.to_string(), Exclusion::UserInvalid(e));
            }
        }
    }
    out.admitted.sort_by_key(|a| a.index);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_parsing() {
        assert_eq!(
            SharePolicy::parse("fraction:0.25"),
            Ok(SharePolicy::Fraction(0.25))
        );
        assert_eq!(SharePolicy::parse("split:4"), Ok(SharePolicy::Split(4)));
        for bad in [
            "fraction:0",
            "fraction:1.5",
            "split:0",
            "half",
            "x:1",
            "fraction:nan",
        ] {
            assert!(SharePolicy::parse(bad).is_err(), "{bad}");
        }
    }

    /// Repeated releases never spend more than eps_ij, in exact floating point, for
    /// awkward budgets and both policies; the number of releases is the expected one.
    #[test]
    fn cumulative_spend_never_exceeds_eps() {
        for policy in [
            SharePolicy::Fraction(0.25),
            SharePolicy::Fraction(0.3),
            SharePolicy::Split(3),
            SharePolicy::Split(7),
            SharePolicy::Fraction(1.0),
        ] {
            for eps in [0.1, 0.3, 1.0, 0.7, 2.9, 10.0, 1e-3] {
                let mut spent = 0.0;
                let mut releases = 0;
                while let Some(s) = release_share(policy, eps, spent, 1e-9) {
                    assert!(fits(eps, spent, s));
                    spent += s;
                    assert!(spent <= eps, "{policy:?} eps {eps} spent {spent}");
                    releases += 1;
                    assert!(releases < 100, "{policy:?} eps {eps} never exhausts");
                }
                let k = match policy {
                    SharePolicy::Split(k) => k as usize,
                    SharePolicy::Fraction(f) => (1.0 / f).ceil() as usize,
                };
                assert!(
                    releases >= k && releases <= k + 1,
                    "{policy:?} {eps}: {releases}"
                );
            }
        }
    }

    #[test]
    fn share_is_capped_by_remaining_and_min() {
        let p = SharePolicy::Fraction(0.25);
        assert_eq!(release_share(p, 1.0, 0.0, 0.01), Some(0.25));
        assert_eq!(release_share(p, 1.0, 0.9, 0.01), Some(1.0 - 0.9));
        assert_eq!(release_share(p, 1.0, 0.995, 0.01), None);
        assert_eq!(release_share(p, 1.0, 1.0, 0.01), None);
        assert!(!fits(1.0, 0.9, 0.2));
        assert!(!fits(1.0, 0.0, f64::NAN));
        assert!(!fits(1.0, 0.0, -0.1));
    }

    #[test]
    fn pure_events_group_equal_amounts() {
        let e = pure_events([0.25, 0.25, 0.1, 0.0]);
        assert_eq!(e.len(), 2);
        assert!(e.contains(&PrivacyEvent::PureDp {
            eps: 0.25,
            count: 2
        }));
    }

    fn budgets(users: &[(&str, f64)]) -> BTreeMap<String, UserBudget> {
        users
            .iter()
            .map(|(u, e)| {
                (
                    u.to_string(),
                    UserBudget {
                        eps: *e,
                        delta: 1e-6,
                        consumed: RdpCurve::zeros_default(),
                    },
                )
            })
            .collect()
    }

    #[test]
    fn plan_excludes_exhausted_ratings_and_full_users() {
        let params = PlanParams {
            policy: SharePolicy::Fraction(0.5),
            min_release_eps: 0.01,
            popularity_eps: 0.05,
            planned_user_event: Some(PrivacyEvent::gaussian(5.0, 1).unwrap()),
            check_user_filter: true,
        };
        let r = |id, user: &str, eps, spent| RatingBudget {
            id,
            user: user.into(),
            eps,
            spent,
        };
        let ratings = vec![
            r(1, "a", 1.0, 0.0),
            r(2, "a", 1.0, 1.0), // exhausted
            r(3, "b", 1.0, 0.0),
            r(4, "poor", 1.0, 0.0),
            r(5, "a", 0.15, 0.0), // share 0.075 < 2 * popularity eps
        ];
        let users = budgets(&[("a", 10.0), ("b", 10.0), ("poor", 0.5)]);
        let p = plan(&params, &ratings, &users);
        let ids: Vec<i64> = p.admitted.iter().map(|a| ratings[a.index].id).collect();
        assert_eq!(ids, vec![1, 3, 5]);
        assert_eq!(p.ratings_exhausted, 1);
        assert_eq!(
            p.users_excluded.get("poor"),
            Some(&Exclusion::UserFilterFull)
        );
        let a1 = &p.admitted[0];
        assert!(a1.popularity && (a1.share - 0.5).abs() < 1e-15);
        assert!((a1.train_budget - 0.45).abs() < 1e-12);
        let a5 = &p.admitted[2];
        assert!(!a5.popularity && a5.train_budget == a5.share);
    }

    /// The unit is one rating: a heavy user's plan charges the largest share once, not the
    /// sum over their ratings, so 300 ratings cost what one does (the sum, 75 here, would
    /// exclude them at eps_u = 10).
    #[test]
    fn plan_charges_the_largest_share_not_the_sum() {
        let params = PlanParams {
            policy: SharePolicy::Fraction(0.25),
            min_release_eps: 0.001,
            popularity_eps: 0.05,
            planned_user_event: Some(PrivacyEvent::gaussian(1.5, 2).unwrap()),
            check_user_filter: true,
        };
        let many: Vec<RatingBudget> = (0..300)
            .map(|k| RatingBudget {
                id: k,
                user: "heavy".into(),
                eps: if k == 7 { 2.0 } else { 1.0 },
                spent: 0.0,
            })
            .collect();
        let p = plan(&params, &many, &budgets(&[("heavy", 10.0)]));
        assert!(p.users_excluded.is_empty(), "{:?}", p.users_excluded);
        assert_eq!(p.admitted.len(), 300);
        // The same user with a budget below one release's worst rating is excluded.
        let p = plan(&params, &many, &budgets(&[("heavy", 0.4)]));
        assert_eq!(
            p.users_excluded.get("heavy"),
            Some(&Exclusion::UserFilterFull)
        );
    }

    #[test]
    fn user_events_cover_the_largest_rating_charge_and_popularity_once() {
        let g = PrivacyEvent::gaussian(2.0, 1).unwrap();
        // A trainer that reported no pure-DP event: the service charges the largest.
        let mut e = vec![g.clone()];
        complete_user_events(&mut e, 0.3, 0.05);
        assert_eq!(
            e,
            vec![
                g.clone(),
                PrivacyEvent::PureDp { eps: 0.3, count: 1 },
                PrivacyEvent::PureDp {
                    eps: 0.05,
                    count: 1
                },
            ]
        );
        // A trainer whose events already cover it: nothing added but the popularity.
        let mut e = vec![g.clone(), PrivacyEvent::PureDp { eps: 0.3, count: 1 }];
        complete_user_events(&mut e, 0.3, 0.0);
        assert_eq!(e.len(), 2);
    }

    /// A user whose consumed curve leaves no room is excluded even with a tiny charge.
    #[test]
    fn plan_respects_consumed_curve() {
        let f = RenyiFilter::with_default_orders(1.0, 1e-6).unwrap();
        let cap: Vec<f64> = f.capacity().iter().map(|c| c.max(0.0)).collect();
        let full = RdpCurve::new(default_orders(), cap).unwrap();
        let mut users = budgets(&[("u", 1.0)]);
        users.get_mut("u").unwrap().consumed = full;
        let params = PlanParams {
            policy: SharePolicy::Split(10),
            min_release_eps: 1e-6,
            popularity_eps: 0.01,
            planned_user_event: None,
            check_user_filter: true,
        };
        let ratings = vec![RatingBudget {
            id: 1,
            user: "u".into(),
            eps: 0.01,
            spent: 0.0,
        }];
        let p = plan(&params, &ratings, &users);
        assert!(p.admitted.is_empty());
        assert_eq!(p.users_excluded.get("u"), Some(&Exclusion::UserFilterFull));
        // Non-private releases charge nothing and skip the filter.
        let open = PlanParams {
            check_user_filter: false,
            ..params
        };
        assert_eq!(plan(&open, &ratings, &users).admitted.len(), 1);
    }
}
