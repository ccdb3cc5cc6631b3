//! Scratch directories under cargo's per-test temporary folder (its own file, so a test
//! binary that needs nothing else of `e2e_support` can include just this).

// Each test binary that includes this file uses only some of it.
#![allow(dead_code)]

use std::path::PathBuf;

use tempfile::TempDir;

/// A fresh directory named `prefix…` in `CARGO_TARGET_TMPDIR`, removed when dropped.
pub fn scratch(prefix: &str) -> TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap_or_else(|error| panic!("temporary directory {prefix}…: {error}"))
}

/// The file `name` holding `contents`, alone in a fresh [`scratch`] directory (returned too:
/// the file lives as long as it).
pub fn scratch_file(prefix: &str, name: &str, contents: &str) -> (TempDir, PathBuf) {
    let dir = scratch(prefix);
    let file = dir.path().join(name);
    std::fs::write(&file, contents)
        .unwrap_or_else(|error| panic!("write {}: {error}", file.display()));
    (dir, file)
}
