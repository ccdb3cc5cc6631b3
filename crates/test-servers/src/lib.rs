//! Test support: starts real backend servers on free `127.0.0.1` ports, each in its own
//! temporary directory, and stops them by PID when dropped.
//!
//! Many test binaries may use it in parallel: every server gets its own port, and a start
//! that loses a port race (another process bound the port between our probe and the
//! server's bind) is retried on a fresh port.
//!
//! - [`RedisServer`]: a `redis-server` without persistence; [`RedisOptions`] adds TLS
//!   (certificates generated per run, [`TlsFiles`]) and a password.
//! - [`RedisCluster`]: 3 primaries + 3 replicas, created with `redis-cli --cluster create`;
//!   optionally all over TLS ([`RedisCluster::start_tls`]).
//! - [`RedisSentinel`]: a master, a replica and three sentinels (`redis-server --sentinel`);
//!   optionally all over TLS ([`RedisSentinel::start_tls`]).
//! - [`MongoServer`]: a MongoDB-wire-compatible server (SecantusDB), or `MONGODB_URI`'s.
//! - [`EtcdCluster`]: one etcd member or a cluster of three, optionally with TLS and
//!   user/password auth (the control plane's etcd binary).
//! - [`ControlPlane`]: a real Kubernetes control plane (etcd, kube-apiserver,
//!   kube-controller-manager, kube-scheduler, KWOK) built from its Go modules.
//! - [`tool_or_skip`]: a command-line tool from `PATH`, or a skip that fails under CI
//!   ([`under_ci`]); [`output_with_stdin`] runs one with its input piped in.
//!
//! New launchers (MongoDB-compatible servers, ...) go in their own module and reuse
//! [`free_port`], [`wait_until`] and [`ServerProcess`].

mod control_plane;
mod etcd;
mod mongo;
mod process;
mod redis;
mod redis_cluster;
mod redis_sentinel;
mod tls;
mod tools;

pub use self::control_plane::{
    binaries as control_plane_binaries, kubernetes_version, ControlPlane, ControlPlaneFiles,
    CONTROL_PLANE_DIR_PREFIX, KWOK_NODE, KWOK_NODE_ANNOTATION,
};
pub use self::etcd::{EtcdCluster, EtcdOptions};
pub use self::mongo::{MongoFlavor, MongoServer, Unavailable};
pub use self::process::{free_port, shared_instance, wait_until, ServerProcess};
pub use self::redis::{RedisOptions, RedisServer, TlsClientAuth, TlsFiles};
pub use self::redis_cluster::{ClusterNode, RedisCluster};
pub use self::redis_sentinel::{RedisSentinel, MASTER_NAME as SENTINEL_MASTER_NAME};
pub use self::tools::{
    env_path, output_with_stdin, record_skip, skip_log, skip_or_fail, tool_or_skip, under_ci,
};
