//! A token bucket shared by a controller's tasks: how many optional API writes (Normal Events,
//! position refreshes) it makes a second, so that under load the writes that matter (grants,
//! releases) go first.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// How many seconds' worth of tokens a bucket holds: the burst it allows after a quiet spell.
pub const BURST_SECONDS: u32 = 5;

/// `per_second` tokens a second, holding at most [`BURST_SECONDS`] seconds' worth; zero
/// tokens a second means no limit. Cloning shares the bucket.
#[derive(Debug, Clone)]
pub struct WriteBudget {
    bucket: Option<Arc<Mutex<Bucket>>>,
}

#[derive(Debug)]
struct Bucket {
    per_second: f64,
    capacity: f64,
    tokens: f64,
    refilled: Instant,
}

impl Bucket {
    fn refill(&mut self, now: Instant) {
        let earned = now.duration_since(self.refilled).as_secs_f64() * self.per_second;
        self.tokens = (self.tokens + earned).min(self.capacity);
        self.refilled = now;
    }
}

impl WriteBudget {
    /// A full bucket of `per_second` tokens a second (0: unlimited).
    pub fn new(per_second: u32) -> Self {
        let bucket = (per_second > 0).then(|| {
            let per_second = f64::from(per_second);
            let capacity = per_second * f64::from(BURST_SECONDS);
            Arc::new(Mutex::new(Bucket {
                per_second,
                capacity,
                tokens: capacity,
                refilled: Instant::now(),
            }))
        });
        Self { bucket }
    }

    /// A budget without a limit.
    pub fn unlimited() -> Self {
        Self { bucket: None }
    }

    fn lock(bucket: &Mutex<Bucket>) -> MutexGuard<'_, Bucket> {
        // A poisoned lock only means another task panicked mid-update: the numbers still do.
        bucket
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes a token if there is one at `now`.
    pub fn try_take_at(&self, now: Instant) -> bool {
        let Some(bucket) = &self.bucket else {
            return true;
        };
        let mut bucket = Self::lock(bucket);
        bucket.refill(now);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Takes a token if there is one now.
    pub fn try_take(&self) -> bool {
        self.try_take_at(Instant::now())
    }

    /// Whether a token is there now, without taking it (for a decision made before it is
    /// known whether the token is needed: [`WriteBudget::spend`] takes it afterwards).
    pub fn has_token(&self) -> bool {
        let Some(bucket) = &self.bucket else {
            return true;
        };
        let mut bucket = Self::lock(bucket);
        bucket.refill(Instant::now());
        bucket.tokens >= 1.0
    }

    /// Takes a token after the fact; the bucket may go below zero (several passes saw the
    /// same token), which later refills pay back.
    pub fn spend(&self) {
        if let Some(bucket) = &self.bucket {
            Self::lock(bucket).tokens -= 1.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_burst_then_the_rate_and_never_more_than_a_burst_saved_up() {
        let start = Instant::now();
        let budget = WriteBudget::new(2);
        let burst = (0..100).filter(|_| budget.try_take_at(start)).count();
        assert_eq!(burst, 10, "five seconds' worth at once");
        assert!(!budget.try_take_at(start + Duration::from_millis(100)));
        assert!(
            budget.try_take_at(start + Duration::from_millis(600)),
            "one earned"
        );
        let later = start + Duration::from_secs(3600);
        let refilled = (0..100).filter(|_| budget.try_take_at(later)).count();
        assert_eq!(refilled, 10, "never more than a burst saved up");
    }

    #[test]
    fn spending_after_the_fact_can_overdraw_and_unlimited_never_runs_out() {
        let budget = WriteBudget::new(1);
        for _ in 0..5 {
            assert!(budget.has_token());
            budget.spend();
        }
        assert!(!budget.has_token(), "five spent of a burst of five");
        budget.spend();
        assert!(!budget.try_take(), "overdrawn");
        let unlimited = WriteBudget::unlimited();
        assert!((0..1000).all(|_| unlimited.try_take()));
    }
}
