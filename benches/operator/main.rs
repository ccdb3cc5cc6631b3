//! The operator benchmark: the real `turnstile run` process (memory backend) against the fake
//! API server, driven by plain API clients; prints one Markdown table.
//!
//! `cargo bench -p turnstile --bench operator`. Every latency is also given as a multiple of
//! the API floor measured in the same run: create an object and see it on your own watch.
//! Knobs (environment): `TURNSTILE_BENCH_LOCKS` (default 1000; the scale rows' lock count,
//! 10 claims each), `TURNSTILE_BENCH_DEEP` (default 1000 waiters), `TURNSTILE_BENCH_IDLE_SECONDS`
//! (default 60), `TURNSTILE_BENCH_SAMPLES` (default 50); `TURNSTILE_BENCH_PLANE=real` runs
//! the same table on a real control plane (`scripts/control-plane.sh build`), the floor
//! measured the same way on it. The suite runs the same scenarios
//! with tiny knobs (`tests/e2e/operator_bench.rs`). To see where a grant's time goes,
//! `TURNSTILE_BENCH_CONTROLLER_LOG` sets the controller's `RUST_LOG` and shows its log (with
//! `debug`: every request of every pass, with its time).

// The e2e tests' request tagging, so the fake's log tells the controller's requests apart.
#[path = "../../tests/e2e/support/actor.rs"]
#[allow(dead_code)]
mod actor;
// The e2e tests' set-up of the controller's ServiceAccount on a real plane.
#[path = "../../tests/e2e/support/plane.rs"]
#[allow(dead_code)]
mod plane;
mod run;

use run::{Knobs, Plane, Report};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let knobs = match Knobs::read(|name| std::env::var(name).ok(), Knobs::DEFAULT) {
        Ok(knobs) => knobs,
        Err(message) => {
            eprintln!("operator benchmark: {message}");
            std::process::exit(2);
        }
    };
    let plane = match Plane::read(|name| std::env::var(name).ok()) {
        Ok(plane) => plane,
        Err(message) => {
            eprintln!("operator benchmark: {message}");
            std::process::exit(2);
        }
    };
    let Report {
        rows,
        writes_per_hand_off,
        idle_writes,
        resync_writes,
        api_server,
    } = run::run(knobs, plane).await;
    println!();
    println!(
        "Counts: API writes per deep-queue hand-off {:?} (Events apart: {:?}); idle writes {idle_writes}; re-sync writes {resync_writes}.",
        writes_per_hand_off.objects, writes_per_hand_off.events
    );
    println!(
        "Machine: {} cores; `turnstile run` built with the bench profile; {api_server}.",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    println!();
    println!(
        "| scenario | p50 ms (× floor) | p99 ms (× floor) | max ms (× floor) | samples | notes |"
    );
    println!("|---|---|---|---|---|---|");
    for row in &rows {
        println!("{row}");
    }
}
