//! A finished command's output as text, for assertion messages; shared by
//! the `e2e` and `checks` test binaries.

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

/// The standard output of `output`, as text.
pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The standard error of `output`, as text.
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}
