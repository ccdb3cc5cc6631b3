//! The contract suite of `contract/` against a real kube-apiserver: this process's control
//! plane (`test-servers`, built from the Kubernetes Go modules), or the cluster named by
//! `TURNSTILE_E2E_KUBECONFIG`. The same test modules as `contract/main.rs`, included here, so
//! every behaviour the fake is held to is also checked on the real server; the differences
//! found are fixed in the fake or listed in this crate's README. Tests of the fake's own hooks
//! run on the fake here too.

#[path = "contract/main.rs"]
mod contract;

/// This binary checks the real API server.
pub(crate) const ON_REAL_PLANE: bool = true;
