//! `tally record decision|outcome|note`: record through the agent's local
//! chain without MCP, then sync to the witness when one is
//! configured. Prints one JSON line per record for scripts.
//!
//! The record is durably in the local chain before anything is sent, so the
//! command's exit status says whether it was recorded (0), not whether the
//! witness answered. Without `--wait-receipt` syncing is one try with no
//! retries, bounded by [`ONE_TRY`]: a witness that is down costs no wait,
//! and standard error says where the record is and that `tally agent sync`
//! sends it later. With `--wait-receipt` it retries up to `--sync-timeout`
//! and exits 1 without an accepted receipt.

use super::out::{errln, outln};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use rand_core::RngCore as _;
use serde_json::{json, Value};
use tally_gateway::acceptance::{accept_receipt, parse_receipt};
use tally_gateway::chain::{AgentChain, ChainOptions, Waited, WriterInfo};
use tally_gateway::state::ApiKeySource;
use tally_gateway::store::Secret;
use tally_schemas::canonical::parse_strict;
use tally_schemas::limits::DEFAULT_MAX_SKEW_MS;
use tally_schemas::record::{Decision, NoteBody, Outcome, OutcomeStatus};
use tally_schemas::time::{Clock as _, SystemClock};
use tally_schemas::tools::TOOL_DEFINITION_LIMITS;
use tally_schemas::{AgentName, Body, Hash, Record};

use super::agent::{parse_agent, runtime, StateArgs};

/// Arguments shared by every `tally record` kind.
#[derive(Debug, clap::Args)]
pub(crate) struct Common {
    /// The agent whose chain gets the record.
    #[arg(long, value_parser = parse_agent)]
    pub agent: AgentName,
    /// Do not sync to the witness after recording.
    #[arg(long)]
    pub no_sync: bool,
    /// Wait for the witness's receipt of this record and accept it, retrying
    /// up to --sync-timeout; exit 1 if there is none (like the gateway's
    /// --strict). Without it, syncing is one try of at most 2 seconds, and a
    /// record the witness did not receipt stays in the local chain for
    /// `tally agent sync`.
    #[arg(long, conflicts_with = "no_sync")]
    pub wait_receipt: bool,
    /// With --wait-receipt: seconds to spend syncing.
    #[arg(long, default_value_t = 10)]
    pub sync_timeout: u64,
    /// Keep the input or output content in the local store (salts are always kept).
    #[arg(long)]
    pub store_content: bool,
    #[command(flatten)]
    pub state: StateArgs,
}

/// Arguments of `tally record`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    pub kind: Kind,
}

/// The record kinds.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Kind {
    /// Record that the agent decided to call a tool (before calling it).
    Decision {
        /// The tool's name.
        #[arg(long)]
        tool: String,
        /// The call id (default: a fresh random one, printed).
        #[arg(long)]
        call_id: Option<String>,
        /// The call's arguments as JSON (default {}).
        #[arg(long, conflicts_with = "input_file")]
        input: Option<String>,
        /// A file holding the arguments as JSON, or - for standard input.
        #[arg(long)]
        input_file: Option<PathBuf>,
        #[command(flatten)]
        common: Common,
    },
    /// Record how a call ended.
    Outcome {
        /// The decision's call id.
        #[arg(long)]
        call_id: String,
        /// ok, error, cancelled, server_exited, client_gone, timeout, http_error or not_run.
        #[arg(long, value_parser = parse_status)]
        status: OutcomeStatus,
        /// The decision's record hash (default: the open decision with this call id).
        #[arg(long)]
        decision: Option<String>,
        /// The result or error as JSON.
        #[arg(long, conflicts_with = "output_file")]
        output: Option<String>,
        /// A file holding the result or error as JSON, or - for standard input.
        #[arg(long)]
        output_file: Option<PathBuf>,
        #[command(flatten)]
        common: Common,
    },
    /// Record free text.
    Note {
        /// The text (1 to 4096 bytes).
        text: String,
        #[command(flatten)]
        common: Common,
    },
}

/// How long `--wait-receipt` waits before saying that it waits.
const SAY_WAITING_AFTER: Duration = Duration::from_secs(2);

/// Without `--wait-receipt`: the bound of the one sync try.
pub(crate) const ONE_TRY: Duration = Duration::from_secs(2);

fn parse_status(s: &str) -> Result<OutcomeStatus, String> {
    serde_json::from_value(Value::String(s.to_owned())).map_err(|_| {
        format!(
            "{s:?} is not one of ok, error, cancelled, server_exited, client_gone, timeout, http_error, not_run"
        )
    })
}

