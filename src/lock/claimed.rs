//! `turnstile lock --lock NAME`: hold a DistributedLock through the operator, with nothing
//! but the Kubernetes API.
//!
//! A LockClaim is created for this one command (`<lock>-<random>`, lease `--ttl`), and the
//! command runs once the controller shows it `Held`, with `TURNSTILE_FENCING_TOKEN`. While it
//! runs the lease is renewed through `spec.renewTime` every ttl/3, and the claim is watched: if
//! it stops being `Held` (expired, released, deleted, its lock deleted) — or no renewal has
//! reached the API server for a whole lease — the command is stopped as on a lost backend
//! lock. When the command ends, the claim is deleted, which hands the lock on at once.
//!
//! The claim is deliberately not owned by the Pod turnstile runs in: the controller renews a
//! Pod-owned claim for as long as the Pod runs, so a `turnstile lock` killed inside a
//! long-running container would leave the lock held until the Pod ended. With a lease of its
//! own, the lock is free at most `--ttl` after turnstile is gone, as with a backend lock.

use std::pin::pin;
use std::time::Duration;

use futures::future::{FusedFuture, FutureExt};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::ResourceExt;
use tokio::time::Instant;

use super::child::{self, Supervised};
use super::signals::TerminationSignals;
use super::{
    command_ended, exit_code, pass_on, renewal_interval, spawn_failure, stop_after_loss, LockArgs,
    WhenBusy,
};
use crate::exit_codes;
use crate::oneshot::{namespace_apis, Outcome};
use crate::wait::{assess, describe, Verdict};
use turnstile_api::error_chain;
use turnstile_api::{
    reasons, ClaimMode, ClaimPhase, ClusterDistributedLock, LockClaim, LockClaimSpec,
};

/// Longest pause between watch retries after errors.
const MAX_WATCH_BACKOFF: Duration = Duration::from_secs(5);

/// How long turnstile tries to delete its claim once the command has ended, before it leaves
/// the claim to its lease.
const DELETE_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs `turnstile lock --lock NAME` (see the module docs) and says how it ended; the claim
/// is deleted before it returns.
pub async fn lock_through_claim(args: &LockArgs, signals: &mut TerminationSignals) -> Outcome {
    let Some(lock) = args.lock.as_deref() else {
        return Outcome::with_reason(
            exit_codes::USAGE,
            "give --backend and a KEY, or --lock NAME",
        );
    };
    let (namespace, locks, claims) =
        match namespace_apis(args.namespace.as_deref(), exit_code::BACKEND_UNAVAILABLE).await {
            Ok(apis) => apis,
            Err(outcome) => return outcome,
        };
    let unreachable = |what: &str, error: &kube::Error| {
        Outcome::with_reason(
            exit_code::BACKEND_UNAVAILABLE,
            format!("cannot {what}: {}", error_chain(error)),
        )
    };
    // Checked first, so that a typo does not leave a claim behind.
    let (found, kind) = match args.cluster {
        true => {
            let cluster_locks: Api<ClusterDistributedLock> = Api::all(locks.into_client());
            let found = cluster_locks.get_opt(lock).await.map(|lock| lock.is_some());
            (found, "ClusterDistributedLock")
        }
        false => (
            locks.get_opt(lock).await.map(|lock| lock.is_some()),
            "DistributedLock",
        ),
    };
    match found {
        Ok(true) => {}
        Ok(false) if args.cluster => {
            return Outcome::with_reason(
                exit_codes::USAGE,
                format!("ClusterDistributedLock {lock} does not exist"),
            )
        }
        Ok(false) => {
            return Outcome::with_reason(
                exit_codes::USAGE,
                format!("DistributedLock {lock} does not exist in namespace {namespace}"),
            )
        }
        Err(error) => return unreachable(&format!("read {kind} {lock}"), &error),
    }
    let claim = match claims
        .create(&PostParams::default(), &new_claim(lock, args))
        .await
    {
        Ok(claim) => claim,
        Err(error) => return unreachable("create a LockClaim", &error),
    };
    let name = claim.name_any();
    tracing::info!(claim = %name, %namespace, lock, "claim created");
    let holding = Holding {
        args,
        claims: &claims,
        name: &name,
        lock,
    };
    let outcome = holding.acquire_and_run(signals).await;
    // Deleting hands the lock on at once (the controller's finalizer releases the grant).
    // Bounded: the client retries a 503 for minutes, and the lease ends the claim anyway.
    match tokio::time::timeout(
        DELETE_TIMEOUT,
        claims.delete(&name, &DeleteParams::default()),
    )
    .await
    {
        Ok(Ok(_)) => {}
        Ok(Err(kube::Error::Api(status))) if status.code == 404 => {}
        Ok(Err(error)) => {
            tracing::warn!(claim = %name, error = %error_chain(&error), "could not delete the claim; its lease will run out");
        }
        Err(_) => {
            tracing::warn!(claim = %name, timeout_s = DELETE_TIMEOUT.as_secs(), "the claim's deletion did not complete; its lease will run out");
        }
    }
    outcome
}

