//! Turnstile's controller: reconcilers that are small I/O shells over a pure decision core.
//!
//! - [`core`]: the decisions (who holds, who waits, who is next, which backend calls), with
//!   no I/O: plan → the calls → fold.
//! - [`pass`]: one pass over a `DistributedLock` (or a `ClusterDistributedLock`) and all its
//!   claims in the shell — gather, carry out the core's plan on the lock engine (claims on
//!   several locks included), report — the code the tests' simulation runs too.
//! - [`writer`]: the one way anything is written (leadership gate → conditional patch), a
//!   pass's writes decided from the core's decision, Events and their budget.
//! - [`wakes`]: lock passes woken by a backend's return, a hand-off from a backend's queue, a
//!   Pod's or Job's event.
//! - [`claim_reconciler`]: claims whose lock does not exist (or does not take them).
//! - [`templates`]: locks made on first use from a `LockTemplate`, and deleted once unused.
//! - [`gate`]: gated workloads (suspended Jobs, Pods with a scheduling gate) go once their claim
//!   is held.
//! - [`runtime`]: the watches, caches and controllers (`turnstile run`), and the handles the
//!   reconcilers share ([`runtime::context`]).
//! - [`leader`]: leader election on a `coordination.k8s.io` Lease, and the gate every write
//!   passes through while this replica leads.
//! - [`metrics`]: the Prometheus series, and the `/metrics`, `/healthz`, `/readyz` endpoints;
//!   [`traces`]: OpenTelemetry spans of each claim's wait and hold (opt-in).

pub mod claim_reconciler;
pub mod core;
pub mod error;
pub mod gate;
pub mod leader;
pub mod metrics;
pub mod pass;
pub mod runtime;
pub mod templates;
pub mod traces;
pub mod wakes;
pub mod writer;

// The schema's `maxHolders` bound and the engine's limit are one value: the resources do not
// depend on the engine, so the crate that uses both checks it.
const _: () = assert!(turnstile_api::MAX_HOLDERS as u32 == turnstile_lock::MAX_HOLDERS);

pub use error::ControllerError;
pub use runtime::{run, ControllerConfig};
pub use writer::events::EventPolicy;
