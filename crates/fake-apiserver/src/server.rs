//! [`FakeApiServer`]: starting it, talking to it, and the test hooks.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::admission::FieldValidation;
use crate::error::Error;
use crate::hooks::{Hooks, RecordedRequest};
use crate::http::{self, AppState};
use crate::rest::{self, Target, WriteOptions};
use crate::store::Store;

/// Namespaces that exist from the start, as on a new cluster.
const INITIAL_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

/// Configures a [`FakeApiServer`] before starting it.
#[derive(Debug, Clone)]
pub struct Builder {
    port: u16,
    bookmark_interval: Duration,
    max_list_page: Option<usize>,
}

impl Default for Builder {
    fn default() -> Self {
        Self {
            port: 0,
            bookmark_interval: Duration::from_secs(5),
            max_list_page: None,
        }
    }
}

impl Builder {
    /// The port to listen on (default 0: a free port).
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// How often watches that allow bookmarks get one (kube-apiserver: about a minute;
    /// default here: 5 s, so tests see them quickly).
    pub fn bookmark_interval(mut self, interval: Duration) -> Self {
        self.bookmark_interval = interval;
        self
    }

    /// Serves paginated lists (requests with a `limit`) at most `items` per page, so a
    /// client's list of a few hundred objects takes many pages, each from the first page's
    /// snapshot. (kube-runtime's watcher asks for 500 a page: without this, tests rarely page.)
    pub fn max_list_page(mut self, items: usize) -> Self {
        self.max_list_page = Some(items.max(1));
        self
    }

    /// Binds `127.0.0.1:<port>` and starts serving. Must run inside a tokio runtime.
    pub async fn start(self) -> Result<FakeApiServer, Error> {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Bind {
                addr: addr.to_string(),
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| Error::Bind {
            addr: addr.to_string(),
            source,
        })?;
        let url = format!("http://{addr}");
        let store = Arc::new(Store::new());
        let (close_watches, _) = watch::channel(0u64);
        let state = Arc::new(AppState {
            store: store.clone(),
            hooks: Hooks::default(),
            close_watches,
            bookmark_interval: self.bookmark_interval,
            max_list_page: self.max_list_page,
            url: url.clone(),
        });
        create_initial_namespaces(&state);
        let app = axum::Router::new()
            .fallback(http::handle)
            .with_state(state.clone());
        // As kube-apiserver does (Go sets TCP_NODELAY on every connection): without it, a watch
        // event written while the previous one is unacknowledged waits for the client's delayed
        // ACK, 40 ms on Linux, which showed as a 40 ms step in the operator benchmark.
        let listener = listener.tap_io(|stream| {
            if let Err(error) = stream.set_nodelay(true) {
                tracing::debug!(%error, "cannot set TCP_NODELAY");
            }
        });
        let server_task = tokio::spawn(async move {
            if let Err(err) = axum::serve(listener, app).await {
                tracing::error!(error = %err, "fake apiserver stopped serving");
            }
        });
        let gc_task = tokio::spawn(crate::gc::run(store));
        tracing::info!(%url, "fake apiserver listening");
        Ok(FakeApiServer {
            state,
            addr,
            url,
            server_task,
            gc_task,
        })
    }
}

fn create_initial_namespaces(state: &AppState) {
    let Some(rtype) = state.store.lock().registry.lookup("", "v1", "namespaces") else {
        return;
    };
    let target = Target {
        rtype,
        version: "v1".into(),
        namespace: None,
        name: None,
        subresource: None,
    };
    let opts = WriteOptions {
        dry_run: false,
        field_validation: FieldValidation::Ignore,
        field_manager: None,
    };
    for ns in INITIAL_NAMESPACES {
        let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        if let Err(err) = rest::create(&state.store, &target, body, &opts) {
            tracing::error!(namespace = ns, error = %err, "cannot create an initial namespace");
        }
    }
}

/// A running fake API server. Dropping it stops it (open watches are cut).
#[derive(Debug)]
pub struct FakeApiServer {
    state: Arc<AppState>,
    addr: SocketAddr,
    url: String,
    server_task: JoinHandle<()>,
    gc_task: JoinHandle<()>,
}

impl FakeApiServer {
    /// Starts a server on a free port of 127.0.0.1 with default settings.
    pub async fn start() -> Result<Self, Error> {
        Builder::default().start().await
    }

    /// A [`Builder`] for non-default settings.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A kube client configuration pointing at this server (default namespace `default`).
    pub fn kube_config(&self) -> Result<kube::Config, Error> {
        let uri = self
            .url
            .parse::<axum::http::Uri>()
            .map_err(|_| Error::Url(self.url.clone()))?;
        Ok(kube::Config::new(uri))
    }

    /// A kube client for this server.
    pub fn try_client(&self) -> Result<kube::Client, Error> {
        Ok(kube::Client::try_from(self.kube_config()?)?)
    }

    /// A kube client for this server. Must be called inside a tokio runtime.
    ///
    /// # Panics
    /// Only if kube cannot build a client for a plain-HTTP loopback URL without
    /// credentials, which does not depend on any input; use [`Self::try_client`] to handle it.
    pub fn client(&self) -> kube::Client {
        self.try_client()
            .expect("a kube client for a plain-HTTP loopback URL needs no TLS or credentials")
    }

