//! An offline link checker for the docs, the README and the other top-level pages: every
//! relative link names a file that exists (and, for a docs page, stays inside the book), every
//! anchor names a heading of its page (for a docs page: an `id` of the built HTML, so mdBook's
//! own anchors are what is checked), and a GitHub address of this repository names a file of
//! it. Addresses of other sites are left alone (no network).

use std::path::{Component, Path, PathBuf};

use super::docs_pages;
use crate::support::docs::workspace;

/// The repository's address, as the docs link its files.
const REPOSITORY: &str = "https://github.com/turnstile-dev/turnstile/";

/// One markdown link: its target as written and its 1-based line.
#[derive(Debug, Clone)]
pub struct Link {
    /// The target, as written between the parentheses.
    pub target: String,
    /// The line it is on.
    pub line: usize,
}

/// The markdown links of `text`, outside code blocks and code spans.
pub fn links_in(text: &str) -> Vec<Link> {
    let mut links = Vec::new();
    let mut in_code = false;
    for (index, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        // Code spans are every other piece between backticks.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(start) = rest.find("](") {
            rest = &rest[start + 2..];
            let Some(end) = rest.find(')') else { break };
            links.push(Link {
                target: rest[..end].to_owned(),
                line: index + 1,
            });
            rest = &rest[end + 1..];
        }
    }
    links
}

/// The anchors of a markdown page's headings, as GitHub and mdBook make them: lower case,
/// letters, digits, `-` and `_` kept, spaces made `-`, the rest dropped; a repeated one gets
/// `-1`, `-2`, ….
pub fn heading_anchors(text: &str) -> Vec<String> {
    let mut anchors: Vec<String> = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        if in_code {
            continue;
        }
        let title = heading.trim_start_matches('#');
        if !title.starts_with(' ') {
            continue;
        }
        let slug: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                c if c.is_whitespace() => Some('-'),
                _ => None,
            })
            .collect();
        let repeats = anchors
            .iter()
            .filter(|anchor| **anchor == slug || anchor.starts_with(&format!("{slug}-")))
            .count();
        anchors.push(if repeats == 0 {
            slug
        } else {
            format!("{slug}-{repeats}")
        });
    }
    anchors
}

/// What a check of every page found.
pub struct Report {
    /// Links checked (addresses of other sites not counted).
    pub checked: usize,
    /// One line per broken link: file, line, target, why.
    pub broken: Vec<String>,
}

/// Checks the docs pages (anchors against the book built into `book`), the README,
/// CONTRIBUTING.md and ARCHITECTURE.md.
pub fn check_all(book: &Path) -> Report {
    let mut files: Vec<PathBuf> = docs_pages()
        .into_iter()
        .map(|page| workspace().join("docs/src").join(page))
        .collect();
    for top in ["README.md", "CONTRIBUTING.md", "ARCHITECTURE.md"] {
        files.push(workspace().join(top));
    }
    let mut report = Report {
        checked: 0,
        broken: Vec::new(),
    };
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read page");
        report.checked += links_in(&text)
            .iter()
            .filter(|link| !is_elsewhere(&link.target))
            .count();
        report.broken.extend(broken_links_of(file, Some(book)));
    }
    report
}

/// An address of another site, or mail: not checked offline.
fn is_elsewhere(target: &str) -> bool {
    (target.starts_with("http://") || target.starts_with("https://"))
        && !target.starts_with(REPOSITORY)
        || target.starts_with("mailto:")
}

/// The broken links of one markdown file; `book` is the built book, where the anchors of
/// docs pages are looked up.
pub fn broken_links_of(file: &Path, book: Option<&Path>) -> Vec<String> {
    let text = std::fs::read_to_string(file).expect("read page");
    let docs = workspace().join("docs/src");
    let in_book = file.starts_with(&docs);
    let mut broken = Vec::new();
    for link in links_in(&text) {
        let target = link.target.as_str();
        if is_elsewhere(target) {
            continue;
        }
        let mut say = |why: &str| {
            broken.push(format!(
                "{}:{}: {target}: {why}",
                file.strip_prefix(workspace()).unwrap_or(file).display(),
                link.line
            ));
        };
        if let Some(rest) = target.strip_prefix(REPOSITORY) {
            let path = rest
                .strip_prefix("blob/main/")
                .or_else(|| rest.strip_prefix("tree/main/"));
            let Some(path) = path else {
                say("not a blob/main or tree/main address");
                continue;
            };
            let (path, anchor) = path.split_once('#').unwrap_or((path, ""));
            let file = workspace().join(path);
            if !file.exists() {
                say("no such file in the repository");
            } else if !anchor.is_empty() {
                let page = std::fs::read_to_string(&file).unwrap_or_default();
                if !heading_anchors(&page).iter().any(|a| a == anchor) {
                    say("no such anchor");
                }
            }
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((path, anchor)) => (path, Some(anchor)),
            None => (target, None),
        };
        let resolved = if path.is_empty() {
            file.to_path_buf()
        } else {
            lexically_normal(&file.parent().expect("a page's folder").join(path))
        };
        if !resolved.exists() {
            say("no such file");
            continue;
        }
        if in_book && !resolved.starts_with(&docs) {
            say("leaves the book (link the repository's address instead)");
            continue;
        }
        let Some(anchor) = anchor else { continue };
        let found = match (book, resolved.strip_prefix(&docs)) {
            (Some(book), Ok(page)) if page.extension().is_some_and(|e| e == "md") => {
                let html = book.join(page.with_extension("html"));
                std::fs::read_to_string(&html)
                    .map(|html| html.contains(&format!("id=\"{anchor}\"")))
                    .unwrap_or(false)
            }
            _ => std::fs::read_to_string(&resolved)
                .map(|page| heading_anchors(&page).iter().any(|a| a == anchor))
                .unwrap_or(false),
        };
        if !found {
            say("no such anchor");
        }
    }
    broken
}

/// `a/b/../c` as `a/c`, without touching the file system.
fn lexically_normal(path: &Path) -> PathBuf {
    let mut normal = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                normal.pop();
            }
            Component::CurDir => {}
            other => normal.push(other),
        }
    }
    normal
}
