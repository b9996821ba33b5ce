//! A fan-out's requests, answered in the order their replies come.
//!
//! `FuturesUnordered` would do, but when it has polled every one of its
//! futures and found them all pending, which is what the first poll of a
//! fan-out always finds, it wakes its own task to yield (a guard against
//! futures that wake themselves for ever). The runtime then queues the
//! task again and, on a multi-threaded runtime, wakes a parked worker to
//! take it: once per fan-out, on the path of every acquire and release,
//! for a task with nothing to do. A 1-node quorum lock paid about four
//! futex calls per lock+unlock for it, where a single-node lock pays none
//! (`BENCHMARKS.md`). A fan-out's requests are I/O, each woken by its own
//! reply: [`FanOut`] polls those woken since it last looked, once each, and
//! never wakes itself.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};

use futures::Stream;
use futures::task::{ArcWake, AtomicWaker};

/// Requests polled as a set, yielding each one's output when it is ready
/// (see the module docs). Request `i` is marked by bit `i % 64` of the
/// woken set: past 64 requests, a wake-up polls every request of its bit.
pub(crate) struct FanOut<F> {
    requests: Vec<Option<F>>,
    /// Each request's waker: marks its bit, then wakes the set's task.
    wakers: Vec<Waker>,
    woken: Arc<Woken>,
    pending: usize,
}

/// What the requests' wakers share with their set.
struct Woken {
    bits: AtomicU64,
    task: AtomicWaker,
}

/// The waker of request `bit`'s set.
struct RequestWaker {
    woken: Arc<Woken>,
    bit: u64,
}

impl ArcWake for RequestWaker {
    fn wake_by_ref(arc_self: &Arc<Self>) {
        arc_self.woken.bits.fetch_or(arc_self.bit, Ordering::AcqRel);
        arc_self.woken.task.wake();
    }
}

impl<F> FanOut<F> {
    /// Whether every request has given its output.
    pub(crate) fn is_empty(&self) -> bool {
        self.pending == 0
    }
}

impl<F> Default for FanOut<F> {
    fn default() -> Self {
        Vec::new().into_iter().collect()
    }
}

impl<F> FromIterator<F> for FanOut<F> {
    fn from_iter<I: IntoIterator<Item = F>>(requests: I) -> Self {
        let requests: Vec<Option<F>> = requests.into_iter().map(Some).collect();
        // Every request is polled once to start it.
        let woken = Arc::new(Woken {
            bits: AtomicU64::new(u64::MAX),
            task: AtomicWaker::new(),
        });
        let wakers = (0..requests.len())
            .map(|at| {
                futures::task::waker(Arc::new(RequestWaker {
                    woken: woken.clone(),
                    bit: 1 << (at % 64),
                }))
            })
            .collect();
        let pending = requests.len();
        FanOut {
            requests,
            wakers,
            woken,
            pending,
        }
    }
}

