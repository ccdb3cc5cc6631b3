//! Delivery of release wake-ups to this process's waiters: a change stream when the
//! deployment has one (replica sets, sharded clusters), polling of the `wake` field otherwise.
//!
//! A release that admits waiters writes `wake: "<seq> <owner>…"` into the lock document. The
//! change stream is filtered on the server to exactly those writes and projected down to the
//! key and the `wake` value; each event is routed to the [`WakeRegistry`] under topic = key,
//! so only the named owners' tasks wake. On a stream failure the listener reopens it and
//! wakes every local waiter once, since events may have been missed meanwhile.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use mongodb::bson::{doc, Bson, Document};
use mongodb::change_stream::ChangeStream;
use mongodb::Collection;
use tokio::sync::oneshot;

use super::pipelines::{field, woken_owners};
use crate::lock::backend::{WakeRegistry, WakeSubscription};

/// How a [`MongoBackend`](super::MongoBackend) learns about releases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MongoWakeSource {
    /// A change stream on the locks collection (replica sets and sharded clusters).
    ChangeStream,
    /// Periodic reads of the `wake` field of keys with local waiters (standalone servers).
    Polling,
}

/// The change stream's server-side filter: only writes that name admitted waiters, and only
/// the fields needed to route them.
fn change_stream_pipeline() -> Vec<Document> {
    let wake_field = format!("updateDescription.updatedFields.{}", field::WAKE);
    vec![
        doc! { "$match": { "operationType": "update", wake_field.as_str(): { "$exists": true } } },
        doc! { "$project": {
            "operationType": 1,
            "ns": 1,
            "documentKey": 1,
            wake_field.as_str(): 1,
        } },
    ]
}

/// Opens the change stream (fails on deployments without change streams).
pub(super) async fn open_change_stream(
    collection: &Collection<Document>,
) -> mongodb::error::Result<ChangeStream<Document>> {
    Ok(collection
        .watch()
        .pipeline(change_stream_pipeline())
        .max_await_time(Duration::from_millis(500))
        .await?
        .with_type::<Document>())
}

/// The key and `wake` value of a change event, if it has both.
fn wake_of_event(event: &Document) -> Option<(&str, &str)> {
    let key = event
        .get_document("documentKey")
        .ok()?
        .get_str("_id")
        .ok()?;
    let wake = event
        .get_document("updateDescription")
        .ok()?
        .get_document("updatedFields")
        .ok()?
        .get_str(field::WAKE)
        .ok()?;
    Some((key, wake))
}

fn route(registry: &WakeRegistry, key: &str, wake: &str) {
    for owner in woken_owners(wake) {
        registry.wake(key, owner);
    }
}

/// Polling state of one key with local waiters.
#[derive(Debug, Default)]
struct Watched {
    subscriptions: usize,
    /// The `wake` value last observed ("" when the document has none); `None` until the
    /// first observation.
    last_seen: Option<String>,
}

type WatchedKeys = Arc<Mutex<HashMap<String, Watched>>>;

fn watched(keys: &WatchedKeys) -> MutexGuard<'_, HashMap<String, Watched>> {
    // Critical sections never leave the map half-updated.
    keys.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The wake-up side of a backend: the registry plus the task feeding it, which stops when
/// this value is dropped.
#[derive(Debug)]
pub(super) struct Wakes {
    registry: WakeRegistry,
    source: MongoWakeSource,
    collection: Collection<Document>,
    watched: WatchedKeys,
    read_timeout: Duration,
    _stop: oneshot::Sender<()>,
}

impl Wakes {
    /// Starts routing events of an opened change stream.
    pub(super) fn with_change_stream(
        collection: Collection<Document>,
        stream: ChangeStream<Document>,
        read_timeout: Duration,
    ) -> Self {
        let (stop, stopped) = oneshot::channel();
        let registry = WakeRegistry::new();
        tokio::spawn(listen(
            collection.clone(),
            stream,
            registry.clone(),
            stopped,
        ));
        Wakes {
            registry,
            source: MongoWakeSource::ChangeStream,
            collection,
            watched: WatchedKeys::default(),
            read_timeout,
            _stop: stop,
        }
    }

    /// Starts polling the keys that have local waiters every `interval`.
    pub(super) fn with_polling(
        collection: Collection<Document>,
        interval: Duration,
        read_timeout: Duration,
    ) -> Self {
        let (stop, stopped) = oneshot::channel();
        let registry = WakeRegistry::new();
        let watched = WatchedKeys::default();
        tokio::spawn(poll(
            collection.clone(),
            registry.clone(),
            Arc::clone(&watched),
            interval,
            read_timeout,
            stopped,
        ));
        Wakes {
            registry,
            source: MongoWakeSource::Polling,
            collection,
            watched,
            read_timeout,
            _stop: stop,
        }
    }

    pub(super) fn source(&self) -> MongoWakeSource {
        self.source
    }

    /// Registers `owner`'s interest in `key`. With polling, also records the key's current
    /// `wake` value before returning, so any later release is seen as a change.
    pub(super) async fn subscribe(
        &self,
        key: &str,
        owner: &str,
    ) -> Result<WakeSubscription, mongodb::error::Error> {
        if self.source == MongoWakeSource::ChangeStream {
            // The stream has been open since connect: every later release reaches it.
            return Ok(self.registry.register(key, owner, None));
        }
        // Counted before any await, and uncounted by the subscription's drop, so a cancelled
        // subscribe leaves the count balanced.
        watched(&self.watched)
            .entry(key.to_owned())
            .or_default()
            .subscriptions += 1;
        let keys = Arc::clone(&self.watched);
        let topic = key.to_owned();
        let on_drop: Box<dyn FnOnce() + Send + Sync> = Box::new(move || {
            let mut keys = watched(&keys);
            if let Some(entry) = keys.get_mut(&topic) {
                entry.subscriptions = entry.subscriptions.saturating_sub(1);
                if entry.subscriptions == 0 {
                    keys.remove(&topic);
                }
            }
        });
        let subscription = self.registry.register(key, owner, Some(on_drop));
        let current = read_wakes(&self.collection, &[key.to_owned()], self.read_timeout).await?;
        if let Some(entry) = watched(&self.watched).get_mut(key) {
            // Keep an older observation: it can only cause an extra wake-up, never a lost one.
            entry
                .last_seen
                .get_or_insert_with(|| current.get(key).cloned().unwrap_or_default());
        }
        Ok(subscription)
    }
}

