//! The attack suite: hostile clients on plain loopback sockets against the
//! real `tally serve` (docs/threat-model.md "Hostile connections"; the
//! limits are in docs/operations.md "Connections"). Each test reproduces
//! one way a client without a key could stop the witness, and checks the
//! defence: slow bodies hold neither an admission slot nor a connection
//! for long; idle and slowloris connections are closed by their timeouts;
//! the connection cap makes room by closing connections that wait for a
//! request, and an exhausted file limit does not flood the log; request
//! heads are bounded (431); HTTP/2 connections without requests, HTTP/2
//! answers without flow-control window and stalled TLS handshakes are
//! closed. The acceptance test holds 5,000 slow bodies and 2,000 slowloris
//! connections at once while an agent posts valid records. The second
//! round: keyless h2c streams, h2 streams over TLS and HTTP/1.1 login
//! bodies cannot hold the connection slots (valid posts from new connections answered within a
//! second), one address holds at most its share of unauthenticated
//! connections, zero-window entry-tile fetches share one bundle (RSS
//! bounded), 2 MB console form bodies are refused at once, rapid resets do
//! not flood the log, unparseable batches are charged and answered 429, a
//! project over its quota is answered 429, and a stalled verify upload is
//! answered 408 at the body deadline.
//!
//! Bounded in count and time: at most about 7,000 sockets, each closed by
//! the server within seconds (short timeouts are set by flag). The tests run
//! one at a time (they share the file limit and two cores). Timing
//! figures (p50/p99 of valid posts) are printed, not asserted beyond
//! generous bounds; docs/benchmarks.md "Hostile connections" has the
//! release-build figures and examples/attack_figures.rs reproduces them.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tally_schemas::note::NoteVerifier;

use crate::common;
use crate::common::hostile;

use common::agent::Agent;
use common::Server;
use hostile::{closures, join, open_held, probe, rss_kib, Attack, Closures};

/// Slack on every "closed within its timeout" check: a loaded 2-core
/// machine may run a timer late, never this late.
const SLACK: Duration = Duration::from_secs(5);

struct Witness {
    server: Server,
    _dir: tempfile::TempDir,
    url: String,
    api_key: String,
    log_key: NoteVerifier,
    http: reqwest::Client,
}

fn start(extra: &[&str]) -> Witness {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["--rate-limit", "0"];
    args.extend_from_slice(extra);
    let server = Server::start(&dir.path().join("data"), &args);
    Witness {
        url: server.url.clone(),
        api_key: server.banner_value("API key"),
        log_key: NoteVerifier::from_vkey(&server.banner_value("witness key")).unwrap(),
        http: reqwest::Client::new(),
        server,
        _dir: dir,
    }
}

impl Witness {
    fn pid(&self) -> u32 {
        self.server.child.id()
    }

    async fn agent(&self, name: &str) -> Agent {
        let a = Agent::new(name);
        a.register(&self.http, &self.url, &self.api_key).await;
        a
    }
}

#[track_caller]
fn assert_closed_within(what: &str, c: &Closures, timeout: Duration) {
    println!(
        "{what}: {} connections, {} closed by the server, the slowest after {:?}; answers {:?}",
        c.total, c.closed, c.slowest, c.statuses
    );
    assert_eq!(
        c.closed, c.total,
        "{what}: the server left connections open"
    );
    assert!(
        c.slowest <= timeout + SLACK,
        "{what}: a connection was closed only after {:?}, its timeout is {timeout:?}",
        c.slowest
    );
}

/// Every answer was `status`, except for connections reset before their
/// answer could be read (the server closes with the body unread, which
/// makes the kernel send a reset that may overtake the answer), and most
/// got the answer.
#[track_caller]
fn assert_only_or_reset(what: &str, c: &Closures, status: u16) {
    let answered = c.statuses.get(&Some(status)).copied().unwrap_or(0);
    let reset = c.statuses.get(&None).copied().unwrap_or(0);
    assert_eq!(answered + reset, c.total, "{what}: other answers: {c:?}");
    assert!(answered * 2 > c.total, "{what}: most got no answer: {c:?}");
}

#[track_caller]
fn assert_probe_ok(what: &str, p: &hostile::Probe) {
    println!(
        "{what}: {} valid posts got receipts (p50 {:?}, p99 {:?}, max {:?}), {} failed; /healthz {}/{}",
        p.receipts.len(),
        p.percentile(50.0),
        p.percentile(99.0),
        p.percentile(100.0),
        p.failures.len(),
        p.healthz_ok,
        p.healthz_total
    );
    assert!(
        p.failures.is_empty(),
        "{what}: {} valid posts failed, the first: {:?}",
        p.failures.len(),
        p.failures.iter().take(3).collect::<Vec<_>>()
    );
    assert_eq!(p.healthz_ok, p.healthz_total, "{what}: /healthz failed");
}

