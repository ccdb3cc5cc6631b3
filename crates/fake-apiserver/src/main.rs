//! `fake-apiserver [--port N] [--kubeconfig PATH]`: prints its URL as the first line on
//! stdout, writes a kubeconfig when asked, and serves until SIGTERM or SIGINT.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

/// A fake Kubernetes API server for tests and manual use with kubectl.
#[derive(Debug, Parser)]
#[command(name = "fake-apiserver", version, about)]
struct Args {
    /// Port on 127.0.0.1 (0 picks a free one).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Write a kubeconfig for this server here.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Seconds between watch bookmarks.
    #[arg(long, default_value_t = 5)]
    bookmark_interval_seconds: u64,
}

#[tokio::main]
async fn main() -> anyhow_free::Result {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let server = fake_apiserver::FakeApiServer::builder()
        .port(args.port)
        .bookmark_interval(Duration::from_secs(args.bookmark_interval_seconds.max(1)))
        .start()
        .await?;
    if let Some(path) = &args.kubeconfig {
        server.write_kubeconfig(path)?;
    }
    let mut stdout = std::io::stdout();
    writeln!(stdout, "{}", server.url()).map_err(|source| fake_apiserver::Error::Bind {
        addr: server.url().into(),
        source,
    })?;
    stdout
        .flush()
        .map_err(|source| fake_apiserver::Error::Bind {
            addr: server.url().into(),
            source,
        })?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|source| fake_apiserver::Error::Bind {
            addr: server.url().into(),
            source,
        })?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    drop(server);
    Ok(())
}

/// `main`'s result without pulling in anyhow for one line.
mod anyhow_free {
    /// Success, or the error that stopped the server.
    pub type Result = std::result::Result<(), fake_apiserver::Error>;
}
