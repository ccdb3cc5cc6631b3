//! End to end: every example in `examples/` is applied with `kubectl` while the controller runs,
//! on the real control plane; the tests that run an init container as a process stay on the
//! fake API server and play the Job controller and the kubelet in step with it (they create
//! the Job's Pods and set their status through `/status`), and
//! `gated_jobs_run_one_at_a_time_through_the_real_job_controller` runs the gated-Job example
//! through the real Job controller and KWOK:
//!
//! - `kubectl-wait-job.yaml`: the init container's bash script runs as written (stock
//!   `kubectl apply` + `kubectl wait --for=condition=Held`) with the Pod's env vars; a second
//!   Pod's script waits until the first Pod finishes;
//! - `wait-init-container.yaml`: the init container's `turnstile wait --create` runs as the
//!   built binary with the Pod's env vars and arguments; likewise a second Pod waits;
//! - `gated-job.yaml`: the Job is un-suspended only once its claim is `Held` (a sampler counts
//!   violations), carries the token, and a second gated Job stays suspended until the first
//!   completes; a suspended Job without the annotation is left alone;
//! - `lock.yaml` and `claims.yaml`: the queue of three;
//! - `multi-lock.yaml`: two claims on both locks, named in opposite orders, hold them in turn;
//! - `lock-in-a-container.yaml`: the container's script runs with the built binary on PATH for
//!   the Job's two Pods at once: the step under `turnstile lock --lock` runs in one Pod at a
//!   time, tokens 1 and 2, and no claim is left behind;
//! - `priority-and-limits.yaml`: the priority claim is granted next, the maximum hold and
//!   lock-delay are on the lock;
//! - `gated-deployment.yaml`: the fake serves no `apps/v1`, so the test is the ReplicaSet and
//!   makes each replica from the Pod template: they are let go one at a time, each with the
//!   next token in its annotation;
//! - `cronjobs-sharing-a-lock.yaml`: the test is the CronJob controller (four runs of the two
//!   CronJobs due at once, made from their job templates) and the Job controller: the runs go
//!   one at a time, tokens increasing, a failed run handing on as a completed one does.
//!
//! The fake serves no RBAC kinds, so `Role`/`RoleBinding` documents are skipped, and kubectl's
//! client-side validation is off (`--validate=false`: it cannot validate the `batch` group
//! against the fake's minimal OpenAPI). Each kubectl gets its own `--cache-dir`
//! (`KUBECACHEDIR` for the scripts).

use crate::support;
mod fixture;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{json, Value};
use support::actor::tagged_client;
use support::jobs::{finish_job, has_condition, is_suspended, jobs, wait_job};
use support::json::strings_of;
use support::pods::{pods, set_pod_phase};
use support::{lock_tokens, phase_of, position_of, token_annotation, token_of, Env, WAIT};
use tokio::io::AsyncWriteExt;
use tokio::process::Command;
use turnstile_api::{ClaimPhase, LockClaim, LOCK_ANNOTATION};

