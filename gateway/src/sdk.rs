//! The in-process recorder the language SDKs wrap (sdk/python,
//! sdk/typescript): one more writer of the agent's chain
//! ([`crate::chain`]), with a blocking API a binding can call from any
//! thread. It holds its own tokio runtime; every method blocks the calling
//! thread only, never a runtime thread, so a binding releases its
//! interpreter's lock around each call.
//!
//! What it records is what the gateway records for a `tools/call`
//! (docs/protocol.md §5): a `decision` before the function runs, durable in
//! the chain (journaled) before [`SdkAgent::decide`] returns, then an
//! `outcome` when it returns or raises. The salted hashes, the signing, the
//! chain, the journal, the sync and the receipt acceptance are the CLI's
//! own; a binding adds only its language's idioms.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand_core::{OsRng, RngCore as _};
use serde_json::Value;
use tally_schemas::canonical::parse_strict;
use tally_schemas::record::{Claim, Decision, NoteBody, Outcome, OutcomeStatus, ToolEntry};
use tally_schemas::time::SystemClock;
use tally_schemas::tools::{digest_tool_definition, TOOL_DEFINITION_LIMITS};
use tally_schemas::{AgentName, Body, Hash};

use crate::action::{self, proof_text};
pub use crate::action::{ActionTool, ProofPath};
use crate::chain::{AgentChain, ChainOptions, ChainStatus, DeclaredTools, Waited, WriterInfo};
use crate::recorder::AppendError;
use crate::state::StateDir;
use crate::store::Secret;
pub use tally_schemas::record::ActionState;

/// A tool check of one MCP client session (docs/protocol.md §5.7) that an
/// SDK's MCP client adapter runs: it lists the tools through
/// [`SdkAgent::check_tools`] and asks [`SdkAgent::admit_tool`] before each
/// call; the checks are recorded by the agent's chain like the gateway's.
#[derive(Debug)]
pub struct SdkToolCheck {
    enforcer: crate::toolcheck::Enforcer,
}

/// Why an SDK call failed; [`SdkError::code`] is stable.
#[derive(Debug, thiserror::Error)]
pub enum SdkError {
    /// The agent has no key or configuration in the state folder (the
    /// message names the folder and how it was chosen).
    #[error("{0}")]
    AgentNotFound(String),
    /// Arguments or a result that is not JSON tally can hash (not
    /// serialisable, a duplicate key, a number JSON cannot hold exactly).
    #[error("{0}")]
    BadContent(String),
    /// A name or text breaks the protocol's rules (docs/protocol.md §5).
    #[error("{0}")]
    Invalid(String),
    /// The record could not be written to the chain: the call must not run.
    #[error("the decision could not be recorded in the agent's chain: {0}")]
    NotRecorded(String),
    /// With `strict`: no accepted receipt for the decision.
    #[error("no accepted witness receipt: {0}")]
    NoReceipt(String),
    /// The agent was closed.
    #[error("the agent is closed")]
    Closed,
}

impl SdkError {
    /// A stable code: `agent_not_found`, `bad_content`, `invalid`,
    /// `not_recorded`, `no_receipt`, `closed`.
    #[must_use]
    pub const fn code(&self) -> &'static str {
        match self {
            Self::AgentNotFound(_) => "agent_not_found",
            Self::BadContent(_) => "bad_content",
            Self::Invalid(_) => "invalid",
            Self::NotRecorded(_) => "not_recorded",
            Self::NoReceipt(_) => "no_receipt",
            Self::Closed => "closed",
        }
    }
}

/// How an SDK agent is opened.
#[derive(Debug, Clone, Default)]
pub struct SdkOptions {
    /// The state folder; none: `TALLY_STATE_DIR`, else `.tally` in the
    /// current folder (as the CLI).
    pub state_dir: Option<PathBuf>,
    /// The tool source the program declares its tools under (docs/protocol.md
    /// §5.3); none: `sdk:<pid-independent program name>` chosen by the binding.
    pub source: Option<String>,
    /// How long a declaration holds, in milliseconds (none: the default).
    pub source_lease_ms: Option<u64>,
    /// Keep arguments and results in the local store (salts are always kept).
    pub store_content: bool,
    /// Put action tools' proofs in their outcomes in clear instead of
    /// salted-hashed (docs/protocol.md §5.2).
    pub proof_in_clear: bool,
    /// Answer a record only once it is committed with fsync.
    pub durable: bool,
    /// The binding's name for `tally status` (`sdk-python`, `sdk-node`).
    pub kind: Option<String>,
}

