//! The Streamable HTTP proxy: `tally gateway --upstream URL` (docs/operations.md
//! "The gateway over HTTP"). An HTTP server the MCP client is pointed at
//! instead of the upstream server, forwarding every request to the upstream
//! over MCP's Streamable HTTP transport and passing every answer back
//! unchanged: bodies byte for byte (JSON, and SSE streams as they arrive),
//! status codes and headers (less the hop-by-hop ones), including the
//! client's own auth headers, `Mcp-Session-Id`, `MCP-Protocol-Version` and
//! `Last-Event-ID`. It reads what passes only to observe it; what is
//! recorded is decided by [`crate::calls`], as on stdio (docs/protocol.md §5).
//!
//! Which answer ends which call: the answer to a `tools/call` comes on the
//! HTTP exchange that carried it (a JSON body, or an SSE stream), or, when
//! that stream broke after the upstream gave its events ids, on a stream the
//! client resumes with `GET` and `Last-Event-ID` in the same session. Calls
//! are kept per session (`Mcp-Session-Id`), so JSON-RPC ids that repeat
//! across sessions never meet; without a session id each call belongs to
//! its exchange alone. How a call ends over HTTP (§5.2):
//!
//! - `ok` / `error`: a JSON-RPC answer to it (an upstream's 4xx with a
//!   JSON-RPC error for the call is `error`);
//! - `cancelled`: the client sent `notifications/cancelled` (protocol
//!   versions up to 2025-11-25), or closed the call's answer stream before
//!   the answer at a later version, where closing the stream is the
//!   cancellation (the gateway then closes its stream to the upstream);
//! - `server_exited`: the upstream's stream or connection ended with the call
//!   in flight and cannot be resumed (no event ids, or a resumption could
//!   not reach the upstream);
//! - `http_error`: the exchange failed without a JSON-RPC answer to the call:
//!   the upstream answered with an HTTP error status or with something that
//!   is not an MCP answer, or could not be reached at all;
//! - `client_gone`: the client went away with the call in flight and no
//!   answer came (up to 2025-11-25 a disconnect is not a cancellation, so the
//!   gateway keeps reading the upstream's answer), the client ended its
//!   session (`DELETE`) or left it idle past the limit with the call open, or
//!   the gateway was stopped with the call open;
//! - `not_run`: a `--strict` call whose receipt did not come.
//!
//! The gateway bounds what it holds: request bodies, answers it reads, SSE
//! events, sessions, requests in flight, connections, and the time to send
//! headers and bodies ([`HttpLimits`]). By default it listens on loopback
//! only and refuses requests whose `Host` or `Origin` is not local (DNS
//! rebinding), since it acts with the client's credentials.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse as _, Response};
use axum::Router;
use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use serde_json::{json, Value};
use tally_schemas::record::{CheckObservation, CheckTrigger, OutcomeStatus};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::calls::{
    error_answer, is_paged_list_request, CallRecorder, OpenCall, PageResult, Refusal, ToolPages,
    ERROR_NOT_FORWARDED, ERROR_UPSTREAM,
};
use crate::sse::SseReader;
use crate::toolcheck::Admission;

/// Request ids the gateway uses for its own `tools/list` requests.
const OWN_ID_PREFIX: &str = "tally-gateway:tools/list:";
/// Protocol versions of the `initialize` era, where a client's disconnect
/// is not a cancellation; any other `MCP-Protocol-Version` (2026-07-28 and
/// later) cancels a call by closing its stream.
const HANDSHAKE_VERSIONS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];
const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";

/// What the HTTP gateway bounds.
#[derive(Debug, Clone)]
pub struct HttpLimits {
    /// Largest request body read from a client (else 413).
    pub max_body_bytes: usize,
    /// Largest JSON answer or single SSE event read from the upstream
    /// (else the exchange fails: 502 before the answer started, a cut stream after).
    pub max_answer_bytes: usize,
    /// Most sessions kept at once (a further `initialize` gets 503).
    pub max_sessions: usize,
    /// Most requests in flight at once, open streams included (else 503).
    pub max_in_flight: usize,
    /// Most client connections open at once (further ones wait to be accepted).
    pub max_connections: usize,
    /// Time a client has to send a request's headers.
    pub header_read_timeout: Duration,
    /// Time a client has to send a request's body (else 408).
    pub body_read_timeout: Duration,
    /// A session without requests or open streams for this long is
    /// forgotten; its open calls end with `client_gone`.
    pub session_idle: Duration,
    /// Time to connect to the upstream.
    pub connect_timeout: Duration,
    /// How long a stop waits for exchanges in flight before ending them.
    pub drain: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            max_body_bytes: 4 << 20,
            max_answer_bytes: 16 << 20,
            max_sessions: 256,
            max_in_flight: 512,
            max_connections: 1024,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            session_idle: Duration::from_secs(3600),
            connect_timeout: Duration::from_secs(10),
            drain: Duration::from_secs(5),
        }
    }
}

/// How the HTTP gateway is set up.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// The upstream MCP endpoint.
    pub upstream: reqwest::Url,
    /// PEM certificates trusted for the upstream's TLS, besides the
    /// built-in roots.
    pub upstream_ca_pem: Option<Vec<u8>>,
    /// Origins allowed besides the local ones (`http://localhost:PORT` and the like).
    pub allowed_origins: Vec<String>,
    /// Refuse requests whose `Host` is not a loopback name (DNS
    /// rebinding); set when the listener is on loopback.
    pub loopback_hosts_only: bool,
    /// The bounds.
    pub limits: HttpLimits,
}

/// Why the gateway could not be set up or the upstream is not usable.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The upstream URL.
    #[error("--upstream {url}: {reason}")]
    Upstream {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The HTTP client could not be built.
    #[error("the HTTP client: {0}")]
    Client(String),
    /// The TLS files.
    #[error("TLS: {0}")]
    Tls(String),
}

/// Counts of how calls ended, for the summary at exit.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HttpReport {
    /// `tools/call` requests seen.
    pub calls: u64,
    /// Calls ended `server_exited`.
    pub server_exited_calls: u64,
    /// Calls ended `http_error`.
    pub http_error_calls: u64,
    /// Calls ended `client_gone`.
    pub client_gone_calls: u64,
    /// Calls ended `cancelled`.
    pub cancelled_calls: u64,
}

/// One `tools/call` from its decision to its outcome.
#[derive(Debug)]
struct CallSlot {
    id: Value,
    key: String,
    call: OpenCall,
    ended: AtomicBool,
    /// The last SSE event id seen on the call's answer stream: a resumption
    /// (`GET` with this `Last-Event-ID`) continues that stream.
    last_event_id: Mutex<Option<String>>,
}

