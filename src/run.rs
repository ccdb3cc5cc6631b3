//! `turnstile run`: its flags, logging set-up and signal handling around [`turnstile_controller::run`].

use std::io::IsTerminal as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use turnstile_api::BackendKind;
use turnstile_controller::leader::LeaderConfig;

use opentelemetry_sdk::trace::SdkTracerProvider;
use turnstile_controller::runtime::backends::{EtcdSettings, MongoSettings, RedisTlsFiles};
use turnstile_controller::{run, ControllerConfig, EventPolicy};

use crate::telemetry;

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line (for log collectors).
    Json,
}

/// Flags of `turnstile run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Redis URL serving locks with `spec.backend: redis`: `redis://[user:password@]host:6379/0`,
    /// `rediss://…` for TLS, `redis+cluster://h1:p1,h2:p2` (Redis Cluster) or
    /// `redis+sentinel://s1:26379,s2:26379/MASTERNAME` (Redis Sentinel). Without it such locks
    /// report `Ready=False` (BackendNotConfigured).
    #[arg(long, env = "TURNSTILE_REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,
    /// PEM file of the CA that signed the Redis server's certificate (`rediss://` only;
    /// default: Mozilla's roots).
    #[arg(long, env = "TURNSTILE_REDIS_CA_FILE")]
    pub redis_ca_file: Option<PathBuf>,
    /// PEM client certificate for mutual TLS with Redis (with `--redis-client-key`).
    #[arg(long, env = "TURNSTILE_REDIS_CLIENT_CERT")]
    pub redis_client_cert: Option<PathBuf>,
    /// PEM private key of `--redis-client-cert`.
    #[arg(long, env = "TURNSTILE_REDIS_CLIENT_KEY")]
    pub redis_client_key: Option<PathBuf>,
    /// Every Redis grant waits (`WAIT`) until this many replicas acknowledged it; one that is
    /// not acknowledged in time is released and retried. Narrows what a failover can lose;
    /// not on Redis Cluster.
    #[arg(long, env = "TURNSTILE_REDIS_MIN_REPLICA_ACKS", requires = "redis_url")]
    pub redis_min_replica_acks: Option<u32>,
    /// How long a grant waits for `--redis-min-replica-acks` (e.g. 500ms; default 1s; must be
    /// below the 5 s response timeout).
    #[arg(
        long,
        env = "TURNSTILE_REDIS_REPLICA_ACK_TIMEOUT",
        value_parser = humantime::parse_duration,
        requires = "redis_min_replica_acks"
    )]
    pub redis_replica_ack_timeout: Option<Duration>,
    /// MongoDB URL (`mongodb://host:27017/db?replicaSet=rs0`) serving locks with
    /// `spec.backend: mongo`. Without it such locks report `Ready=False` (BackendNotConfigured).
    #[arg(long, env = "TURNSTILE_MONGO_URL", hide_env_values = true)]
    pub mongo_url: Option<String>,
    /// Database of the MongoDB locks collection (default: the URL's database, else `turnstile`).
    #[arg(long, env = "TURNSTILE_MONGO_DATABASE", requires = "mongo_url")]
    pub mongo_database: Option<String>,
    /// Name of the MongoDB locks collection (default `turnstile_locks`).
    #[arg(long, env = "TURNSTILE_MONGO_COLLECTION", requires = "mongo_url")]
    pub mongo_collection: Option<String>,
    /// etcd URL serving locks with `spec.backend: etcd`:
    /// `etcd://[user:password@]host1:2379,host2:2379` (the cluster's client endpoints),
    /// `etcds://…` for TLS. Without it such locks report `Ready=False` (BackendNotConfigured).
    #[arg(long, env = "TURNSTILE_ETCD_URL", hide_env_values = true)]
    pub etcd_url: Option<String>,
    /// Prefix of the etcd lock keys (default `turnstile/`). Controllers in several clusters
    /// share a lock by using the same URL, prefix and lock key.
    #[arg(long, env = "TURNSTILE_ETCD_KEY_PREFIX", requires = "etcd_url")]
    pub etcd_key_prefix: Option<String>,
    /// PEM file of the CA that signed the etcd members' certificates (`etcds://` only;
    /// default: Mozilla's roots).
    #[arg(long, env = "TURNSTILE_ETCD_CA_FILE", requires = "etcd_url")]
    pub etcd_ca_file: Option<PathBuf>,
    /// PEM client certificate for etcd's `--client-cert-auth` (with `--etcd-client-key`).
    #[arg(
        long,
        env = "TURNSTILE_ETCD_CLIENT_CERT",
        requires_all = ["etcd_url", "etcd_client_key"]
    )]
    pub etcd_client_cert: Option<PathBuf>,
    /// PEM private key of `--etcd-client-cert`.
    #[arg(long, env = "TURNSTILE_ETCD_CLIENT_KEY", requires = "etcd_client_cert")]
    pub etcd_client_key: Option<PathBuf>,
    /// This cluster's name in the grants it writes to a shared backend (a DNS label): the
    /// other clusters whose controllers share a lock's key then show `cluster NAME` as its
    /// holder. Set it before the clusters share locks: a claim holding when it changes is
    /// not recognised by its own controller any more.
    #[arg(long, env = "TURNSTILE_CLUSTER_NAME")]
    pub cluster_name: Option<String>,
    /// Backend of locks that do not name one: memory (embedded, default), redis, mongo or
    /// etcd.
    #[arg(long, default_value = "memory")]
    pub default_backend: BackendKind,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Serve `/metrics`, `/healthz` and `/readyz` on this address (e.g. `0.0.0.0:8080`).
    #[arg(long)]
    pub metrics_addr: Option<SocketAddr>,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Reconcile only while holding the `turnstile-controller` Lease in `POD_NAMESPACE`
    /// (identity `POD_NAME`), so that several replicas can run.
    #[arg(long)]
    pub leader_elect: bool,
    /// Which Events to publish: `all`, or `warnings` (no `Queued`, `Acquired`, `Released`,
    /// `Renewed`...: each is an API write, and the claims' statuses say the same). Warnings
    /// are always published.
    #[arg(long, env = "TURNSTILE_EVENTS", value_enum, default_value_t = EventLevel::All)]
    pub events: EventLevel,
    /// At most this many Normal Events a second on average (bursts of 5 seconds' worth), so
    /// that a wave of hand-offs spends the API's writes on grants; the rest are counted in
    /// `turnstile_events_skipped_total`. 0: no limit.
    #[arg(long, env = "TURNSTILE_EVENTS_PER_SECOND", default_value_t = EventPolicy::default().normal_per_second)]
    pub events_per_second: u32,
    /// Send OpenTelemetry traces over OTLP/gRPC to this endpoint (`http://collector:4317`):
    /// a span for each claim's wait and one for its hold (a claim's `turnstile.dev/traceparent`
    /// annotation makes them children of the workload's span), and the controller's passes.
    /// Off by default.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
}

