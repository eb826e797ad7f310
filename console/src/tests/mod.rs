//! Handler tests of the console, without sockets: a witness over a temp
//! data folder, the witness's router with the console merged in, driven by
//! `tower::ServiceExt::oneshot`. Records are signed here and admitted
//! through [`tally_witness::Witness::admit`], as `POST /v1/records` would.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use rand_core::OsRng;
use tally_schemas::pack::AgentKeys;
use tally_schemas::record::{
    ActionState, Claim, Decision, NoteBody, Outcome, OutcomeStatus, ToolEntry, ToolList,
    ToolPartDigests,
};
use tally_schemas::report::Verdict;
use tally_schemas::{
    AgentName, Body as RecordBody, Hash, Nonce, Record, SecretKey, Seq, UnixMillis, UnsignedRecord,
};
use tally_testkit::clock::TestClock;
use tower::ServiceExt;

use super::{Console, ConsoleLimits};
use tally_witness::config::{ServeConfig, WitnessConfig};
use tally_witness::{server, Witness};

mod auditor;
mod hostile;
mod login;
mod pages;
mod reports;
mod verify;

/// 2026-11-30T08:00:00.000Z.
const T0: i64 = 1_796_025_600_000;
const HOSTILE_TOOL: &str = "<script>alert('tool')</script>";
const HOSTILE_NOTE: &str = "<img src=x onerror=alert('note')> & \"quoted\"";
const HOSTILE_CALL: &str = "\"><svg onload=alert(1)>";

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

    fn sign(&mut self, time: i64, body: RecordBody) -> Record {
        let r = UnsignedRecord {
            agent: self.name.clone(),
            key_id: self.key.public_key().key_id(),
            seq: Seq::new(self.seq).unwrap(),
            prev: self.prev,
            time: UnixMillis::new(time),
            nonce: Nonce::random(&mut OsRng),
            body,
        }
        .sign(&self.key)
        .unwrap();
        self.seq += 1;
        self.prev = Some(r.hash());
        r
    }
}

struct H {
    _dir: tempfile::TempDir,
    witness: Arc<Witness>,
    console: Arc<Console>,
    app: Router,
    clock: Arc<TestClock>,
    api_key: String,
    other_key: String,
}

fn harness() -> H {
    harness_with(ConsoleLimits::default())
}

fn harness_with(limits: ConsoleLimits) -> H {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(TestClock(AtomicI64::new(T0)));
    let cfg = ServeConfig {
        data_dir: dir.path().to_owned(),
        witness: WitnessConfig::default(),
        ..ServeConfig::default()
    };
    let opened = server::open(&cfg, None, Arc::clone(&clock) as _, Box::new(OsRng)).unwrap();
    let first = opened.first_start.unwrap();
    let witness = opened.witness;
    let other_key = witness.create_project("other").unwrap().token;
    let console =
        Console::open_with_limits(Arc::clone(&witness), dir.path(), false, limits).unwrap();
    let app = tally_witness::http::router(Arc::clone(&witness))
        .merge(super::router(Arc::clone(&console)));
    H {
        _dir: dir,
        witness,
        console,
        app,
        clock,
        api_key: first.api_key.token,
        other_key,
    }
}

impl H {
    fn register(&self, agent: &Agent, project: &str) {
        self.witness
            .registry()
            .add_agent(
                project,
                &agent.name,
                agent.key.public_key(),
                UnixMillis::new(T0 - 3_600_000),
            )
            .unwrap();
    }

    async fn post(&self, key: &str, r: &Record) -> u64 {
        let admitted = self
            .witness
            .admit(Some(key), r.canonical_bytes())
            .await
            .unwrap();
        admitted.receipt.index.get()
    }

    async fn call(&self, req: Request<Body>) -> (StatusCode, axum::http::HeaderMap, String) {
        let resp = self.app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let body = String::from_utf8_lossy(&body).into_owned();
        assert_no_repeated_class(&body);
        (status, headers, body)
    }

    async fn get(
        &self,
        uri: &str,
        cookie: Option<&str>,
    ) -> (StatusCode, axum::http::HeaderMap, String) {
        let mut req = Request::builder().uri(uri);
        if let Some(c) = cookie {
            req = req.header(header::COOKIE, c);
        }
        self.call(req.body(Body::empty()).unwrap()).await
    }

