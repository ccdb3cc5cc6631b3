//! The rules of [`KeyState`] at exact instants: a real clock never lands on the instant a
//! lease or a heartbeat ends, so the conformance suite cannot pin which side of it counts.

use std::time::Duration;

use tokio::time::Instant;

use super::*;

const SECOND: Duration = Duration::from_secs(1);

fn request(owner: &str, ttl: Duration, mode: AcquireMode) -> AcquireRequest<'_> {
    AcquireRequest::new("k", owner, ttl, 1, mode, 5 * SECOND)
}

fn token(outcome: &AcquireOutcome) -> Option<u64> {
    match outcome {
        AcquireOutcome::Granted { fencing_token, .. } => Some(*fencing_token),
        _ => None,
    }
}

#[test]
fn a_lease_ends_at_its_very_instant() {
    let (mut lock, t0) = (KeyState::default(), Instant::now());
    let ends = t0 + 10 * SECOND;
    assert_eq!(
        token(&lock.acquire(&request("a", 10 * SECOND, AcquireMode::Wait), t0)),
        Some(1)
    );
    let just_before = ends - Duration::from_nanos(1);
    assert!(lock.is_held("a", just_before));
    assert!(!lock.is_held("a", ends));
    assert!(
        token(&lock.acquire(&request("b", SECOND, AcquireMode::Try), just_before)).is_none(),
        "still held a nanosecond before"
    );
    assert_eq!(
        lock.extend("a", SECOND, ends),
        None,
        "ended: nothing to extend"
    );
    assert_eq!(
        token(&lock.acquire(&request("b", SECOND, AcquireMode::Try), ends)),
        Some(2)
    );
}

#[test]
fn a_waiter_leaves_the_queue_when_its_heartbeat_ends() {
    let (mut lock, t0) = (KeyState::default(), Instant::now());
    lock.acquire(&request("a", 60 * SECOND, AcquireMode::Wait), t0);
    let queued = lock.acquire(&request("b", SECOND, AcquireMode::Wait), t0);
    assert_eq!(
        queued,
        AcquireOutcome::Waiting {
            position: 1,
            retry_after: Some(60 * SECOND)
        }
    );
    let heartbeat_ends = t0 + 5 * SECOND;
    assert_eq!(
        lock.snapshot(heartbeat_ends - Duration::from_nanos(1))
            .waiters,
        ["b"]
    );
    assert!(lock.snapshot(heartbeat_ends).waiters.is_empty());
}

#[test]
fn a_lock_delay_starts_at_the_leases_end_takes_the_longest_and_ends_at_its_instant() {
    let (mut lock, t0) = (KeyState::default(), Instant::now());
    let slot = |owner, ttl, delay| AcquireRequest {
        max_holders: 2,
        share: ShareMode::Shared,
        lock_delay: delay,
        ..request(owner, ttl, AcquireMode::Try)
    };
    lock.acquire(&slot("a", 10 * SECOND, 3 * SECOND), t0);
    lock.acquire(&slot("b", 11 * SECOND, SECOND), t0);
    // a ends at 10 s (delay to 13 s), b at 11 s (delay to 12 s): the later end wins.
    let snapshot = lock.snapshot(t0 + 11 * SECOND);
    assert!(snapshot.holders.is_empty());
    assert_eq!(snapshot.delayed_for, Some(2 * SECOND));
    assert_eq!(
        lock.acquire(&slot("c", SECOND, Duration::ZERO), t0 + 12 * SECOND),
        AcquireOutcome::Busy {
            retry_after: Some(SECOND)
        }
    );
    assert_eq!(
        token(&lock.acquire(&slot("c", SECOND, Duration::ZERO), t0 + 13 * SECOND)),
        Some(3),
        "the delay is over at its very instant"
    );
    assert_eq!(lock.snapshot(t0 + 13 * SECOND).delayed_for, None);
}