/// Defect: the admission slot was taken before the API key was checked and
/// before the body was read, and a slow body was never timed out, so
/// connections sending a request head and one byte of body made every valid
/// post answer 503. Now a request without a valid key is answered 401 from
/// its headers (and the connection closed, its body unread); a key holder's
/// slow body is cut off by the body deadline (408); and a slot is taken only
/// once the whole body is in.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_bodies_hold_neither_admission_slots_nor_connections() {
    let _heavy = common::heavy().await;
    hostile::raise_nofile(2_000).unwrap();
    let w = start(&["--max-in-flight", "8", "--body-timeout", "2"]);
    let mut agent = w.agent("steady-bot").await;
    let addr = hostile::addr_of(&w.url);
    let give_up = Duration::from_secs(20);

    let keyless = open_held(addr, &Attack::SlowBody { key: None }, 200, 100, give_up).await;
    let keyed = open_held(
        addr,
        &Attack::SlowBody {
            key: Some(w.api_key.clone()),
        },
        200,
        100,
        give_up,
    )
    .await;
    let p = probe(
        &w.http,
        &w.url,
        &w.api_key,
        &mut agent,
        &w.log_key,
        20,
        Duration::from_millis(10),
    )
    .await;
    let keyless = closures(&join(keyless).await);
    let keyed = closures(&join(keyed).await);

    assert_probe_ok("valid posts during 400 slow bodies", &p);
    // Without a key: 401 at once, from the headers alone.
    assert_closed_within(
        "slow bodies without a key",
        &keyless,
        Duration::from_millis(500),
    );
    assert_only_or_reset("slow bodies without a key", &keyless, 401);
    // With a key: the body deadline (2 s here) cuts it off with 408.
    assert_closed_within("slow bodies with a key", &keyed, Duration::from_secs(2));
    assert_eq!(keyed.statuses.get(&Some(408)), Some(&200), "{keyed:?}");
}

/// Defect: no header-read timeout and no idle timeout: idle connections
/// stayed open, and slowloris connections (a head trickled a byte at a
/// time) were never closed. Now a connection must deliver its first request
/// head within `--header-timeout`, and a kept-alive connection with no
/// request in flight is closed after `--idle-timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_and_slowloris_connections_are_closed_by_their_timeouts() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _heavy = common::heavy().await;
    hostile::raise_nofile(2_000).unwrap();
    let w = start(&["--header-timeout", "2", "--idle-timeout", "3"]);
    let addr = hostile::addr_of(&w.url);
    let give_up = Duration::from_secs(20);

    // A kept-alive connection: one request, then silence.
    let keep_alive = tokio::spawn(async move {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut buf = vec![0u8; 4096];
        let n = s.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        let idle_from = Instant::now();
        let closed = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        })
        .await
        .is_ok();
        closed.then(|| idle_from.elapsed())
    });
    let idle = open_held(addr, &Attack::Idle, 300, 100, give_up).await;
    let slowloris = open_held(addr, &Attack::Slowloris, 300, 100, give_up).await;
    let idle = closures(&join(idle).await);
    let slowloris = closures(&join(slowloris).await);
    let keep_alive = keep_alive.await.unwrap();

    assert_closed_within("idle connections", &idle, Duration::from_secs(2));
    assert_closed_within("slowloris connections", &slowloris, Duration::from_secs(2));
    let keep_alive = keep_alive.expect("the kept-alive connection was never closed");
    println!("kept-alive connection closed after {keep_alive:?} idle");
    assert!(keep_alive <= Duration::from_secs(3) + SLACK);
    // And the server still serves.
    let h = w
        .http
        .get(format!("{}/healthz", w.url))
        .send()
        .await
        .unwrap();
    assert_eq!(h.status().as_u16(), 200);
}

/// A `tally serve` run with `ulimit -n nofile`, its stderr in a file.
struct Limited {
    child: Child,
    url: String,
    api_key: String,
    log_key: NoteVerifier,
    stderr: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Limited {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[allow(clippy::zombie_processes)] // reaped by Limited's Drop
fn start_limited(nofile: u32, extra: &[&str]) -> Limited {
    let dir = tempfile::tempdir().unwrap();
    let stderr = dir.path().join("stderr.log");
    let data = dir.path().join("data");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -n {nofile} && exec \"$0\" \"$@\""))
        .arg(common::TALLY)
        .args(["serve", "--listen", "127.0.0.1:0", "--rate-limit", "0"])
        .arg("--data-dir")
        .arg(&data)
        .args(extra)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut banner = String::new();
    loop {
        let mut line = String::new();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "tally serve exited: {banner}{}",
            std::fs::read_to_string(&stderr).unwrap_or_default()
        );
        banner.push_str(&line);
        if let Some(rest) = line.strip_prefix("tally: listening on ") {
            let url = rest.split_whitespace().next().unwrap().to_owned();
            std::thread::spawn(move || for _ in out.lines() {});
            let value = |label: &str| {
                banner
                    .lines()
                    .find_map(|l| {
                        l.trim_start()
                            .strip_prefix(label)
                            .map(|v| v.trim().to_owned())
                    })
                    .unwrap()
            };
            return Limited {
                api_key: value("API key"),
                log_key: NoteVerifier::from_vkey(&value("witness key")).unwrap(),
                child,
                url,
                stderr,
                _dir: dir,
            };
        }
    }
}

fn count_lines(path: &Path, needle: &str) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .count()
}

