//! The REST semantics of kube-apiserver's generic registry: create, get, list, update,
//! patch and delete, with `resourceVersion` concurrency, status isolation, generation
//! rules, finalizers, no-op detection and admission (schema + CEL) for custom resources.

use std::sync::Arc;

use base64::Engine as _;
use serde_json::{json, Value};

use crate::admission::{
    admit, check_type_meta, clean_metadata, field_validation, fold_string_data, validate_metadata,
    validate_name, FieldValidation,
};
use crate::error::{ApiError, FieldError};
use crate::events;
use crate::meta;
use crate::patch::{self, PatchKind};
use crate::registry::{self, Propagation, ResourceType, Special};
use crate::selector::Selectors;
use crate::store::{EventType, Inner, ObjectKey, Store};

/// The resource a request addresses.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub rtype: Arc<ResourceType>,
    pub version: String,
    /// The namespace (None for cluster-scoped types, and for lists across namespaces).
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// `status` or None.
    pub subresource: Option<String>,
}

impl Target {
    /// The storage key of `name` in this target's namespace.
    pub(crate) fn key(&self, name: &str) -> ObjectKey {
        ObjectKey {
            group: self.rtype.storage_group.clone(),
            resource: self.rtype.plural.clone(),
            namespace: if self.rtype.namespaced {
                self.namespace.clone().unwrap_or_default()
            } else {
                String::new()
            },
            name: name.to_string(),
        }
    }

    /// The stored objects in this target's scope (one namespace, or all) that match `selectors`.
    pub(crate) fn matching(&self, inner: &Inner, selectors: &Selectors) -> Vec<Arc<Value>> {
        let namespace = if self.rtype.namespaced {
            self.namespace.as_deref()
        } else {
            None
        };
        inner
            .list(&self.rtype.storage_group, &self.rtype.plural, namespace)
            .into_iter()
            .filter(|o| selectors.matches(o))
            .collect()
    }

    fn not_found(&self, name: &str) -> ApiError {
        ApiError::not_found(&self.rtype.group, &self.rtype.plural, name)
    }

    fn url_name(&self) -> Result<&str, ApiError> {
        self.name
            .as_deref()
            .ok_or_else(ApiError::method_not_allowed)
    }

    fn is_status(&self) -> bool {
        self.subresource.as_deref() == Some("status")
    }
}

/// Options of a create, update or patch.
#[derive(Debug, Clone)]
pub(crate) struct WriteOptions {
    pub dry_run: bool,
    pub field_validation: FieldValidation,
    pub field_manager: Option<String>,
}

/// Options of a delete.
#[derive(Debug, Clone, Default)]
pub(crate) struct DeleteOptions {
    pub dry_run: bool,
    pub propagation: Option<Propagation>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
}

/// The result of a write: the object to answer with, the HTTP code, and warnings.
#[derive(Debug)]
pub(crate) struct WriteResult {
    pub object: Value,
    pub code: u16,
    pub warnings: Vec<String>,
}

/// The object as served at `version` (events.k8s.io converted, apiVersion/kind set).
pub(crate) fn to_served(rtype: &ResourceType, version: &str, stored: &Value) -> Value {
    if rtype.special == Special::EventsV1 {
        return events::from_core(stored);
    }
    let mut obj = stored.clone();
    if let Some(map) = obj.as_object_mut() {
        map.insert(
            "apiVersion".into(),
            Value::String(rtype.api_version(version)),
        );
        map.insert("kind".into(), Value::String(rtype.kind.clone()));
    }
    obj
}

/// The object as stored (core Events for events.k8s.io; the storage version otherwise).
fn to_stored(rtype: &ResourceType, obj: Value) -> Value {
    if rtype.special == Special::EventsV1 {
        return events::to_core(&obj);
    }
    let mut obj = obj;
    if let Some(map) = obj.as_object_mut() {
        map.insert(
            "apiVersion".into(),
            Value::String(rtype.api_version(rtype.storage_version())),
        );
        map.insert("kind".into(), Value::String(rtype.kind.clone()));
    }
    obj
}

