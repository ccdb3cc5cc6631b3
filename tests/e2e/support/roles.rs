//! The example manifests' RBAC Roles, as the verbs they grant: what a test compares with the
//! requests a binary made and with the README's list.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Deserialize as _;
use serde_json::Value;

/// A set of verbs, from a list.
pub fn verbs(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|verb| verb.to_string()).collect()
}

/// The verbs per `(group, resource)` the example's `Role` named `role` grants.
pub fn example_role(file: &str, role: &str) -> BTreeMap<(String, String), BTreeSet<String>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(file);
    let text = std::fs::read_to_string(&path).expect("the example");
    let mut verbs: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let object = Value::deserialize(document).expect("YAML");
        if object["kind"] != "Role" || object["metadata"]["name"] != role {
            continue;
        }
        for rule in object["rules"].as_array().expect("rules") {
            let strings = |field: &str| -> Vec<String> {
                rule[field]
                    .as_array()
                    .expect("a list")
                    .iter()
                    .map(|v| v.as_str().expect("a string").to_owned())
                    .collect()
            };
            for group in strings("apiGroups") {
                for resource in strings("resources") {
                    verbs
                        .entry((group.clone(), resource))
                        .or_default()
                        .extend(strings("verbs"));
                }
            }
        }
    }
    assert!(!verbs.is_empty(), "no Role {role} in {file}");
    verbs
}
