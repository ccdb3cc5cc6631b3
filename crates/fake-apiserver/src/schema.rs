//! Structural-schema processing of custom resources, in kube-apiserver's order:
//! drop `null`s of non-nullable fields, apply `default`s, prune unknown fields, then
//! validate (OpenAPI value validations here, CEL rules in [`crate::cel`]).

use serde_json::{Map, Value};

use crate::error::{format_number, FieldError};
use crate::meta::OBJECT_META_FIELDS;

fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

fn flag(schema: &Value, name: &str) -> bool {
    schema.get(name).and_then(Value::as_bool).unwrap_or(false)
}

fn properties(schema: &Value) -> Option<&Map<String, Value>> {
    schema.get("properties").and_then(Value::as_object)
}

/// The schema of the values of a map (`additionalProperties` as a schema).
fn additional(schema: &Value) -> Option<&Value> {
    schema.get("additionalProperties").filter(|a| a.is_object())
}

/// Removes `null` values of fields whose schema is not `nullable`.
pub(crate) fn drop_nulls(schema: &Value, value: &mut Value) {
    if let Some(obj) = value.as_object_mut() {
        let props = properties(schema);
        let extra = additional(schema);
        obj.retain(|k, v| {
            let sub = props.and_then(|p| p.get(k)).or(extra);
            !(v.is_null() && sub.is_some_and(|s| !flag(s, "nullable")))
        });
        for (k, v) in obj.iter_mut() {
            if let Some(sub) = props.and_then(|p| p.get(k)).or(extra) {
                drop_nulls(sub, v);
            }
        }
    } else if let (Some(items), Some(arr)) = (schema.get("items"), value.as_array_mut()) {
        for v in arr {
            drop_nulls(items, v);
        }
    }
}

/// Applies `default`s of missing fields, recursively (a defaulted object is defaulted inside too).
pub(crate) fn apply_defaults(schema: &Value, value: &mut Value) {
    if let Some(obj) = value.as_object_mut() {
        if let Some(props) = properties(schema) {
            for (k, sub) in props {
                if !obj.contains_key(k) {
                    if let Some(default) = sub.get("default") {
                        obj.insert(k.clone(), default.clone());
                    }
                }
                if let Some(v) = obj.get_mut(k) {
                    apply_defaults(sub, v);
                }
            }
        }
        if let Some(extra) = additional(schema) {
            let known = properties(schema);
            for (k, v) in obj.iter_mut() {
                if known.is_none_or(|p| !p.contains_key(k)) {
                    apply_defaults(extra, v);
                }
            }
        }
    } else if let (Some(items), Some(arr)) = (schema.get("items"), value.as_array_mut()) {
        for v in arr {
            apply_defaults(items, v);
        }
    }
}

/// Prunes fields the schema does not declare; returns their paths (for strict field validation).
pub(crate) fn prune(schema: &Value, value: &mut Value, root: bool) -> Vec<String> {
    let mut pruned = Vec::new();
    prune_at(schema, value, "", root, &mut pruned);
    pruned
}

fn prune_at(
    schema: &Value,
    value: &mut Value,
    path: &str,
    keep_type_meta: bool,
    pruned: &mut Vec<String>,
) {
    let preserve = flag(schema, "x-kubernetes-preserve-unknown-fields");
    let embedded = keep_type_meta || flag(schema, "x-kubernetes-embedded-resource");
    if let Some(obj) = value.as_object_mut() {
        let props = properties(schema);
        let extra = schema.get("additionalProperties");
        let extra_allows_all = extra.is_some_and(|a| a.is_object() || a.as_bool() == Some(true));
        if !preserve && !extra_allows_all {
            obj.retain(|k, _| {
                let keep = props.is_some_and(|p| p.contains_key(k))
                    || (embedded && matches!(k.as_str(), "apiVersion" | "kind" | "metadata"));
                if !keep {
                    pruned.push(join(path, k));
                }
                keep
            });
        }
        if embedded {
            if let Some(Value::Object(meta)) = obj.get_mut("metadata") {
                meta.retain(|k, _| {
                    let keep = OBJECT_META_FIELDS.contains(&k.as_str());
                    if !keep {
                        pruned.push(join(&join(path, "metadata"), k));
                    }
                    keep
                });
            }
        }
        for (k, v) in obj.iter_mut() {
            if embedded && k == "metadata" {
                // ObjectMeta is pruned above by its Go type, not by the schema.
                continue;
            }
            if let Some(sub) = props.and_then(|p| p.get(k)) {
                prune_at(sub, v, &join(path, k), false, pruned);
            } else if let Some(sub) = additional(schema) {
                prune_at(sub, v, &join(path, k), false, pruned);
            }
        }
    } else if let (Some(items), Some(arr)) = (schema.get("items"), value.as_array_mut()) {
        for (i, v) in arr.iter_mut().enumerate() {
            prune_at(items, v, &format!("{path}[{i}]"), false, pruned);
        }
    }
}

