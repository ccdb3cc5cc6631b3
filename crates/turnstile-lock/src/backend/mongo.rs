//! MongoDB backend: one document per lock, every state change one filtered single-document
//! write with majority write concern, expiry judged by the server's `$$NOW`, wake-ups over a
//! change stream (or polling where the deployment has none).
//!
//! # Time
//!
//! Clients never send a point in time, only durations (the lease, the waiter heartbeat). Each
//! write evaluates `$$NOW` once on the primary that applies it and compares and stores
//! expiries in that clock. Two clients with skewed clocks therefore cannot disagree about
//! whether a lease is live: the only clock consulted is the one in the server applying the
//! write, and writes to one lock document are serialized there. A client's own view of its
//! lease ([`Lock::lease_deadline`](crate::Lock::lease_deadline)) is measured from
//! *before* it sent the request, by its monotonic clock, so it ends no later than the
//! server's (clock-rate drift aside). The one remaining hazard is an election onto a primary
//! whose wall clock is ahead of the old one's, which shortens live leases by the difference:
//! keep the members' clocks synchronized (NTP), and hand the fencing token to the resource.
//!
//! # Atomicity
//!
//! Holders, fencing tokens, the fence counter and the wait queue of a key live in one
//! document (see module `pipelines`), so a grant and its token are one write and a semaphore can
//! never admit more than `max_holders`, however many clients race. Acquire is one
//! `findOneAndUpdate` upsert filtered on `_id` whose update pipeline decides the outcome;
//! the grant condition depends on `$$NOW`, which a filter could only express with `$expr`,
//! and `$expr` is not allowed in upsert filters. A duplicate-key error (11000) only means that
//! another client created the document first: the write is simply repeated against it.
//! Release, extend and the fencing floor are single-document writes filtered by key (and, for
//! extend, by the owner's live lease).

mod document;
mod pipelines;
mod sequencer;
mod wakes;

use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::TryStreamExt;
use mongodb::bson::{doc, Bson, Document};
use mongodb::error::{ErrorKind, WriteFailure};
use mongodb::options::{
    ClientOptions, CollectionOptions, ReadConcern, ReturnDocument, SelectionCriteria, WriteConcern,
};
use mongodb::{Client, Collection};

pub use self::wakes::MongoWakeSource;

use self::document::{read_now, LockDocument};
use self::pipelines::{
    acquire_pipeline, extend_pipeline, holds_live_lease, millis, read_with_now, release_pipeline,
    AcquireParams,
};
use self::sequencer::KeySequencer;
use self::wakes::{open_change_stream, Wakes};
use super::{
    validate_key, validate_max_holders, validate_owner, validate_request, validate_ttl,
    AcquireOutcome, AcquireRequest, Backend, LockSnapshot, WakeSubscription,
};
use crate::error::{LockError, LockResult};

const BACKEND: &str = "mongo";
/// MongoDB's duplicate-key error code.
const DUPLICATE_KEY: i32 = 11000;
/// MongoDB's "collection already exists" error code.
const NAMESPACE_EXISTS: i32 = 48;
/// How often an upsert is repeated after losing the race to create the document.
const UPSERT_ATTEMPTS: usize = 5;
/// A write task gives up its key's turn after this many operation timeouts without an answer.
const ABANDON_FACTOR: u32 = 3;

/// How waiters learn about releases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MongoWakeMode {
    /// A change stream if the deployment supports one, else polling.
    #[default]
    Auto,
    /// A change stream; connecting fails if the deployment has none.
    ChangeStream,
    /// Polling, even where change streams exist.
    Polling,
}

/// Settings of a [`MongoBackend`].
#[derive(Debug, Clone)]
pub struct MongoBackendConfig {
    database: Option<String>,
    collection: String,
    wake_mode: MongoWakeMode,
    poll_interval: Duration,
    operation_timeout: Duration,
}

impl Default for MongoBackendConfig {
    fn default() -> Self {
        MongoBackendConfig {
            database: None,
            collection: "turnstile_locks".to_owned(),
            wake_mode: MongoWakeMode::Auto,
            poll_interval: Duration::from_millis(100),
            operation_timeout: Duration::from_secs(10),
        }
    }
}

