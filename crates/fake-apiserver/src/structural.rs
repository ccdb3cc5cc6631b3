//! The checks kube-apiserver makes on a CRD's `openAPIV3Schema` before accepting it: the
//! schema must be *structural* (a `type` at every node, no types or defaults inside
//! `allOf`/`anyOf`/`oneOf`/`not`, no `$ref`, no `properties` next to `additionalProperties`,
//! ...), only `name`/`generateName` may be restricted under `metadata`, and every
//! `x-kubernetes-validations` rule must compile. A generated CRD that the fake accepts is
//! then one a real cluster accepts too (for these rules).

use serde_json::{Map, Value};

use crate::error::FieldError;

const JUNCTORS: &[&str] = &["allOf", "anyOf", "oneOf", "not"];

/// Keys kube-apiserver forbids anywhere in a CRD schema, with its reason.
const UNSUPPORTED: &[(&str, &str)] = &[
    ("$ref", "$ref is not supported"),
    ("definitions", "definitions is not supported"),
    ("dependencies", "dependencies is not supported"),
    ("additionalItems", "additionalItems is not supported"),
    ("patternProperties", "patternProperties is not supported"),
];

/// Keys a schema inside a logical junctor may not carry.
const FORBIDDEN_IN_JUNCTORS: &[(&str, &str)] = &[
    ("type", "must be empty to be structural"),
    ("additionalProperties", "must be undefined to be structural"),
    ("default", "must be undefined to be structural"),
    ("description", "must be empty to be structural"),
    ("nullable", "must be false to be structural"),
    (
        "x-kubernetes-preserve-unknown-fields",
        "must be false to be structural",
    ),
    (
        "x-kubernetes-embedded-resource",
        "must be false to be structural",
    ),
    (
        "x-kubernetes-int-or-string",
        "must be false to be structural",
    ),
];

fn flag(schema: &Map<String, Value>, key: &str) -> Option<bool> {
    schema.get(key).and_then(Value::as_bool)
}

/// Checks one version's `openAPIV3Schema`; `path` names it
/// (`spec.versions[0].schema.openAPIV3Schema`).
pub(crate) fn check(schema: &Value, path: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    node(schema, path, Junctor::No, &mut errors);
    if let Some(meta) = schema
        .pointer("/properties/metadata")
        .and_then(Value::as_object)
    {
        let only_names = meta
            .get("properties")
            .and_then(Value::as_object)
            .is_none_or(|p| p.keys().all(|k| k == "name" || k == "generateName"));
        let allowed = meta
            .keys()
            .all(|k| matches!(k.as_str(), "type" | "properties" | "description"));
        if !only_names || !allowed {
            errors.push(FieldError::forbidden(
                &format!("{path}.properties[metadata]"),
                "must not specify anything other than name and generateName, but metadata is implicitly specified",
            ));
        }
    }
    errors
}

/// Where a schema node sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Junctor {
    /// Not inside `allOf`/`anyOf`/`oneOf`/`not`.
    No,
    /// Inside one.
    Yes,
    /// Inside one of an `x-kubernetes-int-or-string` node, whose
    /// `anyOf: [{type: integer}, {type: string}]` may name types.
    IntOrString,
}

