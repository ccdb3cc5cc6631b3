//! The checker: reads a complete history and reports, per lock, every violation of the
//! contract it can see. Grants are the intervals the statuses promised (from `acquiredAt` to
//! the earliest of the last `expiresAt` shown while `Held`, `releasedAt`, the holder's own
//! release and the claim's deletion); the statuses' times have whole-second resolution, so the
//! test's own times are rounded down to the second before they are compared with them.

use std::collections::{BTreeMap, BTreeSet};

use turnstile_api::ClaimPhase;

use super::effects::Outcome;
use super::history::{floor_second, Ending, Entry, Event, Millis};

/// For a claim with no recorded arrival (created while no controller watched): how long it
/// must have existed before a grant behind it counts as overtaking it, since the controller
/// may run a pass whose cache does not show that claim yet. Claims with recorded arrivals get
/// no allowance: the controller saw the earlier one before the later one, so every pass that
/// sees the later one sees it too.
pub const FIFO_MARGIN_MS: Millis = 2_000;

/// One lock of the run, as the checker needs to know it.
#[derive(Debug, Clone)]
pub struct LockUnderTest {
    pub name: String,
    pub max_holders: usize,
    pub lease_seconds: i64,
    /// Longest time the lock may stay free while claims wait, beyond one lease: covers a
    /// leader failover (the leader-election lease) and a backend's retry backoff.
    pub free_margin_ms: Millis,
}

/// The kinds of violation, in the table's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    OverCapacity,
    TokenRegression,
    LostUpdate,
    FifoViolation,
    NeverServed,
    StuckFree,
    LeftInBackend,
}

impl Kind {
    pub const ALL: [Kind; 7] = [
        Kind::OverCapacity,
        Kind::TokenRegression,
        Kind::LostUpdate,
        Kind::FifoViolation,
        Kind::NeverServed,
        Kind::StuckFree,
        Kind::LeftInBackend,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::OverCapacity => "grants beyond maxHolders",
            Kind::TokenRegression => "fencing-token regressions",
            Kind::LostUpdate => "lost updates (register)",
            Kind::FifoViolation => "FIFO violations",
            Kind::NeverServed => "claims never Held nor terminal",
            Kind::StuckFree => "locks stuck free with waiters",
            Kind::LeftInBackend => "grants left in the backend",
        }
    }
}

/// One violation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub kind: Kind,
    pub lock: String,
    pub detail: String,
}

/// What the checker found.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// Operations by kind (claims created, grants, register reads/writes, ...).
    pub operations: BTreeMap<&'static str, usize>,
    /// Faults by kind.
    pub faults: BTreeMap<String, usize>,
    /// The fault kinds the run was to apply, each at least once (filled in by the run).
    pub expected_faults: BTreeSet<&'static str>,
    /// What each fault was seen to do (filled in by the run, from `effects`).
    pub effects: Vec<Outcome>,
    pub violations: Vec<Violation>,
}

impl Report {
    /// Violations of `kind`.
    pub fn count(&self, kind: Kind) -> usize {
        self.violations.iter().filter(|v| v.kind == kind).count()
    }

    /// The faults that showed no effect (or did not fire), one line each.
    pub fn ineffective(&self) -> Vec<String> {
        self.effects
            .iter()
            .filter_map(|outcome| {
                let why = outcome.shown.as_ref().err()?;
                Some(format!("{}: {why}", outcome.kind))
            })
            .collect()
    }

    /// How many faults of `kind` showed their effect.
    pub fn effective(&self, kind: &str) -> usize {
        self.effects
            .iter()
            .filter(|outcome| outcome.kind == kind && outcome.shown.is_ok())
            .count()
    }
}

/// Everything the history says about one claim.
#[derive(Debug, Default, Clone)]
struct ClaimFacts {
    lock: String,
    /// Server creation time (queue order, with the name, without an arrival).
    created: Option<Millis>,
    /// `status.arrivedAt` in microseconds (queue order, with the name).
    arrived: Option<i64>,
    /// When the test's create call returned.
    created_here: Option<Millis>,
    acquired: Option<Millis>,
    tokens: BTreeSet<i64>,
    max_expires_held: Option<Millis>,
    terminal: Option<ClaimPhase>,
    terminal_seen: Option<Millis>,
    released_at: Option<Millis>,
    ended_here: Option<Millis>,
    gone: Option<Millis>,
    /// When the worker saw it `Held` (the grant was made before).
    worker_saw_held: Option<Millis>,
}

