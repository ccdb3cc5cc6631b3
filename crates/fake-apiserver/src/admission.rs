//! Admission of a write: type checks, name rules, `fieldValidation` (unknown fields),
//! ObjectMeta clean-up, and for custom resources the schema pipeline (nulls, defaults,
//! pruning, OpenAPI validation) followed by CEL rules.

use base64::Engine as _;
use serde_json::{Map, Value};

use crate::error::{ApiError, FieldError};
use crate::meta;
use crate::registry::{ResourceType, Special};
use crate::schema;

/// `fieldValidation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

impl FieldValidation {
    /// Parses the query parameter (default `Warn`, as kube-apiserver).
    pub(crate) fn parse(value: Option<&str>) -> Result<Self, ApiError> {
        match value {
            None | Some("") | Some("Warn") => Ok(Self::Warn),
            Some("Strict") => Ok(Self::Strict),
            Some("Ignore") => Ok(Self::Ignore),
            Some(other) => Err(ApiError::bad_request(format!(
                "fieldValidation: Unsupported value: {other:?}: supported values: \"Ignore\", \"Strict\", \"Warn\""
            ))),
        }
    }
}

/// Rejects a body whose `apiVersion`/`kind` name another type.
pub(crate) fn check_type_meta(
    rtype: &ResourceType,
    version: &str,
    body: &Value,
) -> Result<(), ApiError> {
    if !body.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    }
    let kind = body.get("kind").and_then(Value::as_str).unwrap_or_default();
    let api_version = body
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let served = rtype.api_version(version);
    if !kind.is_empty() && kind != rtype.kind {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({kind}) does not match the expected kind ({})",
            rtype.kind
        )));
    }
    if !api_version.is_empty() && api_version != served {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({served})"
        )));
    }
    Ok(())
}

const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// kube-apiserver's name validation: a DNS label for namespaces, a DNS subdomain otherwise.
pub(crate) fn validate_name(rtype: &ResourceType, name: &str) -> Option<FieldError> {
    let value = Value::String(name.to_string());
    if rtype.special == Special::Namespace {
        return (!is_dns_label(name))
            .then(|| FieldError::invalid("metadata.name", &value, DNS1123_LABEL_MSG));
    }
    if rtype.special == Special::EventsV1 || rtype.plural == "events" {
        // Event names carry timestamps and dots; kube-apiserver only checks they are path-safe.
        return (name.contains('/') || name.contains('%'))
            .then(|| FieldError::invalid("metadata.name", &value, "may not contain '/' or '%'"));
    }
    let ok = name.len() <= 253 && name.split('.').all(is_dns_label);
    (!ok).then(|| FieldError::invalid("metadata.name", &value, DNS1123_SUBDOMAIN_MSG))
}

const QUALIFIED_NAME_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63 characters.
fn is_name_part(s: &str) -> bool {
    let alnum = |c: u8| c.is_ascii_alphanumeric();
    let bytes = s.as_bytes();
    !s.is_empty()
        && s.len() <= 63
        && bytes.first().copied().is_some_and(alnum)
        && bytes.last().copied().is_some_and(alnum)
        && bytes
            .iter()
            .all(|&c| alnum(c) || matches!(c, b'-' | b'_' | b'.'))
}

/// Why `key` is not a qualified name (`[prefix/]name`), if it is not.
fn qualified_name_problem(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        if p.is_empty() || p.len() > 253 || !p.split('.').all(is_dns_label) {
            return Some(format!("prefix part {DNS1123_SUBDOMAIN_MSG}"));
        }
    }
    if name.len() > 63 {
        return Some("name part must be no more than 63 characters".into());
    }
    (!is_name_part(name)).then(|| QUALIFIED_NAME_MSG.to_string())
}

