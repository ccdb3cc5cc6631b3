//! etcd backend: each lock is one key whose value is the lock's whole state (JSON), changed
//! only by compare-and-swap transactions; hand-offs reach the new holder through a watch.
//!
//! # One step, one transaction
//!
//! Every operation reads the key, applies the engine's rules to its state in this process
//! (module `state`, the same rules the memory backend runs), and writes the result back in a
//! transaction that succeeds only if the key's `mod_revision` is still the one read; otherwise
//! the transaction's else-branch returns the new value and the step runs again on it. So every
//! change is atomic, and linearizable as etcd's writes are: a leader change or a member lost
//! cannot let two writes both build on the same value.
//!
//! **Fencing tokens** are the value's counter, raised by one per grant inside that
//! compare-and-swap: two grants can never read the same counter, the counter survives leader
//! changes (it is data, replicated by Raft) and compaction (which drops old revisions, never
//! the current value). After etcd data loss the engine's `raise_fencing_floor` lifts it above
//! the high-water mark kept elsewhere, as on every backend.
//!
//! **Time**: etcd has no clock a client can read. Deadlines are stored relative to the write
//! that set them and counted by each process from when it saw that write (module
//! `document`): no process judges a lease over before its holder does, and no two clocks need
//! agree.
//!
//! **Wake-ups**: a release hands the lock to the compatible head of the queue in its own write
//! and lists those hand-offs in the value it writes; each backend follows the keys it has
//! local waiters for with one etcd watch each and hands each listed owner its grant, so the
//! new holder needs no round trip and nobody else acts (module `watches`).
//!
//! A value carries every holder and waiter of its lock, and etcd limits a request to 1.5 MiB
//! by default: about 10 000 waiters on one lock.

mod config;
mod document;
mod watches;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, Identity, KeyValue, KvClient,
    TlsOptions, Txn, TxnOp, TxnOpResponse,
};
use tokio::time::Instant;

pub use self::config::EtcdBackendConfig;
use self::document::{Document, HandoffEntry, Sightings};
use self::watches::KeyWatches;
use super::state::KeyState;
use super::{
    ceil_millis, validate_key, validate_max_holders, validate_owner, validate_request,
    validate_ttl, AcquireOutcome, AcquireRequest, Backend, Handoff, LockSnapshot, WakeSubscription,
};
use crate::error::{LockError, LockResult};

const BACKEND: &str = "etcd";

/// Pause before a request that reached no member is sent again.
const RETRY_PAUSE: Duration = Duration::from_millis(10);