/// A tool as a program declares it.
#[derive(Debug, Clone)]
pub struct SdkTool {
    /// Its name.
    pub name: String,
    /// Whether calls to it are recorded (it is wrapped).
    pub recorded: bool,
    /// Its definition as an MCP tool definition would give it (at least
    /// `name`; `description`, `inputSchema`, … when known): the digests of
    /// docs/protocol.md §6.2 are taken over it.
    pub definition: Value,
}

/// Where an action call's proof comes from (docs/protocol.md §5.2).
#[derive(Debug, Clone)]
pub enum Proof {
    /// Read at this path of the result.
    Path(ProofPath),
    /// Given by the binding (its proof function's answer); `None`: no proof.
    Value(Option<Value>),
}

/// A decision recorded, until its outcome is.
#[derive(Debug, Clone)]
pub struct SdkCall {
    /// The call id.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// The decision's seq.
    pub seq: u64,
    /// The decision's record hash.
    pub decision: Hash,
}

/// How a sync ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SdkSync {
    /// Every record has an accepted receipt.
    pub complete: bool,
    /// Records in the chain.
    pub records: u64,
    /// Records without a receipt.
    pub pending: u64,
    /// Why not complete: `[code] message`.
    pub error: Option<String>,
}

/// One SDK writer of an agent's chain.
pub struct SdkAgent {
    rt: tokio::runtime::Runtime,
    chain: Mutex<Option<AgentChain>>,
    agent: AgentName,
    source: String,
    lease_ms: Option<u64>,
    store_content: bool,
    proof_in_clear: bool,
    has_witness: bool,
    written: Arc<tokio::sync::watch::Sender<Written>>,
}

/// What this writer has queued and had answered, for [`SdkAgent::sync`].
#[derive(Debug, Default, Clone, Copy)]
struct Written {
    /// Outcomes queued without an answer yet.
    queued: usize,
    /// The newest seq of a record this writer appended.
    newest: Option<u64>,
}

impl std::fmt::Debug for SdkAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SdkAgent")
            .field("agent", &self.agent)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

fn content(json: &[u8], what: &str) -> Result<Value, SdkError> {
    parse_strict(json, TOOL_DEFINITION_LIMITS)
        .map_err(|e| SdkError::BadContent(format!("{what} is not JSON tally can hash: {e}")))
}

/// The newest record's seq: the store's head, or a writer's last record
/// when it is journaled but not yet committed to the store.
fn newest(status: &ChainStatus) -> Option<u64> {
    let writers = status.writers.iter().filter_map(|w| w.last_seq).max();
    status.store.head.map(|(seq, _)| seq).max(writers)
}

fn appended(e: AppendError) -> SdkError {
    // From a member, the owner's refusal of an invalid record has the code.
    if e.code() == "invalid" {
        return SdkError::Invalid(e.to_string());
    }
    SdkError::NotRecorded(e.to_string())
}

