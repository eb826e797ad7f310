//! `tally disclose`: write a disclosure file (docs/protocol.md §6.3) for one
//! call from the agent's local store: its arguments and/or its result with
//! the salts of the decision's and the outcome's salted hashes (§6.1).
//! `tally verify --disclosure FILE` checks it against the pack.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use tally_gateway::store::ChainStore;
use tally_schemas::disclosure::{DisclosedPart, Disclosure, DISCLOSURE_VERSION};
use tally_schemas::display::escape;
use tally_schemas::{AgentName, Body, Record};

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

/// The decision and the outcome (if any) of `call_id` in the agent's chain:
/// the last decision with that id and the outcome after it.
fn find(store: &ChainStore, call_id: &str) -> anyhow::Result<(Option<Record>, Option<Record>)> {
    let (mut decision, mut outcome) = (None, None);
    let mut from = 0;
    loop {
        let batch = store.records(from, 1024)?;
        let Some(last) = batch.last() else { break };
        from = last.seq.get() + 1;
        for r in batch {
            match &r.body {
                Body::Decision(d) if d.call_id == call_id => {
                    decision = Some(r);
                    outcome = None;
                }
                Body::Outcome(o) if o.call_id == call_id && decision.is_some() => {
                    outcome = Some(r);
                }
                _ => {}
            }
        }
    }
    Ok((decision, outcome))
}

fn part(store: &ChainStore, r: &Record, what: &str) -> anyhow::Result<DisclosedPart> {
    let seq = r.seq.get();
    let secret = store
        .secret(seq)?
        .with_context(|| format!("the local store holds no salt for {what} record seq {seq}"))?;
    let Some(content) = secret.content else {
        bail!(
            "the local store keeps the salt of seq {seq} but not its content: the agent ran without --store-content, so the {what} cannot be disclosed"
        );
    };
    Ok(DisclosedPart {
        seq,
        salt: secret.salt,
        content,
    })
}

/// Runs `tally disclose`.
///
/// # Errors
/// An agent without a store, a call not in its chain, content the store
/// does not keep, an unwritable output.
pub(crate) fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let state = args.state.dir();
    state.load_key(&args.agent)?;
    let path = state.agent(&args.agent).store();
    if !path.exists() {
        bail!(
            "agent {} has no local chain store yet ({})",
            args.agent,
            path.display()
        );
    }
    let store = ChainStore::open(&path).with_context(|| {
        format!(
            "opening agent {}'s chain store (a running gateway holds it: stop it, or disclose later)",
            args.agent
        )
    })?;
    let (decision, outcome) = find(&store, &args.call_id)?;
    let Some(decision) = decision else {
        bail!(
            "agent {}'s chain holds no call {:?}: a disclosure is made from the chain of the agent that made the call",
            args.agent,
            escape(&args.call_id)
        );
    };
    if decision.agent != args.agent {
        bail!(
            "record seq {} of the store is agent {}'s, not {}'s",
            decision.seq.get(),
            decision.agent,
            args.agent
        );
    }
    let both = !args.input && !args.output;
    let input = if args.input || both {
        Some(part(&store, &decision, "input")?)
    } else {
        None
    };
    let has_output = |r: &Record| matches!(&r.body, Body::Outcome(o) if o.output_hash.is_some());
    let output = match &outcome {
        Some(o) if has_output(o) && (args.output || both) => Some(part(&store, o, "output")?),
        Some(o) if args.output => bail!(
            "call {:?} ended {} (seq {}) without a result or error: there is no output to disclose",
            escape(&args.call_id),
            match &o.body {
                Body::Outcome(x) => x.status.as_str(),
                _ => "?",
            },
            o.seq.get()
        ),
        None if args.output => bail!(
            "call {:?} has no outcome in agent {}'s chain yet: there is no output to disclose",
            escape(&args.call_id),
            args.agent
        ),
        _ => None,
    };
    let d = Disclosure {
        v: DISCLOSURE_VERSION,
        agent: args.agent.as_str().to_owned(),
        call_id: args.call_id.clone(),
        input,
        output,
    };
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
