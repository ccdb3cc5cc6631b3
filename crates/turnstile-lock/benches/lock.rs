//! `cargo bench --bench lock`: the lock engine against the physical floor, in one table.
//!
//! Starts its own `redis-server` and a 3+3 Redis Cluster (test-servers) and, when one is
//! available, a MongoDB test server (`MONGODB_URI` or an installed SecantusDB), and measures,
//! all in the same run:
//! - the floor of each server: a sequential no-op loop (`PING`, `{ping: 1}`) on one connection
//!   of the same client library, measured for 2 s up front and again for 0.7 s right before
//!   every row, whose ratios use that adjacent floor (the `floor RTT µs` column); on the
//!   cluster, the floor of the primary that owns the row's key;
//! - uncontended acquire+release pairs per second, and their ratio to the floor rate (a pair
//!   is two round trips, so 50% is the ceiling);
//! - contended hand-off with 2, 8 and 32 tasks looping acquire → release on one key: hand-off
//!   latency (release call → next holder's acquire returns) p50/p99, also in floor round trips;
//!   acquisitions/s; the share of hand-offs to a different task; and the longest single wait
//!   (and the 99th percentile) against the fair share (tasks × mean time per acquisition). The
//!   critical section is one `yield_now`.
//!
//! - shared/exclusive: W readers (shared, `max_holders` W) loop acquire → release on one key
//!   while 1 writer (exclusive) loops acquire → release → 10 ms pause: the writer's wait p50 /
//!   p99 (also in floor round trips: it must outwait the readers inside, never the stream),
//!   and the readers' acquire+release pairs per second against the floor rate.
//!
//! The same rows run on etcd (one member built by `scripts/control-plane.sh build`; floor: a
//! sequential `Get` of one key) and, beside them on the same server in the same run, etcd's
//! own lock recipe — `concurrency.Mutex` of its Go client, measured by the same rules by
//! `tools/etcd/mutexbench` — and on the memory backend (no floor there). The hand-off rows
//! also count the hand-offs that went to the task that had waited longest. Bounded in count
//! and time: the whole run takes a few minutes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use test_servers::{EtcdCluster, MongoServer, RedisCluster, RedisServer, Unavailable};
use turnstile_lock::{
    Backend, EtcdBackend, EtcdBackendConfig, Locker, MemoryBackend, MongoBackend,
    MongoBackendConfig, RedisBackend, RedisBackendConfig, RetryPolicy,
};

const FLOOR_TIME: Duration = Duration::from_secs(2);
/// Each Redis row is compared with a PING floor measured right before it: on a shared
/// machine the round trip drifts with the load, and a ratio to a floor taken a minute
/// earlier would measure the neighbours, not the engine.
const ADJACENT_FLOOR_TIME: Duration = Duration::from_millis(700);
const UNCONTENDED_TIME: Duration = Duration::from_secs(3);
const CONTENDED_TIME: Duration = Duration::from_secs(3);
const MAX_OPS: u64 = 1_000_000;
/// Samples kept per contended run (the warm-up's are dropped, so a run never exceeds it).
const SAMPLE_CAPACITY: usize = 1_500_000;
const LEASE: Duration = Duration::from_secs(30);
const WAITER_COUNTS: [usize; 3] = [2, 8, 32];
/// Readers beside the one writer of the shared/exclusive row.
const READERS: usize = 8;

// Targets from the issue.
const TARGET_PAIR_RATIO: f64 = 0.45;
const TARGET_P50_RTTS: f64 = 3.0;
const TARGET_P99_RTTS_AT_32: f64 = 20.0;
const TARGET_LONGEST_WAIT_SHARES: f64 = 4.0;

struct Floor {
    ops_per_sec: f64,
    rtt: Duration,
}

