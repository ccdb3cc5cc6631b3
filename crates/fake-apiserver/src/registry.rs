//! The resource types the server knows: built-in kinds and those registered by CRDs.

use std::sync::Arc;

use serde_json::Value;

use crate::error::{ApiError, FieldError};

/// What a resource needs beyond the generic REST behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Special {
    /// Nothing special.
    None,
    /// `namespaces`: created Active, deleted through Terminating.
    Namespace,
    /// `customresourcedefinitions`: registering a type.
    Crd,
    /// `pods`: status reset to Pending on create.
    Pod,
    /// `secrets`: `stringData` folded into `data`.
    Secret,
    /// `events.k8s.io/v1` Events, stored as core v1 Events.
    EventsV1,
}

/// The deletion propagation a type uses when the request does not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Propagation {
    /// Dependents are deleted by the garbage collector after the owner is gone.
    Background,
    /// Dependents lose their owner reference.
    Orphan,
    /// Treated as Background (see README).
    Foreground,
}

impl Propagation {
    /// Parses a `propagationPolicy` value.
    pub(crate) fn parse(s: &str) -> Result<Self, ApiError> {
        match s {
            "Background" => Ok(Self::Background),
            "Orphan" => Ok(Self::Orphan),
            "Foreground" => Ok(Self::Foreground),
            other => Err(ApiError::bad_request(format!(
                "propagationPolicy: Unsupported value: {other:?}"
            ))),
        }
    }
}

/// One `additionalPrinterColumns` entry.
#[derive(Debug, Clone)]
pub(crate) struct PrinterColumn {
    pub name: String,
    pub type_: String,
    pub format: String,
    pub description: String,
    pub priority: i64,
    pub json_path: String,
}

/// One served version of a type.
#[derive(Debug, Clone)]
pub(crate) struct VersionSpec {
    pub name: String,
    pub served: bool,
    pub storage: bool,
    /// `openAPIV3Schema`, for CRD versions.
    pub schema: Option<Value>,
    /// The schema's CEL rules, compiled once when the CRD is stored (as kube-apiserver does),
    /// not on every write; `None` when it has none.
    pub cel_rules: Option<Arc<kube_cel::CompiledSchema>>,
    pub printer_columns: Vec<PrinterColumn>,
    pub status_subresource: bool,
    /// `selectableFields`, as field-selector labels (`spec.lockName`).
    pub selectable_fields: Vec<String>,
}

/// A resource type as served under `/api` or `/apis`.
#[derive(Debug, Clone)]
pub(crate) struct ResourceType {
    pub group: String,
    pub kind: String,
    pub list_kind: String,
    pub plural: String,
    pub singular: String,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub namespaced: bool,
    pub versions: Vec<VersionSpec>,
    /// The group whose storage holds the objects (differs for `events.k8s.io`).
    pub storage_group: String,
    pub special: Special,
    /// Whether `metadata.generation` is maintained.
    pub tracks_generation: bool,
    pub default_propagation: Propagation,
    /// Whether the type comes from a CRD (schema validation, strict field checks).
    pub from_crd: bool,
}

impl ResourceType {
    /// The version called `name`, if served.
    pub(crate) fn version(&self, name: &str) -> Option<&VersionSpec> {
        self.versions.iter().find(|v| v.name == name && v.served)
    }

    /// The storage version.
    pub(crate) fn storage_version(&self) -> &str {
        self.versions
            .iter()
            .find(|v| v.storage)
            .or_else(|| self.versions.first())
            .map(|v| v.name.as_str())
            .unwrap_or("v1")
    }

    /// `apiVersion` for `version`.
    pub(crate) fn api_version(&self, version: &str) -> String {
        api_version(&self.group, version)
    }

    /// Whether `version` has the status subresource.
    pub(crate) fn has_status(&self, version: &str) -> bool {
        self.versions
            .iter()
            .any(|v| v.name == version && v.status_subresource)
    }
}

