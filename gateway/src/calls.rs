//! The recording core shared by the gateway's transports (docs/protocol.md
//! §5): what is recorded for a `tools/call` and a `tools/list`, whatever
//! carries them. The stdio proxy ([`crate::proxy`]) and the Streamable HTTP
//! proxy ([`crate::http`]) decide *which* message answers which call; this
//! module decides *what* is written:
//!
//! - [`CallRecorder::decide`]: the request is parsed again strictly, and a
//!   `decision` (§5.1) is committed before the caller may forward it; a
//!   [`Refusal`] says why a call must not be forwarded (fail closed);
//! - [`CallRecorder::wait_receipt`]: with `--strict`, the decision's
//!   receipt, accepted (§8), before forwarding;
//! - [`CallRecorder::end`] and [`CallRecorder::end_with_answer`]: the
//!   `outcome` (§5.2) once, when the call ends;
//! - [`CallRecorder::record_tools`]: a `tools` list (§5.3) with per-part
//!   definition digests whenever it differs from the last one recorded;
//!   [`ToolPages`] joins the pages of a paged answer.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use rand_core::OsRng;
use serde_json::Value;
use tally_schemas::canonical::{self, Limits};
use tally_schemas::record::{Decision, Outcome, OutcomeStatus};
use tally_schemas::{Body, Hash, Record};

use crate::action::{self, proof_text, ProofPath};
use crate::chain::{AgentChain, Waited};
pub use crate::refusal::{
    error_answer, Refusal, ERROR_CLIENT_GONE, ERROR_NOT_FORWARDED, ERROR_SERVER_EXITED,
    ERROR_UPSTREAM,
};
use crate::store::Secret;
pub use crate::toollist::check_tool_name;
use crate::toollist::digest_list_as;

/// Most pages the gateway reads when it lists the tools itself.
pub const MAX_LIST_PAGES: usize = 256;

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

/// How the gateway records, on any transport.
#[derive(Debug, Clone, Default)]
pub struct ProxyConfig {
    /// Which calls wait for a receipt.
    pub strict: StrictPolicy,
    /// Put before every tool name this gateway records (decisions and the
    /// tool list), so two servers' tools of one name stay apart.
    pub name_prefix: Option<String>,
    /// When set, only tools whose (server's) name starts with this are
    /// recorded; the others appear in the tool list with `recorded: false`
    /// and their calls are forwarded without records.
    pub record_only_prefix: Option<String>,
    /// The tool source this gateway declares its list under
    /// (docs/protocol.md §5.3); none: the agent's unnamed source.
    pub source: Option<String>,
    /// How long a declaration of the source holds, in milliseconds (none:
    /// the protocol's default); the list is declared again within half of it.
    pub source_lease_ms: Option<u64>,
    /// Keep call arguments and results in the local store (salts are always kept).
    pub store_content: bool,
    /// How long a `--strict` call waits for its receipt.
    pub strict_timeout: Duration,
    /// The approved tool baseline and policy this session enforces
    /// (docs/protocol.md §5.7); none: tools are recorded, not checked.
    pub tool_check: Option<std::sync::Arc<crate::toolcheck::Enforcer>>,
    /// The action tools (docs/protocol.md §5.2) and where their proofs are.
    pub actions: ActionConfig,
}

/// The gateway's action tools (docs/protocol.md §5.2): their outcomes carry
/// a `state`, and the proof read from the result's `structuredContent`.
#[derive(Debug, Clone, Default)]
pub struct ActionConfig {
    /// By the server's tool name: the path of the proof in the structured
    /// result, or `None` for an action without a proof to read (its calls
    /// are `unknown` or `failed`).
    pub tools: BTreeMap<String, Option<ProofPath>>,
    /// Put proofs in outcomes in clear instead of salted-hashed.
    pub proof_in_clear: bool,
}

impl ProxyConfig {
    /// Whether calls to `tool` are recorded.
    #[must_use]
    pub fn records(&self, tool: &str) -> bool {
        self.record_only_prefix
            .as_deref()
            .is_none_or(|p| tool.starts_with(p))
    }

