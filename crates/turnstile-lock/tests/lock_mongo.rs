//! MongoDB-specific behaviour of the lock engine, against a real MongoDB-wire-compatible
//! server (SecantusDB, or `MONGODB_URI`'s): wake-ups across clients by change stream and by
//! polling, the standalone fallback, configurable names and the stored document, literal
//! owner tokens, a semaphore raced by several clients, restarts, and typed errors.
//!
//! Each test uses a database of its own. Without any server (and not under `CI=true`) each
//! test prints one line and passes; under CI that is a failure.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongodb::bson::{doc, Bson, Document};
use support::grants::{
    acquire_as, is_taken, joined_within, locker_retrying, no_polling, pushed_on_release, LONG,
    NO_POLLING,
};
use support::until_queued;
use test_servers::{under_ci, MongoFlavor, MongoServer};
use turnstile_lock::backend::{MongoBackend, MongoBackendConfig, MongoWakeMode, MongoWakeSource};
use turnstile_lock::{Backend, LockError, Locker};

/// The shared test server, or `None` (after one printed line) when there is none.
async fn shared_server() -> Option<Arc<MongoServer>> {
    tokio::task::spawn_blocking(MongoServer::shared_or_skip)
        .await
        .expect("launcher thread")
}

/// A server of this test's own (to restart or stop it), or `None` when none can be started
/// here (no binary outside CI, or a flavor the installed server lacks).
async fn own_server(flavor: MongoFlavor) -> Option<MongoServer> {
    match tokio::task::spawn_blocking(move || MongoServer::start(flavor))
        .await
        .expect("launcher thread")
    {
        Ok(server) => Some(server),
        Err(error)
            if !under_ci()
                && matches!(
                    error.kind(),
                    std::io::ErrorKind::Unsupported | std::io::ErrorKind::NotFound
                ) =>
        {
            println!(
                "skipped: no MongoDB test server of flavor {flavor:?} can be started: {error}"
            );
            None
        }
        Err(error) => panic!("MongoDB test server failed to start: {error}"),
    }
}

fn fresh_database() -> String {
    format!("lock_mongo_{}", uuid::Uuid::new_v4().simple())
}

async fn connect(uri: &str, config: MongoBackendConfig) -> MongoBackend {
    MongoBackend::connect(uri, config).await.expect("connect")
}

fn locker(backend: &MongoBackend) -> Locker {
    locker_retrying(
        backend.clone(),
        Duration::from_secs(20),
        Duration::from_millis(200),
    )
}

async fn raw_collection(
    uri: &str,
    database: &str,
    collection: &str,
) -> mongodb::Collection<Document> {
    mongodb::Client::with_uri_str(uri)
        .await
        .expect("raw client")
        .database(database)
        .collection(collection)
}

/// A holder on `releasing`, a waiter on `waiting` (another client) that never polls: the
/// waiter must get the lock promptly after the release, so the wake-up crossed clients.
/// Asserts that both clients learn of releases by `source`, then [`handoff_across_clients`].
async fn woken_by(
    source: MongoWakeSource,
    releasing: &MongoBackend,
    waiting: &MongoBackend,
    key: &str,
) {
    assert_eq!(releasing.wake_source(), source, "the releasing client");
    assert_eq!(waiting.wake_source(), source, "the waiting client");
    handoff_across_clients(releasing, waiting, key).await;
}

