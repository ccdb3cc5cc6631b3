//! [`HolderMonitor`]: the safety invariants sampled while a test runs.

use super::*;

/// Samples a lock's claims (those naming it among several too) in the background and counts
/// violations of the safety invariants: more than `max_holders` claims `Held` at once, and a newly seen holder whose
/// fencing token is not above every token seen before.
pub struct HolderMonitor {
    stop: oneshot::Sender<()>,
    task: JoinHandle<MonitorReport>,
    /// The tokens of the holders seen so far, as they are seen.
    seen_tokens: std::sync::Arc<std::sync::Mutex<Vec<i64>>>,
}

/// What a [`HolderMonitor`] saw.
#[derive(Debug, Default, Clone)]
pub struct MonitorReport {
    /// Samples taken.
    pub samples: usize,
    /// Samples with more than `max_holders` holders.
    pub over_capacity: usize,
    /// New holders whose token was not above the highest token seen before.
    pub token_regressions: usize,
    /// Holders in the order first seen: (claim, token).
    pub grants: Vec<(String, i64)>,
}

impl MonitorReport {
    /// The holders' tokens, in the order the holders were first seen.
    pub fn tokens(&self) -> Vec<i64> {
        self.grants.iter().map(|(_, token)| *token).collect()
    }
}

impl HolderMonitor {
    /// Starts sampling the claims of `lock` in `env`'s namespace every 20 ms.
    pub fn start(env: &Env, lock: &str, max_holders: usize) -> Self {
        let claims = env.claims();
        let lock = lock.to_owned();
        let (stop, mut stopped) = oneshot::channel::<()>();
        let seen_tokens = std::sync::Arc::<std::sync::Mutex<Vec<i64>>>::default();
        let tokens = seen_tokens.clone();
        let task = tokio::spawn(async move {
            let mut report = MonitorReport::default();
            let mut seen = std::collections::HashSet::new();
            let mut highest = 0i64;
            let mut stopping = false;
            loop {
                if let Ok(list) = claims.list(&Default::default()).await {
                    report.samples += 1;
                    let mut holders: Vec<(String, i64)> = list
                        .items
                        .iter()
                        .filter(|claim| claim.spec.locks().contains(&lock.as_str()))
                        .filter(|claim| phase_of(claim) == Some(ClaimPhase::Held))
                        .map(|claim| {
                            (
                                claim.metadata.uid.clone().unwrap_or_default(),
                                token_on(claim, &lock).unwrap_or_default(),
                            )
                        })
                        .collect();
                    if holders.len() > max_holders {
                        report.over_capacity += 1;
                    }
                    holders.sort_by_key(|(_, token)| *token);
                    for (uid, token) in holders {
                        if seen.insert(uid.clone()) {
                            if token <= highest {
                                report.token_regressions += 1;
                            }
                            highest = highest.max(token);
                            report.grants.push((uid, token));
                            tokens.lock().unwrap_or_else(|p| p.into_inner()).push(token);
                        }
                    }
                }
                if stopping {
                    break;
                }
                // After the stop request one more sample is taken: the state the test saw.
                tokio::select! {
                    _ = &mut stopped => stopping = true,
                    () = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
            }
            report
        });
        Self {
            stop,
            task,
            seen_tokens,
        }
    }

    /// Waits until a sample has shown a holder with `token`: a test that ends a grant soon
    /// after it is made waits for this first, or the 20 ms sampling may never see it.
    pub async fn wait_seen(&self, token: i64) {
        let deadline = Instant::now() + WAIT;
        loop {
            let seen = self
                .seen_tokens
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&token);
            if seen {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the monitor never saw a holder with token {token}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stops sampling and returns the report, asserting no violation was seen.
    pub async fn finish(self) -> MonitorReport {
        let _ = self.stop.send(());
        let report = self.task.await.expect("monitor");
        assert!(report.samples > 0, "the monitor took no samples");
        assert_eq!(
            report.over_capacity, 0,
            "more holders than allowed: {report:?}"
        );
        assert_eq!(
            report.token_regressions, 0,
            "tokens went backwards: {report:?}"
        );
        report
    }
}
