//! Label selectors (`a=b,c!=d,e in (x,y),f notin (z),g,!h`) and field selectors
//! (`metadata.name=x,metadata.namespace!=y`, plus a few per-kind fields).

use serde_json::Value;

use crate::error::ApiError;
use crate::meta;

#[derive(Debug, Clone, PartialEq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector`.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LabelSelector {
    reqs: Vec<LabelReq>,
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
        .into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

fn set_values(rest: &str, selector: &str) -> Result<Vec<String>, ApiError> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "unable to parse requirement: found '{rest}', expected: '(' in {selector:?}"
            ))
        })?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    /// Parses a selector; an empty string selects everything.
    pub(crate) fn parse(selector: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for part in split_top_level(selector) {
            let req = if let Some(key) = part.strip_prefix('!') {
                LabelReq::NotExists(key.trim().to_string())
            } else if let Some((k, v)) = part.split_once("!=") {
                LabelReq::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, rest)) = part.split_once(" notin ") {
                LabelReq::NotIn(k.trim().into(), set_values(rest, selector)?)
            } else if let Some((k, rest)) = part.split_once(" in ") {
                LabelReq::In(k.trim().into(), set_values(rest, selector)?)
            } else if part.contains(' ') || part.contains('(') {
                return Err(ApiError::bad_request(format!(
                    "unable to parse requirement: {part:?}"
                )));
            } else {
                LabelReq::Exists(part.to_string())
            };
            reqs.push(req);
        }
        Ok(Self { reqs })
    }

    /// Whether `obj`'s labels satisfy every requirement.
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        if self.reqs.is_empty() {
            return true;
        }
        let labels = meta::labels(obj);
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        self.reqs.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|l| !vs.iter().any(|v| v == l)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed `fieldSelector`.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FieldSelector {
    /// (field path, value, negated)
    reqs: Vec<(String, String, bool)>,
}

/// Fields every kind supports.
const COMMON_FIELDS: &[&str] = &["metadata.name", "metadata.namespace"];

/// Extra fields some built-in kinds support, as kube-apiserver does.
fn kind_fields(resource: &str) -> &'static [&'static str] {
    match resource {
        "pods" => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.phase",
            "status.podIP",
        ],
        "events" => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        "jobs" => &["status.successful"],
        "namespaces" => &["status.phase"],
        "secrets" => &["type"],
        _ => &[],
    }
}

impl FieldSelector {
    /// Parses a selector for `resource` (whose CRD may declare `selectable` fields);
    /// unsupported fields are a 400, like kube-apiserver.
    pub(crate) fn parse(
        selector: &str,
        resource: &str,
        selectable: &[String],
    ) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for part in split_top_level(selector) {
            let (field, value, negated) = if let Some((f, v)) = part.split_once("!=") {
                (f, v, true)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, v, false)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, v, false)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{selector}'; can't understand '{part}'"
                )));
            };
            let field = field.trim();
            if !COMMON_FIELDS.contains(&field)
                && !kind_fields(resource).contains(&field)
                && !selectable.iter().any(|s| s == field)
            {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            reqs.push((field.to_string(), value.trim().to_string(), negated));
        }
        Ok(Self { reqs })
    }

    /// Whether `obj` satisfies every requirement.
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        self.reqs.iter().all(|(field, value, negated)| {
            let pointer = format!("/{}", field.replace('.', "/"));
            let actual = match obj.pointer(&pointer) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Number(n)) => n.to_string(),
                Some(Value::Bool(b)) => b.to_string(),
                _ => String::new(),
            };
            (actual == *value) != *negated
        })
    }
}

/// Both selectors of a list or watch request.
#[derive(Debug, Clone, Default)]
pub(crate) struct Selectors {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Selectors {
    /// Whether `obj` matches both.
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}})
    }

    #[test]
    fn label_selector_operators() {
        let o = obj(json!({"app": "web", "tier": "front"}));
        let cases = [
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app in (web, db)", true),
            ("app notin (web)", false),
            ("tier", true),
            ("!tier", false),
            ("missing", false),
            ("!missing", true),
            ("app=web,tier=back", false),
            ("app in (db),tier", false),
            ("", true),
        ];
        for (sel, want) in cases {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches(&o),
                want,
                "{sel}"
            );
        }
    }

    #[test]
    fn field_selector_name_namespace_and_unsupported() {
        let o = obj(json!({}));
        assert!(FieldSelector::parse("metadata.name=a", "widgets", &[])
            .unwrap()
            .matches(&o));
        assert!(!FieldSelector::parse("metadata.name!=a", "widgets", &[])
            .unwrap()
            .matches(&o));
        assert!(
            FieldSelector::parse("metadata.namespace=ns,metadata.name=a", "widgets", &[])
                .unwrap()
                .matches(&o)
        );
        let selectable = ["spec.foo".to_string()];
        assert!(FieldSelector::parse("spec.foo=1", "widgets", &selectable)
            .unwrap()
            .matches(&json!({"spec": {"foo": 1}})));
        assert_eq!(
            FieldSelector::parse("spec.foo=1", "widgets", &[])
                .unwrap_err()
                .code,
            400
        );
    }
}
