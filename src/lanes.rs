//! Where the service's work runs, so that reads cannot starve writes (issue 12).
//!
//! Requests are handled on actix's workers (two single-threaded runtimes). A store write
//! is a chain of small awaits (queue place, BEGIN, checks, upserts, COMMIT), and each
//! await on a worker waits behind every ready request of that worker: under a closed-loop
//! read load the chain of one 100-rating batch took hundreds of milliseconds although
//! the database work is a few. So the service runs its writes and its releases on lanes
//! of their own:
//!
//! - the **write lane** runs ingestion's store transaction: one thread that has nothing
//!   else to do, so each await resumes as soon as the database answers;
//! - the **release lane** runs release jobs (snapshot, admission, training, ledger
//!   commit) at a lower OS priority (nice 10, [`lower_thread_priority`]), its blocking
//!   pool and training's rayon pool too ([`background_rayon_pool`]): a release takes the
//!   CPU that requests leave over. Its ledger transactions hold SQLite's write queue only
//!   while the database works (the lane thread waits on the database's own thread, which
//!   keeps normal priority), so writers do not wait on a starved release.
//!
//! A lane is a current-thread tokio runtime on a thread of its own; dropping the [`Lane`]
//! stops it (tasks still queued are dropped, blocking work already started finishes in
//! the background).

use std::future::Future;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// A single-threaded runtime on its own OS thread.
pub struct Lane {
    handle: Handle,
    stop: Option<oneshot::Sender<()>>,
}

impl Lane {
    /// Starts a lane whose thread is named `name`, at normal priority.
    pub fn start(name: &str) -> std::io::Result<Self> {
        Self::start_with(name, false)
    }

    /// Starts a lane whose threads (its own and its blocking pool) all run at nice 10:
    /// for work that should only take the CPU requests leave over (releases).
    pub fn start_background(name: &str) -> std::io::Result<Self> {
        Self::start_with(name, true)
    }

    fn start_with(name: &str, background: bool) -> std::io::Result<Self> {
        let mut builder = tokio::runtime::Builder::new_current_thread();
        builder.enable_all().thread_name(format!("{name}-blocking"));
        if background {
            builder.on_thread_start(|| std::mem::forget(lower_thread_priority()));
        }
        let rt = builder.build()?;
        let handle = rt.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                if background {
                    std::mem::forget(lower_thread_priority());
                }
                // Either a stop signal or the Lane dropped: both end the wait.
                let _ = rt.block_on(stopped);
                rt.shutdown_background();
            })?;
        Ok(Self {
            handle,
            stop: Some(stop),
        })
    }

    /// Runs `fut` on the lane and waits for its output. A panic in `fut` is resumed
    /// here; a lane that was stopped before `fut` finished is an error.
    pub async fn run<F>(&self, fut: F) -> Result<F::Output, LaneStopped>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match self.handle.spawn(fut).await {
            Ok(out) => Ok(out),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(LaneStopped),
        }
    }

    /// Starts `fut` on the lane without waiting for it.
    pub fn spawn<F>(&self, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        drop(self.handle.spawn(fut));
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The lane stopped (the service is shutting down) before the work finished.
#[derive(Debug, thiserror::Error)]
#[error("the service is shutting down")]
pub struct LaneStopped;

/// Lowers the calling thread's OS scheduling priority to nice 10 (Linux; elsewhere a
/// no-op) and returns a guard that restores the previous value when dropped. Used
/// around training: a CPU-bound release then runs on what the request workers leave.
pub fn lower_thread_priority() -> PriorityGuard {
    PriorityGuard::lower(10)
}

/// Builds the global rayon pool (training's parallel loops) with its threads at nice 10,
/// like the training thread. `dprec serve` calls it once at start, before any parallel
/// work; when the pool exists already it changes nothing.
pub fn background_rayon_pool() {
    let _ = rayon::ThreadPoolBuilder::new()
        .thread_name(|k| format!("dprec-train-{k}"))
        .start_handler(|_| std::mem::forget(lower_thread_priority()))
        .build_global();
}

/// Restores a thread's nice value on drop (see [`lower_thread_priority`]).
pub struct PriorityGuard {
    #[cfg(target_os = "linux")]
    previous: Option<libc::c_int>,
}

#[cfg(target_os = "linux")]
impl PriorityGuard {
    fn lower(nice: libc::c_int) -> Self {
        // SAFETY: gettid and get/setpriority take plain integers and touch no memory of
        // ours; on Linux PRIO_PROCESS with a thread id addresses that one thread.
        let previous = unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            *libc::__errno_location() = 0;
            let old = libc::getpriority(libc::PRIO_PROCESS, tid);
            let read_ok = *libc::__errno_location() == 0;
            (read_ok && old < nice && libc::setpriority(libc::PRIO_PROCESS, tid, nice) == 0)
                .then_some(old)
        };
        Self { previous }
    }

    /// The thread's nice value now (tests).
    #[cfg(test)]
    pub fn current_nice() -> libc::c_int {
        // SAFETY: as in `lower`.
        unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            libc::getpriority(libc::PRIO_PROCESS, tid)
        }
    }
}