/// Defect: no cap on open connections: idle connections used up the file
/// limit, after which `/healthz` and valid posts timed out and the log got
/// an "accept failed" line every 20 ms. Now the cap stays below the file
/// limit (lowered, with a warning, when configured above it), a new
/// connection at the cap makes room by closing the connection that has
/// waited longest for a request, and accept failures back off and are
/// logged at most once per interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_connection_cap_makes_room_and_keeps_the_log_quiet() {
    let _heavy = common::heavy().await;
    hostile::raise_nofile(2_000).unwrap();
    // A file limit of 400 with a cap configured far above it; timeouts long
    // enough that only the cap can free a connection during the test.
    let s = start_limited(
        400,
        &[
            "--max-connections",
            "5000",
            "--header-timeout",
            "60",
            "--idle-timeout",
            "60",
        ],
    );
    let addr = hostile::addr_of(&s.url);
    // A new connection per post, as an agent without a connection pool.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let mut agent = Agent::new("capped-bot");
    agent.register(&http, &s.url, &s.api_key).await;

    let flood = open_held(addr, &Attack::Idle, 800, 100, Duration::from_secs(15)).await;
    let p = probe(
        &http,
        &s.url,
        &s.api_key,
        &mut agent,
        &s.log_key,
        10,
        Duration::from_millis(100),
    )
    .await;
    let metrics = http
        .get(format!("{}/metrics", s.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // Let the rest of the flood run into the cap for a while.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let flood = closures(&join(flood).await);
    println!("idle flood: {flood:?}");
    assert_probe_ok("valid posts during an idle flood past the file limit", &p);

    let cap_warnings = count_lines(&s.stderr, "lowering the connection cap");
    let accept_lines = count_lines(&s.stderr, "accept");
    let cap_lines = count_lines(&s.stderr, "connection cap reached");
    println!(
        "stderr: {cap_warnings} cap warnings, {accept_lines} lines about accept, {cap_lines} about the cap\n{}",
        std::fs::read_to_string(&s.stderr).unwrap_or_default()
    );
    assert_eq!(
        cap_warnings, 1,
        "the cap above the file limit was not lowered"
    );
    assert!(accept_lines <= 3, "accept failures flood the log");
    assert!(cap_lines <= 3, "the cap's log line is not rate-limited");
    let evicted = metrics
        .lines()
        .find_map(|l| l.strip_prefix("tally_connections_closed_total{reason=\"evicted\"} "))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(
        evicted > 0,
        "no waiting connection was closed for room:\n{metrics}"
    );
}

/// Defect: each unfinished request head could grow to ~400 KB of buffer,
/// without a timeout. Now a head is at most `--max-header-bytes` (431
/// beyond), so memory per connection is small.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn request_heads_are_bounded() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _heavy = common::heavy().await;
    hostile::raise_nofile(2_000).unwrap();
    let w = start(&["--max-header-bytes", "16384", "--header-timeout", "20"]);
    let addr = hostile::addr_of(&w.url);

    // 400 connections hold a 15 KiB unfinished head, 400 try to send 380 KiB.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss_kib(w.pid());
    let give_up = Duration::from_secs(8);
    let under = open_held(
        addr,
        &Attack::LargeHead { bytes: 15_000 },
        400,
        100,
        give_up,
    )
    .await;
    let over = open_held(
        addr,
        &Attack::LargeHead { bytes: 380 * 1024 },
        400,
        100,
        give_up,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = rss_kib(w.pid());
    let over = closures(&join(over).await);
    drop(under);
    let growth_mib = during.saturating_sub(before) / 1024;
    println!(
        "RSS {} MiB before, {} MiB with 800 large unfinished heads (+{growth_mib} MiB); over the limit: {over:?}",
        before / 1024,
        during / 1024
    );
    // The old buffer took up to ~400 KB per head: 400 x 380 KiB is 148 MiB.
    assert!(
        growth_mib < 32,
        "800 unfinished heads took {growth_mib} MiB"
    );
    assert_eq!(
        over.closed, over.total,
        "heads over the limit were kept open"
    );

    // A whole request with a 20 KiB header: 431, and the connection closed.
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "GET /healthz HTTP/1.1\r\nHost: {addr}\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(20 * 1024)
    );
    let _ = s.write_all(head.as_bytes()).await;
    let mut answer = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer))
        .await
        .is_ok();
    assert!(
        answer.starts_with(b"HTTP/1.1 431"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert!(closed, "the connection stayed open after 431");
}

/// The acceptance run: 5,000 held slow-body connections (sent with a valid
/// API key, so the server must hold them until their deadline) and 2,000
/// slowloris connections at once, plus 1,000 slow bodies without a key,
/// while an agent
/// posts valid records: every post gets a receipt that verifies, `/healthz`
/// answers, the server's RSS stays under the bound docs/operations.md
/// documents, and every held connection is closed by the server within its
/// timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn valid_posts_get_receipts_during_7000_hostile_connections() {
    let _heavy = common::heavy().await;
    hostile::raise_nofile(9_000).unwrap();
    // Timeouts long enough that every connection is still held while the
    // agent posts (opening 7,000 takes seconds on a loaded machine).
    let w = start(&["--header-timeout", "20", "--body-timeout", "20"]);
    let mut agent = w.agent("steady-bot").await;
    let addr = hostile::addr_of(&w.url);
    let give_up = Duration::from_secs(60);

    let started = Instant::now();
    // Slow bodies sent with a valid API key are the ones the server must
    // hold until their deadline; without a key they are answered at once.
    let slow_keyed = open_held(
        addr,
        &Attack::SlowBody {
            key: Some(w.api_key.clone()),
        },
        5_000,
        200,
        give_up,
    )
    .await;
    let slowloris = open_held(addr, &Attack::Slowloris, 2_000, 200, give_up).await;
    println!(
        "7,000 hostile connections opened in {:?}",
        started.elapsed()
    );
    let slow_keyless = open_held(addr, &Attack::SlowBody { key: None }, 1_000, 200, give_up).await;

    let rss_task = {
        let pid = w.pid();
        tokio::spawn(async move {
            let mut max = 0;
            for _ in 0..200 {
                max = max.max(rss_kib(pid));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            max
        })
    };
    let p = probe(
        &w.http,
        &w.url,
        &w.api_key,
        &mut agent,
        &w.log_key,
        100,
        Duration::from_millis(20),
    )
    .await;
    let max_rss_mib = rss_task.await.unwrap() / 1024;
    let slow_keyed = closures(&join(slow_keyed).await);
    let slowloris = closures(&join(slowloris).await);
    let slow_keyless = closures(&join(slow_keyless).await);

    assert_probe_ok("valid posts during 7,000 hostile connections", &p);
    // Generous: the figure that matters (p99 under 200 ms on a release
    // build) is measured by examples/attack_figures.rs, not asserted here.
    assert!(p.percentile(99.0) < Duration::from_secs(5));
    println!("server RSS at most {max_rss_mib} MiB during the attack");
    assert!(
        max_rss_mib < 256,
        "RSS {max_rss_mib} MiB, over the 256 MiB bound of docs/operations.md"
    );
    assert_closed_within(
        "slow bodies without a key",
        &slow_keyless,
        Duration::from_millis(500),
    );
    assert_only_or_reset("slow bodies without a key", &slow_keyless, 401);
    assert_closed_within(
        "slow bodies with a key",
        &slow_keyed,
        Duration::from_secs(20),
    );
    assert_eq!(slow_keyed.statuses.get(&Some(408)), Some(&5_000));
    assert_closed_within("slowloris", &slowloris, Duration::from_secs(20));
}

/// The same bounds hold for HTTP/2 without TLS (h2c) and for TLS
/// handshakes: an h2c connection that opens no stream is closed by the
/// header timeout however often it pings, its SETTINGS carry the stream and
/// header-list limits, and a TLS handshake that stalls is closed by its
/// timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn h2c_and_tls_handshakes_are_bounded_too() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _heavy = common::heavy().await;
    hostile::raise_nofile(2_000).unwrap();

    // h2c: the preface and an empty SETTINGS frame, then only PINGs.
    let w = start(&[
        "--header-timeout",
        "2",
        "--h2-max-streams",
        "8",
        "--max-header-bytes",
        "16384",
    ]);
    let addr = hostile::addr_of(&w.url);
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let opened = Instant::now();
    let mut head = [0u8; 9];
    s.read_exact(&mut head).await.unwrap();
    assert_eq!(head[3], 4, "the server's first frame is not SETTINGS");
    let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).await.unwrap();
    let settings: Vec<(u16, u32)> = payload
        .chunks(6)
        .map(|c| {
            (
                u16::from_be_bytes([c[0], c[1]]),
                u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
            )
        })
        .collect();
    println!("h2c SETTINGS from the server: {settings:?}");
    assert!(
        settings.contains(&(0x3, 8)),
        "MAX_CONCURRENT_STREAMS: {settings:?}"
    );
    assert!(
        settings.contains(&(0x6, 16384)),
        "MAX_HEADER_LIST_SIZE: {settings:?}"
    );
    let (mut rd, mut wr) = s.into_split();
    let pinger = tokio::spawn(async move {
        let ping = b"\x00\x00\x08\x06\x00\x00\x00\x00\x00tally-pi";
        while wr.write_all(ping).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    let mut buf = vec![0u8; 4096];
    let closed = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(n) = rd.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    })
    .await
    .is_ok();
    pinger.abort();
    let after = opened.elapsed();
    println!("the pinging h2c connection without a stream was closed after {after:?}");
    assert!(
        closed,
        "a pinging h2c connection without a request stayed open"
    );
    assert!(after <= Duration::from_secs(2) + SLACK);
    drop(w);

    // TLS: 100 connections send the first bytes of a ClientHello and stall.
    let tls = |name: &str| {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/tls")
            .join(name)
            .to_str()
            .unwrap()
            .to_owned()
    };
    let (cert, key) = (tls("server.pem"), tls("server.key"));
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        &dir.path().join("data"),
        &[
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--tls-handshake-timeout",
            "2",
            "--header-timeout",
            "30",
        ],
    );
    let addr: std::net::SocketAddr = server
        .url
        .strip_prefix("https://")
        .unwrap()
        .parse()
        .unwrap();
    let stalled = open_held(
        addr,
        &Attack::Raw(b"\x16\x03\x01\x02\x00\x01".to_vec()),
        100,
        100,
        Duration::from_secs(20),
    )
    .await;
    let stalled = closures(&join(stalled).await);
    assert_closed_within("stalled TLS handshakes", &stalled, Duration::from_secs(2));
}

