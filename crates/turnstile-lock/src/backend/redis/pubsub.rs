//! The dedicated pub/sub connection of a [`RedisBackend`](super::RedisBackend): which wake-up
//! channels it follows, routing of messages to local waiters, and reconnection.
//!
//! Channels are reference-counted by the local waiters that need them. The table is shared:
//! subscribers change counts synchronously, and the listener task reconciles the server-side
//! subscriptions with it (one `Reconcile` command per change, processed in order). A channel is
//! *live* once the server confirmed the subscription on the current connection; a waiter that
//! registers on a live channel before its acquire attempt cannot miss a wake-up, so it needs
//! no confirming second attempt.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use redis::aio::{PubSub, PubSubSink};
use redis::cluster_async::ClusterConnection;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::{mpsc, oneshot, watch};

use super::sentinel::Resolver;
use crate::backend::{drop_counted, Handoff, WakeRegistry, WakeSubscription};

/// Where the pub/sub connection goes: one server, or whichever master the sentinels name.
pub(super) enum PubSubSource {
    /// A single server (or a fixed address).
    Server(Box<redis::Client>),
    /// The current master of a sentinel-managed set; the listener reconnects (to the new
    /// master) on every `+switch-master`.
    Sentinel(Arc<Resolver>),
}

impl PubSubSource {
    async fn connect(&self) -> redis::RedisResult<PubSub> {
        match self {
            PubSubSource::Server(client) => client.get_async_pubsub().await,
            PubSubSource::Sentinel(resolver) => {
                resolver.master_client().await?.get_async_pubsub().await
            }
        }
    }

    fn switches(&self) -> Option<watch::Receiver<u64>> {
        match self {
            PubSubSource::Server(_) => None,
            PubSubSource::Sentinel(resolver) => Some(resolver.switches()),
        }
    }
}

