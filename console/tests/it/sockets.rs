//! The console over real sockets: `tally serve`'s server function
//! (`tally_witness::server::serve`) on a loopback port, with the witness's
//! and the console's routers, and plain TCP clients written here, so that
//! client addresses and slow bodies are what a hostile client would send.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use rand_core::OsRng;
use tally_console::store::NewLink;
use tally_console::{Console, ConsoleLimits};
use tally_schemas::time::SystemClock;
use tally_schemas::{AgentName, UnixMillis};
use tally_testkit::fixture::{self, Fixture, PackSpec};
use tally_witness::config::ServeConfig;
use tally_witness::{server, Witness};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

struct Server {
    addr: SocketAddr,
    witness: Arc<Witness>,
    console: Arc<Console>,
    api_key: String,
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
        let api_key = opened.first_start.unwrap().api_key.token;
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
            server::ServeOptions {
                drain: Duration::from_secs(1),
                ..Default::default()
            },
            async move {
                let _ = stopped.await;
            },
        ));
        Self {
            addr,
            witness,
            console,
            api_key,
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

    /// Logs in as an operator over HTTP, as a browser does; returns the
    /// session cookie and the CSRF token of its forms.
    async fn operator_login(&self) -> (String, String) {
        let host = self.addr;
        let mut c = self.connect_from(Ipv4Addr::LOCALHOST).await;
        let (_, head, page) = exchange(
            &mut c,
            format!("GET /console/login HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await;
        let login_cookie = set_cookie(&head, "tally_login");
        let token = between(&page, "name=\"login_token\" value=\"", "\"");
        let body = format!("login_token={token}&api_key={}", self.api_key);
        let mut c = self.connect_from(Ipv4Addr::LOCALHOST).await;
        let (status, head, _) = exchange(
            &mut c,
            format!(
                "POST /console/login HTTP/1.1\r\nHost: {host}\r\nCookie: {login_cookie}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await;
        assert_eq!(status, 303, "{head}");
        let session = set_cookie(&head, "tally_console");
        let mut c = self.connect_from(Ipv4Addr::LOCALHOST).await;
        let (status, _, page) = exchange(
            &mut c,
            format!("GET /console/verify HTTP/1.1\r\nHost: {host}\r\nCookie: {session}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await;
        assert_eq!(status, 200);
        let csrf = between(&page, "name=\"csrf\" value=\"", "\"").to_owned();
        (session, csrf)
    }

    /// An auditor link to a registered agent; returns its URL path.
    fn auditor_link(&self) -> String {
        let agent = AgentName::new("audited-bot").unwrap();
        let now = self.witness.now();
        self.witness
            .registry()
            .add_agent(
                "default",
                &agent,
                fixture::key_from_label("audited-bot").public_key(),
                now,
            )
            .unwrap();
        let (_, token) = self
            .console
            .links()
            .create(
                NewLink {
                    project: "default".into(),
                    agents: vec![agent],
                    since: None,
                    until: None,
                    expires: UnixMillis::new(now.as_millis() + 3_600_000),
                    label: "slow auditor".into(),
                },
                now,
                &mut OsRng,
            )
            .unwrap();
        format!("/console/a/{token}")
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

fn set_cookie(head: &str, name: &str) -> String {
    head.lines()
        .filter(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .filter_map(|l| l.split_once(':').map(|(_, v)| v.trim()))
        .find(|v| v.starts_with(&format!("{name}=")))
        .and_then(|v| v.split(';').next())
        .unwrap_or_else(|| panic!("no {name} cookie in {head}"))
        .to_owned()
}

fn between<'a>(s: &'a str, start: &str, end: &str) -> &'a str {
    let i = s
        .find(start)
        .unwrap_or_else(|| panic!("{start:?} not in {s}"))
        + start.len();
    let j = s[i..].find(end).unwrap() + i;
    &s[i..j]
}

const BOUNDARY: &str = "----tallysockettestboundary";

/// A multipart body with these (name, content) fields, files all.
fn multipart(fields: &[(&str, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for (name, data) in fields {
        body.extend_from_slice(
            format!("--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n")
                .as_bytes(),
        );
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    body
}

/// The head of a verify upload of `len` body bytes (`Connection: close`
/// unless `keep_alive`).
fn upload_head(
    host: SocketAddr,
    path: &str,
    cookie: Option<&str>,
    len: usize,
    keep_alive: bool,
) -> Vec<u8> {
    let cookie = cookie
        .map(|c| format!("Cookie: {c}\r\n"))
        .unwrap_or_default();
    let close = if keep_alive {
        ""
    } else {
        "Connection: close\r\n"
    };
    format!(
        "POST {path}/verify HTTP/1.1\r\nHost: {host}\r\n{cookie}Content-Type: multipart/form-data; boundary={BOUNDARY}\r\nContent-Length: {len}\r\n{close}\r\n"
    )
    .into_bytes()
}

/// A small valid pack with its agent-keys.json and witness key (the
/// fixture's log, not this witness's: the verify page checks any pack).
fn valid_pack() -> (Vec<u8>, Vec<u8>, String) {
    let mut fx = Fixture::new("tally.test/log", "socket-test-log");
    fx.add_agent("bot", "bot/1");
    fx.call("bot", "1", "refund");
    fx.commit();
    let pack = fixture::to_jsonl(&fx.pack_lines(&PackSpec::default()));
    let keys = fixture::to_json(&fx.agent_keys());
    (pack, keys, fx.log.verifier().vkey())
}

/// An operator's verify upload, sent whole; returns status and page.
async fn operator_upload(s: &Server, cookie: &str, csrf: &str) -> (u16, String) {
    let (pack, keys, vkey) = valid_pack();
    let body = multipart(&[
        ("csrf", csrf.as_bytes()),
        ("witness_key", vkey.as_bytes()),
        ("agent_keys", &keys),
        ("pack", &pack),
    ]);
    let mut request = upload_head(s.addr, "/console", Some(cookie), body.len(), false);
    request.extend_from_slice(&body);
    let mut c = s.connect_from(Ipv4Addr::LOCALHOST).await;
    let (status, _, page) = exchange(&mut c, &request).await;
    (status, page)
}

/// An auditor's verify upload, sent whole; returns status and page.
async fn auditor_upload(s: &Server, link: &str) -> (u16, String) {
    let (pack, keys, vkey) = valid_pack();
    let body = multipart(&[
        ("witness_key", vkey.as_bytes()),
        ("agent_keys", &keys),
        ("pack", &pack),
    ]);
    let mut request = upload_head(s.addr, link, None, body.len(), false);
    request.extend_from_slice(&body);
    let mut c = s.connect_from(Ipv4Addr::new(127, 0, 0, 9)).await;
    let (status, _, page) = exchange(&mut c, &request).await;
    (status, page)
}

/// Starts an upload on an auditor link that sends its head (keep-alive, as
/// a hostile client would) and the start of its body, then nothing more.
async fn stalled_auditor_upload(s: &Server, link: &str) -> TcpStream {
    let mut c = s.connect_from(Ipv4Addr::new(127, 0, 0, 9)).await;
    let mut request = upload_head(s.addr, link, None, 1_000_000, true);
    request.extend_from_slice(
        format!("--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"witness_key\"\r\n\r\n")
            .as_bytes(),
    );
    c.write_all(&request).await.unwrap();
    c
}

/// Stalled uploads from auditor links never make operators wait: the two
/// of the attack run made every operator upload answer 503.
#[tokio::test]
async fn console_stalled_auditor_uploads_do_not_starve_operators() {
    let s = Server::start(ConsoleLimits::default()).await;
    let link = s.auditor_link();
    let (cookie, csrf) = s.operator_login().await;
    let _held = [
        stalled_auditor_upload(&s, &link).await,
        stalled_auditor_upload(&s, &link).await,
    ];
    // Let the server start both handlers.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, page) = operator_upload(&s, &cookie, &csrf).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("PASS: 12 checks"), "{page}");
    s.stop().await;
}

/// A stalled upload is answered 408 and its connection closed after the
/// idle timeout, and its slot is free again.
#[tokio::test]
async fn console_stalled_upload_is_cut_off_and_frees_its_slot() {
    let s = Server::start(ConsoleLimits {
        upload_idle: Duration::from_secs(1),
        ..ConsoleLimits::default()
    })
    .await;
    let link = s.auditor_link();
    let mut held = stalled_auditor_upload(&s, &link).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The one auditor slot is taken.
    let (status, page) = auditor_upload(&s, &link).await;
    assert_eq!(status, 503, "{page}");
    // The server answers the stalled upload and closes the connection
    // (read_answer reads to the end, and fails after 60 s).
    let started = std::time::Instant::now();
    let (status, _, page) = read_answer(&mut held).await;
    assert_eq!(status, 408, "{page}");
    assert!(page.contains("sent nothing for 1s"), "{page}");
    assert!(started.elapsed() < Duration::from_secs(20));
    let (status, page) = auditor_upload(&s, &link).await;
    assert_eq!(status, 200, "the slot is free again: {page}");
    assert!(page.contains("PASS: 12 checks"), "{page}");
    s.stop().await;
}

/// An upload that trickles (a byte now and then, never idle for long) is
/// cut off at the upload deadline.
#[tokio::test]
async fn console_trickling_upload_is_cut_off_at_the_deadline() {
    let s = Server::start(ConsoleLimits {
        upload_idle: Duration::from_secs(2),
        upload_deadline: Duration::from_secs(3),
        ..ConsoleLimits::default()
    })
    .await;
    let link = s.auditor_link();
    let mut c = stalled_auditor_upload(&s, &link).await;
    let started = std::time::Instant::now();
    let mut answer = Vec::new();
    // One byte of the witness key every 300 ms until the server answers.
    while started.elapsed() < Duration::from_secs(30) {
        if c.write_all(b"x").await.is_err() {
            break;
        }
        let mut buf = [0u8; 4096];
        match tokio::time::timeout(Duration::from_millis(300), c.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
    }
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut rest)).await;
    answer.extend_from_slice(&rest);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("took longer than 3s"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(30));
    s.stop().await;
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
