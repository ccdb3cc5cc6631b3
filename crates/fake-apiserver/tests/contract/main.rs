//! Contract tests: each behaviour kube-apiserver has and the operator relies on, checked
//! against the fake here, and against a real kube-apiserver by `contract_on_real_plane.rs`,
//! which includes these same modules. Tests of the fake's hooks (compaction, faults, closing
//! watches, the request log) run on the fake in both.

/// This binary checks the fake (`contract_on_real_plane.rs`, which includes this file as a
/// module, says true at its own root).
#[allow(dead_code)]
pub(crate) const ON_REAL_PLANE: bool = false;

#[path = "../support/mod.rs"]
mod support;

/// The test's [`Env`](support::Env) on the fake (the test uses its hooks) with the Widget
/// CRD, and its Widgets API.
macro_rules! fake_widgets {
    ($test:literal) => {{
        let env = Env::fake_only_with_widgets($test).await;
        let api = env.widgets();
        (env, api)
    }};
}

mod deletion;
mod faults;
mod reads;
mod schema;
mod server;
mod watch;
mod writes;

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, Namespace, Pod, Secret};
use k8s_openapi::api::events::v1::Event as EventV1;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};
use support::{
    api_code, assert_contains_all, expect_error, expect_invalid, names_in, type_and_name, widget,
    Env, WIDGET_GROUP,
};

const T: Duration = Duration::from_secs(10);

/// The Widgets of a test's namespace ([`Env::widgets`]).
type Widgets = Api<DynamicObject>;

fn rv(o: &DynamicObject) -> String {
    o.metadata.resource_version.clone().unwrap_or_default()
}

/// Posts a Widget.
async fn try_create(api: &Widgets, name: &str, spec: Value) -> kube::Result<DynamicObject> {
    api.create(&PostParams::default(), &widget(name, spec))
        .await
}

/// Creates a Widget (panics on failure).
async fn create(api: &Widgets, name: &str, spec: Value) -> DynamicObject {
    try_create(api, name, spec).await.unwrap()
}

/// A JSON merge patch of the main resource.
async fn merge(api: &Widgets, name: &str, patch: Value) -> kube::Result<DynamicObject> {
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
}

/// A JSON merge patch of `/status`.
async fn merge_status(api: &Widgets, name: &str, patch: Value) -> kube::Result<DynamicObject> {
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
}

fn names(list: kube::api::ObjectList<DynamicObject>) -> Vec<String> {
    list.items
        .into_iter()
        .map(|o| o.metadata.name.unwrap_or_default())
        .collect()
}

fn widget_path(env: &Env, name: &str) -> String {
    format!(
        "/apis/{WIDGET_GROUP}/v1/namespaces/{}/widgets/{name}",
        env.namespace
    )
}

fn widgets_path(env: &Env) -> String {
    format!(
        "/apis/{WIDGET_GROUP}/v1/namespaces/{}/widgets",
        env.namespace
    )
}

/// Opens a watch on the test's widgets, with `params` (`&name=value...`) after `watch=true`.
async fn watch_widgets(env: &Env, params: &str) -> support::WatchLines {
    env.open_watch(&format!("{}?watch=true{params}", widgets_path(env)))
        .await
}

/// Opens a watch on the test's widgets from resource version `rv`.
async fn watch_widgets_from(env: &Env, rv: impl std::fmt::Display) -> support::WatchLines {
    watch_widgets(env, &format!("&resourceVersion={rv}")).await
}
