//! Per-user serving facts (deleted or not, which items the user rated), kept in memory so
//! that a top-N answer comes from memory, not from the store (DESIGN 6).
//!
//! An entry is read from the store on first use and dropped at once when this process
//! writes that user's ratings or deletes them; entries also expire after `ttl`, so writes
//! made through another replica on the same database are seen within that time.

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
}

impl UserFacts {
    /// Facts from the user's stored ratings.
    pub fn new(deleted: bool, ratings: Vec<(String, f64)>) -> Self {
        Self {
            deleted,
            rated: ratings.iter().map(|(i, _)| i.clone()).collect(),
            ratings,
        }
    }
}

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
    pub fn insert(&self, user: &str, facts: Arc<UserFacts>) {
        let mut map = self.lock();
        if map.len() >= self.capacity && !map.contains_key(user) {
            map.clear();
        }
        map.insert(user.to_owned(), (Instant::now(), facts));
    }

    /// Drops the entries of `users` (after this process wrote their ratings).
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
}
