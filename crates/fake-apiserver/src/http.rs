//! HTTP routing: parses kube-apiserver URLs into request attributes, applies the hooks
//! (faults, request log), negotiates content and dispatches to discovery, OpenAPI, the
//! REST handlers and watches.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};
use tokio::sync::watch as tokio_watch;

use crate::admission::FieldValidation;
use crate::discovery;
use crate::error::ApiError;
use crate::hooks::{Hooks, RecordedRequest};
use crate::openapi;
use crate::patch::PatchKind;
use crate::registry::{Propagation, ResourceType};
use crate::render::{self, Rendering};
use crate::rest::{self, DeleteOptions, ListOptions, Target, WriteOptions};
use crate::selector::{FieldSelector, LabelSelector, Selectors};
use crate::store::Store;
use crate::watch::{self, WatchParams, WatchSettings};

/// Largest request body accepted.
const MAX_BODY: usize = 16 * 1024 * 1024;

/// kube-apiserver's default watch timeout when the client gives none (`--min-request-timeout`).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

/// State shared by every request of one server.
#[derive(Debug)]
pub(crate) struct AppState {
    pub store: Arc<Store>,
    pub hooks: Hooks,
    pub close_watches: tokio_watch::Sender<u64>,
    pub bookmark_interval: Duration,
    /// The most items one page of a paginated list holds, whatever `limit` asks.
    pub max_list_page: Option<usize>,
    pub url: String,
}

/// What a URL addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    Version,
    Health,
    CoreVersions,
    Groups,
    Group(String),
    Resources(String, String),
    OpenApiRoot,
    OpenApiDoc(String, String),
    Resource(ResourceRequest),
    NotFound,
}

/// The attributes of a resource request (kube-apiserver's RequestInfo).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct ResourceRequest {
    group: String,
    version: String,
    namespace: Option<String>,
    resource: String,
    name: Option<String>,
    subresource: Option<String>,
}

fn parse_route(path: &str) -> Route {
    let parts: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|p| !p.is_empty())
        .collect();
    match parts.as_slice() {
        ["version"] => Route::Version,
        ["healthz" | "readyz" | "livez", ..] => Route::Health,
        ["api"] => Route::CoreVersions,
        ["api", v] => Route::Resources(String::new(), v.to_string()),
        ["apis"] => Route::Groups,
        ["apis", g] => Route::Group(g.to_string()),
        ["apis", g, v] => Route::Resources(g.to_string(), v.to_string()),
        ["openapi", "v3"] => Route::OpenApiRoot,
        ["openapi", "v3", "api", v] => Route::OpenApiDoc(String::new(), v.to_string()),
        ["openapi", "v3", "apis", g, v] => Route::OpenApiDoc(g.to_string(), v.to_string()),
        ["api", v, rest @ ..] => resource_route("", v, rest),
        ["apis", g, v, rest @ ..] => resource_route(g, v, rest),
        _ => Route::NotFound,
    }
}

fn resource_route(group: &str, version: &str, rest: &[&str]) -> Route {
    let mut rest = rest;
    let mut namespace = None;
    if rest.first() == Some(&"namespaces") && rest.len() > 1 {
        namespace = Some(rest[1].to_string());
        if rest.len() > 2 && !matches!(rest[2], "status" | "finalize") {
            rest = &rest[2..];
        }
    }
    let (resource, name, subresource) = match rest {
        [r] => (r, None, None),
        [r, n] => (r, Some(n.to_string()), None),
        [r, n, s] => (r, Some(n.to_string()), Some(s.to_string())),
        _ => return Route::NotFound,
    };
    Route::Resource(ResourceRequest {
        group: group.into(),
        version: version.into(),
        namespace,
        resource: resource.to_string(),
        name,
        subresource,
    })
}

fn parse_query(query: &str) -> HashMap<String, String> {
    form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect()
}

fn truthy(q: &HashMap<String, String>, key: &str) -> bool {
    matches!(q.get(key).map(String::as_str), Some("true" | "1"))
}

fn verb_of(
    method: &Method,
    req: &ResourceRequest,
    query: &HashMap<String, String>,
) -> &'static str {
    match (method.as_str(), req.name.is_some()) {
        ("GET", _) if truthy(query, "watch") => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "unknown",
    }
}

fn json_response(code: u16, body: &Value, warnings: &[String]) -> Response {
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    for w in warnings {
        if let Ok(v) = HeaderValue::from_str(&format!("299 - {w:?}")) {
            response.headers_mut().append(header::WARNING, v);
        }
    }
    response
}

fn error_response(err: &ApiError) -> Response {
    json_response(err.status_code().as_u16(), &err.to_status(), &[])
}

