//! The Helm chart (`charts/turnstile`), with the helm built from its Go module
//! (`scripts/helm.sh`, run by `.ci/install`): `helm lint --strict` with the default values and
//! with every toggle on; with the default values it renders exactly the kustomize base in
//! `deploy/` (object by object, Helm's own labels and the CRDs' keep annotation aside), so the
//! two cannot drift; every toggle lands where it says; and on a real control plane
//! `helm install` of the previous chart version → a claim granted by a controller running with
//! the chart's ServiceAccount, `helm upgrade` to this chart keeps the held lock and its token,
//! `helm uninstall` keeps the CRDs and a new `helm install` adopts them. The
//! rendered chart also passes kubernetes-validate and checkov (`tests/checks/manifest_checks.rs`).

use crate::deploy;
use crate::support;

use std::collections::BTreeMap;
use std::process::Command;

use deploy::{
    find, helm_or_panic, helm_template_text, kind_of, name_of, objects, render_base, repo, str_at,
    strings, ALL_TOGGLES,
};
use serde_json::Value;

/// The previous chart version, packaged (`helm package` of `charts/turnstile` at 0.1.0).
const PREVIOUS_CHART: &str = "tests/helm_chart/turnstile-0.1.0.tgz";
/// Its version, as `helm list` shows it.
const PREVIOUS_VERSION: &str = "turnstile-0.1.0";

/// This chart's version (`Chart.yaml`).
fn chart_version() -> String {
    let chart =
        std::fs::read_to_string(repo().join("charts/turnstile/Chart.yaml")).expect("Chart.yaml");
    chart
        .lines()
        .find_map(|line| line.strip_prefix("version: "))
        .expect("a version line")
        .trim()
        .to_owned()
}

