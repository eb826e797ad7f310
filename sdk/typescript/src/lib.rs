//! tally-agent's native addon: a napi-rs skin over tally-gateway's
//! [`SdkAgent`] (gateway/src/sdk.rs), the writer of the agent's chain the
//! CLI's gateways and `tally record` share (docs/architecture.md "Several
//! writers, one chain"). The canonical JSON, the hashing, the signing, the
//! chain and the sync are the core's; this file only carries calls across
//! the N-API boundary and the JS loader (`index.js`) adds the idioms.
//!
//! Every method that can block (waiting for the chain's owner, a receipt,
//! a sync) runs as an [`AsyncTask`] on libuv's thread pool, so it never
//! blocks the event loop; `decideSync`, `outcome` and `close` run inline
//! (`outcome` only queues; `decideSync` is measured in docs/benchmarks.md
//! "TypeScript SDK"). An error crosses as a JS `Error` whose message starts
//! with `[code]`, the core's stable [`SdkError::code`]; a panic in the core
//! is caught and crosses as `[panic]`, never unwinding into Node.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use napi::bindgen_prelude::{AsyncTask, ToNapiValue, TypeName};
use napi::{Env, Status, Task};
use napi_derive::napi;
use tally_gateway::sdk::{
    ActionTool, Proof, ProofPath, SdkAgent, SdkCall, SdkError, SdkOptions, SdkTool, SdkToolCheck,
};
use tally_gateway::toolcheck::ServerId;

fn js_error(e: &SdkError) -> napi::Error {
    napi::Error::new(Status::GenericFailure, format!("[{}] {e}", e.code()))
}

/// Runs `work`, turning a panic into an error instead of unwinding across
/// the FFI boundary.
fn guarded<T>(work: impl FnOnce() -> Result<T, SdkError>) -> napi::Result<T> {
    match catch_unwind(AssertUnwindSafe(work)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(js_error(&e)),
        Err(p) => {
            let why = p
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown".into());
            Err(napi::Error::new(
                Status::GenericFailure,
                format!("[panic] the tally core failed: {why}"),
            ))
        }
    }
}

/// Blocking work on libuv's thread pool, resolved to a JS value.
pub struct Blocking<T: Send + 'static, J> {
    work: Option<Box<dyn FnOnce() -> Result<T, SdkError> + Send>>,
    to_js: fn(T) -> J,
}

fn blocking<T: Send + 'static, J>(
    work: impl FnOnce() -> Result<T, SdkError> + Send + 'static,
    to_js: fn(T) -> J,
) -> AsyncTask<Blocking<T, J>>
where
    Blocking<T, J>: Task,
{
    AsyncTask::new(Blocking {
        work: Some(Box::new(work)),
        to_js,
    })
}

impl<T: Send + 'static, J: ToNapiValue + TypeName> Task for Blocking<T, J> {
    type Output = T;
    type JsValue = J;

    fn compute(&mut self) -> napi::Result<T> {
        match self.work.take() {
            Some(work) => guarded(work),
            None => Err(napi::Error::new(
                Status::GenericFailure,
                "[panic] a task ran twice".to_owned(),
            )),
        }
    }

    fn resolve(&mut self, _env: Env, output: T) -> napi::Result<J> {
        Ok((self.to_js)(output))
    }
}

/// How an agent is opened (`new Agent(name, options)`).
#[napi(object)]
pub struct AgentOptions {
    /// The state folder; none: `TALLY_STATE_DIR`, else `./.tally`.
    pub state_dir: Option<String>,
    /// The tool source the program declares its tools under.
    pub source: Option<String>,
    /// How long a declaration holds, in milliseconds.
    pub source_lease_ms: Option<u32>,
    /// Keep arguments and results in the local store.
    pub store_content: Option<bool>,
    /// Put action proofs in outcomes in clear, not salted-hashed.
    pub proof_in_clear: Option<bool>,
    /// Answer a record only once it is committed with fsync.
    pub durable: Option<bool>,
}

