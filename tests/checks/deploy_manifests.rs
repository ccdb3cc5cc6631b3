//! The kustomize base in `deploy/`, rendered by the kubectl on PATH (`kubectl kustomize`),
//! alone and with the Redis component, and checked object by object: what is installed,
//! the controller Pod's hardening, probes and HA settings, and least-privilege RBAC.
//!
//! `deploy/crds/` holds copies of the generated `crds/` files (kustomize refuses files outside
//! its directory); `TURNSTILE_BLESS_CRDS=1` refreshes them, as it refreshes `crds/`.

use crate::deploy;
use crate::files::file_names;
use crate::scratch;

use std::collections::BTreeSet;
use std::path::Path;

use deploy::{
    find, grants, kind_of, kustomize, name_of, relative, render_base, render_with_component, repo,
    str_at, strings, Grant,
};
use scratch::scratch;
use serde_json::Value;
use turnstile_api::FINALIZER;
use turnstile_controller::leader::{DEFAULT_LEASE_NAME, POD_NAMESPACE_ENV, POD_NAME_ENV};

const NAMESPACE: &str = "turnstile-system";
const SERVICE_ACCOUNT: &str = "turnstile-controller";
const CONTROLLER: &str = "turnstile-controller";

/// The base plus the Redis component, through an overlay as a user would write it.
fn render_with_redis() -> Vec<Value> {
    render_with_component("redis")
}

fn controller_container(objects: &[Value]) -> &Value {
    let deployment = find(objects, "Deployment", CONTROLLER);
    deployment
        .pointer("/spec/template/spec/containers")
        .and_then(Value::as_array)
        .and_then(|containers| containers.iter().find(|c| c["name"] == "controller"))
        .expect("a container named controller")
}

fn env_var<'a>(container: &'a Value, name: &str) -> Option<&'a Value> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
}

const CLUSTER_SCOPED: &[&str] = &[
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
];

#[test]
fn the_base_renders_every_part_into_the_turnstile_namespace() {
    let objects = render_base();
    let rendered: BTreeSet<(String, String)> = objects
        .iter()
        .map(|o| (kind_of(o).to_string(), name_of(o).to_string()))
        .collect();
    let expected: BTreeSet<(String, String)> = [
        ("Namespace", NAMESPACE),
        ("CustomResourceDefinition", "distributedlocks.turnstile.dev"),
        ("CustomResourceDefinition", "lockclaims.turnstile.dev"),
        ("CustomResourceDefinition", "locktemplates.turnstile.dev"),
        (
            "CustomResourceDefinition",
            "clusterdistributedlocks.turnstile.dev",
        ),
        ("ServiceAccount", SERVICE_ACCOUNT),
        ("ClusterRole", "turnstile-controller"),
        ("ClusterRoleBinding", "turnstile-controller"),
        ("Role", "turnstile-leader-election"),
        ("RoleBinding", "turnstile-leader-election"),
        ("ClusterRole", "turnstile-edit"),
        ("ClusterRole", "turnstile-view"),
        ("ClusterRole", "turnstile-admin"),
        ("Deployment", CONTROLLER),
        ("Service", "turnstile-controller-metrics"),
        ("NetworkPolicy", CONTROLLER),
        ("PodDisruptionBudget", CONTROLLER),
    ]
    .into_iter()
    .map(|(kind, name)| (kind.to_string(), name.to_string()))
    .collect();
    assert_eq!(rendered, expected);

    for object in &objects {
        let namespace = str_at(object, "/metadata/namespace");
        if CLUSTER_SCOPED.contains(&kind_of(object)) {
            assert_eq!(
                namespace,
                None,
                "{} {} is cluster-scoped",
                kind_of(object),
                name_of(object)
            );
        } else {
            assert_eq!(
                namespace,
                Some(NAMESPACE),
                "{} {}",
                kind_of(object),
                name_of(object)
            );
        }
    }
    let namespace = find(&objects, "Namespace", NAMESPACE);
    assert_eq!(
        str_at(
            namespace,
            "/metadata/labels/pod-security.kubernetes.io~1enforce"
        ),
        Some("restricted")
    );
}

