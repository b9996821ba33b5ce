//! Requests that finish even when their caller goes away.
//!
//! A script sent to Redis is applied whether or not anyone awaits its reply.
//! So an acquire whose future is dropped mid-flight must still learn whether
//! it was granted, and release if so; an unlock whose future is dropped must
//! still release. [`FinishOnDrop`] runs a request in place while it is
//! awaited and, if dropped before completion, moves the rest of it (and a
//! follow-up such as a rollback) onto the runtime.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::BoxFuture;

/// See the module docs. `K` makes what the request keeps while it
/// finishes in the background ([`FinishOnDrop::keeping_while_abandoned`]);
/// `()` keeps nothing.
pub(crate) struct FinishOnDrop<F, K = ()>
where
    F: Future + Send + 'static,
    F::Output: Send,
    K: KeepWhileAbandoned,
{
    request: Option<Pin<Box<F>>>,
    /// What to do with the output when nobody is left to receive it.
    abandoned: fn(F::Output) -> BoxFuture<'static, ()>,
    keep: Option<K>,
}

/// What makes the value a request keeps while it finishes in the
/// background: nothing (`()`), or a closure called when it goes there.
pub(crate) trait KeepWhileAbandoned: Send + 'static {
    type Kept: Send + 'static;
    fn make(self) -> Self::Kept;
}

impl KeepWhileAbandoned for () {
    type Kept = ();
    fn make(self) {}
}

impl<T: Send + 'static, C: FnOnce() -> T + Send + 'static> KeepWhileAbandoned for C {
    type Kept = T;
    fn make(self) -> T {
        self()
    }
}

impl<F> FinishOnDrop<F>
where
    F: Future + Send + 'static,
    F::Output: Send,
{
    pub(crate) fn new(request: F, abandoned: fn(F::Output) -> BoxFuture<'static, ()>) -> Self {
        FinishOnDrop {
            request: Some(Box::pin(request)),
            abandoned,
            keep: Some(()),
        }
    }

    /// If the request goes to the background, `keep()` is called then and
    /// what it returns is kept until the request is done there (a marker
    /// that others wait on, say). Nothing is made for a request awaited to
    /// the end.
    pub(crate) fn keeping_while_abandoned<C: KeepWhileAbandoned>(
        mut self,
        keep: C,
    ) -> FinishOnDrop<F, C> {
        FinishOnDrop {
            request: self.request.take(),
            abandoned: self.abandoned,
            keep: Some(keep),
        }
    }
}

impl<F, K> Future for FinishOnDrop<F, K>
where
    F: Future + Send + 'static,
    F::Output: Send,
    K: KeepWhileAbandoned + Unpin,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // Taken out while it is polled: if the poll panics, nothing is left
        // for `Drop` to move onto the runtime, which would poll a future
        // that panicked ("`async fn` resumed after panicking").
        let Some(mut request) = self.request.take() else {
            return Poll::Pending;
        };
        match request.as_mut().poll(cx) {
            Poll::Ready(out) => Poll::Ready(out),
            Poll::Pending => {
                self.request = Some(request);
                Poll::Pending
            }
        }
    }
}

impl<F, K> Drop for FinishOnDrop<F, K>
where
    F: Future + Send + 'static,
    F::Output: Send,
    K: KeepWhileAbandoned,
{
    fn drop(&mut self) {
        let Some(request) = self.request.take() else {
            return;
        };
        let abandoned = self.abandoned;
        let kept = self.keep.take().map(KeepWhileAbandoned::make);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let output = request.await;
                    drop(kept);
                    abandoned(output).await
                });
            }
            // No runtime (it is shutting down): the lock expires with its lease.
            Err(_) => tracing::warn!(
                "request abandoned outside a runtime; its lock expires with its lease"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures::FutureExt;

    use super::*;

    /// A request that panics is not polled again when its future is dropped.
    /// The request is a hand-written future that counts every poll: an
    /// `async` block polled after its panic would panic at once ("resumed
    /// after panicking") without reaching a counter inside it.
    #[tokio::test]
    async fn a_request_that_panicked_is_not_polled_again() {
        struct PanicsOnSecondPoll(Arc<AtomicUsize>);
        impl Future for PanicsOnSecondPoll {
            type Output = ();
            fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
                if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                panic!("the request panics on its second poll");
            }
        }
        let polls = Arc::new(AtomicUsize::new(0));
        let request = PanicsOnSecondPoll(polls.clone());
        let mut finishing = Box::pin(FinishOnDrop::new(request, |()| async {}.boxed()));
        assert!(futures::poll!(finishing.as_mut()).is_pending());
        let panicked = std::panic::AssertUnwindSafe(finishing.as_mut())
            .catch_unwind()
            .await;
        assert!(panicked.is_err());
        drop(finishing);
        // A request moved onto the runtime would be polled here.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(polls.load(Ordering::SeqCst), 2, "no poll after the panic");
    }

    /// A request dropped before it finished completes on the runtime, and
    /// its output goes to `abandoned`.
    #[tokio::test]
    async fn a_dropped_request_finishes_in_the_background() {
        static OUTPUT: AtomicUsize = AtomicUsize::new(0);
        let request = async {
            tokio::task::yield_now().await;
            7
        };
        let mut finishing = Box::pin(FinishOnDrop::new(request, |out| {
            async move {
                OUTPUT.store(out, Ordering::SeqCst);
            }
            .boxed()
        }));
        assert!(futures::poll!(finishing.as_mut()).is_pending());
        drop(finishing);
        for _ in 0..100 {
            if OUTPUT.load(Ordering::SeqCst) == 7 {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the abandoned request never finished");
    }

    /// What the request keeps while abandoned is made when it goes to the
    /// background (never for a request awaited to the end) and dropped
    /// once it is done there.
    #[tokio::test]
    async fn what_an_abandoned_request_keeps_lives_until_it_is_done() {
        let kept = Arc::new(());
        let (finish, finished) = tokio::sync::oneshot::channel::<()>();
        let made = Arc::new(AtomicUsize::new(0));
        let counter = made.clone();
        let awaited = FinishOnDrop::new(async {}, |()| async {}.boxed())
            .keeping_while_abandoned(move || counter.fetch_add(1, Ordering::SeqCst));
        awaited.await;
        assert_eq!(made.load(Ordering::SeqCst), 0, "never made when awaited");

        let keep = kept.clone();
        let mut finishing = Box::pin(
            FinishOnDrop::new(async move { finished.await.ok() }, |_| async {}.boxed())
                .keeping_while_abandoned(move || keep),
        );
        assert!(futures::poll!(finishing.as_mut()).is_pending());
        drop(finishing);
        assert_eq!(Arc::strong_count(&kept), 2, "kept while in the background");
        finish.send(()).unwrap();
        for _ in 0..100 {
            if Arc::strong_count(&kept) == 1 {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("kept after the request was done");
    }
}
