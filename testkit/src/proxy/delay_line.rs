//! [`Delay`], and the delay line that holds delayed chunks until they are
//! due.
//!
//! Why an OS thread and not `tokio::time::sleep`: tokio's timer counts whole
//! milliseconds, so a 0.2 ms delay would become 1 to 2 ms. One std thread,
//! started on first use and shared by every proxy in the process, keeps the
//! chunks in a heap ordered by due time, sleeps on a `Condvar` until shortly
//! before the earliest (with a timer slack of 1 ns, so the futex timeout
//! lands within a few µs) and spins the rest; a due chunk goes to its connection's tokio task over an
//! unbounded channel, which wakes the task at once. One thread for all
//! proxies: a machine with two cores can spare one thread that mostly
//! sleeps, not one per connection.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::sync::atomic::{self, AtomicBool};
use std::sync::{Condvar, Mutex, MutexGuard, Once, PoisonError};
use std::time::{Duration, Instant};

/// How long a [`TcpProxy`](super::TcpProxy) holds each chunk of bytes in
/// one direction before passing it on: a base, plus a uniformly random
/// extra in `0..=jitter` drawn per chunk.
///
/// Jitter never reorders bytes: a chunk is due at the later of the
/// previous chunk's due time (on that connection and direction) and now
/// plus its delay. [`Delay::NONE`], the default, forwards at once, without
/// going through the delay line.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use multilock_testkit::{Delay, Direction, RedisProcess, TcpProxy};
///
/// # async fn demo() -> std::io::Result<()> {
/// let server = RedisProcess::start().await?;
/// let proxy = TcpProxy::start(server.port()).await?;
/// let half_ms = Duration::from_micros(500);
/// proxy.set_delay(Direction::Both, Delay::jittered(half_ms, half_ms / 5));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Delay {
    base: Duration,
    jitter: Duration,
}

impl Delay {
    /// No delay: bytes are forwarded as soon as they are read.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use multilock_testkit::{Delay, Direction, TcpProxy};
    ///
    /// # fn demo(proxy: &TcpProxy) {
    /// proxy.set_delay(Direction::Both, Delay::NONE); // latency off again
    /// # }
    /// ```
    pub const NONE: Delay = Delay {
        base: Duration::ZERO,
        jitter: Duration::ZERO,
    };

    /// Exactly `delay` for every chunk (give or take ~10 µs of scheduling).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use multilock_testkit::{Delay, Direction, TcpProxy};
    ///
    /// # fn demo(proxy: &TcpProxy) {
    /// proxy.set_delay(Direction::ToServer, Delay::fixed(Duration::from_micros(200)));
    /// # }
    /// ```
    pub const fn fixed(delay: Duration) -> Delay {
        Delay {
            base: delay,
            jitter: Duration::ZERO,
        }
    }

    /// `base` plus a uniformly random extra in `0..=jitter`, drawn anew for
    /// every chunk.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use multilock_testkit::{Delay, Direction, TcpProxy};
    ///
    /// # fn demo(proxy: &TcpProxy) {
    /// let ms = Duration::from_millis(1);
    /// proxy.set_delay(Direction::ToClient, Delay::jittered(ms, ms)); // 1 to 2 ms
    /// # }
    /// ```
    pub const fn jittered(base: Duration, jitter: Duration) -> Delay {
        Delay { base, jitter }
    }

    /// The delay every chunk gets at least.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use multilock_testkit::Delay;
    ///
    /// let ms = Duration::from_millis(1);
    /// assert_eq!(Delay::jittered(ms, ms).base(), ms);
    /// ```
    pub const fn base(&self) -> Duration {
        self.base
    }

    /// The most a chunk's random extra can be.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use multilock_testkit::Delay;
    ///
    /// assert_eq!(Delay::fixed(Duration::from_millis(1)).jitter(), Duration::ZERO);
    /// ```
    pub const fn jitter(&self) -> Duration {
        self.jitter
    }

    /// Whether this is no delay at all ([`Delay::NONE`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use multilock_testkit::Delay;
    ///
    /// assert!(Delay::fixed(Duration::ZERO).is_none());
    /// ```
    pub const fn is_none(&self) -> bool {
        self.base.is_zero() && self.jitter.is_zero()
    }

    /// The delay of one chunk: the base plus a fresh random extra.
    pub(super) fn sample(&self) -> Duration {
        if self.jitter.is_zero() {
            return self.base;
        }
        let most = u64::try_from(self.jitter.as_nanos()).unwrap_or(u64::MAX);
        self.base
            .saturating_add(Duration::from_nanos(rand::random_range(0..=most)))
    }
}

/// How long before a chunk is due the line wakes to spin the rest, and so
/// the longest it spins at a time (a busy two-core machine must not be
/// starved by it). The thread's timer slack is 1 ns (Linux), so a `Condvar`
/// timeout lands within a few µs and the spin only covers the wake-up;
/// with the kernel's default slack it would land 50 to 80 µs late.
const SPIN: Duration = Duration::from_micros(15);

