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

#[tokio::test]
async fn console_pages_need_a_login() {
    let h = harness();
    for uri in [
        "/console",
        "/console/agents/bot",
        "/console/records/0",
        "/console/verify",
        "/console/links",
        "/console/agents/bot/pack",
    ] {
        let (s, hd, _) = h.get(uri, None).await;
        assert_eq!(s, StatusCode::SEE_OTHER, "{uri}");
        assert_eq!(hd.get(header::LOCATION).unwrap(), "/console/login");
    }
    let (s, _, body) = h.get("/console/login", None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(body.contains("name=\"api_key\""));
    let (s, _, body) = h
        .post_login("tally_0000000000000000_000000000000000000000000000000000000000000000000")
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert!(body.contains("unknown or revoked"));
    // A good key without the login form's token and cookie is refused (login
    // CSRF), as is a token that does not match the cookie.
    let (s, hd, _) = h.get("/console/login", None).await;
    assert_eq!(s, StatusCode::OK);
    let cookie = login_cookie(&hd);
    // A token the client made up itself, the same in cookie and form: not
    // one this server made.
    let forged = format!("tally_login={}", "a".repeat(64));
    for (cookie, form) in [
        (
            Some(forged.as_str()),
            format!("login_token={}&api_key={}", "a".repeat(64), h.api_key),
        ),
        (None, format!("api_key={}", h.api_key)),
        (Some(cookie.as_str()), format!("api_key={}", h.api_key)),
        (
            Some(cookie.as_str()),
            format!("login_token={}&api_key={}", "0".repeat(64), h.api_key),
        ),
    ] {
        let (s, hd, body) = h.post_form("/console/login", cookie, &form).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{form}");
        assert!(body.contains("log in again"));
        assert!(!hd
            .get_all(header::SET_COOKIE)
            .iter()
            .any(|v| v.to_str().unwrap().starts_with("tally_console=")));
    }
    // A forged cookie is not a session.
    let (s, _, _) = h.get("/console", Some("tally_console=00ff")).await;
    assert_eq!(s, StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn console_login_cookie_headers_and_overview() {
    let h = harness();
    let mut bot = Agent::new("claims-bot");
    h.register(&bot, "default");
    let mut stranger = Agent::new("stranger");
    h.register(&stranger, "other");
    h.clock.0.store(T0 + 10, Ordering::SeqCst);
    hostile_chain(&h, &mut bot).await;
    let r = stranger.sign(T0, RecordBody::Note(NoteBody { text: "x".into() }));
    h.post(&h.other_key, &r).await;

    let (s, hd, _) = h.post_login(&h.api_key).await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    let set = hd.get(header::SET_COOKIE).unwrap().to_str().unwrap();
    assert!(
        set.starts_with("tally_console=")
            && set.contains("HttpOnly")
            && set.contains("SameSite=Strict")
            && set.contains("Path=/console")
    );
    assert!(!set.contains("Secure"), "no TLS here");
    let cookie = set.split(';').next().unwrap();

    let (s, hd, body) = h.get("/console", Some(cookie)).await;
    assert_eq!(s, StatusCode::OK);
    let csp = hd
        .get(header::CONTENT_SECURITY_POLICY)
        .unwrap()
        .to_str()
        .unwrap();
    assert!(
        csp.contains("default-src 'none'")
            && csp.contains("script-src 'self'")
            && !csp.contains("unsafe")
    );
    assert_eq!(hd.get(header::X_FRAME_OPTIONS).unwrap(), "DENY");
    assert_eq!(hd.get(header::CACHE_CONTROL).unwrap(), "no-store");
    assert!(body.contains("claims-bot"));
    assert!(
        !body.contains("stranger"),
        "another project's agent is shown"
    );
    assert!(body.contains("id=\"log-size\">9<"), "log size");
    assert!(
        body.contains("id=\"records-24h\">8<"),
        "records in the last 24 hours"
    );
    assert!(body.contains("<svg"), "chart");
    assert!(body.contains(
        &h.witness
            .log()
            .latest_checkpoint()
            .checkpoint
            .root
            .to_string()
    ));
    // The agent row: 8 records, head seq 7.
    assert!(body.contains(">8</td>"));
    assert!(body.contains("seq 7 @"));

    // Assets are served by the binary.
    let (s, hd, css) = h.get("/console/assets/console.css", None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(hd
        .get(header::CONTENT_TYPE)
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("text/css"));
    assert!(css.contains("svg.chart"));
    let (s, _, js) = h.get("/console/assets/console.js", None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(js.contains("addEventListener"));
}

#[tokio::test]
async fn console_escapes_hostile_names_and_notes() {
    let (h, _, idx) = hostile_bot().await;
    let (cookie, _) = h.login(&h.api_key).await;
    let (s, _, body) = h.get("/console/agents/bot", Some(&cookie)).await;
    assert_eq!(s, StatusCode::OK);
    assert_escaped(&body);
    assert!(
        body.contains("&lt;script&gt;alert('tool')&lt;/script&gt;"),
        "tool name shown as text"
    );
    assert!(
        body.contains("&lt;img src=x onerror=alert('note')&gt; &amp; &quot;quoted&quot;"),
        "note shown as text"
    );
    assert!(
        body.contains("&quot;&gt;&lt;svg onload=alert(1)&gt;"),
        "call id shown as text"
    );
    for i in &idx {
        let (s, _, body) = h.get(&format!("/console/records/{i}"), Some(&cookie)).await;
        assert_eq!(s, StatusCode::OK);
        assert_escaped(&body);
    }
    let (_, _, body) = h
        .get(&format!("/console/records/{}", idx[7]), Some(&cookie))
        .await;
    assert!(body.contains("&lt;img src=x"));
    // A search for the hostile text is echoed escaped too.
    let (s, _, body) = h
        .get(
            "/console/agents/bot?q=%3Cscript%3Ealert(%27x%27)%3C%2Fscript%3E",
            Some(&cookie),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_escaped(&body);
}

/// An action tool's outcome with `state` (docs/protocol.md §5.2).
fn action_outcome(
    call_id: &str,
    decision: &Record,
    status: OutcomeStatus,
    state: ActionState,
) -> RecordBody {
    RecordBody::Outcome(Outcome {
        call_id: call_id.into(),
        decision: decision.hash(),
        status,
        output_hash: None,
        state: Some(state),
        proof: None,
        proof_hash: (state == ActionState::Posted).then(|| Hash::sha256(call_id.as_bytes())),
    })
}

#[tokio::test]
async fn console_agent_page_states_actions_and_claims_and_filters_calls_by_state() {
    let h = harness();
    let mut bot = Agent::new("bot");
    h.register(&bot, "default");
    h.clock.0.store(T0 + 10, Ordering::SeqCst);
    let r = bot.sign(
        T0,
        tools_body(
            "l1",
            vec![tool("send_email", true, 1), tool("lookup", true, 2)],
        ),
    );
    h.post(&h.api_key, &r).await;
    let mut t = T0 + 1;
    let calls = [
        ("1", OutcomeStatus::Ok, Some(ActionState::Posted)),
        ("2", OutcomeStatus::Ok, Some(ActionState::Posted)),
        ("3", OutcomeStatus::Ok, Some(ActionState::Unknown)),
        ("4", OutcomeStatus::Error, Some(ActionState::Failed)),
        ("5", OutcomeStatus::Ok, None),
    ];
    for (id, status, state) in calls {
        let tool_name = if state.is_some() {
            "send_email"
        } else {
            "lookup"
        };
        let d = bot.sign(t, decision(id, tool_name));
        h.post(&h.api_key, &d).await;
        let body = match state {
            Some(s) => action_outcome(id, &d, status, s),
            None => outcome(id, &d, status),
        };
        let o = bot.sign(t + 1, body);
        h.post(&h.api_key, &o).await;
        t += 2;
    }
    let claim = bot.sign(
        t,
        RecordBody::Claim(Claim {
            tool: "send_email".into(),
            turn_hash: Hash::sha256(b"I've sent the email"),
        }),
    );
    let claim_index = h.post(&h.api_key, &claim).await;
    h.clock.0.store(T0 + 1000, Ordering::SeqCst);
    let (cookie, _) = h.login(&h.api_key).await;
    let (s, _, body) = h.get("/console/agents/bot", Some(&cookie)).await;
    assert_eq!(s, StatusCode::OK);
    assert!(body.contains("id=\"action-count\">2 / 1 / 1<"), "{body}");
    assert!(body.contains("id=\"claim-count\">1<"));
    // The verifier's statement, as `tally verify` prints it.
    assert!(body.contains("coverage: bot: action calls: 2 posted, 1 unknown, 1 failed"));
    assert!(body.contains("coverage: bot: 1 claim without a call: send_email at seq 11"));
    assert!(body.contains(&format!("href=\"/console/records/{claim_index}\">11<")));
    assert!(body.contains(&Hash::sha256(b"I've sent the email").to_string()));
    // The action column, and the filter by state.
    assert_eq!(
        body.matches("<td class=\"state\"><span class=\"st pass\">posted<")
            .count(),
        2
    );
    for (state, n) in [("posted", 2), ("unknown", 1), ("failed", 1)] {
        let (s, _, page) = h
            .get(
                &format!("/console/agents/bot?status={state}"),
                Some(&cookie),
            )
            .await;
        assert_eq!(s, StatusCode::OK);
        assert!(page.contains(&format!("{n} of 5 calls")), "{state}");
        assert!(
            page.contains(&format!("<option value=\"{state}\" selected")),
            "{state}"
        );
    }
    let (s, _, _) = h
        .get("/console/agents/bot?status=sent", Some(&cookie))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    // An agent without actions has no such section.
    let (h2, _, _) = hostile_bot().await;
    let (cookie2, _) = h2.login(&h2.api_key).await;
    let (_, _, plain) = h2.get("/console/agents/bot", Some(&cookie2)).await;
    assert!(!plain.contains("actions-heading"));
    assert!(!plain.contains("action-count"));
}

#[tokio::test]
async fn console_agent_page_coverage_pairs_and_search() {
    let (h, mut bot, _) = hostile_bot().await;
    // Many answered calls, for paging.
    for i in 0..60 {
        let d = bot.sign(T0 + 100 + i * 2, decision(&format!("p{i}"), "lookup"));
        h.post(&h.api_key, &d).await;
        let o = bot.sign(
            T0 + 101 + i * 2,
            outcome(&format!("p{i}"), &d, OutcomeStatus::Ok),
        );
        h.post(&h.api_key, &o).await;
    }
    h.clock.0.store(T0 + 1000, Ordering::SeqCst);
    let (cookie, _) = h.login(&h.api_key).await;
    let (s, _, body) = h.get("/console/agents/bot", Some(&cookie)).await;
    assert_eq!(s, StatusCode::OK);

    // The coverage lines are the verifier's, over the same pack an export gives.
    let keys = tally_witness::export::agent_keys(
        h.witness.registry(),
        h.witness.log().origin(),
        "default",
        &[],
    )
    .unwrap();
    let v = super::data::verify_export(
        &h.witness,
        "default",
        &[bot.name.clone()],
        tally_witness::export::ExportRange::All,
    )
    .unwrap();
    assert!(!v.report.coverage.is_empty());
    for line in &v.report.coverage {
        let shown = format!("coverage: {}", html_escape(line));
        assert!(body.contains(&shown), "missing {shown:?}");
    }
    assert!(v
        .report
        .coverage
        .iter()
        .any(|l| l == "bot: 1 declared tool is not recorded: send_mail"));
    assert!(v
        .report
        .coverage
        .iter()
        .any(|l| l == "bot: 2 recorded tools are not in the declared tool list: lookup, refund"));
    assert!(v
        .report
        .coverage
        .iter()
        .any(|l| l == "bot: tool search changed at seq 5: description"));
    assert!(body.contains("id=\"tool-changes\""));
    assert!(keys.agents.iter().any(|a| a.agent == bot.name));
    // The twelve checks are listed.
    assert_eq!(body.matches("data-check=").count(), 12);

    // Pairs: 63 calls, 1 open, 1 error, highlighted.
    assert!(body.contains("id=\"call-count\">63<"));
    assert!(body.contains("id=\"open-count\">1<"));
    assert!(body.contains("id=\"error-count\">1<"));
    assert_eq!(
        body.matches("<tr class=\"open\"").count(),
        0,
        "the open call is on the last page"
    );
    assert_eq!(
        body.matches("<tr class=\"ok\"").count(),
        50,
        "a page holds 50 rows"
    );
    assert!(body.contains("page 1 of 2"));
    let (_, _, p2) = h.get("/console/agents/bot?page=2", Some(&cookie)).await;
    assert_eq!(p2.matches("<tr class=\"open\"").count(), 1);
    assert_eq!(p2.matches("<tr class=\"error\"").count(), 1);
    // Filters.
    let (_, _, open) = h
        .get("/console/agents/bot?status=open", Some(&cookie))
        .await;
    assert!(open.contains("1 of 63 calls"));
    assert!(open.contains(">refund<"));
    let (_, _, err) = h
        .get("/console/agents/bot?status=error", Some(&cookie))
        .await;
    assert!(err.contains("1 of 63 calls"));
    let (_, _, q) = h.get("/console/agents/bot?q=p5", Some(&cookie)).await;
    assert!(q.contains("11 of 63 calls"), "p5 and p50..p59");
    let (_, _, q) = h
        .get("/console/agents/bot?q=LOOKUP&status=ok", Some(&cookie))
        .await;
    assert!(q.contains("60 of 63 calls"));
    // Key status.
    assert!(body.contains(&bot.key.public_key().key_id().to_string()));
    assert!(body.contains(">active<"));
}

#[tokio::test]
async fn console_pages_follow_new_records() {
    let (h, mut bot, _) = hostile_bot().await;
    let (cookie, _) = h.login(&h.api_key).await;
    let (_, _, over) = h.get("/console", Some(&cookie)).await;
    assert_eq!(between(&over, "id=\"records-24h\">", "<"), "8");
    let (_, _, page) = h.get("/console/agents/bot", Some(&cookie)).await;
    assert_eq!(between(&page, "id=\"call-count\">", "<"), "3");
    assert!(
        page.contains("PASS: 12 checks"),
        "the first report is computed for the page"
    );
    assert!(!page.contains("report-as-of"));

    // Two more calls, one of them answering the open decision.
    let d = bot.sign(T0 + 20, decision("late-1", "lookup"));
    h.post(&h.api_key, &d).await;
    let o = bot.sign(T0 + 21, outcome("late-1", &d, OutcomeStatus::Error));
    h.post(&h.api_key, &o).await;
    let (_, _, over) = h.get("/console", Some(&cookie)).await;
    assert_eq!(
        between(&over, "id=\"records-24h\">", "<"),
        "10",
        "counted from new entries"
    );
    let (_, _, page) = h.get("/console/agents/bot", Some(&cookie)).await;
    assert_eq!(
        between(&page, "id=\"call-count\">", "<"),
        "4",
        "the view grew"
    );
    assert_eq!(between(&page, "id=\"error-count\">", "<"), "2");
    assert_eq!(between(&page, "id=\"record-count\">", "<"), "10");
    // The report is either already over the new head, or the previous one,
    // said so, while the new one runs; it arrives without blocking pages.
    let mut page = page;
    for _ in 0..200 {
        if !page.contains("report-as-of") {
            break;
        }
        assert!(page.contains("covers seq 0 to 7"), "{page}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        page = h.get("/console/agents/bot", Some(&cookie)).await.2;
    }
    assert!(!page.contains("report-as-of"), "the new report arrived");
    assert!(
        page.contains("10 records from 1 agent"),
        "over the new head"
    );
    // An hour later the chart still counts those records in their hour.
    h.clock.0.store(T0 + 3_600_000, Ordering::SeqCst);
    let (_, _, over) = h.get("/console", Some(&cookie)).await;
    assert_eq!(between(&over, "id=\"records-24h\">", "<"), "10");
    // A day later they are out of the window.
    h.clock.0.store(T0 + 25 * 3_600_000, Ordering::SeqCst);
    let (cookie, _) = h.login(&h.api_key).await; // sessions last 8 hours
    let (_, _, over) = h.get("/console", Some(&cookie)).await;
    assert_eq!(between(&over, "id=\"records-24h\">", "<"), "0");
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

#[tokio::test]
async fn console_record_page_and_its_pack_verify() {
    let (h, _, idx) = hostile_bot().await;
    // Far past the grace window: a pack ending on an answered decision
    // would fail check 10, so the download runs through the outcome.
    h.clock.0.store(T0 + 3_600_000, Ordering::SeqCst);
    let (cookie, _) = h.login(&h.api_key).await;
    let (s, _, body) = h
        .get(&format!("/console/records/{}", idx[3]), Some(&cookie))
        .await;
    assert_eq!(s, StatusCode::OK);
    assert!(body.contains("id=\"record-kind\">decision<"));
    let (_, proof) = h
        .witness
        .log()
        .inclusion_proof(tally_schemas::LeafIndex::new(idx[3]), None)
        .unwrap();
    for p in &proof {
        assert!(body.contains(&p.to_string()), "inclusion proof hash shown");
    }
    assert!(body.contains(&html_escape(&h.witness.log().latest_checkpoint().note)));
    assert!(body.contains("through the decision's outcome"));
    for (i, records) in [(idx[3], 2u64), (idx[4], 1), (idx[7], 1), (idx[0], 1)] {
        let (s, hd, pack) = h
            .get(&format!("/console/records/{i}/pack"), Some(&cookie))
            .await;
        assert_eq!(s, StatusCode::OK);
        assert!(hd
            .get(header::CONTENT_DISPOSITION)
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("attachment"));
        let v = verify_pack(&h, pack.as_bytes()).await;
        assert_eq!(v.report.result, Verdict::Pass, "{}", v.to_text());
        assert_eq!(v.report.records, records);
    }
    // The open decision's pack is honest: it fails check 10.
    let (_, _, pack) = h
        .get(&format!("/console/records/{}/pack", idx[6]), Some(&cookie))
        .await;
    assert_eq!(
        verify_pack(&h, pack.as_bytes()).await.report.result,
        Verdict::Fail
    );
    // The agent's whole pack.
    let (s, _, pack) = h.get("/console/agents/bot/pack", Some(&cookie)).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(verify_pack(&h, pack.as_bytes()).await.report.records, 8);
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

#[tokio::test]
async fn console_verify_page_prints_what_tally_verify_prints() {
    let (h, _, _) = hostile_bot().await;
    let (cookie, csrf) = h.login(&h.api_key).await;
    let (_, _, pack) = h.get("/console/agents/bot/pack", Some(&cookie)).await;
    let keys = tally_witness::export::to_canonical(
        &tally_witness::export::agent_keys(
            h.witness.registry(),
            h.witness.log().origin(),
            "default",
            &[],
        )
        .unwrap(),
    )
    .unwrap();
    let expected = verify_pack(&h, pack.as_bytes()).await.to_text();

    let (s, body) = upload(
        &h,
        "/console/verify",
        Some(&cookie),
        &[
            ("csrf", None, csrf.as_bytes()),
            ("witness_key", None, b""),
            ("agent_keys", Some("agent-keys.json"), &keys),
            ("head", Some(""), b""),
            ("pack", Some("pack.jsonl"), pack.as_bytes()),
        ],
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    // The text block is exactly the CLI's text, HTML-escaped.
    assert!(
        body.contains(&html_escape(&expected)),
        "report text differs"
    );
    assert!(body.contains("PASS: 12 checks"));
    assert!(
        body.contains("--max-skew 300 --grace 300"),
        "the CLI's defaults"
    );
    assert_escaped(&body);

    // --max-skew and --grace are tally verify's: a skew bound of 0 s fails
    // the timing check of records whose agent and witness times differ, as
    // the CLI would; the command shown says so.
    let strict = super::data::run_verify(
        pack.as_bytes(),
        &AgentKeys::from_json(&keys).unwrap(),
        h.witness.log().verifier(),
        None,
        0,
        0,
    )
    .unwrap()
    .to_text();
    assert_ne!(strict, expected, "the settings change the report");
    let (s, body) = upload(
        &h,
        "/console/verify",
        Some(&cookie),
        &[
            ("csrf", None, csrf.as_bytes()),
            ("agent_keys", Some("k"), &keys),
            ("max_skew", None, b"0"),
            ("grace", None, b"0"),
            ("pack", Some("p"), pack.as_bytes()),
        ],
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert!(body.contains(&html_escape(&strict)), "report text differs");
    assert!(body.contains("--max-skew 0 --grace 0"));
    for bad in [&b"soon"[..], b"-1", b"999999999999"] {
        let (s, body) = upload(
            &h,
            "/console/verify",
            Some(&cookie),
            &[
                ("csrf", None, csrf.as_bytes()),
                ("agent_keys", Some("k"), &keys),
                ("max_skew", None, bad),
                ("pack", Some("p"), pack.as_bytes()),
            ],
        )
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        assert!(body.contains("--max-skew: give whole seconds"), "{body}");
    }

    // A tampered pack fails, and says which check.
    let tampered = pack.replacen("\"c2\"", "\"c9\"", 1);
    let (s, body) = upload(
        &h,
        "/console/verify",
        Some(&cookie),
        &[
            ("csrf", None, csrf.as_bytes()),
            ("agent_keys", Some("k"), &keys),
            ("pack", Some("p"), tampered.as_bytes()),
        ],
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert!(body.contains("FAIL: "), "{body}");
    assert!(body.contains("record_signatures"));

    // Refusals: wrong CSRF token, no keys, bad keys, a bad vkey, not a pack.
    let big = vec![b' '; 200_000];
    let cases: Vec<(Vec<Field<'_>>, &str)> = vec![
        (
            vec![
                ("csrf", None, b"nope"),
                ("agent_keys", Some("k"), &keys),
                ("pack", Some("p"), pack.as_bytes()),
            ],
            "does not match your session",
        ),
        (
            vec![
                ("csrf", None, csrf.as_bytes()),
                ("pack", Some("p"), pack.as_bytes()),
            ],
            "choose an agent-keys.json",
        ),
        (
            vec![
                ("csrf", None, csrf.as_bytes()),
                ("agent_keys", Some("k"), b"{\"v\":1"),
                ("pack", Some("p"), pack.as_bytes()),
            ],
            "agent-keys.json:",
        ),
        // Swapped files are named, as `tally verify` names them.
        (
            vec![
                ("csrf", None, csrf.as_bytes()),
                ("agent_keys", Some("k"), pack.as_bytes()),
                ("pack", Some("p"), pack.as_bytes()),
            ],
            "the file chosen as agent-keys.json is a pack",
        ),
        (
            vec![
                ("csrf", None, csrf.as_bytes()),
                ("agent_keys", Some("k"), &keys),
                ("head", Some("h"), &keys),
                ("pack", Some("p"), pack.as_bytes()),
            ],
            "the file chosen as head.json is agent-keys.json",
        ),
        (
            vec![
                ("csrf", None, csrf.as_bytes()),
                ("witness_key", None, b"not a key"),
                ("agent_keys", Some("k"), &keys),
                ("pack", Some("p"), pack.as_bytes()),
            ],
            "--witness-key",
        ),
        (
            vec![
                ("csrf", None, csrf.as_bytes()),
                ("agent_keys", Some("k"), &keys),
                ("pack", Some("p"), b"<html>"),
            ],
            "not a tally pack",
        ),
        (
            vec![
                ("csrf", None, csrf.as_bytes()),
                ("agent_keys", Some("k"), &big),
                ("pack", Some("p"), pack.as_bytes()),
            ],
            "larger than",
        ),
    ];
    for (fields, want) in cases {
        let (s, body) = upload(&h, "/console/verify", Some(&cookie), &fields).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{want}");
        assert!(body.contains(want), "{want}: {body}");
    }
    // Not multipart at all.
    let (s, _, _) = h.post_form("/console/verify", Some(&cookie), "a=b").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    // Without a session, no verification.
    let (s, _) = upload(
        &h,
        "/console/verify",
        None,
        &[
            ("agent_keys", Some("k"), &keys),
            ("pack", Some("p"), pack.as_bytes()),
        ],
    )
    .await;
    assert_eq!(s, StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn console_auditor_link_is_scoped_read_only_and_revocable() {
    let h = harness();
    let mut bot = Agent::new("bot");
    let mut other = Agent::new("other-bot");
    h.register(&bot, "default");
    h.register(&other, "default");
    h.clock.0.store(T0 + 10, Ordering::SeqCst);
    let idx = hostile_chain(&h, &mut bot).await;
    let r = other.sign(
        T0 + 20,
        RecordBody::Note(NoteBody {
            text: "hidden".into(),
        }),
    );
    let other_idx = h.post(&h.api_key, &r).await;
    let (cookie, csrf) = h.login(&h.api_key).await;

    // Forms need the CSRF token and a same-site origin.
    let (s, _, _) = h
        .post_form("/console/links", Some(&cookie), "agent=bot&expires_hours=1")
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let mut req = Request::builder()
        .method("POST")
        .uri("/console/links")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(header::COOKIE, &cookie)
        .header("sec-fetch-site", "cross-site");
    req = req.header("x-test", "1");
    let (s, _, _) = h
        .call(
            req.body(Body::from(format!("csrf={csrf}&agent=bot")))
                .unwrap(),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    // Bad forms are refused with a message.
    for (form, want) in [
        ("agent=nobody", "not in project"),
        ("", "at least one agent"),
        ("agent=bot&expires_hours=0", "1 to 8760"),
        // Errors name the fields as their labels do ("from", "to").
        ("agent=bot&since=yesterday", "from: "),
        ("agent=bot&until=yesterday", "to: "),
        (
            "agent=bot&since=2026-12-01T00:00:00.000Z&until=2026-11-30T00:00:00.000Z",
            "from must be before to",
        ),
    ] {
        let (s, _, body) = h
            .post_form(
                "/console/links",
                Some(&cookie),
                &format!("csrf={csrf}&{form}"),
            )
            .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{form}");
        assert!(body.contains(want), "{form}: {want}");
        assert!(
            !body.contains("since:") && !body.contains("until:"),
            "{form}"
        );
    }
    // A link for bot, received before T0 + 10 + ...: all of bot's records.
    let until = UnixMillis::new(T0 + 100_000).to_string();
    let (s, _, body) = h.post_form("/console/links", Some(&cookie), &format!("csrf={csrf}&agent=bot&since=&until={until}&expires_hours=2&label=%3Cb%3Eaudit%3C%2Fb%3E")).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert!(!body.contains("<b>audit"));
    let url = between(&body, "id=\"new-link-url\" href=\"", "\"").to_owned();
    let token = url.strip_prefix("/console/a/").unwrap();
    assert!(token.len() >= 16 + 1 + 64, "at least 256 bits of secret");

    // Without a cookie, the link opens bot's pages and nothing else.
    let (s, _, home) = h.get(&url, None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(home.contains("read-only auditor view"));
    assert!(home.contains("/agents/bot\""));
    assert!(!home.contains("other-bot"));
    assert!(!home.contains("Log out") && !home.contains("/console/links"));
    let (s, _, page) = h.get(&format!("{url}/agents/bot"), None).await;
    assert_eq!(s, StatusCode::OK);
    assert_escaped(&page);
    assert!(page.contains("coverage: bot:"));
    assert!(
        !page.contains("Download this agent"),
        "operator download not offered"
    );
    let (s, _, _) = h.get(&format!("{url}/agents/other-bot"), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _, _) = h.get(&format!("{url}/records/{other_idx}"), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _, rec) = h.get(&format!("{url}/records/{}", idx[1]), None).await;
    assert_eq!(s, StatusCode::OK);
    // The auditor's record page offers the record's own pack, which verifies.
    let rec_pack_url = format!("{url}/records/{}/pack", idx[1]);
    assert!(rec.contains(&format!("href=\"{rec_pack_url}\"")));
    let (s, _, rec_pack) = h.get(&rec_pack_url, None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        verify_pack(&h, rec_pack.as_bytes()).await.report.result,
        Verdict::Pass
    );
    let (s, _, _) = h
        .get(&format!("{url}/records/{other_idx}/pack"), None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    // The link does not log anyone in to operator pages.
    let (s, _, _) = h.get("/console", None).await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    // Its pack and keys verify.
    let (s, _, pack) = h.get(&format!("{url}/pack"), None).await;
    assert_eq!(s, StatusCode::OK);
    let (s, _, keys) = h.get(&format!("{url}/agent-keys.json"), None).await;
    assert_eq!(s, StatusCode::OK);
    let keys = AgentKeys::from_json(keys.as_bytes()).unwrap();
    assert_eq!(keys.agents.len(), 1);
    let v = super::data::run_verify(
        pack.as_bytes(),
        &keys,
        h.witness.log().verifier(),
        None,
        300_000,
        300_000,
    )
    .unwrap();
    assert_eq!(v.report.records, 8);
    // The auditor's verify page works without a session.
    let keys_bytes = tally_witness::export::to_canonical(&keys).unwrap();
    let (s, body) = upload(
        &h,
        &format!("{url}/verify"),
        None,
        &[
            ("agent_keys", Some("k"), &keys_bytes),
            ("pack", Some("p"), pack.as_bytes()),
        ],
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert!(body.contains("12 checks"));

    // Revoke: the very next request is refused.
    let (_, _, list) = h.get("/console/links", Some(&cookie)).await;
    let id = between(&list, "data-link-id=\"", "\"").to_owned();
    assert!(list.contains("&lt;b&gt;audit&lt;/b&gt;"));
    let (s, _, _) = h
        .post_form(
            &format!("/console/links/{id}/revoke"),
            Some(&cookie),
            "csrf=wrong",
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert_eq!(h.get(&url, None).await.0, StatusCode::OK);
    let (s, _, _) = h
        .post_form(
            &format!("/console/links/{id}/revoke"),
            Some(&cookie),
            &format!("csrf={csrf}"),
        )
        .await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    for u in [
        url.clone(),
        format!("{url}/agents/bot"),
        format!("{url}/pack"),
        format!("{url}/agent-keys.json"),
        format!("{url}/records/{}", idx[1]),
    ] {
        let (s, _, body) = h.get(&u, None).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{u}");
        assert!(body.contains("unknown, expired or revoked"));
    }
    // Another project cannot revoke or see the link.
    let (cookie_b, csrf_b) = h.login(&h.other_key).await;
    let (_, _, list_b) = h.get("/console/links", Some(&cookie_b)).await;
    assert!(!list_b.contains(&id));
    let (s, _, _) = h
        .post_form(
            &format!("/console/links/{id}/revoke"),
            Some(&cookie_b),
            &format!("csrf={csrf_b}"),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    // Expiry.
    let url2 = h
        .make_link(&cookie, &csrf, "agent=bot&expires_hours=1")
        .await;
    assert_eq!(h.get(&url2, None).await.0, StatusCode::OK);
    h.clock.0.store(T0 + 10 + 3_600_000, Ordering::SeqCst);
    assert_eq!(h.get(&url2, None).await.0, StatusCode::NOT_FOUND);
    let _ = &h.console;
}

#[tokio::test]
async fn console_time_range_limits_the_auditor_view() {
    let h = harness();
    let mut bot = Agent::new("bot");
    h.register(&bot, "default");
    let mut idx = Vec::new();
    for i in 0..4i64 {
        h.clock.0.store(T0 + i * 60_000, Ordering::SeqCst);
        let r = bot.sign(
            T0 + i * 60_000,
            RecordBody::Note(NoteBody {
                text: format!("note {i}"),
            }),
        );
        idx.push(h.post(&h.api_key, &r).await);
    }
    let (cookie, csrf) = h.login(&h.api_key).await;
    let since = UnixMillis::new(T0 + 60_000).to_string();
    let until = UnixMillis::new(T0 + 180_000).to_string();
    let url = h
        .make_link(
            &cookie,
            &csrf,
            &format!("agent=bot&since={since}&until={until}"),
        )
        .await;
    let (_, _, page) = h.get(&format!("{url}/agents/bot"), None).await;
    assert!(page.contains("note 1") && page.contains("note 2"));
    assert!(!page.contains("note 0") && !page.contains("note 3"));
    assert_eq!(
        h.get(&format!("{url}/records/{}", idx[0]), None).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        h.get(&format!("{url}/records/{}", idx[1]), None).await.0,
        StatusCode::OK
    );
    let (_, _, pack) = h.get(&format!("{url}/pack"), None).await;
    let v = verify_pack(&h, pack.as_bytes()).await;
    assert_eq!(v.report.records, 2);
    assert_eq!(v.report.result, Verdict::Pass, "{}", v.to_text());

    // Nothing of the chain outside the range shows: not the count, the head
    // or the last activity, even after more records arrive.
    h.clock.0.store(T0 + 400_000, Ordering::SeqCst);
    let r = bot.sign(
        T0 + 400_000,
        RecordBody::Note(NoteBody {
            text: "note 4".into(),
        }),
    );
    idx.push(h.post(&h.api_key, &r).await);
    let late = UnixMillis::new(T0 + 400_000).to_string();
    let last_in_range = UnixMillis::new(T0 + 120_000).to_string();
    let (_, _, home) = h.get(&url, None).await;
    let (_, _, page) = h.get(&format!("{url}/agents/bot"), None).await;
    for body in [&home, &page] {
        assert!(body.contains(&last_in_range), "last activity in range");
        assert!(!body.contains(&late), "nothing received after until");
        assert!(
            !body.contains(&format!("@{}", idx[3]))
                && !body.contains(&format!("/records/{}\"", idx[3]))
        );
        assert!(!body.contains(&format!("/records/{}\"", idx[4])));
    }
    assert_eq!(between(&home, "id=\"records-in-range\">", "<"), "2");
    assert_eq!(between(&page, "id=\"record-count\">", "<"), "2");
    assert!(page.contains(&format!("href=\"{url}/records/{}\"", idx[2])));
    // The operator still sees the whole chain.
    let (_, _, op_page) = h.get("/console/agents/bot", Some(&cookie)).await;
    assert_eq!(between(&op_page, "id=\"record-count\">", "<"), "5");
}

#[tokio::test]
async fn console_auditor_record_links_stay_in_range() {
    let h = harness();
    let mut bot = Agent::new("bot");
    h.register(&bot, "default");
    h.clock.0.store(T0, Ordering::SeqCst);
    let d = bot.sign(T0, decision("c-1", "refund"));
    let d_idx = h.post(&h.api_key, &d).await;
    h.clock.0.store(T0 + 120_000, Ordering::SeqCst);
    let o = bot.sign(T0 + 120_000, outcome("c-1", &d, OutcomeStatus::Ok));
    let o_idx = h.post(&h.api_key, &o).await;
    let (cookie, csrf) = h.login(&h.api_key).await;
    let until = UnixMillis::new(T0 + 60_000).to_string();
    let url = h
        .make_link(&cookie, &csrf, &format!("agent=bot&until={until}"))
        .await;
    // The operator's record page links the outcome; the auditor's, whose
    // range ends before it, does not, and the record's pack stops at the
    // decision.
    let (_, _, op) = h
        .get(&format!("/console/records/{d_idx}"), Some(&cookie))
        .await;
    assert!(op.contains(&format!("/console/records/{o_idx}\"")));
    let (s, _, rec) = h.get(&format!("{url}/records/{d_idx}"), None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(!rec.contains(&format!("/records/{o_idx}\"")), "{rec}");
    let (s, _, pack) = h.get(&format!("{url}/records/{d_idx}/pack"), None).await;
    assert_eq!(s, StatusCode::OK);
    let v = verify_pack(&h, pack.as_bytes()).await;
    assert_eq!(v.report.records, 1, "{}", v.to_text());
    assert_eq!(
        h.get(&format!("{url}/records/{o_idx}"), None).await.0,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn console_bad_input_gets_a_page_not_a_panic() {
    let (h, _, _) = hostile_bot().await;
    let (cookie, _) = h.login(&h.api_key).await;
    for (uri, want) in [
        ("/console/records/abc", StatusCode::NOT_FOUND),
        (
            "/console/records/99999999999999999999999",
            StatusCode::NOT_FOUND,
        ),
        ("/console/records/9007199254740991", StatusCode::NOT_FOUND),
        ("/console/records/1000", StatusCode::NOT_FOUND),
        ("/console/records/-1/pack", StatusCode::NOT_FOUND),
        ("/console/agents/%3Cscript%3E", StatusCode::NOT_FOUND),
        ("/console/agents/nobody", StatusCode::NOT_FOUND),
        ("/console/agents/nobody/pack", StatusCode::NOT_FOUND),
        ("/console/agents/bot?page=0", StatusCode::BAD_REQUEST),
        ("/console/agents/bot?page=x", StatusCode::BAD_REQUEST),
        (
            "/console/agents/bot?status=%3Cb%3E",
            StatusCode::BAD_REQUEST,
        ),
        ("/console/agents/bot?page=999", StatusCode::OK),
        ("/console/a/garbage", StatusCode::NOT_FOUND),
        ("/console/a/%00/agents/bot", StatusCode::NOT_FOUND),
        ("/console/nowhere/%3Cscript%3E", StatusCode::NOT_FOUND),
    ] {
        let (s, hd, body) = h.get(uri, Some(&cookie)).await;
        assert_eq!(s, want, "{uri}");
        assert!(hd.get(header::CONTENT_SECURITY_POLICY).is_some(), "{uri}");
        assert!(!body.contains("<script>"), "{uri}");
    }
    let long = format!("/console/agents/bot?q={}", "a".repeat(300));
    assert_eq!(h.get(&long, Some(&cookie)).await.0, StatusCode::BAD_REQUEST);
    // Another project's agent and records are not found, not forbidden.
    let (cookie_b, _) = h.login(&h.other_key).await;
    assert_eq!(
        h.get("/console/agents/bot", Some(&cookie_b)).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        h.get("/console/records/1", Some(&cookie_b)).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        h.get("/console/records/1/pack", Some(&cookie_b)).await.0,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn console_session_ends_with_logout_and_key_revocation() {
    let h = harness();
    let (cookie, csrf) = h.login(&h.api_key).await;
    assert_eq!(h.get("/console", Some(&cookie)).await.0, StatusCode::OK);
    let (s, hd, _) = h
        .post_form("/console/logout", Some(&cookie), &format!("csrf={csrf}"))
        .await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    assert!(hd
        .get(header::SET_COOKIE)
        .unwrap()
        .to_str()
        .unwrap()
        .contains("Max-Age=0"));
    assert_eq!(
        h.get("/console", Some(&cookie)).await.0,
        StatusCode::SEE_OTHER
    );

    let (cookie, _) = h.login(&h.api_key).await;
    let id = h.api_key.split('_').nth(1).unwrap().to_owned();
    h.witness
        .registry()
        .revoke_api_key(&id, h.witness.now())
        .unwrap();
    assert_eq!(
        h.get("/console", Some(&cookie)).await.0,
        StatusCode::SEE_OTHER
    );

    // Sessions expire.
    let (cookie, _) = h.login(&h.other_key).await;
    h.clock
        .0
        .store(T0 + super::auth::SESSION_TTL_MS, Ordering::SeqCst);
    assert_eq!(
        h.get("/console", Some(&cookie)).await.0,
        StatusCode::SEE_OTHER
    );
}

#[tokio::test]
async fn console_secure_cookie_with_tls() {
    let h = harness();
    let console = Console::open(
        Arc::clone(&h.witness),
        h._dir.path().join("tls").as_path(),
        true,
    );
    // A data folder that does not exist cannot hold the link store.
    assert!(console.is_err());
    std::fs::create_dir(h._dir.path().join("tls")).unwrap();
    let console = Console::open(Arc::clone(&h.witness), &h._dir.path().join("tls"), true).unwrap();
    let app = super::router(console);
    let form = app
        .clone()
        .oneshot(
            Request::builder()
                .uri("/console/login")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let login = login_cookie(form.headers());
    assert!(form.headers()[header::SET_COOKIE]
        .to_str()
        .unwrap()
        .ends_with("; Secure"));
    let page = form.into_body().collect().await.unwrap().to_bytes();
    let page = String::from_utf8_lossy(&page);
    let token = between(&page, "name=\"login_token\" value=\"", "\"");
    let req = Request::builder()
        .method("POST")
        .uri("/console/login")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(header::COOKIE, login)
        .body(Body::from(format!(
            "login_token={token}&api_key={}",
            h.api_key
        )))
        .unwrap();
    let resp = app.oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    let set = resp
        .headers()
        .get(header::SET_COOKIE)
        .unwrap()
        .to_str()
        .unwrap();
    assert!(set.ends_with("; Secure"));
}

/// One project's logins never end another project's sessions: sessions are
/// limited per project, and a full project gives up its own oldest.
#[tokio::test]
async fn console_logins_of_one_project_never_end_another_projects_session() {
    let h = harness();
    let (cookie_a, _) = h.login(&h.api_key).await;
    // Later logins expire later (the old table dropped the session that
    // expires first).
    h.clock.0.fetch_add(1, Ordering::SeqCst);
    // Far more logins with project "other"'s key than the session table
    // holds (straight at the session table: the login throttle would
    // refuse them long before over HTTP).
    for _ in 0..=10_000 {
        assert!(h
            .console
            .sessions
            .login(&h.witness, &h.other_key)
            .unwrap()
            .is_some());
    }
    assert_eq!(
        h.get("/console", Some(&cookie_a)).await.0,
        StatusCode::OK,
        "the default project's session survived"
    );
}

/// Logins are throttled per client address and globally, with 429 and
/// Retry-After; a throttled address does not slow another one down.
#[tokio::test]
async fn console_login_is_throttled_per_address_and_globally() {
    let h = harness();
    let a: SocketAddr = "192.0.2.1:40000".parse().unwrap();
    let mut refused = None;
    for i in 0..1_000 {
        let (s, hd, body) = h.post_login_from("tally_wrong_key", Some(a)).await;
        if s == StatusCode::TOO_MANY_REQUESTS {
            refused = Some((i, hd, body));
            break;
        }
        assert_eq!(s, StatusCode::UNAUTHORIZED);
    }
    let (attempts, hd, body) = refused.expect("wrong keys from one address are throttled");
    assert_eq!(attempts, 10, "the 11th attempt in a burst is refused");
    let retry: u64 = hd[header::RETRY_AFTER].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    assert!(body.contains("Too many login attempts"), "{body}");
    // Even the right key waits.
    assert_eq!(
        h.post_login_from(&h.api_key, Some(a)).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another address is not throttled.
    let b: SocketAddr = "198.51.100.7:40000".parse().unwrap();
    assert_eq!(
        h.post_login_from(&h.api_key, Some(b)).await.0,
        StatusCode::SEE_OTHER
    );
    // After Retry-After the address may try again.
    h.clock
        .0
        .fetch_add(i64::try_from(retry).unwrap() * 1000, Ordering::SeqCst);
    assert_eq!(
        h.post_login_from(&h.api_key, Some(a)).await.0,
        StatusCode::SEE_OTHER
    );

    // Globally: many addresses, one attempt each, are refused too once the
    // witness-wide budget is spent.
    let mut global = None;
    for i in 0..10_000u32 {
        let addr = SocketAddr::from(([10, (i >> 16) as u8, (i >> 8) as u8, i as u8], 1));
        let (s, hd, _) = h.post_login_from("tally_wrong_key", Some(addr)).await;
        if s == StatusCode::TOO_MANY_REQUESTS {
            global = Some((i, hd));
            break;
        }
    }
    let (i, hd) = global.expect("a flood from many addresses is throttled");
    assert!(i >= 50, "the global budget is not tiny ({i})");
    assert!(hd.contains_key(header::RETRY_AFTER));
}

/// A full project gives up a session of the API key that holds the most of
/// its sessions; a full table, one of the project that holds the most.
#[tokio::test]
async fn console_session_limits_end_the_biggest_holders_sessions() {
    let h = harness_with(ConsoleLimits {
        sessions: super::auth::SessionLimits {
            per_project: 3,
            total: 5,
        },
        ..ConsoleLimits::default()
    });
    let (cookie_first, _) = h.login(&h.api_key).await;
    // A second key of the same project logs in again and again: it ends
    // only its own sessions.
    let second = h.witness.new_api_key("default").unwrap().token;
    for _ in 0..20 {
        h.clock.0.fetch_add(1, Ordering::SeqCst);
        assert!(h
            .console
            .sessions
            .login(&h.witness, &second)
            .unwrap()
            .is_some());
    }
    assert_eq!(h.console.sessions.count("default"), 3);
    assert_eq!(
        h.get("/console", Some(&cookie_first)).await.0,
        StatusCode::OK
    );
    // Two sessions of another project fill the table (3 + 2 = 5) ...
    let (cookie_other, _) = h.login(&h.other_key).await;
    assert!(h
        .console
        .sessions
        .login(&h.witness, &h.other_key)
        .unwrap()
        .is_some());
    // ... so a third project's login ends one of the biggest project's,
    // and there of the key that holds the most.
    let third = h.witness.create_project("third").unwrap().token;
    assert!(h
        .console
        .sessions
        .login(&h.witness, &third)
        .unwrap()
        .is_some());
    assert_eq!(h.console.sessions.count("default"), 2);
    assert_eq!(h.console.sessions.count("other"), 2);
    assert_eq!(h.console.sessions.count("third"), 1);
    assert_eq!(
        h.get("/console", Some(&cookie_first)).await.0,
        StatusCode::OK
    );
    assert_eq!(
        h.get("/console", Some(&cookie_other)).await.0,
        StatusCode::OK
    );
}

/// Tool names, call ids and notes with bidirectional controls and
/// invisible characters (which records may hold: a tool name is what a
/// server declares) are isolated and shown as marked escapes, never raw.
#[tokio::test]
async fn console_isolates_and_marks_bidi_and_invisible_characters() {
    let h = harness();
    let mut bot = Agent::new("bot");
    h.register(&bot, "default");
    h.clock.0.store(T0 + 10, Ordering::SeqCst);
    let spoof = "refund\u{202e}gnp.exe";
    // Declared as not recorded, so that coverage names it.
    let r = bot.sign(T0, tools_body("l\u{200b}1", vec![tool(spoof, false, 1)]));
    h.post(&h.api_key, &r).await;
    let d = bot.sign(T0 + 1, decision("c\u{2066}1", spoof));
    let d_index = h.post(&h.api_key, &d).await;
    let o = bot.sign(T0 + 2, outcome("c\u{2066}1", &d, OutcomeStatus::Ok));
    h.post(&h.api_key, &o).await;
    let n = bot.sign(
        T0 + 3,
        RecordBody::Note(NoteBody {
            text: "first line\nsecond \u{202e}line\u{feff}".into(),
        }),
    );
    h.post(&h.api_key, &n).await;
    let (cookie, csrf) = h.login(&h.api_key).await;
    let raw = ['\u{202e}', '\u{2066}', '\u{200b}', '\u{feff}'];
    let no_raw = |page: &str, what: &str| {
        for c in raw {
            assert!(!page.contains(c), "{what}: U+{:04X} raw", u32::from(c));
        }
    };
    let mark = |cp: &str| {
        format!(
            "<span class=\"hidden-char\" title=\"U+{}\">\\u{{{}}}</span>",
            cp.to_uppercase(),
            cp
        )
    };

    let (s, _, page) = h.get("/console/agents/bot", Some(&cookie)).await;
    assert_eq!(s, StatusCode::OK);
    no_raw(&page, "agent page");
    // The tool name in the calls table and the tool list, isolated.
    assert!(
        page.contains(&format!(
            "<bdi class=\"ext\">refund{}gnp.exe</bdi>",
            mark("202e")
        )),
        "{page}"
    );
    assert!(page.contains(&format!("c{}1", mark("2066"))), "call id");
    assert!(page.contains(&format!("l{}1", mark("200b"))), "list id");
    // The note keeps its line break and marks the rest.
    assert!(
        page.contains(&format!(
            "<bdi class=\"ext\">first line\nsecond {}line{}</bdi>",
            mark("202e"),
            mark("feff")
        )),
        "{page}"
    );
    // The coverage line names it marked, and the report's text, as tally
    // verify prints it, escaped.
    assert!(
        page.contains(&format!(
            "1 declared tool is not recorded: refund{}gnp.exe</bdi>",
            mark("202e")
        )),
        "{page}"
    );
    assert!(
        page.contains("coverage: bot: 1 declared tool is not recorded: refund\\u{202e}gnp.exe\n"),
        "{page}"
    );

    let (s, _, page) = h
        .get(&format!("/console/records/{d_index}"), Some(&cookie))
        .await;
    assert_eq!(s, StatusCode::OK);
    no_raw(&page, "record page");
    // The JSON shown is the same value, with JSON escapes.
    assert!(page.contains("refund\\u202egnp.exe"), "{page}");
    assert!(page.contains("c\\u20661"), "{page}");

    // An uploaded pack's report on the verify page.
    let (_, _, pack) = h.get("/console/agents/bot/pack", Some(&cookie)).await;
    let keys = tally_witness::export::to_canonical(
        &tally_witness::export::agent_keys(
            h.witness.registry(),
            h.witness.log().origin(),
            "default",
            &[],
        )
        .unwrap(),
    )
    .unwrap();
    let (s, page) = upload(
        &h,
        "/console/verify",
        Some(&cookie),
        &[
            ("csrf", None, csrf.as_bytes()),
            ("agent_keys", Some("agent-keys.json"), &keys),
            ("pack", Some("pack.jsonl"), pack.as_bytes()),
        ],
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{page}");
    no_raw(&page, "verify page");
    assert!(page.contains("PASS: 12 checks"), "{page}");
}

#[tokio::test]
async fn the_overview_shows_each_cosigner_and_its_state() {
    use tally_witness::cosigning::{CosignerConfig, CosignerState, Cosigning, CosigningConfig};
    let h = harness();
    let (cookie, _) = h.login(&h.api_key).await;
    let (_, _, body) = h.get("/console", Some(&cookie)).await;
    assert!(!body.contains("id=\"cosigners\""), "no cosigners, no panel");

    // A cosigner on a port nobody listens on: asked, it fails.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let vkey = tally_schemas::cosignature::CosignatureSigner::from_secret(
        "cosigner.example/down",
        tally_schemas::SecretKey::from_seed(&[9; 32]),
    )
    .unwrap()
    .verifier()
    .vkey();
    let config = CosigningConfig {
        cosigners: vec![CosignerConfig::new(
            "down-one",
            &vkey,
            &format!("http://127.0.0.1:{port}"),
        )
        .unwrap()],
        // Flagged stale one second after the start without a cosignature.
        max_age: std::time::Duration::from_secs(1),
        ..CosigningConfig::default()
    };
    let cosigning = Arc::new(Cosigning::new(Arc::clone(h.witness.log()), config).unwrap());
    h.witness.set_cosigning(Arc::clone(&cosigning));
    let mut bot = Agent::new("claims-bot");
    h.register(&bot, "default");
    let r = bot.sign(T0, RecordBody::Note(NoteBody { text: "x".into() }));
    h.post(&h.api_key, &r).await;
    let (_, _, body) = h.get("/console", Some(&cookie)).await;
    assert!(body.contains("id=\"cosigners\""), "{body}");
    assert!(body.contains("data-state=\"pending\""), "{body}");

    let task = tokio::spawn(Arc::clone(&cosigning).run());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while cosigning.status()[0].consecutive_failures == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            cosigning.status()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (_, _, body) = h.get("/console", Some(&cookie)).await;
    assert!(body.contains("down-one"), "{body}");
    assert!(body.contains("cosigner unreachable"), "{body}");
    // Past the max age with the latest checkpoint uncosigned: stale, on
    // the page and in /metrics.
    while cosigning.status()[0].state != CosignerState::Stale {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            cosigning.status()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let (_, _, body) = h.get("/console", Some(&cookie)).await;
    assert!(body.contains("data-state=\"stale\""), "{body}");
    let (_, _, metrics) = h.get("/metrics", None).await;
    assert!(
        metrics.contains("tally_log_cosigner_stale{cosigner=\"down-one\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tally_log_cosigner_state{cosigner=\"down-one\",state=\"stale\"} 1"),
        "{metrics}"
    );
    task.abort();
}

/// The audit report (protocol.md §11.3) from the console: the operator's
/// for one agent, with a period, as HTML and JSON; the auditor's for the
/// link's agents and range; names escaped; other agents and bad periods
/// refused.
#[tokio::test]
async fn console_offers_the_audit_report_to_the_operator_and_the_auditor() {
    let h = harness();
    let mut bot = Agent::new("bot");
    let mut other = Agent::new("other-bot");
    h.register(&bot, "default");
    h.register(&other, "default");
    h.clock.0.store(T0 + 10, Ordering::SeqCst);
    hostile_chain(&h, &mut bot).await;
    let r = other.sign(
        T0 + 20,
        RecordBody::Note(NoteBody {
            text: "hidden".into(),
        }),
    );
    h.post(&h.api_key, &r).await;
    let (cookie, csrf) = h.login(&h.api_key).await;

    let (s, _, page) = h.get("/console/agents/bot", Some(&cookie)).await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        page.contains("href=\"/console/agents/bot/report\""),
        "offered"
    );

    let (s, hd, html) = h.get("/console/agents/bot/report", Some(&cookie)).await;
    assert_eq!(s, StatusCode::OK, "{html}");
    assert_eq!(hd[header::CONTENT_TYPE], "text/html; charset=utf-8");
    assert!(hd[header::CONTENT_DISPOSITION]
        .to_str()
        .unwrap()
        .contains("report.html"));
    let body = html.split_once("<body>").unwrap().1;
    // The open decision c3 is within the grace window: pending, a pass.
    assert!(
        body.starts_with(r#"<section id="verdict" class="pass"><h1>PASS</h1>"#),
        "{body}"
    );
    assert!(html.contains("<h2>Agent <code>bot</code></h2>"));
    assert!(!html.contains("other-bot"));
    assert_escaped(&html);
    assert!(
        html.contains("tally verify bot.pack.jsonl --agent-keys agent-keys.json --witness-key ")
    );

    // JSON, with a period holding the first three records only.
    let from = UnixMillis::new(T0).to_string();
    let to = UnixMillis::new(T0 + 3).to_string();
    let (s, _, json) = h
        .get(
            &format!("/console/agents/bot/report?format=json&from={from}&to={to}"),
            Some(&cookie),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["agents"][0]["period_records"], 3, "{json}");
    assert_eq!(v["agents"][0]["not_ok"][0]["status"], "error");
    assert_eq!(v["verification"]["result"], "PASS");
    for q in [
        "from=yesterday",
        "format=pdf",
        &format!("from={to}&to={from}"),
    ] {
        let (s, _, _) = h
            .get(&format!("/console/agents/bot/report?{q}"), Some(&cookie))
            .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{q}");
    }
    let (s, _, _) = h.get("/console/agents/bot/report", None).await;
    assert_ne!(s, StatusCode::OK, "needs a login");
    let (s, _, _) = h.get("/console/agents/nobody/report", Some(&cookie)).await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    // The auditor's report covers the link's agent only.
    let (s, _, made) = h
        .post_form(
            "/console/links",
            Some(&cookie),
            &format!("csrf={csrf}&agent=bot&expires_hours=1"),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{made}");
    let url = between(&made, "id=\"new-link-url\" href=\"", "\"").to_owned();
    let (s, _, home) = h.get(&url, None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(home.contains(&format!("href=\"{url}/report\"")), "offered");
    let (s, _, html) = h.get(&format!("{url}/report"), None).await;
    assert_eq!(s, StatusCode::OK, "{html}");
    assert!(html.contains("<h1>PASS</h1>"));
    assert!(html.contains("<h2>Agent <code>bot</code></h2>"));
    assert!(!html.contains("other-bot"));
    assert_escaped(&html);
    let (s, _, _) = h.get("/console/a/not-a-token/report", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

/// Every byte but ASCII letters and digits as `%XX`, for a form body.
fn form_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// An operator attaches a disclosure (protocol.md §6.3) to an auditor
/// link; the auditor's report checks it against the record and shows the
/// content, escaped; one of an agent the link does not show, one that is
/// not a disclosure, and one whose content was changed are refused or fail.
#[tokio::test]
async fn console_attaches_disclosures_to_an_auditor_link_and_its_report_checks_them() {
    let h = harness();
    let mut bot = Agent::new("bot");
    let other = Agent::new("other-bot");
    h.register(&bot, "default");
    h.register(&other, "default");
    h.clock.0.store(T0 + 10, Ordering::SeqCst);
    hostile_chain(&h, &mut bot).await;
    let salt = [7u8; 16];
    let content = serde_json::json!({"q": "<script>alert(3)</script> \u{202e}fdp.exe"});
    let input_hash = tally_schemas::hash::salted_hash(
        &salt,
        &tally_schemas::canonical::canonicalize(&content).unwrap(),
    );
    let d = bot.sign(
        T0 + 8,
        RecordBody::Decision(Decision {
            call_id: "d1".into(),
            tool: "search".into(),
            input_hash,
        }),
    );
    h.post(&h.api_key, &d).await;
    let o = bot.sign(T0 + 9, outcome("d1", &d, OutcomeStatus::Ok));
    h.post(&h.api_key, &o).await;
    let (cookie, csrf) = h.login(&h.api_key).await;
    let (s, _, made) = h
        .post_form(
            "/console/links",
            Some(&cookie),
            &format!("csrf={csrf}&agent=bot&expires_hours=1"),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{made}");
    let url = between(&made, "id=\"new-link-url\" href=\"", "\"").to_owned();
    let id = url
        .strip_prefix("/console/a/")
        .unwrap()
        .split('_')
        .next()
        .unwrap()
        .to_owned();
    let disclosure = |agent: &str, content: &serde_json::Value| {
        serde_json::json!({
            "v": 1, "agent": agent, "call_id": "d1",
            "input": {"seq": 8, "salt": hex::encode(salt), "content": content},
        })
        .to_string()
    };
    let attach = |body: String| {
        let h = &h;
        let cookie = cookie.clone();
        let path = format!("/console/links/{id}/disclosures");
        let form = format!("csrf={csrf}&disclosure={}", form_encode(&body));
        async move { h.post_form(&path, Some(&cookie), &form).await }
    };
    // Refused: another agent's, and not a disclosure.
    let (s, _, page) = attach(disclosure("other-bot", &content)).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(page.contains("which the link does not show"), "{page}");
    let (s, _, page) = attach("{\"v\":1}".into()).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(page.contains("not a disclosure file"), "{page}");
    // Without the CSRF token: refused.
    let (s, _, _) = h
        .post_form(
            &format!("/console/links/{id}/disclosures"),
            Some(&cookie),
            &format!("disclosure={}", form_encode(&disclosure("bot", &content))),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    // Attached.
    let (s, _, _) = attach(disclosure("bot", &content)).await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    let (_, _, links) = h.get("/console/links", Some(&cookie)).await;
    assert!(
        links.contains(r#"disclosed: <bdi class="ext">bot</bdi> call"#),
        "{links}"
    );
    let (_, _, home) = h.get(&url, None).await;
    assert!(home.contains("1 disclosed call(s) attached"), "{home}");
    let (s, _, html) = h.get(&format!("{url}/report"), None).await;
    assert_eq!(s, StatusCode::OK, "{html}");
    assert!(html.contains("<h1>PASS</h1>"), "{html}");
    assert!(html.contains("<h2>Disclosed calls</h2>"));
    assert!(
        html.contains("&lt;script&gt;alert(3)&lt;/script&gt; \\u{202e}fdp.exe"),
        "{html}"
    );
    assert_escaped(&html);
    // A changed byte: the report fails, naming the disclosure.
    let changed = serde_json::json!({"q": "<script>alert(4)</script> \u{202e}fdp.exe"});
    let (s, _, _) = attach(disclosure("bot", &changed)).await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    let (s, _, json) = h.get(&format!("{url}/report?format=json"), None).await;
    assert_eq!(s, StatusCode::OK);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["verification"]["result"], "FAIL");
    assert_eq!(v["verification"]["disclosures"][0]["status"], "match");
    assert_eq!(v["verification"]["disclosures"][1]["status"], "mismatch");
}
