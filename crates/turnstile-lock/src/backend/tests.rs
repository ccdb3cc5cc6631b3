//! The rules every backend shares: the request's limits at their very edges, who a queue
//! admits, and the `Arc<B>` forwarding the controller calls its backends through.

use std::sync::Arc;
use std::time::Duration;

use super::counting::CountingBackend;
use super::*;
use crate::error::LockError;

fn invalid(result: LockResult<()>) -> bool {
    matches!(result, Err(LockError::InvalidArgument(_)))
}

#[test]
fn every_limit_admits_its_edge_and_refuses_one_past_it() {
    assert!(validate_key(&"k".repeat(MAX_KEY_LEN)).is_ok());
    assert!(invalid(validate_key(&"k".repeat(MAX_KEY_LEN + 1))));
    assert!(invalid(validate_key("")));

    assert!(validate_owner(&"o".repeat(MAX_OWNER_LEN)).is_ok());
    assert!(invalid(validate_owner(&"o".repeat(MAX_OWNER_LEN + 1))));
    assert!(invalid(validate_owner("")));
    assert!(invalid(validate_owner("tab\there")));
    assert!(invalid(validate_owner("bell\u{7}")));

    let one_ns = Duration::from_nanos(1);
    assert!(validate_ttl(Duration::from_millis(1)).is_ok());
    assert!(invalid(validate_ttl(Duration::from_millis(1) - one_ns)));
    assert!(validate_ttl(MAX_TTL).is_ok());
    assert!(invalid(validate_ttl(MAX_TTL + one_ns)));
    assert_eq!(MAX_TTL, Duration::from_secs(31_536_000), "one year");

    assert!(validate_max_holders(1).is_ok());
    assert!(validate_max_holders(MAX_HOLDERS).is_ok());
    assert!(invalid(validate_max_holders(0)));
    assert!(invalid(validate_max_holders(MAX_HOLDERS + 1)));

    assert!(validate_lock_delay(Duration::ZERO).is_ok());
    assert!(validate_lock_delay(MAX_TTL).is_ok());
    assert!(invalid(validate_lock_delay(MAX_TTL + one_ns)));
}

#[test]
fn a_request_is_checked_field_by_field_the_waiter_lease_only_when_it_may_wait() {
    let long = Duration::from_secs(30);
    let good = AcquireRequest::new("k", "o", long, 1, AcquireMode::Wait, long);
    assert!(validate_request(&good).is_ok());
    let no_waiter_lease = AcquireRequest {
        waiter_lease: Duration::ZERO,
        ..good
    };
    assert!(invalid(validate_request(&no_waiter_lease)));
    assert!(
        validate_request(&AcquireRequest {
            mode: AcquireMode::Try,
            ..no_waiter_lease
        })
        .is_ok(),
        "a try never queues, so its waiter lease is not used"
    );
    for bad in [
        AcquireRequest { key: "", ..good },
        AcquireRequest { owner: "", ..good },
        AcquireRequest {
            ttl: Duration::ZERO,
            ..good
        },
        AcquireRequest {
            max_holders: 0,
            ..good
        },
        AcquireRequest {
            max_hold: Some(Duration::ZERO),
            ..good
        },
        AcquireRequest {
            lock_delay: MAX_TTL * 2,
            ..good
        },
    ] {
        assert!(invalid(validate_request(&bad)), "{bad:?}");
    }
    assert!(validate_request(&AcquireRequest {
        max_hold: Some(long),
        lock_delay: long,
        ..good
    })
    .is_ok());
}

#[cfg(any(feature = "redis", feature = "mongo", feature = "etcd"))]
#[test]
fn milliseconds_round_up_and_saturate() {
    assert_eq!(ceil_millis(Duration::ZERO), 0);
    assert_eq!(ceil_millis(Duration::from_nanos(1)), 1);
    assert_eq!(ceil_millis(Duration::from_millis(7)), 7);
    assert_eq!(
        ceil_millis(Duration::from_millis(7) + Duration::from_nanos(1)),
        8
    );
    assert_eq!(ceil_millis(Duration::MAX), u64::MAX);
}

use ShareMode::{Exclusive as X, Shared as S};

