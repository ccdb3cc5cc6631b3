//! Routing of targeted wake-ups (and hand-offs) to the waiting tasks of this process.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

type Waiters = HashMap<String, HashMap<String, WaiterSlot>>;

struct WaiterSlot {
    signal: Arc<Signal>,
    /// Requests of this process waiting with the same (topic, owner); they share one slot.
    registrations: usize,
}

#[derive(Default)]
struct Signal {
    notify: Notify,
    handoff: Mutex<Option<Handoff>>,
}

impl Signal {
    fn handoff(&self) -> MutexGuard<'_, Option<Handoff>> {
        self.handoff
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A grant made to a waiter by someone else's release, in the same atomic step (so the waiter
/// needs no round trip to learn it holds the lock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handoff {
    /// The grant's fencing token.
    pub fencing_token: u64,
    /// The lease granted, counted from the release on the backend's clock. It is the smaller
    /// of the waiter's ttl and what was left of its queue heartbeat, so a waiter that died in
    /// the queue blocks the lock no longer than its heartbeat would have; the engine extends
    /// it to the full ttl right after.
    pub lease: Duration,
}

/// What a [`WakeSubscription`] was woken for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeUp {
    /// It may be this owner's turn: attempt again.
    Retry,
    /// The lock was handed to this owner.
    Granted(Handoff),
}

/// Maps (topic, owner token) to the local task waiting for that owner's turn.
///
/// A topic is whatever a backend's wake-up messages are addressed by: the lock key in memory,
/// the pub/sub channel in Redis. Cloning shares the registry.
#[derive(Clone, Default)]
pub struct WakeRegistry {
    waiters: Arc<Mutex<Waiters>>,
}

impl fmt::Debug for WakeRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WakeRegistry")
            .field("topics", &self.locked().len())
            .finish()
    }
}

impl WakeRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    fn locked(&self) -> MutexGuard<'_, Waiters> {
        // A panic while holding this short lock cannot leave the maps inconsistent.
        self.waiters
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers a waiter. `on_drop` runs after the subscription unregistered itself, e.g. to
    /// drop a backend's pub/sub subscription.
    pub fn register(
        &self,
        topic: &str,
        owner: &str,
        on_drop: Option<Box<dyn FnOnce() + Send + Sync>>,
    ) -> WakeSubscription {
        let signal = {
            let mut waiters = self.locked();
            let slot = waiters
                .entry(topic.to_owned())
                .or_default()
                .entry(owner.to_owned())
                .or_insert_with(|| WaiterSlot {
                    signal: Arc::default(),
                    registrations: 0,
                });
            slot.registrations += 1;
            Arc::clone(&slot.signal)
        };
        WakeSubscription {
            signal,
            registry: Some((self.clone(), topic.to_owned(), owner.to_owned())),
            on_drop,
        }
    }

    /// Wakes the local waiter registered for (topic, owner), if any. Returns whether one was.
    pub fn wake(&self, topic: &str, owner: &str) -> bool {
        self.signal(topic, owner, None)
    }

    /// Tells the local waiter registered for (topic, owner), if any, that the lock was handed
    /// to it. Returns whether one was registered.
    pub fn hand_off(&self, topic: &str, owner: &str, handoff: Handoff) -> bool {
        self.signal(topic, owner, Some(handoff))
    }

    fn signal(&self, topic: &str, owner: &str, handoff: Option<Handoff>) -> bool {
        let waiters = self.locked();
        let Some(slot) = waiters.get(topic).and_then(|owners| owners.get(owner)) else {
            return false;
        };
        if handoff.is_some() {
            *slot.signal.handoff() = handoff;
        }
        // notify_one keeps a permit when nobody is awaiting yet: no lost wake-up.
        slot.signal.notify.notify_one();
        true
    }

    /// Wakes every local waiter, e.g. after a pub/sub reconnect during which messages may
    /// have been lost. They re-poll once; that is the price of correctness.
    pub fn wake_all(&self) {
        for owners in self.locked().values() {
            for slot in owners.values() {
                slot.signal.notify.notify_one();
            }
        }
    }

    /// Wakes every local waiter of one topic, e.g. after that topic's watch was re-created and
    /// may have missed messages.
    pub fn wake_topic(&self, topic: &str) {
        if let Some(owners) = self.locked().get(topic) {
            for slot in owners.values() {
                slot.signal.notify.notify_one();
            }
        }
    }

    /// Number of topics with at least one waiter.
    pub fn topic_count(&self) -> usize {
        self.locked().len()
    }

    fn unregister(&self, topic: &str, owner: &str) {
        let mut waiters = self.locked();
        let Some(owners) = waiters.get_mut(topic) else {
            return;
        };
        drop_counted(owners, owner, |slot| &mut slot.registrations);
        if owners.is_empty() {
            waiters.remove(topic);
        }
    }
}

/// Gives back one of the references that `count` counts in `table`'s entry `name`, removing
/// the entry once none is left; true when it was removed (false too when there was none).
pub(crate) fn drop_counted<K, Q, T>(
    table: &mut HashMap<K, T>,
    name: &Q,
    count: impl FnOnce(&mut T) -> &mut usize,
) -> bool
where
    K: Borrow<Q> + Hash + Eq,
    Q: Hash + Eq + ?Sized,
{
    let Some(entry) = table.get_mut(name) else {
        return false;
    };
    let count = count(entry);
    *count = count.saturating_sub(1);
    if *count > 0 {
        return false;
    }
    table.remove(name);
    true
}

