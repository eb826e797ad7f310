//! `tally disclose`: write a disclosure file (docs/protocol.md §6.3) for one
//! call from the agent's local store: its arguments and/or its result with
//! the salts of the decision's and the outcome's salted hashes (§6.1).
//! `tally verify --disclosure FILE` checks it against the pack.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use tally_gateway::chain::peek_disclosure;
use tally_gateway::disclose::Parts;
use tally_schemas::display::escape;
use tally_schemas::AgentName;

use super::agent::{parse_agent, StateArgs};
use super::out::errln;

/// Arguments of `tally disclose`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The agent whose chain holds the call.
    #[arg(long, value_parser = parse_agent)]
    pub agent: AgentName,
    /// The call's id (as the decision record has it).
    #[arg(long, value_name = "ID")]
    pub call_id: String,
    /// Disclose the call's arguments (the decision's input_hash).
    #[arg(long)]
    pub input: bool,
    /// Disclose the call's result or error (the outcome's output_hash).
    /// Without --input or --output, both are disclosed (the output when
    /// there is one).
    #[arg(long = "output")]
    pub output: bool,
    /// Write the disclosure file here.
    #[arg(short = 'o', long = "out", value_name = "FILE")]
    pub out: PathBuf,
    #[command(flatten)]
    pub state: StateArgs,
}

/// Runs `tally disclose`.
///
/// # Errors
/// An agent without a store, a call not in its chain, content the store
/// does not keep, a writer holding the store that does not answer, an
/// unwritable output.
pub(crate) fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let state = args.state.dir();
    state.load_key(&args.agent)?;
    let parts = Parts {
        input: args.input,
        output: args.output,
    };
    // From the chain store, or from the writer holding it (a gateway
    // running for the agent), which reads it for us.
    let d = super::agent::runtime()?
        .block_on(peek_disclosure(&state, &args.agent, &args.call_id, parts))
        .map_err(anyhow::Error::msg)?;
    let mut bytes = serde_json::to_vec_pretty(&d)?;
    bytes.push(b'\n');
    std::fs::write(&args.out, bytes).with_context(|| format!("writing {}", args.out.display()))?;
    errln!(
        "wrote {}: agent {} call {:?}: {}",
        args.out.display(),
        args.agent,
        escape(&args.call_id),
        match (&d.input, &d.output) {
            (Some(_), Some(_)) => "input and output",
            (Some(_), None) => "input",
            (None, Some(_)) => "output",
            (None, None) => "nothing",
        }
    );
    Ok(ExitCode::SUCCESS)
}
