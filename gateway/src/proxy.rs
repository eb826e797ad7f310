//! The MCP stdio proxy: newline-delimited JSON-RPC between an
//! MCP client and server, forwarded byte for byte in both directions. The
//! proxy parses each line only to observe it, and records (docs/protocol.md
//! §5):
//!
//! - a `tools` list for every complete `tools/list` answer that differs from
//!   the last list recorded (pages are joined; after the server's
//!   `notifications/tools/list_changed` the proxy lists the tools itself,
//!   with request ids starting `tally-gateway:`, and does not pass those
//!   answers on);
//! - a `decision` for every `tools/call`, committed durably BEFORE the call
//!   is forwarded; if it cannot be committed the call is answered with a
//!   JSON-RPC error and the server never sees it (fail closed);
//! - with `--strict` (or `--strict-tools`), the decision's witness receipt is
//!   awaited and accepted before forwarding; otherwise the call is refused
//!   and its outcome is `not_run`;
//! - an `outcome` when the call ends: `ok`, `error` (a JSON-RPC error or
//!   `isError: true`), `cancelled` (`notifications/cancelled` from the
//!   client), `server_exited` (the server's output ended with the call in
//!   flight; the client also gets a JSON-RPC error for each such call),
//!   `client_gone` (the same, after the client went away: its input ended or
//!   writing to it failed) or `not_run`.
//!
//! When the client goes away the server's input is closed (the MCP stdio
//! shutdown). Calls in flight stay open until the server answers them (an
//! answer still ends a call with `ok` or `error`: a client that closed only
//! its input may still read it) or its output ends (`client_gone`); held
//! `--strict` calls end at once with `not_run`, and later calls are refused
//! without a decision.
//!
//! With a tool baseline and policy ([`ProxyConfig::tool_check`],
//! docs/protocol.md §5.7) the proxy also checks the server's tools: it lists
//! them itself after the client's `notifications/initialized` and after
//! `notifications/tools/list_changed`, and checks every `tools/list` answer
//! the client gets; each check is a `tool_check` record. A paused tool is
//! left out of the lists the client sees and its calls are refused; a call
//! while a check is awaited waits for it; a paused session refuses every
//! call, a denied one every request.
//!
//! Messages other than held `--strict` calls keep their order. The proxy is
//! written over plain async streams so tests drive it without processes;
//! [`crate::process`] connects it to a child process. What is recorded is
//! decided by [`crate::calls`], shared with the Streamable HTTP proxy
//! ([`crate::http`]); this module decides which line answers which call.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{json, Value};
use tally_schemas::record::{CheckObservation, CheckTrigger, OutcomeStatus};
use tally_schemas::time::{Clock as _, SystemClock};
use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncWrite, AsyncWriteExt as _, BufReader};
use tokio::sync::{mpsc, Notify};

pub use crate::calls::{
    call_id_text, ProxyConfig, StrictPolicy, ERROR_CLIENT_GONE, ERROR_NOT_FORWARDED,
    ERROR_SERVER_EXITED,
};
use crate::calls::{
    error_answer, is_paged_list_request, CallRecorder, OpenCall, PageResult, Refusal, ToolPages,
};
use crate::chain::AgentChain;
use crate::toolcheck::{Admission, Enforcer};

/// How long a call to a tool whose check is stale waits for the list.
const CHECK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Request ids the gateway uses for its own `tools/list` requests.
const OWN_ID_PREFIX: &str = "tally-gateway:tools/list:";

/// What the proxy records through.
#[derive(Clone)]
pub struct ProxyDeps {
    /// The agent's chain.
    pub chain: AgentChain,
    /// Notified when the client goes away (end of its input, or writing to
    /// it failed); the server's input is closed then.
    pub client_gone: Arc<Notify>,
}

/// What happened, for the caller's summary.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ProxyReport {
    /// Calls answered with `server_exited`.
    pub server_exited_calls: usize,
    /// Calls ended with `client_gone`.
    pub client_gone_calls: usize,
}

