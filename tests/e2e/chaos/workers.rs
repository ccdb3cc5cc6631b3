//! Workers that behave like Jobs: each creates a claim (plain, or owned by a Pod it creates
//! and marks `Running`), waits on a watch until the claim is `Held`, does a read-modify-write
//! on its lock's register with the claim's fencing token, and gives the grant back (deletes
//! the claim, sets `spec.release`, or ends or deletes its Pod). A plain claim's worker renews
//! `spec.renewTime` while it holds; some stop renewing and sleep past their lease before they
//! write (a paused process), which the fenced register must refuse once a later holder used it.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::Api;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use turnstile_api::{ClaimPhase, LockClaim};

use super::history::{Ending, Event, History};
use super::register::Register;

/// How long a worker waits for `Held` before it gives up (a violation: never served).
const HELD_WITHIN: Duration = Duration::from_secs(120);
/// How long a worker retries one API call that keeps failing (injected faults, restarts).
const RETRY_FOR: Duration = Duration::from_secs(60);

/// What every worker of one lock shares.
#[derive(Clone)]
pub struct Workload {
    pub lock: String,
    pub lease_seconds: i64,
    pub claims: Api<LockClaim>,
    pub pods: Api<Pod>,
    /// None for a semaphore: its holders overlap by design, so a shared read-modify-write
    /// proves nothing there.
    pub register: Option<Register>,
    pub history: History,
    /// Share of plain workers that pause past their lease before they write.
    pub pause_share: f64,
    /// Share of workers whose claim a Pod owns.
    pub pod_share: f64,
    /// Claim names: `<lock>-<seq>`, in creation order.
    pub seq: Arc<AtomicU64>,
}

