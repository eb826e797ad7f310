//! `tally._native`: the Python SDK's native module, a PyO3 skin over
//! [`tally_gateway::sdk::SdkAgent`] (docs/architecture.md "The Python
//! SDK"). Everything the protocol needs (canonical JSON, hashing, signing,
//! the chain, the journal, sync, receipt acceptance) is the core's; this
//! module converts arguments, maps [`SdkError::code`] to the exception
//! classes of `tally`, and releases the interpreter's lock around every
//! call into the core. The Python idioms (decorators, context managers,
//! asyncio, fork and exit handling) are in `tally/__init__.py`.
//!
//! Nothing here unwraps user input: a Rust panic must not cross into the
//! interpreter.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tally_gateway::sdk::{
    ActionState, ActionTool, Proof, ProofPath, SdkAgent, SdkCall, SdkError, SdkOptions, SdkTool,
    SdkToolCheck,
};
use tally_gateway::toolcheck::ServerId;

pyo3::create_exception!(
    _native,
    TallyError,
    PyException,
    "Every error of the tally SDK; `code` is stable."
);
pyo3::create_exception!(
    _native,
    AgentNotFound,
    TallyError,
    "The agent has no key or configuration in the state folder (the message names where it looked)."
);
pyo3::create_exception!(
    _native,
    BadContent,
    TallyError,
    "Arguments or a result that tally cannot hash as JSON (the message says which)."
);
pyo3::create_exception!(
    _native,
    Invalid,
    TallyError,
    "A name or text the protocol refuses."
);
pyo3::create_exception!(
    _native,
    NotRecorded,
    TallyError,
    "The decision could not be recorded: the call did not run."
);
pyo3::create_exception!(
    _native,
    NoReceipt,
    TallyError,
    "strict: no accepted witness receipt for the decision; the call did not run."
);
pyo3::create_exception!(_native, Closed, TallyError, "The agent was closed.");

fn raise(e: &SdkError) -> PyErr {
    let message = e.to_string();
    match e {
        SdkError::AgentNotFound(_) => AgentNotFound::new_err(message),
        SdkError::BadContent(_) => BadContent::new_err(message),
        SdkError::Invalid(_) => Invalid::new_err(message),
        SdkError::NotRecorded(_) => NotRecorded::new_err(message),
        SdkError::NoReceipt(_) => NoReceipt::new_err(message),
        SdkError::Closed => Closed::new_err(message),
    }
}

fn timeout(seconds: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(seconds)
        .map_err(|_| PyValueError::new_err(format!("timeout {seconds} is not a number of seconds")))
}

/// A decision recorded, until its outcome is.
#[pyclass(frozen, module = "tally._native")]
struct Call {
    inner: SdkCall,
}

#[pymethods]
impl Call {
    /// The call id.
    #[getter]
    fn call_id(&self) -> &str {
        &self.inner.call_id
    }
    /// The tool.
    #[getter]
    fn tool(&self) -> &str {
        &self.inner.tool
    }
    /// The decision's seq in the chain.
    #[getter]
    fn seq(&self) -> u64 {
        self.inner.seq
    }
    /// The decision's record hash, hex.
    #[getter]
    fn decision(&self) -> String {
        self.inner.decision.to_string()
    }
    fn __repr__(&self) -> String {
        format!(
            "Call(tool={:?}, call_id={:?}, seq={})",
            self.inner.tool, self.inner.call_id, self.inner.seq
        )
    }
}

/// A tool check of one MCP client session (docs/protocol.md §5.7).
#[pyclass(frozen, module = "tally._native")]
struct ToolCheck {
    inner: Arc<SdkToolCheck>,
}

/// One writer of an agent's chain.
#[pyclass(frozen, module = "tally._native")]
struct Agent {
    /// `None` once closed or abandoned.
    inner: Mutex<Option<Arc<SdkAgent>>>,
    name: String,
    source: String,
}

impl Agent {
    fn get(&self) -> PyResult<Arc<SdkAgent>> {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| raise(&SdkError::Closed))
    }
}

