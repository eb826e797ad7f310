//! What the console's pages cost on a large chain: one agent with N records
//! (decision/outcome pairs after a tool list) in a real redb data folder,
//! then the overview, the agent page and an auditor link's pages timed
//! through the console's router (no sockets), cold and warm, and after new
//! records arrive.
//!
//!     cargo run --release -p tally-console --example console_scale -- 100000
//!
//! The records are admitted through `Witness::admit` in windows of 512 in
//! chain order, so group commit batches them (one fsync per batch).
//! docs/benchmarks.md "Console" has the figures.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use rand_core::OsRng;
use tally_console::Console;
use tally_schemas::record::{
    Decision, Outcome, OutcomeStatus, ToolEntry, ToolList, ToolPartDigests,
};
use tally_schemas::time::SystemClock;
use tally_schemas::{
    AgentName, Body as RecordBody, Hash, Nonce, Record, SecretKey, Seq, UnixMillis, UnsignedRecord,
};
use tally_witness::config::{ServeConfig, WitnessConfig};
use tally_witness::{server, Witness};
use tower::ServiceExt;

struct Agent {
    name: AgentName,
    key: SecretKey,
    seq: u64,
    prev: Option<Hash>,
}

impl Agent {
    fn sign(&mut self, body: RecordBody) -> Record {
        let r = UnsignedRecord {
            agent: self.name.clone(),
            key_id: self.key.public_key().key_id(),
            seq: Seq::new(self.seq).expect("seq"),
            prev: self.prev,
            time: UnixMillis::now(),
            nonce: Nonce::random(&mut OsRng),
            body,
        }
        .sign(&self.key)
        .expect("sign");
        self.seq += 1;
        self.prev = Some(r.hash());
        r
    }

    /// The next `n` records: decision/outcome pairs, every 50th an error.
    fn calls(&mut self, n: u64) -> Vec<Record> {
        let mut out = Vec::new();
        while (out.len() as u64) < n {
            let id = format!("c{}", self.seq);
            let d = self.sign(RecordBody::Decision(Decision {
                call_id: id.clone(),
                tool: if self.seq % 2 == 0 {
                    "lookup"
                } else {
                    "search"
                }
                .into(),
                input_hash: Hash::sha256(id.as_bytes()),
            }));
            let status = if self.seq % 100 == 1 {
                OutcomeStatus::Error
            } else {
                OutcomeStatus::Ok
            };
            let o = self.sign(RecordBody::Outcome(Outcome {
                call_id: id,
                decision: d.hash(),
                status,
                output_hash: None,
                state: None,
                proof: None,
                proof_hash: None,
            }));
            out.push(d);
            out.push(o);
        }
        out
    }
}

async fn post_all(w: &Arc<Witness>, key: &str, records: Vec<Record>) {
    for window in records.chunks(512) {
        let posts = window
            .iter()
            .map(|r| w.admit(Some(key), r.canonical_bytes()));
        for result in futures::future::join_all(posts).await {
            result.expect("admitted");
        }
    }
}

async fn get(app: &Router, uri: &str, cookie: Option<&str>) -> (StatusCode, String, Duration) {
    let mut req = Request::builder().uri(uri);
    if let Some(c) = cookie {
        req = req.header(header::COOKIE, c);
    }
    let t = Instant::now();
    let resp = app
        .clone()
        .oneshot(req.body(Body::empty()).expect("request"))
        .await
        .expect("response");
    let status = resp.status();
    let set = resp
        .headers()
        .get(header::SET_COOKIE)
        .map(|v| v.to_str().unwrap_or("").to_owned());
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    let elapsed = t.elapsed();
    let mut text = String::from_utf8_lossy(&body).into_owned();
    if let Some(set) = set {
        text.push_str("\nSET-COOKIE ");
        text.push_str(&set);
    }
    (status, text, elapsed)
}

