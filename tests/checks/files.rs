//! Files the checks read and write: a folder's entries, a scratch file.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use tempfile::TempDir;

use crate::scratch::scratch;

/// The names of the entries of `dir`, sorted.
pub fn file_names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("list {}: {e}", dir.display()))
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect()
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