/// The single handler behind every URL.
pub(crate) async fn handle(State(app): State<Arc<AppState>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let method = parts.method.clone();
    let path = parts.uri.path().to_string();
    let raw_query = parts.uri.query().unwrap_or_default().to_string();
    let query = parse_query(&raw_query);
    let route = parse_route(&path);
    let content_type = header_str(&parts.headers, header::CONTENT_TYPE);
    let mut record = RecordedRequest {
        method: method.to_string(),
        path: path.clone(),
        query: raw_query,
        verb: method.as_str().to_lowercase(),
        is_resource_request: false,
        api_group: String::new(),
        api_version: String::new(),
        resource: String::new(),
        subresource: String::new(),
        namespace: String::new(),
        name: String::new(),
        content_type: content_type.clone(),
        status: 0,
        injected_fault: false,
        received: std::time::Instant::now(),
        answered: std::time::Instant::now(),
    };
    if let Route::Resource(r) = &route {
        record.is_resource_request = true;
        record.verb = verb_of(&method, r, &query).to_string();
        record.api_group = r.group.clone();
        record.api_version = r.version.clone();
        record.resource = r.resource.clone();
        record.subresource = r.subresource.clone().unwrap_or_default();
        record.namespace = r.namespace.clone().unwrap_or_default();
        record.name = r.name.clone().unwrap_or_default();
    }
    if let Some(delay) = app.hooks.take_delay(&path) {
        tokio::time::sleep(delay).await;
    }
    let is_write = matches!(
        method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    );
    let fault = match (record.is_resource_request, is_write) {
        (false, _) => None,
        (true, true) => app.hooks.take_fault(&path),
        (true, false) => app.hooks.take_read_fault(&path),
    };
    let response = match fault {
        Some(code) => {
            record.injected_fault = true;
            let err = match code {
                409 => ApiError::conflict(
                    &record.api_group,
                    &record.resource,
                    &record.name,
                    ApiError::STALE,
                ),
                // As RBAC refuses: the caller lacks the verb.
                403 => ApiError {
                    code,
                    reason: "Forbidden",
                    message: format!(
                        "{}.{} {:?} is forbidden: injected fault",
                        record.resource, record.api_group, record.name
                    ),
                    details: None,
                },
                429 => ApiError {
                    code,
                    reason: "TooManyRequests",
                    message: "Too many requests, please try again later (injected fault)".into(),
                    details: None,
                },
                _ => ApiError {
                    code,
                    reason: "InternalError",
                    message: "Internal error occurred: injected fault".into(),
                    details: None,
                },
            };
            let mut response = error_response(&err);
            if code == 429 {
                // kube-apiserver's priority and fairness answers say when to come back.
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            response
        }
        None => match axum::body::to_bytes(body, MAX_BODY).await {
            Ok(body) => {
                let request = Incoming {
                    method: &method,
                    headers: &parts.headers,
                    query: &query,
                    body,
                };
                dispatch(&app, route, request).unwrap_or_else(|e| error_response(&e))
            }
            Err(e) => error_response(&ApiError::bad_request(format!(
                "cannot read request body: {e}"
            ))),
        },
    };
    record.status = response.status().as_u16();
    record.answered = std::time::Instant::now();
    tracing::debug!(method = %record.method, path = %record.path, verb = %record.verb, status = record.status, "request");
    app.hooks.record(record);
    response
}

fn header_str(headers: &HeaderMap, name: header::HeaderName) -> String {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// What the handlers read of a request besides its route.
struct Incoming<'a> {
    method: &'a Method,
    headers: &'a HeaderMap,
    query: &'a HashMap<String, String>,
    body: Bytes,
}

fn dispatch(
    app: &Arc<AppState>,
    route: Route,
    request: Incoming<'_>,
) -> Result<Response, ApiError> {
    let ok = |v: Value| Ok(json_response(200, &v, &[]));
    let registry = || app.store.lock().registry.clone();
    if !matches!(route, Route::Resource(_)) && *request.method != Method::GET {
        return Err(ApiError::method_not_allowed());
    }
    match route {
        Route::Version => ok(discovery::version()),
        Route::Health => {
            let mut r = Response::new(Body::from("ok"));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            Ok(r)
        }
        Route::CoreVersions | Route::Groups => {
            let core = route == Route::CoreVersions;
            match discovery::aggregated_version(&header_str(request.headers, header::ACCEPT)) {
                Some(v) => {
                    let mut r =
                        json_response(200, &discovery::aggregated(&registry(), core, v), &[]);
                    if let Ok(ct) = HeaderValue::from_str(&discovery::aggregated_content_type(v)) {
                        r.headers_mut().insert(header::CONTENT_TYPE, ct);
                    }
                    Ok(r)
                }
                None if core => ok(discovery::core_versions(
                    app.url.trim_start_matches("http://"),
                )),
                None => ok(discovery::group_list(&registry())),
            }
        }
        Route::Group(g) => {
            discovery::group(&registry(), &g).map_or_else(|| Err(ApiError::no_route()), ok)
        }
        Route::Resources(g, v) => discovery::resource_list(&registry(), &g, &v)
            .map_or_else(|| Err(ApiError::no_route()), ok),
        Route::OpenApiRoot => ok(openapi::root(&registry())),
        Route::OpenApiDoc(g, v) => {
            openapi::document(&registry(), &g, &v).map_or_else(|| Err(ApiError::no_route()), ok)
        }
        Route::NotFound => Err(ApiError::no_route()),
        Route::Resource(r) => resource(app, r, request),
    }
}

fn selectors(
    query: &HashMap<String, String>,
    rtype: &ResourceType,
    version: &str,
) -> Result<Selectors, ApiError> {
    let selectable = rtype
        .version(version)
        .map(|v| v.selectable_fields.as_slice())
        .unwrap_or_default();
    Ok(Selectors {
        labels: LabelSelector::parse(
            query
                .get("labelSelector")
                .map(String::as_str)
                .unwrap_or_default(),
        )?,
        fields: FieldSelector::parse(
            query
                .get("fieldSelector")
                .map(String::as_str)
                .unwrap_or_default(),
            &rtype.plural,
            selectable,
        )?,
    })
}

fn decode_body(headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    let content_type = header_str(headers, header::CONTENT_TYPE);
    let base = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    match base.as_str() {
        "" | "application/json" | "*/*" => serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}"))),
        crate::protobuf::MEDIA_TYPE => crate::protobuf::decode(body),
        "application/yaml" => serde_yaml::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML request body: {e}"))),
        other => Err(ApiError::unsupported_media_type(other)),
    }
}

