//! The control plane starter against the real binaries: the pinned version answers over TLS
//! with the admin certificate, RBAC is on, the controllers run, parts restart in place, and
//! every process is gone by PID once the plane is dropped.

use std::time::Duration;

use test_servers::{skip_or_fail, under_ci, ControlPlane, KWOK_NODE};

/// A plane of its own, or None after a skip line where the binaries are not built (outside
/// CI only).
fn plane(test: &str) -> Option<ControlPlane> {
    match ControlPlane::start() {
        Ok(plane) => Some(plane),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            skip_or_fail(test, &error.to_string(), under_ci());
            None
        }
        Err(error) => panic!("control plane: {error}"),
    }
}

fn alive(pid: u32) -> bool {
    // A reaped process has no /proc entry; a zombie would still show, but ours are reaped.
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn the_pinned_release_serves_with_rbac_and_its_controllers_and_stops_by_pid() {
    let Some(mut plane) =
        plane("the_pinned_release_serves_with_rbac_and_its_controllers_and_stops_by_pid")
    else {
        return;
    };
    let version = plane
        .kubectl(&["version", "-o", "json"])
        .expect("kubectl version");
    let pinned = test_servers::kubernetes_version().expect("the pinned version");
    assert!(
        version.contains(&format!("\"gitVersion\": \"{pinned}\"")),
        "{version}"
    );
    // RBAC is on: the admin may list Pods, an unbound ServiceAccount may not (`can-i` exits 1).
    let can = |who: &[&str]| {
        let mut args = vec!["auth", "can-i", "list", "pods"];
        args.extend_from_slice(who);
        plane.kubectl(&args)
    };
    assert_eq!(can(&[]).expect("the admin may").trim(), "yes");
    assert!(
        can(&["--as=system:serviceaccount:default:default"]).is_err(),
        "an unbound account may not"
    );
    // The controllers run: the namespace controller's ServiceAccount, KWOK's Ready Node.
    plane
        .kubectl(&["get", "serviceaccount", "default", "-n", "kube-system"])
        .expect("kube-system's default ServiceAccount");
    plane
        .kubectl(&["get", "node", KWOK_NODE])
        .expect("the KWOK Node");

    plane
        .kubectl(&["create", "configmap", "kept", "--from-literal=k=v"])
        .expect("create");
    plane.restart_apiserver().expect("kube-apiserver restarts");
    plane.restart_etcd().expect("etcd restarts");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while plane.kubectl(&["get", "configmap", "kept"]).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the ConfigMap is served again after the restarts"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let revision = plane
        .etcdctl(&["endpoint", "status", "-w", "json"])
        .expect("etcdctl");
    assert!(revision.contains("\"revision\""), "{revision}");

    let pids = plane.pids();
    assert_eq!(
        pids.len(),
        5,
        "etcd, kube-apiserver, controller manager, scheduler, KWOK"
    );
    assert!(pids.iter().all(|&pid| alive(pid)));
    drop(plane);
    assert!(
        pids.iter().all(|&pid| !alive(pid)),
        "every process stopped by PID"
    );
}
