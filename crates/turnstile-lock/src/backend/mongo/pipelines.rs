//! The lock document, the update pipelines that change it atomically, and their parsing.
//!
//! # One document per lock key
//!
//! ```text
//! { _id:     <key>,                          // the unique _id index is the key's index
//!   fence:   Int64,                          // highest token issued or floor; never lowered
//!   holders: [{owner, token: Int64, exp: Int64}],  // exp: server ms since the epoch
//!   queue:   [{owner, beat: Int64}],         // arrival order; beat: waiter heartbeat expiry
//!   wakeSeq: Int64, wake: "<wakeSeq> <owner> <owner>…",  // set by a release that admits
//!   op:      {owner, outcome, now: Int64} }  // what the last acquire/release did, at what time
//! ```
//!
//! Holders, tokens, the fence counter and the queue live together, so a grant and its
//! fencing token are one atomic single-document write. Every time comparison uses the
//! server's `$$NOW`, evaluated once per write, never a client's clock.
//!
//! A write reports its outcome through `op`, read back with `ReturnDocument::After`: the
//! returned document is exactly the state this write produced.
//!
//! User-supplied strings (owner tokens) always enter expressions through `$literal`, so a
//! token such as `$x` is never read as a field path.

use std::time::Duration;

use mongodb::bson::{doc, Bson, Document};

use crate::backend::{AcquireMode, AcquireOutcome, HolderInfo, LockSnapshot};

/// Field names of the lock document.
pub(super) mod field {
    pub const FENCE: &str = "fence";
    pub const HOLDERS: &str = "holders";
    pub const QUEUE: &str = "queue";
    pub const WAKE: &str = "wake";
    pub const OP: &str = "op";
    pub const OWNER: &str = "owner";
    pub const TOKEN: &str = "token";
    pub const EXPIRES: &str = "exp";
    pub const HEARTBEAT: &str = "beat";
    pub const OUTCOME: &str = "outcome";
    pub const NOW: &str = "now";
}

/// Values of `op.outcome`.
mod outcome {
    pub const GRANTED: &str = "granted";
    pub const ALREADY_HELD: &str = "held";
    pub const WAITING: &str = "waiting";
    pub const BUSY: &str = "busy";
    pub const RELEASED: &str = "released";
    pub const NOT_HELD: &str = "absent";
}

/// Temporary fields used between pipeline stages, removed by the last stage.
const TEMPORARIES: [&str; 6] = ["_now", "_held", "_rank", "_grant", "_was", "_admit"];

/// A whole number of milliseconds as BSON Int64 (durations are validated far below i64::MAX).
pub(super) fn millis(duration: Duration) -> i64 {
    i64::try_from(crate::backend::ceil_millis(duration)).unwrap_or(i64::MAX)
}

fn literal(value: &str) -> Document {
    doc! { "$literal": value }
}

/// `$$NOW` as Int64 milliseconds, kept in `_now` for the later stages.
fn now_stage() -> Document {
    doc! { "$set": { "_now": { "$toLong": "$$NOW" } } }
}

/// Drops holders whose lease ran out and waiters whose heartbeat did; defaults for a new
/// document.
fn prune_stage() -> Document {
    doc! { "$set": {
        field::FENCE: { "$ifNull": ["$fence", Bson::Int64(0)] },
        field::HOLDERS: { "$filter": {
            "input": { "$ifNull": ["$holders", []] },
            "cond": { "$gt": ["$$this.exp", "$_now"] },
        } },
        field::QUEUE: { "$filter": {
            "input": { "$ifNull": ["$queue", []] },
            "cond": { "$gt": ["$$this.beat", "$_now"] },
        } },
    } }
}

fn owners_of(array: &str) -> Document {
    doc! { "$map": { "input": array, "in": "$$this.owner" } }
}

fn without_owner(array: &str, owner: &str) -> Document {
    doc! { "$filter": {
        "input": array,
        "cond": { "$ne": ["$$this.owner", literal(owner)] },
    } }
}

fn cleanup_stage() -> Document {
    doc! { "$unset": TEMPORARIES.to_vec() }
}

/// Parameters of one acquire, in the units the pipeline uses.
#[derive(Debug, Clone)]
pub(super) struct AcquireParams {
    pub owner: String,
    pub ttl_ms: i64,
    pub max_holders: i64,
    pub mode: AcquireMode,
    pub waiter_lease_ms: i64,
}