/// How a backend's physical floor is measured: a sequential no-op command loop on one
/// connection of the same client library.
#[derive(Clone, Copy)]
enum FloorProbe<'a> {
    /// `PING` through a redis connection manager.
    RedisPing(&'a str),
    /// `{ping: 1}` through the MongoDB driver.
    MongoPing(&'a str),
    /// A `Get` of one key through the etcd client (`http://host:port`).
    EtcdGet(&'a str),
}

impl FloorProbe<'_> {
    async fn measure(self, duration: Duration) -> Floor {
        match self {
            FloorProbe::RedisPing(url) => {
                let client = redis::Client::open(url).expect("redis url");
                let connection = client
                    .get_connection_manager()
                    .await
                    .expect("connect for PING");
                floor_loop(duration, || {
                    let mut connection = connection.clone();
                    async move {
                        let _: String = redis::cmd("PING")
                            .query_async(&mut connection)
                            .await
                            .expect("PING");
                    }
                })
                .await
            }
            FloorProbe::MongoPing(uri) => {
                let client = mongodb::Client::with_uri_str(uri)
                    .await
                    .expect("mongo client");
                let admin = client.database("admin");
                floor_loop(duration, || {
                    let admin = admin.clone();
                    async move {
                        admin
                            .run_command(mongodb::bson::doc! { "ping": 1 })
                            .await
                            .expect("ping");
                    }
                })
                .await
            }
            FloorProbe::EtcdGet(endpoint) => {
                let client = etcd_client::Client::connect([endpoint], None)
                    .await
                    .expect("etcd client");
                let kv = client.kv_client();
                floor_loop(duration, || {
                    let mut kv = kv.clone();
                    async move {
                        kv.get("bench-floor", None).await.expect("etcd get");
                    }
                })
                .await
            }
        }
    }
}

async fn floor_loop<F, Fut>(duration: Duration, mut ping: F) -> Floor
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for _ in 0..200 {
        ping().await;
    }
    let started = Instant::now();
    let mut count = 0u64;
    while started.elapsed() < duration && count < MAX_OPS {
        ping().await;
        count += 1;
    }
    let elapsed = started.elapsed();
    Floor {
        ops_per_sec: count as f64 / elapsed.as_secs_f64(),
        rtt: elapsed / u32::try_from(count).unwrap_or(u32::MAX),
    }
}

async fn acquire_release_pair(locker: &Locker) {
    let lock = locker
        .lock(UNCONTENDED_KEY, LEASE)
        .acquire()
        .await
        .expect("acquire");
    lock.release().await.expect("release");
}

async fn uncontended(locker: &Locker) -> f64 {
    for _ in 0..1_000 {
        acquire_release_pair(locker).await;
    }
    let started = Instant::now();
    let mut pairs = 0u64;
    while started.elapsed() < UNCONTENDED_TIME && pairs < MAX_OPS {
        acquire_release_pair(locker).await;
        pairs += 1;
    }
    pairs as f64 / started.elapsed().as_secs_f64()
}

#[derive(Default)]
struct HandoffLog {
    /// Set by the holder just before it calls release: (when, who).
    last_release: Option<(Instant, usize)>,
    handoffs: Vec<Duration>,
    to_other: u64,
    /// Hand-offs to the task that had been waiting longest.
    to_longest: u64,
    /// When each task now waiting asked.
    waiting_since: std::collections::HashMap<usize, Instant>,
    waits: Vec<Duration>,
}

struct Contended {
    p50: Duration,
    p99: Duration,
    acquisitions_per_sec: f64,
    to_other_share: f64,
    to_longest_share: f64,
    longest_wait_in_fair_shares: f64,
    p99_wait_in_fair_shares: f64,
}

