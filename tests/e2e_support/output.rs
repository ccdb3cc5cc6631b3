//! A finished command's output as one text, for assertion messages (its own file, so a test
//! binary that needs nothing else of `e2e_support` can include just this).

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
