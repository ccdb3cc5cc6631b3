//! Just enough of Kubernetes' protobuf encoding to accept what kubectl's imperative
//! generators send (`kubectl create namespace|configmap|secret`): the `k8s\0` envelope,
//! `runtime.Unknown`, and the fields of Namespace, ConfigMap, Secret and their ObjectMeta.
//! Everything is turned into the equivalent JSON object.

use base64::Engine as _;
use serde_json::{json, Map, Value};

use crate::error::ApiError;

/// The media type kubectl's typed clients send.
pub(crate) const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

const MAGIC: &[u8] = b"k8s\0";

/// One decoded field: its number and its wire value.
enum Wire<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

fn bad(what: &str) -> ApiError {
    ApiError::bad_request(format!("cannot decode protobuf body: {what}"))
}

fn varint(buf: &[u8], pos: &mut usize) -> Result<u64, ApiError> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *buf.get(*pos).ok_or_else(|| bad("truncated varint"))?;
        *pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(bad("varint too long"))
}

/// The fields of one message, in order.
fn fields(buf: &[u8]) -> Result<Vec<(u64, Wire<'_>)>, ApiError> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let key = varint(buf, &mut pos)?;
        let wire = match key & 7 {
            0 => Wire::Varint(varint(buf, &mut pos)?),
            2 => {
                let len = usize::try_from(varint(buf, &mut pos)?).map_err(|_| bad("length"))?;
                let end = pos
                    .checked_add(len)
                    .filter(|e| *e <= buf.len())
                    .ok_or_else(|| bad("truncated field"))?;
                let bytes = &buf[pos..end];
                pos = end;
                Wire::Bytes(bytes)
            }
            1 => {
                pos += 8;
                continue;
            }
            5 => {
                pos += 4;
                continue;
            }
            other => return Err(bad(&format!("unsupported wire type {other}"))),
        };
        out.push((key >> 3, wire));
    }
    Ok(out)
}

fn text(bytes: &[u8]) -> Result<String, ApiError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| bad("invalid UTF-8"))
}

/// A `map<string, string>` (or bytes, base64-encoded as in JSON) entry.
fn map_entry(bytes: &[u8], values_are_bytes: bool) -> Result<(String, Value), ApiError> {
    let mut key = String::new();
    let mut value = Value::String(String::new());
    for (n, w) in fields(bytes)? {
        match (n, w) {
            (1, Wire::Bytes(b)) => key = text(b)?,
            (2, Wire::Bytes(b)) if values_are_bytes => {
                value = Value::String(base64::engine::general_purpose::STANDARD.encode(b));
            }
            (2, Wire::Bytes(b)) => value = Value::String(text(b)?),
            _ => {}
        }
    }
    Ok((key, value))
}

fn insert_entry(obj: &mut Map<String, Value>, field: &str, entry: (String, Value)) {
    if let Value::Object(m) = obj.entry(field).or_insert_with(|| json!({})) {
        m.insert(entry.0, entry.1);
    }
}

fn push_string(obj: &mut Map<String, Value>, field: &str, s: String) {
    if let Value::Array(a) = obj.entry(field).or_insert_with(|| json!([])) {
        a.push(Value::String(s));
    }
}

fn object_meta(bytes: &[u8]) -> Result<Value, ApiError> {
    let mut m = Map::new();
    for (n, w) in fields(bytes)? {
        match (n, w) {
            (1, Wire::Bytes(b)) => {
                m.insert("name".into(), Value::String(text(b)?));
            }
            (2, Wire::Bytes(b)) => {
                m.insert("generateName".into(), Value::String(text(b)?));
            }
            (3, Wire::Bytes(b)) => {
                m.insert("namespace".into(), Value::String(text(b)?));
            }
            (6, Wire::Bytes(b)) => {
                m.insert("resourceVersion".into(), Value::String(text(b)?));
            }
            (11, Wire::Bytes(b)) => insert_entry(&mut m, "labels", map_entry(b, false)?),
            (12, Wire::Bytes(b)) => insert_entry(&mut m, "annotations", map_entry(b, false)?),
            (14, Wire::Bytes(b)) => push_string(&mut m, "finalizers", text(b)?),
            _ => {}
        }
    }
    Ok(Value::Object(m))
}