/// The claim for one run of the command: its lease is `--ttl`, renewed by turnstile.
fn new_claim(lock: &str, args: &LockArgs) -> LockClaim {
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let name = format!("{}-{}", truncate(lock, 240), &suffix[..8]);
    let mut spec = match args.cluster {
        true => LockClaimSpec::for_cluster_lock(lock),
        false => LockClaimSpec::for_lock(lock),
    };
    spec.lease_duration_seconds =
        Some(i64::try_from(args.ttl.as_secs().max(1)).unwrap_or(i64::MAX));
    spec.priority = (args.priority != 0).then_some(args.priority);
    spec.holder_identity = Some(holder_identity());
    spec.mode = if args.shared {
        Some(ClaimMode::Shared)
    } else if args.exclusive {
        Some(ClaimMode::Exclusive)
    } else {
        None
    };
    if args.when_busy != WhenBusy::Wait {
        spec.when_busy = Some(args.when_busy.policy());
    }
    spec.group = args.group.clone();
    spec.renew_time = Some(Time(Timestamp::now()));
    // The controller's finalizer from the start: one controller write to `Held`.
    LockClaim::new(&name, spec).with_release_finalizer()
}

/// `<pod or host>/<pid>`: which process holds the lock, for `kubectl get` and `turnstile queue`.
fn holder_identity() -> String {
    let host = ["POD_NAME", "HOSTNAME"]
        .iter()
        .find_map(|variable| {
            std::env::var(variable)
                .ok()
                .filter(|value| !value.is_empty())
        })
        .unwrap_or_else(|| "turnstile-lock".to_owned());
    format!("{}/{}", truncate(&host, 200), std::process::id())
}

fn truncate(text: &str, chars: usize) -> &str {
    text.char_indices()
        .nth(chars)
        .map_or(text, |(index, _)| &text[..index])
}

/// One run of the command under one claim.
struct Holding<'a> {
    args: &'a LockArgs,
    claims: &'a Api<LockClaim>,
    name: &'a str,
    lock: &'a str,
}

/// What the claim's watch says, as far as a holder cares.
enum Seen {
    /// Granted, with this fencing token.
    Held(u64),
    /// Still queued.
    Waiting,
    /// It will not be (or is no longer) held: why.
    Over(String),
    /// It ended before its grant because the lock was busy (`--when-busy fail`) or a newer
    /// run of its group replaced it: why.
    NotGranted(String),
}

