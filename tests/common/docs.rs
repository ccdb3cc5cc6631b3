//! The README and the docs site's pages (`docs/src`), where tests check that they say what the
//! code does, and the console examples of the docs: read, split into commands and expected
//! output, and compared with what the commands print. Shared by the `e2e` and `checks`
//! test binaries.

use std::path::{Path, PathBuf};

/// The repository root.
pub fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|error| panic!("read {}: {error}", path.display()))
}

/// The repository's README.md.
pub fn readme_text() -> String {
    read(&workspace().join("README.md"))
}

/// The docs page `relative` to `docs/src` (`how-to/install.md`).
pub fn docs_page(relative: &str) -> String {
    read(&workspace().join("docs/src").join(relative))
}

/// One command of a console example (after `$ `, continuation lines joined) and the output
/// the example shows for it.
#[derive(Debug, Clone)]
pub struct ConsoleStep {
    /// The command, as bash runs it.
    pub command: String,
    /// The lines shown after it, up to the next command (blank lines left out).
    pub expected: Vec<String>,
}

/// One ```` ```console ```` block of a page: where it starts and its steps.
#[derive(Debug, Clone)]
pub struct ConsoleBlock {
    /// The 1-based line of the opening fence.
    pub line: usize,
    /// The block's commands, in order.
    pub steps: Vec<ConsoleStep>,
}

/// The console blocks of a page, in order.
pub fn console_blocks(page: &str) -> Vec<ConsoleBlock> {
    let mut blocks = Vec::new();
    let mut current: Option<ConsoleBlock> = None;
    let mut continued = false;
    for (index, line) in page.lines().enumerate() {
        if let Some(block) = current.as_mut() {
            if line.starts_with("```") {
                blocks.extend(current.take());
                continue;
            }
            if continued {
                let step = block.steps.last_mut().expect("a step to continue");
                step.command.push('\n');
                step.command.push_str(line);
                continued = line.ends_with('\\');
            } else if let Some(command) = line.strip_prefix("$ ") {
                block.steps.push(ConsoleStep {
                    command: command.to_owned(),
                    expected: Vec::new(),
                });
                continued = command.ends_with('\\');
            } else if !line.trim().is_empty() {
                let step = block
                    .steps
                    .last_mut()
                    .unwrap_or_else(|| panic!("line {}: output before any command", index + 1));
                step.expected.push(line.to_owned());
            }
        } else if line.trim_end() == "```console" {
            current = Some(ConsoleBlock {
                line: index + 1,
                steps: Vec::new(),
            });
        }
    }
    assert!(current.is_none(), "a console block is not closed");
    blocks
}

/// A line's words with what differs from run to run (times, ages, durations) replaced by a
/// placeholder, so a shown output and a real one compare on what matters: names, phases,
/// tokens, counts, messages. Column padding is whitespace, so it does not count either.
pub fn normalized(line: &str) -> String {
    line.split_whitespace()
        .map(|word| {
            if is_time(word) {
                "<time>"
            } else if is_duration(word) {
                "<duration>"
            } else {
                word
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// An RFC 3339 time as the API server writes it: `2026-12-01T02:05:00Z`.
fn is_time(word: &str) -> bool {
    let bytes = word.as_bytes();
    bytes.len() >= 20
        && bytes[..4].iter().all(u8::is_ascii_digit)
        && bytes[4] == b'-'
        && bytes[10] == b'T'
        && word.ends_with('Z')
}

/// A duration or an age as kubectl and turnstile print them: `3s`, `9m57s`, `250ms`, `2d`.
fn is_duration(word: &str) -> bool {
    let mut rest = word;
    let mut parts = 0;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        let unit = ["ms", "s", "m", "h", "d"]
            .into_iter()
            .find(|unit| rest.starts_with(unit));
        let Some(unit) = unit else { return false };
        rest = &rest[unit.len()..];
        parts += 1;
    }
    parts > 0
}

/// Whether `actual` is what `expected` shows: line by line after [`normalized`], blank lines
/// aside, where a line `...` stands for any number of lines and a shown word `<name>` (maybe
/// followed by punctuation: `<user>:`) for any one word (a user name, a path the reader's
/// machine decides). The error shows both.
pub fn output_matches(expected: &[String], actual: &str) -> Result<(), String> {
    let shown: Vec<String> = expected
        .iter()
        .map(|line| normalized(line))
        .filter(|line| !line.is_empty())
        .collect();
    let got: Vec<String> = actual
        .lines()
        .map(normalized)
        .filter(|line| !line.is_empty())
        .collect();
    if glob_lines(&shown, &got) {
        Ok(())
    } else {
        Err(format!(
            "shown:\n  {}\nprinted:\n  {}",
            shown.join("\n  "),
            got.join("\n  ")
        ))
    }
}

/// One shown line against one printed line, word by word, placeholders matching any word.
fn line_matches(shown: &str, printed: &str) -> bool {
    let shown: Vec<&str> = shown.split(' ').collect();
    let printed: Vec<&str> = printed.split(' ').collect();
    shown.len() == printed.len()
        && shown.iter().zip(&printed).all(|(shown, printed)| {
            shown == printed
                || shown.starts_with('<')
                    && shown
                        .find('>')
                        .is_some_and(|end| printed.ends_with(&shown[end + 1..]))
        })
}

fn glob_lines(pattern: &[String], lines: &[String]) -> bool {
    match pattern.split_first() {
        None => lines.is_empty(),
        Some((first, rest)) if first == "..." => {
            (0..=lines.len()).any(|skip| glob_lines(rest, &lines[skip..]))
        }
        Some((first, rest)) => {
            lines.first().is_some_and(|line| line_matches(first, line))
                && glob_lines(rest, &lines[1..])
        }
    }
}
