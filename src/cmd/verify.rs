//! `tally verify`: verify a pack offline (docs/protocol.md §11). Prints one
//! line per check, the coverage lines and the result line (or the JSON
//! report); exit 0 pass, 1 fail, 2 usage or I/O error.
//!
//! A file given in the wrong place (agent-keys.json or head.json as the
//! pack, the pack and agent-keys.json swapped, …) is a usage error that
//! names what the file is and where it goes ([`FileKind`]), not a failed
//! pack or a JSON error (protocol.md §9.1).

use std::io::{BufReader, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use tally_schemas::limits::MAX_PACK_HEADER_BYTES;
use tally_schemas::note::NoteVerifier;
use tally_schemas::pack::{AgentKeys, Head};
use tally_schemas::report::Verdict;
use tally_verifier::trust::TrustFile;
use tally_verifier::{verify, VerifyError, VerifyOptions};

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// One line per check, coverage, result.
    Text,
    /// The report as JSON (schemas/json/report.schema.json).
    Json,
}

/// What `tally verify` and `tally report` check a pack with: the pack, its
/// trust anchors (docs/protocol.md §9.3, §11.1), head.json, the windows and
/// the disclosures.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Checked {
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
    /// A disclosure file (from `tally disclose`, docs/protocol.md §6.3) to
    /// check against its record's salted hashes; its content is printed.
    /// Repeatable. One that does not check fails the run.
    #[arg(long, value_name = "FILE")]
    pub disclosure: Vec<PathBuf>,
}

/// Arguments of `tally verify`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    pub check: Checked,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

/// The trust anchors and head.json of a run, read and checked.
pub(crate) struct Anchors {
    pub keys: AgentKeys,
    pub log: NoteVerifier,
    pub witnesses: Option<tally_verifier::trust::WitnessPolicy>,
    pub head: Option<Head>,
}

/// Reads the disclosure files (protocol.md §6.3).
pub(crate) fn read_disclosures(
    paths: &[PathBuf],
) -> anyhow::Result<Vec<(String, tally_schemas::disclosure::Disclosure)>> {
    use std::io::Read as _;
    paths
        .iter()
        .map(|p| {
            let mut bytes = Vec::new();
            std::fs::File::open(p)
                .with_context(|| format!("reading the disclosure {}", p.display()))?
                .take(tally_schemas::disclosure::MAX_DISCLOSURE_BYTES as u64 + 1)
                .read_to_end(&mut bytes)
                .with_context(|| format!("reading the disclosure {}", p.display()))?;
            let d = tally_schemas::disclosure::Disclosure::from_json(&bytes)
                .with_context(|| format!("--disclosure {}", p.display()))?;
            Ok((p.display().to_string(), d))
        })
        .collect()
}

/// Reads the trust anchors and head.json given to `tally verify` or
/// `tally report`, refusing files given in the wrong place.
pub(crate) fn anchors(args: &Checked) -> anyhow::Result<Anchors> {
    check_pack_argument(args)?;
    let keys = AgentKeys::from_json(&read(&args.agent_keys, "agent keys")?)
        .with_context(|| format!("{}", args.agent_keys.display()))
        .map_err(|e| {
            explain(
                &args.agent_keys,
                FileKind::AgentKeys,
                "agent keys (--agent-keys)",
                e,
            )
        })?;
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
        Some(p) => Some(
            Head::from_json(&read(p, "head")?)
                .with_context(|| format!("{}", p.display()))
                .map_err(|e| explain(p, FileKind::Head, "head.json (--head)", e))?,
        ),
        None => None,
    };
    Ok(Anchors {
        keys,
        log,
        witnesses,
        head,
    })
}

/// What a file given to `tally verify` holds, judged by its shape: the
/// members its first JSON object has (protocol.md §9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileKind {
    /// A first line with a `type` member: a pack (§9.1).
    Pack,
    /// `v`, `origin`, `agents`: agent-keys.json (§9.3).
    AgentKeys,
    /// `v`, `checkpoint`, `from_size`, `consistency`: head.json (§9.4).
    Head,
    /// `v`, `origin`, `keys`: the witness's key directory (§4.5).
    KeyDirectory,
    /// A pinned trust file (§11.1).
    Trust,
    /// Anything else: left to the parser that expects it.
    Other,
}

/// Bytes read to judge a file that is not a pack by its first line.
const MAX_IDENTIFY_BYTES: u64 = 16 << 20;

