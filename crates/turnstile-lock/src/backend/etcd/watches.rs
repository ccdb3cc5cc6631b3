//! The wake-up side of an [`EtcdBackend`](super::EtcdBackend): one etcd watch per lock key
//! that has local waiters, delivering the hand-offs each write carries.
//!
//! A watch is *live* once etcd confirmed it: every write committed after that reaches it, so a
//! waiter that registers on a live watch before its attempt cannot miss its hand-off. When a
//! watch breaks (member lost, compaction, leader lost) it is created again, and the key's
//! local waiters are woken to re-poll once, since hand-offs may have been missed meanwhile.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use etcd_client::{EventType, WatchClient};
use tokio::sync::watch;
use tokio::task::AbortHandle;

use super::document::{Document, Sightings};
use crate::backend::{drop_counted, WakeRegistry, WakeSubscription};

/// Pause before a broken watch is created again.
const REWATCH_DELAY: Duration = Duration::from_millis(200);

struct KeyWatch {
    /// Local waiters that need this watch.
    refs: usize,
    live: watch::Receiver<bool>,
    task: AbortHandle,
}

impl Drop for KeyWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Table = Arc<Mutex<HashMap<String, KeyWatch>>>;

fn locked(table: &Table) -> MutexGuard<'_, HashMap<String, KeyWatch>> {
    // Every critical section leaves the table consistent.
    table
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The per-key watches of one backend and the registry they deliver to.
pub(super) struct KeyWatches {
    client: WatchClient,
    prefix: String,
    sightings: Arc<Sightings>,
    table: Table,
    wakes: WakeRegistry,
    /// How long a subscriber waits for etcd to confirm a new watch.
    confirm_timeout: Duration,
}

impl KeyWatches {
    pub(super) fn new(
        client: WatchClient,
        prefix: String,
        sightings: Arc<Sightings>,
        confirm_timeout: Duration,
    ) -> Self {
        KeyWatches {
            client,
            prefix,
            sightings,
            table: Table::default(),
            wakes: WakeRegistry::new(),
            confirm_timeout,
        }
    }

    /// Registers `owner` on `key` and waits until etcd confirmed the key's watch (or the
    /// confirm timeout passed: the waiter then relies on polling until it is).
    pub(super) async fn subscribe(&self, key: &str, owner: &str) -> WakeSubscription {
        let mut live = {
            let mut table = locked(&self.table);
            let entry = table
                .entry(key.to_owned())
                .or_insert_with(|| self.start(key));
            entry.refs += 1;
            entry.live.clone()
        };
        // No await between counting the reference and creating the subscription whose drop
        // gives it back: a cancelled subscribe leaves the count balanced.
        let subscription = self.register(key, owner);
        let _ = tokio::time::timeout(self.confirm_timeout, live.wait_for(|live| *live)).await;
        subscription
    }

    /// Registers `owner` on `key` only if the key's watch is live, without any round trip.
    pub(super) fn subscribe_if_live(&self, key: &str, owner: &str) -> Option<WakeSubscription> {
        {
            let mut table = locked(&self.table);
            let entry = table.get_mut(key).filter(|entry| *entry.live.borrow())?;
            entry.refs += 1;
        }
        Some(self.register(key, owner))
    }

    fn register(&self, key: &str, owner: &str) -> WakeSubscription {
        let table = Arc::clone(&self.table);
        let name = key.to_owned();
        let on_drop: Box<dyn FnOnce() + Send + Sync> = Box::new(move || {
            // The last waiter gone: the entry's drop stops its watch task.
            drop_counted(&mut locked(&table), &name, |entry| &mut entry.refs);
        });
        self.wakes.register(key, owner, Some(on_drop))
    }

    fn start(&self, key: &str) -> KeyWatch {
        let (live_sender, live) = watch::channel(false);
        let task = tokio::spawn(follow(
            self.client.clone(),
            key.to_owned(),
            format!("{}{key}", self.prefix),
            Arc::clone(&self.sightings),
            self.wakes.clone(),
            live_sender,
        ));
        KeyWatch {
            refs: 0,
            live,
            task: task.abort_handle(),
        }
    }
}

/// Watches `etcd_key` (lock `key`) until aborted: delivers each write's hand-offs, records
/// when each write was seen, and re-creates the watch whenever it breaks.
async fn follow(
    mut client: WatchClient,
    key: String,
    etcd_key: String,
    sightings: Arc<Sightings>,
    wakes: WakeRegistry,
    live: watch::Sender<bool>,
) {
    let mut first = true;
    loop {
        match client.watch(etcd_key.as_str(), None).await {
            Ok(mut stream) => loop {
                match stream.message().await {
                    Ok(Some(response)) => {
                        if response.canceled() {
                            tracing::debug!(%key, reason = response.cancel_reason(), "etcd watch cancelled");
                            break;
                        }
                        if response.created() {
                            live.send_replace(true);
                            if !first {
                                // Hand-offs may have been written while no watch was live.
                                wakes.wake_topic(&key);
                            }
                            first = false;
                        }
                        deliver(&key, &response, &sightings, &wakes);
                    }
                    Ok(None) => break,
                    Err(error) => {
                        tracing::debug!(%key, %error, "etcd watch broke");
                        break;
                    }
                }
            },
            Err(error) => tracing::debug!(%key, %error, "could not create an etcd watch"),
        }
        live.send_replace(false);
        tokio::time::sleep(REWATCH_DELAY).await;
    }
}

fn deliver(
    key: &str,
    response: &etcd_client::WatchResponse,
    sightings: &Sightings,
    wakes: &WakeRegistry,
) {
    let now = tokio::time::Instant::now();
    for event in response.events() {
        let Some(kv) = event.kv().filter(|_| event.event_type() == EventType::Put) else {
            continue;
        };
        let Ok(document) = Document::parse(kv.value()) else {
            tracing::warn!(%key, "an etcd lock value that is not a Turnstile lock document");
            continue;
        };
        sightings.observe(key, &document, kv.mod_revision(), now);
        for handoff in &document.handoffs {
            wakes.hand_off(key, &handoff.owner, handoff.handoff());
        }
    }
}
