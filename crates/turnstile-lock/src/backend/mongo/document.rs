//! The lock document as the backend reads it back: parsing (never panicking on a malformed
//! document) and the outcomes of acquire, release and extend.

use std::time::Duration;

use mongodb::bson::{Bson, Document};

use super::pipelines::{field, outcome};
use crate::backend::{AcquireOutcome, HolderInfo, LockSnapshot, ShareMode};

/// A document that does not have the expected shape.
#[derive(Debug, thiserror::Error)]
#[error("malformed lock document: {0}")]
pub(super) struct Malformed(pub String);

fn malformed(what: impl Into<String>) -> Malformed {
    Malformed(what.into())
}

/// An integer field stored as Int32, Int64 or an integral Double.
fn integer(document: &Document, name: &str) -> Option<i64> {
    match document.get(name)? {
        Bson::Int64(value) => Some(*value),
        Bson::Int32(value) => Some(i64::from(*value)),
        Bson::Double(value) if value.fract() == 0.0 && value.abs() < 9.0e15 => Some(*value as i64),
        _ => None,
    }
}

fn required_integer(document: &Document, name: &str) -> Result<i64, Malformed> {
    integer(document, name).ok_or_else(|| malformed(format!("{name} is not an integer")))
}

fn non_negative(value: i64, name: &str) -> Result<u64, Malformed> {
    u64::try_from(value).map_err(|_| malformed(format!("{name} is negative")))
}

fn entries<'a>(document: &'a Document, name: &str) -> Result<Vec<&'a Document>, Malformed> {
    match document.get(name) {
        None | Some(Bson::Null) => Ok(Vec::new()),
        Some(Bson::Array(items)) => items
            .iter()
            .map(|item| {
                item.as_document()
                    .ok_or_else(|| malformed(format!("{name} has a non-document entry")))
            })
            .collect(),
        Some(_) => Err(malformed(format!("{name} is not an array"))),
    }
}

/// A holder entry as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct StoredHolder {
    pub owner: String,
    pub token: u64,
    pub expires_at_ms: i64,
    pub share: ShareMode,
    pub lock_delay_ms: i64,
}

/// A queue entry as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct StoredWaiter {
    pub owner: String,
    pub heartbeat_ms: i64,
}

/// The record a write leaves in `op`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct OpRecord {
    pub owner: String,
    pub outcome: String,
    pub now_ms: i64,
}

/// The parts of a lock document the backend reads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct LockDocument {
    pub fence: u64,
    pub holders: Vec<StoredHolder>,
    pub queue: Vec<StoredWaiter>,
    pub op: Option<OpRecord>,
    /// No grant before this server time (0: none).
    pub delay_until_ms: i64,
}

impl LockDocument {
    /// Parses a lock document (missing arrays and counter read as empty / 0).
    pub(super) fn parse(document: &Document) -> Result<Self, Malformed> {
        let fence = match integer(document, field::FENCE) {
            Some(value) => non_negative(value, field::FENCE)?,
            None if document.get(field::FENCE).is_none() => 0,
            None => return Err(malformed("fence is not an integer")),
        };
        let holders = entries(document, field::HOLDERS)?
            .into_iter()
            .map(|entry| {
                Ok(StoredHolder {
                    owner: owner_of(entry)?,
                    token: non_negative(required_integer(entry, field::TOKEN)?, field::TOKEN)?,
                    expires_at_ms: required_integer(entry, field::EXPIRES)?,
                    share: match entry.get_str(field::MODE) {
                        Ok("s") => ShareMode::Shared,
                        _ => ShareMode::Exclusive,
                    },
                    lock_delay_ms: integer(entry, field::DELAY).unwrap_or(0),
                })
            })
            .collect::<Result<_, Malformed>>()?;
        let queue = entries(document, field::QUEUE)?
            .into_iter()
            .map(|entry| {
                Ok(StoredWaiter {
                    owner: owner_of(entry)?,
                    heartbeat_ms: required_integer(entry, field::HEARTBEAT)?,
                })
            })
            .collect::<Result<_, Malformed>>()?;
        let op = match document.get(field::OP) {
            Some(Bson::Document(op)) => Some(OpRecord {
                owner: owner_of(op)?,
                outcome: op
                    .get_str(field::OUTCOME)
                    .map_err(|_| malformed("op.outcome is not a string"))?
                    .to_owned(),
                now_ms: required_integer(op, field::NOW)?,
            }),
            _ => None,
        };
        Ok(LockDocument {
            fence,
            holders,
            queue,
            op,
            delay_until_ms: integer(document, field::DELAY_UNTIL).unwrap_or(0),
        })
    }

    /// The record of the write that returned this document, checked to be `owner`'s.
    fn op_of(&self, owner: &str) -> Result<&OpRecord, Malformed> {
        match &self.op {
            Some(op) if op.owner == owner => Ok(op),
            Some(op) => Err(malformed(format!(
                "op names owner {:?}, expected {owner:?}",
                op.owner
            ))),
            None => Err(malformed("op is missing")),
        }
    }

