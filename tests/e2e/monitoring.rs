//! The monitoring component, `deploy/components/monitoring`, rendered through an overlay with
//! the kubectl on PATH: its ServiceMonitor scrapes the metrics Service's port, its
//! PrometheusRule passes `promtool check rules` and the unit cases in
//! `tests/monitoring/alerts.test.yaml` (`promtool test rules`, one firing case at least for
//! every alert), its dashboard is a labelled ConfigMap whose every query is valid PromQL, and
//! every metric, label and label value the rules and the dashboard use is one a running
//! controller (in-process, against the fake API server) serves on `/metrics`.
//!
//! The ServiceMonitor and the PrometheusRule also pass the Prometheus Operator's API schemas
//! (generated from its Go types; `tests/monitoring/operator_schemas.mjs`, Node.js).
//!
//! promtool comes from Debian's `prometheus` package and the Operator's schemas from npm
//! (`.ci/install`). Without them those tests say so and pass, except under `CI=true`, where
//! they fail.

use crate::deploy;
use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use deploy::{find, render_with_component, repo, str_at, strings};
use serde_json::{json, Value};
use support::child::output_with_input;
use support::scrape::get;
use support::scratch::scratch;
use support::Env;

const NAMESPACE: &str = "turnstile-system";
/// The `job` of the controller's series: the ServiceMonitor's Service.
const JOB: &str = "turnstile-controller-metrics";
/// Labels Prometheus adds to every scraped series (not the controller's own).
const TARGET_LABELS: [&str; 2] = ["job", "instance"];

fn rendered() -> Vec<Value> {
    render_with_component("monitoring")
}

/// `promtool`, or None after saying why (a failure under `CI=true`).
fn promtool(test: &str) -> Option<PathBuf> {
    test_servers::tool_or_skip(
        "promtool",
        test,
        "Debian package `prometheus`; `bash .ci/install` installs it",
    )
}

fn run_promtool(promtool: &Path, dir: &Path, args: &[&str]) -> String {
    let output = Command::new(promtool)
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "promtool {} failed:\n{text}",
        args.join(" ")
    );
    text
}

fn prometheus_rule(objects: &[Value]) -> &Value {
    find(objects, "PrometheusRule", "turnstile-controller")
}

/// The PrometheusRule's `spec` (its `groups`), the rules file promtool reads.
fn rules_file(objects: &[Value]) -> String {
    let spec = &prometheus_rule(objects)["spec"];
    serde_yaml::to_string(&json!({ "groups": spec["groups"] })).expect("rules as YAML")
}

/// Every rule of the PrometheusRule: (alert name, expression).
fn alerts(objects: &[Value]) -> Vec<(String, String)> {
    let groups = prometheus_rule(objects)["spec"]["groups"]
        .as_array()
        .expect("groups");
    groups
        .iter()
        .flat_map(|group| group["rules"].as_array().expect("rules").iter())
        .map(|rule| {
            (
                str_at(rule, "/alert")
                    .expect("only alerting rules")
                    .to_string(),
                str_at(rule, "/expr").expect("an expression").to_string(),
            )
        })
        .collect()
}

fn dashboard(objects: &[Value]) -> Value {
    let map = find(objects, "ConfigMap", "turnstile-dashboard");
    let text = str_at(map, "/data/turnstile.json").expect("data turnstile.json");
    serde_json::from_str(text).expect("the dashboard is JSON")
}

/// Every panel of the dashboard, rows' nested panels included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        out.push(panel);
        if let Some(nested) = panel["panels"].as_array() {
            out.extend(nested);
        }
    }
    out
}

/// Every query of the dashboard: (panel title, expression).
fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    panels(dashboard)
        .into_iter()
        .flat_map(|panel| {
            let title = str_at(panel, "/title").unwrap_or_default().to_string();
            panel["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(move |target| {
                    Some((title.clone(), str_at(target, "/expr")?.to_string()))
                })
        })
        .collect()
}

/// A dashboard query as Prometheus receives it from Grafana.
fn as_promql(expr: &str) -> String {
    expr.replace("$__rate_interval", "2m").replace("$job", JOB)
}

