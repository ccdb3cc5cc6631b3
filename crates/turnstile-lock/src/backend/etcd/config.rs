//! [`EtcdBackendConfig`]: the settings of an [`EtcdBackend`](super::EtcdBackend), and the
//! ones read out of its URL.

use std::path::PathBuf;
use std::time::Duration;

use super::EtcdConnectError;

/// Connection settings of an [`EtcdBackend`](super::EtcdBackend).
///
/// Its `Debug` output hides the password.
#[derive(Clone)]
pub struct EtcdBackendConfig {
    pub(super) url: String,
    pub(super) key_prefix: String,
    pub(super) request_timeout: Duration,
    pub(super) connect_timeout: Duration,
    pub(super) ca_file: Option<PathBuf>,
    pub(super) client_cert: Option<(PathBuf, PathBuf)>,
}

impl std::fmt::Debug for EtcdBackendConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let url = match parse_url(&self.url) {
            Ok(parsed) if parsed.user.is_some() => {
                format!(
                    "{}://<redacted>@{}",
                    parsed.scheme(),
                    parsed.endpoints.join(",")
                )
            }
            _ => self.url.clone(),
        };
        f.debug_struct("EtcdBackendConfig")
            .field("url", &url)
            .field("key_prefix", &self.key_prefix)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("ca_file", &self.ca_file)
            .field("client_cert", &self.client_cert)
            .finish()
    }
}

impl EtcdBackendConfig {
    /// Settings for `url`, key prefix `turnstile/`, request timeout 5 s, connect timeout
    /// 2 s. URL forms:
    ///
    /// - `etcd://[user:password@]host1:port1[,host2:port2…]`: the cluster's client
    ///   endpoints (any reachable one serves; the client balances over them);
    /// - `etcds://…`: the same over TLS (the server certificate checked against Mozilla's
    ///   roots, or [`Self::ca_file`]; a client certificate with [`Self::client_cert`]).
    ///
    /// With a user name, the client authenticates with etcd's user/password auth (as
    /// `etcdctl --user`). User name and password are percent-decoded.
    pub fn new(url: impl Into<String>) -> Self {
        EtcdBackendConfig {
            url: url.into(),
            key_prefix: "turnstile/".to_owned(),
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            ca_file: None,
            client_cert: None,
        }
    }

    setters! {
        /// Prefix of every key this backend writes (default `turnstile/`): lock `K` is the
        /// key `PREFIX` + `K`.
        key_prefix(prefix: impl Into<String>) => key_prefix = prefix.into();
        /// How long one request may take before it fails as unavailable (default 5 s).
        request_timeout(timeout: Duration) => request_timeout = timeout;
        /// How long connecting may take (default 2 s).
        connect_timeout(timeout: Duration) => connect_timeout = timeout;
    }

    /// Trusts the CA certificate(s) in this PEM file for `etcds://` instead of Mozilla's roots.
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// Presents this client certificate and key (PEM files) for `etcds://`: etcd's
    /// `--client-cert-auth`.
    pub fn client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.client_cert = Some((cert.into(), key.into()));
        self
    }

    pub(super) fn parsed(&self) -> Result<ParsedUrl, EtcdConnectError> {
        let parsed = parse_url(&self.url)?;
        if !parsed.tls && (self.ca_file.is_some() || self.client_cert.is_some()) {
            return Err(EtcdConnectError::TlsSettingsWithoutTls);
        }
        Ok(parsed)
    }
}

/// What an `etcd://` / `etcds://` URL says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ParsedUrl {
    pub(super) tls: bool,
    /// `host:port` of each endpoint.
    pub(super) endpoints: Vec<String>,
    pub(super) user: Option<(String, String)>,
}

impl ParsedUrl {
    fn scheme(&self) -> &'static str {
        if self.tls {
            "etcds"
        } else {
            "etcd"
        }
    }

    /// The endpoints as the etcd client takes them (`http://` or `https://`).
    pub(super) fn client_endpoints(&self) -> Vec<String> {
        let scheme = if self.tls { "https" } else { "http" };
        self.endpoints
            .iter()
            .map(|endpoint| format!("{scheme}://{endpoint}"))
            .collect()
    }
}

fn parse_url(url: &str) -> Result<ParsedUrl, EtcdConnectError> {
    let invalid = |why: &str| EtcdConnectError::InvalidUrl(why.to_owned());
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| invalid("expected etcd://host:port or etcds://host:port"))?;
    let tls = match scheme {
        "etcd" => false,
        "etcds" => true,
        _ => return Err(invalid("the scheme must be etcd:// or etcds://")),
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains(['/', '?', '#']) {
        return Err(invalid(
            "an etcd URL has no path or query (set the key prefix with key_prefix)",
        ));
    }
    let (user, hosts) = match rest.rsplit_once('@') {
        Some((userinfo, hosts)) => {
            let (name, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
            let decode = |part: &str| {
                percent_decode(part).ok_or_else(|| invalid("bad percent-encoding in the user info"))
            };
            (Some((decode(name)?, decode(password)?)), hosts)
        }
        None => (None, rest),
    };
    let endpoints: Vec<String> = hosts.split(',').map(str::to_owned).collect();
    if endpoints
        .iter()
        .any(|endpoint| endpoint.is_empty() || !endpoint.contains(':'))
    {
        return Err(invalid(
            "every endpoint needs a host and a port (host:port)",
        ));
    }
    Ok(ParsedUrl {
        tls,
        endpoints,
        user,
    })
}

/// `%XX` escapes decoded; `None` if one is malformed or the result is not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text.as_bytes();
    while let Some((&byte, tail)) = rest.split_first() {
        if byte == b'%' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(byte);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_endpoints_tls_and_credentials() {
        let plain = parse_url("etcd://127.0.0.1:2379").unwrap();
        assert_eq!(plain.client_endpoints(), ["http://127.0.0.1:2379"]);
        assert_eq!(plain.user, None);

        let cluster = parse_url("etcds://alice:p%40ss@a:1,b:2/").unwrap();
        assert!(cluster.tls);
        assert_eq!(cluster.client_endpoints(), ["https://a:1", "https://b:2"]);
        assert_eq!(cluster.user, Some(("alice".into(), "p@ss".into())));
    }

    #[test]
    fn bad_urls_say_why() {
        for url in [
            "redis://a:1",
            "etcd://a",
            "etcd://a:1/prefix",
            "etcd://a:1,",
            "etcd://u:%zz@a:1",
        ] {
            assert!(
                matches!(parse_url(url), Err(EtcdConnectError::InvalidUrl(_))),
                "{url}"
            );
        }
    }

    #[test]
    fn debug_hides_the_password() {
        let config = EtcdBackendConfig::new("etcd://alice:secret@a:1");
        let shown = format!("{config:?}");
        assert!(
            !shown.contains("secret") && shown.contains("<redacted>"),
            "{shown}"
        );
    }

    #[test]
    fn tls_files_need_etcds() {
        let config = EtcdBackendConfig::new("etcd://a:1").ca_file("/ca.pem");
        assert!(matches!(
            config.parsed(),
            Err(EtcdConnectError::TlsSettingsWithoutTls)
        ));
    }
}