#[derive(Debug, Default)]
struct Session {
    last_used: Option<Instant>,
    /// Streams open in this session (they keep it from expiring).
    open: usize,
    calls: Vec<Arc<CallSlot>>,
    pages: ToolPages,
    /// The headers of the client's last request, kept in memory only to
    /// list the tools again after `notifications/tools/list_changed`.
    headers: Option<HeaderMap>,
    own_list_running: bool,
    /// The session's tool check (docs/protocol.md §5.7), made at its first use.
    check: Option<Arc<crate::toolcheck::Enforcer>>,
}

#[derive(Debug, Default)]
struct Sessions {
    by_id: HashMap<String, Session>,
    /// Requests without a session id: calls belong to their exchange, and
    /// ids may repeat across clients.
    none: Session,
}

impl Sessions {
    fn get(&mut self, key: Option<&str>) -> Option<&mut Session> {
        match key {
            None => Some(&mut self.none),
            Some(k) => self.by_id.get_mut(k),
        }
    }
}

struct Inner {
    core: CallRecorder,
    client: reqwest::Client,
    upstream: reqwest::Url,
    config: HttpConfig,
    sessions: Mutex<Sessions>,
    in_flight: Arc<Semaphore>,
    own_list_counter: AtomicU64,
    report: Mutex<HttpReport>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under these locks is a single insert, remove or
    // assignment, so the data is consistent even after a panic elsewhere.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The Streamable HTTP gateway; clone it freely.
#[derive(Clone)]
pub struct HttpGateway {
    inner: Arc<Inner>,
}

/// Headers that belong to one connection (RFC 9110 §7.6.1), plus the ones
/// the gateway sets itself.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
    )
}

fn copy_headers(from: &HeaderMap) -> HeaderMap {
    let named_in_connection: Vec<String> = from
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|s| s.trim().to_ascii_lowercase()))
        .collect();
    let mut to = HeaderMap::with_capacity(from.len());
    for (name, value) in from {
        if !hop_by_hop(name) && !named_in_connection.iter().any(|n| n == name.as_str()) {
            to.append(name.clone(), value.clone());
        }
    }
    to
}

/// A response the gateway makes itself: a JSON-RPC error (with `id`, or
/// without one when the request had none) carrying a stable reason.
fn gateway_error(
    status: StatusCode,
    id: Option<&Value>,
    code: i64,
    reason: &str,
    message: &str,
) -> Response {
    let body = error_answer(id.unwrap_or(&Value::Null), code, reason, message);
    let mut body = body;
    if id.is_none() {
        if let Some(m) = body.as_object_mut() {
            m.remove("id");
        }
    }
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(&body).unwrap_or_default(),
    )
        .into_response()
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(body).unwrap_or_default(),
    )
        .into_response()
}

fn is_modern(headers: &HeaderMap) -> bool {
    headers
        .get(VERSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| !HANDSHAKE_VERSIONS.contains(&v))
}

fn session_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn id_key(id: &Value) -> String {
    id.to_string()
}

fn content_type_is(headers: &HeaderMap, wanted: &str) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(wanted))
}