/// The Events `turnstile run` publishes (`--events`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EventLevel {
    /// Normal Events and Warnings.
    All,
    /// Warnings only.
    Warnings,
}

fn init_logging(format: LogFormat, traces: Option<&SdkTracerProvider>) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let lines = match format {
        // Colours only on a terminal: a file or a log collector would keep the codes as text.
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(std::io::stdout().is_terminal())
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer().json().boxed(),
    };
    let registry = tracing_subscriber::registry()
        .with(filter)
        .with(lines)
        .with(traces.map(telemetry::layer));
    // A subscriber installed earlier (tests, embedding) wins.
    let _ = registry.try_init();
}

/// Completes on SIGINT or SIGTERM.
async fn termination() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = terminate.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    tracing::info!("termination signal received; shutting down");
}

/// `url` with the replica-acknowledgement options in its query (the Redis backend takes them
/// out again: `min_replica_acks`, `replica_ack_timeout_ms`).
fn with_replica_acks(url: String, acks: Option<u32>, timeout: Option<Duration>) -> String {
    let Some(acks) = acks else {
        return url;
    };
    let separator = if url.contains('?') { '&' } else { '?' };
    let mut url = format!("{url}{separator}min_replica_acks={acks}");
    if let Some(timeout) = timeout {
        url.push_str(&format!("&replica_ack_timeout_ms={}", timeout.as_millis()));
    }
    url
}

