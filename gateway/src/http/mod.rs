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
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::header;
use axum::Router;
use serde_json::Value;
use tally_schemas::record::OutcomeStatus;
use tokio::sync::Semaphore;

use crate::calls::CallRecorder;

mod config;
mod exchange;
mod relay;
mod server;
mod session;
mod state;
mod tools;
mod wire;

pub use config::{HttpConfig, HttpError, HttpLimits, HttpReport};
use exchange::handle;
pub use server::{serve, tls_config};
pub use state::HttpGateway;
use state::{lock, Inner, Sessions};
use wire::{content_type_is, error_chain};

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