fn loopback_name(host: &str) -> bool {
    let host = host.trim();
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map_or(host, |(h, p)| {
            if p.chars().all(|c| c.is_ascii_digit()) {
                h
            } else {
                host
            }
        })
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// What one upstream exchange observes in the messages it carries.
#[derive(Clone)]
struct Watch {
    session: Option<String>,
    /// The call this exchange carries.
    call: Option<Arc<CallSlot>>,
    /// The `tools/list` request this exchange carries: its id and whether paged.
    list: Option<(Value, bool)>,
    /// The `initialize` request this exchange carries: its id (its answer's
    /// `serverInfo` is checked, docs/protocol.md §5.7).
    init: Option<Value>,
}

impl Inner {
    fn end_call(&self, slot: &CallSlot, status: OutcomeStatus, answer: Option<&Value>) -> bool {
        if slot.ended.swap(true, Ordering::SeqCst) {
            return false;
        }
        match answer {
            Some(msg) => self.core.end_with_answer(&slot.call, msg),
            None => self.core.end(&slot.call, status, None),
        }
        {
            let mut r = lock(&self.report);
            match status {
                OutcomeStatus::ServerExited => r.server_exited_calls += 1,
                OutcomeStatus::HttpError => r.http_error_calls += 1,
                OutcomeStatus::ClientGone => r.client_gone_calls += 1,
                OutcomeStatus::Cancelled => r.cancelled_calls += 1,
                _ => {}
            }
        }
        true
    }

    fn forget_call(&self, session: Option<&str>, slot: &Arc<CallSlot>) {
        if let Some(s) = lock(&self.sessions).get(session) {
            s.calls.retain(|c| !Arc::ptr_eq(c, slot));
        }
    }

    fn finish_call(
        &self,
        session: Option<&str>,
        slot: &Arc<CallSlot>,
        status: OutcomeStatus,
        answer: Option<&Value>,
    ) {
        self.end_call(slot, status, answer);
        self.forget_call(session, slot);
    }

    /// Observes one JSON-RPC message from the upstream.
    fn observe(self: &Arc<Self>, watch: &Watch, msg: &Value) {
        let method = msg.get("method").and_then(Value::as_str);
        match (method, msg.get("id")) {
            (None, Some(id)) => self.answer(watch, id, msg),
            (Some("notifications/tools/list_changed"), None) => {
                if let Some(c) = self.check_of(watch.session.as_deref()) {
                    c.list_changed();
                }
                self.list_tools_own(watch.session.clone(), CheckTrigger::ListChanged, None);
            }
            _ => {}
        }
    }

    fn answer(self: &Arc<Self>, watch: &Watch, id: &Value, msg: &Value) {
        if watch.init.as_ref() == Some(id) {
            // The upstream's `serverInfo` against the approved one.
            if let (Some(c), Some(result)) =
                (self.check_of(watch.session.as_deref()), msg.get("result"))
            {
                let now = tally_schemas::time::Clock::now(&tally_schemas::time::SystemClock);
                if let Some(body) = c.initialized(result, now) {
                    self.core.record_check(body);
                }
            }
            return;
        }
        if let Some(slot) = &watch.call {
            if &slot.id == id {
                let (status, _) = crate::calls::answer_status(msg);
                self.finish_call(watch.session.as_deref(), slot, status, Some(msg));
                return;
            }
        }
        if let Some((list_id, paged)) = &watch.list {
            if list_id == id {
                let page = match lock(&self.sessions).get(watch.session.as_deref()) {
                    Some(s) => s.pages.add(*paged, msg),
                    None => ToolPages::default().add(*paged, msg),
                };
                if let PageResult::Complete(all) = page {
                    self.core.record_tools(&all);
                    if let Some(c) = self.check_of(watch.session.as_deref()) {
                        let now =
                            tally_schemas::time::Clock::now(&tally_schemas::time::SystemClock);
                        self.core
                            .record_check(c.list(CheckTrigger::ToolsList, Ok(&all), now));
                    }
                }
                return;
            }
        }
        // An answer on another stream of the session: a resumed stream
        // (GET with Last-Event-ID) carrying the answer to a call whose own
        // stream broke. Without a session, ids are not unique: nothing to match.
        let Some(session) = watch.session.as_deref() else {
            return;
        };
        let key = id_key(id);
        let slot = lock(&self.sessions)
            .get(Some(session))
            .and_then(|s| s.calls.iter().find(|c| c.key == key).cloned());
        if let Some(slot) = slot {
            let (status, _) = crate::calls::answer_status(msg);
            self.finish_call(Some(session), &slot, status, Some(msg));
        }
    }

    fn observe_json_body(self: &Arc<Self>, watch: &Watch, body: &[u8]) -> bool {
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Array(items)) => {
                for item in &items {
                    self.observe(watch, item);
                }
                true
            }
            Ok(v @ Value::Object(_)) => {
                self.observe(watch, &v);
                true
            }
            _ => false,
        }
    }

    fn touch(&self, session: Option<&str>, headers: Option<&HeaderMap>) {
        let mut st = lock(&self.sessions);
        if let Some(s) = st.get(session) {
            s.last_used = Some(Instant::now());
            // Only a real session's own headers are kept: without a session
            // id, requests of different clients would lend each other
            // their credentials.
            if let (Some(h), Some(_)) = (headers, session) {
                s.headers = Some(copy_headers(h));
            }
        }
    }

    fn open_stream(&self, session: Option<&str>, delta: isize) {
        if let Some(s) = lock(&self.sessions).get(session) {
            s.open = s.open.saturating_add_signed(delta);
            s.last_used = Some(Instant::now());
        }
    }

    /// Ends the calls of `session` still open (and forgets the session):
    /// the client ended it, it expired, or the upstream ended it.
    fn end_session(&self, session: &str, status: OutcomeStatus) {
        let removed = lock(&self.sessions).by_id.remove(session);
        if let Some(s) = removed {
            for slot in s.calls {
                self.end_call(&slot, status, None);
            }
        }
    }

    fn expire_sessions(&self) {
        let idle = self.config.limits.session_idle;
        let expired: Vec<String> = lock(&self.sessions)
            .by_id
            .iter()
            .filter(|(_, s)| s.open == 0 && s.last_used.is_some_and(|t| t.elapsed() >= idle))
            .map(|(k, _)| k.clone())
            .collect();
        for k in expired {
            self.end_session(&k, OutcomeStatus::ClientGone);
        }
    }

    fn upstream_url(&self, uri: &axum::http::Uri) -> reqwest::Url {
        let mut url = self.upstream.clone();
        if uri.path() != self.upstream.path() {
            url.set_path(uri.path());
            url.set_query(None);
        }
        if let Some(q) = uri.query() {
            let joined = match url.query() {
                Some(own) if !own.is_empty() => format!("{own}&{q}"),
                _ => q.to_owned(),
            };
            url.set_query(Some(&joined));
        }
        url
    }

    fn upstream_request(
        &self,
        method: &Method,
        url: reqwest::Url,
        headers: &HeaderMap,
        body: Option<Bytes>,
    ) -> reqwest::RequestBuilder {
        let mut req = self
            .client
            .request(method.clone(), url)
            .headers(copy_headers(headers));
        if let Some(b) = body {
            req = req.body(b);
        }
        req
    }

    /// After `notifications/initialized` (`trigger` `initialize`, with that
    /// request's `headers`) and after `notifications/tools/list_changed`
    /// (with the session's last request headers), lists the tools and
    /// records the list (up to 2025-11-25; later versions deliver the change
    /// on the client's own subscription, and the client lists again itself).
    fn list_tools_own(
        self: &Arc<Self>,
        session: Option<String>,
        trigger: CheckTrigger,
        headers: Option<&HeaderMap>,
    ) {
        if trigger == CheckTrigger::Initialize && self.core.config().tool_check.is_none() {
            return;
        }
        let headers = {
            let mut st = lock(&self.sessions);
            let Some(s) = st.get(session.as_deref()) else {
                return;
            };
            let Some(h) = headers.map(copy_headers).or_else(|| s.headers.clone()) else {
                return;
            };
            if s.own_list_running || is_modern(&h) {
                return;
            }
            s.own_list_running = true;
            h
        };
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let all = this.own_list(&headers).await;
            if let Some(s) = lock(&this.sessions).get(session.as_deref()) {
                s.own_list_running = false;
            }
            if let Some(c) = this.check_of(session.as_deref()) {
                let now = tally_schemas::time::Clock::now(&tally_schemas::time::SystemClock);
                let tools = all.as_deref().map_err(|(o, _)| *o);
                this.core.record_check(c.list(trigger, tools, now));
            }
            match all {
                Ok(tools) => this.core.record_tools(&tools),
                Err((_, e)) => eprintln!("tally: gateway: could not list the tools: {e}"),
            }
        });
    }

    /// The tool check of `session`, made from the gateway's on first use.
    fn check_of(&self, session: Option<&str>) -> Option<Arc<crate::toolcheck::Enforcer>> {
        let root = self.core.config().tool_check.as_ref()?;
        let mut st = lock(&self.sessions);
        let s = st.get(session)?;
        Some(Arc::clone(
            s.check.get_or_insert_with(|| Arc::new(root.fork())),
        ))
    }

    /// The tool check's answer for a `tools/call` (docs/protocol.md §5.7):
    /// `None` to go on. While the session's check is stale the gateway lists
    /// the tools itself with the request's headers and checks them first.
    async fn admit_call(
        &self,
        session: Option<&str>,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Option<Refusal> {
        let check = self.check_of(session)?;
        let tool = serde_json::from_slice::<Value>(body)
            .ok()?
            .pointer("/params/name")?
            .as_str()?
            .to_owned();
        let tool = self.core.config().recorded_name(&tool);
        for _ in 0..3 {
            match check.admit(&tool) {
                Admission::Forward => return None,
                Admission::Refuse(r) => return Some(r),
                Admission::Wait => {
                    let listing = lock(&self.sessions)
                        .get(session)
                        .is_some_and(|s| s.own_list_running);
                    if listing && check.wait_fresh(Duration::from_secs(10)).await {
                        // The list the gateway is reading (the session's
                        // first, or after list_changed) decides.
                        continue;
                    }
                    let trigger = if check.checks() == 0 {
                        CheckTrigger::Initialize
                    } else {
                        CheckTrigger::Call
                    };
                    let all = self.own_list(headers).await;
                    let tools = all.as_deref().map_err(|(o, _)| *o);
                    let now = tally_schemas::time::Clock::now(&tally_schemas::time::SystemClock);
                    self.core.record_check(check.list(trigger, tools, now));
                }
            }
        }
        None
    }

    /// A `tools/list` answer as the client sees it: without the session's
    /// paused tools; `None` when nothing is left out. An `initialize`
    /// answer in a session the check denied is that refusal instead (the
    /// session stops, as over stdio).
    fn shown_list(&self, watch: &Watch, msg: &Value) -> Option<Value> {
        if let Some(id) = watch.init.as_ref().filter(|i| msg.get("id") == Some(*i)) {
            let why = self.check_of(watch.session.as_deref())?.denied()?;
            let r = Refusal::new(
                "session_denied",
                format!("the tool check denied this session: {why}"),
            );
            return Some(r.to_answer(id));
        }
        watch.list.as_ref()?;
        let check = self.check_of(watch.session.as_deref())?;
        let mut shown = msg.clone();
        let now = tally_schemas::time::Clock::now(&tally_schemas::time::SystemClock);
        check.filter_page(&mut shown, now).then_some(shown)
    }

    /// Lists the tools itself, following every `nextCursor`. On failure,
    /// the observation for the check: `list_truncated` when a page after
    /// the first could not be read or the list has more than
    /// `MAX_LIST_PAGES` pages, else `server_unavailable`.
    async fn own_list(
        &self,
        headers: &HeaderMap,
    ) -> Result<Vec<Value>, (CheckObservation, String)> {
        let mut cursor: Option<Value> = None;
        let fail = |cursor: &Option<Value>, e: String| {
            if cursor.is_some() {
                (CheckObservation::ListTruncated, e)
            } else {
                (CheckObservation::ServerUnavailable, e)
            }
        };
        let mut pages = ToolPages::default();
        for _ in 0..crate::calls::MAX_LIST_PAGES {
            let n = self.own_list_counter.fetch_add(1, Ordering::Relaxed) + 1;
            let id = Value::String(format!("{OWN_ID_PREFIX}{n}"));
            let mut req = json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"});
            if let Some(c) = &cursor {
                req["params"] = json!({"cursor": c});
            }
            let mut h = headers.clone();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            h.insert(
                header::ACCEPT,
                HeaderValue::from_static("application/json, text/event-stream"),
            );
            let resp = self
                .upstream_request(
                    &Method::POST,
                    self.upstream.clone(),
                    &h,
                    Some(Bytes::from(serde_json::to_vec(&req).unwrap_or_default())),
                )
                .send()
                .await
                .map_err(|e| fail(&cursor, e.to_string()))?;
            let answer = read_answer(resp, &id, self.config.limits.max_answer_bytes)
                .await
                .map_err(|e| fail(&cursor, e))?;
            match pages.add(cursor.is_some(), &answer) {
                PageResult::Complete(all) => return Ok(all),
                PageResult::More(next) => cursor = Some(next),
                PageResult::NoList => {
                    return Err(fail(&cursor, format!("the upstream answered {answer}")))
                }
            }
        }
        Err((
            CheckObservation::ListTruncated,
            format!("more than {} pages of tools", crate::calls::MAX_LIST_PAGES),
        ))
    }
}