impl ClaimFacts {
    /// The end of the promised grant (None: still held when the history ends).
    fn grant_end(&self) -> Option<Millis> {
        [
            self.max_expires_held,
            self.released_at,
            self.ended_here.map(floor_second),
            self.gone.map(floor_second),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// When it stopped waiting: granted, ended or gone (None: waiting still).
    fn wait_end(&self) -> Option<Millis> {
        [
            self.acquired,
            self.worker_saw_held,
            self.terminal_seen,
            self.ended_here,
            self.gone,
        ]
        .into_iter()
        .flatten()
        .min()
    }
}

fn facts(entries: &[Entry]) -> BTreeMap<String, ClaimFacts> {
    let mut claims: BTreeMap<String, ClaimFacts> = BTreeMap::new();
    for entry in entries {
        match &entry.event {
            Event::Seen(seen) => {
                let facts = claims.entry(seen.claim.clone()).or_default();
                facts.lock.clone_from(&seen.lock);
                facts.created = Some(seen.created);
                facts.arrived = facts.arrived.or(seen.arrived);
                if seen.phase == Some(ClaimPhase::Held) {
                    if let Some(acquired) = seen.acquired_at {
                        facts.acquired = Some(facts.acquired.map_or(acquired, |a| a.min(acquired)));
                    }
                    facts.tokens.extend(seen.token);
                    facts.max_expires_held = facts.max_expires_held.max(seen.expires_at);
                }
                if let Some(phase) = seen.phase.filter(|phase| phase.is_terminal()) {
                    if facts.terminal.is_none() {
                        facts.terminal = Some(phase);
                        facts.terminal_seen = Some(entry.at);
                    }
                    facts.released_at = facts.released_at.or(seen.released_at);
                }
            }
            Event::Gone { claim } => {
                let facts = claims.entry(claim.clone()).or_default();
                facts.gone.get_or_insert(entry.at);
            }
            Event::Created { lock, claim, .. } => {
                let facts = claims.entry(claim.clone()).or_default();
                facts.lock.clone_from(lock);
                facts.created_here = Some(entry.at);
            }
            Event::SawHeld { claim, .. } => {
                let facts = claims.entry(claim.clone()).or_default();
                facts.worker_saw_held.get_or_insert(entry.at);
            }
            Event::Ended { claim, .. } => {
                let facts = claims.entry(claim.clone()).or_default();
                facts.ended_here.get_or_insert(entry.at);
            }
            _ => {}
        }
    }
    claims
}

fn count_operations(entries: &[Entry], claims: &BTreeMap<String, ClaimFacts>) -> Report {
    let mut report = Report::default();
    let mut add = |name: &'static str| *report.operations.entry(name).or_default() += 1;
    for entry in entries {
        match &entry.event {
            Event::Created { pod_owned, .. } => {
                add("claims created");
                if *pod_owned {
                    add("  of them Pod-owned");
                }
            }
            Event::Ended { ending, .. } => add(match ending {
                Ending::Delete => "ended: claim deleted",
                Ending::Release => "ended: spec.release",
                Ending::PodSucceeded => "ended: Pod Succeeded",
                Ending::PodDeleted => "ended: Pod deleted",
                Ending::GaveUp => "ended: gave up waiting",
            }),
            Event::Read { value, .. } => add(if value.is_some() {
                "register reads"
            } else {
                "register reads refused"
            }),
            Event::Write { accepted, .. } => add(if *accepted {
                "register writes"
            } else {
                "register writes refused"
            }),
            Event::Seen(_) | Event::Gone { .. } => add("claim statuses watched"),
            Event::SawHeld { .. } | Event::Fault { .. } => {}
        }
    }
    let grants = claims.values().filter(|c| c.acquired.is_some()).count();
    report.operations.insert("grants", grants);
    let expired = claims
        .values()
        .filter(|c| c.terminal == Some(ClaimPhase::Expired))
        .count();
    report.operations.insert("grants expired", expired);
    for entry in entries {
        if let Event::Fault { kind, .. } = &entry.event {
            *report.faults.entry(kind.clone()).or_default() += 1;
        }
    }
    report
}

/// Checks `entries` for the `locks` of the run; `left_in_backend` are the grants the
/// backends still had once every claim was deleted (lock, description).
pub fn check(
    entries: &[Entry],
    locks: &[LockUnderTest],
    left_in_backend: &[(String, String)],
) -> Report {
    let claims = facts(entries);
    let mut report = count_operations(entries, &claims);
    let history_end = entries.iter().map(|e| e.at).max().unwrap_or_default();
    for lock in locks {
        let mine: Vec<(&String, &ClaimFacts)> =
            claims.iter().filter(|(_, c)| c.lock == lock.name).collect();
        let mut found = Vec::new();
        over_capacity(lock, &mine, &mut found);
        token_regressions(&mine, &mut found);
        fifo(&mine, &mut found);
        never_served(&mine, &mut found);
        stuck_free(lock, &mine, history_end, &mut found);
        report
            .violations
            .extend(found.into_iter().map(|(kind, detail)| Violation {
                kind,
                lock: lock.name.clone(),
                detail,
            }));
    }
    lost_updates(entries, &mut report.violations);
    report
        .violations
        .extend(left_in_backend.iter().map(|(lock, detail)| Violation {
            kind: Kind::LeftInBackend,
            lock: lock.clone(),
            detail: detail.clone(),
        }));
    report
}

type Found = Vec<(Kind, String)>;

fn over_capacity(lock: &LockUnderTest, claims: &[(&String, &ClaimFacts)], found: &mut Found) {
    // (time, +1 start / -1 end, claim); ends sort before starts at the same instant.
    let mut points: Vec<(Millis, i32, &str)> = Vec::new();
    for (name, facts) in claims {
        let Some(start) = facts.acquired else {
            continue;
        };
        let end = facts.grant_end().unwrap_or(Millis::MAX);
        if end > start {
            points.push((start, 1, name.as_str()));
            points.push((end, -1, name.as_str()));
        }
    }
    points.sort();
    let mut holding: BTreeSet<&str> = BTreeSet::new();
    for (at, step, name) in points {
        if step < 0 {
            holding.remove(name);
            continue;
        }
        holding.insert(name);
        if holding.len() > lock.max_holders {
            found.push((
                Kind::OverCapacity,
                format!("{} holders at {at}: {holding:?}", holding.len()),
            ));
        }
    }
}

fn token_regressions(claims: &[(&String, &ClaimFacts)], found: &mut Found) {
    let mut owners: BTreeMap<i64, &str> = BTreeMap::new();
    for (name, facts) in claims {
        if facts.tokens.len() > 1 {
            found.push((
                Kind::TokenRegression,
                format!("{name} held with several tokens {:?}", facts.tokens),
            ));
        }
        for token in &facts.tokens {
            if let Some(other) = owners.insert(*token, name) {
                found.push((
                    Kind::TokenRegression,
                    format!("token {token} granted to {other} and {name}"),
                ));
            }
        }
    }
    let granted: Vec<(&str, Millis, i64)> = claims
        .iter()
        .filter_map(|(name, f)| Some((name.as_str(), f.acquired?, *f.tokens.iter().next()?)))
        .collect();
    for (a, a_at, a_token) in &granted {
        for (b, b_at, b_token) in &granted {
            if a_at < b_at && a_token > b_token {
                found.push((
                    Kind::TokenRegression,
                    format!("{b} granted after {a} with a lower token ({b_token} < {a_token})"),
                ));
            }
        }
    }
}

fn fifo(claims: &[(&String, &ClaimFacts)], found: &mut Found) {
    // The controller's order: arrival, else the creation second; then name.
    let key = |name: &str, facts: &ClaimFacts| {
        let created = facts.created.map(|ms| ms.saturating_mul(1_000));
        (
            facts.arrived.or(created).unwrap_or(i64::MAX),
            name.to_owned(),
        )
    };
    for (later, x) in claims {
        let Some(granted) = x.acquired else { continue };
        for (earlier, y) in claims {
            let Some(y_here) = y.created_here.or(y.created) else {
                continue;
            };
            let waited_past_grant = y.wait_end().is_none_or(|end| end > granted + 1_000);
            let both_arrived = x.arrived.is_some() && y.arrived.is_some();
            if key(earlier, y) < key(later, x)
                && (both_arrived || y_here + FIFO_MARGIN_MS <= granted)
                && waited_past_grant
            {
                found.push((
                    Kind::FifoViolation,
                    format!(
                        "{later} granted at {granted} while earlier {earlier} waited \
                         (created {:?}, arrived {:?}, created here {y_here}, acquired {:?}, \
                         seen Held by its worker {:?}, terminal {:?} seen {:?}, ended {:?}, \
                         gone {:?})",
                        y.created,
                        y.arrived,
                        y.acquired,
                        y.worker_saw_held,
                        y.terminal,
                        y.terminal_seen,
                        y.ended_here,
                        y.gone
                    ),
                ));
            }
        }
    }
}

fn never_served(claims: &[(&String, &ClaimFacts)], found: &mut Found) {
    for (name, facts) in claims {
        let served =
            facts.acquired.is_some() || facts.worker_saw_held.is_some() || facts.terminal.is_some();
        if facts.created_here.is_some() && !served {
            found.push((
                Kind::NeverServed,
                format!("{name} was never Held and never reached a terminal phase"),
            ));
        }
    }
}

fn stuck_free(
    lock: &LockUnderTest,
    claims: &[(&String, &ClaimFacts)],
    history_end: Millis,
    found: &mut Found,
) {
    // (time, holders delta, waiters delta)
    let mut points: Vec<(Millis, i32, i32)> = Vec::new();
    for (_, facts) in claims {
        if let Some(start) = facts.acquired {
            let end = facts.grant_end().unwrap_or(history_end);
            points.push((start, 1, 0));
            points.push((end.max(start), -1, 0));
        }
        if let Some(created) = facts.created_here.or(facts.created) {
            let end = facts.wait_end().unwrap_or(history_end).max(created);
            points.push((created, 0, 1));
            points.push((end, 0, -1));
        }
    }
    points.sort();
    let limit = lock.lease_seconds * 1000 + lock.free_margin_ms;
    let (mut holders, mut waiters) = (0, 0);
    let mut free_since: Option<Millis> = None;
    for (at, dh, dw) in points {
        holders += dh;
        waiters += dw;
        match (holders == 0 && waiters > 0, free_since) {
            (true, None) => free_since = Some(at),
            (false, Some(since)) => {
                if at - since > limit {
                    found.push((
                        Kind::StuckFree,
                        format!("free with waiters for {} ms from {since}", at - since),
                    ));
                }
                free_since = None;
            }
            _ => {}
        }
    }
}

fn lost_updates(entries: &[Entry], violations: &mut Vec<Violation>) {
    for entry in entries {
        if let Event::Write {
            lock,
            claim,
            token,
            read,
            previous,
            accepted: true,
            ..
        } = &entry.event
        {
            if read != previous {
                violations.push(Violation {
                    kind: Kind::LostUpdate,
                    lock: lock.clone(),
                    detail: format!(
                        "{claim} (token {token}) wrote over {previous} having read {read}"
                    ),
                });
            }
        }
    }
}

/// The report as one table (Markdown), with the seed and the run's length.
pub fn table(report: &Report, seed: u64, seconds: u64, title: &str) -> String {
    let mut out = format!("### {title}: seed {seed}, {seconds} s of load\n\n");
    out.push_str("| what | count |\n| --- | --- |\n");
    for (name, count) in &report.operations {
        out.push_str(&format!("| {name} | {count} |\n"));
    }
    let faults: usize = report.faults.values().sum();
    out.push_str(&format!("| **faults** | **{faults}** |\n"));
    for (kind, count) in &report.faults {
        let shown = report.effective(kind);
        out.push_str(&format!(
            "| fault: {kind} | {count} ({shown} effect shown) |\n"
        ));
    }
    out.push_str(&format!(
        "| **violations** | **{}** |\n",
        report.violations.len()
    ));
    for kind in Kind::ALL {
        out.push_str(&format!(
            "| violation: {} | {} |\n",
            kind.name(),
            report.count(kind)
        ));
    }
    for violation in report.violations.iter().take(20) {
        out.push_str(&format!(
            "\n- {} on {}: {}",
            violation.kind.name(),
            violation.lock,
            violation.detail
        ));
    }
    for fault in report.ineffective().iter().take(20) {
        out.push_str(&format!("\n- fault without effect: {fault}"));
    }
    out.push_str(&format!(
        "\n\nreproduce the schedule: TURNSTILE_CHAOS_SEED={seed}\n"
    ));
    out
}
