//! The worker pool of a peer's job service: a fixed number of threads with work stealing.
//!
//! # Job
//! [`WorkerPool`] runs boxed closures on `workers` threads. The deques are crossbeam's
//! (`crossbeam-deque`, the Chase–Lev deque): work submitted from outside the pool goes to
//! a shared injector; work submitted by a job running on a worker goes to that worker's
//! own deque (LIFO, cache-warm); an idle worker takes a batch from the injector, then
//! steals from the other workers' deques (counted in [`PoolStats::steals`]).
//!
//! # Invariants
//! - A closure runs exactly once, on a pool thread, unless the pool is shut down first
//!   (then it is dropped unrun, which callers observe as a dropped result channel).
//! - A panicking closure never takes its worker down: the pool catches it (the job layer
//!   catches it first to report it; this is the backstop).
//! - Idle workers sleep on a condition variable; a submission wakes one (a fence on each
//!   side: the submitter sees the sleeper or the sleeper sees the work), and a timeout of
//!   50 ms bounds the cost of any wake-up missed all the same.
//!
//! # Who calls it
//! [`crate::service::ComputeService`] (jobs from the network and local submissions) and
//! the `myriad bench jobs` benchmark.

use std::cell::RefCell;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_deque::{Injector, Steal, Stealer, Worker};
use parking_lot::{Condvar, Mutex};

/// A unit of work.
pub type Work = Box<dyn FnOnce() + Send + 'static>;

/// Longest [`WorkerPool::shutdown`] waits for the workers' running closures.
pub const SHUTDOWN_WAIT: Duration = Duration::from_secs(2);

/// Longest an idle worker sleeps before it looks for work again.
const IDLE_SLEEP: Duration = Duration::from_millis(50);

/// Counters of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Worker threads.
    pub workers: usize,
    /// Closures run.
    pub executed: u64,
    /// Closures a worker took from another worker's deque.
    pub steals: u64,
    /// Closures queued and not yet started.
    pub queued: u64,
}

struct Shared {
    id: usize,
    injector: Injector<Work>,
    stealers: Vec<Stealer<Work>>,
    sleep_lock: Mutex<()>,
    wake: Condvar,
    sleepers: AtomicUsize,
    stop: AtomicBool,
    executed: AtomicU64,
    steals: AtomicU64,
    submitted: AtomicU64,
}

/// A fixed-size pool of worker threads with work stealing. See the module documentation.
pub struct WorkerPool {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for WorkerPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerPool")
            .field("stats", &self.stats())
            .finish()
    }
}

static NEXT_POOL: AtomicUsize = AtomicUsize::new(1);

thread_local! {
    /// The deque of the pool worker running on this thread: (pool id, deque).
    static LOCAL: RefCell<Option<(usize, Worker<Work>)>> = const { RefCell::new(None) };
}

impl WorkerPool {
    /// Starts `workers` threads (at least one) named `{name}-{i}`.
    pub fn new(name: &str, workers: usize) -> std::io::Result<WorkerPool> {
        let workers = workers.max(1);
        let deques: Vec<Worker<Work>> = (0..workers).map(|_| Worker::new_lifo()).collect();
        let shared = Arc::new(Shared {
            id: NEXT_POOL.fetch_add(1, Ordering::Relaxed),
            injector: Injector::new(),
            stealers: deques.iter().map(Worker::stealer).collect(),
            sleep_lock: Mutex::new(()),
            wake: Condvar::new(),
            sleepers: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            executed: AtomicU64::new(0),
            steals: AtomicU64::new(0),
            submitted: AtomicU64::new(0),
        });
        let pool = WorkerPool {
            shared: Arc::clone(&shared),
            threads: Mutex::new(Vec::with_capacity(workers)),
        };
        for (index, deque) in deques.into_iter().enumerate() {
            let shared = Arc::clone(&shared);
            let thread = std::thread::Builder::new()
                .name(format!("{name}-{index}"))
                .spawn(move || worker_loop(&shared, index, deque))?;
            pool.threads.lock().push(thread);
        }
        Ok(pool)
    }