/// Why [`EtcdBackend::connect`] failed, when the cause is one a person has to fix: kept as
/// the `source` of [`LockError::BackendUnavailable`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EtcdConnectError {
    /// The URL could not be used.
    #[error("invalid etcd URL: {0}")]
    InvalidUrl(String),
    /// A CA file or client certificate was given for a URL without TLS.
    #[error("a CA file or client certificate needs an etcds:// URL (TLS)")]
    TlsSettingsWithoutTls,
    /// A TLS file could not be read.
    #[error("cannot read the {what} {path:?}")]
    ReadFile {
        /// `CA file`, `client certificate` or `client key`.
        what: &'static str,
        /// The path given.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

fn connect_error(error: impl Into<crate::error::BoxError>) -> LockError {
    LockError::backend(BACKEND, "connect", error)
}

/// Locks in etcd (v3 API): see the [module docs](self) for how each step stays atomic.
///
/// Cloning shares the connection, the watches and the table of when each write was seen.
#[derive(Clone)]
pub struct EtcdBackend {
    kv: KvClient,
    prefix: String,
    request_timeout: Duration,
    sightings: Arc<Sightings>,
    watches: Arc<KeyWatches>,
}

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// What one step did to a lock's state, and what it answers.
struct Step<T> {
    answer: T,
    handoffs: Vec<(String, Handoff)>,
    /// Write even if the state did not change (a release: see [`EtcdBackend::release`]).
    always_write: bool,
}

impl<T> Step<T> {
    fn answer(answer: T) -> Self {
        Step {
            answer,
            handoffs: Vec::new(),
            always_write: false,
        }
    }
}

impl EtcdBackend {
    /// Connects to the endpoints of `config` (authenticating and reading TLS files first).
    ///
    /// # Errors
    /// [`LockError::BackendUnavailable`] when the URL or a TLS file is unusable (the source is
    /// an [`EtcdConnectError`]) or no endpoint answers.
    pub async fn connect(config: EtcdBackendConfig) -> LockResult<Self> {
        let parsed = config.parsed().map_err(connect_error)?;
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            .with_timeout(config.request_timeout)
            // A member cut off from the quorum fails requests instead of serving a watch
            // that never fires.
            .with_require_leader(true)
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5));
        if let Some((user, password)) = &parsed.user {
            options = options.with_user(user.clone(), password.clone());
        }
        if parsed.tls {
            let mut tls = TlsOptions::new();
            tls = match &config.ca_file {
                Some(path) => tls.ca_certificate(Certificate::from_pem(read(path, "CA file")?)),
                None => tls.with_webpki_roots(),
            };
            if let Some((cert, key)) = &config.client_cert {
                tls = tls.identity(Identity::from_pem(
                    read(cert, "client certificate")?,
                    read(key, "client key")?,
                ));
            }
            options = options.with_tls(tls);
        }
        let client = Client::connect(parsed.client_endpoints(), Some(options))
            .await
            .map_err(connect_error)?;
        let mut kv = client.kv_client();
        // Fail here, not at the first lock, when no endpoint answers or auth is refused.
        tokio::time::timeout(
            config.request_timeout,
            kv.get("turnstile-connect-check", None),
        )
        .await
        .map_err(connect_error)?
        .map_err(connect_error)?;
        let sightings = Arc::new(Sightings::default());
        let watches = KeyWatches::new(
            client.watch_client(),
            config.key_prefix.clone(),
            Arc::clone(&sightings),
            config.request_timeout,
        );
        Ok(EtcdBackend {
            kv,
            prefix: config.key_prefix,
            request_timeout: config.request_timeout,
            sightings,
            watches: Arc::new(watches),
        })
    }

    fn etcd_key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn unavailable(&self, what: &str, error: impl Into<crate::error::BoxError>) -> LockError {
        LockError::backend(BACKEND, what.to_owned(), error)
    }

    /// The current value of `key` (default state if absent) and its mod revision (0 if absent).
    async fn read(&self, key: &str) -> LockResult<(Document, i64)> {
        let etcd_key = self.etcd_key(key);
        let response = self
            .retrying("read", || {
                let mut kv = self.kv.clone();
                let etcd_key = etcd_key.clone();
                async move { kv.get(etcd_key, None).await }
            })
            .await?;
        self.parse(key, response.kvs().first())
    }

    /// Runs `call` until it answers, for up to the request timeout, again after each error
    /// that says the request did not reach a member (`Unavailable`: the client's balancer
    /// still sends some requests to a member that is down, until it comes back). Only for
    /// calls that are safe to repeat: reads, and compare-and-swap writes (a repeat of one that
    /// did land fails its compare and is run again on the value it wrote).
    async fn retrying<T, F, Fut>(&self, what: &str, mut call: F) -> LockResult<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = Instant::now() + self.request_timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let error = match tokio::time::timeout(left, call()).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(error)) => error,
                Err(elapsed) => return Err(self.unavailable(what, elapsed)),
            };
            let unreached = matches!(&error, etcd_client::Error::GRpcStatus(status) if status.code() == tonic::Code::Unavailable);
            if !unreached || Instant::now() + RETRY_PAUSE >= deadline {
                return Err(self.unavailable(what, error));
            }
            tracing::debug!(%error, "etcd request did not reach a member, trying again");
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }

    fn parse(&self, key: &str, kv: Option<&KeyValue>) -> LockResult<(Document, i64)> {
        let Some(kv) = kv else {
            return Ok((Document::default(), 0));
        };
        let document = Document::parse(kv.value())
            .map_err(|error| self.unavailable("parse the lock's value", error))?;
        self.sightings
            .observe(key, &document, kv.mod_revision(), Instant::now());
        Ok((document, kv.mod_revision()))
    }

    /// Runs `step` on the lock's state until its compare-and-swap write lands (or nothing
    /// needs writing), and returns its answer.
    async fn change<T>(
        &self,
        key: &str,
        mut step: impl FnMut(&mut KeyState, Instant) -> Step<T>,
    ) -> LockResult<T> {
        let etcd_key = self.etcd_key(key);
        let (mut document, mut revision) = self.read(key).await?;
        loop {
            let now = Instant::now();
            let mut state = self.sightings.decode(key, &document, now);
            let Step {
                answer,
                handoffs,
                always_write,
            } = step(&mut state, now);
            let stamp = rand_stamp();
            let mut next = self.sightings.encode(key, &state, &document, stamp, now);
            if !always_write && handoffs.is_empty() && next.same_state(&document) {
                return Ok(answer);
            }
            next.handoffs = handoffs
                .iter()
                .map(|(owner, handoff)| HandoffEntry {
                    owner: owner.clone(),
                    token: handoff.fencing_token,
                    lease_ms: ceil_millis(handoff.lease),
                })
                .collect();
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    etcd_key.as_str(),
                    CompareOp::Equal,
                    revision,
                )])
                .and_then([TxnOp::put(etcd_key.as_str(), next.to_bytes(), None)])
                .or_else([TxnOp::get(etcd_key.as_str(), None)]);
            let response = self
                .retrying("write", || {
                    let mut kv = self.kv.clone();
                    let txn = txn.clone();
                    async move { kv.txn(txn).await }
                })
                .await?;
            if response.succeeded() {
                self.sightings.wrote(key, stamp, now);
                return Ok(answer);
            }
            // Someone else wrote first: run the step again on their value.
            tracing::trace!(%key, "etcd compare-and-swap lost, retrying");
            let current = response.op_responses().into_iter().find_map(|op| match op {
                TxnOpResponse::Get(get) => Some(get),
                _ => None,
            });
            (document, revision) =
                self.parse(key, current.as_ref().and_then(|get| get.kvs().first()))?;
        }
    }
}

