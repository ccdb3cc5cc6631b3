//! One run of the operator benchmark: the real `turnstile run` process (memory backend) against
//! the fake API server, driven by plain API clients. Shared by the benchmark (`main.rs`) and by
//! the suite's smoke run with tiny knobs (`tests/operator_bench.rs`), which includes this file.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::actor;
use fake_apiserver::{FakeApiServer, RecordedRequest};
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;
use turnstile_api::{
    ClaimPhase, DistributedLock, LockClaim, LOCK_ANNOTATION, LOCK_LABEL, SCHEDULING_GATE,
};

const NAMESPACE: &str = "bench";
const BENCH: &str = "bench";
/// Bound on any one wait: a stuck run fails instead of hanging.
const WAIT: Duration = Duration::from_secs(600);

/// The benchmark's knobs: how large and how long each part of the run is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Knobs {
    /// Latency samples per row (`TURNSTILE_BENCH_SAMPLES`).
    pub samples: usize,
    /// Waiters behind the deep queue's holder (`TURNSTILE_BENCH_DEEP`).
    pub deep: usize,
    /// Locks of the scale rows, 10 claims each (`TURNSTILE_BENCH_LOCKS`).
    pub locks: usize,
    /// How long the idle row watches for writes (`TURNSTILE_BENCH_IDLE_SECONDS`).
    pub idle_seconds: u64,
}

impl Knobs {
    /// What `cargo bench` runs when no knob is set.
    pub const DEFAULT: Self = Self {
        samples: 50,
        deep: 1000,
        locks: 1000,
        idle_seconds: 60,
    };

    /// `defaults`, with every knob that `lookup` (the environment, in the benchmark) sets.
    /// A knob that is set but not a whole number is an error naming it, not a silent default.
    pub fn read(lookup: impl Fn(&str) -> Option<String>, defaults: Self) -> Result<Self, String> {
        let number = |name: &str, default: usize| match lookup(name) {
            None => Ok(default),
            Some(value) => value
                .trim()
                .parse()
                .map_err(|_| format!("{name} must be a whole number, got {value:?}")),
        };
        Ok(Self {
            samples: number("TURNSTILE_BENCH_SAMPLES", defaults.samples)?.max(1),
            deep: number("TURNSTILE_BENCH_DEEP", defaults.deep)?.max(1),
            locks: number("TURNSTILE_BENCH_LOCKS", defaults.locks)?.max(1),
            idle_seconds: number(
                "TURNSTILE_BENCH_IDLE_SECONDS",
                defaults.idle_seconds as usize,
            )? as u64,
        })
    }
}

/// What a run measured: the table's rows as printed, and the counts a smoke run checks.
pub struct Report {
    /// The Markdown rows, in order (without the header).
    pub rows: Vec<String>,
    /// API writes per hand-off in the deep queue, sorted.
    pub writes_per_hand_off: Vec<usize>,
    /// Controller writes during the idle row.
    pub idle_writes: usize,
    /// Controller writes (leases aside) during the re-sync after a restart.
    pub resync_writes: usize,
}

/// When each object (by name) first met a condition, as seen on a watch.
#[derive(Clone, Default)]
struct Seen {
    at: Arc<Mutex<HashMap<String, Instant>>>,
}

impl Seen {
    /// Watches `api`, recording each object the first time `done` holds for it.
    fn watch<K>(api: Api<K>, done: fn(&K) -> bool) -> Self
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    {
        let [seen] = Self::watch_each(api, [done]);
        seen
    }

