//! The fault schedule: a seeded random sequence of faults, applied one at a time (each healed
//! before the next is drawn), each logged and recorded in the history. The sequence of kinds
//! and parameters depends only on the seed. Kinds come in rounds (each round every kind once,
//! in a seeded order), so a run that lasts one round has met every kind; the schedule goes on
//! past the load time until it has. Each fault applied comes back as an [`Applied`], with what
//! it was seen to do while it ran (`effects` checks the rest against the history afterwards).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use fake_apiserver::FakeApiServer;
use kube::Client;
use nix::sys::signal::Signal;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use test_servers::MongoServer;

use super::history::{self, Event, History, Millis};
use super::processes::{leader_lease, Redis, Replica};

/// How long the replicas may need to elect a new leader after one was killed without
/// releasing the Lease (the binary's 15 s leader lease, a retry period, and a margin).
pub const LEADER_TAKEOVER: Duration = Duration::from_secs(25);
/// A Redis key only the fault schedule writes: its loss shows a restart lost the data.
const DATA_MARKER: &str = "chaos:data-marker";
/// The longest the schedule runs past the load time to meet every kind once.
const OVERTIME: Duration = Duration::from_secs(120);

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
pub const KINDS: &[&str] = &[
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

/// The kinds a run must meet: every kind, MongoDB's only `with_mongo`.
pub fn kinds(with_mongo: bool) -> BTreeSet<&'static str> {
    KINDS
        .iter()
        .copied()
        .filter(|kind| with_mongo || !kind.starts_with("MongoDB"))
        .collect()
}

