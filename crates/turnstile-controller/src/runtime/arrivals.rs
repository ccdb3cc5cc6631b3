//! When each claim arrived: the queue's order after priority, to the event rather than to the
//! second.
//!
//! The API server stamps `creationTimestamp` in whole seconds, so claims created within one
//! second cannot be told apart by it. Its watch, though, delivers creations in the order etcd
//! committed them. The claim watch's events pass through here (via the claim index) before the
//! cache sees them, and each claim the watch shows for the first time is given an arrival: a
//! microsecond time that is strictly later than every arrival seen or given before, so that
//! the order of arrivals is the order of delivery. The pass writes it into the claim's first
//! status (`status.arrivedAt`, in a write the claim gets anyway), after which the status is the
//! record and the stamp here is dropped: restarts and leader changes keep the order.
//!
//! A gated Job or Pod arrives when its own watch first delivers it, and the claim the gate
//! makes for it takes that arrival ([`Arrivals::expect`]): the gate handles several workloads
//! at once, so their claims may be created in another order than the workloads were.
//!
//! A claim the watch shows first in a *list* (the initial one at start-up, or a re-list after
//! an outage) with no status at all was created while no controller watched (or moments
//! before this one did): it arrived after every claim whose arrival is recorded, and before
//! any the watch delivers later, but its place among the others of the list is unknown. When
//! the list ends, such claims are stamped in `creationTimestamp`-then-name order, after every
//! recorded arrival. A listed claim *with* a status but no arrival was queued by a controller
//! from before `arrivedAt` existed: it keeps no arrival and queues by `creationTimestamp`
//! (from the start of that second), then name, as it did.

