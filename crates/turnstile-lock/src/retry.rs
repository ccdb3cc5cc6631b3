//! How long and how often [`LockRequest::acquire`](crate::LockRequest::acquire) waits.
//!
//! Waiting is push-driven: a release wakes the waiter whose turn it is at once. The retry
//! policy only bounds the wait and sets the *safety-net* polling delay used when no wake-up
//! comes (a holder crashed and its lease must run out, or a message was lost). Every backend
//! call counts as an attempt, whether a wake-up or the delay triggered it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// What a custom delay function sees before each retry.
#[derive(Debug, Clone, Copy)]
pub struct RetryContext {
    /// Attempts already made (starts at 0 for the decision after the first attempt).
    pub attempt: u32,
    /// When the acquire started.
    pub started_at: Instant,
    /// The delay returned for the previous retry, if any.
    pub previous_delay: Option<Duration>,
}

/// A custom delay function's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDecision {
    /// Retry at the latest after this long (a wake-up can come sooner).
    RetryAfter(Duration),
    /// Give up after the attempt in hand (locco's `stop()`).
    Stop,
}

type DelayFn = Arc<dyn Fn(&RetryContext) -> RetryDecision + Send + Sync>;

/// Retry settings of an acquire.
///
/// Defaults ([`RetryPolicy::default`]): wait up to **30 s** in total (`total_time`), with no
/// limit on the number of attempts, polling every **500 ms** as the safety net between
/// wake-ups, and no hard `fail_after`.
#[derive(Clone)]
pub struct RetryPolicy {
    pub(crate) retry_times: Option<u32>,
    pub(crate) retry_delay: Duration,
    pub(crate) total_time: Option<Duration>,
    pub(crate) fail_after: Option<Duration>,
    pub(crate) delay_fn: Option<DelayFn>,
}

impl fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("retry_times", &self.retry_times)
            .field("retry_delay", &self.retry_delay)
            .field("total_time", &self.total_time)
            .field("fail_after", &self.fail_after)
            .field("delay_fn", &self.delay_fn.as_ref().map(|_| "custom"))
            .finish()
    }
}

/// The default safety-net polling delay.
pub const DEFAULT_RETRY_DELAY: Duration = Duration::from_millis(500);
/// The default bound on the whole wait.
pub const DEFAULT_TOTAL_TIME: Duration = Duration::from_secs(30);

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            retry_times: None,
            retry_delay: DEFAULT_RETRY_DELAY,
            total_time: Some(DEFAULT_TOTAL_TIME),
            fail_after: None,
            delay_fn: None,
        }
    }
}

impl RetryPolicy {
    /// The defaults (see the type docs).
    pub fn new() -> Self {
        Self::default()
    }

    /// Wait without any bound (still polling at the retry delay as the safety net).
    pub fn forever() -> Self {
        RetryPolicy {
            total_time: None,
            ..Self::default()
        }
    }

    /// One attempt only: like [`LockRequest::try_acquire`](crate::LockRequest::try_acquire)
    /// but reported as [`LockError::Timeout`](crate::LockError::Timeout).
    pub fn no_retry() -> Self {
        Self::default().retry_times(0)
    }

    /// At most `times` retries after the first attempt (`retryTimes`).
    pub fn retry_times(mut self, times: u32) -> Self {
        self.retry_times = Some(times);
        self
    }

    /// The longest pause between attempts when no wake-up arrives (`retryDelay`). It is also
    /// how often a waiter proves it is alive to the backend's queue. Clamped to at least 1 ms.
    pub fn retry_delay(mut self, delay: Duration) -> Self {
        self.retry_delay = delay.max(Duration::from_millis(1));
        self
    }

    /// No new attempt starts after this much time (`totalTime`); `None` removes the bound.
    /// The last attempt happens at the deadline, so a wake-up right before it still wins.
    pub fn total_time(mut self, total: impl Into<Option<Duration>>) -> Self {
        self.total_time = total.into();
        self
    }

    /// A hard timeout on the whole acquire, cancelling an attempt in flight (`failAfter`).
    /// Whatever that attempt may have won is released.
    pub fn fail_after(mut self, limit: impl Into<Option<Duration>>) -> Self {
        self.fail_after = limit.into();
        self
    }

    /// A custom delay function (`retryDelayFn`), consulted after every unsuccessful attempt;
    /// it replaces `retry_times` and `retry_delay`. `total_time` and `fail_after` still apply.
    pub fn delay_fn(
        mut self,
        delay_fn: impl Fn(&RetryContext) -> RetryDecision + Send + Sync + 'static,
    ) -> Self {
        self.delay_fn = Some(Arc::new(delay_fn));
        self
    }

