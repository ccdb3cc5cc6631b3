//! PATCH bodies: JSON merge patch, JSON patch, strategic merge patch (as merge patch) and
//! server-side apply (as merge patch; see the README's known differences).

use serde_json::Value;

use crate::error::ApiError;

/// The patch types kube-apiserver accepts, by `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchKind {
    /// `application/merge-patch+json` (RFC 7386).
    Merge,
    /// `application/json-patch+json` (RFC 6902).
    Json,
    /// `application/strategic-merge-patch+json`.
    Strategic,
    /// `application/apply-patch+yaml` (server-side apply).
    Apply,
}

impl PatchKind {
    /// The kind for a `Content-Type` header.
    pub(crate) fn from_content_type(content_type: &str) -> Result<Self, ApiError> {
        let base = content_type.split(';').next().unwrap_or_default().trim();
        match base {
            "application/merge-patch+json" => Ok(Self::Merge),
            "application/json-patch+json" => Ok(Self::Json),
            "application/strategic-merge-patch+json" => Ok(Self::Strategic),
            "application/apply-patch+yaml" => Ok(Self::Apply),
            other => Err(ApiError::unsupported_media_type(other)),
        }
    }
}

/// Removes strategic-merge directives (`$patch`, `$retainKeys`, `$setElementOrder/...`,
/// `$deleteFromPrimitiveList/...`), leaving a merge patch.
fn strip_directives(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.retain(|k, _| !k.starts_with('$'));
            map.values_mut().for_each(strip_directives);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_directives),
        _ => {}
    }
}

/// Parses a patch body as JSON (or YAML for apply).
pub(crate) fn parse_body(kind: PatchKind, body: &[u8]) -> Result<Value, ApiError> {
    match kind {
        PatchKind::Apply => serde_yaml::from_slice::<Value>(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}"))),
        _ => serde_json::from_slice::<Value>(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}"))),
    }
}

/// Applies `patch` to `current`.
pub(crate) fn apply(kind: PatchKind, current: &Value, patch: &Value) -> Result<Value, ApiError> {
    let mut doc = current.clone();
    match kind {
        PatchKind::Merge | PatchKind::Apply => json_patch::merge(&mut doc, patch),
        PatchKind::Strategic => {
            let mut p = patch.clone();
            strip_directives(&mut p);
            json_patch::merge(&mut doc, &p);
        }
        PatchKind::Json => {
            let ops: json_patch::Patch = serde_json::from_value(patch.clone())
                .map_err(|e| ApiError::bad_request(format!("error decoding JSON patch: {e}")))?;
            for op in ops.iter() {
                // kube-apiserver's JSON patch (evanphx/json-patch) lets a `test` for null pass on
                // a missing path; kube-rs' finalizer helper relies on it.
                if let json_patch::PatchOperation::Test(test) = op {
                    if test.value.is_null() && doc.pointer(test.path.as_str()).is_none() {
                        continue;
                    }
                }
                json_patch::patch(&mut doc, std::slice::from_ref(op)).map_err(|e| ApiError {
                    code: 422,
                    reason: "Invalid",
                    message: format!(
                        "the server rejected our request due to an error in our request: {e}"
                    ),
                    details: None,
                })?;
            }
        }
    }
    Ok(doc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_json_and_strategic() {
        let cur = json!({"spec": {"a": 1, "b": 2}, "status": {"x": [1, 2]}});
        assert_eq!(
            apply(
                PatchKind::Merge,
                &cur,
                &json!({"spec": {"a": null, "c": 3}})
            )
            .unwrap(),
            json!({"spec": {"b": 2, "c": 3}, "status": {"x": [1, 2]}})
        );
        assert_eq!(
            apply(
                PatchKind::Json,
                &cur,
                &json!([{"op": "replace", "path": "/spec/a", "value": 9}])
            )
            .unwrap()["spec"]["a"],
            json!(9)
        );
        let null_test = json!([{"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": ["f"]}]);
        let mut with_meta = cur.clone();
        with_meta["metadata"] = json!({});
        assert_eq!(
            apply(PatchKind::Json, &with_meta, &null_test).unwrap()["metadata"]["finalizers"],
            json!(["f"])
        );
        let failed_test = apply(
            PatchKind::Json,
            &cur,
            &json!([{"op": "test", "path": "/spec/a", "value": 5}]),
        );
        assert_eq!(failed_test.unwrap_err().code, 422);
        assert_eq!(
            apply(
                PatchKind::Strategic,
                &cur,
                &json!({"$setElementOrder/x": [], "status": {"x": [3], "$retainKeys": ["x"]}})
            )
            .unwrap()["status"],
            json!({"x": [3]})
        );
    }
}