impl MongoBackendConfig {
    /// Defaults: the URL's database (else `turnstile`), collection `turnstile_locks`, change
    /// streams when available, 100 ms polling otherwise, 10 s operation timeout.
    pub fn new() -> Self {
        Self::default()
    }

    setters! {
        /// The database holding the locks collection (overrides the URL's `/database`).
        database(name: impl Into<String>) => database = Some(name.into());

        /// The locks collection's name.
        collection(name: impl Into<String>) => collection = name.into();

        /// How waiters learn about releases.
        wake_mode(mode: MongoWakeMode) => wake_mode = mode;

        /// How often keys with local waiters are polled when there is no change stream.
        poll_interval(interval: Duration) => poll_interval = interval;

        /// How long one operation may take before it fails as
        /// [`LockError::BackendUnavailable`] (also bounds server selection at connect).
        operation_timeout(timeout: Duration) => operation_timeout = timeout;
    }
}

#[derive(Debug)]
struct Shared {
    collection: Collection<Document>,
    database: String,
    operation_timeout: Duration,
    sequencer: Arc<KeySequencer>,
    wakes: Wakes,
}

/// Locks in a MongoDB collection, shared by every process using the same database and
/// collection. Cloning shares the client, its connection pool and the wake-up listener.
#[derive(Debug, Clone)]
pub struct MongoBackend {
    shared: Arc<Shared>,
}

fn mongo_error(operation: &'static str) -> impl FnOnce(mongodb::error::Error) -> LockError {
    move |error| LockError::backend(BACKEND, operation, error)
}

fn malformed(operation: &'static str) -> impl FnOnce(document::Malformed) -> LockError {
    move |error| LockError::backend(BACKEND, operation, error)
}

fn error_code(error: &mongodb::error::Error) -> Option<i32> {
    match error.kind.as_ref() {
        ErrorKind::Command(command) => Some(command.code),
        ErrorKind::Write(WriteFailure::WriteError(write)) => Some(write.code),
        _ => None,
    }
}

fn timed_out(operation: &'static str, timeout: Duration) -> LockError {
    LockError::backend(BACKEND, operation, format!("no answer within {timeout:?}"))
}

/// Runs a driver operation, failing with [`LockError::BackendUnavailable`] after `timeout`.
async fn bounded<T>(
    operation: &'static str,
    timeout: Duration,
    future: impl IntoFuture<Output = Result<T, mongodb::error::Error>>,
) -> LockResult<T> {
    match tokio::time::timeout(timeout, future.into_future()).await {
        Ok(result) => result.map_err(mongo_error(operation)),
        Err(_) => Err(timed_out(operation, timeout)),
    }
}

/// `findOneAndUpdate` upsert returning the new document, repeated when another client
/// created the document between our filter and our insert (11000), or when the server
/// returned no document (a known gap of some test servers under concurrent upserts).
async fn upsert_returning_new(
    collection: &Collection<Document>,
    operation: &'static str,
    key: &str,
    update: impl Fn() -> mongodb::options::UpdateModifications,
) -> LockResult<Document> {
    for attempt in 1..=UPSERT_ATTEMPTS {
        let result = collection
            .find_one_and_update(doc! { "_id": key }, update())
            .upsert(true)
            .return_document(ReturnDocument::After)
            .await;
        match result {
            Ok(Some(document)) => return Ok(document),
            Ok(None) => {
                tracing::debug!(
                    key,
                    operation,
                    attempt,
                    "upsert returned no document; repeating"
                );
            }
            Err(error) if error_code(&error) == Some(DUPLICATE_KEY) => {
                tracing::debug!(
                    key,
                    operation,
                    attempt,
                    "lost the race to create the lock document; repeating"
                );
            }
            Err(error) => return Err(mongo_error(operation)(error)),
        }
    }
    Err(LockError::backend(
        BACKEND,
        operation,
        format!("no document after {UPSERT_ATTEMPTS} upsert attempts"),
    ))
}