/// A tool as the program declares it; `definition` is its JSON.
#[napi(object)]
pub struct ToolDeclaration {
    /// Its name.
    pub name: String,
    /// Whether its calls are recorded.
    pub recorded: bool,
    /// Its MCP-style definition, as JSON text.
    pub definition: String,
}

/// An action tool for the claim check: its name and declared phrases.
#[napi(object)]
pub struct ActionDeclaration {
    /// Its name.
    pub name: String,
    /// Phrases that claim it was done.
    pub phrases: Vec<String>,
}

/// How a sync ended.
#[napi(object)]
pub struct SyncResult {
    /// Every record has an accepted receipt.
    pub complete: bool,
    /// Records in the chain.
    pub records: f64,
    /// Records without a receipt.
    pub pending: f64,
    /// Why not complete: `[code] message`.
    pub error: Option<String>,
}

/// A recorded decision, until its outcome is.
#[napi]
pub struct NativeCall {
    call: SdkCall,
}

#[napi]
impl NativeCall {
    /// The call id.
    #[napi(getter)]
    pub fn call_id(&self) -> String {
        self.call.call_id.clone()
    }

    /// The tool.
    #[napi(getter)]
    pub fn tool(&self) -> String {
        self.call.tool.clone()
    }

    /// The decision's seq in the chain.
    #[napi(getter)]
    pub fn seq(&self) -> f64 {
        // Seqs stay far below 2^53.
        self.call.seq as f64
    }

    /// The decision's record hash, hex.
    #[napi(getter)]
    pub fn decision(&self) -> String {
        self.call.decision.to_hex()
    }
}

/// A tool check of one MCP client session (docs/protocol.md §5.7).
#[napi]
pub struct NativeToolCheck {
    inner: Arc<SdkToolCheck>,
}

fn to_call(call: SdkCall) -> NativeCall {
    NativeCall { call }
}

fn to_f64(n: u64) -> f64 {
    n as f64
}

fn unit(_: ()) {}

/// One writer of an agent's chain.
#[napi]
pub struct NativeAgent {
    inner: Arc<SdkAgent>,
}

