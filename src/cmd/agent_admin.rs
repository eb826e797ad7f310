//! `tally agent add|rotate|retire`: the witness side of agent keys, over
//! the project routes of docs/api.md "Agents and their keys". The validity ranges
//! set here are what `tally keys export` writes into agent-keys.json.

use super::out::outln;
use std::process::ExitCode;

use anyhow::Context;
use tally_schemas::api::{AddAgentRequest, RegisteredAgent, RetireRequest, RotateKeyRequest};
use tally_schemas::display::escape;
use tally_schemas::{PublicKey, UnixMillis};

use super::agent::AgentArg;
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