    /// When a grant could next happen without a release, by the server's clock: the
    /// earliest live lease end or the end of the lock-delay, whichever is later.
    fn retry_after(&self, now_ms: i64) -> Option<Duration> {
        let expiry = self
            .holders
            .iter()
            .filter(|holder| holder.expires_at_ms > now_ms)
            .map(|holder| remaining(holder.expires_at_ms, now_ms))
            .min();
        expiry.max(self.delayed_for(now_ms))
    }

    /// The lock-delay left at `now_ms`, counting leases that ran out but were not pruned yet.
    fn delayed_for(&self, now_ms: i64) -> Option<Duration> {
        let until = self
            .holders
            .iter()
            .filter(|holder| holder.expires_at_ms <= now_ms && holder.lock_delay_ms > 0)
            .map(|holder| holder.expires_at_ms.saturating_add(holder.lock_delay_ms))
            .fold(self.delay_until_ms, i64::max);
        (until > now_ms).then(|| remaining(until, now_ms))
    }

    /// The lease `owner` holds, counted from the time its write's `op` records.
    fn lease_of(&self, owner: &str, op: &OpRecord) -> Result<Duration, Malformed> {
        let holder = self.granted_holder(owner)?;
        Ok(remaining(holder.expires_at_ms, op.now_ms))
    }

    /// The holder entry of `owner`, whose write was granted: malformed when there is none.
    fn granted_holder(&self, owner: &str) -> Result<&StoredHolder, Malformed> {
        self.holders
            .iter()
            .find(|holder| holder.owner == owner)
            .ok_or_else(|| malformed("granted owner is not among the holders"))
    }

    /// Interprets the document an extend by `owner` returned: the lease granted.
    pub(super) fn extend_outcome(&self, owner: &str) -> Result<Duration, Malformed> {
        let op = self.op_of(owner)?;
        match op.outcome.as_str() {
            outcome::EXTENDED => self.lease_of(owner, op),
            other => Err(malformed(format!("unknown extend outcome {other:?}"))),
        }
    }

    /// Interprets the document an acquire by `owner` returned.
    pub(super) fn acquire_outcome(&self, owner: &str) -> Result<AcquireOutcome, Malformed> {
        let op = self.op_of(owner)?;
        let granted = |already_held: bool| {
            Ok(AcquireOutcome::Granted {
                fencing_token: self.granted_holder(owner)?.token,
                ttl: self.lease_of(owner, op)?,
                already_held,
            })
        };
        match op.outcome.as_str() {
            outcome::GRANTED => granted(false),
            outcome::ALREADY_HELD => granted(true),
            outcome::WAITING => {
                let index = self
                    .queue
                    .iter()
                    .position(|waiter| waiter.owner == owner)
                    .ok_or_else(|| malformed("waiting owner is not in the queue"))?;
                Ok(AcquireOutcome::Waiting {
                    position: u32::try_from(index + 1).unwrap_or(u32::MAX),
                    retry_after: self.retry_after(op.now_ms),
                })
            }
            outcome::BUSY => Ok(AcquireOutcome::Busy {
                retry_after: self.retry_after(op.now_ms),
            }),
            other => Err(malformed(format!("unknown acquire outcome {other:?}"))),
        }
    }

    /// Interprets the document a release by `owner` returned: did it hold a live lease?
    pub(super) fn release_outcome(&self, owner: &str) -> Result<bool, Malformed> {
        match self.op_of(owner)?.outcome.as_str() {
            outcome::RELEASED => Ok(true),
            outcome::NOT_HELD => Ok(false),
            other => Err(malformed(format!("unknown release outcome {other:?}"))),
        }
    }

    /// Does `owner` hold a lease that is live at `now_ms`?
    pub(super) fn holds(&self, owner: &str, now_ms: i64) -> bool {
        self.holders
            .iter()
            .any(|holder| holder.owner == owner && holder.expires_at_ms > now_ms)
    }

    /// Live holders (ascending token), live waiters in order, and the counter, at `now_ms`.
    pub(super) fn snapshot(&self, now_ms: i64) -> LockSnapshot {
        let mut holders: Vec<HolderInfo> = self
            .holders
            .iter()
            .filter(|holder| holder.expires_at_ms > now_ms)
            .map(|holder| HolderInfo {
                owner: holder.owner.clone(),
                fencing_token: holder.token,
                expires_in: remaining(holder.expires_at_ms, now_ms),
                share: holder.share,
            })
            .collect();
        holders.sort_by_key(|holder| holder.fencing_token);
        LockSnapshot {
            holders,
            waiters: self
                .queue
                .iter()
                .filter(|waiter| waiter.heartbeat_ms > now_ms)
                .map(|waiter| waiter.owner.clone())
                .collect(),
            fencing_token: self.fence,
            delayed_for: self.delayed_for(now_ms),
        }
    }
}