/// A chunk's delivery, waiting for its due time.
struct Scheduled {
    due: Instant,
    /// Ties broken in the order of scheduling, so chunks due at the same
    /// instant keep their order.
    seq: u64,
    deliver: Box<dyn FnOnce() + Send>,
}

impl Scheduled {
    fn key(&self) -> (Instant, u64) {
        (self.due, self.seq)
    }
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Scheduled {}

impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(&other.key())
    }
}

struct Queue {
    /// Earliest due first.
    heap: BinaryHeap<Reverse<Scheduled>>,
    next_seq: u64,
}

struct Line {
    queue: Mutex<Queue>,
    /// Signalled when a chunk becomes the earliest due.
    wake: Condvar,
    /// Set with the signal, for the thread while it spins (not waiting on
    /// the `Condvar`).
    earlier: AtomicBool,
}

static LINE: Line = Line {
    queue: Mutex::new(Queue {
        heap: BinaryHeap::new(),
        next_seq: 0,
    }),
    wake: Condvar::new(),
    earlier: AtomicBool::new(false),
};

static STARTED: Once = Once::new();

/// Calls `deliver` on the delay line's thread at `due` (at once if it is
/// past). Calls due at the same instant run in the order scheduled.
pub(super) fn schedule(due: Instant, deliver: impl FnOnce() + Send + 'static) {
    STARTED.call_once(|| {
        std::thread::Builder::new()
            .name("multilock-delay-line".into())
            .spawn(|| run(&LINE))
            .expect("the test kit's delay line needs a thread");
    });
    let mut queue = lock(&LINE);
    let seq = queue.next_seq;
    queue.next_seq += 1;
    let earliest = queue
        .heap
        .peek()
        .is_none_or(|Reverse(first)| due < first.due);
    queue.heap.push(Reverse(Scheduled {
        due,
        seq,
        deliver: Box::new(deliver),
    }));
    drop(queue);
    if earliest {
        LINE.earlier.store(true, atomic::Ordering::Release);
        LINE.wake.notify_one();
    }
}

fn lock(line: &Line) -> MutexGuard<'_, Queue> {
    // Deliveries run outside the lock: nothing can panic while holding it.
    line.queue.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The line's thread: waits for the earliest due chunk, delivers every
/// chunk due, forever.
fn run(line: &'static Line) {
    // Timed waits land on time, not up to 50 µs late (the default timer
    // slack). Linux only; elsewhere the spin is all the precision there is.
    let _ = std::fs::write("/proc/thread-self/timerslack_ns", "1");
    let mut due = Vec::new();
    loop {
        let mut queue = lock(line);
        while due.is_empty() {
            line.earlier.store(false, atomic::Ordering::Relaxed);
            let now = Instant::now();
            while let Some(Reverse(first)) = queue.heap.peek() {
                if first.due > now {
                    break;
                }
                if let Some(Reverse(first)) = queue.heap.pop() {
                    due.push(first.deliver);
                }
            }
            if !due.is_empty() {
                break;
            }
            match queue.heap.peek().map(|Reverse(first)| first.due - now) {
                None => {
                    queue = line
                        .wake
                        .wait(queue)
                        .unwrap_or_else(PoisonError::into_inner)
                }
                Some(left) if left > SPIN => {
                    queue = line
                        .wake
                        .wait_timeout(queue, left - SPIN)
                        .map_or_else(|poisoned| poisoned.into_inner().0, |(queue, _)| queue);
                }
                Some(left) => {
                    // Spin without the lock, so proxies can still schedule;
                    // a chunk due earlier cuts the spin short. No yielding:
                    // on a loaded machine a yield gives the core away for a
                    // whole time slice, milliseconds.
                    drop(queue);
                    let until = Instant::now() + left;
                    while Instant::now() < until && !line.earlier.load(atomic::Ordering::Acquire) {
                        std::hint::spin_loop();
                    }
                    queue = lock(line);
                }
            }
        }
        drop(queue);
        for deliver in due.drain(..) {
            deliver();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn delivers_in_due_order_and_not_early() {
        let (tx, rx) = mpsc::channel();
        let start = Instant::now();
        for (i, micros) in [(0, 900), (1, 300), (2, 300), (3, 0)] {
            let tx = tx.clone();
            let due = start + Duration::from_micros(micros);
            schedule(due, move || tx.send((i, Instant::now() >= due)).unwrap());
        }
        let order: Vec<_> = (0..4).map(|_| rx.recv().unwrap()).collect();
        assert_eq!(order, [(3, true), (1, true), (2, true), (0, true)]);
    }

    #[test]
    fn jitter_stays_in_bounds() {
        let ms = Duration::from_millis(1);
        let delay = Delay::jittered(ms, ms);
        for _ in 0..1000 {
            let d = delay.sample();
            assert!(d >= ms && d <= 2 * ms, "{d:?}");
        }
        assert_eq!(Delay::fixed(ms).sample(), ms);
        assert!(Delay::default().is_none());
    }
}
