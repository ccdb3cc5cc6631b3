//! Reading and writing `metadata` fields of JSON objects.

use serde_json::{Map, Value};

/// Now, as kube-apiserver writes timestamps (RFC 3339, seconds, `Z`).
pub(crate) fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// `metadata`, created when missing (and replaced when not an object).
pub(crate) fn metadata_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = Value::Object(Map::new());
    }
    let map = obj.as_object_mut().expect("made an object above");
    let meta = map
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    meta.as_object_mut().expect("made an object above")
}

/// `metadata.<field>` as a string ("" when missing).
pub(crate) fn str_field<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// `metadata.name`.
pub(crate) fn name(obj: &Value) -> &str {
    str_field(obj, "name")
}

/// `metadata.namespace`.
pub(crate) fn namespace(obj: &Value) -> &str {
    str_field(obj, "namespace")
}

/// `metadata.resourceVersion`.
pub(crate) fn resource_version(obj: &Value) -> &str {
    str_field(obj, "resourceVersion")
}

/// `metadata.uid`.
pub(crate) fn uid(obj: &Value) -> &str {
    str_field(obj, "uid")
}

/// Whether `metadata.deletionTimestamp` is set.
pub(crate) fn is_deleting(obj: &Value) -> bool {
    !str_field(obj, "deletionTimestamp").is_empty()
}

/// Sets `metadata.<field>` to a string.
pub(crate) fn set_str(obj: &mut Value, field: &str, value: &str) {
    metadata_mut(obj).insert(field.to_string(), Value::String(value.to_string()));
}

/// `metadata.generation` (0 when missing).
pub(crate) fn generation(obj: &Value) -> i64 {
    obj.pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

/// `metadata.finalizers`.
pub(crate) fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// `metadata.labels` as pairs.
pub(crate) fn labels(obj: &Value) -> Map<String, Value> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

/// The uids in `metadata.ownerReferences`.
pub(crate) fn owner_uids(obj: &Value) -> impl Iterator<Item = &str> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r.get("uid").and_then(Value::as_str))
}

/// Copies `metadata.<field>` from `from` to `to` (removing it from `to` when `from` lacks it).
pub(crate) fn copy_field(from: &Value, to: &mut Value, field: &str) {
    let value = from.get("metadata").and_then(|m| m.get(field)).cloned();
    let meta = metadata_mut(to);
    match value {
        Some(v) => {
            meta.insert(field.to_string(), v);
        }
        None => {
            meta.remove(field);
        }
    }
}

/// The `ObjectMeta` fields; others are unknown and pruned (or rejected when strict).
pub(crate) const OBJECT_META_FIELDS: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];
