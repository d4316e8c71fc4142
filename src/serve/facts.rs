//! Per-user serving facts (deleted or not, the user's ratings), kept in memory so that a
//! top-N or prediction answer comes from memory, not from the store (DESIGN 6).
//!
//! An entry is read from the store on first use and then kept until the user's ratings
//! change or it is evicted for room; it does not expire with time:
//!
//! - ratings stored by this process update the user's entry in place
//!   ([`UserFactsCache::apply_ratings`]), deletions through this process drop it
//!   ([`UserFactsCache::invalidate`]): a user who rates gets lists that reflect it at once;
//! - writes made by another process on the same database (a replica) are merged in every
//!   `scheduler.reload_secs` from the ratings changed since the last check
//!   ([`UserFactsCache::apply_changes`], read by `Store::ratings_changed_since`): only
//!   entries whose facts differ are replaced, in place, so a check never sends a wave of
//!   users back to the store (with a lifetime, entries expired together and under load
//!   their users came back as a burst of store reads);
//! - the cache holds at most `capacity` users and `max_ratings` ratings; when full, an
//!   entry picked at random makes room, one at a time.
//!
//! What an entry costs: about 24 bytes per rating (an item id shared with every other
//! entry, [`ItemIds`], and the value) plus the user id and the entry's bookkeeping (about
//! 150 bytes), plus, once the user asked for a list under the served release, their
//! ready ranking ([`super::user_lists::UserLists`]: 4 bytes per rating and at most a few
//! hundred candidates of 16 bytes, or, without a personal list, 64 items of 4 bytes).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// One of a user's ratings as serving holds it: the item id (shared) and the value.
pub type OwnRating = (Arc<str>, f64);

/// What serving needs to know about a user beyond the model.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UserFacts {
    pub deleted: bool,
    /// The user's own ratings `(item, value)`, sorted by item id, one per item (a ranker
    /// scores from them; the rated items are excluded from lists).
    pub ratings: Vec<OwnRating>,
    /// The user's profile solved from these ratings under a joint-DP release (release id,
    /// profile): computed once per release and these facts; new ratings make new facts,
    /// so the solve is refreshed when the user's ratings change.
    pub solved: std::sync::OnceLock<(i64, Arc<crate::model::joint_als::UserProfile>)>,
    /// The user's part of their top-N lists under the served release
    /// ([`super::lists::UserLists`]), computed from these facts on first use.
    pub lists: super::user_lists::ListsSlot,
}

impl UserFacts {
    /// Facts from the user's stored ratings (sorted here by item id; a later duplicate of
    /// an item wins).
    pub fn new(deleted: bool, ratings: Vec<(String, f64)>) -> Self {
        Self::interned(deleted, ratings, Arc::from)
    }

    fn interned(
        deleted: bool,
        ratings: impl IntoIterator<Item = (String, f64)>,
        mut id: impl FnMut(String) -> Arc<str>,
    ) -> Self {
        let mut ratings: Vec<OwnRating> = ratings.into_iter().map(|(i, v)| (id(i), v)).collect();
        normalise(&mut ratings);
        Self {
            deleted,
            ratings,
            solved: std::sync::OnceLock::new(),
            lists: Default::default(),
        }
    }

    /// Whether the user has a rating of `item`.
    pub fn rated(&self, item: &str) -> bool {
        self.value(item).is_some()
    }

    /// The user's rating of `item`.
    pub fn value(&self, item: &str) -> Option<f64> {
        self.ratings
            .binary_search_by(|(i, _)| i.as_ref().cmp(item))
            .ok()
            .map(|k| self.ratings[k].1)
    }

    /// The user's rated items, by id.
    pub fn rated_items(&self) -> impl Iterator<Item = &str> {
        self.ratings.iter().map(|(i, _)| i.as_ref())
    }
}

/// Sorts by item id and keeps the last of equal items (a stable sort keeps their order).
fn normalise(ratings: &mut Vec<OwnRating>) {
    if ratings.windows(2).any(|w| w[0].0 >= w[1].0) {
        ratings.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out: Vec<OwnRating> = Vec::with_capacity(ratings.len());
        for r in ratings.drain(..) {
            match out.last_mut() {
                Some(last) if last.0 == r.0 => *last = r,
                _ => out.push(r),
            }
        }
        *ratings = out;
    }
}