#[test]
fn a_request_is_admitted_when_it_and_everyone_ahead_fit_together() {
    assert!(X.is_exclusive() && !S.is_exclusive());
    /// Held, held exclusive, the modes ahead, the request's, max holders → admitted?
    type Case = (usize, bool, &'static [ShareMode], ShareMode, u32, bool);
    let cases: &[Case] = &[
        (0, false, &[], X, 1, true),
        (1, true, &[], X, 1, false),
        (1, false, &[], X, 3, false),
        (0, false, &[X], X, 3, false),
        (0, false, &[], S, 3, true),
        (2, false, &[], S, 3, true),
        (3, false, &[], S, 3, false),
        (1, true, &[], S, 3, false),
        (1, false, &[S], S, 3, true),
        (1, false, &[S, S], S, 3, false),
        (0, false, &[X], S, 3, false),
        (0, false, &[S], X, 3, false),
        (1, false, &[], S, 1, false),
    ];
    for &(held, held_exclusive, ahead, share, max_holders, expected) in cases {
        assert_eq!(
            admits(held, held_exclusive, ahead.iter().copied(), share, max_holders),
            expected,
            "held {held} (exclusive {held_exclusive}), ahead {ahead:?}, {share:?}, max {max_holders}"
        );
    }
}

#[test]
fn a_hand_off_admits_the_longest_compatible_head_of_the_queue() {
    // (held, held exclusive, queue, max holders) → how many at the head are admitted.
    let cases: &[(usize, bool, &[ShareMode], u32, usize)] = &[
        (0, false, &[], 3, 0),
        (0, false, &[X, X], 3, 1),
        (0, false, &[S, S, X, S], 3, 2),
        (0, false, &[S, S, S, S], 3, 3),
        (2, false, &[S, S], 3, 1),
        (1, true, &[S], 3, 0),
        (1, false, &[X], 3, 0),
        (0, false, &[S, X], 3, 1),
        (0, false, &[X, S], 3, 1),
    ];
    for &(held, held_exclusive, queue, max_holders, expected) in cases {
        assert_eq!(
            admitted_prefix(held, held_exclusive, queue.iter().copied(), max_holders),
            expected,
            "held {held} (exclusive {held_exclusive}), queue {queue:?}, max {max_holders}"
        );
    }
}

#[tokio::test]
async fn a_shared_backend_forwards_every_call() {
    let backend: Arc<MemoryBackend> = Arc::new(MemoryBackend::new());
    let shared: &dyn Backend = &backend;
    assert_eq!(shared.kind(), "memory");
    let ttl = Duration::from_secs(30);
    let wait = |owner| AcquireRequest::new("k", owner, ttl, 1, AcquireMode::Wait, ttl);
    assert_eq!(shared.raise_fencing_floor("k", 41).await.ok(), Some(41));
    let waiting = shared.subscribe("k", "b").await.expect("subscribe");
    let granted = shared.acquire(&wait("a")).await.expect("acquire");
    assert!(matches!(
        granted,
        AcquireOutcome::Granted {
            fencing_token: 42,
            ..
        }
    ));
    let queued = shared.acquire(&wait("b")).await.expect("acquire");
    assert!(matches!(
        queued,
        AcquireOutcome::Waiting { position: 1, .. }
    ));
    assert_eq!(shared.is_held("k", "a").await.ok(), Some(true));
    assert_eq!(shared.is_held("k", "b").await.ok(), Some(false));
    assert_eq!(shared.extend("k", "a", ttl).await.ok(), Some(Some(ttl)));
    let snapshot = shared.snapshot("k").await.expect("snapshot");
    assert_eq!(snapshot.fencing_token, 42);
    assert_eq!(snapshot.waiters, ["b"]);
    assert_eq!(shared.release("k", "a", 1).await.ok(), Some(true));
    assert_eq!(shared.release("k", "a", 1).await.ok(), Some(false));
    tokio::time::timeout(Duration::from_secs(5), waiting.notified())
        .await
        .expect("the release woke the waiter");
    assert!(shared.subscribe_if_live("k", "c").is_none());
}

#[test]
fn a_shared_backend_forwards_a_subscription_made_at_once() {
    let shared = Arc::new(CountingBackend::subscribing_at_once());
    let backend: &dyn Backend = &shared;
    assert_eq!(backend.kind(), "counting");
    assert!(backend.subscribe_if_live("k", "a").is_some());
    assert_eq!(CountingBackend::count(&shared.live_subscribes), 1);
}
