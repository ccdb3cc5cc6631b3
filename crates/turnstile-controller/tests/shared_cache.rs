//! The shared caches' subscribers (kube-runtime's `reflect_shared` and `ReflectHandle`, through
//! the patched copy in `vendor/kube-runtime`): a subscriber that reads the reference of an
//! object deleted since must go on to the next one. Before the patch it stopped for good, the
//! shared stream blocked once that subscriber's buffer was full, and the controller's claim
//! cache froze until a restart: every lock stuck free, in the chaos suite's one-hour runs.

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::ResourceExt;

fn config_map(name: &str) -> ConfigMap {
    let mut map = ConfigMap::default();
    map.metadata.name = Some(name.to_owned());
    map.metadata.namespace = Some("ns".to_owned());
    map
}

#[tokio::test]
async fn a_subscriber_skips_an_object_deleted_before_it_read_it() {
    let (_store, writer) = reflector::store_shared::<ConfigMap>(16);
    let mut subscriber = writer
        .subscribe()
        .expect("a shared writer hands out subscriptions");
    let events = futures::stream::iter([
        Ok(watcher::Event::Apply(config_map("a"))),
        Ok(watcher::Event::Apply(config_map("b"))),
        Ok(watcher::Event::Delete(config_map("a"))),
        Ok(watcher::Event::Apply(config_map("c"))),
    ]);
    let mut shared = std::pin::pin!(events.reflect_shared(writer));
    while shared.next().await.is_some() {}
    // "a" is gone by the time the subscriber reads its reference: it goes on to "b", "c".
    // Every reference is buffered already, so one poll each must do: a subscriber that
    // answers "pending" here has registered no wake-up for what is already there, and a
    // consumer would never poll it again (a timeout would, and hide the bug).
    let mut seen = Vec::new();
    for _ in 0..2 {
        let next = subscriber
            .next()
            .now_or_never()
            .expect("the subscriber is not stuck on a deleted object")
            .expect("more objects");
        seen.push(next.name_any());
    }
    assert_eq!(seen, ["b", "c"]);
}