impl<F: Future + Unpin> Stream for FanOut<F> {
    type Item = F::Output;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<F::Output>> {
        let this = self.get_mut();
        if this.pending == 0 {
            return Poll::Ready(None);
        }
        // Registered before the bits are taken: a wake-up after they were
        // taken wakes the task again.
        this.woken.task.register(cx.waker());
        let mut bits = this.woken.bits.swap(0, Ordering::AcqRel);
        while bits != 0 {
            let bit = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            for at in (bit..this.requests.len()).step_by(64) {
                let Some(request) = &mut this.requests[at] else {
                    continue;
                };
                let mut request_cx = Context::from_waker(&this.wakers[at]);
                if let Poll::Ready(output) = Pin::new(request).poll(&mut request_cx) {
                    this.requests[at] = None;
                    this.pending -= 1;
                    // What was not looked at yet is looked at next time
                    // (this bit again, if later requests share it).
                    let again = if at + 64 < this.requests.len() {
                        1 << bit
                    } else {
                        0
                    };
                    this.woken.bits.fetch_or(bits | again, Ordering::AcqRel);
                    return Poll::Ready(Some(output));
                }
            }
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use futures::StreamExt;
    use futures::future::BoxFuture;
    use futures::{FutureExt, task::ArcWake};
    use tokio::sync::oneshot;

    use super::*;

    type Reply = BoxFuture<'static, u32>;

    /// The set's next answer, or a failure if it does not come (a lost
    /// wake-up would otherwise hang the test).
    async fn next_of(set: &mut FanOut<Reply>) -> Option<u32> {
        tokio::time::timeout(std::time::Duration::from_secs(10), set.next())
            .await
            .expect("no answer within 10 s: a wake-up was lost")
    }

    /// `n` requests, each answered through its sender with its own value.
    fn requests(n: usize) -> (Vec<oneshot::Sender<u32>>, FanOut<Reply>) {
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..n).map(|_| oneshot::channel()).unzip();
        let set = receivers
            .into_iter()
            .map(|receiver: oneshot::Receiver<u32>| receiver.map(Result::unwrap).boxed())
            .collect();
        (senders, set)
    }

    /// Counts the wake-ups of the task that polls the set.
    struct CountingTask(AtomicUsize);

    impl ArcWake for CountingTask {
        fn wake_by_ref(arc_self: &Arc<Self>) {
            arc_self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A task that counts its wake-ups, and its waker.
    fn counting_task() -> (Arc<CountingTask>, Waker) {
        let task = Arc::new(CountingTask(AtomicUsize::new(0)));
        let waker = futures::task::waker(task.clone());
        (task, waker)
    }

    #[tokio::test]
    async fn answers_come_in_the_order_of_their_replies() {
        let (senders, mut set) = requests(3);
        let mut senders: Vec<Option<oneshot::Sender<u32>>> =
            senders.into_iter().map(Some).collect();
        for at in [1, 2, 0] {
            senders[at].take().unwrap().send(at as u32).unwrap();
            assert_eq!(next_of(&mut set).await, Some(at as u32));
        }
        assert!(set.is_empty());
        assert_eq!(next_of(&mut set).await, None);
    }

    /// The point of the set: polling requests that are all pending does
    /// not wake the polling task (`FuturesUnordered` does), and a reply
    /// does, once.
    #[test]
    fn requests_all_pending_do_not_wake_the_task() {
        let (senders, mut set) = requests(5);
        let (task, waker) = counting_task();
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut set).poll_next(&mut cx).is_pending());
        assert_eq!(task.0.load(Ordering::SeqCst), 0, "woken with nothing to do");
        assert!(Pin::new(&mut set).poll_next(&mut cx).is_pending());
        for (at, sender) in senders.into_iter().enumerate().rev() {
            sender.send(at as u32).unwrap();
            assert_eq!(
                task.0.load(Ordering::SeqCst),
                5 - at,
                "one wake-up per reply"
            );
            assert_eq!(
                Pin::new(&mut set).poll_next(&mut cx),
                Poll::Ready(Some(at as u32))
            );
        }
        assert_eq!(Pin::new(&mut set).poll_next(&mut cx), Poll::Ready(None));
    }

    /// Replies that came together are all given, each by the next poll:
    /// none waits for a wake-up of its own.
    #[test]
    fn replies_that_came_together_are_each_given() {
        let (senders, mut set) = requests(4);
        let (_, waker) = counting_task();
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut set).poll_next(&mut cx).is_pending());
        for (at, sender) in senders.into_iter().enumerate() {
            sender.send(at as u32 * 10).unwrap();
        }
        let mut answers = Vec::new();
        while let Poll::Ready(Some(answer)) = Pin::new(&mut set).poll_next(&mut cx) {
            answers.push(answer);
        }
        answers.sort_unstable();
        assert_eq!(answers, [0, 10, 20, 30]);
    }

    /// Past 64 requests, requests share their bits, and every one is still
    /// answered.
    #[tokio::test]
    async fn more_requests_than_bits_are_all_answered() {
        let (senders, mut set) = requests(150);
        for (at, sender) in senders.into_iter().enumerate().rev() {
            sender.send(at as u32).unwrap();
        }
        let mut answers = Vec::new();
        while let Some(answer) = next_of(&mut set).await {
            answers.push(answer);
        }
        answers.sort_unstable();
        assert_eq!(answers, (0..150).collect::<Vec<u32>>());
    }

    #[test]
    fn an_empty_set_is_done() {
        let mut set: FanOut<Reply> = FanOut::default();
        assert!(set.is_empty());
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert_eq!(Pin::new(&mut set).poll_next(&mut cx), Poll::Ready(None));
    }
}
