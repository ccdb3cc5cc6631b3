//! The REST semantics of kube-apiserver's generic registry: create, get, list, update,
//! patch and delete, with `resourceVersion` concurrency, status isolation, generation
//! rules, finalizers, no-op detection and admission (schema + CEL) for custom resources.
//!
//! This module holds what every verb shares (the addressed [`Target`], write options and
//! results, the served and stored forms); the verbs live in `read` (get, list), `write`
//! (create, update, patch) and `delete` (delete, delete collection, orphaning).

mod delete;
mod read;
mod write;

use std::sync::Arc;

use serde_json::Value;

use crate::admission::FieldValidation;
use crate::error::ApiError;
use crate::events;
use crate::meta;
use crate::registry::{ResourceType, Special};
use crate::selector::Selectors;
use crate::store::{Inner, ListScope, ObjectKey};

pub(crate) use self::delete::{
    delete, delete_collection, delete_locked, drop_owner_refs, DeleteOptions,
};
pub(crate) use self::read::{get, list, ListOptions};
pub(crate) use self::write::{create, patch, update};

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
        self.key_in(self.scope_namespace().unwrap_or_default(), name)
    }

    fn key_in(&self, namespace: &str, name: &str) -> ObjectKey {
        ObjectKey {
            group: self.rtype.storage_group.clone(),
            resource: self.rtype.plural.clone(),
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }

    /// This target's namespace for a namespaced kind (`None` there: all namespaces); `None`
    /// for a cluster-scoped kind, whatever the URL said.
    fn scope_namespace(&self) -> Option<&str> {
        if self.rtype.namespaced {
            self.namespace.as_deref()
        } else {
            None
        }
    }

    /// The stored objects in this target's scope (one namespace, or all) that match `selectors`.
    pub(crate) fn matching(&self, inner: &Inner, selectors: &Selectors) -> Vec<Arc<Value>> {
        self.matching_after(inner, selectors, None)
    }

    /// [`Self::matching`], only the objects whose `(namespace, name)` sorts after `after`.
    pub(crate) fn matching_after(
        &self,
        inner: &Inner,
        selectors: &Selectors,
        after: Option<(&str, &str)>,
    ) -> Vec<Arc<Value>> {
        inner
            .list(self.list_scope(after))
            .into_iter()
            .filter(|o| selectors.matches(o))
            .collect()
    }

    /// [`Self::matching_after`] as the store was at resourceVersion `rv`, or `Err(oldest)`
    /// when that is compacted away.
    pub(crate) fn matching_at(
        &self,
        inner: &Inner,
        selectors: &Selectors,
        after: Option<(&str, &str)>,
        rv: u64,
    ) -> Result<Vec<Arc<Value>>, u64> {
        Ok(inner
            .list_at(self.list_scope(after), rv)?
            .into_iter()
            .filter(|o| selectors.matches(o))
            .collect())
    }

    /// The stored objects this target lists, after the cursor `after` when given.
    fn list_scope<'a>(&'a self, after: Option<(&'a str, &'a str)>) -> ListScope<'a> {
        ListScope {
            group: &self.rtype.storage_group,
            resource: &self.rtype.plural,
            namespace: self.scope_namespace(),
            after,
        }
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
