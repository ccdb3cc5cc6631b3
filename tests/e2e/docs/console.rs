//! Runs the console examples of one docs page, as a reader would type them, on a fresh real
//! control plane: one `bash` for the page (so `export`s and background jobs carry from one
//! block to the next, as in a terminal), in a scratch folder where `examples/` is the
//! repository's, with the built `turnstile` on `PATH`. Each command's output (stdout and
//! stderr) must match what the page shows after it ([`output_matches`]: times, ages and
//! padding aside; `...` for lines left out). A command that exits non-zero must show
//! `[exit N]` as its last line. A read-only command (`kubectl get`, `turnstile queue`,
//! `turnstile history`) is asked again for up to 20 s until it shows what the page shows,
//! since the controller's writes land a moment after the command before it returns.
//!
//! A page's HTML comments set it up, unseen by readers:
//! - `<!-- docs-test: controller -->`: the CRDs are applied and `turnstile run` is started
//!   (stopped by PID at the end) before the page's first block;
//! - `<!-- docs-test: run by tests/FILE.rs -->` on the line before a block: that test runs the
//!   block instead (it needs what a scratch shell lacks); the file must read the block.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::support::docs::{console_blocks, output_matches, workspace};
use crate::support::plane;

const CONTROLLER: &str = "<!-- docs-test: controller -->";
const RUN_BY: &str = "<!-- docs-test: run by ";
const DONE: &str = "@@docs-test-done ";
const STEP_TIMEOUT: Duration = Duration::from_secs(90);
const SETTLE: Duration = Duration::from_secs(20);

/// Runs the console blocks of `page` (a path from the repository's root); the number of
/// commands run, or None where the real control plane is not built (outside CI; under CI
/// that fails).
pub async fn run_page(page: &str) -> Option<usize> {
    let text = std::fs::read_to_string(workspace().join(page)).expect("read the page");
    let blocks = console_blocks(&text);
    let lines: Vec<&str> = text.lines().collect();
    let plane = plane::own_plane().await?;
    let kubeconfig = plane.kubeconfig().to_path_buf();
    let scratch = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink(
        workspace().join("examples"),
        scratch.path().join("examples"),
    )
    .expect("link examples/");
    let turnstile = Path::new(env!("CARGO_BIN_EXE_turnstile"));
    let bin = turnstile.parent().expect("the binary's folder");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );

    let _controller = text
        .contains(CONTROLLER)
        .then(|| start_controller(turnstile, &kubeconfig, scratch.path()));

    let mut shell = Shell::start(scratch.path(), &kubeconfig, &path);
    let mut ran = 0;
    for block in &blocks {
        let before = lines[..block.line - 1]
            .iter()
            .rev()
            .find(|line| !line.trim().is_empty())
            .copied()
            .unwrap_or_default();
        if let Some(rest) = before.strip_prefix(RUN_BY) {
            let file = rest.trim_end_matches("-->").trim();
            let source = std::fs::read_to_string(workspace().join(file))
                .unwrap_or_else(|error| panic!("{page}:{}: {file}: {error}", block.line));
            let name = Path::new(page).file_name().expect("a file name");
            assert!(
                source.contains("console_blocks(") && source.contains(&*name.to_string_lossy()),
                "{page}:{}: {file} does not read this page's console blocks",
                block.line
            );
            continue;
        }
        for step in &block.steps {
            let read_only = ["kubectl get", "turnstile queue", "turnstile history"]
                .iter()
                .any(|prefix| step.command.starts_with(prefix));
            let settle_until = Instant::now() + SETTLE;
            loop {
                let printed = shell.run(&step.command).await;
                match output_matches(&step.expected, &printed) {
                    Ok(()) => break,
                    Err(_) if read_only && Instant::now() < settle_until => {
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                    Err(diff) => {
                        let log = std::fs::read_to_string(scratch.path().join("controller.log"))
                            .unwrap_or_default();
                        let tail: Vec<&str> = log.lines().rev().take(30).collect();
                        panic!(
                            "{page}:{}: `{}` printed something else than the page shows\n{diff}\n\
                             controller log (last lines, newest first):\n{}",
                            block.line,
                            step.command,
                            tail.join("\n")
                        );
                    }
                }
            }
            ran += 1;
        }
    }
    shell.finish().await;
    drop(plane);
    Some(ran)
}

/// The CRDs applied and `turnstile run` started, its log in `controller.log` of `dir`; killed
/// when dropped.
fn start_controller(turnstile: &Path, kubeconfig: &Path, dir: &Path) -> Child {
    let crds = std::process::Command::new(turnstile)
        .arg("crds")
        .output()
        .expect("turnstile crds");
    let applied = test_servers::output_with_stdin(
        std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["apply", "--server-side", "-f", "-"]),
        &String::from_utf8_lossy(&crds.stdout),
    )
    .expect("kubectl apply the CRDs");
    assert!(applied.status.success(), "apply the CRDs: {applied:?}");
    let log = std::fs::File::create(dir.join("controller.log")).expect("controller.log");
    Command::new(turnstile)
        .arg("run")
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("start turnstile run")
}

/// One `bash` reading commands from a pipe, in its own process group (so its background jobs
/// end with it).
struct Shell {
    child: Child,
    input: ChildStdin,
    output: tokio::io::Lines<BufReader<ChildStdout>>,
}

impl Shell {
    fn start(dir: &Path, kubeconfig: &Path, path: &str) -> Shell {
        let mut child = Command::new("bash")
            .args(["--noprofile", "--norc"])
            .current_dir(dir)
            .env("KUBECONFIG", kubeconfig)
            .env("PATH", path)
            .env("HOME", dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .expect("start bash");
        let input = child.stdin.take().expect("bash stdin");
        let output = BufReader::new(child.stdout.take().expect("bash stdout")).lines();
        Shell {
            child,
            input,
            output,
        }
    }

    /// Runs `command`; what it printed, with `[exit N]` last if it failed.
    async fn run(&mut self, command: &str) -> String {
        let script =
            format!("exec 2>&1\n{command}\n__status=$?; printf '\\n{DONE}%d\\n' \"$__status\"\n");
        self.input
            .write_all(script.as_bytes())
            .await
            .expect("write to bash");
        let mut printed = String::new();
        let read = async {
            while let Some(line) = self.output.next_line().await.expect("read bash") {
                if let Some(status) = line.strip_prefix(DONE) {
                    if status != "0" {
                        printed.push_str(&format!("[exit {status}]\n"));
                    }
                    return;
                }
                printed.push_str(&line);
                printed.push('\n');
            }
            panic!("bash ended during `{command}`:\n{printed}");
        };
        if tokio::time::timeout(STEP_TIMEOUT, read).await.is_err() {
            panic!("`{command}` did not finish in {STEP_TIMEOUT:?}");
        }
        printed
    }

    /// Ends the background jobs and the shell.
    async fn finish(mut self) {
        self.input
            .write_all(b"kill $(jobs -p) 2>/dev/null; wait; exit 0\n")
            .await
            .expect("write to bash");
        let ended = tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await;
        assert!(ended.is_ok(), "bash did not end");
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        // After a failed step: end the shell's background jobs too (its process group).
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .status();
        }
    }
}
