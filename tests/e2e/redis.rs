//! End to end with the Redis backend (a real `redis-server` on a free 127.0.0.1 port): the
//! same flows as with the memory backend, a controller restart mid-queue, `FLUSHALL` between
//! grants (the next token is still greater), and Redis down at first (Ready=False, retried
//! with backoff, then served). A grant Redis lost, and that a process outside Kubernetes took,
//! ends `Expired` / `LockLost` at the holder's next renewal.

use crate::support;

use std::process::Command;
use std::time::{Duration, Instant};

use support::{phase_of, position_of, reason_of, token_of, Env, HolderMonitor};
use test_servers::{free_port, wait_until, RedisServer, ServerProcess};
use turnstile_api::{BackendKind, ClaimPhase};
use turnstile_controller::ControllerConfig;

fn redis_config(url: &str) -> ControllerConfig {
    ControllerConfig {
        redis_url: Some(url.to_owned()),
        ..ControllerConfig::default()
    }
}

/// A fresh namespace with the controller on the Redis at `url` and lock `db` on that backend
/// (`spec`: its lines after `backend: redis`).
async fn controller_and_db_on_redis(url: &str, spec: &str) -> Env {
    let mut env = Env::new().await;
    env.start_controller(redis_config(url));
    env.apply_lock("db", &format!("backend: redis\n{spec}"));
    env
}

/// A `redis-server`, the controller on it, and lock `db` (300 s lease) with `a` holding it and
/// `b`, `c` waiting ([`Env::queue_of_three`]), watched by a [`HolderMonitor`] from then on.
async fn queue_of_three_on_redis() -> (RedisServer, Env, HolderMonitor) {
    let server = redis();
    let env = controller_and_db_on_redis(server.url(), "leaseDurationSeconds: 300").await;
    env.queue_of_three("db").await;
    let monitor = HolderMonitor::start(&env, "db", 1);
    // The first holder's grant is in the report before a test ends it.
    monitor.wait_seen(1).await;
    (server, env, monitor)
}

fn redis() -> RedisServer {
    RedisServer::start().expect("start redis-server")
}

