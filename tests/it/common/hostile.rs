//! Hostile HTTP clients on plain sockets, and the measurements around them,
//! shared by the attack suite (tests/it/attack.rs) and the figures example
//! (examples/attack_figures.rs). docs/threat-model.md "Hostile connections"
//! lists the attacks; docs/operations.md "Connections" the limits that
//! answer them.
//!
//! Every attack connection is a tokio `TcpStream` that writes raw bytes and
//! then waits for the server to close it (EOF or reset); the time that took
//! is what the suite checks against the server's timeouts.

// The test and the example each use a different part of this module.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tally_schemas::Record;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::agent::Agent;

/// Raises this process's soft limit on open files to its hard limit (children
/// inherit it) and returns the new soft limit.
///
/// # Errors
/// When the hard limit is below `need`: the machine cannot hold the attack,
/// and the caller must fail loudly rather than measure something smaller.
pub(crate) fn raise_nofile(need: u64) -> Result<u64, String> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(|e| format!("getrlimit: {e}"))?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(|e| format!("setrlimit: {e}"))?;
    }
    if hard < need {
        return Err(format!(
            "the hard limit on open files is {hard}, below the {need} this attack needs; raise it (ulimit -Hn, or LimitNOFILE= in systemd) and run again"
        ));
    }
    Ok(hard)
}

/// Resident memory of process `pid` in KiB (Linux `/proc/<pid>/status`).
pub(crate) fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// What a hostile connection sends.
#[derive(Debug, Clone)]
pub(crate) enum Attack {
    /// The head of `POST /v1/records` announcing 1,000 body bytes, then one
    /// byte of body, then nothing (about 1 KB per connection).
    /// `key`: the bearer token sent, if any.
    SlowBody { key: Option<String> },
    /// A request head sent one byte a second, never finished.
    Slowloris,
    /// Connect and send nothing.
    Idle,
    /// A request head of about `bytes` bytes (one long header), never
    /// finished.
    LargeHead { bytes: usize },
    /// These bytes, then nothing (e.g. the start of a TLS ClientHello).
    Raw(Vec<u8>),
}

impl Attack {
    /// A short name for reports.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::SlowBody { key: Some(_) } => "slow body (with an API key)",
            Self::SlowBody { key: None } => "slow body (no key)",
            Self::Slowloris => "slowloris",
            Self::Idle => "idle",
            Self::LargeHead { .. } => "large unfinished head",
            Self::Raw(_) => "raw bytes",
        }
    }

    fn first_bytes(&self, authority: &str) -> Vec<u8> {
        match self {
            Self::SlowBody { key } => {
                let auth = key
                    .as_ref()
                    .map(|k| format!("Authorization: Bearer {k}\r\n"))
                    .unwrap_or_default();
                format!(
                    "POST /v1/records HTTP/1.1\r\nHost: {authority}\r\n{auth}Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{"
                )
                .into_bytes()
            }
            Self::Slowloris => {
                format!("POST /v1/records HTTP/1.1\r\nHost: {authority}\r\n").into_bytes()
            }
            Self::Idle => Vec::new(),
            Self::LargeHead { bytes } => {
                let mut b =
                    format!("GET /healthz HTTP/1.1\r\nHost: {authority}\r\nX-Pad: ").into_bytes();
                b.resize(b.len() + bytes, b'a');
                b
            }
            Self::Raw(bytes) => bytes.clone(),
        }
    }
}

/// How one hostile connection ended.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    /// Time from the connection's last write of its opening bytes until the
    /// server closed it; `None` when the server had not closed it when the
    /// client gave up.
    pub closed_after: Option<Duration>,
    /// The status code of what the server answered, if it answered.
    pub status: Option<u16>,
}

/// Opens `n` connections of `attack` to `addr`, at most `connect_at_once`
/// connecting at a time. Each connection sends its opening bytes, trickles
/// if it is a slowloris, and waits until the server closes it or
/// `give_up` passes. Returns once every connection is open (or failed to
/// connect, which panics: the server must keep accepting).
pub(crate) async fn open_held(
    addr: SocketAddr,
    attack: &Attack,
    n: usize,
    connect_at_once: usize,
    give_up: Duration,
) -> Vec<JoinHandle<Held>> {
    let gate = Arc::new(Semaphore::new(connect_at_once.max(1)));
    let mut opened = Vec::with_capacity(n);
    for _ in 0..n {
        let permit = Arc::clone(&gate).acquire_owned().await.unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let attack = attack.clone();
        opened.push((
            tokio::spawn(async move {
                hold(addr, &attack, give_up, move || {
                    // Open: the next connection may start connecting.
                    let _ = tx.send(());
                    drop(permit);
                })
                .await
            }),
            rx,
        ));
    }
    let mut handles = Vec::with_capacity(n);
    for (handle, rx) in opened {
        // Resolves once the connection has sent its opening bytes (or ended).
        let _ = rx.await;
        handles.push(handle);
    }
    handles
}

