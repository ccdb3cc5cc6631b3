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

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt, TryStreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Config as ControllerRuntimeConfig, Controller};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;

use super::backend_outages;
use super::backends::{Backends, EtcdSettings, MongoSettings, RedisTlsFiles};
use super::caches::cache_filled;
use super::claim_index::ClaimIndex;
use super::claim_reconciler::{claim_error_policy, reconcile_claim};
use super::cluster_locks;
use super::context::Context;
use super::core::WorkloadKind;
use super::error::ControllerError;
use super::events::{EventPolicy, EventPublisher};
use super::gate::pod::{phase_only, trim_gated_pod, GATED_PODS};
use super::gate::{run_gate, BlockedSaid, GateContext};
use super::leader::LeadershipGate;
use super::lock_reconciler::{
    cluster_lock_error_policy, lock_error_policy, reconcile_cluster_lock, reconcile_lock,
};
use super::owner_watch::{cluster_owner_trigger, owner_trigger, FINISHED_PODS};
use super::owners::OwnerCaches;
use super::templates::claims_waiting_in;
use super::tolerant_watch::{tolerant_watcher, InvalidObjects};
use super::traces::ClaimTraces;
use crate::leader::{self, LeaderConfig};
use crate::metrics::{self, Metrics, Readiness};
use opentelemetry_sdk::trace::SdkTracerProvider;
use turnstile_api::{
    BackendKind, ClusterDistributedLock, DistributedLock, LockClaim, LockTemplate, LOCK_ANNOTATION,
};

/// Name the controller reports Events under.
pub const CONTROLLER_NAME: &str = "turnstile";

/// Passes of each controller that run at once. Each pass makes its API calls one after the
/// other (owner lookups: a few at once), so this bounds the requests in flight to the API
/// server; the kube client retries 429s and 503s after the server's `Retry-After`.
const MAX_CONCURRENT_PASSES: u16 = 16;

/// Events a shared cache buffers for its slowest consumer before the watch waits for it.
const SHARED_BUFFER: usize = 1024;

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

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    }
}

/// A consumer's copy of a shared cache's events.
fn subscribe<K>(writer: &reflector::store::Writer<K>) -> reflector::ReflectHandle<K>
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    // A writer made by `store_shared` always hands out subscriptions.
    writer
        .subscribe()
        .expect("store_shared writers accept subscribers")
}

/// Drops what no decision reads from a cached object: the server's field-ownership records and
/// kubectl's copy of the last applied object (together often larger than the object itself).
fn trim<K: kube::Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// [`trim`], and of a Pod only its phase is kept: all the owner state reads.
fn trim_pod(pod: &mut Pod) {
    trim(pod);
    pod.spec = None;
    pod.status = phase_only(pod.status.take());
}

/// [`trim`] and [`trim_gated_pod`]: a gated Pod as the gate's cache keeps it.
fn trim_gated(pod: &mut Pod) {
    trim(pod);
    trim_gated_pod(pod);
}

