//! The bounded server loop (docs/architecture.md "One server loop"): accept
//! under a connection bound, serve each connection (optional TLS with a
//! handshake timeout, HTTP/1.1 and, where the caller enables it, HTTP/2),
//! and stop gracefully within a drain limit.
//!
//! What bounds the connections is a [`ConnPolicy`]: [`Bounded`] is a plain
//! cap (the gateway and the cosigner); `tally serve` plugs in its own
//! (tally-witness `conn`: eviction at the cap, per-client limits,
//! deadlines, docs/operations.md "Connections").

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

/// The error type hyper takes from services and bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How a server bounds its connections: room for one more, what each one
/// holds, how its socket is watched, when it is closed. The loop calls
/// [`slot`](Self::slot), accepts, [`open`](Self::open)s the connection,
/// and runs the connection's serving inside [`watch`](Self::watch).
pub trait ConnPolicy: Send + Sync + Sized + 'static {
    /// A place under the connection bound, taken before accepting.
    type Slot: Send + 'static;
    /// One accepted connection's state; clones are handles on the same
    /// connection (one is given to the service maker and the socket).
    type Conn: Clone + Send + Sync + 'static;
    /// What the HTTP layer reads and writes: the socket or TLS stream `T`,
    /// wrapped as the policy needs.
    type Io<T>: AsyncRead + AsyncWrite + Unpin + Send + 'static
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// Room for one more connection; waits while there is none. `None`
    /// stops accepting (as at shutdown).
    fn slot(self: &Arc<Self>) -> impl Future<Output = Option<Self::Slot>> + Send;

    /// An accept failed with an error of the listener (the open-file limit,
    /// say), not of one incoming connection; the loop then backs off.
    fn accept_failed(&self, error: &io::Error);

    /// A connection from `peer` was accepted, holding `slot`.
    fn open(self: &Arc<Self>, slot: Self::Slot, peer: SocketAddr) -> Self::Conn;

    /// Wraps the connection's socket (after the TLS handshake, the TLS
    /// stream).
    fn wrap_io<T>(conn: Self::Conn, io: T) -> Self::Io<T>
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// The connection's TLS handshake did not finish within its timeout
    /// (the connection is then closed).
    fn tls_handshake_timed_out(conn: &Self::Conn) {
        let _ = conn;
    }

    /// Runs `connection` (the first byte, the TLS handshake and HTTP
    /// serving of one accepted socket) to its end; a policy may close it
    /// earlier by dropping it. `stopping` turns `true` when the server
    /// stops accepting. By default: runs it to the end, then drops `conn`.
    fn watch<F>(
        conn: Self::Conn,
        connection: F,
        stopping: watch::Receiver<bool>,
    ) -> impl Future<Output = ()> + Send + 'static
    where
        F: Future<Output = ()> + Send + 'static,
    {
        async move {
            let _stopping = stopping;
            connection.await;
            drop(conn);
        }
    }
}

/// A plain connection cap: at most `max_connections` open; at the cap
/// accepting waits (more clients wait in the listen backlog).
#[derive(Debug)]
pub struct Bounded {
    slots: Arc<Semaphore>,
    on_accept_error: fn(&io::Error),
}

impl Bounded {
    /// A cap of `max_connections`; `on_accept_error` reports a failed
    /// accept (the caller's own log line).
    #[must_use]
    pub fn new(max_connections: usize, on_accept_error: fn(&io::Error)) -> Arc<Self> {
        Arc::new(Self {
            slots: Arc::new(Semaphore::new(max_connections)),
            on_accept_error,
        })
    }
}

impl ConnPolicy for Bounded {
    type Slot = OwnedSemaphorePermit;
    type Conn = Arc<OwnedSemaphorePermit>;
    type Io<T>
        = T
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    fn slot(self: &Arc<Self>) -> impl Future<Output = Option<Self::Slot>> + Send {
        let slots = Arc::clone(&self.slots);
        async move { slots.acquire_owned().await.ok() }
    }

    fn accept_failed(&self, error: &io::Error) {
        (self.on_accept_error)(error);
    }

    fn open(self: &Arc<Self>, slot: Self::Slot, _peer: SocketAddr) -> Self::Conn {
        Arc::new(slot)
    }

    fn wrap_io<T>(_conn: Self::Conn, io: T) -> T
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        io
    }
}