/// An HTTP/2 client that asks for an answer and grants no flow-control
/// window to receive it: its socket is never blocked, but the answer is not
/// taken, so the request stays in flight. The connection is closed after
/// the write timeout (before, it stayed open: such connections could fill
/// the cap without a key).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_h2c_client_that_grants_no_window_is_closed_by_the_write_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _heavy = common::heavy().await;
    let w = start(&["--write-timeout", "3", "--idle-timeout", "60"]);
    let addr = hostile::addr_of(&w.url);
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    // The preface, SETTINGS with INITIAL_WINDOW_SIZE 0, then the HEADERS of
    // GET /checkpoint on stream 1 (END_STREAM | END_HEADERS; HPACK: :method
    // GET and :scheme http from the static table, :path and :authority as
    // literals).
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend_from_slice(&[0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0]);
    let authority = addr.to_string();
    let path = b"/checkpoint";
    let mut block = vec![0x82, 0x86, 0x04, path.len() as u8];
    block.extend_from_slice(path);
    block.extend_from_slice(&[0x01, authority.len() as u8]);
    block.extend_from_slice(authority.as_bytes());
    out.extend_from_slice(&[0, 0, block.len() as u8, 1, 5, 0, 0, 0, 1]);
    out.extend_from_slice(&block);
    s.write_all(&out).await.unwrap();
    let sent = Instant::now();

    // Read frames (acknowledging the server's SETTINGS) until the server
    // closes the connection.
    let mut frames = Vec::new();
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 65536];
    let closed = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => pending.extend_from_slice(&buf[..n]),
            }
            while pending.len() >= 9 {
                let len = usize::from(pending[0]) << 16
                    | usize::from(pending[1]) << 8
                    | usize::from(pending[2]);
                if pending.len() < 9 + len {
                    break;
                }
                let (kind, flags) = (pending[3], pending[4]);
                if kind == 4 && flags & 1 == 0 {
                    let _ = s.write_all(&[0, 0, 0, 4, 1, 0, 0, 0, 0]).await;
                }
                frames.push(kind);
                pending.drain(..9 + len);
            }
        }
    })
    .await
    .is_ok();
    let after = sent.elapsed();
    println!("frames from the server (types): {frames:?}; closed: {closed} after {after:?}");
    assert!(frames.contains(&1), "the answer's HEADERS never came");
    assert!(!frames.contains(&0), "DATA was sent without window");
    assert!(
        closed,
        "a connection whose answer waits for window stayed open"
    );
    assert!(after <= Duration::from_secs(3) + SLACK);
}

