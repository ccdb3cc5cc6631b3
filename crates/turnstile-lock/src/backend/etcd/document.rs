//! A lock's value in etcd: its [`KeyState`] as JSON, with every deadline written as "this many
//! milliseconds after write W", and the table that turns that back into instants of this
//! process's clock.
//!
//! # Time without a server clock
//!
//! etcd has no clock a client can read, and its own leases count whole seconds. So a deadline
//! is stored relative to the write that set it (a random stamp per write), and each process
//! counts it from the moment *it* first saw that write: its own write's decision time, or the
//! read or watch event that brought it. That moment is never earlier than the holder's own
//! start (a holder counts its lease from before it sent the request that wrote it), so no
//! process ever judges a lease to have ended before its holder does; clocks need not agree,
//! only tick at the same rate. The price: a process that starts watching a lock late (or
//! restarts) counts the leases it finds from then, so a crashed holder's lease can outlast
//! its real end by up to one lease in that process's eyes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::backend::state::{Holder, KeyState, Waiter};
use crate::backend::{ceil_millis, Handoff, ShareMode};

/// A deadline: `ms` milliseconds after write `at` (as each process saw it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Deadline {
    ms: u64,
    at: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct HolderEntry {
    token: u64,
    #[serde(default, skip_serializing_if = "is_false")]
    shared: bool,
    #[serde(default, skip_serializing_if = "is_zero")]
    lock_delay_ms: u64,
    lease: Deadline,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hold_until: Option<Deadline>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct WaiterEntry {
    /// Queue place: priority (higher first), then arrival.
    priority: i32,
    seq: u64,
    ttl_ms: u64,
    #[serde(default, skip_serializing_if = "is_false")]
    shared: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_hold_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "is_zero")]
    lock_delay_ms: u64,
    heartbeat: Deadline,
}

/// One hand-off made by the write that carries it, for the watchers to deliver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct HandoffEntry {
    pub(super) owner: String,
    pub(super) token: u64,
    pub(super) lease_ms: u64,
}

impl HandoffEntry {
    pub(super) fn handoff(&self) -> Handoff {
        Handoff {
            fencing_token: self.token,
            lease: Duration::from_millis(self.lease_ms),
        }
    }
}

/// The JSON value of a lock's key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Document {
    fence: u64,
    seq: u64,
    #[serde(default)]
    holders: BTreeMap<String, HolderEntry>,
    #[serde(default)]
    waiters: BTreeMap<String, WaiterEntry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    delay_until: Option<Deadline>,
    /// The hand-offs this very write made (none in the next write's value).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) handoffs: Vec<HandoffEntry>,
}

