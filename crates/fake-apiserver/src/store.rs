//! Object storage, the global `resourceVersion`, the event history watches resume from,
//! and compaction.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;
use tokio::sync::{broadcast, Notify};

use crate::meta;
use crate::registry::Registry;

/// Where an object lives: storage group, plural resource, namespace (empty when
/// cluster-scoped) and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ObjectKey {
    pub group: String,
    pub resource: String,
    pub namespace: String,
    pub name: String,
}

/// The stored objects a list covers: those of `group/resource`, in one namespace or all,
/// whose `(namespace, name)` sorts after the cursor `after` when given.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ListScope<'a> {
    pub group: &'a str,
    pub resource: &'a str,
    pub namespace: Option<&'a str>,
    pub after: Option<(&'a str, &'a str)>,
}

impl ListScope<'_> {
    /// Whether the object at `key` is in this scope.
    fn contains(&self, key: &ObjectKey) -> bool {
        key.group == self.group
            && key.resource == self.resource
            && self.namespace.is_none_or(|ns| key.namespace == ns)
            && self
                .after
                .is_none_or(|after| (key.namespace.as_str(), key.name.as_str()) > after)
    }
}

/// The type of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    /// The wire name.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One committed change.
#[derive(Debug)]
pub(crate) struct StoredEvent {
    pub rv: u64,
    pub event_type: EventType,
    pub key: ObjectKey,
    /// The object after the change (for DELETED: its last state, with the deletion's RV).
    pub object: Arc<Value>,
    /// The object before the change, for selector transitions.
    pub previous: Option<Arc<Value>>,
    /// When it happened (for watches whose events a test makes late).
    pub at: tokio::time::Instant,
}

/// How many events are kept for watch resumption before the oldest are compacted away.
const HISTORY_LIMIT: usize = 50_000;

/// Capacity of the live event channel; a watcher that falls this far behind is closed.
const CHANNEL_CAPACITY: usize = 16_384;

/// The mutable state, behind one lock so every write is atomic with its event.
#[derive(Debug)]
pub(crate) struct Inner {
    objects: BTreeMap<ObjectKey, Arc<Value>>,
    rv: u64,
    history: VecDeque<Arc<StoredEvent>>,
    /// Watches may resume from a resourceVersion `>= compacted`.
    compacted: u64,
    /// The served types (changes when CRDs are written).
    pub registry: Registry,
    tx: broadcast::Sender<Arc<StoredEvent>>,
    /// Set by writes the garbage collector should look at.
    pub gc_wanted: bool,
    /// How many stored objects carry each uid (the garbage collector's liveness check).
    uids: HashMap<String, usize>,
    /// Owner uid → the objects naming it in `ownerReferences`.
    dependents: HashMap<String, BTreeSet<ObjectKey>>,
    /// Objects the garbage collector has to look at: written with owner references, or
    /// whose owner went away. (A sweep of every object on each delete made the fake's own
    /// garbage collection the cost of a busy test: O(objects) under the store's lock.)
    gc_candidates: BTreeSet<ObjectKey>,
}

/// The store shared by all request handlers.
#[derive(Debug)]
pub(crate) struct Store {
    inner: Mutex<Inner>,
    /// Wakes the garbage collector.
    pub gc_notify: Notify,
}

impl Store {
    /// An empty store serving the built-in types.
    pub(crate) fn new() -> Self {
        let (tx, _) = broadcast::channel(CHANNEL_CAPACITY);
        Self {
            inner: Mutex::new(Inner {
                objects: BTreeMap::new(),
                rv: 0,
                history: VecDeque::new(),
                compacted: 0,
                registry: Registry::builtins(),
                tx,
                gc_wanted: false,
                uids: HashMap::new(),
                dependents: HashMap::new(),
                gc_candidates: BTreeSet::new(),
            }),
            gc_notify: Notify::new(),
        }
    }

    /// Locks the state. A poisoned lock (a panic in another handler) is taken over:
    /// every write leaves the maps consistent before anything can panic.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `f` under the lock and wakes the garbage collector if it asked for it.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        let (result, wake) = {
            let mut inner = self.lock();
            let result = f(&mut inner);
            let wake = std::mem::take(&mut inner.gc_wanted);
            (result, wake)
        };
        if wake {
            self.gc_notify.notify_one();
        }
        result
    }
}

