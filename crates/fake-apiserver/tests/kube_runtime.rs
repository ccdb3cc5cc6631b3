//! A kube-rs `Controller` and a `watcher` run against the fake across a forced 410:
//! history is compacted and every watch is closed, so each must relist and carry on.

mod support;

/// This binary runs on the fake (it compacts history and closes watches on cue).
pub(crate) const ON_REAL_PLANE: bool = false;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use serde_json::json;
use support::Env;

#[derive(Debug, thiserror::Error)]
#[error("reconcile failed: {0}")]
struct ReconcileError(#[from] kube::Error);

async fn reconcile(cm: Arc<ConfigMap>, api: Arc<Api<ConfigMap>>) -> Result<Action, ReconcileError> {
    let name = cm.metadata.name.clone().unwrap_or_default();
    if cm.data.as_ref().and_then(|d| d.get("seen")).is_none() {
        api.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"seen": "yes"}})),
        )
        .await?;
    }
    Ok(Action::await_change())
}

/// Whether a watch error is a 410 Gone ("too old resource version").
fn is_a_410(error: &str) -> bool {
    error.contains("410") || error.contains("too old resource version")
}

fn make(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": {"app": "rt"}}})).unwrap()
}

async fn all_seen(api: &Api<ConfigMap>, names: &[&str]) -> bool {
    for n in names {
        let seen = api
            .get_opt(n)
            .await
            .unwrap()
            .and_then(|c| c.data)
            .is_some_and(|d| d.contains_key("seen"));
        if !seen {
            return false;
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_and_watcher_recover_from_a_forced_410() {
    // Bookmarks rarely, so the watches still hold an old resourceVersion when history is compacted.
    let builder =
        fake_apiserver::FakeApiServer::builder().bookmark_interval(Duration::from_secs(3600));
    let env =
        Env::fake_only_with("controller_and_watcher_recover_from_a_forced_410", builder).await;
    let api: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.namespace);
    let shared = Arc::new(api.clone());
    let reconcile_errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let watch_errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let config = watcher::Config::default().labels("app=rt");

    let errors = reconcile_errors.clone();
    let werrors = watch_errors.clone();
    let controller = tokio::spawn(
        Controller::new(api.clone(), config.clone())
            .run(
                reconcile,
                |_, _, _| Action::requeue(Duration::from_millis(200)),
                shared,
            )
            .for_each(move |result| {
                let errors = errors.clone();
                let werrors = werrors.clone();
                async move {
                    match result {
                        Ok(_) => {}
                        Err(kube::runtime::controller::Error::QueueError(e)) => werrors
                            .lock()
                            .unwrap()
                            .push(format!("controller watch: {e}")),
                        Err(e) => errors.lock().unwrap().push(e.to_string()),
                    }
                }
            }),
    );
    let seen_by_watcher = Arc::new(Mutex::new(BTreeSet::<String>::new()));
    let seen = seen_by_watcher.clone();
    let werrors = watch_errors.clone();
    let watcher_task = tokio::spawn(watcher(api.clone(), config).for_each(move |event| {
        let seen = seen.clone();
        let werrors = werrors.clone();
        async move {
            match event {
                Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => {
                    seen.lock()
                        .unwrap()
                        .insert(cm.metadata.name.unwrap_or_default());
                }
                Ok(_) => {}
                Err(e) => werrors.lock().unwrap().push(format!("watcher: {e}")),
            }
        }
    }));

    for n in ["a", "b"] {
        api.create(&PostParams::default(), &make(n)).await.unwrap();
    }
    wait_until(|| async { all_seen(&api, &["a", "b"]).await }).await;

    let watcher_seen = seen_by_watcher.clone();
    wait_until(move || {
        let s = watcher_seen.clone();
        async move { ["a", "b"].iter().all(|n| s.lock().unwrap().contains(*n)) }
    })
    .await;

    // Move the resourceVersion on without the watches seeing it, compact, then cut the watches:
    // each resumes from an old resourceVersion and gets 410 Expired.
    let others: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.namespace);
    others
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "unwatched"}})).unwrap(),
        )
        .await
        .unwrap();
    env.server().compact();
    env.server().close_watches();
    for n in ["c", "d"] {
        api.create(&PostParams::default(), &make(n)).await.unwrap();
    }
    wait_until(|| async { all_seen(&api, &["a", "b", "c", "d"]).await }).await;
    let watcher_seen = seen_by_watcher.clone();
    wait_until(move || {
        let s = watcher_seen.clone();
        async move {
            ["a", "b", "c", "d"]
                .iter()
                .all(|n| s.lock().unwrap().contains(*n))
        }
    })
    .await;

    controller.abort();
    watcher_task.abort();
    assert!(
        reconcile_errors.lock().unwrap().is_empty(),
        "reconcile errors: {:?}",
        reconcile_errors.lock().unwrap()
    );
    let watch_errors = watch_errors.lock().unwrap().clone();
    println!("watch errors: {watch_errors:?}");
    assert!(
        watch_errors.len() >= 2,
        "the controller's and the watcher's watches both got the 410: {watch_errors:?}"
    );
    assert!(
        watch_errors.iter().all(|e| is_a_410(e)),
        "only the forced 410s: {watch_errors:?}"
    );
    let expired = env
        .server()
        .request_log()
        .iter()
        .filter(|r| r.verb == "list" && r.resource == "configmaps")
        .count();
    assert!(
        expired >= 4,
        "both the controller and the watcher listed again after the 410 ({expired} lists)"
    );
}

