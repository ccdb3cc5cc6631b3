//! The watches of one controller term: one per kind, each into one cache that every consumer
//! shares (kube-runtime's shared reflectors), so a lock's pass always reads a cache that
//! already holds the claim event that woke it. Claims feed the lock controller, the claim
//! controller and the gates; Jobs feed the Job gate and the owner trigger. Cached objects
//! are trimmed of what no decision reads (managedFields, the last-applied annotation).

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{self, ReflectHandle, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};

use crate::gate::pod::{phase_only, trim_gated_pod, GATED_PODS};
use crate::runtime::claim_index::ClaimIndex;
use crate::runtime::tolerant_watch::{tolerant_watcher, InvalidObjects};
use crate::wakes::owner_watch::FINISHED_PODS;
use turnstile_api::{
    ClusterDistributedLock, DistributedLock, LockClaim, LockTemplate, LOCK_ANNOTATION,
};

/// Events a shared cache buffers for its slowest consumer before the watch waits for it.
const SHARED_BUFFER: usize = 1024;

/// The caches the watches fill.
pub(super) struct Caches {
    pub claims: Store<LockClaim>,
    pub locks: Store<DistributedLock>,
    pub jobs: Store<Job>,
    /// Only the Pods marked for gating (a label selector): most Pods cost nothing.
    pub gated_pods: Store<Pod>,
    /// Finished Pods, trimmed to their phase: all the owner states read (`owners`).
    pub finished_pods: Store<Pod>,
    /// Namespaces, metadata only: one being deleted takes its locks and claims with it, and
    /// they get no status writes on the way out (`CacheHandles::namespace_terminating`).
    pub namespaces: Store<PartialObjectMeta<Namespace>>,
    pub templates: Store<LockTemplate>,
    pub cluster_locks: Store<ClusterDistributedLock>,
}

/// Each consumer's copy of the watches' events, by controller.
pub(super) struct Feeds {
    pub locks: LockFeeds,
    pub claims: ClaimFeeds,
    pub job_gate: GateFeeds<Job>,
    pub pod_gate: GateFeeds<Pod>,
    /// Only for a controller of all namespaces (see `cluster_locks`).
    pub cluster_locks: Option<ClusterLockFeeds>,
}

/// What wakes the `DistributedLock` controller: its own watch, its claims, and their owners
/// (finished Pods, Jobs).
pub(super) struct LockFeeds {
    pub locks: BoxStream<'static, watcher::Result<DistributedLock>>,
    pub claims: ReflectHandle<LockClaim>,
    pub finished_pods: ReflectHandle<Pod>,
    pub jobs: ReflectHandle<Job>,
}

/// What wakes the `LockClaim` controller: the claims; a LockTemplate's change (for the claims
/// of its namespace waiting for a missing lock); in a controller of all namespaces, a cluster
/// lock's or a namespace's change (for the claims a cluster lock does not take).
pub(super) struct ClaimFeeds {
    pub claims: ReflectHandle<LockClaim>,
    pub templates: BoxStream<'static, watcher::Result<LockTemplate>>,
    pub cluster: Option<(
        ReflectHandle<ClusterDistributedLock>,
        ReflectHandle<PartialObjectMeta<Namespace>>,
    )>,
}

/// What wakes a gate: its workloads and their claims.
pub(super) struct GateFeeds<W>
where
    W: kube::Resource + Clone + 'static,
    W::DynamicType: Eq + std::hash::Hash + Clone,
{
    pub workloads: ReflectHandle<W>,
    pub claims: ReflectHandle<LockClaim>,
}

/// What wakes the `ClusterDistributedLock` controller: its own watch, its claims, their
/// owners (Jobs, finished Pods) and the Namespaces, each a consumer of a shared watch.
pub(super) struct ClusterLockFeeds {
    pub locks: ReflectHandle<ClusterDistributedLock>,
    pub claims: ReflectHandle<LockClaim>,
    pub namespaces: ReflectHandle<PartialObjectMeta<Namespace>>,
    pub jobs: ReflectHandle<Job>,
    pub finished_pods: ReflectHandle<Pod>,
}

