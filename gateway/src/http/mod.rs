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

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::http::{header, HeaderMap, HeaderName, StatusCode};
use axum::response::{IntoResponse as _, Response};
use axum::Router;
use serde_json::Value;
use tally_schemas::record::OutcomeStatus;
use tokio::sync::{oneshot, Semaphore};

use crate::calls::{error_answer, CallRecorder};

mod exchange;
mod relay;
mod server;
mod session;
mod tools;

use exchange::handle;
pub use server::{serve, tls_config};
use session::{CallSlot, Sessions};

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