/// One rating changed in the store since a check ([`UserFactsCache::apply_changes`]): its
/// user, item, current value (`None`: deleted) and whether the user is deleted now.
#[derive(Debug, Clone, PartialEq)]
pub struct ChangedRating {
    pub user: String,
    pub item: String,
    pub value: Option<f64>,
    pub user_deleted: bool,
}

/// Item ids shared by every entry: each distinct id is held once, however many users
/// rated it. Bounded by the catalogue (a rating names a registered item).
#[derive(Debug, Default)]
struct ItemIds(Mutex<HashSet<Arc<str>>>);

impl ItemIds {
    fn get(&self, ids: &mut HashSet<Arc<str>>, id: String) -> Arc<str> {
        if let Some(a) = ids.get(id.as_str()) {
            return a.clone();
        }
        let a: Arc<str> = Arc::from(id);
        ids.insert(a.clone());
        a
    }
}

#[derive(Debug)]
struct Entry {
    facts: Arc<UserFacts>,
    /// Position of the user id in [`Entries::keys`].
    slot: usize,
    /// [`Entries::clock`] when the entry was last written.
    stamp: u64,
}

#[derive(Debug, Default)]
struct Entries {
    /// Looked up on every request: a fast hasher (foldhash, seeded per process).
    map: foldhash::HashMap<Arc<str>, Entry>,
    /// The cached user ids, for eviction of a random entry in O(1).
    keys: Vec<Arc<str>>,
    /// Ratings held by all entries.
    ratings: usize,
    /// Counts writes; an entry's stamp says when it was last written.
    clock: u64,
}

impl Entries {
    fn put(&mut self, user: &str, facts: Arc<UserFacts>) -> Option<Arc<UserFacts>> {
        self.clock += 1;
        let stamp = self.clock;
        self.ratings += facts.ratings.len();
        if let Some(e) = self.map.get_mut(user) {
            self.ratings -= e.facts.ratings.len();
            e.stamp = stamp;
            return Some(std::mem::replace(&mut e.facts, facts));
        }
        let key: Arc<str> = Arc::from(user);
        let slot = self.keys.len();
        self.keys.push(key.clone());
        self.map.insert(key, Entry { facts, slot, stamp });
        None
    }

    fn remove(&mut self, user: &str) -> Option<Arc<UserFacts>> {
        let e = self.map.remove(user)?;
        self.clock += 1;
        self.ratings -= e.facts.ratings.len();
        self.keys.swap_remove(e.slot);
        if let Some(moved) = self.keys.get(e.slot) {
            if let Some(m) = self.map.get_mut(moved) {
                m.slot = e.slot;
            }
        }
        Some(e.facts)
    }

    /// The entry replaced only if it still holds `old`.
    fn replace_if(
        &mut self,
        user: &str,
        old: &Arc<UserFacts>,
        new: Arc<UserFacts>,
    ) -> Option<Arc<UserFacts>> {
        match self.map.get(user) {
            Some(e) if Arc::ptr_eq(&e.facts, old) => self.put(user, new),
            _ => None,
        }
    }
}

/// A bounded map user id -> facts, kept fresh by the writes (see the module text).
#[derive(Debug)]
pub struct UserFactsCache {
    capacity: usize,
    max_ratings: usize,
    entries: Mutex<Entries>,
    items: ItemIds,
}

