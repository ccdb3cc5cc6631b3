//! The repository's README.md, where tests check that it says what the code does (its own
//! file, so a test binary that needs nothing else of `e2e_support` can include just this).

// Each test binary that includes this file uses only some of it.
#![allow(dead_code)]

use std::path::Path;

/// The repository's README.md.
pub fn readme_text() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("read {}: {error}", path.display()))
}

/// The first line of the repository's README.md that contains `marker`; panics if none does.
pub fn readme_line(marker: &str) -> String {
    readme_text()
        .lines()
        .find(|line| line.contains(marker))
        .unwrap_or_else(|| panic!("README.md has no line with {marker:?}"))
        .to_owned()
}