async fn handoff_across_clients(releasing: &MongoBackend, waiting: &MongoBackend, key: &str) {
    let holder = locker(releasing)
        .lock(key, LONG)
        .acquire()
        .await
        .expect("holder");
    let waiter = {
        let locker = locker(waiting);
        let key = key.to_owned();
        tokio::spawn(async move {
            locker
                .lock(key, LONG)
                .owner("remote-waiter")
                .retry(no_polling())
                .acquire()
                .await
        })
    };
    until_queued(releasing, key, "remote-waiter").await;
    let lock = pushed_on_release(&holder, waiter).await;
    assert!(lock.fencing_token() > holder.fencing_token());
    lock.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_streams_wake_a_waiter_in_another_client() {
    let Some(server) = shared_server().await else {
        return;
    };
    let database = fresh_database();
    let config = MongoBackendConfig::new().database(&database);
    let releasing = connect(server.uri(), config.clone()).await;
    let waiting = connect(server.uri(), config.wake_mode(MongoWakeMode::ChangeStream)).await;
    woken_by(
        MongoWakeSource::ChangeStream,
        &releasing,
        &waiting,
        "cross-client",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_wakes_waiters_in_order_without_change_streams() {
    let Some(server) = shared_server().await else {
        return;
    };
    let config = MongoBackendConfig::new()
        .database(fresh_database())
        .wake_mode(MongoWakeMode::Polling)
        .poll_interval(Duration::from_millis(20));
    let releasing = connect(server.uri(), config.clone()).await;
    let waiting = connect(server.uri(), config).await;
    woken_by(MongoWakeSource::Polling, &releasing, &waiting, "polled").await;

    // Several waiters on the polling client are served first come, first served.
    let holder = locker(&releasing)
        .lock("polled-fifo", LONG)
        .acquire()
        .await
        .expect("holder");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for index in 0..4 {
        let (locker, order) = (locker(&waiting), Arc::clone(&order));
        tasks.push(tokio::spawn(async move {
            let lock = acquire_as(
                &locker,
                "polled-fifo",
                format!("fifo-{index}"),
                no_polling(),
            )
            .await;
            order.lock().unwrap().push(index);
            lock.release().await.expect("release");
        }));
        until_queued(&waiting, "polled-fifo", &format!("fifo-{index}")).await;
    }
    holder.release().await.expect("release");
    for task in tasks {
        joined_within(NO_POLLING / 2, task, "woken by polling the wake field").await;
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_server_falls_back_to_polling() {
    let Some(server) = own_server(MongoFlavor::Standalone).await else {
        return;
    };
    let config = MongoBackendConfig::new()
        .database(fresh_database())
        .poll_interval(Duration::from_millis(20));
    let required = MongoBackend::connect(
        server.uri(),
        config.clone().wake_mode(MongoWakeMode::ChangeStream),
    )
    .await;
    assert!(
        matches!(required, Err(LockError::BackendUnavailable { .. })),
        "change streams were required: {required:?}"
    );
    let releasing = connect(server.uri(), config.clone()).await;
    let waiting = connect(server.uri(), config).await;
    woken_by(MongoWakeSource::Polling, &releasing, &waiting, "standalone").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_is_the_urls_else_turnstile_and_the_collection_turnstile_locks() {
    let Some(shared) = shared_server().await else {
        return;
    };
    // The test builds URLs from a bare `mongodb://host:port/`: when `MONGODB_URI` carries a
    // path or options of its own, it uses a server of its own instead of skipping.
    let own = if shared.uri().ends_with('/') {
        None
    } else if let Some(own) = own_server(MongoFlavor::ReplicaSet).await {
        Some(own)
    } else {
        test_servers::skip_or_fail(
            "the_database_is_the_urls_else_turnstile_and_the_collection_turnstile_locks",
            &format!(
                "MONGODB_URI {} has a path or options of its own, and no server of the test's \
                 own can start here",
                shared.uri()
            ),
            test_servers::under_ci(),
        );
        return;
    };
    let uri = own.as_ref().map_or(shared.uri(), |own| own.uri());
    let Some(base) = uri.strip_suffix('/') else {
        panic!("the test server's URI {uri} ends without a slash");
    };
    let database = fresh_database();
    for (url, want) in [
        (format!("{base}/{database}"), database.as_str()),
        (format!("{base}/"), "turnstile"),
    ] {
        let backend = MongoBackend::connect(&url, MongoBackendConfig::new())
            .await
            .unwrap_or_else(|error| panic!("{url}: {error}"));
        assert_eq!(backend.database_name(), want, "{url}");
        assert_eq!(backend.collection_name(), "turnstile_locks", "{url}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_are_configurable_and_one_document_holds_the_lock() {
    let Some(server) = shared_server().await else {
        return;
    };
    let database = fresh_database();
    let config = MongoBackendConfig::new()
        .database(&database)
        .collection("team_locks");
    // Several processes starting at once all find (or create) the collection.
    let starts = (0..4).map(|_| MongoBackend::connect(server.uri(), config.clone()));
    let backends: Vec<MongoBackend> = futures::future::join_all(starts)
        .await
        .into_iter()
        .map(|backend| backend.expect("concurrent connect"))
        .collect();
    let backend = &backends[0];
    assert_eq!(backend.database_name(), database);
    assert_eq!(backend.collection_name(), "team_locks");
    let lock = locker(backend)
        .lock("jobs/nightly", Duration::from_secs(30))
        .max_holders(2)
        .shared()
        .owner("worker-1")
        .acquire()
        .await
        .expect("lock");

    let raw = raw_collection(server.uri(), &database, "team_locks").await;
    let stored = raw
        .find_one(doc! { "_id": "jobs/nightly" })
        .await
        .expect("find")
        .expect("the lock's document");
    assert_eq!(
        stored.get_i64("fence").expect("fence"),
        lock.fencing_token() as i64
    );
    let holders = stored.get_array("holders").expect("holders");
    assert_eq!(holders.len(), 1);
    let holder = holders[0].as_document().expect("holder entry");
    assert_eq!(holder.get_str("owner").expect("owner"), "worker-1");
    assert_eq!(
        holder.get_i64("token").expect("token"),
        lock.fencing_token() as i64
    );
    // The expiry is the server's now plus the lease, in milliseconds.
    let mut cursor = raw
        .aggregate([
            doc! { "$match": { "_id": "jobs/nightly" } },
            doc! { "$project": { "now": { "$toLong": "$$NOW" } } },
        ])
        .await
        .expect("aggregate");
    assert!(cursor.advance().await.expect("advance"));
    let now = cursor
        .deserialize_current()
        .expect("now")
        .get_i64("now")
        .expect("now");
    let remaining = holder.get_i64("exp").expect("exp") - now;
    assert!(
        (25_000..=30_000).contains(&remaining),
        "lease ends {remaining} ms after the server's now"
    );
    assert!(
        raw.find_one(doc! { "_id": "jobs/nightly", "op.owner": "worker-1" })
            .await
            .expect("find")
            .is_some(),
        "the write recorded its outcome"
    );
    lock.release().await.expect("release");
    // The document (and so the fence counter) outlives the grant.
    assert_eq!(raw.count_documents(doc! {}).await.expect("count"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_tokens_and_keys_are_taken_literally() {
    let Some(server) = shared_server().await else {
        return;
    };
    let backend = connect(
        server.uri(),
        MongoBackendConfig::new().database(fresh_database()),
    )
    .await;
    let locker = locker(&backend);
    for key in ["$holders", "a.b", "{\"$gt\":1}", "ключ"] {
        let first = locker
            .lock(key, LONG)
            .owner("$holders")
            .acquire()
            .await
            .expect("acquire");
        for intruder in ["$$NOW", "$$ROOT", "$fence", "$holders.owner"] {
            assert!(
                is_taken(&locker.lock(key, LONG).owner(intruder)).await,
                "{intruder} got {key} while $holders held it"
            );
        }
        let snapshot = locker.snapshot(key).await.expect("snapshot");
        assert_eq!(snapshot.holders.len(), 1);
        assert_eq!(snapshot.holders[0].owner, "$holders");
        assert!(backend.is_held(key, "$holders").await.expect("is_held"));
        assert!(!backend.is_held(key, "$$ROOT").await.expect("is_held"));
        assert!(!backend
            .release(key, "$$ROOT", 1)
            .await
            .expect("release other"));
        first.release_strict().await.expect("release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_raced_by_several_clients_counts_zero_violations() {
    const CLIENTS: usize = 3;
    const TASKS_PER_CLIENT: usize = 4;
    const ROUNDS: usize = 8;
    const MAX_HOLDERS: u32 = 2;
    let Some(server) = shared_server().await else {
        return;
    };
    let config = MongoBackendConfig::new().database(fresh_database());
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(connect(server.uri(), config.clone()).await);
    }
    let inside = Arc::new(AtomicUsize::new(0));
    let violations = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for client in &clients {
        for _ in 0..TASKS_PER_CLIENT {
            let locker = locker(client);
            let (inside, violations, tokens) = (
                Arc::clone(&inside),
                Arc::clone(&violations),
                Arc::clone(&tokens),
            );
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let lock = locker
                        .lock("raced", Duration::from_secs(10))
                        .max_holders(MAX_HOLDERS)
                        .shared()
                        .acquire()
                        .await
                        .expect("acquire");
                    if inside.fetch_add(1, Ordering::SeqCst) >= MAX_HOLDERS as usize {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                    tokens.lock().unwrap().push(lock.fencing_token());
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    lock.release_strict().await.expect("still held at release");
                }
            }));
        }
    }
    for task in tasks {
        task.await.expect("join");
    }
    assert_eq!(
        violations.load(Ordering::SeqCst),
        0,
        "more than {MAX_HOLDERS} inside"
    );
    let mut tokens = tokens.lock().unwrap().clone();
    let grants = tokens.len();
    assert_eq!(grants, CLIENTS * TASKS_PER_CLIENT * ROUNDS);
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), grants, "duplicate fencing tokens");
}

/// Retries `try_acquire` while the driver reconnects after a restart. A clean restart loses
/// nothing, so a held key is a failure (`lost_release_lease` zero); a crash may lose the key's
/// last release too, leaving it held until that lease ends, so that is waited out.
/// Takes and releases `key` (lease `lease`) on `backend`; returns the grant's fencing token.
async fn token_of_one_grant(backend: &MongoBackend, key: &str, lease: Duration) -> u64 {
    let lock = locker(backend)
        .lock(key, lease)
        .acquire()
        .await
        .expect("lock");
    lock.release().await.expect("release");
    lock.fencing_token()
}

/// Runs `restart` (a clean restart or a crash) on `server` on a blocking thread, and hands
/// the server back once it is up again.
async fn restarted(
    mut server: MongoServer,
    restart: fn(&mut MongoServer) -> std::io::Result<()>,
) -> MongoServer {
    tokio::task::spawn_blocking(move || {
        restart(&mut server).expect("restart");
        server
    })
    .await
    .expect("launcher thread")
}

async fn lock_after_restart(
    backend: &MongoBackend,
    key: &str,
    lost_release_lease: Duration,
) -> turnstile_lock::Lock {
    let deadline = tokio::time::Instant::now() + lost_release_lease + Duration::from_secs(10);
    loop {
        match locker(backend).lock(key, LONG).try_acquire().await {
            Ok(Some(lock)) => return lock,
            Ok(None) => assert!(
                !lost_release_lease.is_zero(),
                "{key} is held after the restart"
            ),
            Err(error) => assert!(error.is_backend_unavailable(), "{error}"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no lock on {key} within {lost_release_lease:?} and 10 s of the restart"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_wake_ups_survive_restarts_and_the_floor_covers_data_loss() {
    let Some(mut server) = own_server(MongoFlavor::ReplicaSet).await else {
        return;
    };
    let config = MongoBackendConfig::new()
        .database(fresh_database())
        .operation_timeout(Duration::from_secs(5));
    let releasing = connect(server.uri(), config.clone()).await;
    let waiting = connect(server.uri(), config).await;
    let before = token_of_one_grant(&releasing, "restart", LONG).await;
    server = restarted(server, MongoServer::restart).await;
    let after = lock_after_restart(&releasing, "restart", Duration::ZERO).await;
    assert!(
        after.fencing_token() > before,
        "a clean restart keeps the counter"
    );
    after.release().await.expect("release");
    // The change streams were resumed or reopened: wake-ups still cross clients.
    handoff_across_clients(&releasing, &waiting, "restart").await;

    // A crash may lose the latest writes (the test server does not sync each commit): the
    // high-water mark kept elsewhere (the DistributedLock's status) restores the order.
    // A short lease: the crash may lose this grant's release, which then holds until it ends.
    let crash_lease = Duration::from_secs(3);
    let high_water = token_of_one_grant(&releasing, "crash", crash_lease).await;
    server = restarted(server, MongoServer::crash_and_restart).await;
    let raised = loop {
        match releasing.raise_fencing_floor("crash", high_water).await {
            Ok(counter) => break counter,
            Err(error) => {
                assert!(error.is_backend_unavailable(), "{error}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert!(raised >= high_water);
    let next = lock_after_restart(&releasing, "crash", crash_lease).await;
    assert!(next.fencing_token() > high_water);
    next.release().await.expect("release");
    handoff_across_clients(&releasing, &waiting, "crash").await;
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_documents_and_a_lost_server_are_typed_errors() {
    let Some(server) = own_server(MongoFlavor::ReplicaSet).await else {
        return;
    };
    let database = fresh_database();
    let config = MongoBackendConfig::new()
        .database(&database)
        .operation_timeout(Duration::from_secs(2));
    let backend = connect(server.uri(), config.clone()).await;
    let raw = raw_collection(server.uri(), &database, "turnstile_locks").await;
    raw.insert_one(doc! { "_id": "garbage", "holders": "x", "fence": "y" })
        .await
        .expect("insert");
    // A live holder whose token is not a number.
    raw.insert_one(doc! {
        "_id": "odd",
        "fence": Bson::Int64(3),
        "holders": [{ "owner": "a", "token": "t", "exp": Bson::Int64(i64::MAX) }],
    })
    .await
    .expect("insert");
    let locker = locker(&backend);
    for key in ["garbage", "odd"] {
        let acquired = locker.lock(key, LONG).try_acquire().await;
        assert!(
            matches!(acquired, Err(LockError::BackendUnavailable { .. })),
            "{key}: {acquired:?}"
        );
        let snapshot = locker.snapshot(key).await;
        assert!(
            matches!(snapshot, Err(LockError::BackendUnavailable { .. })),
            "{key}: {snapshot:?}"
        );
    }
    let uri = server.uri().to_owned();
    server.stop();
    let started = tokio::time::Instant::now();
    let acquired = locker.lock("k", LONG).try_acquire().await;
    assert!(
        matches!(
            acquired,
            Err(LockError::BackendUnavailable {
                backend: "mongo",
                ..
            })
        ),
        "{acquired:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "bounded by the operation timeout"
    );
    let refused = MongoBackend::connect(&uri, config).await;
    assert!(
        matches!(refused, Err(LockError::BackendUnavailable { .. })),
        "{refused:?}"
    );
    let invalid = MongoBackend::connect("not-a-url", MongoBackendConfig::new()).await;
    assert!(
        matches!(invalid, Err(LockError::InvalidArgument(_))),
        "{invalid:?}"
    );
    let unnamed = MongoBackend::connect(&uri, MongoBackendConfig::new().collection("")).await;
    assert!(
        matches!(unnamed, Err(LockError::InvalidArgument(_))),
        "{unnamed:?}"
    );
}
