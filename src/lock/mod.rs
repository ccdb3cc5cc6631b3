//! `turnstile lock`: run a command while holding a lock directly on a backend, like `flock`
//! across machines.
//!
//! ```text
//! turnstile lock --backend redis://redis:6379 nightly-report --ttl 30s -- ./report.sh
//! ```
//!
//! The lock is acquired (waiting per `--wait`, default forever), the command runs with
//! `TURNSTILE_FENCING_TOKEN` and `TURNSTILE_LOCK_KEY` in its environment, the lease is renewed
//! every ttl/3, and the lock is released when the command exits. If the lease is lost (the
//! backend no longer has it, or renewals failed until it ran out), the command is stopped —
//! SIGTERM, then SIGKILL after `--grace` — because its critical section is no longer
//! protected. SIGTERM and SIGINT sent to turnstile are passed on to the command.
//!
//! Exit codes: see [`exit_codes::lock`].

mod backend_url;
mod child;
mod claimed;
mod renewal;
mod signals;

use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;

use crate::exit_codes::{self, lock as exit_code};
use crate::oneshot::{init_logging, Outcome};
use turnstile_api::error_chain;
use turnstile_api::BusyPolicy;
use turnstile_lock::{Backend, Lock, LockError, Locker, RetryPolicy};

pub use self::backend_url::{BackendUrl, BackendUrlError};
pub use self::child::{shell_exit_code, Stopped, Supervised};
pub use self::renewal::{keep_renewed, renewal_interval, Loss};
pub use self::signals::TerminationSignals;

/// Flags of `turnstile lock`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = exit_code::help())]
pub struct LockArgs {
    // This comment is the flag's --help text, where the brackets are literal (not doc links).
    #[allow(rustdoc::broken_intra_doc_links)]
    /// Backend holding the lock: redis://[USER:PASSWORD@]HOST:PORT[/DB], rediss://… (TLS; CA
    /// and client certificate from TURNSTILE_REDIS_CA_FILE, TURNSTILE_REDIS_CLIENT_CERT,
    /// TURNSTILE_REDIS_CLIENT_KEY), redis+cluster://HOST1:PORT1,HOST2:PORT2 (Redis Cluster),
    /// redis+sentinel://S1:PORT1,S2:PORT2/MASTERNAME (Redis Sentinel; any Redis form but the
    /// cluster ones takes ?min_replica_acks=N[&replica_ack_timeout_ms=MS]), mongodb://…,
    /// mongodb+srv://…, etcd://[USER:PASSWORD@]HOST1:PORT1,HOST2:PORT2 or etcds://… (TLS; CA
    /// and client certificate from TURNSTILE_ETCD_CA_FILE, TURNSTILE_ETCD_CLIENT_CERT,
    /// TURNSTILE_ETCD_CLIENT_KEY) (memory is refused: no other process could see the lock).
    #[arg(
        long,
        env = "TURNSTILE_BACKEND_URL",
        hide_env_values = true,
        value_parser = BackendUrl::parse,
        required_unless_present = "lock",
        conflicts_with = "lock"
    )]
    pub backend: Option<BackendUrl>,
    /// The lock's key in the backend; `<namespace>/<name or spec.key>` is the key of a
    /// DistributedLock on the same backend, shared with its claims.
    #[arg(required_unless_present = "lock", conflicts_with = "lock")]
    pub key: Option<String>,
    /// Instead of a backend: hold this DistributedLock through the operator, with a LockClaim
    /// created for the command and deleted when it ends (needs only the Kubernetes API).
    #[arg(long, value_name = "NAME", conflicts_with_all = ["max_holders", "max_hold", "lock_delay"])]
    pub lock: Option<String>,
    /// With --lock: --lock names a ClusterDistributedLock (one lock for the namespaces it
    /// selects); the claim is made in the namespace below.
    #[arg(long, requires = "lock")]
    pub cluster: bool,
    /// With --lock: the namespace of the DistributedLock (of the claim, with --cluster);
    /// default: the Pod's (POD_NAMESPACE), else the kubeconfig's.
    #[arg(long, short = 'n', env = "POD_NAMESPACE", requires = "lock")]
    pub namespace: Option<String>,
    /// Lease length; renewed every ttl/3 while the command runs (e.g. 30s, 2m).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub ttl: Duration,
    /// How long to wait for the lock (e.g. 0s, 10s, 5m); default: forever.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub wait: Option<Duration>,
    /// Holders admitted at once, of any mode (with --shared: a counting semaphore or the
    /// readers of a read/write lock). A new value takes effect at the next grant.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_holders: u32,
    /// Hold the lock shared: together with other shared holders, up to --max-holders (the
    /// default when --max-holders is above 1: a counting semaphore).
    #[arg(long, conflicts_with = "exclusive")]
    pub shared: bool,
    /// Hold the lock alone, whatever --max-holders says (the writer of a read/write lock;
    /// the default for a mutex).
    #[arg(long)]
    pub exclusive: bool,
    /// Queue priority: higher is served first, first come first served within one priority.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub priority: i32,
    /// Longest the lock may be held, renewals included (seconds, or e.g. 90s, 5m); the
    /// command is stopped when it runs out, as on a lost lock.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    pub max_hold: Option<Duration>,
    /// If the lease is lost (expiry, max hold), nobody gets the lock for this long after
    /// (seconds, or e.g. 500ms); a normal release hands it on at once.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    pub lock_delay: Option<Duration>,
    /// With --lock: what to do when the lock is busy: `wait` (queue), `fail` (exit 75 at
    /// once, never queued), `replace-pending` (queue, and end the older waiting runs of
    /// --group), `cancel-in-progress` (also end the grant of --group's older holder, whose
    /// command is stopped as on a lost lock).
    #[arg(long, value_enum, default_value_t = WhenBusy::Wait, requires = "lock")]
    pub when_busy: WhenBusy,
    /// With --lock: the run's concurrency group (a branch, an environment), which
    /// replace-pending and cancel-in-progress need.
    #[arg(
        long,
        requires = "lock",
        required_if_eq_any = [("when_busy", "replace-pending"), ("when_busy", "cancel-in-progress")]
    )]
    pub group: Option<String>,
    /// After a lost lock, how long the command has between SIGTERM and SIGKILL.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub grace: Duration,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// `--when-busy`: the claim's `spec.whenBusy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WhenBusy {
    /// Queue until granted.
    Wait,
    /// Do not queue: exit 75 when the lock cannot be granted at once.
    Fail,
    /// Queue, ending the older waiting runs of the group.
    ReplacePending,
    /// Queue, ending the older waiting runs of the group and its older holder's grant.
    CancelInProgress,
}

