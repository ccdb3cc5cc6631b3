//! What a claim's current state means to someone waiting for it (pure, no I/O).

use turnstile_api::reasons;
use turnstile_api::{ClaimPhase, LockClaim};

/// What the waiter should do about a claim as it is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Granted: the holder may go ahead, fenced by this token.
    Held {
        /// `status.fencingToken`.
        fencing_token: u64,
    },
    /// Not granted yet (queued, not yet seen by the controller, or Held without a token
    /// recorded yet): keep waiting.
    Waiting,
    /// The controller reports the claim's DistributedLock missing (`LockNotFound`). The lock
    /// may have been created since; check before giving up.
    LockMissing,
    /// The claim reached a terminal phase without being (still) held: it never will be.
    Ended {
        /// `Failed`, `Expired` or `Released`.
        phase: ClaimPhase,
    },
    /// The claim is being deleted.
    Deleting,
}

/// Judges `claim` as it is now.
pub fn assess(claim: &LockClaim) -> Verdict {
    if claim.metadata.deletion_timestamp.is_some() {
        return Verdict::Deleting;
    }
    let status = claim.status.clone().unwrap_or_default();
    match status.phase.unwrap_or_default() {
        ClaimPhase::Held => match status.fencing_token.and_then(|t| u64::try_from(t).ok()) {
            Some(fencing_token) => Verdict::Held { fencing_token },
            None => Verdict::Waiting,
        },
        ClaimPhase::Pending if status.reason.as_deref() == Some(reasons::LOCK_NOT_FOUND) => {
            Verdict::LockMissing
        }
        ClaimPhase::Pending => Verdict::Waiting,
        phase @ (ClaimPhase::Released | ClaimPhase::Expired | ClaimPhase::Failed) => {
            Verdict::Ended { phase }
        }
    }
}

/// One line describing where the claim stands, e.g. `Pending, position 3 (Queued: waiting
/// behind job-a)`.
pub fn describe(claim: &LockClaim) -> String {
    let status = claim.status.clone().unwrap_or_default();
    let Some(phase) = status.phase else {
        return "not yet seen by the controller (no status)".to_owned();
    };
    let mut line = phase.to_string();
    if let (ClaimPhase::Pending, Some(position)) = (phase, status.position) {
        line.push_str(&format!(", position {position}"));
    }
    match (status.reason, status.message) {
        (Some(reason), Some(message)) => line.push_str(&format!(" ({reason}: {message})")),
        (Some(text), None) | (None, Some(text)) => line.push_str(&format!(" ({text})")),
        (None, None) => {}
    }
    line
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use turnstile_api::{LockClaimSpec, LockClaimStatus};

    fn claim(status: Option<LockClaimStatus>) -> LockClaim {
        let mut claim = LockClaim::new("c", LockClaimSpec::for_lock("db"));
        claim.status = status;
        claim
    }

    fn status(phase: ClaimPhase) -> LockClaimStatus {
        LockClaimStatus {
            phase: Some(phase),
            ..LockClaimStatus::default()
        }
    }

    #[test]
    fn held_with_a_token_is_granted_and_without_one_is_not_yet() {
        let held = LockClaimStatus {
            fencing_token: Some(42),
            ..status(ClaimPhase::Held)
        };
        assert_eq!(
            assess(&claim(Some(held))),
            Verdict::Held { fencing_token: 42 }
        );
        assert_eq!(
            assess(&claim(Some(status(ClaimPhase::Held)))),
            Verdict::Waiting
        );
    }

    #[test]
    fn pending_and_statusless_claims_wait_unless_the_lock_is_missing() {
        assert_eq!(assess(&claim(None)), Verdict::Waiting);
        assert_eq!(
            assess(&claim(Some(status(ClaimPhase::Pending)))),
            Verdict::Waiting
        );
        let missing = LockClaimStatus {
            reason: Some(reasons::LOCK_NOT_FOUND.into()),
            ..status(ClaimPhase::Pending)
        };
        assert_eq!(assess(&claim(Some(missing))), Verdict::LockMissing);
    }

    #[test]
    fn terminal_phases_end_the_wait_even_with_a_token() {
        for phase in [
            ClaimPhase::Failed,
            ClaimPhase::Expired,
            ClaimPhase::Released,
        ] {
            let ended = LockClaimStatus {
                fencing_token: Some(7),
                ..status(phase)
            };
            assert_eq!(assess(&claim(Some(ended))), Verdict::Ended { phase });
        }
    }

    #[test]
    fn a_claim_being_deleted_is_never_granted() {
        let mut deleting = claim(Some(LockClaimStatus {
            fencing_token: Some(3),
            ..status(ClaimPhase::Held)
        }));
        deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        assert_eq!(assess(&deleting), Verdict::Deleting);
    }

    #[test]
    fn descriptions_name_phase_position_and_reason() {
        assert_eq!(
            describe(&claim(None)),
            "not yet seen by the controller (no status)"
        );
        let queued = LockClaimStatus {
            position: Some(3),
            reason: Some("Queued".into()),
            message: Some("waiting behind job-a".into()),
            ..status(ClaimPhase::Pending)
        };
        assert_eq!(
            describe(&claim(Some(queued))),
            "Pending, position 3 (Queued: waiting behind job-a)"
        );
        let failed = LockClaimStatus {
            reason: Some("AcquireTimeout".into()),
            ..status(ClaimPhase::Failed)
        };
        assert_eq!(describe(&claim(Some(failed))), "Failed (AcquireTimeout)");
    }
}
