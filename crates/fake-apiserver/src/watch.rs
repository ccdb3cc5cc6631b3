//! Watches: one JSON event per line, resumable from a `resourceVersion` (410 Expired when
//! compacted), with bookmarks, `timeoutSeconds`, `sendInitialEvents`, and namespace and
//! selector filtering (objects leaving a selector are seen as DELETED, entering as ADDED).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc, watch};

use crate::error::ApiError;
use crate::render::{self, Rendering};
use crate::rest::{to_served, Target};
use crate::selector::Selectors;
use crate::store::{EventType, Store, StoredEvent};

/// The parameters of a watch request.
#[derive(Debug, Clone)]
pub(crate) struct WatchParams {
    /// `resourceVersion`: None for "" (current state first), Some(0) for "0", Some(n) to resume.
    pub resource_version: Option<u64>,
    pub send_initial_events: bool,
    pub bookmarks: bool,
    pub timeout: Duration,
    pub selectors: Selectors,
    pub rendering: Rendering,
}

/// Settings that hold for every watch of a server.
#[derive(Debug, Clone)]
pub(crate) struct WatchSettings {
    pub bookmark_interval: Duration,
    pub close: watch::Receiver<u64>,
    /// How late each live event reaches the client (a test hook; zero by default).
    pub event_delay: Duration,
}

fn line(event_type: &str, object: Value) -> Bytes {
    let mut text = json!({"type": event_type, "object": object}).to_string();
    text.push('\n');
    Bytes::from(text)
}

/// Everything a running watch needs to filter and render events.
struct Watcher {
    target: Target,
    params: WatchParams,
    first_table: bool,
}

impl Watcher {
    fn in_scope(&self, ev: &StoredEvent) -> bool {
        ev.key.group == self.target.rtype.storage_group
            && ev.key.resource == self.target.rtype.plural
            && (!self.target.rtype.namespaced
                || self
                    .target
                    .namespace
                    .as_deref()
                    .is_none_or(|ns| ev.key.namespace == ns))
    }

    fn render(&mut self, obj: &Value) -> Value {
        let served = to_served(&self.target.rtype, &self.target.version, obj);
        match &self.params.rendering {
            Rendering::Table(format) => {
                // Only the first event's Table carries the column definitions.
                let with_definitions = std::mem::replace(&mut self.first_table, false);
                format.render(
                    &self.target.rtype,
                    &self.target.version,
                    &[served],
                    None,
                    with_definitions,
                )
            }
            other => render::object(&self.target.rtype, &self.target.version, served, other),
        }
    }

    /// The event this watcher sees for a committed change, if any.
    fn translate(&mut self, ev: &StoredEvent) -> Option<Bytes> {
        if !self.in_scope(ev) {
            return None;
        }
        let now = self.params.selectors.matches(&ev.object);
        let before = ev
            .previous
            .as_deref()
            .is_some_and(|p| self.params.selectors.matches(p));
        let event_type = match ev.event_type {
            EventType::Added if now => EventType::Added,
            EventType::Modified if now && before => EventType::Modified,
            EventType::Modified if now => EventType::Added,
            EventType::Modified if before => EventType::Deleted,
            EventType::Deleted if now => EventType::Deleted,
            _ => return None,
        };
        let object = self.render(&ev.object);
        Some(line(event_type.as_str(), object))
    }

    fn bookmark(&self, rv: u64, initial_events_end: bool) -> Bytes {
        let (kind, api_version) = match &self.params.rendering {
            Rendering::PartialMetadata => (
                "PartialObjectMetadata".to_string(),
                "meta.k8s.io/v1".to_string(),
            ),
            _ => (
                self.target.rtype.kind.clone(),
                self.target.rtype.api_version(&self.target.version),
            ),
        };
        let mut metadata = json!({"resourceVersion": rv.to_string()});
        if initial_events_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        line(
            "BOOKMARK",
            json!({"kind": kind, "apiVersion": api_version, "metadata": metadata}),
        )
    }
}