impl UserFactsCache {
    /// At most `capacity` users and `max_ratings` ratings in all.
    pub fn new(capacity: usize, max_ratings: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            max_ratings,
            entries: Mutex::new(Entries::default()),
            items: ItemIds::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        // A panic while holding the lock cannot leave the map inconsistent (no call
        // that can panic runs between the updates of one write), so a poisoned lock is
        // still usable.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Facts from the user's stored ratings, with item ids shared with the other entries.
    pub fn facts(&self, deleted: bool, ratings: Vec<(String, f64)>) -> UserFacts {
        let mut ids = self.items.0.lock().unwrap_or_else(|e| e.into_inner());
        UserFacts::interned(deleted, ratings, |i| self.items.get(&mut ids, i))
    }

    /// The cached facts of `user`.
    pub fn get(&self, user: &str) -> Option<Arc<UserFacts>> {
        self.lock().map.get(user).map(|e| e.facts.clone())
    }

    /// Whether `user` has an entry.
    pub fn contains(&self, user: &str) -> bool {
        self.lock().map.contains_key(user)
    }

    /// Users and ratings held.
    pub fn len(&self) -> (usize, usize) {
        let e = self.lock();
        (e.map.len(), e.ratings)
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len().0 == 0
    }

    /// The write clock: [`Self::apply_changes`] leaves entries written after it alone.
    pub fn clock(&self) -> u64 {
        self.lock().clock
    }

    /// Stores facts read from the store. When the cache is full, entries picked at
    /// random make room (a user with more ratings than the whole bound is not cached).
    pub fn insert(&self, user: &str, facts: Arc<UserFacts>) {
        if facts.ratings.len() > self.max_ratings {
            return;
        }
        let mut evicted: Vec<Arc<UserFacts>> = Vec::new();
        {
            let mut e = self.lock();
            if let Some(old) = e.put(user, facts) {
                evicted.push(old);
            }
            while e.map.len() > self.capacity || e.ratings > self.max_ratings {
                let k = e.keys[rand::random_range(0..e.keys.len())].clone();
                if &*k == user {
                    continue;
                }
                evicted.extend(e.remove(&k));
            }
        }
        // Dropped after the lock is given back.
        drop(evicted);
    }

    /// Updates the cached entries of the users in `ratings` (user, item, value), after
    /// this process stored them: a new item is added, a re-rated one gets its new value,
    /// and the user is no longer deleted (ingestion reinstates a deleted user, as the
    /// store does). Users without an entry are left to be read from the store.
    ///
    /// The new entries are built outside the lock (a batch of 100 users of 100 ratings
    /// each is about 10,000 ratings to copy): the lock is held only to take the current
    /// entries and to swap in the new ones, so the readers' [`Self::get`] on the other
    /// request workers does not wait for the rebuild (it blocks its whole worker thread).
    /// An entry replaced meanwhile (by another batch, or a fresh read) is dropped instead,
    /// so the next read takes the store's state, which has both.
    pub fn apply_ratings<'a>(&self, ratings: impl IntoIterator<Item = (&'a str, &'a str, f64)>) {
        let mut by_user: HashMap<&str, Vec<(&str, Option<f64>)>> = HashMap::new();
        for (user, item, value) in ratings {
            by_user.entry(user).or_default().push((item, Some(value)));
        }
        let taken = self.take(by_user, None);
        let updated: Vec<_> = taken
            .into_iter()
            .map(|(user, old, new)| {
                let facts = self.merged(&old, false, new);
                (user, old, facts)
            })
            .collect();
        let mut replaced = Vec::with_capacity(updated.len());
        {
            let mut e = self.lock();
            for (user, old, facts) in updated {
                match e.replace_if(user, &old, Arc::new(facts)) {
                    Some(prev) => replaced.push(prev),
                    None => replaced.extend(e.remove(user)),
                }
            }
        }
        drop(replaced);
    }

