//! One timer per fan-out: how a multi-node request (a round's acquire, an
//! unlock) waits for its nodes' answers, bounded by the per-node timeout
//! before its quorum and by a short grace after it.
//!
//! Why one timer, armed as the requests leave, a few milliseconds out.
//! Tokio's timer driver wakes a parked worker (an eventfd write, then a
//! context switch) whenever a timer is registered earlier than the
//! driver's next wake-up, and a timer dropped before its deadline still
//! wakes the driver then, if it was the earliest. A timer armed while the
//! requests leave costs little: their connections' tasks are being woken
//! anyway. One armed later, once the quorum answered and the workers are
//! parked waiting for the rest, wakes one of them for nothing; and a
//! deadline a millisecond out, dropped when the answers come, wakes the
//! driver every millisecond. On 2 cores, one task locking a 5-node RedLock
//! on loopback spent about 5 % of each lock+unlock on such wake-ups, with
//! five per-node timeouts and a grace per round and a grace per unlock
//! (BENCHMARKS.md).
//!
//! So the timer is armed once, with the requests, where the lock's last
//! fan-out ([`Pace`]) says this one's grace will end, and at least
//! [`SLACK`] out. Once the quorum answered, the timer is kept when it ends
//! within the grace the answers call for ([`policy::grace`]: from half of
//! it to twice it, or to [`SLACK`]), and moved only when it does not: a
//! fan-out much faster or slower than the last. The per-node timeout is
//! the fan-out's cut-off: every request of a fan-out left at once, with
//! the same timeout.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::time::{Instant, Sleep};

use super::policy;

/// The earliest a fan-out's timer is armed for, from its start: the grace
/// of a fan-out that reached its quorum sooner may last until then (a
/// frozen node costs a round that much more, until it is suspect).
pub(crate) const SLACK: Duration = Duration::from_millis(5);

/// How long a multi-node lock's last fan-out took to reach its quorum,
/// shared by the lock's handles and guards: the next fan-out arms its
/// timer at the end of the grace that time calls for.
#[derive(Debug, Default)]
pub(crate) struct Pace {
    /// Microseconds (0 until a fan-out reached its quorum).
    quorum_after_us: AtomicU64,
}

impl Pace {
    fn record(&self, quorum_after: Duration) {
        let us = u64::try_from(quorum_after.as_micros()).unwrap_or(u64::MAX);
        self.quorum_after_us.store(us, Ordering::Relaxed);
    }

    /// When the grace of a fan-out as fast as the last one would end,
    /// counted from its start, at least [`SLACK`] (before any fan-out
    /// reached its quorum: [`SLACK`]), with a grace of at most `cap`.
    fn expected_end(&self, cap: Duration) -> Duration {
        let quorum_after = Duration::from_micros(self.quorum_after_us.load(Ordering::Relaxed));
        (quorum_after + policy::grace(quorum_after))
            .max(SLACK)
            .min(quorum_after.saturating_add(cap))
    }
}

/// What a fan-out's wait gave.
pub(crate) enum Next<T> {
    /// A node answered.
    Answer(T),
    /// Every node answered.
    Done,
    /// The quorum answered and the others had their grace.
    GraceOver,
    /// The per-node timeout passed before the quorum answered: every
    /// request still unanswered is overdue.
    CutOff,
}

/// The timer of one fan-out: see the module docs.
pub(crate) struct FanOutTimer {
    started: Instant,
    /// The per-node timeout, counted from `started`: `None` for a fan-out
    /// whose requests carry their own (an unlock's releases).
    cut_off: Option<Instant>,
    /// The longest grace.
    cap: Duration,
    pace: Arc<Pace>,
    /// Boxed: a fan-out's future is moved into a task or a box anyway, and
    /// the timer must stay pinned while it is armed.
    timer: Pin<Box<Sleep>>,
    armed: bool,
    quorum_reached: bool,
}

impl FanOutTimer {
    /// The timer of a fan-out whose requests leave now. Armed at the first
    /// [`FanOutTimer::next`], after the requests were sent.
    pub(crate) fn new(pace: &Arc<Pace>, cut_off: Option<Duration>, cap: Duration) -> FanOutTimer {
        let started = Instant::now();
        let cut_off = cut_off.map(|timeout| started + timeout);
        let mut first = started + pace.expected_end(cap);
        if let Some(cut_off) = cut_off {
            first = first.min(cut_off);
        }
        FanOutTimer {
            started,
            cut_off,
            cap,
            pace: pace.clone(),
            timer: Box::pin(tokio::time::sleep_until(first)),
            armed: true,
            quorum_reached: false,
        }
    }

    /// When the fan-out's requests left.
    pub(crate) fn started(&self) -> Instant {
        self.started
    }

    /// The next answer of `answers`, or why the wait is over.
    ///
    /// Cancel safe: the answers stay in `answers`.
    pub(crate) async fn next<S: Stream + Unpin>(&mut self, answers: &mut S) -> Next<S::Item> {
        loop {
            tokio::select! {
                // Answers first: the requests are sent before the timer is
                // armed, and an answer that is in beats a timer that ran out.
                biased;
                answer = answers.next() => {
                    return match answer {
                        Some(answer) => Next::Answer(answer),
                        None => Next::Done,
                    };
                }
                () = &mut self.timer, if self.armed => {
                    if self.quorum_reached {
                        return Next::GraceOver;
                    }
                    let now = Instant::now();
                    match self.cut_off {
                        Some(cut_off) if now >= cut_off => {
                            self.armed = false;
                            return Next::CutOff;
                        }
                        // Slower than the last fan-out: wait for the quorum
                        // up to the cut-off (if any).
                        Some(cut_off) => self.timer.as_mut().reset(cut_off),
                        None => self.armed = false,
                    }
                }
            }
        }
    }