/// A stamp for one write (see module `document`): random, so stamps never repeat, even
/// after etcd lost its data.
fn rand_stamp() -> u64 {
    let (high, _) = uuid::Uuid::new_v4().as_u64_pair();
    high
}

fn read(path: &std::path::Path, what: &'static str) -> LockResult<Vec<u8>> {
    std::fs::read(path).map_err(|source| {
        connect_error(EtcdConnectError::ReadFile {
            what,
            path: path.to_owned(),
            source,
        })
    })
}

#[async_trait]
impl Backend for EtcdBackend {
    fn kind(&self) -> &'static str {
        BACKEND
    }

    async fn acquire(&self, request: &AcquireRequest<'_>) -> LockResult<AcquireOutcome> {
        validate_request(request)?;
        self.change(request.key, |state, now| {
            Step::answer(state.acquire(request, now))
        })
        .await
    }

    /// Always writes, even when `owner` held nothing: an acquire of `owner` still in flight
    /// (cancelled by the caller, who then releases) compares against the revision this write
    /// replaces, so it can no longer land after the release and leave a grant behind.
    async fn release(&self, key: &str, owner: &str, max_holders: u32) -> LockResult<bool> {
        validate_key(key)?;
        validate_owner(owner)?;
        validate_max_holders(max_holders)?;
        self.change(key, |state, now| {
            let (was_held, handoffs) = state.release(owner, max_holders, now);
            Step {
                answer: was_held,
                handoffs,
                always_write: true,
            }
        })
        .await
    }

    async fn extend(&self, key: &str, owner: &str, ttl: Duration) -> LockResult<Option<Duration>> {
        validate_key(key)?;
        validate_owner(owner)?;
        validate_ttl(ttl)?;
        self.change(key, |state, now| {
            Step::answer(state.extend(owner, ttl, now))
        })
        .await
    }

    async fn is_held(&self, key: &str, owner: &str) -> LockResult<bool> {
        validate_key(key)?;
        validate_owner(owner)?;
        let (document, _) = self.read(key).await?;
        let now = Instant::now();
        Ok(self
            .sightings
            .decode(key, &document, now)
            .is_held(owner, now))
    }

    async fn snapshot(&self, key: &str) -> LockResult<LockSnapshot> {
        validate_key(key)?;
        let (document, _) = self.read(key).await?;
        let now = Instant::now();
        Ok(self.sightings.decode(key, &document, now).snapshot(now))
    }

    async fn raise_fencing_floor(&self, key: &str, floor: u64) -> LockResult<u64> {
        validate_key(key)?;
        self.change(key, |state, _| {
            Step::answer(state.raise_fencing_floor(floor))
        })
        .await
    }

    async fn subscribe(&self, key: &str, owner: &str) -> LockResult<WakeSubscription> {
        validate_key(key)?;
        validate_owner(owner)?;
        Ok(self.watches.subscribe(key, owner).await)
    }

    fn subscribe_if_live(&self, key: &str, owner: &str) -> Option<WakeSubscription> {
        self.watches.subscribe_if_live(key, owner)
    }
}
