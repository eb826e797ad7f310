//! The TLS configuration of every tally listener (docs/operations.md
//! "TLS"): rustls with the ring provider, its safe default protocol
//! versions, one certificate chain and key from PEM files, ALPN `h2` then
//! `http/1.1`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Why the TLS files gave no server configuration. The messages name the
/// file; callers wrap them in their own error (`TLS: …`).
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or parsed.
    #[error("{}: {source}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// Why.
        source: rustls::pki_types::pem::Error,
    },
    /// The certificate file holds no certificate.
    #[error("{}: no certificate", path.display())]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// rustls refused the key or the certificate chain.
    #[error("{0}")]
    Config(#[from] rustls::Error),
}

/// Builds the rustls server configuration from a PEM certificate chain and
/// a PEM private key.
///
/// # Errors
/// [`TlsError`] when a file is unreadable or holds no usable key or
/// certificate.
pub fn tls_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let pem = |path: &Path| {
        let path = path.to_owned();
        move |source| TlsError::Pem { path, source }
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(pem(cert))?
        .collect::<Result<_, _>>()
        .map_err(pem(cert))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: cert.to_owned(),
        });
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(pem(key))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}
