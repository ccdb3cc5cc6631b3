//! Wiring: the watches, the caches and the two controllers, leader election and the metrics
//! endpoint, until shutdown.
//!
//! One watch on `LockClaim`s feeds one cache and the controllers (through a fan-out), so a
//! lock's reconciler always reads a cache that already holds the claim event that woke it:
//!
//! - the `DistributedLock` controller reconciles each lock with all of its claims (claim
//!   events map to their lock by `spec.lockName`), so the FIFO decision sees the whole queue;
//!   finished Pods and all Jobs wake the locks of the claims they own (`owner_watch`);
//! - the `LockClaim` controller only looks after claims whose lock does not exist;
//! - the gates (`gate`) claim locks for suspended, annotated Jobs and for Pods with the lock
//!   label and scheduling gate, and let them go once the claim is held.
//!
//! With leader election, only the leader runs the controllers; a replica that loses the
//! lead stops them at once and stands by again (a new term starts with fresh caches and a
//! fresh memory backend, rebuilt from the claims' statuses).
//!
//! A term: `watches` sets up the watches and their caches, `controllers` builds the
//! controllers on them, and `run_controllers` runs both until the term ends. What the
//! reconcilers share is [`context`] (one handle per concern), what they read comes from the
//! caches ([`caches`], [`tolerant_watch`], the claims by lock and owner in [`claim_index`],
//! their arrival order in [`arrivals`]), and the lock backends are [`backends`].

pub mod arrivals;
pub mod backends;
pub mod caches;
pub mod claim_index;
pub mod context;
mod controllers;
pub mod tolerant_watch;
mod watches;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::events::Reporter;
use kube::Client;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tokio::sync::watch;

use self::watches::{Caches, Watches};
use crate::error::ControllerError;
use crate::leader::{self, LeaderConfig, LeadershipGate};
use crate::metrics::{self, Metrics, Readiness};
use crate::pass::owners::OwnerCaches;
use crate::runtime::backends::{Backends, EtcdSettings, MongoSettings, RedisTlsFiles};
use crate::runtime::caches::cache_filled;
use crate::runtime::claim_index::ClaimIndex;
use crate::runtime::context::Context;
use crate::runtime::tolerant_watch::InvalidObjects;
use crate::traces::ClaimTraces;
use crate::writer::events::{EventPolicy, EventPublisher};
use turnstile_api::BackendKind;

/// Name the controller reports Events under.
pub const CONTROLLER_NAME: &str = "turnstile";

/// How long the passes in flight get to finish once the controllers are told to stop. A pass
/// can be stuck for minutes in the client's retries of an API server answering 503; past
/// this it is abandoned, which is safe (the next term finds the grants in the backend, as
/// after a pass whose writes failed) and keeps a SIGTERM within the Deployment's 30 s.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// How `turnstile run` is configured.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Watch only this namespace (all namespaces when `None`).
    pub namespace: Option<String>,
    /// The backend of locks that do not name one.
    pub default_backend: BackendKind,
    /// Redis connection URL; locks with `backend: redis` are served only when given.
    pub redis_url: Option<String>,
    /// CA file and client certificate for `rediss://` (`--redis-ca-file`, ...).
    pub redis_tls: RedisTlsFiles,
    /// MongoDB connection settings; locks with `backend: mongo` are served only when given.
    pub mongo: Option<MongoSettings>,
    /// etcd connection settings; locks with `backend: etcd` are served only when given.
    pub etcd: Option<EtcdSettings>,
    /// This cluster's name in the owner tokens of its grants (`--cluster-name`): set it when
    /// controllers of several clusters share a backend, so that each shows whose grant
    /// holds a lock. A DNS label.
    pub cluster_name: Option<String>,
    /// Where to serve `/metrics`, `/healthz` and `/readyz`.
    pub metrics_addr: Option<SocketAddr>,
    /// This replica's name in Events (the Pod name).
    pub instance: Option<String>,
    /// Take part in leader election on this Lease; reconcile only while leading.
    pub leader_election: Option<LeaderConfig>,
    /// Which `Normal` Events to publish, and how many a second.
    pub events: EventPolicy,
    /// Where the claims' spans go (`--otlp-endpoint`); `None`: not traced. The caller shuts it
    /// down (flushing what is left) after [`run`].
    pub tracer_provider: Option<SdkTracerProvider>,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            namespace: None,
            default_backend: BackendKind::Memory,
            redis_url: None,
            redis_tls: RedisTlsFiles::default(),
            mongo: None,
            etcd: None,
            cluster_name: None,
            metrics_addr: None,
            instance: None,
            leader_election: None,
            events: EventPolicy::default(),
            tracer_provider: None,
        }
    }
}