    /// A kubeconfig (YAML) with one cluster, user and context, all named `fake`.
    pub fn kubeconfig_yaml(&self) -> Result<String, Error> {
        let config = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": "default"}}],
            "current-context": "fake",
            "preferences": {},
        });
        Ok(serde_yaml::to_string(&config)?)
    }

    /// Writes [`Self::kubeconfig_yaml`] to `path` (for `kubectl --kubeconfig`).
    pub fn write_kubeconfig(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        let path = path.as_ref();
        std::fs::write(path, self.kubeconfig_yaml()?).map_err(|source| Error::Kubeconfig {
            path: path.display().to_string(),
            source,
        })
    }

    /// Compacts the watch history: resuming a watch from any resourceVersion older than
    /// the current one answers `ERROR 410 Expired`. Open watches keep running.
    pub fn compact(&self) {
        self.state.store.with(|inner| inner.compact());
    }

    /// Ends every open watch (clients see the stream close, as when kube-apiserver restarts).
    pub fn close_watches(&self) {
        self.state
            .close_watches
            .send_modify(|generation| *generation += 1);
    }

    /// Makes the next `count` writes (POST, PUT, PATCH, DELETE) whose URL path starts with
    /// `path_prefix` answer `status` without effect: 403 Forbidden (as RBAC refuses), 409
    /// Conflict, 429 TooManyRequests (with `Retry-After: 1`, as priority and fairness
    /// answers), any other code InternalError.
    pub fn inject_faults(&self, path_prefix: &str, count: usize, status: u16) {
        self.state.hooks.inject(path_prefix, count, status);
    }

    /// Makes the next `count` reads (GET: get, list, watch) whose URL path starts with
    /// `path_prefix` answer `status` without effect, with the same bodies as
    /// [`inject_faults`](Self::inject_faults): 403 as RBAC refuses a verb, and so on.
    pub fn inject_read_faults(&self, path_prefix: &str, count: usize, status: u16) {
        self.state.hooks.inject_read(path_prefix, count, status);
    }

    /// Makes every live event of `resource` (the plural: `distributedlocks`) reach the watches
    /// started from now on `delay` late, in order and evenly spaced: a watch cache that lags
    /// behind the writes, as an overloaded API server's does.
    pub fn delay_watch_events(&self, resource: &str, delay: std::time::Duration) {
        self.state.hooks.delay_watch_events(resource, delay);
    }

    /// Makes the next `count` requests (reads, watches and writes) whose URL path starts with
    /// `path_prefix` wait `delay` before they are served: a slow or overloaded API server.
    pub fn inject_delays(&self, path_prefix: &str, count: usize, delay: std::time::Duration) {
        self.state.hooks.inject_delay(path_prefix, count, delay);
    }

    /// Makes every request (reads, watches and writes) whose URL path starts with
    /// `path_prefix` and that arrives within the next `length` wait `delay` before it is
    /// served: an API server overloaded for a while. Unlike [`inject_delays`](Self::inject_delays),
    /// the slowness lasts a time, not a number of requests, so a client paging through a
    /// long list is slowed only while the spell lasts.
    pub fn slow_down(
        &self,
        path_prefix: &str,
        length: std::time::Duration,
        delay: std::time::Duration,
    ) {
        self.state.hooks.slow_down(path_prefix, length, delay);
    }

    /// Stores `object` as it is, bypassing admission, the schema and every other check, and
    /// emits ADDED (or MODIFIED when the object exists) to the watches: the way an object
    /// written under an older or newer CRD schema looks to a client whose types disagree.
    /// `group` is the API group ("" for core), `resource` the plural, `namespace` "" when
    /// cluster-scoped; the name is the object's `metadata.name`. Returns the new
    /// resourceVersion.
    pub fn store_unvalidated(
        &self,
        group: &str,
        resource: &str,
        namespace: &str,
        object: serde_json::Value,
    ) -> u64 {
        let name = object
            .pointer("/metadata/name")
            .and_then(|name| name.as_str())
            .unwrap_or_default()
            .to_owned();
        let key = crate::store::ObjectKey {
            group: group.to_owned(),
            resource: resource.to_owned(),
            namespace: namespace.to_owned(),
            name,
        };
        self.state.store.with(|inner| {
            let event_type = if inner.get(&key).is_some() {
                crate::store::EventType::Modified
            } else {
                crate::store::EventType::Added
            };
            inner.put(key, object, event_type);
            inner.current_rv()
        })
    }

    /// Every request served so far, in order.
    pub fn request_log(&self) -> Vec<RecordedRequest> {
        self.state.hooks.log()
    }

    /// How many requests were served so far: `request_log().len()` without copying the log
    /// (a poll that copied it cost more than the requests it waited for at 100 000 claims).
    pub fn request_count(&self) -> usize {
        self.state.hooks.log_len()
    }

    /// Empties the request log.
    pub fn clear_request_log(&self) {
        self.state.hooks.clear_log();
    }

    /// The latest resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.state.store.lock().current_rv()
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.close_watches();
        self.server_task.abort();
        self.gc_task.abort();
    }
}
