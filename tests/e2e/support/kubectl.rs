//! [`Env`]'s `kubectl`: running it on the test's namespace, and applying locks and claims
//! from YAML as a user would.

use super::*;

impl Env {
    /// Runs `kubectl ARGS -n NAMESPACE`; returns the output (not checked).
    pub fn kubectl_output(&self, args: &[&str]) -> Output {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("-n")
            .arg(&self.namespace)
            .args(args)
            .output()
            .expect("run kubectl")
    }

    /// Runs `kubectl ARGS -n NAMESPACE` and returns stdout; panics on failure.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let output = self.kubectl_output(args);
        assert!(
            output.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("utf-8")
    }

    /// A merge patch of `object` (`kind/name`) with `patch`, by `kubectl patch`; asserts the
    /// API server refuses it with `message` in the error (`why` says what was refused).
    pub fn assert_patch_refused(&self, object: &str, patch: &str, why: &str, message: &str) {
        let output = self.kubectl_output(&["patch", object, "--type=merge", "-p", patch]);
        assert!(!output.status.success(), "{why}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(message), "{stderr}");
    }

    /// A `kubectl` command (with kubeconfig and namespace) to spawn.
    pub fn kubectl_command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("kubectl");
        command
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("-n")
            .arg(&self.namespace)
            .args(args);
        command
    }

    /// `kubectl apply -f -` with `yaml` on stdin; returns the output.
    pub fn kubectl_apply_output(&self, yaml: &str) -> Output {
        let mut apply = self.kubectl_command(&["apply", "-f", "-"]);
        child::output_with_input(&mut apply, yaml.as_bytes(), "kubectl apply")
    }

    /// `kubectl apply -f -` with `yaml`; panics on failure.
    pub fn apply(&self, yaml: &str) {
        let output = self.kubectl_apply_output(yaml);
        assert!(
            output.status.success(),
            "kubectl apply failed: {}\n{yaml}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Applies a lock.
    pub fn apply_lock(&self, name: &str, spec: &str) {
        self.apply(&format!(
            "apiVersion: turnstile.dev/v1alpha1\nkind: DistributedLock\nmetadata:\n  name: {name}\nspec:\n{}",
            indent(spec)
        ));
    }

    /// Applies the locks `names`, each with `spec`.
    pub fn apply_locks(&self, names: &[&str], spec: &str) {
        for name in names {
            self.apply_lock(name, spec);
        }
    }

    /// Applies a claim on `lock` with extra spec lines.
    pub fn apply_claim(&self, name: &str, lock: &str, extra_spec: &str) {
        self.apply(&format!(
            "apiVersion: turnstile.dev/v1alpha1\nkind: LockClaim\nmetadata:\n  name: {name}\nspec:\n  lockName: {lock}\n{}",
            indent(extra_spec)
        ));
    }
}

fn indent(spec: &str) -> String {
    spec.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| format!("  {}\n", line.trim()))
        .collect()
}