/// The five random characters kube-apiserver appends to `generateName`.
fn random_suffix() -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// Sets `status` of `to` to that of `from` (removing it when `from` has none).
fn copy_status(from: &Value, to: &mut Value) {
    let status = from.get("status").cloned();
    if let Some(map) = to.as_object_mut() {
        match status {
            Some(s) => {
                map.insert("status".into(), s);
            }
            None => {
                map.remove("status");
            }
        }
    }
}

/// Whether anything but metadata (and status, when it is a subresource) differs.
fn spec_changed(old: &Value, new: &Value, status_is_subresource: bool) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.as_object_mut() {
            m.remove("metadata");
            m.remove("apiVersion");
            m.remove("kind");
            if status_is_subresource {
                m.remove("status");
            }
        }
        v
    };
    strip(old) != strip(new)
}

/// 409 for a `uid` that does not match the stored object's (a failed UID precondition).
fn uid_precondition_failed(
    rtype: &ResourceType,
    name: &str,
    wanted: &str,
    actual: &Value,
) -> ApiError {
    ApiError::conflict(
        &rtype.group,
        &rtype.plural,
        name,
        &format!(
            "Precondition failed: UID in precondition: {wanted}, UID in object meta: {}",
            meta::uid(actual)
        ),
    )
}

/// Gets one object.
pub(crate) fn get(store: &Store, t: &Target) -> Result<Value, ApiError> {
    let name = t.url_name()?;
    store.with(|inner| {
        inner
            .get(&t.key(name))
            .map(|o| to_served(&t.rtype, &t.version, &o))
            .ok_or_else(|| t.not_found(name))
    })
}

/// Pagination of a list.
#[derive(Debug, Clone, Default)]
pub(crate) struct ListOptions {
    pub selectors: Selectors,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
}

/// A listed page: items (served), the list's resourceVersion, the continue token and the count left.
#[derive(Debug)]
pub(crate) struct ListPage {
    pub items: Vec<Value>,
    pub resource_version: u64,
    pub continue_token: Option<String>,
    pub remaining: Option<usize>,
}

fn encode_continue(rv: u64, namespace: &str, name: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(json!({"rv": rv, "ns": namespace, "name": name}).to_string())
}

