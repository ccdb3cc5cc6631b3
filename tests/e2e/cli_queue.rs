//! `turnstile queue` end to end: the built binary against the fake API server with the
//! controller in-process, on a semaphore (`maxHolders: 2`) with two holders and three
//! waiters.
//!
//! - the table lists both holders (token, holder identity, owner, held-for, expires-in) and
//!   the waiters in grant order, which is the controller's order (`status.position`) and
//!   `creationTimestamp`-then-name — a claim created a second earlier comes first whatever
//!   its name;
//! - `-o wide` adds columns, `-o json` parses with the same order;
//! - a missing lock exits 6 with one `turnstile:` line; a read the API server refuses (403, as
//!   RBAC refuses a verb) exits 1 with one `turnstile:` line naming the refusal;
//! - as a kubectl plugin: the binary run through a symlink named `kubectl-turnstile`, and
//!   `kubectl turnstile queue` with only that symlink's directory on `PATH`;
//! - `turnstile history`: the grants that ended, as a table and as JSON, and under
//!   `turnstile queue -o wide`.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::child::one_line_exit;
use support::output::{succeeded, text};
use support::pods::create_pod;
use support::{position_of, Env};
use turnstile_api::{ClaimPhase, LockClaim};

/// `program ARGS…` with only `KUBECONFIG` pointing at the test's API server.
fn run(env: &Env, program: &Path, args: &[&str], path: Option<&Path>) -> Output {
    let mut command = Command::new(program);
    command
        .args(args)
        .env("KUBECONFIG", &env.kubeconfig)
        .stdin(Stdio::null());
    if let Some(path) = path {
        command.env("PATH", path);
    }
    command.output().expect("run turnstile queue")
}

fn turnstile() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_turnstile"))
}

/// The rows of the table under `title` (`HOLDERS`, `WAITERS (grant order)`), each as
/// `column -> cell`.
fn section(out: &str, title: &str) -> Vec<Vec<(String, String)>> {
    let mut lines = out.lines().skip_while(|line| *line != title).skip(1);
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let header: Vec<&str> = header.split_whitespace().collect();
    lines
        .take_while(|line| !line.is_empty())
        .map(|line| {
            header
                .iter()
                .zip(line.split_whitespace())
                .map(|(column, cell)| ((*column).to_owned(), cell.to_owned()))
                .collect()
        })
        .collect()
}

fn cell<'a>(row: &'a [(String, String)], column: &str) -> &'a str {
    row.iter()
        .find(|(name, _)| name == column)
        .map_or("", |(_, cell)| cell.as_str())
}

/// Whether `text` reads like a short duration of `turnstile queue` (`45s`, `4m59s`).
fn is_short_duration(text: &str) -> bool {
    let digits_then = |part: &str, unit: char| {
        part.strip_suffix(unit)
            .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
    };
    match text.split_once('m') {
        Some((minutes, seconds)) => {
            digits_then(&format!("{minutes}m"), 'm') && digits_then(seconds, 's')
        }
        None => digits_then(text, 's'),
    }
}