/// The HTTP settings of every connection.
#[derive(Debug, Clone, Default)]
pub struct Http {
    /// HTTP/1.1: the time from a head's first byte to its end (hyper's
    /// header read timer); `None`: no such timer (a policy bounds heads).
    pub header_read_timeout: Option<Duration>,
    /// HTTP/1.1: the read buffer, and so the longest head (longer ones are
    /// answered 431); `None`: hyper's default. At least 8 KiB, hyper's
    /// minimum.
    pub max_buf_size: Option<usize>,
    /// HTTP/2 with these settings (h2c by its preface, h2 over TLS by
    /// ALPN); `None`: HTTP/1.1 only.
    pub http2: Option<Http2>,
}

/// HTTP/2 settings; `None` leaves hyper's default.
#[derive(Debug, Clone, Copy, Default)]
pub struct Http2 {
    /// Streams a client may open at once on one connection.
    pub max_concurrent_streams: Option<u32>,
    /// The largest header list of a request.
    pub max_header_list_size: Option<u32>,
}

/// The pauses after failed accepts: the first is `min`, each next one
/// twice the last, at most `max`; an accept that succeeds starts over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first pause.
    pub min: Duration,
    /// The longest pause.
    pub max: Duration,
}

/// How [`serve`] runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Serve HTTPS with this configuration; `None`: plain HTTP.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// The time a TLS handshake may take.
    pub tls_handshake_timeout: Duration,
    /// Wait for a connection's first byte holding only its socket, before
    /// the TLS handshake and hyper's buffers (a policy's deadline must
    /// bound the wait: there is no timeout here).
    pub wait_for_first_byte: bool,
    /// The HTTP settings.
    pub http: Http,
    /// Close a connection this long after its HTTP serving starts
    /// (a keep-alive client reconnects); `None`: no limit.
    pub connection_lifetime: Option<Duration>,
    /// The pauses after failed accepts.
    pub accept_backoff: Backoff,
    /// How long shutdown waits for requests in flight.
    pub drain: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            tls: None,
            tls_handshake_timeout: Duration::from_secs(10),
            wait_for_first_byte: false,
            http: Http::default(),
            connection_lifetime: None,
            accept_backoff: Backoff {
                min: Duration::from_millis(10),
                max: Duration::from_secs(1),
            },
            drain: Duration::from_secs(30),
        }
    }
}

/// How [`serve`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Drained {
    /// Every request in flight finished within the drain limit.
    All,
    /// The drain limit passed with requests still in flight; their
    /// connections are left to close as they end.
    TimedOut,
}

/// Errors of one incoming connection (the client gave up before it was
/// accepted), not of the listener: accept the next one at once.
fn is_connection_error(e: &io::Error) -> bool {
    use io::ErrorKind;
    matches!(
        e.kind(),
        ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset | ErrorKind::ConnectionRefused
    )
}

/// What every connection of one [`serve`] shares.
struct Shared<M> {
    make_service: M,
    http: auto::Builder<TokioExecutor>,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    tls_handshake_timeout: Duration,
    wait_for_first_byte: bool,
    connection_lifetime: Option<Duration>,
}

fn http_builder(http: &Http) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    {
        let mut h1 = builder.http1();
        h1.keep_alive(true);
        match http.header_read_timeout {
            Some(t) => {
                h1.timer(TokioTimer::new()).header_read_timeout(t);
            }
            None => {
                h1.header_read_timeout(None);
            }
        }
        if let Some(n) = http.max_buf_size {
            h1.max_buf_size(n.max(8 * 1024));
        }
    }
    match http.http2 {
        Some(h2) => {
            let mut b = builder.http2();
            if let Some(n) = h2.max_concurrent_streams {
                b.max_concurrent_streams(n);
            }
            if let Some(n) = h2.max_header_list_size {
                b.max_header_list_size(n);
            }
        }
        None => builder = builder.http1_only(),
    }
    builder
}