impl Holding<'_> {
    /// Waits for `Held` (per `--wait`, giving up on a signal), then runs the command.
    async fn acquire_and_run(&self, signals: &mut TerminationSignals) -> Outcome {
        let mut updates = pin!(self.watch());
        let deadline = self.args.wait.map(|wait| Instant::now() + wait);
        let token = loop {
            let timeout = async {
                match deadline {
                    Some(deadline) => tokio::time::sleep_until(deadline).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                seen = updates.next() => match seen {
                    Some(Seen::Held(token)) => break token,
                    Some(Seen::Waiting) => {}
                    Some(Seen::NotGranted(why)) => {
                        return Outcome::with_reason(
                            exit_code::NOT_ACQUIRED,
                            format!("lock {} was not granted: LockClaim {} {why}", self.lock, self.name),
                        )
                    }
                    Some(Seen::Over(why)) => {
                        return Outcome::with_reason(
                            exit_code::BACKEND_UNAVAILABLE,
                            format!("lock {} was not granted: LockClaim {} {why}", self.lock, self.name),
                        )
                    }
                    None => return self.watch_ended(),
                },
                () = timeout => {
                    return Outcome::with_reason(
                        exit_code::NOT_ACQUIRED,
                        format!(
                            "could not get lock {} within {}",
                            self.lock,
                            humantime::format_duration(self.args.wait.unwrap_or_default())
                        ),
                    )
                }
                signal = signals.recv() => {
                    return Outcome::with_reason(
                        child::signal_exit_code(signal as i32),
                        format!("{signal} received while waiting for lock {}; gave up", self.lock),
                    )
                }
            }
        };
        tracing::info!(claim = %self.name, lock = %self.lock, fencing_token = token, "lock acquired");
        self.run(token, &mut updates, signals).await
    }

    /// Runs the command with `token`, renewing the lease, until it ends or the claim is lost.
    async fn run(
        &self,
        token: u64,
        updates: &mut (impl futures::Stream<Item = Seen> + Unpin),
        signals: &mut TerminationSignals,
    ) -> Outcome {
        let env = [
            ("TURNSTILE_FENCING_TOKEN", token.to_string()),
            ("TURNSTILE_LOCK_NAME", self.lock.to_owned()),
            ("TURNSTILE_LOCK_CLAIM", self.name.to_owned()),
        ];
        let mut command = match Supervised::spawn(&self.args.command, &env) {
            Ok(command) => command,
            Err(error) => return spawn_failure(&self.args.command, &error),
        };
        let what = format!("lock {} (fencing token {token})", self.lock);
        let period = renewal_interval(self.args.ttl);
        let mut renew = tokio::time::interval_at(Instant::now() + period, period);
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The lease as the API server last confirmed it: past this, the controller has ended it.
        // Until the first renewal (sent at once) gets through: the grant, seen just now, counted
        // from the start of this second, as the controller counts it (whole seconds).
        let mut lease_ends = lease_counted_from(Timestamp::now(), Instant::now()) + self.args.ttl;
        // The renewal in flight is polled beside everything else, never awaited inside a
        // branch: against an API server answering 503 the client retries one request for
        // minutes, and the lease's end, the command's end and signals must not wait for it.
        let mut renewal = pin!(self.renew().fuse());
        loop {
            tokio::select! {
                status = command.wait() => return command_ended(status),
                signal = signals.recv() => pass_on(&mut command, signal),
                renewed = &mut renewal => match renewed {
                    Ok(stamped) => lease_ends = stamped + self.args.ttl,
                    Err(error) => tracing::warn!(claim = %self.name, error = %error_chain(&error), "renewal failed; retrying"),
                },
                _ = renew.tick(), if renewal.is_terminated() => renewal.set(self.renew().fuse()),
                () = tokio::time::sleep_until(lease_ends) => {
                    return stop_after_loss(self.args, &what, &mut command, &"no renewal reached the API server for a whole lease").await;
                }
                seen = updates.next() => match seen {
                    Some(Seen::Held(_) | Seen::Waiting) => {}
                    Some(Seen::Over(why) | Seen::NotGranted(why)) => {
                        return stop_after_loss(self.args, &what, &mut command, &format!("LockClaim {} {why}", self.name)).await;
                    }
                    None => {
                        return stop_after_loss(self.args, &what, &mut command, &"the claim's watch ended").await;
                    }
                },
            }
        }
    }

    /// Moves `spec.renewTime` to now: the controller extends the grant by a lease from there.
    /// Returns the instant the new lease is counted from, by this process's clock.
    async fn renew(&self) -> Result<Instant, kube::Error> {
        let (stamp, at) = (Timestamp::now(), Instant::now());
        let patch = serde_json::json!({"spec": {"renewTime": Time(stamp)}});
        self.claims
            .patch(self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(lease_counted_from(stamp, at))
    }

    /// The claim's states as the watch shows them; watch errors are retried with backoff.
    fn watch(&self) -> impl futures::Stream<Item = Seen> + '_ {
        let updates = watcher::watch_object(self.claims.clone(), self.name);
        futures::stream::unfold(
            (Box::pin(updates), Duration::from_millis(100)),
            |(mut updates, mut backoff)| async move {
                loop {
                    let seen = match updates.next().await? {
                        Ok(Some(claim)) => seen(&claim),
                        Ok(None) => Seen::Over("was deleted".to_owned()),
                        Err(error) => {
                            tracing::warn!(error = %error_chain(&error), retry_in_ms = backoff.as_millis() as u64, "claim watch failed; retrying");
                            tokio::time::sleep(backoff).await;
                            backoff = (backoff * 2).min(MAX_WATCH_BACKOFF);
                            continue;
                        }
                    };
                    return Some((seen, (updates, Duration::from_millis(100))));
                }
            },
        )
    }

    fn watch_ended(&self) -> Outcome {
        Outcome::with_reason(
            exit_code::INTERNAL,
            format!("the watch of LockClaim {} ended unexpectedly", self.name),
        )
    }
}

fn seen(claim: &LockClaim) -> Seen {
    match assess(claim) {
        Verdict::Held { fencing_token } => Seen::Held(fencing_token),
        Verdict::Waiting => Seen::Waiting,
        Verdict::LockMissing => Seen::Over("names a lock that does not exist".to_owned()),
        // Busy (`--when-busy fail`) or replaced by a newer run of its group: not acquired.
        Verdict::Ended {
            phase: ClaimPhase::Failed,
        } if claim
            .status
            .as_ref()
            .and_then(|status| status.reason.as_deref())
            .is_some_and(|reason| [reasons::LOCK_BUSY, reasons::SUPERSEDED].contains(&reason)) =>
        {
            Seen::NotGranted(format!("is {}", describe(claim)))
        }
        Verdict::Ended { .. } | Verdict::Deleting => Seen::Over(format!("is {}", describe(claim))),
    }
}

/// The instant a lease stamped `stamp` (taken at `at`) is counted from: the controller counts
/// `renewTime` and grants in whole seconds, so from the start of the stamp's second — not from
/// when the request was answered, which may be much later (the client retries a 503 for a
/// while), nor from the stamp itself (up to a second later than the controller's count).
fn lease_counted_from(stamp: Timestamp, at: Instant) -> Instant {
    let into_second = u64::try_from(stamp.subsec_nanosecond()).unwrap_or(0);
    at.checked_sub(Duration::from_nanos(into_second))
        .unwrap_or(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_counts_from_the_start_of_its_stamps_second() {
        let at = Instant::now() + Duration::from_secs(5);
        let stamp = Timestamp::new(1_800_000_000, 900_000_000).expect("valid timestamp");
        assert_eq!(
            lease_counted_from(stamp, at),
            at - Duration::from_millis(900)
        );
        let whole = Timestamp::new(1_800_000_000, 0).expect("valid timestamp");
        assert_eq!(lease_counted_from(whole, at), at);
    }
}
