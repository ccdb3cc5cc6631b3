//! Which planned calls run, and what a claim's calls came to.
//!
//! The shell runs [`Plan::ops`](super::Plan::ops) in order through an [`ExecutionGate`]; the
//! fold reads the answers back through [`step_outcome`] and [`member_tokens`]. Each call of a
//! claim belongs to one *step* ([`Step`]): its lead call, then — for a claim on several
//! locks, which holds all of them or none — the follow-ups on its other locks, then the
//! give-backs that run when the step leaves the claim without its grant. Every one of those
//! calls is planned by the core; the shell only runs them in order.

use super::ops::{AcquirePurpose, BackendOp, OpOutcome, PlannedOp};

/// Where a call stands in its claim's step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A call on its own, or the one the follow-ups after it depend on.
    Lead {
        /// What a grant's token must be for the step to go on.
        expect: Expect,
    },
    /// On another lock of the claim, right after its lead: made only while the lead and
    /// every follow-up before it went through.
    Follow {
        /// What a grant's token must be for the step to go on.
        expect: Expect,
    },
    /// Made only when the step leaves the claim without its grant (see
    /// [`ExecutionGate::admits`]): gives back what the step's calls may hold.
    GiveBack,
}

impl Step {
    /// A lead call that takes any answer as it comes.
    pub const LEAD: Step = Step::Lead {
        expect: Expect::Any,
    };
}

/// What a granted token must be for a step to go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Any token.
    Any,
    /// A new grant: above every token the lock has announced.
    Above(u64),
    /// A grant taken back: its own recorded token (no other is the same grant).
    Exactly(u64),
}

impl Expect {
    fn accepts(self, token: u64) -> bool {
        match self {
            Expect::Any => true,
            Expect::Above(floor) => token > floor,
            Expect::Exactly(expected) => token == expected,
        }
    }
}

/// How one answer counts for its step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Went through.
    Done,
    /// Refused: busy, no longer held, or granted with another token than expected.
    Refused,
    /// The backend failed.
    Failed,
    /// Not made.
    Skipped,
}

fn verdict(outcome: &OpOutcome, expect: Expect) -> Verdict {
    match outcome {
        OpOutcome::Failed { .. } => Verdict::Failed,
        OpOutcome::Skipped => Verdict::Skipped,
        OpOutcome::Busy { .. } | OpOutcome::Extended { still_held: false } => Verdict::Refused,
        OpOutcome::Granted { fencing_token, .. } if !expect.accepts(*fencing_token) => {
            Verdict::Refused
        }
        _ => Verdict::Done,
    }
}

fn is_grant(op: &BackendOp) -> bool {
    matches!(
        op,
        BackendOp::Acquire {
            purpose: AcquirePurpose::Grant,
            ..
        }
    )
}

/// The step being run: whose, whether it grants, and how it went so far.
#[derive(Debug, Clone)]
struct StepState {
    claim: Option<String>,
    grant: bool,
    verdict: Verdict,
}

impl StepState {
    /// Whether the step leaves the claim without its grant: refused, or (a new grant) failed.
    /// A renewal or a re-attach that failed keeps what the API records until the backend
    /// answers again.
    fn gives_back(&self) -> bool {
        self.verdict == Verdict::Refused || (self.grant && self.verdict == Verdict::Failed)
    }
}

/// Decides which planned calls run: after a failure on the pass's own lock nothing more runs
/// there; after a refused grant no later grant runs (FIFO: nobody overtakes the head of the
/// queue); a follow-up runs only while its step goes through, a give-back only when it did
/// not.
#[derive(Debug, Clone, Default)]
pub struct ExecutionGate {
    failed: bool,
    grants_blocked: bool,
    step: Option<StepState>,
}

