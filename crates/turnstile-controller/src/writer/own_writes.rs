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

/// What a pass records for a claim its write deleted (the last finalizer of a claim being
/// deleted): the API server answers such a write with the claim as it was, at the version the
/// cache already shows, so only the claim's absence from the cache shows the write. (No
/// resourceVersion is empty.)
pub const GONE: &str = "";

#[derive(Debug)]
struct Written {
    at: Instant,
    lock: Option<String>,
    claims: HashMap<String, String>,
}

/// The resourceVersions each lock's last pass wrote, by lock.
#[derive(Debug, Default)]
pub struct OwnWrites {
    /// By `(namespace, lock name)`: both calls name the lock the same way, so a pass always
    /// finds what its predecessor recorded.
    by_lock: Mutex<HashMap<(String, String), Written>>,
}

impl OwnWrites {
    /// Records a pass's writes on lock `lock_name` in `namespace`: the lock's new
    /// resourceVersion (if it wrote the lock) and each written claim's.
    pub fn record(
        &self,
        namespace: &str,
        lock_name: &str,
        lock: Option<String>,
        claims: HashMap<String, String>,
    ) {
        let key = (namespace.to_owned(), lock_name.to_owned());
        let mut by_lock = self.by_lock.lock().unwrap_or_else(|p| p.into_inner());
        if lock.is_none() && claims.is_empty() {
            by_lock.remove(&key);
            return;
        }
        by_lock.insert(
            key,
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
        namespace: &str,
        lock_name: &str,
        locks: &Store<DistributedLock>,
        claims: &Store<LockClaim>,
    ) -> Option<Duration> {
        self.pending_in_caches(
            namespace,
            lock_name,
            || {
                locks
                    .get(&ObjectRef::new(lock_name).within(namespace))
                    .and_then(|lock| lock.resource_version())
            },
            |name| {
                claims
                    .get(&ObjectRef::new(name).within(namespace))
                    .and_then(|claim| claim.resource_version())
            },
        )
    }

    /// [`OwnWrites::pending`] for any lock, reading the cached resourceVersions of the lock
    /// and of a claim (by its name in the pass) through `cached_lock` and `cached_claim`.
    pub fn pending_in_caches(
        &self,
        namespace: &str,
        lock_name: &str,
        cached_lock: impl FnOnce() -> Option<String>,
        cached_claim: impl Fn(&str) -> Option<String>,
    ) -> Option<Duration> {
        let key = (namespace.to_owned(), lock_name.to_owned());
        let mut by_lock = self.by_lock.lock().unwrap_or_else(|p| p.into_inner());
        let written = by_lock.get(&key)?;
        let waited = written.at.elapsed();
        // A cached object not yet at the version written (gone counts as shown).
        let behind = |cached: Option<String>, wrote: &String| {
            cached.is_some_and(|version| !shows(&version, wrote))
        };
        let lock_behind = written
            .lock
            .as_ref()
            .is_some_and(|wrote| behind(cached_lock(), wrote));
        let claims_behind = written.claims.iter().any(|(name, wrote)| {
            let cached = cached_claim(name);
            if wrote == GONE {
                cached.is_some()
            } else {
                behind(cached, wrote)
            }
        });
        if (lock_behind || claims_behind) && waited < PATIENCE {
            return Some(PATIENCE - waited);
        }
        by_lock.remove(&key);
        None
    }
}

/// Whether an object cached at resourceVersion `cached` shows the write that produced `wrote`.
///
/// resourceVersions are opaque to clients, so only equality is certain. Every API server in
/// use (etcd's revisions, the fake's counter) gives integers that only grow, so a larger one
/// means a later write on top of ours: without this, someone else's write right after ours
/// would hold the lock's next pass back for the whole [`PATIENCE`].
fn shows(cached: &str, wrote: &str) -> bool {
    cached == wrote
        || matches!(
            (cached.parse::<u64>(), wrote.parse::<u64>()),
            (Ok(cached), Ok(wrote)) if cached > wrote
        )
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector::{self, store::Writer};
    use kube::runtime::watcher;

    use super::*;
    use turnstile_api::{DistributedLockSpec, LockClaimSpec};

    fn at_version<K: kube::Resource>(mut object: K, version: &str) -> K {
        object.meta_mut().namespace = Some("ns".to_owned());
        object.meta_mut().resource_version = Some(version.to_owned());
        object
    }

    fn cache<K>(writer: &mut Writer<K>, object: K)
    where
        K: kube::Resource + Clone,
        K::DynamicType: Eq + std::hash::Hash + Clone,
    {
        writer.apply_watcher_event(&watcher::Event::Apply(object));
    }

    #[test]
    fn the_next_pass_waits_until_the_cache_shows_every_write_of_the_last() {
        let (locks, mut lock_writer) = reflector::store::<DistributedLock>();
        let (claims, mut claim_writer) = reflector::store::<LockClaim>();
        let spec = DistributedLockSpec::default();
        let lock = |version| at_version(DistributedLock::new("db", spec.clone()), version);
        let claim =
            |version| at_version(LockClaim::new("a", LockClaimSpec::for_lock("db")), version);
        cache(&mut lock_writer, lock("4"));
        cache(&mut claim_writer, claim("3"));
        let own = OwnWrites::default();
        own.record(
            "ns",
            "db",
            Some("5".to_owned()),
            [("a".to_owned(), "6".to_owned())].into(),
        );

        let pending = || own.pending("ns", "db", &locks, &claims);
        assert!(pending().is_some(), "neither write is cached yet");
        // At most the patience that is left.
        assert!(
            pending().is_some_and(|wait| wait <= PATIENCE),
            "{:?}",
            pending()
        );
        assert!(
            own.pending("ns", "other", &locks, &claims).is_none(),
            "another lock's pass does not wait"
        );
        cache(&mut lock_writer, lock("5"));
        assert!(pending().is_some(), "the claim's write is not cached yet");
        cache(&mut claim_writer, claim("8"));
        assert!(pending().is_none(), "a later version shows the write too");
        assert!(pending().is_none(), "shown once, forgotten");
    }

    #[test]
    fn a_claim_the_last_pass_deleted_holds_the_next_until_the_cache_drops_it() {
        let (locks, _) = reflector::store::<DistributedLock>();
        let (claims, mut claim_writer) = reflector::store::<LockClaim>();
        let claim = at_version(LockClaim::new("a", LockClaimSpec::for_lock("db")), "7");
        cache(&mut claim_writer, claim.clone());
        let own = OwnWrites::default();
        own.record("ns", "db", None, [("a".to_owned(), GONE.to_owned())].into());
        let pending = || own.pending("ns", "db", &locks, &claims);
        assert!(
            pending().is_some(),
            "still cached: its deletion is on its way"
        );
        claim_writer.apply_watcher_event(&watcher::Event::Delete(claim));
        assert!(pending().is_none(), "gone from the cache: shown");
    }

    #[test]
    fn a_pass_that_wrote_nothing_leaves_nothing_to_wait_for() {
        let (locks, _) = reflector::store::<DistributedLock>();
        let (claims, _) = reflector::store::<LockClaim>();
        let own = OwnWrites::default();
        own.record("ns", "db", Some("5".to_owned()), HashMap::new());
        own.record("ns", "db", None, HashMap::new());
        assert!(own.pending("ns", "db", &locks, &claims).is_none());
    }

    #[test]
    fn a_cached_version_shows_the_write_when_equal_or_later() {
        assert!(shows("17", "17"));
        assert!(shows("18", "17"));
        assert!(!shows("16", "17"), "the cache is behind");
        assert!(shows("abc", "abc"));
        assert!(
            !shows("abd", "abc"),
            "opaque versions: only equality counts"
        );
    }
}
