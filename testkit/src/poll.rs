//! Polling with a deadline: the one way the kit and the tests wait for a
//! condition (a server listening, a key gone, a waiter subscribed) instead
//! of sleeping for it.

use std::io;
use std::time::{Duration, Instant};

/// How often a poll checks its condition.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// The time a poll may take: between two checks, [`PollLimit::tick`] sleeps
/// briefly, or fails once the limit is spent.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use multilock_testkit::PollLimit;
///
/// # async fn demo(mut is_ready: impl FnMut() -> bool) -> std::io::Result<()> {
/// let poll = PollLimit::new(Duration::from_secs(5));
/// while !is_ready() {
///     poll.tick(|| "never ready".to_owned()).await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct PollLimit {
    started: Instant,
    limit: Duration,
}

impl PollLimit {
    /// A limit of `limit` from now.
    pub fn new(limit: Duration) -> PollLimit {
        PollLimit {
            started: Instant::now(),
            limit,
        }
    }

    /// Sleeps briefly (20 ms) before the next check; once the limit is
    /// spent, a [`io::ErrorKind::TimedOut`] error saying `failure` instead.
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::TimedOut`] once the limit is spent.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only sleeps.
    pub async fn tick(&self, failure: impl FnOnce() -> String) -> io::Result<()> {
        if self.is_spent() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{} (waited {:?})", failure(), self.limit),
            ));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
        Ok(())
    }

    /// Whether the limit is spent.
    pub fn is_spent(&self) -> bool {
        self.started.elapsed() > self.limit
    }

    /// How long the poll has run.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

/// Checks `check` every 20 ms until it returns `Some`, for at most `limit`.
///
/// # Errors
///
/// [`io::ErrorKind::TimedOut`], saying `what` was not reached, once `limit`
/// is spent.
///
/// # Cancel safety
///
/// Cancel safe if `check` is.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use multilock_testkit::poll_until;
///
/// # async fn demo(lock: multilock::Lock) -> std::io::Result<()> {
/// poll_until(Duration::from_secs(5), || "the lock is still held".into(), || async {
///     (!lock.is_locked().await.unwrap()).then_some(())
/// })
/// .await?;
/// # Ok(()) }
/// ```
pub async fn poll_until<T, F, Fut>(
    limit: Duration,
    what: impl Fn() -> String,
    mut check: F,
) -> io::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let poll = PollLimit::new(limit);
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        poll.tick(&what).await?;
    }
}
