//! Flows every lock backend must serve end to end, run on each by its own test binary.

use super::*;

impl Env {
    /// On lock `db` (applied by the caller on `backend`, with a 4 s lease: long enough to see
    /// each holder by polling while kubectl applies the rest, short enough to expire) and a
    /// semaphore `pool` of two made here: claims `a`, `b`, `c` on `db` are served in order
    /// with tokens 1, 2, 3 — `a` not renewed hands on by expiry (`LeaseExpired`), `b` by its
    /// deletion — while `p1` and `p2` hold `pool` together and `p3` waits first in line; the
    /// lock reports `Ready`, and a monitor sees no two holders of `db` and no token going back.
    pub async fn fifo_handover_expiry_and_semaphore(&self, backend: &str) {
        self.apply_lock(
            "pool",
            &format!("backend: {backend}\nmaxHolders: 2\nleaseDurationSeconds: 300"),
        );
        let monitor = HolderMonitor::start(self, "db", 1);
        for name in ["p1", "p2", "p3"] {
            self.apply_claim(name, "pool", "");
        }
        for name in ["a", "b", "c"] {
            self.apply_claim(name, "db", "");
        }
        let a = self.wait_phase("a", ClaimPhase::Held).await;
        assert_eq!(token_of(&a), Some(1));
        let a = self.wait_phase("a", ClaimPhase::Expired).await;
        assert_eq!(reason_of(&a).as_deref(), Some("LeaseExpired"));
        let b = self.wait_phase("b", ClaimPhase::Held).await;
        assert_eq!(token_of(&b), Some(2));
        self.delete_claim("b").await;
        let c = self.wait_phase("c", ClaimPhase::Held).await;
        assert_eq!(token_of(&c), Some(3));

        self.wait_held(&["p1", "p2"]).await;
        self.wait_claim("p3", |c| position_of(c) == Some(1)).await;
        self.wait_ready("db", "True").await;
        monitor.finish().await;
    }
}
