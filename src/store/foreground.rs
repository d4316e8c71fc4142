//! Whether requests are being served: what a release's ledger commit asks before it
//! steps aside between two of its transactions.
//!
//! A commit at ML-20M size is thousands of short transactions. Pausing after each one
//! as long as it took keeps concurrent ingestion and top-N within their targets (issue
//! 12), but when no request arrives the pauses are half of the commit (60 s of 134 s at
//! 20M ratings on SQLite, lab note bench-04). The HTTP layer counts the requests it
//! starts and holds a guard while each runs (dropped with the request, finished or not);
//! the commit pauses only after a stretch in which a request started or was running.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Requests started and in flight in this process (shared by the store's clones).
#[derive(Debug, Clone, Default)]
pub struct Foreground(Arc<Counters>);

#[derive(Debug, Default)]
struct Counters {
    started: AtomicU64,
    in_flight: AtomicU64,
}

/// Held while a request runs; dropping it ends the request.
#[derive(Debug)]
pub struct RequestGuard(Foreground);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0 .0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A point in the request count, to ask later whether anything happened since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark(u64);

impl Foreground {
    /// A request starts; it is in flight until the guard is dropped.
    pub fn request(&self) -> RequestGuard {
        self.0.started.fetch_add(1, Ordering::Relaxed);
        self.0.in_flight.fetch_add(1, Ordering::Relaxed);
        RequestGuard(self.clone())
    }

    /// Now, for a later [`Foreground::busy_since`].
    pub fn mark(&self) -> Mark {
        Mark(self.0.started.load(Ordering::Relaxed))
    }

    /// Whether a request started after `mark` or one is running now.
    pub fn busy_since(&self, mark: Mark) -> bool {
        self.0.in_flight.load(Ordering::Relaxed) > 0 || self.mark() != mark
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_while_a_request_runs_and_after_one_started() {
        let f = Foreground::default();
        let m = f.mark();
        assert!(!f.busy_since(m), "nothing happened");
        let guard = f.clone().request();
        assert!(f.busy_since(m), "a request started");
        let m2 = f.mark();
        assert!(f.busy_since(m2), "it is still running");
        drop(guard);
        assert!(
            !f.busy_since(m2),
            "it ended before the mark's stretch closed"
        );
        assert!(f.busy_since(m), "but it started after the first mark");
    }
}
