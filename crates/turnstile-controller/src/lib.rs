//! Turnstile's controller: reconcilers that are small I/O shells over a pure decision core.
//!
//! - [`core`]: the decisions (who holds, who waits, who is next), with no I/O.
//! - [`lock_reconciler`]: one pass over a `DistributedLock` (or a `ClusterDistributedLock`)
//!   and all its claims (plan → backend calls on the lock engine → fold → writes), the code
//!   the tests' simulation runs too.
//! - [`backend_call`]: one backend call of a pass, the core's operation made on the engine.
//! - [`multi_lock`]: claims on several locks, granted all at once by their first lock's pass.
//! - [`cluster_locks`]: `ClusterDistributedLock`s: which claims from the namespaces it
//!   selects the lock's pass takes.
//! - [`claim_reconciler`]: claims whose lock does not exist (or does not take them).
//! - [`templates`]: locks made on first use from a `LockTemplate`, and deleted once unused.
//! - [`pass_report`]: what a pass tells the world after its writes: metrics, outage
//!   wake-ups, spans, Events.
//! - [`traces`]: OpenTelemetry spans of each claim's wait and hold (opt-in).
//! - [`claim_index`]: the claim cache's names by lock and by owner (no whole-cache scans).
//! - [`arrivals`]: when each claim arrived, in the watch's order: the queue order after
//!   priority.
//! - [`lock_wakes`]: lock passes woken by something other than a watch event.
//! - [`backend_outages`]: a backend that answers again wakes the locks that waited for it.
//! - [`queue_wakes`]: a backend that hands a key shared with another cluster to a claim
//!   waiting in its queue wakes that claim's lock.
//! - [`own_writes`]: a lock's pass waits until the cache shows its previous pass's writes.
//! - [`owner_watch`]: Pod/Job events wake the locks of the claims they own.
//! - [`gate`]: gated workloads (suspended Jobs, Pods with a scheduling gate) go once their claim
//!   is held.
//! - [`budget`]: how many optional writes (Normal Events, position refreshes) a second.
//! - [`writer`]: the one way anything is written (leadership gate → conditional patch), and a
//!   pass's writes decided from the core's decision and made through a store (the API server,
//!   or the tests' simulated one).
//! - [`tolerant_watch`]: lock and claim watches that skip (and report) objects they cannot read.
//! - [`runtime`]: the watches, caches and controllers (`turnstile run`); [`caches`]: waiting
//!   for a cache's first list.
//! - [`leader`]: leader election on a `coordination.k8s.io` Lease, and the gate every write
//!   passes through while this replica leads.
//! - [`metrics`]: the Prometheus series, and the `/metrics`, `/healthz`, `/readyz` endpoints.

pub mod arrivals;
pub mod backend_call;
pub mod backend_outages;
pub mod backends;
pub mod budget;
pub mod caches;
pub mod claim_index;
pub mod claim_reconciler;
pub mod cluster_locks;
pub mod context;
pub mod core;
pub mod error;
pub mod events;
pub mod gate;
pub mod leader;
pub mod lock_reconciler;
pub mod lock_wakes;
pub mod metrics;
pub mod multi_lock;
pub mod own_writes;
pub mod owner_watch;
pub mod owners;
pub mod pass_report;
pub mod patch;
pub mod queue_wakes;
pub mod runtime;
pub mod templates;
pub mod tolerant_watch;
pub mod traces;
pub mod writer;

// The schema's `maxHolders` bound and the engine's limit are one value: the resources do not
// depend on the engine, so the crate that uses both checks it.
const _: () = assert!(turnstile_api::MAX_HOLDERS as u32 == turnstile_lock::MAX_HOLDERS);

pub use error::ControllerError;
pub use events::EventPolicy;
pub use runtime::{run, ControllerConfig};
