//! `events.k8s.io/v1` Events are stored as core `v1` Events, as in kube-apiserver, so both
//! APIs (and `kubectl get events`) see the same objects. These convert between the two.

use serde_json::{Map, Value};

/// (core v1 field, events.k8s.io/v1 field) pairs that only differ by name.
const RENAMED: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("reportingComponent", "reportingController"),
];

/// Fields with the same name in both.
const SHARED: &[&str] = &[
    "metadata",
    "reason",
    "type",
    "eventTime",
    "series",
    "action",
    "related",
    "reportingInstance",
];

fn convert(
    from: &Value,
    pairs: impl Iterator<Item = (&'static str, &'static str)>,
    api_version: &str,
) -> Value {
    let mut out = Map::new();
    out.insert("apiVersion".into(), Value::String(api_version.into()));
    out.insert("kind".into(), Value::String("Event".into()));
    for f in SHARED {
        if let Some(v) = from.get(*f) {
            out.insert((*f).into(), v.clone());
        }
    }
    for (src, dst) in pairs {
        if let Some(v) = from.get(src) {
            out.insert(dst.into(), v.clone());
        }
    }
    Value::Object(out)
}

/// An `events.k8s.io/v1` Event as the core `v1` Event that stores it.
pub(crate) fn to_core(event: &Value) -> Value {
    convert(event, RENAMED.iter().map(|(core, v1)| (*v1, *core)), "v1")
}

/// A stored core `v1` Event as `events.k8s.io/v1`.
pub(crate) fn from_core(event: &Value) -> Value {
    convert(event, RENAMED.iter().copied(), "events.k8s.io/v1")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trip() {
        let v1 = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e"},
            "regarding": {"kind": "Pod", "name": "p"}, "note": "hi", "reason": "Acquired", "type": "Normal",
            "reportingController": "turnstile", "reportingInstance": "x", "eventTime": "2024-01-01T00:00:00.000000Z"});
        let core = to_core(&v1);
        assert_eq!(core["involvedObject"]["name"], "p");
        assert_eq!(core["message"], "hi");
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(from_core(&core), v1);
    }
}
