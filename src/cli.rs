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
    Run(crate::run::RunArgs),
    /// Wait until a LockClaim is Held and print its fencing token (for init containers).
    Wait(crate::wait::WaitArgs),
    /// Run a command while holding a lock on a Redis or MongoDB backend (like flock).
    Lock(crate::run_locked::LockArgs),
}

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Crds => {
            print!("{}", turnstile_api::crds_yaml()?);
            Ok(())
        }
        Command::Run(args) => crate::run::run_command(args).await,
        // These end the process with their own exit codes (documented per command).
        Command::Wait(args) => crate::wait::wait_command(args).await.exit(),
        Command::Lock(args) => crate::run_locked::lock_command(args).await.exit(),
    }
}
