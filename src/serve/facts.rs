//! Per-user serving facts (deleted or not, which items the user rated), kept in memory so
//! that a top-N answer comes from memory, not from the store (DESIGN 6).
//!
//! An entry is read from the store on first use. When this process stores ratings, the
//! cached entries of their users are updated in place ([`UserFactsCache::apply_ratings`]):
//! dropping them instead sent every read of a recently rating user to the store, and
//! under steady ingestion that was most reads. Deletions drop the entry. Entries also
//! expire after `ttl`, so writes made through another replica on the same database are
//! seen within that time.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What serving needs to know about a user beyond the model.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UserFacts {
    pub deleted: bool,
    pub rated: HashSet<String>,
    /// The user's own ratings `(item, value)` (a ranker scores from them).
    pub ratings: Vec<(String, f64)>,
    /// The user's profile solved from these ratings under a joint-DP release (release id,
    /// profile): computed once per release and these facts; new ratings make new facts,
    /// so the solve is refreshed when the user's ratings change.
    pub solved: std::sync::OnceLock<(i64, Arc<crate::model::joint_als::UserProfile>)>,
    /// The user's part of their top-N lists under the served release
    /// ([`super::lists::UserLists`]), computed from these facts on first use.
    pub lists: super::user_lists::ListsSlot,
}

impl UserFacts {
    /// Facts from the user's stored ratings.
    pub fn new(deleted: bool, ratings: Vec<(String, f64)>) -> Self {
        Self {
            deleted,
            rated: ratings.iter().map(|(i, _)| i.clone()).collect(),
            ratings,
            solved: std::sync::OnceLock::new(),
            lists: Default::default(),
        }
    }
}

