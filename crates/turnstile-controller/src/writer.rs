//! The one way the controller writes to the API server: leadership gate → conditional merge
//! patch → error with context.
//!
//! A write is first decided as data ([`Write`]: which object, which part, the merge patch) and
//! then made by an [`ApiWriter`], conditional on the resourceVersion the decision was made from.
//! Deciding apart from writing lets the tests' simulation apply exactly the patches the shell
//! sends (see [`crate::pass_writes`]).

use std::fmt::Debug;

use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::context::LeadershipGate;
use crate::error::ControllerError;
use crate::patch::merge_diff;

/// The part of an object a [`Write`] changes, which picks the endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The status subresource.
    Status,
    /// `metadata.finalizers` (the whole list: a merge patch replaces arrays).
    Finalizers,
    /// Anything else of the main resource (metadata and spec).
    Object,
}

impl Part {
    fn doing(self) -> &'static str {
        match self {
            Part::Status => "writing status of",
            Part::Finalizers => "setting finalizers of",
            Part::Object => "patching",
        }
    }
}

/// One decided write: a JSON merge patch (RFC 7386) of one part of the object `name`, without
/// the resourceVersion precondition (the [`ApiWriter`] adds it when the write is made).
#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    /// The object's name (in the namespace of the `Api` it is written through).
    pub name: String,
    /// Which part the patch changes.
    pub part: Part,
    /// The merge patch.
    pub patch: Value,
}

impl Write {
    /// The status write turning `old` into `new`; `None` when they are equal (an unchanged
    /// status is never written).
    pub fn status<S: Serialize>(
        name: &str,
        old: Option<&S>,
        new: &S,
    ) -> Result<Option<Self>, ControllerError> {
        let new = to_json(new)?;
        let diff = match old {
            Some(old) => merge_diff(&to_json(old)?, &new),
            None => Some(new),
        };
        Ok(diff.map(|status| Self {
            name: name.to_owned(),
            part: Part::Status,
            patch: serde_json::json!({ "status": status }),
        }))
    }

    /// The write setting `metadata.finalizers` to `finalizers`.
    pub fn finalizers(name: &str, finalizers: &[String]) -> Self {
        Self {
            name: name.to_owned(),
            part: Part::Finalizers,
            patch: serde_json::json!({ "metadata": { "finalizers": finalizers } }),
        }
    }

    /// Any other merge patch of the object.
    pub fn object(name: &str, patch: Value) -> Self {
        Self {
            name: name.to_owned(),
            part: Part::Object,
            patch,
        }
    }

    /// The patch as sent: with `metadata.resourceVersion`, when given, so the server refuses
    /// it (409) if the object changed since the write was decided.
    pub fn conditional_patch(&self, resource_version: Option<&str>) -> Value {
        let mut patch = self.patch.clone();
        if let (Some(version), Value::Object(members)) = (resource_version, &mut patch) {
            let metadata = members
                .entry("metadata")
                .or_insert_with(|| Value::Object(serde_json::Map::new()));
            if let Value::Object(metadata) = metadata {
                metadata.insert(
                    "resourceVersion".to_owned(),
                    Value::String(version.to_owned()),
                );
            }
        }
        patch
    }
}

fn to_json<S: Serialize>(value: &S) -> Result<Value, ControllerError> {
    serde_json::to_value(value).map_err(|source| ControllerError::Serialize {
        what: "status",
        source,
    })
}

/// What [`ApiWriter::create`] found.
#[derive(Debug)]
pub enum Created<K> {
    /// The object was created.
    New(K),
    /// An object of that name exists already (the cache lagged behind).
    AlreadyExists,
}

/// Makes [`Write`]s and creates objects, each only while this replica leads, and names the
/// object and the action in every error.
#[derive(Debug, Clone)]
pub struct ApiWriter {
    leadership: LeadershipGate,
}

impl ApiWriter {
    /// A writer that writes while `leadership` is open.
    pub fn new(leadership: LeadershipGate) -> Self {
        Self { leadership }
    }

    /// Whether writes are allowed right now (for work that is not a write, e.g. Events).
    pub fn may_write(&self) -> bool {
        self.leadership.is_open()
    }

    /// Makes `write` through `api`, conditional on `resource_version`; returns the object as
    /// the server stored it.
    pub async fn apply<K>(
        &self,
        api: &Api<K>,
        write: &Write,
        resource_version: Option<&str>,
    ) -> Result<K, ControllerError>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    {
        let action = format!("{} {} {}", write.part.doing(), K::kind(&()), write.name);
        self.leadership.check(&action)?;
        let patch = write.conditional_patch(resource_version);
        let params = PatchParams::default();
        let written = match write.part {
            Part::Status => {
                api.patch_status(&write.name, &params, &Patch::Merge(&patch))
                    .await
            }
            Part::Finalizers | Part::Object => {
                api.patch(&write.name, &params, &Patch::Merge(&patch)).await
            }
        };
        written.map_err(|source| ControllerError::kube(action, source))
    }

    /// Creates `object` through `api`; an existing object of that name is reported, not an
    /// error.
    pub async fn create<K>(&self, api: &Api<K>, object: &K) -> Result<Created<K>, ControllerError>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug,
    {
        let action = format!("creating {} {}", K::kind(&()), object.name_any());
        self.leadership.check(&action)?;
        match api.create(&PostParams::default(), object).await {
            Ok(created) => Ok(Created::New(created)),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Created::AlreadyExists),
            Err(source) => Err(ControllerError::kube(action, source)),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn status_writes_only_what_changed() {
        let write = Write::status("a", Some(&json!({"x": 1, "y": 2})), &json!({"x": 1, "y": 3}))
            .expect("serialize")
            .expect("changed");
        assert_eq!(write.part, Part::Status);
        assert_eq!(write.patch, json!({"status": {"y": 3}}));
        assert!(Write::status("a", Some(&json!({"x": 1})), &json!({"x": 1}))
            .expect("serialize")
            .is_none());
    }

    #[test]
    fn the_patch_as_sent_carries_the_resource_version() {
        let write = Write::finalizers("a", &["f".to_owned()]);
        assert_eq!(
            write.conditional_patch(Some("42")),
            json!({"metadata": {"finalizers": ["f"], "resourceVersion": "42"}})
        );
        let status = Write::status("a", None, &json!({"x": 1}))
            .expect("serialize")
            .expect("new");
        assert_eq!(
            status.conditional_patch(Some("7")),
            json!({"status": {"x": 1}, "metadata": {"resourceVersion": "7"}})
        );
        assert_eq!(status.conditional_patch(None), status.patch);
    }
}
