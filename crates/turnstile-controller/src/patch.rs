//! JSON merge patches (RFC 7386) for status and finalizer writes: explicit nulls clear fields,
//! and `metadata.resourceVersion` makes every write conditional on the state it was decided
//! from (a stale write answers 409 and the pass is retried).

use serde::Serialize;
use serde_json::{Map, Value};

use super::error::ControllerError;

/// The merge patch turning `old` into `new`: changed members, `null` for removed ones,
/// arrays replaced whole. `None` when they are equal.
pub fn merge_diff(old: &Value, new: &Value) -> Option<Value> {
    match (old, new) {
        (Value::Object(old), Value::Object(new)) => {
            let mut patch = Map::new();
            for (key, old_value) in old {
                match new.get(key) {
                    None => {
                        patch.insert(key.clone(), Value::Null);
                    }
                    Some(new_value) => {
                        if let Some(diff) = merge_diff(old_value, new_value) {
                            patch.insert(key.clone(), diff);
                        }
                    }
                }
            }
            for (key, new_value) in new {
                if !old.contains_key(key) {
                    patch.insert(key.clone(), new_value.clone());
                }
            }
            (!patch.is_empty()).then_some(Value::Object(patch))
        }
        _ if old == new => None,
        _ => Some(new.clone()),
    }
}

/// A status patch from `old` to `new` (either may be absent), conditional on
/// `resource_version`. `None` when nothing changes.
pub fn status_patch<S: Serialize>(
    old: Option<&S>,
    new: &S,
    resource_version: Option<&str>,
) -> Result<Option<Value>, ControllerError> {
    let serialize = |status: &S| {
        serde_json::to_value(status).map_err(|source| ControllerError::Serialize {
            what: "status",
            source,
        })
    };
    let new = serialize(new)?;
    let diff = match old {
        Some(old) => merge_diff(&serialize(old)?, &new),
        None => Some(new),
    };
    Ok(diff.map(|status| {
        let mut patch = serde_json::json!({ "status": status });
        if let Some(rv) = resource_version {
            patch["metadata"] = serde_json::json!({ "resourceVersion": rv });
        }
        patch
    }))
}

/// A patch setting `metadata.finalizers` to `finalizers`, conditional on `resource_version`
/// (a merge patch replaces the whole list, so it must not race another writer).
pub fn finalizers_patch(finalizers: &[String], resource_version: Option<&str>) -> Value {
    let mut metadata = serde_json::json!({ "finalizers": finalizers });
    if let Some(rv) = resource_version {
        metadata["resourceVersion"] = Value::String(rv.to_owned());
    }
    serde_json::json!({ "metadata": metadata })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn diff_sets_changed_clears_removed_and_replaces_arrays() {
        let old =
            json!({"phase": "Pending", "position": 2, "conditions": [{"type": "Held"}], "same": 1});
        let new = json!({"phase": "Held", "fencingToken": 3, "conditions": [], "same": 1});
        assert_eq!(
            merge_diff(&old, &new),
            Some(json!({"phase": "Held", "position": null, "fencingToken": 3, "conditions": []}))
        );
        assert_eq!(merge_diff(&new, &new), None);
    }

    #[test]
    fn status_patch_carries_the_resource_version() {
        let patch = status_patch(Some(&json!({"a": 1})), &json!({"a": 2}), Some("42"))
            .expect("serialize")
            .expect("changed");
        assert_eq!(
            patch,
            json!({"status": {"a": 2}, "metadata": {"resourceVersion": "42"}})
        );
        assert!(
            status_patch(Some(&json!({"a": 1})), &json!({"a": 1}), Some("42"))
                .expect("serialize")
                .is_none()
        );
    }
}
