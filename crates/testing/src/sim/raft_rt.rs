//! The simulated superpeer group's async runtime: openraft's [`DeterministicRng`] over
//! Tokio, with a watch channel that wakes its waiters in the order they waited.
//!
//! Job: Tokio's `sync::watch` spreads a channel's waiters over eight notification shards
//! picked with the thread's random generator (seeded from the OS unless Tokio is built
//! with `tokio_unstable`), so two tasks waiting on one channel wake in a random order and
//! a simulated run of openraft does not replay from its seed. [`SimRt`] is
//! `DeterministicRng<TokioRuntime>` with [`SimWatch`] in place of Tokio's watch; every
//! other part (tasks, timers, channels, the seeded random generator) is delegated.
//!
//! Invariants: a [`SimWatch`] send wakes every waiter registered since the last send, in
//! registration order; a receiver sees each version at most once through `changed`.
//!
//! Callers: [`super::raft`] only (its type configuration).

use std::future::{poll_fn, Future};
use std::io;
use std::ops::Deref;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};
use std::time::Duration;

use openraft::rt::deterministic_rng::DeterministicRng;
use openraft::rt::watch::{self, RecvError, SendError};
use openraft::rt::{Select2, Select3, Select4};
use openraft::{AsyncRuntime, OptionalSend, OptionalSync};
use openraft_rt_tokio::TokioRuntime;

type Inner = DeterministicRng<TokioRuntime>;

/// The simulation's runtime (see the module docs).
#[derive(Debug)]
pub struct SimRt {
    inner: Inner,
}

impl AsyncRuntime for SimRt {
    type JoinError = <Inner as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <Inner as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <Inner as AsyncRuntime>::Sleep;
    type Instant = <Inner as AsyncRuntime>::Instant;
    type TimeoutError = <Inner as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = <Inner as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = <Inner as AsyncRuntime>::ThreadLocalRng;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        Inner::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        Inner::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        Inner::sleep_until(deadline)
    }

    fn timeout<R, F>(duration: Duration, future: F) -> Self::Timeout<R, F>
    where
        F: Future<Output = R> + OptionalSend,
    {
        Inner::timeout(duration, future)
    }

    fn timeout_at<R, F>(deadline: Self::Instant, future: F) -> Self::Timeout<R, F>
    where
        F: Future<Output = R> + OptionalSend,
    {
        Inner::timeout_at(deadline, future)
    }

    fn select2<A, B>(
        a: A,
        b: B,
    ) -> impl Future<Output = Select2<A::Output, B::Output>> + OptionalSend
    where
        A: Future + OptionalSend,
        B: Future + OptionalSend,
    {
        Inner::select2(a, b)
    }

    fn select3<A, B, C>(
        a: A,
        b: B,
        c: C,
    ) -> impl Future<Output = Select3<A::Output, B::Output, C::Output>> + OptionalSend
    where
        A: Future + OptionalSend,
        B: Future + OptionalSend,
        C: Future + OptionalSend,
    {
        Inner::select3(a, b, c)
    }

    fn select4<A, B, C, D>(
        a: A,
        b: B,
        c: C,
        d: D,
    ) -> impl Future<Output = Select4<A::Output, B::Output, C::Output, D::Output>> + OptionalSend
    where
        A: Future + OptionalSend,
        B: Future + OptionalSend,
        C: Future + OptionalSend,
        D: Future + OptionalSend,
    {
        Inner::select4(a, b, c, d)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        Inner::is_panic(join_error)
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        Inner::thread_rng()
    }

    type Mpsc = <Inner as AsyncRuntime>::Mpsc;
    type Watch = SimWatch;
    type Oneshot = <Inner as AsyncRuntime>::Oneshot;
    type Mutex<T: OptionalSend + 'static> = <Inner as AsyncRuntime>::Mutex<T>;

    fn new(threads: usize) -> Self {
        SimRt {
            inner: Inner::new(threads),
        }
    }

    fn block_on<F, T>(&mut self, future: F) -> T
    where
        F: Future<Output = T>,
    {
        self.inner.block_on(future)
    }

    fn spawn_blocking<F, T>(f: F) -> impl Future<Output = Result<T, io::Error>> + Send
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        Inner::spawn_blocking(f)
    }
}

