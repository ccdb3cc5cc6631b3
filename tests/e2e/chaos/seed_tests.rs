//! The seed alone decides the fault schedule and every worker's choices: drawn twice from one
//! seed they are equal, from another seed they are not.

use super::faults::{kinds, schedule, Fault, KINDS};
use super::workers::{choices, Choices};

const DRAWS: usize = 500;

fn faults(seed: u64, with_mongo: bool) -> Vec<Fault> {
    schedule(seed, with_mongo).take(DRAWS).collect()
}

fn jobs(seed: u64) -> Vec<Choices> {
    choices(seed, 0.3, 0.2, 3_000).take(DRAWS).collect()
}

#[test]
fn one_seed_draws_one_fault_schedule() {
    assert_eq!(faults(429_000, true), faults(429_000, true));
    assert_ne!(faults(429_000, true), faults(429_001, true));
    let kinds: std::collections::BTreeSet<&str> =
        faults(429_000, true).iter().map(|f| f.kind).collect();
    assert!(kinds.len() > 10, "the schedule mixes the kinds: {kinds:?}");
    // Without a MongoDB server its crashes become FLUSHALLs, and nothing else moves.
    let without: Vec<Fault> = faults(429_000, false);
    for (with, without) in faults(429_000, true).iter().zip(&without) {
        if with.kind.starts_with("MongoDB") {
            assert_eq!(without.kind, "Redis FLUSHALL");
        } else {
            assert_eq!(with, without);
        }
    }
}

#[test]
fn one_seed_draws_one_set_of_worker_choices() {
    assert_eq!(jobs(7), jobs(7));
    assert_ne!(jobs(7), jobs(8));
    let drawn = jobs(7);
    assert!(
        drawn.iter().all(|job| !(job.pod_owned && job.pause)),
        "only plain claims pause"
    );
    assert!(drawn.iter().any(|job| job.pause) && drawn.iter().any(|job| job.pod_owned));
    assert!(
        drawn
            .iter()
            .filter(|job| job.pause)
            .all(|job| job.hold_ms > 3_000),
        "a pause outlasts the lease"
    );
}

#[test]
fn every_kind_comes_once_a_round() {
    for seed in [1, 429_000, 7_777_777] {
        for with_mongo in [true, false] {
            let drawn = faults(seed, with_mongo);
            for round in drawn.chunks(KINDS.len()).take(3) {
                let seen: std::collections::BTreeSet<&str> =
                    round.iter().map(|fault| fault.kind).collect();
                assert_eq!(seen, kinds(with_mongo), "seed {seed}, mongo {with_mongo}");
            }
        }
    }
}