use fixture::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claims_example_queues_three_claims() {
    let (mut env, _scratch, _) = Scratch::with_example("claims.yaml").await;
    let a = env.wait_phase("job-a", ClaimPhase::Held).await;
    env.wait_claim("job-b", |c| position_of(c) == Some(1)).await;
    env.wait_claim("job-c", |c| position_of(c) == Some(2)).await;
    env.patch_claim_spec("job-a", json!({"release": true}))
        .await;
    let b = env.wait_phase("job-b", ClaimPhase::Held).await;
    assert!(token_of(&b) > token_of(&a));
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_multi_lock_example_grants_both_locks_to_one_claim_at_a_time() {
    let (mut env, scratch) = Scratch::started().await;
    scratch
        .apply(&env, &documents(&example("multi-lock.yaml")))
        .await;
    let first = env.wait_phase("move-tenant-42", ClaimPhase::Held).await;
    assert_eq!(
        lock_tokens(&first),
        [("billing-db".to_owned(), 1), ("tenants-db".to_owned(), 1)]
    );
    // The other claim waits, holding nothing (its status may come a pass later).
    let second = env
        .wait_phase("rebill-tenant-42", ClaimPhase::Pending)
        .await;
    assert!(lock_tokens(&second).is_empty(), "{second:?}");
    assert_eq!(
        phase_of(&env.claim("move-tenant-42").await),
        Some(ClaimPhase::Held)
    );
    env.patch_claim_spec("move-tenant-42", json!({"release": true}))
        .await;
    let second = env.wait_phase("rebill-tenant-42", ClaimPhase::Held).await;
    assert_eq!(
        lock_tokens(&second),
        [("billing-db".to_owned(), 2), ("tenants-db".to_owned(), 2)]
    );
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_in_a_container_example_runs_one_step_at_a_time_across_pods() {
    let (mut env, scratch, docs) = Scratch::with_example("lock-in-a-container.yaml").await;
    let job = find(&docs, "Job");
    let container = &job["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["command"][0], "sh");
    let script = container["command"][2].as_str().expect("script").to_owned();
    // The script as written, `turnstile` on PATH as in the app image, the Pod's env vars as the
    // downward API gives them.
    let binary_dir = Path::new(env!("CARGO_BIN_EXE_turnstile"))
        .parent()
        .expect("binary dir")
        .to_owned();
    let path = format!(
        "{}:{}",
        binary_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let run = |pod: &str| {
        scratch
            .in_pod("sh", pod)
            .arg("-c")
            .arg(&script)
            .env("PATH", &path)
            .env("POD_NAMESPACE", &env.namespace)
            .spawn()
            .expect("run the container's script")
    };
    // The Job's two Pods at once: one writes while the other waits at the lock.
    let first = run("report-writer-aaaaa");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let second = run("report-writer-bbbbb");
    let ((first_code, first_out, first_err), (second_code, second_out, second_err)) =
        tokio::join!(finished(first), finished(second));
    assert_eq!(first_code, Some(0), "{first_out}{first_err}");
    assert_eq!(second_code, Some(0), "{second_out}{second_err}");
    let token = |out: &str| -> i64 {
        out.lines()
            .find_map(|line| line.strip_prefix("step 2: writing under fencing token "))
            .and_then(|token| token.trim().parse().ok())
            .unwrap_or_else(|| panic!("no token in {out}"))
    };
    let mut tokens = [token(&first_out), token(&second_out)];
    tokens.sort();
    assert_eq!(tokens, [1, 2], "one after the other");
    for out in [&first_out, &second_out] {
        assert!(out.contains("step 3: lock handed on (exit 0)"), "{out}");
    }
    // Each step's claim was deleted as its command ended; it goes once the controller has
    // released it (its finalizer).
    let deadline = Instant::now() + WAIT;
    loop {
        let left = env.claims().list(&Default::default()).await.expect("list");
        let lingering: Vec<_> = left
            .items
            .iter()
            .filter(|claim| claim.metadata.deletion_timestamp.is_none())
            .collect();
        assert!(lingering.is_empty(), "claims left behind: {lingering:?}");
        if left.items.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "deleted claims never went: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_priority_example_serves_the_hotfix_first() {
    let (mut env, scratch) = Scratch::started().await;
    // The lock and current first, so that current finds the lock free whatever the timing;
    // then the waiters (see the example's comment).
    let all = documents(&example("priority-and-limits.yaml"));
    let (lock_and_current, waiters) = all.split_at(2);
    scratch.apply(&env, lock_and_current).await;
    env.wait_phase("current", ClaimPhase::Held).await;
    scratch.apply(&env, waiters).await;
    for (claim, position) in [("hotfix", 1), ("nightly", 2), ("weekly", 3)] {
        env.wait_claim(claim, |c| position_of(c) == Some(position))
            .await;
    }
    env.delete_claim("current").await;
    env.wait_phase("hotfix", ClaimPhase::Held).await;
    let lock = env.kubectl(&["get", "distributedlock", "deploys", "-o", "json"]);
    let lock: serde_json::Value = serde_json::from_str(&lock).expect("lock JSON");
    assert_eq!(lock["spec"]["maxHoldSeconds"], 1800);
    assert_eq!(lock["spec"]["lockDelaySeconds"], 15);
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_init_container_example_runs_turnstile_wait_as_the_pod_would() {
    let (mut env, scratch, docs) =
        Scratch::with_example_playing_the_kubelet("wait-init-container.yaml").await;
    let init = init_container(&docs, "db-migrate");
    assert_eq!(
        strings_of(&init["env"], "name"),
        ["POD_NAME", "POD_NAMESPACE", "POD_UID"]
    );

    // The container's args, expanded by "the kubelet", the token file on a scratch path.
    let namespace = env.namespace.clone();
    let spawn_init = |pod: &str, uid: &str| {
        let token_file = scratch.file(&format!("{pod}.token"));
        let args: Vec<String> = init["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|arg| {
                arg.as_str()
                    .expect("arg")
                    .replace("$(POD_NAME)", pod)
                    .replace("/turnstile/token", &token_file.display().to_string())
            })
            .collect();
        let child = scratch
            .in_pod(env!("CARGO_BIN_EXE_turnstile"), pod)
            .args(&args)
            .env("POD_NAMESPACE", &namespace)
            .env("POD_UID", uid)
            .spawn()
            .expect("run turnstile wait");
        (child, token_file)
    };

    let first = "db-migrate-aaaaa";
    let (uid, claim, _) = first_pod_takes_the_lock(&env, "db-migrate", first, &spawn_init).await;
    // Owned by the Pod, as the downward API said.
    let owner = &claim.metadata.owner_references.as_ref().expect("owner")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Pod", uid.as_str())
    );
    // The first Pod is deleted (e.g. evicted): its claim goes with it.
    let delete_first = async {
        pods(&env)
            .delete(first, &Default::default())
            .await
            .expect("delete pod");
    };
    second_pod_waits_for_the_first(
        &env,
        "db-migrate",
        "db-migrate-bbbbb",
        &spawn_init,
        token_of(&claim).expect("token"),
        delete_first,
    )
    .await;
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubectl_wait_job_example_gates_its_pods_one_at_a_time() {
    let (mut env, scratch, docs) =
        Scratch::with_example_playing_the_kubelet("kubectl-wait-job.yaml").await;
    let init = init_container(&docs, "nightly-report");
    assert_eq!(init["command"], json!(["/bin/bash", "-c"]));

    let spawn_init = |pod: &str, uid: &str| spawn_kubectl_wait_script(&scratch, init, pod, uid);

    let first = "nightly-report-aaaaa";
    let (_, claim, stdout) =
        first_pod_takes_the_lock(&env, "nightly-report", first, &spawn_init).await;
    let first_token = token_of(&claim).expect("token");
    assert!(stdout.contains(&format!("held with fencing token {first_token}")));
    // The first Pod succeeds.
    second_pod_waits_for_the_first(
        &env,
        "nightly-report",
        "nightly-report-bbbbb",
        &spawn_init,
        first_token,
        set_pod_phase(&env, first, "Succeeded"),
    )
    .await;
    let released = env.claim(&format!("{first}-{LOCK}")).await;
    assert_eq!(phase_of(&released), Some(ClaimPhase::Released));
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubectl_wait_script_uses_exactly_the_verbs_of_its_role() {
    // No controller: the test plays it (and the kubelet) through a client of its own, so
    // every other request in the fake's log is the script's kubectl.
    let env = Env::fake_only("its request log shows each verb the script used").await;
    let scratch = Scratch::new(&env);
    let docs = documents(&example("kubectl-wait-job.yaml"));
    let init = init_container(&docs, "nightly-report");
    let as_test = tagged_client(env.server(), "test");
    let claims: Api<LockClaim> = Api::namespaced(as_test.clone(), &env.namespace);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "nightly-report-aaaaa"},
        "spec": {"containers": [{"name": "report", "image": "busybox"}]}
    }))
    .expect("pod");
    let pod = Api::<Pod>::namespaced(as_test, &env.namespace)
        .create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    let (name, uid) = (pod.metadata.name.unwrap(), pod.metadata.uid.unwrap());
    let claim = format!("{name}-{LOCK}");
    env.server().clear_request_log();

    let (waiting, token_file) = spawn_kubectl_wait_script(&scratch, init, &name, &uid);
    let deadline = Instant::now() + WAIT;
    while claims.get_opt(&claim).await.expect("get claim").is_none() {
        assert!(Instant::now() < deadline, "the script created no claim");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let held = json!({"status": {"phase": "Held", "fencingToken": 5, "conditions": [{
        "type": turnstile_api::HELD_CONDITION, "status": "True",
        "reason": turnstile_api::reasons::ACQUIRED, "message": "granted",
        "lastTransitionTime": now}]}});
    claims
        .patch_status(&claim, &PatchParams::default(), &Patch::Merge(&held))
        .await
        .expect("mark held");
    let (code, stdout, stderr) = finished(waiting).await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert_eq!(std::fs::read_to_string(&token_file).expect("token"), "5");
    // Restarted (restartPolicy: OnFailure): the same claim is applied again, found Held.
    let (again, _) = spawn_kubectl_wait_script(&scratch, init, &name, &uid);
    let (code, stdout, stderr) = finished(again).await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");

    let log = env.server().request_log();
    let script: Vec<_> = log
        .into_iter()
        .filter(|request| !support::actor::sent_by(request, "test"))
        .collect();
    let used = fake_apiserver::rbac_summary(&script);
    let on_claims = used
        .get(&("turnstile.dev".to_owned(), "lockclaims".to_owned()))
        .cloned()
        .unwrap_or_default();
    let granted = lockclaim_verbs(&docs, "turnstile-kubectl-wait");
    assert_eq!(
        used.keys().filter(|(group, _)| !group.is_empty()).count(),
        1,
        "nothing but lockclaims: {used:?}"
    );
    let readme: BTreeSet<String> = ["get", "list", "watch", "create"].map(String::from).into();
    assert_eq!(
        on_claims, readme,
        "what the script used, against the README's list"
    );
    assert_eq!(granted, readme, "the example's Role");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_or_expired_claim_leaves_kubectl_wait_waiting_until_its_timeout() {
    // kubectl wait knows only "Held or not yet": the README's caveat, shown.
    let env = Env::new().await;
    let scratch = Scratch::new(&env);
    let claims: Api<LockClaim> = Api::namespaced(env.client.clone(), &env.namespace);
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    for (name, phase, reason) in [
        (
            "timed-out",
            "Failed",
            turnstile_api::reasons::ACQUIRE_TIMEOUT,
        ),
        ("ran-out", "Expired", turnstile_api::reasons::LEASE_EXPIRED),
    ] {
        let claim: LockClaim =
            serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"lockName": LOCK}}))
                .expect("claim");
        claims
            .create(&PostParams::default(), &claim)
            .await
            .expect("create");
        let ended = json!({"status": {"phase": phase, "reason": reason, "conditions": [{
            "type": turnstile_api::HELD_CONDITION, "status": "False", "reason": reason,
            "message": "ended", "lastTransitionTime": now}]}});
        claims
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&ended))
            .await
            .expect("end the claim");
        let started = Instant::now();
        let output = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&scratch.kubeconfig)
            .arg("--cache-dir")
            .arg(scratch.cache_dir())
            .args(["wait", "--for=condition=Held", &format!("lockclaim/{name}")])
            .arg("--timeout=2s")
            .output()
            .await
            .expect("kubectl wait");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{phase}: {stderr}");
        assert!(stderr.contains("timed out"), "{phase}: {stderr}");
        assert!(
            started.elapsed() >= Duration::from_secs(2),
            "{phase}: it waited out the timeout"
        );
    }
}

