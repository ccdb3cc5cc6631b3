//! Waiting for a reflector's cache to be filled by its first list.

use std::time::Duration;

use kube::runtime::reflector::Store;

/// How often a waiter for a cache re-checks whether it has been filled.
const CACHE_READY_RECHECK: Duration = Duration::from_millis(100);

/// Waits until `store` has been filled by its watch once (or its writer is gone).
///
/// kube-runtime's [`Store::wait_until_ready`] keeps one waker: of several tasks waiting at
/// once (the readiness probe and the first passes) only the last one polled is woken, the
/// others would wait forever. Each waiter therefore polls again at a short interval.
pub async fn cache_filled<K>(store: &Store<K>)
where
    K: 'static + Clone + kube::runtime::reflector::Lookup,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    while tokio::time::timeout(CACHE_READY_RECHECK, store.wait_until_ready())
        .await
        .is_err()
    {}
}
