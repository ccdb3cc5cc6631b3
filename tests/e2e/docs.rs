//! The docs site (`docs/`, an mdBook): it builds, every link in it and in the README resolves,
//! its reference pages are what the schema and `--help` say, the README fits on a screen, and
//! every console example runs as shown on a real control plane.
//!
//! After changing the CRDs or a `--help` text, regenerate the reference pages with
//! `TURNSTILE_BLESS_DOCS=1 cargo test -p turnstile --test e2e docs::`.

mod console;
use crate::support;
mod links;
mod reference;

use std::path::Path;

/// A file of the repository, by its path from the root.
fn read_file(relative: &str) -> String {
    std::fs::read_to_string(workspace().join(relative))
        .unwrap_or_else(|error| panic!("read {relative}: {error}"))
}

use support::docs::{
    console_blocks, docs_page, normalized, output_matches, readme_text, workspace,
};

/// The mdbook built by `scripts/mdbook.sh`, or None after saying why (a failure under CI).
fn mdbook() -> Option<std::path::PathBuf> {
    let output = std::process::Command::new("bash")
        .arg(workspace().join("scripts/mdbook.sh"))
        .arg("bin")
        .output()
        .expect("run scripts/mdbook.sh");
    let path = std::path::PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    if path.is_file() {
        return Some(path);
    }
    test_servers::skip_or_fail(
        "the_book_builds_and_every_link_resolves",
        "mdbook is not built (bash scripts/mdbook.sh build; .ci/install does it)",
        test_servers::under_ci(),
    );
    None
}

/// Writes `generated` to `docs/src/<page>` under `TURNSTILE_BLESS_DOCS`, else asserts the
/// committed page is `generated`.
fn committed_page_is(page: &str, generated: &str) {
    let path = workspace().join("docs/src").join(page);
    if std::env::var_os("TURNSTILE_BLESS_DOCS").is_some() {
        std::fs::write(&path, generated).expect("write the generated page");
    }
    let committed = docs_page(page);
    assert!(
        committed == generated,
        "docs/src/{page} is not what the code says; regenerate it with \
         TURNSTILE_BLESS_DOCS=1 cargo test -p turnstile --test e2e docs::"
    );
}

#[test]
fn the_crd_reference_is_generated_from_the_schema() {
    let page = reference::crd_page();
    for field in [
        "`spec.maxHolders`",
        "`spec.lockNames`",
        "`status.holders[].fencingToken`",
        "`spec.whenBusy`",
    ] {
        assert!(page.contains(field), "the generated page lacks {field}");
    }
    committed_page_is("reference/crds.md", &page);
}

#[test]
fn the_command_line_reference_is_generated_from_help() {
    let page = reference::cli_page(Path::new(env!("CARGO_BIN_EXE_turnstile")));
    for command in ["run", "wait", "lock", "queue", "release", "history", "crds"] {
        assert!(
            page.contains(&format!("## `turnstile {command}`")),
            "the generated page lacks {command}"
        );
    }
    committed_page_is("reference/cli.md", &page);
}

#[test]
fn the_readme_fits_on_a_screen_and_links_into_the_docs() {
    let readme = readme_text();
    let lines = readme.lines().count();
    assert!(lines <= 250, "README.md has {lines} lines; at most 250");
    for page in [
        "docs/src/getting-started.md",
        "docs/src/concepts/locks-and-claims.md",
        "docs/src/how-to/install.md",
        "docs/src/reference/crds.md",
        "CONTRIBUTING.md",
        "ARCHITECTURE.md",
    ] {
        assert!(readme.contains(&format!("]({page}")), "README links {page}");
    }
}

#[test]
fn every_page_is_in_the_summary_and_every_summary_entry_is_a_page() {
    let summary = docs_page("SUMMARY.md");
    let listed: Vec<String> = links::links_in(&summary)
        .into_iter()
        .map(|link| link.target)
        .collect();
    let pages: Vec<String> = docs_pages()
        .into_iter()
        .filter(|page| page != "SUMMARY.md")
        .collect();
    let unlisted: Vec<&String> = pages.iter().filter(|page| !listed.contains(page)).collect();
    let missing: Vec<&String> = listed.iter().filter(|page| !pages.contains(page)).collect();
    assert!(unlisted.is_empty(), "pages not in SUMMARY.md: {unlisted:?}");
    assert!(
        missing.is_empty(),
        "SUMMARY.md lists missing pages: {missing:?}"
    );
}