/// A registered interest in wake-ups for one owner on one lock. Dropping it unregisters.
pub struct WakeSubscription {
    signal: Arc<Signal>,
    registry: Option<(WakeRegistry, String, String)>,
    on_drop: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl fmt::Debug for WakeSubscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (topic, owner) = match &self.registry {
            Some((_, topic, owner)) => (topic.as_str(), owner.as_str()),
            None => ("", ""),
        };
        f.debug_struct("WakeSubscription")
            .field("topic", &topic)
            .field("owner", &owner)
            .finish()
    }
}

impl WakeSubscription {
    /// Waits for the next wake-up (returns at once if one arrived since the last call).
    pub async fn notified(&self) -> WakeUp {
        self.signal.notify.notified().await;
        self.take_handoff()
    }

    /// A hand-off that arrived and was not collected yet ([`WakeUp::Retry`] if none).
    pub fn take_handoff(&self) -> WakeUp {
        match self.signal.handoff().take() {
            Some(handoff) => WakeUp::Granted(handoff),
            None => WakeUp::Retry,
        }
    }
}

impl Drop for WakeSubscription {
    fn drop(&mut self) {
        if let Some((registry, topic, owner)) = self.registry.take() {
            registry.unregister(&topic, &owner);
        }
        if let Some(on_drop) = self.on_drop.take() {
            on_drop();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use futures::FutureExt;

    use super::*;

    /// The wake-up waiting for `subscription`, without waiting for one.
    fn pending(subscription: &WakeSubscription) -> Option<WakeUp> {
        subscription.notified().now_or_never()
    }

    #[test]
    fn a_wake_reaches_the_registered_owner_only_while_one_registration_is_left() {
        let registry = WakeRegistry::new();
        assert!(!registry.wake("k", "a"), "nobody registered");
        let first = registry.register("k", "a", None);
        let second = registry.register("k", "a", None);
        assert_eq!(format!("{registry:?}"), "WakeRegistry { topics: 1 }");
        drop(first);
        assert!(
            registry.wake("k", "a"),
            "the second registration is still there"
        );
        assert_eq!(pending(&second), Some(WakeUp::Retry));
        assert_eq!(pending(&second), None, "one wake-up, taken once");
        assert!(!registry.wake("k", "b"), "another owner");
        drop(second);
        assert!(!registry.wake("k", "a"));
        assert_eq!(registry.topic_count(), 0);
    }

    #[test]
    fn a_hand_off_is_delivered_once_with_its_grant() {
        let registry = WakeRegistry::new();
        let subscription = registry.register("k", "a", None);
        let handoff = Handoff {
            fencing_token: 7,
            lease: Duration::from_secs(3),
        };
        assert!(registry.hand_off("k", "a", handoff));
        assert_eq!(pending(&subscription), Some(WakeUp::Granted(handoff)));
        assert_eq!(subscription.take_handoff(), WakeUp::Retry);
    }

    #[test]
    fn everyone_or_one_topic_can_be_woken_after_messages_may_have_been_lost() {
        let registry = WakeRegistry::new();
        let on_k = registry.register("k", "a", None);
        let also_on_k = registry.register("k", "b", None);
        let on_j = registry.register("j", "a", None);
        assert_eq!(registry.topic_count(), 2);
        registry.wake_topic("k");
        assert_eq!(pending(&on_k), Some(WakeUp::Retry));
        assert_eq!(pending(&also_on_k), Some(WakeUp::Retry));
        assert_eq!(pending(&on_j), None, "another topic");
        registry.wake_topic("nobody");
        registry.wake_all();
        for subscription in [&on_k, &also_on_k, &on_j] {
            assert_eq!(pending(subscription), Some(WakeUp::Retry));
        }
    }

    #[test]
    fn dropping_a_subscription_unregisters_it_then_runs_its_cleanup() {
        let registry = WakeRegistry::new();
        let cleaned = Arc::new(AtomicBool::new(false));
        let subscription = {
            let (cleaned, registry) = (Arc::clone(&cleaned), registry.clone());
            registry.clone().register(
                "k",
                "a",
                Some(Box::new(move || {
                    assert_eq!(registry.topic_count(), 0, "unregistered first");
                    cleaned.store(true, Ordering::SeqCst);
                })),
            )
        };
        assert_eq!(
            format!("{subscription:?}"),
            "WakeSubscription { topic: \"k\", owner: \"a\" }"
        );
        drop(subscription);
        assert!(cleaned.load(Ordering::SeqCst));
    }

    #[test]
    fn a_counted_entry_goes_with_its_last_reference() {
        let mut table: HashMap<String, usize> = HashMap::from([("k".to_owned(), 2)]);
        assert!(!drop_counted(&mut table, "k", |count| count));
        assert_eq!(table.get("k"), Some(&1));
        assert!(drop_counted(&mut table, "k", |count| count));
        assert!(table.is_empty());
        assert!(!drop_counted(&mut table, "k", |count| count), "none left");
    }
}