/// The acquire pipeline: prune, then refresh (already held), grant (a slot is free and fewer
/// waiters are ahead than free slots), enqueue / refresh the heartbeat (`Wait`) or refuse.
/// Run as an upsert filtered on `_id` only (`$expr` is not allowed in upsert filters, so
/// every condition lives in the pipeline).
pub(super) fn acquire_pipeline(params: &AcquireParams) -> Vec<Document> {
    let owner = params.owner.as_str();
    let expiry = doc! { "$add": ["$_now", Bson::Int64(params.ttl_ms)] };
    let heartbeat = doc! { "$add": ["$_now", Bson::Int64(params.waiter_lease_ms)] };
    let refreshed_holders = doc! { "$map": {
        "input": "$holders",
        "in": { "$cond": [
            { "$eq": ["$$this.owner", literal(owner)] },
            { field::OWNER: "$$this.owner", field::TOKEN: "$$this.token", field::EXPIRES: expiry.clone() },
            "$$this",
        ] },
    } };
    let new_holder = doc! {
        field::OWNER: literal(owner),
        field::TOKEN: "$fence",
        field::EXPIRES: expiry,
    };
    let queue_after_grant = without_owner("$queue", owner);
    let queue = match params.mode {
        AcquireMode::Try => {
            Bson::Document(doc! { "$cond": ["$_grant", queue_after_grant, "$queue"] })
        }
        AcquireMode::Wait => Bson::Document(doc! { "$switch": {
            "branches": [
                { "case": "$_grant", "then": queue_after_grant },
                { "case": "$_held", "then": "$queue" },
                { "case": { "$gte": ["$_rank", 0] }, "then": { "$map": {
                    "input": "$queue",
                    "in": { "$cond": [
                        { "$eq": ["$$this.owner", literal(owner)] },
                        { field::OWNER: "$$this.owner", field::HEARTBEAT: heartbeat.clone() },
                        "$$this",
                    ] },
                } } },
            ],
            "default": { "$concatArrays": ["$queue", [
                { field::OWNER: literal(owner), field::HEARTBEAT: heartbeat },
            ]] },
        } }),
    };
    let refused = match params.mode {
        AcquireMode::Try => outcome::BUSY,
        AcquireMode::Wait => outcome::WAITING,
    };
    vec![
        now_stage(),
        prune_stage(),
        doc! { "$set": {
            "_held": { "$in": [literal(owner), owners_of("$holders")] },
            "_rank": { "$indexOfArray": [owners_of("$queue"), literal(owner)] },
        } },
        doc! { "$set": { "_grant": { "$and": [
            { "$not": ["$_held"] },
            { "$lt": [
                { "$cond": [{ "$gte": ["$_rank", 0] }, "$_rank", { "$size": "$queue" }] },
                { "$subtract": [Bson::Int64(params.max_holders), { "$size": "$holders" }] },
            ] },
        ] } } },
        // The token is issued in the same write that records the holder.
        doc! { "$set": { field::FENCE: {
            "$cond": ["$_grant", { "$add": ["$fence", Bson::Int64(1)] }, "$fence"],
        } } },
        doc! { "$set": {
            field::HOLDERS: { "$switch": {
                "branches": [
                    { "case": "$_held", "then": refreshed_holders },
                    { "case": "$_grant", "then": { "$concatArrays": ["$holders", [new_holder]] } },
                ],
                "default": "$holders",
            } },
            field::QUEUE: queue,
            field::OP: {
                field::OWNER: literal(owner),
                field::OUTCOME: { "$switch": {
                    "branches": [
                        { "case": "$_held", "then": outcome::ALREADY_HELD },
                        { "case": "$_grant", "then": outcome::GRANTED },
                    ],
                    "default": refused,
                } },
                field::NOW: "$_now",
            },
        } },
        cleanup_stage(),
    ]
}

/// The release pipeline: prune, remove `owner` as holder and as waiter, and when slots are
/// free and waiters queued, name the admitted head of the queue in `wake` (with a fresh
/// sequence number so the field changes, which is what change streams and pollers watch).
pub(super) fn release_pipeline(owner: &str, max_holders: i64) -> Vec<Document> {
    let free = doc! { "$subtract": [Bson::Int64(max_holders), { "$size": "$holders" }] };
    let admitted = doc! { "$gt": [{ "$size": "$_admit" }, 0] };
    vec![
        now_stage(),
        prune_stage(),
        doc! { "$set": { "_was": { "$in": [literal(owner), owners_of("$holders")] } } },
        doc! { "$set": {
            field::HOLDERS: without_owner("$holders", owner),
            field::QUEUE: without_owner("$queue", owner),
        } },
        doc! { "$set": { "_admit": { "$cond": [
            { "$gt": [free.clone(), 0] },
            { "$slice": [owners_of("$queue"), free] },
            [],
        ] } } },
        doc! { "$set": { "wakeSeq": { "$cond": [
            admitted.clone(),
            { "$add": [{ "$ifNull": ["$wakeSeq", Bson::Int64(0)] }, Bson::Int64(1)] },
            "$wakeSeq",
        ] } } },
        doc! { "$set": {
            field::WAKE: { "$cond": [
                admitted,
                { "$reduce": {
                    "input": "$_admit",
                    "initialValue": { "$toString": "$wakeSeq" },
                    "in": { "$concat": ["$$value", " ", "$$this"] },
                } },
                "$wake",
            ] },
            field::OP: {
                field::OWNER: literal(owner),
                field::OUTCOME: { "$cond": ["$_was", outcome::RELEASED, outcome::NOT_HELD] },
                field::NOW: "$_now",
            },
        } },
        cleanup_stage(),
    ]
}

