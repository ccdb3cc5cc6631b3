//! The chaos suite (issue 13): workers that behave like Jobs take locks (memory and Redis,
//! MongoDB where its test server is there; mutexes and semaphores) through two real
//! `turnstile run --leader-elect` replicas on the fake API server, and do fenced
//! read-modify-writes on a shared register, while a seeded random schedule of faults runs:
//! leader and standby kills, watch 410s, injected 409/500/429 and slow responses, Redis
//! restarts, `FLUSHALL`, `CLIENT PAUSE`, SIGSTOP/SIGCONT, workers paused past their lease.
//! The checker reads the complete history and the test fails on any violation.
//!
//! `TURNSTILE_CHAOS_SECONDS=N` sets the load time (default 100), `TURNSTILE_CHAOS_SEED=S`
//! the seed (default: the clock; printed with the table either way).
//! `TURNSTILE_CHAOS_SECONDS=3600 cargo test --release -p turnstile --test e2e chaos:: -- --nocapture`
//! is the long run.
//!
//! The unfenced control runs the same workers with a register that does not check tokens:
//! the checker must report lost updates there, or it proves nothing.

use crate::support;

// The suite's modules, one concept each (files under `tests/e2e/chaos/`).
pub mod checker;
mod checker_tests;
pub mod effects;
mod effects_tests;
pub mod faults;
pub mod history;
pub mod processes;
pub mod register;
mod seed_tests;
pub mod workers;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use self::checker::{check, table, Kind, LockUnderTest, Report};
use self::effects::{Evidence, STALE_WRITE_REFUSED};
use self::faults::Targets;
use self::history::History;
use self::processes::{Redis, Replica};
use self::register::Register;
use self::workers::Workload;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams};
use kube::Api;
use support::Env;
use test_servers::{MongoFlavor, MongoServer};
use turnstile_api::DistributedLock;
use turnstile_lock::{Backend, MongoBackend, MongoBackendConfig, RedisBackend, RedisBackendConfig};

/// Longest time a lock may stay free while claims wait beyond one lease: a leader takeover
/// after a kill, and the backoff of a backend that was down.
const FREE_MARGIN: Duration = Duration::from_secs(30);
/// How long the drain (workers finishing, every claim deleted) may take.
const DRAIN: Duration = Duration::from_secs(240);
const MONGO_DATABASE: &str = "chaos";
/// Items per page of the fake's paginated lists in a chaos run.
const CHAOS_LIST_PAGE: usize = 8;
/// Load without faults after the last one, so that its effect (a grant after it) can show.
const QUIET: Duration = Duration::from_secs(15);

/// One lock of a run.
struct LockPlan {
    name: &'static str,
    backend: &'static str,
    max_holders: usize,
    lease_seconds: i64,
    workers: usize,
}