/// The JSON type name kube-openapi reports for a value.
pub(crate) fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn num(schema: &Value, key: &str) -> Option<f64> {
    schema.get(key).and_then(Value::as_f64)
}

fn num_text(schema: &Value, key: &str) -> String {
    match schema.get(key) {
        Some(Value::Number(n)) => format_number(n),
        _ => String::new(),
    }
}

fn is_rfc3339(s: &str) -> bool {
    chrono::DateTime::parse_from_rfc3339(s).is_ok()
}

/// Validates `value` against the value validations of `schema`; `path` names it in errors.
pub(crate) fn validate(schema: &Value, value: &Value, path: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    validate_at(schema, value, path, &mut errors);
    errors
}

fn validate_at(schema: &Value, value: &Value, path: &str, errors: &mut Vec<FieldError>) {
    let shown = if path.is_empty() { "body" } else { path };
    if value.is_null() && (flag(schema, "nullable") || schema.get("type").is_none()) {
        return;
    }
    let int_or_string = flag(schema, "x-kubernetes-int-or-string");
    if let Some(want) = schema.get("type").and_then(Value::as_str) {
        let actual = type_name(value);
        let ok = match want {
            "number" => matches!(actual, "number" | "integer"),
            "integer" => actual == "integer",
            other => actual == other,
        } || (int_or_string && matches!(actual, "integer" | "string"));
        if !ok {
            let wanted = if int_or_string {
                "integer,string".to_string()
            } else {
                want.to_string()
            };
            errors.push(FieldError::type_invalid(
                path,
                &Value::String(actual.into()),
                &format!("{shown} in body must be of type {wanted}: \"{actual}\""),
            ));
            return;
        }
    } else if int_or_string && !matches!(type_name(value), "integer" | "string") {
        let actual = type_name(value);
        errors.push(FieldError::type_invalid(
            path,
            &Value::String(actual.into()),
            &format!("{shown} in body must be of type integer,string: \"{actual}\""),
        ));
        return;
    }

    if let Some(allowed) = schema.get("enum").and_then(Value::as_array) {
        if !allowed.contains(value) {
            let names: Vec<String> = allowed
                .iter()
                .map(|a| {
                    a.as_str()
                        .map(String::from)
                        .unwrap_or_else(|| a.to_string())
                })
                .collect();
            errors.push(FieldError::not_supported(path, value, &names));
        }
    }

    match value {
        Value::Number(n) => validate_number(schema, n, value, path, shown, errors),
        Value::String(s) => validate_string(schema, s, value, path, shown, errors),
        Value::Array(items) => validate_array(schema, items, value, path, shown, errors),
        Value::Object(obj) => validate_object(schema, obj, path, shown, errors),
        _ => {}
    }

    for (keyword, detail) in [("anyOf", "anyOf"), ("oneOf", "oneOf")] {
        if let Some(branches) = schema.get(keyword).and_then(Value::as_array) {
            let passing = branches
                .iter()
                .filter(|b| validate(b, value, path).is_empty())
                .count();
            let ok = if keyword == "anyOf" {
                passing >= 1
            } else {
                passing == 1
            };
            if !ok {
                let what = if keyword == "anyOf" {
                    "at least one schema"
                } else {
                    "one and only one schema"
                };
                errors.push(FieldError::invalid(
                    path,
                    value,
                    &format!("{shown} in body must validate {what} ({detail})"),
                ));
            }
        }
    }
    if let Some(branches) = schema.get("allOf").and_then(Value::as_array) {
        for b in branches {
            validate_at(b, value, path, errors);
        }
    }
    if let Some(not) = schema.get("not") {
        if validate(not, value, path).is_empty() {
            errors.push(FieldError::invalid(
                path,
                value,
                &format!("{shown} in body must not validate the schema (not)"),
            ));
        }
    }
}

