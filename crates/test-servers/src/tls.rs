//! Certificates for test servers, made with `openssl`: a CA and the leaf certificates it signs,
//! each with v3 extensions (rustls refuses X.509 v1 certificates).

use std::io;
use std::path::Path;
use std::process::Command;

/// Runs `openssl` with `args`; its standard error becomes the error when it fails.
pub(crate) fn openssl(args: &[&std::ffi::OsStr]) -> io::Result<()> {
    let output = Command::new("openssl").args(args).output()?;
    if output.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "openssl {:?} failed: {}",
            args.first(),
            String::from_utf8_lossy(&output.stderr)
        )))
    }
}

/// Writes a new ECDSA P-256 private key to `key`.
pub(crate) fn new_key(key: &Path) -> io::Result<()> {
    openssl(&[
        "genpkey".as_ref(),
        "-algorithm".as_ref(),
        "EC".as_ref(),
        "-pkeyopt".as_ref(),
        "ec_paramgen_curve:P-256".as_ref(),
        "-out".as_ref(),
        key.as_os_str(),
    ])
}

/// Writes a new RSA 2048 private key to `key` (what signs service-account tokens).
pub(crate) fn new_rsa_key(key: &Path) -> io::Result<()> {
    openssl(&[
        "genpkey".as_ref(),
        "-algorithm".as_ref(),
        "RSA".as_ref(),
        "-pkeyopt".as_ref(),
        "rsa_keygen_bits:2048".as_ref(),
        "-out".as_ref(),
        key.as_os_str(),
    ])
}

/// Writes a new key to `key` and a CA certificate for it (valid 2 days) to `cert`.
pub(crate) fn self_signed_ca(key: &Path, cert: &Path, name: &str) -> io::Result<()> {
    new_key(key)?;
    let subject = format!("/CN={name}");
    openssl(&[
        "req".as_ref(),
        "-x509".as_ref(),
        "-new".as_ref(),
        "-key".as_ref(),
        key.as_os_str(),
        "-subj".as_ref(),
        subject.as_ref(),
        "-days".as_ref(),
        "2".as_ref(),
        "-addext".as_ref(),
        "basicConstraints=critical,CA:TRUE".as_ref(),
        "-addext".as_ref(),
        "keyUsage=critical,keyCertSign,cRLSign".as_ref(),
        "-out".as_ref(),
        cert.as_os_str(),
    ])
}

/// Writes a new key to `key` and a certificate for `subject` (`/CN=…`, `/O=…/CN=…`) signed
/// by the CA, with the v3 `extensions` file, to `cert`; the request is left beside the key.
pub(crate) fn signed_certificate(
    (ca_key, ca_cert): (&Path, &Path),
    (key, cert): (&Path, &Path),
    subject: &str,
    extensions: &Path,
) -> io::Result<()> {
    new_key(key)?;
    let request = key.with_extension("csr");
    openssl(&[
        "req".as_ref(),
        "-new".as_ref(),
        "-key".as_ref(),
        key.as_os_str(),
        "-subj".as_ref(),
        subject.as_ref(),
        "-out".as_ref(),
        request.as_os_str(),
    ])?;
    openssl(&[
        "x509".as_ref(),
        "-req".as_ref(),
        "-in".as_ref(),
        request.as_os_str(),
        "-CA".as_ref(),
        ca_cert.as_os_str(),
        "-CAkey".as_ref(),
        ca_key.as_os_str(),
        "-CAcreateserial".as_ref(),
        "-days".as_ref(),
        "2".as_ref(),
        "-extfile".as_ref(),
        extensions.as_os_str(),
        "-out".as_ref(),
        cert.as_os_str(),
    ])
}