    /// Merges ratings changed in the store (read after the clock was at `clock`) into
    /// the entries of their users: only entries not written since `clock` (a newer write
    /// or read of this process already has the store's state) and only where the facts
    /// differ; the entry is replaced in place, never dropped. Returns the number of
    /// entries replaced.
    pub fn apply_changes(&self, clock: u64, changes: &[ChangedRating]) -> usize {
        let mut by_user: HashMap<&str, Vec<(&str, Option<f64>)>> = HashMap::new();
        let mut deleted: HashMap<&str, bool> = HashMap::new();
        for c in changes {
            by_user.entry(&c.user).or_default().push((&c.item, c.value));
            deleted.insert(&c.user, c.user_deleted);
        }
        let taken = self.take(by_user, Some(clock));
        let updated: Vec<_> = taken
            .into_iter()
            .filter_map(|(user, old, new)| {
                // Most changes are this process's own writes, already applied.
                let deleted = deleted[user];
                if old.deleted == deleted && new.iter().all(|&(i, v)| old.value(i) == v) {
                    return None;
                }
                let facts = self.merged(&old, deleted, new);
                (facts != *old).then_some((user, old, facts))
            })
            .collect();
        let mut n = 0;
        let mut replaced = Vec::with_capacity(updated.len());
        {
            let mut e = self.lock();
            for (user, old, facts) in updated {
                if let Some(prev) = e.replace_if(user, &old, Arc::new(facts)) {
                    replaced.push(prev);
                    n += 1;
                }
            }
        }
        drop(replaced);
        n
    }

