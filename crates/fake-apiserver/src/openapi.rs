//! A minimal `/openapi/v3`: enough for kubectl to see that every kind supports
//! server-side field validation (so `kubectl apply` validates with `fieldValidation=Strict`),
//! plus each CRD's schema for `kubectl explain`-style clients.

use std::hash::{Hash, Hasher};

use serde_json::{json, Map, Value};

use crate::registry::{Registry, ResourceType};

/// `api/v1` or `apis/G/V`.
fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// The component name of a kind's schema (reverse-DNS group, version, kind).
fn schema_name(t: &ResourceType, version: &str) -> String {
    if t.group.is_empty() {
        return format!("io.k8s.api.core.{version}.{}", t.kind);
    }
    let reversed: Vec<&str> = t.group.split('.').rev().collect();
    format!("{}.{version}.{}", reversed.join("."), t.kind)
}

fn gvk(t: &ResourceType, version: &str) -> Value {
    json!({"group": t.group, "version": version, "kind": t.kind})
}

fn query_param(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "query", "description": description, "schema": {"type": "string", "uniqueItems": true}})
}

/// The OpenAPI v3 document of one group/version, or None when it is not served.
pub(crate) fn document(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let types = registry.in_group_version(group, version);
    if types.is_empty() {
        return None;
    }
    let mut paths = Map::new();
    let mut schemas = Map::new();
    for t in &types {
        let name = schema_name(t, version);
        let reference = json!({"$ref": format!("#/components/schemas/{name}")});
        let content = json!({"application/json": {"schema": reference}});
        let base = if t.group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{}/{version}", t.group)
        };
        let collection = if t.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}", t.plural)
        } else {
            format!("{base}/{}", t.plural)
        };
        let mut patch_types = Map::new();
        for ct in [
            "application/json-patch+json",
            "application/merge-patch+json",
            "application/apply-patch+yaml",
        ] {
            patch_types.insert(ct.into(), json!({"schema": {"type": "object"}}));
        }
        let op = |action: &str| {
            json!({
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk(t, version),
                "responses": {"200": {"description": "OK", "content": content}},
            })
        };
        let mut patch = op("patch");
        patch["requestBody"] = json!({"content": patch_types});
        patch["parameters"] = json!([
            query_param("dryRun", "When present, indicates that modifications should not be persisted."),
            query_param("fieldManager", "fieldManager is a name associated with the actor or entity that is making these changes."),
            query_param("fieldValidation", "fieldValidation instructs the server on how to handle objects in the request containing unknown or duplicate fields."),
            query_param("force", "Force is going to \"force\" Apply requests."),
        ]);
        let mut put = op("put");
        put["parameters"] = json!([
            query_param("fieldValidation", "fieldValidation"),
            query_param("dryRun", "dryRun")
        ]);
        paths.insert(
            format!("{collection}/{{name}}"),
            json!({"get": op("get"), "put": put, "patch": patch, "delete": op("delete")}),
        );
        let mut post = op("post");
        post["parameters"] = json!([
            query_param("fieldValidation", "fieldValidation"),
            query_param("dryRun", "dryRun")
        ]);
        paths.insert(collection, json!({"get": op("list"), "post": post}));

        let mut schema = t
            .versions
            .iter()
            .find(|v| v.name == version)
            .and_then(|v| v.schema.clone())
            .unwrap_or_else(
                || json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
            );
        if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
            props.insert("apiVersion".into(), json!({"type": "string"}));
            props.insert("kind".into(), json!({"type": "string"}));
            props.insert("metadata".into(), json!({"type": "object"}));
        }
        schema["x-kubernetes-group-version-kind"] = json!([gvk(t, version)]);
        schemas.insert(name, schema);
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": format!("v{}.{}.0", crate::discovery::MAJOR, crate::discovery::MINOR)},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}

/// `/openapi/v3`: the index of per-group/version documents, each with a content hash.
pub(crate) fn root(registry: &Registry) -> Value {
    let mut paths = Map::new();
    for (group, versions) in registry.groups() {
        for version in versions {
            let Some(doc) = document(registry, &group, &version) else {
                continue;
            };
            let mut h = std::collections::hash_map::DefaultHasher::new();
            doc.to_string().hash(&mut h);
            let path = gv_path(&group, &version);
            paths.insert(path.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash={:016X}", h.finish())}));
        }
    }
    json!({ "paths": paths })
}
