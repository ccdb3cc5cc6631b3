//! Checks that need no controller running: the workspace's own promises (crates, the ledger,
//! the docs' claims about the code), the generated CRDs, the `deploy/` manifests and image
//! files as the ecosystem's tools read them, and the quick-start script. One test binary, one
//! module per topic.
//!
//! `cargo test -p turnstile --test checks TOPIC::` runs one topic (`checks crds::`).

#[path = "../common/deploy.rs"]
mod deploy;
#[path = "../common/docs.rs"]
mod docs;
#[path = "../common/json.rs"]
mod json;
#[path = "../common/output.rs"]
mod output;
#[path = "../common/scratch.rs"]
mod scratch;

// What only the checks use.
mod files;
mod lines;

mod crds;
mod deploy_manifests;
mod image;
mod manifest_checks;
mod quickstart;
mod workspace;
