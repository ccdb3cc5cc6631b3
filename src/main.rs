//! The `turnstile` binary: parses the command line and hands over to [`turnstile::cli`].

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    turnstile::cli::run(turnstile::cli::Cli::parse()).await
}
