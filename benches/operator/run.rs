//! One run of the operator benchmark: the real `turnstile run` process (memory backend) against
//! the fake API server or a real control plane ([`Plane`]), driven by plain API clients. Shared by the benchmark (`main.rs`) and by
//! the suite's smoke run with tiny knobs (`tests/e2e/operator_bench.rs`), which includes this file.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fake_apiserver::RecordedRequest;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;
use turnstile_api::{
    ClaimPhase, DistributedLock, LockClaim, LOCK_ANNOTATION, LOCK_LABEL, SCHEDULING_GATE,
};
use turnstile_controller::core::POSITION_REFRESH_DELAY;

#[path = "scenarios.rs"]
mod scenarios;
#[path = "server.rs"]
mod server;

use scenarios::Bench;
pub use server::Plane;
use server::Server;

const NAMESPACE: &str = "bench";
/// The teardown row's floor: a namespace of plain objects, no controller.
const FLOOR_NAMESPACE: &str = "bench-floor";
/// The wave's write floor on LockClaims: a namespace the controller does not serve.
const WRITES_NAMESPACE: &str = "bench-writes";
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

/// The controller's writes per hand-off, each list sorted: to objects (claims, the lock), and
/// Events, counted apart.
#[derive(Debug, Clone)]
pub struct HandOffWrites {
    /// Object writes per hand-off.
    pub objects: Vec<usize>,
    /// Events per hand-off.
    pub events: Vec<usize>,
}

/// What a run measured: the table's rows as printed, and the counts a smoke run checks.
pub struct Report {
    /// The Markdown rows, in order (without the header).
    pub rows: Vec<String>,
    /// The controller's writes per hand-off in the deep queue.
    pub writes_per_hand_off: HandOffWrites,
    /// Controller writes during the idle row.
    pub idle_writes: usize,
    /// Controller writes (leases aside) during the re-sync after a restart.
    pub resync_writes: usize,
    /// What the run's API server was, for the machine line.
    pub api_server: &'static str,
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

/// The `i`-th suspended Job gated on the lock `gate` (by annotation).
fn gated_job(i: usize) -> Job {
    serde_json::from_value(json!({
        "metadata": {"name": format!("job-{i}"), "annotations": {LOCK_ANNOTATION: "gate"}},
        "spec": {"suspend": true, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox"}]}}}
    }))
    .expect("job")
}

/// The `i`-th Pod gated on the lock `pod-gate` (by label and scheduling gate).
fn gated_pod(i: usize) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": format!("gated-pod-{i}"), "labels": {LOCK_LABEL: "pod-gate"}},
        "spec": {
            "schedulingGates": [{"name": SCHEDULING_GATE}],
            "containers": [{"name": "c", "image": "busybox"}]
        }
    }))
    .expect("pod")
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
    /// busy in all, the controller, this process (the benchmark, and the fake API server when
    /// the run uses it) and the other processes (a real plane's kube-apiserver and etcd).
    fn shares_since(&self, earlier: &Self) -> String {
        let total = self
            .machine_total
            .saturating_sub(earlier.machine_total)
            .max(1) as f64;
        let share = |now: u64, then: u64| 100.0 * now.saturating_sub(then) as f64 / total;
        let busy = share(self.machine_busy, earlier.machine_busy);
        let controller = share(self.controller, earlier.controller);
        let bench = share(self.this_process, earlier.this_process);
        format!(
            "CPU busy {busy:.0}% of the machine: controller {controller:.0}%, bench process {bench:.0}%, other processes {:.0}%",
            (busy - controller - bench).max(0.0),
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

fn is_write(r: &RecordedRequest) -> bool {
    matches!(r.verb.as_str(), "create" | "update" | "patch" | "delete")
}

async fn settle(server: &Server, quiet: Duration) {
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
pub async fn run(knobs: Knobs, plane: Plane) -> Report {
    let mut bench = Bench::start(knobs, plane).await;
    bench.idle_lock().await;
    bench.three_locks().await;
    bench.release().await;
    let writes_per_hand_off = bench.deep_queue().await;
    bench.owned_and_gated().await;
    bench.scale_and_wave().await;
    let api_server = bench.api_server();
    let (idle_writes, resync_writes, rows) = bench.idle_and_restart().await;
    Report {
        rows,
        writes_per_hand_off,
        idle_writes,
        resync_writes,
        api_server,
    }
}

/// Waits until `name` has no holders (between samples; not timed).
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