/// Updates the existing document `filter` finds (no upsert) with `update`; returns the
/// document as the update left it, parsed, or `None` when nothing matched.
async fn update_existing(
    collection: &Collection<Document>,
    operation: &'static str,
    filter: Document,
    update: impl Into<mongodb::options::UpdateModifications>,
) -> LockResult<Option<LockDocument>> {
    let document = collection
        .find_one_and_update(filter, update)
        .return_document(ReturnDocument::After)
        .await
        .map_err(mongo_error(operation))?;
    document
        .map(|document| LockDocument::parse(&document).map_err(malformed(operation)))
        .transpose()
}

impl MongoBackend {
    /// Connects to `url` (`mongodb://…` or `mongodb+srv://…`), checks the server answers,
    /// creates the locks collection if it is missing (idempotent: concurrent starts are fine)
    /// and starts the wake-up listener. Must be called inside a tokio runtime.
    /// A malformed URL or an empty name is [`LockError::InvalidArgument`]; an unreachable or
    /// failing server is [`LockError::BackendUnavailable`].
    pub async fn connect(url: &str, config: MongoBackendConfig) -> LockResult<Self> {
        if config.collection.is_empty() || config.database.as_deref() == Some("") {
            return Err(LockError::invalid(
                "mongo database and collection names must not be empty",
            ));
        }
        let parsed = tokio::time::timeout(config.operation_timeout, ClientOptions::parse(url))
            .await
            .map_err(|_| timed_out("parse url", config.operation_timeout))?;
        let mut options = match parsed {
            Ok(options) => options,
            Err(error) if matches!(error.kind.as_ref(), ErrorKind::InvalidArgument { .. }) => {
                return Err(LockError::invalid(format!("mongo url: {error}")));
            }
            Err(error) => return Err(mongo_error("parse url")(error)),
        };
        options
            .app_name
            .get_or_insert_with(|| "turnstile".to_owned());
        options
            .server_selection_timeout
            .get_or_insert(config.operation_timeout);
        let database_name = config
            .database
            .clone()
            .or_else(|| options.default_database.clone())
            .unwrap_or_else(|| "turnstile".to_owned());
        let client = Client::with_options(options).map_err(mongo_error("connect"))?;
        let database = client.database(&database_name);
        bounded(
            "ping",
            config.operation_timeout,
            database.run_command(doc! { "ping": 1 }),
        )
        .await?;
        match bounded(
            "create collection",
            config.operation_timeout,
            database.create_collection(&config.collection),
        )
        .await
        {
            Ok(()) => {}
            Err(LockError::BackendUnavailable { source, .. })
                if source
                    .downcast_ref::<mongodb::error::Error>()
                    .and_then(error_code)
                    == Some(NAMESPACE_EXISTS) => {}
            Err(error) => return Err(error),
        }
        let collection = database
            .collection_with_options::<Document>(&config.collection, lock_collection_options());
        let wakes = Self::start_wakes(&collection, &config).await?;
        tracing::info!(database = %database_name, collection = %config.collection, wake_source = ?wakes.source(), "mongo lock backend connected");
        Ok(MongoBackend {
            shared: Arc::new(Shared {
                collection,
                database: database_name,
                operation_timeout: config.operation_timeout,
                sequencer: Arc::new(KeySequencer::default()),
                wakes,
            }),
        })
    }

    async fn start_wakes(
        collection: &Collection<Document>,
        config: &MongoBackendConfig,
    ) -> LockResult<Wakes> {
        let polling = || {
            Wakes::with_polling(
                collection.clone(),
                config.poll_interval,
                config.operation_timeout,
            )
        };
        if config.wake_mode == MongoWakeMode::Polling {
            return Ok(polling());
        }
        let opened = tokio::time::timeout(
            config.operation_timeout,
            open_change_stream(collection, &[], None),
        )
        .await
        .map_err(|_| timed_out("open change stream", config.operation_timeout))?;
        match opened {
            Ok(stream) => Ok(Wakes::with_change_stream(
                collection.clone(),
                stream,
                config.operation_timeout,
            )),
            // The server answered with an error: it has no change streams (a standalone).
            Err(error)
                if config.wake_mode == MongoWakeMode::Auto
                    && matches!(error.kind.as_ref(), ErrorKind::Command(_)) =>
            {
                tracing::info!(%error, "mongo change streams unavailable; waiters are woken by polling");
                Ok(polling())
            }
            Err(error) => Err(mongo_error("open change stream")(error)),
        }
    }

