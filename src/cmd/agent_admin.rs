//! `tally agent add|rotate|retire`: the witness side of agent keys, over
//! the project routes of docs/api.md "Agents and their keys". The validity ranges
//! set here are what `tally keys export` writes into agent-keys.json.

use super::out::outln;
use std::process::ExitCode;

use anyhow::Context;
use tally_schemas::api::{AddAgentRequest, RegisteredAgent, RetireRequest, RotateKeyRequest};
use tally_schemas::display::escape;
use tally_schemas::{PublicKey, UnixMillis};

use super::agent_args::{AgentArg, StateArgs};
use super::project::RemoteArgs;

/// A public key as registration takes it: standard base64 of a valid,
/// canonically encoded point that is not of small order (the witness
/// refuses the others with `unusable_public_key`, docs/api.md).
fn parse_public_key(s: &str) -> Result<PublicKey, String> {
    PublicKey::from_base64(s.trim()).map_err(|e| e.to_string())
}

fn parse_time(s: &str) -> Result<UnixMillis, String> {
    UnixMillis::parse_rfc3339(s).map_err(|e| e.to_string())
}

/// Arguments of `tally agent add`.
#[derive(Debug, clap::Args)]
pub(crate) struct AddArgs {
    /// The agent's name (unique on the witness).
    #[command(flatten)]
    pub agent: AgentArg,
    /// Its Ed25519 public key, standard base64 (as `tally agent init` prints it).
    #[arg(long, value_parser = parse_public_key)]
    pub public_key: PublicKey,
    /// When the key becomes valid (RFC 3339, ms precision); default: now
    /// minus the witness's skew bound, so records signed shortly before
    /// registration are admitted.
    #[arg(long, value_parser = parse_time)]
    pub not_before: Option<UnixMillis>,
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Where an agent set up on this machine is pinned: registering its
    /// key on another witness is refused.
    #[command(flatten)]
    pub state: StateArgs,
}

/// Arguments of `tally agent rotate`.
#[derive(Debug, clap::Args)]
pub(crate) struct RotateArgs {
    /// The agent.
    #[command(flatten)]
    pub agent: AgentArg,
    /// The new public key, standard base64.
    #[arg(long, value_parser = parse_public_key)]
    pub public_key: PublicKey,
    /// When the old key ends and the new one starts (RFC 3339, ms
    /// precision). Default: now, or just after the agent's latest admitted
    /// record when that is later. An instant at or before that record, or
    /// before now minus the skew bound, is refused (retroactive_key_change):
    /// a key change never invalidates witnessed records.
    #[arg(long, value_parser = parse_time)]
    pub at: Option<UnixMillis>,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// Arguments of `tally agent retire`.
#[derive(Debug, clap::Args)]
pub(crate) struct RetireArgs {
    /// The agent.
    #[command(flatten)]
    pub agent: AgentArg,
    /// When its keys end (RFC 3339, ms precision). Default and limits as
    /// for `tally agent rotate --at`.
    #[arg(long, value_parser = parse_time)]
    pub at: Option<UnixMillis>,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

fn print_keys(agent: &RegisteredAgent) -> std::io::Result<()> {
    for k in &agent.keys {
        outln!(
            "  key {}  valid from {}  until {}",
            k.key_id,
            k.not_before,
            k.not_after
                .map_or_else(|| "(open)".to_owned(), |t| t.to_string())
        )?;
    }
    Ok(())
}

/// Runs `tally agent add`.
///
/// # Errors
/// Transport errors and refusals (exit 2).
pub(crate) fn add(a: &AddArgs) -> anyhow::Result<ExitCode> {
    let agent = a.agent.get()?;
    refuse_another_witness(a, agent)?;
    let request = AddAgentRequest {
        agent: agent.clone(),
        public_key: a.public_key.to_base64(),
        not_before: a.not_before,
    };
    let registered: RegisteredAgent = a
        .remote
        .remote()?
        .post("/v1/agents", &request)
        .context("registering the agent")?;
    outln!(
        "agent {agent} registered in project {}",
        escape(&registered.project)
    )?;
    print_keys(&registered)?;
    Ok(ExitCode::SUCCESS)
}

/// An agent set up in the local state directory with this very key and
/// pinned to a witness is registered there, nowhere else (docs/operations.md,
/// "The agent's witness"): a record admitted into another log stays there
/// for good. The quickstart's `TALLY_WITNESS_URL` for one witness, still
/// exported while an agent is set up for another, is the usual cause.
fn refuse_another_witness(a: &AddArgs, agent: &tally_schemas::AgentName) -> anyhow::Result<()> {
    let state = a.state.dir();
    let Ok(key) = state.load_key(agent) else {
        return Ok(());
    };
    if key.public_key() != a.public_key {
        return Ok(());
    }
    let Some(pinned) = state.load_config(agent)?.witness else {
        return Ok(());
    };
    if tally_gateway::state::same_witness_url(&pinned.url, &a.remote.witness) {
        return Ok(());
    }
    let env = tally_gateway::state::WITNESS_URL_ENV;
    let from = if std::env::args().any(|x| x == "--witness" || x.starts_with("--witness=")) {
        "given with --witness".to_owned()
    } else if std::env::var(env).is_ok_and(|u| u == a.remote.witness) {
        format!("from {env}")
    } else {
        "the default".to_owned()
    };
    anyhow::bail!(
        "agent {agent} is pinned to the witness at {} (`tally agent init`, in {}), but this would register its key with the witness at {} ({from}); nothing was registered. Give --witness {} (with that witness's API key){}",
        pinned.url,
        state.absolute().display(),
        a.remote.witness,
        pinned.url,
        if from.starts_with("from") {
            format!(", or unset {env}")
        } else {
            String::new()
        }
    )
}

/// Runs `tally agent rotate`.
///
/// # Errors
/// Transport errors and refusals (exit 2).
pub(crate) fn rotate(a: &RotateArgs) -> anyhow::Result<ExitCode> {
    let agent = a.agent.get()?;
    let request = RotateKeyRequest {
        public_key: a.public_key.to_base64(),
        at: a.at,
    };
    let registered: RegisteredAgent = a
        .remote
        .remote()?
        .post(&format!("/v1/agents/{agent}/rotate"), &request)
        .context("rotating the agent's key")?;
    outln!("agent {agent} key rotated")?;
    print_keys(&registered)?;
    Ok(ExitCode::SUCCESS)
}

/// Runs `tally agent retire`.
///
/// # Errors
/// Transport errors and refusals (exit 2).
pub(crate) fn retire(a: &RetireArgs) -> anyhow::Result<ExitCode> {
    let agent = a.agent.get()?;
    let registered: RegisteredAgent = a
        .remote
        .remote()?
        .post(
            &format!("/v1/agents/{agent}/retire"),
            &RetireRequest { at: a.at },
        )
        .context("retiring the agent")?;
    outln!("agent {agent} retired")?;
    print_keys(&registered)?;
    Ok(ExitCode::SUCCESS)
}
