//! A lock's pass waits for the cache to show its previous pass's own writes.
//!
//! Without a debounce, the first watch event of a pass's own writes wakes the lock again while
//! the rest of those writes are still on their way to the cache. A pass over that half-updated
//! cache would write again from stale objects and earn 409 Conflicts (each retried after a
//! backoff). So every pass records the resourceVersions it wrote, and the next pass of the same
//! lock runs only once the cache shows them (or the objects are gone), or after [`PATIENCE`]
//! when someone else wrote in between. Conditional writes keep this safe either way: it only
//! saves wasted passes and conflicts.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::runtime::reflector::{ObjectRef, Store};
use kube::ResourceExt;

use turnstile_api::{DistributedLock, LockClaim};

/// How long a pass waits for its predecessor's writes to show before going ahead anyway.
pub const PATIENCE: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct Written {
    at: Instant,
    lock: Option<String>,
    claims: HashMap<String, String>,
}

/// The resourceVersions each lock's last pass wrote, by lock (`namespace/name`).
#[derive(Debug, Default)]
pub struct OwnWrites {
    by_lock: Mutex<HashMap<String, Written>>,
}

impl OwnWrites {
    /// Records a pass's writes: the lock's new resourceVersion (if it wrote the lock) and each
    /// written claim's.
    pub fn record(&self, key: &str, lock: Option<String>, claims: HashMap<String, String>) {
        let mut by_lock = self.by_lock.lock().unwrap_or_else(|p| p.into_inner());
        if lock.is_none() && claims.is_empty() {
            by_lock.remove(key);
            return;
        }
        by_lock.insert(
            key.to_owned(),
            Written {
                at: Instant::now(),
                lock,
                claims,
            },
        );
    }

    /// `None` when the caches show every write of the lock's last pass (or [`PATIENCE`] has
    /// passed); else how long to wait at most.
    pub fn pending(
        &self,
        key: &str,
        namespace: &str,
        lock_name: &str,
        locks: &Store<DistributedLock>,
        claims: &Store<LockClaim>,
    ) -> Option<Duration> {
        let mut by_lock = self.by_lock.lock().unwrap_or_else(|p| p.into_inner());
        let written = by_lock.get(key)?;
        let waited = written.at.elapsed();
        // A cached object still at another version than the one written (gone counts as shown).
        let behind = |cached: Option<String>, wrote: &String| {
            cached.is_some_and(|version| version != *wrote)
        };
        let lock_behind = written.lock.as_ref().is_some_and(|wrote| {
            let cached = locks
                .get(&ObjectRef::new(lock_name).within(namespace))
                .and_then(|lock| lock.resource_version());
            behind(cached, wrote)
        });
        let claims_behind = written.claims.iter().any(|(name, wrote)| {
            let cached = claims
                .get(&ObjectRef::new(name).within(namespace))
                .and_then(|claim| claim.resource_version());
            behind(cached, wrote)
        });
        if (lock_behind || claims_behind) && waited < PATIENCE {
            return Some(PATIENCE - waited);
        }
        by_lock.remove(key);
        None
    }
}