/// `group/version`, or `version` for the core group.
pub(crate) fn api_version(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    }
}

/// All types currently served.
#[derive(Debug, Clone)]
pub(crate) struct Registry {
    types: Vec<Arc<ResourceType>>,
}

/// Shorthand for declaring a built-in type.
struct Builtin {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    short: &'static [&'static str],
    categories: &'static [&'static str],
    namespaced: bool,
    status: bool,
    special: Special,
    generation: bool,
    propagation: Propagation,
}

impl Builtin {
    fn build(&self) -> ResourceType {
        ResourceType {
            group: self.group.into(),
            kind: self.kind.into(),
            list_kind: format!("{}List", self.kind),
            plural: self.plural.into(),
            singular: self.kind.to_lowercase(),
            short_names: self.short.iter().map(|s| s.to_string()).collect(),
            categories: self.categories.iter().map(|s| s.to_string()).collect(),
            namespaced: self.namespaced,
            versions: vec![VersionSpec {
                name: self.version.into(),
                served: true,
                storage: true,
                schema: None,
                cel_rules: None,
                printer_columns: Vec::new(),
                status_subresource: self.status,
                selectable_fields: Vec::new(),
            }],
            storage_group: if self.special == Special::EventsV1 {
                String::new()
            } else {
                self.group.into()
            },
            special: self.special,
            tracks_generation: self.generation,
            default_propagation: self.propagation,
            from_crd: false,
        }
    }
}

#[rustfmt::skip]
const BUILTINS: &[Builtin] = &[
    Builtin { group: "", version: "v1", kind: "Namespace", plural: "namespaces", short: &["ns"], categories: &[], namespaced: false, status: true, special: Special::Namespace, generation: false, propagation: Propagation::Background },
    Builtin { group: "", version: "v1", kind: "Event", plural: "events", short: &["ev"], categories: &[], namespaced: true, status: false, special: Special::None, generation: false, propagation: Propagation::Background },
    Builtin { group: "", version: "v1", kind: "Pod", plural: "pods", short: &["po"], categories: &["all"], namespaced: true, status: true, special: Special::Pod, generation: true, propagation: Propagation::Background },
    Builtin { group: "", version: "v1", kind: "ConfigMap", plural: "configmaps", short: &["cm"], categories: &[], namespaced: true, status: false, special: Special::None, generation: false, propagation: Propagation::Background },
    Builtin { group: "", version: "v1", kind: "Secret", plural: "secrets", short: &[], categories: &[], namespaced: true, status: false, special: Special::Secret, generation: false, propagation: Propagation::Background },
    Builtin { group: "", version: "v1", kind: "ServiceAccount", plural: "serviceaccounts", short: &["sa"], categories: &[], namespaced: true, status: false, special: Special::None, generation: false, propagation: Propagation::Background },
    Builtin { group: "events.k8s.io", version: "v1", kind: "Event", plural: "events", short: &["ev"], categories: &[], namespaced: true, status: false, special: Special::EventsV1, generation: false, propagation: Propagation::Background },
    Builtin { group: "batch", version: "v1", kind: "Job", plural: "jobs", short: &[], categories: &["all"], namespaced: true, status: true, special: Special::None, generation: true, propagation: Propagation::Orphan },
    Builtin { group: "coordination.k8s.io", version: "v1", kind: "Lease", plural: "leases", short: &[], categories: &[], namespaced: true, status: false, special: Special::None, generation: false, propagation: Propagation::Background },
    Builtin { group: "apiextensions.k8s.io", version: "v1", kind: "CustomResourceDefinition", plural: "customresourcedefinitions", short: &["crd", "crds"], categories: &["api-extensions"], namespaced: false, status: true, special: Special::Crd, generation: true, propagation: Propagation::Background },
];

impl Registry {
    /// The built-in types only.
    pub(crate) fn builtins() -> Self {
        Self {
            types: BUILTINS.iter().map(|b| Arc::new(b.build())).collect(),
        }
    }

