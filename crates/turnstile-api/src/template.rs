//! `LockTemplate`: locks created on first use. A claim naming a missing lock whose name a
//! template of its namespace matches gets that lock, with the template's spec.

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::{CustomResource, KubeSchema, ResourceExt};
use serde::{Deserialize, Serialize};

use crate::lock::{DistributedLock, DistributedLockSpec};
use crate::vocabulary::{MAX_UNUSED_LOCK_SECONDS, TEMPLATE_LABEL, UNUSED_LOCK_SECONDS_ANNOTATION};

/// The most name patterns one template may list.
pub const MAX_TEMPLATE_NAMES: usize = 32;

/// Locks created on first use: when a claim names a `DistributedLock` that does not exist and
/// one of `names` matches it, the controller creates the lock with `lock` as its spec.
// clippy reads the repeated `type_` keys of separate `printcolumn(...)` groups as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq, KubeSchema)]
#[kube(
    group = "turnstile.dev",
    version = "v1alpha1",
    kind = "LockTemplate",
    plural = "locktemplates",
    singular = "locktemplate",
    shortname = "ltemplate",
    namespaced,
    derive = "PartialEq",
    doc = "Locks created on first use: a claim naming a missing lock that one of this template's names matches gets it, with the template's spec.",
    printcolumn(
        name = "Names",
        type_ = "string",
        json_path = ".spec.names",
        description = "The lock names (exact, or a prefix ending in *) this template creates"
    ),
    printcolumn(
        name = "Unused-After",
        type_ = "integer",
        json_path = ".spec.deleteAfterUnusedSeconds",
        description = "A lock made from this template is deleted once unused this many seconds"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct LockTemplateSpec {
    /// The lock names this template creates: an exact name (`db-migration`), or a prefix
    /// followed by `*` (`deploy-*` matches `deploy-main` and `deploy-feature-x`). Where several
    /// templates match, the longest pattern wins, then the template's name.
    #[schemars(length(min = 1, max = MAX_TEMPLATE_NAMES), inner(length(min = 1, max = 253)))]
    #[x_kube(
        validation = Rule::new("self.all(n, n.matches('^[^*]*[*]?$'))")
            .message("a name pattern may hold * only at its end"),
    )]
    pub names: Vec<String>,
    /// The spec of every lock made from this template (backend, lease, maxHolders, policies):
    /// whoever may create a claim picks a name, never these.
    pub lock: DistributedLockSpec,
    /// A lock made from this template is deleted once it has had no claim for this many
    /// seconds (counted from its creation or its last grant's end). Omitted: it stays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_UNUSED_LOCK_SECONDS))]
    pub delete_after_unused_seconds: Option<i64>,
}

impl LockTemplateSpec {
    /// How specifically this template names `lock`: the length of its longest pattern that
    /// matches (an exact name counts one more than a prefix of the same length), or `None`.
    pub fn specificity(&self, lock: &str) -> Option<usize> {
        self.names
            .iter()
            .filter_map(|pattern| match pattern.strip_suffix('*') {
                Some(prefix) => lock.starts_with(prefix).then_some(2 * prefix.len()),
                None => (pattern == lock).then_some(2 * pattern.len() + 1),
            })
            .max()
    }
}

/// Of `templates`, the one that makes `lock` (see [`LockTemplateSpec::names`]), if any.
pub fn template_for<'t>(
    templates: impl IntoIterator<Item = &'t LockTemplate>,
    lock: &str,
) -> Option<&'t LockTemplate> {
    templates
        .into_iter()
        .filter(|template| template.metadata.deletion_timestamp.is_none())
        .filter_map(|template| Some((template.spec.specificity(lock)?, template)))
        // The most specific; among equals, the first by name.
        .max_by(|(a, left), (b, right)| a.cmp(b).then(right.name_any().cmp(&left.name_any())))
        .map(|(_, template)| template)
}