/// The watches of a term: their caches, their consumers' feeds, and the shared watches to poll
/// (each ends only with the term).
pub(super) struct Watches {
    pub caches: Caches,
    pub feeds: Feeds,
    pub shared: Vec<BoxFuture<'static, ()>>,
}

impl Watches {
    /// Sets up every watch of a controller of `namespace` (all when `None`); `claim_index`
    /// learns each claim and gated workload as it arrives. Nothing is requested until the
    /// feeds and `shared` are polled.
    pub(super) fn start(
        client: &Client,
        namespace: Option<&str>,
        invalid: &InvalidObjects,
        claim_index: &ClaimIndex,
    ) -> Watches {
        let (claims, claim_writer) = reflector::store_shared::<LockClaim>(SHARED_BUFFER);
        let (jobs, job_writer) = reflector::store_shared::<Job>(SHARED_BUFFER);
        let (gated_pods, gated_pod_writer) = reflector::store_shared::<Pod>(SHARED_BUFFER);
        let (finished_pods, finished_pod_writer) = reflector::store_shared::<Pod>(SHARED_BUFFER);
        let (namespaces, namespace_writer) =
            reflector::store_shared::<PartialObjectMeta<Namespace>>(SHARED_BUFFER);
        let (cluster_locks, cluster_lock_writer) =
            reflector::store_shared::<ClusterDistributedLock>(SHARED_BUFFER);
        let (templates, template_writer) = reflector::store::<LockTemplate>();
        let (locks, lock_writer) = reflector::store::<DistributedLock>();

        // `ClusterDistributedLock`s are served by a controller of all namespaces only.
        let serves_cluster_locks = namespace.is_none();
        let cluster_lock_feeds = serves_cluster_locks.then(|| ClusterLockFeeds {
            locks: subscribe(&cluster_lock_writer),
            claims: subscribe(&claim_writer),
            namespaces: subscribe(&namespace_writer),
            jobs: subscribe(&job_writer),
            finished_pods: subscribe(&finished_pod_writer),
        });
        let lock_events = tolerant_watcher::<DistributedLock>(
            client,
            namespace,
            watcher::Config::default(),
            invalid.clone(),
        )
        .default_backoff()
        .modify(trim)
        .reflect(lock_writer)
        .applied_objects()
        .boxed();
        let template_events = watcher(
            api::<LockTemplate>(client, namespace),
            watcher::Config::default(),
        )
        .default_backoff()
        .modify(trim)
        .reflect(template_writer)
        .applied_objects()
        .boxed();
        let feeds = Feeds {
            locks: LockFeeds {
                locks: lock_events,
                claims: subscribe(&claim_writer),
                finished_pods: subscribe(&finished_pod_writer),
                jobs: subscribe(&job_writer),
            },
            claims: ClaimFeeds {
                claims: subscribe(&claim_writer),
                templates: template_events,
                cluster: serves_cluster_locks.then(|| {
                    (
                        subscribe(&cluster_lock_writer),
                        subscribe(&namespace_writer),
                    )
                }),
            },
            job_gate: GateFeeds {
                workloads: subscribe(&job_writer),
                claims: subscribe(&claim_writer),
            },
            pod_gate: GateFeeds {
                workloads: subscribe(&gated_pod_writer),
                claims: subscribe(&claim_writer),
            },
            cluster_locks: cluster_lock_feeds,
        };

        let mut shared = vec![
            claim_watch(
                client,
                namespace,
                invalid,
                claim_index.clone(),
                claim_writer,
            ),
            job_watch(client, namespace, claim_index.clone(), job_writer),
            gated_pod_watch(client, namespace, claim_index.clone(), gated_pod_writer),
            finished_pod_watch(client, namespace, finished_pod_writer),
            namespace_watch(client, namespace, namespace_writer),
        ];
        if serves_cluster_locks {
            shared.push(cluster_lock_watch(client, invalid, cluster_lock_writer));
        }
        let caches = Caches {
            claims,
            locks,
            jobs,
            gated_pods,
            finished_pods,
            namespaces,
            templates,
            cluster_locks,
        };
        Watches {
            caches,
            feeds,
            shared,
        }
    }
}

