//! The checker on hand-made histories: a clean one passes, and a violation of each kind is
//! caught.

use turnstile_api::ClaimPhase;

use super::checker::{check, Kind, LockUnderTest, Report};
use super::history::{ClaimSeen, Ending, Entry, Event, History, Millis};

const S: Millis = 1_000;
/// An arbitrary whole second to start the histories at.
const T0: Millis = 1_800_000_000_000;

fn mutex() -> LockUnderTest {
    LockUnderTest {
        name: "m".into(),
        max_holders: 1,
        lease_seconds: 3,
        free_margin_ms: 5 * S,
    }
}

/// A hand-made history, written one step at a time.
#[derive(Default)]
struct Script {
    history: History,
}

impl Script {
    fn at(&self, seconds: i64, event: Event) -> &Self {
        self.history.record_at(T0 + seconds * S, event);
        self
    }

    /// A claim created at `created` (seconds), seen `Pending` at once.
    fn create(&self, claim: &str, created: i64) -> &Self {
        self.at(
            created,
            Event::Created {
                lock: "m".into(),
                claim: claim.into(),
                pod_owned: false,
            },
        )
        .at(
            created,
            Event::Seen(seen(claim, created, ClaimPhase::Pending, None)),
        )
    }

    /// The claim seen `Held` from `from` to `until` (seconds) with `token`.
    fn held(&self, claim: &str, created: i64, token: i64, from: i64, until: i64) -> &Self {
        let mut status = seen(claim, created, ClaimPhase::Held, Some(token));
        status.acquired_at = Some(T0 + from * S);
        status.expires_at = Some(T0 + until * S);
        self.at(from, Event::Seen(status)).at(
            from,
            Event::SawHeld {
                claim: claim.into(),
                token,
            },
        )
    }

    /// The holder ends its claim at `at` (deleting it), and the watch shows it gone.
    fn delete(&self, claim: &str, at: i64) -> &Self {
        self.at(
            at,
            Event::Ended {
                claim: claim.into(),
                ending: Ending::Delete,
            },
        )
        .at(
            at,
            Event::Gone {
                claim: claim.into(),
            },
        )
    }

    fn write(&self, at: i64, claim: &str, token: i64, read: u64, previous: u64) -> &Self {
        self.at(
            at,
            Event::Write {
                lock: "m".into(),
                claim: claim.into(),
                token,
                read,
                previous,
                new: read + 1,
                accepted: true,
            },
        )
    }

    fn check(&self, left: &[(String, String)]) -> Report {
        let entries: Vec<Entry> = self.history.entries();
        check(&entries, &[mutex()], left)
    }
}

fn seen(claim: &str, created: i64, phase: ClaimPhase, token: Option<i64>) -> ClaimSeen {
    ClaimSeen {
        claim: claim.into(),
        lock: "m".into(),
        created: T0 + created * S,
        arrived: None,
        phase: Some(phase),
        token,
        acquired_at: None,
        expires_at: None,
        released_at: None,
    }
}

/// a, then b after a's deletion, each writing once.
fn clean() -> Script {
    let script = Script::default();
    script
        .create("a", 0)
        .create("b", 1)
        .held("a", 0, 1, 0, 3)
        .write(1, "a", 1, 0, 0)
        .delete("a", 2)
        .held("b", 1, 2, 2, 5)
        .write(3, "b", 2, 1, 1)
        .delete("b", 4);
    script
}

/// One grant as the history records it: `(fencing token, from, until)`, in seconds.
type Grant = (i64, i64, i64);

/// a (created at 0) and b (created at 1), each granted once as `a`, `b` and deleted at
/// `a_deleted`, `b_deleted`, neither writing: the hand-offs that go wrong by their times or
/// tokens alone.
fn hand_off(a: Grant, a_deleted: i64, b: Grant, b_deleted: i64) -> Script {
    let script = Script::default();
    script
        .create("a", 0)
        .create("b", 1)
        .held("a", 0, a.0, a.1, a.2)
        .delete("a", a_deleted)
        .held("b", 1, b.0, b.1, b.2)
        .delete("b", b_deleted);
    script
}

/// a and b, both created at 0, granted as `a` and `b` (in that order, before either is
/// deleted) and deleted at `deleted.0`, `deleted.1`: grants side by side, or one after the
/// other's lease.
fn both_granted(a: Grant, b: Grant, deleted: (i64, i64)) -> Script {
    let script = Script::default();
    script
        .create("a", 0)
        .create("b", 0)
        .held("a", 0, a.0, a.1, a.2)
        .held("b", 0, b.0, b.1, b.2)
        .delete("a", deleted.0)
        .delete("b", deleted.1);
    script
}