#[pymethods]
impl Agent {
    #[new]
    #[pyo3(signature = (name, state_dir=None, source=None, store_content=false, durable=false, source_lease_ms=None, proof_in_clear=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        name: String,
        state_dir: Option<PathBuf>,
        source: Option<String>,
        store_content: bool,
        durable: bool,
        source_lease_ms: Option<u64>,
        proof_in_clear: bool,
    ) -> PyResult<Self> {
        let options = SdkOptions {
            state_dir,
            source,
            source_lease_ms,
            store_content,
            proof_in_clear,
            durable,
            kind: Some("sdk-python".into()),
        };
        let agent = py
            .detach(|| SdkAgent::open(&name, options))
            .map_err(|e| raise(&e))?;
        Ok(Self {
            name: agent.agent().to_owned(),
            source: agent.source().to_owned(),
            inner: Mutex::new(Some(Arc::new(agent))),
        })
    }

    /// The agent's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The tool source this writer declares under.
    #[getter]
    fn source(&self) -> &str {
        &self.source
    }

    /// Records the decision; returns once it is in the chain.
    #[pyo3(signature = (tool, arguments, call_id=None))]
    fn decide(
        &self,
        py: Python<'_>,
        tool: &str,
        arguments: &[u8],
        call_id: Option<&str>,
    ) -> PyResult<Call> {
        let agent = self.get()?;
        py.detach(|| agent.decide(tool, call_id, arguments))
            .map(|inner| Call { inner })
            .map_err(|e| raise(&e))
    }

    /// Records how the call ended (queued after the decision; does not wait).
    #[pyo3(signature = (call, status, output=None))]
    fn outcome(
        &self,
        py: Python<'_>,
        call: &Call,
        status: &str,
        output: Option<&[u8]>,
    ) -> PyResult<()> {
        let agent = self.get()?;
        py.detach(|| agent.outcome(&call.inner, status, output))
            .map_err(|e| raise(&e))
    }

    /// Waits up to `timeout` seconds for the decision's accepted receipt.
    /// An action tool's outcome (docs/protocol.md §5.2): the proof read at
    /// `proof_path` of the output, or `proof` (JSON) as the program's proof
    /// function gave it; returns the state.
    #[pyo3(signature = (call, status, output=None, proof_path=None, proof=None))]
    fn action_outcome(
        &self,
        py: Python<'_>,
        call: &Call,
        status: &str,
        output: Option<&[u8]>,
        proof_path: Option<&str>,
        proof: Option<&[u8]>,
    ) -> PyResult<&'static str> {
        let agent = self.get()?;
        let proof = match (proof_path, proof) {
            (Some(p), _) => {
                Proof::Path(ProofPath::parse(p).map_err(|e| raise(&SdkError::Invalid(e)))?)
            }
            (None, Some(json)) => Proof::Value(serde_json::from_slice(json).ok()),
            (None, None) => Proof::Value(None),
        };
        py.detach(|| agent.action_outcome(&call.inner, status, output, &proof))
            .map(ActionState::as_str)
            .map_err(|e| raise(&e))
    }

    /// Records a claim for each action tool `text` claims and `called`
    /// does not name (docs/protocol.md §5.6); `tools` are (name, phrases).
    fn claims(
        &self,
        py: Python<'_>,
        text: &str,
        called: Vec<String>,
        tools: Vec<(String, Vec<String>)>,
    ) -> PyResult<Vec<(String, u64)>> {
        let agent = self.get()?;
        let tools: Vec<ActionTool> = tools
            .into_iter()
            .map(|(name, phrases)| ActionTool { name, phrases })
            .collect();
        py.detach(|| agent.claims(text, &called, &tools))
            .map_err(|e| raise(&e))
    }

    fn wait_receipt(&self, py: Python<'_>, call: &Call, timeout: f64) -> PyResult<()> {
        let agent = self.get()?;
        let timeout = self::timeout(timeout)?;
        py.detach(|| agent.wait_receipt(&call.inner, timeout))
            .map_err(|e| raise(&e))
    }

    /// Records a note; returns its seq.
    fn note(&self, py: Python<'_>, text: &str) -> PyResult<u64> {
        let agent = self.get()?;
        py.detach(|| agent.note(text)).map_err(|e| raise(&e))
    }

    /// Loads a lockfile and policy for an MCP client session with the
    /// server `command` (its argv) or `url`, and records the start check
    /// when anything differs.
    #[pyo3(signature = (lock, policy, command=None, url=None))]
    fn tool_check(
        &self,
        py: Python<'_>,
        lock: PathBuf,
        policy: PathBuf,
        command: Option<Vec<String>>,
        url: Option<String>,
    ) -> PyResult<ToolCheck> {
        let agent = self.get()?;
        let server = match (command, url) {
            (Some(c), None) => ServerId::Command(c),
            (None, Some(u)) => ServerId::Url(u),
            _ => {
                return Err(PyValueError::new_err(
                    "give the server's command or its url, one of them",
                ))
            }
        };
        let check = py
            .detach(|| agent.tool_check(&lock, &policy, server))
            .map_err(|e| raise(&e))?;
        Ok(ToolCheck {
            inner: Arc::new(check),
        })
    }

    /// Checks a complete tool list (JSON array of definitions, or `None`
    /// when the server gave none) and records the check; returns the names
    /// the client must not see.
    #[pyo3(signature = (check, initialize, tools=None))]
    fn check_tools(
        &self,
        py: Python<'_>,
        check: &ToolCheck,
        initialize: bool,
        tools: Option<Vec<u8>>,
    ) -> PyResult<Vec<String>> {
        let agent = self.get()?;
        let inner = Arc::clone(&check.inner);
        py.detach(|| agent.check_tools(&inner, initialize, tools.as_deref()))
            .map_err(|e| raise(&e))
    }

    /// The server's `initialize` result (JSON) against the approved
    /// `serverInfo`; returns whether the session is denied.
    fn server_info(&self, py: Python<'_>, check: &ToolCheck, result: Vec<u8>) -> PyResult<bool> {
        let agent = self.get()?;
        let inner = Arc::clone(&check.inner);
        py.detach(|| agent.server_info(&inner, &result))
            .map_err(|e| raise(&e))
    }

    /// The server's tools may have changed: calls wait for a new check.
    fn tools_changed(&self, check: &ToolCheck) -> PyResult<()> {
        self.get()?.tools_changed(&check.inner);
        Ok(())
    }

    /// `None` when a call to `tool` may go on, else `(reason, message)`.
    fn admit_tool(&self, check: &ToolCheck, tool: &str) -> PyResult<Option<(String, String)>> {
        Ok(self.get()?.admit_tool(&check.inner, tool))
    }

    /// Declares the full tool list: `(name, recorded, definition JSON)`
    /// each. Returns whether a declaration was recorded (false: the same
    /// list was declared recently).
    fn declare_tools(&self, py: Python<'_>, tools: Vec<(String, bool, Vec<u8>)>) -> PyResult<bool> {
        let agent = self.get()?;
        let mut list = Vec::with_capacity(tools.len());
        for (name, recorded, definition) in tools {
            let definition = serde_json::from_slice(&definition).map_err(|e| {
                raise(&SdkError::BadContent(format!(
                    "the definition of tool {name:?} is not JSON: {e}"
                )))
            })?;
            list.push(SdkTool {
                name,
                recorded,
                definition,
            });
        }
        py.detach(|| agent.declare_tools(&list))
            .map_err(|e| raise(&e))
    }

    /// Waits up to `timeout` seconds for every record so far to be
    /// receipted; returns `{complete, records, pending, error}`.
    fn sync<'py>(&self, py: Python<'py>, timeout: f64) -> PyResult<Bound<'py, PyDict>> {
        let agent = self.get()?;
        let timeout = self::timeout(timeout)?;
        let s = py.detach(|| agent.sync(timeout)).map_err(|e| raise(&e))?;
        let d = PyDict::new(py);
        d.set_item("complete", s.complete)?;
        d.set_item("records", s.records)?;
        d.set_item("pending", s.pending)?;
        d.set_item("error", s.error)?;
        Ok(d)
    }

    /// The chain's status as `tally status --json` gives it, as JSON text.
    fn status(&self, py: Python<'_>) -> PyResult<String> {
        let agent = self.get()?;
        let status = py.detach(|| agent.status()).map_err(|e| raise(&e))?;
        serde_json::to_string(&status)
            .map_err(|e| raise(&SdkError::NotRecorded(format!("status: {e}"))))
    }

    /// Closes this writer (its queued records are answered first). Safe to
    /// call twice.
    fn close(&self, py: Python<'_>) {
        let agent = self
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(agent) = agent {
            py.detach(move || agent.close());
        }
    }

    /// In a child after `fork`: lets go of the parent's writer without
    /// touching it. Its runtime's threads do not exist in the child, so
    /// closing or dropping it could wait for them forever; it is leaked
    /// instead, and the child opens its own writer.
    fn abandon(&self) {
        let agent = self
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        std::mem::forget(agent);
    }
}

/// The module `tally._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<Agent>()?;
    m.add_class::<Call>()?;
    m.add_class::<ToolCheck>()?;
    for (name, class, code) in [
        ("TallyError", py.get_type::<TallyError>(), None),
        (
            "AgentNotFound",
            py.get_type::<AgentNotFound>(),
            Some("agent_not_found"),
        ),
        (
            "BadContent",
            py.get_type::<BadContent>(),
            Some("bad_content"),
        ),
        ("Invalid", py.get_type::<Invalid>(), Some("invalid")),
        (
            "NotRecorded",
            py.get_type::<NotRecorded>(),
            Some("not_recorded"),
        ),
        ("NoReceipt", py.get_type::<NoReceipt>(), Some("no_receipt")),
        ("Closed", py.get_type::<Closed>(), Some("closed")),
    ] {
        class.setattr("code", code)?;
        m.add(name, class)?;
    }
    Ok(())
}
