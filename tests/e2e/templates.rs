//! Locks made on first use from a `LockTemplate` (issue 42 item 3), end to end with kubectl:
//! a claim naming a missing lock that a template matches gets it, with the template's spec;
//! a name no template matches waits as before; a template created after the claim still
//! makes its lock; a claim on several locks gets each made; an unused lock goes after its
//! lifetime, and one made again keeps tokens rising.

use crate::support;

use support::{reason_of, token_of, token_on, Env};
use turnstile_api::{ClaimPhase, TEMPLATE_LABEL};

fn template(name: &str, names: &str, unused_after: Option<u32>) -> String {
    let unused = unused_after
        .map(|seconds| format!("  deleteAfterUnusedSeconds: {seconds}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: turnstile.dev/v1alpha1\nkind: LockTemplate\nmetadata:\n  name: {name}\nspec:\n  names: [{names}]\n  lock:\n    leaseDurationSeconds: 300\n    maxHolders: 2\n{unused}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_on_a_missing_lock_a_template_matches_gets_the_lock_with_its_spec() {
    let mut env = Env::started().await;
    env.apply(&template("per-branch", "\"deploy-*\"", Some(3)));

    env.apply_claim("main-1", "deploy-main", "");
    let held = env.wait_phase("main-1", ClaimPhase::Held).await;
    let first_token = token_of(&held).expect("token");
    let lock = env.lock("deploy-main").await;
    assert_eq!(lock.spec.max_holders, 2, "the template's spec");
    assert_eq!(lock.spec.lease_duration_seconds, 300);
    assert_eq!(
        lock.metadata.labels.unwrap_or_default().get(TEMPLATE_LABEL),
        Some(&"per-branch".to_owned())
    );

    // No template makes `migrate`: the claim waits as for any missing lock.
    env.apply_claim("migrates", "migrate", "");
    env.wait_claim("migrates", |claim| {
        reason_of(claim).as_deref() == Some("LockNotFound")
    })
    .await;
    assert!(
        env.locks().get_opt("migrate").await.expect("get").is_none(),
        "never for a name no template matches"
    );

    // A template that comes after the claim makes its lock too.
    env.apply(&template("migrations", "migrate", None));
    env.wait_phase("migrates", ClaimPhase::Held).await;

    // A claim on several locks gets each made.
    env.apply(
        "apiVersion: turnstile.dev/v1alpha1\nkind: LockClaim\nmetadata:\n  name: both\nspec:\n  lockNames: [deploy-a, deploy-b]\n",
    );
    let both = env.wait_phase("both", ClaimPhase::Held).await;
    assert!(token_on(&both, "deploy-a").is_some() && token_on(&both, "deploy-b").is_some());

    // Unused for its lifetime (3 s), the lock goes; a claim on it later gets it made again,
    // with a higher token than any before (the backend key is the same).
    env.delete_claim("main-1").await;
    env.wait_lock_gone("deploy-main").await;
    env.apply_claim("main-2", "deploy-main", "");
    let again = env.wait_phase("main-2", ClaimPhase::Held).await;
    assert!(
        token_of(&again) > Some(first_token),
        "{:?} after {first_token}",
        token_of(&again)
    );
    // A lock its template keeps (no lifetime) stays while unused.
    env.delete_claim("migrates").await;
    env.wait_gone("migrates").await;
    env.wait_lock("migrate", |lock| {
        lock.status
            .as_ref()
            .is_some_and(|status| status.holders.is_empty())
    })
    .await;
    let kept = env.locks().get_opt("migrate").await.expect("get");
    assert!(
        kept.is_some_and(|lock| lock.metadata.deletion_timestamp.is_none()),
        "kept"
    );
    env.stop_controller().await;
}