impl WhenBusy {
    /// The claim's policy.
    pub fn policy(self) -> BusyPolicy {
        match self {
            Self::Wait => BusyPolicy::Wait,
            Self::Fail => BusyPolicy::Fail,
            Self::ReplacePending => BusyPolicy::ReplacePending,
            Self::CancelInProgress => BusyPolicy::CancelInProgress,
        }
    }
}

/// A duration in seconds (`90`, `1.5`) or humantime form (`90s`, `500ms`, `5m`).
fn parse_seconds(value: &str) -> Result<Duration, String> {
    match value.parse::<f64>() {
        Ok(seconds) => Duration::try_from_secs_f64(seconds).map_err(|error| error.to_string()),
        Err(_) => humantime::parse_duration(value).map_err(|error| error.to_string()),
    }
}

/// The retry policy for `--wait`: forever when absent, a single attempt for zero.
fn retry_policy(wait: Option<Duration>) -> RetryPolicy {
    match wait {
        None => RetryPolicy::forever(),
        Some(wait) if wait.is_zero() => RetryPolicy::no_retry(),
        Some(wait) => RetryPolicy::new().total_time(wait),
    }
}

/// Runs `turnstile lock` and says how it ended. Everything (child process, lock, queue place)
/// is cleaned up before it returns.
pub async fn lock_command(args: LockArgs) -> Outcome {
    init_logging();
    // Caught before acquiring, so a SIGTERM while waiting still leaves the queue cleanly.
    let mut signals = match TerminationSignals::catch() {
        Ok(signals) => signals,
        Err(error) => {
            return Outcome::with_reason(
                exit_code::INTERNAL,
                format!("cannot catch SIGTERM/SIGINT: {error}"),
            )
        }
    };
    let (Some(backend_url), Some(key)) = (args.backend.clone(), args.key.clone()) else {
        return claimed::lock_through_claim(&args, &mut signals).await;
    };
    let backend = match backend_url.connect().await {
        Ok(backend) => backend,
        Err(error) => {
            return Outcome::cannot(
                exit_code::BACKEND_UNAVAILABLE,
                format!("connect to the {} backend", backend_url.kind()),
                &error,
            )
        }
    };
    let lock = match acquire(&args, &key, backend, &mut signals).await {
        Ok(lock) => lock,
        Err(outcome) => return outcome,
    };
    tracing::info!(%key, fencing_token = lock.fencing_token(), "lock acquired");
    let outcome = hold(&args, &key, &lock, &mut signals).await;
    // A lost grant is not released: it has ended in the backend (or ends there at its lease
    // or maximum hold, which turnstile's own clock may reach a moment earlier), and a release
    // would hand the key on at once, cancelling the `--lock-delay` an involuntary end owes.
    if outcome.code != exit_code::LOCK_LOST {
        if let Err(error) = lock.release().await {
            tracing::warn!(%key, fencing_token = lock.fencing_token(), error = %error_chain(&error), "release failed; the lease will run out");
        }
    }
    outcome
}

