//! Serving the cosigner's routes with bounded resources: at most
//! `max_connections` connections at once (more wait in the listen
//! backlog), a header read timeout, a time limit per request (408) and
//! per connection, bodies bounded by the add-checkpoint handler (413).
//! HTTP/1.1 with keep-alive, as c2sp.org/tlog-witness recommends. The
//! loop is tally-net's (docs/architecture.md "One server loop").

use std::future::Future;
use std::time::Duration;

use axum::Router;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

/// Resource bounds of the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once.
    pub max_connections: usize,
    /// Time a client has to send a request's headers.
    pub header_timeout: Duration,
    /// Time for one request, from its headers to its answer (408 after).
    pub request_timeout: Duration,
    /// Time a connection may stay open (a keep-alive client reconnects).
    pub connection_lifetime: Duration,
    /// Time in-flight requests get to finish on shutdown.
    pub drain: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 256,
            header_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            connection_lifetime: Duration::from_secs(300),
            drain: Duration::from_secs(10),
        }
    }
}

/// How long the cosigner pauses after a failed accept.
const ACCEPT_PAUSE: Duration = Duration::from_millis(20);

/// Serves `app` on `listener` until `shutdown` resolves, then lets
/// in-flight requests finish (at most `limits.drain`).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    let app = app.layer(tower_http::timeout::TimeoutLayer::with_status_code(
        axum::http::StatusCode::REQUEST_TIMEOUT,
        limits.request_timeout,
    ));
    let policy = tally_net::Bounded::new(limits.max_connections.max(1), |e| {
        tracing::warn!(error = %e, "accept failed");
    });
    let options = tally_net::Options {
        tls: None,
        tls_handshake_timeout: limits.header_timeout,
        wait_for_first_byte: false,
        http: tally_net::Http {
            header_read_timeout: Some(limits.header_timeout),
            max_buf_size: Some(64 * 1024),
            // HTTP/1.1 only.
            http2: None,
        },
        connection_lifetime: Some(limits.connection_lifetime),
        accept_backoff: tally_net::Backoff {
            min: ACCEPT_PAUSE,
            max: ACCEPT_PAUSE,
        },
        drain: limits.drain,
    };
    let service = move |_: &_, _, _| TowerToHyperService::new(app.clone());
    if tally_net::serve(listener, policy, service, options, shutdown).await
        == tally_net::Drained::TimedOut
    {
        tracing::warn!("drain timeout: closing connections with requests still in flight");
    }
}