fn decode_continue(token: &str) -> Result<(String, String), ApiError> {
    let bad = || {
        ApiError::bad_request("continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)")
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    let ns = v.get("ns").and_then(Value::as_str).ok_or_else(bad)?;
    let name = v.get("name").and_then(Value::as_str).ok_or_else(bad)?;
    Ok((ns.to_string(), name.to_string()))
}

/// Lists objects matching the selectors, one page at a time when `limit` is set.
pub(crate) fn list(store: &Store, t: &Target, opts: &ListOptions) -> Result<ListPage, ApiError> {
    let after = opts
        .continue_token
        .as_deref()
        .map(decode_continue)
        .transpose()?;
    store.with(|inner| {
        let rv = inner.current_rv();
        let matching: Vec<Arc<Value>> = t
            .matching(inner, &opts.selectors)
            .into_iter()
            .filter(|o| match &after {
                Some((ans, aname)) => {
                    (meta::namespace(o), meta::name(o)) > (ans.as_str(), aname.as_str())
                }
                None => true,
            })
            .collect();
        let total = matching.len();
        let take = opts.limit.filter(|l| *l > 0).unwrap_or(total).min(total);
        let items: Vec<Value> = matching[..take]
            .iter()
            .map(|o| to_served(&t.rtype, &t.version, o))
            .collect();
        let (continue_token, remaining) = if take < total {
            let last = &matching[take - 1];
            (
                Some(encode_continue(rv, meta::namespace(last), meta::name(last))),
                Some(total - take),
            )
        } else {
            (None, None)
        };
        Ok(ListPage {
            items,
            resource_version: rv,
            continue_token,
            remaining,
        })
    })
}

/// Creates an object (POST to the collection).
pub(crate) fn create(
    store: &Store,
    t: &Target,
    body: Value,
    opts: &WriteOptions,
) -> Result<WriteResult, ApiError> {
    store.with(|inner| create_locked(inner, t, body, opts))
}

fn create_locked(
    inner: &mut Inner,
    t: &Target,
    body: Value,
    opts: &WriteOptions,
) -> Result<WriteResult, ApiError> {
    let rtype = t.rtype.clone();
    check_type_meta(&rtype, &t.version, &body)?;
    let warnings = field_validation(&rtype, &t.version, &body, opts.field_validation)?;
    let namespace = if rtype.namespaced {
        let ns = t.namespace.clone().ok_or_else(ApiError::no_route)?;
        let body_ns = meta::namespace(&body);
        if !body_ns.is_empty() && body_ns != ns {
            return Err(ApiError::bad_request("the namespace of the provided object does not match the namespace sent on the request"));
        }
        let ns_key = ObjectKey {
            group: String::new(),
            resource: "namespaces".into(),
            namespace: String::new(),
            name: ns.clone(),
        };
        match inner.get(&ns_key) {
            None => return Err(ApiError::not_found("", "namespaces", &ns)),
            Some(n) if meta::is_deleting(&n) => {
                return Err(ApiError::forbidden(format!(
                    "{} {:?} is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                    crate::error::qualified(&rtype.plural, &rtype.group),
                    meta::name(&body)
                )))
            }
            Some(_) => {}
        }
        ns
    } else {
        String::new()
    };
    let mut obj = to_stored(&rtype, body);
    clean_metadata(&mut obj);
    if !meta::resource_version(&obj).is_empty() {
        return Err(ApiError::internal(
            "resourceVersion should not be set on objects to be created",
        ));
    }
    let mut name = meta::name(&obj).to_string();
    let generate_name = meta::str_field(&obj, "generateName").to_string();
    if name.is_empty() && !generate_name.is_empty() {
        name = loop {
            let candidate = format!("{generate_name}{}", random_suffix());
            if inner.get(&t.key_in(&namespace, &candidate)).is_none() {
                break candidate;
            }
        };
    }
    if name.is_empty() {
        return Err(ApiError::invalid(
            &rtype.group,
            &rtype.kind,
            "",
            &[FieldError::required(
                "metadata.name",
                "name or generateName is required",
            )],
        ));
    }
    let mut meta_errors: Vec<FieldError> = validate_name(&rtype, &name).into_iter().collect();
    meta_errors.extend(validate_metadata(&obj));
    if !meta_errors.is_empty() {
        return Err(ApiError::invalid(
            &rtype.group,
            &rtype.kind,
            &name,
            &meta_errors,
        ));
    }
    let key = t.key_in(&namespace, &name);
    if inner.get(&key).is_some() {
        return Err(ApiError::already_exists(&rtype.group, &rtype.plural, &name));
    }
    {
        let m = meta::metadata_mut(&mut obj);
        m.insert("name".into(), Value::String(name.clone()));
        if rtype.namespaced {
            m.insert("namespace".into(), Value::String(namespace.clone()));
        } else {
            m.remove("namespace");
        }
        m.insert(
            "uid".into(),
            Value::String(uuid::Uuid::new_v4().to_string()),
        );
        m.insert("creationTimestamp".into(), Value::String(meta::now()));
        m.remove("deletionTimestamp");
        m.remove("deletionGracePeriodSeconds");
        m.remove("generation");
        if rtype.tracks_generation {
            m.insert("generation".into(), Value::from(1));
        }
    }
    let storage_version = rtype.storage_version().to_string();
    if rtype.has_status(&storage_version) {
        if let Some(m) = obj.as_object_mut() {
            m.remove("status");
        }
    }
    match rtype.special {
        Special::Namespace => {
            obj["spec"] = json!({"finalizers": ["kubernetes"]});
            obj["status"] = json!({"phase": "Active"});
        }
        Special::Pod => obj["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"}),
        Special::Secret => fold_string_data(&mut obj),
        Special::Crd => {
            let new_type = registry::type_from_crd(&obj)
                .map_err(|errs| ApiError::invalid(&rtype.group, &rtype.kind, &name, &errs))?;
            obj["status"] = json!({
                "acceptedNames": {"plural": "", "kind": ""},
                "conditions": [],
                "storedVersions": [new_type.storage_version()],
            });
        }
        Special::None | Special::EventsV1 => {}
    }
    if rtype.from_crd {
        admit(&rtype, &mut obj, None)?;
    }
    if opts.dry_run {
        return Ok(WriteResult {
            object: to_served(&rtype, &t.version, &obj),
            code: 201,
            warnings,
        });
    }
    let stored = inner.put(key.clone(), obj, EventType::Added);
    if rtype.special == Special::Crd {
        establish_crd(inner, &key, &stored);
    }
    Ok(WriteResult {
        object: to_served(&rtype, &t.version, &stored),
        code: 201,
        warnings,
    })
}

