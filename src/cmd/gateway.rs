//! `tally gateway`: run an MCP server behind the recording stdio proxy
//! (issue 6 §2; the proxy is tally_gateway::proxy).

use super::out::errln;
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tally_gateway::journal::Journal;
use tally_gateway::process::run_gateway;
use tally_gateway::proxy::{ProxyConfig, ProxyDeps, StrictPolicy};
use tally_gateway::recorder::{Recorder, RecorderHandle};
use tally_gateway::store::ChainStore;
use tally_schemas::time::SystemClock;
use tally_schemas::AgentName;
use tokio::sync::{watch, Notify};

use super::agent::{parse_agent, runtime, StateArgs};

/// The last sync when the gateway ends: one try, at most this long.
const FINAL_SYNC: Duration = Duration::from_secs(3);

/// Arguments of `tally gateway`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Every tools/call gets a signed decision record in the agent's local chain BEFORE it is \
forwarded; if that record cannot be written, the call is answered with a JSON-RPC error \
(code -32001) and the server never sees it. When the call ends an outcome record says \
how: ok, error, cancelled, server_exited, client_gone or not_run. Tool lists are recorded \
with per-part definition digests, again whenever they change.

Durability: by default a decision is forwarded once it is written to the record journal \
(.tally/agents/NAME/chain.journal) with one write(), so it survives the gateway being \
killed at any moment; it is committed to chain.redb with fsync right after. A power loss \
or kernel crash can lose the records of the last few milliseconds before that fsync. \
--sync-before-forward waits for the fsync before forwarding instead (survives power loss; \
costs one fsync per call).

--name-prefix P: only tools whose name starts with P are recorded. The other tools are \
still declared in the recorded tool list, with recorded=false, and calls to them are \
forwarded without records, so an auditor's coverage line names them.

With a witness configured (tally agent init NAME --witness URL) records are synced in the \
background; --strict makes each call wait for its decision's receipt and accept it \
(pinned log key, inclusion, record hash and nonce, witness time) before forwarding.

Example: tally gateway --agent claims-bot -- npx @modelcontextprotocol/server-everything stdio")]
pub struct Args {
    /// The agent whose chain records the calls (see `tally agent init`).
    #[arg(long, value_parser = parse_agent)]
    pub agent: AgentName,
    /// Forward a call only after its decision is receipted by the witness
    /// and the receipt is accepted; otherwise refuse it (outcome not_run).
    #[arg(long)]
    pub strict: bool,
    /// Like --strict, for these tools only (comma-separated names).
    #[arg(long, value_delimiter = ',')]
    pub strict_tools: Vec<String>,
    /// How long a strict call waits for its receipt, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub strict_timeout_ms: u64,
    /// Record only tools whose name starts with this prefix (see below).
    #[arg(long)]
    pub name_prefix: Option<String>,
    /// Also keep call arguments and results in the local store, so a call
    /// can be disclosed later (salts are always kept).
    #[arg(long)]
    pub store_content: bool,
    /// Forward a call only once its decision is committed to chain.redb with
    /// fsync (survives a power loss), not as soon as it is in the record
    /// journal (survives the gateway's death; see below).
    #[arg(long)]
    pub sync_before_forward: bool,
    #[command(flatten)]
    pub state: StateArgs,
    /// The MCP server command and its arguments (after --).
    #[arg(last = true, required = true)]
    pub command: Vec<OsString>,
}

/// Runs `tally gateway`; exits with the server's exit code.
///
/// # Errors
/// A missing agent or a server that cannot be started (exit 2).
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let state = args.state.dir();
    let key = state.load_key(&args.agent)?;
    state.load_config(&args.agent)?;
    let clock = Arc::new(SystemClock);
    let rt = runtime()?;

    // A store that cannot be opened does not stop the server: every call is
    // then refused with the reason (fail closed), other traffic still flows.
    let paths = state.agent(&args.agent);
    let store_path = paths.store();
    let (recorder, handle, store) = match ChainStore::open(&store_path).map(Arc::new) {
        Ok(store) => {
            let recovered = store.recovered_from_journal();
            if recovered.records > 0 {
                errln!(
                    "tally: gateway: committed {} records that the last run had journaled (it ended before committing them)",
                    recovered.records
                );
            }
            let started = if args.sync_before_forward {
                Recorder::start(args.agent.clone(), key, clock.clone(), Arc::clone(&store))
            } else {
                Journal::open(&paths.journal())
                    .map_err(|e| {
                        tally_gateway::store::StoreError::Db(format!(
                            "{}: {e}",
                            paths.journal().display()
                        ))
                    })
                    .and_then(|journal| {
                        Recorder::start_journaled(
                            args.agent.clone(),
                            key,
                            clock.clone(),
                            Arc::clone(&store),
                            journal,
                        )
                    })
            };
            match started {
                Ok(r) => {
                    let h = r.handle();
                    (Some(r), h, Some(store))
                }
                Err(e) => {
                    errln!("tally: gateway: tools/call will be refused: {e}");
                    (None, RecorderHandle::unavailable(&e.to_string()), None)
                }
            }
        }
        Err(e) => {
            errln!("tally: gateway: tools/call will be refused: {e}");
            (None, RecorderHandle::unavailable(&e.to_string()), None)
        }
    };

    let syncer = match &store {
        Some(s) => tally_gateway::open_syncer(&state, &args.agent, Arc::clone(s), clock.clone())?
            .map(Arc::new),
        None => None,
    };
    let strict = if args.strict {
        StrictPolicy::All
    } else if args.strict_tools.is_empty() {
        StrictPolicy::Off
    } else {
        StrictPolicy::Tools(args.strict_tools.iter().cloned().collect::<BTreeSet<_>>())
    };
    let config = ProxyConfig {
        strict,
        record_prefix: args.name_prefix.clone(),
        store_content: args.store_content,
        strict_timeout: Duration::from_millis(args.strict_timeout_ms),
    };
    let deps = ProxyDeps {
        recorder: handle.clone(),
        store: store.clone(),
        receipts: syncer.as_ref().map(|s| s.progress()),
        client_gone: Arc::new(Notify::new()),
    };

    let exit = rt.block_on(async {
        let (stop_tx, stop_rx) = watch::channel(false);
        let sync_task = syncer.clone().map(|s| {
            let wake = handle.committed();
            tokio::spawn(async move { s.run(wake, stop_rx).await })
        });
        let exit = run_gateway(config, deps, &args.command).await;
        // Commit every queued outcome, then give the sync one try of at
        // most FINAL_SYNC to send the last records (the next run or `tally
        // agent sync` does the rest). The background task may be waiting on
        // a witness that does not answer: it is stopped, not awaited (a post
        // cut short is safe: the witness answers its retry with the same
        // receipt).
        if let Some(r) = recorder {
            let _ = tokio::task::spawn_blocking(move || r.close()).await;
        }
        let _ = stop_tx.send(true);
        if let Some(t) = sync_task {
            t.abort();
            let _ = t.await;
        }
        if let Some(s) = &syncer {
            let _ =
                tokio::time::timeout(FINAL_SYNC, s.sync_until_idle(tokio::time::Instant::now()))
                    .await;
        }
        exit
    });
    // The reader of our standard input is a blocking thread that may still
    // wait for input the client never sends; do not wait for it.
    rt.shutdown_background();
    let exit = exit?;
    Ok(ExitCode::from(u8::try_from(exit.code).unwrap_or(1)))
}
