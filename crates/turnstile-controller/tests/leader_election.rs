//! Leader election against the fake API server: candidates compete for one
//! `coordination.k8s.io/v1` Lease.
//!
//! - of two candidates exactly one leads, and stays leader;
//! - a leader that shuts down releases the Lease and the standby takes over;
//! - a leader that crashes (its runtime dropped, no release) is replaced once the lease ran
//!   out, not before, and within the lease duration plus one retry;
//! - a leader whose renewals fail reports "not leader" before its lease could run out;
//! - a leader whose Lease was taken by another holder reports "not leader" at its next renewal;
//! - across repeated handovers no two candidates ever lead at once (violations counted).

use std::future::Future;
use std::time::{Duration, Instant};

use fake_apiserver::FakeApiServer;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio::sync::{oneshot, watch};
use turnstile_controller::leader::{self, LeaderConfig, LeaderElector};

const NAMESPACE: &str = "kube-system";
const LEASE: &str = "turnstile-test";
const LEASE_DURATION: Duration = Duration::from_secs(3);
const RENEW_DEADLINE: Duration = Duration::from_secs(2);
const RETRY_PERIOD: Duration = Duration::from_millis(300);
/// Upper bound for things that should happen within a few retries (a loaded CI box).
const PATIENCE: Duration = Duration::from_secs(20);

fn config(identity: &str) -> LeaderConfig {
    let mut config = LeaderConfig::new(NAMESPACE, identity).with_timings(
        LEASE_DURATION,
        RENEW_DEADLINE,
        RETRY_PERIOD,
    );
    config.lease_name = LEASE.to_string();
    config
}

/// A candidate running on the test's runtime, stopped through `stop`.
struct Candidate {
    identity: String,
    elector: LeaderElector,
    stop: oneshot::Sender<()>,
}

fn shutdown_signal() -> (
    oneshot::Sender<()>,
    impl Future<Output = ()> + Send + 'static,
) {
    let (stop, stopped) = oneshot::channel::<()>();
    (stop, async move {
        let _ = stopped.await;
    })
}

fn start(server: &FakeApiServer, identity: &str) -> Candidate {
    let (stop, shutdown) = shutdown_signal();
    let elector = leader::run(server.client(), config(identity), shutdown).expect("valid settings");
    Candidate {
        identity: identity.to_string(),
        elector,
        stop,
    }
}

/// A server with a first candidate that already leads.
async fn server_with_leader(identity: &str) -> (FakeApiServer, Candidate) {
    let server = FakeApiServer::start().await.expect("fake API server");
    let leader = start(&server, identity);
    wait_until("the first candidate leads", || leader.elector.is_leader()).await;
    (server, leader)
}

/// A server whose candidate `leader` leads, and a candidate `standby` that has then watched
/// it for `periods` retry periods.
async fn leader_and_standby(
    leader: &str,
    standby: &str,
    periods: u32,
) -> (FakeApiServer, Candidate, Candidate) {
    let (server, leader) = server_with_leader(leader).await;
    let standby = start(&server, standby);
    // Time: the standby observes `periods` renewal periods.
    tokio::time::sleep(RETRY_PERIOD * periods).await;
    (server, leader, standby)
}

impl Candidate {
    async fn shut_down(self) {
        let _ = self.stop.send(());
        self.elector.stopped().await;
    }
}

/// A candidate on its own runtime, which the test can drop as a crash (no release).
struct Crashable {
    is_leader: watch::Receiver<bool>,
    runtime: tokio::runtime::Runtime,
    _elector: LeaderElector,
}