#[derive(Debug)]
enum Pending {
    Call {
        id: Value,
        call: OpenCall,
        /// A `--strict` call not yet forwarded.
        held: bool,
    },
    List {
        paged: bool,
    },
    Initialize,
}

#[derive(Default)]
struct State {
    pending: HashMap<String, Pending>,
    pages: ToolPages,
    own_list_id: Option<String>,
    own_list_counter: u64,
    /// What started the gateway's own list in flight.
    own_trigger: Option<CheckTrigger>,
    /// Pages of the gateway's own list read so far.
    own_pages: usize,
    server_gone: bool,
    client_closed: bool,
}

enum ToServer {
    Line(Vec<u8>),
    Close,
}

enum ToClient {
    Line(Vec<u8>),
    Close,
}

struct Proxy {
    core: CallRecorder,
    check: Option<Arc<Enforcer>>,
    client_gone: Arc<Notify>,
    state: Mutex<State>,
    to_server: mpsc::UnboundedSender<ToServer>,
    to_client: mpsc::UnboundedSender<ToClient>,
}

fn id_key(id: &Value) -> String {
    // serde_json writes ids the same way each time, and keeps 7 and "7" apart
    // as JSON-RPC does.
    id.to_string()
}

fn line_of(answer: &Value) -> Vec<u8> {
    let mut line = serde_json::to_vec(answer).unwrap_or_default();
    line.push(b'\n');
    line
}

fn denied(why: &str) -> Refusal {
    Refusal::new(
        "session_denied",
        format!("the tool check denied this session: {why}"),
    )
}

fn batch_refusal() -> Refusal {
    // Recording a batch would tie several calls to one forward; MCP
    // 2025-06-18 removed batches, so refuse.
    Refusal::new(
        "batch_not_supported",
        "JSON-RPC batches that contain tools/call are not supported",
    )
}