    /// Queues `work`: on the current worker's own deque when called from a job of this
    /// pool, else on the shared injector.
    pub fn spawn(&self, work: Work) {
        self.shared.submitted.fetch_add(1, Ordering::Relaxed);
        let id = self.shared.id;
        let work = LOCAL.with(|local| match &*local.borrow() {
            Some((pool, deque)) if *pool == id => {
                deque.push(work);
                None
            }
            _ => Some(work),
        });
        if let Some(work) = work {
            self.shared.injector.push(work);
        }
        // Pairs with the fence in `sleep`: either this sees the sleeper, or the sleeper
        // sees the work.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.shared.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = self.shared.sleep_lock.lock();
            self.shared.wake.notify_one();
        }
    }

    /// The pool's counters.
    pub fn stats(&self) -> PoolStats {
        let executed = self.shared.executed.load(Ordering::Relaxed);
        PoolStats {
            workers: self.shared.stealers.len(),
            executed,
            steals: self.shared.steals.load(Ordering::Relaxed),
            queued: self
                .shared
                .submitted
                .load(Ordering::Relaxed)
                .saturating_sub(executed),
        }
    }

    /// Number of worker threads.
    pub fn workers(&self) -> usize {
        self.shared.stealers.len()
    }

    /// Stops the workers after the closures they are running; queued closures are
    /// dropped unrun. Waits for the threads at most [`SHUTDOWN_WAIT`] in all (a job that
    /// runs longer is left to finish on its own thread), never from one of them.
    pub fn shutdown(&self) {
        self.shared.stop.store(true, Ordering::Release);
        {
            let _guard = self.shared.sleep_lock.lock();
            self.shared.wake.notify_all();
        }
        let threads = std::mem::take(&mut *self.threads.lock());
        let me = std::thread::current().id();
        let deadline = std::time::Instant::now() + SHUTDOWN_WAIT;
        for thread in threads {
            if thread.thread().id() == me {
                continue;
            }
            while !thread.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            if thread.is_finished() {
                let _ = thread.join();
            }
        }
        // Queued closures are dropped unrun (their result channels close).
        while !matches!(self.shared.injector.steal(), Steal::Empty) {}
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn worker_loop(shared: &Arc<Shared>, index: usize, deque: Worker<Work>) {
    LOCAL.with(|local| *local.borrow_mut() = Some((shared.id, deque)));
    while !shared.stop.load(Ordering::Acquire) {
        match find_work(shared, index) {
            Some(work) => {
                // The job layer reports panics; this keeps the worker alive regardless.
                let _ = std::panic::catch_unwind(AssertUnwindSafe(work));
                shared.executed.fetch_add(1, Ordering::Relaxed);
            }
            None => sleep(shared),
        }
    }
    LOCAL.with(|local| {
        if let Some((_, deque)) = local.borrow_mut().take() {
            while deque.pop().is_some() {}
        }
    });
}

fn find_work(shared: &Shared, index: usize) -> Option<Work> {
    let own = LOCAL.with(|local| local.borrow().as_ref().and_then(|(_, deque)| deque.pop()));
    if own.is_some() {
        return own;
    }
    loop {
        let from_injector = LOCAL.with(|local| {
            let local = local.borrow();
            match local.as_ref() {
                Some((_, deque)) => shared.injector.steal_batch_and_pop(deque),
                None => shared.injector.steal(),
            }
        });
        match from_injector {
            Steal::Success(work) => return Some(work),
            Steal::Retry => continue,
            Steal::Empty => {}
        }
        let mut retry = false;
        let count = shared.stealers.len();
        for offset in 1..count {
            match shared.stealers[(index + offset) % count].steal() {
                Steal::Success(work) => {
                    shared.steals.fetch_add(1, Ordering::Relaxed);
                    return Some(work);
                }
                Steal::Retry => retry = true,
                Steal::Empty => {}
            }
        }
        if !retry {
            return None;
        }
    }
}

fn sleep(shared: &Shared) {
    let mut guard = shared.sleep_lock.lock();
    shared.sleepers.fetch_add(1, Ordering::SeqCst);
    std::sync::atomic::fence(Ordering::SeqCst);
    let idle = shared.injector.is_empty()
        && shared.stealers.iter().all(Stealer::is_empty)
        && !shared.stop.load(Ordering::Acquire);
    if idle {
        shared.wake.wait_for(&mut guard, IDLE_SLEEP);
    }
    shared.sleepers.fetch_sub(1, Ordering::AcqRel);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn runs_every_closure_once() {
        let pool = WorkerPool::new("t", 3).unwrap();
        let count = Arc::new(AtomicU64::new(0));
        let (done, finished) = mpsc::channel();
        for _ in 0..1000 {
            let count = Arc::clone(&count);
            let done = done.clone();
            pool.spawn(Box::new(move || {
                count.fetch_add(1, Ordering::Relaxed);
                let _ = done.send(());
            }));
        }
        for _ in 0..1000 {
            finished.recv_timeout(Duration::from_secs(10)).unwrap();
        }
        assert_eq!(count.load(Ordering::Relaxed), 1000);
        // The counter goes up just after each closure returns.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while pool.stats().executed < 1000 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(pool.stats().executed, 1000);
        assert_eq!(pool.stats().queued, 0);
    }

    #[test]
    fn nested_work_is_stolen_by_idle_workers() {
        let pool = Arc::new(WorkerPool::new("t", 4).unwrap());
        let (done, finished) = mpsc::channel();
        let inner = Arc::clone(&pool);
        // One job fans out 400 slow children onto its own deque: the others must steal.
        pool.spawn(Box::new(move || {
            for _ in 0..400 {
                let done = done.clone();
                inner.spawn(Box::new(move || {
                    std::thread::sleep(Duration::from_micros(200));
                    let _ = done.send(std::thread::current().name().map(str::to_owned));
                }));
            }
        }));
        let mut threads = std::collections::HashSet::new();
        for _ in 0..400 {
            threads.insert(finished.recv_timeout(Duration::from_secs(10)).unwrap());
        }
        assert!(pool.stats().steals > 0, "{:?}", pool.stats());
        assert!(threads.len() > 1, "children ran on {threads:?}");
        pool.shutdown();
    }

    #[test]
    fn shutdown_does_not_wait_for_a_stuck_closure() {
        let pool = WorkerPool::new("t", 1).unwrap();
        let (started, running) = mpsc::channel();
        pool.spawn(Box::new(move || {
            let _ = started.send(());
            std::thread::sleep(Duration::from_secs(20));
        }));
        running.recv_timeout(Duration::from_secs(10)).unwrap();
        let (ran, never_ran) = mpsc::channel::<()>();
        pool.spawn(Box::new(move || {
            let _ = ran.send(());
        }));
        let begun = std::time::Instant::now();
        pool.shutdown();
        assert!(begun.elapsed() < SHUTDOWN_WAIT + Duration::from_secs(2));
        // The queued closure was dropped unrun: its sender is gone without a message.
        assert_eq!(
            never_ran.recv_timeout(Duration::from_secs(1)),
            Err(mpsc::RecvTimeoutError::Disconnected)
        );
    }

    #[test]
    fn a_panicking_closure_leaves_the_worker_running() {
        let pool = WorkerPool::new("t", 1).unwrap();
        pool.spawn(Box::new(|| panic!("boom")));
        let (done, finished) = mpsc::channel();
        pool.spawn(Box::new(move || {
            let _ = done.send(7);
        }));
        assert_eq!(finished.recv_timeout(Duration::from_secs(10)).unwrap(), 7);
    }
}