/// Where `.ci/install` put the Prometheus Operator's schemas (`npm ci` of
/// `tests/monitoring/operator-schemas`), or None after saying why (a failure under `CI=true`).
fn operator_schemas(test: &str) -> Option<(PathBuf, PathBuf)> {
    let node = test_servers::tool_or_skip("node", test, "Node.js; this machine's kind has it")?;
    let dir = std::env::var_os("TURNSTILE_MONITORING_SCHEMAS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/turnstile-monitoring-schemas"));
    if !dir
        .join("node_modules/@kubernetes-models/prometheus-operator")
        .is_dir()
    {
        test_servers::skip_or_fail(
            test,
            &format!(
                "no Prometheus Operator schemas in {} (npm; `bash .ci/install` installs them)",
                dir.display()
            ),
            test_servers::under_ci(),
        );
        return None;
    }
    Some((node, dir))
}

/// `tests/monitoring/operator_schemas.mjs` on `objects`: whether every one passed, and its lines.
fn validate_against_the_operator(node: &Path, dir: &Path, objects: &[Value]) -> (bool, String) {
    let mut node = Command::new(node);
    node.arg(repo().join("tests/monitoring/operator_schemas.mjs"))
        .arg(dir);
    let input = serde_json::to_vec(objects).expect("objects as JSON");
    let output = output_with_input(&mut node, &input, "node");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        matches!(output.status.code(), Some(0 | 1)),
        "the validator itself failed:\n{text}"
    );
    (output.status.success(), text)
}

#[test]
fn the_service_monitor_and_rule_pass_the_prometheus_operators_api_schemas() {
    let test = "the_service_monitor_and_rule_pass_the_prometheus_operators_api_schemas";
    let Some((node, dir)) = operator_schemas(test) else {
        return;
    };
    let objects = rendered();
    let (ok, text) = validate_against_the_operator(&node, &dir, &objects);
    assert!(ok, "the Operator's schemas refuse the component:\n{text}");
    let passed: BTreeSet<&str> = text.lines().filter_map(|l| l.strip_prefix("ok ")).collect();
    assert_eq!(
        passed,
        BTreeSet::from([
            "PrometheusRule/turnstile-controller",
            "ServiceMonitor/turnstile-controller"
        ]),
        "{text}"
    );

    // The control: mistakes the schemas must catch, each named by its field.
    let monitor = find(&objects, "ServiceMonitor", "turnstile-controller").clone();
    let rule = prometheus_rule(&objects).clone();
    let broken = |object: &Value, pointer: &str, value: Option<Value>| {
        let mut object = object.clone();
        let (parent, key) = pointer.rsplit_once('/').expect("a field");
        let parent = object.pointer_mut(parent).expect("the field's parent");
        match value {
            Some(value) => parent[key] = value,
            None => {
                parent.as_object_mut().expect("an object").remove(key);
            }
        }
        object
    };
    for (object, pointer, value, said) in [
        (
            &monitor,
            "/spec/endpoints/0/port",
            Some(json!(8080)),
            "port must be string",
        ),
        (
            &monitor,
            "/spec/endpoints/0/scheme",
            Some(json!("ftp")),
            "scheme",
        ),
        (
            &rule,
            "/spec/groups/0/rules/0/expr",
            None,
            "required property expr",
        ),
        (
            &rule,
            "/spec/groups/0/rules/0/for",
            Some(json!("5 minutes")),
            "for must match",
        ),
    ] {
        let (ok, text) =
            validate_against_the_operator(&node, &dir, &[broken(object, pointer, value)]);
        assert!(
            !ok && text.contains(said),
            "{pointer}: expected {said:?}, got:\n{text}"
        );
    }
}

