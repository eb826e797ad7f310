//! The listener of the HTTP gateway (docs/operations.md "The gateway over
//! HTTP"): tally-net's server loop (docs/architecture.md "One server
//! loop") with a plain connection cap, the header read timeout (also the
//! TLS handshake's), HTTP/2, a graceful stop; and the TLS config.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

use super::config::{HttpError, HttpReport};
use super::state::HttpGateway;

/// Builds the rustls server config for the listener from PEM files
/// (tally-net's [`tally_net::tls_config`]).
///
/// # Errors
/// [`HttpError::Tls`] when a file is unreadable or holds no usable key or certificate.
pub fn tls_config(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Result<Arc<rustls::ServerConfig>, HttpError> {
    tally_net::tls_config(cert, key).map_err(|e| HttpError::Tls(e.to_string()))
}

/// How long the gateway pauses after a failed accept.
const ACCEPT_PAUSE: Duration = Duration::from_millis(20);

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
    let limits = gateway.inner.config.limits.clone();
    let policy = tally_net::Bounded::new(limits.max_connections, |e| {
        eprintln!("tally: gateway: accept failed: {e}");
    });
    let options = tally_net::Options {
        tls,
        tls_handshake_timeout: limits.header_read_timeout,
        wait_for_first_byte: false,
        http: tally_net::Http {
            header_read_timeout: Some(limits.header_read_timeout),
            max_buf_size: None,
            http2: Some(tally_net::Http2::default()),
        },
        connection_lifetime: None,
        accept_backoff: tally_net::Backoff {
            min: ACCEPT_PAUSE,
            max: ACCEPT_PAUSE,
        },
        drain: limits.drain,
    };
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
    let service = move |_: &_, _, _| TowerToHyperService::new(app.clone());
    // A drain that times out leaves the calls still open to `close` below.
    let _ = tally_net::serve(listener, policy, service, options, shutdown).await;
    expiry.abort();
    gateway.close();
    gateway.report()
}
