//! The routes of one connection, as hyper calls them: requests in flight
//! counted, bodies given their deadline, HSTS over TLS (docs/operations.md
//! "Connections", "TLS").

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::Router;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper::{Request, Response};
use tower::ServiceExt as _;

use super::body::{BodyLimits, DeadlineBody};
use super::state::{ConnState, ConnTrust, RequestGuard, ResponseProgress};

/// `Strict-Transport-Security` of every answer over TLS: browsers that
/// have seen it use HTTPS for the host for a year (docs/operations.md
/// "TLS"); subdomains are left alone, they may be other services.
pub(crate) const HSTS: &str = "max-age=31536000";

/// The routes of one connection: counts its requests in flight, gives each
/// request body its deadline, tells handlers the client's address (axum's
/// `ConnectInfo<SocketAddr>`) and hands them the connection's
/// [`ConnTrust`]; over TLS, adds `Strict-Transport-Security` to every answer.
#[derive(Clone)]
pub(crate) struct TrackedService {
    app: Router,
    state: Arc<ConnState>,
    body: BodyLimits,
    peer: std::net::SocketAddr,
    tls: bool,
}

impl TrackedService {
    /// `app` serving the connection `state` from `peer`, over TLS or not.
    pub(crate) fn new(
        app: Router,
        state: Arc<ConnState>,
        peer: std::net::SocketAddr,
        tls: bool,
    ) -> Self {
        let limits = &state.tracker.limits;
        let body = BodyLimits {
            timeout: limits.body_timeout,
            min_rate: limits.body_min_rate,
            stats: Arc::clone(&state.tracker.stats),
        };
        Self {
            app,
            state,
            body,
            peer,
            tls,
        }
    }
}

impl hyper::service::Service<Request<Incoming>> for TrackedService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let guard = self.state.begin();
        let http2 = req.version() == hyper::Version::HTTP_2;
        let limits = self.body.clone();
        let mut req = req.map(|b| Body::new(DeadlineBody::new(b, limits)));
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(self.peer));
        req.extensions_mut()
            .insert(ConnTrust(Arc::downgrade(&self.state)));
        let app = self.app.clone();
        let state = Arc::clone(&self.state);
        let tls = self.tls;
        Box::pin(async move {
            let mut resp = app.oneshot(req).await?;
            if tls {
                resp.headers_mut().insert(
                    hyper::header::STRICT_TRANSPORT_SECURITY,
                    hyper::header::HeaderValue::from_static(HSTS),
                );
            }
            Ok(resp.map(|inner| {
                let progress = http2.then(|| state.track_response());
                Body::new(GuardedBody {
                    inner,
                    progress,
                    state,
                    _guard: guard,
                })
            }))
        })
    }
}

/// A response body that ends its request (see [`RequestGuard`]) when it is
/// sent in full or dropped. On HTTP/2 it also notes when it was last taken
/// from, so that an answer the client does not take (a stream without
/// flow-control window, whose socket is never blocked) is noticed by the
/// watchdog; on HTTP/1.1 such a client blocks the socket, which
/// [`ConnIo`] notices.
struct GuardedBody {
    inner: Body,
    progress: Option<Arc<ResponseProgress>>,
    state: Arc<ConnState>,
    _guard: RequestGuard,
}

impl HttpBody for GuardedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if let Some(p) = &self.progress {
            p.last_ms.store(self.state.elapsed_ms(), Ordering::Relaxed);
            p.waiting_on_body.store(r.is_pending(), Ordering::Relaxed);
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
