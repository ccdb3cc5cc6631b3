//! End to end: Pods gated by a scheduling gate. A Pod with the label `turnstile.dev/lock: db`
//! and the scheduling gate `turnstile.dev/lock` (as a Deployment's Pod template would give
//! every replica) gets a claim owned by it; the controller writes the fencing token to the
//! Pod's annotation and removes the gate once the claim is held. The test plays the
//! scheduler and kubelet: a Pod without the gate "runs". Three such replicas on a mutex run
//! one at a time (a sampler counts ungated Pods at once), and the next one is let go when its
//! predecessor is deleted or finishes. A gated Pod whose claim fails stays gated, with a
//! Warning Event saying why.
//!
//! Also the Job gate's idempotence: a claim of the Job's fixed name that the gate's cache has
//! not seen yet makes its create answer AlreadyExists; the claim is adopted, not re-created,
//! and the Job's token and `suspend` are written once, across a controller restart too.

use crate::support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::ResourceExt;
use serde_json::json;
use support::actor::{requests_of, tagged_client};
use support::jobs::{is_suspended, jobs, wait_job};
use support::pods::{pods, set_pod_phase};
use support::scrape;
use support::{
    annotate, arrival_of, lock_tokens, phase_of, reason_of, token_annotation, token_of, Env, WAIT,
};
use turnstile_api::{ClaimPhase, LOCKS_ANNOTATION, LOCK_ANNOTATION, LOCK_LABEL, SCHEDULING_GATE};
use turnstile_controller::ControllerConfig;

/// How soon after its predecessor ends the next Pod must be let go: far below the 300 s lease.
const HANDOFF: Duration = Duration::from_secs(15);

/// A replica as a ReplicaSet makes it from a gated template.
async fn create_gated_pod(env: &Env, name: &str, lock: &str) {
    create_pod_from(
        env,
        json!({
            "metadata": {"name": name, "labels": {LOCK_LABEL: lock, "app": "web"}},
            "spec": {
                "schedulingGates": [{"name": SCHEDULING_GATE}],
                "containers": [{"name": "app", "image": "busybox"}]
            }
        }),
    )
    .await;
}

/// Creates the Pod `pod` (JSON) in the test's namespace.
async fn create_pod_from(env: &Env, pod: serde_json::Value) {
    let pod: Pod = serde_json::from_value(pod).expect("pod");
    pods(env)
        .create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
}

/// The note of the first Event `reason` about `name` (empty when there is none).
async fn event_note(env: &Env, name: &str, reason: &str) -> String {
    env.events_about(name)
        .await
        .into_iter()
        .find(|event| event.reason.as_deref() == Some(reason))
        .and_then(|event| event.note)
        .unwrap_or_default()
}

fn is_gated(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|spec| spec.scheduling_gates.as_ref())
        .is_some_and(|gates| gates.iter().any(|gate| gate.name == SCHEDULING_GATE))
}

fn is_finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The Pods past the gate and not finished: those the scheduler would run.
async fn running(env: &Env) -> BTreeSet<String> {
    pods(env)
        .list(&Default::default())
        .await
        .expect("list pods")
        .items
        .into_iter()
        .filter(|pod| {
            !is_gated(pod) && !is_finished(pod) && pod.metadata.deletion_timestamp.is_none()
        })
        .filter_map(|pod| pod.metadata.name)
        .collect()
}

