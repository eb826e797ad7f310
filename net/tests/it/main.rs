//! tally-net's server loop and TLS configuration on real loopback sockets:
//! the connection cap, HTTP/1.1-only and HTTP/2 over TLS (ALPN), the TLS
//! handshake timeout told to the policy, the header read timeout, and the
//! drain at shutdown.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tally_net::{serve, Bounded, ConnPolicy, Drained, Http, Http2, Options, TlsError};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

fn tls_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/tls")
}

/// `/` answers `ok`; `/slow` after 300 ms; `/hang` never.
async fn handler(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    match req.uri().path() {
        "/slow" => tokio::time::sleep(Duration::from_millis(300)).await,
        "/hang" => std::future::pending::<()>().await,
        _ => {}
    }
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}

fn ignore_accept_error(_: &io::Error) {}

/// Starts `serve` with `policy` on a loopback port; returns the address,
/// the shutdown trigger and the loop's end.
async fn start<P: ConnPolicy>(
    policy: Arc<P>,
    options: Options,
) -> (
    SocketAddr,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<Drained>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let served = tokio::spawn(serve(
        listener,
        policy,
        |_: &P::Conn, _, _| service_fn(handler),
        options,
        async move {
            let _ = stopped.await;
        },
    ));
    (addr, stop, served)
}

/// Sends `GET path` over HTTP/1.1 on `stream`.
async fn send_get(stream: &mut TcpStream, path: &str) {
    let head = format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
}

/// Reads until the answer's body `ok` has arrived; `None` on EOF.
async fn read_ok(stream: &mut TcpStream) -> Option<String> {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.ends_with(b"ok") {
        let n = stream.read(&mut buf).await.unwrap_or(0);
        if n == 0 {
            return None;
        }
        got.extend_from_slice(&buf[..n]);
    }
    Some(String::from_utf8_lossy(&got).into_owned())
}

#[test]
fn tls_config_loads_the_test_files_and_offers_h2_then_http1() {
    let cfg = tally_net::tls_config(&tls_dir().join("server.pem"), &tls_dir().join("server.key"))
        .unwrap();
    assert_eq!(
        cfg.alpn_protocols,
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    );
}

#[test]
fn tls_config_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pem");
    let key = tls_dir().join("server.key");
    let e = tally_net::tls_config(&missing, &key).unwrap_err();
    assert!(matches!(e, TlsError::Pem { .. }), "{e:?}");
    assert!(
        e.to_string()
            .starts_with(&format!("{}: ", missing.display())),
        "{e}"
    );
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let e = tally_net::tls_config(&empty, &key).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("{}: no certificate", empty.display())
    );
    // A certificate given as the key: no private key in the file.
    let cert = tls_dir().join("server.pem");
    let e = tally_net::tls_config(&cert, &cert).unwrap_err();
    assert!(
        e.to_string().starts_with(&format!("{}: ", cert.display())),
        "{e}"
    );
}

#[tokio::test]
async fn the_cap_holds_the_next_connection_until_one_closes() {
    let (addr, stop, served) = start(
        Bounded::new(1, ignore_accept_error),
        Options {
            drain: Duration::from_secs(2),
            ..Options::default()
        },
    )
    .await;
    let mut first = TcpStream::connect(addr).await.unwrap();
    send_get(&mut first, "/").await;
    assert!(read_ok(&mut first).await.is_some());
    // The second connection waits in the backlog while the first is open.
    let mut second = TcpStream::connect(addr).await.unwrap();
    send_get(&mut second, "/").await;
    let early = tokio::time::timeout(Duration::from_millis(300), read_ok(&mut second)).await;
    assert!(early.is_err(), "served above the cap: {early:?}");
    drop(first);
    let late = tokio::time::timeout(Duration::from_secs(5), read_ok(&mut second))
        .await
        .expect("served once the first connection closed");
    assert!(late.unwrap().starts_with("HTTP/1.1 200"));
    drop(second);
    stop.send(()).unwrap();
    assert_eq!(served.await.unwrap(), Drained::All);
}

fn tls_client() -> tokio_rustls::TlsConnector {
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(tls_dir().join("ca.pem")).unwrap()
    {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
}

#[tokio::test]
async fn http2_over_tls_when_enabled_and_http1_only_otherwise() {
    let tls = tally_net::tls_config(&tls_dir().join("server.pem"), &tls_dir().join("server.key"))
        .unwrap();
    let (addr, stop, served) = start(
        Bounded::new(8, ignore_accept_error),
        Options {
            tls: Some(tls),
            http: Http {
                http2: Some(Http2 {
                    max_concurrent_streams: Some(4),
                    max_header_list_size: None,
                }),
                ..Http::default()
            },
            ..Options::default()
        },
    )
    .await;
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let stream = tls_client().connect(name, tcp).await.unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = Request::get("https://localhost/")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.version(), hyper::Version::HTTP_2);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"ok");
    drop(sender);
    stop.send(()).unwrap();
    assert_eq!(served.await.unwrap(), Drained::All);

    // HTTP/1.1 only: the h2c preface gets no HTTP/2 answer.
    let (addr, stop, served) =
        start(Bounded::new(8, ignore_accept_error), Options::default()).await;
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = Request::get("http://localhost/")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let refused = tokio::time::timeout(Duration::from_secs(5), sender.send_request(req))
        .await
        .expect("the HTTP/1.1-only server closed the h2c connection");
    assert!(refused.is_err(), "h2c served: {refused:?}");
    stop.send(()).unwrap();
    assert_eq!(served.await.unwrap(), Drained::All);
}

