//! A backend that comes back wakes every lock that waited for it.
//!
//! A pass that cannot reach its lock's backend is retried with exponential backoff (up to a
//! minute), so that a dead Redis does not cost a call per lock per second. Backoff alone would
//! leave a lock idle for as long as its last delay after the backend returns: with waiters
//! queued and nobody changing a claim, nothing else wakes it. So the locks that failed are
//! remembered by backend, one probe per backend (not per lock) asks it again every
//! [`PROBE_INTERVAL`], and the first answer — the probe's or any pass's — wakes them all.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use kube::runtime::reflector::ObjectRef;

use crate::runtime::backends::Backends;
use crate::wakes::lock_wakes::LockWakes;
use turnstile_api::{BackendKind, DistributedLock};

/// How often a backend with waiting locks is asked whether it is back.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// The backend key the probe reads: a snapshot of a key no lock uses (lock keys always start
/// with a namespace and a `/`, and no namespace is empty).
const PROBE_KEY: &str = "/turnstile-probe";

/// The locks whose last pass could not reach their backend, by backend, and the wake-ups sent
/// to the lock controller when a backend answers again.
///
/// A lock whose calls fail while its backend answers the probe (a key of the wrong type, a
/// key the ACL denies) must not be retried every second: a lock that fails again after being
/// woken becomes a *suspect*, left to its backoff, and counts as waiting again only once the
/// probe sees the backend fail too.
#[derive(Debug)]
pub struct BackendOutages {
    state: Mutex<HashMap<BackendKind, Waiting>>,
    wakes: LockWakes,
}

/// One backend's locks.
#[derive(Debug, Default)]
struct Waiting {
    /// Woken when the backend answers.
    waiting: HashSet<ObjectRef<DistributedLock>>,
    /// Woken once and not yet through a clean pass.
    woken: HashSet<ObjectRef<DistributedLock>>,
    /// Failed again after being woken: waiting only if the backend is seen to fail.
    suspects: HashSet<ObjectRef<DistributedLock>>,
}

type Locks = HashSet<ObjectRef<DistributedLock>>;

impl BackendOutages {
    /// Outages whose ends wake locks through `wakes`.
    pub fn new(wakes: LockWakes) -> Self {
        Self {
            state: Mutex::new(HashMap::new()),
            wakes,
        }
    }

    /// A pass of `lock` could not reach `backend`: wake it when the backend answers again.
    pub fn failed(&self, backend: BackendKind, lock: ObjectRef<DistributedLock>) {
        let mut state = self.state();
        let locks = state.entry(backend).or_default();
        if locks.woken.contains(&lock) {
            locks.suspects.insert(lock);
        } else {
            locks.waiting.insert(lock);
        }
    }

    /// A pass of `lock` went through on `backend`.
    pub fn succeeded(&self, backend: BackendKind, lock: &ObjectRef<DistributedLock>) {
        let mut state = self.state();
        if let Some(locks) = state.get_mut(&backend) {
            locks.woken.remove(lock);
            locks.suspects.remove(lock);
            locks.waiting.remove(lock);
            if locks.woken.is_empty() && locks.suspects.is_empty() && locks.waiting.is_empty() {
                state.remove(&backend);
            }
        }
    }

    /// The probe saw `backend` fail: its suspects are outage victims after all.
    fn probe_failed(&self, backend: BackendKind) {
        if let Some(locks) = self.state().get_mut(&backend) {
            let suspects: Locks = std::mem::take(&mut locks.suspects);
            locks.waiting.extend(suspects);
        }
    }

    /// The probe saw `backend` answer: every lock that waited for it is woken now.
    fn answered(&self, backend: BackendKind) {
        let waiting: Locks = {
            let mut state = self.state();
            let Some(locks) = state.get_mut(&backend) else {
                return;
            };
            let waiting = std::mem::take(&mut locks.waiting);
            locks.woken.extend(waiting.iter().cloned());
            waiting
        };
        if waiting.is_empty() {
            return;
        }
        tracing::debug!(%backend, locks = waiting.len(), "backend answers again: waking its locks");
        for lock in waiting {
            self.wakes.wake(lock);
        }
    }