    /// The hard timeout, if any.
    pub fn fail_after_limit(&self) -> Option<Duration> {
        self.fail_after
    }

    /// Decides, before attempt number `context.attempt`, whether another attempt will follow
    /// it and after which delay at most. `None` means this attempt is the last.
    pub(crate) fn plan(&self, context: &RetryContext, now: Instant) -> Option<Duration> {
        let delay = match &self.delay_fn {
            Some(delay_fn) => match delay_fn(context) {
                RetryDecision::RetryAfter(delay) => delay.max(Duration::from_millis(1)),
                RetryDecision::Stop => return None,
            },
            None => {
                if self
                    .retry_times
                    .is_some_and(|times| context.attempt >= times)
                {
                    return None;
                }
                self.retry_delay
            }
        };
        match self.total_time {
            Some(total) => {
                let deadline = context.started_at + total;
                if now >= deadline {
                    None
                } else {
                    Some(delay.min(deadline - now))
                }
            }
            None => Some(delay),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(attempt: u32, started_at: Instant) -> RetryContext {
        RetryContext {
            attempt,
            started_at,
            previous_delay: None,
        }
    }

    /// What `policy` plans after `attempt` attempts, asked `elapsed` after the first began.
    fn plan_after(policy: &RetryPolicy, attempt: u32, elapsed: Duration) -> Option<Duration> {
        let started = Instant::now();
        policy.plan(&context(attempt, started), started + elapsed)
    }

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    #[tokio::test(start_paused = true)]
    async fn retry_times_counts_retries_after_the_first_attempt() {
        let policy = RetryPolicy::forever().retry_times(2).retry_delay(ms(50));
        let plans = [0, 1, 2].map(|attempt| plan_after(&policy, attempt, Duration::ZERO));
        assert_eq!(plans, [Some(ms(50)), Some(ms(50)), None]);
    }

    #[tokio::test(start_paused = true)]
    async fn total_time_truncates_the_last_delay_and_then_stops() {
        let policy = RetryPolicy::new().total_time(ms(120)).retry_delay(ms(100));
        // The last one asked at the deadline.
        let plans = [(0, 0), (1, 100), (2, 120)]
            .map(|(attempt, elapsed)| plan_after(&policy, attempt, ms(elapsed)));
        assert_eq!(plans, [Some(ms(100)), Some(ms(20)), None]);
    }

    #[tokio::test(start_paused = true)]
    async fn delay_fn_sees_attempts_and_can_stop() {
        let policy = RetryPolicy::forever().delay_fn(|ctx| {
            if ctx.attempt == 4 {
                RetryDecision::Stop
            } else {
                RetryDecision::RetryAfter(ms(u64::from(ctx.attempt + 1) * 50))
            }
        });
        let plans = [3, 4].map(|attempt| plan_after(&policy, attempt, Duration::ZERO));
        assert_eq!(plans, [Some(ms(200)), None]);
    }

    #[tokio::test(start_paused = true)]
    async fn default_is_bounded_and_polls_twice_a_second() {
        let policy = RetryPolicy::default();
        assert_eq!(
            plan_after(&policy, 1000, Duration::ZERO),
            Some(DEFAULT_RETRY_DELAY)
        );
        assert_eq!(plan_after(&policy, 1, DEFAULT_TOTAL_TIME), None);
    }

    #[tokio::test(start_paused = true)]
    async fn forever_never_stops_no_retry_stops_at_once_and_fail_after_is_kept() {
        let day = Duration::from_secs(86_400);
        assert_eq!(
            plan_after(&RetryPolicy::forever(), 1_000_000, day),
            Some(DEFAULT_RETRY_DELAY)
        );
        assert_eq!(
            plan_after(&RetryPolicy::no_retry(), 0, Duration::ZERO),
            None
        );
        assert_eq!(RetryPolicy::new().fail_after_limit(), None);
        let limited = RetryPolicy::new().fail_after(ms(250));
        assert_eq!(limited.fail_after_limit(), Some(ms(250)));
        assert_eq!(limited.fail_after(None).fail_after_limit(), None);
    }

    #[test]
    fn a_policy_shows_its_settings_and_whether_a_function_decides() {
        let shown = format!("{:?}", RetryPolicy::no_retry().fail_after(ms(250)));
        for part in [
            "retry_times: Some(0)",
            "retry_delay: 500ms",
            "total_time: Some(30s)",
            "fail_after: Some(250ms)",
            "delay_fn: None",
        ] {
            assert!(shown.contains(part), "{shown} shows {part}");
        }
        let custom = RetryPolicy::new().delay_fn(|_| RetryDecision::Stop);
        assert!(format!("{custom:?}").contains("delay_fn: Some(\"custom\")"));
    }
}
