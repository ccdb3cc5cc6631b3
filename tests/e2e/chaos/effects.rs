//! Did each fault do what it exists for? A fault that never fired, or fired without the
//! effect it is there to cause, would let a run pass without testing anything, so every
//! fault applied gets an [`Outcome`]: the sign, read in the fake's request log and in the
//! history, that it fired and mattered, or why not.
//!
//! - a leader stopped: a live replica renewed the Lease after the stop (seen while it ran),
//!   and a claim was granted afterwards; a standby stopped: the leader stayed;
//! - watches closed with 410: a replica watched or listed the locks again afterwards;
//! - injected errors: at least one write was answered with the error;
//! - slow responses: at least one request was answered that late;
//! - Redis and MongoDB faults: the server lost its data or stopped answering (seen while it
//!   ran), and a lock on that backend was granted afterwards;
//! - a worker paused past its lease: the grant ended while it slept (its last `expiresAt`
//!   before its end), and its stale write, when a later holder had written, was refused.

use std::collections::BTreeMap;
use std::time::Instant;

use fake_apiserver::RecordedRequest;
use turnstile_api::ClaimPhase;

use super::faults::Applied;
use super::history::{floor_second, Entry, Event, Millis};
use super::workers::{paused_claim, PAUSED};

/// What a fault was seen to do.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub kind: String,
    /// The sign it fired and mattered, or why there is none.
    pub shown: Result<String, String>,
}

/// What the run left to read: the history, the fake's request log, each lock's backend.
pub struct Evidence<'a> {
    pub entries: &'a [Entry],
    pub requests: &'a [RecordedRequest],
    pub backends: &'a BTreeMap<String, &'static str>,
}

impl Evidence<'_> {
    /// A claim on a lock of `backend` (any backend: None) first seen `Held` after `after`.
    fn granted_after(&self, backend: Option<&str>, after: Millis) -> Result<String, String> {
        let mut first_held: BTreeMap<&str, (Millis, &str)> = BTreeMap::new();
        for entry in self.entries {
            if let Event::Seen(seen) = &entry.event {
                if seen.phase == Some(ClaimPhase::Held) {
                    first_held
                        .entry(seen.claim.as_str())
                        .or_insert((entry.at, seen.lock.as_str()));
                }
            }
        }
        let on_backend = |lock: &str| {
            backend.is_none_or(|wanted| self.backends.get(lock).copied() == Some(wanted))
        };
        first_held
            .iter()
            .filter(|(_, (at, lock))| *at > after && on_backend(lock))
            .min_by_key(|(_, (at, _))| *at)
            .map(|(claim, (at, _))| format!("{claim} granted {} ms after", at - after))
            .ok_or_else(|| {
                format!(
                    "no claim on {} locks granted after it",
                    backend.unwrap_or("any")
                )
            })
    }
}

/// The outcome of every fault applied by the schedule.
pub fn of_schedule(applied: &[Applied], evidence: &Evidence) -> Vec<Outcome> {
    applied
        .iter()
        .enumerate()
        .map(|(index, fault)| {
            // Requests answered until the next fault of its kind are this one's.
            let next = applied[index + 1..]
                .iter()
                .find(|later| later.fault.kind == fault.fault.kind)
                .map(|later| later.began);
            Outcome {
                kind: fault.fault.kind.to_owned(),
                shown: fault
                    .seen
                    .clone()
                    .and_then(|seen| Ok(format!("{seen}; {}", after_it(fault, next, evidence)?))),
            }
        })
        .collect()
}