#[test]
fn a_release_starts_no_delay_and_hands_the_lock_to_the_head_of_the_queue() {
    let (mut lock, t0) = (KeyState::default(), Instant::now());
    let delayed = AcquireRequest {
        lock_delay: 30 * SECOND,
        ..request("a", 10 * SECOND, AcquireMode::Wait)
    };
    lock.acquire(&delayed, t0);
    lock.acquire(&request("b", 20 * SECOND, AcquireMode::Wait), t0);
    let (was_held, handoffs) = lock.release("a", 1, t0 + SECOND);
    assert!(was_held);
    // b's heartbeat (5 s from t0) has 4 s left: its hand-off lease is no longer than that.
    assert_eq!(
        handoffs,
        [(
            "b".to_owned(),
            Handoff {
                fencing_token: 2,
                lease: 4 * SECOND
            }
        )]
    );
    assert_eq!(lock.snapshot(t0 + SECOND).delayed_for, None);
    let (was_held, handoffs) = lock.release("a", 1, t0 + SECOND);
    assert!(
        !was_held && handoffs.is_empty(),
        "a second release is a no-op"
    );
}

#[test]
fn while_a_delay_runs_a_release_hands_nothing_over() {
    let (mut lock, t0) = (KeyState::default(), Instant::now());
    let delayed = AcquireRequest {
        lock_delay: 30 * SECOND,
        ..request("a", SECOND, AcquireMode::Wait)
    };
    lock.acquire(&delayed, t0);
    lock.acquire(
        &AcquireRequest {
            waiter_lease: 60 * SECOND,
            ..request("b", SECOND, AcquireMode::Wait)
        },
        t0,
    );
    let (was_held, handoffs) = lock.release("nobody", 1, t0 + 2 * SECOND);
    assert!(!was_held);
    assert!(
        handoffs.is_empty(),
        "a's lease ended: the delay holds b back"
    );
    assert_eq!(lock.snapshot(t0 + 2 * SECOND).waiters, ["b"]);
}

#[test]
fn the_retry_hint_is_the_first_leases_end_or_the_delays_whichever_is_later() {
    let (mut lock, t0) = (KeyState::default(), Instant::now());
    let slot = |owner, ttl| AcquireRequest {
        max_holders: 2,
        ..request(owner, ttl, AcquireMode::Try)
    };
    lock.acquire(&slot("a", 5 * SECOND), t0);
    lock.acquire(&slot("b", 8 * SECOND), t0);
    assert_eq!(
        lock.acquire(&slot("c", SECOND), t0),
        AcquireOutcome::Busy {
            retry_after: Some(5 * SECOND)
        }
    );
    lock.delay_until = Some(t0 + 7 * SECOND);
    assert_eq!(
        lock.acquire(&slot("c", SECOND), t0),
        AcquireOutcome::Busy {
            retry_after: Some(7 * SECOND)
        }
    );
}

#[test]
fn a_max_hold_caps_the_first_lease_every_renewal_and_a_re_acquire() {
    let (mut lock, t0) = (KeyState::default(), Instant::now());
    let capped = AcquireRequest {
        max_hold: Some(10 * SECOND),
        ..request("a", 30 * SECOND, AcquireMode::Wait)
    };
    assert_eq!(
        lock.acquire(&capped, t0),
        AcquireOutcome::Granted {
            fencing_token: 1,
            ttl: 10 * SECOND,
            already_held: false
        }
    );
    assert_eq!(lock.extend("a", 4 * SECOND, t0 + SECOND), Some(4 * SECOND));
    assert_eq!(
        lock.extend("a", 30 * SECOND, t0 + 4 * SECOND),
        Some(6 * SECOND)
    );
    assert_eq!(
        lock.acquire(&capped, t0 + 8 * SECOND),
        AcquireOutcome::Granted {
            fencing_token: 1,
            ttl: 2 * SECOND,
            already_held: true
        }
    );
    let holder = &lock.snapshot(t0 + 8 * SECOND).holders[0];
    assert_eq!(holder.expires_in, 2 * SECOND);
}

