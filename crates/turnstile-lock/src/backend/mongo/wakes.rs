//! Delivery of release wake-ups to this process's waiters: a change stream when the
//! deployment has one (replica sets, sharded clusters), polling of the `wake` field otherwise.
//!
//! A release that admits waiters writes `wake: "<seq> <owner>…"` into the lock document.
//! The change stream is filtered on the server to exactly those writes on the keys that have
//! local waiters, and projected down to the key and the `wake` value; each event is routed to
//! the [`WakeRegistry`] under topic = key, so only the named owners' tasks wake.
//!
//! When a key gains its first local waiter, the listener reopens the stream with the new key
//! set, resuming after the last event it saw, so nothing in between is lost; `subscribe`
//! returns once that stream is open. If the stream fails and cannot be resumed, it is opened
//! afresh and every local waiter is woken once to re-poll, since events may have been missed.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use mongodb::bson::{doc, Bson, Document};
use mongodb::change_stream::event::ResumeToken;
use mongodb::change_stream::ChangeStream;
use mongodb::Collection;
use tokio::sync::{mpsc, oneshot};

use super::document::woken_owners;
use super::pipelines::field;
use crate::backend::{drop_counted, WakeRegistry, WakeSubscription};

/// How a [`MongoBackend`](super::MongoBackend) learns about releases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MongoWakeSource {
    /// A change stream on the locks collection (replica sets and sharded clusters).
    ChangeStream,
    /// Periodic reads of the `wake` field of keys with local waiters (standalone servers).
    Polling,
}

/// The change stream's server-side filter: only writes on `keys` that name admitted waiters,
/// and only the fields needed to route them.
fn change_stream_pipeline<'a>(keys: impl IntoIterator<Item = &'a String>) -> Vec<Document> {
    let wake_field = format!("updateDescription.updatedFields.{}", field::WAKE);
    let keys: Vec<&String> = keys.into_iter().collect();
    vec![
        doc! { "$match": {
            "operationType": "update",
            "documentKey._id": { "$in": keys },
            wake_field.as_str(): { "$exists": true },
        } },
        doc! { "$project": {
            "operationType": 1,
            "ns": 1,
            "documentKey": 1,
            wake_field.as_str(): 1,
        } },
    ]
}

