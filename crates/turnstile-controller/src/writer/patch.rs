//! JSON merge patches (RFC 7386): the diff a status write sends (explicit nulls clear fields)
//! and, for the tests' simulation of the API server, applying one.

use serde_json::{Map, Value};

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

/// Applies the merge patch `patch` to `target` (RFC 7386): the API server's side of
/// [`merge_diff`], for the tests' simulation of the server.
pub fn apply_merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(members) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(target) = target {
        for (key, value) in members {
            if value.is_null() {
                target.remove(key);
            } else {
                apply_merge_patch(target.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
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
    fn applying_the_diff_of_old_to_new_gives_new() {
        let cases = [
            (
                json!({"a": 1, "b": {"c": 2, "d": 3}}),
                json!({"a": 1, "b": {"c": 4}}),
            ),
            (json!({"a": [1, 2]}), json!({"a": [3], "e": {"f": null}})),
            (json!({}), json!({"x": {"y": {"z": "deep"}}})),
        ];
        for (old, new) in cases {
            let mut patched = old.clone();
            if let Some(diff) = merge_diff(&old, &new) {
                apply_merge_patch(&mut patched, &diff);
            }
            // A null member of `new` is the absence of that member once patched.
            let mut expected = new.clone();
            if let Some(e) = expected.get_mut("e") {
                *e = json!({});
            }
            assert_eq!(patched, expected, "old {old}");
        }
    }
}