/// An empty `redis-server` on `port` (127.0.0.1, no persistence), for a Redis that comes
/// (back) up where the controller expects it; keep the folder until the process stops.
fn redis_on_port(port: u16) -> (ServerProcess, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut command = Command::new("redis-server");
    command
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--loglevel", "warning"])
        .arg("--dir")
        .arg(dir.path());
    let process = ServerProcess::spawn(command).expect("spawn redis-server");
    (process, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_handover_expiry_and_semaphore_on_redis() {
    let server = redis();
    // A lease long enough to see each holder by polling while kubectl applies the rest
    // (a slow machine takes half a second per apply).
    let mut env = controller_and_db_on_redis(server.url(), "leaseDurationSeconds: 4").await;
    env.fifo_handover_expiry_and_semaphore("redis").await;

    // The grants live in Redis, under the namespaced key.
    let keys = server.command(&["KEYS", "*"]).expect("KEYS");
    assert!(
        keys.contains(&format!("{}/db", env.namespace)),
        "keys: {keys}"
    );
    let lock = env.lock("db").await;
    assert_eq!(lock.spec.backend, Some(BackendKind::Redis));
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_mid_queue_on_redis() {
    let (server, mut env, monitor) = queue_of_three_on_redis().await;

    env.stop_controller().await;
    env.start_controller(redis_config(server.url()));
    env.apply_claim("d", "db", "");
    env.wait_claim("d", |c| position_of(c) == Some(3)).await;
    let a = env.claim("a").await;
    assert_eq!(
        (phase_of(&a), token_of(&a)),
        (Some(ClaimPhase::Held), Some(1))
    );
    assert_eq!(position_of(&env.claim("b").await), Some(1));
    env.delete_claim("a").await;
    let b = env.wait_phase("b", ClaimPhase::Held).await;
    assert_eq!(token_of(&b), Some(2));
    env.wait_claim("d", |c| position_of(c) == Some(2)).await;
    let report = monitor.finish().await;
    assert_eq!(report.tokens(), [1, 2]);
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_between_grants_keeps_tokens_increasing() {
    let (server, mut env, monitor) = queue_of_three_on_redis().await;

    // Redis forgets everything while a holds the lock.
    server.command(&["FLUSHALL"]).expect("FLUSHALL");
    env.delete_claim("a").await;
    let b = env.wait_phase("b", ClaimPhase::Held).await;
    assert_eq!(
        token_of(&b),
        Some(2),
        "the floor was raised to the high-water mark"
    );

    // Again, with a holder that has to be re-attached first: b keeps its token.
    server.command(&["FLUSHALL"]).expect("FLUSHALL");
    env.stop_controller().await;
    env.start_controller(redis_config(server.url()));
    env.apply_claim("d", "db", "");
    env.wait_claim("d", |c| position_of(c) == Some(2)).await;
    let snapshot = server.command(&["KEYS", "*"]).expect("KEYS");
    assert!(
        !snapshot.is_empty(),
        "b was re-attached in Redis: {snapshot}"
    );
    let b = env.claim("b").await;
    assert_eq!(
        (phase_of(&b), token_of(&b)),
        (Some(ClaimPhase::Held), Some(2))
    );
    env.patch_claim_spec("b", serde_json::json!({"release": true}))
        .await;
    let c = env.wait_phase("c", ClaimPhase::Held).await;
    assert_eq!(token_of(&c), Some(3));

    let report = monitor.finish().await;
    assert_eq!(report.tokens(), [1, 2, 3]);
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_reports_unavailable_then_recovers() {
    let port = free_port().expect("free port");
    let url = format!("redis://127.0.0.1:{port}/");
    let mut env = controller_and_db_on_redis(&url, "leaseDurationSeconds: 300").await;
    env.apply_claim("a", "db", "");
    let ready = env.wait_ready("db", "False").await;
    assert_eq!(ready.reason, "BackendUnavailable");
    env.wait_pending_for("a", "BackendUnavailable").await;
    assert!(ready.message.contains("redis"), "{}", ready.message);
    env.wait_event("db", "BackendUnavailable").await;

    // Redis comes up on that port: the retry (with backoff) grants the claim.
    let (mut process, _dir) = redis_on_port(port);
    assert!(
        wait_until(Duration::from_secs(10), || std::net::TcpStream::connect((
            "127.0.0.1",
            port
        ))
        .is_ok()),
        "redis-server did not come up"
    );
    let a = env.wait_phase("a", ClaimPhase::Held).await;
    assert_eq!(token_of(&a), Some(1));
    env.wait_event("db", "BackendReady").await;
    env.stop_controller().await;
    process.stop();
}

/// A process outside Kubernetes on the controller's Redis, and the key of lock `db` there.
async fn outside_process(
    server: &RedisServer,
    env: &Env,
) -> (turnstile_lock::RedisBackend, String) {
    let config = turnstile_lock::RedisBackendConfig::new(server.url());
    let outsider = turnstile_lock::RedisBackend::connect(config)
        .await
        .expect("connect the outside process");
    (outsider, format!("{}/db", env.namespace))
}

/// The outside process's one-shot try for `key`, held for `ttl` if granted.
fn outside_request(key: &str, ttl: Duration) -> turnstile_lock::AcquireRequest<'_> {
    turnstile_lock::AcquireRequest::new(
        key,
        "outside-process",
        ttl,
        1,
        turnstile_lock::AcquireMode::Try,
        Duration::from_secs(30),
    )
}

/// The lock-delay lives in Redis with the grant, so a process outside Kubernetes that locks
/// the same key with the engine obeys it too: the controller cuts an expired grant's lease
/// rather than deleting it, and Redis refuses the key for `lockDelaySeconds` after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_delay_holds_off_a_process_outside_kubernetes() {
    use turnstile_lock::{AcquireOutcome, Backend};

    let server = redis();
    let mut env =
        controller_and_db_on_redis(server.url(), "leaseDurationSeconds: 2\nlockDelaySeconds: 6")
            .await;
    let a = env.hold("a", "db", "").await;
    let a_token = token_of(&a).expect("a's token");
    // a does not renew: its lease runs out and the lock-delay starts.
    let a = env.wait_phase("a", ClaimPhase::Expired).await;
    assert_eq!(reason_of(&a).as_deref(), Some("LeaseExpired"));
    let ended = std::time::Instant::now();

    let (outsider, key) = outside_process(&server, &env).await;
    let request = outside_request(&key, Duration::from_secs(30));
    let first = outsider.acquire(&request).await.expect("acquire");
    assert!(
        matches!(first, AcquireOutcome::Busy { .. }),
        "granted outside Kubernetes right after the involuntary end: {first:?}"
    );
    // The delay ends: the outside process gets the key, above every token the API showed.
    let token = loop {
        match outsider.acquire(&request).await.expect("acquire") {
            AcquireOutcome::Granted { fencing_token, .. } => break fencing_token,
            _ if ended.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            other => panic!("still refused 30 s after the end of a 6 s lock-delay: {other:?}"),
        }
    };
    let waited = ended.elapsed();
    assert!(
        waited >= Duration::from_secs(4),
        "granted after {waited:?}, inside the 6 s lock-delay"
    );
    assert!(
        i64::try_from(token).is_ok_and(|token| token > a_token),
        "token {token} after {a_token}"
    );
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_controller_away_both_lock_delays_hold_and_the_grant_waits_for_the_later() {
    use turnstile_lock::{AcquireOutcome, Backend};

    let server = redis();
    let delay = Duration::from_secs(4);
    let mut env =
        controller_and_db_on_redis(server.url(), "leaseDurationSeconds: 2\nlockDelaySeconds: 4")
            .await;
    let a = env.hold("a", "db", "").await;
    let expires_at = a
        .status
        .as_ref()
        .and_then(|s| s.expires_at.clone())
        .expect("expiresAt");
    // The controller goes away while a holds: nobody ends a's grant in the API.
    env.stop_controller().await;
    let until_expiry = (expires_at.0 - k8s_openapi::jiff::Timestamp::now())
        .total(k8s_openapi::jiff::Unit::Millisecond)
        .unwrap_or_default()
        .max(0.0) as u64;
    let expiry = Instant::now() + Duration::from_millis(until_expiry);

    // The backend's own lease runs out (at most 5 s after expiresAt) and starts its
    // lock-delay there: an outside process is refused meanwhile.
    let (outsider, key) = outside_process(&server, &env).await;
    let request = outside_request(&key, Duration::from_millis(500));
    tokio::time::sleep_until((expiry + Duration::from_secs(6)).into()).await;
    let during = outsider.acquire(&request).await.expect("acquire");
    assert!(
        matches!(during, AcquireOutcome::Busy { .. }),
        "the backend's lock-delay after its lease ran out: {during:?}"
    );
    // After it, the key is free in the backend (the outsider takes and drops it at once).
    tokio::time::sleep_until(
        (expiry + Duration::from_secs(5) + delay + Duration::from_millis(500)).into(),
    )
    .await;
    match outsider.acquire(&request).await.expect("acquire") {
        AcquireOutcome::Granted { .. } => {
            outsider
                .release(&key, "outside-process", 1)
                .await
                .expect("release");
        }
        other => panic!("the backend's delay should be over: {other:?}"),
    }

    // The controller returns, with b waiting: it ends a's grant now, and its own lock-delay
    // starts now, later than the backend's; b waits for it.
    env.apply_claim("b", "db", "");
    let returned = Instant::now();
    env.start_controller(redis_config(server.url()));
    let a = env.wait_phase("a", ClaimPhase::Expired).await;
    assert_eq!(reason_of(&a).as_deref(), Some("LeaseExpired"));
    env.wait_phase("b", ClaimPhase::Held).await;
    let waited = returned.elapsed();
    assert!(
        waited >= delay - Duration::from_secs(1),
        "b granted {waited:?} after the controller's return, inside its {delay:?} lock-delay"
    );
    env.stop_controller().await;
}

/// Redis goes away while a claim holds the lock and others wait, and comes back empty (no
/// persistence): the holder keeps its grant and token throughout, the lock reports
/// `BackendUnavailable` and grants nothing, and on return the lost grant is re-attached with
/// its own token; the next claim then gets a greater one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_gone_while_held_keeps_the_holder_and_grants_nothing() {
    let server = redis();
    let port = server.port();
    let url = server.url().to_owned();
    let mut env = controller_and_db_on_redis(&url, "leaseDurationSeconds: 300").await;
    let monitor = HolderMonitor::start(&env, "db", 1);
    env.a_holds_and_b_waits("db").await;

    server.stop();
    env.backend_gone_while_a_holds_and_b_waits().await;

    // Redis is back on its port, empty.
    let (mut process, _dir) = redis_on_port(port);
    env.wait_ready("db", "True").await;
    // The grant is back in Redis under a's claim.
    let key = format!("{}/db", env.namespace);
    let redis_keys = || {
        Command::new("redis-cli")
            .args(["-p", &port.to_string(), "--scan"])
            .output()
            .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
            .unwrap_or_default()
    };
    assert!(
        wait_until(Duration::from_secs(15), || redis_keys().contains(&key)),
        "a's grant was not re-attached: {}",
        redis_keys()
    );
    let after = env.claim("a").await;
    assert_eq!(phase_of(&after), Some(ClaimPhase::Held));
    assert_eq!(token_of(&after), Some(1), "re-attached with its own token");
    // Above a's token, though Redis lost it.
    env.hand_on_down_the_queue(monitor).await;
    process.stop();
}

/// Redis is away long enough for the lock's retries to back off past half a minute, while `a`
/// (the holder) is deleted and `b` waits: `a`'s release waits for Redis, so nothing is
/// granted meanwhile; once Redis answers again, `b` is granted within seconds, not at the
/// lock's next backed-off retry (the outage probe wakes the lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_end_of_a_long_outage_wakes_the_waiting_lock_at_once() {
    /// Long enough that a retry backing off from 0.5 s (doubling) is next due about half a
    /// minute after Redis returns.
    const OUTAGE: Duration = Duration::from_secs(36);
    /// A correct controller grants within the probe's second plus a reconnect; the backoff
    /// alone would wait some 28 s.
    const WITHIN: Duration = Duration::from_secs(12);
    let server = redis();
    let port = server.port();
    let url = server.url().to_owned();
    let mut env = controller_and_db_on_redis(&url, "leaseDurationSeconds: 300").await;
    env.a_holds_and_b_waits("db").await;

    server.stop();
    let down = Instant::now();
    env.delete_claim("a").await;
    env.wait_ready("db", "False").await;
    // Time: the outage lasts OUTAGE, whatever the controller does meanwhile.
    tokio::time::sleep(OUTAGE.saturating_sub(down.elapsed())).await;
    assert!(
        env.claims().get_opt("a").await.expect("get a").is_some(),
        "a's grant went away without Redis"
    );
    assert_eq!(phase_of(&env.claim("b").await), Some(ClaimPhase::Pending));

    let (mut process, _dir) = redis_on_port(port);
    assert!(
        wait_until(Duration::from_secs(10), || Command::new("redis-cli")
            .args(["-p", &port.to_string(), "PING"])
            .output()
            .is_ok_and(|out| out.stdout.starts_with(b"PONG"))),
        "Redis did not come back"
    );
    let back = Instant::now();
    let b = env
        .wait_claim("b", |claim| phase_of(claim) == Some(ClaimPhase::Held))
        .await;
    let waited = back.elapsed();
    println!("b granted {} ms after Redis answered", waited.as_millis());
    assert!(
        waited < WITHIN,
        "b was granted {waited:?} after Redis answered (the lock waited for its backoff)"
    );
    assert_eq!(token_of(&b), Some(2));
    env.wait_gone("a").await;
    env.stop_controller().await;
    process.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_redis_lost_to_an_outsider_ends_lock_lost_at_the_next_renewal() {
    use turnstile_lock::{AcquireOutcome, Backend as _};

    let server = redis();
    let mut env = controller_and_db_on_redis(server.url(), "leaseDurationSeconds: 300").await;
    env.a_holds_and_b_waits("db").await;

    // Redis forgets a's grant (its lease, not the token counter), and a process outside
    // Kubernetes takes the free key.
    let (outsider, key) = outside_process(&server, &env).await;
    server
        .command(&["DEL", &format!("turnstile:{{{key}}}:holders")])
        .expect("DEL");
    // Its lease is short: a refused grant is retried at the holder's expiry.
    let taken = outsider
        .acquire(&outside_request(&key, Duration::from_secs(6)))
        .await
        .expect("acquire");
    let AcquireOutcome::Granted { fencing_token, .. } = taken else {
        panic!("the outsider did not get the freed key: {taken:?}");
    };
    assert_eq!(fencing_token, 2, "the counter survived");

    // a renews (whole-second times: a renewal in the grant's own second extends nothing,
    // so it keeps renewing): the backend no longer holds its grant.
    let deadline = Instant::now() + Duration::from_secs(30);
    let a = loop {
        env.renew("a").await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let a = env.claim("a").await;
        if phase_of(&a) != Some(ClaimPhase::Held) {
            break a;
        }
        assert!(Instant::now() < deadline, "a still holds: {a:?}");
    };
    assert_eq!(phase_of(&a), Some(ClaimPhase::Expired), "{a:?}");
    assert_eq!(reason_of(&a).as_deref(), Some("LockLost"), "{a:?}");
    env.wait_event("a", "LockLost").await;
    // The outsider holds the key: b waits until its lease runs out, then gets a larger token.
    let b = env.claim("b").await;
    assert_eq!(phase_of(&b), Some(ClaimPhase::Pending), "{b:?}");
    assert_eq!(reason_of(&b).as_deref(), Some("LockBusy"), "{b:?}");
    let b = env.wait_phase("b", ClaimPhase::Held).await;
    assert_eq!(token_of(&b), Some(3));
    env.stop_controller().await;
}