/// Valid posts from new connections (one connection per post, as an agent
/// without a connection pool) all got receipts, each within a second.
#[track_caller]
fn assert_posts_within_a_second(what: &str, p: &hostile::Probe) {
    assert_probe_ok(what, p);
    assert!(
        p.percentile(100.0) < Duration::from_secs(1),
        "{what}: a valid post waited {:?}",
        p.percentile(100.0)
    );
}

/// Defect: a connection with a request in flight was never closed for
/// room, and the console's login form read its body before the throttle,
/// so keyless clients holding a login stream (h2c: a new stream before the
/// last ends) or a slow login body (HTTP/1.1) in flight on every slot made
/// valid posts from new connections wait for a slot (most timed out). Now
/// the login is decided from the headers before its body is read, and at
/// the cap the oldest connection on which nothing has authenticated is
/// closed for room, request in flight or not. All hostile connections come
/// from 127.0.0.1, the address the agent posts from; the per-client limit
/// is set out of the way, so that it is the cap that is tested here (the
/// next test covers the per-client limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keyless_clients_cannot_hold_the_connection_slots() {
    let _heavy = common::heavy().await;
    hostile::raise_nofile(2_000).unwrap();
    let w = start(&[
        "--max-connections",
        "100",
        "--max-connections-per-client",
        "100000",
    ]);
    let addr = hostile::addr_of(&w.url);
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let mut agent = Agent::new("slot-bot");
    agent.register(&http, &w.url, &w.api_key).await;

    for (what, h2c) in [
        ("h2c login streams", true),
        ("HTTP/1.1 login bodies", false),
    ] {
        let until = Instant::now() + Duration::from_secs(12);
        let flood = if h2c {
            hostile::hold_slots_h2c(addr, 150, Duration::from_millis(500), until)
        } else {
            hostile::hold_slots_http1(addr, 150, Duration::from_millis(500), until)
        };
        // Let the flood take every slot.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let p = probe(
            &http,
            &w.url,
            &w.api_key,
            &mut agent,
            &w.log_key,
            10,
            Duration::from_millis(200),
        )
        .await;
        let flood = hostile::join_floods(flood).await;
        println!("{what}: {flood:?}");
        assert_posts_within_a_second(&format!("valid posts during 150 {what}"), &p);
    }
}

