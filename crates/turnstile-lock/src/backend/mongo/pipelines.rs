//! The lock document's update pipelines: every state change of a lock, atomically.
//!
//! # One document per lock key
//!
//! ```text
//! { _id:     <key>,                          // the unique _id index is the key's index
//!   fence:   Int64,                          // highest token issued or floor; never lowered
//!   holders: [{owner, token: Int64, exp: Int64,     // exp: server ms since the epoch
//!              mode: "x"|"s", delay: Int64,        // share mode, lock-delay (ms)
//!              until: Int64}],                     // max-hold deadline, -1 for none
//!   queue:   [{owner, beat: Int64,           // priority descending, then arrival order;
//!              prio: Int64, mode: "x"|"s"}], // beat: waiter heartbeat expiry
//!   delayUntil: Int64,                       // no grant before this (lock-delay), 0: none
//!   wakeSeq: Int64, wake: "<wakeSeq> <owner> <owner>…",  // set by a release that admits
//!   op:      {owner, outcome, now: Int64} }  // what the last write did, at what time
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

use crate::backend::{AcquireMode, ShareMode};

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
    pub const MODE: &str = "mode";
    pub const DELAY: &str = "delay";
    pub const UNTIL: &str = "until";
    pub const PRIORITY: &str = "prio";
    pub const DELAY_UNTIL: &str = "delayUntil";
}

/// Values of `op.outcome`.
pub(super) mod outcome {
    pub const GRANTED: &str = "granted";
    pub const ALREADY_HELD: &str = "held";
    pub const WAITING: &str = "waiting";
    pub const BUSY: &str = "busy";
    pub const RELEASED: &str = "released";
    pub const NOT_HELD: &str = "absent";
    pub const EXTENDED: &str = "extended";
}

/// Temporary fields used between pipeline stages, removed by the last stage.
const TEMPORARIES: [&str; 8] = [
    "_now", "_held", "_rank", "_grant", "_was", "_admit", "_ahead", "_holdX",
];

/// A whole number of milliseconds as BSON Int64 (durations are validated far below i64::MAX).
pub(super) fn millis(duration: Duration) -> i64 {
    i64::try_from(crate::backend::ceil_millis(duration)).unwrap_or(i64::MAX)
}

/// The stored name of a share mode.
pub(super) fn mode_name(share: ShareMode) -> &'static str {
    match share {
        ShareMode::Exclusive => "x",
        ShareMode::Shared => "s",
    }
}

fn literal(value: &str) -> Document {
    doc! { "$literal": value }
}

/// `$$NOW` as Int64 milliseconds, kept in `_now` for the later stages.
fn now_stage() -> Document {
    doc! { "$set": { "_now": { "$toLong": "$$NOW" } } }
}

/// The entry's `name` field, `default` where it is missing (documents of older versions).
fn or_default(name: &str, default: impl Into<Bson>) -> Document {
    doc! { "$ifNull": [format!("$$this.{name}"), default.into()] }
}

/// Is the entry `$$this` exclusive? (An entry without a mode is.)
fn is_exclusive() -> Document {
    doc! { "$ne": [or_default(field::MODE, "x"), "s"] }
}

/// Drops holders whose lease ran out and waiters whose heartbeat did; defaults for a new
/// document. A lease that ran out ended involuntarily: its lock-delay, counted from its end,
/// is folded into `delayUntil` (all fields of one `$set` see the unpruned document).
fn prune_stage() -> Document {
    let holders = doc! { "$ifNull": ["$holders", []] };
    let ended_until = doc! { "$reduce": {
        "input": { "$filter": { "input": holders.clone(), "cond": { "$lte": ["$$this.exp", "$_now"] } } },
        "initialValue": { "$ifNull": ["$delayUntil", Bson::Int64(0)] },
        "in": { "$max": ["$$value", { "$add": ["$$this.exp", or_default(field::DELAY, Bson::Int64(0))] }] },
    } };
    doc! { "$set": {
        field::FENCE: { "$ifNull": ["$fence", Bson::Int64(0)] },
        field::DELAY_UNTIL: { "$cond": [{ "$gt": [ended_until.clone(), "$_now"] }, ended_until, Bson::Int64(0)] },
        field::HOLDERS: { "$filter": {
            "input": holders,
            "cond": { "$gt": ["$$this.exp", "$_now"] },
        } },
        field::QUEUE: { "$filter": {
            "input": { "$ifNull": ["$queue", []] },
            "cond": { "$gt": ["$$this.beat", "$_now"] },
        } },
    } }
}

