//! The lock engine a simulated pass talks to: the real
//! [`MemoryBackend`](turnstile_lock::MemoryBackend) behind faults the
//! test schedules.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use turnstile_lock::{
    AcquireOutcome, AcquireRequest, Backend, LockError, LockResult, LockSnapshot, WakeSubscription,
};

/// The failures the test has scheduled for the lock engine's next calls: `pass_first` calls
/// still answer, then `fail_next` calls fail as an unreachable backend does. Shared by every
/// pass's [`FaultyBackend`], so a schedule survives a backend restart.
#[derive(Debug, Default)]
pub struct Faults {
    script: Mutex<FaultScript>,
}

#[derive(Debug, Default, Clone, Copy)]
struct FaultScript {
    pass_first: usize,
    fail_next: usize,
    /// Armed by [`Faults::mid_pass`]: `(ok, n)` for the next pass that makes calls.
    mid_pass: Option<(usize, usize)>,
    /// Calls failed so far (a pass that saw one is a change of the world, see `settle`).
    fired: usize,
}

impl Faults {
    /// The next `n` calls fail (the backend is down for them).
    pub fn down(&self, n: usize) {
        self.schedule(0, n);
    }

    /// The next `ok` calls answer, then `n` calls fail.
    pub fn fail_after(&self, ok: usize, n: usize) {
        self.schedule(ok, n);
    }

    /// The backend goes in the middle of the next pass that makes calls: after its snapshot
    /// and `ok` of its calls (modulo their number, so that one of them fails), `n` calls fail
    /// (the rest of the pass's are not made; what remains fails the next passes).
    pub fn mid_pass(&self, ok: usize, n: usize) {
        self.script.lock().expect("faults").mid_pass = Some((ok, n));
    }

    /// Schedules an armed mid-pass failure for a pass about to make `calls` calls.
    pub(super) fn arm_for(&self, calls: usize) {
        let armed = self.script.lock().expect("faults").mid_pass;
        if let Some((ok, n)) = armed.filter(|_| calls > 0) {
            self.script.lock().expect("faults").mid_pass = None;
            self.schedule(ok % calls, n);
        }
    }

    fn schedule(&self, ok: usize, n: usize) {
        let mut script = self.script.lock().expect("faults");
        script.pass_first = ok;
        script.fail_next = n;
    }

    /// How many calls have failed so far.
    pub fn fired(&self) -> usize {
        self.script.lock().expect("faults").fired
    }

    /// Counts one call; `Err` if it is to fail.
    fn call(&self, what: &str) -> LockResult<()> {
        let mut script = self.script.lock().expect("faults");
        if script.fail_next == 0 {
            return Ok(());
        }
        if script.pass_first > 0 {
            script.pass_first -= 1;
            return Ok(());
        }
        script.fail_next -= 1;
        script.fired += 1;
        Err(LockError::backend(
            "memory",
            format!("{what} (injected by the simulation)"),
            "connection refused",
        ))
    }
}

/// The lock engine as a pass sees it: the real [`MemoryBackend`](turnstile_lock::MemoryBackend) behind a switch the test
/// flips ([`Faults`]). A failed call changes nothing in the engine (a request that never
/// reached it); that an unreachable backend may also have applied a call is not modelled.
#[derive(Debug)]
pub struct FaultyBackend {
    pub inner: Arc<dyn Backend>,
    pub faults: Arc<Faults>,
}

#[async_trait::async_trait]
impl Backend for FaultyBackend {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    async fn acquire(&self, request: &AcquireRequest<'_>) -> LockResult<AcquireOutcome> {
        self.faults.call("acquire")?;
        self.inner.acquire(request).await
    }
    async fn release(&self, key: &str, owner: &str, max_holders: u32) -> LockResult<bool> {
        self.faults.call("release")?;
        self.inner.release(key, owner, max_holders).await
    }
    async fn extend(&self, key: &str, owner: &str, ttl: Duration) -> LockResult<Option<Duration>> {
        self.faults.call("extend")?;
        self.inner.extend(key, owner, ttl).await
    }
    async fn is_held(&self, key: &str, owner: &str) -> LockResult<bool> {
        self.faults.call("is_held")?;
        self.inner.is_held(key, owner).await
    }
    async fn snapshot(&self, key: &str) -> LockResult<LockSnapshot> {
        self.faults.call("snapshot")?;
        self.inner.snapshot(key).await
    }
    async fn raise_fencing_floor(&self, key: &str, floor: u64) -> LockResult<u64> {
        self.faults.call("raise_fencing_floor")?;
        self.inner.raise_fencing_floor(key, floor).await
    }
    async fn subscribe(&self, key: &str, owner: &str) -> LockResult<WakeSubscription> {
        self.faults.call("subscribe")?;
        self.inner.subscribe(key, owner).await
    }
}