/// Acquires the lock per `--wait`, or gives up on a termination signal (leaving the queue).
async fn acquire(
    args: &LockArgs,
    key: &str,
    backend: Arc<dyn Backend>,
    signals: &mut TerminationSignals,
) -> Result<Lock, Outcome> {
    // An explicit owner token, so that the queue place can be cleaned up here if we give up.
    let owner = uuid::Uuid::new_v4().simple().to_string();
    let mut request = Locker::from_arc(Arc::clone(&backend))
        .lock(key, args.ttl)
        .max_holders(args.max_holders)
        .priority(args.priority)
        .lock_delay(args.lock_delay.unwrap_or_default())
        .owner(owner.as_str())
        .retry(retry_policy(args.wait));
    if args.shared {
        request = request.shared();
    } else if args.exclusive {
        request = request.exclusive();
    }
    if let Some(max_hold) = args.max_hold {
        request = request.max_hold(max_hold);
    }
    let result = tokio::select! {
        result = request.acquire() => result,
        signal = signals.recv() => {
            // Dropping the acquire only schedules its cleanup; the process is about to exit.
            if let Err(error) = backend.release(key, &owner, args.max_holders).await {
                tracing::warn!(%key, error = %error_chain(&error), "could not leave the lock's queue; the place will age out");
            }
            return Err(Outcome::with_reason(
                child::signal_exit_code(signal as i32),
                format!("{signal} received while waiting for lock {key:?}; gave up"),
            ));
        }
    };
    result.map_err(|error| match error {
        LockError::Timeout { elapsed, .. } => Outcome::with_reason(
            exit_code::NOT_ACQUIRED,
            format!(
                "could not get lock {key:?} within {} (waited {})",
                humantime::format_duration(args.wait.unwrap_or_default()),
                humantime::format_duration(Duration::from_millis(elapsed.as_millis() as u64)),
            ),
        ),
        LockError::InvalidArgument(message) => Outcome::with_reason(exit_codes::USAGE, message),
        LockError::BackendUnavailable { .. } => Outcome::cannot(
            exit_code::BACKEND_UNAVAILABLE,
            format!("acquire lock {key:?}"),
            &error,
        ),
        LockError::LockLost { .. } => {
            Outcome::cannot(exit_code::INTERNAL, format!("acquire lock {key:?}"), &error)
        }
    })
}

