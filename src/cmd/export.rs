//! `tally export`: write a pack (docs/protocol.md §9.1) for one or more
//! agents over a seq or time range, streamed from the running witness
//! (`GET /v1/export`) to a file; the file appears only once the whole pack
//! (through its `end` line) arrived. A pack is evidence: an existing file is
//! never replaced without `--force`.

use super::out::errln;
use std::path::PathBuf;
use std::process::ExitCode;

use tally_schemas::display::escape;
use tally_schemas::AgentName;

use super::agent::parse_agent;
use super::project::RemoteArgs;

/// Arguments of `tally export`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The agents (repeatable, at least one).
    #[arg(long = "agent", required = true, value_parser = parse_agent)]
    pub agents: Vec<AgentName>,
    /// First seq (inclusive).
    #[arg(long, conflicts_with_all = ["since", "until"])]
    pub from_seq: Option<u64>,
    /// Last seq (inclusive).
    #[arg(long, conflicts_with_all = ["since", "until"])]
    pub to_seq: Option<u64>,
    /// Records the witness received at or after this time (RFC 3339, e.g.
    /// 2026-11-30T08:00:00.000Z).
    #[arg(long)]
    pub since: Option<String>,
    /// Records the witness received before this time.
    #[arg(long)]
    pub until: Option<String>,
    /// Output file (`-` for stdout); an existing file is kept unless --force.
    #[arg(short, long, default_value = "pack.jsonl")]
    pub output: PathBuf,
    /// Overwrite the output file if it exists.
    #[arg(long)]
    pub force: bool,
    /// Read with this read token (`tallyread_…`) instead of an API key:
    /// any agent the log holds, named with --agent (or by the pack). The
    /// witness operator makes it with `tally read-token create`.
    #[arg(long, env = "TALLY_READ_TOKEN", hide_env_values = true)]
    pub read_token: Option<String>,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// Runs `tally export`.
///
/// # Errors
/// Transport errors, refusals, a pack cut short, I/O (exit 2).
pub(crate) fn run(args: &Args) -> anyhow::Result<ExitCode> {
    // Checked before asking the witness; download checks again at the end.
    if !args.force && args.output.as_os_str() != "-" && args.output.exists() {
        return Err(super::project::exists(&args.output));
    }
    let mut query: Vec<(&str, String)> = args
        .agents
        .iter()
        .map(|a| ("agent", a.to_string()))
        .collect();
    if let Some(v) = args.from_seq {
        query.push(("from_seq", v.to_string()));
    }
    if let Some(v) = args.to_seq {
        query.push(("to_seq", v.to_string()));
    }
    if let Some(v) = &args.since {
        query.push(("since", v.clone()));
    }
    if let Some(v) = &args.until {
        query.push(("until", v.clone()));
    }
    let (bytes, headers) = args
        .remote
        .reader(args.read_token.as_deref())?
        .download_with_headers("/v1/export", &query, &args.output, args.force)?;
    if args.output.as_os_str() != "-" {
        errln!("wrote {} ({bytes} bytes)", args.output.display());
    }
    // docs/api.md "Exports": cosigners whose cosignature the pack lacks.
    if let Some(missing) = headers
        .get("tally-cosigners-missing")
        .and_then(|v| v.to_str().ok())
    {
        errln!(
            "tally: warning: the pack's checkpoint lacks the cosignature of {} (down or slow when the export was made): a `tally verify --trust` whose quorum counts it will fail; export again once it cosigns (the witness's /metrics shows each cosigner's state)",
            escape(missing)
        );
    }
    Ok(ExitCode::SUCCESS)
}