#[test]
fn the_service_monitor_scrapes_the_metrics_port_of_the_controller_service() {
    let objects = rendered();
    let monitor = find(&objects, "ServiceMonitor", "turnstile-controller");
    let service = find(&objects, "Service", "turnstile-controller-metrics");
    assert_eq!(str_at(monitor, "/metadata/namespace"), Some(NAMESPACE));
    assert_eq!(
        strings(monitor.pointer("/spec/namespaceSelector/matchNames")),
        [NAMESPACE]
    );
    let selector = monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels");
    assert!(!selector.is_empty());
    for (key, value) in selector {
        assert_eq!(
            service["metadata"]["labels"].get(key),
            Some(value),
            "the Service lacks the ServiceMonitor's label {key}"
        );
    }
    let ports: Vec<&str> = service["spec"]["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .filter_map(|port| port["name"].as_str())
        .collect();
    let endpoints = monitor["spec"]["endpoints"].as_array().expect("endpoints");
    assert_eq!(endpoints.len(), 1);
    let port = str_at(&endpoints[0], "/port").expect("an endpoint port name");
    assert!(ports.contains(&port), "no Service port {port} in {ports:?}");
    assert_eq!(str_at(&endpoints[0], "/path"), Some("/metrics"));
    assert_eq!(str_at(&endpoints[0], "/interval"), Some("30s"));
    // The job the rules select on is the Service's name (no jobLabel override).
    assert!(monitor["spec"].get("jobLabel").is_none());
    assert_eq!(str_at(service, "/metadata/name"), Some(JOB));
}

#[test]
fn the_rules_pass_promtool_check_and_every_unit_case() {
    let Some(promtool) = promtool("the_rules_pass_promtool_check_and_every_unit_case") else {
        return;
    };
    let objects = rendered();
    let dir = scratch("promtool-");
    std::fs::write(dir.path().join("rules.yaml"), rules_file(&objects)).expect("write rules");
    std::fs::copy(
        repo().join("tests/monitoring/alerts.test.yaml"),
        dir.path().join("alerts.test.yaml"),
    )
    .expect("copy the unit cases");
    let checked = run_promtool(&promtool, dir.path(), &["check", "rules", "rules.yaml"]);
    let count = alerts(&objects).len();
    assert!(
        checked.contains(&format!("SUCCESS: {count} rules found")),
        "{checked}"
    );
    let tested = run_promtool(
        &promtool,
        dir.path(),
        &["test", "rules", "alerts.test.yaml"],
    );
    assert!(tested.contains("SUCCESS"), "{tested}");
    println!("{checked}{tested}");
}

#[test]
fn every_alert_has_a_unit_case_that_fires_it_and_one_that_does_not() {
    let objects = rendered();
    let text = std::fs::read_to_string(repo().join("tests/monitoring/alerts.test.yaml"))
        .expect("read the unit cases");
    let cases: Value = serde_yaml::from_str(&text).expect("YAML");
    assert_eq!(strings(cases.get("rule_files")), ["rules.yaml"]);
    let mut firing = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for test in cases["tests"].as_array().expect("tests") {
        for case in test["alert_rule_test"].as_array().into_iter().flatten() {
            let name = str_at(case, "/alertname").expect("alertname").to_string();
            match case["exp_alerts"].as_array() {
                Some(expected) if !expected.is_empty() => firing.insert(name),
                _ => quiet.insert(name),
            };
        }
    }
    let names: BTreeSet<String> = alerts(&objects).into_iter().map(|(name, _)| name).collect();
    assert!(names.len() >= 5, "{names:?}");
    for name in &names {
        assert!(firing.contains(name), "no unit case expects {name} to fire");
        assert!(
            quiet.contains(name),
            "no unit case expects {name} to stay quiet"
        );
    }
    let unknown: Vec<_> = firing
        .union(&quiet)
        .filter(|n| !names.contains(*n))
        .collect();
    assert!(
        unknown.is_empty(),
        "cases for alerts that do not exist: {unknown:?}"
    );
    for required in [
        "TurnstileNoLeader",
        "TurnstileBackendUnavailable",
        "TurnstileClaimsStuck",
        "TurnstileLockLosses",
        "TurnstileReconcileErrors",
    ] {
        assert!(names.contains(required), "no alert {required}");
    }
    // Every rule selects the ServiceMonitor's job and says how bad it is.
    for (name, expr) in alerts(&objects) {
        assert!(
            expr.matches("turnstile_").count() == expr.matches(&format!("job=\"{JOB}\"")).count(),
            "{name}: every selector should select job=\"{JOB}\": {expr}"
        );
    }
    for rule in prometheus_rule(&objects)["spec"]["groups"][0]["rules"]
        .as_array()
        .expect("rules")
    {
        assert!(
            str_at(rule, "/labels/severity").is_some(),
            "{rule}: no severity"
        );
        assert!(str_at(rule, "/annotations/summary").is_some(), "{rule}");
        assert!(str_at(rule, "/annotations/description").is_some(), "{rule}");
    }
}

#[test]
fn the_dashboard_is_a_labelled_config_map_with_the_panels_operators_need() {
    let objects = rendered();
    let map = find(&objects, "ConfigMap", "turnstile-dashboard");
    assert_eq!(str_at(map, "/metadata/namespace"), Some(NAMESPACE));
    assert_eq!(str_at(map, "/metadata/labels/grafana_dashboard"), Some("1"));
    let board = dashboard(&objects);
    assert_eq!(str_at(&board, "/uid"), Some("turnstile"));
    let queries = dashboard_queries(&board);
    let uses = |metric: &str| queries.iter().any(|(_, expr)| expr.contains(metric));
    // Every panel the README lists, in its order.
    for metric in [
        "turnstile_grants_total",
        "turnstile_releases_total",
        "turnstile_expiries_total",
        "turnstile_renewals_total",
        "turnstile_wait_seconds_bucket",
        "turnstile_hold_seconds_bucket",
        "turnstile_queue_depth",
        "turnstile_lock_lost_total",
        "turnstile_backend_errors_total",
        "turnstile_reconcile_total",
        "turnstile_reconcile_errors_total",
        "turnstile_reconcile_duration_seconds_bucket",
        "turnstile_leader",
        "turnstile_invalid_objects",
    ] {
        assert!(uses(metric), "no panel shows {metric}");
    }
    let by = |metric: &str, label: &str| {
        queries
            .iter()
            .any(|(_, expr)| expr.contains(metric) && expr.contains(&format!("by ({label})")))
    };
    assert!(
        by("turnstile_lock_lost_total", "backend, cause"),
        "lock losses by cause"
    );
    assert!(
        by("turnstile_backend_errors_total", "backend, operation"),
        "backend errors by operation"
    );
    assert!(
        queries
            .iter()
            .any(|(_, expr)| expr.contains("histogram_quantile(0.99,")
                && expr.contains("turnstile_reconcile_duration_seconds_bucket")),
        "no p99 of the reconcile duration"
    );
    for quantile in ["0.5", "0.9", "0.99"] {
        for metric in [
            "turnstile_wait_seconds_bucket",
            "turnstile_hold_seconds_bucket",
        ] {
            assert!(
                queries.iter().any(|(_, expr)| expr
                    .contains(&format!("histogram_quantile({quantile},"))
                    && expr.contains(metric)),
                "no p{quantile} of {metric}"
            );
        }
    }
    // Panel ids are unique (Grafana keys panels by id).
    let ids: Vec<i64> = panels(&board)
        .iter()
        .filter_map(|panel| panel["id"].as_i64())
        .collect();
    assert_eq!(ids.len(), panels(&board).len(), "a panel without an id");
    assert_eq!(ids.iter().collect::<BTreeSet<_>>().len(), ids.len());
}

#[test]
fn every_dashboard_query_is_valid_promql() {
    let Some(promtool) = promtool("every_dashboard_query_is_valid_promql") else {
        return;
    };
    let objects = rendered();
    let queries = dashboard_queries(&dashboard(&objects));
    assert!(!queries.is_empty());
    // promtool parses the queries as recording rules.
    let rules: Vec<Value> = queries
        .iter()
        .enumerate()
        .map(|(i, (_, expr))| json!({"record": format!("dashboard:query_{i}"), "expr": as_promql(expr)}))
        .collect();
    let dir = scratch("promtool-dashboard-");
    let file = json!({"groups": [{"name": "dashboard", "rules": rules}]});
    std::fs::write(
        dir.path().join("dashboard.yaml"),
        serde_yaml::to_string(&file).expect("YAML"),
    )
    .expect("write");
    let checked = run_promtool(&promtool, dir.path(), &["check", "rules", "dashboard.yaml"]);
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", queries.len())),
        "{checked}"
    );
}

