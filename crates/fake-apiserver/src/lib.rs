//! A fake Kubernetes API server for Turnstile's tests.
//!
//! It serves plain HTTP on `127.0.0.1` and behaves like kube-apiserver where a controller
//! and `kubectl` depend on it: `resourceVersion` concurrency, status subresource isolation,
//! `generation` rules, finalizers, watches with resume, bookmarks and 410 after compaction,
//! selectors, discovery with categories and short names, CRDs registered by POSTing them,
//! schema validation/defaulting/pruning and CEL rules, Table output with printer columns,
//! garbage collection, and a minimal `/openapi/v3`. The crate's README lists every known
//! difference from kube-apiserver.
//!
//! ```no_run
//! # async fn demo() -> Result<(), fake_apiserver::Error> {
//! let server = fake_apiserver::FakeApiServer::start().await?;
//! let client = server.client();
//! server.write_kubeconfig("/tmp/kubeconfig")?;
//! server.compact(); // resuming any earlier watch now answers 410 Expired
//! # drop(client); Ok(()) }
//! ```

#![warn(missing_docs)]

mod admission;
mod cel;
mod discovery;
mod error;
mod events;
mod gc;
mod hooks;
mod http;
mod jsonpath;
mod meta;
mod openapi;
mod patch;
mod protobuf;
mod registry;
mod render;
mod rest;
mod schema;
mod selector;
mod server;
mod store;
mod structural;
mod table;
mod watch;

pub use error::{ApiError, Error};
pub use hooks::{rbac_summary, RecordedRequest};
pub use server::{Builder, FakeApiServer};
