//! One lock, several clusters: two control planes with a controller each (`east` and
//! `west`, by `--cluster-name`), one backend, a `DistributedLock` of the same namespace and
//! name in each. The etcd walk-through: one holder across both, shown in the other cluster as
//! `cluster NAME`, a claim waiting for another cluster's grant served before that cluster's
//! next claim, tokens rising across both, and a cluster whose controller dies while holding
//! gives the lock up when the lease runs out. And a mixed run on each backend:
//! workers in both clusters take and let go of the one lock, some leave a grant to run out;
//! the spans in which each worker saw its claim held never overlap and their tokens rise in
//! that order — and the control (the two locks on different keys) shows that this check
//! catches double grants.

use crate::support;

use std::time::{Duration, Instant, SystemTime};

use kube::Api;
use rand::{Rng, SeedableRng};
use support::launch::{blocking, launch};
use support::{create_from_json, phase_of, position_of, token_of, Env};
use test_servers::{EtcdCluster, MongoServer, RedisServer};
use tokio::sync::oneshot;
use turnstile_api::{ClaimPhase, DistributedLock, LockClaim};
use turnstile_controller::runtime::backends::{EtcdSettings, MongoSettings};
use turnstile_controller::ControllerConfig;

/// Samples the claims of lock `db` in both clusters every 20 ms: holders at once across both
/// (see [`is_live_holder`]: a dead controller's claim keeps its last status), and the tokens
/// of new holders in the order seen.
struct TwoClusterMonitor {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<(usize, usize, Vec<i64>)>,
}

