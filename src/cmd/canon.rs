//! `tally canon`: print a JSON document's RFC 8785 canonical form.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use tally_schemas::canonical::{canonicalize_bytes, Limits};
use tally_schemas::limits::MAX_TOOL_DEFINITION_BYTES;

/// Arguments of `tally canon`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The JSON file, or - for standard input.
    pub file: PathBuf,
    /// Also print the SHA-256 of the canonical bytes on a second line.
    #[arg(long)]
    pub hash: bool,
}

/// Runs `tally canon`.
///
/// # Errors
/// I/O errors and refused documents (exit 2).
pub(crate) fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let mut bytes = Vec::new();
    if args.file.as_os_str() == "-" {
        std::io::stdin()
            .read_to_end(&mut bytes)
            .context("reading standard input")?;
    } else {
        bytes = std::fs::read(&args.file)
            .with_context(|| format!("reading {}", args.file.display()))?;
    }
    let limits = Limits {
        max_bytes: MAX_TOOL_DEFINITION_BYTES,
        max_depth: tally_schemas::limits::MAX_TOOL_DEFINITION_DEPTH,
    };
    let canonical = canonicalize_bytes(&bytes, limits).context("refused")?;
    let mut out = super::out::stdout();
    out.write_all(&canonical)?;
    out.write_all(b"\n")?;
    if args.hash {
        writeln!(out, "{}", tally_schemas::Hash::sha256(&canonical))?;
    }
    Ok(ExitCode::SUCCESS)
}