impl Proxy {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves consistent data
        // (every update is a single insert or remove), so keep going.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn reply(&self, line: Vec<u8>) {
        let _ = self.to_client.send(ToClient::Line(line));
    }

    // ---- client → server ----

    async fn on_client_line(self: &Arc<Self>, line: Vec<u8>) {
        let parsed: Option<Value> = serde_json::from_slice(&line).ok();
        match parsed {
            Some(Value::Object(ref m)) => {
                let method = m.get("method").and_then(Value::as_str);
                let id = m.get("id");
                if let Some(why) = self.check.as_ref().and_then(|c| c.denied()) {
                    // A denied session stops: no request reaches the server.
                    if let (Some(_), Some(id)) = (method, id) {
                        self.refuse(id, &denied(&why));
                    }
                    return;
                }
                match (method, id) {
                    (Some("tools/call"), Some(id)) => return self.call(id.clone(), line).await,
                    (Some("tools/list"), Some(id)) => {
                        let paged = parsed.as_ref().is_some_and(is_paged_list_request);
                        self.lock()
                            .pending
                            .insert(id_key(id), Pending::List { paged });
                    }
                    (Some("initialize"), Some(id)) if self.check.is_some() => {
                        self.lock().pending.insert(id_key(id), Pending::Initialize);
                    }
                    (Some("notifications/initialized"), None) if self.check.is_some() => {
                        // Forwarded first: the server answers requests only
                        // once initialised; then the session's first check.
                        let _ = self.to_server.send(ToServer::Line(line));
                        self.list_tools(None, CheckTrigger::Initialize);
                        return;
                    }
                    (Some("notifications/cancelled"), None) => {
                        if let Some(rid) = m.get("params").and_then(|p| p.get("requestId")) {
                            self.cancelled(rid);
                        }
                    }
                    _ => {}
                }
            }
            Some(Value::Array(ref items)) => {
                let is_call =
                    |v: &Value| v.get("method").and_then(Value::as_str) == Some("tools/call");
                if items.iter().any(is_call) {
                    for item in items {
                        if let (Some(id), Some(_)) = (item.get("id"), item.get("method")) {
                            self.refuse(id, &batch_refusal());
                        }
                    }
                    return;
                }
            }
            _ => {}
        }
        let _ = self.to_server.send(ToServer::Line(line));
    }

    fn refuse(&self, id: &Value, refusal: &Refusal) {
        self.reply(line_of(&refusal.to_answer(id)));
    }

    async fn call(self: &Arc<Self>, id: Value, line: Vec<u8>) {
        let key = id_key(&id);
        {
            let st = self.lock();
            let refusal = if st.server_gone {
                Some(Refusal::new("server_exited", "the MCP server has exited"))
            } else if st.client_closed {
                // Only reachable when writing to the client failed while its
                // input is still open: the server's input is closed already.
                Some(Refusal::new("client_gone", "the client went away"))
            } else if st.pending.contains_key(&key) {
                Some(Refusal::new(
                    "duplicate_request_id",
                    format!("request id {key} is already in flight"),
                ))
            } else {
                None
            };
            if let Some(r) = refusal {
                drop(st);
                return self.refuse(&id, &r);
            }
        }
        if let Some(r) = self.admit(&line).await {
            return self.refuse(&id, &r);
        }
        let call = match self.core.decide(&id, &line).await {
            Ok(c) => c,
            Err(r) => return self.refuse(&id, &r),
        };
        let strict = call.strict;
        {
            let mut st = self.lock();
            if st.server_gone || st.client_closed {
                let refusal = if st.server_gone {
                    Refusal::new("server_exited", "the MCP server has exited")
                } else {
                    Refusal::new("client_gone", "the client went away")
                };
                drop(st);
                self.core.end(&call, OutcomeStatus::NotRun, None);
                return self.refuse(&id, &refusal);
            }
            st.pending.insert(
                key.clone(),
                Pending::Call {
                    id: id.clone(),
                    call: call.clone(),
                    held: strict,
                },
            );
            if !strict {
                // Sent under the lock, so an answer cannot be observed before
                // the call is pending.
                let _ = self.to_server.send(ToServer::Line(line));
                return;
            }
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let result = this.core.wait_receipt(&call).await;
            let mut st = this.lock();
            // Gone from the map: cancelled, or the server exited meanwhile;
            // whoever removed it recorded the outcome.
            let Some(Pending::Call { held: true, .. }) = st.pending.get(&key) else {
                return;
            };
            match result {
                Ok(()) if !st.client_closed => {
                    if let Some(Pending::Call { held, .. }) = st.pending.get_mut(&key) {
                        *held = false;
                    }
                    let _ = this.to_server.send(ToServer::Line(line));
                }
                other => {
                    st.pending.remove(&key);
                    drop(st);
                    let refusal = other.err().unwrap_or_else(|| {
                        Refusal::new("strict_receipt", "--strict: the client closed its input")
                    });
                    this.core.end(&call, OutcomeStatus::NotRun, None);
                    this.refuse(&id, &refusal);
                }
            }
        });
    }

    /// The tool check's answer for the `tools/call` `line`: `None` to go on.
    /// A call while the check is stale waits for it (at most
    /// [`CHECK_WAIT`]; then the server is taken as unavailable).
    async fn admit(&self, line: &[u8]) -> Option<Refusal> {
        let check = self.check.as_ref()?;
        let tool = serde_json::from_slice::<Value>(line).ok().and_then(|v| {
            v.pointer("/params/name")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })?;
        let tool = self.core.config().recorded_name(&tool);
        loop {
            match check.admit(&tool) {
                Admission::Forward => return None,
                Admission::Refuse(r) => return Some(r),
                Admission::Wait => {
                    if !check.wait_fresh(CHECK_WAIT).await {
                        // A later page of the gateway's own list that did
                        // not come: the list was cut.
                        let cut = {
                            let st = self.lock();
                            st.own_list_id.is_some() && st.own_pages > 1
                        };
                        let why = if cut {
                            CheckObservation::ListTruncated
                        } else {
                            CheckObservation::ServerUnavailable
                        };
                        let body = check.list(CheckTrigger::Call, Err(why), SystemClock.now());
                        self.core.record_check(body);
                    }
                }
            }
        }
    }

    fn cancelled(&self, request_id: &Value) {
        let removed = {
            let mut st = self.lock();
            match st.pending.get(&id_key(request_id)) {
                Some(Pending::Call { .. }) => st.pending.remove(&id_key(request_id)),
                _ => None,
            }
        };
        if let Some(Pending::Call { call, .. }) = removed {
            self.core.end(&call, OutcomeStatus::Cancelled, None);
        }
    }

    // ---- server → client ----

    fn on_server_line(&self, line: Vec<u8>) {
        let parsed: Option<Value> = serde_json::from_slice(&line).ok();
        let own_answer = parsed
            .as_ref()
            .and_then(|v| v.get("id"))
            .and_then(Value::as_str)
            .is_some_and(|s| s.starts_with(OWN_ID_PREFIX));
        // Observed first: the outcome or tool list is queued to the chain
        // writer before the client can see the answer and act on it.
        let mut replaced = None;
        match &parsed {
            Some(Value::Array(items)) => {
                for item in items {
                    self.observe_server(item);
                }
            }
            Some(v) => replaced = self.observe_server(v),
            None => {}
        }
        if !own_answer {
            self.reply(replaced.map_or(line, |v| line_of(&v)));
        }
    }

    /// Observes one message from the server; `Some` when the client gets
    /// another message instead (a tools list without paused tools, an
    /// error for the `initialize` of a denied session).
    fn observe_server(&self, msg: &Value) -> Option<Value> {
        let method = msg.get("method").and_then(Value::as_str);
        match (method, msg.get("id")) {
            (None, Some(id)) => self.answer(id, msg),
            (Some("notifications/tools/list_changed"), None) => {
                if let Some(c) = &self.check {
                    c.list_changed();
                }
                self.list_tools(None, CheckTrigger::ListChanged);
                None
            }
            _ => None,
        }
    }

    /// Sends the gateway's own `tools/list` request (page `cursor`).
    fn list_tools(&self, cursor: Option<&Value>, trigger: CheckTrigger) {
        let mut st = self.lock();
        if st.server_gone || st.client_closed || (cursor.is_none() && st.own_list_id.is_some()) {
            return;
        }
        if cursor.is_none() {
            st.own_trigger = Some(trigger);
            st.own_pages = 0;
        }
        st.own_pages += 1;
        st.own_list_counter += 1;
        let id = Value::String(format!("{OWN_ID_PREFIX}{}", st.own_list_counter));
        st.own_list_id = Some(id_key(&id));
        st.pending.insert(
            id_key(&id),
            Pending::List {
                paged: cursor.is_some(),
            },
        );
        let mut req = json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"});
        if let Some(c) = cursor {
            req["params"] = json!({"cursor": c});
        }
        let _ = self.to_server.send(ToServer::Line(line_of(&req)));
    }

    fn answer(&self, id: &Value, msg: &Value) -> Option<Value> {
        let key = id_key(id);
        let pending = self.lock().pending.remove(&key)?;
        match pending {
            Pending::Call { call, .. } => {
                self.core.end_with_answer(&call, msg);
                None
            }
            Pending::List { paged } => self.list_answer(&key, paged, msg),
            Pending::Initialize => {
                let check = self.check.as_ref()?;
                if let Some(body) = check.initialized(msg.get("result")?, SystemClock.now()) {
                    self.core.record_check(body);
                }
                let why = check.denied()?;
                // The session stops: the server's input is closed.
                let _ = self.to_server.send(ToServer::Close);
                Some(denied(&why).to_answer(id))
            }
        }
    }

    /// A `tools/list` answer page; `Some` with the page the client sees
    /// when paused tools were left out.
    fn list_answer(&self, key: &str, paged: bool, msg: &Value) -> Option<Value> {
        let (own, page, trigger, own_pages) = {
            let mut st = self.lock();
            let own = st.own_list_id.as_deref() == Some(key);
            if own {
                st.own_list_id = None;
            }
            let trigger = if own {
                st.own_trigger.unwrap_or(CheckTrigger::ListChanged)
            } else {
                CheckTrigger::ToolsList
            };
            (own, st.pages.add(paged, msg), trigger, st.own_pages)
        };
        let now = SystemClock.now();
        match page {
            PageResult::More(_) if own && own_pages >= crate::calls::MAX_LIST_PAGES => {
                // The gateway's own list does not end: truncated.
                if let Some(c) = &self.check {
                    let why = CheckObservation::ListTruncated;
                    self.core.record_check(c.list(trigger, Err(why), now));
                }
            }
            PageResult::More(next) if own => self.list_tools(Some(&next), trigger),
            PageResult::More(_) => {}
            PageResult::NoList => {
                if let (true, Some(c)) = (own, &self.check) {
                    // A page after the first that did not come: the list
                    // was cut (docs/protocol.md §5.7 `list_truncated`).
                    let why = if paged {
                        CheckObservation::ListTruncated
                    } else if msg.get("error").is_some() {
                        CheckObservation::ServerUnavailable
                    } else {
                        CheckObservation::ListMalformed
                    };
                    self.core.record_check(c.list(trigger, Err(why), now));
                }
            }
            PageResult::Complete(all) => {
                self.core.record_tools(&all);
                if let Some(c) = &self.check {
                    self.core.record_check(c.list(trigger, Ok(&all), now));
                }
            }
        }
        let c = self.check.as_ref().filter(|_| !own)?;
        let mut shown = msg.clone();
        c.filter_page(&mut shown, now).then_some(shown)
    }

    /// The client went away: its input ended, or writing to it failed.
    /// Closes the server's input (the MCP stdio shutdown) and ends the calls
    /// held for a receipt, which can no longer be forwarded. Calls already
    /// forwarded stay open for the server's answer; [`Self::server_ended`]
    /// ends the rest with `client_gone`. Idempotent.
    fn client_went_away(&self, why: &str) {
        let held: Vec<Pending> = {
            let mut st = self.lock();
            if st.client_closed {
                return;
            }
            st.client_closed = true;
            let keys: Vec<String> = st
                .pending
                .iter()
                .filter(|(_, p)| matches!(p, Pending::Call { held: true, .. }))
                .map(|(k, _)| k.clone())
                .collect();
            keys.iter().filter_map(|k| st.pending.remove(k)).collect()
        };
        let _ = self.to_server.send(ToServer::Close);
        for p in held {
            if let Pending::Call { id, call, .. } = p {
                self.core.end(&call, OutcomeStatus::NotRun, None);
                self.refuse(
                    &id,
                    &Refusal::new(
                        "client_gone",
                        format!("the client {why} before the receipt arrived"),
                    ),
                );
            }
        }
        self.client_gone.notify_one();
    }

    /// The server's output ended: every call in flight ends with it, as
    /// `client_gone` when the client had gone away first (the server exits
    /// because its input closed), else `server_exited`.
    fn server_ended(&self) -> ProxyReport {
        let (drained, client_closed): (Vec<Pending>, bool) = {
            let mut st = self.lock();
            st.server_gone = true;
            (
                st.pending.drain().map(|(_, p)| p).collect(),
                st.client_closed,
            )
        };
        let mut report = ProxyReport::default();
        for p in drained {
            if let Pending::Call { id, call, held } = p {
                let (status, code, reason, message) = if held {
                    (
                        OutcomeStatus::NotRun,
                        ERROR_SERVER_EXITED,
                        "server_exited",
                        "tally gateway: call not forwarded: the MCP server exited before the receipt arrived",
                    )
                } else if client_closed {
                    (
                        OutcomeStatus::ClientGone,
                        ERROR_CLIENT_GONE,
                        "client_gone",
                        "tally gateway: the client went away while this call was in flight, and the MCP server exited without answering it",
                    )
                } else {
                    (
                        OutcomeStatus::ServerExited,
                        ERROR_SERVER_EXITED,
                        "server_exited",
                        "tally gateway: the MCP server exited while this call was in flight",
                    )
                };
                match status {
                    OutcomeStatus::ClientGone => report.client_gone_calls += 1,
                    _ => report.server_exited_calls += 1,
                }
                self.reply(line_of(&error_answer(&id, code, reason, message)));
                self.core.end(&call, status, None);
            }
        }
        report
    }
}