/// A cap that counts what the loop tells it.
#[derive(Default)]
struct Counting {
    slots: Option<Arc<Semaphore>>,
    accepted: AtomicUsize,
    handshake_timeouts: Arc<AtomicUsize>,
    watched: Arc<AtomicUsize>,
}

#[derive(Clone)]
struct Counted {
    _permit: Arc<OwnedSemaphorePermit>,
    handshake_timeouts: Arc<AtomicUsize>,
    watched: Arc<AtomicUsize>,
}

impl ConnPolicy for Counting {
    type Slot = OwnedSemaphorePermit;
    type Conn = Counted;
    type Io<T>
        = T
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    async fn slot(self: &Arc<Self>) -> Option<OwnedSemaphorePermit> {
        Arc::clone(self.slots.as_ref()?).acquire_owned().await.ok()
    }

    fn accept_failed(&self, _: &io::Error) {}

    fn open(self: &Arc<Self>, slot: OwnedSemaphorePermit, _: SocketAddr) -> Counted {
        self.accepted.fetch_add(1, Ordering::SeqCst);
        Counted {
            _permit: Arc::new(slot),
            handshake_timeouts: Arc::clone(&self.handshake_timeouts),
            watched: Arc::clone(&self.watched),
        }
    }

    fn wrap_io<T>(_: Counted, io: T) -> T
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        io
    }

    fn tls_handshake_timed_out(conn: &Counted) {
        conn.handshake_timeouts.fetch_add(1, Ordering::SeqCst);
    }

    async fn watch<F>(conn: Counted, connection: F, _: tokio::sync::watch::Receiver<bool>)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        connection.await;
        conn.watched.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn a_silent_tls_client_is_closed_at_the_handshake_timeout_and_the_policy_told() {
    let tls = tally_net::tls_config(&tls_dir().join("server.pem"), &tls_dir().join("server.key"))
        .unwrap();
    let policy = Arc::new(Counting {
        slots: Some(Arc::new(Semaphore::new(4))),
        ..Counting::default()
    });
    let (addr, stop, served) = start(
        Arc::clone(&policy),
        Options {
            tls: Some(tls),
            tls_handshake_timeout: Duration::from_millis(200),
            ..Options::default()
        },
    )
    .await;
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf))
        .await
        .expect("closed by the handshake timeout")
        .unwrap_or(0);
    assert_eq!(n, 0);
    assert!(
        t0.elapsed() >= Duration::from_millis(150),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(policy.accepted.load(Ordering::SeqCst), 1);
    assert_eq!(policy.handshake_timeouts.load(Ordering::SeqCst), 1);
    // The connection's end reached the policy's watcher.
    for _ in 0..50 {
        if policy.watched.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(policy.watched.load(Ordering::SeqCst), 1);
    stop.send(()).unwrap();
    assert_eq!(served.await.unwrap(), Drained::All);
}

#[tokio::test]
async fn a_policy_without_room_stops_the_loop() {
    let policy = Arc::new(Counting::default());
    let (_addr, _stop, served) = start(Arc::clone(&policy), Options::default()).await;
    let drained = tokio::time::timeout(Duration::from_secs(5), served)
        .await
        .expect("the loop ended when the policy gave no slot")
        .unwrap();
    assert_eq!(drained, Drained::All);
    assert_eq!(policy.accepted.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_slow_head_is_closed_at_the_header_read_timeout() {
    let (addr, stop, served) = start(
        Bounded::new(4, ignore_accept_error),
        Options {
            http: Http {
                header_read_timeout: Some(Duration::from_millis(200)),
                ..Http::default()
            },
            ..Options::default()
        },
    )
    .await;
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\nhost:").await.unwrap();
    let t0 = Instant::now();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), slow.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the slow head was not closed");
    assert!(
        t0.elapsed() >= Duration::from_millis(150),
        "{:?}",
        t0.elapsed()
    );
    assert!(!String::from_utf8_lossy(&got).contains(" 200 "), "{got:?}");
    stop.send(()).unwrap();
    assert_eq!(served.await.unwrap(), Drained::All);
}

#[tokio::test]
async fn shutdown_lets_a_request_in_flight_finish_within_the_drain() {
    let (addr, stop, served) = start(
        Bounded::new(4, ignore_accept_error),
        Options {
            drain: Duration::from_secs(5),
            ..Options::default()
        },
    )
    .await;
    let mut client = TcpStream::connect(addr).await.unwrap();
    send_get(&mut client, "/slow").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.send(()).unwrap();
    let answer = read_ok(&mut client).await.expect("answered while draining");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let drained = tokio::time::timeout(Duration::from_secs(5), served)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(drained, Drained::All);
    // No longer accepting.
    assert!(TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn shutdown_gives_up_at_the_drain_limit() {
    let (addr, stop, served) = start(
        Bounded::new(4, ignore_accept_error),
        Options {
            drain: Duration::from_millis(300),
            ..Options::default()
        },
    )
    .await;
    let mut client = TcpStream::connect(addr).await.unwrap();
    send_get(&mut client, "/hang").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t0 = Instant::now();
    stop.send(()).unwrap();
    let drained = tokio::time::timeout(Duration::from_secs(5), served)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(drained, Drained::TimedOut);
    assert!(
        t0.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t0.elapsed()
    );
}