fn between<'a>(s: &'a str, start: &str, end: &str) -> &'a str {
    let i = s.find(start).map_or(s.len(), |i| i + start.len());
    let j = s[i..].find(end).map_or(s.len(), |j| j + i);
    &s[i..j]
}

async fn login(app: &Router, api_key: &str) -> String {
    let (_, page, _) = get(app, "/console/login", None).await;
    let token = between(&page, "name=\"login_token\" value=\"", "\"").to_owned();
    let cookie = between(&page, "SET-COOKIE ", ";").to_owned();
    let req = Request::builder()
        .method("POST")
        .uri("/console/login")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(header::COOKIE, cookie)
        .body(Body::from(format!("login_token={token}&api_key={api_key}")))
        .expect("request");
    let resp = app.clone().oneshot(req).await.expect("response");
    assert_eq!(resp.status(), StatusCode::SEE_OTHER, "login");
    let set = resp.headers()[header::SET_COOKIE]
        .to_str()
        .expect("cookie")
        .to_owned();
    set.split(';').next().unwrap_or("").to_owned()
}

/// Reloads `uri` until its report is over the current head.
async fn until_report(app: &Router, uri: &str, cookie: Option<&str>) -> String {
    loop {
        let (_, page, _) = get(app, uri, cookie).await;
        if page.contains("data-check=") && !page.contains("report-as-of") {
            return page;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn row(what: &str, d: Duration, note: &str) {
    println!("| {what} | {:.1} ms | {note} |", d.as_secs_f64() * 1000.0);
}

#[tokio::main]
async fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let dir =
        tempfile::tempdir_in(std::env::var("TALLY_BENCH_DIR").unwrap_or_else(|_| "/tmp".into()))
            .expect("temp dir");
    let cfg = ServeConfig {
        data_dir: dir.path().to_owned(),
        // The records are posted as fast as the log takes them.
        witness: WitnessConfig {
            rate_limit: None,
            ..WitnessConfig::default()
        },
        ..ServeConfig::default()
    };
    let opened = server::open(&cfg, None, Arc::new(SystemClock), Box::new(OsRng)).expect("open");
    let api_key = opened.first_start.expect("first start").api_key.token;
    let w = opened.witness;
    let console = Console::open(Arc::clone(&w), dir.path(), false).expect("console");
    let app = tally_witness::http::router(Arc::clone(&w)).merge(tally_console::router(console));

    let mut bot = Agent {
        name: AgentName::new("big-bot").expect("name"),
        key: SecretKey::generate(&mut OsRng),
        seq: 0,
        prev: None,
    };
    w.registry()
        .add_agent(
            "default",
            &bot.name,
            bot.key.public_key(),
            UnixMillis::new(0),
        )
        .expect("register");
    let tools = (0..20)
        .map(|i| ToolEntry {
            name: format!("tool-{i}"),
            recorded: true,
            digest: Hash::sha256(&[i]),
            parts: ToolPartDigests::default(),
        })
        .collect();
    let list = bot.sign(RecordBody::Tools(ToolList {
        list_id: "l".into(),
        part: 0,
        parts: 1,
        tools,
        source: None,
        lease_ms: None,
    }));
    let t = Instant::now();
    let mut records = vec![list];
    records.extend(bot.calls(n - 1));
    let signed = t.elapsed();
    let t = Instant::now();
    post_all(&w, &api_key, records).await;
    println!(
        "big-bot: {} records signed in {:.1} s, admitted in {:.1} s (log size {})",
        bot.seq,
        signed.as_secs_f64(),
        t.elapsed().as_secs_f64(),
        w.log().latest_checkpoint().checkpoint.size
    );
    let middle = UnixMillis::now();
    let more = bot.calls(n / 4);
    post_all(&w, &api_key, more).await;
    let end = UnixMillis::now();

    let cookie = login(&app, &api_key).await;
    println!("\n| page | time | note |\n|---|---:|---|");
    let (s, over, d) = get(&app, "/console", Some(&cookie)).await;
    assert_eq!(s, StatusCode::OK);
    row(
        "overview, first",
        d,
        &format!(
            "{} records in the last 24 h",
            between(&over, "id=\"records-24h\">", "<")
        ),
    );
    let (_, _, d) = get(&app, "/console", Some(&cookie)).await;
    row("overview, again", d, "");
    let t = Instant::now();
    let (s, page, d) = get(&app, "/console/agents/big-bot", Some(&cookie)).await;
    assert_eq!(s, StatusCode::OK);
    let records = between(&page, "id=\"record-count\">", "<").to_owned();
    row(
        "agent page, first",
        d,
        if page.contains("PASS: 12 checks") {
            "read the table's records, verified the chain"
        } else {
            "read the table's records; the report is still running (a page waits at most 10 s)"
        },
    );
    let page = until_report(&app, "/console/agents/big-bot", Some(&cookie)).await;
    assert!(page.contains("PASS: 12 checks"), "the report passes");
    row(
        "  until the first report shows",
        t.elapsed(),
        &format!("{records} records verified"),
    );
    let (_, _, d) = get(&app, "/console/agents/big-bot", Some(&cookie)).await;
    row("agent page, again", d, "view and report kept");
    let (_, _, d) = get(
        &app,
        "/console/agents/big-bot?q=c4242&status=ok",
        Some(&cookie),
    )
    .await;
    row("agent page, search", d, "");
    let (_, _, d) = get(&app, "/console/agents/big-bot?page=900", Some(&cookie)).await;
    row("agent page, page 900", d, "");

    post_all(&w, &api_key, bot.calls(100)).await;
    let (_, page, d) = get(&app, "/console/agents/big-bot", Some(&cookie)).await;
    let older = page.contains("report-as-of");
    row(
        "agent page, 100 records later",
        d,
        if older {
            "shows the previous report; the new one runs in the background"
        } else {
            "new report ready"
        },
    );
    let t = Instant::now();
    until_report(&app, "/console/agents/big-bot", Some(&cookie)).await;
    row(
        "  until the new report shows",
        t.elapsed(),
        "background verification",
    );

    // An auditor link over the last quarter of the chain.
    let (_, links, _) = get(&app, "/console/links", Some(&cookie)).await;
    let csrf = between(&links, "name=\"csrf\" value=\"", "\"").to_owned();
    let req = Request::builder()
        .method("POST")
        .uri("/console/links")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(header::COOKIE, &cookie)
        .body(Body::from(format!(
            "csrf={csrf}&agent=big-bot&since={}&until={}",
            middle, end
        )))
        .expect("request");
    let resp = app.clone().oneshot(req).await.expect("response");
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    let body = String::from_utf8_lossy(&body);
    let url = between(&body, "id=\"new-link-url\" href=\"", "\"").to_owned();
    let (s, home, d) = get(&app, &url, None).await;
    assert_eq!(s, StatusCode::OK);
    row(
        "auditor home",
        d,
        &format!(
            "{} records in range",
            between(&home, "id=\"records-in-range\">", "<")
        ),
    );
    let t = Instant::now();
    let (_, _, d) = get(&app, &format!("{url}/agents/big-bot"), None).await;
    row("auditor agent page, first", d, "");
    let page = until_report(&app, &format!("{url}/agents/big-bot"), None).await;
    assert!(
        page.contains("PASS: 12 checks"),
        "the range's report passes"
    );
    row(
        "  until its report shows",
        t.elapsed(),
        "verifies the range",
    );
    let (_, _, d) = get(&app, &format!("{url}/agents/big-bot"), None).await;
    row("auditor agent page, again", d, "");
    let (s, pack, d) = get(&app, &format!("{url}/pack"), None).await;
    assert_eq!(s, StatusCode::OK);
    row(
        "auditor pack download",
        d,
        &format!("{} MB", pack.len() / 1_000_000),
    );
}