/// Waits until exactly one Pod runs, other than those in `done`; returns it.
async fn next_running(env: &Env, done: &BTreeSet<String>) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let now: Vec<String> = running(env)
            .await
            .into_iter()
            .filter(|pod| !done.contains(pod))
            .collect();
        if let [only] = now.as_slice() {
            return only.clone();
        }
        assert!(Instant::now() < deadline, "no single next Pod ran: {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gated_replicas_on_a_mutex_run_one_at_a_time() {
    let mut env = Env::started().await;
    env.apply_lock("db", "leaseDurationSeconds: 300");
    // Created in reverse name order, each once the previous one's claim exists: they are
    // let go in creation order (their claims' arrival), not name order.
    let created = ["web-c", "web-b", "web-a"];
    for name in created {
        create_gated_pod(&env, name, "db").await;
        env.wait_claim(&format!("{name}-db"), |claim| phase_of(claim).is_some())
            .await;
    }

    // The sampler: never more than one Pod past the gate at once. A Pod once seen finished
    // stays finished (a kubelet never leaves a finished phase; on a real plane KWOK, playing
    // the kubelet, may still write its own late `Running` over the test's `Succeeded`).
    let most = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (most, stop) = (most.clone(), stop.clone());
        let pods = pods(&env);
        tokio::spawn(async move {
            let mut finished = BTreeSet::new();
            while !stop.load(Ordering::Relaxed) {
                if let Ok(list) = pods.list(&Default::default()).await {
                    for pod in list.items.iter().filter(|pod| is_finished(pod)) {
                        finished.insert(pod.name_any());
                    }
                    let now = list
                        .items
                        .iter()
                        .filter(|pod| !is_gated(pod) && !finished.contains(&pod.name_any()))
                        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
                        .count();
                    most.fetch_max(now, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    let mut done = BTreeSet::new();
    let first = next_running(&env, &done).await;
    assert_eq!(first, created[0]);
    set_pod_phase(&env, &first, "Running").await;
    let claim = env
        .wait_phase(&format!("{first}-db"), ClaimPhase::Held)
        .await;
    assert_eq!(token_of(&claim), Some(1));
    let owner = &claim.metadata.owner_references.clone().unwrap_or_default()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Pod", first.as_str())
    );
    let pod = pods(&env).get(&first).await.expect("pod");
    assert_eq!(
        token_annotation(pod.metadata.annotations.as_ref()).as_deref(),
        Some("1"),
        "the token is on the Pod for the downward API"
    );
    env.wait_event(&first, "LockHeld").await;
    for waiting in ["web-a", "web-b", "web-c"]
        .iter()
        .filter(|pod| **pod != first)
    {
        env.wait_event(waiting, "WaitingForLock").await;
    }

    // The running Pod is deleted: its claim goes with it and the next Pod is let go.
    pods(&env)
        .delete(&first, &DeleteParams::default())
        .await
        .expect("delete pod");
    let deleted = Instant::now();
    done.insert(first);
    let second = next_running(&env, &done).await;
    assert!(deleted.elapsed() < HANDOFF, "took {:?}", deleted.elapsed());
    assert_eq!(second, created[1], "creation order");
    set_pod_phase(&env, &second, "Running").await;
    let claim = env
        .wait_phase(&format!("{second}-db"), ClaimPhase::Held)
        .await;
    assert_eq!(token_of(&claim), Some(2));

    // It finishes: the last one is let go.
    set_pod_phase(&env, &second, "Succeeded").await;
    let finished = Instant::now();
    done.insert(second.clone());
    let third = next_running(&env, &done).await;
    assert_eq!(third, created[2], "creation order");
    assert!(
        finished.elapsed() < HANDOFF,
        "took {:?}",
        finished.elapsed()
    );
    let claim = env
        .wait_phase(&format!("{third}-db"), ClaimPhase::Held)
        .await;
    assert_eq!(token_of(&claim), Some(3));
    let released = env.claim(&format!("{second}-db")).await;
    assert_eq!(reason_of(&released).as_deref(), Some("OwnerFinished"));

    stop.store(true, Ordering::Relaxed);
    sampler.await.expect("sampler");
    assert_eq!(
        most.load(Ordering::Relaxed),
        1,
        "Pods past the gate at once"
    );
    env.stop_controller().await;
}

/// Gated Pods created back to back (the gate makes their claims several at a time, in any
/// order) queue in the order the Pods were created: each claim takes its Pod's arrival.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gated_pods_created_back_to_back_queue_in_creation_order() {
    let mut env = Env::started().await;
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.hold("holder", "db", "").await;
    let created = ["web-z", "web-y", "web-x", "web-w", "web-v"];
    for name in created {
        create_gated_pod(&env, name, "db").await;
    }
    let mut arrivals = Vec::new();
    for name in created {
        let claim = env
            .wait_claim(&format!("{name}-db"), |claim| arrival_of(claim).is_some())
            .await;
        arrivals.push(arrival_of(&claim));
    }
    assert!(
        arrivals.windows(2).all(|pair| pair[0] < pair[1]),
        "the claims queue as their Pods were created: {arrivals:?}"
    );
    env.delete_claim("holder").await;
    let mut done = BTreeSet::new();
    for name in created {
        let next = next_running(&env, &done).await;
        assert_eq!(next, name, "let go in creation order");
        pods(&env)
            .delete(&next, &DeleteParams::default())
            .await
            .expect("delete pod");
        done.insert(next);
    }
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gated_pod_whose_claim_fails_stays_gated_and_says_why() {
    let mut env = Env::new().await;
    let metrics = env.start_controller_serving_metrics();
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.hold("holder", "db", "").await;
    create_gated_pod(&env, "web-x", "db").await;
    env.wait_claim("web-x-db", |claim| {
        phase_of(claim) == Some(ClaimPhase::Pending)
    })
    .await;
    // Someone gives the Pod's claim a deadline it cannot meet.
    env.patch_claim_spec("web-x-db", json!({"acquireTimeoutSeconds": 1}))
        .await;
    let failed = env.wait_phase("web-x-db", ClaimPhase::Failed).await;
    assert_eq!(reason_of(&failed).as_deref(), Some("AcquireTimeout"));
    env.wait_event("web-x", "GateBlocked").await;
    // Said once for its reason, however many passes follow: the claim's own last writes
    // start some, and each change of the Pod another.
    let said = env
        .event_said_settled("web-x", "GateBlocked", Duration::from_millis(500))
        .await;
    assert_eq!(said, 1, "GateBlocked said once, not on every pass");
    let before = scrape::passes(metrics, "pod")
        .await
        .expect("the controller serves its metrics");
    annotate(&pods(&env), "web-x", "test/touch", "1").await;
    // The positive sign that the gate looked at the changed Pod, then the verdict.
    scrape::passed_since(metrics, "pod", before, WAIT).await;
    assert_eq!(env.event_said("web-x", "GateBlocked").await, 1);
    let pod = pods(&env).get("web-x").await.expect("pod");
    assert!(is_gated(&pod), "a Pod whose claim failed stays gated");

    // A labelled Pod created without the gate is not held back (it may be running already).
    let plain: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web-y", "labels": {LOCK_LABEL: "db"}},
        "spec": {"containers": [{"name": "app", "image": "busybox"}]}
    }))
    .expect("pod");
    let before = scrape::passes(metrics, "pod")
        .await
        .expect("the controller serves its metrics");
    pods(&env)
        .create(&PostParams::default(), &plain)
        .await
        .expect("create pod");
    scrape::passed_since(metrics, "pod", before, WAIT).await;
    assert!(env.claim_opt("web-y-db").await.is_none());
    env.stop_controller().await;
}

/// A gated Pod with the annotation `turnstile.dev/locks: cache,db` gets one claim on both
/// locks, owned by it: it stays gated while one of them is held by someone else, is let go
/// holding both (the first lock's token in its annotation, each lock's in the claim), and
/// when it finishes both locks go to the next claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_locks_annotation_gates_a_pod_on_all_its_locks() {
    let mut env = Env::started().await;
    env.apply_locks(&["cache", "db"], "leaseDurationSeconds: 300");
    env.hold("holds-db", "db", "").await;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": "web-m",
            "labels": {LOCK_LABEL: "db"},
            "annotations": {LOCKS_ANNOTATION: "db, cache"}
        },
        "spec": {
            "schedulingGates": [{"name": SCHEDULING_GATE}],
            "containers": [{"name": "app", "image": "busybox"}]
        }
    }))
    .expect("pod");
    pods(&env)
        .create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    let claim = env
        .wait_claim("web-m-db", |claim| {
            reason_of(claim).as_deref() == Some("Queued")
        })
        .await;
    assert_eq!(
        claim.spec.lock_names,
        Some(vec!["cache".to_owned(), "db".to_owned()])
    );
    // After further passes over both locks the claim still waits, and the Pod stays gated.
    env.after_a_pass_over(&["cache", "db"]).await;
    assert!(
        is_gated(&pods(&env).get("web-m").await.expect("pod")),
        "gated while db is held by someone else"
    );
    let cache = env.lock("cache").await.status.unwrap_or_default();
    assert!(cache.holders.is_empty(), "it holds nothing while it waits");

    env.delete_claim("holds-db").await;
    let held = env.wait_phase("web-m-db", ClaimPhase::Held).await;
    assert_eq!(
        lock_tokens(&held),
        [("cache".to_owned(), 1), ("db".to_owned(), 2)]
    );
    let deadline = Instant::now() + WAIT;
    let pod = loop {
        let pod = pods(&env).get("web-m").await.expect("pod");
        if !is_gated(&pod) {
            break pod;
        }
        assert!(Instant::now() < deadline, "the gate never went: {pod:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        token_annotation(pod.metadata.annotations.as_ref()).as_deref(),
        Some("1"),
        "the first lock's (cache) token"
    );

    // Claims behind it on each lock, then the Pod finishes: both go on.
    env.apply_claim("next-cache", "cache", "");
    env.apply_claim("next-db", "db", "");
    set_pod_phase(&env, "web-m", "Succeeded").await;
    let released = env.wait_phase("web-m-db", ClaimPhase::Released).await;
    assert_eq!(reason_of(&released).as_deref(), Some("OwnerFinished"));
    assert_eq!(
        token_of(&env.wait_phase("next-cache", ClaimPhase::Held).await),
        Some(2)
    );
    assert_eq!(
        token_of(&env.wait_phase("next-db", ClaimPhase::Held).await),
        Some(3)
    );
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gated_job_adopts_a_claim_of_its_name_and_is_let_go_once() {
    let env = Env::fake_only("its request log counts the controller's Job patches").await;
    let controller_client = || tagged_client(env.server(), "controller");
    let controller = env.spawn_controller_with(controller_client(), ControllerConfig::default());
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.wait_ready("db", "True").await;
    // Suspended, not yet gated: the test learns its uid first.
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "migrate"},
        "spec": {
            "suspend": true,
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": "busybox"}]
            }}
        }
    }))
    .expect("job");
    let job = jobs(&env)
        .create(&PostParams::default(), &job)
        .await
        .expect("create job");
    let uid = job.uid().expect("uid");

    // The claim watch's next request is held back for 5 s, and the watch is cut: the cache
    // cannot see the claim stored meanwhile (directly, no request of ours on that path).
    let claims_path = env.turnstile_path("lockclaims");
    env.server()
        .inject_delays(&claims_path, 1, Duration::from_secs(5));
    env.server().close_watches();
    tokio::time::sleep(Duration::from_millis(300)).await;
    env.store_unvalidated_claim(
        "migrate-db",
        "adopted-claim-uid",
        json!({"ownerReferences": [{
            "apiVersion": "batch/v1", "kind": "Job", "name": "migrate",
            "uid": uid, "controller": true
        }]}),
        json!({"lockName": "db"}),
    );
    annotate(&jobs(&env), "migrate", LOCK_ANNOTATION, "db").await;

    let job = wait_job(&env, "migrate", |job| !is_suspended(job)).await;
    let claim = env.claim("migrate-db").await;
    assert_eq!(claim.uid().as_deref(), Some("adopted-claim-uid"), "adopted");
    assert_eq!(phase_of(&claim), Some(ClaimPhase::Held));
    assert_eq!(
        token_annotation(job.metadata.annotations.as_ref()),
        token_of(&claim).map(|token| token.to_string())
    );
    let log = requests_of(&env.server().request_log(), "controller");
    let creates: Vec<u16> = log
        .iter()
        .filter(|request| request.verb == "create" && request.resource == "lockclaims")
        .map(|request| request.status)
        .collect();
    assert!(
        !creates.is_empty() && creates.iter().all(|status| *status == 409),
        "the gate's create met the claim (AlreadyExists) and created none: {creates:?}"
    );

    // A restarted controller finds the Job let go: nothing more is written to it.
    controller.stop().await;
    let restarted = env.spawn_controller_with(controller_client(), ControllerConfig::default());
    env.wait_ready("db", "True").await;
    // Time: the lock's Ready shows the restarted controller's caches synced, but nothing can
    // show that its gate chose not to write to the Job; it acts within a second, so two
    // seconds without a write is the test.
    tokio::time::sleep(Duration::from_secs(2)).await;
    restarted.stop().await;
    let job_writes = requests_of(&env.server().request_log(), "controller")
        .into_iter()
        .filter(|request| request.resource == "jobs" && request.verb == "patch")
        .count();
    assert_eq!(job_writes, 1, "token and suspend written once");
    assert_eq!(
        env.claim("migrate-db").await.uid().as_deref(),
        Some("adopted-claim-uid")
    );
}