impl Target {
    fn key_in(&self, namespace: &str, name: &str) -> ObjectKey {
        ObjectKey {
            group: self.rtype.storage_group.clone(),
            resource: self.rtype.plural.clone(),
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }
}

/// Registers the CRD's type and marks it NamesAccepted and Established, as the
/// apiextensions controllers do right after the create.
fn establish_crd(inner: &mut Inner, key: &ObjectKey, stored: &Value) {
    let Ok(new_type) = registry::type_from_crd(stored) else {
        return;
    };
    let now = meta::now();
    let condition = |type_: &str, reason: &str, message: &str| json!({"type": type_, "status": "True", "lastTransitionTime": now, "reason": reason, "message": message});
    let mut established = stored.clone();
    established["status"] = json!({
        "acceptedNames": stored.pointer("/spec/names").cloned().unwrap_or_else(|| json!({})),
        "conditions": [
            condition("NamesAccepted", "NoConflicts", "no conflicts found"),
            condition("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        ],
        "storedVersions": [new_type.storage_version()],
    });
    inner.registry.register(new_type);
    inner.put(key.clone(), established, EventType::Modified);
}

/// Replaces an object (PUT), on the main resource or `/status`.
pub(crate) fn update(
    store: &Store,
    t: &Target,
    body: Value,
    opts: &WriteOptions,
) -> Result<WriteResult, ApiError> {
    let name = t.url_name()?.to_string();
    check_type_meta(&t.rtype, &t.version, &body)?;
    let body_name = meta::name(&body);
    if !body_name.is_empty() && body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    if t.rtype.namespaced {
        let body_ns = meta::namespace(&body);
        if !body_ns.is_empty() && Some(body_ns) != t.namespace.as_deref() {
            return Err(ApiError::bad_request("the namespace of the provided object does not match the namespace sent on the request"));
        }
    }
    let warnings = field_validation(&t.rtype, &t.version, &body, opts.field_validation)?;
    store.with(|inner| {
        let old = inner.get(&t.key(&name)).ok_or_else(|| t.not_found(&name))?;
        let body_rv = meta::resource_version(&body);
        if !body_rv.is_empty() && body_rv != meta::resource_version(&old) {
            return Err(ApiError::conflict(
                &t.rtype.group,
                &t.rtype.plural,
                &name,
                ApiError::STALE,
            ));
        }
        let body_uid = meta::uid(&body);
        if !body_uid.is_empty() && body_uid != meta::uid(&old) {
            return Err(uid_precondition_failed(&t.rtype, &name, body_uid, &old));
        }
        let new = prepare_update(t, &old, to_stored(&t.rtype, body));
        let mut result = commit_update(inner, t, &old, new, opts)?;
        result.warnings = warnings;
        Ok(result)
    })
}

/// Builds the object an update would store: the main endpoint keeps status and
/// server-managed metadata; `/status` changes nothing but status.
fn prepare_update(t: &Target, old: &Value, mut body: Value) -> Value {
    if t.is_status() {
        let mut new = (*old).clone();
        copy_status(&body, &mut new);
        return new;
    }
    clean_metadata(&mut body);
    for field in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "resourceVersion",
    ] {
        meta::copy_field(old, &mut body, field);
    }
    if t.rtype.has_status(t.rtype.storage_version()) {
        copy_status(old, &mut body);
    }
    match t.rtype.special {
        Special::Secret => fold_string_data(&mut body),
        Special::Namespace => {
            // spec.finalizers is only changed through /finalize.
            if let Some(spec) = old.get("spec") {
                body["spec"] = spec.clone();
            }
        }
        _ => {}
    }
    body
}

/// Validates and stores an updated object: generation, finalizer and no-op rules.
fn commit_update(
    inner: &mut Inner,
    t: &Target,
    old: &Value,
    mut new: Value,
    opts: &WriteOptions,
) -> Result<WriteResult, ApiError> {
    let rtype = t.rtype.clone();
    let name = meta::name(old).to_string();
    if meta::is_deleting(old) {
        let before = meta::finalizers(old);
        let added: Vec<String> = meta::finalizers(&new)
            .into_iter()
            .filter(|f| !before.contains(f))
            .collect();
        if !added.is_empty() {
            let detail = format!("no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}", added.iter().map(|a| format!("{a:?}")).collect::<Vec<_>>().join(", "));
            return Err(ApiError::invalid(
                &rtype.group,
                &rtype.kind,
                &name,
                &[FieldError::forbidden("metadata.finalizers", &detail)],
            ));
        }
    }
    let meta_errors = validate_metadata(&new);
    if !meta_errors.is_empty() {
        return Err(ApiError::invalid(
            &rtype.group,
            &rtype.kind,
            &name,
            &meta_errors,
        ));
    }
    if rtype.from_crd {
        admit(&rtype, &mut new, Some(old))?;
    }
    if rtype.special == Special::Crd {
        registry::type_from_crd(&new)
            .map_err(|errs| ApiError::invalid(&rtype.group, &rtype.kind, &name, &errs))?;
    }
    let storage_version = rtype.storage_version().to_string();
    if rtype.tracks_generation && spec_changed(old, &new, rtype.has_status(&storage_version)) {
        meta::metadata_mut(&mut new)
            .insert("generation".into(), Value::from(meta::generation(old) + 1));
    }
    if new == *old {
        return Ok(WriteResult {
            object: to_served(&rtype, &t.version, old),
            code: 200,
            warnings: Vec::new(),
        });
    }
    if opts.dry_run {
        return Ok(WriteResult {
            object: to_served(&rtype, &t.version, &new),
            code: 200,
            warnings: Vec::new(),
        });
    }
    let key = t.key(&name);
    if meta::is_deleting(&new)
        && meta::finalizers(&new).is_empty()
        && !namespace_still_finalizing(&rtype, &new)
    {
        let gone = inner.remove(&key, new);
        after_removal(inner, &rtype, &gone);
        return Ok(WriteResult {
            object: to_served(&rtype, &t.version, &gone),
            code: 200,
            warnings: Vec::new(),
        });
    }
    let stored = inner.put(key, new, EventType::Modified);
    if rtype.special == Special::Crd {
        if let Ok(updated) = registry::type_from_crd(&stored) {
            inner.registry.register(updated);
        }
    }
    Ok(WriteResult {
        object: to_served(&rtype, &t.version, &stored),
        code: 200,
        warnings: Vec::new(),
    })
}

/// A Terminating namespace is removed by the namespace controller (our GC), not by its
/// metadata finalizers running out.
fn namespace_still_finalizing(rtype: &ResourceType, obj: &Value) -> bool {
    rtype.special == Special::Namespace
        && obj
            .pointer("/spec/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty())
}

/// Patches an object; an apply patch to a missing object creates it.
pub(crate) fn patch(
    store: &Store,
    t: &Target,
    kind: PatchKind,
    body: &[u8],
    opts: &WriteOptions,
) -> Result<WriteResult, ApiError> {
    let name = t.url_name()?.to_string();
    if kind == PatchKind::Strategic && t.rtype.from_crd {
        return Err(ApiError {
            code: 415,
            reason: "UnsupportedMediaType",
            message: "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml".into(),
            details: None,
        });
    }
    if kind == PatchKind::Apply && opts.field_manager.as_deref().unwrap_or_default().is_empty() {
        return Err(ApiError::invalid(
            "meta.k8s.io",
            "PatchOptions",
            "",
            &[FieldError::required(
                "fieldManager",
                "is required for apply patch",
            )],
        ));
    }
    let patch_value = patch::parse_body(kind, body)?;
    store.with(|inner| {
        let Some(old) = inner.get(&t.key(&name)) else {
            if kind == PatchKind::Apply && !t.is_status() {
                let body_name = meta::name(&patch_value);
                if !body_name.is_empty() && body_name != name {
                    return Err(ApiError::bad_request(format!("the name of the object ({body_name}) does not match the name on the URL ({name})")));
                }
                let mut body = patch_value.clone();
                meta::set_str(&mut body, "name", &name);
                return create_locked(inner, t, body, opts);
            }
            return Err(t.not_found(&name));
        };
        let current = to_served(&t.rtype, &t.version, &old);
        let patched = patch::apply(kind, &current, &patch_value)?;
        check_type_meta(&t.rtype, &t.version, &patched)?;
        let patched_rv = meta::resource_version(&patched);
        if !patched_rv.is_empty() && patched_rv != meta::resource_version(&old) {
            return Err(ApiError::conflict(&t.rtype.group, &t.rtype.plural, &name, ApiError::STALE));
        }
        let patched_uid = meta::uid(&patched);
        if !patched_uid.is_empty() && patched_uid != meta::uid(&old) {
            return Err(uid_precondition_failed(&t.rtype, &name, patched_uid, &old));
        }
        let warnings = field_validation(&t.rtype, &t.version, &patched, opts.field_validation)?;
        let new = prepare_update(t, &old, to_stored(&t.rtype, patched));
        let mut result = commit_update(inner, t, &old, new, opts)?;
        result.warnings = warnings;
        Ok(result)
    })
}

/// Deletes an object: with finalizers it only gets a `deletionTimestamp`.
pub(crate) fn delete(
    store: &Store,
    t: &Target,
    opts: &DeleteOptions,
) -> Result<WriteResult, ApiError> {
    let name = t.url_name()?.to_string();
    store.with(|inner| {
        let key = t.key(&name);
        let obj = delete_locked(inner, &t.rtype, &key, opts)?;
        Ok(WriteResult {
            object: to_served(&t.rtype, &t.version, &obj),
            code: 200,
            warnings: Vec::new(),
        })
    })
}

/// Deletes every object of the collection that matches the selectors.
pub(crate) fn delete_collection(
    store: &Store,
    t: &Target,
    selectors: &Selectors,
    opts: &DeleteOptions,
) -> Result<Vec<Value>, ApiError> {
    store.with(|inner| {
        let victims = t.matching(inner, selectors);
        let mut deleted = Vec::new();
        for v in victims {
            let key = t.key_in(meta::namespace(&v), meta::name(&v));
            let obj = delete_locked(inner, &t.rtype, &key, opts)?;
            deleted.push(to_served(&t.rtype, &t.version, &obj));
        }
        Ok(deleted)
    })
}

/// The delete itself, under the lock; also used by the garbage collector.
pub(crate) fn delete_locked(
    inner: &mut Inner,
    rtype: &Arc<ResourceType>,
    key: &ObjectKey,
    opts: &DeleteOptions,
) -> Result<Value, ApiError> {
    let old = inner
        .get(key)
        .ok_or_else(|| ApiError::not_found(&rtype.group, &rtype.plural, &key.name))?;
    if let Some(uid) = opts
        .precondition_uid
        .as_deref()
        .filter(|u| *u != meta::uid(&old))
    {
        return Err(uid_precondition_failed(rtype, &key.name, uid, &old));
    }
    if let Some(rv) = opts
        .precondition_rv
        .as_deref()
        .filter(|r| *r != meta::resource_version(&old))
    {
        return Err(ApiError::conflict(
            &rtype.group,
            &rtype.plural,
            &key.name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                meta::resource_version(&old)
            ),
        ));
    }
    if opts.dry_run {
        return Ok((*old).clone());
    }
    let policy = opts.propagation.unwrap_or(rtype.default_propagation);
    if policy == Propagation::Orphan {
        orphan_dependents(inner, meta::uid(&old));
    }
    let deleting = rtype.special == Special::Namespace || !meta::finalizers(&old).is_empty();
    if deleting {
        if meta::is_deleting(&old) {
            return Ok((*old).clone());
        }
        let mut marked = (*old).clone();
        {
            let m = meta::metadata_mut(&mut marked);
            m.insert("deletionTimestamp".into(), Value::String(meta::now()));
            m.insert("deletionGracePeriodSeconds".into(), Value::from(0));
        }
        if meta::generation(&old) > 0 {
            meta::metadata_mut(&mut marked)
                .insert("generation".into(), Value::from(meta::generation(&old) + 1));
        }
        if rtype.special == Special::Namespace {
            marked["status"] = json!({"phase": "Terminating"});
            inner.gc_wanted = true;
        }
        return Ok((*inner.put(key.clone(), marked, EventType::Modified)).clone());
    }
    if rtype.special == Special::Crd {
        remove_custom_resources(inner, &old);
    }
    let gone = inner.remove(key, (*old).clone());
    after_removal(inner, rtype, &gone);
    Ok((*gone).clone())
}

/// Housekeeping after an object is gone for good.
fn after_removal(inner: &mut Inner, rtype: &ResourceType, gone: &Value) {
    if rtype.special == Special::Crd {
        if let (Some(group), Some(plural)) = (
            gone.pointer("/spec/group").and_then(Value::as_str),
            gone.pointer("/spec/names/plural").and_then(Value::as_str),
        ) {
            inner.registry.unregister(group, plural);
        }
    }
}

/// Deletes every custom resource of a CRD that is being deleted.
fn remove_custom_resources(inner: &mut Inner, crd: &Value) {
    let group = crd
        .pointer("/spec/group")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let plural = crd
        .pointer("/spec/names/plural")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let keys: Vec<(ObjectKey, Arc<Value>)> = inner
        .all()
        .filter(|(k, _)| k.group == group && k.resource == plural)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (k, v) in keys {
        inner.remove(&k, (*v).clone());
    }
}

/// Removes owner references to `owner_uid` from every object (orphan propagation).
pub(crate) fn orphan_dependents(inner: &mut Inner, owner_uid: &str) {
    let dependents: Vec<(ObjectKey, Arc<Value>)> = inner
        .all()
        .filter(|(_, v)| meta::owner_uids(v).any(|u| u == owner_uid))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (k, v) in dependents {
        let mut updated = (*v).clone();
        drop_owner_refs(&mut updated, &[owner_uid.to_string()]);
        inner.put(k, updated, EventType::Modified);
    }
}

/// Removes the owner references whose uid is in `uids` (and the field when none is left).
pub(crate) fn drop_owner_refs(obj: &mut Value, uids: &[String]) {
    let m = meta::metadata_mut(obj);
    if let Some(Value::Array(refs)) = m.get_mut("ownerReferences") {
        refs.retain(|r| {
            !uids
                .iter()
                .any(|u| r.get("uid").and_then(Value::as_str) == Some(u))
        });
        if refs.is_empty() {
            m.remove("ownerReferences");
        }
    }
}
