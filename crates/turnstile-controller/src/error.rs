//! Typed errors of the controller.

/// What can make a reconcile pass (or the controller) fail.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// A request to the Kubernetes API failed (409 Conflict on a stale write included: the
    /// pass is retried with fresh state).
    #[error("Kubernetes API request failed while {action}: {source}")]
    Kube {
        /// What the controller was doing.
        action: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// A patch could not be built.
    #[error("cannot serialize {what}: {source}")]
    Serialize {
        /// What was serialized.
        what: &'static str,
        /// The serializer's error.
        #[source]
        source: serde_json::Error,
    },
    /// The metrics endpoint could not be served (its address taken, say).
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
    /// This replica lost the leadership, so the pass stopped before a write.
    #[error("not the leader any more; skipped {action}")]
    NotLeader {
        /// The write that was skipped.
        action: String,
    },
    /// The controller was configured with something it cannot use.
    #[error("invalid controller configuration: {0}")]
    Config(String),
}

impl ControllerError {
    /// Wraps a client error with what the controller was doing.
    pub fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        ControllerError::Kube {
            action: action.into(),
            source,
        }
    }

    /// Whether the pass stopped because this replica lost the leadership.
    pub fn is_not_leader(&self) -> bool {
        matches!(self, ControllerError::NotLeader { .. })
    }

    /// Whether this is an API 409 Conflict (someone wrote the object after we read it).
    pub fn is_conflict(&self) -> bool {
        matches!(
            self,
            ControllerError::Kube {
                source: kube::Error::Api(status),
                ..
            } if status.code == 409
        )
    }

    /// Logs a failed pass over `object` (`kind/namespace/name`) that is retried in `retry_in`:
    /// optimistic-concurrency conflicts are routine (the retry reads fresh state) and go to
    /// debug; everything else to warn.
    pub fn log_failed_pass(&self, object: &str, retry_in: std::time::Duration) {
        if self.is_conflict() {
            tracing::debug!(object, error = %self, ?retry_in, "pass conflicted; retrying");
        } else {
            tracing::warn!(object, error = %self, ?retry_in, "pass failed; retrying");
        }
    }
}
