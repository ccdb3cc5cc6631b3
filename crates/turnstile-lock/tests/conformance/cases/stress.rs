//! Concurrent stress runs that count violations of the guarantees.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use turnstile_lock::{Lock, LockError};

use crate::harness::Harness;

/// Shared bookkeeping of a stress run.
#[derive(Default)]
struct Referee {
    /// Locks inside their critical section right now.
    inside: Mutex<Vec<Lock>>,
    /// Highest token of any holder that left its critical section.
    finished_max: AtomicU64,
    tokens: Mutex<Vec<u64>>,
    violations: Mutex<Vec<String>>,
    stalled_told: AtomicUsize,
    stalled: AtomicUsize,
}

impl Referee {
    /// A holder enters: count live leases inside (including its own).
    fn enter(&self, lock: &Lock, max_holders: usize, started_after_token: u64) {
        let mut inside = self.inside.lock().unwrap();
        let live = inside.iter().filter(|other| !other.is_lost()).count() + 1;
        if live > max_holders {
            let now = tokio::time::Instant::now();
            let others: Vec<String> = inside
                .iter()
                .map(|other| {
                    format!(
                        "token {} owner {} lost {} left {:?}",
                        other.fencing_token(),
                        other.owner(),
                        other.is_lost(),
                        other.lease_deadline().checked_duration_since(now)
                    )
                })
                .collect();
            self.violation(format!(
                "{live} live holders inside (max {max_holders}), token {} owner {} left {:?}: {others:?}",
                lock.fencing_token(),
                lock.owner(),
                lock.lease_deadline().checked_duration_since(now)
            ));
        }
        if lock.fencing_token() <= started_after_token {
            self.violation(format!(
                "token {} not above {started_after_token}, held before the acquire began",
                lock.fencing_token()
            ));
        }
        inside.push(lock.clone());
        self.tokens.lock().unwrap().push(lock.fencing_token());
    }

    fn leave(&self, lock: &Lock) {
        self.inside
            .lock()
            .unwrap()
            .retain(|other| other.fencing_token() != lock.fencing_token());
        self.finished_max
            .fetch_max(lock.fencing_token(), Ordering::SeqCst);
    }

    fn violation(&self, message: String) {
        self.violations.lock().unwrap().push(message);
    }

    fn check(&self, expected_grants: usize, mutex: bool) {
        let violations = self.violations.lock().unwrap();
        assert!(
            violations.is_empty(),
            "{} violations: {violations:?}",
            violations.len()
        );
        let tokens = self.tokens.lock().unwrap();
        assert_eq!(tokens.len(), expected_grants);
        let mut unique = tokens.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), tokens.len(), "duplicate fencing tokens");
        if mutex {
            assert!(
                tokens.windows(2).all(|pair| pair[0] < pair[1]),
                "tokens out of grant order"
            );
        }
    }
}

async fn stress(
    h: Harness,
    key: &'static str,
    max_holders: u32,
    tasks: usize,
    rounds: usize,
    stall_every: Option<usize>,
) {
    let locker = h.locker();
    let referee = Arc::new(Referee::default());
    let ttl = if stall_every.is_some() {
        Duration::from_millis(300)
    } else {
        Duration::from_secs(10)
    };
    let mut handles = Vec::new();
    for task in 0..tasks {
        let (locker, referee) = (locker.clone(), referee.clone());
        handles.push(tokio::spawn(async move {
            for round in 0..rounds {
                let started_after = referee.finished_max.load(Ordering::SeqCst);
                let lock = locker
                    .lock(key, ttl)
                    .max_holders(max_holders)
                    .acquire()
                    .await
                    .expect("acquire");
                referee.enter(&lock, max_holders as usize, started_after);
                let stall =
                    stall_every.is_some_and(|every| (task * rounds + round).is_multiple_of(every));
                if stall {
                    referee.stalled.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(ttl * 2).await;
                    // The holder must learn it lost the lock, every way it can ask.
                    let told = lock.is_lost()
                        && matches!(lock.extend(ttl).await, Err(LockError::LockLost { .. }))
                        && !lock.is_locked().await.expect("is_locked")
                        && matches!(lock.release_strict().await, Err(LockError::LockLost { .. }));
                    if told {
                        referee.stalled_told.fetch_add(1, Ordering::SeqCst);
                    } else {
                        referee.violation(format!(
                            "stalled holder {} was not told it lost the lock",
                            lock.fencing_token()
                        ));
                    }
                } else {
                    tokio::task::yield_now().await;
                    if lock.is_lost() {
                        referee
                            .violation(format!("holder {} lost its lease", lock.fencing_token()));
                    }
                }
                referee.leave(&lock);
                lock.release().await.expect("release");
            }
        }));
    }
    for handle in handles {
        handle.await.expect("join");
    }
    referee.check(tasks * rounds, max_holders == 1 && stall_every.is_none());
    if stall_every.is_some() {
        assert!(referee.stalled.load(Ordering::SeqCst) > 0);
        assert_eq!(
            referee.stalled_told.load(Ordering::SeqCst),
            referee.stalled.load(Ordering::SeqCst)
        );
    }
}

pub async fn stress_mutex_counts_zero_violations(h: Harness) {
    stress(h, "stress-mutex", 1, 8, 25, None).await;
}

pub async fn stress_semaphore_counts_zero_violations(h: Harness) {
    stress(h, "stress-sem", 3, 12, 15, None).await;
}

pub async fn stress_with_stalled_holders_counts_zero_violations(h: Harness) {
    stress(h, "stress-stall", 2, 6, 6, Some(4)).await;
}
