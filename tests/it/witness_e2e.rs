//! The ordered end-to-end walk through the real `tally` binary (docs/api.md):
//! a fresh `tally serve`, the quickstart (register an agent, post records),
//! every row of the admission status table, the CLI exports checked by
//! `tally verify`, SIGTERM, and a restart that returns the same receipts.

use std::path::{Path, PathBuf};

use rand_core::OsRng;
use serde_json::{json, Value};
use tally_schemas::note::NoteVerifier;
use tally_schemas::record::NoteBody;
use tally_schemas::{
    AgentName, Body, Hash, Nonce, Receipt, Record, SecretKey, Seq, UnixMillis, UnsignedRecord,
};

use crate::common;

use common::{tally, Server};

struct Agent {
    name: AgentName,
    key: SecretKey,
    seq: u64,
    prev: Option<Hash>,
}

impl Agent {
    fn new(name: &str) -> Self {
        Self {
            name: AgentName::new(name).unwrap(),
            key: SecretKey::generate(&mut OsRng),
            seq: 0,
            prev: None,
        }
    }

    fn draft_at(&self, time: UnixMillis, text: &str) -> Record {
        UnsignedRecord {
            agent: self.name.clone(),
            key_id: self.key.public_key().key_id(),
            seq: Seq::new(self.seq).unwrap(),
            prev: self.prev,
            time,
            nonce: Nonce::random(&mut OsRng),
            body: Body::Note(NoteBody { text: text.into() }),
        }
        .sign(&self.key)
        .unwrap()
    }

    fn draft(&self, text: &str) -> Record {
        self.draft_at(UnixMillis::now(), text)
    }

    fn accept(&mut self, r: &Record) {
        self.seq = r.seq.get() + 1;
        self.prev = Some(r.hash());
    }
}

async fn post(
    http: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    body: Vec<u8>,
) -> (u16, Vec<u8>) {
    let mut req = http.post(format!("{url}/v1/records")).body(body);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    match req.send().await {
        Ok(resp) => {
            let s = resp.status().as_u16();
            (s, resp.bytes().await.unwrap_or_default().to_vec())
        }
        Err(e) => panic!("POST failed: {e}"),
    }
}

fn code(body: &[u8]) -> String {
    serde_json::from_slice::<Value>(body).map_or_else(
        |_| format!("(not JSON: {})", String::from_utf8_lossy(body)),
        |v| v["error"]["code"].as_str().unwrap_or_default().to_owned(),
    )
}

/// POSTs to `/v1/records` announcing `content_length` bytes but sends none of
/// them, and returns the status and body the server answers with.
async fn headers_only_post(url: &str, key: &str, content_length: usize) -> (u16, Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let authority = url.strip_prefix("http://").expect("plain-HTTP test server");
    let mut sock = tokio::net::TcpStream::connect(authority).await.unwrap();
    let head = format!(
        "POST /v1/records HTTP/1.1\r\nHost: {authority}\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {content_length}\r\n\
         Connection: close\r\n\r\n"
    );
    sock.write_all(head.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        sock.read_to_end(&mut raw),
    )
    .await
    .expect("no answer within 10 s to a headers-only 10 MB POST")
    .unwrap();
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {text}"));
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("response without a header end");
    let mut body = raw[split + 4..].to_vec();
    if text
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    (status, body)
}

/// Decodes an HTTP/1.1 chunked body.
fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = raw
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("chunk size line");
        let size = usize::from_str_radix(std::str::from_utf8(&raw[..eol]).unwrap().trim(), 16)
            .expect("chunk size");
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&raw[eol + 2..eol + 2 + size]);
        raw = &raw[eol + 2 + size + 2..];
    }
}

#[track_caller]
fn expect(got: (u16, Vec<u8>), status: u16, want: &str) -> Vec<u8> {
    assert_eq!(
        (got.0, code(&got.1).as_str()),
        (status, want),
        "{}",
        String::from_utf8_lossy(&got.1)
    );
    got.1
}