/// One connection of `attack`, in this task: sends its opening bytes, then
/// waits until the server closes it or `give_up` passes.
pub(crate) async fn hold_one(addr: SocketAddr, attack: &Attack, give_up: Duration) -> Held {
    hold(addr, attack, give_up, || {}).await
}

async fn hold(addr: SocketAddr, attack: &Attack, give_up: Duration, opened: impl FnOnce()) -> Held {
    let mut attempts = 0;
    let mut sock = loop {
        match TcpStream::connect(addr).await {
            Ok(s) => break s,
            // A full accept queue on a loaded machine refuses or resets a
            // connection now and then; try again like a client would.
            Err(e) => {
                attempts += 1;
                assert!(
                    attempts < 100,
                    "connect to {addr}: {e} ({attempts} attempts)"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let first = attack.first_bytes(&addr.to_string());
    let write_failed = !first.is_empty() && sock.write_all(&first).await.is_err();
    let start = Instant::now();
    opened();
    if write_failed {
        return Held {
            closed_after: Some(Duration::ZERO),
            status: None,
        };
    }
    let (mut rd, mut wr) = sock.into_split();
    let deadline = tokio::time::Instant::now() + give_up;
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let trickle = matches!(attack, Attack::Slowloris);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    let closed = loop {
        tokio::select! {
            r = rd.read(&mut buf) => match r {
                Ok(0) | Err(_) => break true,
                Ok(k) => {
                    if answer.len() < 64 {
                        answer.extend_from_slice(&buf[..k.min(64)]);
                    }
                }
            },
            _ = tick.tick(), if trickle => {
                // One byte of an endless header line.
                if wr.write_all(b"x").await.is_err() {
                    break true;
                }
            }
            () = tokio::time::sleep_until(deadline) => break false,
        }
    };
    let status = std::str::from_utf8(&answer)
        .ok()
        .and_then(|t| t.strip_prefix("HTTP/1.1 "))
        .and_then(|t| t.get(..3))
        .and_then(|s| s.parse().ok());
    Held {
        closed_after: closed.then(|| start.elapsed()),
        status,
    }
}

/// Awaits every connection of an attack.
pub(crate) async fn join(handles: Vec<JoinHandle<Held>>) -> Vec<Held> {
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("attack task"));
    }
    out
}

/// A summary of how an attack's connections ended.
#[derive(Debug, Default)]
pub(crate) struct Closures {
    /// Connections.
    pub total: usize,
    /// Closed by the server before the client gave up.
    pub closed: usize,
    /// The latest close, from the opening bytes.
    pub slowest: Duration,
    /// Count of each status the server answered with (`None`: closed
    /// without an answer).
    pub statuses: std::collections::BTreeMap<Option<u16>, usize>,
}

/// Summarises `held`.
pub(crate) fn closures(held: &[Held]) -> Closures {
    let mut c = Closures {
        total: held.len(),
        ..Closures::default()
    };
    for h in held {
        if let Some(t) = h.closed_after {
            c.closed += 1;
            c.slowest = c.slowest.max(t);
        }
        *c.statuses.entry(h.status).or_default() += 1;
    }
    c
}

/// Valid posts of one agent, one after another, each with its latency.
#[derive(Debug, Default)]
pub(crate) struct Probe {
    /// Latency of each post that got a receipt.
    pub receipts: Vec<Duration>,
    /// What went wrong with the others.
    pub failures: Vec<String>,
    /// `/healthz` answers that were 200 / all.
    pub healthz_ok: usize,
    pub healthz_total: usize,
}

impl Probe {
    /// The `p`-th percentile (0–100) of the receipt latencies.
    pub(crate) fn percentile(&self, p: f64) -> Duration {
        let mut v = self.receipts.clone();
        v.sort();
        if v.is_empty() {
            return Duration::ZERO;
        }
        let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
        v[i.min(v.len() - 1)]
    }
}

/// Posts `count` records of `agent`, one after another (each a new record
/// of its chain), and asks `/healthz` after each; every receipt is checked
/// against `log_key`.
pub(crate) async fn probe(
    http: &reqwest::Client,
    url: &str,
    api_key: &str,
    agent: &mut Agent,
    log_key: &tally_schemas::note::NoteVerifier,
    count: usize,
    pause: Duration,
) -> Probe {
    let mut p = Probe::default();
    // A record whose answer was lost goes again, as an agent's would (a
    // retry gets the original receipt).
    let mut unanswered: Option<Record> = None;
    for i in 0..count {
        let r = unanswered
            .take()
            .unwrap_or_else(|| agent.draft(&format!("probe {i}")));
        let started = Instant::now();
        let answer = http
            .post(format!("{url}/v1/records"))
            .bearer_auth(api_key)
            .body(r.canonical_bytes().to_vec())
            .timeout(Duration::from_secs(30))
            .send()
            .await;
        let outcome = match answer {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let body = resp.bytes().await.unwrap_or_default();
                let elapsed = started.elapsed();
                if status == 200 {
                    match tally_schemas::Receipt::from_json(&body)
                        .map_err(|e| e.to_string())
                        .and_then(|rc| rc.verify(&r, log_key).map_err(|e| e.to_string()))
                    {
                        Ok(_) => Ok(elapsed),
                        Err(e) => Err(format!("receipt does not verify: {e}")),
                    }
                } else {
                    Err(format!("{status}: {}", String::from_utf8_lossy(&body)))
                }
            }
            Err(e) => Err(format!("post failed: {e}")),
        };
        match outcome {
            Ok(t) => {
                p.receipts.push(t);
                agent.accepted(&r);
            }
            Err(e) => {
                p.failures.push(e);
                unanswered = Some(r);
            }
        }
        p.healthz_total += 1;
        let h = http
            .get(format!("{url}/healthz"))
            .timeout(Duration::from_secs(30))
            .send()
            .await;
        if h.is_ok_and(|h| h.status().as_u16() == 200) {
            p.healthz_ok += 1;
        }
        tokio::time::sleep(pause).await;
    }
    p
}

/// The `host:port` of an `http://` URL.
pub(crate) fn addr_of(url: &str) -> SocketAddr {
    url.strip_prefix("http://")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("not a plain-HTTP loopback URL: {url}"))
}