/// Runs the command while keeping the lease alive; stops it if the lease is lost.
async fn hold(
    args: &LockArgs,
    key: &str,
    lock: &Lock,
    signals: &mut TerminationSignals,
) -> Outcome {
    let env = [
        ("TURNSTILE_FENCING_TOKEN", lock.fencing_token().to_string()),
        ("TURNSTILE_LOCK_KEY", key.to_owned()),
    ];
    let mut command = match Supervised::spawn(&args.command, &env) {
        Ok(command) => command,
        Err(error) => return spawn_failure(&args.command, &error),
    };
    tracing::debug!(pid = command.pid(), %key, "command started");
    let renewing = keep_renewed(lock, renewal_interval(args.ttl));
    tokio::pin!(renewing);
    loop {
        tokio::select! {
            status = command.wait() => return command_ended(status),
            signal = signals.recv() => pass_on(&mut command, signal),
            loss = &mut renewing => {
                let what = format!("lock {key:?} (fencing token {})", lock.fencing_token());
                return stop_after_loss(args, &what, &mut command, &loss).await;
            }
        }
    }
}

/// The outcome of a command that ended by itself: its exit status, as a shell reports it.
fn command_ended(status: std::io::Result<std::process::ExitStatus>) -> Outcome {
    match status {
        Ok(status) => Outcome::quiet(shell_exit_code(status)),
        Err(error) => Outcome::with_reason(
            exit_code::INTERNAL,
            format!("lost track of the command: {error}"),
        ),
    }
}

/// Passes a termination signal sent to turnstile on to the command.
fn pass_on(command: &mut Supervised, signal: nix::sys::signal::Signal) {
    tracing::info!(%signal, pid = command.pid(), "passing the signal on to the command");
    command.signal(signal);
}

/// Stops the command after `what` (the lock and its token) was lost and says so.
async fn stop_after_loss(
    args: &LockArgs,
    what: &str,
    command: &mut Supervised,
    loss: &dyn std::fmt::Display,
) -> Outcome {
    // Info, not warn: the outcome line on stderr reports it once the command has stopped.
    tracing::info!(lost = what, %loss, "lock lost; stopping the command");
    let how = match command.stop(args.grace).await {
        Ok(Stopped { killed: false, .. }) => "stopped the command (SIGTERM)".to_owned(),
        Ok(Stopped { killed: true, .. }) => format!(
            "killed the command (SIGKILL after {} grace)",
            humantime::format_duration(args.grace)
        ),
        Err(error) => format!("could not confirm the command stopped: {error}"),
    };
    Outcome::with_reason(exit_code::LOCK_LOST, format!("lost {what}: {loss}; {how}"))
}

