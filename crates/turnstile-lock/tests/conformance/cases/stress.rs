//! Concurrent stress runs that count violations of the guarantees.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use turnstile_lock::{Lock, LockError, LockRequest, Locker, ShareMode};

use crate::harness::Harness;

/// Shared bookkeeping of a stress run.
#[derive(Default)]
struct Referee {
    /// Locks inside their critical section right now, with their modes.
    inside: Mutex<Vec<(Lock, ShareMode)>>,
    /// Highest token of any holder that left its critical section.
    finished_max: AtomicU64,
    tokens: Mutex<Vec<u64>>,
    violations: Mutex<Vec<String>>,
    stalled_told: AtomicUsize,
    stalled: AtomicUsize,
}

impl Referee {
    /// A holder enters: count live leases inside (including its own), and exclusive ones
    /// beside anybody.
    fn enter(&self, lock: &Lock, share: ShareMode, max_holders: usize, started_after_token: u64) {
        let mut inside = self.inside.lock().unwrap();
        let others: Vec<ShareMode> = inside
            .iter()
            .filter(|(other, _)| !other.is_lost())
            .map(|(_, mode)| *mode)
            .collect();
        let live = others.len() + 1;
        if !others.is_empty()
            && (share.is_exclusive() || others.iter().any(|mode| mode.is_exclusive()))
        {
            self.violation(format!(
                "an exclusive holder beside others: token {} ({share:?}) with {others:?}",
                lock.fencing_token()
            ));
        }
        if live > max_holders {
            let now = tokio::time::Instant::now();
            let others: Vec<String> = inside
                .iter()
                .map(|(other, _)| {
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
        inside.push((lock.clone(), share));
        self.tokens.lock().unwrap().push(lock.fencing_token());
    }

    fn leave(&self, lock: &Lock) {
        self.inside
            .lock()
            .unwrap()
            .retain(|(other, _)| other.fencing_token() != lock.fencing_token());
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
                    .shared()
                    .acquire()
                    .await
                    .expect("acquire");
                referee.enter(
                    &lock,
                    ShareMode::Shared,
                    max_holders as usize,
                    started_after,
                );
                let stall =
                    stall_every.is_some_and(|every| (task * rounds + round).is_multiple_of(every));
                if stall {
                    referee.stalled.fetch_add(1, Ordering::SeqCst);
                    // Time: the holder stalls past its lease: the stall is the fault.
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

/// Mixed traffic on one key of 3 holders: every third request of a task is exclusive.
pub async fn stress_mixed_shared_exclusive_counts_zero_violations(h: Harness) {
    const MAX_HOLDERS: u32 = 3;
    const TASKS: usize = 8;
    const ROUNDS: usize = 15;
    let locker = h.locker();
    let referee = Arc::new(Referee::default());
    let mut handles = Vec::new();
    for task in 0..TASKS {
        let (locker, referee) = (locker.clone(), referee.clone());
        handles.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                let share = if (task + round) % 3 == 0 {
                    ShareMode::Exclusive
                } else {
                    ShareMode::Shared
                };
                let started_after = referee.finished_max.load(Ordering::SeqCst);
                let request = locker
                    .lock("stress-mixed", Duration::from_secs(10))
                    .max_holders(MAX_HOLDERS);
                let request = match share {
                    ShareMode::Shared => request.shared(),
                    ShareMode::Exclusive => request.exclusive(),
                };
                let lock = request.acquire().await.expect("acquire");
                referee.enter(&lock, share, MAX_HOLDERS as usize, started_after);
                tokio::task::yield_now().await;
                if lock.is_lost() {
                    referee.violation(format!("holder {} lost its lease", lock.fencing_token()));
                }
                referee.leave(&lock);
                lock.release().await.expect("release");
            }
        }));
    }
    for handle in handles {
        handle.await.expect("join");
    }
    referee.check(TASKS * ROUNDS, false);
}

/// A stream of shared claims (each reader comes back as soon as it left) must not starve a
/// writer: it gets the lock while the stream still runs.
pub async fn exclusive_waiter_is_not_starved_by_a_stream_of_shared_claims(h: Harness) {
    const READERS: usize = 4;
    /// Bounds the stream: far more than the writer needs if it is served fairly.
    const STREAM: Duration = Duration::from_secs(8);
    /// The lock readers and the writer contend for (up to 3 holders), in either mode.
    fn stream(locker: &Locker) -> LockRequest {
        locker
            .lock("stream", Duration::from_secs(10))
            .max_holders(3)
    }
    let locker = h.locker();
    let reads = Arc::new(AtomicUsize::new(0));
    let reader = |locker: Locker, reads: Arc<AtomicUsize>| async move {
        let until = Instant::now() + STREAM;
        while Instant::now() < until {
            let lock = stream(&locker).shared().acquire().await.expect("reader");
            reads.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(10)).await;
            lock.release().await.expect("release");
        }
    };
    let handles: Vec<_> = (0..READERS)
        .map(|_| tokio::spawn(reader(locker.clone(), reads.clone())))
        .collect();
    crate::harness::eventually("the readers stream", || {
        let reads = reads.clone();
        async move { reads.load(Ordering::SeqCst) >= 2 * READERS }
    })
    .await;
    let started = Instant::now();
    let writer = stream(&locker)
        .exclusive()
        .acquire()
        .await
        .expect("the writer is served");
    let waited = started.elapsed();
    let reads_at_grant = reads.load(Ordering::SeqCst);
    let snapshot = locker.snapshot("stream").await.expect("snapshot");
    assert_eq!(snapshot.holders.len(), 1, "the writer holds alone");
    writer.release().await.expect("release");
    for handle in handles {
        handle.await.expect("join");
    }
    assert!(
        reads.load(Ordering::SeqCst) > reads_at_grant,
        "the shared claims stopped before the writer was served (it waited {waited:?})"
    );
}