#[napi]
impl NativeAgent {
    /// Opens `agent` (blocking: the chain store or its owner's socket).
    #[napi(constructor)]
    pub fn new(agent: String, options: Option<AgentOptions>) -> napi::Result<Self> {
        let o = options.unwrap_or(AgentOptions {
            state_dir: None,
            source: None,
            source_lease_ms: None,
            store_content: None,
            proof_in_clear: None,
            durable: None,
        });
        let options = SdkOptions {
            state_dir: o.state_dir.map(PathBuf::from),
            source: o.source,
            source_lease_ms: o.source_lease_ms.map(u64::from),
            store_content: o.store_content.unwrap_or(false),
            proof_in_clear: o.proof_in_clear.unwrap_or(false),
            durable: o.durable.unwrap_or(false),
            kind: Some("sdk-node".into()),
        };
        let inner = guarded(|| SdkAgent::open(&agent, options))?;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// The agent's name.
    #[napi(getter)]
    pub fn agent(&self) -> String {
        self.inner.agent().to_owned()
    }

    /// The tool source this writer declares under.
    #[napi(getter)]
    pub fn source(&self) -> String {
        self.inner.source().to_owned()
    }

    /// Records a decision; resolves once it is in the chain.
    #[napi(ts_return_type = "Promise<NativeCall>")]
    pub fn decide(
        &self,
        tool: String,
        call_id: Option<String>,
        arguments: String,
    ) -> AsyncTask<Blocking<SdkCall, NativeCall>> {
        let a = Arc::clone(&self.inner);
        blocking(
            move || a.decide(&tool, call_id.as_deref(), arguments.as_bytes()),
            to_call,
        )
    }

    /// Loads a lockfile and policy for an MCP client session with the
    /// server `command` (its argv) or `url`; records the start check when
    /// anything differs (docs/protocol.md §5.7).
    #[napi]
    pub fn tool_check(
        &self,
        lock: String,
        policy: String,
        command: Option<Vec<String>>,
        url: Option<String>,
    ) -> napi::Result<NativeToolCheck> {
        let server = match (command, url) {
            (Some(c), None) => ServerId::Command(c),
            (None, Some(u)) => ServerId::Url(u),
            _ => {
                return Err(js_error(&SdkError::Invalid(
                    "give the server's command or its url, one of them".into(),
                )))
            }
        };
        guarded(|| {
            self.inner
                .tool_check(&PathBuf::from(&lock), &PathBuf::from(&policy), server)
        })
        .map(|c| NativeToolCheck { inner: Arc::new(c) })
    }

    /// Checks a complete tool list (JSON array of definitions; none when
    /// the server gave none), records the check, returns the names the
    /// client must not see.
    #[napi]
    pub fn check_tools_sync(
        &self,
        check: &NativeToolCheck,
        initialize: bool,
        tools: Option<String>,
    ) -> napi::Result<Vec<String>> {
        guarded(|| {
            self.inner.check_tools(
                &check.inner,
                initialize,
                tools.as_deref().map(str::as_bytes),
            )
        })
    }

    /// The server's `initialize` result (JSON) against the approved
    /// `serverInfo`; returns whether the session is denied.
    #[napi]
    pub fn server_info_sync(&self, check: &NativeToolCheck, result: String) -> napi::Result<bool> {
        guarded(|| self.inner.server_info(&check.inner, result.as_bytes()))
    }

    /// The server's tools may have changed: calls wait for a new check.
    #[napi]
    pub fn tools_changed(&self, check: &NativeToolCheck) {
        self.inner.tools_changed(&check.inner);
    }

    /// `null` when a call to `tool` may go on, else `[reason, message]`.
    #[napi]
    pub fn admit_tool(&self, check: &NativeToolCheck, tool: String) -> Option<Vec<String>> {
        self.inner
            .admit_tool(&check.inner, &tool)
            .map(|(r, m)| vec![r, m])
    }

    /// Records a decision on the calling thread.
    #[napi]
    pub fn decide_sync(
        &self,
        tool: String,
        call_id: Option<String>,
        arguments: String,
    ) -> napi::Result<NativeCall> {
        guarded(|| {
            self.inner
                .decide(&tool, call_id.as_deref(), arguments.as_bytes())
        })
        .map(to_call)
    }

    /// Waits up to `timeout_ms` for the decision's accepted receipt.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn wait_receipt(&self, call: &NativeCall, timeout_ms: u32) -> AsyncTask<Blocking<(), ()>> {
        let a = Arc::clone(&self.inner);
        let call = call.call.clone();
        blocking(
            move || a.wait_receipt(&call, Duration::from_millis(timeout_ms.into())),
            unit,
        )
    }

    /// Records the call's outcome (queued after its decision; does not wait).
    #[napi]
    pub fn outcome(
        &self,
        call: &NativeCall,
        status: String,
        output: Option<String>,
    ) -> napi::Result<()> {
        guarded(|| {
            self.inner
                .outcome(&call.call, &status, output.as_deref().map(str::as_bytes))
        })
    }

    /// Records an action tool's outcome (docs/protocol.md §5.2): the proof
    /// read at `proof_path` of the output, else `proof` (JSON) as the
    /// program's proof function gave it; returns the state.
    #[napi]
    pub fn action_outcome(
        &self,
        call: &NativeCall,
        status: String,
        output: Option<String>,
        proof_path: Option<String>,
        proof: Option<String>,
    ) -> napi::Result<String> {
        let proof = match (proof_path, proof) {
            (Some(p), _) => {
                Proof::Path(ProofPath::parse(&p).map_err(|e| js_error(&SdkError::Invalid(e)))?)
            }
            (None, Some(json)) => Proof::Value(serde_json::from_str(&json).ok()),
            (None, None) => Proof::Value(None),
        };
        guarded(|| {
            self.inner.action_outcome(
                &call.call,
                &status,
                output.as_deref().map(str::as_bytes),
                &proof,
            )
        })
        .map(|s| s.as_str().to_owned())
    }