/// Resolves when the sentinels announce a new master (never without sentinels).
async fn switched(switches: &mut Option<watch::Receiver<u64>>) {
    match switches {
        Some(receiver) => {
            if receiver.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending::<()>().await,
    }
}

#[derive(Debug)]
struct Channel {
    /// Local waiters that need this channel.
    refs: usize,
    /// The server confirmed the subscription on the current connection.
    live: bool,
}

type Table = Arc<Mutex<HashMap<String, Channel>>>;

fn locked(table: &Table) -> MutexGuard<'_, HashMap<String, Channel>> {
    // Every critical section leaves the table consistent.
    table
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// "Make the server-side subscription of this channel match the table", with an optional
/// acknowledgement once done.
struct Reconcile {
    channel: String,
    done: Option<oneshot::Sender<()>>,
}

/// Subscriber side of the wake-up channels.
pub(super) struct WakeChannels {
    table: Table,
    commands: mpsc::UnboundedSender<Reconcile>,
    wakes: WakeRegistry,
}

impl WakeChannels {
    /// Connects the pub/sub connection and starts the listener task (it stops once this value
    /// and every subscription are dropped).
    pub(super) async fn connect(source: PubSubSource) -> redis::RedisResult<Self> {
        let first = source.connect().await?;
        let (commands, receiver) = mpsc::unbounded_channel();
        let table = Table::default();
        let wakes = WakeRegistry::new();
        let listener = Listener {
            switches: source.switches(),
            source,
            commands: receiver,
            table: Arc::clone(&table),
            wakes: wakes.clone(),
            subscribed: HashSet::new(),
        };
        tokio::spawn(listener.run(first));
        Ok(WakeChannels {
            table,
            commands,
            wakes,
        })
    }

    /// Starts the listener of a cluster's sharded wake-up channels on `connection` (a RESP3
    /// cluster connection whose pushes arrive on `pushes`). The cluster connection follows the
    /// slots and re-subscribes after reconnects itself; the listener re-subscribes a channel
    /// the server dropped (its slot moved) and wakes every local waiter to re-poll whenever a
    /// subscription may have missed messages.
    pub(super) fn connect_cluster(
        connection: ClusterConnection,
        pushes: mpsc::UnboundedReceiver<PushInfo>,
    ) -> Self {
        let (commands, receiver) = mpsc::unbounded_channel();
        let table = Table::default();
        let wakes = WakeRegistry::new();
        let listener = ClusterListener {
            connection,
            pushes,
            commands: receiver,
            table: Arc::clone(&table),
            wakes: wakes.clone(),
            subscribed: HashSet::new(),
            resubscribe: Vec::new(),
        };
        tokio::spawn(listener.run());
        WakeChannels {
            table,
            commands,
            wakes,
        }
    }

    /// Registers `owner` on `channel` and waits until the server confirmed the subscription
    /// (or the connection is down: then reconnecting wakes everyone to re-poll).
    pub(super) async fn subscribe(&self, channel: &str, owner: &str) -> WakeSubscription {
        let (done, confirmed) = oneshot::channel();
        let must_wait = {
            let mut table = locked(&self.table);
            let entry = table.entry(channel.to_owned()).or_insert(Channel {
                refs: 0,
                live: false,
            });
            entry.refs += 1;
            !entry.live
        };
        // No await between counting the reference and creating the subscription whose drop
        // gives it back: a cancelled subscribe leaves the count balanced.
        let subscription = self.register(channel, owner);
        if must_wait {
            let _ = self.commands.send(Reconcile {
                channel: channel.to_owned(),
                done: Some(done),
            });
            // An error means the listener is gone (runtime shutting down): polling remains.
            let _ = confirmed.await;
        }
        subscription
    }

    /// Registers `owner` on `channel` only if the channel is live, without any round trip.
    pub(super) fn subscribe_if_live(&self, channel: &str, owner: &str) -> Option<WakeSubscription> {
        {
            let mut table = locked(&self.table);
            let entry = table.get_mut(channel).filter(|entry| entry.live)?;
            entry.refs += 1;
        }
        Some(self.register(channel, owner))
    }

    fn register(&self, channel: &str, owner: &str) -> WakeSubscription {
        let table = Arc::clone(&self.table);
        let commands = self.commands.clone();
        let channel_name = channel.to_owned();
        let on_drop: Box<dyn FnOnce() + Send + Sync> = Box::new(move || {
            // Sent with the table still locked, as every other change to the channel's count.
            let mut table = locked(&table);
            if drop_counted(&mut table, &channel_name, |entry| &mut entry.refs) {
                let _ = commands.send(Reconcile {
                    channel: channel_name,
                    done: None,
                });
            }
        });
        self.wakes.register(channel, owner, Some(on_drop))
    }
}

/// Why the listener left a connection.
enum Disconnect {
    /// The connection dropped: reconnect.
    Lost,
    /// The backend and every subscription are gone: stop.
    Shutdown,
}

/// Routes one wake-up message (`owner token lease_ms` lines: hand-offs; a bare owner: wake)
/// to the local waiters of `channel`.
fn route(wakes: &WakeRegistry, channel: &str, payload: &[u8]) {
    let Ok(payload) = std::str::from_utf8(payload) else {
        return;
    };
    for line in payload.split('\n') {
        let mut fields = line.split(' ');
        let (Some(owner), token, lease) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        let handoff = token
            .and_then(|token| token.parse().ok())
            .zip(lease.and_then(|lease| lease.parse().ok()));
        match handoff {
            Some((fencing_token, lease_ms)) => {
                wakes.hand_off(
                    channel,
                    owner,
                    Handoff {
                        fencing_token,
                        lease: Duration::from_millis(lease_ms),
                    },
                );
            }
            // A bare owner: it may be its turn, it should look again.
            None if !owner.is_empty() => {
                wakes.wake(channel, owner);
            }
            None => {}
        }
    }
}

/// The listener task: owns the pub/sub connection.
struct Listener {
    source: PubSubSource,
    /// `+switch-master` notifications (sentinel only).
    switches: Option<watch::Receiver<u64>>,
    commands: mpsc::UnboundedReceiver<Reconcile>,
    table: Table,
    wakes: WakeRegistry,
    /// Channels subscribed on the current connection.
    subscribed: HashSet<String>,
}

impl Listener {
    /// Reconciles one channel. Returns false if the connection failed.
    async fn reconcile(&mut self, command: Reconcile, sink: &mut PubSubSink) -> bool {
        let Reconcile { channel, done } = command;
        let wanted = locked(&self.table)
            .get(&channel)
            .is_some_and(|entry| entry.refs > 0);
        let mut healthy = true;
        if wanted && !self.subscribed.contains(&channel) {
            match sink.subscribe(&channel).await {
                Ok(()) => {
                    self.subscribed.insert(channel.clone());
                }
                Err(error) => {
                    tracing::warn!(%channel, %error, "redis SUBSCRIBE failed; reconnecting pub/sub");
                    healthy = false;
                }
            }
        } else if !wanted && self.subscribed.contains(&channel) {
            self.subscribed.remove(&channel);
            if let Err(error) = sink.unsubscribe(&channel).await {
                tracing::debug!(%channel, %error, "redis UNSUBSCRIBE failed; reconnecting pub/sub");
                healthy = false;
            }
        }
        if healthy && self.subscribed.contains(&channel) {
            if let Some(entry) = locked(&self.table).get_mut(&channel) {
                entry.live = true;
            }
        }
        if let Some(done) = done {
            let _ = done.send(());
        }
        healthy
    }

    fn route(&self, message: &redis::Msg) {
        route(
            &self.wakes,
            message.get_channel_name(),
            message.get_payload_bytes(),
        );
    }

    /// Serves one connection until it drops or everything is dropped.
    async fn serve(&mut self, pubsub: PubSub) -> Disconnect {
        let (mut sink, mut stream) = pubsub.split();
        self.subscribed.clear();
        let wanted: Vec<String> = locked(&self.table).keys().cloned().collect();
        if !wanted.is_empty() {
            if let Err(error) = sink.subscribe(&wanted).await {
                tracing::warn!(%error, "redis re-SUBSCRIBE failed; reconnecting pub/sub");
                return Disconnect::Lost;
            }
            let mut table = locked(&self.table);
            for channel in wanted {
                if let Some(entry) = table.get_mut(&channel) {
                    entry.live = true;
                }
                self.subscribed.insert(channel);
            }
        }
        // Wake-ups may have been published while we were not listening: everyone re-polls.
        self.wakes.wake_all();
        if let Some(switches) = &mut self.switches {
            switches.borrow_and_update();
        }
        loop {
            tokio::select! {
                () = switched(&mut self.switches) => {
                    tracing::info!("redis sentinel: new master; moving the pub/sub connection");
                    return Disconnect::Lost;
                }
                command = self.commands.recv() => {
                    let Some(command) = command else { return Disconnect::Shutdown };
                    if !self.reconcile(command, &mut sink).await {
                        return Disconnect::Lost;
                    }
                }
                message = stream.next() => {
                    let Some(message) = message else { return Disconnect::Lost };
                    self.route(&message);
                }
            }
        }
    }

    /// Waits `delay` while disconnected, acknowledging commands (nothing can be subscribed
    /// now; the reconnect subscribes whatever the table wants). Returns false on shutdown.
    async fn pause(&mut self, delay: Duration) -> bool {
        let sleep = tokio::time::sleep(delay);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                () = &mut sleep => return true,
                command = self.commands.recv() => {
                    let Some(Reconcile { done, .. }) = command else { return false };
                    if let Some(done) = done {
                        let _ = done.send(());
                    }
                }
            }
        }
    }

    /// Owns the pub/sub connection for the backend's life: routes messages, reconnects with
    /// backoff, stops when the backend and all its subscriptions are dropped.
    async fn run(mut self, first: PubSub) {
        let mut next = Some(first);
        let mut backoff = Duration::from_millis(50);
        loop {
            let connection = match next.take() {
                Some(pubsub) => Ok(pubsub),
                None => self.source.connect().await,
            };
            match connection {
                Ok(pubsub) => {
                    if let Disconnect::Shutdown = self.serve(pubsub).await {
                        return;
                    }
                    for entry in locked(&self.table).values_mut() {
                        entry.live = false;
                    }
                    tracing::warn!("redis pub/sub connection lost; reconnecting");
                    backoff = Duration::from_millis(50);
                }
                Err(error) => {
                    tracing::warn!(%error, retry_in_ms = backoff.as_millis() as u64, "redis pub/sub reconnect failed");
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
            if !self.pause(backoff).await {
                return;
            }
        }
    }
}

/// The listener of a cluster's sharded wake-up channels.
struct ClusterListener {
    connection: ClusterConnection,
    pushes: mpsc::UnboundedReceiver<PushInfo>,
    commands: mpsc::UnboundedReceiver<Reconcile>,
    table: Table,
    wakes: WakeRegistry,
    /// Channels we asked the cluster to follow.
    subscribed: HashSet<String>,
    /// Channels the server dropped while still wanted: subscribe again.
    resubscribe: Vec<String>,
}

/// The text of a bulk-string push field.
fn push_text(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(bytes) => Some(bytes),
        Value::SimpleString(text) => Some(text.as_bytes()),
        _ => None,
    }
}