impl ExecutionGate {
    /// Whether `planned` should be performed, given what ran before.
    pub fn admits(&self, planned: &PlannedOp) -> bool {
        match planned.step {
            Step::Lead { .. } => {
                // Another lock's backend failing says nothing about this lock's.
                let stopped_here = planned.on_lock.is_none() && self.failed;
                let overtakes = self.grants_blocked && is_grant(&planned.op);
                !stopped_here && !overtakes
            }
            Step::Follow { .. } => self
                .step_of(planned)
                .is_some_and(|step| step.verdict == Verdict::Done),
            Step::GiveBack => self.step_of(planned).is_some_and(StepState::gives_back),
        }
    }

    /// Records the outcome of a performed `planned` call.
    pub fn record(&mut self, planned: &PlannedOp, outcome: &OpOutcome) {
        match planned.step {
            Step::Lead { expect } => {
                if planned.on_lock.is_none() && matches!(outcome, OpOutcome::Failed { .. }) {
                    self.failed = true;
                }
                let step = StepState {
                    claim: planned.claim.clone(),
                    grant: is_grant(&planned.op),
                    verdict: verdict(outcome, expect),
                };
                self.grants_blocked |= step.grant && step.verdict != Verdict::Done;
                self.step = Some(step);
            }
            Step::Follow { expect } => {
                // Admitted only while its step went through: its answer is the step's now.
                if let Some(step) = self
                    .step
                    .as_mut()
                    .filter(|step| step.claim == planned.claim)
                {
                    step.verdict = verdict(outcome, expect);
                    self.grants_blocked |= step.grant && step.verdict != Verdict::Done;
                }
            }
            // What a give-back answers changes nothing: a grant not given back now is given
            // back by a later pass.
            Step::GiveBack => {}
        }
    }

    fn step_of(&self, planned: &PlannedOp) -> Option<&StepState> {
        self.step
            .as_ref()
            .filter(|step| step.claim == planned.claim)
    }
}

/// The calls of the step led by `ops[lead]` that come after it (its follow-ups and
/// give-backs, which the plan lays out right after their lead), with their indices.
fn rest_of_step(ops: &[PlannedOp], lead: usize) -> impl Iterator<Item = (usize, &PlannedOp)> {
    ops.iter()
        .enumerate()
        .skip(lead + 1)
        .take_while(|(_, planned)| !matches!(planned.step, Step::Lead { .. }))
}

/// The answer to `ops[index]` (a call with no answer was not made).
pub(super) fn answer(outcomes: &[OpOutcome], index: usize) -> &OpOutcome {
    outcomes.get(index).unwrap_or(&OpOutcome::Skipped)
}

/// What the step led by `ops[lead]` came to for its claim: the lead's answer, unless a
/// follow-up did not go through — then that one's (a grant with another token than
/// expected counts as busy: it is not the grant asked for).
pub fn step_outcome(ops: &[PlannedOp], outcomes: &[OpOutcome], lead: usize) -> OpOutcome {
    let led = answer(outcomes, lead).clone();
    let went_through = match ops.get(lead).map(|planned| planned.step) {
        Some(Step::Lead { expect }) => verdict(&led, expect) == Verdict::Done,
        _ => false,
    };
    if !went_through {
        // No follow-up was made: the lead's answer says it all.
        return led;
    }
    for (index, planned) in rest_of_step(ops, lead) {
        let Step::Follow { expect } = planned.step else {
            continue;
        };
        let outcome = answer(outcomes, index);
        match verdict(outcome, expect) {
            Verdict::Done => {}
            Verdict::Refused if matches!(outcome, OpOutcome::Granted { .. }) => {
                return OpOutcome::Busy { retry_after: None }
            }
            // Skipped too: the pass stopped (leadership lost) before the step was whole.
            _ => return outcome.clone(),
        }
    }
    led
}

