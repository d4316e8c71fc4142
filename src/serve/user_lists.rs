//! The per-user part of the ready top-N orders ([`super::lists`]), as the user's cached
//! facts hold it: plain data, so that the facts need not know how lists are made.

/// One user's part of their lists under one release: computed from the user's facts
/// and the release, never from anyone else's data.
#[derive(Debug)]
pub struct UserLists {
    pub(super) release_id: i64,
    /// The user's rated items in this release, sorted (excluded unless asked for).
    pub(super) rated: Vec<u32>,
    /// `None`: the model does not personalise for this user (the DP counts' order).
    pub(super) personal: Option<Personal>,
    /// Without a personal list: the DP counts' order without the user's rated items, cut
    /// after [`super::lists`]'s `KEEP` items (all of them when shorter). Empty otherwise.
    pub(super) popular: Vec<u32>,
    /// What the user's personal list is made of ([`crate::model::Ranker::personal_source`]).
    pub(super) source: &'static str,
}

#[derive(Debug)]
pub(super) struct Personal {
    /// The candidates in list order, cut after [`super::lists`]'s `KEEP` unrated ones.
    pub(super) ranked: Vec<Ranked>,
    /// Whether `ranked` holds every listable candidate.
    pub(super) complete: bool,
    /// Items outside the candidates score `base + term`.
    pub(super) base: f64,
    /// Whether `ranked` ranks the whole catalogue (a label or fused list scores every
    /// item): no item outside it is listed.
    pub(super) whole: bool,
}

/// One ranked candidate of a user: whether the user rated it is settled once here, not
/// per request.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ranked {
    pub(super) score: f64,
    pub(super) item: u32,
    pub(super) rated: bool,
}

/// The last [`UserLists`] computed from one version of a user's facts; replaced when a
/// newer release is served.
#[derive(Debug, Default)]
pub struct ListsSlot(pub(super) arc_swap::ArcSwapOption<UserLists>);

impl Clone for ListsSlot {
    fn clone(&self) -> Self {
        Self(arc_swap::ArcSwapOption::new(self.0.load_full()))
    }
}

impl PartialEq for ListsSlot {
    /// A cache of what the facts determine: facts are equal whatever it holds.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
