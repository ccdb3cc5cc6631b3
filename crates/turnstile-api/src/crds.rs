//! Rendering the CustomResourceDefinitions (`turnstile crds`, the committed `crds/` files).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use super::{ClusterDistributedLock, DistributedLock, LockClaim, LockTemplate};

/// Rendering the CRDs as YAML failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot render CRD {name} as YAML: {source}")]
pub struct CrdRenderError {
    name: String,
    #[source]
    source: serde_yaml::Error,
}

/// Every CustomResourceDefinition, `DistributedLock` first.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        DistributedLock::crd(),
        LockClaim::crd(),
        LockTemplate::crd(),
        ClusterDistributedLock::crd(),
    ]
}

/// One CRD as a YAML document (what `crds/<plural>.turnstile.dev.yaml` holds).
pub fn crd_yaml(crd: &CustomResourceDefinition) -> Result<String, CrdRenderError> {
    serde_yaml::to_string(crd).map_err(|source| CrdRenderError {
        name: crd.metadata.name.clone().unwrap_or_default(),
        source,
    })
}

/// Every CRD as one multi-document YAML stream: exactly what `turnstile crds` prints and the
/// concatenation of the committed `crds/*.yaml` files (in [`crds`] order).
pub fn crds_yaml() -> Result<String, CrdRenderError> {
    let mut out = String::new();
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&crd_yaml(&crd)?);
    }
    Ok(out)
}