impl Inner {
    /// The latest committed resourceVersion.
    pub(crate) fn current_rv(&self) -> u64 {
        self.rv
    }

    /// The object at `key`.
    pub(crate) fn get(&self, key: &ObjectKey) -> Option<Arc<Value>> {
        self.objects.get(key).cloned()
    }

    /// The objects in `scope`, ordered by namespace and name.
    pub(crate) fn list(&self, scope: ListScope<'_>) -> Vec<Arc<Value>> {
        self.range_of(scope).map(|(_, v)| v.clone()).collect()
    }

    /// The stored objects in `scope`: a range of the key order, so each page of a
    /// paginated list costs the objects after its cursor, not a scan of every stored object
    /// (with tens of thousands of Events stored, that scan made a re-list of a few thousand
    /// claims in pages of 8 take seconds, holding the store's lock for every page).
    fn range_of<'a>(
        &'a self,
        scope: ListScope<'a>,
    ) -> impl Iterator<Item = (&'a ObjectKey, &'a Arc<Value>)> + 'a {
        let ListScope {
            group,
            resource,
            namespace,
            after,
        } = scope;
        let key = |namespace: &str, name: &str| ObjectKey {
            group: group.to_owned(),
            resource: resource.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        };
        let start = match (namespace, after) {
            // A cursor before the namespace starts the namespace (the empty name sorts first).
            (Some(namespace), Some((after_namespace, _))) if after_namespace < namespace => {
                Bound::Included(key(namespace, ""))
            }
            (_, Some((after_namespace, name))) => Bound::Excluded(key(after_namespace, name)),
            (namespace, None) => Bound::Included(key(namespace.unwrap_or_default(), "")),
        };
        self.objects
            .range((start, Bound::Unbounded))
            .take_while(move |(k, _)| {
                k.group == group
                    && k.resource == resource
                    && namespace.is_none_or(|namespace| k.namespace == namespace)
            })
    }

    /// The stored objects of `group/resource` with their keys, ordered by namespace and name
    /// (a range of the key order, not a scan of every object).
    pub(crate) fn of_type<'a>(
        &'a self,
        group: &'a str,
        resource: &'a str,
    ) -> impl Iterator<Item = (&'a ObjectKey, &'a Arc<Value>)> + 'a {
        self.range_of(ListScope {
            group,
            resource,
            namespace: None,
            after: None,
        })
    }

    /// Whether a stored object has this uid.
    pub(crate) fn is_live(&self, uid: &str) -> bool {
        self.uids.contains_key(uid)
    }

    /// The objects the garbage collector has to look at, forgotten here.
    pub(crate) fn take_gc_candidates(&mut self) -> BTreeSet<ObjectKey> {
        std::mem::take(&mut self.gc_candidates)
    }

    /// Keeps the uid and owner indexes up to date as `key` changes from `old` to `new`.
    fn reindex(&mut self, key: &ObjectKey, old: Option<&Value>, new: Option<&Value>) {
        if let Some(old) = old {
            let uid = meta::uid(old);
            if let Some(count) = self.uids.get_mut(uid) {
                *count -= 1;
                if *count == 0 {
                    self.uids.remove(uid);
                    // Its dependents may now hang on nothing.
                    if let Some(dependents) = self.dependents.get(uid) {
                        self.gc_candidates.extend(dependents.iter().cloned());
                        self.gc_wanted = true;
                    }
                }
            }
            for owner in meta::owner_uids(old) {
                if let Some(dependents) = self.dependents.get_mut(owner) {
                    dependents.remove(key);
                    if dependents.is_empty() {
                        self.dependents.remove(owner);
                    }
                }
            }
        }
        if let Some(new) = new {
            *self.uids.entry(meta::uid(new).to_owned()).or_default() += 1;
            for owner in meta::owner_uids(new) {
                self.dependents
                    .entry(owner.to_owned())
                    .or_default()
                    .insert(key.clone());
                self.gc_candidates.insert(key.clone());
                self.gc_wanted = true;
            }
        }
    }

    /// The objects in `scope` as they were at resourceVersion `rv` (the snapshot a paginated
    /// list serves every page from, as etcd does), or `Err(oldest)` when the history back to
    /// `rv` has been compacted.
    pub(crate) fn list_at(&self, scope: ListScope<'_>, rv: u64) -> Result<Vec<Arc<Value>>, u64> {
        if rv < self.compacted {
            return Err(self.compacted);
        }
        let mut objects: BTreeMap<&ObjectKey, Arc<Value>> =
            self.range_of(scope).map(|(k, v)| (k, v.clone())).collect();
        // Undo the changes made since `rv`, newest first.
        for event in self.history.iter().rev().take_while(|e| e.rv > rv) {
            if !scope.contains(&event.key) {
                continue;
            }
            match &event.previous {
                Some(previous) => objects.insert(&event.key, previous.clone()),
                None => objects.remove(&event.key),
            };
        }
        Ok(objects.into_values().collect())
    }

    /// Every stored object with its key.
    pub(crate) fn all(&self) -> impl Iterator<Item = (&ObjectKey, &Arc<Value>)> {
        self.objects.iter()
    }

    /// Stores `object` at a new resourceVersion and emits `event_type`.
    pub(crate) fn put(
        &mut self,
        key: ObjectKey,
        mut object: Value,
        event_type: EventType,
    ) -> Arc<Value> {
        self.rv += 1;
        meta::set_str(&mut object, "resourceVersion", &self.rv.to_string());
        let object = Arc::new(object);
        let previous = self.objects.insert(key.clone(), object.clone());
        self.reindex(&key, previous.as_deref(), Some(&object));
        self.emit(StoredEvent {
            rv: self.rv,
            event_type,
            key,
            object: object.clone(),
            previous,
            at: tokio::time::Instant::now(),
        });
        object
    }

    /// Removes the object at `key` and emits DELETED with `last_state` at a new resourceVersion.
    pub(crate) fn remove(&mut self, key: &ObjectKey, mut last_state: Value) -> Arc<Value> {
        self.rv += 1;
        meta::set_str(&mut last_state, "resourceVersion", &self.rv.to_string());
        let object = Arc::new(last_state);
        let previous = self.objects.remove(key);
        self.reindex(key, previous.as_deref(), None);
        // The last object of a Terminating namespace lets the namespace go.
        let namespace = ObjectKey {
            group: String::new(),
            resource: "namespaces".to_owned(),
            namespace: String::new(),
            name: key.namespace.clone(),
        };
        if self
            .objects
            .get(&namespace)
            .is_some_and(|ns| meta::is_deleting(ns))
        {
            self.gc_wanted = true;
        }
        self.emit(StoredEvent {
            rv: self.rv,
            event_type: EventType::Deleted,
            key: key.clone(),
            object: object.clone(),
            previous,
            at: tokio::time::Instant::now(),
        });
        object
    }

    fn emit(&mut self, event: StoredEvent) {
        let event = Arc::new(event);
        self.history.push_back(event.clone());
        while self.history.len() > HISTORY_LIMIT {
            if let Some(old) = self.history.pop_front() {
                self.compacted = old.rv;
            }
        }
        // No receivers is fine: nobody is watching.
        let _ = self.tx.send(event);
    }

    /// Forgets all history: resuming a watch from any older resourceVersion answers 410.
    pub(crate) fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.rv;
    }

    /// Events after `rv`, or `Err(oldest)` when `rv` has been compacted.
    pub(crate) fn events_since(&self, rv: u64) -> Result<Vec<Arc<StoredEvent>>, u64> {
        if rv < self.compacted {
            return Err(self.compacted);
        }
        // The history is in resourceVersion order: find the start, don't scan the whole of it.
        let start = self.history.partition_point(|e| e.rv <= rv);
        Ok(self.history.range(start..).cloned().collect())
    }

    /// A receiver of every event committed from now on.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Arc<StoredEvent>> {
        self.tx.subscribe()
    }
}
