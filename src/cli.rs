//! The `turnstile` command line: argument parsing and dispatch to the subcommands.

use clap::{Parser, Subcommand};

/// Distributed locks for Kubernetes workloads.
#[derive(Debug, Parser)]
#[command(name = "turnstile", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands of `turnstile`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the CustomResourceDefinitions as YAML (`turnstile crds | kubectl apply -f -`).
    Crds,
    /// Run the controller: grant LockClaims their DistributedLocks, in order.
    Run(crate::controller::command::RunArgs),
}

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Crds => {
            print!("{}", crate::api::crds_yaml()?);
            Ok(())
        }
        Command::Run(args) => crate::controller::command::run_command(args).await,
    }
}
