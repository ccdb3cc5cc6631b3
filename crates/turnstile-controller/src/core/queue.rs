//! The FIFO order of a lock's claims. One function, used by the reconcile pass
//! ([`super::plan`]) and by whatever shows the queue (`turnstile queue`), so that what people
//! are shown is the order the controller grants in.

use super::model::ClaimView;

/// Indices into `claims`, in queue order: `creationTimestamp` (whole seconds, as the API
/// stores it), then name. The controller grants pending claims in this order, as many as
/// `maxHolders` allows; a claim never overtakes one before it.
pub fn queue_order(claims: &[ClaimView]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..claims.len()).collect();
    order.sort_by(|a, b| claims[*a].queue_order().cmp(&claims[*b].queue_order()));
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnstile_api::LockClaim;

    fn claim(name: &str, created: &str) -> ClaimView {
        let claim: LockClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "turnstile.dev/v1alpha1", "kind": "LockClaim",
            "metadata": {"name": name, "uid": name, "creationTimestamp": created},
            "spec": {"lockName": "l"}
        }))
        .expect("claim");
        ClaimView::from_resource(&claim).expect("complete claim")
    }

    #[test]
    fn creation_second_first_then_name_and_fractions_do_not_count() {
        let claims = [
            claim("b", "2026-01-01T00:00:01Z"),
            claim("z", "2026-01-01T00:00:00.900Z"),
            claim("a", "2026-01-01T00:00:01Z"),
            claim("c", "2026-01-01T00:00:00Z"),
        ];
        let names: Vec<&str> = queue_order(&claims)
            .into_iter()
            .map(|index| claims[index].name.as_str())
            .collect();
        assert_eq!(names, ["c", "z", "a", "b"]);
    }
}