/// Opens the change stream on `keys` (fails on deployments without change streams), resuming
/// after `resume` if given.
pub(super) async fn open_change_stream<'a>(
    collection: &Collection<Document>,
    keys: impl IntoIterator<Item = &'a String>,
    resume: Option<ResumeToken>,
) -> mongodb::error::Result<ChangeStream<Document>> {
    Ok(collection
        .watch()
        .pipeline(change_stream_pipeline(keys))
        .resume_after(resume)
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
    /// Change stream mode: tells the listener which keys have local waiters.
    commands: Option<mpsc::UnboundedSender<StreamCommand>>,
    /// Polling mode: the keys with local waiters and what was last seen of them.
    watched: WatchedKeys,
    read_timeout: Duration,
    _stop: oneshot::Sender<()>,
}

/// A change to the set of keys the change stream follows. Sent without an await between
/// registering a waiter and queueing its `Watch` (or dropping it and queueing its `Unwatch`),
/// so the listener's counts stay balanced even when a subscribe is cancelled.
#[derive(Debug)]
pub(super) enum StreamCommand {
    /// A local waiter on this key; answer once the stream covers it.
    Watch(String, oneshot::Sender<()>),
    /// A local waiter on this key went away.
    Unwatch(String),
}

impl Wakes {
    /// Starts routing events of an opened change stream (opened on no keys: it proves the
    /// deployment has change streams; keys are added as waiters subscribe).
    pub(super) fn with_change_stream(
        collection: Collection<Document>,
        stream: ChangeStream<Document>,
        read_timeout: Duration,
    ) -> Self {
        let (stop, stopped) = oneshot::channel();
        let (commands, receiver) = mpsc::unbounded_channel();
        let registry = WakeRegistry::new();
        let listener = Listener {
            collection: collection.clone(),
            registry: registry.clone(),
            commands: receiver,
            keys: HashMap::new(),
            stream_keys: HashSet::new(),
            resume: None,
            pending: Vec::new(),
        };
        tokio::spawn(listener.run(stream, stopped));
        Wakes {
            registry,
            source: MongoWakeSource::ChangeStream,
            collection,
            commands: Some(commands),
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
            commands: None,
            watched,
            read_timeout,
            _stop: stop,
        }
    }

    pub(super) fn source(&self) -> MongoWakeSource {
        self.source
    }

    /// Registers `owner`'s interest in `key`. Returns once every later release on `key` will
    /// reach the subscription: the change stream covers the key, or (polling) the key's
    /// current `wake` value was read, so any later release is seen as a change.
    pub(super) async fn subscribe(
        &self,
        key: &str,
        owner: &str,
    ) -> Result<WakeSubscription, mongodb::error::Error> {
        if let Some(commands) = &self.commands {
            let (ack, acked) = oneshot::channel();
            let _ = commands.send(StreamCommand::Watch(key.to_owned(), ack));
            let commands = commands.clone();
            let unwatch = StreamCommand::Unwatch(key.to_owned());
            let on_drop: Box<dyn FnOnce() + Send + Sync> = Box::new(move || {
                let _ = commands.send(unwatch);
            });
            let subscription = self.registry.register(key, owner, Some(on_drop));
            // Err only if the listener is gone (runtime shutting down): polling still works.
            let _ = acked.await;
            return Ok(subscription);
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
            drop_counted(&mut watched(&keys), &topic, |entry| {
                &mut entry.subscriptions
            });
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

/// The listener task's state.
struct Listener {
    collection: Collection<Document>,
    registry: WakeRegistry,
    commands: mpsc::UnboundedReceiver<StreamCommand>,
    /// Keys with local waiters → number of subscriptions.
    keys: HashMap<String, usize>,
    /// The keys the open stream filters on (may include keys no longer waited on).
    stream_keys: HashSet<String>,
    /// Where the next stream resumes: after the last event (or batch) seen.
    resume: Option<ResumeToken>,
    /// Subscribers waiting until the stream covers their key.
    pending: Vec<oneshot::Sender<()>>,
}

impl Listener {
    /// Applies a command; returns whether the stream must be reopened to cover a new key.
    fn apply(&mut self, command: StreamCommand) -> bool {
        match command {
            StreamCommand::Watch(key, ack) => {
                *self.keys.entry(key.clone()).or_insert(0) += 1;
                if self.stream_keys.contains(&key) {
                    let _ = ack.send(());
                    false
                } else {
                    self.pending.push(ack);
                    true
                }
            }
            StreamCommand::Unwatch(key) => {
                drop_counted(&mut self.keys, &key, |count| count);
                false
            }
        }
    }

    fn acknowledge_pending(&mut self) {
        for ack in self.pending.drain(..) {
            // The subscriber may have given up waiting; that is fine.
            let _ = ack.send(());
        }
    }

    /// Opens a stream on the current keys, resuming after the last event seen if possible,
    /// else afresh (then every local waiter re-polls once: events may have been missed).
    async fn open(&mut self) -> mongodb::error::Result<ChangeStream<Document>> {
        let keys: Vec<String> = self.keys.keys().cloned().collect();
        if let Some(token) = self.resume.take() {
            match open_change_stream(&self.collection, &keys, Some(token)).await {
                Ok(stream) => {
                    self.stream_keys = keys.into_iter().collect();
                    return Ok(stream);
                }
                Err(error) => {
                    tracing::warn!(%error, "mongo change stream could not be resumed; opening afresh");
                }
            }
        }
        let stream = open_change_stream(&self.collection, &keys, None).await?;
        self.stream_keys = keys.into_iter().collect();
        self.registry.wake_all();
        Ok(stream)
    }

    /// Owns the change stream: routes events, follows the key set, reopens the stream after
    /// failures with backoff, stops when the backend is dropped.
    async fn run(mut self, first: ChangeStream<Document>, mut stopped: oneshot::Receiver<()>) {
        let mut current = Some(first);
        let mut backoff = Duration::from_millis(50);
        loop {
            let mut stream = match current.take() {
                Some(stream) => stream,
                None => {
                    let opened = tokio::select! {
                        _ = &mut stopped => return,
                        opened = self.open() => opened,
                    };
                    self.acknowledge_pending();
                    match opened {
                        Ok(stream) => {
                            backoff = Duration::from_millis(50);
                            stream
                        }
                        Err(error) => {
                            tracing::warn!(%error, retry_in_ms = backoff.as_millis() as u64, "mongo change stream could not be opened");
                            if !self.pause(backoff, &mut stopped).await {
                                return;
                            }
                            backoff = (backoff * 2).min(Duration::from_secs(5));
                            continue;
                        }
                    }
                }
            };
            // Resuming from here loses nothing, even if no getMore completes before a reopen.
            if let Some(token) = stream.resume_token() {
                self.resume = Some(token);
            }
            let reopen = loop {
                tokio::select! {
                    _ = &mut stopped => return,
                    command = self.commands.recv() => {
                        let Some(command) = command else { return };
                        let mut widen = self.apply(command);
                        // Batch whatever else is queued into one reopen.
                        while let Ok(command) = self.commands.try_recv() {
                            widen |= self.apply(command);
                        }
                        if widen {
                            break true;
                        }
                    }
                    // One getMore at a time, so the resume token can be read between them
                    // (the driver forbids reading it while a poll is in flight).
                    batch = stream.next_if_any() => {
                        match batch {
                            Ok(Some(event)) => {
                                if let Some((key, wake)) = wake_of_event(&event) {
                                    route(&self.registry, key, wake);
                                }
                            }
                            Ok(None) => {}
                            Err(error) => {
                                tracing::warn!(%error, "mongo change stream failed; reopening");
                                break false;
                            }
                        }
                        if let Some(token) = stream.resume_token() {
                            self.resume = Some(token);
                        }
                        if !stream.is_alive() {
                            tracing::warn!("mongo change stream ended; reopening");
                            break false;
                        }
                    }
                }
            };
            // A getMore cut short by a command is repeated by the resumed stream.
            drop(stream);
            if reopen {
                tracing::trace!(
                    keys = self.keys.len(),
                    "mongo change stream follows a new key"
                );
            }
        }
    }

    /// Waits `delay` while still accepting commands (answered at once: the stream is down,
    /// and its reopening wakes everyone). Returns false on shutdown.
    async fn pause(&mut self, delay: Duration, stopped: &mut oneshot::Receiver<()>) -> bool {
        let sleep = tokio::time::sleep(delay);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                _ = &mut *stopped => return false,
                () = &mut sleep => return true,
                command = self.commands.recv() => {
                    let Some(command) = command else { return false };
                    self.apply(command);
                    self.acknowledge_pending();
                }
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
