//! Backend conformance suite: every behaviour of the lock engine, written once in
//! [`cases`], run against every backend.
//!
//! Adding a backend = a factory in [`harness`] (`async fn NAME() -> Harness`) plus one
//! `conformance_suite!(NAME);` line below.

mod cases;
mod harness;
#[path = "../support/mod.rs"]
mod support;

/// Instantiates every case as a test in module `$backend`, each with a fresh backend from
/// `harness::$backend()`; the cancellation case also checks that its trials cut acquires short
/// on every backend mode across the network.
macro_rules! conformance_suite {
    ($backend:ident) => {
        mod $backend {
            conformance_suite!(@cases $backend,
                invalid_arguments_are_typed_errors,
                mutex_excludes_and_tokens_increase,
                release_is_idempotent_and_never_hits_the_next_holder,
                release_strict_reports_a_lost_lock,
                extend_and_refresh_keep_the_lock_and_fail_once_lost,
                expired_lease_is_lost_even_without_a_successor,
                explicit_owner_reacquire_is_idempotent,
                semaphore_admits_max_holders,
                fencing_floor_raises_and_never_lowers,
                snapshot_shows_holders_waiters_and_counter,
                release_wakes_the_waiter_without_polling,
                handed_over_lease_reaches_the_full_ttl,
                a_vanished_waiter_holds_a_handed_over_lock_no_longer_than_its_heartbeat,
                expiry_frees_the_lock_for_waiters,
                waiters_are_served_first_come_first_served,
                try_acquire_never_jumps_the_queue_and_dead_waiters_age_out,
                one_release_costs_one_waiter_one_attempt,
                releaser_does_not_regrab_its_own_lock,
                run_releases_on_success_error_and_panic,
                dropping_an_unreleased_lock_releases_it,
                retry_policy_bounds_the_wait,
                cancelled_waiter_leaves_the_queue_and_passes_the_turn,
                stress_mutex_counts_zero_violations,
                stress_semaphore_counts_zero_violations,
                stress_with_stalled_holders_counts_zero_violations,
                shared_holders_coexist_up_to_the_limit,
                exclusive_holds_alone,
                a_waiting_exclusive_blocks_later_shared_and_shared_are_admitted_together,
                priority_orders_the_queue_then_first_come_first_served,
                max_hold_ends_a_renewed_grant,
                lock_delay_follows_an_expiry_but_not_a_release,
                lowering_max_holders_revokes_nobody,
                stress_mixed_shared_exclusive_counts_zero_violations,
                exclusive_waiter_is_not_starved_by_a_stream_of_shared_claims,
            );
        }
    };
    (@cases $backend:ident, $($case:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                // A factory may return `Option<Harness>`: `None` skips (no server installed).
                let Some(harness) =
                    Option::<crate::harness::Harness>::from(crate::harness::$backend().await)
                else {
                    return;
                };
                crate::cases::$case(harness).await;
            }
        )+

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn timeouts_and_cancellation_leave_no_ghost_grant() {
            let Some(harness) =
                Option::<crate::harness::Harness>::from(crate::harness::$backend().await)
            else {
                return;
            };
            let cut_short = crate::cases::timeouts_and_cancellation_leave_no_ghost_grant(harness).await;
            // Against a store across the network the trials must really cut acquires short,
            // or they prove nothing there (an in-process acquire may finish before any cut).
            assert!(
                cut_short > 0 || stringify!($backend) == "memory",
                "no acquire was cut short"
            );
        }
    };
}

conformance_suite!(memory);
conformance_suite!(redis);
conformance_suite!(redis_tls);
conformance_suite!(redis_cluster);
conformance_suite!(redis_cluster_tls);
conformance_suite!(redis_sentinel);
conformance_suite!(redis_sentinel_acks);
conformance_suite!(mongo);
conformance_suite!(etcd);
conformance_suite!(etcd_cluster_tls_auth);