async fn read_line<R: AsyncRead + Unpin>(r: &mut BufReader<R>) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    match r.read_until(b'\n', &mut buf).await {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(buf),
    }
}

/// Runs the proxy until the server's output ends. Returns once every
/// message for the client has been written and every outcome has been
/// queued to the recorder.
pub async fn run_proxy<CI, CO, SI, SO>(
    config: ProxyConfig,
    deps: ProxyDeps,
    client_in: CI,
    mut client_out: CO,
    mut server_in: SI,
    server_out: SO,
) -> ProxyReport
where
    CI: AsyncRead + Unpin + Send + 'static,
    CO: AsyncWrite + Unpin + Send + 'static,
    SI: AsyncWrite + Unpin + Send + 'static,
    SO: AsyncRead + Unpin + Send + 'static,
{
    let (to_server, mut server_rx) = mpsc::unbounded_channel::<ToServer>();
    let (to_client, mut client_rx) = mpsc::unbounded_channel::<ToClient>();
    let proxy = Arc::new(Proxy {
        check: config.tool_check.clone(),
        core: CallRecorder::new(config, deps.chain),
        client_gone: deps.client_gone,
        state: Mutex::new(State::default()),
        to_server,
        to_client,
    });

    let server_writer = tokio::spawn(async move {
        while let Some(msg) = server_rx.recv().await {
            match msg {
                ToServer::Line(l) => {
                    if server_in.write_all(&l).await.is_err() || server_in.flush().await.is_err() {
                        break;
                    }
                }
                ToServer::Close => break,
            }
        }
        let _ = server_in.shutdown().await;
    });
    let p = Arc::clone(&proxy);
    let client_writer = tokio::spawn(async move {
        let mut open = true;
        while let Some(msg) = client_rx.recv().await {
            match msg {
                ToClient::Line(l) if open => {
                    open =
                        client_out.write_all(&l).await.is_ok() && client_out.flush().await.is_ok();
                    if !open {
                        // A client that cannot be written to is gone (it
                        // died, or closed its end of our output).
                        p.client_went_away("stopped reading its answers");
                    }
                }
                ToClient::Line(_) => {}
                ToClient::Close => break,
            }
        }
        let _ = client_out.flush().await;
    });

    let p = Arc::clone(&proxy);
    let client_reader = tokio::spawn(async move {
        let mut r = BufReader::new(client_in);
        while let Some(line) = read_line(&mut r).await {
            p.on_client_line(line).await;
        }
        p.client_went_away("closed its input");
    });

    let mut r = BufReader::new(server_out);
    while let Some(line) = read_line(&mut r).await {
        proxy.on_server_line(line);
    }
    let report = proxy.server_ended();
    let _ = proxy.to_client.send(ToClient::Close);
    let _ = client_writer.await;
    server_writer.abort();
    client_reader.abort();
    report
}