/// Decodes a protobuf request body of a Namespace, ConfigMap or Secret into JSON.
pub(crate) fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let envelope = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| bad("missing k8s envelope"))?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    for (n, w) in fields(envelope)? {
        match (n, w) {
            (1, Wire::Bytes(type_meta)) => {
                for (tn, tw) in fields(type_meta)? {
                    match (tn, tw) {
                        (1, Wire::Bytes(b)) => api_version = text(b)?,
                        (2, Wire::Bytes(b)) => kind = text(b)?,
                        _ => {}
                    }
                }
            }
            (2, Wire::Bytes(b)) => raw = b,
            _ => {}
        }
    }
    let mut obj = Map::new();
    obj.insert("apiVersion".into(), Value::String(api_version.clone()));
    obj.insert("kind".into(), Value::String(kind.clone()));
    for (n, w) in fields(raw)? {
        match (kind.as_str(), n, w) {
            (_, 1, Wire::Bytes(b)) => {
                obj.insert("metadata".into(), object_meta(b)?);
            }
            ("Namespace", 2, Wire::Bytes(spec)) => {
                let mut s = Map::new();
                for (sn, sw) in fields(spec)? {
                    if let (1, Wire::Bytes(b)) = (sn, sw) {
                        push_string(&mut s, "finalizers", text(b)?);
                    }
                }
                obj.insert("spec".into(), Value::Object(s));
            }
            ("ConfigMap", 2, Wire::Bytes(b)) => {
                insert_entry(&mut obj, "data", map_entry(b, false)?)
            }
            ("ConfigMap", 3, Wire::Bytes(b)) => {
                insert_entry(&mut obj, "binaryData", map_entry(b, true)?)
            }
            ("ConfigMap", 4, Wire::Varint(v)) | ("Secret", 5, Wire::Varint(v)) => {
                obj.insert("immutable".into(), Value::Bool(v != 0));
            }
            ("Secret", 2, Wire::Bytes(b)) => insert_entry(&mut obj, "data", map_entry(b, true)?),
            ("Secret", 3, Wire::Bytes(b)) => {
                obj.insert("type".into(), Value::String(text(b)?));
            }
            ("Secret", 4, Wire::Bytes(b)) => {
                insert_entry(&mut obj, "stringData", map_entry(b, false)?)
            }
            ("Namespace" | "ConfigMap" | "Secret", _, _) => {}
            (other, _, _) => {
                return Err(ApiError::unsupported_media_type(&format!(
                    "{MEDIA_TYPE} (kind {other} in {api_version})"
                )));
            }
        }
    }
    Ok(Value::Object(obj))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(n: u64, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![(n << 3 | 2) as u8, bytes.len() as u8];
        out.extend_from_slice(bytes);
        out
    }

    #[test]
    fn decodes_a_configmap_like_kubectl_sends_it() {
        let meta = [
            field(1, b"cm"),
            field(11, &[field(1, b"app"), field(2, b"x")].concat()),
        ]
        .concat();
        let raw = [
            field(1, &meta),
            field(2, &[field(1, b"k"), field(2, b"v")].concat()),
        ]
        .concat();
        let type_meta = [field(1, b"v1"), field(2, b"ConfigMap")].concat();
        let body = [MAGIC.to_vec(), field(1, &type_meta), field(2, &raw)].concat();
        assert_eq!(
            decode(&body).unwrap(),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "labels": {"app": "x"}}, "data": {"k": "v"}})
        );
        assert_eq!(decode(b"nope").unwrap_err().code, 400);
    }
}