impl ControllerConfig {
    fn validate(&self) -> Result<(), ControllerError> {
        if let Some(name) = &self.cluster_name {
            if !is_dns_label(name) {
                return Err(ControllerError::Config(format!(
                    "--cluster-name {name:?}: expected a DNS label (at most 63 lowercase \
                     letters, digits and '-', starting and ending with a letter or digit)"
                )));
            }
        }
        match self.default_backend {
            BackendKind::Memory => Ok(()),
            BackendKind::Redis if self.redis_url.is_some() => Ok(()),
            BackendKind::Redis => Err(ControllerError::Config(
                "--default-backend redis needs --redis-url".to_owned(),
            )),
            BackendKind::Mongo if self.mongo.is_some() => Ok(()),
            BackendKind::Mongo => Err(ControllerError::Config(
                "--default-backend mongo needs --mongo-url".to_owned(),
            )),
            BackendKind::Etcd if self.etcd.is_some() => Ok(()),
            BackendKind::Etcd => Err(ControllerError::Config(
                "--default-backend etcd needs --etcd-url".to_owned(),
            )),
        }
    }
}

/// Whether `name` is a DNS-1123 label, as a cluster's name must be.
fn is_dns_label(name: &str) -> bool {
    let alphanumeric = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    (1..=63).contains(&name.len())
        && name.chars().all(|c| alphanumeric(c) || c == '-')
        && name.starts_with(alphanumeric)
        && name.ends_with(alphanumeric)
}

/// A future completing once `flag` is true.
fn raised(flag: &watch::Receiver<bool>) -> impl Future<Output = ()> + Send + Sync + 'static {
    let mut flag = flag.clone();
    async move {
        let _ = flag.wait_for(|raised| *raised).await;
    }
}

/// Runs the controller until `shutdown` completes, then finishes the passes in flight.
pub async fn run(
    client: Client,
    config: ControllerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ControllerError> {
    config.validate()?;
    let metrics = Metrics::new();
    let readiness = Readiness::new();
    let (stop_tx, stop) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });

    let server = match config.metrics_addr {
        Some(addr) => {
            let listener = metrics::bind(addr).await?;
            let serving =
                metrics::serve(listener, metrics.clone(), readiness.clone(), raised(&stop));
            Some(tokio::spawn(async move {
                if let Err(error) = serving.await {
                    tracing::error!(%error, "metrics server stopped");
                }
            }))
        }
        None => None,
    };

    // Runs the controllers, writing while `leadership` is open, until `stop` is raised.
    // Boxed: the controllers' future is deep (a pass per lock inside each stream).
    let controllers = |leadership: LeadershipGate, stop: &watch::Receiver<bool>| {
        let stop = raised(stop);
        Box::pin(run_controllers(
            &client, &config, &metrics, &readiness, leadership, stop,
        ))
    };
    match config.leader_election.clone() {
        None => controllers(LeadershipGate::always_open(), &stop).await,
        Some(leader_config) => {
            // The Lease is released only after the controllers have stopped.
            let (released_tx, released) = watch::channel(false);
            let identity = leader_config.identity.clone();
            let elector = leader::run(client.clone(), leader_config, raised(&released))
                .map_err(|error| ControllerError::Config(error.to_string()))?;
            let is_leader = elector.subscribe();
            while stand_by(&identity, &readiness, is_leader.clone(), &stop).await {
                let term = Term::begin(&metrics, is_leader.clone(), &stop);
                tracing::info!(identity = %identity, "leading: starting the controllers");
                controllers(LeadershipGate::following(is_leader.clone()), &term.over).await;
                term.end(&metrics);
                if *stop.borrow() {
                    break;
                }
                tracing::warn!(identity = %identity, "lost leadership: controllers stopped");
            }
            let _ = released_tx.send(true);
            elector.stopped().await;
        }
    }
    if let Some(server) = server {
        let _ = server.await;
    }
    tracing::info!("controller stopped");
    Ok(())
}

