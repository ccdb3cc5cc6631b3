//! Errors: the crate's own [`Error`] and the API errors rendered as `metav1.Status`.

use axum::http::StatusCode;
use serde_json::{json, Value};

/// Errors of the fake server's Rust API (starting it, writing a kubeconfig, building a client).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Binding or serving the listening socket failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address that was asked for.
        addr: String,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// Writing the kubeconfig file failed.
    #[error("cannot write kubeconfig {path}: {source}")]
    Kubeconfig {
        /// Where it was to be written.
        path: String,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// Serialising the kubeconfig failed.
    #[error("cannot render kubeconfig: {0}")]
    KubeconfigYaml(#[from] serde_yaml::Error),
    /// Building the kube client failed.
    #[error("cannot build a kube client: {0}")]
    Client(#[from] kube::Error),
    /// The server URL could not be parsed as a URI.
    #[error("invalid server URL {0}")]
    Url(String),
}

/// One field-level cause of an `Invalid` (422) answer, as in `metav1.StatusCause`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FieldError {
    /// `FieldValueInvalid`, `FieldValueRequired`, ...
    pub reason: &'static str,
    /// The field path, e.g. `spec.maxHolders`.
    pub field: String,
    /// The message without the field path, e.g. `Required value`.
    pub body: String,
}

impl FieldError {
    /// `field: Invalid value: <value>: <detail>` (kube-apiserver's `field.Invalid`).
    pub(crate) fn invalid(field: &str, value: &Value, detail: &str) -> Self {
        Self::with_value("FieldValueInvalid", "Invalid value", field, value, detail)
    }

    /// `field: Invalid value: "<type>": <detail>` (`field.TypeInvalid`).
    pub(crate) fn type_invalid(field: &str, value: &Value, detail: &str) -> Self {
        Self::with_value(
            "FieldValueTypeInvalid",
            "Invalid value",
            field,
            value,
            detail,
        )
    }

    /// `field: Required value[: detail]` (`field.Required`).
    pub(crate) fn required(field: &str, detail: &str) -> Self {
        let body = if detail.is_empty() {
            "Required value".to_string()
        } else {
            format!("Required value: {detail}")
        };
        Self {
            reason: "FieldValueRequired",
            field: field.to_string(),
            body,
        }
    }

    /// `field: Forbidden: detail` (`field.Forbidden`).
    pub(crate) fn forbidden(field: &str, detail: &str) -> Self {
        Self {
            reason: "FieldValueForbidden",
            field: field.to_string(),
            body: format!("Forbidden: {detail}"),
        }
    }

    /// `field: Unsupported value: <v>: supported values: "a", "b"` (`field.NotSupported`).
    pub(crate) fn not_supported(field: &str, value: &Value, allowed: &[String]) -> Self {
        let quoted: Vec<String> = allowed.iter().map(|a| format!("{a:?}")).collect();
        Self::with_value(
            "FieldValueNotSupported",
            "Unsupported value",
            field,
            value,
            &format!("supported values: {}", quoted.join(", ")),
        )
    }

    /// A cause with a caller-chosen reason and body.
    pub(crate) fn other(reason: &'static str, field: &str, body: String) -> Self {
        Self {
            reason,
            field: field.to_string(),
            body,
        }
    }

    fn with_value(
        reason: &'static str,
        kind: &str,
        field: &str,
        value: &Value,
        detail: &str,
    ) -> Self {
        let mut body = format!("{kind}: {}", go_value(value));
        if !detail.is_empty() {
            body.push_str(": ");
            body.push_str(detail);
        }
        Self {
            reason,
            field: field.to_string(),
            body,
        }
    }

    /// The full text, `field: body`.
    pub(crate) fn text(&self) -> String {
        if self.field.is_empty() {
            self.body.clone()
        } else {
            format!("{}: {}", self.field, self.body)
        }
    }
}

/// Renders a value the way `field.Error.ErrorBody` prints a bad value: strings quoted,
/// numbers and booleans bare, `null` for null.
pub(crate) fn go_value(value: &Value) -> String {
    match value {
        Value::Null => "\"null\"".to_string(),
        Value::String(s) => format!("{s:?}"),
        Value::Number(n) => format_number(n),
        Value::Bool(b) => b.to_string(),
        other => other.to_string(),
    }
}

/// Formats a JSON number like Go's `%v`: integral floats lose their `.0`.
pub(crate) fn format_number(n: &serde_json::Number) -> String {
    if let Some(f) = n.as_f64().filter(|_| !n.is_i64() && !n.is_u64()) {
        if f.fract() == 0.0 && f.abs() < 1e15 {
            return format!("{}", f as i64);
        }
        return f.to_string();
    }
    n.to_string()
}

/// An error answered to an API request, rendered as a `metav1.Status` body.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// The `reason` field of the Status (`NotFound`, `Conflict`, ...).
    pub reason: &'static str,
    /// Human-readable message, worded as kube-apiserver words it.
    pub message: String,
    /// The `details` field, when there is one.
    pub details: Option<Value>,
}

