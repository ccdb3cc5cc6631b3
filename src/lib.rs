//! The `turnstile` binary: the command line over the workspace's layers.
//!
//! The workspace's crate graph is the architecture; each crate depends only on those above it:
//!
//! - [`turnstile_lock`]: the lock engine, a library in its own right with no Kubernetes
//!   dependency: a `Locker` over a `Backend` (memory; Redis and MongoDB behind features).
//! - [`turnstile_api`]: the `DistributedLock` and `LockClaim` custom resources
//!   (`turnstile.dev/v1alpha1`) and the contract's vocabulary (reasons, conditions, limits).
//! - [`turnstile_controller`]: the reconcilers, thin I/O shells over a pure decision core;
//!   leader election on a Lease; Prometheus metrics, `/healthz`, `/readyz`.
//! - this crate: [`cli`] (`turnstile run`, `crds`, `wait`, `lock`), with [`run`] (the
//!   controller's flags and process set-up), [`wait`] (block until a LockClaim is held),
//!   [`lock`] (run a command under a lock: a backend key, or a DistributedLock), [`queue`]
//!   (who holds and waits), [`history`] (who held it), [`release`] (an audited force-release), [`oneshot`] for how they end and
//!   [`exit_codes`] for the numbers they end with.

pub mod cli;
pub mod exit_codes;
pub mod history;
pub mod lock;
pub mod oneshot;
pub mod queue;
pub mod release;
pub mod run;
pub mod telemetry;
pub mod wait;

/// The README's Rust examples, compiled (and, where they need no server, run) as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The docs site's lock engine page's Rust examples, as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/src/engine.md")]
pub struct EngineDocsDoctests;
