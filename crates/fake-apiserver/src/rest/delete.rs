//! The deletes: one object or a collection, with preconditions, finalizers, propagation
//! (orphaning dependents) and the clean-up after an object is gone.

use std::sync::Arc;

use serde_json::{json, Value};

use super::{to_served, uid_precondition_failed, Target, WriteResult};
use crate::error::ApiError;
use crate::meta;
use crate::registry::{Propagation, ResourceType, Special};
use crate::selector::Selectors;
use crate::store::{EventType, Inner, ObjectKey, Store};

/// Options of a delete.
#[derive(Debug, Clone, Default)]
pub(crate) struct DeleteOptions {
    pub dry_run: bool,
    pub propagation: Option<Propagation>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
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
pub(super) fn after_removal(inner: &mut Inner, rtype: &ResourceType, gone: &Value) {
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
