//! What the example tests share: reading an example's documents, a scratch kubeconfig whose
//! context is the test namespace (`Scratch`), playing the Job controller and the kubelet for an
//! example's Pods, running an init container as its Pod would, and the sampler that counts gated
//! Jobs running without their claim `Held`.

use super::*;

pub(crate) const LOCK: &str = "db-migrations";

pub(crate) fn example(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The documents of a multi-document YAML file, as JSON values.
pub(crate) fn documents(yaml: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| Value::deserialize(doc).expect("yaml document"))
        .filter(|doc| !doc.is_null())
        .collect()
}

/// What the fake can serve: everything but RBAC kinds.
pub(crate) fn without_rbac(docs: Vec<Value>) -> Vec<Value> {
    docs.into_iter()
        .filter(|doc| {
            !doc["apiVersion"]
                .as_str()
                .unwrap_or("")
                .starts_with("rbac.authorization.k8s.io/")
        })
        .collect()
}

pub(crate) fn find<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|doc| doc["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in the example"))
}

/// What each test needs besides the [`Env`]: a kubectl cache and a kubeconfig whose current
/// context is the test namespace (as a Pod's in-cluster config would be).
pub(crate) struct Scratch {
    dir: tempfile::TempDir,
    /// A copy of the controller's kubeconfig whose current context is the test namespace.
    pub(crate) kubeconfig: PathBuf,
}

/// Why the tests that run an init container as a process stay on the fake API server.
pub(crate) const PLAYS_THE_KUBELET: &str =
    "it plays the Job controller and the kubelet in step with the init container it runs as a process";

impl Scratch {
    /// A started controller and a scratch kubeconfig for it.
    pub(crate) async fn started() -> (Env, Scratch) {
        Scratch::started_in(Env::started().await)
    }

    /// [`Scratch::started`] on the fake API server, for a test that plays the Job controller
    /// and the kubelet in step with the init container it runs as a process (on a real plane
    /// KWOK would finish the Pod before that process has run).
    pub(crate) async fn started_playing_the_kubelet() -> (Env, Scratch) {
        Scratch::started_in(Env::fake_only_started(PLAYS_THE_KUBELET).await)
    }

    fn started_in(env: Env) -> (Env, Scratch) {
        let scratch = Scratch::new(&env);
        (env, scratch)
    }

    /// `started`, then `lock.yaml` and the example `file` without its RBAC objects applied, as
    /// a reader following the example would; also returns the example's documents.
    pub(crate) async fn with_example(file: &str) -> (Env, Scratch, Vec<Value>) {
        Scratch::with_example_in(Scratch::started().await, file).await
    }

    /// [`Scratch::with_example`] on the fake API server (see [`PLAYS_THE_KUBELET`]).
    pub(crate) async fn with_example_playing_the_kubelet(file: &str) -> (Env, Scratch, Vec<Value>) {
        Scratch::with_example_in(Scratch::started_playing_the_kubelet().await, file).await
    }

    async fn with_example_in(
        (env, scratch): (Env, Scratch),
        file: &str,
    ) -> (Env, Scratch, Vec<Value>) {
        let docs = without_rbac(documents(&example(file)));
        scratch.apply(&env, &documents(&example("lock.yaml"))).await;
        scratch.apply(&env, &docs).await;
        (env, scratch, docs)
    }