/// The JSON-RPC answer with `id` from a JSON body or an SSE stream.
async fn read_answer(mut resp: reqwest::Response, id: &Value, max: usize) -> Result<Value, String> {
    let status = resp.status();
    let sse = content_type_is(resp.headers(), "text/event-stream");
    let mut reader = SseReader::new(max);
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| e.to_string())? {
        if sse {
            for ev in reader.feed(&chunk).map_err(|e| e.to_string())? {
                if let Ok(v) = serde_json::from_str::<Value>(&ev.data) {
                    if v.get("id") == Some(id) && v.get("method").is_none() {
                        return Ok(v);
                    }
                }
            }
        } else {
            body.extend_from_slice(&chunk);
            if body.len() > max {
                return Err(format!("answer larger than {max} bytes"));
            }
        }
    }
    if sse {
        return Err(format!("HTTP {status}: the stream ended without an answer"));
    }
    serde_json::from_slice(&body).map_err(|_| format!("HTTP {status}: not a JSON-RPC answer"))
}

/// What the exchange task hands the handler: the response to send.
type Reply = oneshot::Sender<Response>;

impl HttpGateway {
    /// A gateway recording through `core`.
    ///
    /// # Errors
    /// [`HttpError`] when the upstream URL is not http(s) or the HTTP client
    /// cannot be built.
    pub fn new(core: CallRecorder, config: HttpConfig) -> Result<Self, HttpError> {
        let upstream = config.upstream.clone();
        if !matches!(upstream.scheme(), "http" | "https") || upstream.host_str().is_none() {
            return Err(HttpError::Upstream {
                url: upstream.to_string(),
                reason: "not an http:// or https:// URL with a host".into(),
            });
        }
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(config.limits.connect_timeout)
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(60));
        if let Some(pem) = &config.upstream_ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| HttpError::Tls(format!("--upstream-ca: {e}")))?;
            if certs.is_empty() {
                return Err(HttpError::Tls(
                    "--upstream-ca: no certificate in the file".into(),
                ));
            }
            for c in certs {
                builder = builder.add_root_certificate(c);
            }
        }
        let client = builder
            .build()
            .map_err(|e| HttpError::Client(e.to_string()))?;
        let in_flight = Arc::new(Semaphore::new(config.limits.max_in_flight));
        Ok(Self {
            inner: Arc::new(Inner {
                core,
                client,
                upstream,
                config,
                sessions: Mutex::new(Sessions::default()),
                in_flight,
                own_list_counter: AtomicU64::new(0),
                report: Mutex::new(HttpReport::default()),
            }),
        })
    }

    /// The router: every path and method, forwarded to the upstream's origin;
    /// the upstream URL's path is the MCP endpoint, where calls are recorded.
    pub fn router(&self) -> Router {
        Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&self.inner))
    }

    /// What happened so far.
    #[must_use]
    pub fn report(&self) -> HttpReport {
        lock(&self.inner.report).clone()
    }

    /// Ends every call still open with `client_gone` (the gateway stops).
    pub fn close(&self) {
        let mut all = Vec::new();
        {
            let mut st = lock(&self.inner.sessions);
            all.append(&mut st.none.calls);
            for s in st.by_id.values_mut() {
                all.append(&mut s.calls);
            }
        }
        for slot in all {
            self.inner.end_call(&slot, OutcomeStatus::ClientGone, None);
        }
    }

    /// Checks that the upstream is an MCP endpoint: a JSON-RPC `ping`
    /// without a session must come back as a JSON-RPC message (an answer,
    /// or an error such as "no session"), or as 401/403 (the upstream wants
    /// the client's credentials, which the gateway does not have).
    ///
    /// # Errors
    /// [`HttpError::Upstream`] naming what came back instead.
    pub async fn probe(&self) -> Result<ProbeResult, HttpError> {
        let url = self.inner.upstream.to_string();
        let fail = |reason: String| HttpError::Upstream {
            url: url.clone(),
            reason,
        };
        let resp = self
            .inner
            .client
            .post(self.inner.upstream.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream")
            .body(r#"{"jsonrpc":"2.0","id":"tally-gateway:probe","method":"ping"}"#)
            .timeout(Duration::from_secs(15))
            .send()
            .await
            .map_err(|e| fail(format!("cannot reach it: {}", error_chain(&e))))?;
        let status = resp.status();
        if matches!(status.as_u16(), 401 | 403) {
            return Ok(ProbeResult::NeedsAuth(status.as_u16()));
        }
        let ctype = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("no content type")
            .to_owned();
        let json = content_type_is(resp.headers(), "application/json");
        let sse = content_type_is(resp.headers(), "text/event-stream");
        let is_jsonrpc = |v: &Value| v.get("jsonrpc").and_then(Value::as_str) == Some("2.0");
        let mcp = if sse {
            true
        } else if json {
            let body = read_limited(resp, 1 << 20).await;
            body.and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .is_some_and(|v| is_jsonrpc(&v))
        } else {
            false
        };
        if mcp {
            Ok(ProbeResult::Mcp)
        } else {
            Err(fail(format!(
                "not an MCP endpoint: a JSON-RPC ping sent with POST was answered with HTTP {status} ({ctype}), not a JSON-RPC message; check the URL's path (often /mcp)"
            )))
        }
    }
}

/// What [`HttpGateway::probe`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeResult {
    /// A JSON-RPC answer came back.
    Mcp,
    /// The upstream wants credentials (401 or 403): it could not be checked.
    NeedsAuth(u16),
}