/// The gated-Job example on the real control plane, nothing played: the real Job controller
/// makes the Pods once the operator un-suspends a Job, KWOK runs them to `Succeeded`, the Job
/// completes, its claim is released and the next Job is let go. Sampled throughout, never two
/// Jobs run at once, and each ran under its own token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gated_jobs_run_one_at_a_time_through_the_real_job_controller() {
    let (mut env, scratch) = Scratch::started().await;
    if !env.on_real_plane("gated_jobs_run_one_at_a_time…") {
        return;
    }
    scratch.apply(&env, &documents(&example("lock.yaml"))).await;
    let docs = documents(&example("gated-job.yaml"));
    let names = ["gated-migrate", "gated-migrate-2", "gated-migrate-3"];
    let gated: Vec<Value> = names
        .iter()
        .map(|name| {
            let mut job = find(&docs, "Job").clone();
            job["metadata"]["name"] = json!(name);
            job
        })
        .collect();
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let sampler = tokio::spawn(most_jobs_running_at_once(jobs(&env), stopped));
    // Each Job once the previous one's claim exists: on a free lock the first claim made is
    // granted at once, and of Jobs applied within milliseconds any may get its claim made
    // first (README, "Gated Job").
    for (name, job) in names.iter().zip(&gated) {
        scratch.apply(&env, std::slice::from_ref(job)).await;
        env.wait_claim(&format!("{name}-{LOCK}"), |claim| claim.status.is_some())
            .await;
    }
    let mut tokens = Vec::new();
    for name in names {
        let done = wait_job(&env, name, |job| has_condition(job, "Complete")).await;
        let pods = pods(&env)
            .list(&kube::api::ListParams::default().labels(&format!("job-name={name}")))
            .await
            .expect("list Pods");
        assert!(
            !pods.items.is_empty(),
            "the Job controller made {name}'s Pods"
        );
        tokens.push(
            token_annotation(done.metadata.annotations.as_ref()).expect("a token on the Job"),
        );
        let claim = env
            .wait_phase(&format!("{name}-{LOCK}"), ClaimPhase::Released)
            .await;
        assert_eq!(support::reason_of(&claim).as_deref(), Some("OwnerFinished"));
    }
    assert_eq!(
        tokens,
        ["1", "2", "3"],
        "one after the other, in the order they were created"
    );
    let _ = stop.send(());
    let (samples, most) = sampler.await.expect("sampler");
    assert!(samples > 10, "the Jobs were sampled ({samples} samples)");
    assert_eq!(most, 1, "at most one Job ran at any sample, and one did");
    env.stop_controller().await;
}