/// The sign a fault leaves after it ends (requests counted until `next`, the next fault of
/// its kind).
fn after_it(
    applied: &Applied,
    next: Option<Instant>,
    evidence: &Evidence,
) -> Result<String, String> {
    let kind = applied.fault.kind;
    let since = |request: &&RecordedRequest| {
        request.received >= applied.began && next.is_none_or(|next| request.received < next)
    };
    if kind.starts_with("leader") {
        return evidence.granted_after(None, applied.ended_at);
    }
    if kind.starts_with("standby") {
        return Ok("leader kept".into());
    }
    if kind.starts_with("watches") {
        // The leader's lock watch came back: a new watch, or a list after a 410 (a watch that
        // resumes from the newest resourceVersion, as after a bookmark, gets no 410).
        return evidence
            .requests
            .iter()
            .filter(since)
            .find(|r| (r.verb == "list" || r.verb == "watch") && r.resource == "distributedlocks")
            .map(|r| format!("the locks' watch came back ({})", r.verb))
            .ok_or_else(|| "the locks were neither watched nor listed again after it".to_owned());
    }
    if let Some(status) = kind.strip_prefix("injected ") {
        let status: u16 = status[..3].parse().expect("status");
        let answered = evidence
            .requests
            .iter()
            .filter(since)
            .filter(|r| r.injected_fault && r.status == status)
            .count();
        return match answered {
            0 => Err(format!("no write answered {status}")),
            n => Ok(format!("{n} writes answered {status}")),
        };
    }
    if kind.starts_with("slow") {
        let delay = applied.fault.delay;
        return evidence
            .requests
            .iter()
            .filter(since)
            .filter(|r| r.received <= applied.ended)
            .filter(|r| r.answered.duration_since(r.received) >= delay)
            .count()
            .checked_sub(1)
            .map(|more| format!("{} requests {} ms late", more + 1, delay.as_millis()))
            .ok_or_else(|| "no request answered late".to_owned());
    }
    let backend = if kind.starts_with("Redis") {
        "redis"
    } else {
        "mongo"
    };
    evidence.granted_after(Some(backend), applied.ended_at)
}

/// The outcome of every worker that paused past its lease: its grant ended while it slept
/// (seen ended by the controller, or the last `expiresAt` it was shown `Held` with is before
/// the worker ended it), and what became of its stale write.
pub fn of_pauses(evidence: &Evidence) -> Vec<Outcome> {
    let mut outcomes = Vec::new();
    for entry in evidence.entries {
        let Event::Fault { kind, detail } = &entry.event else {
            continue;
        };
        let Some(claim) = paused_claim(detail).filter(|_| kind == PAUSED) else {
            continue;
        };
        outcomes.push(Outcome {
            kind: kind.clone(),
            shown: lost_lease(claim, evidence).and_then(|lost| {
                match stale_write(claim, evidence).transpose()? {
                    Some(write) => Ok(format!("{lost}; {write}")),
                    None => Ok(lost),
                }
            }),
        });
    }
    outcomes
}

fn lost_lease(claim: &str, evidence: &Evidence) -> Result<String, String> {
    let mut last_expiry = None;
    let mut ended_by_controller = None;
    let mut ended_here = None;
    for entry in evidence.entries {
        match &entry.event {
            Event::Seen(seen) if seen.claim == claim => match seen.phase {
                Some(ClaimPhase::Held) => last_expiry = last_expiry.max(seen.expires_at),
                Some(phase @ (ClaimPhase::Expired | ClaimPhase::Failed)) => {
                    ended_by_controller.get_or_insert(phase);
                }
                _ => {}
            },
            Event::Ended { claim: ended, .. } if ended == claim => {
                ended_here.get_or_insert(entry.at);
            }
            _ => {}
        }
    }
    if let Some(phase) = ended_by_controller {
        return Ok(format!("{phase:?}"));
    }
    match (last_expiry, ended_here) {
        (Some(expiry), Some(ended)) if expiry <= floor_second(ended) => Ok(format!(
            "its lease ran out {} ms before it woke",
            floor_second(ended) - expiry
        )),
        (expiry, ended) => Err(format!(
            "{claim} was not seen to lose its lease: last expiresAt {expiry:?}, ended {ended:?}"
        )),
    }
}

/// What became of the paused claim's write: refused when a later holder of its lock had
/// written before it (an `Err` if it was accepted then), None when it made none.
fn stale_write(claim: &str, evidence: &Evidence) -> Option<Result<String, String>> {
    let writes: Vec<(&str, &str, i64, bool)> = evidence
        .entries
        .iter()
        .filter_map(|entry| match &entry.event {
            Event::Write {
                lock,
                claim,
                token,
                accepted,
                ..
            } => Some((lock.as_str(), claim.as_str(), *token, *accepted)),
            _ => None,
        })
        .collect();
    let at = writes.iter().position(|(_, name, ..)| *name == claim)?;
    let (lock, _, token, accepted) = writes[at];
    let overtaken = writes[..at]
        .iter()
        .any(|(other, _, later, accepted)| *other == lock && *accepted && *later > token);
    Some(match (overtaken, accepted) {
        (true, false) => Ok(STALE_WRITE_REFUSED.to_owned()),
        (true, true) => Err(format!(
            "{claim}'s stale write (token {token}) was accepted after a later holder's"
        )),
        (false, _) => Ok("nobody wrote while it slept".to_owned()),
    })
}

/// What [`of_pauses`] says of a paused holder whose stale write was refused.
pub const STALE_WRITE_REFUSED: &str = "its stale write was refused";