fn start_crashable(server: &FakeApiServer, identity: &str) -> Crashable {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let elector = {
        let _inside = runtime.enter();
        leader::run(server.client(), config(identity), std::future::pending())
            .expect("valid settings")
    };
    Crashable {
        is_leader: elector.subscribe(),
        runtime,
        _elector: elector,
    }
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < PATIENCE,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn lease(server: &FakeApiServer) -> Lease {
    Api::<Lease>::namespaced(server.client(), NAMESPACE)
        .get(LEASE)
        .await
        .expect("the Lease exists")
}

/// When the Lease was last renewed.
async fn last_renewal(server: &FakeApiServer) -> Timestamp {
    lease(server)
        .await
        .spec
        .and_then(|s| s.renew_time)
        .expect("renewed")
        .0
}

fn holder(lease: &Lease) -> Option<String> {
    lease.spec.as_ref()?.holder_identity.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_candidates_exactly_one_leads_and_keeps_leading() {
    let server = FakeApiServer::start().await.expect("fake API server");
    let a = start(&server, "replica-a");
    let b = start(&server, "replica-b");
    wait_until("someone leads", || {
        a.elector.is_leader() || b.elector.is_leader()
    })
    .await;
    let (leader, standby) = if a.elector.is_leader() {
        (&a, &b)
    } else {
        (&b, &a)
    };

    // Several lease durations of renewals: no flapping, never both.
    let mut leader_changes = leader.elector.subscribe();
    let mut standby_changes = standby.elector.subscribe();
    leader_changes.mark_unchanged();
    standby_changes.mark_unchanged();
    let observed = Instant::now();
    while observed.elapsed() < LEASE_DURATION * 2 {
        assert!(
            leader.elector.is_leader(),
            "the leader stepped down while healthy"
        );
        assert!(!standby.elector.is_leader(), "both candidates lead");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !leader_changes.has_changed().expect("open"),
        "the leader's state flapped"
    );
    assert!(
        !standby_changes.has_changed().expect("open"),
        "the standby's state flapped"
    );

    let lease = lease(&server).await;
    assert_eq!(holder(&lease).as_deref(), Some(leader.identity.as_str()));
    let spec = lease.spec.expect("spec");
    assert_eq!(spec.lease_duration_seconds, Some(3));
    assert!(spec.renew_time.is_some() && spec.acquire_time.is_some());

    a.shut_down().await;
    b.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_shuts_down_releases_and_the_standby_takes_over() {
    let (server, first, second) = leader_and_standby("first", "second", 3).await;
    assert!(
        !second.elector.is_leader(),
        "the standby leads while the leader is healthy"
    );

    let mut first_state = first.elector.subscribe();
    first.shut_down().await;
    assert!(
        !*first_state.borrow_and_update(),
        "a stopped leader still reports leading"
    );
    // Released: the Lease has no holder until the standby takes it.
    wait_until("the standby leads", || second.elector.is_leader()).await;
    let lease = lease(&server).await;
    assert_eq!(holder(&lease).as_deref(), Some("second"));
    assert_eq!(lease.spec.and_then(|s| s.lease_transitions), Some(1));
    second.shut_down().await;
    assert_eq!(
        holder(&self::lease(&server).await),
        None,
        "the last leader released the Lease"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_leader_is_replaced_after_its_lease_ran_out_not_before() {
    let server = FakeApiServer::start().await.expect("fake API server");
    let crashed = start_crashable(&server, "crashes");
    wait_until("the first candidate leads", || *crashed.is_leader.borrow()).await;
    let standby = start(&server, "standby");
    // Let the standby observe a few renewals.
    // Time: the standby observes a few renewals (their period is the subject).
    tokio::time::sleep(RETRY_PERIOD * 4).await;
    assert!(!standby.elector.is_leader());

    // The process dies: no step-down, no release.
    let last_renewal = last_renewal(&server).await;
    let crashed_at = Instant::now();
    crashed.runtime.shutdown_background();
    wait_until("the standby leads", || standby.elector.is_leader()).await;
    let took_over_after = crashed_at.elapsed();
    let took_over_at = Timestamp::now();

    // Not before the crashed leader's lease ran out (measured from its last renewal) ...
    let since_last_renewal = took_over_at.duration_since(last_renewal).unsigned_abs();
    assert!(
        since_last_renewal >= LEASE_DURATION,
        "took over {since_last_renewal:?} after the last renewal, within the {LEASE_DURATION:?} lease"
    );
    // ... and within the lease duration plus a retry (and scheduling slack).
    assert!(
        took_over_after <= LEASE_DURATION + RETRY_PERIOD * 2 + Duration::from_secs(2),
        "took {took_over_after:?} to take over a {LEASE_DURATION:?} lease"
    );
    assert_eq!(holder(&lease(&server).await).as_deref(), Some("standby"));
    standby.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_renewals_fail_steps_down_before_its_lease_runs_out() {
    let (server, leader, standby) = leader_and_standby("leader", "standby", 2).await;

    // Every write of the Lease now fails; reads still work.
    let path = format!("/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases");
    server.inject_faults(&path, 1_000_000, 500);
    let mut leader_state = leader.elector.subscribe();
    tokio::time::timeout(PATIENCE, leader_state.wait_for(|leading| !leading))
        .await
        .expect("the leader stepped down")
        .expect("open");
    let stepped_down_at = Timestamp::now();
    let last_renewal = last_renewal(&server).await;
    let held_for = stepped_down_at.duration_since(last_renewal).unsigned_abs();
    assert!(
        held_for < LEASE_DURATION,
        "stepped down {held_for:?} after the last renewal: after its {LEASE_DURATION:?} lease ran out"
    );
    assert_eq!(holder(&lease(&server).await).as_deref(), Some("leader"));

    // Nobody can take the Lease while writes fail.
    let observed = Instant::now();
    while observed.elapsed() < LEASE_DURATION + RETRY_PERIOD * 2 {
        assert!(
            !leader.elector.is_leader() && !standby.elector.is_leader(),
            "someone leads without a Lease write"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let failed_writes = server
        .request_log()
        .iter()
        .filter(|r| r.injected_fault && r.resource == "leases" && r.verb == "update")
        .count();
    assert!(
        failed_writes >= 2,
        "only {failed_writes} renewals were attempted"
    );
    leader.shut_down().await;
    standby.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_lease_was_taken_reports_not_leader_at_once() {
    let (server, leader) = server_with_leader("leader").await;

    // Another holder overwrites the Lease (as a forced takeover would).
    let api = Api::<Lease>::namespaced(server.client(), NAMESPACE);
    let mut taken = api.get(LEASE).await.expect("lease");
    if let Some(spec) = taken.spec.as_mut() {
        spec.holder_identity = Some("intruder".to_string());
    }
    let written = api.replace(LEASE, &PostParams::default(), &taken).await;
    let written = match written {
        Ok(lease) => lease,
        // The leader renewed in between: read again and retry once.
        Err(_) => {
            let mut again = api.get(LEASE).await.expect("lease");
            if let Some(spec) = again.spec.as_mut() {
                spec.holder_identity = Some("intruder".to_string());
            }
            api.replace(LEASE, &PostParams::default(), &again)
                .await
                .expect("overwrite the Lease")
        }
    };
    let taken_at = Instant::now();
    let mut state = leader.elector.subscribe();
    tokio::time::timeout(PATIENCE, state.wait_for(|leading| !leading))
        .await
        .expect("the leader noticed")
        .expect("open");
    // Noticed at the next renewal, well before its own renew deadline.
    assert!(
        taken_at.elapsed() < RENEW_DEADLINE,
        "noticed only after {:?}",
        taken_at.elapsed()
    );
    assert_eq!(holder(&written).as_deref(), Some("intruder"));
    // It does not take the Lease back while the intruder's lease is valid.
    assert!(!leader.elector.is_leader());
    assert_eq!(holder(&lease(&server).await).as_deref(), Some("intruder"));
    leader.shut_down().await;
}

/// Three candidates; the leader is repeatedly shut down and replaced by a fresh candidate.
/// Until someone takes over, every candidate's current state is checked against the old
/// leader's: two "leading" at once is a violation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_handovers_never_have_two_leaders() {
    const HANDOVERS: usize = 6;
    let server = FakeApiServer::start().await.expect("fake API server");
    let mut candidates: Vec<Candidate> = (0..3)
        .map(|i| start(&server, &format!("candidate-{i}")))
        .collect();
    let mut violations = 0;
    let mut leaders = Vec::new();
    for handover in 0..HANDOVERS {
        wait_until("someone leads", || {
            candidates.iter().any(|c| c.elector.is_leader())
        })
        .await;
        if candidates.iter().filter(|c| c.elector.is_leader()).count() > 1 {
            violations += 1;
        }
        let position = candidates
            .iter()
            .position(|c| c.elector.is_leader())
            .expect("a leader");
        let leader = candidates.swap_remove(position);
        leaders.push(leader.identity.clone());
        // Until someone else leads, watch every state: a new leader may only appear once the
        // old one reports "not leader" (it does so before releasing the Lease).
        let old_state = leader.elector.subscribe();
        let stepping_down = tokio::spawn(leader.shut_down());
        let started = Instant::now();
        loop {
            let leading = candidates.iter().filter(|c| c.elector.is_leader()).count();
            if leading > 1 {
                violations += 1;
            }
            if leading > 0 {
                violations += usize::from(*old_state.borrow());
                break;
            }
            assert!(started.elapsed() < PATIENCE, "nobody took over");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        stepping_down.await.expect("step-down task");
        candidates.push(start(&server, &format!("candidate-{}", 3 + handover)));
    }
    assert_eq!(violations, 0, "two leaders at once {violations} times");
    let distinct: std::collections::BTreeSet<_> = leaders.iter().collect();
    assert_eq!(
        distinct.len(),
        HANDOVERS,
        "each handover went to a new leader: {leaders:?}"
    );
    for candidate in candidates {
        candidate.shut_down().await;
    }
}
