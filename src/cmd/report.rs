//! `tally report`: verify a pack as `tally verify` does, with the same trust
//! anchors, and write the audit report (docs/protocol.md §11.3): one
//! self-contained HTML page, or the same content as JSON
//! (schemas/json/audit-report.schema.json). Exit 0 pass, 1 fail (the report
//! is written either way), 2 usage or I/O error.

use std::io::{BufReader, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use sha2::{Digest, Sha256};
use tally_schemas::audit::{AuditReport, PackInfo, Period, TrustInfo, AUDIT_REPORT_VERSION};
use tally_schemas::report::Verdict;
use tally_schemas::UnixMillis;
use tally_verifier::{AuditOptions, VerifyOptions};

use super::verify::{anchors, read_disclosures, Anchors, Checked};

/// Output format of `tally report`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ReportFormat {
    /// One self-contained HTML page, printable to PDF.
    Html,
    /// The same content as JSON (schemas/json/audit-report.schema.json).
    Json,
}

/// Arguments of `tally report`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The pack, its trust anchors, head.json, windows and disclosures, as
    /// for `tally verify`.
    #[command(flatten)]
    pub check: Checked,
    /// The per-agent figures cover records made at or after this time
    /// (RFC 3339, e.g. 2026-12-01T00:00:00Z); the checks cover the whole
    /// pack.
    #[arg(long, value_name = "TIME")]
    pub from: Option<String>,
    /// ... and before this time (RFC 3339).
    #[arg(long, value_name = "TIME")]
    pub to: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = ReportFormat::Html)]
    pub format: ReportFormat,
    /// Write the report here (default: standard output).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// A shell word: as it is when it is plain, else in single quotes.
fn shell_word(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=+@%,".contains(&b));
    if plain {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The `tally verify` command that makes the same verification.
pub(crate) fn verify_command(a: &Checked) -> String {
    let mut words = vec![
        "tally".to_owned(),
        "verify".to_owned(),
        shell_word(&a.pack.display().to_string()),
        "--agent-keys".to_owned(),
        shell_word(&a.agent_keys.display().to_string()),
    ];
    if let Some(t) = &a.trust {
        words.extend(["--trust".to_owned(), shell_word(&t.display().to_string())]);
    } else if let Some(k) = &a.witness_key {
        words.extend(["--witness-key".to_owned(), shell_word(k)]);
    }
    if let Some(h) = &a.head {
        words.extend(["--head".to_owned(), shell_word(&h.display().to_string())]);
    }
    if a.max_skew != 300 {
        words.extend(["--max-skew".to_owned(), a.max_skew.to_string()]);
    }
    if a.grace != 300 {
        words.extend(["--grace".to_owned(), a.grace.to_string()]);
    }
    for d in &a.disclosure {
        words.extend([
            "--disclosure".to_owned(),
            shell_word(&d.display().to_string()),
        ]);
    }
    words.join(" ")
}

/// Reads through to the verifier and hashes what passes (the pack's
/// SHA-256 in the same pass).
struct Hashing<R> {
    inner: R,
    hash: Sha256,
    bytes: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

fn parse_time(flag: &str, text: &Option<String>) -> anyhow::Result<Option<UnixMillis>> {
    text.as_deref()
        .map(|t| {
            UnixMillis::parse_rfc3339(t).map_err(|e| {
                anyhow::anyhow!(
                    "{flag} {t:?}: not an RFC 3339 time such as 2026-12-01T00:00:00Z: {e}"
                )
            })
        })
        .transpose()
}

fn sha256_file(path: &std::path::Path) -> anyhow::Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(hex::encode(Sha256::digest(&bytes)))
}

/// Verifies and builds the audit report; `Ok` for a failing pack too.
pub(crate) fn build(args: &Args) -> anyhow::Result<AuditReport> {
    let from = parse_time("--from", &args.from)?;
    let to = parse_time("--to", &args.to)?;
    if let (Some(f), Some(t)) = (from, to) {
        if f >= t {
            anyhow::bail!("--from {} is not before --to {}", f, t);
        }
    }
    let Anchors {
        keys,
        log,
        witnesses,
        head,
    } = anchors(&args.check)?;
    let disclosures = read_disclosures(&args.check.disclosure)?;
    let file = std::fs::File::open(&args.check.pack)
        .with_context(|| format!("opening the pack {}", args.check.pack.display()))?;
    let mut reader = BufReader::with_capacity(
        1 << 20,
        Hashing {
            inner: file,
            hash: Sha256::new(),
            bytes: 0,
        },
    );
    let options = VerifyOptions {
        max_skew_ms: args.check.max_skew.saturating_mul(1000),
        grace_ms: args.check.grace.saturating_mul(1000),
        threads: args.check.threads,
        witnesses: witnesses.as_ref(),
        progress: None,
    };
    let audited = tally_verifier::audit(
        &mut reader,
        &keys,
        &log,
        head.as_ref(),
        options,
        AuditOptions {
            period: tally_verifier::Period { from, to },
            disclosures,
        },
    )
    .map_err(|e| anyhow::anyhow!("{}: {e}", args.check.pack.display()))?;
    // The verifier stops at the end of the pack; hash anything it left.
    std::io::copy(&mut reader, &mut std::io::sink())?;
    let hashing = reader.into_inner();
    let (sections, statements) =
        tally_verifier::audit::sections(&audited.verification.report, audited.sections);
    let policy = witnesses.as_ref();
    Ok(AuditReport {
        v: AUDIT_REPORT_VERSION,
        tally_version: env!("CARGO_PKG_VERSION").to_owned(),
        generated: UnixMillis::now().to_rfc3339().unwrap_or_default(),
        pack: PackInfo {
            file: args.check.pack.display().to_string(),
            sha256: hex::encode(hashing.hash.finalize()),
            bytes: hashing.bytes,
        },
        trust: TrustInfo {
            agent_keys_file: args.check.agent_keys.display().to_string(),
            agent_keys_sha256: sha256_file(&args.check.agent_keys)?,
            origin: keys.origin.clone(),
            log_key: log.vkey(),
            trust_file: args.check.trust.as_ref().map(|p| p.display().to_string()),
            cosigners: policy
                .map(|p| p.witnesses.iter().map(|w| w.vkey()).collect())
                .unwrap_or_default(),
            quorum: policy.map_or(0, |p| p.quorum as u64),
            head_file: args.check.head.as_ref().map(|p| p.display().to_string()),
        },
        period: Period {
            from: from.and_then(|t| t.to_rfc3339().ok()),
            to: to.and_then(|t| t.to_rfc3339().ok()),
        },
        command: verify_command(&args.check),
        verification: audited.verification.report,
        agents: sections,
        statements,
    })
}

/// Runs `tally report`.
///
/// # Errors
/// As `tally verify`, and a bad `--from`/`--to` or an unwritable output.
pub(crate) fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let report = build(args)?;
    let bytes = match args.format {
        ReportFormat::Html => tally_verifier::audit::render_html(&report).into_bytes(),
        ReportFormat::Json => {
            let mut v = serde_json::to_vec(&report)?;
            v.push(b'\n');
            v
        }
    };
    match &args.output {
        Some(p) => std::fs::write(p, &bytes)
            .with_context(|| format!("writing the report {}", p.display()))?,
        None => {
            let mut out = super::out::stdout();
            out.write_all(&bytes)?;
            out.flush()?;
        }
    }
    Ok(match report.verification.result {
        Verdict::Pass => ExitCode::SUCCESS,
        Verdict::Fail => ExitCode::from(1),
    })
}
