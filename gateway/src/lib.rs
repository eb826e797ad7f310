//! # tally-gateway
//!
//! The agent side of tally (docs/operations.md "The agent side: `tally
//! gateway` and `.tally/`"): everything an agent needs to record
//! its tool calls in its own signed hash chain and get them witnessed.
//!
//! - [`state`]: the `.tally/` state directory: agent key, witness config, pinned log keys.
//! - [`store`]: the local redb chain store (records, salts and contents, receipts, sync state).
//! - [`recorder`]: the chain writer that signs records and makes them survive a crash
//!   before it answers: committed durably, or written to the [`journal`] and committed right after.
//! - [`journal`]: the append-only record journal replayed into the store on open.
//! - [`acceptance`]: receipt acceptance, docs/protocol.md §8, shared by the gateway and `tally record`.
//! - [`witness`]: the witness HTTP client; [`sync`]: background sync with backoff and resync.
//! - `toollist`: `tools` records from MCP tool lists (§5.3, §6.2).
//! - [`toolcheck`]: approved tool baselines (lockfiles), the policy, and the session state
//!   that enforces them; each check a `tool_check` body (§5.7).
//! - [`chain`]: the agent's one chain, shared by every writer on the host (gateways,
//!   `tally record`, the SDKs): one owner holds the store, the others hand it records.
//! - [`sdk`]: the blocking in-process writer the language SDKs (sdk/python, sdk/typescript) wrap.
//! - [`calls`]: the recording core both transports share: decision, strict receipt, outcome, tool lists.
//! - [`proxy`], [`process`]: the MCP stdio proxy and the child process behind it.
//! - [`http`], `sse`: the MCP Streamable HTTP proxy (`tally gateway --upstream URL`).
//!
//! It depends on tally-schemas for every wire type and never on tally-log.

pub mod acceptance;
pub mod action;
mod appended;
pub mod calls;
pub mod chain;
pub mod disclose;
pub mod http;
pub mod journal;
pub mod process;
pub mod proxy;
pub mod recorder;
mod refusal;
pub mod sdk;
mod sse;
pub mod state;
pub mod store;
pub mod sync;
pub mod toolcheck;
mod toollist;
pub mod witness;

use std::sync::Arc;

use tally_schemas::limits::DEFAULT_MAX_SKEW_MS;
use tally_schemas::time::Clock;
use tally_schemas::AgentName;

/// Why an agent's sync could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// Local state.
    #[error(transparent)]
    State(#[from] state::StateError),
    /// The HTTP client.
    #[error(transparent)]
    Witness(#[from] witness::WitnessError),
}

/// The sync task for `agent`, or `None` when no witness is configured
/// (nothing is ever sent before one is).
///
/// # Errors
/// [`SetupError`] when the configuration or pinned keys cannot be read.
pub fn open_syncer(
    state: &state::StateDir,
    agent: &AgentName,
    store: Arc<store::ChainStore>,
    clock: Arc<dyn Clock>,
) -> Result<Option<sync::Syncer>, SetupError> {
    let config = state.load_config(agent)?;
    let Some(witness) = config.witness else {
        return Ok(None);
    };
    let trust = witness.trust(&state.agent(agent).config())?;
    let settings = state.witness_settings(agent, &witness)?;
    if let Some(note) = &settings.ignored_env {
        eprintln!("tally: agent {agent}: {note}");
    }
    let client = witness::WitnessClient::new(&settings.url, settings.api_key)?;
    Ok(Some(
        sync::Syncer::new(
            store,
            agent.as_str(),
            client,
            trust,
            clock,
            DEFAULT_MAX_SKEW_MS,
        )
        .with_pin_file(state.clone(), agent.clone()),
    ))
}