impl SdkAgent {
    /// Opens `agent`'s chain as one more writer (the owner when no other
    /// writer holds it).
    ///
    /// # Errors
    /// [`SdkError::AgentNotFound`] naming where it looked;
    /// [`SdkError::NotRecorded`] when the chain can be neither opened nor
    /// reached.
    pub fn open(agent: &str, options: SdkOptions) -> Result<Self, SdkError> {
        let agent = AgentName::new(agent)
            .map_err(|e| SdkError::Invalid(format!("agent name {agent:?}: {e}")))?;
        let state = match &options.state_dir {
            Some(d) => StateDir::with_lookup(d, "given to the SDK"),
            None => match std::env::var_os("TALLY_STATE_DIR").filter(|v| !v.is_empty()) {
                Some(d) => StateDir::with_lookup(PathBuf::from(d), "from TALLY_STATE_DIR"),
                None => StateDir::with_lookup(
                    ".tally",
                    "the default, .tally in the current folder: TALLY_STATE_DIR is not set",
                ),
            },
        };
        let config = state
            .load_config(&agent)
            .and_then(|c| state.load_key(&agent).map(|_| c))
            .map_err(|e| SdkError::AgentNotFound(e.to_string()))?;
        let source = options.source.clone().unwrap_or_else(|| "sdk".into());
        crate::calls::check_tool_name(&source)
            .map_err(|why| SdkError::Invalid(format!("source {source:?}: {why}")))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("tally-sdk")
            .enable_all()
            .build()
            .map_err(|e| SdkError::NotRecorded(format!("cannot start a runtime: {e}")))?;
        let chain = rt
            .block_on(AgentChain::open(
                &state,
                &agent,
                Arc::new(SystemClock),
                ChainOptions {
                    me: WriterInfo {
                        kind: options.kind.clone().unwrap_or_else(|| "sdk".into()),
                        source: Some(source.clone()),
                    },
                    durable: options.durable,
                    final_sync: Duration::from_secs(3),
                    window: None,
                    keep_trying: false,
                },
            ))
            .map_err(|e| match e {
                crate::chain::ChainError::State(s) => SdkError::AgentNotFound(s.to_string()),
                e => SdkError::NotRecorded(e.to_string()),
            })?;
        Ok(Self {
            rt,
            chain: Mutex::new(Some(chain)),
            agent,
            source,
            lease_ms: options.source_lease_ms,
            store_content: options.store_content,
            proof_in_clear: options.proof_in_clear,
            has_witness: config.witness.is_some(),
            written: Arc::new(tokio::sync::watch::channel(Written::default()).0),
        })
    }

    fn chain(&self) -> Result<AgentChain, SdkError> {
        self.chain
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .ok_or(SdkError::Closed)
    }

    /// The agent's name.
    #[must_use]
    pub fn agent(&self) -> &str {
        self.agent.as_str()
    }

    /// The tool source this writer declares under.
    #[must_use]
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Records the decision to call `tool` with `arguments` (JSON), and
    /// returns once it is in the chain: only then may the call run.
    /// `call_id` defaults to 16 random hex digits.
    ///
    /// # Errors
    /// [`SdkError::BadContent`] for arguments that cannot be hashed,
    /// [`SdkError::Invalid`] for a bad tool name or call id,
    /// [`SdkError::NotRecorded`] when it could not be written.
    pub fn decide(
        &self,
        tool: &str,
        call_id: Option<&str>,
        arguments: &[u8],
    ) -> Result<SdkCall, SdkError> {
        let arguments = content(arguments, "the arguments")?;
        let (input_hash, secret) = Secret::for_content(&arguments, self.store_content, &mut OsRng)
            .map_err(|e| SdkError::BadContent(format!("the arguments: {e}")))?;
        let call_id = match call_id {
            Some(c) => c.to_owned(),
            None => {
                let mut b = [0u8; 8];
                OsRng.fill_bytes(&mut b);
                hex::encode(b)
            }
        };
        let body = Body::Decision(Decision {
            call_id: call_id.clone(),
            tool: tool.to_owned(),
            input_hash,
        });
        let chain = self.chain()?;
        let record = self
            .rt
            .block_on(chain.append(body, Some(secret)))
            .map_err(appended)?;
        self.wrote(record.seq.get());
        Ok(SdkCall {
            call_id,
            tool: tool.to_owned(),
            seq: record.seq.get(),
            decision: record.hash(),
        })
    }