/// One metric selector in a PromQL expression: a `turnstile_*` name and its label matchers
/// (label, operator, value).
#[derive(Debug)]
struct Selector {
    name: String,
    matchers: Vec<(String, String, String)>,
}

/// The `turnstile_*` selectors of `expr`, and the labels of its `by (…)` clauses.
fn selectors(expr: &str) -> (Vec<Selector>, Vec<String>) {
    let bytes = expr.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let mut found = Vec::new();
    let mut grouping = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if !word(bytes[i]) || (i > 0 && word(bytes[i - 1])) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && word(bytes[i]) {
            i += 1;
        }
        let ident = &expr[start..i];
        if ident == "by" || ident == "without" {
            let rest = expr[i..].trim_start();
            if let Some(inner) = rest.strip_prefix('(') {
                let close = inner.find(')').expect("a closing parenthesis");
                grouping.extend(
                    inner[..close]
                        .split(',')
                        .map(|label| label.trim().to_string())
                        .filter(|label| !label.is_empty()),
                );
            }
            continue;
        }
        if !ident.starts_with("turnstile_") {
            continue;
        }
        let mut matchers = Vec::new();
        if expr[i..].starts_with('{') {
            let close = expr[i..].find('}').expect("a closing brace") + i;
            for matcher in expr[i + 1..close]
                .split(',')
                .filter(|m| !m.trim().is_empty())
            {
                let at = matcher
                    .find(['=', '!'])
                    .unwrap_or_else(|| panic!("a matcher: {matcher}"));
                let label = matcher[..at].trim().to_string();
                let rest = &matcher[at..];
                let op_len =
                    if rest.starts_with("=~") || rest.starts_with("!=") || rest.starts_with("!~") {
                        2
                    } else {
                        1
                    };
                let value = rest[op_len..].trim().trim_matches('"').to_string();
                matchers.push((label, rest[..op_len].to_string(), value));
            }
            i = close + 1;
        }
        found.push(Selector {
            name: ident.to_string(),
            matchers,
        });
    }
    (found, grouping)
}