fn owner_of(entry: &Document) -> Result<String, Malformed> {
    entry
        .get_str(field::OWNER)
        .map(str::to_owned)
        .map_err(|_| malformed("owner is not a string"))
}

fn remaining(expires_at_ms: i64, now_ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(expires_at_ms.saturating_sub(now_ms)).unwrap_or(0))
}

/// The server's now (`_now`) of a document read through [`read_with_now`].
pub(super) fn read_now(document: &Document) -> Result<i64, Malformed> {
    required_integer(document, "_now")
}

/// The owners a `wake` value names (the first word is the release's sequence number).
pub(super) fn woken_owners(wake: &str) -> impl Iterator<Item = &str> {
    wake.split_whitespace().skip(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::doc;

    fn holder(owner: &str, token: i64, exp: i64) -> Document {
        doc! { "owner": owner, "token": Bson::Int64(token), "exp": Bson::Int64(exp) }
    }

    fn document(outcome: &str, owner: &str) -> Document {
        doc! {
            "_id": "k",
            "fence": Bson::Int64(7),
            "holders": [holder("b", 7, 1_500), holder("a", 5, 1_200), holder("old", 3, 900)],
            "queue": [
                { "owner": "w1", "beat": Bson::Int64(2_000) },
                { "owner": owner, "beat": Bson::Int64(2_000) },
                { "owner": "dead", "beat": Bson::Int64(10) },
            ],
            "op": { "owner": owner, "outcome": outcome, "now": Bson::Int64(1_000) },
        }
    }

    #[test]
    fn acquire_outcomes_are_read_from_the_op_record() {
        let granted = |fencing_token, ttl_ms, already_held| AcquireOutcome::Granted {
            fencing_token,
            ttl: Duration::from_millis(ttl_ms),
            already_held,
        };
        let later = Some(Duration::from_millis(200));
        let cases = [
            ("granted", "b", granted(7, 500, false)),
            ("held", "a", granted(5, 200, true)),
            (
                "waiting",
                "me",
                AcquireOutcome::Waiting {
                    position: 2,
                    retry_after: later,
                },
            ),
            ("busy", "me", AcquireOutcome::Busy { retry_after: later }),
        ];
        for (outcome, owner, expected) in cases {
            let parsed = LockDocument::parse(&document(outcome, owner)).expect("parse");
            assert_eq!(
                parsed.acquire_outcome(owner).expect("outcome"),
                expected,
                "{outcome}"
            );
        }
        let parsed = LockDocument::parse(&document("busy", "me")).expect("parse");
        // The record must be ours.
        assert!(parsed.acquire_outcome("someone-else").is_err());
        let parsed = LockDocument::parse(&document("granted", "not-a-holder")).expect("parse");
        assert!(parsed.acquire_outcome("not-a-holder").is_err());
    }

    #[test]
    fn snapshot_judges_expiry_by_the_given_server_time() {
        let parsed = LockDocument::parse(&document("busy", "me")).expect("parse");
        let snapshot = parsed.snapshot(1_000);
        let owners: Vec<&str> = snapshot.holders.iter().map(|h| h.owner.as_str()).collect();
        assert_eq!(owners, ["a", "b"], "live holders in token order");
        assert_eq!(snapshot.holders[0].expires_in, Duration::from_millis(200));
        assert_eq!(snapshot.waiters, ["w1", "me"]);
        assert_eq!(snapshot.fencing_token, 7);
        assert!(parsed.holds("a", 1_199));
        assert!(!parsed.holds("a", 1_200));
        assert!(!parsed.holds("old", 1_000));
    }

    #[test]
    fn release_outcome_and_wake_values() {
        let parsed = LockDocument::parse(&document("released", "x")).expect("parse");
        assert!(parsed.release_outcome("x").expect("outcome"));
        let parsed = LockDocument::parse(&document("absent", "x")).expect("parse");
        assert!(!parsed.release_outcome("x").expect("outcome"));
        assert_eq!(woken_owners("12 a b").collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(woken_owners("").count(), 0);
    }

    #[test]
    fn malformed_documents_are_errors_not_panics() {
        let bad = [
            doc! { "fence": "x" },
            doc! { "fence": Bson::Int64(-1) },
            doc! { "holders": "x" },
            doc! { "holders": [1] },
            doc! { "holders": [{ "owner": "a", "token": "1", "exp": Bson::Int64(1) }] },
            doc! { "queue": [{ "owner": 3, "beat": Bson::Int64(1) }] },
            doc! { "op": { "owner": "a", "outcome": 1, "now": Bson::Int64(1) } },
        ];
        for document in &bad {
            assert!(LockDocument::parse(document).is_err(), "{document}");
        }
        assert_eq!(
            LockDocument::parse(&doc! { "_id": "k" }).expect("empty"),
            LockDocument::default()
        );
    }
}