impl FileKind {
    fn of(path: &Path) -> Self {
        use std::io::{BufRead as _, Read as _};
        let Ok(file) = std::fs::File::open(path) else {
            return Self::Other;
        };
        let mut first = Vec::new();
        let limit = u64::try_from(MAX_PACK_HEADER_BYTES).unwrap_or(u64::MAX) + 1;
        if BufReader::new(file.take(limit))
            .read_until(b'\n', &mut first)
            .is_err()
        {
            return Self::Other;
        }
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&first) {
            return Self::of_json(&v);
        }
        let mut whole = Vec::new();
        if std::fs::File::open(path)
            .and_then(|f| f.take(MAX_IDENTIFY_BYTES).read_to_end(&mut whole))
            .is_err()
        {
            return Self::Other;
        }
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&whole) {
            return Self::of_json(&v);
        }
        match std::str::from_utf8(&whole) {
            Ok(text) if TrustFile::parse(text).is_ok() => Self::Trust,
            _ => Self::Other,
        }
    }

    fn of_json(v: &serde_json::Value) -> Self {
        let Some(o) = v.as_object() else {
            return Self::Other;
        };
        let has = |names: &[&str]| names.iter().all(|n| o.contains_key(*n));
        if o.get("type").is_some_and(serde_json::Value::is_string) {
            Self::Pack
        } else if has(&["v", "checkpoint", "from_size", "consistency"]) {
            Self::Head
        } else if has(&["v", "origin", "agents"]) {
            Self::AgentKeys
        } else if has(&["v", "origin", "keys"]) {
            Self::KeyDirectory
        } else {
            Self::Other
        }
    }

    fn what(self) -> &'static str {
        match self {
            Self::Pack => "a pack",
            Self::AgentKeys => "agent keys (agent-keys.json, from `tally keys export`)",
            Self::Head => "head.json (a newer checkpoint, from `tally head`)",
            Self::KeyDirectory => "the witness's key directory (/.well-known/tally/keys)",
            Self::Trust => "a trust file",
            Self::Other => "not recognised",
        }
    }

    fn goes(self) -> &'static str {
        match self {
            Self::Pack => {
                "the pack is the first argument: tally verify PACK --agent-keys agent-keys.json"
            }
            Self::AgentKeys => "give it with --agent-keys",
            Self::Head => "give it with --head",
            Self::KeyDirectory => {
                "tally verify does not read it: give the witness key with --witness-key"
            }
            Self::Trust => "give it with --trust",
            Self::Other => "",
        }
    }
}

/// The usage error for `path`, which holds `kind` where `expected` goes.
fn wrong_file(path: &Path, kind: FileKind, expected: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "{} is {}, not {expected}; {}",
        path.display(),
        kind.what(),
        kind.goes()
    )
}

/// Refuses a pack argument that is another of tally's files.
fn check_pack_argument(args: &Checked) -> anyhow::Result<()> {
    let kind = FileKind::of(&args.pack);
    if matches!(kind, FileKind::Pack | FileKind::Other) {
        return Ok(());
    }
    if kind == FileKind::AgentKeys && FileKind::of(&args.agent_keys) == FileKind::Pack {
        bail!(
            "the pack and the agent keys are swapped: {} is a pack and {} is agent keys; run tally verify PACK --agent-keys agent-keys.json",
            args.agent_keys.display(),
            args.pack.display()
        );
    }
    Err(wrong_file(&args.pack, kind, "a pack (the first argument)"))
}

/// When `path` did not parse as `expected`, says what it is instead if it
/// is another of tally's files; else the parse error as it was.
fn explain(path: &Path, expected: FileKind, label: &str, e: anyhow::Error) -> anyhow::Error {
    match FileKind::of(path) {
        FileKind::Other => e,
        k if k == expected => e,
        FileKind::Pack if expected == FileKind::AgentKeys => anyhow::anyhow!(
            "{} is a pack, not {label}: were the pack and the agent keys swapped? {}",
            path.display(),
            FileKind::Pack.goes()
        ),
        k => wrong_file(path, k, label),
    }
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
                let body = body.trim();
                NoteVerifier::from_vkey(body).map_err(|e| {
                    cosigner_key(body)
                        .unwrap_or_else(|| anyhow::anyhow!("{}: not a vkey: {e}", path.display()))
                })
            } else {
                Err(cosigner_key(text).unwrap_or_else(|| anyhow::anyhow!("--witness-key: {e}")))
            }
        }
    }
}

/// The error for a cosigner's key given as the log's (§14: a cosigner key's
/// type byte is 0x04, a log key's 0x01): it belongs in a trust file.
fn cosigner_key(vkey: &str) -> Option<anyhow::Error> {
    tally_schemas::cosignature::CosignatureVerifier::from_vkey(vkey)
        .ok()
        .map(|c| {
            anyhow::anyhow!(
                "--witness-key: {} is a cosigner's key (a timestamped cosignature key, type 0x04), not a log's: give the log's key (the witness key its `tally serve` printed) with --witness-key, and trust cosigners with --trust FILE, a trust file with the lines `log <the log's key>`, `witness {}` and `quorum 1` (docs/protocol.md §11.1)",
                c.name(),
                vkey
            )
        })
}

/// Runs `tally verify`.
///
/// # Errors
/// Usage and I/O errors (exit 2): unreadable files, a bad key, an
/// unsupported pack version, input that is not a pack.
pub(crate) fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let format = args.format;
    let args = &args.check;
    let Anchors {
        keys,
        log,
        witnesses,
        head,
    } = anchors(args)?;
    let disclosures = read_disclosures(&args.disclosure)?;
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
    let reader = BufReader::with_capacity(1 << 20, file);
    let result = if disclosures.is_empty() {
        verify(reader, &keys, &log, head.as_ref(), options)
    } else {
        tally_verifier::audit(
            reader,
            &keys,
            &log,
            head.as_ref(),
            options,
            tally_verifier::AuditOptions {
                period: tally_verifier::Period::default(),
                disclosures,
            },
        )
        .map(|a| a.verification)
    };
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let verification =
        result.map_err(|e: VerifyError| anyhow::anyhow!("{}: {e}", args.pack.display()))?;
    let mut out = super::out::stdout();
    match format {
        Format::Text => out.write_all(verification.to_text().as_bytes())?,
        Format::Json => {
            // Serialised first: an I/O error inside serde_json would hide
            // a closed standard output from `main`.
            let mut json = serde_json::to_vec(&verification.report)?;
            json.push(b'\n');
            out.write_all(&json)?;
        }
    }
    out.flush()?;
    Ok(match verification.report.result {
        Verdict::Pass => ExitCode::SUCCESS,
        Verdict::Fail => ExitCode::from(1),
    })
}
