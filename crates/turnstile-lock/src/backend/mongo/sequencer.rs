//! Per-key ordering of this process's operations.
//!
//! The driver sends each command on whichever pooled connection is free, and a command whose
//! future is dropped is still applied by the server. Without care, the release the engine
//! sends after cancelling an acquire could overtake that acquire on another connection and
//! leave a grant nobody owns, and a read issued after a write could miss it. So operations on
//! one key take turns in the order they were issued (tokio's mutex is fair), and a write keeps
//! its turn until the server answered, even if its caller stopped waiting: one backend value
//! applies its operations on a key in issue order, as one Redis connection does.
//!
//! Operations on one lock document are serialized by the server anyway, so taking turns in
//! the client costs little: one process's requests on a hot key are not pipelined.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Mutex as TurnLock, OwnedMutexGuard};

type Slots = HashMap<String, Arc<TurnLock<()>>>;

/// Hands out turns per key in request order.
#[derive(Debug, Default)]
pub(super) struct KeySequencer {
    slots: Mutex<Slots>,
}

impl KeySequencer {
    fn slots(&self) -> MutexGuard<'_, Slots> {
        // Every critical section below leaves the map consistent before it could panic.
        self.slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits until the operations on `key` issued earlier have finished. Dropping the future
    /// before it resolves gives the turn up without effect.
    pub(super) async fn turn(self: &Arc<Self>, key: &str) -> Turn {
        let slot = Arc::clone(self.slots().entry(key.to_owned()).or_default());
        let guard = slot.lock_owned().await;
        Turn {
            sequencer: Arc::clone(self),
            key: key.to_owned(),
            guard: Some(guard),
        }
    }

    /// Number of keys with an operation in flight or queued.
    #[cfg(test)]
    fn active(&self) -> usize {
        self.slots().len()
    }
}

/// An exclusive turn on a key; the next operation on the key starts when it drops.
#[derive(Debug)]
pub(super) struct Turn {
    sequencer: Arc<KeySequencer>,
    key: String,
    guard: Option<OwnedMutexGuard<()>>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut slots = self.sequencer.slots();
        // Only the map's own reference left: nobody holds or awaits this slot any more.
        // (References are only cloned under this lock, so the count cannot grow meanwhile.)
        if slots
            .get(&self.key)
            .is_some_and(|slot| Arc::strong_count(slot) == 1)
        {
            slots.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_later_turn_waits_for_the_earlier_one_and_slots_are_freed() {
        let sequencer = Arc::new(KeySequencer::default());
        let first = sequencer.turn("k").await;
        let waiting = {
            let sequencer = Arc::clone(&sequencer);
            tokio::spawn(async move { sequencer.turn("k").await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !waiting.is_finished(),
            "second turn started before the first ended"
        );
        // Another key is not held up.
        let other = sequencer.turn("other").await;
        drop(other);
        drop(first);
        let second = waiting.await.expect("join");
        assert_eq!(sequencer.active(), 1);
        drop(second);
        assert_eq!(sequencer.active(), 0);
    }

    #[tokio::test]
    async fn a_cancelled_wait_leaves_no_slot_behind() {
        let sequencer = Arc::new(KeySequencer::default());
        let first = sequencer.turn("k").await;
        let cancelled = tokio::time::timeout(Duration::from_millis(10), sequencer.turn("k")).await;
        assert!(cancelled.is_err());
        drop(first);
        assert_eq!(sequencer.active(), 0);
    }
}