/// A gated Pod that another controller also holds back (a second scheduling gate, as a quota
/// or admission controller sets one): Turnstile claims the lock only once the other gates are
/// gone, so the lock is never held by a Pod that could not run anyway. It says so once; then
/// the Pod queues and is let go like any gated Pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_another_controller_also_gates_claims_the_lock_once_the_other_gates_are_gone() {
    const OTHER_GATE: &str = "example.com/quota";
    let mut env = Env::new().await;
    let metrics = env.start_controller_serving_metrics();
    env.apply_lock("db", "leaseDurationSeconds: 300");
    create_pod_from(
        &env,
        json!({
            "metadata": {"name": "web-q", "labels": {LOCK_LABEL: "db"}},
            "spec": {
                "schedulingGates": [{"name": SCHEDULING_GATE}, {"name": OTHER_GATE}],
                "containers": [{"name": "app", "image": "busybox"}]
            }
        }),
    )
    .await;
    // The positive sign the gate looked: it says what it waits for.
    env.wait_event("web-q", "WaitingForGates").await;
    let note = event_note(&env, "web-q", "WaitingForGates").await;
    assert!(note.contains(OTHER_GATE), "{note}");
    assert!(env.claim_opt("web-q-db").await.is_none(), "claimed early");

    // A change of the Pod: the gate looks again, says nothing new, claims nothing.
    let before = scrape::passes(metrics, "pod")
        .await
        .expect("the controller serves its metrics");
    annotate(&pods(&env), "web-q", "test/touch", "1").await;
    scrape::passed_since(metrics, "pod", before, WAIT).await;
    assert_eq!(env.event_said("web-q", "WaitingForGates").await, 1);
    assert!(env.claim_opt("web-q-db").await.is_none(), "claimed early");

    // The other controller lets go (a gate can only be removed).
    pods(&env)
        .patch(
            "web-q",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"spec": {"schedulingGates": [{"name": SCHEDULING_GATE}]}}),
            ),
        )
        .await
        .expect("remove the other gate");
    let claim = env.wait_phase("web-q-db", ClaimPhase::Held).await;
    let pod = support::wait_object(pods(&env), "web-q", |pod| !is_gated(pod)).await;
    assert_eq!(
        token_annotation(pod.metadata.annotations.as_ref()),
        token_of(&claim).map(|token| token.to_string())
    );
    env.stop_controller().await;
}

