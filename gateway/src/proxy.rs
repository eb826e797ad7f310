//! The MCP stdio proxy (issue 6 §2): newline-delimited JSON-RPC between an
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
//! Messages other than held `--strict` calls keep their order. The proxy is
//! written over plain async streams so tests drive it without processes;
//! [`crate::process`] connects it to a child process.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rand_core::{OsRng, RngCore as _};
use serde_json::{json, Value};
use tally_schemas::canonical::{self, Limits};
use tally_schemas::hash::{salted_hash, SALT_LEN};
use tally_schemas::record::{Decision, Outcome, OutcomeStatus};
use tally_schemas::{Body, Hash, Record};
use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncWrite, AsyncWriteExt as _, BufReader};
use tokio::sync::{mpsc, watch, Notify};

use crate::recorder::RecorderHandle;
use crate::store::{ChainStore, Secret};
use crate::sync::{wait_for_receipt, SyncProgress};
use crate::toollist::digest_list;

/// JSON-RPC error code of a call the gateway did not forward.
pub const ERROR_NOT_FORWARDED: i64 = -32001;
/// JSON-RPC error code of a call whose server exited while it was in flight.
pub const ERROR_SERVER_EXITED: i64 = -32002;
/// JSON-RPC error code of a call still in flight when the client went away
/// and the server exited (sent in case the client still reads).
pub const ERROR_CLIENT_GONE: i64 = -32003;

/// Request ids the gateway uses for its own `tools/list` requests.
const OWN_ID_PREFIX: &str = "tally-gateway:tools/list:";

/// Which calls wait for a witness receipt before they are forwarded.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum StrictPolicy {
    /// None.
    #[default]
    Off,
    /// Every recorded call.
    All,
    /// Calls to these tools.
    Tools(BTreeSet<String>),
}

impl StrictPolicy {
    fn applies_to(&self, tool: &str) -> bool {
        match self {
            Self::Off => false,
            Self::All => true,
            Self::Tools(t) => t.contains(tool),
        }
    }
}

/// How the proxy records.
#[derive(Debug, Clone, Default)]
pub struct ProxyConfig {
    /// Which calls wait for a receipt.
    pub strict: StrictPolicy,
    /// When set, only tools whose name starts with this are recorded; the
    /// others appear in the tool list with `recorded: false` and their
    /// calls are forwarded without records.
    pub record_prefix: Option<String>,
    /// Keep call arguments and results in the local store (salts are always kept).
    pub store_content: bool,
    /// How long a `--strict` call waits for its receipt.
    pub strict_timeout: Duration,
}

impl ProxyConfig {
    fn records(&self, tool: &str) -> bool {
        self.record_prefix
            .as_deref()
            .is_none_or(|p| tool.starts_with(p))
    }
}

/// What the proxy records through.
#[derive(Clone)]
pub struct ProxyDeps {
    /// The chain writer.
    pub recorder: RecorderHandle,
    /// The store, to remember the last recorded tool list across runs.
    pub store: Option<Arc<ChainStore>>,
    /// Receipt progress of the sync task; `None` when no witness is configured.
    pub receipts: Option<watch::Receiver<SyncProgress>>,
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
        call_id: String,
        /// `None` for calls to tools that are not recorded.
        decision: Option<Box<Record>>,
        /// A `--strict` call not yet forwarded.
        held: bool,
    },
    List {
        paged: bool,
    },
}

#[derive(Default)]
struct State {
    pending: HashMap<String, Pending>,
    pages: Vec<Value>,
    own_list_id: Option<String>,
    own_list_counter: u64,
    last_fingerprint: Option<String>,
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
    config: ProxyConfig,
    deps: ProxyDeps,
    state: Mutex<State>,
    to_server: mpsc::UnboundedSender<ToServer>,
    to_client: mpsc::UnboundedSender<ToClient>,
}

/// The text of a request id as a decision's `call_id` (docs/protocol.md
/// §5.1): numbers and strings as written; anything that is not valid text
/// (empty, too long, control characters, another type) becomes
/// `sha256:<hex of its canonical JSON>`.
#[must_use]
pub fn call_id_text(id: &Value) -> String {
    let direct = match id {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    match direct {
        Some(s) if !s.is_empty() && s.len() <= 256 && !s.chars().any(char::is_control) => s,
        _ => format!(
            "sha256:{}",
            Hash::sha256(
                &canonical::canonicalize(id).unwrap_or_else(|_| id.to_string().into_bytes())
            )
        ),
    }
}

fn id_key(id: &Value) -> String {
    // serde_json writes ids the same way each time, and keeps 7 and "7" apart
    // as JSON-RPC does.
    id.to_string()
}

fn error_line(id: &Value, code: i64, reason: &str, message: &str) -> Vec<u8> {
    let mut line = serde_json::to_vec(&json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": code, "message": message, "data": {"tally": reason}},
    }))
    .unwrap_or_default();
    line.push(b'\n');
    line
}

