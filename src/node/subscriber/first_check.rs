//! The attempt a waiter owes after subscribing, shared.
//!
//! A waiter that subscribed must attempt once more before it parks: a
//! release before the confirmation reached nobody. But one attempt sent
//! after the confirmation that finds the lock held by another owner covers
//! every waiter the confirmation covers. So the first waiter after a
//! confirmation gets the duty of that check ([`CheckDuty`]), the others
//! wait for its outcome and park, and N tasks arriving at once at a held
//! lock send one such attempt, not N.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Shared, Subscription};

/// The attempt after the latest confirmation, shared by the waiters it covers.
#[derive(Clone, Copy)]
pub(super) enum FirstCheck {
    /// Nobody has tried since the latest confirmation.
    Open,
    /// A waiter is trying ([`CheckDuty`]).
    InFlight,
    /// An attempt sent after the latest confirmation found the lock held,
    /// with this TTL: any later release publishes to us.
    Held(Option<Duration>),
}

/// What a waiter that has just subscribed does before it parks.
pub(crate) enum AfterSubscribing {
    /// Attempt. With a duty, this waiter's attempt is the shared first check:
    /// report what it found through the duty.
    Attempt(Option<CheckDuty>),
    /// Another waiter's attempt, sent after this waiter's subscription was
    /// confirmed, found the lock held (with this TTL): park at once.
    Park(Option<Duration>),
}

/// The duty of making the first check of a confirmation. Dropped without
/// [`CheckDuty::found_held`] (error, timeout, cancelled), it hands the check
/// back: the waiters waiting on it then try for themselves.
pub(crate) struct CheckDuty {
    shared: Arc<Shared>,
    channel: String,
    confirmation: u64,
}

impl CheckDuty {
    /// The check's attempt found the lock held by another owner, with
    /// `ttl`: the waiters of this confirmation can park without trying.
    pub(crate) fn found_held(self, ttl: Option<Duration>) {
        self.end(FirstCheck::Held(ttl));
    }

    fn end(&self, outcome: FirstCheck) {
        let mut channels = self.shared.channels.lock().unwrap();
        let Some(ch) = channels.get_mut(&self.channel) else {
            return;
        };
        if ch.subscribed
            && ch.confirmations == self.confirmation
            && matches!(ch.first_check, FirstCheck::InFlight)
        {
            ch.first_check = outcome;
        }
        // Also when the subscription changed meanwhile: those waiting look
        // again, and try for themselves.
        ch.checked.notify_waiters();
    }
}

impl Drop for CheckDuty {
    fn drop(&mut self) {
        // After `found_held` this finds the check no longer in flight.
        self.end(FirstCheck::Open);
    }
}