/// Waits, ready, until this replica leads (true) or the controller stops or the election
/// ends (false).
async fn stand_by(
    identity: &str,
    readiness: &Readiness,
    mut is_leader: watch::Receiver<bool>,
    stop: &watch::Receiver<bool>,
) -> bool {
    readiness.set_ready(true);
    tracing::info!(identity = %identity, "standing by for leadership");
    let mut stopping = stop.clone();
    tokio::select! {
        result = is_leader.wait_for(|leading| *leading) => result.is_ok(),
        _ = stopping.wait_for(|stop| *stop) => false,
    }
}

/// A term of leadership: `over` is raised once the lead is lost or the controller stops.
struct Term {
    over: watch::Receiver<bool>,
    watcher: tokio::task::JoinHandle<()>,
}

impl Term {
    fn begin(
        metrics: &Metrics,
        is_leader: watch::Receiver<bool>,
        stop: &watch::Receiver<bool>,
    ) -> Term {
        metrics.replica.set_leader(true);
        let (mut lost, mut stop_now) = (is_leader, stop.clone());
        let (over_tx, over) = watch::channel(false);
        let metrics = metrics.clone();
        let watcher = tokio::spawn(async move {
            tokio::select! {
                _ = lost.wait_for(|leading| !*leading) => {}
                _ = stop_now.wait_for(|stop| *stop) => {}
            }
            // Reported at once: the gate already stops writes, the controllers take a
            // moment to wind down.
            metrics.replica.set_leader(false);
            let _ = over_tx.send(true);
        });
        Term { over, watcher }
    }

    /// After the term's controllers have stopped.
    fn end(self, metrics: &Metrics) {
        self.watcher.abort();
        metrics.replica.set_leader(false);
    }
}

/// Runs the controllers of one term until `stop` completes, then gives the passes in flight
/// [`SHUTDOWN_GRACE`] to finish.
async fn run_controllers(
    client: &Client,
    config: &ControllerConfig,
    metrics: &Metrics,
    readiness: &Readiness,
    leadership: LeadershipGate,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let (stop_tx, stop_rx) = watch::channel(false);
    let relay = tokio::spawn(async move {
        stop.await;
        let _ = stop_tx.send(true);
    });
    let namespace = config.namespace.as_deref();
    let events = EventPublisher::new(
        client.clone(),
        Reporter {
            controller: CONTROLLER_NAME.to_owned(),
            instance: config.instance.clone(),
        },
    )
    .with_policy(config.events, metrics.replica.events_skipped());
    // One bad object must not stop the watch of all the others (see `tolerant_watch`).
    let invalid = InvalidObjects::new(metrics.clone(), events.clone(), leadership.clone());
    let claim_index = ClaimIndex::new();
    let Watches {
        caches,
        feeds,
        shared,
    } = Watches::start(client, namespace, &invalid, &claim_index);
    let ctx = Arc::new(context(
        client,
        config,
        metrics,
        &caches,
        claim_index,
        events,
        leadership,
    ));
    let gate_ctx = controllers::gate_context(&ctx);
    let controllers = controllers::run_all(feeds, &caches, &ctx, gate_ctx, || raised(&stop_rx));

    readiness.set_ready(false);
    let synced = tokio::spawn({
        let (readiness, locks, claims) = (readiness.clone(), caches.locks, caches.claims);
        async move {
            cache_filled(&locks).await;
            cache_filled(&claims).await;
            readiness.set_ready(true);
            tracing::info!("caches synced; reconciling");
        }
    });
    tracing::info!(
        namespace = namespace.unwrap_or("(all)"),
        default_backend = %config.default_backend,
        redis = config.redis_url.is_some(),
        mongo = config.mongo.is_some(),
        "controller starting"
    );
    let grace_over = {
        let stopped = raised(&stop_rx);
        async move {
            stopped.await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        }
    };
    // A shared watch ends only with the term; polling them all feeds every cache.
    tokio::select! {
        () = controllers => {}
        _ = futures::future::select_all(shared) => {}
        () = grace_over => {
            tracing::warn!(grace_s = SHUTDOWN_GRACE.as_secs(), "passes still in flight after the shutdown grace: abandoned");
        }
    }
    synced.abort();
    relay.abort();
}

