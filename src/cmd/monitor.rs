//! `tally monitor`: follow a log's checkpoints and prove each one consistent
//! with the last verified one (docs/protocol.md §7). On an inconsistency it
//! prints both signed checkpoints as evidence; with `--once` it exits 1,
//! otherwise it keeps alerting every interval. Errors exit 2 under `--once`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use tally_schemas::display::{escape, escape_lines};
use tally_schemas::note::NoteVerifier;
use tally_verifier::monitor::{Monitor, ProofSource, Round};

/// Arguments of `tally monitor`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The log's base URL (serving /checkpoint).
    #[arg(long, value_name = "URL")]
    pub log: String,
    /// The log's checkpoint key (the witness key) as a vkey, or a file
    /// holding it.
    #[arg(long, value_name = "VKEY")]
    pub witness_key: String,
    /// Where the last verified checkpoint is kept (written atomically).
    #[arg(long, value_name = "FILE")]
    pub state: PathBuf,
    /// Seconds between rounds.
    #[arg(long, value_name = "S", default_value_t = 60)]
    pub interval: u64,
    /// Run one round and exit: 0 consistent, 1 inconsistent, 2 error.
    #[arg(long)]
    pub once: bool,
    /// Rebuild consistency proofs from C2SP tiles instead of the JSON
    /// proof route.
    #[arg(long)]
    pub from_tiles: bool,
}

fn key(text: &str) -> anyhow::Result<NoteVerifier> {
    NoteVerifier::from_vkey(text).or_else(|e| {
        let path = std::path::Path::new(text);
        if path.is_file() {
            let body = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            NoteVerifier::from_vkey(body.trim())
                .with_context(|| format!("{}: not a vkey", path.display()))
        } else {
            Err(anyhow::anyhow!("--witness-key: {e}"))
        }
    })
}

/// Runs `tally monitor`.
///
/// # Errors
/// A bad key, and under `--once` any failed round (exit 2).
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let source = if args.from_tiles {
        ProofSource::Tiles
    } else {
        ProofSource::Json
    };
    let monitor = Monitor::new(
        &args.log,
        key(&args.witness_key)?,
        args.state.clone(),
        source,
    );
    loop {
        match monitor.check_once() {
            Ok(Round::First(cp)) => println!("first checkpoint: size {} root {}", cp.size, cp.root),
            Ok(Round::Unchanged(cp)) => println!("unchanged: size {}", cp.size),
            Ok(Round::Advanced { from, to }) => {
                println!("consistent: size {from} -> {} root {}", to.size, to.root)
            }
            Ok(Round::Inconsistent(evidence)) => {
                // The evidence quotes checkpoints a log served: escape
                // what could spoof a line (protocol.md §11.2).
                println!("{}", escape_lines(&evidence.to_string()));
                eprintln!("tally monitor: ALERT: {}", escape(&evidence.reason));
                if args.once {
                    return Ok(ExitCode::from(1));
                }
            }
            Err(e) => {
                if args.once {
                    return Err(e.into());
                }
                eprintln!("tally monitor: error: {}", escape(&e.to_string()));
            }
        }
        if args.once {
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(Duration::from_secs(args.interval.max(1)));
    }
}
