//! The run's complete history: every claim status the watch showed, every worker step, every
//! register read and write (accepted or refused) and every fault, each with the time it was
//! recorded (milliseconds since the Unix epoch, the clock the controller's statuses use).

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use futures::StreamExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::watcher;
use kube::Api;
use turnstile_api::{ClaimPhase, LockClaim};

/// Milliseconds since the Unix epoch.
pub type Millis = i64;

/// Now, in [`Millis`].
pub fn now() -> Millis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as i64)
        .unwrap_or_default()
}

/// A Kubernetes time in [`Millis`].
pub fn millis(time: &Time) -> Millis {
    time.0.as_millisecond()
}

/// `at` rounded down to the whole second: the resolution of the statuses' times, so that
/// comparisons between the test's clock and the controller's never invent an overlap.
pub fn floor_second(at: Millis) -> Millis {
    at - at.rem_euclid(1000)
}

/// One claim as one watch event showed it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimSeen {
    pub claim: String,
    pub lock: String,
    /// `metadata.creationTimestamp`: the claim's place in the queue (with the name) while it
    /// has no recorded arrival.
    pub created: Millis,
    /// `status.arrivedAt` in microseconds: when the controller saw it arrive, its place in
    /// the queue.
    pub arrived: Option<i64>,
    pub phase: Option<ClaimPhase>,
    pub token: Option<i64>,
    pub acquired_at: Option<Millis>,
    pub expires_at: Option<Millis>,
    pub released_at: Option<Millis>,
}

impl ClaimSeen {
    /// What `claim` shows.
    pub fn of(claim: &LockClaim) -> Self {
        let status = claim.status.as_ref();
        Self {
            claim: claim.metadata.name.clone().unwrap_or_default(),
            lock: claim.spec.lock_name.clone(),
            created: claim
                .metadata
                .creation_timestamp
                .as_ref()
                .map(millis)
                .unwrap_or_default(),
            arrived: status
                .and_then(|s| s.arrived_at.as_ref())
                .map(|at| at.0.as_microsecond()),
            phase: status.and_then(|s| s.phase),
            token: status.and_then(|s| s.fencing_token),
            acquired_at: status.and_then(|s| s.acquired_at.as_ref()).map(millis),
            expires_at: status.and_then(|s| s.expires_at.as_ref()).map(millis),
            released_at: status.and_then(|s| s.released_at.as_ref()).map(millis),
        }
    }
}

/// How a worker ended its claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Deleted the claim.
    Delete,
    /// Set `spec.release: true`.
    Release,
    /// Marked its Pod `Succeeded`.
    PodSucceeded,
    /// Deleted its Pod (garbage collection takes the claim).
    PodDeleted,
    /// Stopped waiting for `Held` and deleted the claim.
    GaveUp,
}

/// What the history records.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The claim watch showed this status.
    Seen(ClaimSeen),
    /// The claim watch showed the claim deleted.
    Gone { claim: String },
    /// A worker's claim was created (the create call returned).
    Created {
        lock: String,
        claim: String,
        pod_owned: bool,
    },
    /// A worker saw its claim `Held`.
    SawHeld { claim: String, token: i64 },
    /// A worker gave its grant up (or gave up waiting) this way.
    Ended { claim: String, ending: Ending },
    /// A register read: `value` is None when the register refused the token.
    Read {
        lock: String,
        claim: String,
        token: i64,
        value: Option<u64>,
    },
    /// A register write of `new` computed from `read`; `previous` is what the register held.
    Write {
        lock: String,
        claim: String,
        token: i64,
        read: u64,
        previous: u64,
        new: u64,
        accepted: bool,
    },
    /// A fault began (`kind` is a short stable name, `detail` says where and how long).
    Fault { kind: String, detail: String },
}

/// An event and when it was recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub at: Millis,
    pub event: Event,
}

/// The shared, append-only history.
#[derive(Debug, Clone, Default)]
pub struct History {
    entries: Arc<Mutex<Vec<Entry>>>,
}

impl History {
    /// Records `event` now.
    pub fn record(&self, event: Event) {
        self.record_at(now(), event);
    }

    /// Records `event` at `at` (hand-made histories).
    pub fn record_at(&self, at: Millis, event: Event) {
        self.entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(Entry { at, event });
    }

    /// Everything recorded so far, in order.
    pub fn entries(&self) -> Vec<Entry> {
        self.entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Records every claim status the watch of `claims` shows until the task is aborted
    /// (a 410 or a closed watch is followed by a fresh list, as any client does).
    pub fn watch_claims(&self, claims: Api<LockClaim>) -> tokio::task::JoinHandle<()> {
        let history = self.clone();
        tokio::spawn(async move {
            let mut stream = watcher(claims, watcher::Config::default()).boxed();
            while let Some(event) = stream.next().await {
                match event {
                    Ok(watcher::Event::Apply(claim) | watcher::Event::InitApply(claim)) => {
                        history.record(Event::Seen(ClaimSeen::of(&claim)));
                    }
                    Ok(watcher::Event::Delete(claim)) => history.record(Event::Gone {
                        claim: claim.metadata.name.unwrap_or_default(),
                    }),
                    Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
                    Err(error) => {
                        tracing::debug!(%error, "history watch error (retrying)");
                        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    }
                }
            }
        })
    }
}