fn write_options(query: &HashMap<String, String>) -> Result<WriteOptions, ApiError> {
    Ok(WriteOptions {
        dry_run: query.get("dryRun").is_some_and(|d| d == "All"),
        field_validation: FieldValidation::parse(query.get("fieldValidation").map(String::as_str))?,
        field_manager: query.get("fieldManager").cloned(),
    })
}

fn delete_options(query: &HashMap<String, String>, body: &[u8]) -> Result<DeleteOptions, ApiError> {
    let parsed: Value = if body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?
    };
    let policy = parsed
        .get("propagationPolicy")
        .and_then(Value::as_str)
        .map(String::from)
        .or_else(|| query.get("propagationPolicy").cloned());
    let orphan = parsed
        .get("orphanDependents")
        .and_then(Value::as_bool)
        .or_else(|| query.get("orphanDependents").map(|o| o == "true"));
    let mut propagation = policy.as_deref().map(Propagation::parse).transpose()?;
    if propagation.is_none() {
        propagation = orphan.map(|o| {
            if o {
                Propagation::Orphan
            } else {
                Propagation::Background
            }
        });
    }
    let dry_run = query.get("dryRun").is_some_and(|d| d == "All")
        || parsed
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|d| d.iter().any(|x| x == "All"));
    Ok(DeleteOptions {
        dry_run,
        propagation,
        precondition_uid: parsed
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(String::from),
        precondition_rv: parsed
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(String::from),
    })
}

