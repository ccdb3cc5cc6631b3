//! A finished command's output as text, for assertion messages (its own file, so a test
//! binary that needs nothing else of `e2e_support` can include just this).

// Each test binary that includes this file uses only some of it.
#![allow(dead_code)]

use std::process::Output;

/// The exit code, standard output and standard error of `output`, each labelled.
pub fn text(output: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The standard output of a command that must have succeeded; panics with both outputs,
/// naming it `what`, if it did not.
pub fn succeeded(what: &str, output: &Output) -> String {
    let stdout = stdout(output);
    assert!(
        output.status.success(),
        "{what} failed:\n{stdout}\n{}",
        stderr(output)
    );
    stdout
}

/// A `turnstile` that ended with `code` and said why in one line on stderr, `turnstile: …`
/// (`context` starts each failure message). Returns that line.
pub fn one_line_exit(output: &Output, code: i32, context: &str) -> String {
    let line = stderr(output);
    assert_eq!(output.status.code(), Some(code), "{context}: {line}");
    assert_eq!(line.lines().count(), 1, "{context}: one line, got {line:?}");
    assert!(line.starts_with("turnstile: "), "{context}: {line:?}");
    line
}

/// The standard output of `output`, as text.
pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The standard error of `output`, as text.
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}
