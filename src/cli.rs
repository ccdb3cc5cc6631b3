//! The `turnstile` command line: argument parsing and dispatch to the subcommands.

use std::ffi::OsString;

use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::exit_codes;
use crate::oneshot::Outcome;

/// Distributed locks for Kubernetes workloads.
#[derive(Debug, Parser)]
#[command(name = "turnstile", version, about)]
struct Arguments {
    /// What to do.
    #[command(subcommand)]
    command: Command,
}

/// The parsed command line.
///
/// [`Parser::parse`] exits on a usage error as clap does (usage text, exit 2), except for
/// `turnstile wait`: there a usage error is one `turnstile: …` line on stderr and exit 2, like
/// every other way `wait` can fail, so that init-container logs and scripts see one shape.
#[derive(Debug)]
pub struct Cli {
    /// What to do.
    pub command: Command,
}

impl CommandFactory for Cli {
    fn command() -> clap::Command {
        Arguments::command()
    }

    fn command_for_update() -> clap::Command {
        Arguments::command_for_update()
    }
}

impl FromArgMatches for Cli {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        Arguments::from_arg_matches(matches).map(|arguments| Cli {
            command: arguments.command,
        })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        // A subcommand reads the parent's matches, as the derived `Arguments` passes them on.
        self.command.update_from_arg_matches(matches)
    }
}

impl Parser for Cli {
    fn parse() -> Self {
        Self::parse_from(std::env::args_os())
    }

    fn parse_from<I, T>(itr: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let args: Vec<OsString> = itr.into_iter().map(Into::into).collect();
        match Self::try_parse_from(&args) {
            Ok(cli) => cli,
            Err(error) => match usage_failure(&error, &args) {
                Some(outcome) => outcome.exit(),
                None => error.exit(),
            },
        }
    }
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
    Lock(crate::lock::LockArgs),
    /// Show who holds a DistributedLock and who waits for it, in grant order.
    Queue(crate::queue::QueueArgs),
    /// End a holder's grant now, recording who and why (an administrator's force-release).
    Release(crate::release::ReleaseArgs),
    /// Show the last grants of a DistributedLock that ended: who held it when, and how it ended.
    History(crate::history::HistoryArgs),
}

/// For a usage error of `turnstile wait`: the one-line outcome to exit with. `None` for
/// other subcommands, and for `--help` / `--version`, which are not errors.
fn usage_failure(error: &clap::Error, args: &[OsString]) -> Option<Outcome> {
    use clap::error::ErrorKind;
    if matches!(
        error.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
    ) {
        return None;
    }
    // The top level takes no flags with values, so the first word that is not a flag is the
    // subcommand (argv[0] is skipped: it may be `turnstile` or `kubectl-turnstile`).
    let subcommand = args
        .iter()
        .skip(1)
        .find(|arg| !arg.to_string_lossy().starts_with('-'))?;
    (subcommand == "wait").then(|| {
        Outcome::with_reason(
            exit_codes::USAGE,
            format!("{} (see turnstile wait --help)", one_line(error)),
        )
    })
}

/// clap's error message on one line, without the usage and hints that follow it.
fn one_line(error: &clap::Error) -> String {
    // `Display` of the rendered text carries no colour codes.
    let text = error.render().to_string();
    // The message is the first paragraph (`error: …` and indented details, such as the
    // missing arguments); usage and tips come after a blank line.
    let message = text.split("\n\n").next().unwrap_or_default();
    let joined = message
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    joined
        .strip_prefix("error: ")
        .map(str::to_owned)
        .unwrap_or(joined)
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
        Command::Lock(args) => crate::lock::lock_command(args).await.exit(),
        Command::Queue(args) => crate::queue::queue_command(args).await.exit(),
        Command::Release(args) => crate::release::release_command(args).await.exit(),
        Command::History(args) => crate::history::history_command(args).await.exit(),
    }
}

/// Parsing one subcommand's flags alone (any `clap::Args`), for the commands' unit tests.
#[cfg(test)]
pub(crate) trait ParseFlags: clap::Args + Sized {
    /// Parses `args` (without a program or subcommand name) as these flags.
    fn parse_flags(args: &[&str]) -> Result<Self, clap::Error> {
        let matches = Self::augment_args(clap::Command::new("turnstile"))
            .try_get_matches_from(std::iter::once("turnstile").chain(args.iter().copied()))?;
        Self::from_arg_matches(&matches)
    }
}

#[cfg(test)]
impl<A: clap::Args> ParseFlags for A {}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(args: &[&str]) -> Option<Outcome> {
        let args: Vec<OsString> = std::iter::once("turnstile")
            .chain(args.iter().copied())
            .map(OsString::from)
            .collect();
        let error = Cli::try_parse_from(&args).expect_err("a usage error");
        usage_failure(&error, &args)
    }

    #[test]
    fn wait_usage_errors_are_one_line() {
        let outcome = failure(&["wait", "c", "--create"]).expect("wait's own report");
        assert_eq!(outcome.code, exit_codes::USAGE);
        let reason = outcome.reason.unwrap_or_default();
        assert!(!reason.contains('\n'), "{reason}");
        assert!(
            reason.starts_with("the following required arguments were not provided: --lock"),
            "{reason}"
        );
    }

    #[test]
    fn run_flags_that_need_another_are_refused_alone() {
        // Each flag alone, and the one it needs named in the error.
        for (args, needed) in [
            (&["--redis-min-replica-acks", "1"][..], "--redis-url"),
            (
                &[
                    "--redis-url",
                    "redis://h",
                    "--redis-replica-ack-timeout",
                    "1s",
                ][..],
                "--redis-min-replica-acks",
            ),
            (&["--mongo-database", "d"][..], "--mongo-url"),
            (&["--mongo-collection", "c"][..], "--mongo-url"),
            (&["--etcd-ca-file", "ca.pem"][..], "--etcd-url"),
            (
                &["--etcd-url", "etcd://h:2379", "--etcd-client-cert", "c.pem"][..],
                "--etcd-client-key",
            ),
            (
                &["--etcd-url", "etcd://h:2379", "--etcd-client-key", "k.pem"][..],
                "--etcd-client-cert",
            ),
        ] {
            let command: Vec<&str> = ["turnstile", "run"].iter().chain(args).copied().collect();
            let error = Cli::try_parse_from(&command).expect_err("a usage error");
            assert_eq!(
                error.kind(),
                clap::error::ErrorKind::MissingRequiredArgument,
                "{command:?}: {error}"
            );
            assert!(error.to_string().contains(needed), "{command:?}: {error}");
        }
        // With what they need, they parse.
        Cli::try_parse_from([
            "turnstile",
            "run",
            "--redis-url",
            "redis://h",
            "--redis-min-replica-acks",
            "1",
            "--redis-replica-ack-timeout",
            "500ms",
            "--mongo-url",
            "mongodb://h",
            "--mongo-database",
            "d",
            "--mongo-collection",
            "c",
            "--etcd-url",
            "etcds://h:2379",
            "--etcd-key-prefix",
            "shared/",
            "--etcd-ca-file",
            "ca.pem",
            "--etcd-client-cert",
            "c.pem",
            "--etcd-client-key",
            "k.pem",
            "--cluster-name",
            "east",
        ])
        .expect("a complete command line");
    }

    #[test]
    fn other_subcommands_and_help_keep_clap_output() {
        assert_eq!(failure(&["lock"]), None);
        assert_eq!(failure(&["wait", "--help"]), None);
        assert_eq!(failure(&["--version"]), None);
    }
}