/// The lock and claim controllers' context: the API client, the term's caches, the backends
/// `config` names, the Event publisher and the leadership gate every write passes.
fn context(
    client: &Client,
    config: &ControllerConfig,
    metrics: &Metrics,
    caches: &Caches,
    claim_index: ClaimIndex,
    events: EventPublisher,
    leadership: LeadershipGate,
) -> Context {
    let backends = Backends::with_redis_tls(
        config.default_backend,
        config.redis_url.clone(),
        Ok(config.redis_tls.clone()),
    )
    .with_mongo(config.mongo.clone())
    .with_etcd(config.etcd.clone())
    .with_cluster_name(config.cluster_name.clone());
    let ctx = Context::new(
        client.clone(),
        caches.locks.clone(),
        caches.claims.clone(),
        claim_index,
        backends,
        events,
        metrics.clone(),
    )
    .with_leadership(leadership)
    .with_owner_caches(OwnerCaches {
        jobs: caches.jobs.clone(),
        finished_pods: caches.finished_pods.clone(),
    })
    .with_namespaces(caches.namespaces.clone())
    .with_templates(caches.templates.clone())
    .with_traces(config.tracer_provider.as_ref().map(ClaimTraces::new));
    // `ClusterDistributedLock`s are served by a controller of all namespaces only.
    if config.namespace.is_none() {
        ctx.with_cluster_locks(caches.cluster_locks.clone())
    } else {
        ctx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_backend_is_memory_and_another_needs_its_url() {
        let config = ControllerConfig::default();
        assert_eq!(config.default_backend, BackendKind::Memory);
        assert!(config.validate().is_ok());
        for (kind, flag) in [
            (BackendKind::Redis, "--redis-url"),
            (BackendKind::Mongo, "--mongo-url"),
            (BackendKind::Etcd, "--etcd-url"),
        ] {
            let missing = ControllerConfig {
                default_backend: kind,
                ..ControllerConfig::default()
            };
            let error = missing.validate().expect_err("refused without its URL");
            assert!(error.to_string().contains(flag), "{kind:?}: {error}");
        }
        let redis = ControllerConfig {
            default_backend: BackendKind::Redis,
            redis_url: Some("redis://127.0.0.1:6379".to_owned()),
            ..ControllerConfig::default()
        };
        assert!(redis.validate().is_ok());
    }

    #[test]
    fn a_cluster_name_is_a_dns_label() {
        let named = |name: &str| ControllerConfig {
            cluster_name: Some(name.to_owned()),
            ..ControllerConfig::default()
        };
        for good in ["east", "eu-west-1", "a", &"x".repeat(63)] {
            assert!(named(good).validate().is_ok(), "{good}");
        }
        for bad in [
            "",
            "East",
            "-east",
            "east-",
            "us/east",
            "a b",
            &"x".repeat(64),
        ] {
            let error = named(bad).validate().expect_err(bad);
            assert!(error.to_string().contains("--cluster-name"), "{error}");
        }
    }
}
