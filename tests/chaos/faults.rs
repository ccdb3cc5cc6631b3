//! The fault schedule: a seeded random sequence of faults, applied one at a time (each healed
//! before the next is drawn), each logged and recorded in the history. The sequence of kinds
//! and parameters depends only on the seed.

use std::time::{Duration, Instant};

use fake_apiserver::FakeApiServer;
use kube::Client;
use nix::sys::signal::Signal;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use test_servers::MongoServer;

use super::history::{Event, History};
use super::processes::{leader, Redis, Replica};

/// How long the replicas need to elect a new leader after one was killed without releasing
/// the Lease (the binary's 15 s leader lease, and a retry period).
pub const LEADER_TAKEOVER: Duration = Duration::from_secs(17);

/// What the faults act on.
pub struct Targets<'a> {
    pub fake: &'a FakeApiServer,
    pub client: Client,
    pub namespace: String,
    pub replicas: Vec<Replica>,
    pub redis: Redis,
    pub mongo: Option<MongoServer>,
    pub history: History,
}

/// The kinds of fault, by their names in the table.
const KINDS: &[&str] = &[
    "leader killed (SIGKILL) and restarted",
    "leader stopped (SIGTERM) and restarted",
    "standby killed and restarted",
    "watches closed + 410 Gone on resume",
    "injected 409 Conflict",
    "injected 500 InternalError",
    "injected 429 TooManyRequests",
    "slow API responses",
    "Redis restarted (data lost)",
    "Redis FLUSHALL",
    "Redis CLIENT PAUSE",
    "Redis SIGSTOP then SIGCONT",
    "MongoDB crashed and restarted",
];

fn blocking<T>(work: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(work)
}

/// One fault as drawn: its kind and every parameter, from the seed alone (applying it draws
/// nothing, so the schedule cannot depend on how the run went).
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// The wait before it.
    pub gap: Duration,
    /// Its name in the table (one of `KINDS`).
    pub kind: &'static str,
    /// How long a stopped process or paused server stays down.
    pub down: Duration,
    /// For injected errors: which path (0 claims, 1 locks, 2 the whole group) and how many.
    pub target: u8,
    pub count: usize,
    /// For slow responses: how late, and for how long.
    pub delay: Duration,
    pub length: Duration,
}

/// The seeded sequence of faults; `with_mongo: false` turns MongoDB crashes into `FLUSHALL`s.
pub fn schedule(seed: u64, with_mongo: bool) -> impl Iterator<Item = Fault> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xfa17);
    std::iter::from_fn(move || {
        let gap = Duration::from_millis(rng.random_range(2_000..6_000));
        let mut kind = KINDS[rng.random_range(0..KINDS.len())];
        if kind.starts_with("MongoDB") && !with_mongo {
            kind = "Redis FLUSHALL";
        }
        Some(Fault {
            gap,
            kind,
            down: Duration::from_millis(rng.random_range(1_000..3_000)),
            target: rng.random_range(0..3),
            count: rng.random_range(2..8),
            delay: Duration::from_millis(rng.random_range(200..1_500)),
            length: Duration::from_millis(rng.random_range(2_000..10_000)),
        })
    })
}

