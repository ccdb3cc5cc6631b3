//! Scratch directories under cargo's per-test temporary folder; shared by the
//! `e2e` and `checks` test binaries.

use tempfile::TempDir;

/// A fresh directory named `prefix…` in `CARGO_TARGET_TMPDIR`, removed when dropped.
pub fn scratch(prefix: &str) -> TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap_or_else(|error| panic!("temporary directory {prefix}…: {error}"))
}