    /// Waits up to `timeout` for the decision's witness receipt, accepted
    /// by the chain's syncer (docs/protocol.md §8): the SDKs' `strict`.
    ///
    /// # Errors
    /// [`SdkError::NoReceipt`] saying why there is none.
    pub fn wait_receipt(&self, call: &SdkCall, timeout: Duration) -> Result<(), SdkError> {
        let chain = self.chain()?;
        match self
            .rt
            .block_on(chain.wait_receipt(call.seq, timeout, false))
        {
            Waited::Receipted { .. } => Ok(()),
            Waited::NoWitness => Err(SdkError::NoReceipt(format!(
                "no witness is configured for agent {} (tally agent init {} --witness URL)",
                self.agent, self.agent
            ))),
            Waited::Halted { note } | Waited::Failed { note } => Err(SdkError::NoReceipt(format!(
                "[{}] {}",
                note.code, note.message
            ))),
            Waited::TimedOut { last } => Err(SdkError::NoReceipt(format!(
                "none within {} ms{}",
                timeout.as_millis(),
                last.map(|n| format!(" (last sync error: [{}] {})", n.code, n.message))
                    .unwrap_or_default()
            ))),
        }
    }

    /// Records how `call` ended: `status` is one of docs/protocol.md §5.2's
    /// (`ok`, `error`, …), `output` the result or error as JSON. Queued in
    /// order after the decision; does not wait.
    ///
    /// # Errors
    /// [`SdkError::Invalid`] for an unknown status, [`SdkError::BadContent`]
    /// for an output that cannot be hashed (the outcome is then recorded
    /// without an output hash, and the error says so),
    /// [`SdkError::NotRecorded`] when the chain is gone.
    pub fn outcome(
        &self,
        call: &SdkCall,
        status: &str,
        output: Option<&[u8]>,
    ) -> Result<(), SdkError> {
        self.outcome_of(call, status, output, None).map(|_| ())
    }

    /// Records how a call of an action tool ended (docs/protocol.md §5.2):
    /// as [`SdkAgent::outcome`], with the `state` resolved from `status`
    /// and the proof `proof` gives, kept in clear or salted-hashed as the
    /// agent was opened. Returns the state.
    ///
    /// # Errors
    /// As [`SdkAgent::outcome`].
    pub fn action_outcome(
        &self,
        call: &SdkCall,
        status: &str,
        output: Option<&[u8]>,
        proof: &Proof,
    ) -> Result<ActionState, SdkError> {
        self.outcome_of(call, status, output, Some(proof))
            .map(|s| s.unwrap_or(ActionState::Unknown))
    }