async fn read_limited(mut resp: reqwest::Response, max: usize) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        body.extend_from_slice(&chunk);
        if body.len() > max {
            return None;
        }
    }
    Some(body)
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        let t = inner.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        source = inner.source();
    }
    s
}

fn origin_allowed(inner: &Inner, headers: &HeaderMap) -> Result<(), &'static str> {
    if inner.config.loopback_hosts_only {
        let host = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !host.is_empty() && !loopback_name(host) {
            return Err("forbidden_host");
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        let local = origin.split_once("://").is_some_and(|(scheme, rest)| {
            matches!(scheme, "http" | "https") && loopback_name(rest)
        });
        let listed = inner
            .config
            .allowed_origins
            .iter()
            .any(|o| o.eq_ignore_ascii_case(origin));
        if !(local || listed) {
            return Err("forbidden_origin");
        }
    }
    Ok(())
}

async fn handle(State(inner): State<Arc<Inner>>, req: Request) -> Response {
    if let Err(reason) = origin_allowed(&inner, req.headers()) {
        return gateway_error(
            StatusCode::FORBIDDEN,
            None,
            ERROR_NOT_FORWARDED,
            reason,
            "tally gateway: request refused: its Host or Origin is not allowed (the gateway refuses non-local origins; see --allow-origin)",
        );
    }
    let Ok(permit) = Arc::clone(&inner.in_flight).try_acquire_owned() else {
        return gateway_error(
            StatusCode::SERVICE_UNAVAILABLE,
            None,
            ERROR_NOT_FORWARDED,
            "busy",
            "tally gateway: too many requests in flight; try again",
        );
    };
    let (parts, body) = req.into_parts();
    let body = match tokio::time::timeout(
        inner.config.limits.body_read_timeout,
        http_body_util::Limited::new(body, inner.config.limits.max_body_bytes).collect(),
    )
    .await
    {
        Err(_) => {
            return gateway_error(
                StatusCode::REQUEST_TIMEOUT,
                None,
                ERROR_NOT_FORWARDED,
                "body_timeout",
                "tally gateway: the request body did not arrive in time",
            )
        }
        Ok(Err(e)) => {
            let too_large = e
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some();
            return if too_large {
                gateway_error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    None,
                    ERROR_NOT_FORWARDED,
                    "body_too_large",
                    &format!(
                        "tally gateway: the request body is larger than {} bytes (--max-body-bytes)",
                        inner.config.limits.max_body_bytes
                    ),
                )
            } else {
                gateway_error(
                    StatusCode::BAD_REQUEST,
                    None,
                    ERROR_NOT_FORWARDED,
                    "body_unreadable",
                    "tally gateway: the request body could not be read",
                )
            };
        }
        Ok(Ok(collected)) => collected.to_bytes(),
    };
    let on_endpoint = parts.uri.path() == inner.upstream.path();
    let (reply_tx, reply_rx) = oneshot::channel();
    // The exchange runs in its own task, so a client that goes away (and
    // makes hyper drop this handler) cannot stop an outcome from being recorded.
    let task = Arc::clone(&inner);
    tokio::spawn(async move {
        exchange(
            task,
            parts.method,
            parts.uri,
            parts.headers,
            body,
            on_endpoint,
            reply_tx,
        )
        .await;
        drop(permit);
    });
    reply_rx.await.unwrap_or_else(|_| {
        gateway_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            None,
            ERROR_NOT_FORWARDED,
            "internal",
            "tally gateway: the exchange ended without an answer",
        )
    })
}

/// What a `POST` to the MCP endpoint carries, as far as recording goes.
enum Carried {
    Call(Value),
    List(Value, bool),
    Cancel(Value),
    Initialize(Value),
    /// The client's `notifications/initialized`.
    Initialized,
    /// A batch with a `tools/call`: refused, with these request ids.
    CallBatch(Vec<Value>),
    Other,
}

fn carried(method: &Method, body: &[u8]) -> Carried {
    if method != Method::POST {
        return Carried::Other;
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => {
            let id = m.get("id").cloned();
            match (m.get("method").and_then(Value::as_str), id) {
                (Some("tools/call"), Some(id)) => Carried::Call(id),
                (Some("tools/list"), Some(id)) => {
                    Carried::List(id, is_paged_list_request(&Value::Object(m)))
                }
                (Some("initialize"), Some(id)) => Carried::Initialize(id),
                (Some("notifications/initialized"), None) => Carried::Initialized,
                (Some("notifications/cancelled"), None) => {
                    match m.get("params").and_then(|p| p.get("requestId")) {
                        Some(rid) => Carried::Cancel(rid.clone()),
                        None => Carried::Other,
                    }
                }
                _ => Carried::Other,
            }
        }
        Ok(Value::Array(items)) => {
            let is_call = |v: &Value| v.get("method").and_then(Value::as_str) == Some("tools/call");
            if items.iter().any(is_call) {
                Carried::CallBatch(
                    items
                        .iter()
                        .filter(|i| i.get("method").is_some())
                        .filter_map(|i| i.get("id").cloned())
                        .collect(),
                )
            } else {
                Carried::Other
            }
        }
        _ => Carried::Other,
    }
}