impl ClusterListener {
    /// Makes the cluster's subscription of `channel` match the table.
    async fn reconcile(&mut self, channel: &str) {
        let wanted = locked(&self.table)
            .get(channel)
            .is_some_and(|entry| entry.refs > 0);
        if wanted && !self.subscribed.contains(channel) {
            match self.connection.ssubscribe(channel).await {
                Ok(()) => {
                    self.subscribed.insert(channel.to_owned());
                }
                // Not live: its waiters poll (and a later subscriber tries again).
                Err(error) => tracing::warn!(%channel, %error, "redis SSUBSCRIBE failed"),
            }
        } else if !wanted && self.subscribed.remove(channel) {
            if let Err(error) = self.connection.sunsubscribe(channel).await {
                tracing::debug!(%channel, %error, "redis SUNSUBSCRIBE failed");
            }
        }
        if self.subscribed.contains(channel) {
            if let Some(entry) = locked(&self.table).get_mut(channel) {
                entry.live = true;
            }
        }
    }

    fn on_push(&mut self, push: PushInfo) {
        match push.kind {
            PushKind::SMessage | PushKind::Message => {
                if let [channel, payload, ..] = push.data.as_slice() {
                    let channel = push_text(channel).and_then(|c| std::str::from_utf8(c).ok());
                    if let (Some(channel), Some(payload)) = (channel, push_text(payload)) {
                        route(&self.wakes, channel, payload);
                    }
                }
            }
            // The server drops shard subscriptions whose slot moved to another node.
            PushKind::SUnsubscribe => {
                let channel = push
                    .data
                    .first()
                    .and_then(push_text)
                    .and_then(|c| std::str::from_utf8(c).ok())
                    .map(str::to_owned);
                if let Some(channel) = channel {
                    if self.subscribed.remove(&channel) {
                        tracing::debug!(%channel, "redis dropped a shard subscription; subscribing again");
                        if let Some(entry) = locked(&self.table).get_mut(&channel) {
                            entry.live = false;
                        }
                        self.resubscribe.push(channel);
                    }
                }
            }
            // A node connection dropped: the client re-subscribes on its own, but messages
            // published meanwhile are gone.
            PushKind::Disconnection => {
                tracing::warn!("redis cluster pub/sub connection lost; waiters re-poll");
                self.wakes.wake_all();
            }
            _ => {}
        }
    }

    async fn run(mut self) {
        loop {
            while let Some(channel) = self.resubscribe.pop() {
                self.reconcile(&channel).await;
                // Whatever was published between the drop and now is lost: everyone re-polls.
                self.wakes.wake_all();
            }
            tokio::select! {
                command = self.commands.recv() => {
                    let Some(Reconcile { channel, done }) = command else { return };
                    self.reconcile(&channel).await;
                    if let Some(done) = done {
                        let _ = done.send(());
                    }
                }
                push = self.pushes.recv() => {
                    let Some(push) = push else { return };
                    self.on_push(push);
                }
            }
        }
    }
}