/// `mdbook build` succeeds without a warning, and every link of the docs, the README,
/// CONTRIBUTING.md and ARCHITECTURE.md resolves: a page or file that exists, a heading the
/// built page has (an anchor), a repository file behind a GitHub address. Offline: addresses
/// of other sites are counted, not fetched.
#[test]
fn the_book_builds_and_every_link_resolves() {
    let Some(mdbook) = mdbook() else { return };
    let out = tempfile::tempdir().expect("tempdir");
    let output = std::process::Command::new(mdbook)
        .arg("build")
        .arg(workspace().join("docs"))
        .arg("--dest-dir")
        .arg(out.path())
        .output()
        .expect("run mdbook");
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "mdbook build failed: {log}");
    assert!(
        !log.contains("WARN") && !log.contains("ERROR"),
        "mdbook build warned: {log}"
    );
    let report = links::check_all(out.path());
    assert!(
        report.checked >= 100,
        "checked only {} links",
        report.checked
    );
    assert!(
        report.broken.is_empty(),
        "{} broken links:\n{}",
        report.broken.len(),
        report.broken.join("\n")
    );
}

/// A link checker that passes everything is worthless: one broken file link, one broken
/// anchor and one missing repository file are each caught.
#[test]
fn the_link_checker_catches_a_missing_page_an_anchor_and_a_repository_file_or_heading() {
    let root = tempfile::tempdir().expect("tempdir");
    let page = root.path().join("page.md");
    std::fs::write(
        &page,
        "# Page\n\n## A heading\n\n[ok](#a-heading) [gone](nowhere.md) [bad](#no-heading) \
         [repo](https://github.com/turnstile-dev/turnstile/blob/main/no/such/file.rs) \
         [fine](https://github.com/turnstile-dev/turnstile/blob/main/Cargo.toml) \
         [anchor](https://github.com/turnstile-dev/turnstile/blob/main/CONTRIBUTING.md#no-such)\n",
    )
    .expect("write page");
    let broken = links::broken_links_of(&page, None);
    assert_eq!(broken.len(), 4, "{broken:#?}");
}

#[test]
fn console_output_matches_on_what_matters() {
    let shown = |text: &str| text.lines().map(str::to_owned).collect::<Vec<_>>();
    // Times, ages and padding differ from run to run.
    assert_eq!(
        normalized("job-a   Held   1   2026-12-01T02:05:00Z   9m57s"),
        "job-a Held 1 <time> <duration>"
    );
    assert!(output_matches(&shown("a   1  3s\n...\nz"), "a 1 10m\nb\nc\nz\n").is_ok());
    // A token, a name or a phase that differs does not match; nor a missing or extra line.
    assert!(output_matches(&shown("job-a Held 1"), "job-a Held 2").is_err());
    assert!(output_matches(&shown("job-a Held 1"), "job-b Held 1").is_err());
    assert!(output_matches(&shown("a\nb"), "a").is_err());
    // A placeholder stands for one word, keeping what follows it.
    assert!(output_matches(&shown("by <you>: why"), "by jane: why").is_ok());
    assert!(output_matches(&shown("by <you>: why"), "by jane why").is_err());
    assert!(output_matches(&shown("by <you>: why"), "by jane doe: why").is_err());
    assert!(output_matches(&shown("a"), "a\nb").is_err());
    // Commands and their output are read from the block.
    let blocks = console_blocks(
        "text\n```console\n$ one \\\n  --flag\nout 1\n\n$ two\n```\n```sh\n$ not this\n```\n",
    );
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0].steps.len(), 2);
    assert_eq!(blocks[0].steps[0].command, "one \\\n  --flag");
    assert_eq!(blocks[0].steps[0].expected, ["out 1"]);
}

/// Every ```` ```console ```` example of the README and the docs, run in order on a fresh real
/// control plane per page, prints what the page shows (see [`console`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_console_example_in_the_docs_runs_as_shown() {
    let pages: Vec<String> = std::iter::once("README.md".to_owned())
        .chain(
            docs_pages()
                .into_iter()
                .map(|page| format!("docs/src/{page}")),
        )
        .filter(|file| !console_blocks(&read_file(file)).is_empty())
        .collect();
    assert!(pages.len() >= 3, "files with console examples: {pages:?}");
    let mut ran = 0;
    for page in &pages {
        match console::run_page(page).await {
            Some(steps) => ran += steps,
            None => return,
        }
    }
    assert!(ran >= 15, "ran {ran} commands");
}

/// Every page of the docs site (`docs/src/**/*.md`), as paths relative to `docs/src`, sorted.
fn docs_pages() -> Vec<String> {
    fn walk(dir: &Path, root: &Path, pages: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("read docs/src") {
            let path = entry.expect("docs entry").path();
            if path.is_dir() {
                walk(&path, root, pages);
            } else if path.extension().is_some_and(|extension| extension == "md") {
                let relative = path.strip_prefix(root).expect("under docs/src");
                pages.push(relative.to_string_lossy().into_owned());
            }
        }
    }
    let root = workspace().join("docs/src");
    let mut pages = Vec::new();
    walk(&root, &root, &mut pages);
    pages.sort();
    pages
}