/// The per-client limit: one address's unauthenticated connections past
/// `--max-connections-per-client` close its oldest, so a client cannot
/// fill the cap; a key holder's connection is never among them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_address_holds_at_most_its_share_of_unauthenticated_connections() {
    let _heavy = common::heavy().await;
    hostile::raise_nofile(2_000).unwrap();
    let w = start(&[
        "--max-connections",
        "1000",
        "--max-connections-per-client",
        "50",
        "--header-timeout",
        "60",
    ]);
    let addr = hostile::addr_of(&w.url);
    // A key holder's kept-alive connection, then 200 idle keyless ones.
    let mut agent = w.agent("share-bot").await;
    let p1 = probe(
        &w.http,
        &w.url,
        &w.api_key,
        &mut agent,
        &w.log_key,
        1,
        Duration::ZERO,
    )
    .await;
    let idle = open_held(addr, &Attack::Idle, 200, 100, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let metrics = w
        .http
        .get(format!("{}/metrics", w.url))
        .bearer_auth(&w.api_key)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let idle = closures(&join(idle).await);
    let metric = |name: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let open = metric("tally_connections_open ");
    let limited = metric("tally_connections_closed_total{reason=\"client_limit\"} ");
    println!("open {open}, closed for the client limit {limited}; idle {idle:?}");
    assert!(open <= 50 + 3, "one address holds {open} connections");
    assert!(limited >= 150, "{limited} closed for the client limit");
    // The key holder's pooled connection was not among them.
    let p2 = probe(
        &w.http,
        &w.url,
        &w.api_key,
        &mut agent,
        &w.log_key,
        3,
        Duration::ZERO,
    )
    .await;
    assert_probe_ok("the key holder before", &p1);
    assert_probe_ok("the key holder after", &p2);
}

/// Defect: `/tile/entries/…` built its bundle in memory per request, no
/// cache, no bound: h2c clients granting no flow-control window, 64
/// streams each, held one copy per stream until the write timeout (RSS
/// grew by the bundle size times the streams). Now a bundle is built once
/// into shared bytes every answer refers to, and the bundles alive are
/// bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn zero_window_tile_fetches_do_not_grow_memory() {
    use tokio::io::AsyncWriteExt;
    let _heavy = common::heavy().await;
    hostile::raise_nofile(2_000).unwrap();
    let w = start(&["--write-timeout", "20"]);
    let addr = hostile::addr_of(&w.url);
    let mut agent = w.agent("big-bot").await;
    // 64 records of about 4.4 KB each: a partial bundle of about 280 KB.
    let text = "x".repeat(tally_schemas::limits::MAX_NOTE_TEXT_BYTES - 16);
    for i in 0..64 {
        let r = agent.draft(&format!("{i} {text}"));
        let resp = common::post_record(&w.http, &w.url, &w.api_key, &r)
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        agent.accepted(&r);
    }
    let path = "/tile/entries/000.p/64";
    let tile = loop {
        let r = w.http.get(format!("{}{path}", w.url)).send().await.unwrap();
        if r.status() == 200 {
            break r.bytes().await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!("bundle of {} bytes", tile.len());
    assert!(tile.len() > 250_000);

    let before = rss_kib(w.pid());
    let authority = addr.to_string();
    let mut held = Vec::new();
    for _ in 0..8 {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut out = hostile::h2c_preface(true);
        for k in 0..64u32 {
            out.extend(hostile::h2c_headers(
                1 + 2 * k,
                false,
                path,
                &authority,
                &[],
                true,
            ));
        }
        s.write_all(&out).await.unwrap();
        held.push(s);
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    let during = rss_kib(w.pid());
    let grown = during.saturating_sub(before);
    println!(
        "RSS {before} KiB before, {during} KiB with 8 x 64 zero-window streams on a {} KB bundle (+{grown} KiB; one copy per stream would be +{} KiB)",
        tile.len() / 1000,
        8 * 64 * tile.len() / 1024
    );
    drop(held);
    assert!(
        grown < 40 * 1024,
        "RSS grew by {grown} KiB for answers of one bundle"
    );
}

/// Defect: the console's form routes took axum's default 2 MB body limit,
/// read before the session check, with a deadline that grows a second per
/// 8 KiB: a keyless client held 2 MB per connection for minutes. Now every
/// console body but the verify upload's is at most 16 KiB, refused 413
/// unread when announced larger, and a form post without a session is
/// answered before its body is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn console_form_routes_refuse_large_keyless_bodies_at_once() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _heavy = common::heavy().await;
    hostile::raise_nofile(2_000).unwrap();
    let w = start(&[]);
    let addr = hostile::addr_of(&w.url);
    let before = rss_kib(w.pid());
    let mut tasks = Vec::new();
    for i in 0..120 {
        let route = ["/console/login", "/console/logout", "/console/links"][i % 3];
        tasks.push(tokio::spawn(async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let head = format!(
                "POST {route} HTTP/1.1\r\nHost: {addr}\r\nOrigin: http://{addr}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 2000000\r\n\r\n"
            );
            let started = Instant::now();
            s.write_all(head.as_bytes()).await.unwrap();
            // Up to a megabyte of the body, as fast as the server takes it.
            let chunk = vec![b'a'; 64 * 1024];
            let (mut rd, mut wr) = s.into_split();
            let writer = tokio::spawn(async move {
                for _ in 0..16 {
                    if wr.write_all(&chunk).await.is_err() {
                        break;
                    }
                }
                wr
            });
            let mut answer = Vec::new();
            let mut buf = vec![0u8; 4096];
            let read = tokio::time::timeout(Duration::from_secs(20), async {
                loop {
                    match rd.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            answer.extend_from_slice(&buf[..n]);
                            if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                                break;
                            }
                        }
                    }
                }
            })
            .await;
            writer.abort();
            let status = String::from_utf8_lossy(&answer)
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse::<u16>().ok());
            (route, read.is_ok(), status, started.elapsed())
        }));
    }
    let mut slowest = Duration::ZERO;
    for t in tasks {
        let (route, answered, status, took) = t.await.unwrap();
        assert!(answered, "{route}: no answer within 20 s");
        let status = status.unwrap_or(0);
        assert!(
            matches!(status, 303 | 403 | 413 | 429),
            "{route}: answered {status}"
        );
        slowest = slowest.max(took);
    }
    let grown = rss_kib(w.pid()).saturating_sub(before);
    println!("120 keyless 2 MB console form posts: slowest answer {slowest:?}, RSS +{grown} KiB");
    assert!(slowest < Duration::from_secs(2), "slowest {slowest:?}");
    assert!(grown < 32 * 1024, "RSS grew by {grown} KiB");
}

