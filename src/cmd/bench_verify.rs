//! `tally bench verify`: the offline verifier's benchmark (docs/benchmarks.md
//! "Verify"). Generates valid packs of the given sizes, verifies each in a
//! child process (so its peak RSS is the verifier's alone), and prints
//! records/s, peak RSS (VmHWM) and the ratio to the raw strict Ed25519
//! verification rate of all cores measured in the same run on the same
//! signed messages. A benchmark, not a test.

use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{bail, Context};
use tally_schemas::note::NoteVerifier;
use tally_schemas::pack::AgentKeys;
use tally_schemas::report::Verdict;
use tally_verifier::fixture::{bench_sample, write_bench_pack};
use tally_verifier::sig::verify_many;
use tally_verifier::{verify, VerifyOptions};

/// Arguments of `tally bench`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub what: What,
}

/// What to benchmark.
#[derive(Debug, clap::Subcommand)]
pub enum What {
    /// The offline verifier: records/s, peak RSS, ratio to raw Ed25519.
    Verify(VerifyArgs),
    /// Ingest over HTTP into a witness: records/s, latency, ratio to raw Ed25519.
    Ingest(super::bench_ingest::IngestArgs),
}

/// Arguments of `tally bench verify`.
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// Pack sizes in records.
    #[arg(long, value_delimiter = ',', default_values_t = [10_000u64, 100_000, 1_000_000])]
    pub sizes: Vec<u64>,
    /// Agents per pack.
    #[arg(long, default_value_t = 64)]
    pub agents: u64,
    /// Where packs are kept (reused when already complete); default a
    /// directory under the system temp dir.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Threads for verification and for the raw rate (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Internal: verify the pack in this directory and print one result line.
    #[arg(long, hide = true)]
    pub one: Option<PathBuf>,
}

/// Runs `tally bench`.
///
/// # Errors
/// I/O errors, a child that fails, a generated pack that does not pass.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    match &args.what {
        What::Verify(v) => match &v.one {
            Some(dir) => verify_one(dir, v.threads),
            None => bench(v),
        },
        What::Ingest(a) => super::bench_ingest::ingest(a),
    }
}

fn vm_hwm_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|n| n.parse().ok()))
        })
        .unwrap_or(0)
}

fn verify_one(dir: &Path, threads: usize) -> anyhow::Result<ExitCode> {
    let keys = AgentKeys::from_json(&std::fs::read(dir.join("agent-keys.json"))?)?;
    let key = NoteVerifier::from_vkey(std::fs::read_to_string(dir.join("log.vkey"))?.trim())?;
    let file = std::fs::File::open(dir.join("pack.jsonl"))?;
    let started = Instant::now();
    let options = VerifyOptions {
        threads,
        ..VerifyOptions::default()
    };
    let v = verify(
        BufReader::with_capacity(1 << 20, file),
        &keys,
        &key,
        None,
        options,
    )?;
    let secs = started.elapsed().as_secs_f64();
    let result = if v.report.result == Verdict::Pass {
        "PASS"
    } else {
        "FAIL"
    };
    println!(
        "records={} secs={secs:.3} hwm_kb={} result={result}",
        v.report.records,
        vm_hwm_kb()
    );
    Ok(if result == "PASS" {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn raw_rate(sample: &[([u8; 32], Vec<u8>, [u8; 64])], threads: usize) -> f64 {
    let started = Instant::now();
    let mut done = 0usize;
    while started.elapsed().as_secs_f64() < 3.0 {
        let ok = verify_many(sample, threads);
        done += ok.iter().filter(|x| **x).count();
    }
    done as f64 / started.elapsed().as_secs_f64()
}

fn bench(args: &VerifyArgs) -> anyhow::Result<ExitCode> {
    let threads = if args.threads == 0 {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    } else {
        args.threads
    };
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("tally-bench-verify"));
    println!(
        "tally bench verify: {threads} threads, {} agents, packs in {}",
        args.agents,
        dir.display()
    );
    let mut rows = Vec::new();
    let sample = bench_sample(20_000, args.agents);
    for &n in &args.sizes {
        let d = dir.join(n.to_string());
        if !d.join("complete").exists() {
            std::fs::create_dir_all(&d)?;
            let started = Instant::now();
            let mut out =
                BufWriter::with_capacity(1 << 20, std::fs::File::create(d.join("pack.jsonl"))?);
            let made = write_bench_pack(&mut out, n, args.agents, threads)?;
            out.flush()?;
            std::fs::write(
                d.join("agent-keys.json"),
                tally_schemas::canonical::canonicalize(&made.keys).context("keys")?,
            )?;
            std::fs::write(d.join("log.vkey"), format!("{}\n", made.vkey))?;
            std::fs::write(d.join("complete"), b"")?;
            println!(
                "generated {n} records in {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
        let bytes = std::fs::metadata(d.join("pack.jsonl"))?.len();
        let raw = raw_rate(&sample, threads);
        let output = Command::new(std::env::current_exe()?)
            .args([
                "bench",
                "verify",
                "--threads",
                &threads.to_string(),
                "--one",
            ])
            .arg(&d)
            .output()?;
        let line = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        if !output.status.success() {
            bail!(
                "verifying {}: {line} {}",
                d.display(),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let field = |k: &str| -> anyhow::Result<f64> {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(k).and_then(|v| v.parse().ok()))
                .with_context(|| format!("no {k} in {line:?}"))
        };
        let (records, secs, hwm) = (field("records=")?, field("secs=")?, field("hwm_kb=")?);
        let rate = records / secs;
        rows.push((n, bytes, secs, rate, hwm / 1024.0, raw, rate / raw));
        println!(
            "{n:>9} records  {:>7.1} MB  {secs:>7.2} s  {rate:>9.0} records/s  peak RSS {:>6.1} MB  raw strict Ed25519 {raw:>8.0}/s  ratio {:.2}",
            bytes as f64 / 1e6,
            hwm / 1024.0,
            rate / raw
        );
    }
    println!();
    println!("| records | pack size | verify time | records/s | peak RSS (VmHWM) | raw strict Ed25519/s ({threads} threads) | ratio |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for (n, bytes, secs, rate, mb, raw, ratio) in rows {
        println!(
            "| {n} | {:.0} MB | {secs:.2} s | {rate:.0} | {mb:.1} MB | {raw:.0} | {ratio:.2} |",
            bytes as f64 / 1e6
        );
    }
    Ok(ExitCode::SUCCESS)
}
