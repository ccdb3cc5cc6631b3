//! `x-kubernetes-validations` CEL rules, evaluated with the `kube-cel` crate
//! (the CEL library kube-rs maintains), including transition rules with `oldSelf`.

use serde_json::Value;

use crate::error::FieldError;
use crate::schema::type_name;

/// Whether the schema has any CEL rule (to skip the work when it has none).
pub(crate) fn has_rules(schema: &Value) -> bool {
    match schema {
        Value::Object(map) => {
            map.contains_key("x-kubernetes-validations") || map.values().any(has_rules)
        }
        Value::Array(items) => items.iter().any(has_rules),
        _ => false,
    }
}

/// The value at a kube-cel field path such as `spec.items[2].name`.
fn value_at<'a>(root: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = root;
    for segment in path.split('.').filter(|s| !s.is_empty()) {
        let (field, indexes) = match segment.find('[') {
            Some(i) => (&segment[..i], &segment[i..]),
            None => (segment, ""),
        };
        if !field.is_empty() {
            cur = cur.get(field)?;
        }
        for idx in indexes.split('[').filter(|s| !s.is_empty()) {
            let n: usize = idx.trim_end_matches(']').parse().ok()?;
            cur = cur.get(n)?;
        }
    }
    Some(cur)
}

thread_local! {
    /// A validator per server thread: making one registers every Kubernetes CEL function, far
    /// more work than most rule evaluations (and it is not `Sync`, so not shared).
    static VALIDATOR: kube_cel::Validator = kube_cel::Validator::new();
}

/// Evaluates every rule of `rules` (a schema's, compiled once); `old` is the stored object on
/// updates (for `oldSelf`). Errors are worded as kube-apiserver words them:
/// `path: Invalid value: <the value, or "<type>" for an object or a list>: <message>`.
pub(crate) fn evaluate(
    rules: &kube_cel::CompiledSchema,
    object: &Value,
    old: Option<&Value>,
    api_version: &str,
    group: &str,
    kind: &str,
) -> Vec<FieldError> {
    let root = kube_cel::RootContext {
        api_version: api_version.into(),
        api_group: group.into(),
        kind: kind.into(),
    };
    let outcome = VALIDATOR.with(|validator| {
        validator.validate_compiled_with_context(rules, object, old, Some(&root))
    });
    match outcome {
        Ok(()) => Vec::new(),
        Err(errors) => errors
            .into_vec()
            .into_iter()
            .map(|e| {
                // kube-apiserver 1.37 shows a scalar's own value, and the type of an object or
                // a list (the contract suite checks this against the real server).
                let value = match value_at(object, &e.field_path) {
                    Some(scalar @ (Value::String(_) | Value::Number(_) | Value::Bool(_))) => {
                        scalar.clone()
                    }
                    found => Value::String(found.map(type_name).unwrap_or("object").to_string()),
                };
                match e.reason.as_deref() {
                    Some("FieldValueRequired") => FieldError::required(&e.field_path, &e.message),
                    Some("FieldValueForbidden") => FieldError::forbidden(&e.field_path, &e.message),
                    Some("FieldValueDuplicate") => FieldError::other(
                        "FieldValueDuplicate",
                        &e.field_path,
                        format!("Duplicate value: {}", e.message),
                    ),
                    _ => FieldError::invalid(&e.field_path, &value, &e.message),
                }
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn immutability_transition_rule() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object",
            "properties": {"lockName": {"type": "string",
                "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "lockName is immutable"}]}}}}});
        let old = json!({"spec": {"lockName": "a"}});
        let new = json!({"spec": {"lockName": "b"}});
        let schema = kube_cel::compile_schema(&schema);
        assert!(
            evaluate(&schema, &new, None, "x/v1", "x", "K").is_empty(),
            "no oldSelf on create"
        );
        assert!(evaluate(&schema, &old, Some(&old), "x/v1", "x", "K").is_empty());
        let errs = evaluate(&schema, &new, Some(&old), "x/v1", "x", "K");
        assert_eq!(errs.len(), 1);
        assert_eq!(
            errs[0].text(),
            "spec.lockName: Invalid value: \"b\": lockName is immutable"
        );
    }
}