    async fn post_form(
        &self,
        uri: &str,
        cookie: Option<&str>,
        form: &str,
    ) -> (StatusCode, axum::http::HeaderMap, String) {
        let mut req = Request::builder()
            .method("POST")
            .uri(uri)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        if let Some(c) = cookie {
            req = req.header(header::COOKIE, c);
        }
        self.call(req.body(Body::from(form.to_owned())).unwrap())
            .await
    }

    /// Logs in; returns the cookie header value and the CSRF token.
    /// Posts the login form as a browser would: with the token and cookie
    /// the login page handed out.
    async fn post_login(&self, key: &str) -> (StatusCode, axum::http::HeaderMap, String) {
        self.post_login_from(key, None).await
    }

    /// [`Self::post_login`] from the client address `from`, as `tally
    /// serve` hands it to the router (`ConnectInfo`); `None`: no address.
    async fn post_login_from(
        &self,
        key: &str,
        from: Option<SocketAddr>,
    ) -> (StatusCode, axum::http::HeaderMap, String) {
        let (s, hd, page) = self.get("/console/login", None).await;
        assert_eq!(s, StatusCode::OK);
        let cookie = login_cookie(&hd);
        let token = between(&page, "name=\"login_token\" value=\"", "\"").to_owned();
        let mut req = Request::builder()
            .method("POST")
            .uri("/console/login")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(header::COOKIE, cookie);
        if let Some(addr) = from {
            req = req.extension(ConnectInfo(addr));
        }
        self.call(
            req.body(Body::from(format!("login_token={token}&api_key={key}")))
                .unwrap(),
        )
        .await
    }

    /// Makes an auditor link with the form fields `fields` (after the CSRF
    /// token) and returns its URL.
    async fn make_link(&self, cookie: &str, csrf: &str, fields: &str) -> String {
        let (s, _, body) = self
            .post_form(
                "/console/links",
                Some(cookie),
                &format!("csrf={csrf}&{fields}"),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{body}");
        between(&body, "id=\"new-link-url\" href=\"", "\"").to_owned()
    }

    async fn login(&self, key: &str) -> (String, String) {
        let (s, h, _) = self.post_login(key).await;
        assert_eq!(s, StatusCode::SEE_OTHER);
        let set = h
            .get(header::SET_COOKIE)
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        let cookie = set.split(';').next().unwrap().to_owned();
        let (s, _, body) = self.get("/console/links", Some(&cookie)).await;
        assert_eq!(s, StatusCode::OK);
        let csrf = between(&body, "name=\"csrf\" value=\"", "\"").to_owned();
        (cookie, csrf)
    }
}

/// Every tag of `html` has at most one `class` attribute: browsers keep the
/// first of two, so a second (maud's `p.x class=(..)` writes both) would
/// silently drop the styling that makes errors and open decisions stand out.
fn assert_no_repeated_class(html: &str) {
    for tag in html.split('<').skip(1) {
        let tag = tag.split('>').next().unwrap_or("");
        assert!(
            tag.matches(" class=").count() <= 1,
            "a tag with two class attributes: <{tag}>"
        );
    }
}

/// The `tally_login=…` pair a login page set.
fn login_cookie(hd: &axum::http::HeaderMap) -> String {
    let set = hd.get(header::SET_COOKIE).unwrap().to_str().unwrap();
    assert!(set.starts_with("tally_login="), "{set}");
    set.split(';').next().unwrap().to_owned()
}

fn between<'a>(s: &'a str, start: &str, end: &str) -> &'a str {
    let i = s
        .find(start)
        .unwrap_or_else(|| panic!("{start:?} not in page"))
        + start.len();
    let j = s[i..].find(end).unwrap() + i;
    &s[i..j]
}

fn tool(name: &str, recorded: bool, d: u8) -> ToolEntry {
    ToolEntry {
        name: name.into(),
        recorded,
        digest: Hash::sha256(&[d]),
        parts: ToolPartDigests {
            description: Some(Hash::sha256(&[d, 1])),
            ..ToolPartDigests::default()
        },
    }
}

fn tools_body(list_id: &str, tools: Vec<ToolEntry>) -> RecordBody {
    RecordBody::Tools(ToolList {
        list_id: list_id.into(),
        part: 0,
        parts: 1,
        tools,
        source: None,
        lease_ms: None,
    })
}

fn decision(call_id: &str, tool: &str) -> RecordBody {
    RecordBody::Decision(Decision {
        call_id: call_id.into(),
        tool: tool.into(),
        input_hash: Hash::sha256(call_id.as_bytes()),
    })
}

