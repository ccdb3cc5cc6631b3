//! The operator benchmark (`cargo bench -p turnstile --bench operator`) as part of the suite:
//! its knobs and their defaults as the README gives them, and one run of every scenario with
//! tiny knobs against the real `turnstile run` process and the fake API server, so the
//! benchmark cannot rot between the runs that fill the README's table.

#[path = "../../benches/operator/run.rs"]
mod run;

use std::collections::HashMap;

use run::{Knobs, Plane};

/// Small enough for a debug build in CI, large enough that every row has several samples.
const SMOKE: Knobs = Knobs {
    samples: 3,
    deep: 20,
    locks: 10,
    idle_seconds: 1,
};

#[test]
fn the_plane_knob_is_fake_by_default_real_on_request_and_a_bad_value_is_named() {
    let plane = |value: Option<&str>| Plane::read(|_| value.map(str::to_owned));
    assert_eq!(plane(None), Ok(Plane::Fake));
    assert_eq!(plane(Some("fake")), Ok(Plane::Fake));
    assert_eq!(plane(Some("real")), Ok(Plane::Real));
    let error = plane(Some("kind")).expect_err("an unknown plane");
    assert!(
        error.contains("TURNSTILE_BENCH_PLANE") && error.contains("kind"),
        "{error}"
    );
}

#[test]
fn the_knobs_default_to_the_documented_sizes_and_a_bad_value_is_named() {
    let defaults = Knobs::read(|_| None, Knobs::DEFAULT).expect("no knob set");
    assert_eq!(
        defaults,
        Knobs {
            samples: 50,
            deep: 1000,
            locks: 1000,
            idle_seconds: 60
        }
    );
    let readme = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/src/development/scale.md"
    ))
    .expect("docs/src/development/scale.md");
    let readme = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    for (knob, default) in [
        ("TURNSTILE_BENCH_LOCKS", "1000"),
        ("TURNSTILE_BENCH_DEEP", "1000"),
        ("TURNSTILE_BENCH_SAMPLES", "50"),
        ("TURNSTILE_BENCH_IDLE_SECONDS", "60"),
    ] {
        let said = format!("`{knob}` ({default}");
        let said_default = format!("`{knob}` (default {default}");
        assert!(
            readme.contains(&said) || readme.contains(&said_default),
            "the scale page gives {knob} a default other than {default}"
        );
    }

    let set: HashMap<&str, &str> = [
        ("TURNSTILE_BENCH_LOCKS", "7"),
        ("TURNSTILE_BENCH_DEEP", " 30"),
    ]
    .into_iter()
    .collect();
    let knobs = Knobs::read(|name| set.get(name).map(|v| v.to_string()), Knobs::DEFAULT)
        .expect("whole numbers");
    assert_eq!((knobs.locks, knobs.deep, knobs.samples), (7, 30, 50));

    let error = Knobs::read(
        |name| (name == "TURNSTILE_BENCH_LOCKS").then(|| "ten".to_string()),
        Knobs::DEFAULT,
    )
    .expect_err("not a number");
    assert!(
        error.contains("TURNSTILE_BENCH_LOCKS") && error.contains("ten"),
        "{error}"
    );
}

/// A row's cells, without the leading and trailing `|`.
fn cells(row: &str) -> Vec<&str> {
    let inner = row.trim().trim_start_matches('|').trim_end_matches('|');
    inner.split('|').map(str::trim).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_with_tiny_knobs_measures_every_scenario_at_the_sizes_asked_for() {
    every_scenario_at_the_sizes_asked_for(Plane::Fake).await;
}

/// The same run on a real control plane (`TURNSTILE_BENCH_PLANE=real`): the same rows, the
/// writes counted in the kube-apiserver's audit log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_plane_mode_measures_the_same_table() {
    if let Err(error) = test_servers::control_plane_binaries() {
        test_servers::skip_or_fail(
            "the_real_plane_mode_measures_the_same_table",
            &error.to_string(),
            test_servers::under_ci(),
        );
        return;
    }
    every_scenario_at_the_sizes_asked_for(Plane::Real).await;
}

async fn every_scenario_at_the_sizes_asked_for(plane: Plane) {
    let report = run::run(SMOKE, plane).await;
    let named = match plane {
        Plane::Fake => "fake API server",
        Plane::Real => "real control plane",
    };
    assert!(report.api_server.contains(named), "{}", report.api_server);
    let scenarios: Vec<String> = report
        .rows
        .iter()
        .map(|row| cells(row)[0].to_string())
        .collect();
    let expected = [
        "API floor: create → seen on own watch".to_string(),
        "a grant's requests in a row, no controller: create → seen → patch → patch → seen".into(),
        "claim create → `Held`, idle lock".into(),
        "claim created with the finalizer → `Held`, idle lock".into(),
        "claim on 3 locks create → `Held`, idle locks".into(),
        "release (claim deleted) → next `Held`".into(),
        "hand-off, one lock, 20 waiters".into(),
        "Pod-owned claim create → `Held`".into(),
        "gated Job create → unsuspended".into(),
        "gated Pod create → gate removed".into(),
        "10 locks × 10 claims: created / every lock held / every claim has a status".into(),
        "hand-off wave: 10 holders released at once → each next `Held`".into(),
        "the wave's write floor: 2 plain writes per lock × 10, 16 locks at a time".into(),
        "scale: controller API requests per grant, by verb".into(),
        // The benchmark's own count: 10 × 10 at scale, the deep queue, twice the samples.
        "controller RSS with 126 claims cached".into(),
        "idle: controller writes in 1 s".into(),
        "restart: until ready / writes during the re-sync".into(),
    ];
    let (teardown, scenarios) = scenarios.split_last().expect("rows");
    assert_eq!(scenarios, expected);
    // Last, the namespace torn down: one write per object, its finalizer's removal.
    assert!(
        teardown.starts_with("namespace teardown: ")
            && teardown.ends_with(", the controller running"),
        "{teardown}"
    );
    let teardown_row = report.rows.last().expect("the teardown row");
    assert!(
        teardown_row.contains("statuses 0, Events 0"),
        "{teardown_row}"
    );

    // Every latency row took the samples asked for (the wave: one per lock).
    let latency_rows: Vec<Vec<&str>> = report
        .rows
        .iter()
        .map(|row| cells(row))
        .filter(|cells| !cells[4].is_empty())
        .collect();
    assert_eq!(latency_rows.len(), 11, "{:?}", report.rows);
    for cells in latency_rows {
        let want = if cells[0].starts_with("hand-off wave") {
            // Where the machine's CPU went during the wave, from /proc.
            assert!(
                cells[5].contains("CPU busy") && cells[5].contains("controller"),
                "{cells:?}"
            );
            "10"
        } else {
            "3"
        };
        assert_eq!(cells[4], want, "{cells:?}");
    }
    // The new holder's status, the lock's status, the old holder's finalizer; `Released`
    // and `Acquired` apart.
    let hand_offs = &report.writes_per_hand_off;
    assert_eq!(hand_offs.objects, [3, 3, 3], "object writes per hand-off");
    assert!(
        hand_offs.events.len() == 3 && hand_offs.events.iter().all(|&events| events <= 2),
        "Events per hand-off: {:?}",
        hand_offs.events
    );
    assert_eq!(report.idle_writes, 0, "the controller wrote while idle");
    assert_eq!(
        report.resync_writes, 0,
        "the controller wrote during the re-sync"
    );
}
