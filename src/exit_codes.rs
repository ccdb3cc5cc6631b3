//! The exit codes of the one-shot commands (`wait`, `lock`, `queue`, `release`): the numbers scripts
//! branch on, all in one place, so that a code means one thing across the commands (2 usage,
//! 6 no such lock, 75 gave up waiting) and each command's `--help` lists its codes from these
//! same constants rather than from a copy of them.

use std::fmt::{Display, Write};

/// A usage error: clap's own, and the commands' own argument checks.
pub const USAGE: u8 = 2;

/// `turnstile wait`.
pub mod wait {
    use super::USAGE;

    /// Held: the fencing token was printed.
    pub const HELD: u8 = 0;
    /// The API server could not be reached or refused a request (configuration, RBAC, ...).
    pub const ERROR: u8 = 1;
    /// The claim is `Failed` (acquire timeout, invalid spec, ...).
    pub const FAILED: u8 = 3;
    /// The claim is `Expired`: its lease ran out or its lock was deleted.
    pub const EXPIRED: u8 = 4;
    /// The claim is `Released` (or was withdrawn) before we saw it held.
    pub const RELEASED: u8 = 5;
    /// The claim's DistributedLock does not exist.
    pub const LOCK_NOT_FOUND: u8 = 6;
    /// The claim does not exist (without `--create`), was deleted, or is being deleted.
    pub const CLAIM_NOT_FOUND: u8 = 7;
    /// With `--create`: a claim of that name exists for another lock or another Pod.
    pub const CLAIM_CONFLICT: u8 = 8;
    /// `--timeout` passed before the claim was held (EX_TEMPFAIL, as for `turnstile lock`).
    pub const TIMEOUT: u8 = 75;

    /// The `Exit codes:` section of `turnstile wait --help`.
    pub fn help() -> String {
        super::help(&[
            (&HELD, "Held; the fencing token is on stdout"),
            (
                &ERROR,
                "API server unreachable or request refused (kubeconfig, RBAC)",
            ),
            (
                &USAGE,
                "usage error (e.g. --create without POD_NAME/POD_UID)",
            ),
            (&FAILED, "claim Failed"),
            (&EXPIRED, "claim Expired"),
            (&RELEASED, "claim Released"),
            (
                &LOCK_NOT_FOUND,
                "the claim's DistributedLock does not exist",
            ),
            (
                &CLAIM_NOT_FOUND,
                "claim not found, or deleted while waiting",
            ),
            (
                &CLAIM_CONFLICT,
                "--create: a claim of that name belongs to another Pod or lock",
            ),
            (&TIMEOUT, "--timeout passed"),
        ])
    }
}

/// `turnstile lock`, besides the command's own. A command exiting with one of these numbers
/// itself is indistinguishable from them (as with `flock`).
pub mod lock {
    use super::USAGE;

    /// The backend could not be reached (connect, or an error while acquiring).
    pub const BACKEND_UNAVAILABLE: u8 = 69;
    /// Something unexpected went wrong in turnstile itself.
    pub const INTERNAL: u8 = 70;
    /// The lock was not acquired within `--wait` (EX_TEMPFAIL, as commonly used with `flock -E`).
    pub const NOT_ACQUIRED: u8 = 75;
    /// The lock was lost while the command ran; the command was stopped.
    pub const LOCK_LOST: u8 = 76;
    /// The command exists but could not be executed (as in shells).
    pub const CANNOT_EXECUTE: u8 = 126;
    /// The command was not found (as in shells).
    pub const COMMAND_NOT_FOUND: u8 = 127;

