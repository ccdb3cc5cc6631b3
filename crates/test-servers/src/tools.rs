//! Command-line tools some tests run (`promtool`, `kubernetes-validate`, `checkov`): found on
//! `PATH`, or the test is skipped with one line saying why — except under CI, where a test
//! must not pass by skipping, so a missing tool fails it.

use std::ffi::OsString;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Whether the tests run under CI (`CI=true` or `CI=1`): there a test must not pass by
/// skipping, so a missing or lacking test server or tool fails it.
pub fn under_ci() -> bool {
    is_ci_value(std::env::var("CI").ok().as_deref())
}

/// The path in the environment variable `name`, when it is set and not empty (a real
/// cluster's kubeconfig, a tool's location, ...).
pub fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|value| !value.is_empty())
        .map(PathBuf::from)
}

/// Whether `CI` set to `value` means "under CI".
fn is_ci_value(value: Option<&str>) -> bool {
    value.is_some_and(|value| value.eq_ignore_ascii_case("true") || value == "1")
}

/// `name` on `PATH`, or `None` after [`skip_or_fail`] said why; `install` tells where the
/// tool comes from (e.g. "PyPI; `bash .ci/install` installs it").
///
/// # Panics
/// Under CI, when the tool is missing.
pub fn tool_or_skip(name: &str, test: &str, install: &str) -> Option<PathBuf> {
    let found = find_on_path(name, std::env::var_os("PATH"));
    if found.is_none() {
        skip_or_fail(
            test,
            &format!("{name} is not on PATH ({install})"),
            under_ci(),
        );
    }
    found
}

/// The first file called `name` in the directories of `path` (a `PATH` value).
fn find_on_path(name: &str, path: Option<OsString>) -> Option<PathBuf> {
    std::env::split_paths(&path?)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Says why `test` cannot run here: one `skipped {test}: {why}` line, or under CI (`ci`) a
/// panic, so that the test fails instead of passing by skipping.
///
/// # Panics
/// When `ci` is true.
pub fn skip_or_fail(test: &str, why: &str, ci: bool) {
    skip_or_fail_logged(test, why, ci, &skip_log());
}

/// [`skip_or_fail`], listing the skip in the log at `log`.
fn skip_or_fail_logged(test: &str, why: &str, ci: bool, log: &Path) {
    assert!(
        !ci,
        "{test}: {why} (under CI a test must not pass by skipping)"
    );
    println!("skipped {test}: {why}");
    append_skip(log, test, why);
}

/// Where the skips of test runs are listed: `test-skips.log` in the build folder
/// (`CARGO_TARGET_DIR`, else the workspace's `target/`).
pub fn skip_log() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"))
        .join("test-skips.log")
}

/// Says that `test` skipped, and why: one `skipped {test}: {why}` line on the test's output
/// (shown with `--nocapture`) and the same line, with the time, appended to [`skip_log`], so
/// that after a run `cat target/test-skips.log` lists every skip (remove the file first to see
/// one run's). Only outside CI: under CI a test that cannot run fails ([`skip_or_fail`]).
pub fn record_skip(test: &str, why: &str) {
    println!("skipped {test}: {why}");
    append_skip(&skip_log(), test, why);
}

/// Appends one skip line to the log at `path`.
fn append_skip(path: &Path, test: &str, why: &str) {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path);
    if let Ok(mut log) = log {
        // One write per line, so lines of tests running at once do not interleave.
        let _ = log.write_all(format!("{seconds} skipped {test}: {why}\n").as_bytes());
    }
}

/// Runs `command` with `stdin` written to its standard input and its standard output and
/// error captured (as `kubectl apply -f -` wants its manifest); returns its output.
///
/// # Errors
/// When the command cannot be spawned, its input cannot be written, or waiting for it fails.
pub fn output_with_stdin(command: &mut Command, stdin: &str) -> io::Result<Output> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut input) = child.stdin.take() {
        // Dropped at the end of this block: the command sees the end of its input.
        input.write_all(stdin.as_bytes())?;
    }
    child.wait_with_output()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skip_is_listed_in_the_skip_log() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("test-skips.log");
        append_skip(&path, "one", "no server");
        append_skip(&path, "two", "no tool");
        let log = std::fs::read_to_string(&path).expect("the skip log");
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(lines.len(), 2, "{log}");
        assert!(lines[0].ends_with(" skipped one: no server"), "{log}");
        assert!(lines[1].ends_with(" skipped two: no tool"), "{log}");
        assert!(skip_log().ends_with("test-skips.log"));
    }

    #[test]
    fn ci_is_true_or_1() {
        for (value, ci) in [
            (None, false),
            (Some(""), false),
            (Some("false"), false),
            (Some("0"), false),
            (Some("true"), true),
            (Some("TRUE"), true),
            (Some("1"), true),
        ] {
            assert_eq!(is_ci_value(value), ci, "{value:?}");
        }
    }

    #[test]
    fn a_tool_is_found_in_the_directories_of_path_only() {
        let dir = tempfile::tempdir().expect("temporary directory");
        std::fs::write(dir.path().join("sometool"), "").expect("write");
        let path = std::env::join_paths([PathBuf::from("/nonexistent"), dir.path().into()])
            .expect("a PATH");
        assert_eq!(
            find_on_path("sometool", Some(path.clone())),
            Some(dir.path().join("sometool"))
        );
        assert_eq!(find_on_path("othertool", Some(path)), None);
        assert_eq!(find_on_path("sometool", None), None);
    }

    #[test]
    fn a_command_reads_the_given_stdin() {
        let output = output_with_stdin(&mut Command::new("cat"), "line\n").expect("cat runs");
        assert!(output.status.success());
        assert_eq!(output.stdout, b"line\n");
    }

    #[test]
    fn an_unset_or_empty_variable_names_no_path() {
        assert_eq!(env_path("TURNSTILE_TEST_SERVERS_SURELY_UNSET"), None);
        assert_eq!(
            env_path("PATH").is_some(),
            std::env::var_os("PATH").is_some_and(|p| !p.is_empty())
        );
    }

    #[test]
    fn outside_ci_a_missing_tool_skips_and_is_listed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("test-skips.log");
        skip_or_fail_logged("some_test", "sometool is not on PATH", false, &log);
        let listed = std::fs::read_to_string(&log).expect("the skip log");
        assert!(
            listed.ends_with(" skipped some_test: sometool is not on PATH\n"),
            "{listed}"
        );
    }

    #[test]
    #[should_panic(expected = "under CI a test must not pass by skipping")]
    fn under_ci_a_missing_tool_fails_the_test() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("test-skips.log");
        skip_or_fail_logged("some_test", "sometool is not on PATH", true, &log);
    }
}