    /// The backends with locks waiting for them or suspected of failing on their own.
    fn to_probe(&self) -> Vec<BackendKind> {
        self.state()
            .iter()
            .filter(|(_, locks)| !locks.waiting.is_empty() || !locks.suspects.is_empty())
            .map(|(backend, _)| *backend)
            .collect()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, HashMap<BackendKind, Waiting>> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Asks each backend that has waiting locks, every [`PROBE_INTERVAL`], whether it is back,
/// until `stop` completes.
pub async fn probe(outages: &BackendOutages, backends: &Backends, stop: impl Future<Output = ()>) {
    let probing = async {
        let mut ticks = tokio::time::interval(PROBE_INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            for backend in outages.to_probe() {
                let answered = match backends.get(backend).await {
                    Ok(connection) => connection.snapshot(PROBE_KEY).await.is_ok(),
                    Err(_) => false,
                };
                if answered {
                    outages.answered(backend);
                } else {
                    outages.probe_failed(backend);
                }
            }
        }
    };
    tokio::select! {
        () = probing => {}
        () = stop => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::channel::mpsc;

    fn lock(name: &str) -> ObjectRef<DistributedLock> {
        ObjectRef::new(name).within("ns")
    }

    /// The names woken so far (without waiting for more).
    fn woken(wakes: &mut mpsc::UnboundedReceiver<ObjectRef<DistributedLock>>) -> Vec<String> {
        let mut names = Vec::new();
        while let Ok(lock) = wakes.try_recv() {
            names.push(lock.name);
        }
        names.sort();
        names
    }

    #[test]
    fn an_answer_wakes_each_waiting_lock_of_that_backend_once() {
        let lock_wakes = LockWakes::default();
        let outages = BackendOutages::new(lock_wakes.clone());
        let mut wakes = lock_wakes
            .take_stream()
            .expect("the first call hands out the stream");
        assert!(lock_wakes.take_stream().is_none(), "only one consumer");
        outages.failed(BackendKind::Redis, lock("a"));
        outages.failed(BackendKind::Redis, lock("a"));
        outages.failed(BackendKind::Redis, lock("b"));
        outages.failed(BackendKind::Mongo, lock("m"));
        let mut probed = outages.to_probe();
        probed.sort_by_key(|backend| backend.to_string());
        assert_eq!(probed, vec![BackendKind::Mongo, BackendKind::Redis]);

        outages.answered(BackendKind::Redis);
        assert_eq!(woken(&mut wakes), ["a", "b"]);
        assert_eq!(outages.to_probe(), vec![BackendKind::Mongo]);
        // A second answer has nobody left to wake.
        outages.answered(BackendKind::Redis);
        assert!(woken(&mut wakes).is_empty());
        outages.answered(BackendKind::Mongo);
        assert_eq!(woken(&mut wakes), ["m"]);
        assert!(outages.to_probe().is_empty());
    }

    #[test]
    fn a_lock_failing_while_its_backend_answers_is_left_to_its_backoff() {
        let lock_wakes = LockWakes::default();
        let outages = BackendOutages::new(lock_wakes.clone());
        let mut wakes = lock_wakes.take_stream().expect("stream");
        outages.failed(BackendKind::Redis, lock("wrong-type"));
        outages.failed(BackendKind::Redis, lock("fine"));
        outages.answered(BackendKind::Redis);
        assert_eq!(woken(&mut wakes), ["fine", "wrong-type"]);
        outages.succeeded(BackendKind::Redis, &lock("fine"));

        // Woken, and failing again although the backend answers: a suspect, not woken.
        outages.failed(BackendKind::Redis, lock("wrong-type"));
        outages.answered(BackendKind::Redis);
        assert!(woken(&mut wakes).is_empty(), "no retry every probe");
        // Until the probe sees the backend fail: then it is an outage's victim again.
        outages.probe_failed(BackendKind::Redis);
        outages.answered(BackendKind::Redis);
        assert_eq!(woken(&mut wakes), ["wrong-type"]);

        // A clean pass forgets everything about the lock.
        outages.succeeded(BackendKind::Redis, &lock("wrong-type"));
        assert!(outages.to_probe().is_empty());
        assert!(outages.state().is_empty());
    }
}