/// Runs helm with `args`; panics with its output when it fails.
fn helm(args: &[&str]) -> String {
    let output = Command::new(helm_or_panic())
        .args(args)
        .output()
        .expect("run helm");
    assert!(
        output.status.success(),
        "helm {args:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn the_chart_lints_strictly_with_default_and_all_toggles_values() {
    let chart = repo().join("charts/turnstile").display().to_string();
    let all = repo().join(ALL_TOGGLES).display().to_string();
    for values in [vec![], vec!["-f", all.as_str()]] {
        let mut args = vec!["lint", "--strict", chart.as_str()];
        args.extend(values);
        let said = helm(&args);
        assert!(said.contains("0 chart(s) failed"), "{said}");
    }
}

/// `object` without what only one of the two tools adds: Helm's release labels, kustomize's
/// `managed-by`, the CRDs' `helm.sh/resource-policy: keep`, and checkov's skip notes (whose
/// reasons name each tool's way of pinning the image).
fn comparable(mut object: Value) -> Value {
    let metadata = &mut object["metadata"];
    if let Some(labels) = metadata["labels"].as_object_mut() {
        for label in [
            "app.kubernetes.io/managed-by",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
            "helm.sh/chart",
        ] {
            labels.remove(label);
        }
    }
    if let Some(annotations) = metadata["annotations"].as_object_mut() {
        annotations.remove("helm.sh/resource-policy");
        // The scanner's notes say how to pin the image in each tool's own terms.
        annotations.retain(|key, _| !key.starts_with("checkov.io/"));
    }
    let metadata = metadata.as_object_mut().expect("metadata");
    if metadata
        .get("annotations")
        .is_some_and(|annotations| annotations.as_object().is_none_or(|map| map.is_empty()))
    {
        metadata.remove("annotations");
    }
    object
}

fn by_kind_and_name(objects: Vec<Value>) -> BTreeMap<(String, String), Value> {
    objects
        .into_iter()
        .map(|object| {
            let key = (kind_of(&object).to_owned(), name_of(&object).to_owned());
            (key, comparable(object))
        })
        .collect()
}

#[test]
fn with_default_values_the_chart_renders_the_kustomize_base_object_by_object() {
    let chart = by_kind_and_name(objects(&helm_template_text(&[])));
    // The namespace is Helm's (`--namespace … --create-namespace`), not the chart's.
    let base = by_kind_and_name(
        render_base()
            .into_iter()
            .filter(|object| kind_of(object) != "Namespace")
            .collect(),
    );
    assert_eq!(
        chart.keys().collect::<Vec<_>>(),
        base.keys().collect::<Vec<_>>(),
        "the same objects"
    );
    for (key, object) in &base {
        let pretty = |value: &Value| serde_yaml::to_string(value).expect("YAML");
        assert!(
            &chart[key] == object,
            "{key:?} differs from deploy/:\n--- chart\n{}\n--- deploy/\n{}",
            pretty(&chart[key]),
            pretty(object)
        );
    }
}

#[test]
fn the_chart_keeps_copies_of_the_monitoring_component() {
    for file in [
        "servicemonitor.yaml",
        "prometheusrule.yaml",
        "dashboard.json",
    ] {
        let original =
            std::fs::read_to_string(repo().join("deploy/components/monitoring").join(file))
                .expect("read the component");
        let copy =
            std::fs::read_to_string(repo().join("charts/turnstile/files/monitoring").join(file))
                .expect("read the chart's copy");
        assert!(
            original == copy,
            "charts/turnstile/files/monitoring/{file} differs from deploy/components/monitoring/{file}: copy it again"
        );
    }
}

#[test]
fn every_toggle_lands_where_the_values_file_says() {
    let rendered = objects(&helm_template_text(&[ALL_TOGGLES]));
    let deployment = find(&rendered, "Deployment", "turnstile-controller");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(deployment["spec"]["replicas"], 3);
    assert_eq!(
        str_at(container, "/image"),
        Some("registry.example.com/turnstile@sha256:0000000000000000000000000000000000000000000000000000000000000000")
    );
    assert_eq!(
        strings(container.get("args")),
        [
            "run",
            "--leader-elect",
            "--metrics-addr=0.0.0.0:8080",
            "--log-format=text",
            "--default-backend=redis",
            "--cluster-name=east",
            "--namespace=team-a",
            "--otlp-endpoint=http://otel-collector.observability.svc:4317",
            "--events=warnings",
        ]
    );
    let env: BTreeMap<String, Value> = container["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|var| (var["name"].as_str().expect("name").to_owned(), var.clone()))
        .collect();
    for (name, key) in [
        ("TURNSTILE_REDIS_URL", "redis-url"),
        ("TURNSTILE_MONGO_URL", "mongo-url"),
        ("TURNSTILE_ETCD_URL", "etcd-url"),
    ] {
        assert_eq!(
            env[name]["valueFrom"]["secretKeyRef"],
            serde_json::json!({"name": "turnstile-backends", "key": key}),
            "{name}"
        );
    }
    assert_eq!(env["RUST_LOG"]["value"], "debug");
    assert_eq!(env["TURNSTILE_EVENTS_PER_SECOND"]["value"], "20");
    assert_eq!(container["resources"]["limits"]["memory"], "512Mi");
    assert_eq!(pod["nodeSelector"]["kubernetes.io/os"], "linux");
    assert_eq!(pod["tolerations"][0]["key"], "dedicated");
    assert!(pod["affinity"]["podAntiAffinity"].is_object());
    assert_eq!(pod["imagePullSecrets"][0]["name"], "registry-credentials");
    assert_eq!(
        deployment["spec"]["template"]["metadata"]["annotations"]["example.com/team"],
        "platform"
    );
    let policy = find(&rendered, "NetworkPolicy", "turnstile-controller");
    let ports = policy["spec"]["egress"][2]["ports"]
        .as_array()
        .expect("ports");
    for port in [2379, 7000] {
        assert!(
            ports.iter().any(|open| open["port"] == port),
            "egress port {port} (etcd's, as etcd.urlSecret is set; the extra one)"
        );
    }
    for (kind, name) in [
        ("ServiceMonitor", "turnstile-controller"),
        ("PrometheusRule", "turnstile-controller"),
        ("ConfigMap", "turnstile-dashboard"),
    ] {
        let object = find(&rendered, kind, name);
        assert_eq!(
            object["metadata"]["labels"]["release"], "kube-prometheus-stack",
            "{kind} carries monitoring.labels"
        );
        assert_eq!(object["metadata"]["namespace"], "turnstile-system");
    }
    // Off: no PodDisruptionBudget, NetworkPolicy, metrics Service or CRDs.
    let off = std::env::temp_dir().join(format!("turnstile-helm-off-{}.yaml", std::process::id()));
    std::fs::write(
        &off,
        "podDisruptionBudget: {enabled: false}\nnetworkPolicy: {enabled: false}\nmetrics: {service: false}\ncrds: {install: false}\n",
    )
    .expect("write values");
    let chart = repo().join("charts/turnstile").display().to_string();
    let text = helm(&[
        "template",
        "turnstile",
        &chart,
        "-f",
        &off.display().to_string(),
    ]);
    std::fs::remove_file(&off).ok();
    let kinds: Vec<String> = objects(&text)
        .iter()
        .map(|o| kind_of(o).to_owned())
        .collect();
    for gone in [
        "PodDisruptionBudget",
        "NetworkPolicy",
        "Service",
        "CustomResourceDefinition",
    ] {
        assert!(
            !kinds.iter().any(|kind| kind == gone),
            "{gone} still rendered"
        );
    }
    assert!(kinds.iter().any(|kind| kind == "Deployment"));
}

/// `helm ARGS` against the cluster of the kubeconfig `admin` (blocking: run off the async
/// workers).
async fn helm_on(admin: &std::path::Path, args: &[&str]) -> String {
    let mut args: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
    args.extend(["--kubeconfig".to_owned(), admin.display().to_string()]);
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        helm(&args)
    })
    .await
    .expect("helm thread")
}