impl TwoClusterMonitor {
    fn start(a: &Env, b: &Env) -> Self {
        let apis = [a.claims(), b.claims()];
        let (stop, mut stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let (mut samples, mut over, mut tokens) = (0, 0, Vec::<i64>::new());
            loop {
                // Asked to stop: one more sample, taken after the ask, so that what the test
                // saw before it asked (the last grant) is in the report.
                let stopping = stopped.try_recv().is_ok();
                let mut holders = Vec::new();
                for api in &apis {
                    if let Ok(list) = api.list(&Default::default()).await {
                        holders.extend(list.items.into_iter().filter(is_live_holder));
                    }
                }
                samples += 1;
                if holders.len() > 1 {
                    over += 1;
                }
                for token in holders.iter().filter_map(token_of) {
                    if !tokens.contains(&token) {
                        tokens.push(token);
                    }
                }
                if stopping {
                    return (samples, over, tokens);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        TwoClusterMonitor { stop, task }
    }

    /// Stops sampling: (samples, samples with two holders, tokens in the order seen).
    async fn finish(self) -> (usize, usize, Vec<i64>) {
        let _ = self.stop.send(());
        self.task.await.expect("monitor task")
    }
}

/// A claim held and not let go: not deleted (its holder let go when it deleted it; the
/// backend's release and the finalizer's removal follow) and with its lease still running.
fn is_live_holder(claim: &LockClaim) -> bool {
    let expires_at = claim.status.as_ref().and_then(|s| s.expires_at.as_ref());
    phase_of(claim) == Some(ClaimPhase::Held)
        && claim.metadata.deletion_timestamp.is_none()
        && expires_at.is_some_and(|at| at.0.as_second() >= unix_seconds())
}

fn unix_seconds() -> i64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    now.map_or(0, |since| {
        i64::try_from(since.as_secs()).unwrap_or(i64::MAX)
    })
}

/// Waits until `env`'s lock `db` shows `summary` in its Holders column (`kubectl get locks`).
async fn until_holders_shown(env: &Env, summary: &str) {
    let shown = |lock: &DistributedLock| {
        lock.status
            .as_ref()
            .and_then(|s| s.holder_summary.as_deref())
            == Some(summary)
    };
    env.wait_lock("db", shown).await;
    let table = env.kubectl(&["get", "distributedlocks", "db"]);
    assert!(table.contains(summary), "kubectl get locks:\n{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clusters_share_one_lock_on_etcd() {
    let etcd = SharedBackend::Etcd(launch(EtcdCluster::start, "etcd starts").await);
    let (mut east, mut west) = east_and_west(&etcd, "leaseDurationSeconds: 6", None).await;
    let monitor = TwoClusterMonitor::start(&east, &west);

    // east holds; west's claim waits, told the key is busy, and west's lock names the
    // holder's cluster.
    east.apply_claim("e1", "db", "");
    let e1 = east.wait_phase("e1", ClaimPhase::Held).await;
    assert_eq!(token_of(&e1), Some(1));
    west.apply_claim("w1", "db", "");
    west.wait_pending_for("w1", "LockBusy").await;
    until_holders_shown(&west, "cluster east").await;
    let holder = west.lock("db").await.status.expect("status").holders;
    assert_eq!(
        (holder[0].cluster.as_deref(), holder[0].fencing_token),
        (Some("east"), 1)
    );

    // w1 waits in etcd's queue for the key; east's next claim, e2, comes after it.
    east.apply_claim("e2", "db", "");
    east.wait_claim("e2", |claim| position_of(claim) == Some(1))
        .await;

    // east lets go: etcd hands the key to w1, first in its queue, not to e2 — west's
    // controller sees it at its next try (every 2 s at least), with the next token.
    east.delete_claim("e1").await;
    let w1 = west.wait_phase("w1", ClaimPhase::Held).await;
    assert_eq!(token_of(&w1), Some(2));
    east.wait_pending_for("e2", "LockBusy").await;
    until_holders_shown(&west, &w1.holder_identity()).await;
    until_holders_shown(&east, "cluster west").await;

    // west's controller dies while w1 holds: nothing renews the grant, and east's claim is
    // granted once its lease ran out in etcd, not before.
    west.stop_controller().await;
    let w1 = west.claim("w1").await;
    let w1_expires = w1
        .status
        .as_ref()
        .and_then(|s| s.expires_at.clone())
        .expect("w1's expiry");
    let e2 = east.wait_phase("e2", ClaimPhase::Held).await;
    assert_eq!(token_of(&e2), Some(3));
    let e2_acquired = e2
        .status
        .as_ref()
        .and_then(|s| s.acquired_at.clone())
        .expect("e2's grant time");
    // Both whole seconds (the API server's Time).
    assert!(
        e2_acquired.0.as_second() >= w1_expires.0.as_second() - 1,
        "e2 granted at {e2_acquired:?}, before w1's lease ended at {w1_expires:?}"
    );
    let (samples, over, tokens) = monitor.finish().await;
    assert!(samples > 10, "the monitor sampled ({samples})");
    assert_eq!(over, 0, "two live holders across the clusters");
    assert_eq!(tokens, [1, 2, 3], "tokens rise across both clusters");

    // Back, west's controller finds w1's grant gone and says so.
    west.start_controller(etcd.config_in("west"));
    let w1 = west.wait_phase("w1", ClaimPhase::Expired).await;
    println!("w1 after its controller came back: {:?}", w1.status);
    until_holders_shown(&west, "cluster east").await;
    west.stop_controller().await;
    east.stop_controller().await;
}

/// A cluster whose controller dies while its claim waits in the backend's queue holds the
/// others up briefly: the backend hands the key to that place when it frees (nobody
/// renews the grant, whose lease is at most the place's 10 s), then to the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_clusters_place_in_the_backends_queue_holds_the_others_up_briefly() {
    let etcd = SharedBackend::Etcd(launch(EtcdCluster::start, "etcd starts").await);
    let (mut east, mut west) = east_and_west(&etcd, "leaseDurationSeconds: 60", None).await;

    east.apply_claim("e1", "db", "");
    east.wait_phase("e1", ClaimPhase::Held).await;
    west.apply_claim("w1", "db", "");
    west.wait_pending_for("w1", "LockBusy").await;
    east.apply_claim("e2", "db", "");
    east.wait_claim("e2", |claim| position_of(claim) == Some(1))
        .await;
    west.stop_controller().await;

    // e1 lets go: the key goes to w1's place, whose controller is gone; e2 gets it once that
    // grant runs out — within the place's 10 s and a retry, far inside e2's 60 s lease.
    let released = Instant::now();
    east.delete_claim("e1").await;
    let e2 = east.wait_phase("e2", ClaimPhase::Held).await;
    let waited = released.elapsed();
    assert_eq!(token_of(&e2), Some(3), "w1's place was granted token 2");
    assert!(waited < Duration::from_secs(25), "e2 waited {waited:?}");
    east.stop_controller().await;
}

/// Two clusters, `east` and `west`, each with its controller on `backend` and lock `db` on it
/// (`spec`: the lines after `backend: …`; west's on backend key `west_key` when given, else
/// on east's).
async fn east_and_west(backend: &SharedBackend, spec: &str, west_key: Option<&str>) -> (Env, Env) {
    let spec = format!("backend: {}\n{spec}", backend.name());
    let mut east = Env::new().await;
    east.start_controller(backend.config_in("east"));
    east.apply_lock("db", &spec);
    let mut west = east.another_cluster_like().await;
    west.start_controller(backend.config_in("west"));
    let west_spec = match west_key {
        Some(key) => format!("{spec}\nkey: {key}"),
        None => spec,
    };
    west.apply_lock("db", &west_spec);
    (east, west)
}

/// A backend server both clusters' controllers use.
enum SharedBackend {
    Redis(RedisServer),
    Mongo(std::sync::Arc<MongoServer>),
    Etcd(EtcdCluster),
}

impl SharedBackend {
    /// `spec.backend` of the locks on it.
    fn name(&self) -> &'static str {
        match self {
            SharedBackend::Redis(_) => "redis",
            SharedBackend::Mongo(_) => "mongo",
            SharedBackend::Etcd(_) => "etcd",
        }
    }

    /// The controller's settings for this server, in the cluster named `cluster`.
    fn config_in(&self, cluster: &str) -> ControllerConfig {
        let config = ControllerConfig {
            cluster_name: Some(cluster.to_owned()),
            ..ControllerConfig::default()
        };
        match self {
            SharedBackend::Redis(server) => ControllerConfig {
                redis_url: Some(server.url().to_owned()),
                ..config
            },
            SharedBackend::Mongo(server) => ControllerConfig {
                mongo: Some(MongoSettings {
                    url: server.uri().to_owned(),
                    database: Some("turnstile_clusters".to_owned()),
                    collection: None,
                }),
                ..config
            },
            SharedBackend::Etcd(server) => ControllerConfig {
                etcd: Some(EtcdSettings::new(server.url())),
                ..config
            },
        }
    }
}

/// How long each mixed run lasts: `TURNSTILE_MIXED_RUN_SECONDS`, else 15 s (the suite's
/// run; the 10-minute run is this test with 600).
fn mixed_run_length() -> Duration {
    let seconds = std::env::var("TURNSTILE_MIXED_RUN_SECONDS")
        .ok()
        .map(|value| {
            value
                .parse::<u64>()
                .expect("TURNSTILE_MIXED_RUN_SECONDS: seconds")
        });
    Duration::from_secs(seconds.unwrap_or(15))
}

/// Workers per cluster in a mixed run.
const WORKERS: u64 = 2;

/// One grant as its worker saw it: from the moment the worker saw its claim `Held` until it
/// deleted the claim — or, for a grant it left to run out, until its `expiresAt`. The real
/// grant spans at least that, so two such spans that overlap are a double grant.
#[derive(Debug, Clone)]
struct SeenGrant {
    claim: String,
    token: i64,
    seen: SystemTime,
    until: SystemTime,
}

/// What the workers of a mixed run saw.
#[derive(Debug, Default)]
struct MixedRun {
    grants: Vec<SeenGrant>,
    /// Claims left to run out (deleted after the run).
    left: Vec<(Api<LockClaim>, String)>,
    /// Claims not granted by the end of the run (and a margin).
    not_granted: usize,
}

impl MixedRun {
    /// Grants whose span began before an earlier one's ended, and grants whose token is not
    /// above the one seen before, in the order the spans began.
    fn violations(&mut self) -> (usize, usize) {
        self.grants.sort_by_key(|grant| grant.seen);
        let (mut overlaps, mut inversions) = (0, 0);
        let mut latest_end = SystemTime::UNIX_EPOCH;
        let mut last_token = 0;
        for grant in &self.grants {
            if grant.seen < latest_end {
                overlaps += 1;
                println!("overlap: {grant:?} began before {latest_end:?}");
            }
            if grant.token <= last_token {
                inversions += 1;
                println!("token not above {last_token}: {grant:?}");
            }
            latest_end = latest_end.max(grant.until);
            last_token = last_token.max(grant.token);
        }
        (overlaps, inversions)
    }

