//! `turnstile history LOCK`: the last grants of a DistributedLock that ended — who held it
//! when, with which fencing token, and how it ended — from the lock's `status.history`.
//!
//! ```text
//! turnstile history db-migrations [-n NS] [-o json]
//! ```
//!
//! One get of the lock; nothing is written. The controller keeps the last
//! [`LOCK_HISTORY_LEN`](turnstile_api::LOCK_HISTORY_LEN) ended grants, written with the
//! holders' change (no write of their own).

use std::fmt::Write as _;

use crate::exit_codes::queue as exit_code;
use crate::oneshot::{existing_lock, init_logging, namespace_apis, Outcome};
use turnstile_api::PastGrant;

/// Flags of `turnstile history`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = exit_code::help())]
pub struct HistoryArgs {
    /// The DistributedLock.
    pub lock: String,
    /// Namespace of the lock; default: the kubeconfig's.
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Print `status.history` as JSON instead of a table.
    #[arg(long, short = 'o', value_parser = ["json"])]
    pub output: Option<String>,
}

/// Runs `turnstile history`.
pub async fn history_command(args: HistoryArgs) -> Outcome {
    init_logging();
    let (namespace, locks, _) =
        match namespace_apis(args.namespace.as_deref(), exit_code::ERROR).await {
            Ok(apis) => apis,
            Err(outcome) => return outcome,
        };
    let found = existing_lock(
        &locks,
        &args.lock,
        &namespace,
        exit_code::ERROR,
        exit_code::LOCK_NOT_FOUND,
    );
    let lock = match found.await {
        Ok(lock) => lock,
        Err(outcome) => return outcome,
    };
    let history = lock.status.map(|status| status.history).unwrap_or_default();
    if args.output.is_some() {
        match serde_json::to_string_pretty(&history) {
            Ok(json) => println!("{json}"),
            Err(error) => {
                return Outcome::cannot(exit_code::ERROR, "print the history as JSON", &error)
            }
        }
    } else {
        print!("{}", render(&namespace, &args.lock, &history));
    }
    Outcome::quiet(exit_code::OK)
}

/// The title line and the table: oldest grant first.
pub fn render(namespace: &str, lock: &str, history: &[PastGrant]) -> String {
    let title = format!(
        "DistributedLock {namespace}/{lock}: the last {} grants that ended\n",
        history.len()
    );
    title + &render_table(history)
}

/// The table alone (nothing when `history` is empty), also under `turnstile queue -o wide`.
pub fn render_table(history: &[PastGrant]) -> String {
    let mut text = String::new();
    if history.is_empty() {
        return text;
    }
    let rows: Vec<[String; 7]> = history
        .iter()
        .map(|grant| {
            let time = |at: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
                at.as_ref().map_or("-".to_owned(), |at| at.0.to_string())
            };
            let held_for = match (&grant.acquired_at, &grant.released_at) {
                (Some(from), Some(to)) => {
                    let seconds = (to.0.as_second() - from.0.as_second()).max(0);
                    humantime::format_duration(std::time::Duration::from_secs(
                        u64::try_from(seconds).unwrap_or(0),
                    ))
                    .to_string()
                }
                _ => "-".to_owned(),
            };
            [
                grant.claim.clone(),
                grant.fencing_token.to_string(),
                grant.holder_identity.clone(),
                time(&grant.acquired_at),
                time(&grant.released_at),
                held_for,
                grant.reason.clone(),
            ]
        })
        .collect();
    let header = [
        "CLAIM", "TOKEN", "HOLDER", "ACQUIRED", "RELEASED", "HELD-FOR", "REASON",
    ];
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        // Writing to a String cannot fail.
        let _ = writeln!(text, "{}", padded.join("   ").trim_end());
    };
    line(header.to_vec());
    for row in &rows {
        line(row.iter().map(String::as_str).collect());
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at(seconds: i64) -> Option<Time> {
        Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(seconds).expect("a time"),
        ))
    }

    #[test]
    fn the_table_lists_each_ended_grant_oldest_first() {
        let history = [
            PastGrant {
                claim: "job-a".into(),
                holder_identity: "job-a".into(),
                fencing_token: 1,
                acquired_at: at(1_800_000_000),
                released_at: at(1_800_000_090),
                reason: "ReleaseRequested".into(),
            },
            PastGrant {
                claim: "job-b".into(),
                holder_identity: "web-0".into(),
                fencing_token: 2,
                acquired_at: at(1_800_000_090),
                released_at: at(1_800_000_120),
                reason: "ForceReleased".into(),
            },
        ];
        let text = render("ops", "db", &history);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "DistributedLock ops/db: the last 2 grants that ended"
        );
        assert!(lines[1].starts_with("CLAIM   TOKEN   HOLDER"), "{text}");
        assert!(lines[2].starts_with("job-a   1       job-a"), "{text}");
        assert!(
            lines[2].contains("1m 30s") && lines[2].ends_with("ReleaseRequested"),
            "{text}"
        );
        assert!(
            lines[3].contains("30s") && lines[3].ends_with("ForceReleased"),
            "{text}"
        );
        assert_eq!(render("ops", "db", &[]).lines().count(), 1);
    }
}
