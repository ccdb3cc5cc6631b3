//! Contract tests: each behaviour kube-apiserver has and the operator relies on, checked
//! against the fake (default) or a real cluster (`TURNSTILE_E2E_KUBECONFIG`). Tests of the
//! fake's hooks (compaction, faults, closing watches, the request log) are fake-only.

mod support;

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, Namespace, Pod, Secret};
use k8s_openapi::api::events::v1::Event as EventV1;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};
use support::{api_code, type_and_name, widget, Env, WIDGET_GROUP};

const T: Duration = Duration::from_secs(10);

fn rv(o: &DynamicObject) -> String {
    o.metadata.resource_version.clone().unwrap_or_default()
}

/// Creates a Widget (panics on failure).
async fn create(api: &Api<DynamicObject>, name: &str, spec: Value) -> DynamicObject {
    api.create(&PostParams::default(), &widget(name, spec))
        .await
        .unwrap()
}

/// A JSON merge patch of the main resource.
async fn merge(
    api: &Api<DynamicObject>,
    name: &str,
    patch: Value,
) -> Result<DynamicObject, kube::Error> {
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
}

/// A JSON merge patch of `/status`.
async fn merge_status(
    api: &Api<DynamicObject>,
    name: &str,
    patch: Value,
) -> Result<DynamicObject, kube::Error> {
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

#[tokio::test]
async fn starts_on_its_own_loopback_port_with_a_kubeconfig() {
    let (Some(a), Some(b)) = (
        Env::fake_only("starts_on_its_own_loopback_port").await,
        Env::fake_only("second server").await,
    ) else {
        return;
    };
    assert!(a.server().url().starts_with("http://127.0.0.1:"));
    assert_ne!(
        a.server().addr().port(),
        b.server().addr().port(),
        "parallel servers share nothing"
    );
    // Objects of one server are not in the other.
    assert!(Api::<Namespace>::all(b.client.clone())
        .get_opt(&a.namespace)
        .await
        .unwrap()
        .is_none());
    // The written kubeconfig works for a kube client.
    let kubeconfig = kube::config::Kubeconfig::read_from(&a.kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.major, "1");
}

#[tokio::test]
async fn discovery_serves_groups_versions_and_resources() {
    let env = Env::new().await;
    let (code, _, body) = env.raw("GET", "/version", &[], None).await;
    assert_eq!(code, 200);
    let version: Value = serde_json::from_str(&body).unwrap();
    let minor: u32 = version["minor"]
        .as_str()
        .unwrap()
        .trim_end_matches('+')
        .parse()
        .unwrap();
    assert!(version["major"] == "1" && minor >= 32, "{version}");

    let (_, _, body) = env.raw("GET", "/api", &[], None).await;
    assert!(serde_json::from_str::<Value>(&body).unwrap()["versions"]
        .as_array()
        .unwrap()
        .contains(&json!("v1")));
    env.install_widget_crd().await;
    let (_, _, body) = env.raw("GET", "/apis", &[], None).await;
    let groups: Value = serde_json::from_str(&body).unwrap();
    let names: Vec<&str> = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap())
        .collect();
    for g in [
        WIDGET_GROUP,
        "batch",
        "coordination.k8s.io",
        "events.k8s.io",
        "apiextensions.k8s.io",
    ] {
        assert!(names.contains(&g), "{g} missing from {names:?}");
    }
    let (code, _, body) = env
        .raw("GET", &format!("/apis/{WIDGET_GROUP}"), &[], None)
        .await;
    assert_eq!(code, 200, "{body}");
    let (_, _, body) = env
        .raw("GET", &format!("/apis/{WIDGET_GROUP}/v1"), &[], None)
        .await;
    let list: Value = serde_json::from_str(&body).unwrap();
    let resources = list["resources"].as_array().unwrap();
    let widgets = resources.iter().find(|r| r["name"] == "widgets").unwrap();
    assert_eq!(widgets["shortNames"], json!(["wg"]));
    assert_eq!(widgets["categories"], json!(["gadgets"]));
    assert_eq!(widgets["namespaced"], json!(true));
    for verb in [
        "get", "list", "watch", "create", "update", "patch", "delete",
    ] {
        assert!(
            widgets["verbs"].as_array().unwrap().contains(&json!(verb)),
            "{verb}"
        );
    }
    let status = resources
        .iter()
        .find(|r| r["name"] == "widgets/status")
        .unwrap();
    assert_eq!(status["kind"], "Widget");
    let (_, _, body) = env.raw("GET", "/api/v1", &[], None).await;
    let core: Value = serde_json::from_str(&body).unwrap();
    let ns = core["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "namespaces")
        .unwrap();
    assert_eq!(ns["shortNames"], json!(["ns"]));

    // Aggregated discovery, which kubectl 1.32 and kube-rs' run_aggregated ask for first.
    let discovery = kube::Discovery::new(env.client.clone())
        .run_aggregated()
        .await
        .unwrap();
    let (ar, caps) = discovery
        .resolve_gvk(&kube::api::GroupVersionKind::gvk(
            WIDGET_GROUP,
            "v1",
            "Widget",
        ))
        .unwrap();
    assert_eq!(ar.plural, "widgets");
    assert!(caps
        .subresources
        .iter()
        .any(|(s, _)| s.plural == "widgets/status" || s.plural == "status"));
}

#[tokio::test]
async fn openapi_v3_lets_kubectl_validate_server_side() {
    let env = Env::with_widgets().await;
    let (code, _, body) = env.raw("GET", "/openapi/v3", &[], None).await;
    assert_eq!(code, 200);
    let root: Value = serde_json::from_str(&body).unwrap();
    let url = root["paths"][format!("apis/{WIDGET_GROUP}/v1")]["serverRelativeURL"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(root["paths"]["api/v1"]["serverRelativeURL"].is_string());
    let (code, _, body) = env.raw("GET", &url, &[], None).await;
    assert_eq!(code, 200);
    let doc: Value = serde_json::from_str(&body).unwrap();
    let patch_ops: Vec<&Value> = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .filter_map(|p| p.get("patch"))
        .collect();
    let widget_patch = patch_ops
        .iter()
        .find(|op| op["x-kubernetes-group-version-kind"]["kind"] == "Widget")
        .expect("a PATCH operation for Widget");
    assert!(widget_patch["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["name"] == "fieldValidation" && p["in"] == "query"));
}

#[tokio::test]
async fn resource_types_are_registered_only_by_posting_a_crd() {
    let env = Env::new().await;
    if env.is_fake() {
        let (code, _, _) = env
            .raw("GET", &format!("/apis/{WIDGET_GROUP}/v1"), &[], None)
            .await;
        assert_eq!(code, 404, "no type before its CRD");
        let (code, _, _) = env.raw("GET", &widgets_path(&env), &[], None).await;
        assert_eq!(code, 404);
    }
    env.install_widget_crd().await;
    let crds: Api<DynamicObject> = Api::all_with(env.client.clone(), &support::crd_resource());
    let crd = crds.get(support::WIDGET_CRD_NAME).await.unwrap();
    let conditions = crd.data["status"]["conditions"].as_array().unwrap();
    for t in ["NamesAccepted", "Established"] {
        assert!(
            conditions
                .iter()
                .any(|c| c["type"] == t && c["status"] == "True"),
            "{t}"
        );
    }
    assert!(env
        .widgets()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .is_empty());
    // A malformed CRD is rejected like kube-apiserver does.
    let mut bad = support::widget_crd();
    bad["metadata"]["name"] = json!("wrong.contract.turnstile.dev");
    let (code, reason, _) = api_code(
        crds.create(
            &PostParams::default(),
            &serde_json::from_value(bad).unwrap(),
        )
        .await,
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    // So is a non-structural schema (a property without a type).
    let mut loose = support::widget_crd();
    loose["metadata"]["name"] = json!("loosewidgets.contract.turnstile.dev");
    loose["spec"]["names"] = json!({"plural": "loosewidgets", "kind": "LooseWidget"});
    loose["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["untyped"] = json!({"description": "no type"});
    let (code, _, message) = api_code(
        crds.create(
            &PostParams::default(),
            &serde_json::from_value(loose).unwrap(),
        )
        .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.contains("properties[spec].properties[untyped].type: Required value"),
        "{message}"
    );
}

#[tokio::test]
async fn create_sets_server_fields_and_rejects_duplicates() {
    let env = Env::with_widgets().await;
    let api = env.widgets();
    let mut w = widget("w1", json!({"size": 2}));
    w.data["status"] = json!({"phase": "Forged"});
    let (code, _, body) = env
        .raw(
            "POST",
            &widgets_path(&env),
            &[("content-type", "application/json")],
            Some(serde_json::to_value(&w).unwrap()),
        )
        .await;
    assert_eq!(code, 201, "{body}");
    let created: Value = serde_json::from_str(&body).unwrap();
    let m = &created["metadata"];
    assert_eq!(
        m["namespace"],
        json!(env.namespace),
        "namespace comes from the URL"
    );
    assert_eq!(m["generation"], 1);
    assert!(m["uid"].as_str().is_some_and(|u| !u.is_empty()));
    assert!(m["creationTimestamp"]
        .as_str()
        .is_some_and(|t| chrono::DateTime::parse_from_rfc3339(t).is_ok()));
    assert!(m["resourceVersion"].as_str().is_some_and(|r| !r.is_empty()));
    assert!(
        created.get("status").is_none(),
        "status is dropped on create with the status subresource"
    );

    let generated = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"apiVersion": format!("{WIDGET_GROUP}/v1"), "kind": "Widget",
            "metadata": {"generateName": "gen-"}, "spec": {"size": 1}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    let name = generated.metadata.name.unwrap();
    assert!(
        name.starts_with("gen-") && name.len() == "gen-".len() + 5,
        "{name}"
    );

    let (code, reason, message) = api_code(
        api.create(&PostParams::default(), &widget("w1", json!({"size": 2})))
            .await,
    );
    assert_eq!((code, reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(
        message,
        format!("widgets.{WIDGET_GROUP} \"w1\" already exists")
    );
    let (code, _, _) = api_code(api.get("missing").await);
    assert_eq!(code, 404);
}

#[tokio::test]
async fn update_with_a_stale_resource_version_conflicts() {
    let env = Env::with_widgets().await;
    let api = env.widgets();
    let first = create(&api, "w", json!({"size": 1})).await;
    let mut a = first.clone();
    a.data["spec"]["size"] = json!(2);
    let updated = api.replace("w", &PostParams::default(), &a).await.unwrap();
    assert_ne!(rv(&updated), rv(&first));
    let mut stale = first.clone();
    stale.data["spec"]["size"] = json!(3);
    let (code, reason, message) = api_code(api.replace("w", &PostParams::default(), &stale).await);
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    assert!(message.contains("the object has been modified; please apply your changes to the latest version and try again"), "{message}");
    // A patch carrying a stale resourceVersion conflicts too.
    let patch = json!({"metadata": {"resourceVersion": rv(&first)}, "spec": {"size": 4}});
    let (code, _, _) = api_code(merge(&api, "w", patch).await);
    assert_eq!(code, 409);
}

#[tokio::test]
async fn status_subresource_is_isolated_from_the_main_resource() {
    let env = Env::with_widgets().await;
    let api = env.widgets();
    create(&api, "w", json!({"size": 1})).await;
    let patched = merge_status(
        &api,
        "w",
        json!({"status": {"phase": "Ready"}, "spec": {"size": 9}}),
    )
    .await
    .unwrap();
    assert_eq!(patched.data["status"]["phase"], "Ready");
    assert_eq!(
        patched.data["spec"]["size"], 1,
        "/status changes only .status"
    );
    let main = merge(
        &api,
        "w",
        json!({"status": {"phase": "Hacked"}, "spec": {"size": 2}}),
    )
    .await
    .unwrap();
    assert_eq!(main.data["spec"]["size"], 2);
    assert_eq!(
        main.data["status"]["phase"], "Ready",
        "the main endpoint never changes .status"
    );
    let mut replaced = main.clone();
    replaced.data["status"] = json!({"phase": "Replaced"});
    replaced.data["spec"]["size"] = json!(5);
    let status_replaced = api
        .replace_status("w", &PostParams::default(), &replaced)
        .await
        .unwrap();
    assert_eq!(status_replaced.data["status"]["phase"], "Replaced");
    assert_eq!(status_replaced.data["spec"]["size"], 2);
}

#[tokio::test]
async fn generation_bumps_only_on_spec_changes_and_metadata_is_immutable() {
    let env = Env::with_widgets().await;
    let api = env.widgets();
    let created = create(&api, "w", json!({"size": 1})).await;
    let pp = PatchParams::default();
    let labelled = api
        .patch(
            "w",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        labelled.metadata.generation,
        Some(1),
        "metadata changes keep generation"
    );
    let status = api
        .patch_status("w", &pp, &Patch::Merge(json!({"status": {"phase": "X"}})))
        .await
        .unwrap();
    assert_eq!(
        status.metadata.generation,
        Some(1),
        "status changes keep generation"
    );
    let spec = api
        .patch("w", &pp, &Patch::Merge(json!({"spec": {"size": 3}})))
        .await
        .unwrap();
    assert_eq!(spec.metadata.generation, Some(2));
    let forged = api
        .patch("w", &pp, &Patch::Merge(json!({"metadata": {"uid": null, "creationTimestamp": "2000-01-01T00:00:00Z", "generation": 40}})))
        .await
        .unwrap();
    assert_eq!(forged.metadata.uid, created.metadata.uid);
    assert_eq!(
        forged.metadata.creation_timestamp,
        created.metadata.creation_timestamp
    );
    assert_eq!(forged.metadata.generation, Some(2));
}

#[tokio::test]
async fn a_write_that_changes_nothing_keeps_the_resource_version_and_emits_no_event() {
    let env = Env::with_widgets().await;
    let api = env.widgets();
    let created = create(&api, "w", json!({"size": 1})).await;
    let mut watch = env
        .open_watch(&format!(
            "{}?watch=true&resourceVersion={}",
            widgets_path(&env),
            rv(&created)
        ))
        .await;
    let same = merge(&api, "w", json!({"spec": {"size": 1}}))
        .await
        .unwrap();
    assert_eq!(rv(&same), rv(&created));
    let replaced = api
        .replace("w", &PostParams::default(), &created)
        .await
        .unwrap();
    assert_eq!(rv(&replaced), rv(&created));
    let status_same = merge_status(&api, "w", json!({"status": null}))
        .await
        .unwrap();
    assert_eq!(rv(&status_same), rv(&created));
    let changed = merge(&api, "w", json!({"spec": {"size": 2}}))
        .await
        .unwrap();
    let first = watch.next_change(T).await.expect("an event");
    assert_eq!(first["type"], "MODIFIED");
    assert_eq!(
        first["object"]["metadata"]["resourceVersion"],
        json!(rv(&changed)),
        "no event for the no-op writes"
    );
}

#[tokio::test]
async fn patch_types_merge_json_and_apply() {
    let env = Env::with_widgets().await;
    let api = env.widgets();
    // Apply to a missing object creates it.
    let applied = api
        .patch(
            "w",
            &PatchParams::apply("contract-test"),
            &Patch::Apply(
                json!({"apiVersion": format!("{WIDGET_GROUP}/v1"), "kind": "Widget",
            "metadata": {"name": "w"}, "spec": {"size": 1, "note": "n"}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(applied.data["spec"]["note"], "n");
    // Merge patch: explicit null clears a field.
    let merged = merge(&api, "w", json!({"spec": {"note": null, "size": 2}}))
        .await
        .unwrap();
    assert!(merged.data["spec"].get("note").is_none());
    assert_eq!(merged.data["spec"]["size"], 2);
    // Status written with a merge patch and cleared with nulls.
    merge_status(
        &api,
        "w",
        json!({"status": {"phase": "A", "observedGeneration": 2}}),
    )
    .await
    .unwrap();
    let cleared = merge_status(&api, "w", json!({"status": {"phase": null}}))
        .await
        .unwrap();
    assert_eq!(cleared.data["status"], json!({"observedGeneration": 2}));
    // JSON patch, including a failing test operation.
    let (code, _, body) = env
        .raw(
            "PATCH",
            &widget_path(&env, "w"),
            &[("content-type", "application/json-patch+json")],
            Some(json!([{"op": "replace", "path": "/spec/size", "value": 3}])),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["spec"]["size"],
        3
    );
    let (code, _, _) = env
        .raw(
            "PATCH",
            &widget_path(&env, "w"),
            &[("content-type", "application/json-patch+json")],
            Some(json!([{"op": "test", "path": "/spec/size", "value": 99}])),
        )
        .await;
    assert_eq!(code, 422);
    // Strategic merge patch is not supported for custom resources.
    let (code, _, _) = api_code(
        api.patch(
            "w",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"size": 4}})),
        )
        .await,
    );
    assert_eq!(code, 415);
    // Apply on an existing object merges.
    let reapplied = api
        .patch(
            "w",
            &PatchParams::apply("contract-test"),
            &Patch::Apply(
                json!({"apiVersion": format!("{WIDGET_GROUP}/v1"), "kind": "Widget",
            "metadata": {"name": "w"}, "spec": {"size": 5}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(reapplied.data["spec"]["size"], 5);
}

#[tokio::test]
async fn delete_with_finalizers_waits_for_the_last_one() {
    let env = Env::with_widgets().await;
    let api = env.widgets();
    let mut w = widget("w", json!({"size": 1}));
    w.metadata.finalizers = Some(vec![
        "contract.turnstile.dev/a".into(),
        "contract.turnstile.dev/b".into(),
    ]);
    let created = api.create(&PostParams::default(), &w).await.unwrap();
    let mut watch = env
        .open_watch(&format!(
            "{}?watch=true&resourceVersion={}",
            widgets_path(&env),
            rv(&created)
        ))
        .await;
    api.delete("w", &DeleteParams::default()).await.unwrap();
    let marked = api.get("w").await.unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    let ev = watch.next_change(T).await.unwrap();
    assert_eq!(ev["type"], "MODIFIED");
    // No new finalizers once deleting.
    let (code, _, _) = api_code(merge(&api, "w", json!({"metadata": {"finalizers": ["contract.turnstile.dev/a", "contract.turnstile.dev/b", "contract.turnstile.dev/c"]}})).await);
    assert_eq!(code, 422);
    merge(
        &api,
        "w",
        json!({"metadata": {"finalizers": ["contract.turnstile.dev/b"]}}),
    )
    .await
    .unwrap();
    assert!(api.get_opt("w").await.unwrap().is_some());
    assert_eq!(watch.next_change(T).await.unwrap()["type"], "MODIFIED");
    merge(&api, "w", json!({"metadata": {"finalizers": null}}))
        .await
        .unwrap();
    let gone = watch.next_change(T).await.unwrap();
    assert_eq!(gone["type"], "DELETED");
    assert!(api.get_opt("w").await.unwrap().is_none());
    // Without finalizers the object goes at once.
    create(&api, "plain", json!({"size": 1})).await;
    api.delete("plain", &DeleteParams::default()).await.unwrap();
    assert!(api.get_opt("plain").await.unwrap().is_none());
}

#[tokio::test]
async fn list_filters_by_label_and_field_selectors_and_pages() {
    // (spec.color is a CRD selectableField.)
    let env = Env::with_widgets().await;
    let api = env.widgets();
    for (name, tier) in [("a", "front"), ("b", "back"), ("c", "front")] {
        let color = if name == "b" { "red" } else { "blue" };
        let mut w = widget(name, json!({"size": 1, "color": color}));
        w.metadata.labels = Some([("tier".to_string(), tier.to_string())].into());
        api.create(&PostParams::default(), &w).await.unwrap();
    }
    for (params, want) in [
        (ListParams::default().labels("tier=front"), vec!["a", "c"]),
        (ListParams::default().labels("tier in (back)"), vec!["b"]),
        (ListParams::default().labels("tier!=front"), vec!["b"]),
        (ListParams::default().fields("metadata.name=c"), vec!["c"]),
        (ListParams::default().fields("spec.color=red"), vec!["b"]),
    ] {
        assert_eq!(names(api.list(&params).await.unwrap()), want, "{params:?}");
    }
    let all: Api<DynamicObject> = Api::all_with(env.client.clone(), &support::widget_resource());
    let in_ns = all
        .list(&ListParams::default().fields(&format!("metadata.namespace={}", env.namespace)))
        .await
        .unwrap();
    assert_eq!(in_ns.items.len(), 3);
    let listed = api.list(&ListParams::default()).await.unwrap();
    let list_rv: u64 = listed.metadata.resource_version.unwrap().parse().unwrap();
    assert!(
        listed
            .items
            .iter()
            .all(|o| rv(o).parse::<u64>().unwrap() <= list_rv),
        "the list RV is at least every item's"
    );
    let page = api.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(page.items.len(), 2);
    let token = page.metadata.continue_.clone().unwrap();
    let rest = api
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(names(rest), ["c"]);
}

#[tokio::test]
async fn table_output_has_the_printer_columns() {
    let env = Env::with_widgets().await;
    let api = env.widgets();
    create(&api, "w", json!({"size": 7})).await;
    let future = (chrono::Utc::now() + chrono::Duration::hours(1))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    merge_status(
        &api,
        "w",
        json!({"status": {"phase": "Ready", "expiresAt": future}}),
    )
    .await
    .unwrap();
    let accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
    let (code, _, body) = env
        .raw("GET", &widgets_path(&env), &[("accept", accept)], None)
        .await;
    assert_eq!(code, 200);
    let table: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(table["kind"], "Table");
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        columns,
        ["Name", "Size", "Phase", "Until", "Expires", "Age"]
    );
    let cells = table["rows"][0]["cells"].as_array().unwrap();
    assert_eq!(cells[0], "w");
    assert_eq!(cells[1], 7);
    assert_eq!(cells[2], "Ready");
    assert_eq!(cells[3], "<invalid>", "a future date renders as <invalid>");
    assert_eq!(
        cells[4],
        json!(future),
        "a string column shows the RFC 3339 time"
    );
    assert!(
        cells[5].as_str().unwrap().ends_with('s'),
        "age like 0s: {}",
        cells[5]
    );
    assert_eq!(table["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    let (_, _, body) = env
        .raw("GET", &widget_path(&env, "w"), &[("accept", accept)], None)
        .await;
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["rows"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test]
async fn watch_streams_json_lines_and_resumes_from_a_resource_version() {
    let env = Env::with_widgets().await;
    let api = env.widgets();
    let a = create(&api, "a", json!({"size": 1})).await;
    let b = create(&api, "b", json!({"size": 1})).await;
    let mut watch = env
        .open_watch(&format!(
            "{}?watch=true&resourceVersion={}",
            widgets_path(&env),
            rv(&a)
        ))
        .await;
    assert_eq!(watch.status, 200);
    assert!(
        watch.content_type.starts_with("application/json"),
        "{}",
        watch.content_type
    );
    let ev = watch.next_change(T).await.unwrap();
    assert_eq!(type_and_name(&ev), ("ADDED", "b"));
    assert_eq!(ev["object"]["metadata"]["resourceVersion"], json!(rv(&b)));
    api.delete("a", &DeleteParams::default()).await.unwrap();
    let ev = watch.next_change(T).await.unwrap();
    assert_eq!(type_and_name(&ev), ("DELETED", "a"));
    // Without a resourceVersion the watch starts with the current state.
    let mut from_now = env
        .open_watch(&format!("{}?watch=true", widgets_path(&env)))
        .await;
    let ev = from_now.next_change(T).await.unwrap();
    assert_eq!(type_and_name(&ev), ("ADDED", "b"));
}

#[tokio::test]
async fn watch_sends_bookmarks_and_ends_at_its_timeout() {
    let env = Env::with_builder(
        fake_apiserver::FakeApiServer::builder().bookmark_interval(Duration::from_millis(300)),
    )
    .await;
    env.install_widget_crd().await;
    let created = env
        .widgets()
        .create(&PostParams::default(), &widget("w", json!({"size": 1})))
        .await
        .unwrap();
    let mut watch = env
        .open_watch(&format!(
            "{}?watch=true&allowWatchBookmarks=true&timeoutSeconds=2&resourceVersion={}",
            widgets_path(&env),
            rv(&created)
        ))
        .await;
    // The stream must end by itself (at timeoutSeconds): `next` panics if it stays open
    // silently, and the count bounds a stream that keeps sending bookmarks.
    let mut bookmarks = 0;
    while let Some(ev) = watch.next(Duration::from_secs(90)).await {
        assert!(bookmarks < 100, "the stream did not end at timeoutSeconds");
        assert_eq!(ev["type"], "BOOKMARK", "{ev}");
        assert_eq!(ev["object"]["kind"], "Widget");
        assert!(
            ev["object"]["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse::<u64>()
                .unwrap()
                >= rv(&created).parse().unwrap()
        );
        bookmarks += 1;
    }
    assert!(bookmarks >= 1, "at least one bookmark");
}

#[tokio::test]
async fn watch_sends_initial_events_then_an_end_bookmark() {
    let env = Env::with_widgets().await;
    env.widgets()
        .create(&PostParams::default(), &widget("w", json!({"size": 1})))
        .await
        .unwrap();
    let mut watch = env
        .open_watch(&format!("{}?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan", widgets_path(&env)))
        .await;
    let ev = watch.next(T).await.unwrap();
    assert_eq!(type_and_name(&ev), ("ADDED", "w"));
    let end = watch.next(T).await.unwrap();
    assert_eq!(end["type"], "BOOKMARK");
    assert_eq!(
        end["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
}

#[tokio::test]
async fn watch_from_a_compacted_resource_version_gets_410_expired() {
    let Some(env) = Env::fake_only("watch_from_a_compacted_resource_version").await else {
        return;
    };
    env.install_widget_crd().await;
    let api = env.widgets();
    let old = create(&api, "a", json!({"size": 1})).await;
    create(&api, "b", json!({"size": 1})).await;
    env.server().compact();
    let mut watch = env
        .open_watch(&format!(
            "{}?watch=true&resourceVersion={}",
            widgets_path(&env),
            rv(&old)
        ))
        .await;
    let ev = watch.next(T).await.unwrap();
    assert_eq!(ev["type"], "ERROR");
    assert_eq!(ev["object"]["code"], 410);
    assert_eq!(ev["object"]["reason"], "Expired");
    assert!(
        watch.next(T).await.is_none(),
        "the stream ends after the error"
    );
    // Resuming from the current resourceVersion still works.
    let now = env.server().resource_version();
    let mut ok = env
        .open_watch(&format!(
            "{}?watch=true&resourceVersion={now}",
            widgets_path(&env)
        ))
        .await;
    create(&api, "c", json!({"size": 1})).await;
    assert_eq!(ok.next_change(T).await.unwrap()["type"], "ADDED");
}

#[tokio::test]
async fn watch_filters_by_namespace_and_selectors() {
    let env = Env::with_widgets().await;
    let other = Env::new_namespace(&env).await;
    let api = env.widgets();
    let other_api: Api<DynamicObject> =
        Api::namespaced_with(env.client.clone(), &other, &support::widget_resource());
    let start = create(&api, "seed", json!({"size": 1})).await;
    let mut watch = env
        .open_watch(&format!(
            "{}?watch=true&labelSelector=pick%3Dyes&resourceVersion={}",
            widgets_path(&env),
            rv(&start)
        ))
        .await;
    let mut chosen = widget("chosen", json!({"size": 1}));
    chosen.metadata.labels = Some([("pick".to_string(), "yes".to_string())].into());
    other_api
        .create(&PostParams::default(), &chosen)
        .await
        .unwrap();
    create(&api, "unlabelled", json!({"size": 1})).await;
    api.create(&PostParams::default(), &chosen).await.unwrap();
    let ev = watch.next_change(T).await.unwrap();
    assert_eq!(
        (
            ev["type"].as_str().unwrap(),
            ev["object"]["metadata"]["namespace"].as_str().unwrap()
        ),
        ("ADDED", env.namespace.as_str())
    );
    assert_eq!(ev["object"]["metadata"]["name"], "chosen");
    merge(
        &api,
        "chosen",
        json!({"metadata": {"labels": {"pick": "no"}}}),
    )
    .await
    .unwrap();
    let left = watch.next_change(T).await.unwrap();
    assert_eq!(
        left["type"], "DELETED",
        "an object leaving the selector is seen as deleted"
    );
    merge(
        &api,
        "unlabelled",
        json!({"metadata": {"labels": {"pick": "yes"}}}),
    )
    .await
    .unwrap();
    let entered = watch.next_change(T).await.unwrap();
    assert_eq!(type_and_name(&entered), ("ADDED", "unlabelled"));
}

#[tokio::test]
async fn schema_violations_are_422_with_the_field_path() {
    let env = Env::with_widgets().await;
    let api = env.widgets();
    let (code, reason, message) = api_code(
        api.create(&PostParams::default(), &widget("w", json!({"size": 0})))
            .await,
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert_eq!(
        message,
        format!("Widget.{WIDGET_GROUP} \"w\" is invalid: spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1")
    );
    let (_, _, message) = api_code(
        api.create(
            &PostParams::default(),
            &widget("w", json!({"color": "green"})),
        )
        .await,
    );
    assert!(message.contains("spec.size: Required value"), "{message}");
    assert!(
        message.contains(
            "spec.color: Unsupported value: \"green\": supported values: \"blue\", \"red\""
        ),
        "{message}"
    );
    let (_, _, message) = api_code(
        api.create(&PostParams::default(), &widget("w", json!({"size": "big"})))
            .await,
    );
    assert!(message.contains("spec.size: Invalid value: \"string\": spec.size in body must be of type integer: \"string\""), "{message}");
    let (code, _, message) = api_code(
        api.create(
            &PostParams::default(),
            &widget("Bad_Name", json!({"size": 1})),
        )
        .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.contains("metadata.name: Invalid value: \"Bad_Name\""),
        "{message}"
    );
    // ObjectMeta rules hold for every kind: label values, finalizer names.
    let mut labelled = widget("labelled", json!({"size": 1}));
    labelled.metadata.labels = Some([("tier".to_string(), "not valid!".to_string())].into());
    let (code, _, message) = api_code(api.create(&PostParams::default(), &labelled).await);
    assert_eq!(code, 422);
    assert!(
        message.contains("metadata.labels: Invalid value: \"not valid!\""),
        "{message}"
    );
    // Updates are validated too.
    create(&api, "ok", json!({"size": 1})).await;
    let (code, _, _) = api_code(merge(&api, "ok", json!({"spec": {"size": 11}})).await);
    assert_eq!(code, 422);
}

#[tokio::test]
async fn schema_defaults_are_applied_and_unknown_fields_pruned() {
    let env = Env::with_widgets().await;
    let api = env.widgets();
    let created = api
        .create(
            &PostParams::default(),
            &widget(
                "w",
                json!({"size": 1, "bogus": true, "extra": {"anything": {"goes": 1}}, "note": null}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(created.data["spec"]["color"], "blue", "defaulted");
    assert!(created.data["spec"].get("bogus").is_none(), "pruned");
    assert_eq!(
        created.data["spec"]["extra"],
        json!({"anything": {"goes": 1}}),
        "x-kubernetes-preserve-unknown-fields keeps it"
    );
    // Defaults apply on update as well (a removed defaulted field comes back).
    let updated = merge(&api, "w", json!({"spec": {"color": null}}))
        .await
        .unwrap();
    assert_eq!(updated.data["spec"]["color"], "blue");
    // fieldValidation=Strict rejects unknown fields instead (what kubectl sends).
    let (code, _, body) = env
        .raw(
            "POST",
            &format!("{}?fieldValidation=Strict", widgets_path(&env)),
            &[("content-type", "application/json")],
            Some(serde_json::to_value(widget("s", json!({"size": 1, "bogus": 1}))).unwrap()),
        )
        .await;
    assert_eq!(code, 400, "{body}");
    assert!(
        body.contains("strict decoding error: unknown field \\\"spec.bogus\\\""),
        "{body}"
    );
    // The default (Warn) answers with a warning header.
    let (code, headers, _) = env
        .raw(
            "POST",
            &widgets_path(&env),
            &[("content-type", "application/json")],
            Some(serde_json::to_value(widget("warned", json!({"size": 1, "bogus": 1}))).unwrap()),
        )
        .await;
    assert_eq!(code, 201);
    let warning = headers
        .get("warning")
        .and_then(|w| w.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(
        warning.contains("unknown field") && warning.contains("spec.bogus"),
        "{warning}"
    );
}

#[tokio::test]
async fn cel_rules_are_evaluated_including_transition_rules() {
    let env = Env::with_widgets().await;
    let api = env.widgets();
    create(&api, "w", json!({"size": 1, "lockName": "db"})).await;
    merge(&api, "w", json!({"spec": {"size": 2}}))
        .await
        .unwrap();
    let (code, _, message) =
        api_code(merge(&api, "w", json!({"spec": {"lockName": "other"}})).await);
    assert_eq!(code, 422);
    assert!(
        message.contains("spec.lockName: Invalid value: \"string\": lockName is immutable"),
        "{message}"
    );
}

#[tokio::test]
async fn garbage_collection_deletes_dependents_of_a_deleted_owner() {
    let env = Env::with_widgets().await;
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.namespace);
    let owner = cms
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "owner"}})).unwrap(),
        )
        .await
        .unwrap();
    let mut dependent = widget("dependent", json!({"size": 1}));
    dependent.metadata.owner_references = Some(vec![serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid.clone().unwrap()})).unwrap()]);
    env.widgets()
        .create(&PostParams::default(), &dependent)
        .await
        .unwrap();
    env.widgets()
        .create(
            &PostParams::default(),
            &widget("bystander", json!({"size": 1})),
        )
        .await
        .unwrap();
    cms.delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    let mut gone = false;
    for _ in 0..200 {
        if env.widgets().get_opt("dependent").await.unwrap().is_none() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "the dependent was garbage collected");
    assert!(env.widgets().get_opt("bystander").await.unwrap().is_some());
}

#[tokio::test]
async fn built_in_kinds_are_served() {
    let env = Env::new().await;
    let ns = env.namespace.clone();
    let c = env.client.clone();
    assert!(Api::<Namespace>::all(c.clone())
        .get("default")
        .await
        .is_ok());
    // Pods and Jobs: status is set through /status, as the kubelet and job controller do.
    let pods: Api<Pod> = Api::namespaced(c.clone(), &ns);
    let pod = serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Running"}})).unwrap();
    let created = pods.create(&PostParams::default(), &pod).await.unwrap();
    assert_eq!(created.status.unwrap().phase.as_deref(), Some("Pending"));
    let running = pods
        .patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .unwrap();
    assert_eq!(running.status.unwrap().phase.as_deref(), Some("Running"));
    let jobs: Api<Job> = Api::namespaced(c.clone(), &ns);
    let job = serde_json::from_value(
        json!({"metadata": {"name": "j"}, "spec": {"template": {"spec": {"restartPolicy": "Never",
        "containers": [{"name": "c", "image": "busybox"}]}}}}),
    )
    .unwrap();
    jobs.create(&PostParams::default(), &job).await.unwrap();
    let done = jobs
        .patch_status(
            "j",
            &PatchParams::default(),
            // (kube-apiserver 1.32 rejects a Complete condition without SuccessCriteriaMet.)
            &Patch::Merge(json!({"status": {"succeeded": 1}})),
        )
        .await
        .unwrap();
    assert_eq!(done.status.unwrap().succeeded, Some(1));
    // Leases, for leader election.
    let leases: Api<Lease> = Api::namespaced(c.clone(), &ns);
    let lease = leases
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "leader"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let mut taken = lease.clone();
    taken.spec.as_mut().unwrap().holder_identity = Some("b".into());
    leases
        .replace("leader", &PostParams::default(), &taken)
        .await
        .unwrap();
    let (code, _, _) = api_code(
        leases
            .replace("leader", &PostParams::default(), &lease)
            .await,
    );
    assert_eq!(code, 409, "stale lease takeover conflicts");
    // Events: events.k8s.io/v1 and core v1 are one store.
    let events: Api<EventV1> = Api::namespaced(c.clone(), &ns);
    let ev = serde_json::from_value(json!({"metadata": {"name": "e1"}, "eventTime": "2025-01-01T00:00:00.000000Z",
        "reportingController": "turnstile.dev/controller", "reportingInstance": "x", "action": "Acquire", "reason": "Acquired",
        "type": "Normal", "note": "granted", "regarding": {"kind": "Pod", "name": "p", "namespace": ns}})).unwrap();
    events.create(&PostParams::default(), &ev).await.unwrap();
    let core: Api<CoreEvent> = Api::namespaced(c.clone(), &ns);
    let as_core = core.get("e1").await.unwrap();
    assert_eq!(as_core.message.as_deref(), Some("granted"));
    assert_eq!(as_core.involved_object.name.as_deref(), Some("p"));
    let by_field = core
        .list(&ListParams::default().fields("involvedObject.name=p"))
        .await
        .unwrap();
    assert_eq!(by_field.items.len(), 1);
    // Secrets fold stringData into data.
    let secrets: Api<Secret> = Api::namespaced(c.clone(), &ns);
    let s = secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "s"},
        "stringData": {"url": "redis://x"}}))
            .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(s.data.unwrap()["url"].0, b"redis://x".to_vec());
    // Creating in a missing namespace is a 404, as on a cluster.
    let nowhere: Api<ConfigMap> = Api::namespaced(c.clone(), "no-such-namespace");
    let (code, _, _) = api_code(
        nowhere
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap(),
            )
            .await,
    );
    assert_eq!(code, 404);
}

#[tokio::test]
async fn deleting_a_namespace_removes_its_contents() {
    let env = Env::new().await;
    let ns = Env::new_namespace(&env).await;
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), &ns);
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap(),
    )
    .await
    .unwrap();
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    namespaces
        .delete(&ns, &DeleteParams::default())
        .await
        .unwrap();
    let mut gone = false;
    for _ in 0..600 {
        if namespaces.get_opt(&ns).await.unwrap().is_none() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "the namespace went away");
    assert!(cms.get_opt("x").await.unwrap().is_none());
}

#[tokio::test]
async fn close_watches_ends_open_streams() {
    let Some(env) = Env::fake_only("close_watches_ends_open_streams").await else {
        return;
    };
    env.install_widget_crd().await;
    let mut watch = env
        .open_watch(&format!(
            "{}?watch=true&resourceVersion={}",
            widgets_path(&env),
            env.server().resource_version()
        ))
        .await;
    env.server().close_watches();
    assert!(watch.next(T).await.is_none(), "the stream ended");
}

#[tokio::test]
async fn injected_faults_answer_the_next_writes() {
    let Some(env) = Env::fake_only("injected_faults_answer_the_next_writes").await else {
        return;
    };
    env.install_widget_crd().await;
    let api = env.widgets();
    env.server().inject_faults(&widgets_path(&env), 2, 409);
    for _ in 0..2 {
        let (code, reason, _) = api_code(
            api.create(&PostParams::default(), &widget("w", json!({"size": 1})))
                .await,
        );
        assert_eq!((code, reason.as_str()), (409, "Conflict"));
    }
    assert!(
        api.get_opt("w").await.unwrap().is_none(),
        "a fault has no effect"
    );
    create(&api, "w", json!({"size": 1})).await;
    env.server().inject_faults(&widget_path(&env, "w"), 1, 500);
    let (code, _, _) = api_code(merge(&api, "w", json!({"spec": {"size": 2}})).await);
    assert_eq!(code, 500);
    assert_eq!(
        merge(&api, "w", json!({"spec": {"size": 2}}))
            .await
            .unwrap()
            .data["spec"]["size"],
        2
    );
    let log = env.server().request_log();
    assert_eq!(log.iter().filter(|r| r.injected_fault).count(), 3);
}

/// Sent over a bare connection: kube's client retries a 429 by itself, which would hide it.
#[tokio::test]
async fn an_injected_429_says_when_to_retry() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some(env) = Env::fake_only("an_injected_429_says_when_to_retry").await else {
        return;
    };
    env.install_widget_crd().await;
    env.server().inject_faults(&widgets_path(&env), 1, 429);
    let body = serde_json::to_string(&widget("w", json!({"size": 1}))).unwrap();
    let request = format!(
        "POST {} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        widgets_path(&env),
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(env.server().addr())
        .await
        .unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    assert!(answer.contains("TooManyRequests"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1\r\n"),
        "{answer}"
    );
    assert!(
        env.widgets().get_opt("w").await.unwrap().is_none(),
        "a fault has no effect"
    );
    create(&env.widgets(), "w", json!({"size": 1})).await;
}

#[tokio::test]
async fn injected_delays_slow_the_next_requests_down() {
    let Some(env) = Env::fake_only("injected_delays_slow_the_next_requests_down").await else {
        return;
    };
    env.install_widget_crd().await;
    let api = env.widgets();
    create(&api, "w", json!({"size": 1})).await;
    let delay = Duration::from_millis(400);
    env.server()
        .inject_delays(&widget_path(&env, "w"), 2, delay);
    for _ in 0..2 {
        let started = std::time::Instant::now();
        api.get("w").await.unwrap();
        assert!(started.elapsed() >= delay, "{:?}", started.elapsed());
    }
    // Used up: the request is served and the object is unchanged by the delays.
    assert_eq!(api.get("w").await.unwrap().data["spec"]["size"], 1);
}

#[tokio::test]
async fn request_log_records_what_rbac_must_allow() {
    let Some(env) = Env::fake_only("request_log_records_what_rbac_must_allow").await else {
        return;
    };
    env.install_widget_crd().await;
    env.server().clear_request_log();
    let api = env.widgets();
    create(&api, "w", json!({"size": 1})).await;
    api.get("w").await.unwrap();
    api.list(&ListParams::default()).await.unwrap();
    merge_status(&api, "w", json!({"status": {"phase": "A"}}))
        .await
        .unwrap();
    api.delete("w", &DeleteParams::default()).await.unwrap();
    let log = env.server().request_log();
    let create = log.iter().find(|r| r.verb == "create").unwrap();
    assert_eq!(
        (
            create.method.as_str(),
            create.api_group.as_str(),
            create.api_version.as_str(),
            create.resource.as_str()
        ),
        ("POST", WIDGET_GROUP, "v1", "widgets")
    );
    assert_eq!(create.namespace, env.namespace);
    assert_eq!(create.status, 201);
    let status_patch = log.iter().find(|r| r.verb == "patch").unwrap();
    assert_eq!(
        (
            status_patch.subresource.as_str(),
            status_patch.name.as_str()
        ),
        ("status", "w")
    );
    assert_eq!(status_patch.content_type, "application/merge-patch+json");
    let rbac = fake_apiserver::rbac_summary(&log);
    let verbs: Vec<&str> = rbac[&(WIDGET_GROUP.to_string(), "widgets".to_string())]
        .iter()
        .map(String::as_str)
        .collect();
    assert_eq!(verbs, ["create", "delete", "get", "list"]);
    assert!(rbac[&(WIDGET_GROUP.to_string(), "widgets/status".to_string())].contains("patch"));
}
