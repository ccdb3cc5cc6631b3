//! Turnstile: distributed locks (mutexes and counting semaphores) as Kubernetes objects.
//!
//! The crate is layered; each layer only depends on the ones above it in this list:
//!
//! - [`lock`]: the lock engine, a library in its own right with no Kubernetes dependency:
//!   [`lock::Locker`] over a [`lock::Backend`] (memory, Redis, MongoDB).
//! - [`api`]: the `DistributedLock` and `LockClaim` custom resources (`turnstile.dev/v1alpha1`).
//! - [`controller`]: the reconcilers, thin I/O shells over a pure decision core.
//! - [`cli`]: the `turnstile` command line (`run`, `crds`, `wait`, `lock`).
//!
//! Beside the layers: [`leader`] (leader election on a Lease) and [`metrics`] (Prometheus
//! metrics, `/healthz`, `/readyz`), wired into `turnstile run`. The helper commands live in
//! [`wait`] (`turnstile wait`: block until a LockClaim is held) and [`run_locked`]
//! (`turnstile lock`: run a command under a backend lock), with [`oneshot`] for their exits.

pub mod api;
pub mod cli;
pub mod controller;
pub mod leader;
pub mod lock;
pub mod metrics;
pub mod oneshot;
pub mod run_locked;
pub mod wait;

/// The README's Rust examples, compiled (and, where they need no server, run) as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
