//! `tally`: the command-line entry point. It wires the crates together and
//! nothing else; each subcommand's arguments and work live in `cmd/`.
//! Output goes through `cmd::out` (a closed standard output is a quiet exit
//! with status 141, never a panic), so the print macros are denied here.

#![deny(clippy::print_stdout, clippy::print_stderr)]

mod cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use cmd::out::errln;

/// tally: a transparency log for what AI agents do.
///
/// Agents sign a record of every tool call they decide to make and of what
/// came back; a witness appends each record to an append-only Merkle log and
/// returns a receipt; auditors verify exported packs offline.
#[derive(Debug, Parser)]
#[command(name = "tally", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the RFC 8785 canonical form of a JSON file (or - for stdin), as
    /// tally hashes and signs it. Refuses duplicate keys, integers beyond
    /// 2^53-1 and invalid UTF-8.
    Canon(cmd::canon::Args),
    /// An agent's key, witness configuration and sync (agent side).
    Agent(cmd::agent::Args),
    /// Record every tool call of an MCP server in the agent's signed chain:
    /// run it over stdio behind a proxy, or stand in front of a remote one
    /// over Streamable HTTP (--upstream URL).
    Gateway(cmd::gateway::Args),
    /// Approve an MCP server's tool definitions as a baseline (a lockfile)
    /// that `tally gateway --lock FILE --policy FILE` enforces.
    Tools(cmd::tools::Args),
    /// Record a decision, outcome or note in an agent's chain (for scripts).
    Record(cmd::record::Args),
    /// Show each agent's chain head, unreceipted records and sync errors.
    Status(cmd::status::Args),
    /// Verify a pack offline: the twelve checks, coverage and the result
    /// (exit 0 pass, 1 fail, 2 usage or I/O error).
    Verify(cmd::verify::Args),
    /// Verify a pack as `tally verify` does and write the audit report: one
    /// self-contained HTML page (or JSON) that leads with PASS or FAIL.
    Report(cmd::report::Args),
    /// Write a disclosure file: one call's content with its salts, from the
    /// agent's local store, for `tally verify --disclosure`.
    Disclose(cmd::disclose::Args),
    /// Follow a log's checkpoints and prove each consistent with the last
    /// one verified; print both checkpoints as evidence of a fork.
    Monitor(cmd::monitor::Args),
    /// Run a cosigner: a C2SP tlog-witness that cosigns a log's checkpoints
    /// after proving each consistent with the last it cosigned (not to be
    /// confused with `tally serve`, tally's witness).
    Cosigner(cmd::cosigner::Args),
    /// Run the witness: admit signed records, issue receipts, serve the
    /// log, exports and the key directory (creates ./tally-data on first start).
    Serve(Box<cmd::serve::Args>),
    /// The witness's storage: `tally store copy` carries a data folder's
    /// log into PostgreSQL and checks the copy.
    Store(cmd::store::Args),
    /// Projects and their API keys on the witness (admin token).
    Project(cmd::project::Args),
    /// Read tokens for a witness whose log is not public (admin token).
    ReadToken(cmd::read_token::Args),
    /// Export trust anchors from the witness (agent-keys.json).
    Keys(cmd::keys::Args),
    /// Export a pack for one or more agents from the witness.
    Export(cmd::export::Args),
    /// Write head.json: the witness's newer checkpoint, a consistency proof
    /// from the pack's, and each agent's latest record.
    Head(cmd::head::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Canon(args) => cmd::canon::run(&args),
        Command::Agent(args) => cmd::agent::run(&args),
        Command::Gateway(args) => cmd::gateway::run(&args),
        Command::Tools(args) => cmd::tools::run(&args),
        Command::Record(args) => cmd::record::run(&args),
        Command::Status(args) => cmd::status::run(&args),
        Command::Verify(args) => cmd::verify::run(&args),
        Command::Report(args) => cmd::report::run(&args),
        Command::Disclose(args) => cmd::disclose::run(&args),
        Command::Monitor(args) => cmd::monitor::run(&args),
        Command::Cosigner(args) => cmd::cosigner::run(&args),
        Command::Serve(args) => cmd::serve::run(&args),
        Command::Store(args) => cmd::store::run(&args),
        Command::Project(args) => cmd::project::run(&args),
        Command::ReadToken(args) => cmd::read_token::run(&args),
        Command::Keys(args) => cmd::keys::run(&args),
        Command::Export(args) => cmd::export::run(&args),
        Command::Head(args) => cmd::head::run(&args),
    };
    match result {
        Ok(code) => code,
        Err(e) if cmd::out::is_stdout_closed(&e) => ExitCode::from(cmd::out::STDOUT_CLOSED_EXIT),
        Err(e) => {
            // Errors quote what witnesses, packs and servers sent: escape
            // what could spoof the line (protocol.md §11.2).
            let text = error_chain(&e);
            errln!("tally: error: {}", tally_schemas::display::escape(&text));
            ExitCode::from(2)
        }
    }
}

/// `e` and its causes, joined by `: `, leaving out a cause whose text the
/// message already ends with (error types that print their source in
/// their own message would otherwise repeat it once per level).
fn error_chain(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let line = cause.to_string();
        if text.ends_with(&line) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&line);
    }
    text
}
