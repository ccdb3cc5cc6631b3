//! Busy policies (`spec.whenBusy`): the claims a newer claim of their group replaces, and the
//! claims that do not queue. Decided from the pass's claims alone, so every pass (and every
//! leader) reaches the same verdict.

use std::collections::HashMap;

use turnstile_api::{BusyPolicy, ClaimPhase, Micros};

use super::model::{ClaimView, LockInput};

/// Why a claim is replaced: the newer claim of its group that replaces it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Replacement {
    /// The newer claim.
    pub by: String,
    /// The claim's group.
    pub group: String,
    /// The newer claim's policy.
    pub policy: BusyPolicy,
}

impl Replacement {
    /// The message of the replaced claim's status.
    pub fn message(&self, held: bool) -> String {
        let what = if held { "cancelled" } else { "replaced" };
        format!(
            "{what} by claim {} of group {} (whenBusy: {:?})",
            self.by, self.group, self.policy
        )
    }
}

/// A claim's arrival, priority aside: replacement goes by which claim is newer.
fn arrival(claim: &ClaimView) -> (Micros, &str) {
    let (_, micros, name) = claim.queue_order();
    (micros, name)
}

/// A claim that can replace or be replaced: live, on one lock, in a group.
fn grouped(claim: &ClaimView) -> Option<&str> {
    let live = !claim.deleting && !claim.phase().is_terminal() && !claim.is_multi_lock();
    claim.spec.group.as_deref().filter(|_| live)
}

/// The claims of `input` a newer live claim of their group replaces, by index: a pending one
/// when a newer claim has `ReplacePending` or `CancelInProgress`, a held one when a newer claim
/// has `CancelInProgress`.
pub(super) fn replacements(input: &LockInput) -> HashMap<usize, Replacement> {
    // The newest replacing and the newest cancelling claim of each group.
    let mut newest: HashMap<&str, [Option<&ClaimView>; 2]> = HashMap::new();
    for claim in &input.claims {
        let (Some(group), Some(policy)) = (grouped(claim), claim.spec.when_busy) else {
            continue;
        };
        let slots = newest.entry(group).or_default();
        let kinds = [
            policy.replaces_pending(),
            policy == BusyPolicy::CancelInProgress,
        ];
        for (slot, applies) in slots.iter_mut().zip(kinds) {
            if applies && slot.is_none_or(|newer| arrival(newer) < arrival(claim)) {
                *slot = Some(claim);
            }
        }
    }
    let mut replaced = HashMap::new();
    for (index, claim) in input.claims.iter().enumerate() {
        let Some(group) = grouped(claim) else {
            continue;
        };
        let Some([replacing, cancelling]) = newest.get(group) else {
            continue;
        };
        let by = if claim.phase() == ClaimPhase::Held {
            cancelling
        } else {
            replacing
        };
        if let Some(newer) = by.filter(|newer| arrival(newer) > arrival(claim)) {
            replaced.insert(
                index,
                Replacement {
                    by: newer.name.clone(),
                    group: group.to_owned(),
                    policy: newer.spec.when_busy.unwrap_or_default(),
                },
            );
        }
    }
    replaced
}

/// Whether `claim` ends instead of waiting when the lock cannot grant it (`whenBusy: Fail`).
pub(super) fn fails_when_busy(claim: &ClaimView) -> bool {
    claim.spec.when_busy == Some(BusyPolicy::Fail)
}

/// The message of a claim that `whenBusy: Fail` ends.
pub(super) const BUSY_MESSAGE: &str = "the lock could not be granted at once (whenBusy: Fail)";