fn node(schema: &Value, path: &str, junctor: Junctor, errors: &mut Vec<FieldError>) {
    let in_junctor = junctor != Junctor::No;
    let Some(s) = schema.as_object() else {
        errors.push(FieldError::invalid(path, schema, "must be a schema object"));
        return;
    };
    for (key, why) in UNSUPPORTED {
        if s.contains_key(*key) {
            errors.push(FieldError::forbidden(&format!("{path}.{key}"), why));
        }
    }
    if in_junctor {
        for (key, why) in FORBIDDEN_IN_JUNCTORS {
            if *key == "type" && junctor == Junctor::IntOrString {
                continue;
            }
            let present = match s.get(*key) {
                Some(Value::Bool(b)) => *b,
                Some(Value::String(t)) => !t.is_empty(),
                Some(_) => true,
                None => false,
            };
            if present {
                errors.push(FieldError::forbidden(&format!("{path}.{key}"), why));
            }
        }
    } else {
        let int_or_string = flag(s, "x-kubernetes-int-or-string") == Some(true);
        let preserve = flag(s, "x-kubernetes-preserve-unknown-fields") == Some(true);
        let type_empty = s
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .is_empty();
        if type_empty && !int_or_string && !preserve {
            errors.push(FieldError::required(
                &format!("{path}.type"),
                "must not be empty for specified object fields",
            ));
        }
        if int_or_string && !type_empty {
            errors.push(FieldError::forbidden(
                &format!("{path}.type"),
                "must be empty if x-kubernetes-int-or-string is true",
            ));
        }
    }
    if flag(s, "x-kubernetes-preserve-unknown-fields") == Some(false) {
        errors.push(FieldError::invalid(
            &format!("{path}.x-kubernetes-preserve-unknown-fields"),
            &Value::Bool(false),
            "must be true or undefined",
        ));
    }
    if flag(s, "uniqueItems") == Some(true) {
        errors.push(FieldError::forbidden(
            &format!("{path}.uniqueItems"),
            "uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
        ));
    }
    if s.contains_key("properties")
        && s.get("additionalProperties")
            .is_some_and(|a| a.is_object() || a == true)
    {
        errors.push(FieldError::forbidden(
            &format!("{path}.additionalProperties"),
            "additionalProperties and properties are mutual exclusive",
        ));
    }
    if let Some(rules) = s.get("x-kubernetes-validations").and_then(Value::as_array) {
        for (i, rule) in rules.iter().enumerate() {
            let text = rule.get("rule").and_then(Value::as_str).unwrap_or_default();
            if text.is_empty() {
                errors.push(FieldError::required(
                    &format!("{path}.x-kubernetes-validations[{i}].rule"),
                    "",
                ));
            } else if let Err(e) = kube_cel::cel::Program::compile(text) {
                errors.push(FieldError::invalid(
                    &format!("{path}.x-kubernetes-validations[{i}].rule"),
                    &Value::String(text.into()),
                    &format!("compilation failed: {e}"),
                ));
            }
        }
    }
    if let Some(props) = s.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            node(
                v,
                &format!("{path}.properties[{k}]"),
                inner(junctor),
                errors,
            );
        }
    }
    match s.get("items") {
        Some(Value::Array(_)) => errors.push(FieldError::forbidden(
            &format!("{path}.items"),
            "items must be a schema object and not an array",
        )),
        Some(items) => node(items, &format!("{path}.items"), inner(junctor), errors),
        None => {}
    }
    if let Some(extra) = s.get("additionalProperties").filter(|a| a.is_object()) {
        node(
            extra,
            &format!("{path}.additionalProperties"),
            inner(junctor),
            errors,
        );
    }
    let branch_kind = if flag(s, "x-kubernetes-int-or-string") == Some(true) {
        Junctor::IntOrString
    } else {
        Junctor::Yes
    };
    for name in JUNCTORS {
        match s.get(*name) {
            Some(Value::Array(branches)) => {
                for (i, b) in branches.iter().enumerate() {
                    node(b, &format!("{path}.{name}[{i}]"), branch_kind, errors);
                }
            }
            Some(single) => node(single, &format!("{path}.{name}"), branch_kind, errors),
            None => {}
        }
    }
}

/// Children of a node inside a junctor are inside it too.
fn inner(junctor: Junctor) -> Junctor {
    if junctor == Junctor::No {
        Junctor::No
    } else {
        Junctor::Yes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn texts(schema: Value) -> Vec<String> {
        check(&schema, "s").iter().map(FieldError::text).collect()
    }

    #[test]
    fn structural_rules() {
        assert!(texts(json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "port": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]},
                "free": {"x-kubernetes-preserve-unknown-fields": true},
                "name": {"type": "string", "nullable": true,
                         "x-kubernetes-validations": [{"rule": "self == oldSelf"}]}}},
            "metadata": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}}}}}))
        .is_empty());
        assert_eq!(
            texts(json!({"type": "object", "properties": {
                "a": {"description": "no type"},
                "b": {"type": "object", "anyOf": [{"type": "object"}], "uniqueItems": true},
                "c": {"type": "object", "properties": {}, "additionalProperties": {"type": "string"}},
                "d": {"type": "string", "x-kubernetes-validations": [{"rule": "self ==="}]},
                "metadata": {"type": "object", "properties": {"labels": {"type": "object"}}}}})),
            vec![
                "s.properties[a].type: Required value: must not be empty for specified object fields".to_string(),
                "s.properties[b].uniqueItems: Forbidden: uniqueItems cannot be set to true since the runtime complexity becomes quadratic".into(),
                "s.properties[b].anyOf[0].type: Forbidden: must be empty to be structural".into(),
                "s.properties[c].additionalProperties: Forbidden: additionalProperties and properties are mutual exclusive".into(),
                texts(json!({"type": "string", "x-kubernetes-validations": [{"rule": "self ==="}]}))[0].replacen("s.", "s.properties[d].", 1),
                "s.properties[metadata]: Forbidden: must not specify anything other than name and generateName, but metadata is implicitly specified".into(),
            ]
        );
    }
}