    pub(crate) fn new(env: &Env) -> Scratch {
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::copy(&env.kubeconfig, &kubeconfig).expect("copy kubeconfig");
        let status = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["config", "set-context", "--current", "--namespace"])
            .arg(&env.namespace)
            .stdout(Stdio::null())
            .status()
            .expect("kubectl config");
        assert!(status.success(), "kubectl config set-context failed");
        Scratch { dir, kubeconfig }
    }

    pub(crate) fn cache_dir(&self) -> PathBuf {
        self.dir.path().join("kube-cache")
    }

    pub(crate) fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `program` as a container of Pod `pod` would run it: `POD_NAME` from the downward API,
    /// the scratch kubeconfig, output captured, killed if the test ends first.
    pub(crate) fn in_pod(&self, program: impl AsRef<std::ffi::OsStr>, pod: &str) -> Command {
        let mut command = Command::new(program);
        command
            .env("POD_NAME", pod)
            .env("KUBECONFIG", &self.kubeconfig)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    /// `kubectl apply --validate=false -f -` of `docs` in the test namespace.
    pub(crate) async fn apply(&self, env: &Env, docs: &[Value]) {
        let yaml = docs
            .iter()
            .map(|doc| serde_yaml::to_string(doc).expect("yaml"))
            .collect::<Vec<_>>()
            .join("---\n");
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&env.kubeconfig)
            .arg("--cache-dir")
            .arg(self.cache_dir())
            .args(["-n", &env.namespace, "apply", "--validate=false", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn kubectl");
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(yaml.as_bytes()).await.expect("write");
        drop(stdin);
        let output = child.wait_with_output().await.expect("kubectl apply");
        assert!(
            output.status.success(),
            "kubectl apply failed: {}\n{yaml}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// Plays the Job controller: a Pod from the Job's template, owned by the Job. Returns its uid.
pub(crate) async fn start_pod_of_job(env: &Env, job: &str, pod: &str) -> String {
    let job = jobs(env).get(job).await.expect("get job");
    let template = serde_json::to_value(&job.spec.as_ref().expect("spec").template).expect("tpl");
    let object: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": pod,
            "labels": {"job-name": job.metadata.name},
            "ownerReferences": [{
                "apiVersion": "batch/v1", "kind": "Job", "name": job.metadata.name,
                "uid": job.metadata.uid, "controller": true
            }]
        },
        "spec": template["spec"],
    }))
    .expect("pod");
    let created = pods(env)
        .create(&PostParams::default(), &object)
        .await
        .expect("create pod");
    // Init containers run while the Pod is Pending.
    set_pod_phase(env, pod, "Pending").await;
    created.metadata.uid.expect("uid")
}

pub(crate) async fn complete_job(env: &Env, job: &str) {
    finish_job(env, job, "Complete").await;
}

/// The first init container of the Job `job` in the example documents.
pub(crate) fn init_container<'a>(docs: &'a [Value], job: &str) -> &'a Value {
    let job = docs
        .iter()
        .find(|doc| doc["kind"] == "Job" && doc["metadata"]["name"] == job)
        .expect("job in example");
    &job["spec"]["template"]["spec"]["initContainers"][0]
}

/// Waits for a spawned init container; returns (exit code, stdout, stderr).
pub(crate) async fn finished(child: tokio::process::Child) -> (Option<i32>, String, String) {
    let output = tokio::time::timeout(WAIT, child.wait_with_output())
        .await
        .expect("init container finishes in time")
        .expect("init container output");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The init container is still running `for_how_long` from now (it waits for the lock).
pub(crate) async fn still_waiting(child: &mut tokio::process::Child, for_how_long: Duration) {
    // Time: the init container must still be waiting after this long.
    tokio::time::sleep(for_how_long).await;
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "the second Pod's init container must wait while the first Pod holds the lock"
    );
}

/// The stock-kubectl init container's script as written, run as Pod `pod` (`uid`), with the
/// token file on a scratch path instead of the volume. Returns the process and that path.
pub(crate) fn spawn_kubectl_wait_script(
    scratch: &Scratch,
    init: &Value,
    pod: &str,
    uid: &str,
) -> (tokio::process::Child, PathBuf) {
    let token_file = scratch.file(&format!("{pod}.token"));
    let script = init["args"][0]
        .as_str()
        .expect("script")
        .replace("/turnstile/token", &token_file.display().to_string());
    let child = scratch
        .in_pod("/bin/bash", pod)
        .arg("-c")
        .arg(script)
        .env("POD_UID", uid)
        .env("KUBECACHEDIR", scratch.cache_dir())
        .spawn()
        .expect("run the init script");
    (child, token_file)
}

pub(crate) type SpawnInit<'a> = dyn Fn(&str, &str) -> (tokio::process::Child, PathBuf) + 'a;

/// The first Pod of `job`: created, its init container run to success. Returns the Pod's uid,
/// its claim (`Held`), and the init container's stdout; the Pod is then `Running`.
pub(crate) async fn first_pod_takes_the_lock(
    env: &Env,
    job: &str,
    pod: &str,
    spawn_init: &SpawnInit<'_>,
) -> (String, LockClaim, String) {
    let uid = start_pod_of_job(env, job, pod).await;
    let (child, token_file) = spawn_init(pod, &uid);
    let (code, stdout, stderr) = finished(child).await;
    assert_eq!(code, Some(0), "init container failed: {stdout}\n{stderr}");
    let claim = env
        .wait_phase(&format!("{pod}-{LOCK}"), ClaimPhase::Held)
        .await;
    assert_eq!(
        std::fs::read_to_string(&token_file)
            .expect("token file")
            .trim(),
        token_of(&claim).expect("token").to_string()
    );
    set_pod_phase(env, pod, "Running").await;
    (uid, claim, stdout)
}

