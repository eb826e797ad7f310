//! The console over real sockets: `tally serve`'s server function
//! (`tally_witness::server::serve`) on a loopback port, with the witness's
//! and the console's routers, and plain TCP clients written here, so that
//! client addresses and slow bodies are what a hostile client would send.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use rand_core::OsRng;
use tally_console::{Console, ConsoleLimits};
use tally_schemas::time::SystemClock;
use tally_witness::config::ServeConfig;
use tally_witness::{server, Witness};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

struct Server {
    addr: SocketAddr,
    witness: Arc<Witness>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Server {
    async fn start(limits: ConsoleLimits) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let cfg = ServeConfig {
            data_dir: dir.path().to_owned(),
            ..ServeConfig::default()
        };
        let opened = server::open(&cfg, None, Arc::new(SystemClock), Box::new(OsRng)).unwrap();
        let witness = opened.witness;
        let console =
            Console::open_with_limits(Arc::clone(&witness), dir.path(), false, limits).unwrap();
        let app = tally_witness::http::router(Arc::clone(&witness))
            .merge(tally_console::router(Arc::clone(&console)));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let done = tokio::spawn(server::serve(
            listener,
            app,
            None,
            async move {
                let _ = stopped.await;
            },
            Duration::from_secs(1),
        ));
        Self {
            addr,
            witness,
            stop: Some(stop),
            done: Some(done),
            _dir: dir,
        }
    }

    /// A connection to the server from the loopback address `from`
    /// (127.0.0.0/8 is all loopback on Linux).
    async fn connect_from(&self, from: Ipv4Addr) -> TcpStream {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::new(IpAddr::V4(from), 0)).unwrap();
        socket.connect(self.addr).await.unwrap()
    }

    async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(d) = self.done.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), d).await;
        }
        let log = Arc::clone(self.witness.log());
        let _ = tokio::task::spawn_blocking(move || log.shutdown()).await;
    }
}

/// Sends `request` whole and reads the answer to the end (the requests
/// here say `Connection: close`): status, headers, body.
async fn exchange(stream: &mut TcpStream, request: &[u8]) -> (u16, String, String) {
    stream.write_all(request).await.unwrap();
    read_answer(stream).await
}

async fn read_answer(stream: &mut TcpStream) -> (u16, String, String) {
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), stream.read_to_end(&mut raw))
        .await
        .expect("the server answers and closes within 60 s")
        .unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_owned(), body.to_owned())
}

fn login_post(host: SocketAddr) -> Vec<u8> {
    let body = "api_key=tally_not_a_key";
    format!(
        "POST /console/login HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// `tally serve` hands each connection's address to the console, so one
/// address that is throttled does not throttle another.
#[tokio::test]
async fn console_login_throttle_sees_each_client_address() {
    let s = Server::start(ConsoleLimits::default()).await;
    let a = Ipv4Addr::new(127, 0, 0, 1);
    let b = Ipv4Addr::new(127, 0, 0, 2);
    let mut throttled = None;
    for _ in 0..100 {
        let mut c = s.connect_from(a).await;
        let (status, head, _) = exchange(&mut c, &login_post(s.addr)).await;
        if status == 429 {
            throttled = Some(head);
            break;
        }
        // No login-form token: refused, but counted.
        assert_eq!(status, 403, "{head}");
    }
    let head = throttled.expect("one address is throttled");
    assert!(
        head.to_ascii_lowercase().contains("\r\nretry-after: "),
        "{head}"
    );
    let mut c = s.connect_from(b).await;
    let (status, head, _) = exchange(&mut c, &login_post(s.addr)).await;
    assert_eq!(status, 403, "another address is not throttled: {head}");
    s.stop().await;
}