fn is_false(value: &bool) -> bool {
    !*value
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

fn millis(duration: Duration) -> u64 {
    ceil_millis(duration)
}

fn share(shared: bool) -> ShareMode {
    if shared {
        ShareMode::Shared
    } else {
        ShareMode::Exclusive
    }
}

impl Document {
    /// Parses a key's value.
    pub(super) fn parse(value: &[u8]) -> serde_json::Result<Self> {
        serde_json::from_slice(value)
    }

    /// The value to write.
    pub(super) fn to_bytes(&self) -> Vec<u8> {
        // A map of plain structs with string keys always serializes.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Same lock state (the hand-off list aside).
    pub(super) fn same_state(&self, other: &Document) -> bool {
        // Field by field, without copying either value (a step calls this on every lock
        // operation, and a value carries every waiter of its lock).
        let Document {
            fence,
            seq,
            holders,
            waiters,
            delay_until,
            handoffs: _,
        } = self;
        *fence == other.fence
            && *seq == other.seq
            && *holders == other.holders
            && *waiters == other.waiters
            && *delay_until == other.delay_until
    }

    fn stamps(&self) -> impl Iterator<Item = u64> + '_ {
        let holders = self
            .holders
            .values()
            .flat_map(|holder| std::iter::once(holder.lease).chain(holder.hold_until));
        let waiters = self.waiters.values().map(|waiter| waiter.heartbeat);
        holders
            .chain(waiters)
            .chain(self.delay_until)
            .map(|deadline| deadline.at)
    }
}

/// When this process first saw each write that set a deadline still in use, per lock key.
#[derive(Debug, Default)]
pub(super) struct Sightings {
    keys: Mutex<HashMap<String, KeySightings>>,
}

#[derive(Debug, Default)]
struct KeySightings {
    /// The newest value's mod revision seen: older reads never drop a newer stamp.
    revision: i64,
    seen: HashMap<u64, Instant>,
}

impl Sightings {
    fn locked(&self) -> std::sync::MutexGuard<'_, HashMap<String, KeySightings>> {
        // Every critical section leaves the table consistent.
        self.keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records the stamps of `document` (the value of `key` at `revision`) not seen before as
    /// seen `now`; forgets the ones no longer in use once the value is the newest seen.
    pub(super) fn observe(&self, key: &str, document: &Document, revision: i64, now: Instant) {
        let mut keys = self.locked();
        let sightings = keys.entry(key.to_owned()).or_default();
        let in_use: HashSet<u64> = document.stamps().collect();
        for &stamp in &in_use {
            sightings.seen.entry(stamp).or_insert(now);
        }
        if revision >= sightings.revision {
            sightings.revision = revision;
            sightings.seen.retain(|stamp, _| in_use.contains(stamp));
        }
        if sightings.seen.is_empty() {
            keys.remove(key);
        }
    }

    /// Records that this process wrote `stamp` on `key` at `now`.
    pub(super) fn wrote(&self, key: &str, stamp: u64, now: Instant) {
        self.locked()
            .entry(key.to_owned())
            .or_default()
            .seen
            .insert(stamp, now);
    }

    /// `document` as a [`KeyState`] on this process's clock (every stamp already observed;
    /// an unknown one counts from `now`).
    pub(super) fn decode(&self, key: &str, document: &Document, now: Instant) -> KeyState {
        let keys = self.locked();
        let seen = keys.get(key);
        let instant = |deadline: Deadline| {
            let start = seen
                .and_then(|sightings| sightings.seen.get(&deadline.at))
                .copied()
                .unwrap_or(now);
            start + Duration::from_millis(deadline.ms)
        };
        let holders = document
            .holders
            .iter()
            .map(|(owner, entry)| {
                let holder = Holder {
                    fencing_token: entry.token,
                    expires_at: instant(entry.lease),
                    share: share(entry.shared),
                    lock_delay: Duration::from_millis(entry.lock_delay_ms),
                    hold_until: entry.hold_until.map(instant),
                };
                (owner.clone(), holder)
            })
            .collect();
        let mut queue = BTreeMap::new();
        let waiters = document
            .waiters
            .iter()
            .map(|(owner, entry)| {
                let place = (-i64::from(entry.priority), entry.seq);
                queue.insert(place, owner.clone());
                let waiter = Waiter {
                    place,
                    heartbeat_expires_at: instant(entry.heartbeat),
                    ttl: Duration::from_millis(entry.ttl_ms),
                    share: share(entry.shared),
                    max_hold: entry.max_hold_ms.map(Duration::from_millis),
                    lock_delay: Duration::from_millis(entry.lock_delay_ms),
                };
                (owner.clone(), waiter)
            })
            .collect();
        KeyState {
            holders,
            fence: document.fence,
            queue,
            waiters,
            next_seq: document.seq,
            delay_until: document.delay_until.map(instant),
        }
    }

    /// `state` as the value to write in a write stamped `stamp` at `now`: a deadline the
    /// operation left as it was keeps its old form (so other processes keep counting it from
    /// when they saw it), a new one is counted from this write.
    pub(super) fn encode(
        &self,
        key: &str,
        state: &KeyState,
        previous: &Document,
        stamp: u64,
        now: Instant,
    ) -> Document {
        let keys = self.locked();
        let seen = keys.get(key);
        let keep_or_new = |old: Option<Deadline>, instant: Instant| {
            let unchanged = old.filter(|old| {
                seen.and_then(|sightings| sightings.seen.get(&old.at))
                    .is_some_and(|start| *start + Duration::from_millis(old.ms) == instant)
            });
            unchanged.unwrap_or(Deadline {
                ms: millis(instant.saturating_duration_since(now)),
                at: stamp,
            })
        };
        let holders = state
            .holders
            .iter()
            .map(|(owner, holder)| {
                let old = previous.holders.get(owner);
                let entry = HolderEntry {
                    token: holder.fencing_token,
                    shared: !holder.share.is_exclusive(),
                    lock_delay_ms: millis(holder.lock_delay),
                    lease: keep_or_new(old.map(|old| old.lease), holder.expires_at),
                    hold_until: holder
                        .hold_until
                        .map(|until| keep_or_new(old.and_then(|old| old.hold_until), until)),
                };
                (owner.clone(), entry)
            })
            .collect();
        let waiters = state
            .waiters
            .iter()
            .map(|(owner, waiter)| {
                let old = previous.waiters.get(owner).map(|old| old.heartbeat);
                let entry = WaiterEntry {
                    priority: i32::try_from(-waiter.place.0).unwrap_or(i32::MAX),
                    seq: waiter.place.1,
                    ttl_ms: millis(waiter.ttl),
                    shared: !waiter.share.is_exclusive(),
                    max_hold_ms: waiter.max_hold.map(millis),
                    lock_delay_ms: millis(waiter.lock_delay),
                    heartbeat: keep_or_new(old, waiter.heartbeat_expires_at),
                };
                (owner.clone(), entry)
            })
            .collect();
        Document {
            fence: state.fence,
            seq: state.next_seq,
            holders,
            waiters,
            delay_until: state
                .delay_until
                .map(|until| keep_or_new(previous.delay_until, until)),
            handoffs: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{AcquireMode, AcquireRequest};

    fn request<'a>(owner: &'a str, mode: AcquireMode) -> AcquireRequest<'a> {
        AcquireRequest::new(
            "k",
            owner,
            Duration::from_secs(10),
            1,
            mode,
            Duration::from_secs(3),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_trip_keeps_what_did_not_change() {
        let sightings = Sightings::default();
        let now = Instant::now();
        let mut state = KeyState::default();
        state.acquire(&request("a", AcquireMode::Wait), now);
        state.acquire(&request("b", AcquireMode::Wait), now);
        let first = sightings.encode("k", &state, &Document::default(), 1, now);
        sightings.wrote("k", 1, now);
        assert_eq!(first.holders["a"].lease, Deadline { ms: 10_000, at: 1 });

        // Later, another write refreshes b's heartbeat only: a's lease keeps stamp 1.
        tokio::time::advance(Duration::from_secs(1)).await;
        let later = Instant::now();
        let mut state = sightings.decode("k", &first, later);
        state.acquire(&request("b", AcquireMode::Wait), later);
        let second = sightings.encode("k", &state, &first, 2, later);
        assert_eq!(second.holders["a"].lease, first.holders["a"].lease);
        assert_eq!(second.waiters["b"].heartbeat, Deadline { ms: 3_000, at: 2 });
        assert!(!second.same_state(&first));
        let parsed = Document::parse(&second.to_bytes()).unwrap();
        assert_eq!(parsed, second);
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_counts_from_when_this_process_first_saw_it() {
        let writer = Sightings::default();
        let reader = Sightings::default();
        let start = Instant::now();
        let mut state = KeyState::default();
        state.acquire(&request("a", AcquireMode::Wait), start);
        let document = writer.encode("k", &state, &Document::default(), 7, start);

        // The reader sees the write 4 s late: for it, a holds until 4 + 10 s.
        tokio::time::advance(Duration::from_secs(4)).await;
        reader.observe("k", &document, 1, Instant::now());
        tokio::time::advance(Duration::from_secs(7)).await;
        let state = reader.decode("k", &document, Instant::now());
        assert!(state.is_held("a", Instant::now()));
        tokio::time::advance(Duration::from_secs(3)).await;
        let state = reader.decode("k", &document, Instant::now());
        assert!(!state.is_held("a", Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn an_older_read_never_forgets_a_newer_stamp() {
        let sightings = Sightings::default();
        let now = Instant::now();
        let mut state = KeyState::default();
        state.acquire(&request("a", AcquireMode::Wait), now);
        let newer = sightings.encode("k", &state, &Document::default(), 9, now);
        sightings.observe("k", &newer, 5, now);
        sightings.observe("k", &Document::default(), 4, now);
        tokio::time::advance(Duration::from_secs(9)).await;
        let state = sightings.decode("k", &newer, Instant::now());
        assert!(!state.is_held("a", Instant::now() + Duration::from_secs(1)));
    }
}