#[test]
fn the_deployed_crds_are_the_generated_ones() {
    let generated = repo().join("crds");
    let yaml_files = |dir: &Path| -> BTreeSet<String> {
        file_names(dir)
            .into_iter()
            .filter(|name| name.ends_with(".yaml"))
            .collect()
    };
    let names = yaml_files(&generated);
    // kustomize and Helm both refuse files outside their directory: each keeps copies.
    for copies in ["deploy/crds", "charts/turnstile/files/crds"] {
        let dir = repo().join(copies);
        if std::env::var_os("TURNSTILE_BLESS_CRDS").is_some() {
            std::fs::create_dir_all(&dir).expect("create the copies' folder");
            for name in yaml_files(&dir) {
                std::fs::remove_file(dir.join(name)).expect("remove a stale copy");
            }
            for name in &names {
                std::fs::copy(generated.join(name), dir.join(name)).expect("copy a CRD");
            }
        }
        assert_eq!(
            yaml_files(&dir),
            names,
            "{copies}/ must copy crds/; refresh with TURNSTILE_BLESS_CRDS=1 cargo test -p turnstile --test checks deploy_manifests::"
        );
        for name in &names {
            let original = std::fs::read_to_string(generated.join(name)).expect("read crds/");
            let copy = std::fs::read_to_string(dir.join(name)).expect("read a copy");
            assert!(
                original == copy,
                "{copies}/{name} differs from crds/{name}; refresh with TURNSTILE_BLESS_CRDS=1 cargo test -p turnstile --test checks deploy_manifests::"
            );
        }
    }
    // Every copy is installed by the base.
    let kustomization =
        std::fs::read_to_string(repo().join("deploy").join("kustomization.yaml")).expect("read");
    let kustomization: Value = serde_yaml::from_str(&kustomization).expect("YAML");
    let resources = strings(kustomization.get("resources"));
    for name in &names {
        assert!(
            resources.contains(&format!("crds/{name}")),
            "deploy/kustomization.yaml misses crds/{name}"
        );
    }
}

#[test]
fn the_controller_runs_two_leader_elected_replicas() {
    let objects = render_base();
    let deployment = find(&objects, "Deployment", CONTROLLER);
    assert_eq!(deployment.pointer("/spec/replicas"), Some(&Value::from(2)));
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], SERVICE_ACCOUNT);
    let container = controller_container(&objects);
    let args = strings(container.get("args"));
    assert_eq!(args.first().map(String::as_str), Some("run"), "{args:?}");
    assert!(args.iter().any(|a| a == "--leader-elect"), "{args:?}");
    assert!(args.iter().any(|a| a == "--log-format=json"), "{args:?}");
    // The Lease identity and namespace come from the downward API.
    for (variable, field) in [
        (POD_NAME_ENV, "metadata.name"),
        (POD_NAMESPACE_ENV, "metadata.namespace"),
    ] {
        let env = env_var(container, variable).unwrap_or_else(|| panic!("no {variable}"));
        assert_eq!(
            str_at(env, "/valueFrom/fieldRef/fieldPath"),
            Some(field),
            "{variable}"
        );
    }
    let image = str_at(container, "/image").expect("image");
    let tag = image.rsplit_once(':').map(|(_, tag)| tag).unwrap_or("");
    assert!(
        !tag.is_empty() && tag != "latest" && !tag.contains('/'),
        "pin the image tag: {image}"
    );
    // A rolling update replaces one replica at a time: one new Pod may start before an old
    // one stops, and at most one is unavailable.
    assert_eq!(
        deployment.pointer("/spec/strategy/type"),
        Some(&Value::from("RollingUpdate"))
    );
    assert_eq!(
        deployment.pointer("/spec/strategy/rollingUpdate/maxUnavailable"),
        Some(&Value::from(1))
    );
    assert_eq!(
        deployment.pointer("/spec/strategy/rollingUpdate/maxSurge"),
        Some(&Value::from(1))
    );
    // Two replicas never drain together and prefer different nodes.
    let pdb = find(&objects, "PodDisruptionBudget", CONTROLLER);
    assert_eq!(pdb.pointer("/spec/maxUnavailable"), Some(&Value::from(1)));
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    let spread = &pod["topologySpreadConstraints"][0];
    assert_eq!(spread["topologyKey"], "kubernetes.io/hostname");
    // Room for SIGTERM -> stop reconciling -> release the Lease.
    assert!(pod["terminationGracePeriodSeconds"].as_i64().unwrap_or(30) >= 15);
}