    /// The name a call to the server's tool `tool` is recorded under.
    #[must_use]
    pub fn recorded_name(&self, tool: &str) -> String {
        match &self.name_prefix {
            Some(p) => format!("{p}{tool}"),
            None => tool.to_owned(),
        }
    }
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

/// How an answer to a call ends it: `error` for a JSON-RPC error or a
/// result with `isError: true`, else `ok`; with what is hashed as its output.
#[must_use]
pub fn answer_status(msg: &Value) -> (OutcomeStatus, Option<&Value>) {
    match (msg.get("error"), msg.get("result")) {
        (Some(e), _) => (OutcomeStatus::Error, Some(e)),
        (None, Some(r)) if r.get("isError").and_then(Value::as_bool) == Some(true) => {
            (OutcomeStatus::Error, Some(r))
        }
        (None, Some(r)) => (OutcomeStatus::Ok, Some(r)),
        (None, None) => (OutcomeStatus::Error, None),
    }
}

/// A `tools/call` whose decision has been recorded (or whose tool is not
/// recorded), until its outcome is.
#[derive(Debug, Clone)]
pub struct OpenCall {
    /// The decision's `call_id`.
    pub call_id: String,
    /// The tool called.
    pub tool: String,
    /// The decision; `None` for calls to tools that are not recorded.
    pub decision: Option<Box<Record>>,
    /// Whether the call waits for its decision's receipt before it is forwarded.
    pub strict: bool,
}

impl OpenCall {
    /// The decision's log sequence number, for [`CallRecorder::wait_receipt`].
    fn seq(&self) -> Option<u64> {
        self.decision.as_ref().map(|d| d.seq.get())
    }
}

/// The recording core: one per gateway, shared by every connection and
/// session of it (they all write the agent's one chain).
pub struct CallRecorder {
    config: ProxyConfig,
    chain: AgentChain,
    /// Fingerprint of the last tool list declared (or being declared).
    last_fingerprint: Mutex<Option<String>>,
}

impl std::fmt::Debug for CallRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallRecorder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl CallRecorder {
    /// A core writing through `chain`.
    #[must_use]
    pub fn new(config: ProxyConfig, chain: AgentChain) -> Self {
        Self {
            config,
            chain,
            last_fingerprint: Mutex::new(None),
        }
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &ProxyConfig {
        &self.config
    }

    /// Records the decision for the `tools/call` request `message` (its raw
    /// bytes) with request id `id`, before it may be forwarded.
    ///
    /// # Errors
    /// A [`Refusal`] when the call must not be forwarded: the request is not
    /// strict JSON (the server could read other arguments than the ones
    /// recorded), has no tool name, or its decision could not be recorded.
    pub async fn decide(&self, id: &Value, message: &[u8]) -> Result<OpenCall, Refusal> {
        let call_id = call_id_text(id);
        // Parse again, strictly: a duplicate key or an inexact number would
        // let the server read other arguments than the ones recorded.
        let strict = canonical::parse_strict(
            message,
            Limits {
                max_bytes: usize::MAX,
                max_depth: 128,
            },
        )
        .map_err(|e| {
            Refusal::new(
                "not_strict_json",
                format!("the request is not strict JSON, so its recorded arguments could differ from what the server reads: {e}"),
            )
        })?;
        let params = strict.get("params");
        let Some(tool) = params.and_then(|p| p.get("name")).and_then(Value::as_str) else {
            return Err(Refusal::new(
                "decision_not_recorded",
                "tools/call without a string params.name cannot be recorded",
            ));
        };
        let server_tool = tool;
        let tool = self.config.recorded_name(server_tool);
        if !self.config.records(server_tool) {
            return Ok(OpenCall {
                call_id,
                tool,
                decision: None,
                strict: false,
            });
        }
        let empty = Value::Object(serde_json::Map::new());
        let arguments = params.and_then(|p| p.get("arguments")).unwrap_or(&empty);
        let (input_hash, secret) =
            Secret::for_content(arguments, self.config.store_content, &mut OsRng).map_err(|e| {
                Refusal::new(
                    "decision_not_recorded",
                    format!("the arguments cannot be canonicalised: {e}"),
                )
            })?;
        let body = Body::Decision(Decision {
            call_id: call_id.clone(),
            tool: tool.clone(),
            input_hash,
        });
        let decision = self.chain.append(body, Some(secret)).await.map_err(|e| {
            Refusal::new(
                "decision_not_recorded",
                format!("the decision could not be recorded in the local chain: {e}"),
            )
        })?;
        Ok(OpenCall {
            strict: self.config.strict.applies_to(&tool),
            call_id,
            tool,
            decision: Some(Box::new(decision)),
        })
    }

    /// Waits for the receipt of `call`'s decision and its acceptance (§8),
    /// at most the configured strict timeout.
    ///
    /// # Errors
    /// Why the call must not be forwarded, as a [`Refusal`] with reason
    /// `strict_receipt` (no witness configured, timeout, receipt refused).
    pub async fn wait_receipt(&self, call: &OpenCall) -> Result<(), Refusal> {
        let Some(seq) = call.seq() else {
            return Ok(());
        };
        let why = match self
            .chain
            .wait_receipt(seq, self.config.strict_timeout, false)
            .await
        {
            Waited::Receipted { .. } => return Ok(()),
            Waited::NoWitness => "missing receipt: no witness is configured for this agent (tally agent init NAME --witness URL)".to_owned(),
            Waited::Halted { note } | Waited::Failed { note } => {
                format!("no valid receipt: {}", note.message)
            }
            Waited::TimedOut { last } => format!(
                "missing receipt: none within {} ms{}",
                self.config.strict_timeout.as_millis(),
                last.map(|f| format!(" (last sync error: {})", f.message))
                    .unwrap_or_default()
            ),
        };
        Err(Refusal::new("strict_receipt", format!("--strict: {why}")))
    }

    /// Records how `call` ended (nothing for calls that are not recorded).
    /// The outcome is queued to the chain writer, which commits in order.
    pub fn end(&self, call: &OpenCall, status: OutcomeStatus, output: Option<&Value>) {
        let Some(decision) = &call.decision else {
            return;
        };
        let call_id = &call.call_id;
        let (output_hash, secret) = match output
            .map(|o| Secret::for_content(o, self.config.store_content, &mut OsRng))
        {
            Some(Ok((h, s))) => (Some(h), Some(s)),
            Some(Err(e)) => {
                eprintln!("tally: gateway: outcome of call {call_id} recorded without an output hash: {e}");
                (None, None)
            }
            None => (None, None),
        };
        let resolved = self.config.actions.tools.get(&call.tool).map(|path| {
            let proof = path
                .as_ref()
                .zip(output.and_then(|o| o.get("structuredContent")))
                .and_then(|(p, structured)| p.read(structured))
                .and_then(proof_text);
            action::resolve(
                status,
                proof,
                self.config.actions.proof_in_clear,
                self.config.store_content,
                &mut OsRng,
            )
        });
        let mut secret = secret;
        if let Some(proof_secret) = resolved.as_ref().and_then(|r| r.secret.clone()) {
            let mut s = secret.unwrap_or_else(|| Secret {
                salt: String::new(),
                content: None,
                proof: None,
            });
            s.proof = Some(Box::new(proof_secret));
            secret = Some(s);
        }
        let body = Body::Outcome(Outcome {
            call_id: call_id.clone(),
            decision: decision.hash(),
            status,
            output_hash,
            state: resolved.as_ref().map(|r| r.state),
            proof: resolved.as_ref().and_then(|r| r.proof.clone()),
            proof_hash: resolved.as_ref().and_then(|r| r.proof_hash),
        });
        if let Err(e) = self.chain.append_detached(body, secret) {
            eprintln!("tally: gateway: could not record the outcome of call {call_id}: {e}");
        }
    }

    /// Records the outcome of `call` from the JSON-RPC answer `msg`.
    pub fn end_with_answer(&self, call: &OpenCall, msg: &Value) {
        let (status, output) = answer_status(msg);
        self.end(call, status, output);
    }

    /// Declares `tools` (a complete list, every page joined) as this
    /// gateway's source, unless it is the list declared last; the owner of
    /// the chain records it unless the same list of the source was recorded
    /// recently, and it is declared again before its lease ends.
    pub fn record_tools(&self, tools: &[Value]) {
        let prefix = self.config.name_prefix.as_deref().unwrap_or("");
        let list = match digest_list_as(tools, prefix, |name| self.config.records(name)) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("tally: gateway: the tool list could not be recorded: {e}");
                return;
            }
        };
        {
            let mut last = self
                .last_fingerprint
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if last.as_deref() == Some(list.fingerprint.as_str()) {
                return;
            }
            *last = Some(list.fingerprint.clone());
        }
        let declared = list.declared(self.config.source.clone(), self.config.source_lease_ms);
        // Queued now, so the list precedes in the chain any call that
        // follows its answer.
        let done = self.chain.declare_tools_queued(declared);
        tokio::spawn(async move {
            if let Err(e) = done.await {
                eprintln!("tally: gateway: the tool list could not be recorded: {e}");
            }
        });
    }
}