/// Samples the Jobs every 20 ms until `stop`: how many samples, and the most Jobs seen
/// running (un-suspended, neither complete nor failed) in one.
async fn most_jobs_running_at_once(
    jobs: Api<Job>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) -> (usize, usize) {
    let (mut samples, mut most) = (0, 0);
    while stop.try_recv().is_err() {
        if let Ok(list) = jobs.list(&Default::default()).await {
            let running = list
                .items
                .iter()
                .filter(|job| {
                    !is_suspended(job)
                        && !has_condition(job, "Complete")
                        && !has_condition(job, "Failed")
                })
                .count();
            samples += 1;
            most = most.max(running);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (samples, most)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gated_job_example_runs_only_while_its_claim_is_held() {
    let mut env = Env::fake_only(PLAYS_THE_KUBELET).await;
    let scratch = Scratch::new(&env);
    let docs = documents(&example("gated-job.yaml"));
    assert_eq!(
        find(&docs, "Job")["metadata"]["annotations"][LOCK_ANNOTATION],
        LOCK
    );
    scratch.apply(&env, &documents(&example("lock.yaml"))).await;
    let monitor = GateMonitor::start(&env);
    env.start_default_controller();

    // The example, a second copy created after it, and a suspended Job without the annotation.
    // The second comes once the first holds: claims created within one second (creation
    // times are whole seconds) are queued by name, and `gated-migrate-2-…` sorts first.
    scratch.apply(&env, &docs).await;
    env.wait_phase("gated-migrate-db-migrations", ClaimPhase::Held)
        .await;
    let mut second = find(&docs, "Job").clone();
    second["metadata"]["name"] = json!("gated-migrate-2");
    let mut plain = find(&docs, "Job").clone();
    plain["metadata"]["name"] = json!("plain");
    plain["metadata"]["annotations"] = json!({});
    scratch.apply(&env, &[second, plain]).await;

    let first_claim = env
        .wait_phase("gated-migrate-db-migrations", ClaimPhase::Held)
        .await;
    let first_token = token_of(&first_claim).expect("token");
    let owner = &first_claim
        .metadata
        .owner_references
        .as_ref()
        .expect("owner")[0];
    assert_eq!((owner.kind.as_str(), owner.controller), ("Job", Some(true)));
    let first = wait_job(&env, "gated-migrate", |job| !is_suspended(job)).await;
    assert_eq!(
        token_annotation(first.metadata.annotations.as_ref()),
        Some(first_token.to_string())
    );
    let template_annotations = first
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.annotations.as_ref());
    assert_eq!(
        token_annotation(template_annotations),
        Some(first_token.to_string())
    );

    // The second waits, suspended, behind the first.
    env.wait_claim("gated-migrate-2-db-migrations", |c| {
        position_of(c) == Some(1)
    })
    .await;
    env.after_a_pass_over(&["db-migrations"]).await;
    assert!(is_suspended(
        &jobs(&env).get("gated-migrate-2").await.expect("job")
    ));
    env.wait_event("gated-migrate-2", "WaitingForLock").await;
    env.wait_event("gated-migrate", "LockHeld").await;

    complete_job(&env, "gated-migrate").await;
    let done = env
        .wait_phase("gated-migrate-db-migrations", ClaimPhase::Released)
        .await;
    assert_eq!(support::reason_of(&done).as_deref(), Some("OwnerFinished"));
    let second_claim = env
        .wait_phase("gated-migrate-2-db-migrations", ClaimPhase::Held)
        .await;
    let second_token = token_of(&second_claim).expect("token");
    assert!(second_token > first_token);
    let second = wait_job(&env, "gated-migrate-2", |job| !is_suspended(job)).await;
    assert_eq!(
        token_annotation(second.metadata.annotations.as_ref()),
        Some(second_token.to_string())
    );
    // The first Job keeps its record; nothing was un-suspended twice.
    assert_eq!(
        token_annotation(
            jobs(&env)
                .get("gated-migrate")
                .await
                .expect("job")
                .metadata
                .annotations
                .as_ref()
        ),
        Some(first_token.to_string())
    );
    complete_job(&env, "gated-migrate-2").await;
    env.wait_phase("gated-migrate-2-db-migrations", ClaimPhase::Released)
        .await;
    monitor.finish().await;

    // Ignored: no claim, still suspended.
    assert!(is_suspended(&jobs(&env).get("plain").await.expect("job")));
    let claims = env
        .claims()
        .list(&Default::default())
        .await
        .expect("claims");
    let made = claims
        .items
        .iter()
        .filter(|claim| !support::waits::is_marker(claim))
        .count();
    assert_eq!(made, 2, "only the gated Jobs got claims");
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gated_deployment_example_lets_its_replicas_go_one_at_a_time() {
    let (mut env, scratch) = Scratch::started().await;
    scratch.apply(&env, &documents(&example("lock.yaml"))).await;
    let deployment = documents(&example("gated-deployment.yaml"))
        .into_iter()
        .find(|doc| doc["kind"] == "Deployment")
        .expect("the Deployment");
    let replicas = deployment["spec"]["replicas"].as_u64().expect("replicas");
    // The fake serves no apps/v1: the test is the ReplicaSet, making each Pod from the template.
    let template = &deployment["spec"]["template"];
    for n in 0..replicas {
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": template["metadata"].clone(),
            "spec": template["spec"].clone(),
        });
        pod["metadata"]["name"] = json!(format!("schema-worker-{n}"));
        let pod: Pod = serde_json::from_value(pod).expect("pod");
        pods(&env)
            .create(&PostParams::default(), &pod)
            .await
            .expect("create pod");
    }
    let gated = |pod: &Pod| {
        pod.spec
            .as_ref()
            .and_then(|spec| spec.scheduling_gates.as_ref())
            .is_some_and(|gates| !gates.is_empty())
    };
    let mut let_go = Vec::new();
    for round in 0..replicas {
        let deadline = Instant::now() + WAIT;
        let next = loop {
            let list = pods(&env).list(&Default::default()).await.expect("pods");
            let free: Vec<Pod> = list
                .items
                .into_iter()
                .filter(|pod| !gated(pod) && pod.metadata.deletion_timestamp.is_none())
                .collect();
            assert!(
                free.len() <= 1,
                "two replicas past the gate: {}",
                free.len()
            );
            if let [pod] = free.as_slice() {
                break pod.clone();
            }
            assert!(Instant::now() < deadline, "no replica was let go");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let name = next.metadata.name.clone().expect("name");
        let token = token_annotation(next.metadata.annotations.as_ref());
        assert_eq!(
            token,
            Some((round + 1).to_string()),
            "{name}: the downward API's token"
        );
        let_go.push(name.clone());
        // The replica is done (scaled away, or rolled): the next one goes.
        pods(&env)
            .delete(&name, &Default::default())
            .await
            .expect("delete pod");
        env.wait_gone(&format!("{name}-{LOCK}")).await;
    }
    assert_eq!(let_go.len() as u64, replicas);
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cronjobs_example_never_runs_two_jobs_at_once() {
    let (mut env, scratch) = Scratch::started_playing_the_kubelet().await;
    let docs = documents(&example("cronjobs-sharing-a-lock.yaml"));
    let lock = find(&docs, "DistributedLock").clone();
    scratch.apply(&env, &[lock]).await;
    let cronjobs: Vec<&Value> = docs.iter().filter(|doc| doc["kind"] == "CronJob").collect();
    assert_eq!(cronjobs.len(), 2);
    // The fake serves no CronJobs: the test is the CronJob controller, and both schedules fire
    // twice in a row, so four runs are due at once.
    let mut runs = Vec::new();
    for tick in 0..2 {
        for cronjob in &cronjobs {
            let template = &cronjob["spec"]["jobTemplate"];
            let name = format!(
                "{}-{tick}",
                cronjob["metadata"]["name"].as_str().expect("name")
            );
            let job: Job = serde_json::from_value(json!({
                "metadata": {"name": name, "annotations": template["metadata"]["annotations"]},
                "spec": template["spec"],
            }))
            .expect("job");
            jobs(&env)
                .create(&PostParams::default(), &job)
                .await
                .expect("create job");
            runs.push(name);
        }
    }
    // The test is also the Job controller: a run that is let go finishes, then the next goes.
    let mut tokens = Vec::new();
    let mut finished: Vec<String> = Vec::new();
    for _ in 0..runs.len() {
        let deadline = Instant::now() + WAIT;
        let running = loop {
            let list = jobs(&env).list(&Default::default()).await.expect("jobs");
            let going: Vec<Job> = list
                .items
                .into_iter()
                .filter(|job| !is_suspended(job))
                .filter(|job| !finished.contains(job.metadata.name.as_ref().expect("name")))
                .collect();
            assert!(going.len() <= 1, "two runs at once: {}", going.len());
            if let [job] = going.as_slice() {
                break job.clone();
            }
            assert!(Instant::now() < deadline, "no run was let go");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let name = running.metadata.name.clone().expect("name");
        tokens.push(token_annotation(running.metadata.annotations.as_ref()));
        // The second run fails: a failed run hands the lock on just as a completed one does.
        if finished.len() == 1 {
            finish_job(&env, &name, "Failed").await;
        } else {
            complete_job(&env, &name).await;
        }
        env.wait_phase(&format!("{name}-reports"), ClaimPhase::Released)
            .await;
        finished.push(name);
    }
    finished.sort();
    runs.sort();
    assert_eq!(finished, runs, "every run ran");
    let expected: Vec<Option<String>> = (1..=4).map(|t| Some(t.to_string())).collect();
    assert_eq!(tokens, expected, "one after the other, tokens increasing");
    env.stop_controller().await;
}

#[test]
fn the_init_container_examples_share_the_token_through_an_empty_dir_with_downward_api_names() {
    for (file, job, fields, image) in [
        (
            "wait-init-container.yaml",
            "db-migrate",
            &["POD_NAME", "POD_NAMESPACE", "POD_UID"][..],
            "turnstile:",
        ),
        (
            "kubectl-wait-job.yaml",
            "nightly-report",
            &["POD_NAME", "POD_UID"][..],
            "registry.k8s.io/kubectl:",
        ),
    ] {
        let docs = documents(&example(file));
        let spec = &docs
            .iter()
            .find(|doc| doc["kind"] == "Job" && doc["metadata"]["name"] == job)
            .unwrap_or_else(|| panic!("{file}: no Job {job}"))["spec"]["template"]["spec"];
        let volume = spec["volumes"]
            .as_array()
            .and_then(|volumes| volumes.iter().find(|v| v["name"] == "turnstile"))
            .unwrap_or_else(|| panic!("{file}: no turnstile volume"));
        assert_eq!(
            volume["emptyDir"],
            json!({}),
            "{file}: the token travels in an emptyDir"
        );
        let init = init_container(&docs, job);
        assert!(
            init["image"].as_str().is_some_and(|i| i.starts_with(image)),
            "{file}: {}",
            init["image"]
        );
        let mount = |container: &Value| {
            container["volumeMounts"]
                .as_array()
                .and_then(|mounts| mounts.iter().find(|m| m["name"] == "turnstile"))
                .and_then(|m| m["mountPath"].as_str())
                .map(str::to_owned)
        };
        let main = &spec["containers"][0];
        assert!(
            mount(init).is_some(),
            "{file}: the init container writes the token"
        );
        assert_eq!(
            mount(init),
            mount(main),
            "{file}: the app reads it at the same path"
        );
        for name in fields {
            let entry = init["env"]
                .as_array()
                .and_then(|env| env.iter().find(|e| e["name"] == *name))
                .unwrap_or_else(|| panic!("{file}: no {name}"));
            let path = entry["valueFrom"]["fieldRef"]["fieldPath"].as_str();
            let want = format!(
                "metadata.{}",
                name.trim_start_matches("POD_").to_lowercase()
            );
            assert_eq!(
                path,
                Some(want.as_str()),
                "{file}: {name} from the downward API"
            );
        }
    }
}
