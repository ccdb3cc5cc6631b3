//! Writes: create, optimistic concurrency, the status subresource, generation, no-op writes and the patch types.

use super::*;

/// A JSON patch (`application/json-patch+json`) of widget `name`, sent as is: the status
/// code and the body.
async fn json_patch(env: &Env, name: &str, patch: Value) -> (u16, String) {
    let (code, _, body) = env
        .raw(
            "PATCH",
            &widget_path(env, name),
            &[("content-type", "application/json-patch+json")],
            Some(patch),
        )
        .await;
    (code, body)
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

    let message = expect_error(
        try_create(&api, "w1", json!({"size": 2})).await,
        409,
        "AlreadyExists",
    );
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
    let message = expect_error(
        api.replace("w", &PostParams::default(), &stale).await,
        409,
        "Conflict",
    );
    assert_contains_all(&message, &["the object has been modified; please apply your changes to the latest version and try again"]);
    // A patch carrying a stale resourceVersion conflicts too.
    let patch = json!({"metadata": {"resourceVersion": rv(&first)}, "spec": {"size": 4}});
    let (code, _, _) = api_code(merge(&api, "w", patch).await);
    assert_eq!(code, 409);
}

/// A patch that sets both `.spec.size` and `.status.phase`.
fn size_and_phase(size: i64, phase: &str) -> Value {
    json!({"spec": {"size": size}, "status": {"phase": phase}})
}

#[tokio::test]
async fn status_subresource_is_isolated_from_the_main_resource() {
    let env = Env::with_widgets().await;
    let api = env.widgets();
    create(&api, "w", json!({"size": 1})).await;
    let patched = merge_status(&api, "w", size_and_phase(9, "Ready"))
        .await
        .unwrap();
    assert_eq!(patched.data["status"]["phase"], "Ready");
    assert_eq!(
        patched.data["spec"]["size"], 1,
        "/status changes only .status"
    );
    let main = merge(&api, "w", size_and_phase(2, "Hacked")).await.unwrap();
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
    let mut watch = watch_widgets_from(&env, rv(&created)).await;
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

/// Server-side applies Widget `w` with `spec` (field manager `contract-test`), forced: where
/// another manager changed a field since, kube-apiserver answers 409 to an unforced apply (the
/// fake has no field ownership: see the README's known differences).
async fn apply_w(api: &Widgets, spec: Value) -> DynamicObject {
    let manifest = serde_json::to_value(widget("w", spec)).unwrap();
    api.patch(
        "w",
        &PatchParams::apply("contract-test").force(),
        &Patch::Apply(manifest),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn patch_types_merge_json_and_apply() {
    let env = Env::with_widgets().await;
    let api = env.widgets();
    // Apply to a missing object creates it.
    let applied = apply_w(&api, json!({"size": 1, "note": "n"})).await;
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
    let (code, body) = json_patch(
        &env,
        "w",
        json!([{"op": "replace", "path": "/spec/size", "value": 3}]),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["spec"]["size"],
        3
    );
    let (code, _) = json_patch(
        &env,
        "w",
        json!([{"op": "test", "path": "/spec/size", "value": 99}]),
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
    let reapplied = apply_w(&api, json!({"size": 5})).await;
    assert_eq!(reapplied.data["spec"]["size"], 5);
}