/// The pieces of the "restricted" Pod Security Standard a Pod template can get wrong.
fn assert_restricted(name: &str, pod: &Value) {
    for field in ["hostNetwork", "hostPID", "hostIPC"] {
        assert_ne!(pod[field], Value::Bool(true), "{name}: {field}");
    }
    for volume in pod["volumes"].as_array().into_iter().flatten() {
        assert!(volume.get("hostPath").is_none(), "{name}: hostPath volume");
    }
    let containers = pod["containers"].as_array().expect("containers");
    let init = pod["initContainers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for container in containers.iter().chain(&init) {
        let security = &container["securityContext"];
        let pod_security = &pod["securityContext"];
        let non_root = security["runAsNonRoot"]
            .as_bool()
            .or(pod_security["runAsNonRoot"].as_bool());
        assert_eq!(non_root, Some(true), "{name}: runAsNonRoot");
        let user = security["runAsUser"]
            .as_i64()
            .or(pod_security["runAsUser"].as_i64());
        assert_ne!(user, Some(0), "{name}: runs as root");
        assert_eq!(
            security["allowPrivilegeEscalation"],
            Value::Bool(false),
            "{name}: privilege escalation"
        );
        assert_ne!(
            security["privileged"],
            Value::Bool(true),
            "{name}: privileged"
        );
        assert_eq!(
            security["readOnlyRootFilesystem"],
            Value::Bool(true),
            "{name}: writable root filesystem"
        );
        let dropped = strings(security.pointer("/capabilities/drop"));
        assert!(
            dropped.iter().any(|c| c == "ALL"),
            "{name}: capabilities not dropped"
        );
        let added = strings(security.pointer("/capabilities/add"));
        assert!(
            added.iter().all(|c| c == "NET_BIND_SERVICE"),
            "{name}: adds {added:?}"
        );
        let seccomp = str_at(security, "/seccompProfile/type")
            .or(str_at(pod_security, "/seccompProfile/type"));
        assert_eq!(seccomp, Some("RuntimeDefault"), "{name}: seccomp");
        // Requests and limits for CPU and memory, requests within limits.
        for resource in ["cpu", "memory"] {
            let request = str_at(container, &format!("/resources/requests/{resource}"));
            let limit = str_at(container, &format!("/resources/limits/{resource}"));
            let (Some(request), Some(limit)) = (request, limit) else {
                panic!("{name}: {resource} request and limit required");
            };
            assert!(
                quantity(request) <= quantity(limit),
                "{name}: {resource} {request} > {limit}"
            );
        }
    }
}

/// A Kubernetes quantity in base units (the suffixes the manifests use).
fn quantity(text: &str) -> f64 {
    let (number, factor) = [
        ("Gi", 1024.0 * 1024.0 * 1024.0),
        ("Mi", 1024.0 * 1024.0),
        ("Ki", 1024.0),
        ("m", 0.001),
    ]
    .iter()
    .find_map(|(suffix, factor)| text.strip_suffix(suffix).map(|n| (n, *factor)))
    .unwrap_or((text, 1.0));
    number
        .parse::<f64>()
        .unwrap_or_else(|_| panic!("quantity {text}"))
        * factor
}