#[allow(clippy::too_many_lines)]
async fn exchange(
    inner: Arc<Inner>,
    method: Method,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
    on_endpoint: bool,
    reply: Reply,
) {
    let url = inner.upstream_url(&uri);
    if !on_endpoint {
        // Not the MCP endpoint (OAuth metadata, for example): passed through.
        let sent = inner
            .upstream_request(&method, url, &headers, request_body(&method, body))
            .send()
            .await;
        let watch = Watch {
            session: None,
            call: None,
            list: None,
            init: None,
        };
        let _ = relay(&inner, sent, watch, reply, false, None).await;
        return;
    }
    let session = session_of(&headers);
    let modern = is_modern(&headers);
    let what = carried(&method, &body);

    // Sessions: a new one comes with an `initialize`; a known id is used;
    // an unknown id (the gateway restarted, say) is adopted, within the bound.
    if let Some(sid) = &session {
        let mut st = lock(&inner.sessions);
        if !st.by_id.contains_key(sid) {
            if st.by_id.len() >= inner.config.limits.max_sessions {
                drop(st);
                inner.expire_sessions();
                st = lock(&inner.sessions);
            }
            if st.by_id.len() >= inner.config.limits.max_sessions {
                drop(st);
                let _ = reply.send(too_many_sessions(&inner));
                return;
            }
            st.by_id.insert(sid.clone(), Session::default());
        }
    } else if matches!(what, Carried::Initialize(_)) {
        inner.expire_sessions();
        if lock(&inner.sessions).by_id.len() >= inner.config.limits.max_sessions {
            let _ = reply.send(too_many_sessions(&inner));
            return;
        }
    }
    inner.touch(
        session.as_deref(),
        (method == Method::POST).then_some(&headers),
    );

    let is_initialize = matches!(what, Carried::Initialize(_));
    let is_initialized = matches!(what, Carried::Initialized);
    let mut watch = Watch {
        session: session.clone(),
        call: None,
        list: None,
        init: None,
    };
    match what {
        Carried::CallBatch(ids) => {
            let refusal = Refusal::new(
                "batch_not_supported",
                "JSON-RPC batches that contain tools/call are not supported",
            );
            let answers: Vec<Value> = ids.iter().map(|id| refusal.to_answer(id)).collect();
            let _ = reply.send(json_response(StatusCode::OK, &Value::Array(answers)));
            return;
        }
        Carried::Cancel(rid) => {
            let key = id_key(&rid);
            let slot = {
                let mut st = lock(&inner.sessions);
                st.get(session.as_deref()).and_then(|s| {
                    let matching: Vec<_> = s.calls.iter().filter(|c| c.key == key).collect();
                    // Without a session, ids repeat across clients: only an
                    // unambiguous match is taken.
                    (matching.len() == 1).then(|| Arc::clone(matching[0]))
                })
            };
            if let Some(slot) = slot {
                inner.finish_call(session.as_deref(), &slot, OutcomeStatus::Cancelled, None);
            }
        }
        Carried::List(id, paged) => watch.list = Some((id, paged)),
        Carried::Call(id) => {
            lock(&inner.report).calls += 1;
            let key = id_key(&id);
            if session.is_some() {
                let duplicate = lock(&inner.sessions)
                    .get(session.as_deref())
                    .is_some_and(|s| s.calls.iter().any(|c| c.key == key));
                if duplicate {
                    let r = Refusal::new(
                        "duplicate_request_id",
                        format!("request id {key} is already in flight in this session"),
                    );
                    let _ = reply.send(json_response(StatusCode::OK, &r.to_answer(&id)));
                    return;
                }
            }
            if let Some(r) = inner.admit_call(session.as_deref(), &headers, &body).await {
                let _ = reply.send(json_response(StatusCode::OK, &r.to_answer(&id)));
                return;
            }
            let call = match inner.core.decide(&id, &body).await {
                Ok(c) => c,
                Err(r) => {
                    let _ = reply.send(json_response(StatusCode::OK, &r.to_answer(&id)));
                    return;
                }
            };
            let slot = Arc::new(CallSlot {
                id: id.clone(),
                key,
                call,
                ended: AtomicBool::new(false),
                last_event_id: Mutex::new(None),
            });
            if let Some(s) = lock(&inner.sessions).get(session.as_deref()) {
                s.calls.push(Arc::clone(&slot));
            }
            if slot.call.strict {
                let mut reply = reply;
                let waited = tokio::select! {
                    r = inner.core.wait_receipt(&slot.call) => Some(r),
                    () = reply.closed() => None,
                };
                match waited {
                    Some(Ok(())) => {
                        return forward_call(
                            inner,
                            method,
                            url,
                            headers,
                            body,
                            watch_with(&watch, &slot),
                            reply,
                            modern,
                        )
                        .await;
                    }
                    Some(Err(r)) => {
                        inner.finish_call(session.as_deref(), &slot, OutcomeStatus::NotRun, None);
                        let _ = reply.send(json_response(StatusCode::OK, &r.to_answer(&id)));
                    }
                    None => {
                        inner.finish_call(session.as_deref(), &slot, OutcomeStatus::NotRun, None);
                    }
                }
                return;
            }
            let w = watch_with(&watch, &slot);
            return forward_call(inner, method, url, headers, body, w, reply, modern).await;
        }
        Carried::Initialize(id) => watch.init = Some(id),
        Carried::Initialized | Carried::Other => {}
    }

    let last_event_id = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // A resumption continues the stream of the call whose last event id it
    // names: if it fails, that call's answer is lost.
    let resumed = last_event_id.as_deref().and_then(|leid| {
        lock(&inner.sessions).get(session.as_deref()).and_then(|s| {
            s.calls
                .iter()
                .find(|c| lock(&c.last_event_id).as_deref() == Some(leid))
                .cloned()
        })
    });
    let sent = inner
        .upstream_request(&method, url, &headers, request_body(&method, body))
        .send()
        .await;
    if let (true, Some(sid)) = (method == Method::DELETE, &session) {
        match &sent {
            Ok(r) if r.status().is_success() => inner.end_session(sid, OutcomeStatus::ClientGone),
            // The upstream is gone: so is every answer still owed in the session.
            Err(e) if e.is_connect() => inner.end_session(sid, OutcomeStatus::ServerExited),
            _ => {}
        }
    }
    if let (Some(slot), Err(e)) = (&resumed, &sent) {
        let status = if e.is_connect() {
            OutcomeStatus::ServerExited
        } else {
            OutcomeStatus::HttpError
        };
        inner.finish_call(session.as_deref(), slot, status, None);
    }
    if let (Some(slot), Ok(r)) = (&resumed, &sent) {
        if !r.status().is_success() {
            inner.finish_call(session.as_deref(), slot, OutcomeStatus::HttpError, None);
        }
    }
    if let Ok(r) = &sent {
        if is_initialize {
            if let Some(sid) = session_of(r.headers()) {
                lock(&inner.sessions)
                    .by_id
                    .entry(sid.clone())
                    .or_default()
                    .last_used = Some(Instant::now());
                // The answer belongs to the session it opens: its
                // `serverInfo` is checked in that session.
                watch.session = Some(sid);
            }
        }
        if is_initialized && r.status().is_success() {
            // The session's first check, as soon as the server may be
            // asked (docs/protocol.md §5.7): the client's
            // `notifications/initialized` follows the `initialize` answer.
            inner.list_tools_own(session.clone(), CheckTrigger::Initialize, Some(&headers));
        }
        if r.status() == StatusCode::NOT_FOUND {
            if let Some(sid) = &session {
                // The upstream ended the session: what was still open in it is lost.
                inner.end_session(sid, OutcomeStatus::HttpError);
            }
        }
    }
    let streaming = method == Method::GET;
    if streaming {
        inner.open_stream(session.as_deref(), 1);
    }
    let _ = relay(&inner, sent, watch, reply, false, resumed).await;
    if streaming {
        inner.open_stream(session.as_deref(), -1);
    }
}