use std::collections::{HashMap, HashSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use turnstile_api::{arrival_micros, LockClaim, Micros};

/// The arrivals given to claims whose status does not record one yet.
#[derive(Debug, Clone, Default)]
pub struct Arrivals {
    /// Stamps not yet seen in a status, by claim uid.
    stamped: HashMap<String, Micros>,
    /// The latest arrival given or seen in any status: the next one is later (a new leader
    /// whose clock is behind the old one's still queues new claims behind the old ones).
    latest: Micros,
    /// During a re-list: the uids listed so far (stamps of claims not listed are dropped at
    /// its end: those claims were deleted meanwhile).
    relisted: Option<HashSet<String>>,
    /// During a re-list: the listed claims no controller has queued yet (no status), as
    /// `(creation second in microseconds, name, uid)`, stamped when it ends.
    unqueued: Vec<(Micros, String, String)>,
    /// Gated workloads' arrivals, by workload uid, until their claim is made.
    workloads: HashMap<String, Micros>,
    /// The arrival a claim about to be created takes, by `(namespace, name)`: its workload's.
    expected: HashMap<(String, String), Micros>,
}

impl Arrivals {
    /// A claim the watch shows, changed or new; `known` says whether the index already held
    /// it (a claim it did not hold arrives now).
    pub fn applied(&mut self, claim: &LockClaim, known: bool, now: Timestamp) {
        let Some(uid) = claim.uid() else { return };
        if let Some(recorded) = recorded(claim) {
            self.latest = self.latest.max(recorded);
            self.stamped.remove(&uid);
            return;
        }
        if known || self.stamped.contains_key(&uid) {
            return;
        }
        let key = (claim.namespace().unwrap_or_default(), claim.name_any());
        let arrival = match self.expected.remove(&key) {
            Some(arrival) => arrival,
            None => self.next_arrival(created_micros(&claim.metadata), now),
        };
        self.stamped.insert(uid, arrival);
    }

    /// A gated workload the watch shows (not in a list): it arrives now, unless it did.
    pub fn workload_applied(&mut self, workload: &ObjectMeta, now: Timestamp) {
        let Some(uid) = workload.uid.as_deref() else {
            return;
        };
        if !self.workloads.contains_key(uid) {
            let arrival = self.next_arrival(created_micros(workload), now);
            self.workloads.insert(uid.to_owned(), arrival);
        }
    }

    /// A gated workload the watch shows gone.
    pub fn workload_deleted(&mut self, workload: &ObjectMeta) {
        if let Some(uid) = workload.uid.as_deref() {
            self.workloads.remove(uid);
        }
    }

    /// The claim `name` in `namespace` is about to be made for the workload `uid`: it takes
    /// the workload's arrival, if the watch showed the workload arrive.
    pub fn expect(&mut self, namespace: &str, name: &str, uid: &str) {
        if let Some(arrival) = self.workloads.get(uid) {
            self.expected
                .insert((namespace.to_owned(), name.to_owned()), *arrival);
        }
    }

    /// The next arrival, for an object created in the second starting at `created`: now, but
    /// later than every arrival so far.
    fn next_arrival(&mut self, created: Micros, now: Timestamp) -> Micros {
        // Not before its own creation second either: a controller clock behind the API
        // server's must not queue a new claim ahead of older ones that queue by
        // `creationTimestamp`.
        let arrival = now
            .as_microsecond()
            .max(self.latest.saturating_add(1))
            .max(created);
        self.latest = arrival;
        arrival
    }

    /// A claim the watch shows gone.
    pub fn deleted(&mut self, claim: &LockClaim) {
        if let Some(uid) = claim.uid() {
            self.stamped.remove(&uid);
        }
        self.expected
            .remove(&(claim.namespace().unwrap_or_default(), claim.name_any()));
    }

    /// A list starts.
    pub fn relist_started(&mut self) {
        self.relisted = Some(HashSet::new());
        self.unqueued.clear();
    }

    /// A claim in a list.
    pub fn listed(&mut self, claim: &LockClaim) {
        let Some(uid) = claim.uid() else { return };
        if let Some(recorded) = recorded(claim) {
            self.latest = self.latest.max(recorded);
        } else if claim.status.is_none() && !self.stamped.contains_key(&uid) {
            self.unqueued.push((
                created_micros(&claim.metadata),
                claim.name_any(),
                uid.clone(),
            ));
        }
        self.relisted.get_or_insert_with(HashSet::new).insert(uid);
    }

    /// The list is complete: stamps of claims it did not show go, and the claims it showed
    /// that no controller has queued arrive now, oldest first.
    pub fn relist_done(&mut self, now: Timestamp) {
        if let Some(listed) = self.relisted.take() {
            self.stamped.retain(|uid, _| listed.contains(uid));
        }
        let mut unqueued = std::mem::take(&mut self.unqueued);
        unqueued.sort();
        for (created, _, uid) in unqueued {
            let arrival = self.next_arrival(created, now);
            self.stamped.insert(uid, arrival);
        }
    }

    /// The arrival given to the claim with `uid`, while its status does not record it.
    pub fn of(&self, uid: &str) -> Option<MicroTime> {
        let micros = *self.stamped.get(uid)?;
        Timestamp::from_microsecond(micros).ok().map(MicroTime)
    }
}

/// The start of the object's creation second, in microseconds (0 when unset): where a claim
/// without an arrival queues from.
fn created_micros(object: &ObjectMeta) -> Micros {
    arrival_micros(None, object.creation_timestamp.as_ref())
}

/// The arrival the claim's status records, in microseconds.
fn recorded(claim: &LockClaim) -> Option<Micros> {
    let status = claim.status.as_ref()?;
    Some(status.arrived_at.as_ref()?.0.as_microsecond())
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnstile_api::{LockClaimSpec, LockClaimStatus};

    fn claim(name: &str, created_second: i64) -> LockClaim {
        let mut claim = LockClaim::new(name, LockClaimSpec::for_lock("db"));
        claim.metadata.uid = Some(format!("uid-{name}"));
        claim.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Timestamp::from_second(created_second).expect("time"),
            ));
        claim
    }

    fn at(micros: Micros) -> Timestamp {
        Timestamp::from_microsecond(micros).expect("time")
    }

    fn micros(arrivals: &Arrivals, name: &str) -> Option<Micros> {
        arrivals
            .of(&format!("uid-{name}"))
            .map(|at| at.0.as_microsecond())
    }

    #[test]
    fn claims_arriving_in_one_microsecond_keep_their_delivery_order() {
        let mut arrivals = Arrivals::default();
        let now = at(5_000_000);
        for name in ["c", "b", "a"] {
            arrivals.applied(&claim(name, 5), false, now);
        }
        assert_eq!(micros(&arrivals, "c"), Some(5_000_000));
        assert_eq!(micros(&arrivals, "b"), Some(5_000_001));
        assert_eq!(micros(&arrivals, "a"), Some(5_000_002));
        // Seen again (a status write, a label): the place stays.
        arrivals.applied(&claim("c", 5), true, at(9_000_000));
        assert_eq!(micros(&arrivals, "c"), Some(5_000_000));
    }

    #[test]
    fn listed_claims_nobody_queued_arrive_after_the_recorded_ones_oldest_first() {
        let mut arrivals = Arrivals::default();
        arrivals.relist_started();
        let mut recorded = claim("old", 1);
        recorded.status = Some(LockClaimStatus {
            arrived_at: Some(MicroTime(at(70_000_000))),
            ..LockClaimStatus::default()
        });
        arrivals.listed(&recorded);
        // Created while nobody watched, within one second: creation, then name.
        arrivals.listed(&claim("z-unseen", 2));
        arrivals.listed(&claim("a-unseen", 2));
        arrivals.listed(&claim("m-unseen", 1));
        // Queued by a controller from before `arrivedAt`: it keeps its creation-time place.
        let mut queued_before = claim("queued-before", 1);
        queued_before.status = Some(LockClaimStatus::default());
        arrivals.listed(&queued_before);
        // The list ends on a clock behind the recorded arrival (a new leader's).
        arrivals.relist_done(at(60_000_000));
        assert_eq!(micros(&arrivals, "m-unseen"), Some(70_000_001));
        assert_eq!(micros(&arrivals, "a-unseen"), Some(70_000_002));
        assert_eq!(micros(&arrivals, "z-unseen"), Some(70_000_003));
        assert_eq!(micros(&arrivals, "queued-before"), None);
        // Later changes to a listed claim are no arrival either.
        arrivals.applied(&queued_before, true, at(80_000_000));
        assert_eq!(micros(&arrivals, "queued-before"), None);
        // A claim the watch delivers afterwards arrives after all of them, and never before
        // its own creation second.
        arrivals.applied(&claim("new", 3), false, at(60_000_000));
        assert_eq!(micros(&arrivals, "new"), Some(70_000_004));
        arrivals.applied(&claim("future", 90), false, at(60_000_000));
        assert_eq!(micros(&arrivals, "future"), Some(90_000_000));
    }

    #[test]
    fn a_gated_workloads_claim_takes_the_workloads_arrival() {
        let mut arrivals = Arrivals::default();
        // Two workloads arrive in the order 1, 2; the gate makes 2's claim first.
        let job = |uid: &str| claim(uid, 5).metadata;
        arrivals.workload_applied(&job("job-1"), at(5_000_000));
        arrivals.workload_applied(&job("job-2"), at(5_000_000));
        arrivals.workload_applied(&job("job-1"), at(6_000_000));
        let mut claims = Vec::new();
        for (job, name) in [("job-2", "b"), ("job-1", "a")] {
            let mut claim = claim(name, 5);
            claim.metadata.namespace = Some("ns".to_owned());
            arrivals.expect("ns", name, &format!("uid-{job}"));
            arrivals.applied(&claim, false, at(7_000_000));
            claims.push(claim);
        }
        assert_eq!(micros(&arrivals, "a"), Some(5_000_000), "job-1's arrival");
        assert_eq!(micros(&arrivals, "b"), Some(5_000_001), "job-2's arrival");
        // A claim nobody expected arrives after them.
        arrivals.applied(&claim("c", 5), false, at(7_000_000));
        assert_eq!(micros(&arrivals, "c"), Some(7_000_000));
    }

    #[test]
    fn a_recorded_arrival_replaces_the_stamp_and_a_relist_drops_the_deleted() {
        let mut arrivals = Arrivals::default();
        arrivals.applied(&claim("a", 1), false, at(1_000_000));
        arrivals.applied(&claim("b", 1), false, at(1_000_000));
        let mut written = claim("a", 1);
        written.status = Some(LockClaimStatus {
            arrived_at: arrivals.of("uid-a"),
            ..LockClaimStatus::default()
        });
        arrivals.applied(&written, true, at(2_000_000));
        assert_eq!(micros(&arrivals, "a"), None, "the status is the record now");
        arrivals.relist_started();
        arrivals.relist_done(at(3_000_000));
        assert_eq!(micros(&arrivals, "b"), None, "b was not listed: it is gone");
    }
}