    /// How this backend learns about releases (decided at connect).
    pub fn wake_source(&self) -> MongoWakeSource {
        self.shared.wakes.source()
    }

    /// The database holding the locks collection.
    pub fn database_name(&self) -> &str {
        &self.shared.database
    }

    /// The locks collection.
    pub fn collection_name(&self) -> &str {
        self.shared.collection.name()
    }

    fn timeout(&self) -> Duration {
        self.shared.operation_timeout
    }

    /// Runs a write on `key` in the key's turn (see [`sequencer`]). The write runs in a task of
    /// its own that keeps the turn until the server answered, so an operation issued later on
    /// the key is applied after it even if this caller stops waiting. The caller waits at most
    /// the operation timeout; the task gives up (and the turn) after [`ABANDON_FACTOR`] times
    /// that, as a last resort against a connection that never answers.
    async fn write_in_turn<T, W>(
        &self,
        operation: &'static str,
        key: &str,
        write: W,
    ) -> LockResult<T>
    where
        T: Send + 'static,
        W: std::future::Future<Output = LockResult<T>> + Send + 'static,
    {
        let turn = self.shared.sequencer.turn(key).await;
        let timeout = self.timeout();
        let task = tokio::spawn(async move {
            let _turn = turn;
            tokio::time::timeout(timeout * ABANDON_FACTOR, write)
                .await
                .unwrap_or_else(|_| Err(timed_out(operation, timeout * ABANDON_FACTOR)))
        });
        match tokio::time::timeout(timeout, task).await {
            Ok(Ok(result)) => result,
            Ok(Err(join_error)) => Err(LockError::backend(BACKEND, operation, join_error)),
            Err(_) => Err(timed_out(operation, timeout)),
        }
    }

    /// The lock document with the server's now, or `None` if the key was never used. Read in
    /// the key's turn, so it reflects every write this backend issued on the key before.
    async fn read(
        &self,
        operation: &'static str,
        key: &str,
    ) -> LockResult<Option<(LockDocument, i64)>> {
        let _turn = self.shared.sequencer.turn(key).await;
        let collection = &self.shared.collection;
        let documents: Vec<Document> = bounded(operation, self.timeout(), async {
            collection
                .aggregate(read_with_now(key))
                .await?
                .try_collect()
                .await
        })
        .await?;
        let Some(document) = documents.first() else {
            return Ok(None);
        };
        let now = read_now(document).map_err(malformed(operation))?;
        let parsed = LockDocument::parse(document).map_err(malformed(operation))?;
        Ok(Some((parsed, now)))
    }
}