async fn register(http: &reqwest::Client, url: &str, key: &str, agent: &Agent) {
    let r = http
        .post(format!("{url}/v1/agents"))
        .bearer_auth(key)
        .json(&json!({"agent": agent.name, "public_key": agent.key.public_key(), "not_before": UnixMillis::new(UnixMillis::now().as_millis() - 3_600_000)}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
}

fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ordered_walk_through_the_real_binary() {
    let tmp = tempfile::tempdir().unwrap();
    let data: PathBuf = tmp.path().join("tally-data");
    let http = reqwest::Client::new();

    // 1. First start: the data folder, the key (0600), the banner printed once.
    let server = Server::start(&data, &[]);
    let url = server.url.clone();
    let api_key = server.banner_value("API key");
    let vkey = server.banner_value("witness key");
    // An origin of this install's own (docs/operations.md, `--origin`).
    let origin = server.banner_value("origin");
    let suffix = origin.strip_prefix("tally.local/log/").unwrap_or("");
    assert!(
        suffix.len() == 8 && suffix.bytes().all(|b| b.is_ascii_hexdigit()),
        "{origin}"
    );
    assert!(vkey.starts_with(&format!("{origin}+")), "{vkey}");
    assert!(api_key.starts_with("tally_"));
    for f in [
        "log.skey",
        "keys.json",
        "log.redb",
        "witness.redb",
        "admin.token",
    ] {
        assert!(data.join(f).exists(), "{f}");
    }
    assert_eq!(mode(&data.join("log.skey")), 0o600);
    assert_eq!(mode(&data.join("admin.token")), 0o600);
    let log_key = NoteVerifier::from_vkey(&vkey).unwrap();

    // 2. Public reads.
    let keys: Value = http
        .get(format!("{url}/.well-known/tally/keys"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(keys["keys"][0]["vkey"], vkey);
    assert_eq!(keys["keys"][0]["not_after"], Value::Null);
    let health = http.get(format!("{url}/healthz")).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 200);

    // 3. The quickstart: register an agent with the CLI, post records.
    let env = [
        ("TALLY_WITNESS_URL", url.as_str()),
        ("TALLY_API_KEY", api_key.as_str()),
    ];
    let mut bot = Agent::new("claims-bot");
    let pk = bot.key.public_key().to_base64();
    let (ok, out, err) = tally(&["agent", "add", "claims-bot", "--public-key", &pk], &env);
    assert!(ok, "{out}{err}");
    let (ok, _, err) = tally(&["agent", "add", "claims-bot", "--public-key", &pk], &env);
    assert!(!ok && err.contains("exists"), "{err}");
    let (ok, out, err) = tally(
        &[
            "project",
            "create",
            "other",
            "--data-dir",
            data.to_str().unwrap(),
            "--witness",
            &url,
        ],
        &[],
    );
    assert!(ok, "{out}{err}");
    let other_key = out
        .lines()
        .find_map(|l| l.strip_prefix("API key: "))
        .unwrap()
        .to_owned();

    // 200, and a retry gets the same bytes.
    let r0 = bot.draft("first");
    let receipt0 = expect(
        post(&http, &url, Some(&api_key), r0.canonical_bytes().to_vec()).await,
        200,
        "",
    );
    Receipt::from_json(&receipt0)
        .unwrap()
        .verify(&r0, &log_key)
        .unwrap();
    bot.accept(&r0);
    let again = expect(
        post(&http, &url, Some(&api_key), r0.canonical_bytes().to_vec()).await,
        200,
        "",
    );
    assert_eq!(receipt0, again);
    for i in 1..5 {
        let r = bot.draft(&format!("note {i}"));
        expect(
            post(&http, &url, Some(&api_key), r.canonical_bytes().to_vec()).await,
            200,
            "",
        );
        bot.accept(&r);
    }

    // 4. Every row of the status table.
    expect(
        post(&http, &url, Some(&api_key), b"{\"v\":1".to_vec()).await,
        400,
        "malformed",
    );
    let mut v2 = serde_json::to_value(bot.draft("v2")).unwrap();
    v2["v"] = json!(2);
    expect(
        post(
            &http,
            &url,
            Some(&api_key),
            serde_json::to_vec(&v2).unwrap(),
        )
        .await,
        400,
        "unsupported_version",
    );
    let next = bot.draft("next");
    expect(
        post(&http, &url, None, next.canonical_bytes().to_vec()).await,
        401,
        "unauthorized",
    );
    expect(
        post(
            &http,
            &url,
            Some("tally_0123456789abcdef_000000000000000000000000000000000000000000000000"),
            next.canonical_bytes().to_vec(),
        )
        .await,
        401,
        "unauthorized",
    );
    expect(
        post(
            &http,
            &url,
            Some(&other_key),
            next.canonical_bytes().to_vec(),
        )
        .await,
        403,
        "agent_not_allowed",
    );
    let impostor = Agent {
        key: SecretKey::generate(&mut OsRng),
        ..Agent::new("claims-bot")
    };
    expect(
        post(
            &http,
            &url,
            Some(&api_key),
            impostor.draft("x").canonical_bytes().to_vec(),
        )
        .await,
        403,
        "key_not_allowed",
    );
    let fork = Agent {
        seq: 1,
        prev: Some(r0.hash()),
        ..Agent {
            key: bot.key.clone(),
            ..Agent::new("claims-bot")
        }
    };
    let conflict = expect(
        post(
            &http,
            &url,
            Some(&api_key),
            fork.draft("fork").canonical_bytes().to_vec(),
        )
        .await,
        409,
        "chain_conflict",
    );
    let head: Value = serde_json::from_slice::<Value>(&conflict).unwrap()["error"]["head"].clone();
    assert_eq!(head["seq"], 4);
    assert_eq!(head["hash"], bot.prev.unwrap().to_hex());
    let mut replay = bot.draft("replay").unsigned().clone();
    replay.nonce = r0.nonce.clone();
    let replay = replay.sign(&bot.key).unwrap();
    let body = expect(
        post(
            &http,
            &url,
            Some(&api_key),
            replay.canonical_bytes().to_vec(),
        )
        .await,
        409,
        "nonce_replayed",
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["error"]["first_index"],
        0
    );
    // 10 MB: refused from its Content-Length alone, before any of the body
    // is read. Sent over a raw socket with the headers only, so the answer
    // cannot race a client still writing a body the server has closed on.
    let (s, b) = headers_only_post(&url, &api_key, 10 * 1024 * 1024).await;
    expect((s, b), 413, "too_large");
    let mut forged = serde_json::to_value(&next).unwrap();
    forged["sig"] = serde_json::to_value(bot.draft("other").signature()).unwrap();
    expect(
        post(
            &http,
            &url,
            Some(&api_key),
            serde_json::to_vec(&forged).unwrap(),
        )
        .await,
        422,
        "bad_signature",
    );
    let late = bot.draft_at(
        UnixMillis::new(UnixMillis::now().as_millis() + 3_600_000),
        "an hour ahead",
    );
    let body = expect(
        post(&http, &url, Some(&api_key), late.canonical_bytes().to_vec()).await,
        422,
        "clock_skew",
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["error"]["max_skew_ms"],
        300_000
    );
    let retiree = Agent::new("retiree");
    register(&http, &url, &api_key, &retiree).await;
    let (ok, out, err) = tally(&["agent", "retire", "retiree"], &env);
    assert!(ok, "{out}{err}");
    expect(
        post(
            &http,
            &url,
            Some(&api_key),
            retiree.draft("after").canonical_bytes().to_vec(),
        )
        .await,
        422,
        "key_not_active",
    );

    // 429 and 503 on a second witness with tight limits.
    {
        let data2 = tmp.path().join("tight");
        let tight = Server::start(&data2, &["--rate-limit", "1", "--rate-burst", "1"]);
        let key2 = tight.banner_value("API key");
        let mut a = Agent::new("rl");
        register(&http, &tight.url, &key2, &a).await;
        let r = a.draft("one");
        expect(
            post(&http, &tight.url, Some(&key2), r.canonical_bytes().to_vec()).await,
            200,
            "",
        );
        a.accept(&r);
        expect(
            post(
                &http,
                &tight.url,
                Some(&key2),
                a.draft("two").canonical_bytes().to_vec(),
            )
            .await,
            429,
            "rate_limited",
        );
        let data3 = tmp.path().join("busy");
        let busy = Server::start(&data3, &["--max-in-flight", "1", "--rate-limit", "0"]);
        let key3 = busy.banner_value("API key");
        let mut saw_503 = false;
        for round in 0..5 {
            let agents: Vec<Agent> = (0..24)
                .map(|i| Agent::new(&format!("busy-{round}-{i}")))
                .collect();
            for a in &agents {
                register(&http, &busy.url, &key3, a).await;
            }
            let tasks: Vec<_> = agents
                .iter()
                .map(|a| {
                    let (http, u, k, b) = (
                        http.clone(),
                        busy.url.clone(),
                        key3.clone(),
                        a.draft("x").canonical_bytes().to_vec(),
                    );
                    tokio::spawn(async move { post(&http, &u, Some(&k), b).await })
                })
                .collect();
            for t in tasks {
                let (s, b) = t.await.unwrap();
                match s {
                    200 => {}
                    503 => {
                        assert_eq!(code(&b), "overloaded");
                        saw_503 = true;
                    }
                    other => panic!("unexpected {other}: {}", String::from_utf8_lossy(&b)),
                }
            }
            if saw_503 {
                break;
            }
        }
        assert!(
            saw_503,
            "24 concurrent posts to a witness with one admission slot never met 503"
        );
    }

    // 5. Reads: the agent head (own project only) and metrics.
    let head: Value = http
        .get(format!("{url}/v1/agents/claims-bot/head"))
        .bearer_auth(&api_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(head["seq"], 4);
    let r = http
        .get(format!("{url}/v1/agents/claims-bot/head"))
        .bearer_auth(&other_key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    let metrics = http
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("tally_admissions_total{status=\"409\",code=\"chain_conflict\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("tally_admission_seconds_bucket"));

    // 6. Exports with the CLI, checked by `tally verify`.
    let dir = tmp.path();
    let (keys_f, pack_f, head_f) = (
        dir.join("agent-keys.json"),
        dir.join("pack.jsonl"),
        dir.join("head.json"),
    );
    let (ok, out, err) = tally(&["keys", "export", "-o", keys_f.to_str().unwrap()], &env);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = tally(
        &[
            "export",
            "--agent",
            "claims-bot",
            "-o",
            pack_f.to_str().unwrap(),
        ],
        &env,
    );
    assert!(ok, "{out}{err}");
    let more = bot.draft("after the export");
    expect(
        post(&http, &url, Some(&api_key), more.canonical_bytes().to_vec()).await,
        200,
        "",
    );
    bot.accept(&more);
    let (ok, out, err) = tally(
        &[
            "head",
            "--pack",
            pack_f.to_str().unwrap(),
            "-o",
            head_f.to_str().unwrap(),
        ],
        &env,
    );
    assert!(ok, "{out}{err}");
    let pack_text = std::fs::read_to_string(&pack_f).unwrap();
    assert_eq!(
        pack_text
            .lines()
            .filter(|l| l.starts_with("{\"receipt\"") || l.contains("\"type\":\"record\""))
            .count(),
        5
    );
    let (ok, out, err) = tally(
        &[
            "verify",
            pack_f.to_str().unwrap(),
            "--agent-keys",
            keys_f.to_str().unwrap(),
            "--witness-key",
            &vkey,
            "--head",
            head_f.to_str().unwrap(),
        ],
        &[],
    );
    assert!(
        ok && out.lines().last().unwrap_or_default().starts_with("PASS"),
        "tally verify:\n{out}{err}"
    );
    let (ok, _, err) = tally(
        &[
            "export",
            "--agent",
            "claims-bot",
            "-o",
            dir.join("refused.jsonl").to_str().unwrap(),
        ],
        &[
            ("TALLY_WITNESS_URL", url.as_str()),
            ("TALLY_API_KEY", other_key.as_str()),
        ],
    );
    assert!(!ok && err.contains("agent_not_allowed"), "{err}");

    // 7. SIGTERM drains and exits 0; a restart shows no API key and answers the same receipt.
    let status = server.sigterm();
    assert!(status.success(), "{status}");
    let server = Server::start(&data, &[]);
    assert!(!server.banner.contains("API key"), "{}", server.banner);
    let again = expect(
        post(
            &http,
            &server.url,
            Some(&api_key),
            r0.canonical_bytes().to_vec(),
        )
        .await,
        200,
        "",
    );
    assert_eq!(receipt0, again);
    let r = bot.draft("after restart");
    expect(
        post(
            &http,
            &server.url,
            Some(&api_key),
            r.canonical_bytes().to_vec(),
        )
        .await,
        200,
        "",
    );
}
