//! The one line of the README or of a docs page that says a thing, for checks that compare
//! a figure or a list on it with the code.

use crate::docs::{docs_page, readme_text};

/// The first line of the repository's README.md that contains `marker`; panics if none does.
pub fn readme_line(marker: &str) -> String {
    first_line_with(&readme_text(), marker, "README.md")
}

/// The first line of the docs page `relative` that contains `marker`; panics if none does.
pub fn docs_line(relative: &str, marker: &str) -> String {
    first_line_with(&docs_page(relative), marker, relative)
}

fn first_line_with(text: &str, marker: &str, file: &str) -> String {
    text.lines()
        .find(|line| line.contains(marker))
        .unwrap_or_else(|| panic!("{file} has no line with {marker:?}"))
        .to_owned()
}
