//! The listener of the HTTP gateway (docs/operations.md "The gateway over
//! HTTP"): the server loop with its connection bounds and graceful stop,
//! and the TLS config.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use super::{HttpError, HttpGateway, HttpReport};

/// Builds the rustls server config for the listener from PEM files.
///
/// # Errors
/// [`HttpError::Tls`] when a file is unreadable or holds no usable key or certificate.
pub fn tls_config(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Result<Arc<rustls::ServerConfig>, HttpError> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| HttpError::Tls(format!("{}: {e}", cert.display())))?
        .collect::<Result<_, _>>()
        .map_err(|e| HttpError::Tls(format!("{}: {e}", cert.display())))?;
    if certs.is_empty() {
        return Err(HttpError::Tls(format!(
            "{}: no certificate",
            cert.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| HttpError::Tls(format!("{}: {e}", key.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| HttpError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| HttpError::Tls(e.to_string()))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Serves the gateway on `listener` (over TLS when `tls` is set) until
/// `shutdown` resolves; then stops accepting, lets exchanges in flight end
/// (at most the drain limit), ends the calls still open with `client_gone`,
/// and returns what happened.
pub async fn serve(
    gateway: HttpGateway,
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()>,
) -> HttpReport {
    let graceful = GracefulShutdown::new();
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let limits = gateway.inner.config.limits.clone();
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let app = gateway.router();
    let expiry = {
        let inner = Arc::clone(&gateway.inner);
        let every =
            (limits.session_idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(60));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                inner.expire_sessions();
            }
        })
    };
    tokio::pin!(shutdown);
    loop {
        let Ok(permit) = Arc::clone(&connections).acquire_owned().await else {
            break;
        };
        let (stream, _peer): (_, SocketAddr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("tally: gateway: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let watcher = graceful.watcher();
        let acceptor = acceptor.clone();
        let header_timeout = limits.header_read_timeout;
        tokio::spawn(async move {
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout);
            match acceptor {
                None => {
                    let conn = builder.serve_connection(TokioIo::new(stream), service);
                    let _ = watcher.watch(conn).await;
                }
                Some(acceptor) => {
                    let handshake =
                        tokio::time::timeout(header_timeout, acceptor.accept(stream)).await;
                    let Ok(Ok(tls_stream)) = handshake else {
                        return;
                    };
                    let conn = builder.serve_connection(TokioIo::new(tls_stream), service);
                    let _ = watcher.watch(conn).await;
                }
            }
            drop(permit);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(limits.drain) => {}
    }
    expiry.abort();
    gateway.close();
    gateway.report()
}