/// `_holdX`: does a live holder hold exclusively?
fn held_exclusive_stage() -> Document {
    doc! { "$set": { "_holdX": { "$anyElementTrue": [{ "$map": {
        "input": "$holders",
        "in": is_exclusive(),
    } }] } } }
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

/// `holders` with `owner`'s lease ending `ttl_ms` after now, capped at its max-hold deadline
/// (every other field kept).
fn refreshed_holders(owner: &str, ttl_ms: i64, now: &str) -> Document {
    let expiry = doc! { "$add": [now, Bson::Int64(ttl_ms)] };
    let until = or_default(field::UNTIL, Bson::Int64(-1));
    doc! { "$map": {
        "input": "$holders",
        "in": { "$cond": [
            { "$eq": ["$$this.owner", literal(owner)] },
            {
                field::OWNER: "$$this.owner",
                field::TOKEN: "$$this.token",
                field::EXPIRES: { "$cond": [
                    { "$gte": [until.clone(), 0] },
                    { "$min": [expiry.clone(), until] },
                    expiry,
                ] },
                field::MODE: or_default(field::MODE, "x"),
                field::DELAY: or_default(field::DELAY, Bson::Int64(0)),
                field::UNTIL: or_default(field::UNTIL, Bson::Int64(-1)),
            },
            "$$this",
        ] },
    } }
}

/// Parameters of one acquire, in the units the pipeline uses.
#[derive(Debug, Clone)]
pub(super) struct AcquireParams {
    pub owner: String,
    pub ttl_ms: i64,
    pub max_holders: i64,
    pub mode: AcquireMode,
    pub waiter_lease_ms: i64,
    pub share: ShareMode,
    pub priority: i64,
    /// -1 for none.
    pub max_hold_ms: i64,
    pub lock_delay_ms: i64,
}

/// The acquire pipeline: prune, then refresh (already held), grant (no lock-delay runs and
/// the request fits together with the holders and every waiter ahead of it, see
/// [`admits`](crate::backend::admits)), enqueue / refresh the heartbeat (`Wait`) or refuse.
/// Run as an upsert filtered on `_id` only (`$expr` is not allowed in upsert filters, so
/// every condition lives in the pipeline).
pub(super) fn acquire_pipeline(params: &AcquireParams) -> Vec<Document> {
    let owner = params.owner.as_str();
    let priority = Bson::Int64(params.priority);
    let share = mode_name(params.share);
    let heartbeat = doc! { "$add": ["$_now", Bson::Int64(params.waiter_lease_ms)] };
    let first_lease = if params.max_hold_ms >= 0 {
        params.ttl_ms.min(params.max_hold_ms)
    } else {
        params.ttl_ms
    };
    let new_holder = doc! {
        field::OWNER: literal(owner),
        field::TOKEN: "$fence",
        field::EXPIRES: { "$add": ["$_now", Bson::Int64(first_lease)] },
        field::MODE: share,
        field::DELAY: Bson::Int64(params.lock_delay_ms),
        field::UNTIL: if params.max_hold_ms >= 0 {
            Bson::Document(doc! { "$add": ["$_now", Bson::Int64(params.max_hold_ms)] })
        } else {
            Bson::Int64(-1)
        },
    };
    // Waiters ahead: those before our entry, or, when not queued, those of our priority or
    // higher (the queue is sorted by priority, so both end at the first lower one).
    let ahead = doc! { "$reduce": {
        "input": "$queue",
        "initialValue": { "n": Bson::Int64(0), "x": false, "stop": false },
        "in": { "$cond": [
            { "$or": [
                "$$value.stop",
                { "$eq": ["$$this.owner", literal(owner)] },
                { "$lt": [or_default(field::PRIORITY, Bson::Int64(0)), priority.clone()] },
            ] },
            { "n": "$$value.n", "x": "$$value.x", "stop": true },
            { "n": { "$add": ["$$value.n", Bson::Int64(1)] }, "x": { "$or": ["$$value.x", is_exclusive()] }, "stop": false },
        ] },
    } };
    let total = doc! { "$add": [{ "$size": "$holders" }, "$_ahead.n", Bson::Int64(1)] };
    let queue_after_grant = without_owner("$queue", owner);
    let new_waiter = doc! {
        field::OWNER: literal(owner),
        field::HEARTBEAT: heartbeat.clone(),
        field::PRIORITY: priority.clone(),
        field::MODE: share,
    };
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
                        {
                            field::OWNER: "$$this.owner",
                            field::HEARTBEAT: heartbeat,
                            field::PRIORITY: or_default(field::PRIORITY, Bson::Int64(0)),
                            field::MODE: or_default(field::MODE, "x"),
                        },
                        "$$this",
                    ] },
                } } },
            ],
            // Joins after every waiter of its priority or higher.
            "default": { "$concatArrays": [
                { "$filter": { "input": "$queue", "cond": { "$gte": [or_default(field::PRIORITY, Bson::Int64(0)), priority.clone()] } } },
                [new_waiter],
                { "$filter": { "input": "$queue", "cond": { "$lt": [or_default(field::PRIORITY, Bson::Int64(0)), priority] } } },
            ] },
        } }),
    };
    let refused = match params.mode {
        AcquireMode::Try => outcome::BUSY,
        AcquireMode::Wait => outcome::WAITING,
    };
    vec![
        now_stage(),
        prune_stage(),
        held_exclusive_stage(),
        doc! { "$set": {
            "_held": { "$in": [literal(owner), owners_of("$holders")] },
            "_rank": { "$indexOfArray": [owners_of("$queue"), literal(owner)] },
            "_ahead": ahead,
        } },
        doc! { "$set": { "_grant": { "$and": [
            { "$not": ["$_held"] },
            { "$lte": ["$delayUntil", "$_now"] },
            { "$lte": [total.clone(), Bson::Int64(params.max_holders)] },
            { "$or": [
                { "$eq": [total, Bson::Int64(1)] },
                { "$and": [share == "s", { "$not": ["$_holdX"] }, { "$not": ["$_ahead.x"] }] },
            ] },
        ] } } },
        // The token is issued in the same write that records the holder.
        doc! { "$set": { field::FENCE: {
            "$cond": ["$_grant", { "$add": ["$fence", Bson::Int64(1)] }, "$fence"],
        } } },
        doc! { "$set": {
            field::HOLDERS: { "$switch": {
                "branches": [
                    { "case": "$_held", "then": refreshed_holders(owner, params.ttl_ms, "$_now") },
                    { "case": "$_grant", "then": { "$concatArrays": ["$holders", [new_holder]] } },
                ],
                "default": "$holders",
            } },
            field::QUEUE: queue,
            field::OP: op_record(owner, doc! { "$switch": {
                "branches": [
                    { "case": "$_held", "then": outcome::ALREADY_HELD },
                    { "case": "$_grant", "then": outcome::GRANTED },
                ],
                "default": refused,
            } }),
        } },
        cleanup_stage(),
    ]
}