impl Targets<'_> {
    /// Applies the faults of `seed`'s schedule until `until`; every fault is healed when this
    /// returns.
    pub async fn run_schedule(&mut self, seed: u64, until: Instant) {
        for fault in schedule(seed, self.mongo.is_some()) {
            if Instant::now() + fault.gap >= until {
                break;
            }
            // Time: the schedule's gap between faults.
            tokio::time::sleep(fault.gap).await;
            self.apply(&fault).await;
        }
    }

    fn log(&self, kind: &str, detail: String) {
        println!("chaos fault at {}: {kind}: {detail}", super::history::now());
        self.history.record(Event::Fault {
            kind: kind.to_owned(),
            detail,
        });
    }

    fn replica(&mut self, leading: bool, leader: Option<&str>) -> Option<&mut Replica> {
        let leader = leader?;
        self.replicas
            .iter_mut()
            .find(|replica| (replica.identity == leader) == leading)
    }

    async fn apply(&mut self, fault: &Fault) {
        let (kind, down) = (fault.kind, fault.down);
        let claims_path = format!(
            "/apis/turnstile.dev/v1alpha1/namespaces/{}/",
            self.namespace
        );
        match kind {
            "leader killed (SIGKILL) and restarted"
            | "leader stopped (SIGTERM) and restarted"
            | "standby killed and restarted" => {
                let current = leader(&self.client, &self.namespace).await;
                let leading = !kind.starts_with("standby");
                let signal = if kind.contains("SIGTERM") {
                    Signal::SIGTERM
                } else {
                    Signal::SIGKILL
                };
                let Some(replica) = self.replica(leading, current.as_deref()) else {
                    self.log(kind, "skipped: no leader yet".into());
                    return;
                };
                let identity = replica.identity.clone();
                self.log(kind, format!("{identity}, down {} ms", down.as_millis()));
                let Some(replica) = self.replicas.iter_mut().find(|r| r.identity == identity)
                else {
                    return;
                };
                blocking(|| replica.stop(signal));
                // Time: the fault lasts `down` (a replica stopped).
                tokio::time::sleep(down).await;
                replica.start();
                if leading && signal == Signal::SIGKILL {
                    // Let a leader be elected before anything else goes wrong.
                    // Time: a new leader takes the Lease over before the next fault.
                    tokio::time::sleep(LEADER_TAKEOVER).await;
                }
            }
            "watches closed + 410 Gone on resume" => {
                self.fake.compact();
                self.fake.close_watches();
                self.log(kind, "every watch".into());
            }
            "injected 409 Conflict"
            | "injected 500 InternalError"
            | "injected 429 TooManyRequests" => {
                let status = kind["injected ".len()..][..3].parse().expect("status");
                let target = match fault.target {
                    0 => format!("{claims_path}lockclaims"),
                    1 => format!("{claims_path}distributedlocks"),
                    _ => claims_path.clone(),
                };
                let count = fault.count;
                self.fake.inject_faults(&target, count, status);
                self.log(kind, format!("next {count} writes under {target}"));
            }
            "slow API responses" => {
                // A spell of time, not a count of requests: with a count, one client's
                // sequential requests (a re-list's hundreds of pages) soaked up the whole
                // slowness meant for every client, and the leader was blind for up to 45 s.
                let (delay, length) = (fault.delay, fault.length);
                self.fake.slow_down(&claims_path, length, delay);
                self.log(
                    kind,
                    format!(
                        "every request under {claims_path} for {} ms, {} ms late",
                        length.as_millis(),
                        delay.as_millis()
                    ),
                );
                // Time: the fault lasts `length` (API watch events delayed).
                tokio::time::sleep(length).await;
            }
            "Redis restarted (data lost)" => {
                blocking(|| self.redis.down());
                // Time: the fault lasts `down` (Redis gone, its data lost).
                tokio::time::sleep(down).await;
                blocking(|| self.redis.up());
                self.log(kind, format!("down {} ms", down.as_millis()));
            }
            "Redis FLUSHALL" => {
                let answer = blocking(|| self.redis.cli(&["FLUSHALL"]));
                self.log(kind, answer.trim().to_owned());
            }
            "Redis CLIENT PAUSE" => {
                let ms = down.as_millis().to_string();
                let answer = blocking(|| self.redis.cli(&["CLIENT", "PAUSE", &ms, "ALL"]));
                // Time: the fault lasts `down` (Redis paused).
                tokio::time::sleep(down).await;
                self.log(kind, format!("{ms} ms: {}", answer.trim()));
            }
            "Redis SIGSTOP then SIGCONT" => {
                self.redis.signal(Signal::SIGSTOP);
                // Time: the fault lasts `down` (Redis stopped by SIGSTOP).
                tokio::time::sleep(down).await;
                self.redis.signal(Signal::SIGCONT);
                self.log(kind, format!("stopped {} ms", down.as_millis()));
            }
            "MongoDB crashed and restarted" => {
                if let Some(mongo) = self.mongo.as_mut() {
                    let result = blocking(|| mongo.crash_and_restart());
                    self.log(kind, format!("{result:?}"));
                }
            }
            other => unreachable!("unknown fault {other}"),
        }
    }

    /// Stops every replica (SIGTERM) — the run is over.
    pub fn stop_replicas(&mut self) {
        for replica in &mut self.replicas {
            blocking(|| replica.stop(Signal::SIGTERM));
        }
    }
}