impl Subscription {
    /// After [`Subscriber::subscribe`]: whether this waiter attempts before
    /// it parks. The first waiter after a confirmation gets the duty of the
    /// check; those that come while it is in flight wait for its outcome (at
    /// most until `deadline`) and park if it found the lock held; those that
    /// come after, park at once. Without a confirmed subscription, every
    /// waiter attempts for itself.
    ///
    /// Cancel safe: waiting on another's check holds nothing.
    pub(crate) async fn first_check(&self, deadline: Option<Instant>) -> AfterSubscribing {
        loop {
            let checked = {
                let mut channels = self.shared.channels.lock().unwrap();
                let Some(ch) = channels.get_mut(&self.channel).filter(|ch| ch.subscribed) else {
                    return AfterSubscribing::Attempt(None);
                };
                match ch.first_check {
                    FirstCheck::Held(ttl) => return AfterSubscribing::Park(ttl),
                    FirstCheck::Open => {
                        ch.first_check = FirstCheck::InFlight;
                        return AfterSubscribing::Attempt(Some(CheckDuty {
                            shared: self.shared.clone(),
                            channel: self.channel.clone(),
                            confirmation: ch.confirmations,
                        }));
                    }
                    FirstCheck::InFlight => ch.checked.clone(),
                }
            };
            // Counts for `notify_waiters` from its creation; then look again,
            // in case the check ended in between.
            let ended = checked.notified();
            let in_flight = self
                .shared
                .channels
                .lock()
                .unwrap()
                .get(&self.channel)
                .is_some_and(|ch| ch.subscribed && matches!(ch.first_check, FirstCheck::InFlight));
            if !in_flight {
                continue;
            }
            match deadline {
                None => ended.await,
                Some(deadline) => {
                    if tokio::time::timeout_at(deadline, ended).await.is_err() {
                        return AfterSubscribing::Attempt(None);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Channel, Subscriber};
    use super::*;

    /// A subscriber whose server is never asked: these tests set the
    /// channel's state by hand.
    fn subscriber() -> Subscriber {
        let client = redis::Client::open("redis://127.0.0.1:1").unwrap();
        let target = crate::node::target::Target::Server(std::sync::Arc::new(client));
        let second = Duration::from_secs(1);
        Subscriber::new("test".into(), target, second, second, second)
    }

    /// Registers a waiter on `channel` as if the server had confirmed it.
    fn confirmed(subscriber: &Subscriber, channel: &str) -> Subscription {
        let mut channels = subscriber.shared.channels.lock().unwrap();
        let ch = channels.entry(channel.into()).or_insert_with(Channel::new);
        if !ch.subscribed {
            ch.confirm();
        }
        ch.waiters += 1;
        Subscription {
            shared: subscriber.shared.clone(),
            channel: channel.into(),
            wake: ch.wake.clone(),
        }
    }

    fn duty(next: AfterSubscribing) -> CheckDuty {
        match next {
            AfterSubscribing::Attempt(Some(duty)) => duty,
            _ => panic!("expected the duty of the first check"),
        }
    }

    #[tokio::test]
    async fn one_check_covers_the_waiters_of_a_confirmation() {
        let subscriber = subscriber();
        let (a, b) = (confirmed(&subscriber, "c"), confirmed(&subscriber, "c"));
        let check = duty(a.first_check(None).await);
        let waiting = tokio::spawn(async move { b.first_check(None).await });
        tokio::task::yield_now().await;
        assert!(
            !waiting.is_finished(),
            "the second waits for the check in flight"
        );
        check.found_held(Some(Duration::from_secs(7)));
        match waiting.await.unwrap() {
            AfterSubscribing::Park(ttl) => assert_eq!(ttl, Some(Duration::from_secs(7))),
            _ => panic!("the check found the lock held: park"),
        }
        // A later waiter of the same confirmation parks at once.
        let c = confirmed(&subscriber, "c");
        assert!(matches!(
            c.first_check(None).await,
            AfterSubscribing::Park(_)
        ));
    }

    #[tokio::test]
    async fn a_check_that_found_nothing_is_handed_on() {
        let subscriber = subscriber();
        let (a, b) = (confirmed(&subscriber, "c"), confirmed(&subscriber, "c"));
        let check = duty(a.first_check(None).await);
        let waiting = tokio::spawn(async move { b.first_check(None).await });
        tokio::task::yield_now().await;
        // Error, timeout or cancellation: the duty is dropped unreported.
        drop(check);
        let next = tokio::time::timeout(Duration::from_secs(5), waiting).await;
        let _next_check = duty(next.expect("handed on").unwrap());
    }

    #[tokio::test]
    async fn a_new_confirmation_starts_the_check_over() {
        let subscriber = subscriber();
        let a = confirmed(&subscriber, "c");
        duty(a.first_check(None).await).found_held(None);
        // Reconnected: a release may have been missed since that check.
        subscriber.shared.forget_subscriptions();
        assert!(matches!(
            a.first_check(None).await,
            AfterSubscribing::Attempt(None)
        ));
        let b = confirmed(&subscriber, "c");
        let _check = duty(b.first_check(None).await);
    }

    #[tokio::test]
    async fn a_waiter_stops_waiting_for_the_check_at_its_deadline() {
        let subscriber = subscriber();
        let (a, b) = (confirmed(&subscriber, "c"), confirmed(&subscriber, "c"));
        let _check = duty(a.first_check(None).await);
        let deadline = Instant::now() + Duration::from_millis(50);
        assert!(matches!(
            b.first_check(Some(deadline)).await,
            AfterSubscribing::Attempt(None)
        ));
    }
}