/// Serves on `listener` until `shutdown` resolves; then stops accepting,
/// tells the policy's watchers (`stopping`), lets requests in flight
/// finish (at most `options.drain`), and returns whether they all did.
///
/// Each accepted connection is `policy`'s ([`ConnPolicy`]); its requests go
/// to the service `make_service(conn, peer, over_tls)` makes for it. A
/// failed accept of the listener is told to the policy and backs off as
/// `options.accept_backoff` says.
pub async fn serve<P, M, S, B>(
    listener: TcpListener,
    policy: Arc<P>,
    make_service: M,
    options: Options,
    shutdown: impl Future<Output = ()>,
) -> Drained
where
    P: ConnPolicy,
    M: Fn(&P::Conn, SocketAddr, bool) -> S + Send + Sync + 'static,
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let graceful = GracefulShutdown::new();
    let (stop, stopping) = watch::channel(false);
    let shared = Arc::new(Shared {
        make_service,
        http: http_builder(&options.http),
        acceptor: options.tls.map(tokio_rustls::TlsAcceptor::from),
        tls_handshake_timeout: options.tls_handshake_timeout,
        wait_for_first_byte: options.wait_for_first_byte,
        connection_lifetime: options.connection_lifetime,
    });
    let Backoff { min, max } = options.accept_backoff;
    tokio::pin!(shutdown);
    let mut backoff = min;
    'accepting: loop {
        let slot = tokio::select! {
            slot = policy.slot() => match slot {
                Some(slot) => slot,
                None => break,
            },
            () = &mut shutdown => break,
        };
        let (stream, peer) = loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => {
                        backoff = min;
                        break accepted;
                    }
                    Err(e) if is_connection_error(&e) => {}
                    Err(e) => {
                        policy.accept_failed(&e);
                        tokio::select! {
                            () = tokio::time::sleep(backoff) => {}
                            () = &mut shutdown => break 'accepting,
                        }
                        backoff = (backoff * 2).min(max);
                    }
                },
                () = &mut shutdown => break 'accepting,
            }
        };
        let _ = stream.set_nodelay(true);
        let conn = policy.open(slot, peer);
        let connection = connection::<P, M, S, B>(
            stream,
            peer,
            conn.clone(),
            Arc::clone(&shared),
            graceful.watcher(),
        );
        tokio::spawn(P::watch(conn, connection, stopping.clone()));
    }
    drop(listener);
    let _ = stop.send(true);
    tokio::select! {
        () = graceful.shutdown() => Drained::All,
        () = tokio::time::sleep(options.drain) => Drained::TimedOut,
    }
}

/// One accepted connection: with `wait_for_first_byte`, waits for its
/// first byte holding only the socket (the rest of the connection's state
/// is allocated once the client sends), then the TLS handshake if any
/// (bounded by its timeout), then HTTP.
async fn connection<P, M, S, B>(
    stream: TcpStream,
    peer: SocketAddr,
    conn: P::Conn,
    shared: Arc<Shared<M>>,
    watcher: Watcher,
) where
    P: ConnPolicy,
    M: Fn(&P::Conn, SocketAddr, bool) -> S + Send + Sync + 'static,
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    if shared.wait_for_first_byte && stream.readable().await.is_err() {
        return;
    }
    // Boxed, so that a connection waiting for its first byte is a small
    // task: the HTTP connection's state is allocated only now.
    Box::pin(serve_http::<P, M, S, B>(
        stream, peer, conn, shared, watcher,
    ))
    .await;
}

/// The TLS handshake if any, then HTTP (see [`connection`]).
async fn serve_http<P, M, S, B>(
    stream: TcpStream,
    peer: SocketAddr,
    conn: P::Conn,
    shared: Arc<Shared<M>>,
    watcher: Watcher,
) where
    P: ConnPolicy,
    M: Fn(&P::Conn, SocketAddr, bool) -> S + Send + Sync + 'static,
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let service = (shared.make_service)(&conn, peer, shared.acceptor.is_some());
    match &shared.acceptor {
        None => serve_io(&shared, P::wrap_io(conn, stream), service, watcher).await,
        Some(acceptor) => {
            let handshake = acceptor.accept(stream);
            let tls = match tokio::time::timeout(shared.tls_handshake_timeout, handshake).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(_)) => return,
                Err(_) => {
                    P::tls_handshake_timed_out(&conn);
                    return;
                }
            };
            serve_io(&shared, P::wrap_io(conn, tls), service, watcher).await;
        }
    }
}

/// HTTP on one connection's (wrapped) socket, watched for graceful
/// shutdown and bounded by the connection lifetime if any.
async fn serve_io<M, I, S, B>(shared: &Shared<M>, io: I, service: S, watcher: Watcher)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let serving = watcher.watch(shared.http.serve_connection(TokioIo::new(io), service));
    match shared.connection_lifetime {
        Some(lifetime) => {
            let _ = tokio::time::timeout(lifetime, serving).await;
        }
        None => {
            let _ = serving.await;
        }
    }
}