/// The grants the step led by `ops[lead]` took on other locks: `(lock, token)`.
pub fn member_tokens(ops: &[PlannedOp], outcomes: &[OpOutcome], lead: usize) -> Vec<(String, u64)> {
    rest_of_step(ops, lead)
        .filter(|(_, planned)| matches!(planned.step, Step::Follow { .. }))
        .filter_map(
            |(index, planned)| match (&planned.on_lock, answer(outcomes, index)) {
                (Some(lock), OpOutcome::Granted { fencing_token, .. }) => {
                    Some((lock.clone(), *fencing_token))
                }
                _ => None,
            },
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn lead(claim: &str, op: BackendOp) -> PlannedOp {
        PlannedOp {
            claim: Some(claim.to_owned()),
            op,
            on_lock: None,
            step: Step::LEAD,
        }
    }

    fn acquire(owner: &str, purpose: AcquirePurpose) -> BackendOp {
        BackendOp::Acquire {
            owner: owner.to_owned(),
            ttl: Duration::from_secs(1),
            purpose,
            shared: false,
            queue: false,
        }
    }

    fn release(owner: &str) -> BackendOp {
        BackendOp::Release {
            owner: owner.to_owned(),
            involuntary: false,
        }
    }

    fn granted(token: u64) -> OpOutcome {
        OpOutcome::Granted {
            fencing_token: token,
            already_held: false,
        }
    }

    const BUSY: OpOutcome = OpOutcome::Busy { retry_after: None };

    #[test]
    fn gate_stops_everything_on_the_lock_after_a_failure() {
        let mut gate = ExecutionGate::default();
        let release = lead("x", release("x"));
        assert!(gate.admits(&release));
        gate.record(
            &release,
            &OpOutcome::Failed {
                message: "down".to_owned(),
            },
        );
        assert!(!gate.admits(&release));
        assert!(!gate.admits(&PlannedOp {
            claim: None,
            ..lead("x", BackendOp::RaiseFloor { floor: 1 })
        }));
        // Another lock's backend is another matter.
        let elsewhere = PlannedOp {
            on_lock: Some("b".to_owned()),
            ..release
        };
        assert!(gate.admits(&elsewhere));
    }

    #[test]
    fn gate_stops_later_grants_after_a_refused_grant_only() {
        let mut gate = ExecutionGate::default();
        let grant = lead("x", acquire("x", AcquirePurpose::Grant));
        let reattach = lead("y", acquire("y", AcquirePurpose::Reattach));
        gate.record(&reattach, &BUSY);
        assert!(
            gate.admits(&grant),
            "a lost re-attach does not block grants"
        );
        gate.record(&grant, &BUSY);
        assert!(!gate.admits(&grant));
        assert!(gate.admits(&lead("z", release("z"))));
    }

    /// A claim on `a` (the pass's lock) and `b`: its grant step.
    fn grant_step() -> Vec<PlannedOp> {
        let on_b = |op, step| PlannedOp {
            on_lock: Some("b".to_owned()),
            step,
            ..lead("m", op)
        };
        vec![
            PlannedOp {
                step: Step::Lead {
                    expect: Expect::Above(3),
                },
                ..lead("m", acquire("m", AcquirePurpose::Grant))
            },
            on_b(
                acquire("m", AcquirePurpose::Grant),
                Step::Follow {
                    expect: Expect::Above(5),
                },
            ),
            PlannedOp {
                step: Step::GiveBack,
                ..lead("m", release("m"))
            },
            on_b(release("m"), Step::GiveBack),
            lead("n", acquire("n", AcquirePurpose::Grant)),
        ]
    }

    /// Runs `ops` through a gate with the answers `answers` gives the calls it admits.
    fn run(ops: &[PlannedOp], mut answers: Vec<OpOutcome>) -> Vec<OpOutcome> {
        let mut gate = ExecutionGate::default();
        answers.reverse();
        ops.iter()
            .map(|planned| {
                if !gate.admits(planned) {
                    return OpOutcome::Skipped;
                }
                let outcome = answers.pop().expect("an answer per admitted call");
                gate.record(planned, &outcome);
                outcome
            })
            .collect()
    }

    #[test]
    fn a_step_that_goes_through_gives_nothing_back() {
        let ops = grant_step();
        let outcomes = run(&ops, vec![granted(4), granted(6), granted(7)]);
        assert_eq!(outcomes[2..4], [OpOutcome::Skipped, OpOutcome::Skipped]);
        assert_eq!(outcomes[4], granted(7), "the next grant runs");
        assert_eq!(step_outcome(&ops, &outcomes, 0), granted(4));
        assert_eq!(member_tokens(&ops, &outcomes, 0), [("b".to_owned(), 6)]);
    }

    #[test]
    fn a_step_cut_short_is_no_grant() {
        // Leadership lost between the lead and the follow-up: the lead went through, the
        // follow-up was never made.
        let ops = grant_step();
        let outcomes = [granted(4), OpOutcome::Skipped];
        assert_eq!(step_outcome(&ops, &outcomes, 0), OpOutcome::Skipped);
        // A step's follow-ups end at the next lead: the next claim's grant is not this one's.
        let mut outcomes = vec![
            granted(4),
            granted(6),
            OpOutcome::Skipped,
            OpOutcome::Skipped,
        ];
        outcomes.push(OpOutcome::Busy { retry_after: None });
        let mut ops = ops;
        ops[4].step = Step::Follow {
            expect: Expect::Any,
        };
        ops[4].claim = Some("m".to_owned());
        assert_eq!(
            step_outcome(&ops, &outcomes, 0),
            BUSY,
            "a follow-up of the step"
        );
        ops[4].step = Step::LEAD;
        assert_eq!(step_outcome(&ops, &outcomes, 0), granted(4), "another step");
    }

    #[test]
    fn a_refused_follow_up_gives_everything_back_and_blocks_later_grants() {
        let ops = grant_step();
        let released = OpOutcome::Released { was_held: true };
        let outcomes = run(&ops, vec![granted(4), BUSY, released.clone(), released]);
        assert_eq!(outcomes[4], OpOutcome::Skipped, "nobody overtakes the head");
        assert_eq!(step_outcome(&ops, &outcomes, 0), BUSY);
        assert!(member_tokens(&ops, &outcomes, 0).is_empty());
    }

    #[test]
    fn a_token_not_above_the_high_water_is_a_refusal() {
        let ops = grant_step();
        let released = OpOutcome::Released { was_held: true };
        let outcomes = run(
            &ops,
            vec![granted(4), granted(5), released.clone(), released.clone()],
        );
        assert_eq!(step_outcome(&ops, &outcomes, 0), BUSY);
        // The lead's own: no follow-up is made, and the lead's answer says it all.
        let outcomes = run(&ops, vec![granted(3), released.clone(), released]);
        assert_eq!(outcomes[1], OpOutcome::Skipped);
        assert_eq!(step_outcome(&ops, &outcomes, 0), granted(3));
    }

    #[test]
    fn a_failed_renewal_elsewhere_keeps_the_grant_a_lost_one_gives_back() {
        let extend = |claim: &str| BackendOp::Extend {
            owner: claim.to_owned(),
            ttl: Duration::from_secs(1),
        };
        let ops = vec![
            lead("m", extend("m")),
            PlannedOp {
                on_lock: Some("b".to_owned()),
                step: Step::Follow {
                    expect: Expect::Any,
                },
                ..lead("m", extend("m"))
            },
            PlannedOp {
                on_lock: Some("b".to_owned()),
                step: Step::GiveBack,
                ..lead("m", release("m"))
            },
        ];
        let held = OpOutcome::Extended { still_held: true };
        let failed = OpOutcome::Failed {
            message: "down".to_owned(),
        };
        let outcomes = run(&ops, vec![held.clone(), failed.clone()]);
        assert_eq!(outcomes[2], OpOutcome::Skipped);
        assert_eq!(step_outcome(&ops, &outcomes, 0), failed);
        let lost = OpOutcome::Extended { still_held: false };
        let released = OpOutcome::Released { was_held: true };
        let outcomes = run(&ops, vec![held, lost.clone(), released.clone()]);
        assert_eq!(outcomes[2], released);
        assert_eq!(step_outcome(&ops, &outcomes, 0), lost);
    }
}
