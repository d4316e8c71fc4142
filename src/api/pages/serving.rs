//! What users' lists are made of with the served release, as the serve layer answers it
//! ([`Published::top_n`]'s `fallback`, the `source` of `GET /v1/users/{user}/recommendations`),
//! for the receipt ("your list today") and the operator overview ("what users are served").

use crate::serve::facts::{OwnRating, UserFacts};
use crate::serve::{Exclude, Published, TopNQuery};

/// What one user's list is made of today.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListSource {
    /// No release is served yet: no list at all (503).
    NoRelease,
    /// The user is deleted: the DP popularity order, whatever the model.
    Deleted,
    /// The served release gives nobody a personal list (for example a `dp-topn` release
    /// that spent its budget on counts only): everybody gets the DP popularity order.
    PopularityForAll,
    /// The release personalises, but not from this user's ratings (none of the items the
    /// user rated is one the model scores from, or no profile): the DP popularity order.
    Popularity,
    /// A personal list: from the published model and the user's own ratings.
    Personal,
    /// A personal list from the label model: the DP counts reweighted by the public
    /// labels of the user's own rated items.
    Labels,
}

impl ListSource {
    /// The `source` field of the user's recommendations (`None`: no list).
    pub fn api_source(self) -> Option<&'static str> {
        match self {
            Self::NoRelease => None,
            Self::Personal => Some("profile"),
            Self::Labels => Some("labels"),
            _ => Some("popularity"),
        }
    }
}

/// One top-N of the release for `own` ratings (n = 1: only `fallback` is read).
fn falls_back(p: &Published, user: &str, own: &[OwnRating], deleted: bool) -> bool {
    p.top_n(&TopNQuery {
        user,
        n: 1,
        offset: 0,
        exclude: Exclude::Nothing,
        own,
        force_fallback: deleted,
    })
    .fallback
}

/// Whether the label model answers `own` (the API's `source: labels`).
fn labelled(p: &Published, own: &[OwnRating]) -> bool {
    let facts = UserFacts::new(
        false,
        own.iter().map(|(i, v)| (i.to_string(), *v)).collect(),
    );
    p.personal_source(&facts) == "labels"
}

/// Whether the release gives anybody a personal list: a ranker asked for a user who
/// rated every catalogue item (it personalises from the presence of rated items, never
/// their values); a factor model with at least one published user profile.
pub fn release_personalises(p: &Published) -> bool {
    if p.has_ranker() {
        let own: Vec<OwnRating> = p.items.iter().map(|i| (i.as_str().into(), 5.0)).collect();
        !falls_back(p, "", &own, false)
    } else {
        p.users.iter().any(|u| p.has_profile(u))
    }
}

/// What `user`'s list is made of, given whether the release personalises at all
/// ([`release_personalises`], computed once for many users).
pub fn list_source(
    p: Option<&Published>,
    personalises: bool,
    user: &str,
    deleted: bool,
    own: &[OwnRating],
) -> ListSource {
    let Some(p) = p else {
        return ListSource::NoRelease;
    };
    if deleted {
        ListSource::Deleted
    } else if !personalises {
        ListSource::PopularityForAll
    } else if falls_back(p, user, own, false) {
        ListSource::Popularity
    } else if labelled(p, own) {
        ListSource::Labels
    } else {
        ListSource::Personal
    }
}

/// What the live users get from the served release, for the overview.
#[derive(Debug, Clone, PartialEq)]
pub struct Served {
    /// The served release's id and trainer (`None`: nothing served yet).
    pub release: Option<(i64, String)>,
    /// Whether the release gives anybody a personal list.
    pub personalises: bool,
    pub live_users: u64,
    /// Live users with a personal list and with the DP popularity order; `None` when not
    /// counted (more than [`COUNT_USERS_UP_TO`] live users: counting reads each one's
    /// ratings). When the release personalises nobody, every user gets popularity and
    /// the count costs nothing.
    pub counts: Option<(u64, u64)>,
}

/// The most live users the overview counts one by one.
pub const COUNT_USERS_UP_TO: u64 = 5_000;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::ReleaseMeta;
    use crate::train::{FactorModel, Guarantee};

    fn release(profiles: usize) -> Published {
        let users: Vec<String> = (0..2).map(|u| format!("u{u}")).collect();
        let items: Vec<String> = (0..3).map(|i| format!("i{i}")).collect();
        let model = FactorModel::zeros(profiles, 3, 2, 3.0, crate::data::RatingScale::ONE_TO_FIVE);
        Published::new(
            ReleaseMeta {
                release_id: 7,
                trainer: "t".into(),
                guarantee: Guarantee::Proven,
                created_at: 0,
            },
            model,
            users,
            items,
            vec![3, 2, 1],
        )
        .unwrap()
    }

    #[test]
    fn sources_follow_the_serve_layer() {
        let none = release(0);
        assert!(!release_personalises(&none));
        assert_eq!(
            list_source(Some(&none), false, "u0", false, &[]),
            ListSource::PopularityForAll
        );
        let some = release(1);
        assert!(release_personalises(&some));
        assert_eq!(
            list_source(Some(&some), true, "u0", false, &[]),
            ListSource::Personal
        );
        assert_eq!(
            list_source(Some(&some), true, "u1", false, &[]),
            ListSource::Popularity
        );
        assert_eq!(
            list_source(Some(&some), true, "u0", true, &[]),
            ListSource::Deleted
        );
        assert_eq!(
            list_source(None, false, "u0", false, &[]),
            ListSource::NoRelease
        );
        assert_eq!(ListSource::Personal.api_source(), Some("profile"));
        assert_eq!(ListSource::Deleted.api_source(), Some("popularity"));
    }
}