/// The `op` record of a write by `owner`.
fn op_record(owner: &str, outcome: impl Into<Bson>) -> Document {
    doc! {
        field::OWNER: literal(owner),
        field::OUTCOME: outcome.into(),
        field::NOW: "$_now",
    }
}

/// The release pipeline: prune, remove `owner` as holder and as waiter (a voluntary end: no
/// lock-delay), and unless a lock-delay runs, name the compatible head of the queue (the
/// longest prefix that fits together with the holders) in `wake`, with a fresh sequence
/// number so the field changes, which is what change streams and pollers watch.
pub(super) fn release_pipeline(owner: &str, max_holders: i64) -> Vec<Document> {
    let admitted = doc! { "$gt": [{ "$size": "$_admit" }, 0] };
    let fits = doc! { "$cond": [
        is_exclusive(),
        { "$eq": ["$$value.n", Bson::Int64(0)] },
        { "$and": [{ "$not": ["$$value.x"] }, { "$lt": ["$$value.n", Bson::Int64(max_holders)] }] },
    ] };
    let walk = doc! { "$reduce": {
        "input": "$queue",
        "initialValue": { "n": { "$size": "$holders" }, "x": "$_holdX", "stop": false, "admit": [] },
        "in": { "$cond": [
            { "$or": ["$$value.stop", { "$not": [fits] }] },
            { "n": "$$value.n", "x": "$$value.x", "stop": true, "admit": "$$value.admit" },
            {
                "n": { "$add": ["$$value.n", Bson::Int64(1)] },
                "x": { "$or": ["$$value.x", is_exclusive()] },
                "stop": false,
                "admit": { "$concatArrays": ["$$value.admit", ["$$this.owner"]] },
            },
        ] },
    } };
    vec![
        now_stage(),
        prune_stage(),
        doc! { "$set": { "_was": { "$in": [literal(owner), owners_of("$holders")] } } },
        doc! { "$set": {
            field::HOLDERS: without_owner("$holders", owner),
            field::QUEUE: without_owner("$queue", owner),
        } },
        held_exclusive_stage(),
        doc! { "$set": { "_admit": walk } },
        doc! { "$set": { "_admit": { "$cond": [
            { "$gt": ["$delayUntil", "$_now"] },
            [],
            "$_admit.admit",
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
            field::OP: op_record(owner, doc! { "$cond": ["$_was", outcome::RELEASED, outcome::NOT_HELD] }),
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
/// after the server's now, capped at its max-hold deadline; `op` records the time, so the
/// lease granted can be read back.
pub(super) fn extend_pipeline(owner: &str, ttl_ms: i64) -> Vec<Document> {
    vec![
        now_stage(),
        doc! { "$set": {
            field::HOLDERS: refreshed_holders(owner, ttl_ms, "$_now"),
            field::OP: op_record(owner, outcome::EXTENDED),
        } },
        doc! { "$unset": ["_now"] },
    ]
}

/// Read pipeline: the lock document plus the server's now (`_now`), for reads that judge
/// expiry without writing.
pub(super) fn read_with_now(key: &str) -> Vec<Document> {
    vec![
        doc! { "$match": { "_id": key } },
        doc! { "$set": { "_now": { "$toLong": "$$NOW" } } },
    ]
}
