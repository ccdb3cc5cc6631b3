//! Graceful shutdown of the real `turnstile run` binary: on SIGTERM a leading replica stops
//! reconciling, steps down from its Lease (so a standby can take over at once) and exits 0,
//! leaving every grant it wrote intact — also while a pass is stuck in the client's retries of
//! an API server answering 503 (abandoned after the shutdown grace, well within the
//! Deployment's 30 s).

use crate::support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use support::{phase_of, token_of, Env};
use turnstile_api::{ClaimPhase, LockClaim};
use turnstile_controller::leader::DEFAULT_LEASE_NAME;

const IDENTITY: &str = "turnstile-shutdown-test";

/// Kills the controller on drop, so a failing assertion never leaves it running.
struct Controller(Child);

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_controller(env: &Env) -> Controller {
    let child = Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .args(["run", "--leader-elect", "--namespace", &env.namespace])
        .env("KUBECONFIG", &env.kubeconfig)
        .env("POD_NAME", IDENTITY)
        .env("POD_NAMESPACE", &env.namespace)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn turnstile run");
    Controller(child)
}

/// The fake (it fails the lease renewals on cue), a spawned `turnstile run` and its claim
/// `first` on lock `db`, once held.
async fn first_claim_held() -> (Env, Controller, LockClaim) {
    let env = Env::fake_only("it fails requests on cue").await;
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.apply_claim("first", "db", "");
    let controller = spawn_controller(&env);
    let held = env.wait_phase("first", ClaimPhase::Held).await;
    (env, controller, held)
}

async fn lease_holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt(DEFAULT_LEASE_NAME)
        .await
        .expect("read lease")
        .and_then(|lease| lease.spec)
        .and_then(|spec| spec.holder_identity)
}

/// Sends SIGTERM and waits (at most 30 s, the Deployment's grace period) for a clean exit;
/// returns how long it took.
async fn sigterm_and_wait(controller: &mut Controller) -> Duration {
    let pid = Pid::from_raw(i32::try_from(controller.0.id()).expect("pid fits"));
    let sent = Instant::now();
    kill(pid, Signal::SIGTERM).expect("send SIGTERM");
    let deadline = sent + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = controller.0.try_wait().expect("poll controller") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "turnstile run did not exit within 30 s of SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "turnstile run exited with {status}");
    sent.elapsed()
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_steps_down_from_the_lease_and_keeps_the_grants() {
    let (env, mut controller, held) = first_claim_held().await;
    let token = token_of(&held);
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.namespace);
    assert_eq!(lease_holder(&leases).await.as_deref(), Some(IDENTITY));

    sigterm_and_wait(&mut controller).await;

    // Stepped down: the Lease names no holder, so a standby takes over without waiting for it
    // to run out.
    assert_eq!(lease_holder(&leases).await, None);
    // Nothing half-written: the grant is as it was.
    let after = env.claim("first").await;
    assert_eq!(phase_of(&after), Some(ClaimPhase::Held));
    assert_eq!(token_of(&after), token);
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_during_a_pass_stuck_in_api_retries_still_exits_in_time() {
    let (env, mut controller, _) = first_claim_held().await;

    // Every write to claim `second` answers 503, which the client retries for minutes: the
    // pass that adds its finalizer is stuck.
    let second = env.turnstile_path("lockclaims/second");
    env.server().inject_faults(&second, 100_000, 503);
    env.apply_claim("second", "db", "");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !env
        .server()
        .request_log()
        .iter()
        .any(|request| request.injected_fault && request.path.starts_with(&second))
    {
        assert!(
            Instant::now() < deadline,
            "the controller never wrote to second"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let took = sigterm_and_wait(&mut controller).await;
    println!("exited {took:?} after SIGTERM with a pass stuck in retries");
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.namespace);
    assert_eq!(lease_holder(&leases).await, None, "stepped down");
    assert_eq!(phase_of(&env.claim("first").await), Some(ClaimPhase::Held));
}
