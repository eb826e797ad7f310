//! Serving the cosigner's routes with bounded resources: at most
//! `max_connections` connections at once (more wait in the listen
//! backlog), a header read timeout, a time limit per request (408) and
//! per connection, bodies bounded by the add-checkpoint handler (413).
//! HTTP/1.1 with keep-alive, as c2sp.org/tlog-witness recommends.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

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
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = Arc::clone(&slots).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .max_buf_size(64 * 1024)
            .keep_alive(true);
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        let watched = graceful.watch(conn);
        let lifetime = limits.connection_lifetime;
        tokio::spawn(async move {
            let _ = tokio::time::timeout(lifetime, watched).await;
            drop(permit);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(limits.drain) => {
            tracing::warn!("drain timeout: closing connections with requests still in flight");
        }
    }
}