    /// The `Exit codes:` section of `turnstile lock --help`.
    pub fn help() -> String {
        super::help(&[
            (
                &"the command's own",
                "its exit code, or 128+N if signal N killed it",
            ),
            (&USAGE, "usage error"),
            (&BACKEND_UNAVAILABLE, "backend unreachable"),
            (&INTERNAL, "internal error"),
            (&NOT_ACQUIRED, "lock not acquired within --wait"),
            (
                &LOCK_LOST,
                "lock lost while the command ran (the command was stopped)",
            ),
            (
                &format!("{CANNOT_EXECUTE} / {COMMAND_NOT_FOUND}"),
                "command not executable / not found",
            ),
            (
                &"128+N",
                "signal N (SIGTERM, SIGINT) received while waiting for the lock",
            ),
        ])
    }
}

/// `turnstile release`.
pub mod release {
    use super::{lock, wait, USAGE};

    /// The grant was ended (the claim's status says how).
    pub const RELEASED: u8 = 0;
    /// The API server could not be reached or refused a request (kubeconfig, RBAC).
    pub const ERROR: u8 = wait::ERROR;
    /// The DistributedLock does not exist.
    pub const LOCK_NOT_FOUND: u8 = wait::LOCK_NOT_FOUND;
    /// Nobody holds the lock, or `--claim` does not hold it.
    pub const NOT_HELD: u8 = 9;
    /// The claim is marked, but the controller had not ended the grant within `--timeout`.
    pub const TIMEOUT: u8 = lock::NOT_ACQUIRED;

    /// The `Exit codes:` section of `turnstile release --help`.
    pub fn help() -> String {
        super::help(&[
            (&RELEASED, "the grant was ended"),
            (&USAGE, "usage error (also: several holders and no --claim)"),
            (
                &ERROR,
                "API server unreachable or request refused (kubeconfig, RBAC)",
            ),
            (&LOCK_NOT_FOUND, "the DistributedLock does not exist"),
            (&NOT_HELD, "nobody holds the lock, or --claim does not"),
            (&TIMEOUT, "marked, but not ended within --timeout"),
        ])
    }
}

/// `turnstile queue`.
pub mod queue {
    use super::wait;

    /// The queue was printed.
    pub const OK: u8 = 0;
    /// The API server could not be reached or refused a request (kubeconfig, RBAC).
    pub const ERROR: u8 = wait::ERROR;
    /// The DistributedLock does not exist.
    pub const LOCK_NOT_FOUND: u8 = wait::LOCK_NOT_FOUND;

    /// The `Exit codes:` section of `turnstile queue --help`.
    pub fn help() -> String {
        super::help(&[
            (&OK, "printed"),
            (
                &ERROR,
                "API server unreachable or request refused (kubeconfig, RBAC)",
            ),
            (&LOCK_NOT_FOUND, "the DistributedLock does not exist"),
        ])
    }
}

/// An `Exit codes:` help section: one line per code (or codes) and its meaning, aligned.
fn help(lines: &[(&dyn Display, &str)]) -> String {
    let codes: Vec<String> = lines.iter().map(|(code, _)| code.to_string()).collect();
    let width = codes.iter().map(String::len).max().unwrap_or(0) + 3;
    let mut section = String::from("Exit codes:");
    for (code, (_, meaning)) in codes.iter().zip(lines) {
        // Writing to a String cannot fail.
        let _ = write!(section, "\n  {code:width$}{meaning}");
    }
    section
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_help_lists_its_codes_aligned() {
        assert_eq!(
            queue::help(),
            "Exit codes:\n  \
             0   printed\n  \
             1   API server unreachable or request refused (kubeconfig, RBAC)\n  \
             6   the DistributedLock does not exist"
        );
        let lock = lock::help();
        assert!(
            lock.contains("\n  126 / 127           command not executable"),
            "{lock}"
        );
        let wait = wait::help();
        assert!(wait.contains("\n  75   --timeout passed"), "{wait}");
        assert!(wait.contains("\n  2    usage error"), "{wait}");
        let release = release::help();
        assert!(
            release.contains("\n  9    nobody holds the lock, or --claim does not"),
            "{release}"
        );
        assert!(
            release.contains("\n  75   marked, but not ended within --timeout"),
            "{release}"
        );
    }
}
