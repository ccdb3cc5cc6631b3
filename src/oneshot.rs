//! Plumbing shared by the one-shot commands `turnstile wait` and `turnstile lock` (as opposed
//! to the long-running `turnstile run`): their logging and how they report their outcome —
//! an exit code scripts can branch on, plus one line on stderr saying why.

use std::io::{IsTerminal, Write};

use kube::Api;
use turnstile_api::error_chain;
use turnstile_api::{DistributedLock, LockClaim};

/// How a one-shot command ended: the process exit code and, unless it succeeded quietly, one
/// line for people on stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The process exit code.
    pub code: u8,
    /// Why, for people (printed as `turnstile: <reason>` on stderr); `None` prints nothing.
    pub reason: Option<String>,
}

impl Outcome {
    /// Ends with `code` and prints nothing.
    pub fn quiet(code: u8) -> Self {
        Outcome { code, reason: None }
    }

    /// Ends with `code` and prints `turnstile: <reason>` on stderr.
    pub fn with_reason(code: u8, reason: impl Into<String>) -> Self {
        Outcome {
            code,
            reason: Some(reason.into()),
        }
    }

    /// Ends with `code` and the reason `cannot <doing>: <error and its causes>`.
    pub fn cannot(
        code: u8,
        doing: impl std::fmt::Display,
        error: &(dyn std::error::Error + 'static),
    ) -> Self {
        Outcome::with_reason(code, format!("cannot {doing}: {}", error_chain(error)))
    }

    /// Prints the reason, flushes stdout (it may carry the command's result) and exits the
    /// process with the code. Called by the CLI after every resource (locks, child processes)
    /// has been cleaned up: the exit skips destructors.
    pub fn exit(self) -> ! {
        if let Some(reason) = &self.reason {
            eprintln!("turnstile: {reason}");
        }
        let _ = std::io::stdout().flush();
        std::process::exit(i32::from(self.code))
    }
}

/// Logs to stderr (stdout is reserved for the commands' results), warnings and errors only
/// unless `RUST_LOG` says otherwise. The kube client's own log of a failed request is off by
/// default: the failure reaches the user once, as the command's one `turnstile:` line.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,kube_client=off"));
    // A subscriber installed earlier (tests, embedding) wins.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // No colour codes in container logs.
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// A client from the environment (in-cluster or `KUBECONFIG`) and the namespace to work in:
/// `namespace` when given and not empty, else the client's default. On failure, the outcome
/// to end with (`error_exit`, one line naming the cause).
pub async fn client_in_namespace(
    namespace: Option<&str>,
    error_exit: u8,
) -> Result<(kube::Client, String), Outcome> {
    let client = kube::Client::try_default().await.map_err(|error| {
        Outcome::cannot(
            error_exit,
            "configure a Kubernetes client (in-cluster or KUBECONFIG)",
            &error,
        )
    })?;
    let namespace = namespace
        .filter(|namespace| !namespace.is_empty())
        .map_or_else(|| client.default_namespace().to_owned(), str::to_owned);
    Ok((client, namespace))
}

/// The namespace a one-shot command works in, its DistributedLocks and its LockClaims.
pub type NamespaceApis = (String, Api<DistributedLock>, Api<LockClaim>);

/// [`client_in_namespace`], with the APIs of that namespace's locks and claims. On failure,
/// the outcome to end with (`error_exit`, one line naming the cause).
pub async fn namespace_apis(
    namespace: Option<&str>,
    error_exit: u8,
) -> Result<NamespaceApis, Outcome> {
    let (client, namespace) = client_in_namespace(namespace, error_exit).await?;
    let locks = Api::namespaced(client.clone(), &namespace);
    let claims = Api::namespaced(client, &namespace);
    Ok((namespace, locks, claims))
}

/// The DistributedLock `name` of `namespace`; on failure the outcome to end with:
/// `not_found_exit` when it does not exist, `error_exit` when it cannot be read (one line
/// naming the cause either way).
pub async fn existing_lock(
    locks: &Api<DistributedLock>,
    name: &str,
    namespace: &str,
    error_exit: u8,
    not_found_exit: u8,
) -> Result<DistributedLock, Outcome> {
    match locks.get_opt(name).await {
        Ok(Some(lock)) => Ok(lock),
        Ok(None) => Err(Outcome::with_reason(
            not_found_exit,
            format!("DistributedLock {name} does not exist in namespace {namespace}"),
        )),
        Err(error) => Err(Outcome::cannot(
            error_exit,
            format!("read DistributedLock {name} in namespace {namespace}"),
            &error,
        )),
    }
}