/// Every sample of an exposition: series name → the label sets it is served with.
fn exposition(text: &str) -> BTreeMap<String, Vec<BTreeMap<String, String>>> {
    let mut out: BTreeMap<String, Vec<BTreeMap<String, String>>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = line[..end].to_string();
        let mut labels = BTreeMap::new();
        if line[end..].starts_with('{') {
            let close = line.find('}').expect("a closing brace");
            for pair in line[end + 1..close].split(',').filter(|p| !p.is_empty()) {
                let (key, value) = pair.split_once('=').expect("label=value");
                labels.insert(key.to_string(), value.trim_matches('"').to_string());
            }
        }
        out.entry(name).or_default().push(labels);
    }
    out
}

#[test]
fn the_selector_reader_finds_names_matchers_and_grouping_labels() {
    let (found, grouping) = selectors(
        r#"sum by (backend, le) (rate(turnstile_wait_seconds_bucket{job="j",operation=~"a|b"}[5m])) unless turnstile_leader"#,
    );
    assert_eq!(grouping, ["backend", "le"]);
    assert_eq!(found.len(), 2);
    assert_eq!(found[0].name, "turnstile_wait_seconds_bucket");
    assert_eq!(
        found[0].matchers,
        [
            ("job".to_string(), "=".to_string(), "j".to_string()),
            ("operation".to_string(), "=~".to_string(), "a|b".to_string())
        ]
    );
    assert_eq!(found[1].name, "turnstile_leader");
    assert!(found[1].matchers.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_rules_and_the_dashboard_use_is_served_by_a_running_controller() {
    let objects = rendered();
    let mut queries: Vec<(String, String)> = alerts(&objects);
    queries.extend(dashboard_queries(&dashboard(&objects)));

    let mut env = Env::new().await;
    let addr = env.start_controller_serving_metrics();
    // One grant, so the controller has done real work before the scrape.
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.apply_claim("a", "db", "");
    env.wait_phase("a", turnstile_api::ClaimPhase::Held).await;
    let answer = get(addr, "/metrics").await;
    assert_eq!(answer.status, 200);
    env.stop_controller().await;
    let served = exposition(&answer.body);
    assert!(
        served.contains_key("turnstile_grants_total"),
        "{}",
        answer.body
    );

    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    for (what, expr) in &queries {
        let (found, grouping) = selectors(expr);
        assert!(!found.is_empty(), "{what}: no turnstile metric in {expr}");
        let mut labels_here = BTreeSet::new();
        for selector in &found {
            used.insert(selector.name.clone());
            let Some(series) = served.get(&selector.name) else {
                problems.push(format!("{what}: {} is not served", selector.name));
                continue;
            };
            labels_here.extend(series.iter().flat_map(|labels| labels.keys().cloned()));
            for (label, op, value) in &selector.matchers {
                if TARGET_LABELS.contains(&label.as_str()) {
                    continue;
                }
                let values: BTreeSet<&str> = series
                    .iter()
                    .filter_map(|labels| labels.get(label).map(String::as_str))
                    .collect();
                if values.is_empty() {
                    problems.push(format!("{what}: {} has no label {label}", selector.name));
                    continue;
                }
                let wanted: Vec<&str> = match op.as_str() {
                    "=" | "!=" => vec![value.as_str()],
                    _ => value.split('|').collect(),
                };
                for want in wanted {
                    if !values.contains(want) {
                        problems.push(format!(
                            "{what}: {}{{{label}{op}\"{value}\"}}: no {label}=\"{want}\" served (served: {values:?})",
                            selector.name
                        ));
                    }
                }
            }
        }
        for label in grouping {
            if !TARGET_LABELS.contains(&label.as_str()) && !labels_here.contains(&label) {
                problems.push(format!("{what}: groups by {label}, which its metrics lack"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{problems:#?}\nserved:\n{}",
        answer.body
    );
    println!("checked against /metrics: {used:?}");
}
