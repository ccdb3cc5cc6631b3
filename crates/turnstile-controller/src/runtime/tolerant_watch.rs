//! Watches that survive objects they cannot read.
//!
//! A typed watch fails as a whole when one stored object does not deserialize (a field of the
//! wrong type, possible wherever the stored object and the controller's types disagree: across
//! a CRD upgrade, an older schema), and while it re-lists nothing is granted anywhere. So the
//! locks and claims are watched untyped and decoded one by one: an object that does not decode
//! is skipped (the cache keeps its last good version, if any), logged, counted in
//! `turnstile_invalid_objects` and given a Warning Event naming the field; once fixed, its
//! next event decodes and it is picked up.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::{Stream, TryStreamExt};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::events::{Event, EventType};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use crate::leader::LeadershipGate;
use crate::metrics::Metrics;
use crate::writer::events::{EventPublisher, Repeats};
use turnstile_api::{
    object_event_reasons, ClusterDistributedLock, ClusterDistributedLockSpec, DistributedLock,
    DistributedLockSpec, LockClaim, LockClaimSpec,
};

/// A kind whose deletions must reach the cache even when the deleted object no longer decodes:
/// the placeholder carries only the metadata, which is all a cache needs to drop it.
pub trait Placeholder: Resource + Sized {
    /// An object with `metadata` and an empty spec.
    fn placeholder(metadata: ObjectMeta) -> Self;
}

impl Placeholder for LockClaim {
    fn placeholder(metadata: ObjectMeta) -> Self {
        let mut claim = LockClaim::new("", LockClaimSpec::for_lock(""));
        claim.metadata = metadata;
        claim
    }
}

impl Placeholder for DistributedLock {
    fn placeholder(metadata: ObjectMeta) -> Self {
        let mut lock = DistributedLock::new("", DistributedLockSpec::default());
        lock.metadata = metadata;
        lock
    }
}

impl Placeholder for ClusterDistributedLock {
    fn placeholder(metadata: ObjectMeta) -> Self {
        let spec = ClusterDistributedLockSpec {
            namespace_selector: LabelSelector::default(),
            lock: DistributedLockSpec::default(),
        };
        let mut lock = ClusterDistributedLock::new("", spec);
        lock.metadata = metadata;
        lock
    }
}

/// The objects that currently do not decode, shared by the watches of one controller term.
#[derive(Clone)]
pub struct InvalidObjects {
    entries: Arc<Mutex<BTreeMap<String, String>>>,
    metrics: Metrics,
    events: EventPublisher,
    leadership: LeadershipGate,
}

impl InvalidObjects {
    /// Reports into `metrics` and, while `leadership` is open, as Events through `events`.
    pub fn new(metrics: Metrics, events: EventPublisher, leadership: LeadershipGate) -> Self {
        Self {
            entries: Arc::default(),
            metrics,
            events,
            leadership,
        }
    }

    /// How many objects do not decode now.
    pub fn count(&self) -> usize {
        self.entries().len()
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, String>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn key(object: &DynamicObject) -> String {
        let kind = object.types.as_ref().map_or("", |t| t.kind.as_str());
        format!(
            "{kind}/{}/{}",
            object.namespace().unwrap_or_default(),
            object.name_any()
        )
    }

    fn forget(&self, object: &DynamicObject) {
        let mut entries = self.entries();
        if entries.remove(&Self::key(object)).is_some() {
            self.metrics.replica.set_invalid_objects(entries.len());
            tracing::info!(object = %Self::key(object), "object readable again");
        }
    }

    fn report(&self, object: &DynamicObject, problem: String) {
        let key = Self::key(object);
        tracing::warn!(object = %key, %problem, "skipping an object that does not match the schema");
        {
            let mut entries = self.entries();
            entries.insert(key, problem.clone());
            self.metrics.replica.set_invalid_objects(entries.len());
        }
        if !self.leadership.is_open() {
            return;
        }
        let regarding = ObjectReference {
            api_version: object.types.as_ref().map(|t| t.api_version.clone()),
            kind: object.types.as_ref().map(|t| t.kind.clone()),
            name: object.metadata.name.clone(),
            namespace: object.metadata.namespace.clone(),
            uid: object.metadata.uid.clone(),
            resource_version: object.metadata.resource_version.clone(),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: object_event_reasons::INVALID_OBJECT.to_owned(),
            note: Some(format!(
                "the controller cannot read this object and skips it until it is fixed: {problem}"
            )),
            action: "Decode".to_owned(),
            secondary: None,
        };
        let events = self.events.clone();
        tokio::spawn(async move {
            // Each watch event of a broken object reports it again.
            if let Err(error) = events.publish(&event, &regarding, Repeats::Often).await {
                tracing::debug!(%error, "cannot publish event");
            }
        });
    }

    /// The typed event for `event`, or `None` when its object does not decode.
    fn decode_event<K>(&self, event: watcher::Event<DynamicObject>) -> Option<watcher::Event<K>>
    where
        K: Placeholder + DeserializeOwned,
    {
        let checked = |object: DynamicObject| match decode::<K>(&object) {
            Ok(typed) => {
                self.forget(&object);
                Some(typed)
            }
            Err(problem) => {
                self.report(&object, problem);
                None
            }
        };
        Some(match event {
            watcher::Event::Apply(object) => watcher::Event::Apply(checked(object)?),
            watcher::Event::InitApply(object) => watcher::Event::InitApply(checked(object)?),
            watcher::Event::Delete(object) => {
                self.forget(&object);
                let typed = decode::<K>(&object)
                    .unwrap_or_else(|_| K::placeholder(object.metadata.clone()));
                watcher::Event::Delete(typed)
            }
            watcher::Event::Init => watcher::Event::Init,
            watcher::Event::InitDone => watcher::Event::InitDone,
        })
    }
}

/// Decodes one object, naming the field that does not fit (`spec.release: invalid type: …`).
pub fn decode<K: DeserializeOwned>(object: &DynamicObject) -> Result<K, String> {
    let value = serde_json::to_value(object).map_err(|error| error.to_string())?;
    // Every watch event of every object passes here: tracking the path costs on each field,
    // so it is done only for the rare object that does not decode.
    K::deserialize(&value).or_else(|_| {
        serde_path_to_error::deserialize(value)
            .map_err(|error| format!("{}: {}", error.path(), error.inner()))
    })
}

/// A watch of `K` in `namespace` (all namespaces when `None`) that skips what does not decode.
pub fn tolerant_watcher<K>(
    client: &Client,
    namespace: Option<&str>,
    config: watcher::Config,
    invalid: InvalidObjects,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static
where
    K: Placeholder + DeserializeOwned + Clone + Send + 'static,
    K: Resource<DynamicType = ()>,
{
    let resource = ApiResource::erase::<K>(&());
    let api: Api<DynamicObject> = match namespace {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    watcher(api, config)
        .try_filter_map(move |event| futures::future::ready(Ok(invalid.decode_event(event))))
}
