//! Discovery: `/version`, `/api`, `/api/v1`, `/apis`, `/apis/G`, `/apis/G/V` (the legacy
//! documents; kubectl falls back to them when aggregated discovery is not offered).

use std::hash::{Hash, Hasher};

use serde_json::{json, Value};

use crate::registry::{api_version, Registry, ResourceType};

/// The Kubernetes version the fake claims (kubectl on these machines is v1.32).
pub(crate) const MAJOR: &str = "1";
/// See [`MAJOR`].
pub(crate) const MINOR: &str = "32";

/// The verbs every served resource supports.
const RESOURCE_VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// `/version`.
pub(crate) fn version() -> Value {
    json!({
        "major": MAJOR,
        "minor": MINOR,
        "gitVersion": format!("v{MAJOR}.{MINOR}.0-fake"),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.23.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `/api`.
pub(crate) fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn group_entry(name: &str, versions: &[String]) -> Value {
    let list: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": api_version(name, v), "version": v}))
        .collect();
    let preferred = list.first().cloned().unwrap_or_else(|| json!({}));
    json!({"name": name, "versions": list, "preferredVersion": preferred})
}

/// `/apis`.
pub(crate) fn group_list(registry: &Registry) -> Value {
    let groups: Vec<Value> = registry
        .groups()
        .iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, vs)| group_entry(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/G`, or None when no such group is served.
pub(crate) fn group(registry: &Registry, name: &str) -> Option<Value> {
    let (g, vs) = registry
        .groups()
        .into_iter()
        .find(|(g, _)| g == name && !g.is_empty())?;
    let mut entry = group_entry(&g, &vs);
    entry["kind"] = json!("APIGroup");
    entry["apiVersion"] = json!("v1");
    Some(entry)
}

/// A stable hash of a type's shape, like `storageVersionHash`.
fn storage_hash(t: &ResourceType) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (&t.group, &t.kind, t.storage_version()).hash(&mut h);
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(h.finish().to_be_bytes())
}

/// `/api/v1` or `/apis/G/V`, or None when that group/version is not served.
pub(crate) fn resource_list(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let types = registry.in_group_version(group, version);
    if types.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for t in &types {
        let mut entry = json!({
            "name": t.plural,
            "singularName": t.singular,
            "namespaced": t.namespaced,
            "kind": t.kind,
            "verbs": RESOURCE_VERBS,
            "storageVersionHash": storage_hash(t),
        });
        if !t.short_names.is_empty() {
            entry["shortNames"] = json!(t.short_names);
        }
        if !t.categories.is_empty() {
            entry["categories"] = json!(t.categories);
        }
        resources.push(entry);
        if t.has_status(version) {
            resources.push(json!({
                "name": format!("{}/status", t.plural),
                "singularName": "",
                "namespaced": t.namespaced,
                "kind": t.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": api_version(group, version),
        "resources": resources,
    }))
}

/// Which aggregated discovery version (`v2` or `v2beta1`) the `Accept` header asks for first,
/// if any; kubectl 1.32 and kube-rs' `run_aggregated` ask for it, older clients do not.
pub(crate) fn aggregated_version(accept: &str) -> Option<&'static str> {
    for range in accept.split(',') {
        let params: Vec<&str> = range.split(';').map(str::trim).collect();
        let has = |p: &str| params.contains(&p);
        if params.first() == Some(&"application/json") {
            if has("g=apidiscovery.k8s.io") && has("as=APIGroupDiscoveryList") {
                if has("v=v2") {
                    return Some("v2");
                }
                if has("v=v2beta1") {
                    return Some("v2beta1");
                }
            } else if !range.contains("as=") {
                return None;
            }
        }
    }
    None
}

/// The `Content-Type` of an aggregated discovery answer.
pub(crate) fn aggregated_content_type(version: &str) -> String {
    format!("application/json;g=apidiscovery.k8s.io;v={version};as=APIGroupDiscoveryList")
}

/// Aggregated discovery (`APIGroupDiscoveryList`) of the core group (`core == true`, for
/// `/api`) or of all named groups (for `/apis`).
pub(crate) fn aggregated(registry: &Registry, core: bool, discovery_version: &str) -> Value {
    let items: Vec<Value> = registry
        .groups()
        .iter()
        .filter(|(g, _)| g.is_empty() == core)
        .map(|(g, versions)| {
            let versions: Vec<Value> = versions
                .iter()
                .map(|v| {
                    let resources: Vec<Value> = registry
                        .in_group_version(g, v)
                        .iter()
                        .map(|t| {
                            let kind = json!({"group": t.group, "version": v, "kind": t.kind});
                            let mut r = json!({
                                "resource": t.plural,
                                "responseKind": kind,
                                "scope": if t.namespaced { "Namespaced" } else { "Cluster" },
                                "singularResource": t.singular,
                                "verbs": RESOURCE_VERBS,
                            });
                            if !t.short_names.is_empty() {
                                r["shortNames"] = json!(t.short_names);
                            }
                            if !t.categories.is_empty() {
                                r["categories"] = json!(t.categories);
                            }
                            if t.has_status(v) {
                                r["subresources"] = json!([{"subresource": "status", "responseKind": kind, "verbs": ["get", "patch", "update"]}]);
                            }
                            r
                        })
                        .collect();
                    json!({"version": v, "resources": resources, "freshness": "Current"})
                })
                .collect();
            let metadata = if g.is_empty() { json!({}) } else { json!({"name": g}) };
            json!({"metadata": metadata, "versions": versions})
        })
        .collect();
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": format!("apidiscovery.k8s.io/{discovery_version}"),
        "metadata": {},
        "items": items,
    })
}
