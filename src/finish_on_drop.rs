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

/// See the module docs.
pub(crate) struct FinishOnDrop<F>
where
    F: Future + Send + 'static,
    F::Output: Send,
{
    request: Option<Pin<Box<F>>>,
    /// What to do with the output when nobody is left to receive it.
    abandoned: fn(F::Output) -> BoxFuture<'static, ()>,
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
        }
    }
}

impl<F> Future for FinishOnDrop<F>
where
    F: Future + Send + 'static,
    F::Output: Send,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let Some(request) = self.request.as_mut() else {
            return Poll::Pending;
        };
        let out = std::task::ready!(request.as_mut().poll(cx));
        self.request = None;
        Poll::Ready(out)
    }
}

impl<F> Drop for FinishOnDrop<F>
where
    F: Future + Send + 'static,
    F::Output: Send,
{
    fn drop(&mut self) {
        let Some(request) = self.request.take() else {
            return;
        };
        let abandoned = self.abandoned;
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move { abandoned(request.await).await });
            }
            // No runtime (it is shutting down): the lock expires with its lease.
            Err(_) => tracing::warn!(
                "request abandoned outside a runtime; its lock expires with its lease"
            ),
        }
    }
}