    /// Marks the quorum as reached now, and returns how long it took. The
    /// others get [`policy::grace`] of it, at most the cap and never past
    /// the cut-off: the timer armed with the requests ends it if it ends
    /// between half of that and twice it (or [`SLACK`]), within the cap.
    pub(crate) fn quorum_reached(&mut self) -> Duration {
        let now = Instant::now();
        let after = now - self.started;
        self.pace.record(after);
        self.quorum_reached = true;
        let grace = policy::grace(after).min(self.cap);
        let mut ends = now + grace;
        if let Some(cut_off) = self.cut_off {
            ends = ends.min(cut_off);
        }
        let deadline = self.timer.deadline();
        let longest = (grace * 2).max(SLACK).min(self.cap);
        let close_enough = deadline >= now + grace / 2 && deadline <= now + longest;
        if !(self.armed && close_enough) {
            self.timer.as_mut().reset(ends);
            self.armed = true;
        }
        after
    }
}

#[cfg(test)]
mod tests {
    use futures::future::BoxFuture;
    use futures::stream::FuturesUnordered;

    use super::*;

    type Answers = FuturesUnordered<BoxFuture<'static, u32>>;

    /// Two nodes' answers, after `first` and `second` ms.
    fn answers(first: u64, second: u64) -> Answers {
        [(first, 1), (second, 2)]
            .into_iter()
            .map(|(ms, value)| -> BoxFuture<'static, u32> {
                Box::pin(async move {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    value
                })
            })
            .collect()
    }

    const TIMEOUT: Option<Duration> = Some(Duration::from_millis(500));

    fn paced(quorum_after_ms: u64) -> Arc<Pace> {
        let pace = Arc::new(Pace::default());
        pace.record(Duration::from_millis(quorum_after_ms));
        pace
    }

    #[tokio::test(start_paused = true)]
    async fn the_cut_off_ends_a_fan_out_without_its_quorum() {
        let mut answers = answers(1, 10_000);
        let mut timer = FanOutTimer::new(&Arc::default(), TIMEOUT, Duration::MAX);
        assert!(matches!(timer.next(&mut answers).await, Next::Answer(1)));
        assert!(matches!(timer.next(&mut answers).await, Next::CutOff));
        assert_eq!(timer.started().elapsed(), Duration::from_millis(500));
    }

    /// How long after its start a fan-out, `pace`d, under `cut_off` and
    /// `cap`, whose quorum answers after `quorum_ms` and whose other node
    /// never does, ends its grace.
    async fn grace_over_at(
        pace: &Arc<Pace>,
        quorum_ms: u64,
        cut_off: Option<Duration>,
        cap: Duration,
    ) -> Duration {
        let mut answers = answers(quorum_ms, 10_000);
        let mut timer = FanOutTimer::new(pace, cut_off, cap);
        assert!(matches!(timer.next(&mut answers).await, Next::Answer(1)));
        assert_eq!(timer.quorum_reached(), Duration::from_millis(quorum_ms));
        assert!(matches!(timer.next(&mut answers).await, Next::GraceOver));
        timer.started().elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn after_the_quorum_the_others_get_the_grace() {
        let pace = Arc::new(Pace::default());
        // The first fan-out moves its timer; the next ones, as fast, keep
        // the one armed with their requests. 10 ms to the quorum, then a
        // grace of 2 × 10 + 1 ms.
        for _ in 0..3 {
            let ended = grace_over_at(&pace, 10, TIMEOUT, Duration::MAX).await;
            assert_eq!(ended, Duration::from_millis(31));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_fast_fan_out_ends_its_grace_at_the_slack() {
        let ended = grace_over_at(&paced(1), 1, TIMEOUT, Duration::MAX).await;
        assert_eq!(ended, SLACK);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fan_out_much_slower_than_the_last_still_gets_its_grace() {
        let ended = grace_over_at(&paced(1), 40, TIMEOUT, Duration::MAX).await;
        assert_eq!(ended, Duration::from_millis(40 + 81));
    }

    #[tokio::test(start_paused = true)]
    async fn a_fan_out_much_faster_than_the_last_gets_no_longer_grace() {
        let ended = grace_over_at(&paced(100), 2, TIMEOUT, Duration::MAX).await;
        assert_eq!(ended, Duration::from_millis(2 + 5));
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_cut_off_it_waits_for_the_quorum_and_caps_the_grace() {
        let cap = Duration::from_millis(500);
        let ended = grace_over_at(&paced(1), 2_000, None, cap).await;
        assert_eq!(ended, Duration::from_millis(2_500));
    }

    #[tokio::test(start_paused = true)]
    async fn every_answer_in_ends_the_wait() {
        let mut answers = answers(1, 2);
        let mut timer = FanOutTimer::new(&Arc::default(), TIMEOUT, Duration::MAX);
        assert!(matches!(timer.next(&mut answers).await, Next::Answer(1)));
        timer.quorum_reached();
        assert!(matches!(timer.next(&mut answers).await, Next::Answer(2)));
        assert!(matches!(timer.next(&mut answers).await, Next::Done));
    }
}
