//! `tally read-token …`: read tokens for a witness whose log is not public
//! (`tally serve --log-read token`), over the admin routes of docs/api.md
//! "Read tokens". A read token lets its holder read the whole log (tiles,
//! proofs, `/checkpoint`, `/metrics`, and exports and head.json of any
//! agent); monitors and auditors pass it with `--read-token` or
//! `TALLY_READ_TOKEN` (docs/operations.md "Who can read the log").

use std::process::ExitCode;

use tally_schemas::api::{CreateReadTokenRequest, NewReadToken, ReadTokenList, ReadTokenRevoked};

use super::out::outln;
use super::project::AdminArgs;
use tally_schemas::display::escape;

/// Arguments of `tally read-token`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    pub command: ReadTokenCommand,
}

/// The `tally read-token` subcommands (admin token).
#[derive(Debug, clap::Subcommand)]
pub(crate) enum ReadTokenCommand {
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
pub(crate) fn run(args: &Args) -> anyhow::Result<ExitCode> {
    match &args.command {
        ReadTokenCommand::Create { label, admin } => {
            let token: NewReadToken = admin.remote()?.post(
                "/v1/read-tokens",
                &CreateReadTokenRequest {
                    label: label.clone(),
                },
            )?;
            outln!("read token: {}", escape(&token.read_token))?;
            outln!("id:         {}", escape(&token.read_token_id))?;
            outln!("(shown once: it is stored only as a hash)")?;
        }
        ReadTokenCommand::List { admin } => {
            let list: ReadTokenList = admin.remote()?.get("/v1/read-tokens", &[])?;
            for t in &list.read_tokens {
                let state = t
                    .revoked
                    .map_or_else(|| "active".to_owned(), |r| format!("revoked {r}"));
                outln!(
                    "{}\tcreated {}\t{state}\t{}",
                    escape(&t.id),
                    t.created,
                    escape(&t.label)
                )?;
            }
        }
        ReadTokenCommand::Revoke { id, admin } => {
            let revoked: ReadTokenRevoked = admin
                .remote()?
                .post_empty(&format!("/v1/read-tokens/{id}/revoke"))?;
            outln!("read token {} revoked", escape(&revoked.read_token_id))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
