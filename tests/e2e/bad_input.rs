//! Bad input, everywhere (issue 13 item 3): a corpus of bad specs applied with the real
//! `kubectl` against the fake API server while the controller runs. Each row is rejected by
//! the schema with a clear message (the text is checked), or accepted and shown as a condition
//! and an Event with a clear reason. After every row a good claim on another lock is still
//! granted (nothing wedged); at the end every accepted claim still exists with a status
//! (nothing lost) and the controller stops cleanly (it never crashed).

use crate::support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use serde_json::{json, Value};
use support::{phase_of, Env};
use turnstile_api::{ClaimPhase, DistributedLock, LockClaim};

/// What a row must lead to.
enum Outcome {
    /// `kubectl apply` fails; its error contains the text.
    Rejected(&'static str),
    /// Accepted; the claim (or lock) named shows the condition `(type, status, reason)` and
    /// gets an Event with the reason.
    Accepted {
        object: Object,
        condition: (&'static str, &'static str, &'static str),
        event: &'static str,
    },
}

/// The object an accepted row is judged by.
enum Object {
    Claim(&'static str),
    Lock(&'static str),
}

/// One corpus row: what it tries, objects applied first (must succeed), the bad input, and
/// what must happen.
struct Row {
    what: &'static str,
    setup: String,
    input: String,
    outcome: Outcome,
}

fn lock(name: &str, spec: &str) -> String {
    format!("apiVersion: turnstile.dev/v1alpha1\nkind: DistributedLock\nmetadata:\n  name: {name}\nspec:\n{spec}\n---\n")
}

fn claim(name: &str, spec: &str) -> String {
    format!("apiVersion: turnstile.dev/v1alpha1\nkind: LockClaim\nmetadata:\n  name: {name}\nspec:\n{spec}\n---\n")
}

fn template(name: &str, spec: &str) -> String {
    format!("apiVersion: turnstile.dev/v1alpha1\nkind: LockTemplate\nmetadata:\n  name: {name}\nspec:\n{spec}\n---\n")
}

fn long(n: usize) -> String {
    "a".repeat(n)
}

const LEASE_MIN: &str = "spec.leaseDurationSeconds in body should be greater than or equal to 1";
const LEASE_MAX: &str = "spec.leaseDurationSeconds in body should be less than or equal to 86400";
const TIMEOUT_MIN: &str = "spec.acquireTimeoutSeconds in body should be greater than or equal to 1";
const HOLDERS_MIN: &str = "spec.maxHolders in body should be greater than or equal to 1";
const NOT_A_TIME: &str = "spec.renewTime in body must be of type date-time";
const NO_NAME: &str = "resource name may not be empty";
const BAD_NAME: &str = "metadata.name: Invalid value";

fn rejected(what: &'static str, input: String, message: &'static str) -> Row {
    Row {
        what,
        setup: String::new(),
        input,
        outcome: Outcome::Rejected(message),
    }
}

fn corpus() -> Vec<Row> {
    let on_good = "  lockName: spare";
    vec![
        rejected(
            "lock lease 0",
            lock("l-lease-0", "  leaseDurationSeconds: 0"),
            LEASE_MIN,
        ),
        rejected(
            "lock lease negative",
            lock("l-lease-neg", "  leaseDurationSeconds: -30"),
            LEASE_MIN,
        ),
        rejected(
            "lock lease over a day",
            lock("l-lease-big", "  leaseDurationSeconds: 86401"),
            LEASE_MAX,
        ),
        rejected(
            "claim lease negative",
            claim(
                "c-lease-neg",
                &format!("{on_good}\n  leaseDurationSeconds: -1"),
            ),
            LEASE_MIN,
        ),
        rejected(
            "claim lease over a day",
            claim(
                "c-lease-big",
                &format!("{on_good}\n  leaseDurationSeconds: 86401"),
            ),
            LEASE_MAX,
        ),
        rejected(
            "claim acquire timeout 0",
            claim(
                "c-timeout-0",
                &format!("{on_good}\n  acquireTimeoutSeconds: 0"),
            ),
            TIMEOUT_MIN,
        ),
        rejected(
            "claim acquire timeout negative",
            claim(
                "c-timeout-neg",
                &format!("{on_good}\n  acquireTimeoutSeconds: -5"),
            ),
            TIMEOUT_MIN,
        ),
        rejected(
            "claim acquire timeout over a year",
            claim(
                "c-timeout-big",
                &format!("{on_good}\n  acquireTimeoutSeconds: 31536001"),
            ),
            "spec.acquireTimeoutSeconds in body should be less than or equal to 31536000",
        ),
        rejected(
            "maxHolders 0",
            lock("l-holders-0", "  maxHolders: 0"),
            HOLDERS_MIN,
        ),
        rejected(
            "maxHolders negative",
            lock("l-holders-neg", "  maxHolders: -1"),
            HOLDERS_MIN,
        ),
        rejected(
            "maxHolders huge",
            lock("l-holders-big", "  maxHolders: 1000000"),
            "spec.maxHolders in body should be less than or equal to 10000",
        ),
        rejected(
            "unknown backend",
            lock("l-consul", "  backend: consul"),
            r#"spec.backend: Unsupported value: "consul": supported values: "memory", "redis", "mongo", "etcd""#,
        ),
        rejected("empty lock name", lock("\"\"", "  maxHolders: 1"), NO_NAME),
        rejected("empty claim name", claim("\"\"", on_good), NO_NAME),
        rejected(
            "10 000-character lock name",
            lock(&long(10_000), "  maxHolders: 1"),
            BAD_NAME,
        ),
        rejected(
            "10 000-character claim name",
            claim(&long(10_000), on_good),
            BAD_NAME,
        ),
        rejected(
            "10 000-character holderIdentity",
            claim(
                "c-ident-long",
                &format!("{on_good}\n  holderIdentity: {}", long(10_000)),
            ),
            "spec.holderIdentity: Too long: may not be more than 253",
        ),
        rejected(
            "10 000-character lockName",
            claim("c-lockname-long", &format!("  lockName: {}", long(10_000))),
            "spec.lockName: Too long: may not be more than 253",
        ),
        rejected(
            "empty lockName",
            claim("c-lockname-empty", "  lockName: \"\""),
            "spec.lockName in body should be at least 1 chars long",
        ),
        rejected(
            "10 000-character key",
            lock("l-key-long", &format!("  key: {}", long(10_000))),
            "spec.key: Too long: may not be more than 253",
        ),
        rejected(
            "renewTime not a time",
            claim(
                "c-renew-word",
                &format!("{on_good}\n  renewTime: yesterday"),
            ),
            NOT_A_TIME,
        ),
        rejected(
            "renewTime out of range",
            claim(
                "c-renew-range",
                &format!("{on_good}\n  renewTime: \"2026-13-45T99:00:00Z\""),
            ),
            NOT_A_TIME,
        ),
        rejected(
            "release not a boolean",
            claim("c-release-maybe", &format!("{on_good}\n  release: maybe")),
            "spec.release in body must be of type boolean",
        ),
        Row {
            what: "changing lockName",
            setup: claim("c-moved", "  lockName: spare"),
            input: claim("c-moved", "  lockName: good"),
            outcome: Outcome::Rejected("lockName is immutable"),
        },
        rejected(
            "neither lockName nor lockNames",
            claim("c-no-lock", "  priority: 1"),
            "set exactly one of lockName and lockNames",
        ),
        rejected(
            "both lockName and lockNames",
            claim("c-both", "  lockName: good\n  lockNames: [good, spare]"),
            "set exactly one of lockName and lockNames",
        ),
        rejected(
            "a template pattern with * inside",
            template("t-star", "  names: [\"a*b\"]\n  lock: {}"),
            "a name pattern may hold * only at its end",
        ),
        rejected(
            "a template naming nothing",
            template("t-empty", "  names: []\n  lock: {}"),
            "spec.names in body should have at least 1 items",
        ),
        rejected(
            "a template's lock spec out of bounds",
            template("t-bounds", "  names: [x]\n  lock:\n    maxHolders: 0"),
            "spec.lock.maxHolders in body should be greater than or equal to 1",
        ),
        rejected(
            "maxOvertakeSeconds on a FIFO lock",
            lock("l-overtake-fifo", "  maxOvertakeSeconds: 30"),
            "maxOvertakeSeconds is for queue: FirstRunnable",
        ),
        rejected(
            "maxOvertakeSeconds 0",
            lock(
                "l-overtake-0",
                "  queue: FirstRunnable\n  maxOvertakeSeconds: 0",
            ),
            "spec.maxOvertakeSeconds in body should be greater than or equal to 1",
        ),
        rejected(
            "an unknown queue order",
            lock("l-lifo", "  queue: Lifo"),
            r#"spec.queue: Unsupported value: "Lifo": supported values: "Fifo", "FirstRunnable""#,
        ),
        rejected(
            "lockNames with one lock",
            claim("c-one-of-many", "  lockNames: [good]"),
            "spec.lockNames in body should have at least 2 items",
        ),
        rejected(
            "lockNames naming a lock twice",
            claim("c-twice", "  lockNames: [good, spare, good]"),
            "lockNames must not name a lock twice",
        ),
        rejected(
            "lockNames of nine locks",
            claim(
                "c-nine",
                "  lockNames: [l1, l2, l3, l4, l5, l6, l7, l8, l9]",
            ),
            "spec.lockNames: Too many: 9: must have at most 8 items",
        ),
        Row {
            what: "changing lockNames",
            setup: claim("c-many-moved", "  lockNames: [x-one, x-two]"),
            input: claim("c-many-moved", "  lockNames: [x-one, x-three]"),
            outcome: Outcome::Rejected("lockNames is immutable"),
        },
        Row {
            what: "switching from lockName to lockNames",
            setup: claim("c-switched", "  lockName: spare"),
            input: claim("c-switched", "  lockNames: [good, spare]"),
            outcome: Outcome::Rejected("a claim cannot switch between lockName and lockNames"),
        },
        Row {
            what: "lockNames whose first lock does not exist",
            setup: lock("present", "  maxHolders: 1"),
            input: claim("c-first-missing", "  lockNames: [present, absent]"),
            outcome: Outcome::Accepted {
                object: Object::Claim("c-first-missing"),
                condition: ("Held", "False", "LockNotFound"),
                event: "LockNotFound",
            },
        },
        Row {
            what: "lockNames whose other lock does not exist",
            setup: lock("present-too", "  maxHolders: 1"),
            input: claim("c-other-missing", "  lockNames: [present-too, zz-absent]"),
            outcome: Outcome::Accepted {
                object: Object::Claim("c-other-missing"),
                condition: ("Held", "False", "LockNotFound"),
                event: "LockNotFound",
            },
        },
        Row {
            what: "release: true at creation",
            setup: String::new(),
            input: claim("c-release-first", "  lockName: good\n  release: true"),
            outcome: Outcome::Accepted {
                object: Object::Claim("c-release-first"),
                condition: ("Held", "False", "Withdrawn"),
                event: "Released",
            },
        },
        Row {
            what: "empty holderIdentity",
            setup: lock("ident", "  maxHolders: 1"),
            input: claim("c-ident-empty", "  lockName: ident\n  holderIdentity: \"\""),
            outcome: Outcome::Accepted {
                object: Object::Claim("c-ident-empty"),
                condition: ("Held", "True", "Acquired"),
                event: "Acquired",
            },
        },
        Row {
            what: "renewTime far in the future",
            setup: lock("future", "  maxHolders: 1"),
            input: claim(
                "c-renew-future",
                "  lockName: future\n  renewTime: \"2999-01-01T00:00:00Z\"",
            ),
            outcome: Outcome::Accepted {
                object: Object::Claim("c-renew-future"),
                condition: ("Held", "True", "Acquired"),
                event: "Acquired",
            },
        },
        Row {
            what: "claim for a lock in another namespace",
            setup: String::new(),
            input: claim("c-elsewhere", "  lockName: elsewhere"),
            outcome: Outcome::Accepted {
                object: Object::Claim("c-elsewhere"),
                condition: ("Held", "False", "LockNotFound"),
                event: "LockNotFound",
            },
        },
        Row {
            what: "claim naming namespace/lock",
            setup: String::new(),
            input: claim("c-ns-slash", "  lockName: other/elsewhere"),
            outcome: Outcome::Accepted {
                object: Object::Claim("c-ns-slash"),
                condition: ("Held", "False", "LockNotFound"),
                event: "LockNotFound",
            },
        },
        Row {
            what: "backend not configured on the controller",
            setup: String::new(),
            input: lock("unconfigured", "  backend: redis"),
            outcome: Outcome::Accepted {
                object: Object::Lock("unconfigured"),
                condition: ("Ready", "False", "BackendNotConfigured"),
                event: "BackendNotConfigured",
            },
        },
        Row {
            what: "MongoDB backend not configured on the controller",
            setup: String::new(),
            input: lock("unconfigured-mongo", "  backend: mongo"),
            outcome: Outcome::Accepted {
                object: Object::Lock("unconfigured-mongo"),
                condition: ("Ready", "False", "BackendNotConfigured"),
                event: "BackendNotConfigured",
            },
        },
        Row {
            what: "claim on a lock whose backend is not configured",
            setup: String::new(),
            input: claim("c-unconfigured", "  lockName: unconfigured"),
            outcome: Outcome::Accepted {
                object: Object::Claim("c-unconfigured"),
                condition: ("Held", "False", "BackendNotConfigured"),
                event: "Queued",
            },
        },
        Row {
            what: "two locks sharing one spec.key",
            setup: format!(
                "{}{}",
                lock("share-a", "  key: shared\n  leaseDurationSeconds: 10"),
                claim("c-share-a", "  lockName: share-a")
            ),
            input: format!(
                "{}{}",
                lock("share-b", "  key: shared"),
                claim("c-share-b", "  lockName: share-b")
            ),
            outcome: Outcome::Accepted {
                object: Object::Claim("c-share-b"),
                condition: ("Held", "False", "LockBusy"),
                event: "Queued",
            },
        },
    ]
}

/// The condition `type_` of the object's status, as `(status, reason)`.
fn condition_of(status: &Value, type_: &str) -> Option<(String, String)> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_owned(),
                c["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
}

async fn status_of(env: &Env, object: &Object) -> Value {
    match object {
        Object::Claim(name) => json!(env.claim(name).await.status),
        Object::Lock(name) => json!(env.lock(name).await.status),
    }
}

/// Applies one row and checks its outcome, then that a fresh claim on `good` is granted.
async fn check_row(env: &Env, index: usize, row: &Row) {
    if !row.setup.is_empty() {
        env.apply(&row.setup);
    }
    let output = env.kubectl_apply_output(&row.input);
    let stderr = String::from_utf8_lossy(&output.stderr);
    match &row.outcome {
        Outcome::Rejected(message) => {
            assert!(
                !output.status.success(),
                "{}: accepted, must be rejected",
                row.what
            );
            assert!(
                stderr.contains(message),
                "{}: rejected without the message {message:?}: {}",
                row.what,
                &stderr[..stderr.len().min(2_000)]
            );
        }
        Outcome::Accepted {
            object,
            condition: (type_, status, reason),
            event,
        } => {
            assert!(output.status.success(), "{}: rejected: {stderr}", row.what);
            let deadline = std::time::Instant::now() + support::WAIT;
            loop {
                let shown = status_of(env, object).await;
                if condition_of(&shown, type_) == Some(((*status).to_owned(), (*reason).to_owned()))
                {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "{}: never showed {type_}={status} ({reason}); status: {shown}",
                    row.what
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let name = match object {
                Object::Claim(name) | Object::Lock(name) => name,
            };
            env.wait_event(name, event).await;
        }
    }
    // Nothing is wedged: a good claim on the good lock is still granted.
    let probe = format!("probe-{index}");
    env.apply_claim(&probe, "good", "");
    env.wait_phase(&probe, ClaimPhase::Held).await;
    env.delete_claim(&probe).await;
    env.wait_gone(&probe).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_input_is_rejected_or_reported_and_nothing_wedges() {
    let mut env = Env::started().await;
    env.apply(&format!(
        "{}{}",
        lock("good", "  leaseDurationSeconds: 300"),
        lock("spare", "  leaseDurationSeconds: 300")
    ));
    // A lock of the same name as the claims' lockName, but in another namespace.
    let other = format!("{}-other", env.namespace);
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": other}})).expect("ns");
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .expect("other namespace");
    let elsewhere: DistributedLock = serde_json::from_value(
        json!({"apiVersion": "turnstile.dev/v1alpha1", "kind": "DistributedLock",
            "metadata": {"name": "elsewhere"}, "spec": {}}),
    )
    .expect("lock");
    Api::<DistributedLock>::namespaced(env.client.clone(), &other)
        .create(&PostParams::default(), &elsewhere)
        .await
        .expect("lock in the other namespace");

    let rows = corpus();
    for (index, row) in rows.iter().enumerate() {
        println!("bad input {index}: {}", row.what);
        check_row(&env, index, row).await;
    }

    // What a user reads: the identity an empty one falls back to, the missing lock named in
    // a Warning Event, the shared key named.
    let ident = env.claim("c-ident-empty").await;
    let shown = ident.status.and_then(|status| status.holder_identity);
    assert_eq!(shown.as_deref(), Some("c-ident-empty"), "the claim's name");
    let held_message = |claim: LockClaim| -> String {
        let status = json!(claim.status);
        status["conditions"]
            .as_array()
            .and_then(|conditions| conditions.iter().find(|c| c["type"] == "Held"))
            .and_then(|held| held["message"].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    for (name, missing) in [
        ("c-elsewhere", "elsewhere"),
        ("c-ns-slash", "other/elsewhere"),
    ] {
        let message = held_message(env.claim(name).await);
        let names_it = format!("DistributedLock {missing} does not exist");
        assert!(message.contains(&names_it), "{name}: {message}");
        let not_found: Vec<_> = env
            .events_about(name)
            .await
            .into_iter()
            .filter(|event| event.reason.as_deref() == Some("LockNotFound"))
            .collect();
        assert_eq!(
            not_found.len(),
            1,
            "{name}: one LockNotFound Event per wait"
        );
        assert_eq!(not_found[0].type_.as_deref(), Some("Warning"), "{name}");
    }
    let busy = held_message(env.claim("c-share-b").await);
    let key = format!("{}/shared", env.namespace);
    assert!(busy.contains(&key), "the busy key named: {busy}");

    // Nothing lost: every claim an accepted row made is still there, with a status.
    for row in &rows {
        if let Outcome::Accepted {
            object: Object::Claim(name),
            ..
        } = row.outcome
        {
            let claim = env.claim(name).await;
            assert!(
                phase_of(&claim).is_some(),
                "{name} lost its status: {claim:?}"
            );
        }
    }
    // The claim behind the shared key is granted once the other lock's holder lets go: at
    // the latest when its backend lease (10 s) would have run out, when the refused grant is
    // retried (the release on another lock does not wake this one).
    env.delete_claim("c-share-a").await;
    env.wait_phase("c-share-b", ClaimPhase::Held).await;
    // Never crashed: the controller stops cleanly.
    env.stop_controller().await;
}