    fn outcome_of(
        &self,
        call: &SdkCall,
        status: &str,
        output: Option<&[u8]>,
        proof: Option<&Proof>,
    ) -> Result<Option<ActionState>, SdkError> {
        let status: OutcomeStatus = serde_json::from_value(Value::String(status.to_owned()))
            .map_err(|_| {
                SdkError::Invalid(format!(
                    "outcome status {status:?} is not one of ok, error, cancelled, server_exited, client_gone, timeout, http_error, not_run"
                ))
            })?;
        let mut unhashable = None;
        let mut parsed = None;
        let (output_hash, mut secret) = match output.map(|o| {
            content(o, "the result").and_then(|v| {
                let hashed = Secret::for_content(&v, self.store_content, &mut OsRng)
                    .map_err(|e| SdkError::BadContent(format!("the result: {e}")));
                parsed = Some(v);
                hashed
            })
        }) {
            Some(Ok((h, s))) => (Some(h), Some(s)),
            Some(Err(e)) => {
                unhashable = Some(e);
                (None, None)
            }
            None => (None, None),
        };
        let resolved = proof.map(|p| {
            let text = match p {
                Proof::Path(path) => parsed
                    .as_ref()
                    .and_then(|v| path.read(v))
                    .and_then(proof_text),
                Proof::Value(v) => v.as_ref().and_then(proof_text),
            };
            action::resolve(
                status,
                text,
                self.proof_in_clear,
                self.store_content,
                &mut OsRng,
            )
        });
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
            call_id: call.call_id.clone(),
            decision: call.decision,
            status,
            output_hash,
            state: resolved.as_ref().map(|r| r.state),
            proof: resolved.as_ref().and_then(|r| r.proof.clone()),
            proof_hash: resolved.as_ref().and_then(|r| r.proof_hash),
        });
        let queued = self
            .chain()?
            .append_queued(body, secret)
            .map_err(appended)?;
        self.written.send_modify(|w| w.queued += 1);
        let written = Arc::clone(&self.written);
        self.rt.spawn(async move {
            let result = queued.await;
            written.send_modify(|w| {
                w.queued -= 1;
                if let Ok(r) = &result {
                    w.newest = w.newest.max(Some(r.seq.get()));
                }
            });
            if let Err(e) = result {
                eprintln!("tally: could not record an outcome: {e}");
            }
        });
        match unhashable {
            Some(SdkError::BadContent(m)) => Err(SdkError::BadContent(format!(
                "{m}; the outcome was recorded without an output hash"
            ))),
            Some(e) => Err(e),
            None => Ok(resolved.map(|r| r.state)),
        }
    }

    /// Checks a model turn's text against the program's action tools
    /// (docs/protocol.md §5.6) and records a `claim` for each one the text
    /// claims was done and `called` does not name; returns (tool, seq) of
    /// each claim recorded, once they are in the chain. The turn's text is
    /// salted and hashed; the store keeps it only with `store_content`.
    ///
    /// # Errors
    /// [`SdkError::NotRecorded`] when a claim could not be written.
    pub fn claims(
        &self,
        text: &str,
        called: &[String],
        tools: &[ActionTool],
    ) -> Result<Vec<(String, u64)>, SdkError> {
        let found = action::claimed(text, called, tools);
        if found.is_empty() {
            return Ok(Vec::new());
        }
        let chain = self.chain()?;
        let mut out = Vec::with_capacity(found.len());
        for tool in found {
            let (turn_hash, secret) = Secret::for_content(
                &Value::String(text.to_owned()),
                self.store_content,
                &mut OsRng,
            )
            .map_err(|e| SdkError::BadContent(format!("the turn's text: {e}")))?;
            let body = Body::Claim(Claim {
                tool: tool.name.clone(),
                turn_hash,
            });
            let seq = self
                .rt
                .block_on(chain.append(body, Some(secret)))
                .map(|r| r.seq.get())
                .map_err(appended)?;
            self.wrote(seq);
            out.push((tool.name.clone(), seq));
        }
        Ok(out)
    }

    /// Records a note; returns its seq once it is in the chain.
    ///
    /// # Errors
    /// [`SdkError::Invalid`] for text the protocol refuses,
    /// [`SdkError::NotRecorded`] when it could not be written.
    pub fn note(&self, text: &str) -> Result<u64, SdkError> {
        let chain = self.chain()?;
        let seq = self
            .rt
            .block_on(chain.append(Body::Note(NoteBody { text: text.into() }), None))
            .map(|r| r.seq.get())
            .map_err(appended)?;
        self.wrote(seq);
        Ok(seq)
    }

    fn wrote(&self, seq: u64) {
        self.written
            .send_modify(|w| w.newest = w.newest.max(Some(seq)));
    }

    /// Declares the program's full tool list under its source (docs/protocol.md
    /// §5.3): recorded unless the same list was declared recently, and
    /// declared again every half lease while the agent is open.
    ///
    /// # Errors
    /// [`SdkError::Invalid`] for a definition without a name or two tools
    /// of one name; [`SdkError::NotRecorded`] when it could not be written
    /// (a name another source declares: `tool_name_conflict`).
    pub fn declare_tools(&self, tools: &[SdkTool]) -> Result<bool, SdkError> {
        let mut entries = Vec::with_capacity(tools.len());
        let mut seen = std::collections::BTreeSet::new();
        for t in tools {
            let (name, digest, parts) = digest_tool_definition(&t.definition)
                .map_err(|e| SdkError::Invalid(format!("tool {:?}: {e}", t.name)))?;
            crate::calls::check_tool_name(&name)
                .map_err(|why| SdkError::Invalid(format!("tool name {name:?}: {why}")))?;
            if !seen.insert(name.clone()) {
                return Err(SdkError::Invalid(format!(
                    "tool {name:?} is declared twice"
                )));
            }
            entries.push(ToolEntry {
                name,
                recorded: t.recorded,
                digest,
                parts,
            });
        }
        let declared = DeclaredTools {
            source: Some(self.source.clone()),
            lease_ms: self.lease_ms,
            entries,
        };
        let chain = self.chain()?;
        self.rt
            .block_on(chain.declare_tools(declared))
            .map_err(appended)
    }

    /// Loads an approved baseline and a policy for one MCP client session
    /// with `server` (its command or URL, as approved), runs the start
    /// check (identity, age, signature) and records it when anything
    /// differs (docs/protocol.md §5.7).
    ///
    /// # Errors
    /// [`SdkError::Invalid`] for a lockfile or policy that cannot be used
    /// (the message starts with `bad_lockfile` or `bad_policy`);
    /// [`SdkError::NotRecorded`] when the check could not be written.
    pub fn tool_check(
        &self,
        lock: &std::path::Path,
        policy: &std::path::Path,
        server: crate::toolcheck::ServerId,
    ) -> Result<SdkToolCheck, SdkError> {
        use tally_schemas::time::Clock as _;
        let guard = crate::toolcheck::ToolGuard::load(lock, policy)
            .map_err(|e| SdkError::Invalid(e.to_string()))?;
        let enforcer = crate::toolcheck::Enforcer::new(guard, Some(self.source.clone()), None);
        if let Some(body) = enforcer.start(&server, SystemClock.now()) {
            self.record_check(body)?;
        }
        Ok(SdkToolCheck { enforcer })
    }

    fn record_check(&self, body: tally_schemas::record::ToolCheck) -> Result<(), SdkError> {
        let chain = self.chain()?;
        let seq = self
            .rt
            .block_on(chain.append(Body::ToolCheck(body), None))
            .map(|r| r.seq.get())
            .map_err(appended)?;
        self.wrote(seq);
        Ok(())
    }

    /// Checks a complete tool list (`tools`: the JSON array of definitions,
    /// `None` when the server gave none) and records the check; `initialize`
    /// for the session's first. Returns the names of the tools the client
    /// must not see (paused, or all of them in a paused or denied session).
    ///
    /// # Errors
    /// [`SdkError::NotRecorded`] when the check could not be written.
    pub fn check_tools(
        &self,
        check: &SdkToolCheck,
        initialize: bool,
        tools: Option<&[u8]>,
    ) -> Result<Vec<String>, SdkError> {
        use tally_schemas::record::{CheckObservation, CheckTrigger};
        use tally_schemas::time::Clock as _;
        let now = SystemClock.now();
        let defs: Result<Vec<Value>, CheckObservation> = match tools {
            Some(bytes) => {
                serde_json::from_slice(bytes).map_err(|_| CheckObservation::ListMalformed)
            }
            None => Err(CheckObservation::ServerUnavailable),
        };
        let trigger = if initialize {
            CheckTrigger::Initialize
        } else {
            CheckTrigger::ToolsList
        };
        let body = check
            .enforcer
            .list(trigger, defs.as_deref().map_err(|o| *o), now);
        self.record_check(body)?;
        let names: Vec<String> = defs
            .unwrap_or_default()
            .iter()
            .filter_map(|d| {
                let mut page = serde_json::json!({"result": {"tools": [d]}});
                check
                    .enforcer
                    .filter_page(&mut page, now)
                    .then(|| d.get("name").and_then(Value::as_str).map(str::to_owned))
                    .flatten()
            })
            .collect();
        Ok(names)
    }

    /// Compares the server's `initialize` result (`result`: its JSON) with
    /// the baseline's `serverInfo` (docs/protocol.md §5.7): the findings
    /// hold for the session and are repeated in its later checks; a denied
    /// session is recorded at once. Returns whether the session is denied.
    ///
    /// # Errors
    /// [`SdkError::NotRecorded`] when the check could not be written.
    pub fn server_info(&self, check: &SdkToolCheck, result: &[u8]) -> Result<bool, SdkError> {
        use tally_schemas::time::Clock as _;
        let result: Value = serde_json::from_slice(result).unwrap_or(Value::Null);
        if let Some(body) = check.enforcer.initialized(&result, SystemClock.now()) {
            self.record_check(body)?;
        }
        Ok(check.enforcer.denied().is_some())
    }

    /// Marks the session's check stale (the server sent
    /// `notifications/tools/list_changed`): [`Self::admit_tool`] answers
    /// `tool_check_pending` until the tools are checked again.
    pub fn tools_changed(&self, check: &SdkToolCheck) {
        check.enforcer.list_changed();
    }

    /// Whether a call to `tool` may go on: `None`, or why not as a stable
    /// reason (`tool_paused`, `session_paused`, `session_denied`,
    /// `tool_check_pending`: list the tools first) and a message.
    #[must_use]
    pub fn admit_tool(&self, check: &SdkToolCheck, tool: &str) -> Option<(String, String)> {
        use crate::toolcheck::Admission;
        match check.enforcer.admit(tool) {
            Admission::Forward => None,
            Admission::Wait => Some((
                "tool_check_pending".into(),
                "the tools have not been checked since they may have changed: list them first"
                    .into(),
            )),
            Admission::Refuse(r) => Some((r.reason.to_owned(), r.message)),
        }
    }

    /// Waits up to `timeout` for every record so far to be receipted:
    /// those in the journal but not yet committed too, and outcomes queued
    /// before the call.
    ///
    /// # Errors
    /// [`SdkError::Closed`].
    pub fn sync(&self, timeout: Duration) -> Result<SdkSync, SdkError> {
        let chain = self.chain()?;
        let deadline = tokio::time::Instant::now() + timeout;
        self.rt.block_on(async {
            // Outcomes this writer queued before the call are answered first.
            let mut written = self.written.subscribe();
            let _ = tokio::time::timeout_at(deadline, written.wait_for(|w| w.queued == 0)).await;
            let mine = written.borrow().newest;
            let mut error = None;
            let mut head = newest(&chain.status().await.map_err(SdkError::NotRecorded)?).max(mine);
            if !self.has_witness {
                error = Some(format!(
                    "[no_witness] no witness is configured for agent {}",
                    self.agent
                ));
            }
            // A record queued before this call may be journaled while we
            // wait: wait again until the newest record is the one waited for.
            while let (true, Some(seq)) = (error.is_none(), head) {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                error = match chain.wait_receipt(seq, left, false).await {
                    Waited::Receipted { .. } => None,
                    Waited::NoWitness => Some("[no_witness] no witness is configured".into()),
                    Waited::Halted { note } | Waited::Failed { note } => {
                        Some(format!("[{}] {}", note.code, note.message))
                    }
                    Waited::TimedOut { last } => Some(match last {
                        Some(n) => format!("[{}] {}", n.code, n.message),
                        None => format!("[timeout] no receipt within {} ms", timeout.as_millis()),
                    }),
                };
                let now = newest(&chain.status().await.map_err(SdkError::NotRecorded)?).max(mine);
                if now == head {
                    break;
                }
                head = now;
            }
            let after = chain.status().await.map_err(SdkError::NotRecorded)?;
            let records = head.map_or(0, |h| h + 1).max(after.store.records);
            Ok(SdkSync {
                complete: error.is_none(),
                records,
                pending: records.saturating_sub(after.store.sync_cursor),
                error,
            })
        })
    }

    /// The chain's status, from its owner.
    ///
    /// # Errors
    /// [`SdkError::NotRecorded`] when the owner cannot say.
    pub fn status(&self) -> Result<ChainStatus, SdkError> {
        let chain = self.chain()?;
        self.rt
            .block_on(chain.status())
            .map_err(SdkError::NotRecorded)
    }

    /// Closes this writer: its queued records are answered (an owner
    /// commits them, tries one last sync and hands the chain on). Later
    /// calls fail with [`SdkError::Closed`]. Safe to call twice.
    pub fn close(&self) {
        let chain = self
            .chain
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(c) = chain {
            self.rt.block_on(c.close());
        }
    }
}

impl Drop for SdkAgent {
    fn drop(&mut self) {
        self.close();
    }
}