/// A salt and the salted hash of `content`, and the secret to keep.
fn salted(content: &Value, keep: bool) -> Result<(Hash, Secret), canonical::CanonicalError> {
    let bytes = canonical::canonicalize(content)?;
    let mut salt = [0u8; SALT_LEN];
    OsRng.fill_bytes(&mut salt);
    Ok((
        salted_hash(&salt, &bytes),
        Secret {
            salt: hex::encode(salt),
            content: keep.then(|| content.clone()),
        },
    ))
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

    fn record_outcome(
        &self,
        decision: &Record,
        call_id: &str,
        status: OutcomeStatus,
        output: Option<&Value>,
    ) {
        let (output_hash, secret) = match output.map(|o| salted(o, self.config.store_content)) {
            Some(Ok((h, s))) => (Some(h), Some(s)),
            Some(Err(e)) => {
                eprintln!("tally: gateway: outcome of call {call_id} recorded without an output hash: {e}");
                (None, None)
            }
            None => (None, None),
        };
        let body = Body::Outcome(Outcome {
            call_id: call_id.to_owned(),
            decision: decision.hash(),
            status,
            output_hash,
        });
        if let Err(e) = self.deps.recorder.append_detached(body, secret) {
            eprintln!("tally: gateway: could not record the outcome of call {call_id}: {e}");
        }
    }

    // ---- client → server ----

    async fn on_client_line(self: &Arc<Self>, line: Vec<u8>) {
        let parsed: Option<Value> = serde_json::from_slice(&line).ok();
        match parsed {
            Some(Value::Object(ref m)) => {
                let method = m.get("method").and_then(Value::as_str);
                let id = m.get("id");
                match (method, id) {
                    (Some("tools/call"), Some(id)) => return self.call(id.clone(), line).await,
                    (Some("tools/list"), Some(id)) => {
                        let paged = m
                            .get("params")
                            .and_then(|p| p.get("cursor"))
                            .is_some_and(|c| !c.is_null());
                        self.lock()
                            .pending
                            .insert(id_key(id), Pending::List { paged });
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
                    // Recording a batch would tie several calls to one
                    // forward; MCP 2025-06-18 removed batches, so refuse.
                    for item in items {
                        if let (Some(id), Some(_)) = (item.get("id"), item.get("method")) {
                            self.reply(error_line(
                                id,
                                ERROR_NOT_FORWARDED,
                                "batch_not_supported",
                                "tally gateway: call not forwarded: JSON-RPC batches that contain tools/call are not supported",
                            ));
                        }
                    }
                    return;
                }
            }
            _ => {}
        }
        let _ = self.to_server.send(ToServer::Line(line));
    }

    fn refuse(&self, id: &Value, reason: &str, message: &str) {
        self.reply(error_line(
            id,
            ERROR_NOT_FORWARDED,
            reason,
            &format!("tally gateway: call not forwarded: {message}"),
        ));
    }

    async fn call(self: &Arc<Self>, id: Value, line: Vec<u8>) {
        let key = id_key(&id);
        let call_id = call_id_text(&id);
        {
            let st = self.lock();
            if st.server_gone {
                drop(st);
                return self.refuse(&id, "server_exited", "the MCP server has exited");
            }
            if st.client_closed {
                // Only reachable when writing to the client failed while its
                // input is still open: the server's input is closed already.
                drop(st);
                return self.refuse(&id, "client_gone", "the client went away");
            }
            if st.pending.contains_key(&key) {
                drop(st);
                return self.refuse(
                    &id,
                    "duplicate_request_id",
                    &format!("request id {key} is already in flight"),
                );
            }
        }
        // Parse again, strictly: a duplicate key or an inexact number would
        // let the server read other arguments than the ones recorded.
        let strict = match canonical::parse_strict(
            &line,
            Limits {
                max_bytes: usize::MAX,
                max_depth: 128,
            },
        ) {
            Ok(v) => v,
            Err(e) => {
                return self.refuse(
                    &id,
                    "not_strict_json",
                    &format!("the request is not strict JSON, so its recorded arguments could differ from what the server reads: {e}"),
                )
            }
        };
        let params = strict.get("params");
        let Some(tool) = params.and_then(|p| p.get("name")).and_then(Value::as_str) else {
            return self.refuse(
                &id,
                "decision_not_recorded",
                "tools/call without a string params.name cannot be recorded",
            );
        };
        let tool = tool.to_owned();
        if !self.config.records(&tool) {
            self.lock().pending.insert(
                key,
                Pending::Call {
                    id,
                    call_id,
                    decision: None,
                    held: false,
                },
            );
            let _ = self.to_server.send(ToServer::Line(line));
            return;
        }
        let empty = Value::Object(serde_json::Map::new());
        let arguments = params.and_then(|p| p.get("arguments")).unwrap_or(&empty);
        let (input_hash, secret) = match salted(arguments, self.config.store_content) {
            Ok(x) => x,
            Err(e) => {
                return self.refuse(
                    &id,
                    "decision_not_recorded",
                    &format!("the arguments cannot be canonicalised: {e}"),
                )
            }
        };
        let body = Body::Decision(Decision {
            call_id: call_id.clone(),
            tool: tool.clone(),
            input_hash,
        });
        let decision = match self.deps.recorder.append(body, Some(secret)).await {
            Ok(r) => r,
            Err(e) => {
                return self.refuse(
                    &id,
                    "decision_not_recorded",
                    &format!("the decision could not be recorded in the local chain: {e}"),
                )
            }
        };
        let strict = self.config.strict.applies_to(&tool);
        let seq = decision.seq.get();
        {
            let mut st = self.lock();
            if st.server_gone || st.client_closed {
                let (reason, message) = if st.server_gone {
                    ("server_exited", "the MCP server has exited")
                } else {
                    ("client_gone", "the client went away")
                };
                drop(st);
                self.record_outcome(&decision, &call_id, OutcomeStatus::NotRun, None);
                return self.refuse(&id, reason, message);
            }
            st.pending.insert(
                key.clone(),
                Pending::Call {
                    id: id.clone(),
                    call_id: call_id.clone(),
                    decision: Some(Box::new(decision.clone())),
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
        let Some(receipts) = self.deps.receipts.clone() else {
            self.lock().pending.remove(&key);
            self.record_outcome(&decision, &call_id, OutcomeStatus::NotRun, None);
            return self.refuse(
                &id,
                "strict_receipt",
                "--strict: missing receipt: no witness is configured for this agent (tally agent init NAME --witness URL)",
            );
        };
        let this = Arc::clone(self);
        let timeout = self.config.strict_timeout;
        tokio::spawn(async move {
            let result = wait_for_receipt(receipts, seq, timeout).await;
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
                    let why = match other {
                        Err(e) => e,
                        Ok(()) => "the client closed its input".into(),
                    };
                    this.record_outcome(&decision, &call_id, OutcomeStatus::NotRun, None);
                    this.refuse(&id, "strict_receipt", &format!("--strict: {why}"));
                }
            }
        });
    }

    fn cancelled(&self, request_id: &Value) {
        let removed = {
            let mut st = self.lock();
            match st.pending.get(&id_key(request_id)) {
                Some(Pending::Call { .. }) => st.pending.remove(&id_key(request_id)),
                _ => None,
            }
        };
        if let Some(Pending::Call {
            call_id,
            decision: Some(d),
            ..
        }) = removed
        {
            self.record_outcome(&d, &call_id, OutcomeStatus::Cancelled, None);
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
        if !own_answer {
            self.reply(line);
        }
        match parsed {
            Some(Value::Array(items)) => {
                for item in &items {
                    self.observe_server(item);
                }
            }
            Some(v) => self.observe_server(&v),
            None => {}
        }
    }

    fn observe_server(&self, msg: &Value) {
        let method = msg.get("method").and_then(Value::as_str);
        match (method, msg.get("id")) {
            (None, Some(id)) => self.answer(id, msg),
            (Some("notifications/tools/list_changed"), None) => self.list_tools(None),
            _ => {}
        }
    }

    /// Sends the gateway's own `tools/list` request (page `cursor`).
    fn list_tools(&self, cursor: Option<&Value>) {
        let mut st = self.lock();
        if st.server_gone || st.client_closed || (cursor.is_none() && st.own_list_id.is_some()) {
            return;
        }
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
        let mut line = serde_json::to_vec(&req).unwrap_or_default();
        line.push(b'\n');
        let _ = self.to_server.send(ToServer::Line(line));
    }

    fn answer(&self, id: &Value, msg: &Value) {
        let key = id_key(id);
        let Some(pending) = self.lock().pending.remove(&key) else {
            return;
        };
        match pending {
            Pending::Call {
                call_id,
                decision: Some(d),
                ..
            } => {
                let (status, output) = match (msg.get("error"), msg.get("result")) {
                    (Some(e), _) => (OutcomeStatus::Error, Some(e)),
                    (None, Some(r)) if r.get("isError").and_then(Value::as_bool) == Some(true) => {
                        (OutcomeStatus::Error, Some(r))
                    }
                    (None, Some(r)) => (OutcomeStatus::Ok, Some(r)),
                    (None, None) => (OutcomeStatus::Error, None),
                };
                self.record_outcome(&d, &call_id, status, output);
            }
            Pending::Call { decision: None, .. } => {}
            Pending::List { paged } => self.list_answer(&key, paged, msg),
        }
    }

    fn list_answer(&self, key: &str, paged: bool, msg: &Value) {
        let own = self.lock().own_list_id.as_deref() == Some(key);
        let Some(result) = msg.get("result") else {
            if own {
                self.lock().own_list_id = None;
            }
            return;
        };
        let tools = result
            .get("tools")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let next = result.get("nextCursor").filter(|c| !c.is_null());
        let complete = {
            let mut st = self.lock();
            if !paged {
                st.pages.clear();
            }
            st.pages.extend(tools);
            if own {
                st.own_list_id = None;
            }
            if next.is_some() {
                None
            } else {
                Some(std::mem::take(&mut st.pages))
            }
        };
        match complete {
            None if own => self.list_tools(next),
            None => {}
            Some(all) => self.record_tools(&all),
        }
    }

    fn record_tools(&self, tools: &[Value]) {
        let list = match digest_list(tools, |name| self.config.records(name)) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("tally: gateway: the tool list could not be recorded: {e}");
                return;
            }
        };
        {
            let mut st = self.lock();
            if st.last_fingerprint.as_deref() == Some(list.fingerprint.as_str()) {
                return;
            }
            st.last_fingerprint = Some(list.fingerprint.clone());
        }
        let bodies = match list.bodies() {
            Ok(b) => b,
            Err(e) => {
                eprintln!("tally: gateway: the tool list could not be recorded: {e}");
                return;
            }
        };
        let n = bodies.len();
        let mut last = None;
        for (i, body) in bodies.into_iter().enumerate() {
            if i + 1 == n {
                let recorder = self.deps.recorder.clone();
                last = Some(tokio::spawn(
                    async move { recorder.append(body, None).await },
                ));
            } else if let Err(e) = self.deps.recorder.append_detached(body, None) {
                eprintln!("tally: gateway: the tool list could not be recorded: {e}");
            }
        }
        // Remember the list once its last part is durable, so an unchanged
        // list is not recorded again on the next run.
        if let (Some(task), Some(store)) = (last, self.deps.store.clone()) {
            let fingerprint = list.fingerprint;
            tokio::spawn(async move {
                if let Ok(Ok(_)) = task.await {
                    let _ = store.set_tools_fingerprint(&fingerprint);
                }
            });
        }
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
            if let Pending::Call {
                id,
                call_id,
                decision,
                ..
            } = p
            {
                if let Some(d) = decision {
                    self.record_outcome(&d, &call_id, OutcomeStatus::NotRun, None);
                }
                self.refuse(
                    &id,
                    "client_gone",
                    &format!("the client {why} before the receipt arrived"),
                );
            }
        }
        self.deps.client_gone.notify_one();
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
            if let Pending::Call {
                id,
                call_id,
                decision,
                held,
            } = p
            {
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
                self.reply(error_line(&id, code, reason, message));
                if let Some(d) = decision {
                    self.record_outcome(&d, &call_id, status, None);
                }
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
    let last_fingerprint = deps
        .store
        .as_ref()
        .and_then(|s| s.tools_fingerprint().ok().flatten());
    let proxy = Arc::new(Proxy {
        config,
        deps,
        state: Mutex::new(State {
            last_fingerprint,
            ..State::default()
        }),
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