/// Shell-like outcome of a command that could not be started.
fn spawn_failure(command: &[OsString], error: &std::io::Error) -> Outcome {
    let program = command
        .first()
        .map(|program| program.to_string_lossy().into_owned())
        .unwrap_or_default();
    let code = match error.kind() {
        std::io::ErrorKind::NotFound => exit_code::COMMAND_NOT_FOUND,
        _ => exit_code::CANNOT_EXECUTE,
    };
    Outcome::with_reason(code, format!("cannot run {program:?}: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::ParseFlags;

    #[test]
    fn parses_durations_and_the_command_after_the_separator() {
        let args = LockArgs::parse_flags(&[
            "--backend",
            "redis://h:6379",
            "jobs",
            "--ttl",
            "2m",
            "--wait",
            "1h30m",
            "--max-holders",
            "3",
            "--",
            "sh",
            "-c",
            "echo --ttl",
        ])
        .unwrap();
        assert_eq!(args.key.as_deref(), Some("jobs"));
        assert_eq!(args.ttl, Duration::from_secs(120));
        assert_eq!(args.wait, Some(Duration::from_secs(5400)));
        assert_eq!(args.max_holders, 3);
        assert_eq!(args.grace, Duration::from_secs(10));
        assert_eq!(args.command, ["sh", "-c", "echo --ttl"]);
    }

    #[test]
    fn parses_the_lock_semantics_flags() {
        let args = LockArgs::parse_flags(&[
            "--backend",
            "redis://h",
            "k",
            "--shared",
            "--priority",
            "-3",
            "--max-hold",
            "1.5",
            "--lock-delay",
            "500ms",
            "--",
            "true",
        ])
        .unwrap();
        assert!(args.shared);
        assert_eq!(args.priority, -3);
        assert_eq!(args.max_hold, Some(Duration::from_millis(1500)));
        assert_eq!(args.lock_delay, Some(Duration::from_millis(500)));
        let defaults =
            LockArgs::parse_flags(&["--backend", "redis://h", "k", "--", "true"]).unwrap();
        assert!(!defaults.shared);
        assert_eq!(
            (defaults.priority, defaults.max_hold, defaults.lock_delay),
            (0, None, None)
        );
        assert!(LockArgs::parse_flags(&[
            "--backend",
            "redis://h",
            "k",
            "--max-hold",
            "-1",
            "--",
            "true"
        ])
        .is_err());
    }

    #[test]
    fn refuses_memory_zero_holders_bad_durations_and_a_missing_command() {
        let memory =
            LockArgs::parse_flags(&["--backend", "memory", "k", "--", "true"]).unwrap_err();
        assert!(memory.to_string().contains("memory backend"), "{memory}");
        assert!(LockArgs::parse_flags(&[
            "--backend",
            "redis://h",
            "k",
            "--max-holders",
            "0",
            "--",
            "true"
        ])
        .is_err());
        assert!(LockArgs::parse_flags(&[
            "--backend",
            "redis://h",
            "k",
            "--ttl",
            "soon",
            "--",
            "true"
        ])
        .is_err());
        assert!(LockArgs::parse_flags(&["--backend", "redis://h", "k"]).is_err());
    }

    #[test]
    fn an_internal_failure_exits_70_and_a_finished_command_with_its_status() {
        // Losing track of the child (waitpid failing) is turnstile's own failure.
        let lost = command_ended(Err(std::io::Error::other("waitpid failed")));
        assert_eq!(lost.code, exit_code::INTERNAL);
        assert_eq!(exit_code::INTERNAL, 70);
        assert!(lost
            .reason
            .unwrap_or_default()
            .contains("lost track of the command"));
        let done = command_ended(Ok(std::os::unix::process::ExitStatusExt::from_raw(3 << 8)));
        assert_eq!(
            (done.code, done.reason),
            (3, None),
            "the command's own exit, silently"
        );
    }

    #[test]
    fn defaults_durations_and_the_shared_exclusive_conflict_are_as_the_help_says() {
        let defaults =
            LockArgs::parse_flags(&["--backend", "redis://h", "k", "--", "true"]).unwrap();
        assert_eq!(
            defaults.ttl,
            Duration::from_secs(30),
            "--ttl defaults to 30s"
        );
        assert_eq!(defaults.max_holders, 1, "--max-holders defaults to 1");
        assert_eq!(defaults.wait, None, "--wait: forever");
        let both = [
            "--backend",
            "redis://h",
            "k",
            "--shared",
            "--exclusive",
            "--",
            "true",
        ];
        let conflict = LockArgs::parse_flags(&both).unwrap_err();
        assert_eq!(
            conflict.kind(),
            clap::error::ErrorKind::ArgumentConflict,
            "{conflict}"
        );
        // Seconds (whole or fractional) or a duration, for both flags.
        for (value, want) in [
            ("90", Duration::from_secs(90)),
            ("1.5", Duration::from_millis(1500)),
            ("90s", Duration::from_secs(90)),
            ("500ms", Duration::from_millis(500)),
            ("5m", Duration::from_secs(300)),
        ] {
            for flag in ["--max-hold", "--lock-delay"] {
                let args = LockArgs::parse_flags(&[
                    "--backend",
                    "redis://h",
                    "k",
                    flag,
                    value,
                    "--",
                    "true",
                ])
                .unwrap_or_else(|error| panic!("{flag} {value}: {error}"));
                let got = if flag == "--max-hold" {
                    args.max_hold
                } else {
                    args.lock_delay
                };
                assert_eq!(got, Some(want), "{flag} {value}");
            }
        }
    }

    #[test]
    fn wait_flag_maps_to_the_retry_policy() {
        assert_eq!(retry_policy(None).fail_after_limit(), None);
        let zero = format!("{:?}", retry_policy(Some(Duration::ZERO)));
        assert!(zero.contains("retry_times: Some(0)"), "{zero}");
        let bounded = format!("{:?}", retry_policy(Some(Duration::from_secs(5))));
        assert!(bounded.contains("total_time: Some(5s)"), "{bounded}");
        let forever = format!("{:?}", retry_policy(None));
        assert!(forever.contains("total_time: None"), "{forever}");
    }
}
