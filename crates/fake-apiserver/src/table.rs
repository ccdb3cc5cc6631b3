//! `meta.k8s.io` Table rendering (what `kubectl get` asks for) and `PartialObjectMetadata`.

use serde_json::{json, Map, Value};

use crate::error::format_number;
use crate::jsonpath::JsonPath;
use crate::registry::{PrinterColumn, ResourceType};

/// What each Table row carries in `object` (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IncludeObject {
    None,
    Metadata,
    Object,
}

impl IncludeObject {
    /// Parses the query parameter (default `Metadata`).
    pub(crate) fn parse(value: Option<&str>) -> Self {
        match value {
            Some("None") => Self::None,
            Some("Object") => Self::Object,
            _ => Self::Metadata,
        }
    }
}

const NAME_DESCRIPTION: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";

/// kube-apiserver's `duration.HumanDuration` (`5m`, `3h20m`, `<invalid>` for a future time).
pub(crate) fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        return two_units((minutes, "m"), (seconds % 60, "s"));
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        return two_units((hours, "h"), (minutes % 60, "m"));
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    let days = hours / 24;
    if days < 8 {
        return two_units((days, "d"), (hours % 24, "h"));
    }
    if days < 365 * 2 {
        return format!("{days}d");
    }
    if days < 365 * 8 {
        return two_units((days / 365, "y"), (days % 365, "d"));
    }
    format!("{}y", days / 365)
}

/// `3m20s` from `(3, "m")` and `(20, "s")`; `3m` when the second count is 0.
fn two_units((count, unit): (i64, &str), (rest, rest_unit): (i64, &str)) -> String {
    if rest == 0 {
        format!("{count}{unit}")
    } else {
        format!("{count}{unit}{rest}{rest_unit}")
    }
}

/// Prints a value as Go's `fmt.Print` prints the decoded JSON (`map[a:1]`, `[x y]`).
fn go_print(v: &Value) -> String {
    match v {
        Value::Null => "<nil>".into(),
        Value::String(s) => s.clone(),
        Value::Number(n) => format_number(n),
        Value::Bool(b) => b.to_string(),
        Value::Array(a) => format!("[{}]", a.iter().map(go_print).collect::<Vec<_>>().join(" ")),
        Value::Object(o) => {
            let mut keys: Vec<&String> = o.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys
                .iter()
                .map(|k| format!("{k}:{}", go_print(&o[*k])))
                .collect();
            format!("map[{}]", parts.join(" "))
        }
    }
}

/// One cell as the CRD table convertor computes it.
fn cell(column: &PrinterColumn, obj: &Value) -> Value {
    let Ok(path) = JsonPath::parse(&column.json_path) else {
        return Value::Null;
    };
    let Some(value) = path.find(obj).into_iter().next() else {
        return Value::Null;
    };
    match column.type_.as_str() {
        "string" => Value::String(go_print(value)),
        "integer" => value
            .as_i64()
            .or_else(|| value.as_f64().map(|f| f as i64))
            .map(Value::from)
            .unwrap_or(Value::Null),
        "number" => value.as_f64().map(Value::from).unwrap_or(Value::Null),
        "boolean" => value.as_bool().map(Value::Bool).unwrap_or(Value::Null),
        "date" => match value.as_str() {
            Some(s) => match chrono::DateTime::parse_from_rfc3339(s) {
                Ok(t) => Value::String(human_duration(
                    chrono::Utc::now().signed_duration_since(t).num_seconds(),
                )),
                Err(_) => Value::String("<invalid>".into()),
            },
            None => Value::Null,
        },
        _ => Value::Null,
    }
}

fn age_column() -> PrinterColumn {
    PrinterColumn {
        name: "Age".into(),
        type_: "date".into(),
        format: String::new(),
        description: "CreationTimestamp is a timestamp representing the server time when this object was created.".into(),
        priority: 0,
        json_path: ".metadata.creationTimestamp".into(),
    }
}

/// The printer columns of `rtype` at `version` (Age alone when the CRD declares none).
fn columns(rtype: &ResourceType, version: &str) -> Vec<PrinterColumn> {
    let declared = rtype
        .versions
        .iter()
        .find(|v| v.name == version)
        .map(|v| v.printer_columns.clone())
        .unwrap_or_default();
    if declared.is_empty() {
        vec![age_column()]
    } else {
        declared
    }
}

/// `PartialObjectMetadata` for an object.
pub(crate) fn partial_metadata(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| Value::Object(Map::new())),
    })
}

/// A Table of `objects` (already in the served version).
pub(crate) fn table(
    rtype: &ResourceType,
    version: &str,
    objects: &[Value],
    include: IncludeObject,
    table_api_version: &str,
    list_meta: Option<Value>,
    with_definitions: bool,
) -> Value {
    let cols = columns(rtype, version);
    let mut definitions = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": NAME_DESCRIPTION, "priority": 0}),
    ];
    definitions.extend(cols.iter().map(|c| {
        json!({"name": c.name, "type": c.type_, "format": c.format, "description": c.description, "priority": c.priority})
    }));
    let rows: Vec<Value> = objects
        .iter()
        .map(|obj| {
            let mut cells = vec![Value::String(crate::meta::name(obj).to_string())];
            cells.extend(cols.iter().map(|c| cell(c, obj)));
            let mut row = json!({ "cells": cells });
            match include {
                IncludeObject::None => {}
                IncludeObject::Metadata => row["object"] = partial_metadata(obj),
                IncludeObject::Object => row["object"] = obj.clone(),
            }
            row
        })
        .collect();
    let mut t = json!({
        "kind": "Table",
        "apiVersion": table_api_version,
        "metadata": list_meta.unwrap_or_else(|| json!({})),
        "columnDefinitions": if with_definitions { Value::Array(definitions) } else { Value::Null },
        "rows": rows,
    });
    if !with_definitions {
        if let Some(m) = t.as_object_mut() {
            m.remove("columnDefinitions");
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations_match_kube() {
        assert_eq!(human_duration(-5), "<invalid>");
        assert_eq!(human_duration(-1), "0s");
        assert_eq!(human_duration(59), "59s");
        assert_eq!(human_duration(125), "2m5s");
        assert_eq!(human_duration(300), "5m");
        assert_eq!(human_duration(3 * 3600 + 20 * 60), "3h20m");
        assert_eq!(human_duration(50 * 3600), "2d2h");
        assert_eq!(human_duration(400 * 86400), "400d");
    }

    #[test]
    fn go_printing_of_non_strings() {
        assert_eq!(go_print(&json!([1, "a"])), "[1 a]");
        assert_eq!(go_print(&json!({"b": 1, "a": true})), "map[a:true b:1]");
    }
}