/// The body to send on: none for a bodiless GET, HEAD, DELETE or OPTIONS.
fn request_body(method: &Method, body: Bytes) -> Option<Bytes> {
    let bodiless = matches!(
        *method,
        Method::GET | Method::HEAD | Method::DELETE | Method::OPTIONS
    );
    (!(bodiless && body.is_empty())).then_some(body)
}

fn watch_with(watch: &Watch, slot: &Arc<CallSlot>) -> Watch {
    Watch {
        session: watch.session.clone(),
        call: Some(Arc::clone(slot)),
        list: None,
        init: None,
    }
}

fn too_many_sessions(inner: &Inner) -> Response {
    gateway_error(
        StatusCode::SERVICE_UNAVAILABLE,
        None,
        ERROR_NOT_FORWARDED,
        "too_many_sessions",
        &format!(
            "tally gateway: {} sessions are open (--max-sessions); end one (DELETE) or wait for one to expire",
            inner.config.limits.max_sessions
        ),
    )
}

#[allow(clippy::too_many_arguments)]
async fn forward_call(
    inner: Arc<Inner>,
    method: Method,
    url: reqwest::Url,
    headers: HeaderMap,
    body: Bytes,
    watch: Watch,
    mut reply: Reply,
    modern: bool,
) {
    let Some(slot) = watch.call.clone() else {
        return;
    };
    let session = watch.session.clone();
    let send = inner
        .upstream_request(&method, url, &headers, Some(body))
        .send();
    tokio::pin!(send);
    let mut client_left = false;
    let sent = loop {
        tokio::select! {
            r = &mut send => break r,
            () = reply.closed(), if !client_left => {
                if modern {
                    // Closing the stream is the cancellation (2026-07-28):
                    // dropping the upstream request passes it on.
                    inner.finish_call(session.as_deref(), &slot, OutcomeStatus::Cancelled, None);
                    return;
                }
                client_left = true;
            }
        }
    };
    let sent = match sent {
        Ok(r) => Ok(r),
        Err(e) => {
            let status = if e.is_connect() {
                OutcomeStatus::HttpError
            } else {
                OutcomeStatus::ServerExited
            };
            inner.finish_call(session.as_deref(), &slot, status, None);
            Err(e)
        }
    };
    // An answer stream in progress keeps its session from expiring.
    inner.open_stream(session.as_deref(), 1);
    let ended = relay(&inner, sent, watch, reply, modern, None).await;
    inner.open_stream(session.as_deref(), -1);
    if slot.ended.load(Ordering::SeqCst) {
        return;
    }
    match ended {
        StreamEnd::Answered => {}
        StreamEnd::ClientLeft if modern => {
            inner.finish_call(session.as_deref(), &slot, OutcomeStatus::Cancelled, None);
        }
        StreamEnd::NotMcp => {
            inner.finish_call(session.as_deref(), &slot, OutcomeStatus::HttpError, None);
        }
        StreamEnd::ClientLeft | StreamEnd::Broken | StreamEnd::Closed => {
            if session.is_some() && lock(&slot.last_event_id).is_some() {
                // The upstream gave the stream event ids: the client can
                // resume it with GET and Last-Event-ID in its session, so
                // the call stays open there until an answer, a failed
                // resumption, the session's end or the gateway's stop.
                return;
            }
            let status = if client_left || ended == StreamEnd::ClientLeft {
                OutcomeStatus::ClientGone
            } else {
                OutcomeStatus::ServerExited
            };
            inner.finish_call(session.as_deref(), &slot, status, None);
        }
    }
}

/// How a relayed answer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StreamEnd {
    /// A JSON body (observed) or a stream that ended cleanly after its answer.
    Answered,
    /// The answer is not JSON-RPC: an HTTP error or another content type.
    NotMcp,
    /// The client stopped reading.
    ClientLeft,
    /// The upstream's stream broke (connection reset, oversized event).
    Broken,
    /// The upstream closed the stream cleanly.
    Closed,
}