    /// The type serving `group/version/plural`.
    pub(crate) fn lookup(
        &self,
        group: &str,
        version: &str,
        plural: &str,
    ) -> Option<Arc<ResourceType>> {
        self.types
            .iter()
            .find(|t| t.group == group && t.plural == plural && t.version(version).is_some())
            .cloned()
    }

    /// The type that stores objects under `storage_group/plural` with its own group
    /// (the canonical one, used for garbage collection and namespaces).
    pub(crate) fn storage_type(
        &self,
        storage_group: &str,
        plural: &str,
    ) -> Option<Arc<ResourceType>> {
        self.types
            .iter()
            .find(|t| t.group == storage_group && t.plural == plural)
            .cloned()
    }

    /// The types served at `group/version`.
    pub(crate) fn in_group_version(&self, group: &str, version: &str) -> Vec<Arc<ResourceType>> {
        self.types
            .iter()
            .filter(|t| t.group == group && t.version(version).is_some())
            .cloned()
            .collect()
    }

    /// The groups in discovery order (core first), with their served versions.
    pub(crate) fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut groups: Vec<(String, Vec<String>)> = Vec::new();
        for t in &self.types {
            let entry = match groups.iter_mut().position(|(g, _)| *g == t.group) {
                Some(i) => &mut groups[i].1,
                None => {
                    groups.push((t.group.clone(), Vec::new()));
                    let last = groups.len() - 1;
                    &mut groups[last].1
                }
            };
            for v in t.versions.iter().filter(|v| v.served) {
                if !entry.contains(&v.name) {
                    entry.push(v.name.clone());
                }
            }
        }
        groups
    }

    /// Registers (or replaces) the type a CRD defines.
    pub(crate) fn register(&mut self, rtype: ResourceType) {
        self.types
            .retain(|t| !(t.group == rtype.group && t.plural == rtype.plural));
        self.types.push(Arc::new(rtype));
    }

    /// Removes the type `group/plural`.
    pub(crate) fn unregister(&mut self, group: &str, plural: &str) {
        self.types
            .retain(|t| !(t.from_crd && t.group == group && t.plural == plural));
    }
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    let mut cur = v;
    for p in path {
        cur = cur.get(p)?;
    }
    cur.as_str()
}