/// Owns the change stream: routes events, reopens it after failures with backoff, stops when
/// the backend is dropped.
async fn listen(
    collection: Collection<Document>,
    first: ChangeStream<Document>,
    registry: WakeRegistry,
    mut stopped: oneshot::Receiver<()>,
) {
    let mut next = Some(first);
    let mut backoff = Duration::from_millis(50);
    loop {
        let mut stream = match next.take() {
            Some(stream) => stream,
            None => {
                let reopened = tokio::select! {
                    _ = &mut stopped => return,
                    reopened = open_change_stream(&collection) => reopened,
                };
                match reopened {
                    Ok(stream) => {
                        tracing::info!("mongo change stream reopened");
                        // Releases may have happened while no stream was open.
                        registry.wake_all();
                        backoff = Duration::from_millis(50);
                        stream
                    }
                    Err(error) => {
                        tracing::warn!(%error, retry_in_ms = backoff.as_millis() as u64, "mongo change stream could not be reopened");
                        tokio::select! {
                            _ = &mut stopped => return,
                            () = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                        continue;
                    }
                }
            }
        };
        loop {
            tokio::select! {
                _ = &mut stopped => return,
                event = stream.next() => match event {
                    Some(Ok(event)) => {
                        if let Some((key, wake)) = wake_of_event(&event) {
                            route(&registry, key, wake);
                        }
                    }
                    Some(Err(error)) => {
                        tracing::warn!(%error, "mongo change stream failed; reopening");
                        break;
                    }
                    None => {
                        tracing::warn!("mongo change stream ended; reopening");
                        break;
                    }
                },
            }
        }
    }
}

/// Reads the `wake` value of each existing document among `keys`.
async fn read_wakes(
    collection: &Collection<Document>,
    keys: &[String],
    timeout: Duration,
) -> Result<HashMap<String, String>, mongodb::error::Error> {
    let read = async {
        let mut cursor = collection
            .find(doc! { "_id": { "$in": keys } })
            .projection(doc! { field::WAKE: 1 })
            .await?;
        let mut wakes = HashMap::new();
        while let Some(document) = cursor.next().await {
            let document = document?;
            if let Ok(key) = document.get_str("_id") {
                let wake = match document.get(field::WAKE) {
                    Some(Bson::String(wake)) => wake.clone(),
                    _ => String::new(),
                };
                wakes.insert(key.to_owned(), wake);
            }
        }
        Ok(wakes)
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(result) => result,
        Err(_) => Err(mongodb::error::Error::custom(format!(
            "reading wake-ups took longer than {timeout:?}"
        ))),
    }
}

/// Every `interval`, reads the `wake` value of each key with local waiters and routes the
/// ones that changed since the last look.
async fn poll(
    collection: Collection<Document>,
    registry: WakeRegistry,
    keys: WatchedKeys,
    interval: Duration,
    read_timeout: Duration,
    mut stopped: oneshot::Receiver<()>,
) {
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            () = tokio::time::sleep(interval) => {}
        }
        let polled: Vec<String> = watched(&keys).keys().cloned().collect();
        if polled.is_empty() {
            continue;
        }
        let current = match read_wakes(&collection, &polled, read_timeout).await {
            Ok(current) => current,
            Err(error) => {
                // Nothing is lost: the next successful read is compared with the last one.
                tracing::warn!(%error, "mongo wake-up poll failed");
                continue;
            }
        };
        let mut watched_keys = watched(&keys);
        for key in &polled {
            let Some(entry) = watched_keys.get_mut(key) else {
                continue;
            };
            let observed = current.get(key).cloned().unwrap_or_default();
            if entry
                .last_seen
                .as_ref()
                .is_some_and(|previous| *previous != observed)
            {
                route(&registry, key, &observed);
            }
            entry.last_seen = Some(observed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn change_events_yield_key_and_wake() {
        let event = doc! {
            "_id": { "_data": "x" },
            "operationType": "update",
            "documentKey": { "_id": "jobs" },
            "updateDescription": { "updatedFields": { "wake": "3 a b" } },
        };
        assert_eq!(wake_of_event(&event), Some(("jobs", "3 a b")));
        let unrelated = doc! {
            "documentKey": { "_id": "jobs" },
            "updateDescription": { "updatedFields": { "fence": 2 } },
        };
        assert_eq!(wake_of_event(&unrelated), None);
    }

    #[tokio::test]
    async fn routing_wakes_only_the_named_owners() {
        let registry = WakeRegistry::new();
        let named = registry.register("k", "a", None);
        let other = registry.register("k", "c", None);
        let other_key = registry.register("k2", "a", None);
        route(&registry, "k", "9 a b");
        tokio::time::timeout(Duration::from_secs(1), named.notified())
            .await
            .expect("named owner woken");
        for (name, subscription) in [("unnamed owner", &other), ("other key", &other_key)] {
            assert!(
                tokio::time::timeout(Duration::from_millis(20), subscription.notified())
                    .await
                    .is_err(),
                "{name} was woken"
            );
        }
    }
}
