//! `tally read-token …`: read tokens for a witness whose log is not public
//! (`tally serve --log-read token`), over the admin routes of docs/api.md
//! "Read tokens". A read token lets its holder read the whole log (tiles,
//! proofs, `/checkpoint`, `/metrics`, and exports and head.json of any
//! agent); monitors and auditors pass it with `--read-token` or
//! `TALLY_READ_TOKEN` (docs/operations.md "Who can read the log").

use std::process::ExitCode;

use serde_json::json;

use super::out::outln;
use super::project::AdminArgs;
use tally_schemas::display::escape;

/// Arguments of `tally read-token`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: ReadTokenCommand,
}

/// The `tally read-token` subcommands (admin token).
#[derive(Debug, clap::Subcommand)]
pub enum ReadTokenCommand {
    /// Make a read token and print it (shown once: it is stored as a hash).
    Create {
        /// Who it is for, shown by `list` (at most 128 bytes).
        #[arg(long, default_value = "")]
        label: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// List the read tokens: id, when made, whether revoked, label.
    List {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Revoke a read token by its id (the 16 hex digits after `tallyread_`);
    /// it reads nothing from the next request on.
    Revoke {
        /// The token id.
        id: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
}

/// Runs `tally read-token …`.
///
/// # Errors
/// Transport errors and refusals (exit 2).
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    match &args.command {
        ReadTokenCommand::Create { label, admin } => {
            let v = admin
                .remote()?
                .post_json("/v1/read-tokens", &json!({ "label": label }))?;
            outln!(
                "read token: {}",
                v["read_token"].as_str().unwrap_or_default()
            )?;
            outln!(
                "id:         {}",
                v["read_token_id"].as_str().unwrap_or_default()
            )?;
            outln!("(shown once: it is stored only as a hash)")?;
        }
        ReadTokenCommand::List { admin } => {
            let v = admin.remote()?.get_json("/v1/read-tokens", &[])?;
            for t in v["read_tokens"].as_array().into_iter().flatten() {
                let state = t["revoked"]
                    .as_str()
                    .map_or_else(|| "active".to_owned(), |r| format!("revoked {r}"));
                outln!(
                    "{}\tcreated {}\t{state}\t{}",
                    t["id"].as_str().unwrap_or_default(),
                    t["created"].as_str().unwrap_or_default(),
                    escape(t["label"].as_str().unwrap_or_default())
                )?;
            }
        }
        ReadTokenCommand::Revoke { id, admin } => {
            admin
                .remote()?
                .post_json(&format!("/v1/read-tokens/{id}/revoke"), &json!({}))?;
            outln!("read token {id} revoked")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
