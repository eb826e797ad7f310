//! `tally-bench`: the benchmarks of docs/benchmarks.md and the log's load
//! generator, one subcommand each, outside the product (`cargo build
//! --release -p tally-bench`; the `tally` binary has none of them). Output
//! goes through `out` (a closed standard output is a quiet exit with
//! status 141, never a panic), so the print macros are denied here.

#![deny(clippy::print_stdout, clippy::print_stderr)]

mod ingest;
mod log_load;
mod out;
mod verify;

use std::io::Write as _;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// tally-bench: tally's benchmarks (docs/benchmarks.md) and the log's load
/// generator. Not part of the product.
#[derive(Debug, Parser)]
#[command(name = "tally-bench", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Ingest over HTTP into a witness: records/s, latency, ratio to raw Ed25519.
    Ingest(ingest::IngestArgs),
    /// The offline verifier: records/s, peak RSS, ratio to raw Ed25519.
    Verify(verify::VerifyArgs),
    /// Append to a redb log file from several agents until killed or until
    /// --records are acknowledged, one JSON line per receipt (the process
    /// the kill -9 loop kills, docs/storage.md "Recovery").
    LogLoad(log_load::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Ingest(args) => ingest::ingest(&args),
        Command::Verify(args) => verify::run(&args),
        Command::LogLoad(args) => Ok(log_load::run(&args)),
    };
    match result {
        Ok(code) => code,
        Err(e) if out::is_stdout_closed(&e) => ExitCode::from(out::STDOUT_CLOSED_EXIT),
        Err(e) => {
            // Errors quote what witnesses and servers sent: escape what
            // could spoof the line (protocol.md §11.2).
            let text = error_chain(&e);
            let _ = writeln!(
                std::io::stderr(),
                "tally-bench: error: {}",
                tally_schemas::display::escape(&text)
            );
            ExitCode::from(2)
        }
    }
}

/// `e` and its causes, joined by `: `, leaving out a cause whose text the
/// message already ends with (as the `tally` CLI prints them).
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
