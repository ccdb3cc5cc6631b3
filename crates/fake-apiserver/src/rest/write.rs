//! The writes: create (POST), update (PUT, also of `/status`) and patch (merge, JSON,
//! strategic and apply), with their generation, finalizer and no-op rules.

use serde_json::{json, Value};

use super::delete::after_removal;
use super::{to_served, to_stored, uid_precondition_failed, Target, WriteOptions, WriteResult};
use crate::admission::{
    admit, check_type_meta, clean_metadata, field_validation, fold_string_data, validate_metadata,
    validate_name,
};
use crate::error::{ApiError, FieldError};
use crate::meta;
use crate::patch::{self, PatchKind};
use crate::registry::{self, ResourceType, Special};
use crate::store::{EventType, Inner, ObjectKey, Store};

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
    ApiError::invalid_if_any(&rtype.group, &rtype.kind, &name, &meta_errors)?;
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
    ApiError::invalid_if_any(&rtype.group, &rtype.kind, &name, &meta_errors)?;
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
