//! The server itself: its port and kubeconfig, discovery, OpenAPI, CRD registration, the built-in kinds and the request log.

use super::*;

#[tokio::test]
async fn starts_on_its_own_loopback_port_with_a_kubeconfig() {
    let (a, b) = (
        Env::fake_only("starts_on_its_own_loopback_port").await,
        Env::fake_only("second server").await,
    );
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
    let version = env.get_json("/version").await;
    let minor: u32 = version["minor"]
        .as_str()
        .unwrap()
        .trim_end_matches('+')
        .parse()
        .unwrap();
    assert!(version["major"] == "1" && minor >= 32, "{version}");

    assert!(env.get_json("/api").await["versions"]
        .as_array()
        .unwrap()
        .contains(&json!("v1")));
    env.install_widget_crd().await;
    let groups = env.get_json("/apis").await;
    let names = names_in(&groups["groups"]);
    for g in [
        WIDGET_GROUP,
        "batch",
        "coordination.k8s.io",
        "events.k8s.io",
        "apiextensions.k8s.io",
    ] {
        assert!(names.contains(&g), "{g} missing from {names:?}");
    }
    env.get_json(&format!("/apis/{WIDGET_GROUP}")).await;
    let list = env.get_json(&format!("/apis/{WIDGET_GROUP}/v1")).await;
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
    let core = env.get_json("/api/v1").await;
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
    let root = env.get_json("/openapi/v3").await;
    let url = root["paths"][format!("apis/{WIDGET_GROUP}/v1")]["serverRelativeURL"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(root["paths"]["api/v1"]["serverRelativeURL"].is_string());
    let doc = env.get_json(&url).await;
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
    expect_invalid(
        crds.create(
            &PostParams::default(),
            &serde_json::from_value(bad).unwrap(),
        )
        .await,
        &[],
    );
    // So is a non-structural schema (a property without a type).
    let mut loose = support::widget_crd();
    loose["metadata"]["name"] = json!("loosewidgets.contract.turnstile.dev");
    loose["spec"]["names"] = json!({"plural": "loosewidgets", "kind": "LooseWidget"});
    loose["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["untyped"] = json!({"description": "no type"});
    expect_invalid(
        crds.create(
            &PostParams::default(),
            &serde_json::from_value(loose).unwrap(),
        )
        .await,
        &["properties[spec].properties[untyped].type: Required value"],
    );
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
        "type": "Normal", "note": "granted", "regarding": {"kind": "Pod", "name": "nobody", "namespace": ns}})).unwrap();
    events.create(&PostParams::default(), &ev).await.unwrap();
    let core: Api<CoreEvent> = Api::namespaced(c.clone(), &ns);
    let as_core = core.get("e1").await.unwrap();
    assert_eq!(as_core.message.as_deref(), Some("granted"));
    // About a Pod that does not exist: on a real plane the scheduler writes Events about the
    // Pod `p` made above.
    assert_eq!(as_core.involved_object.name.as_deref(), Some("nobody"));
    let by_field = core
        .list(&ListParams::default().fields("involvedObject.name=nobody"))
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
async fn request_log_records_what_rbac_must_allow() {
    let env = Env::fake_only("request_log_records_what_rbac_must_allow").await;
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