/// A second Pod of `job` (a retry, or parallelism) waits in its init container until
/// `end_first` ends the first Pod, then gets a token above `first_token`.
pub(crate) async fn second_pod_waits_for_the_first(
    env: &Env,
    job: &str,
    pod: &str,
    spawn_init: &SpawnInit<'_>,
    first_token: i64,
    end_first: impl std::future::Future<Output = ()>,
) {
    let uid = start_pod_of_job(env, job, pod).await;
    let (mut child, token_file) = spawn_init(pod, &uid);
    env.wait_claim(&format!("{pod}-{LOCK}"), |c| position_of(c) == Some(1))
        .await;
    still_waiting(&mut child, Duration::from_secs(2)).await;
    end_first.await;
    let (code, stdout, stderr) = finished(child).await;
    assert_eq!(
        code,
        Some(0),
        "second init container failed: {stdout}\n{stderr}"
    );
    let token: i64 = std::fs::read_to_string(&token_file)
        .expect("token file")
        .trim()
        .parse()
        .expect("token");
    assert!(token > first_token);
}

/// Samples the Jobs and claims of the namespace; counts Jobs seen running (not suspended,
/// not finished) while their claim was not `Held`, and samples with two gated Jobs running.
pub(crate) struct GateMonitor {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<(usize, usize, usize)>,
}

impl GateMonitor {
    pub(crate) fn start(env: &Env) -> GateMonitor {
        let jobs = jobs(env);
        let claims = env.claims();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let (mut samples, mut ungated, mut overlapping) = (0, 0, 0);
            loop {
                let listed_jobs = jobs.list(&Default::default()).await;
                let listed_claims = claims.list(&Default::default()).await;
                if let (Ok(jobs), Ok(claims)) = (listed_jobs, listed_claims) {
                    samples += 1;
                    let mut running = 0;
                    for job in &jobs.items {
                        let Some(lock) = job
                            .metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get(LOCK_ANNOTATION))
                        else {
                            continue;
                        };
                        let suspended = job.spec.as_ref().and_then(|s| s.suspend) == Some(true);
                        let done = job
                            .status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .is_some_and(|c| c.iter().any(|c| c.type_ == "Complete"));
                        if suspended || done {
                            continue;
                        }
                        running += 1;
                        let name = format!("{}-{lock}", job.metadata.name.as_deref().unwrap_or(""));
                        // Claims are listed after Jobs: a Job seen running had its claim
                        // Held before; by now it may have been released (the Job finished).
                        let held = claims.items.iter().any(|c: &LockClaim| {
                            c.metadata.name.as_deref() == Some(name.as_str())
                                && matches!(
                                    phase_of(c),
                                    Some(ClaimPhase::Held | ClaimPhase::Released)
                                )
                        });
                        if !held {
                            ungated += 1;
                        }
                    }
                    if running > 1 {
                        overlapping += 1;
                    }
                }
                tokio::select! {
                    _ = &mut stopped => break,
                    () = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
            }
            (samples, ungated, overlapping)
        });
        GateMonitor { stop, task }
    }

    pub(crate) async fn finish(self) {
        let _ = self.stop.send(());
        let (samples, ungated, overlapping) = self.task.await.expect("monitor");
        assert!(samples > 0, "the monitor took no samples");
        assert_eq!(ungated, 0, "a gated Job ran without its claim Held");
        assert_eq!(overlapping, 0, "two gated Jobs ran at once on a mutex");
    }
}

/// The verbs `role` (a Role in `docs`) grants on `lockclaims`.
pub(crate) fn lockclaim_verbs(docs: &[Value], role: &str) -> BTreeSet<String> {
    let role = docs
        .iter()
        .find(|doc| doc["kind"] == "Role" && doc["metadata"]["name"] == role)
        .expect("the Role");
    role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .filter(|rule| rule["resources"] == json!(["lockclaims"]))
        .flat_map(|rule| rule["verbs"].as_array().expect("verbs").clone())
        .map(|verb| verb.as_str().expect("a verb").to_owned())
        .collect()
}