#[test]
fn a_hand_off_grants_what_the_waiter_asked_for_capped_by_its_max_hold() {
    let (mut lock, t0) = (KeyState::default(), Instant::now());
    lock.acquire(&request("a", 10 * SECOND, AcquireMode::Wait), t0);
    let waiter = AcquireRequest {
        waiter_lease: 60 * SECOND,
        max_hold: Some(3 * SECOND),
        share: ShareMode::Exclusive,
        ..request("b", 20 * SECOND, AcquireMode::Wait)
    };
    lock.acquire(&waiter, t0);
    let (_, handoffs) = lock.release("a", 1, t0);
    assert_eq!(handoffs[0].1.lease, 3 * SECOND);
    assert_eq!(lock.extend("b", 20 * SECOND, t0 + SECOND), Some(2 * SECOND));
}

#[test]
fn positions_count_from_the_head_by_priority_then_arrival() {
    let (mut lock, t0) = (KeyState::default(), Instant::now());
    lock.acquire(&request("holder", 60 * SECOND, AcquireMode::Wait), t0);
    let wait = |owner, priority| AcquireRequest {
        priority,
        ..request(owner, SECOND, AcquireMode::Wait)
    };
    let position = |outcome| match outcome {
        AcquireOutcome::Waiting { position, .. } => position,
        other => panic!("{other:?}"),
    };
    assert_eq!(position(lock.acquire(&wait("low", 0), t0)), 1);
    assert_eq!(position(lock.acquire(&wait("high", 5), t0)), 1);
    assert_eq!(position(lock.acquire(&wait("low2", 0), t0)), 3);
    assert_eq!(
        position(lock.acquire(&wait("low", 0), t0)),
        2,
        "a waiter keeps its place"
    );
    assert_eq!(lock.snapshot(t0).waiters, ["high", "low", "low2"]);
    // A try never joins, and is judged at the place it would join.
    assert_eq!(
        lock.acquire(&request("t", SECOND, AcquireMode::Try), t0),
        AcquireOutcome::Busy {
            retry_after: Some(60 * SECOND)
        }
    );
    assert_eq!(lock.snapshot(t0).waiters.len(), 3);
}

#[test]
fn the_fence_counter_only_rises_and_holders_are_shown_in_grant_order() {
    let (mut lock, t0) = (KeyState::default(), Instant::now());
    assert_eq!(lock.raise_fencing_floor(7), 7);
    assert_eq!(lock.raise_fencing_floor(3), 7);
    let slot = |owner| AcquireRequest {
        max_holders: 3,
        share: ShareMode::Shared,
        ..request(owner, 10 * SECOND, AcquireMode::Wait)
    };
    for owner in ["c", "a", "b"] {
        lock.acquire(&slot(owner), t0);
    }
    let snapshot = lock.snapshot(t0 + SECOND);
    let shown: Vec<(&str, u64)> = snapshot
        .holders
        .iter()
        .map(|holder| (holder.owner.as_str(), holder.fencing_token))
        .collect();
    assert_eq!(shown, [("c", 8), ("a", 9), ("b", 10)]);
    assert!(snapshot
        .holders
        .iter()
        .all(|holder| holder.expires_in == 9 * SECOND));
    assert_eq!(snapshot.fencing_token, 10);
}

#[test]
fn a_request_not_yet_queued_is_judged_at_the_place_its_priority_would_give_it() {
    let (mut lock, t0) = (KeyState::default(), Instant::now());
    lock.acquire(&request("holder", SECOND, AcquireMode::Wait), t0);
    let low = AcquireRequest {
        waiter_lease: 60 * SECOND,
        ..request("low", SECOND, AcquireMode::Wait)
    };
    lock.acquire(&low, t0);
    // The holder's lease ran out; "low" has not come back yet, so the lock is free.
    let free = t0 + SECOND;
    let try_at = |lock: &mut KeyState, owner, priority| {
        lock.acquire(
            &AcquireRequest {
                priority,
                ..request(owner, SECOND, AcquireMode::Try)
            },
            free,
        )
    };
    assert!(
        token(&try_at(&mut lock, "lower", -1)).is_none(),
        "behind low"
    );
    assert!(token(&try_at(&mut lock, "same", 0)).is_none(), "behind low");
    assert_eq!(
        token(&try_at(&mut lock, "urgent", 5)),
        Some(2),
        "ahead of every lower priority"
    );
}