    /// The grants made in the cluster whose workers' claims start with `cluster`.
    fn grants_in(&self, cluster: &str) -> usize {
        (self.grants.iter())
            .filter(|grant| grant.claim.starts_with(cluster))
            .count()
    }
}

/// When a claim's `expiresAt` is.
fn expires_at(claim: &LockClaim) -> SystemTime {
    let seconds = claim
        .status
        .as_ref()
        .and_then(|status| status.expires_at.as_ref())
        .map(|at| at.0.as_second())
        .expect("a held claim's expiresAt");
    SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(seconds).expect("after 1970"))
}

/// One worker until `end`: creates a claim on `db`, waits until it is held, keeps it 20–200 ms
/// and deletes it, or (one in six) leaves it to run out; thinks up to 300 ms; again.
async fn mixed_worker(claims: Api<LockClaim>, who: String, seed: u64, end: Instant) -> MixedRun {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut run = MixedRun::default();
    let give_up = end + Duration::from_secs(30);
    for round in 0.. {
        if Instant::now() >= end {
            break;
        }
        let name = format!("{who}-{round}");
        let object = serde_json::json!({
            "apiVersion": "turnstile.dev/v1alpha1",
            "kind": "LockClaim",
            "metadata": {"name": name},
            "spec": {"lockName": "db"}
        });
        create_from_json(&claims, object).await;
        let held = loop {
            let claim = claims.get(&name).await.expect("get claim");
            if phase_of(&claim) == Some(ClaimPhase::Held) {
                break Some(claim);
            }
            if Instant::now() >= give_up {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let Some(claim) = held else {
            run.not_granted += 1;
            let _ = claims.delete(&name, &Default::default()).await;
            break;
        };
        let seen = SystemTime::now();
        let token = token_of(&claim).expect("a held claim's token");
        if rng.random_range(0..6) == 0 {
            run.grants.push(SeenGrant {
                claim: name.clone(),
                token,
                seen,
                until: expires_at(&claim),
            });
            run.left.push((claims.clone(), name));
        } else {
            // Time: the worker's work while it holds the lock.
            tokio::time::sleep(Duration::from_millis(rng.random_range(20..200))).await;
            run.grants.push(SeenGrant {
                claim: name.clone(),
                token,
                seen,
                until: SystemTime::now(),
            });
            claims
                .delete(&name, &Default::default())
                .await
                .expect("delete claim");
        }
        // Time: the worker thinks before it asks again.
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..300))).await;
    }
    run
}