/// A watch channel's shared state.
#[derive(Debug)]
struct Shared<T> {
    value: T,
    version: u64,
    senders: usize,
    /// Waiters since the last send, in the order they waited.
    waiters: Vec<Waker>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The deterministic watch channel (see the module docs).
#[derive(Debug)]
pub struct SimWatch;

/// The sending half.
#[derive(Debug)]
pub struct Sender<T> {
    shared: Arc<Mutex<Shared<T>>>,
}

/// The receiving half.
#[derive(Debug)]
pub struct Receiver<T> {
    shared: Arc<Mutex<Shared<T>>>,
    seen: u64,
}

/// A borrow of the current value (holds the channel's lock).
pub struct Ref<'a, T> {
    guard: MutexGuard<'a, Shared<T>>,
}

impl<T> Deref for Ref<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.guard.value
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        lock(&self.shared).senders += 1;
        Sender {
            shared: self.shared.clone(),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let waiters = {
            let mut shared = lock(&self.shared);
            shared.senders -= 1;
            if shared.senders > 0 {
                return;
            }
            std::mem::take(&mut shared.waiters)
        };
        for waker in waiters {
            waker.wake();
        }
    }
}

impl<T> Clone for Receiver<T> {
    fn clone(&self) -> Self {
        Receiver {
            shared: self.shared.clone(),
            seen: self.seen,
        }
    }
}

impl watch::Watch for SimWatch {
    type Sender<T: OptionalSend + OptionalSync> = Sender<T>;
    type Receiver<T: OptionalSend + OptionalSync> = Receiver<T>;
    type Ref<'a, T: OptionalSend + 'a> = Ref<'a, T>;

    fn channel<T: OptionalSend + OptionalSync>(init: T) -> (Sender<T>, Receiver<T>) {
        let shared = Arc::new(Mutex::new(Shared {
            value: init,
            version: 0,
            senders: 1,
            waiters: Vec::new(),
        }));
        (
            Sender {
                shared: shared.clone(),
            },
            Receiver { shared, seen: 0 },
        )
    }
}

impl<T> Sender<T> {
    /// Changes the value with `modify`; if it reports a change, a new version wakes every
    /// waiter in order.
    fn modify(&self, modify: impl FnOnce(&mut T) -> bool) -> bool {
        let waiters = {
            let mut shared = lock(&self.shared);
            if !modify(&mut shared.value) {
                return false;
            }
            shared.version += 1;
            std::mem::take(&mut shared.waiters)
        };
        for waker in waiters {
            waker.wake();
        }
        true
    }
}

impl<T> watch::WatchSender<SimWatch, T> for Sender<T>
where
    T: OptionalSend + OptionalSync,
{
    fn send(&self, value: T) -> Result<(), SendError<T>> {
        // Like Tokio's, a send succeeds also without receivers left is not tracked here:
        // openraft keeps its receivers for the channel's life.
        self.modify(|slot| {
            *slot = value;
            true
        });
        Ok(())
    }

    fn send_if_modified<F>(&self, modify: F) -> bool
    where
        F: FnOnce(&mut T) -> bool,
    {
        self.modify(modify)
    }

    fn borrow_watched(&self) -> Ref<'_, T> {
        Ref {
            guard: lock(&self.shared),
        }
    }

    fn subscribe(&self) -> Receiver<T> {
        let seen = lock(&self.shared).version;
        Receiver {
            shared: self.shared.clone(),
            seen,
        }
    }
}

impl<T> watch::WatchReceiver<SimWatch, T> for Receiver<T>
where
    T: OptionalSend + OptionalSync,
{
    async fn changed(&mut self) -> Result<(), RecvError> {
        poll_fn(|cx| {
            let mut shared = lock(&self.shared);
            if shared.version != self.seen {
                self.seen = shared.version;
                return Poll::Ready(Ok(()));
            }
            if shared.senders == 0 {
                return Poll::Ready(Err(RecvError(())));
            }
            if !shared.waiters.iter().any(|w| w.will_wake(cx.waker())) {
                shared.waiters.push(cx.waker().clone());
            }
            Poll::Pending
        })
        .await
    }

    fn borrow_watched(&self) -> Ref<'_, T> {
        Ref {
            guard: lock(&self.shared),
        }
    }

    fn borrow_and_update(&mut self) -> Ref<'_, T> {
        let guard = lock(&self.shared);
        self.seen = guard.version;
        Ref { guard }
    }
}