/// Waits (bounded) until the claim `name` in `namespace` satisfies `done`; returns it.
async fn wait_claim(
    claims: &kube::Api<turnstile_api::LockClaim>,
    name: &str,
    done: impl Fn(&turnstile_api::LockClaim) -> bool,
) -> turnstile_api::LockClaim {
    let deadline = std::time::Instant::now() + support::WAIT;
    loop {
        if let Some(claim) = claims.get_opt(name).await.expect("get claim") {
            if done(&claim) {
                return claim;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "claim {name} never got there"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_previous_chart_grants_a_claim_an_upgrade_to_this_one_keeps_it_and_uninstall_keeps_the_crds(
) {
    use support::plane::{client_for, kubectl_ok, own_plane, with_token};
    use support::{phase_of, position_of, token_of};
    use turnstile_api::{ClaimPhase, LockClaim};
    use turnstile_controller::leader::LeaderConfig;
    use turnstile_controller::ControllerConfig;

    // A plane of its own with nothing of Turnstile's but the CRDs the plane applies at start
    // (a fresh cluster has none: they go, and Helm installs them).
    let Some(plane) = own_plane().await else {
        test_servers::skip_or_fail(
            "the_previous_chart_grants_a_claim_an_upgrade_to_this_one_keeps_it_and_uninstall_keeps_the_crds",
            "it needs a real control plane",
            test_servers::under_ci(),
        );
        return;
    };
    let admin = plane.kubeconfig().to_path_buf();
    let crds = [
        "crd/distributedlocks.turnstile.dev",
        "crd/lockclaims.turnstile.dev",
        "crd/locktemplates.turnstile.dev",
        "crd/clusterdistributedlocks.turnstile.dev",
    ];
    let mut delete = vec!["delete", "--wait"];
    delete.extend(crds);
    kubectl_ok(Some(&admin), &delete);

    // The previous chart version, as it was packaged (`helm package` of the chart at 0.1.0);
    // the upgrade goes from it to this one, as a user's would.
    let chart = repo().join("charts/turnstile").display().to_string();
    let previous = repo().join(PREVIOUS_CHART).display().to_string();
    assert_ne!(
        format!("turnstile-{}", chart_version()),
        PREVIOUS_VERSION,
        "the chart changed since its previous version: raise its version"
    );
    let installed = helm_on(
        &admin,
        &[
            "install",
            "turnstile",
            &previous,
            "-n",
            "turnstile-system",
            "--create-namespace",
        ],
    )
    .await;
    assert!(installed.contains("STATUS: deployed"), "{installed}");
    assert!(
        helm_on(&admin, &["list", "-n", "turnstile-system"])
            .await
            .contains(PREVIOUS_VERSION),
        "the previous version is installed"
    );
    // The previous chart's CRDs (this one's brings the ClusterDistributedLock's too).
    let established = |crds: &[&str]| {
        let mut wait = vec!["wait", "--for=condition=Established", "--timeout=60s"];
        wait.extend(crds);
        kubectl_ok(Some(&admin), &wait);
    };
    established(&crds[..3]);

    // The controller runs here (no kubelet runs the chart's Pods) as the chart's
    // ServiceAccount, with leader election on the chart's Role in turnstile-system.
    let token = kubectl_ok(
        Some(&admin),
        &[
            "create",
            "token",
            "turnstile-controller",
            "-n",
            "turnstile-system",
        ],
    );
    let kubeconfig = tempfile::NamedTempFile::new().expect("kubeconfig file");
    std::fs::write(kubeconfig.path(), with_token(&admin, token.trim())).expect("write kubeconfig");
    let controller_client = client_for(kubeconfig.path()).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let controller = tokio::spawn(turnstile_controller::run(
        controller_client,
        ControllerConfig {
            namespace: Some("default".to_owned()),
            leader_election: Some(LeaderConfig::new("turnstile-system", "helm-test")),
            ..ControllerConfig::default()
        },
        async {
            let _ = stopped.await;
        },
    ));

    let apply = |yaml: String| {
        let mut command = Command::new("kubectl");
        command
            .arg("--kubeconfig")
            .arg(&admin)
            .args(["apply", "-n", "default", "-f", "-"]);
        let output = test_servers::output_with_stdin(&mut command, &yaml).expect("kubectl");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let claim = |name: &str| {
        format!("apiVersion: turnstile.dev/v1alpha1\nkind: LockClaim\nmetadata:\n  name: {name}\nspec:\n  lockName: db\n")
    };
    apply("apiVersion: turnstile.dev/v1alpha1\nkind: DistributedLock\nmetadata:\n  name: db\nspec:\n  leaseDurationSeconds: 300\n".to_owned());
    apply(claim("held"));
    let claims: kube::Api<LockClaim> = kube::Api::namespaced(client_for(&admin).await, "default");
    let held = wait_claim(&claims, "held", |c| phase_of(c) == Some(ClaimPhase::Held)).await;
    assert_eq!(token_of(&held), Some(1));

    // The upgrade to this chart (and new values) keeps the lock held, with its token, and the
    // controller keeps its rights under this chart's RBAC: the next claim is granted after the
    // release.
    let upgraded = helm_on(
        &admin,
        &[
            "upgrade",
            "turnstile",
            &chart,
            "-n",
            "turnstile-system",
            "--set",
            "replicas=1",
        ],
    )
    .await;
    assert!(upgraded.contains("REVISION: 2"), "{upgraded}");
    established(&crds);
    let listed = helm_on(&admin, &["list", "-n", "turnstile-system"]).await;
    assert!(
        listed.contains(&format!("turnstile-{}", chart_version())),
        "{listed}"
    );
    let still = claims.get("held").await.expect("get claim");
    assert_eq!(phase_of(&still), Some(ClaimPhase::Held));
    assert_eq!(token_of(&still), Some(1));
    apply(claim("next"));
    wait_claim(&claims, "next", |c| position_of(c) == Some(1)).await;
    kubectl_ok(
        Some(&admin),
        &[
            "patch",
            "lockclaim",
            "held",
            "-n",
            "default",
            "--type=merge",
            "-p",
            r#"{"spec":{"release":true}}"#,
        ],
    );
    let next = wait_claim(&claims, "next", |c| phase_of(c) == Some(ClaimPhase::Held)).await;
    assert_eq!(token_of(&next), Some(2));
    let _ = stop.send(());
    controller
        .await
        .expect("controller task")
        .expect("controller ran");

    // Uninstall says it keeps the CRDs, and does: the lock and its claims stay.
    let uninstalled = helm_on(
        &admin,
        &["uninstall", "turnstile", "-n", "turnstile-system"],
    )
    .await;
    assert!(
        uninstalled.contains("kept due to the resource policy"),
        "{uninstalled}"
    );
    for crd in crds {
        kubectl_ok(Some(&admin), &["get", crd]);
    }
    let kept = claims.get("next").await.expect("the claim stays");
    assert_eq!(phase_of(&kept), Some(ClaimPhase::Held));

    // Installing again adopts the CRDs uninstall kept; the objects are untouched.
    let again = helm_on(
        &admin,
        &["install", "turnstile", &chart, "-n", "turnstile-system"],
    )
    .await;
    assert!(again.contains("STATUS: deployed"), "{again}");
    let kept = claims.get("next").await.expect("the claim stays");
    assert_eq!(token_of(&kept), Some(2));
    drop(plane);
}