/// Two clusters with their controllers on `backend`, lock `db` in each (lease 3 s; west's on
/// backend key `west_key` when given, else the same as east's), [`WORKERS`] workers in each
/// for `length`: what they saw.
async fn mixed_run(backend: &SharedBackend, west_key: Option<&str>, length: Duration) -> MixedRun {
    let (mut east, mut west) = east_and_west(backend, "leaseDurationSeconds: 3", west_key).await;
    let end = Instant::now() + length;
    let mut workers = Vec::new();
    for (cluster, env) in [("east", &east), ("west", &west)] {
        for worker in 0..WORKERS {
            let who = format!("{cluster}-{worker}");
            let seed = worker + if cluster == "east" { 0 } else { 100 };
            workers.push(tokio::spawn(mixed_worker(env.claims(), who, seed, end)));
        }
    }
    let mut run = MixedRun::default();
    for worker in workers {
        let seen = worker.await.expect("worker");
        run.grants.extend(seen.grants);
        run.left.extend(seen.left);
        run.not_granted += seen.not_granted;
    }
    for (claims, name) in std::mem::take(&mut run.left) {
        let _ = claims.delete(&name, &Default::default()).await;
    }
    west.stop_controller().await;
    east.stop_controller().await;
    run
}

/// The mixed run on `backend`: no double grant, tokens rising, and both clusters served.
async fn mixed_run_holds_on(backend: SharedBackend) {
    let length = mixed_run_length();
    let mut run = mixed_run(&backend, None, length).await;
    let (overlaps, inversions) = run.violations();
    println!(
        "{} for {length:?}: {} grants (east {}, west {}), {} not granted by the end",
        backend.name(),
        run.grants.len(),
        run.grants_in("east"),
        run.grants_in("west"),
        run.not_granted
    );
    assert_eq!(
        (overlaps, inversions),
        (0, 0),
        "double grants, token inversions"
    );
    // The backend's queue orders the clusters' heads: neither keeps the lock from the
    // other (they take turns; a quarter leaves room for the random think times).
    let fewer = run.grants_in("east").min(run.grants_in("west"));
    assert!(
        fewer * 4 >= run.grants.len() && fewer > 0,
        "each cluster had its turns"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_run_of_two_clusters_on_redis_grants_one_at_a_time() {
    let server = blocking(|| RedisServer::start().expect("start redis-server")).await;
    mixed_run_holds_on(SharedBackend::Redis(server)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_run_of_two_clusters_on_mongo_grants_one_at_a_time() {
    let Some(server) = blocking(MongoServer::shared_or_skip).await else {
        return;
    };
    mixed_run_holds_on(SharedBackend::Mongo(server)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_run_of_two_clusters_on_etcd_grants_one_at_a_time() {
    let server = launch(EtcdCluster::start, "etcd starts").await;
    mixed_run_holds_on(SharedBackend::Etcd(server)).await;
}

/// The control: the same run with the two clusters' locks on different backend keys (two
/// locks, each granted in its own cluster) must show overlapping spans — the check above can
/// fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mixed_run_check_catches_two_clusters_holding_at_once() {
    let server = blocking(|| RedisServer::start().expect("start redis-server")).await;
    let backend = SharedBackend::Redis(server);
    let mut run = mixed_run(&backend, Some("not-shared"), Duration::from_secs(8)).await;
    let (overlaps, _) = run.violations();
    assert!(
        overlaps > 0,
        "the check saw no overlap in {} grants",
        run.grants.len()
    );
}
