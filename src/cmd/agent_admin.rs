//! `tally agent add|rotate|retire`: the witness side of agent keys, over
//! the project routes of docs/api.md "Agents and their keys". The validity ranges
//! set here are what `tally keys export` writes into agent-keys.json.

use super::out::outln;
use std::process::ExitCode;

use anyhow::Context;
use serde_json::{json, Value};
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
pub struct AddArgs {
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
pub struct RotateArgs {
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
pub struct RetireArgs {
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

fn print_keys(v: &Value) -> std::io::Result<()> {
    for k in v["keys"].as_array().into_iter().flatten() {
        outln!(
            "  key {}  valid from {}  until {}",
            k["key_id"].as_str().unwrap_or_default(),
            k["not_before"].as_str().unwrap_or_default(),
            k["not_after"].as_str().unwrap_or("(open)")
        )?;
    }
    Ok(())
}

/// Runs `tally agent add`.
///
/// # Errors
/// Transport errors and refusals (exit 2).
pub fn add(a: &AddArgs) -> anyhow::Result<ExitCode> {
    let agent = a.agent.get()?;
    let mut body = json!({"agent": agent, "public_key": a.public_key});
    if let Some(t) = a.not_before {
        body["not_before"] = json!(t);
    }
    let v = a
        .remote
        .remote()?
        .post_json("/v1/agents", &body)
        .context("registering the agent")?;
    outln!(
        "agent {agent} registered in project {}",
        v["project"].as_str().unwrap_or_default()
    )?;
    print_keys(&v)?;
    Ok(ExitCode::SUCCESS)
}

/// Runs `tally agent rotate`.
///
/// # Errors
/// Transport errors and refusals (exit 2).
pub fn rotate(a: &RotateArgs) -> anyhow::Result<ExitCode> {
    let agent = a.agent.get()?;
    let mut body = json!({"public_key": a.public_key});
    if let Some(t) = a.at {
        body["at"] = json!(t);
    }
    let v = a
        .remote
        .remote()?
        .post_json(&format!("/v1/agents/{agent}/rotate"), &body)
        .context("rotating the agent's key")?;
    outln!("agent {agent} key rotated")?;
    print_keys(&v)?;
    Ok(ExitCode::SUCCESS)
}

/// Runs `tally agent retire`.
///
/// # Errors
/// Transport errors and refusals (exit 2).
pub fn retire(a: &RetireArgs) -> anyhow::Result<ExitCode> {
    let agent = a.agent.get()?;
    let mut body = json!({});
    if let Some(t) = a.at {
        body["at"] = json!(t);
    }
    let v = a
        .remote
        .remote()?
        .post_json(&format!("/v1/agents/{agent}/retire"), &body)
        .context("retiring the agent")?;
    outln!("agent {agent} retired")?;
    print_keys(&v)?;
    Ok(ExitCode::SUCCESS)
}
