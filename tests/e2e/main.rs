//! The end-to-end suite, one test binary: the controller, the `turnstile` binary and the
//! manifests against real servers (a real control plane, `redis-server`, MongoDB, etcd), one
//! module per topic, all sharing [`support`]. One binary, so the support code and the product
//! are compiled and linked once, and one control plane serves every test that can share it.
//!
//! `cargo test -p turnstile --test e2e TOPIC::` runs one topic (`e2e multi_lock::`).

#[path = "../common/deploy.rs"]
mod deploy;
mod support;

// The operator benchmark's code (shared with its bench binary) finds these at the crate root.
use support::{actor, plane};

// The controller on the lock kinds and their semantics.
mod claim_lifecycle;
mod cluster_locks;
mod kubectl;
mod lock_semantics;
mod multi_lock;
mod templates;

// Workloads and their owners: Jobs, Pods, the scheduling gate.
mod examples;
mod owners;
mod pod_gate;

// Backends under the controller.
mod clusters;
mod etcd;
mod mongo;
mod redis;
mod redis_cluster;

// Faults, restarts, leaders and load.
mod chaos;
mod control_plane;
mod leader;
mod restart;
mod scale;
mod shutdown;
mod stress;

// Bad input and what the controller may do.
mod bad_input;
mod poison;
mod rbac;

// Observability.
mod metrics;
mod metrics_server;
mod monitoring;
mod traces;

// The command line.
mod cli_lock;
mod cli_lock_operator;
mod cli_lock_redis_modes;
mod cli_queue;
mod cli_run;
mod cli_wait;

// The documentation, the Helm chart and the operator benchmark, run.
mod docs;
mod helm_chart;
mod operator_bench;