/// Retries `call` (with a short pause) until it succeeds or [`RETRY_FOR`] has passed; `ok`
/// may accept an error as success (e.g. AlreadyExists after an attempt that got through).
async fn retry<T, F, Fut>(what: &str, ok: fn(&kube::Error) -> bool, mut call: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
    T: Default,
{
    let deadline = Instant::now() + RETRY_FOR;
    loop {
        match call().await {
            Ok(value) => return Some(value),
            Err(error) if ok(&error) => return Some(T::default()),
            Err(error) if Instant::now() > deadline => {
                tracing::warn!(%error, "worker gave up on {what}");
                return None;
            }
            Err(error) => tracing::debug!(%error, "worker retries {what}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn code_is(error: &kube::Error, code: u16) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == code)
}

fn already_exists(error: &kube::Error) -> bool {
    code_is(error, 409) && error.to_string().contains("exists")
}

fn not_found(error: &kube::Error) -> bool {
    code_is(error, 404)
}

fn never(_: &kube::Error) -> bool {
    false
}

/// One job's choices, drawn whole before it starts: the seed decides them, however the job
/// goes (a job that gives up early draws no less).
#[derive(Debug, Clone, PartialEq)]
pub struct Choices {
    /// A Pod owns the claim (it ends with the Pod), or it is a plain claim (renewed).
    pub pod_owned: bool,
    /// A plain claim's worker stops renewing and sleeps past its lease before it writes.
    pub pause: bool,
    /// How long it holds (or, paused, sleeps), in milliseconds.
    pub hold_ms: u64,
    /// Delete (the claim, or its Pod) rather than release (or finish the Pod).
    pub delete: bool,
    /// The wait before the next job, in milliseconds.
    pub gap_ms: u64,
}

/// The seeded choices of one worker's jobs, for a lock of `lease_ms`.
pub fn choices(
    seed: u64,
    pod_share: f64,
    pause_share: f64,
    lease_ms: u64,
) -> impl Iterator<Item = Choices> {
    let mut rng = StdRng::seed_from_u64(seed);
    std::iter::from_fn(move || {
        let pod_owned = rng.random_bool(pod_share);
        let pause = rng.random_bool(pause_share) && !pod_owned;
        let paused_ms = lease_ms + rng.random_range(4_000..6_000);
        let held_ms = rng.random_range(50..lease_ms * 3 / 2);
        Some(Choices {
            pod_owned,
            pause,
            hold_ms: if pause { paused_ms } else { held_ms },
            delete: rng.random_bool(0.5),
            gap_ms: rng.random_range(0..400),
        })
    })
}

/// The fault a worker plays on itself: a holder paused past its lease (a stopped process).
pub const PAUSED: &str = "worker paused past its lease";

/// The claim of a [`PAUSED`] fault's detail.
pub fn paused_claim(detail: &str) -> Option<&str> {
    detail.split_once(" sleeps ").map(|(claim, _)| claim)
}

impl Workload {
    /// Runs jobs one after another until the load is `over` (the run ends it once its
    /// faults are done: their number, not a clock, decides).
    pub async fn run_worker(self, seed: u64, over: Arc<AtomicBool>) {
        let lease_ms = (self.lease_seconds * 1000) as u64;
        for choices in choices(seed, self.pod_share, self.pause_share, lease_ms) {
            if over.load(Ordering::SeqCst) {
                break;
            }
            self.job(&choices).await;
            // Time: the workload's pace, a gap between one worker's claims.
            tokio::time::sleep(Duration::from_millis(choices.gap_ms)).await;
        }
    }

    async fn job(&self, choices: &Choices) {
        let seq = self.seq.fetch_add(1, Ordering::SeqCst);
        let name = format!("{}-{seq:05}", self.lock);
        let pod_owned = choices.pod_owned;
        let Some(claim) = self.create(&name, pod_owned).await else {
            return;
        };
        self.history.record(Event::Created {
            lock: self.lock.clone(),
            claim: claim.clone(),
            pod_owned,
        });
        let Some(token) = self.wait_held(&claim).await else {
            self.history.record(Event::Ended {
                claim: claim.clone(),
                ending: Ending::GaveUp,
            });
            self.delete_claim(&claim).await;
            return;
        };
        self.history.record(Event::SawHeld {
            claim: claim.clone(),
            token,
        });
        let pause = choices.pause;
        let renewer = (!pod_owned).then(|| self.renew_while_held(&claim));
        let read = self.register.as_ref().and_then(|r| r.read(&claim, token));
        if pause {
            if let Some(renewer) = &renewer {
                renewer.abort();
            }
            let sleep = choices.hold_ms;
            self.history.record(Event::Fault {
                kind: PAUSED.into(),
                detail: format!("{claim} sleeps {sleep} ms without renewing"),
            });
            // Time: the fault is a holder paused past its lease.
            tokio::time::sleep(Duration::from_millis(sleep)).await;
        } else {
            // Time: the holder works for its hold time before it releases.
            tokio::time::sleep(Duration::from_millis(choices.hold_ms)).await;
        }
        if let (Some(register), Some(read)) = (&self.register, read) {
            register.write_next(&claim, token, read);
        }
        if let Some(renewer) = renewer {
            renewer.abort();
        }
        self.end(&claim, pod_owned, choices.delete).await;
    }

    /// Creates the claim (and its Running Pod); returns its name.
    async fn create(&self, name: &str, pod_owned: bool) -> Option<String> {
        let mut owner = None;
        if pod_owned {
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"containers": [{"name": "job", "image": "busybox"}]}
            }))
            .expect("pod");
            create(&self.pods, &pod).await?;
            let running = Patch::Merge(json!({"status": {"phase": "Running"}}));
            let params = PatchParams::default();
            let pod = retry("start pod", never, || {
                self.pods.patch_status(name, &params, &running)
            })
            .await?;
            owner = Some(json!([{"apiVersion": "v1", "kind": "Pod", "name": name,
                "uid": pod.metadata.uid, "controller": true}]));
        }
        let mut claim = json!({
            "apiVersion": "turnstile.dev/v1alpha1", "kind": "LockClaim",
            "metadata": {"name": name},
            "spec": {"lockName": self.lock},
        });
        if let Some(owner) = owner {
            claim["metadata"]["ownerReferences"] = owner;
        }
        let claim: LockClaim = serde_json::from_value(claim).expect("claim");
        create(&self.claims, &claim).await?;
        Some(name.to_owned())
    }

    /// Watches the claim until it is `Held`; its token, or None (terminal, or too long).
    async fn wait_held(&self, claim: &str) -> Option<i64> {
        let deadline = Instant::now() + HELD_WITHIN;
        let settled = |c: Option<&LockClaim>| {
            c.and_then(|c| c.status.as_ref())
                .and_then(|s| s.phase)
                .is_some_and(|p| p == ClaimPhase::Held || p.is_terminal())
        };
        while Instant::now() < deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            let wait = await_condition(self.claims.clone(), claim, settled);
            match tokio::time::timeout(left, wait).await {
                Ok(Ok(Some(found))) => {
                    let status = found.status.unwrap_or_default();
                    return (status.phase == Some(ClaimPhase::Held))
                        .then_some(status.fencing_token)
                        .flatten();
                }
                Ok(Ok(None)) => return None,
                Ok(Err(error)) => {
                    tracing::debug!(%error, "claim watch failed; watching again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(_) => break,
            }
        }
        None
    }

    /// Bumps `spec.renewTime` every third of the lease until aborted.
    fn renew_while_held(&self, claim: &str) -> tokio::task::JoinHandle<()> {
        let claims = self.claims.clone();
        let claim = claim.to_owned();
        let every = Duration::from_millis((self.lease_seconds * 1000 / 3) as u64);
        tokio::spawn(async move {
            loop {
                // Time: a holder renews every third of its lease: the cadence is the behaviour.
                tokio::time::sleep(every).await;
                let stamp = k8s_openapi::jiff::Timestamp::now().to_string();
                let patch = json!({"spec": {"renewTime": stamp}});
                if let Err(error) = claims
                    .patch(&claim, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    tracing::debug!(%error, %claim, "renewal failed");
                }
            }
        })
    }

    async fn end(&self, claim: &str, pod_owned: bool, delete: bool) {
        let ending = match (pod_owned, delete) {
            (false, true) => Ending::Delete,
            (false, false) => Ending::Release,
            (true, true) => Ending::PodSucceeded,
            (true, false) => Ending::PodDeleted,
        };
        self.history.record(Event::Ended {
            claim: claim.to_owned(),
            ending,
        });
        match ending {
            Ending::Release => {
                let release = json!({"spec": {"release": true}});
                merge_patch("release", &self.claims, claim, &release).await;
            }
            Ending::PodSucceeded => {
                let done = json!({"status": {"phase": "Succeeded"}});
                merge_patch("finish pod", &self.pods, claim, &done).await;
            }
            Ending::PodDeleted => self.delete_pod(claim).await,
            Ending::Delete | Ending::GaveUp => self.delete_claim(claim).await,
        }
    }

    async fn delete_claim(&self, claim: &str) {
        delete(&self.claims, claim).await;
    }

    async fn delete_pod(&self, pod: &str) {
        delete(&self.pods, pod).await;
    }
}

/// Deletes `name` (retrying; gone already is fine).
async fn delete<K>(api: &Api<K>, name: &str)
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    retry("delete", not_found, || async {
        api.delete(name, &DeleteParams::default()).await.map(|_| ())
    })
    .await;
}

/// Merge-patches `name` with `patch`, its status if `patch` sets only `status` (retrying;
/// gone already is fine).
async fn merge_patch<K>(what: &str, api: &Api<K>, name: &str, patch: &serde_json::Value)
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let status_only = patch
        .as_object()
        .is_some_and(|fields| fields.len() == 1 && fields.contains_key("status"));
    let (params, patch) = (PatchParams::default(), Patch::Merge(patch));
    retry(what, not_found, || async {
        if status_only {
            api.patch_status(name, &params, &patch).await.map(|_| ())
        } else {
            api.patch(name, &params, &patch).await.map(|_| ())
        }
    })
    .await;
}

/// Creates `object` (retrying; AlreadyExists after an attempt that got through is fine).
async fn create<K>(api: &Api<K>, object: &K) -> Option<()>
where
    K: Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    retry("create", already_exists, || async {
        api.create(&PostParams::default(), object).await.map(|_| ())
    })
    .await
}
