//! Leader election on a `coordination.k8s.io/v1` Lease, so that one of several controller
//! replicas reconciles while the others stand by.
//!
//! The algorithm is client-go's, written against kube 5 (the maintained crates either target
//! kube 4 or rely on server-side-apply field ownership and unconditional renewals):
//!
//! - Every write of the Lease is a `PUT` carrying the `resourceVersion` that was read, so two
//!   candidates can never both win: the loser gets `409 Conflict`.
//! - A candidate only takes a Lease held by someone else when the Lease record has not changed
//!   for the holder's `leaseDurationSeconds`, measured on the candidate's own monotonic clock
//!   from when it last saw the record change (no trust in other nodes' wall clocks).
//! - The leader renews every `retry_period`. If it has not renewed successfully within
//!   `renew_deadline` (shorter than the lease duration) it reports "not leader" at that
//!   instant, before any other candidate may take over, and becomes a candidate again.
//! - On shutdown it reports "not leader", then releases the Lease (clears the holder), so a
//!   standby takes over at its next retry instead of waiting for the lease to run out.
//!
//! The state is published on a [`tokio::sync::watch`] channel of `bool` ("am I leader").
//!
//! ```no_run
//! # async fn demo(client: kube::Client) -> Result<(), turnstile_controller::leader::LeaderError> {
//! use turnstile_controller::leader::{self, LeaderConfig};
//! let config = LeaderConfig::from_env(&client)?;
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let elector = leader::run(client, config, async { let _ = stopped.await; })?;
//! let mut is_leader = elector.subscribe();
//! while is_leader.changed().await.is_ok() {
//!     if *is_leader.borrow_and_update() { /* start reconciling */ } else { /* stop at once */ }
//! }
//! # drop(stop); elector.stopped().await; Ok(()) }
//! ```

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use rand::Rng;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, timeout_at, Instant};

use crate::error::ControllerError;

/// Whether this replica may still change anything: checked right before every backend call
/// and every API write, so a replica that loses the Lease stops granting at that instant,
/// even in a pass that was already running (the controllers themselves stop a moment later).
#[derive(Debug, Clone)]
pub struct LeadershipGate {
    is_leader: Option<watch::Receiver<bool>>,
}

impl LeadershipGate {
    /// A gate that is always open (no leader election: the only replica may always write).
    pub fn always_open() -> Self {
        Self { is_leader: None }
    }

    /// A gate open exactly while `is_leader` holds `true` (the elector's channel).
    pub fn following(is_leader: watch::Receiver<bool>) -> Self {
        Self {
            is_leader: Some(is_leader),
        }
    }

    /// Whether writes are allowed right now.
    pub fn is_open(&self) -> bool {
        self.is_leader
            .as_ref()
            .is_none_or(|is_leader| *is_leader.borrow())
    }

    /// `Ok` while writes are allowed, else [`ControllerError::NotLeader`] naming `action`.
    pub fn check(&self, action: &str) -> Result<(), ControllerError> {
        if self.is_open() {
            Ok(())
        } else {
            Err(ControllerError::NotLeader {
                action: action.to_owned(),
            })
        }
    }
}

/// The Lease the controller elects its leader on (the deploy/ RBAC grants exactly this name).
pub const DEFAULT_LEASE_NAME: &str = "turnstile-controller";

/// Environment variable holding the holder identity (the Pod's name, from the downward API).
pub const POD_NAME_ENV: &str = "POD_NAME";

/// Environment variable holding the namespace of the Lease (the Pod's own namespace).
pub const POD_NAMESPACE_ENV: &str = "POD_NAMESPACE";

/// Errors of leader election.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// The settings cannot give a safe election.
    #[error("invalid leader election settings: {0}")]
    InvalidConfig(String),
    /// A call on the Lease failed (network, authorisation, server error).
    #[error("Lease {namespace}/{name}: {source}")]
    Api {
        /// The Lease's namespace.
        namespace: String,
        /// The Lease's name.
        name: String,
        /// What the client reported.
        #[source]
        source: kube::Error,
    },
}

/// How, where and as whom to take part in the election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub lease_name: String,
    /// This replica's holder identity; must be unique among the candidates (the Pod name).
    pub identity: String,
    /// How long a Lease stays valid after its last renewal; standbys take over after it.
    pub lease_duration: Duration,
    /// The leader steps down when it has not renewed for this long (less than
    /// `lease_duration`, so it has stopped before anyone else can start).
    pub renew_deadline: Duration,
    /// Pause between attempts to acquire or renew.
    pub retry_period: Duration,
}

