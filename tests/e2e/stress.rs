//! A bounded concurrent stress run: workers create, release, renew and delete claims on a
//! semaphore while the controller restarts and writes fail now and then; a monitor counts
//! every sample with more holders than `maxHolders` and every new holder whose token is not
//! above all earlier ones. Both counts must be zero, and the queue must drain.

use crate::support;

use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use support::{phase_of, Env, HolderMonitor};
use turnstile_api::ClaimPhase;

const WORKERS: usize = 3;
const CLAIMS_PER_WORKER: usize = 8;
const MAX_HOLDERS: usize = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_never_exceed_max_holders_nor_reuse_tokens() {
    let mut env =
        Env::fake_only_started("it compacts its store and closes the watches on cue").await;
    env.apply_lock("pool", "maxHolders: 2\nleaseDurationSeconds: 3");
    let monitor = HolderMonitor::start(&env, "pool", MAX_HOLDERS);
    let claims = env.claims();

    let mut workers = Vec::new();
    for worker in 0..WORKERS {
        let claims = claims.clone();
        workers.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(worker as u64);
            for round in 0..CLAIMS_PER_WORKER {
                let name = format!("w{worker}-{round}");
                let claim: turnstile_api::LockClaim = serde_json::from_value(serde_json::json!({
                    "apiVersion": "turnstile.dev/v1alpha1",
                    "kind": "LockClaim",
                    "metadata": {"name": name},
                    "spec": {"lockName": "pool"}
                }))
                .expect("claim");
                // Injected faults hit the workers too: retry as any client would.
                let mut attempts = 0;
                while let Err(error) = claims.create(&Default::default(), &claim).await {
                    attempts += 1;
                    assert!(attempts < 20, "create {name}: {error}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                // Time: random holding times are the stress.
                tokio::time::sleep(Duration::from_millis(rng.random_range(50..400))).await;
                // Some holders release, some renew, some are deleted, some just expire.
                let patch = match rng.random_range(0..4) {
                    0 => Some(serde_json::json!({"spec": {"release": true}})),
                    1 => Some(serde_json::json!({"spec": {"renewTime":
                        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                            k8s_openapi::jiff::Timestamp::now())}})),
                    2 => {
                        let _ = claims.delete(&name, &Default::default()).await;
                        None
                    }
                    _ => None,
                };
                if let Some(patch) = patch {
                    let _ = claims
                        .patch(
                            &name,
                            &kube::api::PatchParams::default(),
                            &kube::api::Patch::Merge(&patch),
                        )
                        .await;
                }
            }
        }));
    }

    // Meanwhile: write faults, a forced relist and a controller restart.
    tokio::time::sleep(Duration::from_millis(700)).await;
    env.server()
        .inject_faults(&env.turnstile_path("lockclaims"), 4, 409);
    tokio::time::sleep(Duration::from_millis(700)).await;
    env.server().compact();
    env.server().close_watches();
    tokio::time::sleep(Duration::from_millis(700)).await;
    env.stop_controller().await;
    env.start_default_controller();
    env.server()
        .inject_faults(&env.turnstile_path("distributedlocks"), 2, 500);
    for worker in workers {
        worker.await.expect("worker");
    }

    // Every claim ends: granted claims release, expire or go; none is left waiting.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let list = claims.list(&Default::default()).await.expect("list");
        let open = list
            .items
            .iter()
            .filter(|claim| {
                matches!(
                    phase_of(claim),
                    None | Some(ClaimPhase::Pending) | Some(ClaimPhase::Held)
                )
            })
            .count();
        if open == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{open} claims never finished");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let report = monitor.finish().await;
    assert!(
        report.grants.len() >= 2,
        "the run granted too little to mean anything: {report:?}"
    );
    println!(
        "stress: {} samples, {} grants, 0 violations",
        report.samples,
        report.grants.len()
    );
    env.stop_controller().await;
}