/// Defect: h2's warning for a connection that resets streams faster than
/// they are accepted (`recv_reset … reached limit`) came once per
/// connection, not rate-limited: a keyless client wrote gigabytes of log an
/// hour. Now library log lines pass at most a few per call site per 10 s;
/// the rest are counted in `tally_log_lines_suppressed_total`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rapid_reset_connections_do_not_flood_the_log() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _heavy = common::heavy().await;
    hostile::raise_nofile(2_000).unwrap();
    let s = start_limited(2_000, &[]);
    let addr = hostile::addr_of(&s.url);
    let authority = addr.to_string();
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let authority = authority.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
            let mut out = hostile::h2c_preface(false);
            for k in 0..100u32 {
                let id = 1 + 2 * k;
                out.extend(hostile::h2c_headers(
                    id,
                    false,
                    "/healthz",
                    &authority,
                    &[],
                    true,
                ));
                out.extend(hostile::h2c_reset(id));
            }
            let _ = c.write_all(&out).await;
            let mut buf = vec![0u8; 16 * 1024];
            let _ = tokio::time::timeout(Duration::from_secs(10), async {
                while let Ok(n) = c.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                }
            })
            .await;
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let h2_lines = count_lines(&s.stderr, "h2::");
    let metrics = reqwest::get(format!("{}/metrics", s.url))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let suppressed = metrics
        .lines()
        .find_map(|l| l.strip_prefix("tally_log_lines_suppressed_total "))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    println!("200 rapid-reset connections: {h2_lines} h2 log lines, {suppressed} suppressed");
    assert!(
        h2_lines + (suppressed as usize) >= 100,
        "the rapid resets did not make h2 warn; the test no longer reproduces the flood"
    );
    assert!(
        h2_lines <= 10,
        "{h2_lines} h2 log lines for 200 connections"
    );
}

/// Defect: a batch was parsed before its tokens were taken, so a key could
/// make the server parse failing 1 MiB batches as fast as it sent them,
/// never answered 429. Now a batch pays by size before it is parsed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unparseable_batches_are_charged_and_answered_429() {
    let _heavy = common::heavy().await;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        &dir.path().join("data"),
        &["--rate-limit", "10", "--rate-burst", "20"],
    );
    let api_key = server.banner_value("API key");
    let http = reqwest::Client::new();
    let garbage = vec![b'['; 1 << 20];
    let mut statuses = std::collections::BTreeMap::new();
    for _ in 0..20 {
        let r = http
            .post(format!("{}/v1/records/batch", server.url))
            .bearer_auth(&api_key)
            .body(garbage.clone())
            .send()
            .await
            .unwrap();
        *statuses.entry(r.status().as_u16()).or_insert(0) += 1;
    }
    println!("20 unparseable 1 MiB batches: {statuses:?}");
    // 1 MiB pays 8 tokens (one per 128 KiB): a burst of 20 pays for three.
    assert!(
        statuses.get(&429).copied().unwrap_or(0) >= 15,
        "{statuses:?}"
    );
}

