//! Command-line tools some tests run (`promtool`, `kubernetes-validate`, `checkov`): found on
//! `PATH`, or the test is skipped with one line saying why — except under CI, where a test
//! must not pass by skipping, so a missing tool fails it.

use std::ffi::OsString;
use std::io::{self, Write as _};
use std::path::PathBuf;
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
    assert!(
        !ci,
        "{test}: {why} (under CI a test must not pass by skipping)"
    );
    println!("skipped {test}: {why}");
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
    fn outside_ci_a_missing_tool_skips() {
        skip_or_fail("some_test", "sometool is not on PATH", false);
    }

    #[test]
    #[should_panic(expected = "under CI a test must not pass by skipping")]
    fn under_ci_a_missing_tool_fails_the_test() {
        skip_or_fail("some_test", "sometool is not on PATH", true);
    }
}
