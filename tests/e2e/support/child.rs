//! Child processes of the tests (the built `turnstile`, `sh`, ...): spawned with stdout and
//! stderr captured and killed if the test drops them, and waited for within a bound.

use std::process::{Output, Stdio};
use std::time::Duration;

use tokio::process::{Child, Command};

/// `command` spawned with `stdin`, its stdout and stderr piped, killed on drop; `what` names
/// it in the panic if it cannot be spawned.
pub fn spawn_captured(command: &mut Command, stdin: Stdio, what: &str) -> Child {
    command
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|error| panic!("spawn {what}: {error}"))
}

/// Runs `command` (blocking) with `input` on its stdin and its stdout and stderr captured;
/// `what` names it in the panic if it cannot be run.
pub fn output_with_input(command: &mut std::process::Command, input: &[u8], what: &str) -> Output {
    use std::io::Write as _;
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("spawn {what}: {error}"));
    let mut stdin = child.stdin.take().expect("stdin is piped");
    stdin
        .write_all(input)
        .unwrap_or_else(|error| panic!("write to {what}: {error}"));
    // Closed, so that the command sees the end of its input.
    drop(stdin);
    child
        .wait_with_output()
        .unwrap_or_else(|error| panic!("output of {what}: {error}"))
}

/// Waits up to `patience` for `child` to end and returns its output; `what` names it in the
/// panic if it does not end in time.
pub async fn finish_within(patience: Duration, child: Child, what: &str) -> Output {
    tokio::time::timeout(patience, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{what} did not end within {patience:?}"))
        .unwrap_or_else(|error| panic!("output of {what}: {error}"))
}

/// A `turnstile` that ended with `code` and said why in one line on stderr, `turnstile: …`
/// (`context` starts each failure message). Returns that line.
pub fn one_line_exit(output: &Output, code: i32, context: &str) -> String {
    let line = super::output::stderr(output);
    assert_eq!(output.status.code(), Some(code), "{context}: {line}");
    assert_eq!(line.lines().count(), 1, "{context}: one line, got {line:?}");
    assert!(line.starts_with("turnstile: "), "{context}: {line:?}");
    line
}
