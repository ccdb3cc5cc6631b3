//! The fault effects' check on hand-made evidence: each sign it looks for, present, passes;
//! absent, fails. (The unfenced control run shows the paused-holder check failing on a real
//! run.)

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fake_apiserver::RecordedRequest;
use turnstile_api::ClaimPhase;

use super::effects::{of_pauses, of_schedule, Evidence, Outcome};
use super::faults::{schedule, Applied};
use super::history::{ClaimSeen, Ending, Entry, Event, History, Millis};
use super::workers::PAUSED;

const S: Millis = 1_000;
const T0: Millis = 1_800_000_000_000;

/// The first fault of `kind` a schedule draws, applied from second 0 to second 5.
fn applied(kind: &str, began: Instant, seen: Result<String, String>) -> Applied {
    let fault = (0..)
        .flat_map(|seed| schedule(seed, true).take(20))
        .find(|fault| fault.kind == kind)
        .expect("every kind is drawn");
    Applied {
        fault,
        began,
        ended: began + Duration::from_secs(5),
        ended_at: T0 + 5 * S,
        seen,
    }
}

fn held(claim: &str, lock: &str, expires: Millis) -> Event {
    Event::Seen(ClaimSeen {
        claim: claim.into(),
        lock: lock.into(),
        created: T0,
        arrived: None,
        phase: Some(ClaimPhase::Held),
        token: Some(1),
        acquired_at: None,
        expires_at: Some(T0 + expires * S),
        released_at: None,
    })
}

fn request(received: Instant, late: Duration, injected: Option<u16>) -> RecordedRequest {
    RecordedRequest {
        method: "PATCH".into(),
        path: "/apis/turnstile.dev/v1alpha1/namespaces/n/lockclaims/c".into(),
        query: String::new(),
        verb: "patch".into(),
        is_resource_request: true,
        api_group: "turnstile.dev".into(),
        api_version: "v1alpha1".into(),
        resource: "lockclaims".into(),
        subresource: String::new(),
        namespace: "n".into(),
        name: "c".into(),
        content_type: String::new(),
        status: injected.unwrap_or(200),
        injected_fault: injected.is_some(),
        received,
        answered: received + late,
    }
}

fn outcome(applied: &Applied, entries: &[(i64, Event)], requests: &[RecordedRequest]) -> Outcome {
    let history = History::default();
    for (at, event) in entries {
        history.record_at(T0 + at * S, event.clone());
    }
    let backends = BTreeMap::from([("r".to_owned(), "redis"), ("m".to_owned(), "memory")]);
    let entries: Vec<Entry> = history.entries();
    let evidence = Evidence {
        entries: &entries,
        requests,
        backends: &backends,
    };
    of_schedule(std::slice::from_ref(applied), &evidence).remove(0)
}

#[test]
fn a_backend_fault_needs_a_grant_on_that_backend_after_it() {
    let flush = applied(
        "Redis FLUSHALL",
        Instant::now(),
        Ok("3 keys flushed".into()),
    );
    let before = [(2, held("a", "r", 10))];
    assert!(outcome(&flush, &before, &[]).shown.is_err());
    let other_backend = [(2, held("a", "r", 10)), (7, held("b", "m", 20))];
    assert!(outcome(&flush, &other_backend, &[]).shown.is_err());
    let after = [(2, held("a", "r", 10)), (7, held("b", "r", 20))];
    assert!(outcome(&flush, &after, &[]).shown.is_ok());
}

#[test]
fn a_fault_that_did_not_fire_fails_whatever_follows() {
    let missed = applied(
        "leader killed (SIGKILL) and restarted",
        Instant::now(),
        Err("no replica renewed the leader Lease".into()),
    );
    let shown = outcome(&missed, &[(7, held("b", "m", 20))], &[]).shown;
    assert_eq!(shown.unwrap_err(), "no replica renewed the leader Lease");
}

#[test]
fn an_injected_error_needs_a_write_answered_with_it() {
    let began = Instant::now();
    let conflict = applied("injected 409 Conflict", began, Ok("armed".into()));
    let other = request(began, Duration::ZERO, Some(500));
    assert!(outcome(&conflict, &[], std::slice::from_ref(&other))
        .shown
        .is_err());
    let hit = request(began + Duration::from_millis(10), Duration::ZERO, Some(409));
    assert!(outcome(&conflict, &[], &[other, hit]).shown.is_ok());
}

#[test]
fn slow_responses_need_a_request_answered_that_late() {
    let began = Instant::now();
    let slow = applied("slow API responses", began, Ok("over".into()));
    let quick = request(began, Duration::ZERO, None);
    assert!(outcome(&slow, &[], &[quick]).shown.is_err());
    let late = request(began, slow.fault.delay, None);
    assert!(outcome(&slow, &[], &[late]).shown.is_ok());
}

fn paused(expires: Millis, wrote_after_a_later_holder: Option<bool>) -> Outcome {
    let history = History::default();
    let at = |seconds: i64, event: Event| history.record_at(T0 + seconds * S, event);
    at(1, held("p", "m", expires));
    at(
        2,
        Event::Fault {
            kind: PAUSED.into(),
            detail: "p sleeps 8000 ms without renewing".into(),
        },
    );
    if let Some(accepted) = wrote_after_a_later_holder {
        let write = |claim: &str, token, accepted| Event::Write {
            lock: "m".into(),
            claim: String::from(claim),
            token,
            read: 0,
            previous: 0,
            new: 1,
            accepted,
        };
        at(6, write("q", 2, true));
        at(10, write("p", 1, accepted));
    }
    at(
        10,
        Event::Ended {
            claim: "p".into(),
            ending: Ending::Delete,
        },
    );
    let entries = history.entries();
    let evidence = Evidence {
        entries: &entries,
        requests: &[],
        backends: &BTreeMap::new(),
    };
    of_pauses(&evidence).remove(0)
}

#[test]
fn a_paused_holder_must_lose_its_lease_and_its_stale_write() {
    assert!(
        paused(4, None).shown.is_ok(),
        "lease ran out at 4, woke at 10"
    );
    assert!(paused(4, Some(false)).shown.is_ok(), "stale write refused");
    assert!(
        paused(30, None).shown.is_err(),
        "still renewed past its wake"
    );
    assert!(paused(4, Some(true)).shown.is_err(), "stale write accepted");
}

#[test]
fn an_injected_error_is_not_credited_with_the_next_ones_answers() {
    let began = Instant::now();
    let first = applied("injected 500 InternalError", began, Ok("armed".into()));
    let mut second = first.clone();
    second.began = began + Duration::from_secs(60);
    let answered_later = request(
        second.began + Duration::from_millis(10),
        Duration::ZERO,
        Some(500),
    );
    let evidence_entries: Vec<Entry> = Vec::new();
    let backends = BTreeMap::new();
    let requests = [answered_later];
    let evidence = Evidence {
        entries: &evidence_entries,
        requests: &requests,
        backends: &backends,
    };
    let outcomes = of_schedule(&[first, second], &evidence);
    assert!(outcomes[0].shown.is_err(), "{outcomes:?}");
    assert!(outcomes[1].shown.is_ok(), "{outcomes:?}");
}