    /// Records a claim for each action tool `text` claims and `called` does
    /// not name (docs/protocol.md §5.6); returns the tools claimed.
    #[napi]
    pub fn claims(
        &self,
        text: String,
        called: Vec<String>,
        tools: Vec<ActionDeclaration>,
    ) -> napi::Result<Vec<String>> {
        let tools: Vec<ActionTool> = tools
            .into_iter()
            .map(|t| ActionTool {
                name: t.name,
                phrases: t.phrases,
            })
            .collect();
        guarded(|| self.inner.claims(&text, &called, &tools))
            .map(|found| found.into_iter().map(|(tool, _)| tool).collect())
    }

    /// Records a note; resolves to its seq.
    #[napi(ts_return_type = "Promise<number>")]
    pub fn note(&self, text: String) -> AsyncTask<Blocking<u64, f64>> {
        let a = Arc::clone(&self.inner);
        blocking(move || a.note(&text), to_f64)
    }

    /// Declares the program's tool list under its source; resolves to
    /// whether a new declaration was recorded.
    #[napi(ts_return_type = "Promise<boolean>")]
    pub fn declare_tools(
        &self,
        tools: Vec<ToolDeclaration>,
    ) -> napi::Result<AsyncTask<Blocking<bool, bool>>> {
        let tools = tools
            .into_iter()
            .map(|t| {
                serde_json::from_str(&t.definition)
                    .map(|definition| SdkTool {
                        name: t.name.clone(),
                        recorded: t.recorded,
                        definition,
                    })
                    .map_err(|e| {
                        js_error(&SdkError::Invalid(format!(
                            "tool {:?}: its definition is not JSON: {e}",
                            t.name
                        )))
                    })
            })
            .collect::<napi::Result<Vec<_>>>()?;
        let a = Arc::clone(&self.inner);
        Ok(blocking(
            move || a.declare_tools(&tools),
            std::convert::identity,
        ))
    }

    /// Waits up to `timeout_ms` for every record so far to be receipted.
    #[napi(ts_return_type = "Promise<SyncResult>")]
    pub fn sync(&self, timeout_ms: u32) -> AsyncTask<Blocking<SyncResult, SyncResult>> {
        let a = Arc::clone(&self.inner);
        blocking(
            move || {
                a.sync(Duration::from_millis(timeout_ms.into()))
                    .map(|s| SyncResult {
                        complete: s.complete,
                        records: to_f64(s.records),
                        pending: to_f64(s.pending),
                        error: s.error,
                    })
            },
            std::convert::identity,
        )
    }

    /// The chain's status as JSON, from its owner.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn status(&self) -> AsyncTask<Blocking<String, String>> {
        let a = Arc::clone(&self.inner);
        blocking(
            move || {
                a.status().and_then(|s| {
                    serde_json::to_string(&s).map_err(|e| SdkError::NotRecorded(e.to_string()))
                })
            },
            std::convert::identity,
        )
    }

    /// Closes this writer on the calling thread: queued records are
    /// answered (an owner commits them and tries one last sync). Safe to
    /// call twice; for the process's `exit` hook.
    #[napi]
    pub fn close_sync(&self) -> napi::Result<()> {
        guarded(|| {
            self.inner.close();
            Ok(())
        })
    }

    /// Closes this writer off the event loop.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn close(&self) -> AsyncTask<Blocking<(), ()>> {
        let a = Arc::clone(&self.inner);
        blocking(
            move || {
                a.close();
                Ok(())
            },
            unit,
        )
    }
}
