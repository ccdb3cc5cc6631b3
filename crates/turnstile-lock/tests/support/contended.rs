//! A contended, bounded stress run on one lock while a fault (a slot move, a failover) is
//! injected, with the safety violations counted rather than asserted, so each test decides
//! which counts must be zero.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use turnstile_lock::{Lock, Locker};

/// What a contended run does: `tasks` tasks each take `key` (one holder at a time) `rounds`
/// times, holding it 2 ms, with leases of `lease`; the run stops at `deadline` even if not
/// every round completed (so a broken backend fails the test instead of hanging it).
#[derive(Debug, Clone, Copy)]
pub struct ContendedRun {
    pub tasks: usize,
    pub rounds: usize,
    pub key: &'static str,
    pub lease: Duration,
    pub deadline: Duration,
}

impl ContendedRun {
    /// The size every fault test here uses: 4 tasks of 40 rounds each, so a fault timed at a
    /// fraction of the 160 grants lands mid-run.
    pub fn four_tasks_of_forty_rounds(
        key: &'static str,
        lease: Duration,
        deadline: Duration,
    ) -> Self {
        ContendedRun {
            tasks: 4,
            rounds: 40,
            key,
            lease,
            deadline,
        }
    }

    /// How many grants the run makes when every round completes.
    pub fn total_grants(&self) -> u64 {
        (self.tasks * self.rounds) as u64
    }
}

/// How far a run got, for the fault to wait on.
#[derive(Clone)]
pub struct Progress {
    grants: Arc<AtomicU64>,
}

impl Progress {
    /// Blocks (polling every 5 ms) until at least `grants` grants are done or `within` has
    /// passed, whichever comes first; the fault then goes ahead either way.
    pub fn wait_for_grants(&self, grants: u64, within: Duration) {
        let until = Instant::now() + within;
        while self.grants.load(Ordering::SeqCst) < grants && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// The counts of a finished run, plus what the fault returned.
#[derive(Debug)]
pub struct ContendedReport<T> {
    /// Grants done (a holder got the lock, held it and let go).
    pub grants: u64,
    /// Grants made while someone else already held the lock (`max_holders` is 1).
    pub over_max_holders: u64,
    /// Grants whose fencing token was not above every earlier one.
    pub token_regressions: u64,
    /// Acquires that failed with the backend unavailable, and releases that failed.
    pub backend_errors: u64,
    /// The highest fencing token seen.
    pub last_token: u64,
    /// What the fault closure returned.
    pub fault: T,
}

impl<T> ContendedReport<T> {
    /// Asserts what a fault must never break: at most one holder at a time, every token
    /// above every earlier one, and every round of `run` completed.
    pub fn assert_safe_and_complete(&self, run: &ContendedRun) {
        assert_eq!(self.over_max_holders, 0, "more than one holder at a time");
        assert_eq!(
            self.token_regressions, 0,
            "a token not above an earlier one"
        );
        assert_eq!(self.grants, run.total_grants(), "every round completes");
    }
}

/// Runs `run` with `locker` while `fault` runs on a blocking thread (it gets the run's
/// [`Progress`] to time itself), and returns the counts once every task and the fault ended.
/// A panic in the fault (a failed assertion in it) fails the test.
pub async fn run_contended_with_fault<T, F>(
    locker: &Locker,
    run: ContendedRun,
    fault: F,
) -> ContendedReport<T>
where
    F: FnOnce(Progress) -> T + Send + 'static,
    T: Send + 'static,
{
    let over_max_holders = Arc::new(AtomicU64::new(0));
    let token_regressions = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicU64::new(0));
    let last_token = Arc::new(Mutex::new(0u64));
    let grants = Arc::new(AtomicU64::new(0));
    let backend_errors = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + run.deadline;
    let mut tasks = Vec::new();
    for _ in 0..run.tasks {
        let locker = locker.clone();
        let (over_max_holders, token_regressions, inside, last_token, grants, backend_errors) = (
            over_max_holders.clone(),
            token_regressions.clone(),
            inside.clone(),
            last_token.clone(),
            grants.clone(),
            backend_errors.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut done = 0;
            while done < run.rounds && Instant::now() < deadline {
                let lock = match locker.lock(run.key, run.lease).acquire().await {
                    Ok(lock) => lock,
                    // A call may fail while the fault happens; the lock's state must not.
                    Err(error) if error.is_backend_unavailable() => {
                        backend_errors.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                    Err(error) => panic!("acquire: {error}"),
                };
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    over_max_holders.fetch_add(1, Ordering::SeqCst);
                }
                {
                    let mut last = last_token.lock().unwrap();
                    if lock.fencing_token() <= *last {
                        token_regressions.fetch_add(1, Ordering::SeqCst);
                    }
                    *last = (*last).max(lock.fencing_token());
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                grants.fetch_add(1, Ordering::SeqCst);
                done += 1;
                // A failed release leaves a lease that runs out; it cannot break exclusion.
                if lock.release().await.is_err() {
                    backend_errors.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    let progress = Progress {
        grants: grants.clone(),
    };
    let fault = tokio::task::spawn_blocking(move || fault(progress));
    for task in tasks {
        task.await.expect("stress task");
    }
    let fault = fault.await.expect("fault thread");
    let last_token = *last_token.lock().unwrap();
    ContendedReport {
        grants: grants.load(Ordering::SeqCst),
        over_max_holders: over_max_holders.load(Ordering::SeqCst),
        token_regressions: token_regressions.load(Ordering::SeqCst),
        backend_errors: backend_errors.load(Ordering::SeqCst),
        last_token,
        fault,
    }
}

/// Takes `key` on `locker`, trying up to 50 times, 100 ms apart, while the backend is
/// unavailable: the first calls after a failover may fail while the client finds the new
/// master. Any other error panics; `None` if every try failed.
pub async fn acquire_after_failover(locker: &Locker, key: &str, lease: Duration) -> Option<Lock> {
    for _ in 0..50 {
        match locker.lock(key, lease).acquire().await {
            Ok(lock) => return Some(lock),
            Err(error) if error.is_backend_unavailable() => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("acquire: {error}"),
        }
    }
    None
}
