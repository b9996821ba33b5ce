//! How a [`MultiLock`] (every node must grant) and a [`RedLock`] (a
//! majority, N/2+1, must grant) run a round over independent masters, and
//! what a slow, frozen or dead minority costs.
//!
//! # RedLock and MultiLock
//!
//! RedLock and MultiLock send to every node at once, each request under
//! its own timeout (`with_node_timeout`, default 500 ms, at most a tenth of
//! the lease or watchdog timeout); validity = lease − elapsed − (1 % of the
//! lease + 2 ms). A failed round releases its grants at once, concurrently;
//! contenders that split the nodes back off 50–250 ms at random, and waiters
//! woken by a release stagger their next round by a fraction of a round trip.
//!
//! # Degraded mode
//!
//! A node whose request timed out or was refused becomes
//! *suspect* ([`Node::health`]): requests to it fail at once, with nothing
//! sent, while one probe per node (PING, backing off from 20 ms to 500 ms)
//! decides when it is back; a warning is logged when it becomes suspect and
//! an info line when it recovers, once per change. A round returns as soon
//! as a quorum granted, after a grace of twice the time the quorum took
//! plus a millisecond (a round that reached its quorum sooner may wait up
//! to 5 ms from its start: the one timer a round arms, as its requests
//! leave, is not moved for less), never the node timeout; a node that has
//! not answered by the node timeout is cut off and becomes suspect even
//! when the quorum needs it. A grant that arrives later is adopted by the
//! guard (renewed and released with it) or, if the guard is gone, rolled
//! back. Fencing settlement also returns at quorum, and unlock after the
//! same grace; the rest finishes in the background. So a RedLock with a
//! minority of masters frozen, black-holed or dead costs about what it
//! costs healthy.
//!
//! A fenced round's token is settled after the round is won: see
//! [`fencing`](super::fencing). What a failed or refused node makes of
//! `lock()` and `try_lock_for` is in
//! [`semantics`](super::semantics#in-a-service-use-try_lock_for).
//!
//! [`MultiLock`]: crate::MultiLock
//! [`RedLock`]: crate::RedLock
//! [`Node::health`]: crate::Node::health
