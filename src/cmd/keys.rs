//! `tally keys export`: write agent-keys.json (docs/protocol.md §9.3) for
//! the project's agents, from the running witness (`GET /v1/agent-keys`).

use super::out::errln;
use std::path::PathBuf;
use std::process::ExitCode;

use tally_schemas::AgentName;

use super::agent::parse_agent;
use super::project::RemoteArgs;

/// Arguments of `tally keys`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    pub command: KeysCommand,
}

/// The `tally keys` subcommands.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum KeysCommand {
    /// Write agent-keys.json: every key of the project's agents (or of the
    /// agents named) with its validity range, for auditors' `tally verify`.
    Export(ExportArgs),
}

/// Arguments of `tally keys export`.
#[derive(Debug, clap::Args)]
pub(crate) struct ExportArgs {
    /// Only these agents (repeatable); default: all of the project's.
    #[arg(long = "agent", value_parser = parse_agent)]
    pub agents: Vec<AgentName>,
    /// Output file (`-` for stdout).
    #[arg(short, long, default_value = "agent-keys.json")]
    pub output: PathBuf,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// Runs `tally keys …`.
///
/// # Errors
/// Transport errors, refusals, I/O (exit 2).
pub(crate) fn run(args: &Args) -> anyhow::Result<ExitCode> {
    match &args.command {
        KeysCommand::Export(a) => {
            let query: Vec<(&str, String)> =
                a.agents.iter().map(|n| ("agent", n.to_string())).collect();
            a.remote
                .remote()?
                .download("/v1/agent-keys", &query, &a.output, true)?;
            if a.output.as_os_str() != "-" {
                errln!("wrote {}", a.output.display());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