    /// The current entries of the users in `by_user` (written at or before `clock`, if
    /// given), with their changes.
    #[allow(clippy::type_complexity)]
    fn take<'a>(
        &self,
        by_user: HashMap<&'a str, Vec<(&'a str, Option<f64>)>>,
        clock: Option<u64>,
    ) -> Vec<(&'a str, Arc<UserFacts>, Vec<(&'a str, Option<f64>)>)> {
        let e = self.lock();
        by_user
            .into_iter()
            .filter_map(|(user, new)| {
                let entry = e.map.get(user)?;
                clock
                    .is_none_or(|c| entry.stamp <= c)
                    .then(|| (user, entry.facts.clone(), new))
            })
            .collect()
    }

    /// `old`'s ratings with `new` applied (`None` removes the item), of a user deleted
    /// or not.
    fn merged(&self, old: &UserFacts, deleted: bool, new: Vec<(&str, Option<f64>)>) -> UserFacts {
        let mut all: BTreeMap<Arc<str>, f64> = old.ratings.iter().cloned().collect();
        let mut ids = self.items.0.lock().unwrap_or_else(|e| e.into_inner());
        for (item, value) in new {
            match value {
                Some(v) => {
                    all.insert(self.items.get(&mut ids, item.to_owned()), v);
                }
                None => {
                    all.remove(item);
                }
            }
        }
        drop(ids);
        UserFacts {
            deleted,
            ratings: all.into_iter().collect(),
            ..Default::default()
        }
    }

    /// Drops the entries of `users` (after this process deleted their ratings).
    pub fn invalidate<'a>(&self, users: impl IntoIterator<Item = &'a str>) {
        let mut dropped = Vec::new();
        {
            let mut e = self.lock();
            for u in users {
                dropped.extend(e.remove(u));
            }
        }
        drop(dropped);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(items: &[&str]) -> Arc<UserFacts> {
        Arc::new(UserFacts::new(
            false,
            items.iter().map(|s| (s.to_string(), 4.0)).collect(),
        ))
    }

    fn change(user: &str, item: &str, value: Option<f64>, deleted: bool) -> ChangedRating {
        ChangedRating {
            user: user.into(),
            item: item.into(),
            value,
            user_deleted: deleted,
        }
    }

    fn items(f: &UserFacts) -> Vec<(&str, f64)> {
        f.ratings.iter().map(|(i, v)| (i.as_ref(), *v)).collect()
    }

    #[test]
    fn entries_stay_until_invalidated_and_are_bounded_one_at_a_time() {
        let c = UserFactsCache::new(3, 100);
        c.insert("a", facts(&["x"]));
        assert!(c.get("a").unwrap().rated("x"));
        c.invalidate(["a"]);
        assert!(c.get("a").is_none());
        for u in ["a", "b", "c", "d", "e"] {
            c.insert(u, facts(&["x"]));
            // Full: one random other entry made room, the new one is kept.
            assert!(c.get(u).is_some());
            assert!(c.len().0 <= 3);
        }
        assert_eq!(c.len(), (3, 3));
        // The ratings bound: a user of 60 ratings leaves room for 40 more.
        let many: Vec<String> = (0..60).map(|k| format!("i{k:02}")).collect();
        let many: Vec<&str> = many.iter().map(|s| s.as_str()).collect();
        c.insert("big", facts(&many));
        c.insert("big2", facts(&many));
        assert!(c.get("big2").is_some() && c.get("big").is_none());
        assert!(c.len().1 <= 100);
        // Larger than the whole bound: not cached.
        let huge: Vec<String> = (0..101).map(|k| format!("h{k}")).collect();
        let huge: Vec<&str> = huge.iter().map(|s| s.as_str()).collect();
        c.insert("huge", facts(&huge));
        assert!(c.get("huge").is_none() && c.get("big2").is_some());
    }

    #[test]
    fn facts_are_sorted_by_item_and_share_item_ids() {
        let c = UserFactsCache::new(10, 100);
        let a = c.facts(false, vec![("y".into(), 1.0), ("x".into(), 2.0)]);
        let b = c.facts(false, vec![("x".into(), 3.0)]);
        assert_eq!(items(&a), [("x", 2.0), ("y", 1.0)]);
        assert!(Arc::ptr_eq(&a.ratings[0].0, &b.ratings[0].0));
        assert!(a.rated("y") && !a.rated("z"));
        let dup = UserFacts::new(
            false,
            vec![("b".into(), 1.0), ("a".into(), 2.0), ("b".into(), 5.0)],
        );
        assert_eq!(items(&dup), [("a", 2.0), ("b", 5.0)]);
    }

    #[test]
    fn stored_ratings_update_cached_entries_in_place() {
        let c = UserFactsCache::new(10, 1000);
        c.insert(
            "a",
            Arc::new(UserFacts::new(
                false,
                vec![("m".into(), 2.0), ("x".into(), 4.0)],
            )),
        );
        c.insert("d", Arc::new(UserFacts::new(true, vec![])));
        c.apply_ratings([
            ("a", "x", 5.0),
            ("a", "b", 3.0),
            ("d", "y", 1.0),
            ("nobody", "z", 1.0),
        ]);
        let a = c.get("a").unwrap();
        // Re-rated x, new b, kept m; ordered by item like the store's answer.
        assert_eq!(items(&a), [("b", 3.0), ("m", 2.0), ("x", 5.0)]);
        assert!(!a.deleted);
        // A deleted user who rates again is reinstated, as in the store.
        let d = c.get("d").unwrap();
        assert!(!d.deleted && d.rated("y"));
        // Users without an entry are read from the store later, not invented.
        assert!(c.get("nobody").is_none());
        assert_eq!(c.len(), (2, 4));
    }

    /// The periodic check merges what another process wrote: changed entries are
    /// replaced in place (new facts, so new lists), unchanged ones keep their facts (and
    /// their ready lists), and entries this process wrote after the check's read are
    /// left alone.
    #[test]
    fn changes_from_the_store_are_merged_without_dropping_entries() {
        let c = UserFactsCache::new(10, 1000);
        c.insert("a", facts(&["x", "y"]));
        c.insert("b", facts(&["x"]));
        c.insert("gone", facts(&["x"]));
        let b_before = c.get("b").unwrap();
        let clock = c.clock();
        c.insert("late", facts(&["x"]));
        let n = c.apply_changes(
            clock,
            &[
                change("a", "z", Some(2.0), false),
                change("a", "y", None, false),
                // b's change is the value this process already holds.
                change("b", "x", Some(4.0), false),
                change("gone", "x", None, true),
                // Written by this process after the check read the store.
                change("late", "x", None, false),
                change("nobody", "x", Some(1.0), false),
            ],
        );
        assert_eq!(n, 2);
        assert_eq!(items(&c.get("a").unwrap()), [("x", 4.0), ("z", 2.0)]);
        assert!(Arc::ptr_eq(&c.get("b").unwrap(), &b_before));
        let gone = c.get("gone").unwrap();
        assert!(gone.deleted && gone.ratings.is_empty());
        assert!(c.get("late").unwrap().rated("x"));
        assert!(c.get("nobody").is_none());
        assert_eq!(c.len(), (4, 4));
    }
}