impl LeaderConfig {
    /// Settings with client-go's timings (15 s lease, 10 s renew deadline, 2 s retry)
    /// on [`DEFAULT_LEASE_NAME`].
    pub fn new(namespace: impl Into<String>, identity: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            lease_name: DEFAULT_LEASE_NAME.to_string(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// Settings for a controller Pod: identity from `POD_NAME`, namespace from
    /// `POD_NAMESPACE`. Outside a Pod, the identity is the host name plus a random suffix
    /// (two local processes must not share one) and the namespace the client's default.
    pub fn from_env(client: &Client) -> Result<Self, LeaderError> {
        let identity = match non_empty_env(POD_NAME_ENV) {
            Some(name) => name,
            None => {
                let host = non_empty_env("HOSTNAME").unwrap_or_else(|| "turnstile".to_string());
                format!("{host}-{}", uuid::Uuid::new_v4().simple())
            }
        };
        let namespace = non_empty_env(POD_NAMESPACE_ENV)
            .unwrap_or_else(|| client.default_namespace().to_string());
        let config = Self::new(namespace, identity);
        config.validate()?;
        Ok(config)
    }

    /// Replaces the three timings.
    pub fn with_timings(
        mut self,
        lease_duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
    ) -> Self {
        self.lease_duration = lease_duration;
        self.renew_deadline = renew_deadline;
        self.retry_period = retry_period;
        self
    }

    /// Checks that the settings give a safe election:
    /// `0 < retry_period < renew_deadline < lease_duration`, whole seconds for the lease
    /// duration (the Lease stores seconds), names and identity present.
    pub fn validate(&self) -> Result<(), LeaderError> {
        let invalid = |why: &str| Err(LeaderError::InvalidConfig(why.to_string()));
        if self.identity.is_empty() {
            return invalid("the holder identity is empty");
        }
        if self.namespace.is_empty() || self.lease_name.is_empty() {
            return invalid("the Lease namespace and name must be set");
        }
        if self.retry_period.is_zero() {
            return invalid("retry_period must be positive");
        }
        if self.retry_period >= self.renew_deadline {
            return invalid("retry_period must be shorter than renew_deadline");
        }
        if self.renew_deadline >= self.lease_duration {
            return invalid("renew_deadline must be shorter than lease_duration");
        }
        if self.lease_duration.subsec_nanos() != 0 || self.lease_seconds() <= 0 {
            return invalid("lease_duration must be a whole number of seconds");
        }
        Ok(())
    }

    fn lease_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }
}

fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

/// A running election: the "am I leader" channel and the task behind it.
#[derive(Debug)]
pub struct LeaderElector {
    is_leader: watch::Receiver<bool>,
    task: JoinHandle<()>,
}

impl LeaderElector {
    /// Whether this replica leads right now.
    pub fn is_leader(&self) -> bool {
        *self.is_leader.borrow()
    }

    /// A receiver of the "am I leader" state; `changed()` wakes on every transition.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.is_leader.clone()
    }

    /// Waits until the election has ended after `shutdown`: "not leader" was published and
    /// the Lease released (if this replica held it).
    pub async fn stopped(self) {
        if let Err(error) = self.task.await {
            tracing::error!(%error, "leader election task failed");
        }
    }
}

/// Starts taking part in the election on `config`'s Lease, until `shutdown` completes.
///
/// Complete `shutdown` only once the work guarded by leadership has stopped: the Lease is
/// released right after, and a standby may start at once.
pub fn run<F>(
    client: Client,
    config: LeaderConfig,
    shutdown: F,
) -> Result<LeaderElector, LeaderError>
where
    F: Future<Output = ()> + Send + 'static,
{
    config.validate()?;
    let (sender, is_leader) = watch::channel(false);
    let candidate = Candidate {
        api: Api::namespaced(client, &config.namespace),
        config,
        observed: None,
    };
    let task = tokio::spawn(candidate.campaign(sender, shutdown));
    Ok(LeaderElector { is_leader, task })
}

/// The Lease as last seen, and when it was last seen to change.
#[derive(Debug, Clone)]
struct Observed {
    spec: LeaseSpec,
    changed_at: Instant,
}

/// What one acquire-or-renew attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempt {
    /// This replica holds the Lease (acquired or renewed it).
    Leading,
    /// Someone else holds a Lease that has not run out.
    HeldByOther,
    /// Another writer got there first (409); look again.
    Conflict,
}

