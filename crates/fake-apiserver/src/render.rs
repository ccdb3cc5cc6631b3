//! Content negotiation: full objects, `PartialObjectMetadata`, or `meta.k8s.io` Tables,
//! chosen from the `Accept` header as kube-apiserver does.

use serde_json::{json, Value};

use crate::registry::ResourceType;
use crate::table::{self, IncludeObject};

/// How objects are rendered in an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Rendering {
    /// The objects themselves.
    Full,
    /// `PartialObjectMetadata(List)`.
    PartialMetadata,
    /// A Table (see [`TableFormat`]).
    Table(TableFormat),
}

/// What a Table answer looks like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableFormat {
    /// The Table's `apiVersion` (`meta.k8s.io/v1` or `v1beta1`).
    pub(crate) api_version: String,
    /// What each row carries of its object.
    pub(crate) include: IncludeObject,
}

impl TableFormat {
    /// `objects` (served form) as a Table with `list_meta` when it is a list's; with the
    /// column definitions unless `with_definitions` is false (a watch sends them once).
    pub(crate) fn render(
        &self,
        rtype: &ResourceType,
        version: &str,
        objects: &[Value],
        list_meta: Option<Value>,
        with_definitions: bool,
    ) -> Value {
        table::table(
            rtype,
            version,
            objects,
            self.include,
            &self.api_version,
            list_meta,
            with_definitions,
        )
    }
}

/// Picks the first acceptable media type of `accept`.
pub(crate) fn negotiate(accept: &str, include_object: Option<&str>) -> Rendering {
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or_default();
        let params: Vec<(&str, &str)> = parts.filter_map(|p| p.split_once('=')).collect();
        let param = |k: &str| params.iter().find(|(pk, _)| *pk == k).map(|(_, v)| *v);
        if !matches!(media, "application/json" | "*/*" | "application/*" | "") {
            continue;
        }
        match (param("as"), param("g")) {
            (Some("Table"), Some("meta.k8s.io")) => {
                let v = param("v").unwrap_or("v1");
                if v == "v1" || v == "v1beta1" {
                    return Rendering::Table(TableFormat {
                        api_version: format!("meta.k8s.io/{v}"),
                        include: IncludeObject::parse(include_object),
                    });
                }
            }
            (Some("PartialObjectMetadata" | "PartialObjectMetadataList"), Some("meta.k8s.io")) => {
                return Rendering::PartialMetadata
            }
            (None, _) => return Rendering::Full,
            _ => {}
        }
    }
    Rendering::Full
}

/// One object (served form) as `rendering` asks.
pub(crate) fn object(
    rtype: &ResourceType,
    version: &str,
    obj: Value,
    rendering: &Rendering,
) -> Value {
    match rendering {
        Rendering::Full => obj,
        Rendering::PartialMetadata => table::partial_metadata(&obj),
        Rendering::Table(format) => {
            format.render(rtype, version, std::slice::from_ref(&obj), None, true)
        }
    }
}

/// A list (served items) as `rendering` asks.
pub(crate) fn list(
    rtype: &ResourceType,
    version: &str,
    items: Vec<Value>,
    list_meta: Value,
    rendering: &Rendering,
) -> Value {
    match rendering {
        Rendering::Full => json!({
            "kind": rtype.list_kind,
            "apiVersion": rtype.api_version(version),
            "metadata": list_meta,
            "items": items,
        }),
        Rendering::PartialMetadata => json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": list_meta,
            "items": items.iter().map(table::partial_metadata).collect::<Vec<_>>(),
        }),
        Rendering::Table(format) => format.render(rtype, version, &items, Some(list_meta), true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_and_kube_rs_accept_headers() {
        let kubectl = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert!(
            matches!(negotiate(kubectl, None), Rendering::Table(TableFormat { ref api_version, .. }) if api_version == "meta.k8s.io/v1")
        );
        assert_eq!(
            negotiate(
                "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
                None
            ),
            Rendering::PartialMetadata
        );
        assert_eq!(
            negotiate(
                "application/vnd.kubernetes.protobuf, application/json",
                None
            ),
            Rendering::Full
        );
        assert_eq!(negotiate("", None), Rendering::Full);
    }
}
