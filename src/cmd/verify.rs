//! `tally verify`: verify a pack offline (docs/protocol.md §11). Prints one
//! line per check, the coverage lines and the result line (or the JSON
//! report); exit 0 pass, 1 fail, 2 usage or I/O error.

use std::io::{BufReader, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use tally_schemas::note::NoteVerifier;
use tally_schemas::pack::{AgentKeys, Head};
use tally_schemas::report::Verdict;
use tally_verifier::trust::TrustFile;
use tally_verifier::{verify, VerifyError, VerifyOptions};

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One line per check, coverage, result.
    Text,
    /// The report as JSON (schemas/json/report.schema.json).
    Json,
}

/// Arguments of `tally verify`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The pack (JSON Lines).
    pub pack: PathBuf,
    /// The agents' public keys (agent-keys.json), from the operator, never
    /// from the pack (`tally keys export`).
    #[arg(long, value_name = "FILE")]
    pub agent_keys: PathBuf,
    /// The log's checkpoint key (the witness key) as a vkey, or a file
    /// holding it.
    #[arg(
        long,
        value_name = "VKEY",
        required_unless_present = "trust",
        conflicts_with = "trust"
    )]
    pub witness_key: Option<String>,
    /// A pinned trust file naming the log key and optional witness
    /// cosigners with a quorum (docs/protocol.md §11.1).
    #[arg(long, value_name = "FILE")]
    pub trust: Option<PathBuf>,
    /// head.json: a newer checkpoint and each agent's latest record, to show
    /// nothing was cut from the end.
    #[arg(long, value_name = "FILE")]
    pub head: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Skew bound between agent and witness time, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    pub max_skew: u64,
    /// Grace window for decisions without an outcome, in seconds before the
    /// pack was made.
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    pub grace: u64,
    /// Worker threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

fn read(path: &Path, what: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {what} {}", path.display()))
}

/// A vkey given inline, or the first line of a file holding one.
fn log_key(text: &str) -> anyhow::Result<NoteVerifier> {
    match NoteVerifier::from_vkey(text) {
        Ok(v) => Ok(v),
        Err(e) => {
            let path = Path::new(text);
            if path.is_file() {
                let body = String::from_utf8(read(path, "the witness key file")?)
                    .context("the witness key file is not UTF-8")?;
                NoteVerifier::from_vkey(body.trim())
                    .with_context(|| format!("{}: not a vkey", path.display()))
            } else {
                bail!("--witness-key: {e}")
            }
        }
    }
}

/// Runs `tally verify`.
///
/// # Errors
/// Usage and I/O errors (exit 2): unreadable files, a bad key, an
/// unsupported pack version, input that is not a pack.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let keys = AgentKeys::from_json(&read(&args.agent_keys, "agent keys")?)
        .with_context(|| format!("{}", args.agent_keys.display()))?;
    let (log, witnesses) = match (&args.trust, &args.witness_key) {
        (Some(path), _) => {
            let text = String::from_utf8(read(path, "the trust file")?)
                .context("the trust file is not UTF-8")?;
            let t = TrustFile::parse(&text).with_context(|| format!("{}", path.display()))?;
            (t.log, Some(t.witnesses))
        }
        (None, Some(k)) => (log_key(k)?, None),
        (None, None) => bail!("give --witness-key or --trust"),
    };
    let head = match &args.head {
        Some(p) => {
            Some(Head::from_json(&read(p, "head")?).with_context(|| format!("{}", p.display()))?)
        }
        None => None,
    };
    let file = std::fs::File::open(&args.pack)
        .with_context(|| format!("opening the pack {}", args.pack.display()))?;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let bar = if std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new(len);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "verifying {bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        ) {
            bar.set_style(style);
        }
        Some(bar)
    } else {
        None
    };
    let mut progress = |bytes: u64| {
        if let Some(b) = &bar {
            b.set_position(bytes);
        }
    };
    let options = VerifyOptions {
        max_skew_ms: args.max_skew.saturating_mul(1000),
        grace_ms: args.grace.saturating_mul(1000),
        threads: args.threads,
        witnesses: witnesses.as_ref(),
        progress: Some(&mut progress),
    };
    let result = verify(
        BufReader::with_capacity(1 << 20, file),
        &keys,
        &log,
        head.as_ref(),
        options,
    );
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let verification =
        result.map_err(|e: VerifyError| anyhow::anyhow!("{}: {e}", args.pack.display()))?;
    let mut out = std::io::stdout().lock();
    match args.format {
        Format::Text => out.write_all(verification.to_text().as_bytes())?,
        Format::Json => {
            serde_json::to_writer(&mut out, &verification.report)?;
            out.write_all(b"\n")?;
        }
    }
    out.flush()?;
    Ok(match verification.report.result {
        Verdict::Pass => ExitCode::SUCCESS,
        Verdict::Fail => ExitCode::from(1),
    })
}