/// The waiters' names in `-o json` output, and checks that it parses as documented.
fn json_order(out: &str) -> (Vec<String>, Vec<String>, Value) {
    let value: Value = serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let names = |key: &str| -> Vec<String> {
        value[key]
            .as_array()
            .unwrap_or_else(|| panic!("{key}[] in {value}"))
            .iter()
            .map(|entry| entry["claim"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    (names("holders"), names("waiters"), value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_shows_holders_and_waiters_in_grant_order() {
    let mut env = Env::started().await;
    env.apply_lock("pool", "maxHolders: 2\nleaseDurationSeconds: 300");

    // Two holders: one owned by a Pod, one with its own holder identity.
    let uid = create_pod(&env, "web-0").await;
    env.apply(&format!(
        "apiVersion: turnstile.dev/v1alpha1\nkind: LockClaim\nmetadata:\n  name: h-pod\n  \
         ownerReferences:\n  - apiVersion: v1\n    kind: Pod\n    name: web-0\n    uid: {uid}\n    \
         controller: true\nspec:\n  lockName: pool\n"
    ));
    env.wait_phase("h-pod", ClaimPhase::Held).await;
    env.hold("h-named", "pool", "holderIdentity: worker-7")
        .await;

    // Four waiters, created back to back in the order zulu, bravo, alpha: they queue in that
    // order (arrival), though their names sort the other way; urgent, created last, has a
    // higher priority and comes before them all.
    env.apply_claim("zulu", "pool", "");
    env.apply_claim("bravo", "pool", "");
    env.apply_claim("alpha", "pool", "");
    env.apply_claim("urgent", "pool", "priority: 5");
    for name in ["zulu", "bravo", "alpha", "urgent"] {
        env.wait_claim(name, |claim| position_of(claim).is_some())
            .await;
    }
    // The controller's order, by the positions it reported once they settle.
    let mut by_position = Vec::new();
    for _ in 0..100 {
        let mut waiting: Vec<LockClaim> = Vec::new();
        for name in ["zulu", "bravo", "alpha", "urgent"] {
            waiting.push(env.claim(name).await);
        }
        waiting.sort_by_key(|claim| position_of(claim).unwrap_or(i32::MAX));
        let positions: Vec<_> = waiting.iter().filter_map(position_of).collect();
        by_position = waiting;
        if positions == [1, 2, 3, 4] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let controller_order: Vec<String> = by_position
        .iter()
        .map(|claim| claim.metadata.name.clone().unwrap_or_default())
        .collect();
    let mut fifo = by_position[1..].to_vec();
    fifo.sort_by_key(LockClaim::arrival);
    let fifo_order: Vec<String> = fifo.iter().map(|claim| claim.arrival().1).collect();
    assert_eq!(controller_order[0], "urgent", "higher priority first");
    assert_eq!(
        controller_order[1..],
        fifo_order,
        "the controller grants FIFO within one priority"
    );
    assert_eq!(
        controller_order[1..],
        ["zulu", "bravo", "alpha"],
        "arrival order"
    );

    // From here on nobody but `turnstile queue` talks to the API server, so every request in
    // the fake's log is its own: it must only read.
    env.stop_controller().await;
    let log_start = env.fake.as_ref().map(|fake| fake.request_log().len());
    let namespace = env.namespace.clone();
    let args = ["queue", "pool", "-n", namespace.as_str()];

    // The table.
    let output = run(&env, turnstile(), &args, None);
    assert!(output.status.success(), "{}", text(&output));
    let out = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        out.starts_with(&format!(
            "DistributedLock {namespace}/pool (backend default, maxHolders 2): 2 holding, 4 waiting"
        )),
        "{out}"
    );
    let holders = section(&out, "HOLDERS");
    let claims: Vec<&str> = holders.iter().map(|row| cell(row, "CLAIM")).collect();
    assert_eq!(claims, ["h-pod", "h-named"], "{out}");
    let expected = [
        ("h-pod", "1", "web-0", "Pod/web-0"),
        ("h-named", "2", "worker-7", "-"),
    ];
    for (row, (claim, token, holder, owner)) in holders.iter().zip(expected) {
        assert_eq!(cell(row, "CLAIM"), claim, "{out}");
        assert_eq!(cell(row, "TOKEN"), token, "{out}");
        assert_eq!(cell(row, "HOLDER"), holder, "{out}");
        assert_eq!(cell(row, "OWNER"), owner, "{out}");
        assert!(is_short_duration(cell(row, "HELD-FOR")), "{out}");
        let expires_in = cell(row, "EXPIRES-IN");
        assert!(
            is_short_duration(expires_in) && (expires_in.starts_with('4') || expires_in == "5m0s"),
            "a 300 s lease: {out}"
        );
    }
    let waiters = section(&out, "WAITERS (grant order)");
    let order: Vec<&str> = waiters.iter().map(|row| cell(row, "CLAIM")).collect();
    assert_eq!(order, controller_order, "{out}");
    for (index, row) in waiters.iter().enumerate() {
        assert_eq!(cell(row, "#"), (index + 1).to_string(), "{out}");
        assert_eq!(cell(row, "OWNER"), "-", "{out}");
        assert!(is_short_duration(cell(row, "WAITING-FOR")), "{out}");
    }

    // -o wide: more columns, same rows.
    let wide_args = [&args[..], &["-o", "wide"]].concat();
    let output = run(&env, turnstile(), &wide_args, None);
    assert!(output.status.success(), "{}", text(&output));
    let wide = String::from_utf8_lossy(&output.stdout).into_owned();
    let holders = section(&wide, "HOLDERS");
    assert!(
        cell(&holders[0], "ACQUIRED").ends_with('Z') && cell(&holders[0], "EXPIRES").ends_with('Z'),
        "{wide}"
    );
    let waiters = section(&wide, "WAITERS (grant order)");
    let reported: Vec<&str> = waiters
        .iter()
        .map(|row| cell(row, "STATUS-POSITION"))
        .collect();
    assert_eq!(reported, ["1", "2", "3", "4"], "{wide}");
    assert_eq!(cell(&waiters[0], "REASON"), "Queued", "{wide}");
    for row in &waiters {
        assert!(cell(row, "CREATED").ends_with('Z'), "{wide}");
        assert_ne!(cell(row, "HOLDER"), "", "{wide}");
    }

    // -o json.
    let json_args = [&args[..], &["-o", "json"]].concat();
    let output = run(&env, turnstile(), &json_args, None);
    assert!(output.status.success(), "{}", text(&output));
    let out = String::from_utf8_lossy(&output.stdout).into_owned();
    let (holder_names, waiter_names, value) = json_order(&out);
    assert_eq!(holder_names, ["h-pod", "h-named"]);
    assert_eq!(waiter_names, controller_order);
    assert_eq!(value["lock"], "pool");
    assert_eq!(value["maxHolders"], 2);
    assert_eq!(value["holders"][0]["fencingToken"], 1);
    assert_eq!(value["holders"][0]["owner"], "Pod/web-0");
    assert_eq!(value["holders"][1]["holderIdentity"], "worker-7");
    let expires_in = value["holders"][1]["expiresInSeconds"]
        .as_i64()
        .unwrap_or_default();
    assert!((1..=300).contains(&expires_in), "{out}");
    let positions: Vec<i64> = value["waiters"]
        .as_array()
        .map(|waiters| {
            waiters
                .iter()
                .filter_map(|w| w["position"].as_i64())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(positions, [1, 2, 3, 4]);
    // Every field the README documents, at every level.
    let has = |object: &serde_json::Value, keys: &[&str]| {
        for key in keys {
            assert!(object.get(key).is_some(), "no {key} in {object}");
        }
    };
    has(
        &value,
        &[
            "lock",
            "namespace",
            "backend",
            "maxHolders",
            "holders",
            "waiters",
        ],
    );
    has(
        &value["holders"][0],
        &[
            "claim",
            "fencingToken",
            "holderIdentity",
            "owner",
            "acquiredAt",
            "expiresAt",
            "heldForSeconds",
            "expiresInSeconds",
        ],
    );
    has(
        &value["waiters"][0],
        &[
            "position",
            "claim",
            "holderIdentity",
            "owner",
            "createdAt",
            "waitingForSeconds",
            "reportedPosition",
            "reason",
        ],
    );

    // A lock that does not exist.
    let output = run(
        &env,
        turnstile(),
        &["queue", "nope", "-n", &namespace],
        None,
    );
    assert_eq!(output.status.code(), Some(6), "{}", text(&output));
    let line = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(
        line.starts_with("turnstile: DistributedLock nope does not exist"),
        "{line}"
    );

    // As a kubectl plugin.
    let plugins = tempfile::tempdir().expect("tempdir");
    let plugin = plugins.path().join("kubectl-turnstile");
    std::os::unix::fs::symlink(turnstile(), &plugin).expect("symlink");
    let output = run(&env, &plugin, &json_args, None);
    assert!(output.status.success(), "{}", text(&output));
    let (holders, waiters, _) = json_order(&String::from_utf8_lossy(&output.stdout));
    assert_eq!(
        (holders, waiters),
        (holder_names.clone(), controller_order.clone())
    );

    let kubectl = which("kubectl");
    let plugin_args = [&["turnstile"][..], &json_args].concat();
    let output = run(&env, &kubectl, &plugin_args, Some(plugins.path()));
    assert!(
        output.status.success(),
        "kubectl turnstile: {}",
        text(&output)
    );
    let (holders, waiters, _) = json_order(&String::from_utf8_lossy(&output.stdout));
    assert_eq!((holders, waiters), (holder_names, controller_order));

    // Without -n: the namespace of the kubeconfig's context, as kubectl takes it.
    let scoped = plugins.path().join("kubeconfig");
    std::fs::copy(&env.kubeconfig, &scoped).expect("copy kubeconfig");
    let set = Command::new(&kubectl)
        .arg("--kubeconfig")
        .arg(&scoped)
        .args([
            "config",
            "set-context",
            "--current",
            "--namespace",
            &namespace,
        ])
        .output()
        .expect("kubectl config set-context");
    assert!(set.status.success(), "{}", text(&set));
    let output = Command::new(turnstile())
        .args(["queue", "pool", "-o", "json"])
        .env("KUBECONFIG", &scoped)
        .stdin(Stdio::null())
        .output()
        .expect("run turnstile queue");
    assert!(output.status.success(), "{}", text(&output));
    let (_, _, value) = json_order(&String::from_utf8_lossy(&output.stdout));
    assert_eq!(
        value["namespace"],
        namespace.as_str(),
        "the context's namespace"
    );
    // (The test's own kubeconfig names `default`, where there is no such lock.)
    let elsewhere = run(&env, turnstile(), &["queue", "pool"], None);
    assert_eq!(elsewhere.status.code(), Some(6), "{}", text(&elsewhere));

    if let (Some(fake), Some(start)) = (&env.fake, log_start) {
        let log = fake.request_log();
        assert!(log.len() > start, "the queue commands were logged");
        // Exactly the README's RBAC: `get` on distributedlocks, `list` on lockclaims.
        let used = fake_apiserver::rbac_summary(&log[start..]);
        let only = |verb: &str| std::collections::BTreeSet::from([verb.to_owned()]);
        let readme = std::collections::BTreeMap::from([
            (
                ("turnstile.dev".to_owned(), "distributedlocks".to_owned()),
                only("get"),
            ),
            (
                ("turnstile.dev".to_owned(), "lockclaims".to_owned()),
                only("list"),
            ),
        ]);
        assert_eq!(used, readme, "turnstile queue's requests");
    }
}

/// The absolute path of `program` on the current `PATH`.
fn which(program: &str) -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
        .unwrap_or_else(|| panic!("{program} is not on PATH"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_lists_the_grants_that_ended() {
    let env = Env::started().await;
    env.apply_lock("db", "leaseDurationSeconds: 300");
    for name in ["first", "second", "third"] {
        env.apply_claim(name, "db", "");
    }
    env.wait_phase("first", ClaimPhase::Held).await;
    env.delete_claim("first").await;
    env.wait_phase("second", ClaimPhase::Held).await;
    env.apply_claim("second", "db", "release: true");
    env.wait_phase("third", ClaimPhase::Held).await;

    let json = run(
        &env,
        turnstile(),
        &["history", "db", "-n", &env.namespace, "-o", "json"],
        None,
    );
    assert!(json.status.success(), "{}", text(&json));
    let history: Value = serde_json::from_slice(&json.stdout).expect("JSON");
    let ended: Vec<(&str, i64, &str)> = history
        .as_array()
        .expect("a list")
        .iter()
        .map(|grant| {
            (
                grant["claim"].as_str().unwrap_or_default(),
                grant["fencingToken"].as_i64().unwrap_or_default(),
                grant["reason"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        ended,
        [
            ("first", 1, "ClaimDeleted"),
            ("second", 2, "ReleaseRequested")
        ]
    );

    let table = run(
        &env,
        turnstile(),
        &["history", "db", "-n", &env.namespace],
        None,
    );
    let out = succeeded("turnstile history", &table);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].ends_with("the last 2 grants that ended"), "{out}");
    assert!(lines[1].starts_with("CLAIM"), "{out}");
    assert!(
        lines[2].starts_with("first ") && lines[2].ends_with("ClaimDeleted"),
        "{out}"
    );
    assert!(
        lines[3].starts_with("second ") && lines[3].ends_with("ReleaseRequested"),
        "{out}"
    );
    // `turnstile queue -o wide` lists them too, under the holders and waiters.
    let wide = run(
        &env,
        turnstile(),
        &["queue", "db", "-n", &env.namespace, "-o", "wide"],
        None,
    );
    let wide = succeeded("turnstile queue -o wide", &wide);
    let ended = section(&wide, "ENDED (the last 2 grants, oldest first)");
    let claims: Vec<(&str, &str)> = ended
        .iter()
        .map(|row| (cell(row, "CLAIM"), cell(row, "TOKEN")))
        .collect();
    assert_eq!(claims, [("first", "1"), ("second", "2")], "{wide}");

    let missing = run(
        &env,
        turnstile(),
        &["history", "nope", "-n", &env.namespace],
        None,
    );
    assert_eq!(missing.status.code(), Some(6), "{}", text(&missing));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_read_exits_1_with_one_line() {
    let env = Env::fake_only("it refuses the read on cue").await;
    env.apply_lock("db", "leaseDurationSeconds: 300");
    // As RBAC would refuse `list` on lockclaims: the Role lacks the verb.
    let claims = env.turnstile_path("lockclaims");
    env.server().inject_read_faults(&claims, 1, 403);
    let output = run(
        &env,
        turnstile(),
        &["queue", "db", "-n", &env.namespace],
        None,
    );
    let said = one_line_exit(&output, 1, &text(&output));
    assert!(said.contains("forbidden"), "the refusal is named: {said:?}");
    assert!(output.stdout.is_empty(), "{}", text(&output));
    assert!(
        env.server()
            .request_log()
            .iter()
            .any(|request| request.injected_fault && request.path == claims),
        "the fault was what turnstile met"
    );
}