/// kube-apiserver's ObjectMeta validation of labels, annotation keys, finalizers and owner
/// references (common to every kind).
pub(crate) fn validate_metadata(obj: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let text = |s: &str| Value::String(s.to_string());
    for (key, value) in meta::labels(obj) {
        if let Some(problem) = qualified_name_problem(&key) {
            errors.push(FieldError::invalid(
                "metadata.labels",
                &text(&key),
                &problem,
            ));
        }
        let v = value.as_str().unwrap_or_default();
        if v.len() > 63 {
            errors.push(FieldError::invalid(
                "metadata.labels",
                &text(v),
                "must be no more than 63 characters",
            ));
        } else if !v.is_empty() && !is_name_part(v) {
            errors.push(FieldError::invalid(
                "metadata.labels",
                &text(v),
                LABEL_VALUE_MSG,
            ));
        }
    }
    if let Some(annotations) = obj
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
    {
        for key in annotations.keys() {
            if let Some(problem) = qualified_name_problem(&key.to_lowercase()) {
                errors.push(FieldError::invalid(
                    "metadata.annotations",
                    &text(key),
                    &problem,
                ));
            }
        }
    }
    for (i, finalizer) in meta::finalizers(obj).iter().enumerate() {
        if let Some(problem) = qualified_name_problem(finalizer) {
            errors.push(FieldError::invalid(
                &format!("metadata.finalizers[{i}]"),
                &text(finalizer),
                &problem,
            ));
        }
    }
    let refs = obj
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for owner in &refs {
        for (field, what) in [
            ("apiVersion", "version"),
            ("kind", "kind"),
            ("name", "name"),
            ("uid", "uid"),
        ] {
            if owner
                .get(field)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .is_empty()
            {
                errors.push(FieldError::invalid(
                    &format!("metadata.ownerReferences.{field}"),
                    &text(""),
                    &format!("{what} must not be empty"),
                ));
            }
        }
    }
    let controllers = refs
        .iter()
        .filter(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
        .count();
    if controllers > 1 {
        errors.push(FieldError::invalid(
            "metadata.ownerReferences",
            &Value::Array(refs.clone()),
            "Only one reference can have Controller set to true",
        ));
    }
    errors
}

/// Unknown fields of a request body (for `fieldValidation`), as `unknown field "path"` texts.
fn unknown_fields(rtype: &ResourceType, version: &str, body: &Value) -> Vec<String> {
    let mut probe = body.clone();
    let mut unknown = Vec::new();
    if let Some(Value::Object(m)) = probe.get_mut("metadata") {
        for k in m.keys() {
            if !meta::OBJECT_META_FIELDS.contains(&k.as_str()) {
                unknown.push(format!("metadata.{k}"));
            }
        }
    }
    if let Some(schema_root) = rtype.version(version).and_then(|v| v.schema.as_ref()) {
        schema::drop_nulls(schema_root, &mut probe);
        unknown.extend(
            schema::prune(schema_root, &mut probe, true)
                .into_iter()
                .filter(|p| !p.starts_with("metadata.")),
        );
    }
    unknown
}

/// Applies `fieldValidation` to the unknown fields of a body: an error when Strict,
/// warnings when Warn.
pub(crate) fn field_validation(
    rtype: &ResourceType,
    version: &str,
    body: &Value,
    mode: FieldValidation,
) -> Result<Vec<String>, ApiError> {
    if mode == FieldValidation::Ignore {
        return Ok(Vec::new());
    }
    let unknown: Vec<String> = unknown_fields(rtype, version, body)
        .iter()
        .map(|p| format!("unknown field {p:?}"))
        .collect();
    if unknown.is_empty() {
        return Ok(Vec::new());
    }
    if mode == FieldValidation::Strict {
        return Err(ApiError::bad_request(format!(
            "{kind} in version {version:?} cannot be handled as a {kind}: strict decoding error: {}",
            unknown.join(", "),
            kind = rtype.kind
        )));
    }
    Ok(unknown)
}

/// Drops metadata fields ObjectMeta does not have, empty ones, and the ones clients may not set.
pub(crate) fn clean_metadata(obj: &mut Value) {
    let m = meta::metadata_mut(obj);
    m.retain(|k, v| {
        // ObjectMeta's Go fields are `omitempty`: empty maps and lists, and nulls, vanish.
        let empty = match v {
            Value::Null => true,
            Value::Object(o) => o.is_empty(),
            Value::Array(a) => a.is_empty(),
            Value::String(s) => s.is_empty(),
            _ => false,
        };
        meta::OBJECT_META_FIELDS.contains(&k.as_str()) && !empty
    });
    m.remove("managedFields");
    m.remove("selfLink");
}

/// Schema processing of a custom resource: nulls, defaults, pruning, validation, CEL.
pub(crate) fn admit(
    rtype: &ResourceType,
    obj: &mut Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    let storage_version = rtype.storage_version();
    let Some(version) = rtype.versions.iter().find(|v| v.name == storage_version) else {
        return Ok(());
    };
    let Some(schema_root) = &version.schema else {
        return Ok(());
    };
    schema::drop_nulls(schema_root, obj);
    schema::apply_defaults(schema_root, obj);
    schema::prune(schema_root, obj, true);
    let content = without_metadata(obj);
    let mut errors = schema::validate(schema_root, &content, "");
    if let (true, Some(rules)) = (errors.is_empty(), &version.cel_rules) {
        let old_clean = old.map(without_metadata);
        errors.extend(crate::cel::evaluate(
            rules,
            &content,
            old_clean.as_ref(),
            &rtype.api_version(storage_version),
            &rtype.group,
            &rtype.kind,
        ));
    }
    ApiError::invalid_if_any(&rtype.group, &rtype.kind, meta::name(obj), &errors)
}

/// The object without `metadata` (the schema does not describe ObjectMeta).
fn without_metadata(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("metadata");
    }
    o
}

/// Folds a Secret's `stringData` into base64 `data` and defaults its `type`, as kube-apiserver does.
pub(crate) fn fold_string_data(obj: &mut Value) {
    let Some(map) = obj.as_object_mut() else {
        return;
    };
    if map
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .is_empty()
    {
        map.insert("type".into(), Value::String("Opaque".into()));
    }
    let Some(Value::Object(string_data)) = map.remove("stringData") else {
        return;
    };
    let data = map
        .entry("data")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Some(data) = data.as_object_mut() {
        for (k, v) in string_data {
            let text = v.as_str().unwrap_or_default().to_string();
            data.insert(
                k,
                Value::String(base64::engine::general_purpose::STANDARD.encode(text)),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn object_meta_drops_unknown_and_empty_fields() {
        let mut obj = json!({"metadata": {"name": "a", "annotations": {}, "finalizers": [], "labels": null,
            "bogus": 1, "managedFields": [{}], "generateName": ""}});
        clean_metadata(&mut obj);
        assert_eq!(obj["metadata"], json!({"name": "a"}));
    }

    #[test]
    fn metadata_rules_match_kube_apiserver() {
        let ok = json!({"metadata": {"labels": {"turnstile.dev/lock": "db-1", "empty": ""},
            "annotations": {"a.b/C": "x"}, "finalizers": ["turnstile.dev/release"],
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u", "controller": true}]}});
        assert!(validate_metadata(&ok).is_empty());
        let bad = json!({"metadata": {"labels": {"bad key": "ok", "k": "no spaces"}, "finalizers": ["-x"],
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p"}]}});
        let fields: Vec<String> = validate_metadata(&bad)
            .into_iter()
            .map(|e| e.field)
            .collect();
        assert_eq!(
            fields,
            [
                "metadata.labels",
                "metadata.labels",
                "metadata.finalizers[0]",
                "metadata.ownerReferences.uid"
            ]
        );
    }
}