/// `$expr` condition: `owner` holds a live lease. Only for non-upsert filters.
pub(super) fn holds_live_lease(owner: &str) -> Document {
    doc! { "$anyElementTrue": [{ "$map": {
        "input": { "$ifNull": ["$holders", []] },
        "in": { "$and": [
            { "$eq": ["$$this.owner", literal(owner)] },
            { "$gt": ["$$this.exp", { "$toLong": "$$NOW" }] },
        ] },
    } }] }
}

/// The extend pipeline (run filtered by [`holds_live_lease`]): `owner`'s lease ends `ttl_ms`
/// after the server's now.
pub(super) fn extend_pipeline(owner: &str, ttl_ms: i64) -> Vec<Document> {
    vec![doc! { "$set": { field::HOLDERS: { "$map": {
        "input": "$holders",
        "in": { "$cond": [
            { "$eq": ["$$this.owner", literal(owner)] },
            {
                field::OWNER: "$$this.owner",
                field::TOKEN: "$$this.token",
                field::EXPIRES: { "$add": [{ "$toLong": "$$NOW" }, Bson::Int64(ttl_ms)] },
            },
            "$$this",
        ] },
    } } } }]
}

/// Read pipeline: the lock document plus the server's now (`_now`), for reads that judge
/// expiry without writing.
pub(super) fn read_with_now(key: &str) -> Vec<Document> {
    vec![
        doc! { "$match": { "_id": key } },
        doc! { "$set": { "_now": { "$toLong": "$$NOW" } } },
    ]
}

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

    /// Time until the earliest live lease ends, by the server's clock.
    fn earliest_expiry(&self, now_ms: i64) -> Option<Duration> {
        self.holders
            .iter()
            .filter(|holder| holder.expires_at_ms > now_ms)
            .map(|holder| remaining(holder.expires_at_ms, now_ms))
            .min()
    }

    /// Interprets the document an acquire by `owner` returned.
    pub(super) fn acquire_outcome(
        &self,
        owner: &str,
        ttl: Duration,
    ) -> Result<AcquireOutcome, Malformed> {
        let op = self.op_of(owner)?;
        let granted = |already_held: bool| {
            let holder = self
                .holders
                .iter()
                .find(|holder| holder.owner == owner)
                .ok_or_else(|| malformed("granted owner is not among the holders"))?;
            Ok(AcquireOutcome::Granted {
                fencing_token: holder.token,
                ttl,
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
                    retry_after: self.earliest_expiry(op.now_ms),
                })
            }
            outcome::BUSY => Ok(AcquireOutcome::Busy {
                retry_after: self.earliest_expiry(op.now_ms),
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
        let ttl = Duration::from_secs(1);
        let parsed = LockDocument::parse(&document("granted", "b")).expect("parse");
        assert_eq!(
            parsed.acquire_outcome("b", ttl).expect("outcome"),
            AcquireOutcome::Granted {
                fencing_token: 7,
                ttl,
                already_held: false
            }
        );
        let parsed = LockDocument::parse(&document("held", "a")).expect("parse");
        assert_eq!(
            parsed.acquire_outcome("a", ttl).expect("outcome"),
            AcquireOutcome::Granted {
                fencing_token: 5,
                ttl,
                already_held: true
            }
        );
        let parsed = LockDocument::parse(&document("waiting", "me")).expect("parse");
        assert_eq!(
            parsed.acquire_outcome("me", ttl).expect("outcome"),
            AcquireOutcome::Waiting {
                position: 2,
                retry_after: Some(Duration::from_millis(200)),
            }
        );
        let parsed = LockDocument::parse(&document("busy", "me")).expect("parse");
        assert_eq!(
            parsed.acquire_outcome("me", ttl).expect("outcome"),
            AcquireOutcome::Busy {
                retry_after: Some(Duration::from_millis(200))
            }
        );
        // The record must be ours.
        assert!(parsed.acquire_outcome("someone-else", ttl).is_err());
        let parsed = LockDocument::parse(&document("granted", "not-a-holder")).expect("parse");
        assert!(parsed.acquire_outcome("not-a-holder", ttl).is_err());
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
