//! How long a lease can be trusted from the client's side.
//!
//! A key's TTL runs on the server's clock from when the server applied the
//! request, which is after the client sent it; the client only knows when
//! it sent. So a TTL of `lease` set by a request sent at `t` surely runs until
//! `t + lease`, less an allowance for the drift between the two clocks.

use std::time::Duration;

use tokio::time::Instant;

/// The longest lease or watchdog timeout accepted: ten years. Beyond it,
/// a TTL in milliseconds overflows what Redis can set.
pub const MAX_LEASE: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// `started + wait`, or a deadline too far to matter when that overflows
/// (`Duration::MAX` means "no limit").
pub(crate) fn deadline(started: Instant, wait: Duration) -> Instant {
    started
        .checked_add(wait)
        .unwrap_or_else(|| started + MAX_LEASE * 3)
}

/// Clock drift allowed for a lease: 1 % plus 2 ms (the Redlock paper's
/// allowance for the drift between the processes' clocks).
pub(crate) fn drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

/// What is left of `lease` after acquiring took `elapsed`: `None` when
/// nothing is, and the lock must be given up.
pub(crate) fn validity(lease: Duration, elapsed: Duration) -> Option<Duration> {
    lease
        .checked_sub(elapsed + drift(lease))
        .filter(|v| !v.is_zero())
}

/// Until when a TTL of `lease`, set by a request sent at `sent_at`, surely
/// runs.
pub(crate) fn trusted_until(sent_at: Instant, lease: Duration) -> Instant {
    sent_at + lease.saturating_sub(drift(lease))
}

/// From when a TTL of `lease`, set by a request whose reply arrived at
/// `replied_at`, has surely run out (the server applied the request before
/// it replied).
pub(crate) fn surely_expired_at(replied_at: Instant, lease: Duration) -> Instant {
    replied_at + lease + drift(lease)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validity_subtracts_elapsed_and_drift() {
        let lease = Duration::from_secs(10);
        assert_eq!(drift(lease), Duration::from_millis(102));
        assert_eq!(
            validity(lease, Duration::from_millis(898)),
            Some(Duration::from_millis(9000))
        );
        assert_eq!(validity(lease, Duration::from_millis(9898)), None);
        assert_eq!(validity(lease, Duration::from_secs(11)), None);
        assert_eq!(validity(Duration::from_millis(2), Duration::ZERO), None);
    }

    #[tokio::test(start_paused = true)]
    async fn trusted_until_never_precedes_the_send() {
        let sent = Instant::now();
        assert_eq!(
            trusted_until(sent, Duration::from_secs(10)),
            sent + Duration::from_millis(9898)
        );
        assert_eq!(trusted_until(sent, Duration::from_millis(1)), sent);
    }

    #[tokio::test(start_paused = true)]
    async fn surely_expired_adds_the_drift() {
        let replied = Instant::now();
        assert_eq!(
            surely_expired_at(replied, Duration::from_secs(10)),
            replied + Duration::from_millis(10_102)
        );
    }
}
