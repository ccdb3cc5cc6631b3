//! One pass over a lock, in the shell: what the pure [`core`](crate::core) decides on is
//! gathered here, its plan is carried out here, and what it decided is reported from here.
//!
//! - [`lock_reconciler`]: the pass itself, in three steps: [`gather`] (the lock, its claims,
//!   [`owners`]' states, one backend snapshot) → [`execute`] (plan → the calls → fold → write:
//!   [`run_pass`](execute::run_pass), which the controller's property tests run too) →
//!   [`report`];
//! - [`backend_call`]: one planned call made on the lock engine;
//! - [`multi_lock`]: claims on several locks — the other locks read for the core, and the
//!   backends its calls on them are made on;
//! - [`cluster_locks`]: which claims from the namespaces a `ClusterDistributedLock` selects
//!   its pass takes;
//! - [`owners`]: whether each claim's Pod or Job still runs;
//! - [`report`]: what the pass tells the world after its writes (metrics, outage wake-ups,
//!   spans, Events).

pub mod backend_call;
pub mod cluster_locks;
pub mod execute;
pub mod gather;
pub mod lock_reconciler;
pub mod multi_lock;
pub mod owners;
pub mod report;
