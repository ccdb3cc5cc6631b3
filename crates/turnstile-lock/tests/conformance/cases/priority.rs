//! Priority: the queue is served by priority, higher first, then first come first served.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{no_polling, LONG};
use crate::harness::{until_queued, Harness};
use crate::support::grants::{is_taken, joined_within};

pub async fn priority_orders_the_queue_then_first_come_first_served(h: Harness) {
    let locker = h.locker();
    let holder = locker.lock("prio", LONG).acquire().await.expect("holder");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut handles = Vec::new();
    for (owner, priority) in [
        ("low1", 0),
        ("low2", 0),
        ("high1", 5),
        ("mid", 1),
        ("high2", 5),
        ("neg", -2),
    ] {
        let request = locker
            .lock("prio", LONG)
            .owner(owner)
            .priority(priority)
            .retry(no_polling());
        let order = Arc::clone(&order);
        handles.push(tokio::spawn(async move {
            let lock = request.acquire().await.expect("acquire");
            order.lock().unwrap().push(owner);
            lock.release().await.expect("release");
        }));
        until_queued(&h, "prio", owner).await;
    }
    let expected = ["high1", "high2", "mid", "low1", "low2", "neg"];
    assert_eq!(
        locker.snapshot("prio").await.expect("snapshot").waiters,
        expected
    );
    // A try of the highest priority still does not take a place that is not free.
    let eager = locker.lock("prio", LONG).priority(100);
    assert!(is_taken(&eager).await);
    holder.release().await.expect("release");
    for handle in handles {
        joined_within(
            Duration::from_secs(20),
            handle,
            "served by hand-off, not polling",
        )
        .await;
    }
    assert_eq!(*order.lock().unwrap(), expected);
}
