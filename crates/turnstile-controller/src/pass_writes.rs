//! The API writes of one lock's pass, decided from the core's [`Decision`] with no I/O: the
//! lock reconciler makes them through the [`ApiWriter`](crate::writer::ApiWriter), and the
//! tests' simulation applies the very same patches to its objects.

use std::collections::HashMap;

use crate::core::{ClaimChange, Decision, FinalizerChange};
use crate::error::ControllerError;
use crate::writer::Write;
use turnstile_api::{DistributedLock, LockClaim, LockClaimStatus, FINALIZER};

/// Whose object a [`PassWrite`] changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A claim of the lock (the write names it).
    Claim,
    /// The lock itself.
    Lock,
}

/// One write of a pass and the object it is for.
#[derive(Debug, Clone, PartialEq)]
pub struct PassWrite {
    /// A claim or the lock.
    pub target: Target,
    /// The write.
    pub write: Write,
}

/// Decides a pass's writes in order, keeping each claim's finalizers as the pass's own earlier
/// writes left them (a merge patch replaces the whole list, so each write must start from the
/// previous one).
#[derive(Debug, Clone, Default)]
pub struct PassWrites {
    finalizers: HashMap<String, Vec<String>>,
}

impl PassWrites {
    /// Starts from the claims as the pass read them.
    pub fn new<'a>(claims: impl IntoIterator<Item = &'a LockClaim>) -> Self {
        Self {
            finalizers: claims
                .into_iter()
                .filter_map(|claim| {
                    let name = claim.metadata.name.clone()?;
                    Some((name, claim.metadata.finalizers.clone().unwrap_or_default()))
                })
                .collect(),
        }
    }

    /// Adds the controller's finalizer to each claim named that lacks it (before any backend
    /// call for it: a claim is never granted without the finalizer that guarantees its release).
    pub fn add_finalizers(&mut self, names: &[String]) -> Vec<Write> {
        names
            .iter()
            .filter_map(|name| self.set_finalizer(name, true))
            .collect()
    }

    /// The writes of one claim's change: its status (when it differs from `old`), then the
    /// removal of the finalizer.
    pub fn claim_change(
        &mut self,
        old: Option<&LockClaimStatus>,
        change: &ClaimChange,
    ) -> Result<Vec<Write>, ControllerError> {
        let mut writes = Vec::new();
        if let Some(status) = &change.status {
            writes.extend(Write::status(&change.name, old, status)?);
        }
        if change.finalizer == FinalizerChange::Remove {
            writes.extend(self.set_finalizer(&change.name, false));
        }
        Ok(writes)
    }

    /// The lock's own writes, after its claims': its status, then its finalizer.
    pub fn lock(lock: &DistributedLock, decision: &Decision) -> Result<Vec<Write>, ControllerError> {
        let name = lock.metadata.name.as_deref().unwrap_or_default();
        let mut writes = Vec::new();
        if let Some(status) = &decision.lock_status {
            writes.extend(Write::status(name, lock.status.as_ref(), status)?);
        }
        if decision.add_lock_finalizer || decision.remove_lock_finalizer {
            let mut finalizers = lock.metadata.finalizers.clone().unwrap_or_default();
            finalizers.retain(|f| f != FINALIZER);
            if decision.add_lock_finalizer {
                finalizers.push(FINALIZER.to_owned());
            }
            writes.push(Write::finalizers(name, &finalizers));
        }
        Ok(writes)
    }

    /// Every write of `decision`, in order: the claims' (status of each `old_status` names),
    /// then the lock's.
    pub fn decision<'a>(
        &mut self,
        lock: &DistributedLock,
        old_status: impl Fn(&str) -> Option<&'a LockClaimStatus>,
        decision: &Decision,
    ) -> Result<Vec<PassWrite>, ControllerError> {
        let mut writes = Vec::new();
        for change in &decision.claims {
            for write in self.claim_change(old_status(&change.name), change)? {
                writes.push(PassWrite {
                    target: Target::Claim,
                    write,
                });
            }
        }
        for write in Self::lock(lock, decision)? {
            writes.push(PassWrite {
                target: Target::Lock,
                write,
            });
        }
        Ok(writes)
    }

    fn set_finalizer(&mut self, name: &str, present: bool) -> Option<Write> {
        let finalizers = self.finalizers.entry(name.to_owned()).or_default();
        if finalizers.iter().any(|f| f == FINALIZER) == present {
            return None;
        }
        if present {
            finalizers.push(FINALIZER.to_owned());
        } else {
            finalizers.retain(|f| f != FINALIZER);
        }
        Some(Write::finalizers(name, finalizers))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use turnstile_api::LockClaimSpec;

    fn claim(name: &str, finalizers: &[&str]) -> LockClaim {
        let mut claim = LockClaim::new(name, LockClaimSpec::for_lock("db"));
        claim.metadata.finalizers = Some(finalizers.iter().map(|f| (*f).to_owned()).collect());
        claim
    }

    #[test]
    fn finalizer_writes_keep_other_finalizers_and_follow_earlier_writes() {
        let claims = [claim("a", &["other"]), claim("b", &[FINALIZER])];
        let mut writes = PassWrites::new(&claims);
        let added = writes.add_finalizers(&["a".to_owned(), "b".to_owned()]);
        assert_eq!(added.len(), 1, "b has it already: {added:?}");
        assert_eq!(
            added[0].patch,
            json!({"metadata": {"finalizers": ["other", FINALIZER]}})
        );
        let removal = ClaimChange {
            name: "a".to_owned(),
            status: None,
            finalizer: FinalizerChange::Remove,
        };
        let removed = writes.claim_change(None, &removal).expect("serialize");
        assert_eq!(
            removed[0].patch,
            json!({"metadata": {"finalizers": ["other"]}}),
            "starts from the list the add left"
        );
        assert!(
            writes.claim_change(None, &removal).expect("serialize").is_empty(),
            "a second removal writes nothing"
        );
    }
}
