//! `tally head`: write head.json (docs/protocol.md §9.4) from the running
//! witness (`GET /v1/head`): its latest checkpoint, a consistency proof from
//! the pack checkpoint's size, and each agent's latest record.

use super::out::errln;
use std::io::{BufRead as _, Read as _};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use tally_schemas::note::peek_checkpoint;
use tally_schemas::pack::PackLine;
use tally_schemas::AgentName;

use super::agent::parse_agent;
use super::project::RemoteArgs;

/// Arguments of `tally head`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The pack checkpoint's tree size (the proof starts there).
    #[arg(long, required_unless_present = "pack", conflicts_with = "pack")]
    pub from_size: Option<u64>,
    /// Read the size (and the agents, unless --agent is given) from a pack.
    #[arg(long)]
    pub pack: Option<PathBuf>,
    /// Only these agents (repeatable); default: the pack's, or all of the project's.
    #[arg(long = "agent", value_parser = parse_agent)]
    pub agents: Vec<AgentName>,
    /// Output file (`-` for stdout).
    #[arg(short, long, default_value = "head.json")]
    pub output: PathBuf,
    /// Read with this read token (`tallyread_…`) instead of an API key:
    /// any agent the log holds, named with --agent (or by the pack). The
    /// witness operator makes it with `tally read-token create`.
    #[arg(long, env = "TALLY_READ_TOKEN", hide_env_values = true)]
    pub read_token: Option<String>,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// Runs `tally head`.
///
/// # Errors
/// Transport errors, refusals, an unreadable pack, I/O (exit 2).
pub(crate) fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let mut agents = args.agents.clone();
    let mut pack_origin = None;
    let from_size = match (args.from_size, &args.pack) {
        (Some(n), _) => n,
        (None, Some(pack)) => {
            let f =
                std::fs::File::open(pack).with_context(|| format!("opening {}", pack.display()))?;
            // The header is at most MAX_PACK_HEADER_BYTES (and its newline):
            // read no more than that, whatever the file holds.
            let bound = tally_schemas::limits::MAX_PACK_HEADER_BYTES as u64 + 1;
            let mut first = Vec::new();
            std::io::BufReader::new(f)
                .take(bound)
                .read_until(b'\n', &mut first)
                .with_context(|| format!("reading {}", pack.display()))?;
            if !first.ends_with(b"\n") && first.len() as u64 == bound {
                bail!(
                    "{}: the first line is longer than a pack header may be ({} bytes)",
                    pack.display(),
                    tally_schemas::limits::MAX_PACK_HEADER_BYTES
                );
            }
            let PackLine::Header(h) =
                PackLine::from_json(first.trim_ascii_end()).context("the pack's first line")?
            else {
                bail!("{} does not start with a pack header", pack.display());
            };
            if agents.is_empty() {
                agents = h.agents.iter().map(|a| a.agent.clone()).collect();
            }
            pack_origin = Some(h.origin.clone());
            peek_checkpoint(&h.checkpoint)
                .context("the pack's checkpoint")?
                .size
                .get()
        }
        (None, None) => bail!("give --from-size or --pack"),
    };
    if let Some(origin) = &pack_origin {
        same_log(&args.remote.witness, origin)?;
    }
    let mut query: Vec<(&str, String)> = vec![("from_size", from_size.to_string())];
    query.extend(agents.iter().map(|a| ("agent", a.to_string())));
    args.remote.reader(args.read_token.as_deref())?.download(
        "/v1/head",
        &query,
        &args.output,
        true,
    )?;
    if args.output.as_os_str() != "-" {
        errln!("wrote {}", args.output.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Refuses a witness that keeps another log than the pack's: its head could
/// only fail check 11, and its answer (the pack's agents unknown there)
/// would not say why. The key directory is public (protocol.md §4.5); a
/// witness that does not answer it is left to the head request's own error.
fn same_log(witness: &str, pack_origin: &str) -> anyhow::Result<()> {
    let rt = super::agent::runtime()?;
    let Ok(dir) = rt.block_on(async {
        tally_gateway::witness::WitnessClient::new(witness, None)?
            .key_directory()
            .await
    }) else {
        return Ok(());
    };
    if dir.origin != pack_origin {
        bail!(
            "the pack is from the log {pack_origin:?}, but the witness at {witness} keeps the log {:?}: make head.json with the witness that exported the pack (--witness URL, or TALLY_WITNESS_URL)",
            dir.origin
        );
    }
    Ok(())
}