fn validate_number(
    schema: &Value,
    n: &serde_json::Number,
    value: &Value,
    path: &str,
    shown: &str,
    errors: &mut Vec<FieldError>,
) {
    let Some(x) = n.as_f64() else { return };
    if let Some(min) = num(schema, "minimum") {
        let exclusive = flag(schema, "exclusiveMinimum");
        if (exclusive && x <= min) || (!exclusive && x < min) {
            let rel = if exclusive {
                "greater than"
            } else {
                "greater than or equal to"
            };
            errors.push(FieldError::invalid(
                path,
                value,
                &format!(
                    "{shown} in body should be {rel} {}",
                    num_text(schema, "minimum")
                ),
            ));
        }
    }
    if let Some(max) = num(schema, "maximum") {
        let exclusive = flag(schema, "exclusiveMaximum");
        if (exclusive && x >= max) || (!exclusive && x > max) {
            let rel = if exclusive {
                "less than"
            } else {
                "less than or equal to"
            };
            errors.push(FieldError::invalid(
                path,
                value,
                &format!(
                    "{shown} in body should be {rel} {}",
                    num_text(schema, "maximum")
                ),
            ));
        }
    }
    if let Some(m) = num(schema, "multipleOf").filter(|m| *m != 0.0) {
        if (x / m).fract() != 0.0 {
            errors.push(FieldError::invalid(
                path,
                value,
                &format!(
                    "{shown} in body should be a multiple of {}",
                    num_text(schema, "multipleOf")
                ),
            ));
        }
    }
    if schema.get("format").and_then(Value::as_str) == Some("int32")
        && (x < i32::MIN as f64 || x > i32::MAX as f64)
    {
        errors.push(FieldError::invalid(
            path,
            value,
            &format!(
                "{shown} in body must be of type int32: {}",
                format_number(n)
            ),
        ));
    }
}

/// What a size bound counts: a string's characters, an array's items or an object's
/// properties (with the count).
#[derive(Debug, Clone, Copy)]
enum Size {
    Chars(u64),
    Items(u64),
    Properties(u64),
}

impl Size {
    fn count(self) -> u64 {
        match self {
            Size::Chars(n) | Size::Items(n) | Size::Properties(n) => n,
        }
    }

    /// The schema keywords of the upper and the lower bound.
    fn keywords(self) -> (&'static str, &'static str) {
        match self {
            Size::Chars(_) => ("maxLength", "minLength"),
            Size::Items(_) => ("maxItems", "minItems"),
            Size::Properties(_) => ("maxProperties", "minProperties"),
        }
    }

    /// kube-apiserver's error for a count above `max`.
    fn too_big(self, path: &str, max: u64) -> FieldError {
        match self {
            Size::Chars(_) => FieldError::other(
                "FieldValueTooLong",
                path,
                format!("Too long: may not be more than {max} bytes"),
            ),
            Size::Items(n) | Size::Properties(n) => FieldError::other(
                "FieldValueTooMany",
                path,
                format!("Too many: {n}: must have at most {max} items"),
            ),
        }
    }

    /// kube-apiserver's detail for a count below `min` (of the field shown as `shown`).
    fn too_small(self, shown: &str, min: u64) -> String {
        match self {
            Size::Chars(_) => format!("{shown} in body should be at least {min} chars long"),
            Size::Items(_) => format!("{shown} in body should have at least {min} items"),
            Size::Properties(_) => {
                format!("{shown} in body should have at least {min} properties")
            }
        }
    }
}

/// Checks `size` against its bounds in `schema`; below the lower bound, `value` is the
/// invalid value reported.
fn check_size(
    schema: &Value,
    size: Size,
    value: &Value,
    path: &str,
    shown: &str,
    errors: &mut Vec<FieldError>,
) {
    let (max_key, min_key) = size.keywords();
    let n = size.count();
    if let Some(max) = schema.get(max_key).and_then(Value::as_u64) {
        if n > max {
            errors.push(size.too_big(path, max));
        }
    }
    if let Some(min) = schema.get(min_key).and_then(Value::as_u64) {
        if n < min {
            errors.push(FieldError::invalid(
                path,
                value,
                &size.too_small(shown, min),
            ));
        }
    }
}