#[tokio::test]
async fn a_watcher_sees_an_object_created_between_the_pages_of_its_list() {
    // The chaos suite's hour-long run lost a claim for minutes this way: created while the
    // controller's watcher was between list pages, with a name before the cursor.
    let env = Env::new().await;
    let api: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.namespace);
    for n in ["b", "c", "d"] {
        api.create(&PostParams::default(), &make(n)).await.unwrap();
    }
    let config = watcher::Config::default().labels("app=rt").page_size(2);
    let mut events = watcher(api.clone(), config).boxed();
    assert!(matches!(
        next_event(&mut events).await,
        watcher::Event::Init
    ));
    let mut listed = Vec::new();
    for _ in 0..2 {
        match next_event(&mut events).await {
            watcher::Event::InitApply(cm) => listed.push(cm.metadata.name.unwrap_or_default()),
            other => panic!("expected the first page, got {other:?}"),
        }
    }
    assert_eq!(listed, ["b", "c"]);
    // The watcher asks for the second page only when polled again.
    api.create(&PostParams::default(), &make("a"))
        .await
        .unwrap();
    let mut applied = Vec::new();
    loop {
        match next_event(&mut events).await {
            watcher::Event::InitApply(cm) => listed.push(cm.metadata.name.unwrap_or_default()),
            watcher::Event::InitDone => {}
            watcher::Event::Apply(cm) => {
                applied.push(cm.metadata.name.unwrap_or_default());
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        (listed, applied),
        (
            vec!["b".to_owned(), "c".to_owned(), "d".to_owned()],
            vec!["a".to_owned()]
        ),
        "a is not in the list's snapshot, so the watch resumed from it delivers a"
    );
}

async fn next_event<S>(events: &mut S) -> watcher::Event<ConfigMap>
where
    S: futures::Stream<Item = watcher::Result<watcher::Event<ConfigMap>>> + Unpin,
{
    match tokio::time::timeout(Duration::from_secs(10), events.next()).await {
        Ok(Some(Ok(event))) => event,
        other => panic!("no watch event: {other:?}"),
    }
}

async fn wait_until<F, Fut>(mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..300 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("condition not reached within 30 s");
}

#[tokio::test]
async fn the_event_recorder_creates_then_patches_a_series() {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    use kube::Resource as _;

    let env = Env::new().await;
    let api: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.namespace);
    let cm = api
        .create(&PostParams::default(), &make("subject"))
        .await
        .unwrap();
    let recorder = Recorder::new(
        env.client.clone(),
        Reporter {
            controller: "turnstile-test".into(),
            instance: Some("t".into()),
        },
    );
    let event = Event {
        type_: EventType::Normal,
        reason: "Acquired".into(),
        note: Some("granted".into()),
        action: "Acquire".into(),
        secondary: None,
    };
    let reference = cm.object_ref(&());
    recorder.publish(&event, &reference).await.unwrap();
    recorder.publish(&event, &reference).await.unwrap();
    let events: Api<CoreEvent> = Api::namespaced(env.client.clone(), &env.namespace);
    let listed = events.list(&Default::default()).await.unwrap();
    assert_eq!(
        listed.items.len(),
        1,
        "the repeat is a patch of the same Event"
    );
    let e = &listed.items[0];
    assert_eq!(e.reason.as_deref(), Some("Acquired"));
    assert_eq!(e.involved_object.name.as_deref(), Some("subject"));
    assert_eq!(e.series.as_ref().and_then(|s| s.count), Some(2));
}

#[tokio::test]
async fn the_finalizer_helper_adds_and_removes_its_finalizer() {
    use kube::runtime::finalizer::{finalizer, Event as FinalizerEvent};

    const NAME: &str = "test.turnstile.dev/cleanup";
    let env = Env::new().await;
    let api: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.namespace);
    api.create(&PostParams::default(), &make("guarded"))
        .await
        .unwrap();
    let cleaned = Arc::new(Mutex::new(0));
    let run = |cm: ConfigMap| {
        let cleaned = cleaned.clone();
        let api = api.clone();
        async move {
            finalizer(&api, NAME, Arc::new(cm), |event| async move {
                if let FinalizerEvent::Cleanup(_) = event {
                    *cleaned.lock().unwrap() += 1;
                }
                Ok::<_, ReconcileError>(Action::await_change())
            })
            .await
        }
    };
    // First pass adds the finalizer (JSON patch: test null + add), the second reconciles.
    run(api.get("guarded").await.unwrap()).await.unwrap();
    let guarded = api.get("guarded").await.unwrap();
    assert_eq!(
        guarded.metadata.finalizers.clone().unwrap_or_default(),
        [NAME]
    );
    run(guarded).await.unwrap();
    api.delete("guarded", &Default::default()).await.unwrap();
    let deleting = api.get("guarded").await.unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());
    run(deleting).await.unwrap();
    assert_eq!(*cleaned.lock().unwrap(), 1);
    assert!(
        api.get_opt("guarded").await.unwrap().is_none(),
        "gone once the helper removed its finalizer"
    );
}