async fn contended(locker: &Locker, tasks: usize) -> Contended {
    let key = contended_key(tasks);
    // Room for every sample up front: growing a vector of a million samples inside the
    // critical section would stall every task for milliseconds and show up as unfairness.
    let log = Arc::new(Mutex::new(HandoffLog {
        handoffs: Vec::with_capacity(SAMPLE_CAPACITY),
        waits: Vec::with_capacity(SAMPLE_CAPACITY),
        ..HandoffLog::default()
    }));
    let stop = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(false));
    let acquisitions = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for task in 0..tasks {
        let (locker, key, log) = (locker.clone(), key.clone(), log.clone());
        let (stop, measuring, acquisitions) =
            (stop.clone(), measuring.clone(), acquisitions.clone());
        handles.push(tokio::spawn(async move {
            let request = locker.lock(key, LEASE).retry(RetryPolicy::forever());
            while !stop.load(Ordering::Relaxed) {
                let asked = Instant::now();
                log.lock().unwrap().waiting_since.insert(task, asked);
                let lock = request.acquire().await.expect("acquire");
                let acquired = Instant::now();
                {
                    let mut log = log.lock().unwrap();
                    log.waiting_since.remove(&task);
                    let longest = log.waiting_since.values().all(|other| *other >= asked);
                    let previous = log.last_release.take();
                    if measuring.load(Ordering::Relaxed) {
                        acquisitions.fetch_add(1, Ordering::Relaxed);
                        if log.waits.len() < SAMPLE_CAPACITY {
                            log.waits.push(acquired - asked);
                        }
                        if let Some((released_at, releaser)) = previous {
                            if log.handoffs.len() < SAMPLE_CAPACITY {
                                log.handoffs.push(acquired - released_at);
                            }
                            if releaser != task {
                                log.to_other += 1;
                            }
                            if longest {
                                log.to_longest += 1;
                            }
                        }
                    }
                }
                // The critical section: one yield, so every task gets to queue (the memory
                // backend never waits by itself).
                tokio::task::yield_now().await;
                log.lock().unwrap().last_release = Some((Instant::now(), task));
                lock.release().await.expect("release");
                if acquisitions.load(Ordering::Relaxed) >= MAX_OPS {
                    break;
                }
            }
        }));
    }
    // Warm-up: every task queued and subscribed once.
    tokio::time::sleep(Duration::from_millis(300)).await;
    {
        let mut log = log.lock().unwrap();
        log.handoffs.clear();
        log.to_other = 0;
        log.to_longest = 0;
        log.waits.clear();
    }
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(CONTENDED_TIME).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for handle in handles {
        handle.await.expect("task");
    }
    let log = log.lock().unwrap();
    let mut handoffs = log.handoffs.clone();
    handoffs.sort_unstable();
    let mut waits = log.waits.clone();
    waits.sort_unstable();
    let count = acquisitions.load(Ordering::Relaxed).max(1);
    let mean_cycle = elapsed / u32::try_from(count).unwrap_or(u32::MAX);
    let fair_share = mean_cycle * u32::try_from(tasks).unwrap_or(u32::MAX);
    Contended {
        p50: percentile(&handoffs, 0.50),
        p99: percentile(&handoffs, 0.99),
        acquisitions_per_sec: count as f64 / elapsed.as_secs_f64(),
        to_other_share: log.to_other as f64 / handoffs.len().max(1) as f64,
        to_longest_share: log.to_longest as f64 / handoffs.len().max(1) as f64,
        longest_wait_in_fair_shares: waits.last().copied().unwrap_or_default().as_secs_f64()
            / fair_share.as_secs_f64(),
        p99_wait_in_fair_shares: percentile(&waits, 0.99).as_secs_f64() / fair_share.as_secs_f64(),
    }
}

struct ReadWrite {
    reader_pairs_per_sec: f64,
    writer_p50: Duration,
    writer_p99: Duration,
    writes: usize,
}