/// Why a leader stopped leading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loss {
    /// No successful renewal within the renew deadline.
    RenewDeadline,
    /// Another replica holds the Lease now.
    TakenOver,
}

struct Candidate {
    api: Api<Lease>,
    config: LeaderConfig,
    observed: Option<Observed>,
}

impl Candidate {
    /// The whole life of the election: candidate, leader, candidate again..., until shutdown.
    async fn campaign<F>(mut self, sender: watch::Sender<bool>, shutdown: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        tokio::pin!(shutdown);
        let identity = self.config.identity.clone();
        let lease = self.config.lease_name.clone();
        loop {
            let leading_since = tokio::select! {
                () = &mut shutdown => break,
                since = self.acquire() => since,
            };
            sender.send_replace(true);
            tracing::info!(%identity, %lease, "became leader");
            let loss = tokio::select! {
                () = &mut shutdown => {
                    // Stop the guarded work before anyone else can start it.
                    sender.send_replace(false);
                    self.release().await;
                    return;
                }
                loss = self.keep_renewing(leading_since) => loss,
            };
            sender.send_replace(false);
            tracing::warn!(%identity, %lease, ?loss, "lost leadership; standing by");
        }
        sender.send_replace(false);
    }

    /// Retries until this replica holds the Lease; returns when the winning write was sent.
    async fn acquire(&mut self) -> Instant {
        loop {
            let started = Instant::now();
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Leading) => return started,
                Ok(Attempt::HeldByOther | Attempt::Conflict) => {}
                Err(error) => tracing::warn!(%error, "could not acquire the leader Lease"),
            }
            tokio::time::sleep(self.jittered_retry_period()).await;
        }
    }

    /// Renews every retry period; returns the moment leadership can no longer be trusted.
    async fn keep_renewing(&mut self, mut last_renewal: Instant) -> Loss {
        loop {
            let deadline = last_renewal + self.config.renew_deadline;
            let next = (Instant::now() + self.config.retry_period).min(deadline);
            sleep_until(next).await;
            if Instant::now() >= deadline {
                return Loss::RenewDeadline;
            }
            let started = Instant::now();
            // The attempt is cut at the deadline: a hanging API call must not extend a
            // leadership that may already have passed to someone else.
            match timeout_at(deadline, self.try_acquire_or_renew()).await {
                Err(_elapsed) => return Loss::RenewDeadline,
                Ok(Ok(Attempt::Leading)) => last_renewal = started,
                Ok(Ok(Attempt::HeldByOther)) => return Loss::TakenOver,
                Ok(Ok(Attempt::Conflict)) => {
                    tracing::debug!("conflict renewing the leader Lease; retrying");
                }
                Ok(Err(error)) => tracing::warn!(%error, "could not renew the leader Lease"),
            }
        }
    }

    /// One round of client-go's `tryAcquireOrRenew`.
    async fn try_acquire_or_renew(&mut self) -> Result<Attempt, LeaderError> {
        let now = MicroTime(Timestamp::now());
        let Some(current) = self
            .api
            .get_opt(&self.config.lease_name)
            .await
            .map_err(|e| self.api_error(e))?
        else {
            return self.create(now).await;
        };
        let spec = current.spec.clone().unwrap_or_default();
        let seen_at = Instant::now();
        let observed = match &self.observed {
            Some(previous) if previous.spec == spec => previous.changed_at,
            _ => seen_at,
        };
        self.observed = Some(Observed {
            spec: spec.clone(),
            changed_at: observed,
        });

        let holder = spec
            .holder_identity
            .as_deref()
            .filter(|holder| !holder.is_empty());
        let held_by_me = holder == Some(self.config.identity.as_str());
        if let Some(other) = holder.filter(|_| !held_by_me) {
            let lease_seconds = spec
                .lease_duration_seconds
                .and_then(|seconds| u64::try_from(seconds).ok())
                .unwrap_or(self.config.lease_duration.as_secs());
            if seen_at < observed + Duration::from_secs(lease_seconds) {
                tracing::trace!(holder = other, "leader Lease held by another replica");
                return Ok(Attempt::HeldByOther);
            }
            tracing::info!(holder = other, "leader Lease ran out; taking it over");
        }

        let mut next = spec.clone();
        if !held_by_me {
            next.holder_identity = Some(self.config.identity.clone());
            next.acquire_time = Some(now.clone());
            next.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        }
        next.renew_time = Some(now);
        next.lease_duration_seconds = Some(self.config.lease_seconds());
        let mut replacement = current;
        replacement.spec = Some(next);
        // `replacement` still carries the resourceVersion read above: a concurrent writer
        // makes this PUT fail with 409 instead of being overwritten.
        self.write(replacement).await
    }

    async fn create(&mut self, now: MicroTime) -> Result<Attempt, LeaderError> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.config.lease_name.clone()),
                namespace: Some(self.config.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.config.identity.clone()),
                lease_duration_seconds: Some(self.config.lease_seconds()),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(created) => {
                self.remember(&created);
                Ok(Attempt::Leading)
            }
            Err(kube::Error::Api(status)) if status.is_already_exists() || status.is_conflict() => {
                Ok(Attempt::Conflict)
            }
            Err(error) => Err(self.api_error(error)),
        }
    }

    async fn write(&mut self, lease: Lease) -> Result<Attempt, LeaderError> {
        match self
            .api
            .replace(&self.config.lease_name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => {
                self.remember(&written);
                Ok(Attempt::Leading)
            }
            Err(kube::Error::Api(status)) if status.is_conflict() => Ok(Attempt::Conflict),
            Err(error) => Err(self.api_error(error)),
        }
    }

    /// Our own writes count as changes seen now.
    fn remember(&mut self, lease: &Lease) {
        self.observed = Some(Observed {
            spec: lease.spec.clone().unwrap_or_default(),
            changed_at: Instant::now(),
        });
    }

    /// Clears the holder if it is still this replica, so a standby need not wait out the
    /// lease. Best effort, bounded by the renew deadline: on failure the lease just runs out.
    async fn release(&mut self) {
        let attempt = async {
            let Some(mut lease) = self.api.get_opt(&self.config.lease_name).await? else {
                return Ok(false);
            };
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
                return Ok(false);
            }
            spec.holder_identity = None;
            spec.renew_time = Some(MicroTime(Timestamp::now()));
            self.api
                .replace(&self.config.lease_name, &PostParams::default(), &lease)
                .await
                .map(|_| true)
        };
        match tokio::time::timeout(self.config.renew_deadline, attempt).await {
            Ok(Ok(true)) => {
                tracing::info!(identity = %self.config.identity, "released the leader Lease")
            }
            Ok(Ok(false)) => {}
            Ok(Err(error)) => {
                tracing::warn!(%error, "could not release the leader Lease; it will run out")
            }
            Err(_elapsed) => {
                tracing::warn!("releasing the leader Lease timed out; it will run out")
            }
        }
    }

    /// Candidates spread their attempts (up to +20%) so they do not hit the API in step.
    fn jittered_retry_period(&self) -> Duration {
        let factor = rand::rng().random_range(1.0..1.2);
        self.config.retry_period.mul_f64(factor)
    }

    fn api_error(&self, source: kube::Error) -> LeaderError {
        LeaderError::Api {
            namespace: self.config.namespace.clone(),
            name: self.config.lease_name.clone(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_timings_are_valid() {
        assert!(LeaderConfig::new("ns", "me").validate().is_ok());
        // As the README's High availability section says: renew every 2 s, step down after
        // 10 s without a renewal, before the 15 s lease could be taken.
        let config = LeaderConfig::new("ns", "me");
        assert_eq!(
            (
                config.retry_period,
                config.renew_deadline,
                config.lease_duration
            ),
            (
                Duration::from_secs(2),
                Duration::from_secs(10),
                Duration::from_secs(15)
            )
        );
    }

    #[test]
    fn unsafe_timings_are_rejected() {
        let base = LeaderConfig::new("ns", "me");
        let secs = Duration::from_secs;
        for (lease, deadline, retry) in [
            (secs(10), secs(10), secs(2)),
            (secs(10), secs(12), secs(2)),
            (secs(10), secs(5), secs(5)),
            (secs(10), secs(5), Duration::ZERO),
            (Duration::from_millis(10_500), secs(5), secs(1)),
        ] {
            let config = base.clone().with_timings(lease, deadline, retry);
            assert!(
                matches!(config.validate(), Err(LeaderError::InvalidConfig(_))),
                "accepted lease {lease:?}, deadline {deadline:?}, retry {retry:?}"
            );
        }
    }

    #[test]
    fn an_empty_identity_is_rejected() {
        assert!(LeaderConfig::new("ns", "").validate().is_err());
    }
}
