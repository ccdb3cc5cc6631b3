//! Code shared by the Redis Cluster and Redis Sentinel test binaries (`mod support;` in each).

// Each test binary compiles this module on its own and uses only part of it.
#![allow(dead_code)]

pub mod contended;
pub mod tls;