/// Feeds a shared cache from `events` (trimmed by `trim`, each seen first by `observe`), as
/// a future that polls the watch until it ends.
fn shared_watch<K>(
    events: impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
    trim: fn(&mut K),
    mut observe: impl FnMut(&watcher::Event<K>) + Send + 'static,
    writer: Writer<K>,
    kind: &'static str,
) -> BoxFuture<'static, ()>
where
    K: kube::Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default + Send + Sync,
{
    let events = events
        .default_backoff()
        .modify(trim)
        .map_ok(move |event| {
            observe(&event);
            event
        })
        .reflect_shared(writer);
    drive(events, kind).boxed()
}

/// The claims: the index learns of a claim before the store does (see `claim_index`).
fn claim_watch(
    client: &Client,
    namespace: Option<&str>,
    invalid: &InvalidObjects,
    index: ClaimIndex,
    writer: Writer<LockClaim>,
) -> BoxFuture<'static, ()> {
    let config = watcher::Config::default();
    let events = tolerant_watcher::<LockClaim>(client, namespace, config, invalid.clone());
    shared_watch(
        events,
        trim,
        move |event| index.observe(event),
        writer,
        "claim",
    )
}

/// The Jobs (gated ones and claim owners). A gated workload's claim takes the workload's
/// arrival (see `arrivals`): the watch tells the index when each marked Job arrives.
fn job_watch(
    client: &Client,
    namespace: Option<&str>,
    index: ClaimIndex,
    writer: Writer<Job>,
) -> BoxFuture<'static, ()> {
    let events = watcher(api::<Job>(client, namespace), watcher::Config::default());
    let observe = move |event: &watcher::Event<Job>| {
        // Only Jobs marked for gating: the others never get a claim from the gate.
        let marked = |job: &Job| job.annotations().contains_key(LOCK_ANNOTATION);
        match event {
            watcher::Event::Apply(job) | watcher::Event::Delete(job) if !marked(job) => {}
            _ => index.observe_workload(event),
        }
    };
    shared_watch(events, trim, observe, writer, "job")
}

/// The Pods marked for gating; the index learns when each arrives, as for Jobs.
fn gated_pod_watch(
    client: &Client,
    namespace: Option<&str>,
    index: ClaimIndex,
    writer: Writer<Pod>,
) -> BoxFuture<'static, ()> {
    let config = watcher::Config::default().labels(GATED_PODS);
    let events = watcher(api::<Pod>(client, namespace), config);
    let observe = move |event: &watcher::Event<Pod>| index.observe_workload(event);
    shared_watch(events, trim_gated, observe, writer, "gated pod")
}

/// The finished Pods, for the owner states.
fn finished_pod_watch(
    client: &Client,
    namespace: Option<&str>,
    writer: Writer<Pod>,
) -> BoxFuture<'static, ()> {
    let config = watcher::Config::default().fields(FINISHED_PODS);
    let events = watcher(api::<Pod>(client, namespace), config);
    shared_watch(events, trim_pod, |_| {}, writer, "finished pod")
}

/// The Namespaces (only the controller's own, when it serves one).
fn namespace_watch(
    client: &Client,
    namespace: Option<&str>,
    writer: Writer<PartialObjectMeta<Namespace>>,
) -> BoxFuture<'static, ()> {
    let config = match namespace {
        Some(namespace) => watcher::Config::default().fields(&format!("metadata.name={namespace}")),
        None => watcher::Config::default(),
    };
    let events = watcher(Api::all(client.clone()), config);
    shared_watch(events, trim, |_| {}, writer, "namespace")
}

/// The ClusterDistributedLocks: one watch for their controller and the claims'.
fn cluster_lock_watch(
    client: &Client,
    invalid: &InvalidObjects,
    writer: Writer<ClusterDistributedLock>,
) -> BoxFuture<'static, ()> {
    let config = watcher::Config::default();
    let events = tolerant_watcher::<ClusterDistributedLock>(client, None, config, invalid.clone());
    shared_watch(events, trim, |_| {}, writer, "cluster lock")
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
fn subscribe<K>(writer: &Writer<K>) -> ReflectHandle<K>
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
    events: impl Stream<Item = watcher::Result<watcher::Event<K>>>,
    kind: &'static str,
) {
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        if let Err(error) = event {
            tracing::warn!(%error, kind, "watch error (retrying)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

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