impl CallRecorder {
    /// Queues a `tool_check` record now (so it precedes in the chain every
    /// call that follows the check), through the agent's one chain writer.
    pub fn record_check(&self, check: tally_schemas::record::ToolCheck) {
        match self.chain.append_queued(Body::ToolCheck(check), None) {
            Ok(done) => {
                tokio::spawn(async move {
                    if let Err(e) = done.await {
                        eprintln!("tally: gateway: the tool check could not be recorded: {e}");
                    }
                });
            }
            Err(e) => eprintln!("tally: gateway: the tool check could not be recorded: {e}"),
        }
    }
}

/// The pages of a `tools/list` answer being joined.
#[derive(Debug, Default)]
pub struct ToolPages {
    pages: Vec<Value>,
}

/// What one page of a `tools/list` answer completes.
#[derive(Debug, PartialEq)]
pub enum PageResult {
    /// The list is complete: every tool of every page.
    Complete(Vec<Value>),
    /// More pages follow; the cursor of the next one.
    More(Value),
    /// The answer is an error or has no result: nothing to record.
    NoList,
}

impl ToolPages {
    /// Adds the answer `msg` to a `tools/list` request (`paged`: the request
    /// had a cursor, so this page continues the ones before it).
    pub fn add(&mut self, paged: bool, msg: &Value) -> PageResult {
        let Some(result) = msg.get("result") else {
            return PageResult::NoList;
        };
        if !paged {
            self.pages.clear();
        }
        let tools = result
            .get("tools")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        self.pages.extend(tools);
        match result.get("nextCursor").filter(|c| !c.is_null()) {
            Some(next) => PageResult::More(next.clone()),
            None => PageResult::Complete(std::mem::take(&mut self.pages)),
        }
    }
}

/// Whether a `tools/list` request continues a paged list (has a cursor).
#[must_use]
pub fn is_paged_list_request(msg: &Value) -> bool {
    msg.get("params")
        .and_then(|p| p.get("cursor"))
        .is_some_and(|c| !c.is_null())
}