/// W shared readers and one exclusive writer on one key (see the module docs).
async fn read_write(locker: &Locker, readers: usize) -> ReadWrite {
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let max_holders = u32::try_from(readers).unwrap_or(u32::MAX);
    let mut handles = Vec::new();
    for _ in 0..readers {
        let (locker, stop, reads) = (locker.clone(), stop.clone(), reads.clone());
        handles.push(tokio::spawn(async move {
            let request = locker
                .lock(READ_WRITE_KEY, LEASE)
                .max_holders(max_holders)
                .shared()
                .retry(RetryPolicy::forever());
            while !stop.load(Ordering::Relaxed) && reads.load(Ordering::Relaxed) < MAX_OPS {
                let lock = request.acquire().await.expect("reader");
                tokio::task::yield_now().await;
                lock.release().await.expect("release");
                reads.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let writer = {
        let (locker, stop) = (locker.clone(), stop.clone());
        tokio::spawn(async move {
            let request = locker
                .lock(READ_WRITE_KEY, LEASE)
                .max_holders(max_holders)
                .exclusive()
                .retry(RetryPolicy::forever());
            let mut waits = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let asked = Instant::now();
                let lock = request.acquire().await.expect("writer");
                waits.push(asked.elapsed());
                tokio::task::yield_now().await;
                lock.release().await.expect("release");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            waits
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (started, reads_before) = (Instant::now(), reads.load(Ordering::Relaxed));
    tokio::time::sleep(CONTENDED_TIME).await;
    let reader_pairs = reads.load(Ordering::Relaxed) - reads_before;
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for handle in handles {
        handle.await.expect("reader task");
    }
    let mut waits = writer.await.expect("writer task");
    waits.sort_unstable();
    ReadWrite {
        reader_pairs_per_sec: reader_pairs as f64 / elapsed.as_secs_f64(),
        writer_p50: percentile(&waits, 0.50),
        writer_p99: percentile(&waits, 0.99),
        writes: waits.len(),
    }
}

/// The `p` quantile of sorted samples (zero without samples).
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted
        .get(((sorted.len() as f64 * p) as usize).min(sorted.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default()
}

/// ` (N.N)`: `latency` in floor round trips, or nothing without a floor.
fn in_rtts(latency: Duration, floor: Option<&Floor>) -> String {
    floor.map_or(String::new(), |floor| {
        format!(" ({:.1})", latency.as_secs_f64() / floor.rtt.as_secs_f64())
    })
}

fn micros(duration: Duration) -> String {
    format!("{:.1}", duration.as_secs_f64() * 1e6)
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}

struct Table {
    rows: Vec<[String; 11]>,
}

impl Table {
    const HEADER: [&'static str; 11] = [
        "backend",
        "scenario",
        "ops/s",
        "µs/op",
        "floor RTT µs",
        "vs floor",
        "hand-off p50 µs (floor RTTs)",
        "hand-off p99 µs (floor RTTs)",
        "to other task / longest waiter",
        "wait / fair share: max (p99)",
        "targets",
    ];

    fn print(&self) {
        let mut widths: Vec<usize> = Self::HEADER.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let line = |cells: Vec<String>| {
            let padded: Vec<String> = cells
                .iter()
                .zip(&widths)
                .map(|(cell, width)| format!("{cell:<width$}"))
                .collect();
            println!("| {} |", padded.join(" | "));
        };
        line(Self::HEADER.iter().map(|h| h.to_string()).collect());
        println!(
            "|{}|",
            widths
                .iter()
                .map(|w| "-".repeat(w + 2))
                .collect::<Vec<_>>()
                .join("|")
        );
        for row in &self.rows {
            line(row.to_vec());
        }
    }
}

async fn adjacent_floor(probe: Option<FloorProbe<'_>>) -> Option<Floor> {
    match probe {
        Some(probe) => Some(probe.measure(ADJACENT_FLOOR_TIME).await),
        None => None,
    }
}

fn floor_cell(floor: Option<&Floor>) -> String {
    floor.map_or("-".into(), |floor| micros(floor.rtt))
}

/// A share of the floor's rate as a percentage, `-` without a floor.
fn percent_cell(ratio: Option<f64>) -> String {
    ratio.map_or("-".into(), |r| format!("{:.0}%", r * 100.0))
}

/// A latency in µs, with how many floor round trips it is when there is a floor.
fn latency_cell(latency: Duration, floor: Option<&Floor>) -> String {
    format!("{}{}", micros(latency), in_rtts(latency, floor))
}

impl Table {
    /// Adds a measured row: `backend`, `scenario`, `per_sec` operations a second and what one
    /// takes at that rate, the adjacent `floor`'s round trip, then the `rest` of the cells.
    fn push_measured(
        &mut self,
        backend: &str,
        scenario: String,
        per_sec: f64,
        floor: Option<&Floor>,
        rest: [String; 6],
    ) {
        let [vs_floor, p50, p99, to_other, fair_share, targets] = rest;
        self.rows.push([
            backend.into(),
            scenario,
            format!("{per_sec:.0}"),
            micros(Duration::from_secs_f64(1.0 / per_sec)),
            floor_cell(floor),
            vs_floor,
            p50,
            p99,
            to_other,
            fair_share,
            targets,
        ]);
    }
}

async fn floor_row(backend: &str, scenario: &str, probe: FloorProbe<'_>, table: &mut Table) {
    let floor = probe.measure(FLOOR_TIME).await;
    table.rows.push([
        backend.into(),
        scenario.into(),
        format!("{:.0}", floor.ops_per_sec),
        micros(floor.rtt),
        micros(floor.rtt),
        "100%".into(),
        "-".into(),
        "-".into(),
        "-".into(),
        "-".into(),
        "-".into(),
    ]);
}

/// The keys of the rows, for a probe that depends on where a key lives.
const UNCONTENDED_KEY: &str = "bench-uncontended";
const READ_WRITE_KEY: &str = "bench-rw";

fn contended_key(tasks: usize) -> String {
    format!("bench-contended-{tasks}")
}

async fn backend_rows<'p>(
    name: &str,
    backend: Arc<dyn Backend>,
    probe: impl Fn(&str) -> Option<FloorProbe<'p>>,
    table: &mut Table,
) {
    let locker = Locker::from_arc(backend);
    eprintln!("{name}: uncontended");
    let floor = adjacent_floor(probe(UNCONTENDED_KEY)).await;
    let floor = floor.as_ref();
    let pairs = uncontended(&locker).await;
    let ratio = floor.map(|floor| pairs / floor.ops_per_sec);
    table.push_measured(
        name,
        "uncontended acquire+release".into(),
        pairs,
        floor,
        [
            percent_cell(ratio),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            ratio.map_or("-".into(), |r| {
                format!("≥45% of floor: {}", verdict(r >= TARGET_PAIR_RATIO))
            }),
        ],
    );
    for tasks in WAITER_COUNTS {
        eprintln!("{name}: hand-off with {tasks} tasks");
        let floor = adjacent_floor(probe(&contended_key(tasks))).await;
        let floor = floor.as_ref();
        let result = contended(&locker, tasks).await;
        let mut targets = vec![format!(
            "wait ≤4× fair: {}",
            verdict(result.longest_wait_in_fair_shares <= TARGET_LONGEST_WAIT_SHARES)
        )];
        if let Some(floor) = floor {
            let p50_rtts = result.p50.as_secs_f64() / floor.rtt.as_secs_f64();
            targets.insert(
                0,
                format!("p50 ≤3 RTT: {}", verdict(p50_rtts <= TARGET_P50_RTTS)),
            );
            if tasks == 32 {
                let p99_rtts = result.p99.as_secs_f64() / floor.rtt.as_secs_f64();
                targets.insert(
                    1,
                    format!(
                        "p99 ≤20 RTT: {}",
                        verdict(p99_rtts <= TARGET_P99_RTTS_AT_32)
                    ),
                );
            }
        }
        table.push_measured(
            name,
            format!("hand-off, {tasks} tasks on one key"),
            result.acquisitions_per_sec,
            floor,
            [
                "-".into(),
                latency_cell(result.p50, floor),
                latency_cell(result.p99, floor),
                format!(
                    "{:.1}% / {:.1}%",
                    result.to_other_share * 100.0,
                    result.to_longest_share * 100.0
                ),
                format!(
                    "{:.2} ({:.2})",
                    result.longest_wait_in_fair_shares, result.p99_wait_in_fair_shares
                ),
                targets.join(", "),
            ],
        );
    }
    eprintln!("{name}: shared/exclusive, {READERS} readers + 1 writer");
    let floor = adjacent_floor(probe(READ_WRITE_KEY)).await;
    let floor = floor.as_ref();
    let result = read_write(&locker, READERS).await;
    let ratio = floor.map(|floor| result.reader_pairs_per_sec / floor.ops_per_sec);
    table.push_measured(
        name,
        format!("shared/exclusive: {READERS} readers + 1 writer (writer wait)"),
        result.reader_pairs_per_sec,
        floor,
        [
            percent_cell(ratio),
            latency_cell(result.writer_p50, floor),
            latency_cell(result.writer_p99, floor),
            "-".into(),
            "-".into(),
            format!("writer served {} times", result.writes),
        ],
    );
}

/// `redis://127.0.0.1:PORT` of the cluster primary that owns lock `key` (default prefix): any
/// other node answers `GET` on its keys with `-MOVED slot host:port`.
fn owner_url(cluster: &RedisCluster, key: &str) -> String {
    let node = &cluster.nodes()[0];
    let reply = node
        .command(&["GET", &format!("turnstile:{{{key}}}:fence")])
        .expect("GET on a cluster node");
    let port = match reply.strip_prefix("-MOVED ") {
        Some(moved) => moved
            .trim_end()
            .rsplit(':')
            .next()
            .and_then(|port| port.parse().ok())
            .expect("MOVED names a port"),
        None => node.port(),
    };
    format!("redis://127.0.0.1:{port}/")
}

/// Runs etcd's Go `concurrency.Mutex` benchmark (`tools/etcd/mutexbench`, built beside etcd
/// by `scripts/control-plane.sh build`) in `mode` against `endpoint`; its `key=value` line.
fn go_mutex_bench(
    endpoint: &str,
    mode: &str,
    tasks: usize,
) -> std::collections::HashMap<String, f64> {
    let binary = test_servers::control_plane_binaries()
        .expect("the control plane's binaries")
        .join("etcd-mutex-bench");
    assert!(
        binary.is_file(),
        "{} is missing: run `bash scripts/control-plane.sh build`",
        binary.display()
    );
    let output = std::process::Command::new(&binary)
        .args([
            "-endpoint",
            endpoint,
            "-mode",
            mode,
            "-tasks",
            &tasks.to_string(),
        ])
        .args(["-seconds", &CONTENDED_TIME.as_secs_f64().to_string()])
        .output()
        .expect("run etcd-mutex-bench");
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "etcd-mutex-bench {mode}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    said.split_whitespace()
        .filter_map(|pair| pair.split_once('='))
        .filter_map(|(key, value)| Some((key.to_owned(), value.parse().ok()?)))
        .collect()
}

/// The rows of etcd's own recipe, measured by the Go program on the etcd at `endpoint`, each
/// against the Go client's own `Get` floor measured right before it.
fn go_mutex_rows(endpoint: &str, table: &mut Table) {
    let name = "etcd Go concurrency.Mutex";
    let floor = || {
        let said = go_mutex_bench(endpoint, "floor", 1);
        Floor {
            ops_per_sec: said["ops_per_sec"],
            rtt: Duration::from_secs_f64(said["rtt_us"] / 1e6),
        }
    };
    eprintln!("{name}: uncontended");
    let adjacent = floor();
    let pairs = go_mutex_bench(endpoint, "uncontended", 1)["pairs_per_sec"];
    table.push_measured(
        name,
        "uncontended Lock+Unlock".into(),
        pairs,
        Some(&adjacent),
        [
            percent_cell(Some(pairs / adjacent.ops_per_sec)),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
        ],
    );
    for tasks in WAITER_COUNTS {
        eprintln!("{name}: hand-off with {tasks} goroutines");
        let adjacent = floor();
        let said = go_mutex_bench(endpoint, "handoff", tasks);
        let latency = |key: &str| Duration::from_secs_f64(said[key] / 1e6);
        table.push_measured(
            name,
            format!("hand-off, {tasks} goroutines on one key"),
            said["acquisitions_per_sec"],
            Some(&adjacent),
            [
                "-".into(),
                latency_cell(latency("p50_us"), Some(&adjacent)),
                latency_cell(latency("p99_us"), Some(&adjacent)),
                format!(
                    "{:.1}% / {:.1}%",
                    said["to_other"] * 100.0,
                    said["to_longest"] * 100.0
                ),
                "-".into(),
                "-".into(),
            ],
        );
    }
}

fn redis_version() -> String {
    std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .ok()
        .and_then(|output| String::from_utf8(output.stdout).ok())
        .map(|version| version.trim().to_owned())
        .unwrap_or_else(|| "redis-server (version unknown)".into())
}

fn main() {
    // Criterion-style flags (e.g. `--bench`) are accepted and ignored.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let server = RedisServer::start().expect("redis-server starts");
    let cluster = RedisCluster::start().expect("Redis Cluster starts");
    let owners: std::collections::HashMap<String, String> = [UNCONTENDED_KEY, READ_WRITE_KEY]
        .into_iter()
        .map(str::to_owned)
        .chain(WAITER_COUNTS.into_iter().map(contended_key))
        .map(|key| {
            let url = owner_url(&cluster, &key);
            (key, url)
        })
        .collect();
    // MongoDB rows when a server is available (MONGODB_URI or an installed SecantusDB).
    let mongo = match MongoServer::for_tests() {
        Ok(server) => Some(server),
        Err(Unavailable::Skip(reason)) => {
            eprintln!("mongo rows skipped: {reason}");
            None
        }
        Err(Unavailable::Fail(error)) => panic!("MongoDB test server: {error}"),
    };
    let etcd = EtcdCluster::start().expect("etcd starts");
    let etcd_endpoint = etcd.url().replacen("etcd://", "http://", 1);
    let started = Instant::now();
    runtime.block_on(async {
        let mut table = Table { rows: Vec::new() };
        eprintln!("redis: PING floor");
        let redis_probe = FloorProbe::RedisPing(server.url());
        floor_row("redis", "PING floor (1 connection)", redis_probe, &mut table).await;
        let redis = RedisBackend::connect(RedisBackendConfig::new(server.url()))
            .await
            .expect("connect");
        backend_rows("redis", Arc::new(redis), |_| Some(redis_probe), &mut table).await;
        eprintln!("redis cluster: PING floor");
        let first_owner = FloorProbe::RedisPing(&owners[UNCONTENDED_KEY]);
        floor_row(
            "redis cluster",
            "PING floor (1 connection, one primary)",
            first_owner,
            &mut table,
        )
        .await;
        let clustered = RedisBackend::connect(RedisBackendConfig::new(cluster.url()))
            .await
            .expect("connect to the cluster");
        backend_rows(
            "redis cluster",
            Arc::new(clustered),
            |key| owners.get(key).map(|url| FloorProbe::RedisPing(url)),
            &mut table,
        )
        .await;
        if let Some(mongo) = &mongo {
            eprintln!("mongo: ping floor");
            let mongo_probe = FloorProbe::MongoPing(mongo.uri());
            floor_row("mongo", "ping floor (1 connection)", mongo_probe, &mut table).await;
            let backend = MongoBackend::connect(
                mongo.uri(),
                MongoBackendConfig::new()
                    .database(format!("bench_{}", uuid::Uuid::new_v4().simple())),
            )
            .await
            .expect("connect to mongo");
            backend_rows("mongo", Arc::new(backend), |_| Some(mongo_probe), &mut table).await;
        }
        eprintln!("etcd: Get floor");
        let etcd_probe = FloorProbe::EtcdGet(&etcd_endpoint);
        floor_row("etcd", "Get floor (1 connection)", etcd_probe, &mut table).await;
        let backend = EtcdBackend::connect(EtcdBackendConfig::new(etcd.url()))
            .await
            .expect("connect to etcd");
        backend_rows("etcd", Arc::new(backend), |_| Some(etcd_probe), &mut table).await;
        go_mutex_rows(&etcd_endpoint, &mut table);
        backend_rows("memory", Arc::new(MemoryBackend::new()), |_| None, &mut table).await;
        println!();
        println!(
            "Turnstile lock engine — {}; {} CPU cores; client: tokio current_thread runtime; bench took {:.0} s",
            redis_version(),
            std::thread::available_parallelism().map_or(0, usize::from),
            started.elapsed().as_secs_f64()
        );
        println!();
        table.print();
    });
    server.stop();
}