/// Starts a watch and returns its streaming body.
pub(crate) fn start(
    store: Arc<Store>,
    target: Target,
    params: WatchParams,
    settings: WatchSettings,
) -> Result<Body, ApiError> {
    let mut watcher = Watcher {
        target,
        params,
        first_table: true,
    };
    let mut initial: Vec<Bytes> = Vec::new();
    let mut close = settings.close.clone();
    close.borrow_and_update();
    // Read the starting point and subscribe under one lock, so no event is missed or repeated.
    let (rx, start_rv) = store
        .with(|inner| {
            let rx = inner.subscribe();
            let current = inner.current_rv();
            let from_state = watcher.params.send_initial_events
                || matches!(watcher.params.resource_version, None | Some(0));
            if from_state {
                for obj in watcher.target.matching(inner, &watcher.params.selectors) {
                    let rendered = watcher.render(&obj);
                    initial.push(line("ADDED", rendered));
                }
                Ok((rx, current))
            } else {
                let from = watcher.params.resource_version.unwrap_or(0);
                match inner.events_since(from) {
                    Ok(events) => {
                        for ev in events {
                            if let Some(l) = watcher.translate(&ev) {
                                initial.push(l);
                            }
                        }
                        Ok((rx, current.max(from)))
                    }
                    Err(oldest) => Err(ApiError::expired(from, oldest)),
                }
            }
        })
        .map_or_else(
            |expired: ApiError| {
                initial.push(line("ERROR", expired.to_status()));
                (None, 0)
            },
            |(rx, rv)| (Some(rx), rv),
        );
    if watcher.params.send_initial_events && rx.is_some() {
        initial.push(watcher.bookmark(start_rv, true));
    }
    let (out, out_rx) = mpsc::channel::<Bytes>(256);
    tokio::spawn(async move {
        for l in initial {
            if out.send(l).await.is_err() {
                return;
            }
        }
        let Some(rx) = rx else { return };
        pump(watcher, rx, out, close, start_rv, &settings).await;
    });
    let stream = futures::stream::unfold(out_rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<Bytes, Infallible>(b), rx))
    });
    Ok(Body::from_stream(stream))
}

/// Forwards live events until the timeout, a close, a lag, or the client going away.
async fn pump(
    mut watcher: Watcher,
    mut rx: broadcast::Receiver<Arc<StoredEvent>>,
    out: mpsc::Sender<Bytes>,
    mut close: watch::Receiver<u64>,
    start_rv: u64,
    settings: &WatchSettings,
) {
    let bookmark_interval = settings.bookmark_interval;
    let deadline = tokio::time::sleep(watcher.params.timeout);
    tokio::pin!(deadline);
    let mut ticker = tokio::time::interval_at(
        tokio::time::Instant::now() + bookmark_interval,
        bookmark_interval,
    );
    let mut progress = start_rv;
    loop {
        let next = tokio::select! {
            // Biased: a close by the test hook must win over events already queued behind it,
            // or a test that closes watches and then writes could see its writes arrive on the
            // watch it meant to cut.
            biased;
            _ = out.closed() => return,
            changed = close.changed() => {
                if changed.is_ok() { tracing::debug!("watch closed by the test hook"); }
                return;
            }
            _ = &mut deadline => {
                if watcher.params.bookmarks {
                    let _ = out.send(watcher.bookmark(progress, false)).await;
                }
                return;
            }
            _ = ticker.tick(), if watcher.params.bookmarks => Some(watcher.bookmark(progress, false)),
            ev = rx.recv() => match ev {
                Ok(ev) => {
                    if ev.rv <= progress { None } else {
                        progress = ev.rv;
                        let translated = watcher.translate(&ev);
                        if translated.is_some() && !settings.event_delay.is_zero() {
                            // Late by the same amount each: events keep their order and spacing.
                            tokio::time::sleep_until(ev.at + settings.event_delay).await;
                        }
                        translated
                    }
                }
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "watcher fell behind; closing it so the client resumes");
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
        };
        if let Some(bytes) = next {
            if out.send(bytes).await.is_err() {
                return;
            }
        }
    }
}