/// The seeded sequence of faults, in rounds of every kind once; `with_mongo: false` turns
/// MongoDB crashes into `FLUSHALL`s (so nothing else in the schedule moves).
pub fn schedule(seed: u64, with_mongo: bool) -> impl Iterator<Item = Fault> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xfa17);
    let mut round: Vec<&'static str> = Vec::new();
    std::iter::from_fn(move || {
        if round.is_empty() {
            round = KINDS.to_vec();
            round.shuffle(&mut rng);
        }
        let gap = Duration::from_millis(rng.random_range(2_000..5_000));
        let mut kind = round.pop()?;
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

/// One fault as it was applied.
#[derive(Debug, Clone)]
pub struct Applied {
    pub fault: Fault,
    /// When it began and when it was healed, on the test's monotonic clock (the fake's
    /// request log), and its end in [`Millis`] (the history).
    pub began: Instant,
    pub ended: Instant,
    pub ended_at: Millis,
    /// What it was seen to do while it ran (`Ok`), or why it did not fire or showed no effect
    /// (`Err`).
    pub seen: Result<String, String>,
}

impl Targets<'_> {
    /// Applies the faults of `seed`'s schedule until `until` and, past it, until every kind
    /// has been applied once (at most [`OVERTIME`] more); every fault is healed when this
    /// returns. The faults applied, in order.
    pub async fn run_schedule(&mut self, seed: u64, until: Instant) -> Vec<Applied> {
        let mut missing = kinds(self.mongo.is_some());
        let mut applied = Vec::new();
        for fault in schedule(seed, self.mongo.is_some()) {
            let next = Instant::now() + fault.gap;
            if next >= until && (missing.is_empty() || next >= until + OVERTIME) {
                break;
            }
            // Time: the schedule's gap between faults.
            tokio::time::sleep(fault.gap).await;
            let began = Instant::now();
            let seen = self.apply(&fault).await;
            if let Err(why) = &seen {
                println!("chaos fault {}: no effect seen: {why}", fault.kind);
            }
            missing.remove(fault.kind);
            applied.push(Applied {
                fault,
                began,
                ended: Instant::now(),
                ended_at: history::now(),
                seen,
            });
        }
        applied
    }

    fn log(&self, kind: &str, detail: String) {
        println!("chaos fault at {}: {kind}: {detail}", history::now());
        self.history.record(Event::Fault {
            kind: kind.to_owned(),
            detail,
        });
    }

    /// Waits until a live replica renews the leader Lease after `since`; its holder.
    async fn renewed_after(&self, since: Millis) -> Result<String, String> {
        let deadline = Instant::now() + LEADER_TAKEOVER;
        loop {
            let lease = leader_lease(&self.client, &self.namespace).await;
            if let Some((holder, renewed)) = &lease {
                if *renewed > since {
                    return Ok(holder.clone());
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "no replica renewed the leader Lease within {LEADER_TAKEOVER:?} (last seen {lease:?})"
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Kills (or stops) the leader or a standby for `down`, restarts it, and shows the Lease
    /// afterwards: a leader's fault is over when a live replica leads again, a standby's must
    /// leave the leader as it was.
    async fn stop_replica(&mut self, kind: &'static str, down: Duration) -> Result<String, String> {
        let leading = !kind.starts_with("standby");
        let signal = if kind.contains("SIGTERM") {
            Signal::SIGTERM
        } else {
            Signal::SIGKILL
        };
        // A leader fault right after another waits for a leader rather than skip; a renewal
        // within the last retry period (2 s) and a margin shows a live one.
        let leader = self.renewed_after(history::now() - 3_000).await?;
        let Some(at) = self
            .replicas
            .iter()
            .position(|replica| (replica.identity == leader) == leading)
        else {
            return Err(format!("no replica to stop besides the leader {leader}"));
        };
        let identity = self.replicas[at].identity.clone();
        self.log(kind, format!("{identity}, down {} ms", down.as_millis()));
        let replica = &mut self.replicas[at];
        blocking(|| replica.stop(signal));
        let stopped = history::now();
        // Time: the fault lasts `down` (a replica stopped).
        tokio::time::sleep(down).await;
        replica.start();
        // Let a leader be elected before anything else goes wrong.
        let now_leading = self.renewed_after(stopped).await?;
        if leading {
            Ok(format!(
                "{identity} stopped; {now_leading} leads again, renewed the Lease after the stop"
            ))
        } else if now_leading == leader {
            Ok(format!("{identity} stopped; {leader} still leads"))
        } else {
            Err(format!(
                "a standby's stop moved leadership from {leader} to {now_leading}"
            ))
        }
    }

    /// Applies one fault and heals it; what was seen while it ran.
    async fn apply(&mut self, fault: &Fault) -> Result<String, String> {
        let (kind, down) = (fault.kind, fault.down);
        let claims_path = format!(
            "/apis/turnstile.dev/v1alpha1/namespaces/{}/",
            self.namespace
        );
        match kind {
            "leader killed (SIGKILL) and restarted"
            | "leader stopped (SIGTERM) and restarted"
            | "standby killed and restarted" => self.stop_replica(kind, down).await,
            "watches closed + 410 Gone on resume" => {
                self.fake.compact();
                self.fake.close_watches();
                self.log(kind, "every watch".into());
                Ok("every watch closed, history compacted".into())
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
                Ok(format!("armed for the next {count} writes under {target}"))
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
                Ok("the spell is over".into())
            }
            "Redis restarted (data lost)" => {
                // A key no one else writes shows the loss (the controller may write its own
                // keys again the moment the server answers).
                let marked = blocking(|| self.redis.cli(&["SET", DATA_MARKER, "1"]));
                let keys = self.redis_keys()?;
                blocking(|| self.redis.down());
                self.log(kind, format!("down {} ms", down.as_millis()));
                // Time: the fault lasts `down` (Redis gone, its data lost).
                tokio::time::sleep(down).await;
                blocking(|| self.redis.up());
                let kept = blocking(|| self.redis.cli(&["EXISTS", DATA_MARKER]));
                match (marked.trim(), kept.trim()) {
                    ("OK", "0") => Ok(format!("{keys} keys lost")),
                    answers => Err(format!("the marker key was not lost: {answers:?}")),
                }
            }
            "Redis FLUSHALL" => {
                let keys = self.redis_keys()?;
                let answer = blocking(|| self.redis.cli(&["FLUSHALL"]));
                self.log(kind, answer.trim().to_owned());
                if answer.trim() == "OK" && keys > 0 {
                    Ok(format!("{keys} keys flushed"))
                } else {
                    Err(format!("FLUSHALL of {keys} keys answered {answer:?}"))
                }
            }
            "Redis CLIENT PAUSE" => {
                let ms = down.as_millis().to_string();
                let answer = blocking(|| self.redis.cli(&["CLIENT", "PAUSE", &ms, "ALL"]));
                self.log(kind, format!("{ms} ms: {}", answer.trim()));
                // Time: the fault lasts `down` (Redis paused).
                tokio::time::sleep(down).await;
                if answer.trim() == "OK" {
                    Ok(format!("paused {ms} ms"))
                } else {
                    Err(format!("CLIENT PAUSE answered {answer:?}"))
                }
            }
            "Redis SIGSTOP then SIGCONT" => {
                self.log(kind, format!("stopped {} ms", down.as_millis()));
                self.redis.signal(Signal::SIGSTOP)?;
                // Time: the fault lasts `down` (Redis stopped by SIGSTOP).
                tokio::time::sleep(down).await;
                self.redis.signal(Signal::SIGCONT)?;
                Ok(format!("stopped {} ms", down.as_millis()))
            }
            "MongoDB crashed and restarted" => {
                let Some(mongo) = self.mongo.as_mut() else {
                    return Err("no MongoDB server of the run's own".into());
                };
                let result = blocking(|| mongo.crash_and_restart());
                self.log(kind, format!("{result:?}"));
                result
                    .map(|()| "crashed and back".to_owned())
                    .map_err(|error| error.to_string())
            }
            other => unreachable!("unknown fault {other}"),
        }
    }

    /// How many keys Redis holds (an error when it does not answer).
    fn redis_keys(&self) -> Result<u64, String> {
        let answer = blocking(|| self.redis.cli(&["DBSIZE"]));
        answer
            .trim()
            .parse()
            .map_err(|_| format!("DBSIZE answered {answer:?}"))
    }

    /// Stops every replica (SIGTERM) — the run is over.
    pub fn stop_replicas(&mut self) {
        for replica in &mut self.replicas {
            blocking(|| replica.stop(Signal::SIGTERM));
        }
    }
}