#[test]
fn every_pod_meets_the_restricted_pod_security_standard() {
    let objects = render_with_redis();
    let deployments: Vec<&Value> = objects
        .iter()
        .filter(|o| kind_of(o) == "Deployment")
        .collect();
    assert_eq!(deployments.len(), 2, "the controller and Redis");
    for deployment in deployments {
        assert_restricted(name_of(deployment), &deployment["spec"]["template"]["spec"]);
    }
}

#[test]
fn probes_and_the_metrics_service_use_the_metrics_port() {
    let objects = render_base();
    let container = controller_container(&objects);
    let args = strings(container.get("args"));
    let address = args
        .iter()
        .find_map(|a| a.strip_prefix("--metrics-addr="))
        .expect("--metrics-addr");
    let port: i64 = address
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .expect("a port");
    assert!(
        !address.starts_with("127.") && !address.starts_with("localhost"),
        "kubelet cannot probe {address}"
    );
    let ports = container["ports"].as_array().expect("ports");
    let metrics_port = ports
        .iter()
        .find(|p| p["name"] == "metrics")
        .expect("a port named metrics");
    assert_eq!(metrics_port["containerPort"].as_i64(), Some(port));
    let names_the_port = |value: &Value| value == "metrics" || value.as_i64() == Some(port);
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}");
        assert!(names_the_port(&get["port"]), "{probe} port {}", get["port"]);
    }
    let service = find(&objects, "Service", "turnstile-controller-metrics");
    let deployment = find(&objects, "Deployment", CONTROLLER);
    let pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .expect("labels");
    for (key, value) in service["spec"]["selector"].as_object().expect("selector") {
        assert_eq!(
            pod_labels.get(key),
            Some(value),
            "the Service selects the controller Pods"
        );
    }
    let service_port = &service["spec"]["ports"][0];
    assert_eq!(service_port["name"], "metrics");
    assert_eq!(
        service_port["port"].as_i64(),
        Some(8080),
        "the README's port"
    );
    assert!(names_the_port(&service_port["targetPort"]));
}

fn assert_no_wildcards(role: &Value) {
    for (group, resource, verb, _) in grants(role) {
        for part in [&group, &resource, &verb] {
            assert!(
                !part.contains('*'),
                "{} grants a wildcard: {group}/{resource} {verb}",
                name_of(role)
            );
        }
    }
}

fn unnamed(grants: &[Grant]) -> BTreeSet<(String, String, String)> {
    grants
        .iter()
        .filter(|(.., names)| names.is_empty())
        .map(|(g, r, v, _)| (g.clone(), r.clone(), v.clone()))
        .collect()
}

fn triples(list: &[(&str, &str, &[&str])]) -> BTreeSet<(String, String, String)> {
    list.iter()
        .flat_map(|(group, resource, verbs)| {
            verbs
                .iter()
                .map(move |verb| (group.to_string(), resource.to_string(), verb.to_string()))
        })
        .collect()
}

const WRITE_VERBS: &[&str] = &["create", "update", "patch", "delete", "deletecollection"];
const DANGEROUS_VERBS: &[&str] = &["escalate", "bind", "impersonate", "approve", "sign"];