/// The checker finds `kind`, and only `kind`, in `script` (nothing left in the backend).
fn assert_caught(script: &Script, kind: Kind) {
    assert_only(&script.check(&[]), kind);
}

/// `report` has `kind` violations and no other.
fn assert_only(report: &Report, kind: Kind) {
    assert!(report.count(kind) > 0, "{kind:?} not caught: {report:?}");
    let others: Vec<_> = report
        .violations
        .iter()
        .filter(|v| v.kind != kind)
        .collect();
    assert!(others.is_empty(), "also reported: {others:?}");
}

#[test]
fn a_clean_history_passes() {
    let report = clean().check(&[]);
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert_eq!(report.operations.get("grants"), Some(&2));
    assert_eq!(report.operations.get("register writes"), Some(&2));
}

#[test]
fn two_holders_of_a_mutex_at_once_are_caught() {
    assert_caught(
        &both_granted((1, 0, 3), (2, 1, 4), (2, 3)),
        Kind::OverCapacity,
    );
}

#[test]
fn a_lease_that_ran_out_before_the_next_grant_is_no_overlap() {
    let script = both_granted((1, 0, 3), (2, 3, 6), (5, 5));
    let report = script.check(&[]);
    assert!(report.violations.is_empty(), "{:?}", report.violations);
}

#[test]
fn a_token_that_goes_backwards_is_caught() {
    assert_caught(&hand_off((5, 0, 3), 2, (4, 2, 5), 4), Kind::TokenRegression);
}

#[test]
fn a_lost_update_is_caught() {
    let script = clean();
    script
        .create("c", 5)
        .held("c", 5, 3, 5, 8)
        // c read 0, long ago, and writes over b's 2.
        .write(6, "c", 3, 0, 2)
        .delete("c", 7);
    assert_caught(&script, Kind::LostUpdate);
}

#[test]
fn a_later_claim_granted_while_an_earlier_one_waits_is_caught() {
    let script = Script::default();
    script
        .create("a", 0)
        .create("b", 1)
        .create("c", 2)
        .held("a", 0, 1, 0, 20)
        .delete("a", 4)
        // c overtakes b, which waits until 9.
        .held("c", 2, 2, 5, 20)
        .delete("c", 8)
        .held("b", 1, 3, 8, 20)
        .delete("b", 9);
    assert_caught(&script, Kind::FifoViolation);
}

/// Claims b, a, c created in that order within one second (the controller recorded their
/// arrivals 1 ms apart), granted one after another in the order `granted` once the holder
/// `h` ends.
fn one_second_queue(granted: [&str; 3]) -> Script {
    let script = Script::default();
    script.create("h", 0).held("h", 0, 1, 0, 60);
    for (n, claim) in ["b", "a", "c"].into_iter().enumerate() {
        let mut pending = seen(claim, 1, ClaimPhase::Pending, None);
        pending.arrived = Some((T0 + S) * 1_000 + i64::try_from(n).expect("small") * 1_000);
        script
            .at(
                1,
                Event::Created {
                    lock: "m".into(),
                    claim: claim.into(),
                    pod_owned: false,
                },
            )
            .at(1, Event::Seen(pending));
    }
    // The first grant comes within the 2 s allowance of the claims' creation: only their
    // recorded arrivals can tell an overtake there.
    script.delete("h", 2);
    for (n, claim) in granted.into_iter().enumerate() {
        let n = i64::try_from(n).expect("small");
        script.held(claim, 1, 2 + n, 2 + 2 * n, 60);
        script.delete(claim, 4 + 2 * n);
    }
    script
}

#[test]
fn claims_arriving_within_one_second_are_checked_in_arrival_order() {
    // Granted in arrival order: clean, with no allowance needed.
    let clean = one_second_queue(["b", "a", "c"]).check(&[]);
    assert!(clean.violations.is_empty(), "{clean:?}");
    // The control: name order within the second (what ordering by `creationTimestamp`, then
    // name, did) is caught.
    assert_caught(&one_second_queue(["a", "b", "c"]), Kind::FifoViolation);
}

#[test]
fn a_claim_that_never_got_anywhere_is_caught() {
    let script = clean();
    script.create("c", 4).at(
        6,
        Event::Ended {
            claim: "c".into(),
            ending: Ending::GaveUp,
        },
    );
    assert_caught(&script, Kind::NeverServed);
}

#[test]
fn a_lock_left_free_with_a_waiter_is_caught() {
    // Nobody holds from 2 to 20 while b waits: more than the lease (3) + margin (5).
    assert_caught(&hand_off((1, 0, 3), 2, (2, 20, 23), 21), Kind::StuckFree);
}

#[test]
fn grants_left_in_the_backend_are_reported() {
    let report = clean().check(&[("m".into(), "1 holder: a".into())]);
    assert_only(&report, Kind::LeftInBackend);
}
