//! Telling the controller's API requests from the test's own in the fake's request log: the
//! controller gets a client of its own that adds `e2e-actor=NAME` to every request's query
//! (the fake records the raw query and ignores parameters it does not know).

use fake_apiserver::{FakeApiServer, RecordedRequest};
use kube::client::{Body, ClientBuilder};
use kube::Client;

/// The query parameter naming who sent a request.
const ACTOR_PARAM: &str = "e2e-actor";

fn tag(actor: &str) -> String {
    format!("{ACTOR_PARAM}={actor}")
}

/// `uri` with `tag` appended to its query.
fn tagged_uri(uri: &http::Uri, tag: &str) -> http::Uri {
    let path = uri.path();
    let path_and_query = match uri.query() {
        Some(query) if !query.is_empty() => format!("{path}?{query}&{tag}"),
        _ => format!("{path}?{tag}"),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(path_and_query.parse().expect("tagged path and query"));
    http::Uri::from_parts(parts).expect("tagged URI")
}

/// A client for `server` whose every request carries `actor`'s tag.
pub fn tagged_client(server: &FakeApiServer, actor: &str) -> Client {
    let config = server.kube_config().expect("fake API server config");
    let tag = tag(actor);
    let layer =
        tower::ServiceBuilder::new().map_request(move |mut request: http::Request<Body>| {
            *request.uri_mut() = tagged_uri(request.uri(), &tag);
            request
        });
    ClientBuilder::try_from(config)
        .expect("client builder")
        .with_layer(&layer)
        .build()
}

/// Whether `request` was sent by a [`tagged_client`] of `actor`.
pub fn sent_by(request: &RecordedRequest, actor: &str) -> bool {
    let tag = tag(actor);
    request.query.split('&').any(|pair| pair == tag)
}

/// The requests in `log` sent by `actor`.
pub fn requests_of(log: &[RecordedRequest], actor: &str) -> Vec<RecordedRequest> {
    log.iter()
        .filter(|request| sent_by(request, actor))
        .cloned()
        .collect()
}