/// A cached entry taken for an update: user, entry time, facts, the new ratings.
type Cached<'a> = (&'a str, Instant, Arc<UserFacts>, Vec<(&'a str, f64)>);

/// A bounded, expiring map user id -> facts.
#[derive(Debug)]
pub struct UserFactsCache {
    ttl: Duration,
    capacity: usize,
    entries: Mutex<HashMap<String, (Instant, Arc<UserFacts>)>>,
}

impl UserFactsCache {
    pub fn new(ttl: Duration, capacity: usize) -> Self {
        Self {
            ttl,
            capacity: capacity.max(1),
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, Arc<UserFacts>)>> {
        // A panic while holding the lock cannot leave the map inconsistent (single
        // insert/remove calls), so a poisoned lock is still usable.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cached facts of `user`, if present and fresh.
    pub fn get(&self, user: &str) -> Option<Arc<UserFacts>> {
        let map = self.lock();
        map.get(user)
            .filter(|(at, _)| at.elapsed() < self.ttl)
            .map(|(_, f)| f.clone())
    }

    /// Stores fresh facts; when full, the whole map is cleared (entries are cheap to
    /// re-read and a full clear keeps the bound without bookkeeping).
    ///
    /// An entry lives a random time between `ttl / 2` and `ttl` (its time is set back by
    /// up to `ttl / 2`): with one fixed lifetime the entries read in the same second
    /// expired in the same second, and under load the users read in the first seconds
    /// came back as a wave of store reads every `ttl` (top-N p99 spikes every 10 s at 1M
    /// ratings, lab note bench-01). Facts are still never older than `ttl`.
    pub fn insert(&self, user: &str, facts: Arc<UserFacts>) {
        let back = self.ttl.mul_f64(0.5 * rand::random::<f64>());
        let at = Instant::now()
            .checked_sub(back)
            .unwrap_or_else(Instant::now);
        let mut map = self.lock();
        if map.len() >= self.capacity && !map.contains_key(user) {
            map.clear();
        }
        map.insert(user.to_owned(), (at, facts));
    }

    /// Updates the cached entries of the users in `ratings` (user, item, value), after
    /// this process stored them: a new item is added, a re-rated one gets its new value,
    /// and the user is no longer deleted (ingestion reinstates a deleted user, as the
    /// store does). Users without an entry are left to be read from the store. The
    /// ratings stay ordered by item, as the store returns them.
    ///
    /// The new entries are built outside the lock (a batch of 100 users of 100 ratings
    /// each is about 10,000 strings to copy and hash): the lock is held only to take the
    /// current entries and to swap in the new ones, so the readers' [`Self::get`] on the
    /// other request workers does not wait for the rebuild (it blocks its whole worker
    /// thread). An entry replaced meanwhile (by another batch, or a fresh read) is
    /// dropped instead, so the next read takes the store's state, which has both.
    pub fn apply_ratings<'a>(&self, ratings: impl IntoIterator<Item = (&'a str, &'a str, f64)>) {
        let mut by_user: HashMap<&str, Vec<(&str, f64)>> = HashMap::new();
        for (user, item, value) in ratings {
            by_user.entry(user).or_default().push((item, value));
        }
        let cached: Vec<Cached<'_>> = {
            let map = self.lock();
            by_user
                .into_iter()
                .filter_map(|(user, new)| {
                    map.get(user).map(|(at, old)| (user, *at, old.clone(), new))
                })
                .collect()
        };
        if cached.is_empty() {
            return;
        }
        let updated: Vec<(&str, Instant, Arc<UserFacts>, Arc<UserFacts>)> = cached
            .into_iter()
            .map(|(user, at, old, new)| {
                let mut all: std::collections::BTreeMap<String, f64> =
                    old.ratings.iter().cloned().collect();
                all.extend(new.into_iter().map(|(i, v)| (i.to_owned(), v)));
                let facts = Arc::new(UserFacts::new(false, all.into_iter().collect()));
                (user, at, old, facts)
            })
            .collect();
        // Replaced entries are dropped after the lock is given back.
        let mut replaced: Vec<(Instant, Arc<UserFacts>)> = Vec::with_capacity(updated.len());
        {
            let mut map = self.lock();
            for (user, at, old, facts) in &updated {
                match map.get(*user) {
                    Some((_, cur)) if Arc::ptr_eq(cur, old) => {
                        if let Some(prev) = map.insert((*user).to_owned(), (*at, facts.clone())) {
                            replaced.push(prev);
                        }
                    }
                    Some(_) => {
                        if let Some(prev) = map.remove(*user) {
                            replaced.push(prev);
                        }
                    }
                    None => {}
                }
            }
        }
        drop(replaced);
    }

    /// Drops the entries of `users` (after this process deleted their ratings).
    pub fn invalidate<'a>(&self, users: impl IntoIterator<Item = &'a str>) {
        let mut map = self.lock();
        for u in users {
            map.remove(u);
        }
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

    #[test]
    fn entries_expire_are_invalidated_and_bounded() {
        let c = UserFactsCache::new(Duration::from_secs(60), 2);
        c.insert("a", facts(&["x"]));
        assert!(c.get("a").unwrap().rated.contains("x"));
        c.invalidate(["a"]);
        assert!(c.get("a").is_none());
        c.insert("a", facts(&[]));
        c.insert("b", facts(&[]));
        c.insert("c", facts(&[])); // full: cleared, then c
        assert!(c.get("a").is_none() && c.get("c").is_some());
        let expired = UserFactsCache::new(Duration::ZERO, 10);
        expired.insert("a", facts(&[]));
        assert!(expired.get("a").is_none());
    }

    #[test]
    fn stored_ratings_update_cached_entries_in_place() {
        let c = UserFactsCache::new(Duration::from_secs(60), 10);
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
        assert_eq!(
            a.ratings,
            vec![("b".into(), 3.0), ("m".into(), 2.0), ("x".into(), 5.0)]
        );
        assert_eq!(a.rated.len(), 3);
        assert!(!a.deleted);
        // A deleted user who rates again is reinstated, as in the store.
        let d = c.get("d").unwrap();
        assert!(!d.deleted && d.rated.contains("y"));
        // Users without an entry are read from the store later, not invented.
        assert!(c.get("nobody").is_none());
    }

    /// Lifetimes are spread over [ttl / 2, ttl]: all present well before ttl / 2, none
    /// after ttl.
    #[test]
    fn entries_live_between_half_the_ttl_and_the_ttl() {
        // A 1 s lifetime: the check right after the inserts fails only if this thread
        // stalls for more than 0.5 s between them.
        let c = UserFactsCache::new(Duration::from_millis(1000), 100);
        let users: Vec<String> = (0..50).map(|k| format!("u{k}")).collect();
        for u in &users {
            c.insert(u, facts(&[]));
        }
        assert!(users.iter().all(|u| c.get(u).is_some()));
        std::thread::sleep(Duration::from_millis(1010));
        assert!(users.iter().all(|u| c.get(u).is_none()));
    }

    #[test]
    fn an_updated_entry_keeps_its_expiry() {
        let c = UserFactsCache::new(Duration::from_millis(50), 10);
        c.insert("a", facts(&["x"]));
        std::thread::sleep(Duration::from_millis(60));
        c.apply_ratings([("a", "y", 3.0)]);
        assert!(
            c.get("a").is_none(),
            "an update must not extend the entry's life"
        );
    }
}