#[test]
fn the_controller_cluster_role_grants_exactly_what_the_controller_uses() {
    let objects = render_base();
    let role = find(&objects, "ClusterRole", "turnstile-controller");
    assert_no_wildcards(role);
    let granted = grants(role);
    assert!(granted.iter().all(|(.., names)| names.is_empty()));
    const READ: &[&str] = &["get", "list", "watch"];
    let expected = triples(&[
        // Watched and cached; finalizers and status are merge-patched; made from a
        // LockTemplate on first use and deleted when unused.
        (
            "turnstile.dev",
            "distributedlocks",
            &["get", "list", "watch", "create", "patch", "delete"],
        ),
        ("turnstile.dev", "locktemplates", READ),
        // Served as locks are, but never made or deleted: they are the cluster admins'.
        (
            "turnstile.dev",
            "clusterdistributedlocks",
            &["get", "list", "watch", "patch"],
        ),
        (
            "turnstile.dev",
            "clusterdistributedlocks/status",
            &["patch"],
        ),
        // Gated Jobs get their claim from the controller.
        (
            "turnstile.dev",
            "lockclaims",
            &["get", "list", "watch", "create", "patch"],
        ),
        ("turnstile.dev", "distributedlocks/status", &["patch"]),
        ("turnstile.dev", "lockclaims/status", &["patch"]),
        // Owners of claims: alive or finished? Gated Pods: their scheduling gate removed.
        ("", "pods", &["get", "list", "watch", "patch"]),
        // Job gating un-suspends Jobs.
        ("batch", "jobs", &["get", "list", "watch", "patch"]),
        ("events.k8s.io", "events", &["create", "patch"]),
        // A namespace being deleted: its objects get no status writes on the way out.
        ("", "namespaces", &["list", "watch"]),
    ]);
    assert_eq!(
        unnamed(&granted),
        expected,
        "update this list only with the e2e RBAC coverage test"
    );

    // Whatever the list becomes, these stay true.
    for (group, resource, verb, _) in &granted {
        let what = format!("{group}/{resource} {verb}");
        assert!(!DANGEROUS_VERBS.contains(&verb.as_str()), "{what}");
        // The one thing it deletes: a lock it made from a LockTemplate, once unused.
        assert!(
            verb != "deletecollection"
                && (verb != "delete"
                    || (group == "turnstile.dev" && resource == "distributedlocks")),
            "the controller deletes nothing but the unused locks it made: {what}"
        );
        assert_ne!(
            resource, "secrets",
            "Secrets reach the controller as env vars, not API reads: {what}"
        );
        assert!(!group.starts_with("rbac.authorization.k8s.io"), "{what}");
        assert!(
            !group.starts_with("apiextensions.k8s.io"),
            "CRDs are installed, not managed: {what}"
        );
        if *verb == "create" {
            assert!(
                matches!(
                    (group.as_str(), resource.as_str()),
                    ("events.k8s.io", "events")
                        | ("turnstile.dev", "lockclaims" | "distributedlocks")
                ),
                "cluster-wide create: {what}"
            );
        }
        if group.is_empty() && resource == "pods" {
            // Read, and patched only to remove a gated Pod's scheduling gate.
            assert!(
                READ.contains(&verb.as_str()) || verb == "patch",
                "Pods are read and patched only: {what}"
            );
        }
    }

    let binding = find(&objects, "ClusterRoleBinding", "turnstile-controller");
    assert_eq!(binding["roleRef"]["kind"], "ClusterRole");
    assert_eq!(binding["roleRef"]["name"], "turnstile-controller");
    assert_eq!(
        binding["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}])
    );
}

#[test]
fn leader_election_is_a_namespaced_role_on_one_named_lease() {
    let objects = render_base();
    assert!(
        objects
            .iter()
            .filter(|o| kind_of(o) == "ClusterRole")
            .flat_map(grants)
            .all(|(_, resource, ..)| resource != "leases"),
        "no cluster-wide Lease access"
    );
    let role = find(&objects, "Role", "turnstile-leader-election");
    assert_no_wildcards(role);
    let granted = grants(role);
    // `create` cannot name its object; everything else is limited to the controller's Lease.
    let expected: BTreeSet<Grant> = [
        ("create", vec![]),
        ("get", vec![DEFAULT_LEASE_NAME.to_string()]),
        ("update", vec![DEFAULT_LEASE_NAME.to_string()]),
    ]
    .into_iter()
    .map(|(verb, names)| {
        (
            "coordination.k8s.io".to_string(),
            "leases".to_string(),
            verb.to_string(),
            names,
        )
    })
    .collect();
    assert_eq!(granted.into_iter().collect::<BTreeSet<_>>(), expected);
    let binding = find(&objects, "RoleBinding", "turnstile-leader-election");
    assert_eq!(binding["roleRef"]["kind"], "Role");
    assert_eq!(binding["roleRef"]["name"], "turnstile-leader-election");
    assert_eq!(binding["subjects"][0]["name"], SERVICE_ACCOUNT);
    assert_eq!(binding["subjects"][0]["namespace"], NAMESPACE);
}

#[test]
fn edit_and_view_users_get_locks_and_claims_through_aggregated_roles() {
    let objects = render_base();
    let aggregated = |label: &str| -> Vec<&Value> {
        objects
            .iter()
            .filter(|o| kind_of(o) == "ClusterRole")
            .filter(|o| {
                o["metadata"]["labels"][format!("rbac.authorization.k8s.io/{label}")] == "true"
            })
            .collect()
    };
    let rules_of = |roles: &[&Value]| -> BTreeSet<(String, String, String)> {
        roles
            .iter()
            .inspect(|role| assert_no_wildcards(role))
            .flat_map(|role| unnamed(&grants(role)))
            .collect()
    };
    let edit = rules_of(&aggregated("aggregate-to-edit"));
    let view = rules_of(&aggregated("aggregate-to-view"));
    let admin = rules_of(&aggregated("aggregate-to-admin"));
    for resource in ["distributedlocks", "lockclaims"] {
        for verb in [
            "get", "list", "watch", "create", "update", "patch", "delete",
        ] {
            let triple = (
                "turnstile.dev".to_string(),
                resource.to_string(),
                verb.to_string(),
            );
            assert!(edit.contains(&triple), "edit lacks {resource} {verb}");
            assert!(admin.contains(&triple), "admin lacks {resource} {verb}");
        }
        for verb in ["get", "list", "watch"] {
            let triple = (
                "turnstile.dev".to_string(),
                resource.to_string(),
                verb.to_string(),
            );
            assert!(view.contains(&triple), "view lacks {resource} {verb}");
        }
    }
    // LockTemplates pick backends and limits for the locks made from them: admin writes them,
    // edit (who may create claims) and view only read them.
    let template = |verb: &str| {
        (
            "turnstile.dev".to_string(),
            "locktemplates".to_string(),
            verb.to_string(),
        )
    };
    for verb in ["create", "update", "patch", "delete"] {
        assert!(
            admin.contains(&template(verb)),
            "admin lacks locktemplates {verb}"
        );
    }
    let edit_only: Vec<_> = aggregated("aggregate-to-edit")
        .into_iter()
        .flat_map(|role| unnamed(&grants(role)))
        .filter(|(_, resource, verb)| {
            resource == "locktemplates" && WRITE_VERBS.contains(&verb.as_str())
        })
        .collect();
    assert!(
        edit_only.is_empty(),
        "edit may write templates: {edit_only:?}"
    );
    assert!(
        view.contains(&template("list")),
        "view lacks locktemplates list"
    );
    for (group, resource, verb) in view {
        assert!(
            !WRITE_VERBS.contains(&verb.as_str()),
            "view may write {group}/{resource} {verb}"
        );
    }
    for (group, resource, verb) in edit.iter().chain(&admin) {
        assert_eq!(
            group, "turnstile.dev",
            "aggregated roles only cover Turnstile's resources"
        );
        assert!(
            !(resource.ends_with("/status") && WRITE_VERBS.contains(&verb.as_str())),
            "tenants may write {resource} ({verb}): status is the controller's"
        );
    }
}

#[test]
fn the_mongo_and_etcd_components_wire_the_url_from_the_users_secret() {
    for (component, variable) in [
        ("mongo", "TURNSTILE_MONGO_URL"),
        ("etcd", "TURNSTILE_ETCD_URL"),
    ] {
        let objects = render_with_component(component);
        let container = controller_container(&objects);
        let env = env_var(container, variable).unwrap_or_else(|| panic!("{variable}"));
        assert!(
            env.get("value").is_none(),
            "{component}: the URL must come from a Secret"
        );
        let secret = format!("turnstile-{component}");
        assert_eq!(
            str_at(env, "/valueFrom/secretKeyRef/name"),
            Some(secret.as_str())
        );
        assert_eq!(str_at(env, "/valueFrom/secretKeyRef/key"), Some("url"));
        let args = strings(container.get("args"));
        assert!(
            args.iter().all(|a| !a.contains(component)),
            "no URL on the command line: {args:?}"
        );
        // The user brings the Secret and the server: the component adds neither.
        assert!(objects
            .iter()
            .all(|o| kind_of(o) != "Secret" && !name_of(o).contains(component)));
        // The controller may reach the server: its port is open in the NetworkPolicy.
        let port = if component == "etcd" { 2379 } else { 27017 };
        let policy = find(&objects, "NetworkPolicy", "turnstile-controller");
        let open = policy["spec"]["egress"]
            .as_array()
            .expect("egress")
            .iter()
            .flat_map(|rule| rule["ports"].as_array().cloned().unwrap_or_default())
            .any(|open| open["port"] == port);
        assert!(open, "{component}: egress to port {port}");
    }
}

#[test]
fn the_finalizer_on_create_component_adds_the_controllers_finalizer_to_new_claims_only() {
    let base = render_base();
    let objects = render_with_component("finalizer-on-create");
    let added: Vec<&Value> = objects
        .iter()
        .filter(|object| !base.contains(object))
        .collect();
    let kinds: Vec<(&str, &str)> = added.iter().map(|o| (kind_of(o), name_of(o))).collect();
    assert_eq!(
        kinds,
        [
            ("MutatingAdmissionPolicy", "turnstile-release-finalizer"),
            (
                "MutatingAdmissionPolicyBinding",
                "turnstile-release-finalizer"
            ),
        ],
        "the component adds the policy and its binding, and changes nothing else"
    );
    let policy = added[0];
    assert_eq!(
        str_at(policy, "/metadata/namespace"),
        None,
        "cluster-scoped"
    );
    let rules = &policy["spec"]["matchConstraints"]["resourceRules"];
    assert_eq!(
        rules,
        &serde_json::json!([{"apiGroups": ["turnstile.dev"], "apiVersions": ["*"],
            "resources": ["lockclaims"], "operations": ["CREATE"]}]),
        "new claims only: the controller removes its finalizer on updates"
    );
    // If the policy fails, the claim is still created; the controller adds the finalizer.
    assert_eq!(str_at(policy, "/spec/failurePolicy"), Some("Ignore"));
    let expression = str_at(policy, "/spec/mutations/0/applyConfiguration/expression")
        .expect("an apply configuration");
    assert!(
        expression.contains(&format!("[\"{FINALIZER}\"]")),
        "{expression} adds {FINALIZER}"
    );
    assert_eq!(
        str_at(added[1], "/spec/policyName"),
        Some("turnstile-release-finalizer")
    );
}

#[test]
fn the_redis_component_wires_the_url_from_a_secret() {
    let objects = render_with_redis();
    let container = controller_container(&objects);
    let env = env_var(container, "TURNSTILE_REDIS_URL").expect("TURNSTILE_REDIS_URL");
    assert!(
        env.get("value").is_none(),
        "the URL must come from a Secret"
    );
    let secret_name = str_at(env, "/valueFrom/secretKeyRef/name").expect("a secretKeyRef");
    let key = str_at(env, "/valueFrom/secretKeyRef/key").expect("a key");
    let secret = find(&objects, "Secret", secret_name);
    assert_eq!(str_at(secret, "/metadata/namespace"), Some(NAMESPACE));
    assert!(
        secret["data"].get(key).is_some(),
        "the Secret {secret_name} has no key {key}"
    );
    let args = strings(container.get("args"));
    assert!(
        args.iter().all(|a| !a.contains("redis")),
        "no URL on the command line: {args:?}"
    );

    // The Redis it points at, reachable only from the controller.
    let redis = find(&objects, "Deployment", "turnstile-redis");
    let service = find(&objects, "Service", "turnstile-redis");
    let redis_labels = &redis["spec"]["template"]["metadata"]["labels"];
    for (label, value) in service["spec"]["selector"].as_object().expect("selector") {
        assert_eq!(&redis_labels[label], value, "the Service selects Redis");
    }
    assert_eq!(service["spec"]["ports"][0]["port"], 6379);
    let policy = find(&objects, "NetworkPolicy", "turnstile-redis");
    assert_eq!(
        policy["spec"]["podSelector"]["matchLabels"],
        redis["spec"]["selector"]["matchLabels"]
    );
    let controller_labels =
        &find(&objects, "Deployment", CONTROLLER)["spec"]["template"]["metadata"]["labels"];
    let from = &policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"];
    for (label, value) in from.as_object().expect("a pod selector") {
        assert_eq!(
            &controller_labels[label], value,
            "only the controller reaches Redis"
        );
    }
    for object in &objects {
        if !CLUSTER_SCOPED.contains(&kind_of(object)) {
            assert_eq!(
                str_at(object, "/metadata/namespace"),
                Some(NAMESPACE),
                "{}",
                name_of(object)
            );
        }
    }
    // The base alone has no Redis.
    let base = render_base();
    assert!(env_var(controller_container(&base), "TURNSTILE_REDIS_URL").is_none());
    assert!(base.iter().all(|o| !name_of(o).contains("redis")));
}

/// The name of the Secret the controller reads `TURNSTILE_REDIS_URL` from.
fn redis_url_secret(objects: &[Value]) -> String {
    let env = env_var(controller_container(objects), "TURNSTILE_REDIS_URL").expect("the env");
    str_at(env, "/valueFrom/secretKeyRef/name")
        .expect("a secretKeyRef")
        .to_owned()
}

#[test]
fn the_component_redis_keeps_no_data_and_a_url_change_rolls_the_controller() {
    let objects = render_with_redis();
    // No persistence: no RDB snapshots, no append-only file, and only an emptyDir for /data.
    let redis = find(&objects, "Deployment", "turnstile-redis");
    let pod = &redis["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(
        strings(container.get("args")),
        ["--save", "", "--appendonly", "no"]
    );
    for volume in pod["volumes"].as_array().expect("volumes") {
        assert!(volume.get("emptyDir").is_some(), "{volume}");
    }
    // kustomize names the generated Secret after its content, and the controller's Pod
    // template names the Secret: a changed URL is a changed template, so a rollout.
    let secret = redis_url_secret(&objects);
    assert!(secret.starts_with("turnstile-redis-"), "{secret}");
    let changed = objects_with_redis_url("redis://elsewhere.example:6379");
    let renamed = redis_url_secret(&changed);
    assert!(renamed.starts_with("turnstile-redis-"), "{renamed}");
    assert_ne!(secret, renamed, "a new URL must rename the Secret");
    find(&changed, "Secret", &renamed);
}

/// The base and a copy of the Redis component whose Secret holds `url` instead, through an
/// overlay: what a user who edits the component's URL renders.
fn objects_with_redis_url(url: &str) -> Vec<Value> {
    const URL: &str = "url=redis://turnstile-redis.turnstile-system.svc:6379";
    let overlay = scratch("deploy-overlay-");
    let root = overlay.path().canonicalize().expect("overlay path");
    let component = repo().join("deploy").join("components").join("redis");
    let copy = root.join("redis");
    std::fs::create_dir(&copy).expect("the component's copy");
    for file in file_names(&component) {
        let text = std::fs::read_to_string(component.join(&file)).expect("component file");
        if file == "kustomization.yaml" {
            assert!(text.contains(URL), "the component's URL literal moved");
        }
        std::fs::write(copy.join(&file), text.replace(URL, &format!("url={url}")))
            .expect("copy the component");
    }
    let deploy = repo().join("deploy").canonicalize().expect("deploy path");
    let kustomization = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\ncomponents:\n  - redis\n",
        relative(&root, &deploy).display()
    );
    std::fs::write(root.join("kustomization.yaml"), kustomization).expect("write the overlay");
    kustomize(&root)
}