fn read_json(inline: Option<&String>, file: Option<&PathBuf>) -> anyhow::Result<Option<Value>> {
    let bytes = match (inline, file) {
        (Some(s), _) => s.as_bytes().to_vec(),
        (None, Some(p)) if p.as_os_str() == "-" => {
            let mut b = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut b)
                .context("reading standard input")?;
            b
        }
        (None, Some(p)) => std::fs::read(p).with_context(|| format!("reading {}", p.display()))?,
        (None, None) => return Ok(None),
    };
    Ok(Some(
        parse_strict(&bytes, TOOL_DEFINITION_LIMITS).context("the JSON content is refused")?,
    ))
}

/// Records the record `args` asks for through `chain`, then waits for its
/// receipt as asked: the JSON line to print, a note for standard error and
/// the exit code.
async fn record_and_sync(
    args: &Args,
    common: &Common,
    state: &tally_gateway::state::StateDir,
    config: &tally_gateway::state::AgentConfig,
    chain: &AgentChain,
    clock: Arc<SystemClock>,
) -> anyhow::Result<(Value, Option<String>, ExitCode)> {
    let mut extra = json!({});
    let (body, secret) = match &args.kind {
        Kind::Decision {
            tool,
            call_id,
            input,
            input_file,
            common,
        } => {
            let arguments =
                read_json(input.as_ref(), input_file.as_ref())?.unwrap_or_else(|| json!({}));
            let (input_hash, secret) =
                Secret::for_content(&arguments, common.store_content, &mut rand_core::OsRng)
                    .context("canonicalising the content")?;
            let call_id = call_id.clone().unwrap_or_else(|| {
                let mut b = [0u8; 8];
                rand_core::OsRng.fill_bytes(&mut b);
                hex::encode(b)
            });
            extra["call_id"] = json!(call_id);
            (
                Body::Decision(Decision {
                    call_id,
                    tool: tool.clone(),
                    input_hash,
                }),
                Some(secret),
            )
        }
        Kind::Outcome {
            call_id,
            status,
            decision,
            output,
            output_file,
            common,
        } => {
            let decision = match decision {
                Some(h) => Hash::from_hex(h).context("--decision")?,
                None => match chain.open_decision(call_id).await.map_err(anyhow::Error::msg)? {
                    Some(h) => h,
                    None => bail!("no open decision with call id {call_id:?} in agent {}'s chain (pass --decision HASH)", common.agent),
                },
            };
            let (output_hash, secret) = match read_json(output.as_ref(), output_file.as_ref())? {
                Some(o) => {
                    let (h, s) =
                        Secret::for_content(&o, common.store_content, &mut rand_core::OsRng)
                            .context("canonicalising the content")?;
                    (Some(h), Some(s))
                }
                None => (None, None),
            };
            (
                Body::Outcome(Outcome {
                    call_id: call_id.clone(),
                    decision,
                    status: *status,
                    output_hash,
                    state: None,
                    proof: None,
                    proof_hash: None,
                }),
                secret,
            )
        }
        Kind::Note { text, .. } => (Body::Note(NoteBody { text: text.clone() }), None),
    };

    let record: Record = chain.append(body, secret).await.context("recording")?;

    let mut out = json!({
        "agent": common.agent.as_str(),
        "kind": record.kind().as_str(),
        "seq": record.seq.get(),
        "hash": record.hash().to_hex(),
    });
    if let (Some(o), Some(e)) = (out.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    let mut code = ExitCode::SUCCESS;
    let agent = &common.agent;
    let seq = record.seq.get();
    let local = format!(
        "{agent}'s record seq {seq} is safe in its local chain ({})",
        state.absolute().display()
    );
    let mut note = None;
    match &config.witness {
        None => {
            out["receipt"] = json!("no_witness");
            note = Some(format!(
                "{local}; no witness is configured for {agent}, so nothing was sent (`tally agent init {agent} --witness URL` configures one)"
            ));
            if common.wait_receipt {
                code = ExitCode::from(1);
            }
        }
        Some(_) if common.no_sync => out["receipt"] = json!("pending"),
        Some(witness) => {
            // The chain's owner syncs (this process, or the writer that
            // holds the chain); without --wait-receipt, one try.
            let waited = if common.wait_receipt {
                let wait = chain.wait_receipt(seq, Duration::from_secs(common.sync_timeout), false);
                tokio::pin!(wait);
                // A witness failing over (or slow) can take seconds: say
                // what is awaited rather than sit silent for --sync-timeout.
                tokio::select! {
                    w = &mut wait => w,
                    () = tokio::time::sleep(SAY_WAITING_AFTER) => {
                        let url = state.witness_settings(agent, witness)?.url;
                        errln!(
                            "tally: no receipt yet for {agent}'s record seq {seq} from the witness at {url}: still trying, up to {} s in all (--sync-timeout); the record is safe in the local chain",
                            common.sync_timeout
                        );
                        wait.await
                    }
                }
            } else {
                chain.wait_receipt(seq, ONE_TRY, true).await
            };
            // Accept the receipt again here, with the shared function, so
            // the answer is about this record and this moment.
            let trust = witness.trust(&state.agent(agent).config())?;
            let accepted = match waited {
                Waited::Receipted {
                    receipt: Some(bytes),
                } => parse_receipt(bytes.as_bytes())
                    .and_then(|r| {
                        accept_receipt(&r, &record, &trust, clock.now(), DEFAULT_MAX_SKEW_MS)
                    })
                    .map_err(|e| e.to_string()),
                Waited::Receipted { receipt: None } => {
                    Err("the receipt is not in the local chain".into())
                }
                Waited::NoWitness => Err("no witness is configured".into()),
                Waited::Halted { note: n } | Waited::Failed { note: n } => {
                    Err(format!("[{}] {}", n.code, n.message))
                }
                Waited::TimedOut { last: Some(n) } => Err(format!("[{}] {}", n.code, n.message)),
                Waited::TimedOut { last: None } if common.wait_receipt => {
                    Err("no receipt yet".into())
                }
                Waited::TimedOut { last: None } => Err(format!(
                    "[timeout] the witness did not answer within {} s",
                    ONE_TRY.as_secs()
                )),
            };
            match accepted {
                Ok(a) => {
                    out["receipt"] = json!("accepted");
                    out["index"] = json!(a.receipt.index.get());
                }
                Err(e) => {
                    // A refused API key is not fixed by syncing again: say
                    // which key was presented and where it came from.
                    let key_hint = if e.starts_with("[unauthorized]") {
                        let s = state.witness_settings(agent, witness)?;
                        format!(
                            "; the API key presented is {} ({}): give the project's key with `tally agent init {agent} --witness {} --api-key KEY`{}",
                            s.api_key_from.describe(),
                            if s.api_key_from == ApiKeySource::Environment { "unset it, or set it to a key of that witness" } else { "not a current key of that witness" },
                            s.url,
                            if s.api_key_from == ApiKeySource::Environment { " and unset TALLY_API_KEY" } else { "" }
                        )
                    } else {
                        String::new()
                    };
                    note = Some(format!(
                        "{local}, not yet witnessed: {e}{key_hint}; `tally agent sync --agent {agent}` sends it, and every other record not yet receipted, when the witness accepts them"
                    ));
                    out["receipt"] = json!("pending");
                    out["sync_error"] = json!(e);
                    if common.wait_receipt {
                        code = ExitCode::from(1);
                    }
                }
            }
        }
    }
    Ok((out, note, code))
}

/// Runs `tally record …`.
///
/// # Errors
/// Bad input, missing agent, store failures (exit 2).
pub(crate) fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let common = match &args.kind {
        Kind::Decision { common, .. }
        | Kind::Outcome { common, .. }
        | Kind::Note { common, .. } => common,
    };
    let state = common.state.dir();
    state.load_key(&common.agent)?;
    let config = state.load_config(&common.agent)?;
    let clock = Arc::new(SystemClock);
    let rt = runtime()?;
    // One writer of the agent's chain among any others running (gateways,
    // SDKs): the record is answered once committed with fsync.
    let chain = rt.block_on(AgentChain::open(
        &state,
        &common.agent,
        clock.clone(),
        ChainOptions {
            me: WriterInfo::new("record"),
            durable: true,
            final_sync: Duration::ZERO,
            window: None,
            keep_trying: false,
        },
    ))?;
    let result = rt.block_on(record_and_sync(
        args, common, &state, &config, &chain, clock,
    ));
    rt.block_on(chain.close());
    let (out, note, code) = result?;
    if let Some(n) = note {
        errln!("tally: {n}");
    }
    outln!("{out}")?;
    Ok(code)
}
