//! A TLS front for the fake API server, which serves plain HTTP: what a Pod's in-cluster
//! config talks to (`https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`, trusting the
//! service account's `ca.crt`). Each connection is decrypted and copied to the fake.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{crypto, ServerConfig};
use tokio_rustls::TlsAcceptor;

/// A listening TLS front; dropping it stops it.
pub struct TlsFront {
    /// Where it listens (127.0.0.1).
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves TLS with the PEM `cert` and `key` on a free loopback port, forwarding to `upstream`.
pub async fn tls_front(cert: &Path, key: &Path, upstream: SocketAddr) -> TlsFront {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .expect("read the certificate")
        .collect::<Result<_, _>>()
        .expect("a PEM certificate");
    let key = PrivateKeyDer::from_pem_file(key).expect("a PEM private key");
    let config = ServerConfig::builder_with_provider(Arc::new(crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("server certificate");
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(stream).await else {
                    return;
                };
                let Ok(mut plain) = TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    TlsFront { addr, task }
}