/// Polls a shared watch (which feeds its cache and subscribers) until it ends.
async fn drive<K>(
    events: impl futures::Stream<Item = watcher::Result<watcher::Event<K>>>,
    kind: &str,
) {
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        if let Err(error) = event {
            tracing::warn!(%error, kind, "watch error (retrying)");
        }
    }
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
            let mut is_leader = elector.subscribe();
            let mut stopping = stop.clone();
            loop {
                readiness.set_ready(true);
                tracing::info!(identity = %identity, "standing by for leadership");
                tokio::select! {
                    result = is_leader.wait_for(|leading| *leading) => {
                        if result.is_err() { break; }
                    }
                    _ = stopping.wait_for(|stop| *stop) => break,
                }
                metrics.replica.set_leader(true);
                tracing::info!(identity = %identity, "leading: starting the controllers");
                let mut lost = is_leader.clone();
                let mut stop_now = stop.clone();
                let term_over = async move {
                    tokio::select! {
                        _ = lost.wait_for(|leading| !*leading) => {}
                        _ = stop_now.wait_for(|stop| *stop) => {}
                    }
                };
                let (term_tx, term_rx) = watch::channel(false);
                let term_metrics = metrics.clone();
                let watcher_task = tokio::spawn(async move {
                    term_over.await;
                    // Reported at once: the gate already stops writes, the controllers
                    // take a moment to wind down.
                    term_metrics.replica.set_leader(false);
                    let _ = term_tx.send(true);
                });
                controllers(LeadershipGate::following(is_leader.clone()), &term_rx).await;
                watcher_task.abort();
                metrics.replica.set_leader(false);
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

/// Runs both controllers until `stop` completes.
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

    // One watch per kind, each into one cache that every consumer shares (kube-runtime's
    // shared reflectors): claims feed the lock controller, the orphan-claim controller and
    // the Job gate; Jobs feed the Job gate and the owner trigger. Cached objects are trimmed
    // of what no decision reads (managedFields, the last-applied annotation).
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
    let (claim_store, claim_writer) = reflector::store_shared::<LockClaim>(SHARED_BUFFER);
    let claims_for_locks = subscribe(&claim_writer);
    let claims_for_orphans = subscribe(&claim_writer);
    let claims_for_job_gate = subscribe(&claim_writer);
    let claims_for_pod_gate = subscribe(&claim_writer);
    let serves_cluster_locks = namespace.is_none();
    let claims_for_cluster_locks = serves_cluster_locks.then(|| subscribe(&claim_writer));
    let claim_index = ClaimIndex::new();
    let claim_watch = {
        let index = claim_index.clone();
        tolerant_watcher::<LockClaim>(
            client,
            namespace,
            watcher::Config::default(),
            invalid.clone(),
        )
        .default_backoff()
        .modify(trim)
        // The index learns of a claim before the store does (see `claim_index`).
        .map_ok(move |event| {
            index.observe(&event);
            event
        })
        .reflect_shared(claim_writer)
    };

    let (job_store, job_writer) = reflector::store_shared::<Job>(SHARED_BUFFER);
    let jobs_for_owners = subscribe(&job_writer);
    let jobs_for_gate = subscribe(&job_writer);
    let jobs_for_cluster_locks = serves_cluster_locks.then(|| subscribe(&job_writer));
    // Only the Pods marked for gating (a label selector): most Pods cost nothing.
    let (gated_pod_store, gated_pod_writer) = reflector::store_shared::<Pod>(SHARED_BUFFER);
    let gated_pods_for_gate = subscribe(&gated_pod_writer);
    // A gated workload's claim takes the workload's arrival (see `arrivals`): the watches
    // tell the index when each arrives, in their order.
    let gated_pod_watch = {
        let index = claim_index.clone();
        watcher(
            api::<Pod>(client, namespace),
            watcher::Config::default().labels(GATED_PODS),
        )
        .default_backoff()
        .modify(trim_gated)
        .map_ok(move |event| {
            index.observe_workload(&event);
            event
        })
        .reflect_shared(gated_pod_writer)
    };
    let job_watch = {
        let index = claim_index.clone();
        watcher(api::<Job>(client, namespace), watcher::Config::default())
            .default_backoff()
            .modify(trim)
            .map_ok(move |event| {
                // Only Jobs marked for gating: the others never get a claim from the gate.
                let marked = |job: &Job| job.annotations().contains_key(LOCK_ANNOTATION);
                match &event {
                    watcher::Event::Apply(job) | watcher::Event::Delete(job) if !marked(job) => {}
                    _ => index.observe_workload(&event),
                }
                event
            })
            .reflect_shared(job_writer)
    };

    // Namespaces, metadata only: one being deleted takes its locks and claims with it, and
    // they get no status writes on the way out (`Context::namespace_terminating`).
    let (namespace_store, namespace_writer) =
        reflector::store_shared::<PartialObjectMeta<Namespace>>(SHARED_BUFFER);
    // `ClusterDistributedLock`s are served by a controller of all namespaces only (see
    // `cluster_locks`): their passes and their claims' are woken by Namespace events too.
    let namespaces_for_cluster =
        serves_cluster_locks.then(|| (subscribe(&namespace_writer), subscribe(&namespace_writer)));
    let namespace_watch = watcher(
        Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
        match namespace {
            Some(namespace) => {
                watcher::Config::default().fields(&format!("metadata.name={namespace}"))
            }
            None => watcher::Config::default(),
        },
    )
    .default_backoff()
    .modify(trim)
    .reflect_shared(namespace_writer);

    // LockTemplates: a change wakes the claims of its namespace waiting for a missing lock.
    let (template_store, template_writer) = reflector::store::<LockTemplate>();
    let template_events = watcher(
        api::<LockTemplate>(client, namespace),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(trim)
    .reflect(template_writer)
    .applied_objects();

    // ClusterDistributedLocks: one watch for their controller and the claims' (which decide
    // about the claims a cluster lock does not take).
    let (cluster_lock_store, cluster_lock_writer) =
        reflector::store_shared::<ClusterDistributedLock>(SHARED_BUFFER);
    let cluster_locks_for_claims = serves_cluster_locks.then(|| subscribe(&cluster_lock_writer));
    let cluster_locks_for_locks = serves_cluster_locks.then(|| subscribe(&cluster_lock_writer));
    let cluster_lock_watch = serves_cluster_locks.then(|| {
        tolerant_watcher::<ClusterDistributedLock>(
            client,
            None,
            watcher::Config::default(),
            invalid.clone(),
        )
        .default_backoff()
        .modify(trim)
        .reflect_shared(cluster_lock_writer)
    });

    let (lock_store, lock_writer) = reflector::store::<DistributedLock>();
    let lock_events =
        tolerant_watcher::<DistributedLock>(client, namespace, watcher::Config::default(), invalid)
            .default_backoff()
            .modify(trim)
            .reflect(lock_writer)
            .applied_objects();

    // No debounce: a lone event is handled at once. A burst still costs at most two passes,
    // as kube-runtime runs one pass of a lock at a time and folds every trigger that arrives
    // meanwhile into one more; and a pass woken by the first echo of its predecessor's writes
    // waits until the cache shows all of them (`own_writes`).
    let runtime_config = ControllerRuntimeConfig::default().concurrency(MAX_CONCURRENT_PASSES);
    // Finished Pods are cached for the owner states (`owners`), trimmed to their phase.
    let (finished_pod_store, finished_pod_writer) = reflector::store_shared::<Pod>(SHARED_BUFFER);
    let finished_pods_for_locks = subscribe(&finished_pod_writer);
    let finished_pods_for_cluster_locks =
        serves_cluster_locks.then(|| subscribe(&finished_pod_writer));
    let finished_pod_watch = watcher(
        api::<Pod>(client, namespace),
        watcher::Config::default().fields(FINISHED_PODS),
    )
    .default_backoff()
    .modify(trim_pod)
    .reflect_shared(finished_pod_writer);
    let lock_controller = Controller::for_stream(lock_events, lock_store.clone())
        // A claim on several locks wakes each of them.
        .watches_shared_stream(claims_for_locks, |claim: Arc<LockClaim>| {
            let namespace = claim.namespace().unwrap_or_default();
            claim
                .spec
                .locks()
                .into_iter()
                .map(|lock| ObjectRef::<DistributedLock>::new(lock).within(&namespace))
                .collect::<Vec<_>>()
        })
        // A claim owner's finish or deletion wakes its locks at once (see `owner_watch`).
        .watches_shared_stream(
            finished_pods_for_locks,
            owner_trigger::<Pod>(claim_store.clone(), claim_index.clone(), WorkloadKind::Pod),
        )
        .watches_shared_stream(
            jobs_for_owners,
            owner_trigger::<Job>(claim_store.clone(), claim_index.clone(), WorkloadKind::Job),
        )
        .with_config(runtime_config.clone())
        .graceful_shutdown_on(raised(&stop_rx));

    let ctx = Context::new(
        client.clone(),
        lock_store.clone(),
        claim_store.clone(),
        claim_index,
        Backends::with_redis_tls(
            config.default_backend,
            config.redis_url.clone(),
            Ok(config.redis_tls.clone()),
        )
        .with_mongo(config.mongo.clone())
        .with_etcd(config.etcd.clone()),
        events,
        metrics.clone(),
    )
    .with_leadership(leadership)
    .with_owner_caches(OwnerCaches {
        jobs: job_store.clone(),
        finished_pods: finished_pod_store,
    })
    .with_namespaces(namespace_store)
    .with_templates(template_store)
    .with_traces(config.tracer_provider.as_ref().map(ClaimTraces::new));
    let ctx = Arc::new(if serves_cluster_locks {
        ctx.with_cluster_locks(cluster_lock_store.clone())
    } else {
        ctx
    });
    let gate_ctx = Arc::new(GateContext {
        client: client.clone(),
        claims: claim_store.clone(),
        leadership: ctx.leadership.clone(),
        events: ctx.events.clone(),
        metrics: ctx.metrics.clone(),
        blocked_said: BlockedSaid::default(),
        claim_index: ctx.claim_index.clone(),
        namespaces: ctx.namespaces.clone(),
    });
    let job_gate_done = run_gate(
        job_store,
        jobs_for_gate,
        gate_ctx.clone(),
        claims_for_job_gate,
        raised(&stop_rx),
    );
    let pod_gate_done = run_gate(
        gated_pod_store,
        gated_pods_for_gate,
        gate_ctx,
        claims_for_pod_gate,
        raised(&stop_rx),
    );
    let claim_controller = Controller::for_shared_stream(claims_for_orphans, claim_store.clone())
        .watches_stream(template_events, {
            let (claims, locks) = (claim_store.clone(), ctx.locks.clone());
            move |template: LockTemplate| claims_waiting_in(&template, &claims, &locks)
        });
    // A cluster lock's claims are decided again when it or a namespace's labels change.
    let claim_controller = match (cluster_locks_for_claims, &namespaces_for_cluster) {
        (Some(cluster_locks), Some((_, namespaces))) => claim_controller
            .watches_shared_stream(
                cluster_locks,
                cluster_locks::claims_of_lock(claim_store.clone(), ctx.claim_index.clone()),
            )
            .watches_shared_stream(
                namespaces.clone(),
                cluster_locks::claims_in_namespace(claim_store.clone()),
            ),
        _ => claim_controller,
    }
    .with_config(runtime_config.clone())
    .graceful_shutdown_on(raised(&stop_rx));
    let cluster_locks_done = match (
        cluster_locks_for_locks,
        claims_for_cluster_locks,
        namespaces_for_cluster,
        jobs_for_cluster_locks,
        finished_pods_for_cluster_locks,
    ) {
        (Some(locks), Some(claims), Some((namespaces, _)), Some(jobs), Some(finished_pods)) => {
            let feeds = ClusterLockFeeds {
                store: cluster_lock_store,
                locks,
                claims,
                namespaces,
                jobs,
                finished_pods,
            };
            run_cluster_lock_controller(feeds, ctx.clone(), runtime_config, raised(&stop_rx))
                .boxed()
        }
        _ => futures::future::ready(()).boxed(),
    };

    readiness.set_ready(false);
    let synced = {
        let readiness = readiness.clone();
        async move {
            cache_filled(&lock_store).await;
            cache_filled(&claim_store).await;
            readiness.set_ready(true);
            tracing::info!("caches synced; reconciling");
        }
    };
    let synced = tokio::spawn(synced);

    tracing::info!(
        namespace = namespace.unwrap_or("(all)"),
        default_backend = %config.default_backend,
        redis = config.redis_url.is_some(),
        mongo = config.mongo.is_some(),
        "controller starting"
    );
    // Wake-ups no watch brings: a backend answers again (`backend_outages`), another lock of
    // a multi-lock claim admits it (`multi_lock`).
    let lock_controller = match ctx.wakes.take_stream() {
        Some(wakes) => lock_controller.reconcile_on(wakes),
        None => lock_controller,
    };
    let probe_ctx = ctx.clone();
    let probe_stop = raised(&stop_rx);
    let probe_done = async move {
        backend_outages::probe(&probe_ctx.outages, &probe_ctx.backends, probe_stop).await;
    };
    let locks_done = lock_controller
        .run(reconcile_lock, lock_error_policy, ctx.clone())
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "lock controller");
            }
        });
    let claims_done = claim_controller
        .run(reconcile_claim, claim_error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "claim controller");
            }
        });
    let controllers = futures::future::join(
        futures::future::join5(
            locks_done,
            claims_done,
            job_gate_done,
            pod_gate_done,
            probe_done,
        ),
        cluster_locks_done,
    );
    let grace_over = {
        let stopped = raised(&stop_rx);
        async move {
            stopped.await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        }
    };
    tokio::select! {
        _ = controllers => {}
        () = drive(claim_watch, "claim") => {}
        () = drive(job_watch, "job") => {}
        () = drive(gated_pod_watch, "gated pod") => {}
        () = drive(namespace_watch, "namespace") => {}
        () = drive(finished_pod_watch, "finished pod") => {}
        () = async {
            match cluster_lock_watch {
                Some(watch) => drive(watch, "cluster lock").await,
                None => futures::future::pending().await,
            }
        } => {}
        () = grace_over => {
            tracing::warn!(grace_s = SHUTDOWN_GRACE.as_secs(), "passes still in flight after the shutdown grace: abandoned");
        }
    }
    synced.abort();
    relay.abort();
}