    /// One watch of `api` recording, for each condition, each object the first time it holds:
    /// one watch, not one per condition, so the benchmark's own watching costs the API server
    /// (and this process, which hosts it) as little as it can.
    fn watch_each<K, const N: usize>(api: Api<K>, conditions: [fn(&K) -> bool; N]) -> [Self; N]
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    {
        let seen: [Self; N] = std::array::from_fn(|_| Self::default());
        let records: Vec<_> = seen.iter().map(|seen| seen.at.clone()).collect();
        tokio::spawn(async move {
            let events = watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects();
            let mut events = std::pin::pin!(events);
            while let Some(Ok(object)) = events.next().await {
                for (done, at) in conditions.iter().zip(&records) {
                    if done(&object) {
                        let mut at = at.lock().unwrap_or_else(|p| p.into_inner());
                        at.entry(object.name_any()).or_insert_with(Instant::now);
                    }
                }
            }
        });
        seen
    }

    fn get(&self, name: &str) -> Option<Instant> {
        self.at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .copied()
    }

    fn count(&self, prefix: &str) -> usize {
        self.at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .filter(|name| name.starts_with(prefix))
            .count()
    }

    async fn wait(&self, name: &str) -> Instant {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(at) = self.get(name) {
                return at;
            }
            assert!(Instant::now() < deadline, "{name} never seen");
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
    }

    async fn wait_count(&self, prefix: &str, count: usize) -> Instant {
        let deadline = Instant::now() + WAIT;
        loop {
            if self.count(prefix) >= count {
                return Instant::now();
            }
            assert!(
                Instant::now() < deadline,
                "only {} of {count} {prefix}* seen",
                self.count(prefix)
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

fn held(claim: &LockClaim) -> bool {
    claim.status.as_ref().and_then(|s| s.phase) == Some(ClaimPhase::Held)
}

fn has_status(claim: &LockClaim) -> bool {
    claim.status.as_ref().and_then(|s| s.phase).is_some()
}

fn unsuspended(job: &Job) -> bool {
    job.spec.as_ref().and_then(|s| s.suspend) == Some(false)
}

fn ungated(pod: &Pod) -> bool {
    pod.labels().contains_key(LOCK_LABEL)
        && !pod
            .spec
            .as_ref()
            .and_then(|spec| spec.scheduling_gates.as_ref())
            .is_some_and(|gates| gates.iter().any(|gate| gate.name == SCHEDULING_GATE))
}

/// An empty ConfigMap called `name` (the floor's and the grant chain's object).
fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}})).expect("cm")
}

/// The data key the grant-chain row's last patch sets.
const MARK: &str = "held";

fn marked(map: &ConfigMap) -> bool {
    map.data
        .as_ref()
        .is_some_and(|data| data.contains_key(MARK))
}

fn exists(_: &ConfigMap) -> bool {
    true
}

fn lock(name: &str, max_holders: i32) -> DistributedLock {
    serde_json::from_value(json!({
        "apiVersion": "turnstile.dev/v1alpha1", "kind": "DistributedLock",
        "metadata": {"name": name},
        "spec": {"leaseDurationSeconds": 300, "maxHolders": max_holders}
    }))
    .expect("lock")
}

fn claim(name: &str, lock: &str) -> LockClaim {
    serde_json::from_value(json!({
        "apiVersion": "turnstile.dev/v1alpha1", "kind": "LockClaim",
        "metadata": {"name": name},
        "spec": {"lockName": lock}
    }))
    .expect("claim")
}

/// Latency statistics of one row.
struct Stats {
    p50: Duration,
    p99: Duration,
    max: Duration,
}