struct RunPlan {
    title: &'static str,
    seconds: u64,
    seed: u64,
    fenced: bool,
    faults: bool,
    pause_share: f64,
    pod_share: f64,
    locks: Vec<LockPlan>,
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn seed() -> u64 {
    env_u64("TURNSTILE_CHAOS_SEED").unwrap_or_else(|| history::now() as u64 % 1_000_000)
}

/// Our own MongoDB test server (it gets crashed; an external one `MONGODB_URI` names is left
/// alone), or None after one line; under `CI=true` a missing server fails, as in the other
/// MongoDB tests.
fn mongo() -> Option<MongoServer> {
    MongoServer::start_or_skip(MongoFlavor::ReplicaSet)
}

fn apply_locks(env: &Env, plan: &RunPlan, with_mongo: bool) -> Vec<LockUnderTest> {
    plan.locks
        .iter()
        .filter(|lock| with_mongo || lock.backend != "mongo")
        .map(|lock| {
            env.apply_lock(
                lock.name,
                &format!(
                    "backend: {}\nmaxHolders: {}\nleaseDurationSeconds: {}",
                    lock.backend, lock.max_holders, lock.lease_seconds
                ),
            );
            LockUnderTest {
                name: lock.name.to_owned(),
                max_holders: lock.max_holders,
                lease_seconds: lock.lease_seconds,
                free_margin_ms: FREE_MARGIN.as_millis() as i64,
            }
        })
        .collect()
}

/// Deletes every Pod and claim and waits until the claims are gone; the claims that stayed.
async fn delete_everything(env: &Env) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    let claims = env.claims();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let _ = pods
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await;
        let _ = claims
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await;
        let left: Vec<String> = claims
            .list(&ListParams::default())
            .await
            .map(|list| {
                list.items
                    .into_iter()
                    .filter_map(|c| c.metadata.name)
                    .collect()
            })
            .unwrap_or_else(|_| vec!["(list failed)".into()]);
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The grants still in the backends (and in the locks' statuses) once every claim is gone.
async fn leftovers(
    env: &Env,
    plan: &RunPlan,
    redis: &Redis,
    mongo: Option<&MongoServer>,
) -> Vec<(String, String)> {
    let mut left = Vec::new();
    for claim in delete_everything(env).await {
        left.push(("(any)".to_owned(), format!("claim {claim} never went away")));
    }
    // The last pass of each lock writes its status: wait until every lock shows nobody, or
    // until the wait runs out (then the checks below say which lock still shows whom).
    let deadline = Instant::now() + support::WAIT;
    while Instant::now() < deadline {
        let mut shown = 0;
        for lock in &plan.locks {
            let status = env.locks().get(lock.name).await.ok().and_then(|l| l.status);
            shown += status.map_or(0, |s| s.holders.len() + usize::from(s.waiting > 0));
        }
        if shown == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let redis_backend = RedisBackend::connect(RedisBackendConfig::new(redis.url())).await;
    let mongo_backend = match mongo {
        Some(server) => Some(
            MongoBackend::connect(
                server.uri(),
                MongoBackendConfig::new().database(MONGO_DATABASE.to_owned()),
            )
            .await,
        ),
        None => None,
    };
    for lock in &plan.locks {
        let key = format!("{}/{}", env.namespace, lock.name);
        let snapshot = match lock.backend {
            "redis" => Some(match &redis_backend {
                Ok(backend) => backend.snapshot(&key).await.map_err(|e| e.to_string()),
                Err(error) => Err(error.to_string()),
            }),
            "mongo" => match &mongo_backend {
                Some(Ok(backend)) => Some(backend.snapshot(&key).await.map_err(|e| e.to_string())),
                Some(Err(error)) => Some(Err(error.to_string())),
                None => continue,
            },
            _ => None,
        };
        match snapshot {
            Some(Ok(snapshot)) if !snapshot.holders.is_empty() => left.push((
                lock.name.to_owned(),
                format!(
                    "{} holders in {}: {:?}",
                    snapshot.holders.len(),
                    lock.backend,
                    snapshot.holders
                ),
            )),
            Some(Err(error)) => left.push((
                lock.name.to_owned(),
                format!("cannot read the backend: {error}"),
            )),
            _ => {}
        }
        let status = env
            .locks()
            .get(lock.name)
            .await
            .ok()
            .and_then(|l: DistributedLock| l.status);
        if let Some(status) = status.filter(|s| !s.holders.is_empty() || s.waiting > 0) {
            left.push((
                lock.name.to_owned(),
                format!(
                    "status still shows {} holders, {} waiting",
                    status.holders.len(),
                    status.waiting
                ),
            ));
        }
    }
    left
}

fn replica_args(redis: &Redis, mongo: Option<&MongoServer>) -> Vec<String> {
    let mut args = vec!["--redis-url".to_owned(), redis.url()];
    if let Some(mongo) = mongo {
        args.extend([
            "--mongo-url".to_owned(),
            mongo.uri().to_owned(),
            "--mongo-database".to_owned(),
            MONGO_DATABASE.to_owned(),
        ]);
    }
    args
}

fn tail(path: &std::path::Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// One whole run: set-up, load with faults, drain, check. Returns the report and the table.
async fn run(plan: RunPlan) -> (Report, String) {
    // Small list pages, so every re-list after a fault pages through the claims, and a claim
    // created between two pages must still reach the controller (the hour-long run once lost
    // one for minutes when the fake served later pages from a newer snapshot).
    let fake = fake_apiserver::FakeApiServer::builder().max_list_page(CHAOS_LIST_PAGE);
    let env = Env::fake_only_with("it injects the API faults of the run", fake).await;
    let dir = tempfile::tempdir().expect("run dir");
    // `TURNSTILE_CHAOS_LOG_DIR` keeps the replicas' whole logs for a look afterwards.
    let kept_logs = std::env::var_os("TURNSTILE_CHAOS_LOG_DIR")
        .filter(|dir| !dir.is_empty())
        .map(std::path::PathBuf::from);
    let log_dir = match &kept_logs {
        Some(kept) => {
            std::fs::create_dir_all(kept).expect("TURNSTILE_CHAOS_LOG_DIR");
            kept.clone()
        }
        None => dir.path().to_owned(),
    };
    let uses_mongo = plan.locks.iter().any(|l| l.backend == "mongo");
    let mongo = if uses_mongo {
        tokio::task::block_in_place(mongo)
    } else {
        None
    };
    let redis = tokio::task::block_in_place(Redis::start);
    let args = replica_args(&redis, mongo.as_ref());
    let mut replicas: Vec<Replica> = ["replica-1", "replica-2"]
        .iter()
        .map(|id| Replica::new(id, args.clone(), &env.kubeconfig, &env.namespace, &log_dir))
        .collect();
    for replica in &mut replicas {
        replica.start();
    }
    let history = History::default();
    let watch = history.watch_claims(env.claims());
    let locks = apply_locks(&env, &plan, mongo.is_some());
    println!(
        "chaos: {}: seed {}, {} s, locks {:?}",
        plan.title,
        plan.seed,
        plan.seconds,
        locks.iter().map(|l| &l.name).collect::<Vec<_>>()
    );

    let until = Instant::now() + Duration::from_secs(plan.seconds);
    let load_over = Arc::new(AtomicBool::new(false));
    let seq = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for (index, lock) in plan
        .locks
        .iter()
        .filter(|l| locks.iter().any(|t| t.name == l.name))
        .enumerate()
    {
        let workload = Workload {
            lock: lock.name.to_owned(),
            lease_seconds: lock.lease_seconds,
            claims: env.claims(),
            pods: Api::namespaced(env.client.clone(), &env.namespace),
            register: (lock.max_holders == 1)
                .then(|| Register::new(lock.name, plan.fenced, history.clone())),
            history: history.clone(),
            pause_share: plan.pause_share,
            pod_share: plan.pod_share,
            seq: seq.clone(),
        };
        for worker in 0..lock.workers {
            let seed = plan
                .seed
                .wrapping_mul(1_000)
                .wrapping_add((index * 100 + worker) as u64);
            workers.push(tokio::spawn(
                workload.clone().run_worker(seed, load_over.clone()),
            ));
        }
    }
    let mut targets = Targets {
        fake: env.server(),
        client: env.client.clone(),
        namespace: env.namespace.clone(),
        replicas,
        redis,
        mongo,
        history: history.clone(),
    };
    let applied = if plan.faults {
        let applied = targets.run_schedule(plan.seed, until).await;
        // Time: load without faults, so the last fault's effect can show.
        tokio::time::sleep(QUIET).await;
        applied
    } else {
        // Time: the run's load time.
        tokio::time::sleep_until(until.into()).await;
        Vec::new()
    };
    load_over.store(true, Ordering::SeqCst);
    let drain = tokio::time::timeout(DRAIN, futures::future::join_all(workers)).await;
    assert!(drain.is_ok(), "the workers did not finish within {DRAIN:?}");
    let left = leftovers(&env, &plan, &targets.redis, targets.mongo.as_ref()).await;
    watch.abort();
    targets.stop_replicas();
    let entries = history.entries();
    let mut report = check(&entries, &locks, &left);
    let backends: BTreeMap<String, &'static str> = plan
        .locks
        .iter()
        .map(|lock| (lock.name.to_owned(), lock.backend))
        .collect();
    let requests = env.server().request_log();
    let evidence = Evidence {
        entries: &entries,
        requests: &requests,
        backends: &backends,
    };
    if plan.faults {
        report.expected_faults = faults::kinds(targets.mongo.is_some());
        report.expected_faults.insert(workers::PAUSED);
    }
    report.effects = effects::of_schedule(&applied, &evidence);
    for outcome in &report.effects {
        println!("chaos fault effect: {}: {:?}", outcome.kind, outcome.shown);
    }
    report.effects.extend(effects::of_pauses(&evidence));
    let mut out = table(&report, plan.seed, plan.seconds, plan.title);
    if !report.violations.is_empty() || !report.ineffective().is_empty() {
        for replica in &targets.replicas {
            out.push_str(&format!(
                "\n--- last lines of {}:\n{}\n",
                replica.identity,
                tail(replica.log(), 40)
            ));
        }
    }
    println!("{out}");
    (report, out)
}

fn mutex(name: &'static str, backend: &'static str) -> LockPlan {
    LockPlan {
        name,
        backend,
        max_holders: 1,
        lease_seconds: 3,
        workers: 3,
    }
}

fn semaphore(name: &'static str, backend: &'static str, max_holders: usize) -> LockPlan {
    LockPlan {
        name,
        backend,
        max_holders,
        lease_seconds: 4,
        workers: max_holders + 2,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_run_has_no_violations() {
    let plan = RunPlan {
        title: "chaos (fenced)",
        seconds: env_u64("TURNSTILE_CHAOS_SECONDS").unwrap_or(100),
        seed: seed(),
        fenced: true,
        faults: true,
        pause_share: 0.15,
        pod_share: 0.3,
        locks: vec![
            mutex("mem-mutex", "memory"),
            semaphore("mem-sem", "memory", 3),
            mutex("redis-mutex", "redis"),
            semaphore("redis-sem", "redis", 2),
            mutex("mongo-mutex", "mongo"),
        ],
    };
    let (report, out) = run(plan).await;
    assert!(
        report.operations.get("grants").copied().unwrap_or(0) > 10,
        "too little happened:\n{out}"
    );
    assert!(
        report.violations.is_empty(),
        "the checker found violations:\n{out}"
    );
    // Every fault kind fired and did what it is there for; none skipped.
    assert!(report.expected_faults.len() > 10, "{out}");
    for kind in &report.expected_faults {
        assert!(
            report.effective(kind) > 0,
            "fault {kind:?} never fired with its effect:\n{out}"
        );
    }
    assert_eq!(
        report.ineffective(),
        Vec::<String>::new(),
        "faults without their effect:\n{out}"
    );
    let refused = report.effects.iter().filter(|outcome| {
        outcome
            .shown
            .as_ref()
            .is_ok_and(|shown| shown.ends_with(STALE_WRITE_REFUSED))
    });
    assert!(
        refused.count() > 0,
        "no paused holder's stale write was refused (a later holder must have written first):\n{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfenced_control_reports_lost_updates() {
    let plan = RunPlan {
        title: "unfenced control",
        seconds: 25,
        seed: seed(),
        fenced: false,
        faults: false,
        pause_share: 0.5,
        pod_share: 0.0,
        locks: vec![LockPlan {
            name: "control",
            backend: "memory",
            max_holders: 1,
            lease_seconds: 2,
            workers: 3,
        }],
    };
    let (report, out) = run(plan).await;
    assert!(
        report.count(Kind::LostUpdate) > 0,
        "an unfenced register with holders paused past their lease must lose updates:\n{out}"
    );
    // The fault effects' check fails too: a paused holder's stale write got through.
    assert!(
        report
            .ineffective()
            .iter()
            .any(|fault| fault.contains("stale write") && fault.contains("accepted")),
        "the unfenced register accepted stale writes; the fault effects must say so:\n{out}"
    );
}