/// A Job another admission controller holds (Kueue's `kueue.x-k8s.io/queue-name` label, or a
/// `spec.managedBy` of another controller) cannot be un-suspended by Turnstile without running
/// past it: the Job gate leaves it alone, claims nothing, and says so with a Warning naming the
/// marker (gate its Pods instead).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_another_admission_controller_manages_is_not_gated_and_says_why() {
    let env = Env::started().await;
    env.apply_lock("db", "leaseDurationSeconds: 300");
    for (name, marker, job) in [
        (
            "queued",
            "kueue.x-k8s.io/queue-name",
            json!({"metadata": {"name": "queued", "annotations": {LOCK_ANNOTATION: "db"},
                                "labels": {"kueue.x-k8s.io/queue-name": "team-a"}},
                   "spec": {"suspend": true, "template": {"spec": {"restartPolicy": "Never",
                       "containers": [{"name": "main", "image": "busybox"}]}}}}),
        ),
        (
            "managed",
            "spec.managedBy",
            json!({"metadata": {"name": "managed", "annotations": {LOCK_ANNOTATION: "db"}},
                   "spec": {"suspend": true, "managedBy": "example.com/batch",
                       "template": {"spec": {"restartPolicy": "Never",
                       "containers": [{"name": "main", "image": "busybox"}]}}}}),
        ),
    ] {
        let job: Job = serde_json::from_value(job).expect("job");
        jobs(&env)
            .create(&PostParams::default(), &job)
            .await
            .expect("create job");
        env.wait_event(name, "GateBlocked").await;
        let note = event_note(&env, name, "GateBlocked").await;
        assert!(note.contains(marker), "{name}: {note}");
        assert!(
            env.claim_opt(&format!("{name}-db")).await.is_none(),
            "{name}: claimed"
        );
        let job = jobs(&env).get(name).await.expect("get job");
        assert!(is_suspended(&job), "{name}: un-suspended by Turnstile");
    }
}
