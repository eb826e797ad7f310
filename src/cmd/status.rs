//! `tally status`: the agent side's state at a glance: per
//! agent, the chain head, the records not yet receipted, the witness and
//! the last sync error, and a fork, loudly.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;

use anyhow::Context;
use serde_json::{json, Value};
use tally_gateway::chain::peek_status;
use tally_gateway::store::ChainStore;
use tally_schemas::display::escape;
use tally_schemas::AgentName;

use super::agent::{parse_agent, StateArgs};
use super::out::outln;

/// Arguments of `tally status`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
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
    let settings = config
        .witness
        .as_ref()
        .map(|w| state.witness_settings(agent, w))
        .transpose()?;
    let mut out = json!({
        "agent": agent.as_str(),
        "key_id": key.public_key().key_id().to_hex(),
        "witness": config.witness.as_ref().zip(settings.as_ref()).map(|(w, s)| json!({
            "url": s.url,
            "url_from": "pinned by `tally agent init --witness`",
            "api_key_from": s.api_key_from.describe(),
            "ignored_environment": s.ignored_env,
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
    let live = match super::agent::runtime()?.block_on(peek_status(&state, agent)) {
        Ok(Some(s)) => s,
        Ok(None) => {
            out["records"] = json!(0);
            out["head"] = Value::Null;
            out["not_receipted"] = json!(0);
            return Ok(out);
        }
        Err(e) => {
            out["store_error"] = json!(e);
            return Ok(out);
        }
    };
    let s = &live.store;
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
    // The writers running now: the owner (the one that syncs) and the
    // others handing it records (docs/operations.md "Several writers").
    out["writers"] = serde_json::to_value(&live.writers)?;
    out["syncer_pid"] = match live.owner() {
        Some(o) if live.syncing => json!(o.pid),
        _ => Value::Null,
    };
    if args.records && !live.writers.is_empty() {
        out["chain_error"] = json!("a writer holds the chain now; stop it to list the records");
    } else if args.records {
        let store = ChainStore::open(&path)?;
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

/// The text form of one agent's status. Every string here can come from a
/// witness (sync errors, its origin) or from local files: the characters
/// of protocol.md §11.2 are escaped.
fn status_text(s: &Value) -> String {
    let text = |v: &Value| escape(v.as_str().unwrap_or("?")).into_owned();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "agent {} (key id {})",
        text(&s["agent"]),
        text(&s["key_id"])
    );
    if let Some(e) = s.get("store_error").filter(|e| e.is_string()) {
        let _ = writeln!(out, "  store: {}", text(e));
        return out;
    }
    match s["head"].as_object() {
        Some(h) => {
            let _ = writeln!(
                out,
                "  chain head: seq {} hash {}",
                h["seq"],
                text(&h["hash"])
            );
        }
        None => {
            let _ = writeln!(out, "  chain head: none (no records yet)");
        }
    }
    let _ = writeln!(
        out,
        "  records: {}, not yet receipted: {}",
        s["records"], s["not_receipted"]
    );
    match s["witness"].as_object() {
        Some(w) => {
            // Indexing a map by a key it lacks panics: read each member.
            let field = |k: &str| w.get(k).unwrap_or(&Value::Null);
            let _ = writeln!(
                out,
                "  witness: {} (log {}; {})",
                text(field("url")),
                text(field("origin")),
                text(field("url_from"))
            );
            let _ = writeln!(out, "  API key: {}", text(field("api_key_from")));
            if field("ignored_environment").is_string() {
                let _ = writeln!(out, "  note: {}", text(field("ignored_environment")));
            }
        }
        None => {
            let _ = writeln!(out, "  witness: none configured, nothing is sent");
        }
    }
    for k in s["witness"]["retired_keys"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let _ = writeln!(
            out,
            "  pinned log key {} retired at {}: receipts it signs from then on are refused",
            text(&k["vkey"]),
            text(&k["not_after"])
        );
    }
    if s["writers"].as_array().is_some_and(Vec::is_empty) {
        let _ = writeln!(out, "  writers: none running");
    }
    for w in s["writers"].as_array().into_iter().flatten() {
        let last = match w["last_seq"].as_u64() {
            Some(seq) => format!("last record seq {seq}"),
            None => "no record yet".into(),
        };
        let source = w["source"]
            .as_str()
            .map(|src| format!(", source {}", escape(src)))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  writer: {} pid {}{source}, {last}{}",
            text(&w["kind"]),
            w["pid"],
            if w["owner"].as_bool() == Some(true) {
                " (holds the chain; the one syncer)"
            } else {
                ""
            }
        );
    }
    match s.get("last_sync_error").and_then(Value::as_object) {
        Some(e) => {
            let _ = writeln!(
                out,
                "  last sync error: {} [{}] {}",
                text(&e["time"]),
                text(&e["code"]),
                text(&e["message"])
            );
        }
        None if s["not_receipted"].as_u64().unwrap_or(0) > 0 => {
            // A `tally record` that gave up after its one short try (or ran
            // with --no-sync) leaves no error behind: say what to run.
            let _ = writeln!(
                out,
                "  last sync error: none recorded, but {} record(s) are not yet receipted (a `tally record` that gave up after its one 2 s try, or ran with --no-sync, records no error): `tally agent sync {}` sends them and says what happens",
                s["not_receipted"],
                text(&s["agent"])
            );
        }
        None => {
            let _ = writeln!(out, "  last sync error: none");
        }
    }
    if s["superseded_receipts"].as_u64().unwrap_or(0) > 0 {
        let witness = s["witness"]["url"].as_str().map_or_else(
            || "the witness".to_owned(),
            |u| format!("the witness at {}", escape(u)),
        );
        let _ = writeln!(
            out,
            "  !!! {} receipts were superseded: {witness} lost records it had receipted (its log went back: restored from a backup, or an old copy served), so they were sent again and have new receipts. The old receipts stay in the chain as evidence, and this line with them: ask the witness's operator what happened; `tally monitor` shows whether the log went back (docs/operations.md, \"Superseded receipts\")",
            s["superseded_receipts"]
        );
    }
    if let Some(f) = s.get("fork").and_then(Value::as_object) {
        let message = f
            .get("message")
            .filter(|m| m.is_string())
            .map_or_else(|| "fork".to_owned(), text);
        let _ = writeln!(
            out,
            "  !!! {message} — syncing is stopped until this is resolved by hand"
        );
    }
    out
}

/// Runs `tally status`; exits 1 when any agent's chain is forked.
///
/// # Errors
/// Unreadable state (exit 2).
pub(crate) fn run(args: &Args) -> anyhow::Result<ExitCode> {
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
            super::out::stdout().write_all(status_text(s).as_bytes())?;
        }
    }
    Ok(if forked {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A witness's error message cannot reorder or forge status lines.
    #[test]
    fn status_text_escapes_what_a_witness_sent() {
        let s = json!({
            "agent": "claims-bot",
            "key_id": "00112233aabbccdd",
            "head": {"seq": 3, "hash": "ab"},
            "records": 4,
            "not_receipted": 1,
            "witness": {"url": "http://127.0.0.1:7878", "origin": "evil\u{202e}gol/", "retired_keys": [],
                        "url_from": "pinned at agent init", "api_key_from": "the agent's api-key file"},
            "last_sync_error": {
                "time": "2026-11-30T08:00:00.000Z",
                "code": "chain_conflict",
                "message": "head is \u{202e}0 qes\nsynced: all receipted"
            },
            "superseded_receipts": 0,
            "fork": null,
        });
        let text = status_text(&s);
        assert!(!text.contains('\u{202e}'), "{text}");
        assert!(
            text.contains("(log evil\\u{202e}gol/; pinned at agent init)"),
            "{text}"
        );
        assert!(
            text.contains("[chain_conflict] head is \\u{202e}0 qes\\u{a}synced: all receipted\n"),
            "{text}"
        );
        assert_eq!(text.lines().count(), 6, "{text}");
    }
}
