//! The writes against a real API server (the fake): a replica writes only while it leads,
//! an existing object is reported on create, a delete takes only the very object, a failed
//! write names what it was doing, and a pass's store returns the version each write made.

use fake_apiserver::FakeApiServer;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::ObjectMeta;
use kube::Api;
use tokio::sync::watch;

use serde_json::json;

use super::*;

const PATH: &str = "/api/v1/namespaces/default/configmaps";

fn config_map(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

async fn api() -> (FakeApiServer, Api<ConfigMap>) {
    let server = FakeApiServer::start().await.expect("fake API server");
    let api = Api::namespaced(server.client(), "default");
    (server, api)
}

fn writer() -> ApiWriter {
    ApiWriter::new(LeadershipGate::always_open())
}

/// A replica writes only while it leads, and says so when asked.
#[tokio::test]
async fn a_writer_writes_only_while_its_replica_leads() {
    let (_server, api) = api().await;
    let (leads, is_leader) = watch::channel(false);
    let follower = ApiWriter::new(LeadershipGate::following(is_leader));
    assert!(!follower.may_write());
    let refused = follower.create(&api, &config_map("c")).await;
    assert!(refused.is_err_and(|error| error.is_not_leader()));
    leads.send_replace(true);
    assert!(follower.may_write());
    let created = follower.create(&api, &config_map("c")).await;
    assert!(matches!(created, Ok(Created::New(_))), "{created:?}");
}

/// An object that exists already (the cache lagged) is reported, not an error; any
/// other refusal is an error naming what was being done.
#[tokio::test]
async fn creating_an_object_that_exists_is_reported_and_other_refusals_fail() {
    let (server, api) = api().await;
    let created = writer().create(&api, &config_map("c")).await;
    assert!(matches!(created, Ok(Created::New(_))), "{created:?}");
    let again = writer().create(&api, &config_map("c")).await;
    assert!(matches!(again, Ok(Created::AlreadyExists)), "{again:?}");
    server.inject_faults(PATH, 1, 500);
    let error = writer()
        .create(&api, &config_map("d"))
        .await
        .expect_err("refused");
    assert!(
        error.to_string().contains("while creating ConfigMap d"),
        "{error}"
    );
}

/// A failed write's error says which part of which object it was writing.
#[tokio::test]
async fn a_failed_write_names_the_part_and_the_object() {
    let (server, api) = api().await;
    writer()
        .create(&api, &config_map("c"))
        .await
        .expect("create");
    for (write, doing) in [
        (
            Write::finalizers("c", &["f".to_owned()]),
            "setting finalizers of ConfigMap c",
        ),
        (
            Write::object("c", json!({"data": {"k": "v"}})),
            "patching ConfigMap c",
        ),
    ] {
        server.inject_faults(PATH, 1, 500);
        let error = writer()
            .apply(&api, &write, None)
            .await
            .expect_err("refused");
        assert!(error.to_string().contains(doing), "{error}");
    }
    let written = writer()
        .apply(&api, &Write::object("c", json!({"data": {"k": "v"}})), None)
        .await
        .expect("written");
    assert_eq!(
        written.data.and_then(|data| data.get("k").cloned()),
        Some("v".to_owned())
    );
}

/// A delete takes only the very object it was given: one made again under its name
/// is left alone, one gone already is reported, neither as an error; other refusals are.
#[tokio::test]
async fn a_delete_takes_only_that_very_object() {
    let (server, api) = api().await;
    let first = match writer().create(&api, &config_map("c")).await {
        Ok(Created::New(object)) => object,
        other => panic!("{other:?}"),
    };
    assert_eq!(writer().delete(&api, &first).await.ok(), Some(true));
    assert_eq!(writer().delete(&api, &first).await.ok(), Some(false));
    let second = match writer().create(&api, &config_map("c")).await {
        Ok(Created::New(object)) => object,
        other => panic!("{other:?}"),
    };
    assert_eq!(writer().delete(&api, &first).await.ok(), Some(false));
    assert!(
        api.get_opt("c").await.expect("get").is_some(),
        "still there"
    );
    // Any other refusal is an error.
    server.inject_faults(PATH, 1, 500);
    let refused = writer().delete(&api, &second).await;
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(writer().delete(&api, &second).await.ok(), Some(true));
}

/// The fake with Turnstile's CRDs served, lock `db` and claim `a` in `default`.
async fn with_lock_and_claim() -> (FakeApiServer, Client) {
    let server = FakeApiServer::start().await.expect("fake API server");
    let client = server.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in turnstile_api::crds() {
        crds.create(&PostParams::default(), &crd)
            .await
            .expect("create CRD");
    }
    let locks: Api<DistributedLock> = Api::namespaced(client.clone(), "default");
    let lock = DistributedLock::new("db", turnstile_api::DistributedLockSpec::default());
    // Served once the CRD is: the fake serves it on creation.
    locks
        .create(&PostParams::default(), &lock)
        .await
        .expect("create lock");
    let claims: Api<LockClaim> = Api::namespaced(client.clone(), "default");
    let claim = LockClaim::new("a", turnstile_api::LockClaimSpec::for_lock("db"));
    claims
        .create(&PostParams::default(), &claim)
        .await
        .expect("create claim");
    (server, client)
}

/// A pass's store writes the claim and the lock it is told to and returns the version each
/// write made: the next write of the pass is conditional on it.
#[tokio::test]
async fn a_pass_store_returns_the_version_each_write_made() {
    let (_server, client) = with_lock_and_claim().await;
    let mut store = ApiStore::new(writer(), client.clone(), "default");
    let claims: Api<LockClaim> = Api::namespaced(client.clone(), "default");
    let locks: Api<DistributedLock> = Api::namespaced(client.clone(), "default");
    let to_claim = PassWrite {
        target: Target::Claim,
        write: Write::finalizers("a", &[FINALIZER.to_owned()]),
    };
    let version = store.patch(&to_claim, None).await.expect("claim written");
    let claim = claims.get("a").await.expect("get claim");
    assert_eq!(claim.finalizers(), [FINALIZER.to_owned()]);
    assert_eq!(version, claim.resource_version());
    let to_lock = PassWrite {
        target: Target::Lock,
        write: Write::finalizers("db", &[FINALIZER.to_owned()]),
    };
    let version = store.patch(&to_lock, None).await.expect("lock written");
    let lock = locks.get("db").await.expect("get lock");
    assert_eq!(lock.finalizers(), [FINALIZER.to_owned()]);
    assert_eq!(version, lock.resource_version());
    // Conditional on a version the object is past: refused.
    let stale = store.patch(&to_claim, Some("1")).await;
    assert!(stale.is_err(), "{stale:?}");
    // A cluster lock's pass names its claims `namespace/name`: the write reaches the claim.
    let mut cluster_store = ApiStore::for_cluster_lock(writer(), client);
    let none = PassWrite {
        target: Target::Claim,
        write: Write::finalizers("default/a", &[]),
    };
    let version = cluster_store
        .patch(&none, None)
        .await
        .expect("claim written");
    let claim = claims.get("a").await.expect("get claim");
    assert!(claim.finalizers().is_empty(), "{:?}", claim.finalizers());
    assert_eq!(version, claim.resource_version());
}
