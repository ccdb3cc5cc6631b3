//! Deletion: finalizers, garbage collection of dependents and namespace deletion.

use super::*;

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
    let mut watch = watch_widgets_from(&env, rv(&created)).await;
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
    // A real garbage collector learns of a CRD installed moments before (the Widgets') at its
    // next discovery, within 30 s: up to 60 s here.
    let mut gone = false;
    for _ in 0..600 {
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