fn strings_at(v: &Value, path: &[&str]) -> Vec<String> {
    let mut cur = v;
    for p in path {
        match cur.get(p) {
            Some(next) => cur = next,
            None => return Vec::new(),
        }
    }
    cur.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Checks a CRD object and builds the type it defines, with kube-apiserver's causes on error.
pub(crate) fn type_from_crd(crd: &Value) -> Result<ResourceType, Vec<FieldError>> {
    let mut errors = Vec::new();
    let name = str_at(crd, &["metadata", "name"]).unwrap_or_default();
    let group = str_at(crd, &["spec", "group"])
        .unwrap_or_default()
        .to_string();
    let plural = str_at(crd, &["spec", "names", "plural"])
        .unwrap_or_default()
        .to_string();
    let kind = str_at(crd, &["spec", "names", "kind"])
        .unwrap_or_default()
        .to_string();
    if group.is_empty() {
        errors.push(FieldError::required("spec.group", ""));
    } else if !group.contains('.') {
        errors.push(FieldError::invalid(
            "spec.group",
            &Value::String(group.clone()),
            "should be a domain with at least one dot",
        ));
    }
    if plural.is_empty() {
        errors.push(FieldError::required("spec.names.plural", ""));
    }
    if kind.is_empty() {
        errors.push(FieldError::required("spec.names.kind", ""));
    }
    if !group.is_empty() && !plural.is_empty() && name != format!("{plural}.{group}") {
        errors.push(FieldError::invalid(
            "metadata.name",
            &Value::String(name.to_string()),
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    let scope = str_at(crd, &["spec", "scope"]).unwrap_or_default();
    let namespaced = match scope {
        "Namespaced" => true,
        "Cluster" => false,
        other => {
            errors.push(FieldError::not_supported(
                "spec.scope",
                &Value::String(other.into()),
                &["Cluster".into(), "Namespaced".into()],
            ));
            true
        }
    };
    let mut versions = Vec::new();
    let raw_versions = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if raw_versions.is_empty() {
        errors.push(FieldError::invalid(
            "spec.versions",
            &Value::Array(vec![]),
            "must have exactly one version marked as storage version",
        ));
    }
    for (i, v) in raw_versions.iter().enumerate() {
        let vname = str_at(v, &["name"]).unwrap_or_default().to_string();
        if vname.is_empty() {
            errors.push(FieldError::required(
                &format!("spec.versions[{i}].name"),
                "",
            ));
        }
        let schema = v.pointer("/schema/openAPIV3Schema").cloned();
        match &schema {
            None => errors.push(FieldError::required(
                &format!("spec.versions[{i}].schema.openAPIV3Schema"),
                "schemas are required",
            )),
            Some(s) if s.get("type").and_then(Value::as_str) != Some("object") => {
                errors.push(FieldError::other(
                    "FieldValueRequired",
                    &format!("spec.versions[{i}].schema.openAPIV3Schema.type"),
                    "Required value: must be object at the root".into(),
                ))
            }
            Some(s) => errors.extend(crate::structural::check(
                s,
                &format!("spec.versions[{i}].schema.openAPIV3Schema"),
            )),
        }
        let printer_columns = v
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .map(|cols| {
                cols.iter()
                    .map(|c| PrinterColumn {
                        name: str_at(c, &["name"]).unwrap_or_default().into(),
                        type_: str_at(c, &["type"]).unwrap_or("string").into(),
                        format: str_at(c, &["format"]).unwrap_or_default().into(),
                        description: str_at(c, &["description"]).unwrap_or_default().into(),
                        priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                        json_path: str_at(c, &["jsonPath"]).unwrap_or_default().into(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let cel_rules = schema
            .as_ref()
            .filter(|schema| crate::cel::has_rules(schema))
            .map(|schema| Arc::new(kube_cel::compile_schema(schema)));
        versions.push(VersionSpec {
            name: vname,
            served: v.get("served").and_then(Value::as_bool).unwrap_or(false),
            storage: v.get("storage").and_then(Value::as_bool).unwrap_or(false),
            schema,
            cel_rules,
            printer_columns,
            status_subresource: v.pointer("/subresources/status").is_some(),
            selectable_fields: v
                .get("selectableFields")
                .and_then(Value::as_array)
                .map(|fields| {
                    fields
                        .iter()
                        .filter_map(|f| f.get("jsonPath").and_then(Value::as_str))
                        .map(|p| p.trim_start_matches('.').to_string())
                        .collect()
                })
                .unwrap_or_default(),
        });
    }
    if !raw_versions.is_empty() && versions.iter().filter(|v| v.storage).count() != 1 {
        errors.push(FieldError::invalid(
            "spec.versions",
            &Value::String(String::new()),
            "must have exactly one version marked as storage version",
        ));
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let singular = str_at(crd, &["spec", "names", "singular"])
        .map(String::from)
        .unwrap_or_else(|| kind.to_lowercase());
    let list_kind = str_at(crd, &["spec", "names", "listKind"])
        .map(String::from)
        .unwrap_or_else(|| format!("{kind}List"));
    Ok(ResourceType {
        storage_group: group.clone(),
        group,
        kind,
        list_kind,
        plural,
        singular,
        short_names: strings_at(crd, &["spec", "names", "shortNames"]),
        categories: strings_at(crd, &["spec", "names", "categories"]),
        namespaced,
        versions,
        special: Special::None,
        tracks_generation: true,
        default_propagation: Propagation::Background,
        from_crd: true,
    })
}