/// The HTTP/2 connection preface and a SETTINGS frame; with
/// `zero_window`, INITIAL_WINDOW_SIZE 0 (the client takes no answer
/// data).
pub(crate) fn h2c_preface(zero_window: bool) -> Vec<u8> {
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    if zero_window {
        out.extend_from_slice(&[0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0]);
    } else {
        out.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    }
    out
}

/// A HEADERS frame (END_HEADERS, and END_STREAM when `end_stream`) of
/// `POST` (else `GET`) `path` on `stream`. HPACK without Huffman or
/// indexing: `:method` and `:scheme http` from the static table, `:path`,
/// `:authority` and the `extra` headers (static-table name index, value) as
/// literals.
pub(crate) fn h2c_headers(
    stream: u32,
    post: bool,
    path: &str,
    authority: &str,
    extra: &[(u8, &str)],
    end_stream: bool,
) -> Vec<u8> {
    fn literal(block: &mut Vec<u8>, index: u8, value: &str) {
        // Literal without indexing, indexed name (4-bit prefix).
        if index < 15 {
            block.push(index);
        } else {
            block.extend_from_slice(&[0x0f, index - 15]);
        }
        assert!(value.len() < 127);
        block.push(value.len() as u8);
        block.extend_from_slice(value.as_bytes());
    }
    let mut block = vec![if post { 0x83 } else { 0x82 }, 0x86];
    literal(&mut block, 4, path);
    literal(&mut block, 1, authority);
    for (index, value) in extra {
        literal(&mut block, *index, value);
    }
    let flags = 4 | u8::from(end_stream);
    let len = block.len();
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, 1, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(&block);
    out
}

/// An RST_STREAM frame (CANCEL) of `stream`.
pub(crate) fn h2c_reset(stream: u32) -> Vec<u8> {
    let mut out = vec![0, 0, 4, 3, 0];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(&8u32.to_be_bytes());
    out
}