fn outcome(call_id: &str, decision: &Record, status: OutcomeStatus) -> RecordBody {
    RecordBody::Outcome(Outcome {
        call_id: call_id.into(),
        decision: decision.hash(),
        status,
        output_hash: None,
        state: None,
        proof: None,
        proof_hash: None,
    })
}

/// Posts a small hostile chain for `bot`: tool list, an answered call with
/// an error, a tool-definition change, an open call, a note. Returns the
/// log indexes of the records.
async fn hostile_chain(h: &H, bot: &mut Agent) -> Vec<u64> {
    let mut idx = Vec::new();
    let t = T0;
    let r = bot.sign(
        t,
        tools_body(
            "l1",
            vec![
                tool(HOSTILE_TOOL, true, 1),
                tool("search", true, 2),
                tool("send_mail", false, 3),
            ],
        ),
    );
    idx.push(h.post(&h.api_key, &r).await);
    let d = bot.sign(t + 1, decision(HOSTILE_CALL, HOSTILE_TOOL));
    idx.push(h.post(&h.api_key, &d).await);
    let o = bot.sign(t + 2, outcome(HOSTILE_CALL, &d, OutcomeStatus::Error));
    idx.push(h.post(&h.api_key, &o).await);
    let d2 = bot.sign(t + 3, decision("c2", "search"));
    idx.push(h.post(&h.api_key, &d2).await);
    let o2 = bot.sign(t + 4, outcome("c2", &d2, OutcomeStatus::Ok));
    idx.push(h.post(&h.api_key, &o2).await);
    let r = bot.sign(
        t + 5,
        tools_body(
            "l2",
            vec![
                tool(HOSTILE_TOOL, true, 1),
                tool("search", true, 9),
                tool("send_mail", false, 3),
            ],
        ),
    );
    idx.push(h.post(&h.api_key, &r).await);
    let d3 = bot.sign(t + 6, decision("c3", "refund"));
    idx.push(h.post(&h.api_key, &d3).await);
    let n = bot.sign(
        t + 7,
        RecordBody::Note(NoteBody {
            text: HOSTILE_NOTE.into(),
        }),
    );
    idx.push(h.post(&h.api_key, &n).await);
    idx
}

/// A witness whose project has the agent `bot` with [`hostile_chain`]
/// posted, and the log indexes of that chain.
async fn hostile_bot() -> (H, Agent, Vec<u64>) {
    let h = harness();
    let mut bot = Agent::new("bot");
    h.register(&bot, "default");
    h.clock.0.store(T0 + 10, Ordering::SeqCst);
    let idx = hostile_chain(&h, &mut bot).await;
    (h, bot, idx)
}

fn assert_escaped(body: &str) {
    assert!(!body.contains("<script>alert"), "raw script in page");
    assert!(!body.contains("<img src=x"), "raw img in page");
    assert!(!body.contains("<svg onload"), "raw svg in page");
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

async fn verify_pack(h: &H, pack: &[u8]) -> tally_verifier::Verification {
    let keys = tally_witness::export::agent_keys(
        h.witness.registry(),
        h.witness.log().origin(),
        "default",
        &[],
    )
    .unwrap();
    super::data::run_verify(
        pack,
        &keys,
        h.witness.log().verifier(),
        None,
        300_000,
        300_000,
    )
    .unwrap()
}

/// One multipart field: name, file name, content.
type Field<'a> = (&'a str, Option<&'a str>, &'a [u8]);

fn multipart(fields: &[Field<'_>]) -> (String, Vec<u8>) {
    let boundary = "----tallyconsoletestboundary";
    let mut body = Vec::new();
    for (name, filename, data) in fields {
        body.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
        match filename {
            Some(f) => body.extend_from_slice(format!("Content-Disposition: form-data; name=\"{name}\"; filename=\"{f}\"\r\nContent-Type: application/octet-stream\r\n\r\n").as_bytes()),
            None => body.extend_from_slice(format!("Content-Disposition: form-data; name=\"{name}\"\r\n\r\n").as_bytes()),
        }
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

async fn upload(
    h: &H,
    uri: &str,
    cookie: Option<&str>,
    fields: &[Field<'_>],
) -> (StatusCode, String) {
    let (ct, body) = multipart(fields);
    let mut req = Request::builder()
        .method("POST")
        .uri(uri)
        .header(header::CONTENT_TYPE, ct);
    if let Some(c) = cookie {
        req = req.header(header::COOKIE, c);
    }
    let (s, _, body) = h.call(req.body(Body::from(body)).unwrap()).await;
    (s, body)
}