/// Runs `turnstile run` until SIGINT/SIGTERM.
pub async fn run_command(args: RunArgs) -> anyhow::Result<()> {
    let tracer_provider = args
        .otlp_endpoint
        .as_deref()
        .map(telemetry::tracer_provider)
        .transpose()?;
    init_logging(args.log_format, tracer_provider.as_ref());
    // Checked before anything starts.
    let redis_tls = RedisTlsFiles::new(
        args.redis_ca_file,
        args.redis_client_cert,
        args.redis_client_key,
    )?;
    let client = kube::Client::try_default().await?;
    let instance = std::env::var("POD_NAME")
        .ok()
        .filter(|name| !name.is_empty());
    let leader_election = if args.leader_elect {
        Some(LeaderConfig::from_env(&client)?)
    } else {
        None
    };
    let config = ControllerConfig {
        namespace: args.namespace,
        default_backend: args.default_backend,
        redis_url: args.redis_url.map(|url| {
            with_replica_acks(
                url,
                args.redis_min_replica_acks,
                args.redis_replica_ack_timeout,
            )
        }),
        redis_tls,
        mongo: args.mongo_url.map(|url| MongoSettings {
            url,
            database: args.mongo_database,
            collection: args.mongo_collection,
        }),
        etcd: args.etcd_url.map(|url| EtcdSettings {
            url,
            key_prefix: args.etcd_key_prefix,
            ca_file: args.etcd_ca_file,
            client_cert: args.etcd_client_cert.zip(args.etcd_client_key),
        }),
        cluster_name: args.cluster_name,
        metrics_addr: args.metrics_addr,
        instance,
        leader_election,
        events: EventPolicy {
            normal: args.events == EventLevel::All,
            normal_per_second: args.events_per_second,
        },
        tracer_provider: tracer_provider.clone(),
    };
    let ran = run(client, config, termination()).await;
    if let Some(provider) = tracer_provider {
        telemetry::shutdown(provider).await;
    }
    ran?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::ParseFlags;

    #[test]
    fn without_flags_nothing_is_served_and_the_default_backend_is_memory() {
        let defaults = RunArgs::parse_flags(&[]).expect("no flag is required");
        assert_eq!(defaults.metrics_addr, None, "off by default");
        assert_eq!(
            defaults.default_backend,
            BackendKind::Memory,
            "--default-backend"
        );
        assert_eq!(defaults.events, EventLevel::All, "--events");
        assert_eq!(defaults.events_per_second, 20, "--events-per-second");
        let set = RunArgs::parse_flags(&["--metrics-addr", "0.0.0.0:8080"]).unwrap();
        assert_eq!(set.metrics_addr, Some("0.0.0.0:8080".parse().unwrap()));
        let quiet = RunArgs::parse_flags(&["--events", "warnings", "--events-per-second", "0"])
            .expect("event flags");
        assert_eq!(
            (quiet.events, quiet.events_per_second),
            (EventLevel::Warnings, 0)
        );
        let error = RunArgs::parse_flags(&["--events", "some"]).expect_err("a bad level");
        assert!(error.to_string().contains("--events"), "{error}");
    }

    #[test]
    fn replica_acks_travel_in_the_redis_url() {
        let url = "redis+sentinel://s1:26379/m".to_owned();
        assert_eq!(with_replica_acks(url.clone(), None, None), url);
        assert_eq!(
            with_replica_acks(url.clone(), Some(1), None),
            "redis+sentinel://s1:26379/m?min_replica_acks=1"
        );
        assert_eq!(
            with_replica_acks(
                "redis://h/0?protocol=resp3".to_owned(),
                Some(2),
                Some(Duration::from_millis(500))
            ),
            "redis://h/0?protocol=resp3&min_replica_acks=2&replica_ack_timeout_ms=500"
        );
    }
}