impl LockTemplate {
    /// The lock `name` in `namespace` as this template makes it: its spec, a label naming the
    /// template, and the unused lifetime written on the lock itself (so it holds even after
    /// the template is gone).
    pub fn lock_named(&self, namespace: &str, name: &str) -> DistributedLock {
        let mut lock = DistributedLock::new(name, self.spec.lock.clone());
        lock.metadata.namespace = Some(namespace.to_owned());
        let template = self.name_any();
        lock.labels_mut()
            .insert(TEMPLATE_LABEL.to_owned(), template);
        if let Some(seconds) = self.spec.delete_after_unused_seconds {
            lock.annotations_mut().insert(
                UNUSED_LOCK_SECONDS_ANNOTATION.to_owned(),
                seconds.to_string(),
            );
        }
        lock
    }
}

/// When a lock made from a template, with no claims, may be deleted as unused: its unused
/// lifetime (the annotation) after its creation or its last grant's end, whichever is later.
/// `None` for a lock without that annotation (made by hand, or kept by its template).
pub fn unused_lock_deadline(lock: &DistributedLock) -> Option<Timestamp> {
    let seconds: i64 = lock
        .annotations()
        .get(UNUSED_LOCK_SECONDS_ANNOTATION)?
        .trim()
        .parse()
        .ok()
        .filter(|seconds| *seconds > 0)?;
    let created = lock.metadata.creation_timestamp.as_ref()?.0;
    let last_end = lock
        .status
        .as_ref()
        .and_then(|status| {
            status
                .history
                .iter()
                .filter_map(|g| g.released_at.as_ref())
                .max()
        })
        .map(|at| at.0);
    let since = last_end.map_or(created, |end| end.max(created));
    since
        .checked_add(SignedDuration::from_secs(
            seconds.min(MAX_UNUSED_LOCK_SECONDS),
        ))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(name: &str, names: &[&str]) -> LockTemplate {
        let mut template = LockTemplate::new(
            name,
            LockTemplateSpec {
                names: names.iter().map(|n| (*n).to_owned()).collect(),
                lock: serde_json::from_value(serde_json::json!({})).expect("default spec"),
                delete_after_unused_seconds: Some(60),
            },
        );
        template.metadata.namespace = Some("team-a".to_owned());
        template
    }

    #[test]
    fn exact_names_and_prefixes_match_and_the_most_specific_template_wins() {
        let templates = [
            template("any-deploy", &["deploy-*"]),
            template("main", &["deploy-main"]),
            template("feature", &["deploy-feature-*", "hotfix"]),
        ];
        let chosen = |lock: &str| template_for(&templates, lock).map(ResourceExt::name_any);
        assert_eq!(chosen("deploy-main").as_deref(), Some("main"));
        assert_eq!(chosen("deploy-feature-x").as_deref(), Some("feature"));
        assert_eq!(chosen("deploy-other").as_deref(), Some("any-deploy"));
        assert_eq!(chosen("hotfix").as_deref(), Some("feature"));
        assert_eq!(chosen("hotfix-2"), None, "an exact name is not a prefix");
        assert_eq!(
            chosen("migrate"),
            None,
            "never for a name no template matches"
        );
        // Equal patterns: the first template by name.
        let tie = [template("b", &["x-*"]), template("a", &["x-*"])];
        assert_eq!(
            template_for(&tie, "x-1")
                .map(ResourceExt::name_any)
                .as_deref(),
            Some("a")
        );
    }

    #[test]
    fn a_made_lock_carries_the_spec_the_template_and_its_unused_lifetime() {
        let made = template("per-branch", &["deploy-*"]).lock_named("team-a", "deploy-main");
        assert_eq!(made.metadata.namespace.as_deref(), Some("team-a"));
        assert_eq!(made.labels()[TEMPLATE_LABEL], "per-branch");
        assert_eq!(made.annotations()[UNUSED_LOCK_SECONDS_ANNOTATION], "60");
        let mut stored = made.clone();
        stored.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2030-01-01T00:00:00Z".parse().expect("time"),
            ));
        assert_eq!(
            unused_lock_deadline(&stored)
                .map(|t| t.to_string())
                .as_deref(),
            Some("2030-01-01T00:01:00Z")
        );
        stored
            .annotations_mut()
            .remove(UNUSED_LOCK_SECONDS_ANNOTATION);
        assert_eq!(unused_lock_deadline(&stored), None, "kept");
    }
}