/// A plain or TLS stream of the h2 floods.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// A TLS client trusting `ca_pem` alone, offering only ALPN h2.
pub(crate) fn h2_tls_connector(ca_pem: &[u8]) -> tokio_rustls::TlsConnector {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem) {
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

/// A connection to `addr`, over TLS (server name `localhost`) when
/// `tls` is given.
async fn connect(
    addr: SocketAddr,
    tls: Option<&tokio_rustls::TlsConnector>,
) -> Option<Box<dyn Io>> {
    let s = TcpStream::connect(addr).await.ok()?;
    match tls {
        None => Some(Box::new(s)),
        Some(c) => {
            let name = rustls::pki_types::ServerName::try_from("localhost").ok()?;
            let t = c.connect(name, s).await.ok()?;
            Some(Box::new(t))
        }
    }
}

/// Reads and drops whatever the server sends until it closes; counts the
/// bytes.
fn drain<R: tokio::io::AsyncRead + Unpin + Send + 'static>(mut rd: R) -> JoinHandle<u64> {
    tokio::spawn(async move {
        let mut buf = vec![0u8; 16 * 1024];
        let mut n = 0;
        while let Ok(k) = rd.read(&mut buf).await {
            if k == 0 {
                break;
            }
            n += k as u64;
        }
        n
    })
}

/// Static-table index of `content-type` (RFC 7541 Appendix A).
pub(crate) const HPACK_CONTENT_TYPE: u8 = 31;

/// How a slot-holding flood went: connections opened, of which the server
/// closed.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Flood {
    pub opened: u64,
    pub closed_by_server: u64,
}

/// `conns` keyless h2c clients, each reopened when the server closes it,
/// until `until`: each opens a new stream every `every`, a `POST
/// /console/login` form whose body never comes, before the last one ends,
/// so that a connection always has a request in flight.
pub(crate) fn hold_slots_h2c(
    addr: SocketAddr,
    conns: usize,
    every: Duration,
    until: Instant,
) -> Vec<JoinHandle<Flood>> {
    hold_slots_h2(addr, None, conns, every, until)
}

/// [`hold_slots_h2c`], over TLS with `tls` (ALPN h2) when given.
pub(crate) fn hold_slots_h2(
    addr: SocketAddr,
    tls: Option<tokio_rustls::TlsConnector>,
    conns: usize,
    every: Duration,
    until: Instant,
) -> Vec<JoinHandle<Flood>> {
    (0..conns)
        .map(|_| {
            let tls = tls.clone();
            tokio::spawn(async move {
                let mut f = Flood::default();
                let authority = addr.to_string();
                while Instant::now() < until {
                    let Some(s) = connect(addr, tls.as_ref()).await else {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    f.opened += 1;
                    let (rd, mut wr) = tokio::io::split(s);
                    let reader = drain(rd);
                    let mut out = h2c_preface(false);
                    let mut stream = 1u32;
                    let closed = loop {
                        out.extend(h2c_headers(
                            stream,
                            true,
                            "/console/login",
                            &authority,
                            &[(HPACK_CONTENT_TYPE, "application/x-www-form-urlencoded")],
                            false,
                        ));
                        if wr.write_all(&out).await.is_err() {
                            break true;
                        }
                        out.clear();
                        stream += 2;
                        tokio::time::sleep(every).await;
                        if reader.is_finished() {
                            break true;
                        }
                        if Instant::now() >= until {
                            break false;
                        }
                    };
                    if closed {
                        f.closed_by_server += 1;
                    }
                    reader.abort();
                }
                f
            })
        })
        .collect()
}

/// `conns` keyless HTTP/1.1 clients, each reopened when the server closes
/// it, until `until`: a `POST /console/login` form announcing 2,000,000
/// bytes, whose body then trickles a byte every `every`.
pub(crate) fn hold_slots_http1(
    addr: SocketAddr,
    conns: usize,
    every: Duration,
    until: Instant,
) -> Vec<JoinHandle<Flood>> {
    (0..conns)
        .map(|_| {
            tokio::spawn(async move {
                let mut f = Flood::default();
                while Instant::now() < until {
                    let Ok(s) = TcpStream::connect(addr).await else {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    f.opened += 1;
                    let (rd, mut wr) = s.into_split();
                    let reader = drain(rd);
                    let head = format!(
                        "POST /console/login HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 2000000\r\n\r\napi_key="
                    );
                    let mut closed = wr.write_all(head.as_bytes()).await.is_err();
                    while !closed && Instant::now() < until {
                        tokio::time::sleep(every).await;
                        closed = reader.is_finished() || wr.write_all(b"a").await.is_err();
                    }
                    if closed {
                        f.closed_by_server += 1;
                    }
                    reader.abort();
                }
                f
            })
        })
        .collect()
}

/// Sums the floods' counts.
pub(crate) async fn join_floods(handles: Vec<JoinHandle<Flood>>) -> Flood {
    let mut total = Flood::default();
    for h in handles {
        if let Ok(f) = h.await {
            total.opened += f.opened;
            total.closed_by_server += f.closed_by_server;
        }
    }
    total
}
