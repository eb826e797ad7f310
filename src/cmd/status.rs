//! `tally status`: the agent side's state at a glance (issue 6 §1): per
//! agent, the chain head, the records not yet receipted, the witness and
//! the last sync error, and a fork, loudly.

use super::out::outln;
use std::process::ExitCode;

use anyhow::Context;
use serde_json::{json, Value};
use tally_gateway::store::ChainStore;
use tally_schemas::AgentName;

use super::agent::{parse_agent, StateArgs};

/// Arguments of `tally status`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only this agent (default: every agent in the state directory).
    #[arg(long, value_parser = parse_agent)]
    pub agent: Option<AgentName>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// With --json: include every record of the local chain, with the salt
    /// (and content, when kept) behind its salted hash.
    #[arg(long, requires = "json")]
    pub records: bool,
    #[command(flatten)]
    pub state: StateArgs,
}

fn agent_status(args: &Args, agent: &AgentName) -> anyhow::Result<Value> {
    let state = args.state.dir();
    let key = state.load_key(agent)?;
    let config = state.load_config(agent)?;
    let mut out = json!({
        "agent": agent.as_str(),
        "key_id": key.public_key().key_id().to_hex(),
        "witness": config.witness.as_ref().map(|w| json!({
            "url": tally_gateway::state::witness_url(w),
            "origin": w.origin,
            "keys": w.keys.iter().map(|k| k.vkey.clone()).collect::<Vec<_>>(),
            "retired_keys": w.keys.iter().filter_map(|k| k.not_after.map(|t| json!({
                "vkey": k.vkey,
                "not_after": t.to_string(),
            }))).collect::<Vec<_>>(),
        })),
    });
    let path = state.agent(agent).store();
    if !path.exists() {
        out["records"] = json!(0);
        out["head"] = Value::Null;
        out["not_receipted"] = json!(0);
        return Ok(out);
    }
    let store = match ChainStore::open(&path) {
        Ok(s) => s,
        Err(e) => {
            out["store_error"] = json!(format!("{e} (a running gateway holds the store open)"));
            return Ok(out);
        }
    };
    let s = store.status()?;
    out["records"] = json!(s.records);
    out["head"] = match s.head {
        Some((seq, hash)) => json!({"seq": seq, "hash": hash.to_hex()}),
        None => Value::Null,
    };
    out["receipted"] = json!(s.receipted);
    out["not_receipted"] = json!(s.records.saturating_sub(s.sync_cursor));
    out["last_sync_error"] = serde_json::to_value(&s.last_sync_error)?;
    out["fork"] = serde_json::to_value(&s.fork)?;
    out["superseded_receipts"] = json!(s.superseded_receipts);
    if args.records {
        let mut all = Vec::new();
        let mut from = 0;
        loop {
            let batch = store.records(from, 1024)?;
            if batch.is_empty() {
                break;
            }
            from = batch.last().map_or(from, |r| r.seq.get() + 1);
            for r in batch {
                let receipted = store.receipt(r.seq.get())?.is_some();
                let secret = store.secret(r.seq.get())?;
                all.push(json!({"hash": r.hash().to_hex(), "receipted": receipted, "record": r, "secret": secret}));
            }
        }
        out["chain"] = Value::Array(all);
    }
    Ok(out)
}

fn print_text(s: &Value) -> std::io::Result<()> {
    let agent = s["agent"].as_str().unwrap_or("?");
    outln!(
        "agent {agent} (key id {})",
        s["key_id"].as_str().unwrap_or("?")
    )?;
    if let Some(e) = s.get("store_error").and_then(Value::as_str) {
        outln!("  store: {e}")?;
        return Ok(());
    }
    match s["head"].as_object() {
        Some(h) => outln!(
            "  chain head: seq {} hash {}",
            h["seq"],
            h["hash"].as_str().unwrap_or("?")
        )?,
        None => outln!("  chain head: none (no records yet)")?,
    }
    outln!(
        "  records: {}, not yet receipted: {}",
        s["records"],
        s["not_receipted"]
    )?;
    match s["witness"].as_object() {
        Some(w) => outln!(
            "  witness: {} (log {})",
            w["url"].as_str().unwrap_or("?"),
            w["origin"].as_str().unwrap_or("?")
        )?,
        None => outln!("  witness: none configured, nothing is sent")?,
    }
    for k in s["witness"]["retired_keys"]
        .as_array()
        .into_iter()
        .flatten()
    {
        outln!(
            "  pinned log key {} retired at {}: receipts it signs from then on are refused",
            k["vkey"].as_str().unwrap_or("?"),
            k["not_after"].as_str().unwrap_or("?")
        )?;
    }
    match s.get("last_sync_error").and_then(Value::as_object) {
        Some(e) => outln!(
            "  last sync error: {} [{}] {}",
            e["time"].as_str().unwrap_or("?"),
            e["code"].as_str().unwrap_or("?"),
            e["message"].as_str().unwrap_or("?")
        )?,
        None => outln!("  last sync error: none")?,
    }
    if s["superseded_receipts"].as_u64().unwrap_or(0) > 0 {
        outln!(
            "  !!! {} receipts were superseded: the witness lost records it had receipted (they were sent again)",
            s["superseded_receipts"]
        )?;
    }
    if let Some(f) = s.get("fork").and_then(Value::as_object) {
        outln!(
            "  !!! {} — syncing is stopped until this is resolved by hand",
            f["message"].as_str().unwrap_or("fork")
        )?;
    }
    Ok(())
}

/// Runs `tally status`; exits 1 when any agent's chain is forked.
///
/// # Errors
/// Unreadable state (exit 2).
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let state = args.state.dir();
    let agents = match &args.agent {
        Some(a) => vec![a.clone()],
        None => state.agents().context("listing agents")?,
    };
    if agents.is_empty() && !args.json {
        outln!(
            "no agents in {} ({}); the agents of another folder are shown with --state-dir DIR or TALLY_STATE_DIR=DIR, and `tally agent init NAME` makes a new one",
            state.absolute().display(),
            state.lookup()
        )?;
    }
    let statuses = agents
        .iter()
        .map(|a| agent_status(args, a))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let forked = statuses
        .iter()
        .any(|s| s.get("fork").is_some_and(|f| !f.is_null()));
    if args.json {
        outln!("{}", json!({"v": 1, "agents": statuses}))?;
    } else {
        for s in &statuses {
            print_text(s)?;
        }
    }
    Ok(if forked {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