/// What wakes the `ClusterDistributedLock` controller: its own watch, its claims, their
/// owners (Jobs, finished Pods) and the Namespaces, each a consumer of a shared watch.
struct ClusterLockFeeds {
    store: reflector::Store<ClusterDistributedLock>,
    locks: reflector::ReflectHandle<ClusterDistributedLock>,
    claims: reflector::ReflectHandle<LockClaim>,
    namespaces: reflector::ReflectHandle<PartialObjectMeta<Namespace>>,
    jobs: reflector::ReflectHandle<Job>,
    finished_pods: reflector::ReflectHandle<Pod>,
}

/// Runs the `ClusterDistributedLock` controller (see `cluster_locks`) until `stop`.
async fn run_cluster_lock_controller(
    feeds: ClusterLockFeeds,
    ctx: Arc<Context>,
    config: ControllerRuntimeConfig,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let (claims, index) = (ctx.claims.clone(), ctx.claim_index.clone());
    Controller::for_shared_stream(feeds.locks, feeds.store.clone())
        .watches_shared_stream(feeds.claims, cluster_locks::lock_of_claim)
        .watches_shared_stream(feeds.namespaces, cluster_locks::every_lock(feeds.store))
        .watches_shared_stream(
            feeds.jobs,
            cluster_owner_trigger::<Job>(claims.clone(), index.clone(), WorkloadKind::Job),
        )
        .watches_shared_stream(
            feeds.finished_pods,
            cluster_owner_trigger::<Pod>(claims, index, WorkloadKind::Pod),
        )
        .with_config(config)
        .graceful_shutdown_on(stop)
        .run(reconcile_cluster_lock, cluster_lock_error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "cluster lock controller");
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

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

    fn pod_as_stored() -> Pod {
        let mut pod = Pod::default();
        pod.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        pod.metadata.annotations = Some(
            [
                ("kubectl.kubernetes.io/last-applied-configuration", "{}"),
                ("team", "a"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        );
        pod.spec = Some(PodSpec::default());
        pod.status = Some(PodStatus {
            phase: Some("Running".to_owned()),
            message: Some("long".to_owned()),
            ..PodStatus::default()
        });
        pod
    }

    #[test]
    fn cached_pods_drop_field_ownership_the_last_applied_copy_and_unread_status() {
        for trimmed in [trim_pod as fn(&mut Pod), trim_gated] {
            let mut pod = pod_as_stored();
            trimmed(&mut pod);
            assert_eq!(pod.metadata.managed_fields, None);
            let annotations = pod.metadata.annotations.clone().unwrap_or_default();
            assert_eq!(annotations.keys().collect::<Vec<_>>(), ["team"]);
            let status = pod.status.clone().expect("status");
            assert_eq!(status.phase.as_deref(), Some("Running"));
            assert_eq!(status.message, None);
        }
    }
}