/// Sends the upstream's answer to the client unchanged while observing it.
/// `keep_reading_after_client`: read the upstream to its end after the
/// client left (a call in the 2025-era, whose answer is still recorded).
async fn relay(
    inner: &Arc<Inner>,
    sent: Result<reqwest::Response, reqwest::Error>,
    watch: Watch,
    reply: Reply,
    modern: bool,
    resumed: Option<Arc<CallSlot>>,
) -> StreamEnd {
    let mut resp = match sent {
        Ok(r) => r,
        Err(e) => {
            let id = watch.call.as_ref().map(|c| c.id.clone());
            let detail = error_chain(&e);
            eprintln!("tally: gateway: upstream {}: {detail}", inner.upstream);
            let _ = reply.send(gateway_error(
                StatusCode::BAD_GATEWAY,
                id.as_ref(),
                ERROR_UPSTREAM,
                "upstream_unreachable",
                &format!("tally gateway: the upstream MCP server could not be reached or broke the connection: {detail}"),
            ));
            return StreamEnd::Broken;
        }
    };
    let status = resp.status();
    let sse = content_type_is(resp.headers(), "text/event-stream");
    let json = content_type_is(resp.headers(), "application/json");
    let mut builder = Response::builder().status(status);
    if let Some(h) = builder.headers_mut() {
        *h = copy_headers(resp.headers());
    }
    let max = inner.config.limits.max_answer_bytes;

    if !sse {
        // A JSON answer (or anything else): read whole, bounded, observed,
        // then passed on.
        let mut body = Vec::new();
        let mut broken = false;
        loop {
            match resp.chunk().await {
                Ok(Some(c)) => {
                    body.extend_from_slice(&c);
                    if body.len() > max {
                        let id = watch.call.as_ref().map(|c| c.id.clone());
                        let _ = reply.send(gateway_error(
                            StatusCode::BAD_GATEWAY,
                            id.as_ref(),
                            ERROR_UPSTREAM,
                            "answer_too_large",
                            &format!("tally gateway: the upstream's answer is larger than {max} bytes (--max-answer-bytes)"),
                        ));
                        return StreamEnd::NotMcp;
                    }
                }
                Ok(None) => break,
                Err(_) => {
                    broken = true;
                    break;
                }
            }
        }
        if broken {
            let id = watch.call.as_ref().map(|c| c.id.clone());
            let _ = reply.send(gateway_error(
                StatusCode::BAD_GATEWAY,
                id.as_ref(),
                ERROR_UPSTREAM,
                "upstream_broken",
                "tally gateway: the upstream broke the connection while sending its answer",
            ));
            return StreamEnd::Broken;
        }
        let observed = json && inner.observe_json_body(&watch, &body);
        // Parsed again only for a tools/list answer under a tool check.
        let listed = (watch.list.is_some() || watch.init.is_some())
            && inner.core.config().tool_check.is_some();
        if let Some(shown) = listed
            .then(|| serde_json::from_slice::<Value>(&body).ok())
            .flatten()
            .and_then(|v| inner.shown_list(&watch, &v))
        {
            body = serde_json::to_vec(&shown).unwrap_or_default();
            if let Some(h) = builder.headers_mut() {
                h.remove(header::CONTENT_LENGTH);
            }
        }
        let _ = reply.send(
            builder
                .body(Body::from(body))
                .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response()),
        );
        let answered = watch
            .call
            .as_ref()
            .is_none_or(|c| c.ended.load(Ordering::SeqCst));
        return if observed && answered {
            StreamEnd::Answered
        } else {
            StreamEnd::NotMcp
        };
    }

    // An SSE stream: each chunk goes on as it arrives.
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(64);
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let sent = reply.send(
        builder
            .body(Body::from_stream(stream))
            .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response()),
    );
    if sent.is_err() && (modern || watch.call.is_none()) {
        return StreamEnd::ClientLeft;
    }
    let mut reader = SseReader::new(max);
    let mut client_open = !tx.is_closed();
    // Up to 2025-11-25 a client's disconnect is not a cancellation: the
    // upstream's answer to an open call is still read, to be recorded.
    let keep_reading = || {
        !modern
            && watch
                .call
                .as_ref()
                .is_some_and(|c| !c.ended.load(Ordering::SeqCst))
    };
    let slot = watch.call.clone().or(resumed);
    loop {
        let chunk = if client_open {
            tokio::select! {
                c = resp.chunk() => c,
                () = tx.closed() => {
                    client_open = false;
                    if !keep_reading() {
                        return StreamEnd::ClientLeft;
                    }
                    continue;
                }
            }
        } else {
            resp.chunk().await
        };
        let chunk = match chunk {
            Ok(Some(c)) => c,
            Ok(None) => {
                return if client_open {
                    StreamEnd::Closed
                } else {
                    StreamEnd::ClientLeft
                }
            }
            Err(_) => {
                return if client_open {
                    StreamEnd::Broken
                } else {
                    StreamEnd::ClientLeft
                }
            }
        };
        let Ok(events) = reader.feed(&chunk) else {
            eprintln!("tally: gateway: an event from the upstream is larger than {max} bytes (--max-answer-bytes); the stream is cut");
            return StreamEnd::Broken;
        };
        // Observed (outcomes and tool lists queued to the chain writer)
        // before the client sees the chunk, so a record of an answer always
        // precedes the records of what the client does next.
        // A tools/list answer leaving out paused tools is sent as events
        // written again (id and data), instead of the chunk.
        let mut rewritten: Option<Vec<u8>> = None;
        for ev in events {
            if let (Some(s), true) = (&slot, ev.has_id) {
                ev.id.clone_into(&mut lock(&s.last_event_id));
            }
            if ev.data.is_empty() {
                continue;
            }
            if let Ok(msg) = serde_json::from_str::<Value>(&ev.data) {
                inner.observe(&watch, &msg);
                if let Some(shown) = inner.shown_list(&watch, &msg) {
                    let out = rewritten.get_or_insert_with(Vec::new);
                    if let Some(id) = ev.id.as_deref().filter(|_| ev.has_id) {
                        out.extend_from_slice(format!("id: {id}\n").as_bytes());
                    }
                    out.extend_from_slice(b"event: message\ndata: ");
                    out.extend(serde_json::to_vec(&shown).unwrap_or_default());
                    out.extend_from_slice(b"\n\n");
                }
            }
        }
        let chunk = rewritten.map_or(chunk, Bytes::from);
        if client_open && tx.send(Ok(chunk)).await.is_err() {
            client_open = false;
        }
        if !client_open && !keep_reading() {
            return StreamEnd::ClientLeft;
        }
    }
}

/// Builds the rustls server config for the listener from PEM files.
///
/// # Errors
/// [`HttpError::Tls`] when a file is unreadable or holds no usable key or certificate.
pub fn tls_config(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Result<Arc<rustls::ServerConfig>, HttpError> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| HttpError::Tls(format!("{}: {e}", cert.display())))?
        .collect::<Result<_, _>>()
        .map_err(|e| HttpError::Tls(format!("{}: {e}", cert.display())))?;
    if certs.is_empty() {
        return Err(HttpError::Tls(format!(
            "{}: no certificate",
            cert.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| HttpError::Tls(format!("{}: {e}", key.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| HttpError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| HttpError::Tls(e.to_string()))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Serves the gateway on `listener` (over TLS when `tls` is set) until
/// `shutdown` resolves; then stops accepting, lets exchanges in flight end
/// (at most the drain limit), ends the calls still open with `client_gone`,
/// and returns what happened.
pub async fn serve(
    gateway: HttpGateway,
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()>,
) -> HttpReport {
    let graceful = GracefulShutdown::new();
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let limits = gateway.inner.config.limits.clone();
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let app = gateway.router();
    let expiry = {
        let inner = Arc::clone(&gateway.inner);
        let every =
            (limits.session_idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(60));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                inner.expire_sessions();
            }
        })
    };
    tokio::pin!(shutdown);
    loop {
        let Ok(permit) = Arc::clone(&connections).acquire_owned().await else {
            break;
        };
        let (stream, _peer): (_, SocketAddr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("tally: gateway: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let watcher = graceful.watcher();
        let acceptor = acceptor.clone();
        let header_timeout = limits.header_read_timeout;
        tokio::spawn(async move {
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout);
            match acceptor {
                None => {
                    let conn = builder.serve_connection(TokioIo::new(stream), service);
                    let _ = watcher.watch(conn).await;
                }
                Some(acceptor) => {
                    let handshake =
                        tokio::time::timeout(header_timeout, acceptor.accept(stream)).await;
                    let Ok(Ok(tls_stream)) = handshake else {
                        return;
                    };
                    let conn = builder.serve_connection(TokioIo::new(tls_stream), service);
                    let _ = watcher.watch(conn).await;
                }
            }
            drop(permit);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(limits.drain) => {}
    }
    expiry.abort();
    gateway.close();
    gateway.report()
}