fn validate_string(
    schema: &Value,
    s: &str,
    value: &Value,
    path: &str,
    shown: &str,
    errors: &mut Vec<FieldError>,
) {
    let len = s.chars().count() as u64;
    check_size(schema, Size::Chars(len), value, path, shown, errors);
    if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
        match regex::Regex::new(pattern) {
            Ok(re) if !re.is_match(s) => {
                errors.push(FieldError::invalid(
                    path,
                    value,
                    &format!("{shown} in body should match '{pattern}'"),
                ));
            }
            Ok(_) => {}
            Err(_) => errors.push(FieldError::invalid(
                path,
                value,
                &format!("{shown} in body has an invalid pattern '{pattern}'"),
            )),
        }
    }
    if schema.get("format").and_then(Value::as_str) == Some("date-time") && !is_rfc3339(s) {
        errors.push(FieldError::invalid(
            path,
            value,
            &format!("{shown} in body must be of type date-time: {s:?}"),
        ));
    }
}

fn validate_array(
    schema: &Value,
    items: &[Value],
    value: &Value,
    path: &str,
    shown: &str,
    errors: &mut Vec<FieldError>,
) {
    let n = items.len() as u64;
    check_size(schema, Size::Items(n), value, path, shown, errors);
    if flag(schema, "uniqueItems") {
        for (i, a) in items.iter().enumerate() {
            if items[..i].contains(a) {
                errors.push(FieldError::other(
                    "FieldValueDuplicate",
                    &format!("{path}[{i}]"),
                    format!("Duplicate value: {}", crate::error::go_value(a)),
                ));
            }
        }
    }
    if let Some(item_schema) = schema.get("items") {
        for (i, item) in items.iter().enumerate() {
            validate_at(item_schema, item, &format!("{path}[{i}]"), errors);
        }
    }
}

fn validate_object(
    schema: &Value,
    obj: &Map<String, Value>,
    path: &str,
    shown: &str,
    errors: &mut Vec<FieldError>,
) {
    if let Some(required) = schema.get("required").and_then(Value::as_array) {
        for r in required.iter().filter_map(Value::as_str) {
            if !obj.contains_key(r) {
                errors.push(FieldError::required(&join(path, r), ""));
            }
        }
    }
    let n = obj.len() as u64;
    let count = Value::Number(n.into());
    check_size(schema, Size::Properties(n), &count, path, shown, errors);
    let props = properties(schema);
    // Sorted, so errors come out in the same order whether or not another crate in the build
    // turns on serde_json's `preserve_order` (feature unification changes `Map`'s iteration).
    let mut fields: Vec<_> = obj.iter().collect();
    fields.sort_unstable_by(|a, b| a.0.cmp(b.0));
    for (k, v) in fields {
        let child = join(path, k);
        if let Some(sub) = props.and_then(|p| p.get(k)) {
            validate_at(sub, v, &child, errors);
        } else if let Some(sub) = additional(schema) {
            validate_at(sub, v, &child, errors);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["lockName"],
                    "properties": {
                        "lockName": {"type": "string", "minLength": 1},
                        "max": {"type": "integer", "minimum": 1, "default": 1},
                        "backend": {"type": "string", "enum": ["memory", "redis"]},
                        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "opt": {"type": "string", "nullable": true}
                    }
                }
            }
        })
    }

    #[test]
    fn defaults_prunes_and_validates_in_kube_words() {
        let s = schema();
        let mut obj = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "a", "bogus": 1},
            "spec": {"lockName": "l", "extra": true, "free": {"any": 1}, "opt": null, "backend": null}, "top": 1});
        drop_nulls(&s, &mut obj);
        apply_defaults(&s, &mut obj);
        let pruned = prune(&s, &mut obj, true);
        assert_eq!(
            pruned,
            vec![
                "top".to_string(),
                "metadata.bogus".into(),
                "spec.extra".into()
            ]
        );
        assert_eq!(
            obj["spec"],
            json!({"lockName": "l", "max": 1, "free": {"any": 1}, "opt": null})
        );
        assert!(validate(&s, &obj, "").is_empty());

        let bad = json!({"spec": {"max": 0, "backend": "mongo"}});
        let texts: Vec<String> = validate(&s, &bad, "")
            .iter()
            .map(FieldError::text)
            .collect();
        assert_eq!(
            texts,
            vec![
                "spec.lockName: Required value".to_string(),
                "spec.backend: Unsupported value: \"mongo\": supported values: \"memory\", \"redis\"".into(),
                "spec.max: Invalid value: 0: spec.max in body should be greater than or equal to 1".into(),
            ]
        );
        let wrong_type = json!({"spec": {"lockName": 3}});
        assert_eq!(
            validate(&s, &wrong_type, "")[0].text(),
            "spec.lockName: Invalid value: \"integer\": spec.lockName in body must be of type string: \"integer\""
        );
    }
}
