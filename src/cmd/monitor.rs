//! `tally monitor`: follow a log's checkpoints and prove each one consistent
//! with the last verified one (docs/protocol.md §7). On an inconsistency it
//! prints both signed checkpoints as evidence; with `--once` it exits 1,
//! otherwise it keeps alerting every interval. Errors exit 2 under `--once`.
//! With `--trust` (the trust file of `tally verify`, protocol.md §11.1) it
//! also checks each checkpoint for the file's quorum of cosignatures and
//! alerts, printing the checkpoint, when it is not met.

use super::out::{errln, outln};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use tally_schemas::display::{escape, escape_lines};
use tally_schemas::note::NoteVerifier;
use tally_verifier::monitor::{Cosignatures, Monitor, ProofSource, Round};
use tally_verifier::trust::TrustFile;

/// Arguments of `tally monitor`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The log's base URL (serving /checkpoint).
    #[arg(long, value_name = "URL")]
    pub log: String,
    /// The log's checkpoint key (the witness key) as a vkey, or a file
    /// holding it.
    #[arg(
        long,
        value_name = "VKEY",
        required_unless_present = "trust",
        conflicts_with = "trust"
    )]
    pub witness_key: Option<String>,
    /// A trust file (as for `tally verify --trust`): the log key, and
    /// cosigners whose quorum of cosignatures every checkpoint must carry
    /// (docs/protocol.md §11.1).
    #[arg(long, value_name = "FILE")]
    pub trust: Option<PathBuf>,
    /// Where the last verified checkpoint is kept (written atomically).
    #[arg(long, value_name = "FILE")]
    pub state: PathBuf,
    /// Seconds between rounds.
    #[arg(long, value_name = "S", default_value_t = 60)]
    pub interval: u64,
    /// Run one round and exit: 0 consistent (and the quorum met), 1
    /// inconsistent or the quorum not met, 2 error.
    #[arg(long)]
    pub once: bool,
    /// Rebuild consistency proofs from C2SP tiles instead of the JSON
    /// proof route.
    #[arg(long)]
    pub from_tiles: bool,
    /// A read token (`tallyread_…`) for a witness run with `--log-read
    /// token`, sent as `Authorization: Bearer`; the operator makes it with
    /// `tally read-token create`.
    #[arg(long, env = "TALLY_READ_TOKEN", hide_env_values = true)]
    pub read_token: Option<String>,
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
pub(crate) fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let source = if args.from_tiles {
        ProofSource::Tiles
    } else {
        ProofSource::Json
    };
    let (log_key, cosigners) = match (&args.trust, &args.witness_key) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading the trust file {}", path.display()))?;
            let t = TrustFile::parse(&text).with_context(|| format!("{}", path.display()))?;
            (t.log, Some(t.witnesses))
        }
        (None, Some(k)) => (key(k)?, None),
        (None, None) => anyhow::bail!("give --witness-key or --trust"),
    };
    let mut monitor = Monitor::new(&args.log, log_key, args.state.clone(), source);
    if let Some(policy) = cosigners {
        monitor = monitor.with_cosigners(policy);
    }
    if let Some(token) = &args.read_token {
        monitor = monitor.with_read_token(token.trim().to_owned());
    }
    loop {
        let mut alert = false;
        let round = match monitor.check_round() {
            Ok(checked) => {
                match checked.cosignatures {
                    Some(Cosignatures::Met { count, quorum }) => {
                        outln!("cosignatures: {count} trusted cosigners (quorum {quorum})")?;
                    }
                    Some(Cosignatures::NotMet { note, reason }) => {
                        // The note is what the log served: escape what
                        // could spoof a line (protocol.md §11.2).
                        outln!(
                            "QUORUM NOT MET: {}\n--- checkpoint ---\n{}",
                            escape(&reason),
                            escape_lines(&note)
                        )?;
                        errln!(
                            "tally monitor: ALERT: cosignature quorum not met: {}",
                            escape(&reason)
                        );
                        alert = true;
                    }
                    None => {}
                }
                Ok(checked.round)
            }
            Err(e) => Err(e),
        };
        match round {
            Ok(Round::First(cp)) => outln!("first checkpoint: size {} root {}", cp.size, cp.root)?,
            Ok(Round::Unchanged(cp)) => outln!("unchanged: size {}", cp.size)?,
            Ok(Round::Advanced { from, to }) => {
                outln!("consistent: size {from} -> {} root {}", to.size, to.root)?
            }
            Ok(Round::Inconsistent(evidence)) => {
                // The evidence quotes checkpoints a log served: escape
                // what could spoof a line (protocol.md §11.2).
                outln!("{}", escape_lines(&evidence.to_string()))?;
                errln!("tally monitor: ALERT: {}", escape(&evidence.reason));
                alert = true;
            }
            Err(e) => {
                if args.once {
                    return Err(e.into());
                }
                errln!("tally monitor: error: {}", escape(&e.to_string()));
            }
        }
        if args.once {
            return Ok(if alert {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            });
        }
        std::thread::sleep(Duration::from_secs(args.interval.max(1)));
    }
}
