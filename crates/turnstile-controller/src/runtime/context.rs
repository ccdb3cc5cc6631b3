//! What the reconcilers share: the API client, the caches, the backends, Events, metrics,
//! and the leadership gate every write passes through (`leader::LeadershipGate`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::Client;

use crate::error::ControllerError;
use crate::leader::LeadershipGate;
use crate::metrics::Metrics;
use crate::pass::owners::OwnerCaches;
use crate::runtime::backends::Backends;
use crate::runtime::claim_index::ClaimIndex;
use crate::traces::ClaimTraces;
use crate::wakes::backend_outages::BackendOutages;
use crate::wakes::lock_wakes::LockWakes;
use crate::wakes::queue_wakes::QueueWakes;
use crate::writer::budget::WriteBudget;
use crate::writer::events::EventPublisher;
use crate::writer::own_writes::OwnWrites;
use crate::writer::ApiWriter;
use turnstile_api::{ClusterDistributedLock, DistributedLock, LockClaim, LockTemplate};

/// First retry delay after a failed pass or an unavailable backend.
const BACKOFF_BASE: Duration = Duration::from_millis(500);
/// Longest retry delay.
const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// Passes a second that may refresh waiters' positions, over all locks (a refresh writes at
/// most `EXACT_POSITIONS + POSITION_REFRESHES_PER_PASS` claims): 20, in bursts of 100.
pub const POSITION_REFRESHES_PER_SECOND: u32 = 20;

/// Shared state of the reconcilers, one handle per concern.
pub struct Context {
    /// What a pass reads: the caches and their index.
    pub cache: CacheHandles,
    /// Where a pass writes: the API, behind the leadership gate.
    pub api: ApiHandles,
    /// The lock backends.
    pub backends: Backends,
    /// Prometheus metrics.
    pub metrics: Metrics,
    /// When a lock's next pass comes besides its watches.
    pub retries: Retries,
}

/// The caches a pass reads.
pub struct CacheHandles {
    /// The lock cache (filled by the lock controller's watch).
    pub locks: Store<DistributedLock>,
    /// The claim cache (filled by the shared claim watch).
    pub claims: Store<LockClaim>,
    /// The claim cache's names by lock and by owner.
    pub claim_index: ClaimIndex,
    /// Where owner states are read (`None`: each is looked up in the API).
    pub owners: Option<OwnerCaches>,
    /// The namespaces' metadata, to tell the ones being deleted (`None`: not watched).
    pub namespaces: Option<Store<PartialObjectMeta<Namespace>>>,
    /// The `LockTemplate`s, for locks made on first use (`None`: not watched).
    pub templates: Option<Store<LockTemplate>>,
    /// The `ClusterDistributedLock`s (`None`: not served, as by a controller of one namespace).
    pub cluster_locks: Option<Store<ClusterDistributedLock>>,
}

/// What a pass writes through: the API client, the gate every write passes, Events, and what
/// paces and records the writes.
pub struct ApiHandles {
    /// The API client.
    pub client: Client,
    /// Closed once this replica is no longer the leader.
    pub leadership: LeadershipGate,
    /// Publishes Events.
    pub events: EventPublisher,
    /// What each lock's last pass wrote, so the next one waits for the cache to show it.
    pub own_writes: OwnWrites,
    /// How many passes a second may refresh waiters' positions, over all locks: under a wave
    /// of hand-offs the grants' writes go first.
    pub position_refreshes: WriteBudget,
    /// The claims' OpenTelemetry spans (`None`: not traced).
    pub traces: Option<ClaimTraces>,
}

/// When a lock's next pass comes besides its watches: wake-ups no watch brings, the backends
/// awaited, and the backoff after failed passes.
pub struct Retries {
    /// Wake-ups of lock passes that no watch event brings.
    pub wakes: LockWakes,
    /// The locks waiting for a backend to answer again, woken when it does.
    pub outages: BackendOutages,
    /// The claims waiting in a backend's queue, whose locks it wakes when it hands them the
    /// key.
    pub queue_wakes: QueueWakes,
    failures: Mutex<HashMap<String, u32>>,
}

impl Context {
    /// Assembles a context.
    pub fn new(
        client: Client,
        locks: Store<DistributedLock>,
        claims: Store<LockClaim>,
        claim_index: ClaimIndex,
        backends: Backends,
        events: EventPublisher,
        metrics: Metrics,
    ) -> Self {
        let wakes = LockWakes::default();
        Self {
            cache: CacheHandles {
                locks,
                claims,
                claim_index,
                owners: None,
                namespaces: None,
                templates: None,
                cluster_locks: None,
            },
            api: ApiHandles {
                client,
                leadership: LeadershipGate::always_open(),
                events,
                own_writes: OwnWrites::default(),
                position_refreshes: WriteBudget::new(POSITION_REFRESHES_PER_SECOND),
                traces: None,
            },
            backends,
            metrics,
            retries: Retries {
                outages: BackendOutages::new(wakes.clone()),
                queue_wakes: QueueWakes::default(),
                wakes,
                failures: Mutex::new(HashMap::new()),
            },
        }
    }

    /// Writes only while `leadership` is open.
    pub fn with_leadership(mut self, leadership: LeadershipGate) -> Self {
        self.api.leadership = leadership;
        self
    }

    /// Reads owner states from these caches instead of the API.
    pub fn with_owner_caches(mut self, owners: OwnerCaches) -> Self {
        self.cache.owners = Some(owners);
        self
    }

