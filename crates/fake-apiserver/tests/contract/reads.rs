//! Reads: list selectors and paging, and table output with printer columns.

use super::*;

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
    assert_eq!(
        names_in(&table["columnDefinitions"]),
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
async fn every_page_of_a_list_is_one_snapshot_that_its_watch_resumes_from() {
    // kube-runtime's watcher resumes from the *last* page's resourceVersion. Had later pages
    // been read live at a newer one, "a" (created mid-list, before the cursor) would be in
    // neither the list nor the watch: the chaos suite's claim lost until the next re-list.
    let env = Env::with_widgets().await;
    let api = env.widgets();
    for name in ["b", "c", "d"] {
        create(&api, name, json!({"size": 1})).await;
    }
    let first = api.list(&ListParams::default().limit(2)).await.unwrap();
    let first_rv = first.metadata.resource_version.clone().unwrap();
    let token = first.metadata.continue_.clone().unwrap();
    assert_eq!(names(first), ["b", "c"]);

    create(&api, "a", json!({"size": 1})).await;
    api.delete("d", &DeleteParams::default()).await.unwrap();
    let rest = api
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(
        rest.metadata.resource_version.as_deref(),
        Some(first_rv.as_str()),
        "every page carries the snapshot's resourceVersion"
    );
    assert_eq!(names(rest), ["d"], "the snapshot still has d and not a");

    let mut watch = watch_widgets_from(&env, &first_rv).await;
    let added = watch.next_change(T).await.unwrap();
    assert_eq!(
        (
            added["type"].as_str(),
            added["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("a"))
    );
    let deleted = watch.next_change(T).await.unwrap();
    assert_eq!(
        (
            deleted["type"].as_str(),
            deleted["object"]["metadata"]["name"].as_str()
        ),
        (Some("DELETED"), Some("d"))
    );
}

#[tokio::test]
async fn continuing_a_list_whose_snapshot_is_compacted_gets_410_expired() {
    let (env, api) = fake_widgets!("continuing_a_list_whose_snapshot_is_compacted");
    for name in ["a", "b"] {
        create(&api, name, json!({"size": 1})).await;
    }
    let first = api.list(&ListParams::default().limit(1)).await.unwrap();
    let token = first.metadata.continue_.clone().unwrap();
    create(&api, "c", json!({"size": 1})).await;
    env.server().compact();
    expect_error(
        api.list(&ListParams::default().limit(1).continue_token(&token))
            .await,
        410,
        "Expired",
    );
}

#[tokio::test]
async fn a_server_page_limit_caps_only_the_lists_that_ask_for_pages() {
    let builder = fake_apiserver::FakeApiServer::builder().max_list_page(1);
    let env = Env::fake_only_with("a_server_page_limit_caps_only_paged_lists", builder).await;
    env.install_widget_crd().await;
    let api = env.widgets();
    for name in ["a", "b", "c"] {
        create(&api, name, json!({"size": 1})).await;
    }
    let page = api.list(&ListParams::default().limit(500)).await.unwrap();
    assert!(page.metadata.continue_.is_some(), "more pages follow");
    assert_eq!(names(page), ["a"]);
    assert_eq!(
        names(api.list(&ListParams::default()).await.unwrap()),
        ["a", "b", "c"],
        "a list without a limit is whole"
    );
}

#[tokio::test]
async fn a_paged_list_serves_each_object_once_in_order_and_keeps_to_its_namespace() {
    // Each page is read from its cursor on (a range of the store's key order, not a scan of
    // every object): pages must still meet at namespace boundaries and stop at the end of
    // the listed namespace, with other kinds stored around them.
    let env = Env::fake_only("a_paged_list_serves_each_object_once_in_order").await;
    let first = env.namespace.clone();
    let second = format!("{first}-z");
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": second}})).unwrap(),
        )
        .await
        .unwrap();
    for namespace in [&first, &second] {
        let maps: Api<ConfigMap> = Api::namespaced(env.client.clone(), namespace);
        let secrets: Api<Secret> = Api::namespaced(env.client.clone(), namespace);
        for name in ["m1", "m2", "m3"] {
            let object = json!({"metadata": {"name": name}});
            maps.create(
                &PostParams::default(),
                &serde_json::from_value(object.clone()).unwrap(),
            )
            .await
            .unwrap();
            secrets
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(object).unwrap(),
                )
                .await
                .unwrap();
        }
    }
    async fn pages(api: &Api<ConfigMap>, limit: u32) -> Vec<String> {
        let mut params = ListParams::default().limit(limit);
        let mut seen = Vec::new();
        loop {
            let page = api.list(&params).await.unwrap();
            seen.extend(page.items.iter().map(|m| {
                format!(
                    "{}/{}",
                    m.metadata.namespace.as_deref().unwrap_or_default(),
                    m.metadata.name.as_deref().unwrap_or_default()
                )
            }));
            match page.metadata.continue_.filter(|token| !token.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return seen,
            }
        }
    }
    let in_first: Api<ConfigMap> = Api::namespaced(env.client.clone(), &first);
    let everywhere: Api<ConfigMap> = Api::all(env.client.clone());
    let want_first: Vec<String> = ["m1", "m2", "m3"]
        .iter()
        .map(|name| format!("{first}/{name}"))
        .collect();
    for limit in [1, 2, 3] {
        assert_eq!(pages(&in_first, limit).await, want_first, "limit {limit}");
        let all: Vec<String> = pages(&everywhere, limit)
            .await
            .into_iter()
            .filter(|key| key.starts_with(&first))
            .collect();
        let mut want_all = want_first.clone();
        want_all.extend(
            ["m1", "m2", "m3"]
                .iter()
                .map(|name| format!("{second}/{name}")),
        );
        assert_eq!(all, want_all, "all namespaces, limit {limit}");
    }
}