fn stats(mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    Stats {
        p50: at(0.5),
        p99: at(0.99),
        max: *samples.last().expect("samples"),
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

struct Table {
    floor: Duration,
    rows: Vec<String>,
}

impl Table {
    fn latency(&mut self, scenario: &str, samples: Vec<Duration>, note: &str) {
        let n = samples.len();
        let s = stats(samples);
        let x = |d: Duration| format!("{:.1}×", d.as_secs_f64() / self.floor.as_secs_f64());
        self.rows.push(format!(
            "| {scenario} | {} ({}) | {} ({}) | {} ({}) | {n} | {note} |",
            ms(s.p50),
            x(s.p50),
            ms(s.p99),
            x(s.p99),
            ms(s.max),
            x(s.max)
        ));
        println!("{}", self.rows.last().expect("row"));
    }

    fn fact(&mut self, scenario: &str, value: String) {
        self.rows.push(format!("| {scenario} | {value} | | | | |"));
        println!("{}", self.rows.last().expect("row"));
    }
}

/// The controller process.
struct Controller {
    child: Child,
    metrics: SocketAddr,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

impl Controller {
    fn start(kubeconfig: &std::path::Path) -> Self {
        let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        // `TURNSTILE_BENCH_CONTROLLER_LOG`: the controller's `RUST_LOG`, its log (on stdout)
        // shown, to see where a grant's time goes; by default warnings only, on stderr.
        let log = std::env::var("TURNSTILE_BENCH_CONTROLLER_LOG").ok();
        let child = Command::new(env!("CARGO_BIN_EXE_turnstile"))
            .args(["run", "--namespace", NAMESPACE, "--metrics-addr"])
            .arg(metrics.to_string())
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", log.as_deref().unwrap_or("warn"))
            .stdout(if log.is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start turnstile run");
        Self { child, metrics }
    }

    async fn wait_ready(&self) -> Instant {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(mut stream) = tokio::net::TcpStream::connect(self.metrics).await {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let request = "GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
                if stream.write_all(request.as_bytes()).await.is_ok() {
                    let mut answer = String::new();
                    let _ = stream.read_to_string(&mut answer).await;
                    if answer.starts_with("HTTP/1.1 200") {
                        return Instant::now();
                    }
                }
            }
            assert!(Instant::now() < deadline, "controller never ready");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Resident memory (kB): now and the peak.
    fn rss_kb(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        let field = |key: &str| {
            status
                .lines()
                .find(|line| line.starts_with(key))
                .and_then(|line| line.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

/// Where the machine's CPU went over a stretch of the run, from `/proc` (all in the kernel's
/// clock ticks, so the shares need no tick rate): the whole machine, the controller process,
/// and this process (the fake API server and the benchmark's clients and watchers).
struct CpuSample {
    machine_busy: u64,
    machine_total: u64,
    controller: u64,
    this_process: u64,
}

impl CpuSample {
    fn take(controller_pid: u32) -> Self {
        let (machine_busy, machine_total) = machine_ticks();
        Self {
            machine_busy,
            machine_total,
            controller: process_ticks(&controller_pid.to_string()),
            this_process: process_ticks("self"),
        }
    }

    /// Shares of the machine's capacity since `earlier`, as percentages of all its cores:
    /// busy in all, the controller, the fake API server with the benchmark.
    fn shares_since(&self, earlier: &Self) -> String {
        let total = self
            .machine_total
            .saturating_sub(earlier.machine_total)
            .max(1) as f64;
        let share = |now: u64, then: u64| 100.0 * now.saturating_sub(then) as f64 / total;
        format!(
            "CPU busy {:.0}% of the machine: controller {:.0}%, API server + bench {:.0}%",
            share(self.machine_busy, earlier.machine_busy),
            share(self.controller, earlier.controller),
            share(self.this_process, earlier.this_process),
        )
    }
}

/// The machine's busy and total clock ticks over all cores (`/proc/stat`'s `cpu` line; idle
/// and I/O wait are not busy).
fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|field| field.parse().ok())
        .collect();
    let total = ticks.iter().sum();
    let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// A process's user and system clock ticks, all its threads (`/proc/PID/stat` fields 14, 15).
fn process_ticks(pid: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name (field 2) may hold spaces: count the fields after its closing `)`.
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // `fields[0]` is field 3 (the state), so fields 14 and 15 are at 11 and 12.
    [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<u64>().ok()))
        .sum()
}

/// The controller's requests (everything the bench's tagged client did not send).
fn controller_requests(server: &FakeApiServer) -> Vec<RecordedRequest> {
    server
        .request_log()
        .into_iter()
        .filter(|r| !actor::sent_by(r, BENCH) && r.is_resource_request)
        .collect()
}

fn is_write(r: &RecordedRequest) -> bool {
    matches!(r.verb.as_str(), "create" | "update" | "patch" | "delete")
}

async fn settle(server: &FakeApiServer, quiet: Duration) {
    let mut last = server.request_count();
    let mut since = Instant::now();
    let deadline = Instant::now() + WAIT;
    while since.elapsed() < quiet && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = server.request_count();
        if now != last {
            last = now;
            since = Instant::now();
        }
    }
}

async fn create<K>(api: &Api<K>, object: &K)
where
    K: Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    api.create(&PostParams::default(), object)
        .await
        .expect("create");
}

/// Creates many objects with bounded concurrency.
async fn create_all<K>(api: &Api<K>, objects: Vec<K>)
where
    K: Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    futures::stream::iter(objects)
        .map(|object| async move { create(api, &object).await })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
}

/// Runs every scenario once with `knobs`, printing each row as it is measured.
pub async fn run(knobs: Knobs) -> Report {
    let Knobs {
        samples,
        deep,
        locks: locks_at_scale,
        idle_seconds,
    } = knobs;

    let server = FakeApiServer::start().await.expect("fake API server");
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let client: Client = actor::tagged_client(&server, BENCH);
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    for crd in turnstile_api::crds() {
        create(&crds, &crd).await;
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    create(
        &namespaces,
        &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).expect("ns"),
    )
    .await;
    let locks: Api<DistributedLock> = Api::namespaced(client.clone(), NAMESPACE);
    let claims: Api<LockClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let jobs: Api<Job> = Api::namespaced(client.clone(), NAMESPACE);

    let controller = Controller::start(&kubeconfig);
    controller.wait_ready().await;

    // The floor: create an object and see it on our own watch.
    // One watch of ConfigMaps for both rows that use them (see `Seen::watch_each`).
    let [seen_maps, seen_marked] = Seen::watch_each(config_maps.clone(), [exists, marked]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut floor_samples = Vec::new();
    for i in 0..samples {
        let name = format!("floor-{i}");
        let start = Instant::now();
        create(&config_maps, &config_map(&name)).await;
        floor_samples.push(seen_maps.wait(&name).await - start);
    }
    let floor = stats(floor_samples.clone()).p50;
    let mut table = Table {
        floor,
        rows: Vec::new(),
    };
    println!(
        "| scenario | p50 ms (× floor) | p99 ms (× floor) | max ms (× floor) | samples | notes |"
    );
    println!("|---|---|---|---|---|---|");
    table.latency(
        "API floor: create → seen on own watch",
        floor_samples,
        "the unit of the ratios",
    );

    // The least a grant can cost on this API server: the requests of create → `Held` made one
    // after the other by a client in this process, with no controller between them (create,
    // seen on the watch, the finalizer's patch, the status's patch, seen on the watch).
    let mut chain = Vec::new();
    for i in 0..samples {
        let name = format!("chain-{i}");
        let start = Instant::now();
        create(&config_maps, &config_map(&name)).await;
        seen_maps.wait(&name).await;
        for patch in [
            json!({"metadata": {"annotations": {"bench/finalizer": "yes"}}}),
            json!({"data": {MARK: "yes"}}),
        ] {
            config_maps
                .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .expect("patch");
        }
        chain.push(seen_marked.wait(&name).await - start);
    }
    table.latency(
        "a grant's requests in a row, no controller: create → seen → patch → patch → seen",
        chain,
        "the least create → `Held` can take here",
    );

    let [seen_held, seen_status] = Seen::watch_each(claims.clone(), [held, has_status]);

    // An idle lock: create → Held.
    create(&locks, &lock("idle", 1)).await;
    let mut idle = Vec::new();
    for i in 0..samples {
        let name = format!("idle-{i}");
        let start = Instant::now();
        create(&claims, &claim(&name, "idle")).await;
        idle.push(seen_held.wait(&name).await - start);
        claims
            .delete(&name, &DeleteParams::default())
            .await
            .expect("delete");
        wait_free(&locks, "idle").await;
    }
    table.latency("claim create → `Held`, idle lock", idle, "");

    // A claim on three idle locks at once: create → `Held` (all of them).
    let triple = ["multi-a", "multi-b", "multi-c"];
    for name in triple {
        create(&locks, &lock(name, 1)).await;
    }
    let mut multi = Vec::new();
    for i in 0..samples {
        let name = format!("multi-{i}");
        let mut on_three = claim(&name, "");
        on_three.spec = turnstile_api::LockClaimSpec::for_locks(triple);
        let start = Instant::now();
        create(&claims, &on_three).await;
        multi.push(seen_held.wait(&name).await - start);
        claims
            .delete(&name, &DeleteParams::default())
            .await
            .expect("delete");
        for lock in triple {
            wait_free(&locks, lock).await;
        }
    }
    table.latency("claim on 3 locks create → `Held`, idle locks", multi, "");

    // Release → next Held, one waiter behind the holder.
    create(&locks, &lock("relay", 1)).await;
    create(&claims, &claim("relay-0000", "relay")).await;
    seen_held.wait("relay-0000").await;
    let mut relay = Vec::new();
    for i in 0..samples {
        let next = format!("relay-{:04}", i + 1);
        create(&claims, &claim(&next, "relay")).await;
        seen_status.wait(&next).await;
        let start = Instant::now();
        claims
            .delete(&format!("relay-{i:04}"), &DeleteParams::default())
            .await
            .expect("delete");
        relay.push(seen_held.wait(&next).await - start);
    }
    table.latency("release (claim deleted) → next `Held`", relay, "");

    // A deep queue.
    create(&locks, &lock("deep", 1)).await;
    create_all(
        &claims,
        (0..=deep)
            .map(|i| claim(&format!("deep-{i:05}"), "deep"))
            .collect(),
    )
    .await;
    seen_status.wait_count("deep-", deep + 1).await;
    settle(&server, Duration::from_millis(500)).await;
    let mut hand_offs = Vec::new();
    let mut writes = Vec::new();
    for i in 0..samples.min(deep) {
        let before = controller_requests(&server)
            .iter()
            .filter(|r| is_write(r))
            .count();
        let start = Instant::now();
        claims
            .delete(&format!("deep-{i:05}"), &DeleteParams::default())
            .await
            .expect("delete");
        hand_offs.push(seen_held.wait(&format!("deep-{:05}", i + 1)).await - start);
        settle(&server, Duration::from_millis(200)).await;
        let after = controller_requests(&server)
            .iter()
            .filter(|r| is_write(r))
            .count();
        writes.push(after - before);
    }
    writes.sort();
    table.latency(
        &format!("hand-off, one lock, {deep} waiters"),
        hand_offs,
        &format!(
            "API writes per hand-off (Events included): median {}, max {}",
            writes[writes.len() / 2],
            writes.last().copied().unwrap_or(0)
        ),
    );

    // Pod-owned claims and gated Jobs on an idle lock.
    create(&locks, &lock("owned", 1)).await;
    let mut owned = Vec::new();
    for i in 0..samples {
        let pod_name = format!("pod-{i}");
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": pod_name},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}
        }))
        .expect("pod");
        let pod = pods
            .create(&PostParams::default(), &pod)
            .await
            .expect("pod");
        let mut owned_claim = claim(&format!("owned-{i}"), "owned");
        owned_claim.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: pod_name.clone(),
                uid: pod.uid().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: None,
            },
        ]);
        let start = Instant::now();
        create(&claims, &owned_claim).await;
        owned.push(seen_held.wait(&format!("owned-{i}")).await - start);
        claims
            .delete(&format!("owned-{i}"), &DeleteParams::default())
            .await
            .expect("delete");
        wait_free(&locks, "owned").await;
    }
    table.latency("Pod-owned claim create → `Held`", owned, "");

    let seen_jobs = Seen::watch(jobs.clone(), unsuspended);
    let gated_jobs = (0..samples).map(|i| {
        serde_json::from_value(json!({
            "metadata": {"name": format!("job-{i}"), "annotations": {LOCK_ANNOTATION: "gate"}},
            "spec": {"suspend": true, "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "c", "image": "busybox"}]}}}
        }))
        .expect("job")
    });
    let gated = gated_latencies(&jobs, &seen_jobs, "gate", gated_jobs, &locks, &claims).await;
    table.latency("gated Job create → unsuspended", gated, "");

    // A Pod with the lock label and scheduling gate: create → gate removed.
    let seen_ungated = Seen::watch(pods.clone(), ungated);
    let pods_to_gate = (0..samples).map(|i| {
        serde_json::from_value(json!({
            "metadata": {"name": format!("gated-pod-{i}"), "labels": {LOCK_LABEL: "pod-gate"}},
            "spec": {
                "schedulingGates": [{"name": SCHEDULING_GATE}],
                "containers": [{"name": "c", "image": "busybox"}]
            }
        }))
        .expect("pod")
    });
    let gated_pods = gated_latencies(
        &pods,
        &seen_ungated,
        "pod-gate",
        pods_to_gate,
        &locks,
        &claims,
    )
    .await;
    table.latency("gated Pod create → gate removed", gated_pods, "");

    // Scale: many locks, 10 claims each.
    let requests_before = controller_requests(&server).len();
    let start = Instant::now();
    create_all(
        &locks,
        (0..locks_at_scale)
            .map(|l| lock(&format!("s{l:05}"), 1))
            .collect(),
    )
    .await;
    let mut scale_claims = Vec::new();
    for c in 0..10 {
        for l in 0..locks_at_scale {
            scale_claims.push(claim(&format!("s{l:05}-{c}"), &format!("s{l:05}")));
        }
    }
    create_all(&claims, scale_claims).await;
    let created = start.elapsed();
    let every_holder = seen_held.wait_count("s", locks_at_scale).await - start;
    let every_status = seen_status.wait_count("s", locks_at_scale * 10).await - start;
    table.fact(
        &format!("{locks_at_scale} locks × 10 claims: created / every lock held / every claim has a status"),
        format!(
            "{:.1} s / {:.1} s / {:.1} s",
            created.as_secs_f64(),
            every_holder.as_secs_f64(),
            every_status.as_secs_f64()
        ),
    );
    settle(&server, Duration::from_millis(1000)).await;

    // The wave: every holder releases at once.
    let wave_cpu = CpuSample::take(controller.child.id());
    let wave_start = Instant::now();
    let deletes: Vec<String> = (0..locks_at_scale).map(|l| format!("s{l:05}-0")).collect();
    let deleted_at: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    futures::stream::iter(deletes)
        .map(|name| {
            let claims = claims.clone();
            let deleted_at = deleted_at.clone();
            async move {
                claims.delete(&name, &DeleteParams::default()).await.ok();
                deleted_at
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(name, Instant::now());
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    let mut wave = Vec::new();
    for l in 0..locks_at_scale {
        let next = seen_held.wait(&format!("s{l:05}-1")).await;
        let deleted = deleted_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&format!("s{l:05}-0"))
            .copied()
            .unwrap_or(wave_start);
        wave.push(next.saturating_duration_since(deleted));
    }
    let wave_all = wave_start.elapsed();
    let wave_cpu = CpuSample::take(controller.child.id()).shares_since(&wave_cpu);
    table.latency(
        &format!("hand-off wave: {locks_at_scale} holders released at once → each next `Held`"),
        wave,
        &format!(
            "all done {:.2} s after the first delete; {wave_cpu}",
            wave_all.as_secs_f64()
        ),
    );
    settle(&server, Duration::from_millis(1000)).await;
    let scale_requests: Vec<RecordedRequest> = controller_requests(&server)
        .into_iter()
        .skip(requests_before)
        .collect();
    let mut by_verb: HashMap<String, usize> = HashMap::new();
    for request in &scale_requests {
        *by_verb.entry(request.verb.clone()).or_default() += 1;
    }
    let grants = (2 * locks_at_scale) as f64;
    let mut verbs: Vec<_> = by_verb.into_iter().collect();
    verbs.sort();
    table.fact(
        "scale: controller API requests per grant, by verb",
        verbs
            .iter()
            .map(|(verb, n)| format!("{verb} {:.2}", *n as f64 / grants))
            .collect::<Vec<_>>()
            .join(", "),
    );
    let (rss, peak) = controller.rss_kb();
    table.fact(
        &format!(
            "controller RSS with {} claims cached",
            locks_at_scale * 10 + deep + 2 * samples
        ),
        format!(
            "{:.0} MB (peak {:.0} MB)",
            rss as f64 / 1024.0,
            peak as f64 / 1024.0
        ),
    );

    // Idle, then a restart.
    let before = controller_requests(&server)
        .iter()
        .filter(|r| is_write(r))
        .count();
    tokio::time::sleep(Duration::from_secs(idle_seconds)).await;
    let idle_writes = controller_requests(&server)
        .iter()
        .filter(|r| is_write(r))
        .count()
        - before;
    table.fact(
        &format!("idle: controller writes in {idle_seconds} s"),
        idle_writes.to_string(),
    );

    controller.stop();
    let before = controller_requests(&server)
        .iter()
        .filter(|r| is_write(r))
        .count();
    let start = Instant::now();
    let controller = Controller::start(&kubeconfig);
    let ready = controller.wait_ready().await - start;
    settle(&server, Duration::from_secs(3)).await;
    let resync_writes = controller_requests(&server)
        .iter()
        .filter(|r| is_write(r))
        .filter(|r| r.resource != "leases")
        .count()
        - before;
    table.fact(
        "restart: until ready / writes during the re-sync",
        format!("{:.2} s / {resync_writes}", ready.as_secs_f64()),
    );
    controller.stop();
    Report {
        rows: table.rows,
        writes_per_hand_off: writes,
        idle_writes,
        resync_writes,
    }
}

/// Waits until `name` has no holders (between samples; not timed).
/// Creates lock `lock_name` (a mutex), then each of `workloads` (gated on it) in turn: the
/// time from its create to `seen` recording it let go. After each, its claim
/// (`<name>-<lock_name>`) is deleted and the lock waited free, so every sample starts alike.
async fn gated_latencies<K>(
    api: &Api<K>,
    seen: &Seen,
    lock_name: &str,
    workloads: impl Iterator<Item = K>,
    locks: &Api<DistributedLock>,
    claims: &Api<LockClaim>,
) -> Vec<Duration>
where
    K: Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    create(locks, &lock(lock_name, 1)).await;
    let mut samples = Vec::new();
    for workload in workloads {
        let name = workload.meta().name.clone().expect("a name");
        let start = Instant::now();
        create(api, &workload).await;
        samples.push(seen.wait(&name).await - start);
        claims
            .delete(&format!("{name}-{lock_name}"), &DeleteParams::default())
            .await
            .ok();
        wait_free(locks, lock_name).await;
    }
    samples
}

async fn wait_free(locks: &Api<DistributedLock>, name: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let lock = locks.get(name).await.expect("get lock");
        let holders = lock.status.as_ref().map(|s| s.holders.len()).unwrap_or(0);
        if holders == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "lock {name} never freed");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