    /// Tells the namespaces being deleted by this cache of their metadata.
    pub fn with_namespaces(mut self, namespaces: Store<PartialObjectMeta<Namespace>>) -> Self {
        self.cache.namespaces = Some(namespaces);
        self
    }

    /// Records the claims' spans here (`None`: not traced).
    pub fn with_traces(mut self, traces: Option<ClaimTraces>) -> Self {
        self.api.traces = traces;
        self
    }

    /// Serves `ClusterDistributedLock`s from this cache.
    pub fn with_cluster_locks(mut self, cluster_locks: Store<ClusterDistributedLock>) -> Self {
        self.cache.cluster_locks = Some(cluster_locks);
        self
    }

    /// Makes locks on first use from the `LockTemplate`s of this cache.
    pub fn with_templates(mut self, templates: Store<LockTemplate>) -> Self {
        self.cache.templates = Some(templates);
        self
    }
}

impl CacheHandles {
    /// Whether `namespace` is being deleted (its objects go with it: the passes release their
    /// grants and remove the finalizers, and write no status nor Event to them). False when
    /// the namespace is not (yet) in the cache.
    pub fn namespace_terminating(&self, namespace: &str) -> bool {
        is_terminating(self.namespaces.as_ref(), namespace)
    }

    /// Whether the lock exists in the cache.
    pub fn lock_exists(&self, namespace: &str, name: &str) -> bool {
        self.locks
            .get(&ObjectRef::new(name).within(namespace))
            .is_some()
    }
}

impl ApiHandles {
    /// The writer every API write of a pass goes through (gated by [`ApiHandles::leadership`]).
    pub fn writer(&self) -> ApiWriter {
        ApiWriter::new(self.leadership.clone())
    }
}

impl Retries {
    /// The next retry delay for `key` (exponential, capped), counting this failure.
    pub fn backoff(&self, key: &str) -> Duration {
        let mut failures = self
            .failures
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let count = failures.entry(key.to_owned()).or_insert(0);
        let delay = BACKOFF_BASE.saturating_mul(2u32.saturating_pow(*count));
        *count = count.saturating_add(1).min(16);
        delay.min(BACKOFF_MAX)
    }

    /// The retry delay after a failed pass of `key`. A 409 Conflict is optimistic concurrency
    /// doing its job, not a sick API server: it is retried soon, with fresh state, and does not
    /// grow the backoff that real failures (5xx, unreachable backends) earn.
    pub fn retry_delay(&self, key: &str, error: &ControllerError) -> Duration {
        if error.is_conflict() {
            BACKOFF_BASE
        } else {
            self.backoff(key)
        }
    }

    /// Forgets the failures of `key` after a clean pass.
    pub fn reset_backoff(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(key);
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("backends", &self.backends)
            .field("leading", &self.api.leadership.is_open())
            .finish_non_exhaustive()
    }
}

/// Whether `namespaces` (the namespaces' metadata, `None` when not watched) shows `namespace`
/// marked for deletion.
pub fn is_terminating(
    namespaces: Option<&Store<PartialObjectMeta<Namespace>>>,
    namespace: &str,
) -> bool {
    namespaces.is_some_and(|namespaces| {
        namespaces
            .get(&ObjectRef::new(namespace))
            .is_some_and(|meta| meta.metadata.deletion_timestamp.is_some())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;
    use kube::runtime::events::Reporter;
    use kube::runtime::reflector;
    use turnstile_api::BackendKind;

    fn api_error(code: u16) -> ControllerError {
        ControllerError::kube(
            "writing status",
            kube::Error::Api(
                Status {
                    code,
                    message: "test".into(),
                    reason: "test".into(),
                    ..Status::default()
                }
                .boxed(),
            ),
        )
    }

    #[tokio::test]
    async fn conflicts_retry_soon_and_leave_the_backoff_of_real_failures_alone() {
        // A client that is never used: the context only needs one to exist.
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("uri"));
        let client = Client::try_from(config).expect("client");
        let (locks, _) = reflector::store();
        let (claims, _) = reflector::store();
        let events = EventPublisher::new(
            client.clone(),
            Reporter {
                controller: "turnstile".into(),
                instance: None,
            },
        );
        let ctx = Context::new(
            client,
            locks,
            claims,
            ClaimIndex::new(),
            Backends::new(BackendKind::Memory, None),
            events,
            Metrics::new(),
        );
        for _ in 0..10 {
            assert_eq!(
                ctx.retries.retry_delay("lock/ns/db", &api_error(409)),
                BACKOFF_BASE
            );
        }
        let first = ctx.retries.retry_delay("lock/ns/db", &api_error(500));
        let second = ctx.retries.retry_delay("lock/ns/db", &api_error(500));
        assert_eq!(first, BACKOFF_BASE, "ten conflicts earned no backoff");
        assert_eq!(second, BACKOFF_BASE * 2);
        ctx.retries.reset_backoff("lock/ns/db");
        assert_eq!(
            ctx.retries.retry_delay("lock/ns/db", &api_error(500)),
            BACKOFF_BASE
        );

        // Doubling from 0.5 s, capped at 60 s however long the failures go on.
        let delays: Vec<Duration> = (0..20)
            .map(|_| ctx.retries.backoff("ns/redis-lock"))
            .collect();
        assert_eq!(
            delays[..4],
            [500, 1000, 2000, 4000].map(Duration::from_millis)
        );
        assert_eq!(
            delays[7],
            Duration::from_secs(60),
            "0.5 s × 2⁷ = 64 s, capped"
        );
        assert!(delays.iter().all(|delay| *delay <= Duration::from_secs(60)));
        assert_eq!(delays[19], Duration::from_secs(60));
    }
}
