//! [`Env`]'s reads and waits: a claim, lock or Event reaching a state within [`WAIT`], and the
//! writes that move one on (release, renew, delete).

use super::*;

/// The name prefix of [`Env::after_a_pass_over`]'s marker claims.
pub const MARKER_PREFIX: &str = "marker-";

/// Whether `claim` is one of [`Env::after_a_pass_over`]'s marker claims (a test that counts
/// claims leaves them out).
pub fn is_marker(claim: &LockClaim) -> bool {
    claim
        .metadata
        .name
        .as_deref()
        .is_some_and(|name| name.starts_with(MARKER_PREFIX))
}

impl Env {
    /// Returns once the controller has run a pass over each of `locks` since this call: the
    /// positive sign a test waits for before it asserts that nothing changed (a bare sleep
    /// would pass against a controller that is merely slow or stuck).
    ///
    /// The sign is a marker claim, created withdrawn (`spec.release: true`: it never queues,
    /// holds, or moves anyone's position), which only a pass over its lock ends (`Released`,
    /// reason `Withdrawn`); that pass read every change to the lock's claims made before the
    /// marker, since one watch delivers a kind's changes in the order they were made.
    pub async fn after_a_pass_over(&self, locks: &[&str]) {
        for lock in locks {
            let marker = format!("marker-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
            self.apply_claim(&marker, lock, "release: true");
            self.wait_claim(&marker, |claim| {
                reason_of(claim).as_deref() == Some(turnstile_api::reasons::WITHDRAWN)
            })
            .await;
        }
    }

    /// Waits until claim `name` satisfies `done`; panics with its last state after [`WAIT`].
    pub async fn wait_claim(&self, name: &str, done: impl Fn(&LockClaim) -> bool) -> LockClaim {
        wait_object(self.claims(), name, done).await
    }

    /// Waits until claim `name` reports `reason`, and checks that it is `Pending` then.
    pub async fn wait_pending_for(&self, name: &str, reason: &str) -> LockClaim {
        let claim = self
            .wait_claim(name, |c| reason_of(c).as_deref() == Some(reason))
            .await;
        assert_eq!(
            phase_of(&claim),
            Some(ClaimPhase::Pending),
            "{name} waits ({reason})"
        );
        claim
    }

    /// Waits until claim `name` is in `phase`.
    pub async fn wait_phase(&self, name: &str, phase: ClaimPhase) -> LockClaim {
        self.wait_claim(name, |claim| phase_of(claim) == Some(phase))
            .await
    }

    /// Waits for each of the claims `names` in turn until it is `Held`.
    pub async fn wait_held(&self, names: &[&str]) {
        for name in names {
            self.wait_phase(name, ClaimPhase::Held).await;
        }
    }

    /// Waits until lock `name` satisfies `done`.
    pub async fn wait_lock(
        &self,
        name: &str,
        done: impl Fn(&DistributedLock) -> bool,
    ) -> DistributedLock {
        wait_object(self.locks(), name, done).await
    }

    /// Waits until lock `name`'s `Ready` condition has `status` ("True"/"False"); returns it.
    pub async fn wait_ready(&self, name: &str, status: &str) -> Condition {
        let ready = |lock: &DistributedLock| {
            lock.status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
                .filter(|c| c.status == status)
                .cloned()
        };
        let lock = self.wait_lock(name, |lock| ready(lock).is_some()).await;
        ready(&lock).expect("Ready condition")
    }

    /// Waits until claim `name` is gone.
    pub async fn wait_gone(&self, name: &str) {
        wait_absent(self.claims(), "claim", name).await
    }

    /// Waits until lock `name` is gone.
    pub async fn wait_lock_gone(&self, name: &str) {
        wait_absent(self.locks(), "lock", name).await
    }

    /// Deletes a claim (returns at once; the finalizer may keep it a moment).
    pub async fn delete_claim(&self, name: &str) {
        self.claims()
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete claim");
    }

    /// Merge-patches a claim's spec (what a holder does to renew or release).
    pub async fn patch_claim_spec(&self, name: &str, spec: serde_json::Value) {
        self.claims()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "spec": spec })),
            )
            .await
            .expect("patch claim");
    }

    /// Renews claim `name` as its holder does: `renewTime` set to now.
    pub async fn renew(&self, name: &str) {
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        );
        self.patch_claim_spec(name, json!({ "renewTime": now }))
            .await;
    }

    /// Reasons of the Events about object `name` in the test namespace, oldest first.
    pub async fn event_reasons(&self, name: &str) -> Vec<String> {
        let found = self.events_about(name).await;
        found.into_iter().filter_map(|event| event.reason).collect()
    }

    /// The Events about the object `name` in the test namespace, oldest first.
    pub async fn events_about(&self, name: &str) -> Vec<k8s_openapi::api::events::v1::Event> {
        let mut found: Vec<_> = self
            .events()
            .await
            .into_iter()
            .filter(|event| event.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .collect();
        found.sort_by_key(|event| event.event_time.as_ref().map(|t| t.0));
        found
    }

    /// All Events in the test namespace.
    pub async fn events(&self) -> Vec<k8s_openapi::api::events::v1::Event> {
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.client.clone(), &self.namespace);
        events
            .list(&Default::default())
            .await
            .expect("list events")
            .items
    }

    /// Waits until an Event with `reason` about `name` exists.
    pub async fn wait_event(&self, name: &str, reason: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            let reasons = self.event_reasons(name).await;
            if reasons.iter().any(|r| r == reason) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no {reason} Event about {name}; got {reasons:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// How many times the one Event with `reason` about `name` has been said (its series'
    /// count; 0 while there is none); fails if there is more than one such Event.
    pub async fn event_said(&self, name: &str, reason: &str) -> i32 {
        let said: Vec<_> = self
            .events_about(name)
            .await
            .into_iter()
            .filter(|event| event.reason.as_deref() == Some(reason))
            .collect();
        assert!(said.len() <= 1, "{reason} said as several Events: {said:?}");
        said.first()
            .map_or(0, |event| event.series.as_ref().map_or(1, |s| s.count))
    }

    /// How many times the Event with `reason` about `name` has been said, once that count has
    /// stayed the same for `quiet` (passes still under way may say it again); panics after
    /// [`WAIT`].
    pub async fn event_said_settled(&self, name: &str, reason: &str, quiet: Duration) -> i32 {
        let deadline = Instant::now() + WAIT;
        let mut last = self.event_said(name, reason).await;
        loop {
            // Time: the count staying the same for `quiet` is what settled means.
            tokio::time::sleep(quiet).await;
            let now = self.event_said(name, reason).await;
            if now == last {
                return now;
            }
            assert!(
                Instant::now() < deadline,
                "{reason} about {name} never settled (now said {now} times)"
            );
            last = now;
        }
    }

    /// Waits until the one Event with `reason` about `name` has been said `count` times (its
    /// series' count); fails at once if there is more than one such Event.
    pub async fn wait_event_said(&self, name: &str, reason: &str, count: i32) {
        let deadline = Instant::now() + WAIT;
        loop {
            let times = self.event_said(name, reason).await;
            if times == count {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{reason} about {name} never said {count} times (said {times})"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Polls `name` in `api` until it exists and satisfies `done`; panics with its last state
/// after [`WAIT`].
pub async fn wait_object<K>(api: Api<K>, name: &str, done: impl Fn(&K) -> bool) -> K
where
    K: Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let deadline = Instant::now() + WAIT;
    loop {
        let current = api.get_opt(name).await.expect("get");
        if let Some(object) = &current {
            if done(object) {
                return object.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "{name} never reached the expected state; last: {current:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `name` (a `kind`, for the message) is gone from `api`; panics after [`WAIT`].
async fn wait_absent<K>(api: Api<K>, kind: &str, name: &str)
where
    K: Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let deadline = Instant::now() + WAIT;
    while api.get_opt(name).await.expect("get").is_some() {
        assert!(Instant::now() < deadline, "{kind} {name} never went away");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