#[cfg(target_os = "linux")]
impl Drop for PriorityGuard {
    fn drop(&mut self) {
        if let Some(old) = self.previous {
            // Raising the priority back needs CAP_SYS_NICE unless RLIMIT_NICE allows it;
            // when refused the thread stays at the lower priority (it is a blocking-pool
            // thread of the release lane, which only runs release work).
            // SAFETY: as in `lower`.
            unsafe {
                let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
                libc::setpriority(libc::PRIO_PROCESS, tid, old);
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
impl PriorityGuard {
    fn lower(_nice: i32) -> Self {
        Self {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_runs_on_the_lane_thread_and_returns_its_output() {
        let lane = Lane::start("test-lane").unwrap();
        let name = lane
            .run(async { std::thread::current().name().map(str::to_owned) })
            .await
            .unwrap();
        assert_eq!(name.as_deref(), Some("test-lane"));
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_background_lane_runs_at_nice_10_and_its_blocking_pool_too() {
        let lane = Lane::start_background("test-lane-bg").unwrap();
        let (own, blocking) = lane
            .run(async {
                let own = PriorityGuard::current_nice();
                let blocking = tokio::task::spawn_blocking(PriorityGuard::current_nice)
                    .await
                    .unwrap();
                (own, blocking)
            })
            .await
            .unwrap();
        assert!(own >= 10 && blocking >= 10, "nice {own} / {blocking}");
    }

    #[tokio::test]
    async fn a_stopped_lane_refuses_work() {
        let lane = Lane::start("test-lane-stop").unwrap();
        let handle = lane.handle.clone();
        drop(lane);
        // The runtime shuts down on its own thread; wait until it refuses new tasks.
        let mut refused = false;
        for _ in 0..200 {
            if handle.spawn(async {}).await.is_err() {
                refused = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert!(refused, "a dropped lane still runs tasks");
    }

    #[tokio::test]
    #[should_panic(expected = "boom")]
    async fn a_panic_on_the_lane_reaches_the_caller() {
        let lane = Lane::start("test-lane-panic").unwrap();
        let _ = lane.run(async { panic!("boom") }).await;
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn training_priority_is_lowered_on_the_calling_thread_only() {
        let outer = PriorityGuard::current_nice();
        let (lowered_tx, lowered_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let worker = std::thread::spawn(move || {
            let g = lower_thread_priority();
            lowered_tx.send(PriorityGuard::current_nice()).unwrap();
            done_rx.recv().unwrap();
            drop(g);
        });
        let inside = lowered_rx.recv().unwrap();
        assert_eq!(inside, outer.max(10), "the training thread runs at nice 10");
        assert_eq!(
            PriorityGuard::current_nice(),
            outer,
            "other threads keep theirs"
        );
        done_tx.send(()).unwrap();
        worker.join().unwrap();
    }
}