/// Defect: nothing bounded how much one project could grow the log: one
/// key at the allowed rate could add about 1.1 TB an hour. Now a project
/// may have at most `--project-records-per-day` records (and
/// `--project-bytes-per-day` bytes) checked per UTC day; past it `429
/// quota_exceeded` with the time to the next day, for single records and
/// each record of a batch, while a retry of an admitted record still gets
/// its receipt.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_project_over_its_quota_is_answered_429_quota_exceeded() {
    let _heavy = common::heavy().await;
    let w = start(&["--project-records-per-day", "5"]);
    let mut agent = w.agent("quota-bot").await;
    let mut admitted = Vec::new();
    for i in 0..5 {
        let r = agent.draft(&format!("within {i}"));
        let resp = common::post_record(&w.http, &w.url, &w.api_key, &r)
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "record {i}");
        agent.accepted(&r);
        admitted.push(r);
    }
    let over = agent.draft("over");
    let resp = common::post_record(&w.http, &w.url, &w.api_key, &over)
        .await
        .unwrap();
    assert_eq!(resp.status(), 429);
    let retry_after: u64 = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!((1..=86_400).contains(&retry_after), "{retry_after}");
    let body: serde_json::Value = resp.json().await.unwrap();
    println!("over the quota: {body}");
    assert_eq!(body["error"]["code"], "quota_exceeded");
    assert!(body["error"]["retry_after_ms"].as_u64().unwrap() <= 86_400_000);

    // A batch: each record refused on its own.
    let batch = format!(
        "{{\"records\":[{}],\"v\":1}}",
        String::from_utf8(over.canonical_bytes().to_vec()).unwrap()
    );
    let resp = w
        .http
        .post(format!("{}/v1/records/batch", w.url))
        .bearer_auth(&w.api_key)
        .body(batch)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let answer: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(answer["results"][0]["status"], 429, "{answer}");
    assert_eq!(answer["results"][0]["error"]["code"], "quota_exceeded");

    // A lost answer retried: the original receipt, quota or not.
    let resp = common::post_record(&w.http, &w.url, &w.api_key, &admitted[2])
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);

    let metrics = w
        .http
        .get(format!("{}/metrics", w.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("tally_project_records_today{project=\"default\"} 5"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tally_admissions_total{status=\"429\",code=\"quota_exceeded\"}"),
        "{metrics}"
    );
}

/// Defect: a verify upload that stalled was cut off by the server's body
/// deadline and answered `400`, where api.md and console.md said `408`
/// at 20 s. Now a body timeout on the upload routes is `408`, at the body
/// deadline (`--body-timeout`, here 2 s, plus a second per
/// `--body-min-rate` bytes), as the docs now say.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_verify_upload_is_answered_408_at_the_body_deadline() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _heavy = common::heavy().await;
    let w = start(&["--body-timeout", "2"]);
    let addr = hostile::addr_of(&w.url);
    let browser = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let first_cookie = |r: &reqwest::Response| {
        r.headers()
            .get(reqwest::header::SET_COOKIE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .unwrap()
            .to_owned()
    };
    let between = |s: &str, start: &str| {
        let i = s.find(start).unwrap() + start.len();
        s[i..i + s[i..].find('"').unwrap()].to_owned()
    };
    let form = browser
        .get(format!("{}/console/login", w.url))
        .send()
        .await
        .unwrap();
    let login_cookie = first_cookie(&form);
    let token = between(&form.text().await.unwrap(), "name=\"login_token\" value=\"");
    let r = browser
        .post(format!("{}/console/login", w.url))
        .header(reqwest::header::COOKIE, login_cookie)
        .form(&[("login_token", token.as_str()), ("api_key", &w.api_key)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let session = first_cookie(&r);
    let page = browser
        .get(format!("{}/console/verify", w.url))
        .header(reqwest::header::COOKIE, &session)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let csrf = between(&page, "name=\"csrf\" value=\"");

    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let body = format!(
        "--XyZ\r\nContent-Disposition: form-data; name=\"csrf\"\r\n\r\n{csrf}\r\n--XyZ\r\nContent-Disposition: form-data; name=\"agent_keys\"\r\n\r\n{{"
    );
    let head = format!(
        "POST /console/verify HTTP/1.1\r\nHost: {addr}\r\nOrigin: http://{addr}\r\nCookie: {session}\r\nContent-Type: multipart/form-data; boundary=XyZ\r\nContent-Length: 100000\r\n\r\n"
    );
    s.write_all(format!("{head}{body}").as_bytes())
        .await
        .unwrap();
    let sent = Instant::now();
    let mut answer = Vec::new();
    let mut buf = vec![0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&buf[..n]);
            if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
    })
    .await;
    let after = sent.elapsed();
    let status = String::from_utf8_lossy(&answer)
        .split_whitespace()
        .nth(1)
        .unwrap_or("none")
        .to_owned();
    println!("the stalled verify upload was answered {status} after {after:?}");
    assert_eq!(status, "408");
    assert!(after >= Duration::from_secs(2) && after <= Duration::from_secs(2) + SLACK);
}

/// The slot hold of `keyless_clients_cannot_hold_the_connection_slots`
/// over TLS (ALPN h2): the same connection layer bounds it, so valid
/// posts from new connections are still answered within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keyless_h2_streams_over_tls_cannot_hold_the_connection_slots() {
    let _heavy = common::heavy().await;
    hostile::raise_nofile(2_000).unwrap();
    let tls = |name: &str| {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/tls")
            .join(name)
    };
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (tls("server.pem"), tls("server.key"));
    let server = Server::start(
        &dir.path().join("data"),
        &[
            "--rate-limit",
            "0",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--max-connections",
            "100",
            "--max-connections-per-client",
            "100000",
        ],
    );
    let api_key = server.banner_value("API key");
    let log_key = NoteVerifier::from_vkey(&server.banner_value("witness key")).unwrap();
    let addr: std::net::SocketAddr = server
        .url
        .strip_prefix("https://")
        .unwrap()
        .parse()
        .unwrap();
    let ca = std::fs::read(tls("ca.pem")).unwrap();
    let http = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let mut agent = Agent::new("tls-slot-bot");
    agent.register(&http, &server.url, &api_key).await;

    let until = Instant::now() + Duration::from_secs(12);
    let flood = hostile::hold_slots_h2(
        addr,
        Some(hostile::h2_tls_connector(&ca)),
        150,
        Duration::from_millis(500),
        until,
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let p = probe(
        &http,
        &server.url,
        &api_key,
        &mut agent,
        &log_key,
        10,
        Duration::from_millis(200),
    )
    .await;
    let flood = hostile::join_floods(flood).await;
    println!("h2 login streams over TLS: {flood:?}");
    assert_posts_within_a_second("valid posts during 150 h2 login streams over TLS", &p);
    assert!(flood.opened >= 150, "the flood did not connect: {flood:?}");
}