#[async_trait]
impl Backend for MongoBackend {
    fn kind(&self) -> &'static str {
        BACKEND
    }

    async fn acquire(&self, request: &AcquireRequest<'_>) -> LockResult<AcquireOutcome> {
        validate_request(request)?;
        let params = AcquireParams {
            owner: request.owner.to_owned(),
            ttl_ms: millis(request.ttl),
            max_holders: i64::from(request.max_holders),
            mode: request.mode,
            waiter_lease_ms: millis(request.waiter_lease).max(1),
            share: request.share,
            priority: i64::from(request.priority),
            max_hold_ms: request.max_hold.map_or(-1, millis),
            lock_delay_ms: millis(request.lock_delay),
        };
        let collection = self.shared.collection.clone();
        let key = request.key.to_owned();
        self.write_in_turn("acquire", request.key, async move {
            let pipeline = acquire_pipeline(&params);
            let document =
                upsert_returning_new(&collection, "acquire", &key, || pipeline.clone().into())
                    .await?;
            LockDocument::parse(&document)
                .and_then(|parsed| parsed.acquire_outcome(&params.owner))
                .map_err(malformed("acquire"))
        })
        .await
    }

    async fn release(&self, key: &str, owner: &str, max_holders: u32) -> LockResult<bool> {
        validate_key(key)?;
        validate_owner(owner)?;
        validate_max_holders(max_holders)?;
        let collection = self.shared.collection.clone();
        let (filter, owner) = (doc! { "_id": key }, owner.to_owned());
        self.write_in_turn("release", key, async move {
            let update = release_pipeline(&owner, i64::from(max_holders));
            match update_existing(&collection, "release", filter, update).await? {
                None => Ok(false),
                Some(parsed) => parsed.release_outcome(&owner).map_err(malformed("release")),
            }
        })
        .await
    }

    async fn extend(&self, key: &str, owner: &str, ttl: Duration) -> LockResult<Option<Duration>> {
        validate_key(key)?;
        validate_owner(owner)?;
        validate_ttl(ttl)?;
        // Not an upsert, so the live-lease condition may use `$expr` (with the server's now).
        let filter = doc! { "_id": key, "$expr": holds_live_lease(owner) };
        let update = extend_pipeline(owner, millis(ttl));
        let (collection, owner) = (self.shared.collection.clone(), owner.to_owned());
        self.write_in_turn("extend", key, async move {
            match update_existing(&collection, "extend", filter, update).await? {
                None => Ok(None),
                Some(parsed) => parsed
                    .extend_outcome(&owner)
                    .map(Some)
                    .map_err(malformed("extend")),
            }
        })
        .await
    }

    async fn is_held(&self, key: &str, owner: &str) -> LockResult<bool> {
        validate_key(key)?;
        validate_owner(owner)?;
        Ok(self
            .read("is_held", key)
            .await?
            .is_some_and(|(document, now)| document.holds(owner, now)))
    }

    async fn snapshot(&self, key: &str) -> LockResult<LockSnapshot> {
        validate_key(key)?;
        Ok(self
            .read("snapshot", key)
            .await?
            .map(|(document, now)| document.snapshot(now))
            .unwrap_or_default())
    }

    async fn raise_fencing_floor(&self, key: &str, floor: u64) -> LockResult<u64> {
        validate_key(key)?;
        let floor = i64::try_from(floor).map_err(|_| {
            LockError::invalid(format!(
                "fencing floor must be at most {}, got {floor}",
                i64::MAX
            ))
        })?;
        let collection = self.shared.collection.clone();
        let key_owned = key.to_owned();
        self.write_in_turn("raise_fencing_floor", key, async move {
            let document =
                upsert_returning_new(&collection, "raise_fencing_floor", &key_owned, || {
                    doc! { "$max": { "fence": Bson::Int64(floor) } }.into()
                })
                .await?;
            LockDocument::parse(&document)
                .map(|parsed| parsed.fence)
                .map_err(malformed("raise_fencing_floor"))
        })
        .await
    }

    async fn subscribe(&self, key: &str, owner: &str) -> LockResult<WakeSubscription> {
        validate_key(key)?;
        validate_owner(owner)?;
        self.shared
            .wakes
            .subscribe(key, owner)
            .await
            .map_err(mongo_error("subscribe"))
    }
}

/// How the locks collection is read and written. Majority writes: an acknowledged grant
/// survives a failover. Majority reads from the primary: a read never shows a grant that
/// could still be rolled back.
fn lock_collection_options() -> CollectionOptions {
    CollectionOptions::builder()
        .write_concern(WriteConcern::majority())
        .read_concern(ReadConcern::majority())
        .selection_criteria(SelectionCriteria::ReadPreference(
            mongodb::options::ReadPreference::Primary,
        ))
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_locks_collection_reads_and_writes_by_majority_on_the_primary() {
        let options = lock_collection_options();
        assert_eq!(options.write_concern, Some(WriteConcern::majority()));
        assert_eq!(options.read_concern, Some(ReadConcern::majority()));
        assert!(matches!(
            options.selection_criteria,
            Some(SelectionCriteria::ReadPreference(
                mongodb::options::ReadPreference::Primary
            ))
        ));
    }
}