fn resource(
    app: &Arc<AppState>,
    r: ResourceRequest,
    request: Incoming<'_>,
) -> Result<Response, ApiError> {
    let Incoming {
        method,
        headers,
        query,
        body,
    } = request;
    let rtype = app
        .store
        .lock()
        .registry
        .lookup(&r.group, &r.version, &r.resource)
        .ok_or_else(ApiError::no_route)?;
    // A namespace in the URL of a cluster-scoped type (other than namespaces/NAME) names nothing.
    if !rtype.namespaced && r.namespace.is_some() && r.resource != "namespaces" {
        return Err(ApiError::no_route());
    }
    if let Some(sub) = &r.subresource {
        if sub != "status" || !rtype.has_status(&r.version) {
            return Err(ApiError::no_route());
        }
    }
    let target = Target {
        rtype: rtype.clone(),
        version: r.version.clone(),
        namespace: if rtype.namespaced {
            r.namespace.clone()
        } else {
            None
        },
        name: r.name.clone(),
        subresource: r.subresource.clone(),
    };
    if rtype.namespaced
        && target.namespace.is_none()
        && !(method == Method::GET && r.name.is_none())
    {
        return Err(ApiError::no_route());
    }
    let rendering = render::negotiate(
        &header_str(headers, header::ACCEPT),
        query.get("includeObject").map(String::as_str),
    );
    let write = |result: rest::WriteResult| {
        Ok(json_response(result.code, &result.object, &result.warnings))
    };
    match (method.as_str(), r.name.is_some()) {
        ("GET", true) => {
            let obj = rest::get(&app.store, &target)?;
            Ok(json_response(
                200,
                &render::object(&rtype, &r.version, obj, &rendering),
                &[],
            ))
        }
        ("GET", false) if truthy(query, "watch") => {
            let rv = query
                .get("resourceVersion")
                .map(String::as_str)
                .unwrap_or_default();
            let resource_version = if rv.is_empty() {
                None
            } else {
                Some(rv.parse::<u64>().map_err(|_| {
                    ApiError::bad_request(format!(
                        "resourceVersion: Invalid value: {rv:?}: must be a number"
                    ))
                })?)
            };
            let timeout = query
                .get("timeoutSeconds")
                .and_then(|t| t.parse::<u64>().ok())
                .filter(|t| *t > 0)
                .map(Duration::from_secs)
                .unwrap_or(DEFAULT_WATCH_TIMEOUT);
            let params = WatchParams {
                resource_version,
                send_initial_events: truthy(query, "sendInitialEvents"),
                bookmarks: truthy(query, "allowWatchBookmarks"),
                timeout,
                selectors: selectors(query, &rtype, &r.version)?,
                rendering,
            };
            let settings = WatchSettings {
                bookmark_interval: app.bookmark_interval,
                close: app.close_watches.subscribe(),
                event_delay: app.hooks.watch_event_delay(&r.resource),
            };
            let body = watch::start(app.store.clone(), target, params, settings)?;
            let mut response = Response::new(body);
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            response.headers_mut().insert(
                header::CACHE_CONTROL,
                HeaderValue::from_static("no-cache, private"),
            );
            Ok(response)
        }
        ("GET", false) => {
            let opts = ListOptions {
                selectors: selectors(query, &rtype, &r.version)?,
                // Only a client that pages (asks for a limit) gets smaller pages.
                limit: query
                    .get("limit")
                    .and_then(|l| l.parse::<usize>().ok())
                    .map(|l| app.max_list_page.map_or(l, |max| l.min(max))),
                continue_token: query.get("continue").filter(|c| !c.is_empty()).cloned(),
            };
            let page = rest::list(&app.store, &target, &opts)?;
            let mut list_meta = json!({"resourceVersion": page.resource_version.to_string()});
            if let Some(c) = page.continue_token {
                list_meta["continue"] = json!(c);
            }
            if let Some(n) = page.remaining {
                list_meta["remainingItemCount"] = json!(n);
            }
            Ok(json_response(
                200,
                &render::list(&rtype, &r.version, page.items, list_meta, &rendering),
                &[],
            ))
        }
        // Neither creates nor deletes go to a subresource.
        ("POST", false) if r.subresource.is_none() => write(rest::create(
            &app.store,
            &target,
            decode_body(headers, &body)?,
            &write_options(query)?,
        )?),
        ("PUT", true) => write(rest::update(
            &app.store,
            &target,
            decode_body(headers, &body)?,
            &write_options(query)?,
        )?),
        ("PATCH", true) => {
            let kind = PatchKind::from_content_type(&header_str(headers, header::CONTENT_TYPE))?;
            write(rest::patch(
                &app.store,
                &target,
                kind,
                &body,
                &write_options(query)?,
            )?)
        }
        ("DELETE", true) if r.subresource.is_none() => write(rest::delete(
            &app.store,
            &target,
            &delete_options(query, &body)?,
        )?),
        ("DELETE", false) => {
            let deleted = rest::delete_collection(
                &app.store,
                &target,
                &selectors(query, &rtype, &r.version)?,
                &delete_options(query, &body)?,
            )?;
            let list_meta = json!({"resourceVersion": app.store.lock().current_rv().to_string()});
            Ok(json_response(
                200,
                &render::list(&rtype, &r.version, deleted, list_meta, &Rendering::Full),
                &[],
            ))
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_like_kube_request_info() {
        // (path, its "resource namespace name subresource", "-" where there is none)
        for (path, expected) in [
            ("/api/v1/namespaces/foo", "namespaces foo foo -"),
            ("/api/v1/namespaces/foo/status", "namespaces foo foo status"),
            (
                "/apis/x.dev/v1/namespaces/ns/things/a/status",
                "things ns a status",
            ),
            ("/apis/x.dev/v1/things", "things - - -"),
        ] {
            let Route::Resource(r) = parse_route(path) else {
                panic!("{path}: not a resource route");
            };
            let part = |p: Option<String>| p.unwrap_or_else(|| "-".into());
            let parts = [
                r.resource,
                part(r.namespace),
                part(r.name),
                part(r.subresource),
            ];
            assert_eq!(parts.join(" "), expected, "{path}");
        }
        assert_eq!(
            parse_route("/apis/x.dev/v1"),
            Route::Resources("x.dev".into(), "v1".into())
        );
    }
}
