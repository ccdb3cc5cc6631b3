//! The reads: get one object, and list a collection page by page.

use base64::Engine as _;
use serde_json::{json, Value};

use super::{to_served, Target};
use crate::error::ApiError;
use crate::meta;
use crate::selector::Selectors;
use crate::store::Store;

/// Gets one object.
pub(crate) fn get(store: &Store, t: &Target) -> Result<Value, ApiError> {
    let name = t.url_name()?;
    store.with(|inner| {
        inner
            .get(&t.key(name))
            .map(|o| to_served(&t.rtype, &t.version, &o))
            .ok_or_else(|| t.not_found(name))
    })
}

/// Pagination of a list.
#[derive(Debug, Clone, Default)]
pub(crate) struct ListOptions {
    pub selectors: Selectors,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
}

/// A listed page: items (served), the list's resourceVersion, the continue token and the count left.
#[derive(Debug)]
pub(crate) struct ListPage {
    pub items: Vec<Value>,
    pub resource_version: u64,
    pub continue_token: Option<String>,
    pub remaining: Option<usize>,
}

fn encode_continue(rv: u64, namespace: &str, name: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(json!({"rv": rv, "ns": namespace, "name": name}).to_string())
}

/// A continue token's list: the resourceVersion of its snapshot and the last key served.
struct Continue {
    rv: u64,
    namespace: String,
    name: String,
}

fn decode_continue(token: &str) -> Result<Continue, ApiError> {
    let bad = || {
        ApiError::bad_request("continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)")
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    let rv = v.get("rv").and_then(Value::as_u64).ok_or_else(bad)?;
    let ns = v.get("ns").and_then(Value::as_str).ok_or_else(bad)?;
    let name = v.get("name").and_then(Value::as_str).ok_or_else(bad)?;
    Ok(Continue {
        rv,
        namespace: ns.to_string(),
        name: name.to_string(),
    })
}

/// Lists objects matching the selectors, one page at a time when `limit` is set.
///
/// Every page of one list is served from the snapshot its first page saw, with that page's
/// resourceVersion, as etcd does: a watch resumed from it then sees every later change exactly
/// once. (Serving later pages from the live store at a newer resourceVersion loses an object
/// created mid-list whose name sorts before the cursor: in neither the list nor the watch.)
pub(crate) fn list(store: &Store, t: &Target, opts: &ListOptions) -> Result<ListPage, ApiError> {
    let after = opts
        .continue_token
        .as_deref()
        .map(decode_continue)
        .transpose()?;
    store.with(|inner| {
        // Only what follows the cursor is read: a page costs what is left, not the whole list.
        let (rv, matching) = match &after {
            None => (inner.current_rv(), t.matching(inner, &opts.selectors)),
            Some(after) => {
                let cursor = Some((after.namespace.as_str(), after.name.as_str()));
                let snapshot = t
                    .matching_at(inner, &opts.selectors, cursor, after.rv)
                    .map_err(|_| ApiError::continue_expired())?;
                (after.rv, snapshot)
            }
        };
        let total = matching.len();
        let take = opts.limit.filter(|l| *l > 0).unwrap_or(total).min(total);
        let items: Vec<Value> = matching[..take]
            .iter()
            .map(|o| to_served(&t.rtype, &t.version, o))
            .collect();
        let (continue_token, remaining) = if take < total {
            let last = &matching[take - 1];
            (
                Some(encode_continue(rv, meta::namespace(last), meta::name(last))),
                Some(total - take),
            )
        } else {
            (None, None)
        };
        Ok(ListPage {
            items,
            resource_version: rv,
            continue_token,
            remaining,
        })
    })
}