/// The `details` of a Status naming one object.
fn details(group: &str, kind: &str, name: &str) -> Value {
    json!({ "name": name, "group": group, "kind": kind })
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: String, details: Option<Value>) -> Self {
        Self {
            code,
            reason,
            message,
            details,
        }
    }

    /// 404: `<resource>.<group> "<name>" not found`.
    pub(crate) fn not_found(group: &str, resource: &str, name: &str) -> Self {
        Self::about_object(404, "NotFound", (group, resource, name), "not found")
    }

    /// 404 for a URL that names no known resource.
    pub(crate) fn no_route() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource".into(),
            None,
        )
    }

    /// 409: `<resource>.<group> "<name>" already exists`.
    pub(crate) fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        Self::about_object(
            409,
            "AlreadyExists",
            (group, resource, name),
            "already exists",
        )
    }

    /// `<resource>.<group> "<name>" <what>`, with the object's details.
    fn about_object(
        code: u16,
        reason: &'static str,
        (group, resource, name): (&str, &str, &str),
        what: &str,
    ) -> Self {
        Self::new(
            code,
            reason,
            format!("{} {name:?} {what}", qualified(resource, group)),
            Some(details(group, resource, name)),
        )
    }

    /// 409: the optimistic-concurrency conflict.
    pub(crate) fn conflict(group: &str, resource: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} {name:?}: {why}",
                qualified(resource, group)
            ),
            Some(details(group, resource, name)),
        )
    }

    /// The wording of a stale `resourceVersion` conflict.
    pub(crate) const STALE: &'static str =
        "the object has been modified; please apply your changes to the latest version and try again";

    /// `Ok` when there are no `causes`; else [`ApiError::invalid`] with them.
    pub(crate) fn invalid_if_any(
        group: &str,
        kind: &str,
        name: &str,
        causes: &[FieldError],
    ) -> Result<(), Self> {
        if causes.is_empty() {
            Ok(())
        } else {
            Err(Self::invalid(group, kind, name, causes))
        }
    }

    /// 422 Invalid with causes.
    pub(crate) fn invalid(group: &str, kind: &str, name: &str, causes: &[FieldError]) -> Self {
        let texts: Vec<String> = causes.iter().map(FieldError::text).collect();
        let joined = if texts.len() == 1 {
            texts[0].clone()
        } else {
            format!("[{}]", texts.join(", "))
        };
        let qualified_kind = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let causes_json: Vec<Value> = causes
            .iter()
            .map(|c| json!({ "reason": c.reason, "message": c.body, "field": c.field }))
            .collect();
        Self::new(
            422,
            "Invalid",
            format!("{qualified_kind} {name:?} is invalid: {joined}"),
            Some(json!({ "name": name, "group": group, "kind": kind, "causes": causes_json })),
        )
    }

    /// 400 BadRequest.
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message.into(), None)
    }

    /// 403 Forbidden.
    pub(crate) fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message.into(), None)
    }

    /// 405 MethodNotAllowed.
    pub(crate) fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource".into(),
            None,
        )
    }

    /// 410 Expired, as sent in a watch ERROR event.
    pub(crate) fn expired(requested: u64, oldest: u64) -> Self {
        Self::new(
            410,
            "Expired",
            format!("too old resource version: {requested} ({oldest})"),
            None,
        )
    }

    /// 410 Expired for a continue token whose snapshot has been compacted away.
    pub(crate) fn continue_expired() -> Self {
        Self::new(
            410,
            "Expired",
            "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.".into(),
            None,
        )
    }

    /// 415 UnsupportedMediaType.
    pub(crate) fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(415, "UnsupportedMediaType", format!("the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (got {content_type:?})"), None)
    }

    /// 500 InternalError.
    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
            None,
        )
    }

    /// The HTTP status code.
    pub(crate) fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// The `metav1.Status` object.
    pub(crate) fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

/// `resource.group`, or `resource` for the core group.
pub(crate) fn qualified(resource: &str, group: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}
