//! The garbage collector (background propagation of `ownerReferences`) and the
//! namespace controller (emptying a Terminating namespace, then removing it).

use std::sync::Arc;

use serde_json::Value;

use crate::meta;
use crate::rest::{self, DeleteOptions};
use crate::store::{EventType, Inner, ObjectKey, Store};

/// What one sweep decided to do to one object.
enum Action {
    Delete(ObjectKey),
    DropDanglingRefs(ObjectKey, Vec<String>),
    RemoveNamespace(ObjectKey),
}

/// Runs until the task is aborted, sweeping whenever a write asks for it.
pub(crate) async fn run(store: Arc<Store>) {
    loop {
        store.gc_notify.notified().await;
        store.with(sweep);
    }
}

/// Sweeps until nothing more changes (so cascades complete in one wake-up).
pub(crate) fn sweep(inner: &mut Inner) {
    for _ in 0..64 {
        let actions = plan(inner);
        if actions.is_empty() {
            return;
        }
        for action in actions {
            apply(inner, action);
        }
    }
}

fn plan(inner: &mut Inner) -> Vec<Action> {
    let mut actions = Vec::new();
    for key in inner.take_gc_candidates() {
        let Some(obj) = inner.get(&key) else {
            continue;
        };
        let owners: Vec<&str> = meta::owner_uids(&obj).collect();
        if owners.is_empty() {
            continue;
        }
        let dangling: Vec<String> = owners
            .iter()
            .filter(|u| !inner.is_live(u))
            .map(|u| u.to_string())
            .collect();
        if dangling.len() == owners.len() {
            if !meta::is_deleting(&obj) {
                actions.push(Action::Delete(key));
            }
        } else if !dangling.is_empty() {
            actions.push(Action::DropDanglingRefs(key, dangling));
        }
    }
    let terminating: Vec<ObjectKey> = inner
        .of_type("", "namespaces")
        .filter(|(_, v)| meta::is_deleting(v))
        .map(|(k, _)| k.clone())
        .collect();
    for ns_key in terminating {
        // Rare (a namespace being deleted): a scan of everything is fine here.
        let contents: Vec<(&ObjectKey, &Arc<Value>)> = inner
            .all()
            .filter(|(k, _)| k.namespace == ns_key.name)
            .collect();
        if contents.is_empty() {
            actions.push(Action::RemoveNamespace(ns_key));
            continue;
        }
        for (k, v) in contents {
            if !meta::is_deleting(v) {
                actions.push(Action::Delete(k.clone()));
            }
        }
    }
    actions
}

fn apply(inner: &mut Inner, action: Action) {
    match action {
        Action::Delete(key) => {
            let Some(rtype) = inner.registry.storage_type(&key.group, &key.resource) else {
                return;
            };
            if let Err(err) = rest::delete_locked(inner, &rtype, &key, &DeleteOptions::default()) {
                tracing::debug!(name = %key.name, error = %err, "garbage collection skipped an object");
            }
        }
        Action::DropDanglingRefs(key, uids) => {
            if let Some(obj) = inner.get(&key) {
                let mut updated = (*obj).clone();
                rest::drop_owner_refs(&mut updated, &uids);
                inner.put(key, updated, EventType::Modified);
            }
        }
        Action::RemoveNamespace(key) => {
            if let Some(obj) = inner.get(&key) {
                let mut last = (*obj).clone();
                last["spec"] = serde_json::json!({"finalizers": []});
                inner.remove(&key, last);
            }
        }
    }
}
