//! All duration arithmetic: leases, clock drift, validity, deadlines and
//! TTL replies.
//!
//! A key's TTL runs on the server's clock from when the server applied the
//! request, which is after the client sent it; the client only knows when
//! it sent. So a TTL of `lease` set by a request sent at `t` surely runs until
//! `t + lease`, less an allowance for the drift between the two clocks. Every
//! instant here is on tokio's monotonic clock: a wall-clock jump changes
//! nothing.

use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, Result};

/// The longest lease or watchdog timeout accepted: ten years. Beyond it,
/// a TTL in milliseconds overflows what Redis can set.
pub const MAX_LEASE: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// The shortest lease or watchdog timeout accepted: 10 ms. A grant is
/// proof of holding only while its TTL surely runs, which is the lease
/// less the clock drift allowance (1 % + 2 ms) and the round trip that
/// granted it; a shorter lease would leave a guard valid for a fraction of
/// a millisecond, or for no time at all.
pub const MIN_LEASE: Duration = Duration::from_millis(10);

/// How long an acquire whose reply nobody received may still be rolled
/// back: a re-entry's hold latch (which tells the rollback whether it was
/// applied) lives this long at most (the acquire script caps it at min(lease,
/// 60 s), never longer than the key, so the latch never speaks for a later
/// hold), and the rollback gives up after it.
pub(crate) const ROLLBACK_WINDOW: Duration = Duration::from_secs(60);

/// How long a release or rollback given up after [`ROLLBACK_WINDOW`] stays
/// buried (`protocol::bury`): a copy of it can still be on its way while
/// TCP retransmits it, which Linux does for about 15 minutes
/// (`tcp_retries2`) before it drops the connection. Twice that.
pub(crate) const BURIAL: Duration = Duration::from_secs(30 * 60);

/// Checks a lease (or watchdog timeout) given by the caller: from
/// [`MIN_LEASE`] to [`MAX_LEASE`], for every lock type alike.
pub(crate) fn check_lease(lease: Duration) -> Result<()> {
    if lease < MIN_LEASE {
        return Err(Error::invalid(format!(
            "a lease of {lease:?} is under the minimum of {MIN_LEASE:?} (MIN_LEASE): \
             the clock drift allowance alone is {:?}, so a guard would be valid for next to no time",
            drift(lease)
        )));
    }
    if lease > MAX_LEASE {
        return Err(Error::invalid(
            "lease must be at most ten years (MAX_LEASE)",
        ));
    }
    Ok(())
}

/// Checks a maximum hold time: from 1 ms to [`MAX_LEASE`].
pub(crate) fn check_max_hold(max_hold: Duration) -> Result<()> {
    if max_hold < Duration::from_millis(1) || max_hold > MAX_LEASE {
        return Err(Error::invalid(
            "maximum hold time must be from 1 ms to ten years (MAX_LEASE)",
        ));
    }
    Ok(())
}

/// Checks a hold warning: from 1 ms to [`MAX_LEASE`], as a maximum hold
/// time.
pub(crate) fn check_hold_warning(after: Duration) -> Result<()> {
    if after < Duration::from_millis(1) || after > MAX_LEASE {
        return Err(Error::invalid(
            "hold warning must be from 1 ms to ten years (MAX_LEASE)",
        ));
    }
    Ok(())
}

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

/// A PTTL reply as a TTL: `None` for a key without expiry (-1) or without
/// existence (-2).
pub(crate) fn ttl_from_pttl(pttl: i64) -> Option<Duration> {
    (pttl >= 0).then(|| Duration::from_millis(pttl as u64))
}

/// A duration in whole milliseconds, as Redis takes it.
pub(crate) fn millis(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

/// The wall-clock floor of a token that no counter can prove: microseconds
/// since the Unix epoch. Tokens are counters that go up by one per grant,
/// so no token handed out before a floor was taken exceeds it unless a
/// name was granted more than once per microsecond since the last floor,
/// or the clocks of the clients disagree by more than the time since the
/// last floor was taken (about 1.8e15 in 2026, far below `i64::MAX`).
pub(crate) fn token_floor() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(1)
}

/// The wall clock in epoch milliseconds: a fair lock's queue deadlines are
/// in it, as Redisson's clients write them.
pub(crate) fn epoch_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
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

    #[test]
    fn leases_are_bounded() {
        assert!(check_lease(Duration::ZERO).is_err());
        assert!(check_lease(Duration::from_millis(1)).is_err());
        assert!(check_lease(MIN_LEASE - Duration::from_micros(1)).is_err());
        assert!(check_lease(MIN_LEASE).is_ok());
        assert!(check_lease(MAX_LEASE).is_ok());
        assert!(check_lease(MAX_LEASE + Duration::from_millis(1)).is_err());
        assert!(check_max_hold(Duration::from_millis(1)).is_ok());
        assert!(check_max_hold(Duration::ZERO).is_err());
        assert!(check_hold_warning(Duration::from_millis(1)).is_ok());
        assert!(check_hold_warning(Duration::ZERO).is_err());
        assert!(check_hold_warning(MAX_LEASE + Duration::from_millis(1)).is_err());
    }

    #[test]
    fn the_minimum_lease_outlasts_the_drift() {
        assert!(validity(MIN_LEASE, Duration::from_millis(5)).is_some());
    }

    #[test]
    fn pttl_replies() {
        assert_eq!(ttl_from_pttl(1500), Some(Duration::from_millis(1500)));
        assert_eq!(ttl_from_pttl(0), Some(Duration::ZERO));
        assert_eq!(ttl_from_pttl(-1), None);
        assert_eq!(ttl_from_pttl(-2), None);
    }

    #[tokio::test(start_paused = true)]
    async fn deadlines_saturate() {
        let now = Instant::now();
        assert_eq!(
            deadline(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
        assert!(deadline(now, Duration::MAX) > now + MAX_LEASE);
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
