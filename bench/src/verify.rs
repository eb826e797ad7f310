//! `tally-bench verify`: the offline verifier's benchmark (docs/benchmarks.md
//! "Verify"). Generates valid packs of the given sizes, verifies each in a
//! child process (so its peak RSS is the verifier's alone), and prints
//! records/s, peak RSS (VmHWM), the CPU the child used (all threads, and the
//! reading thread alone) and the ratio to the raw strict Ed25519
//! verification rate of all cores, measured just before and just after the
//! pack on the same signed messages (the mean of the two, so that a load
//! that comes or goes during the run counts on both sides). Two raw rates:
//! decoding the public key for each signature, as libsodium's and
//! OpenSSL's verify do, and with the keys decoded once, as the verifier
//! does (about 9% faster; the stricter baseline). A benchmark, not a test.

use crate::out::outln;
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{bail, Context};
use tally_bench::pack::{bench_sample, write_bench_pack};
use tally_schemas::keys::{PublicKey, Signature};
use tally_schemas::note::NoteVerifier;
use tally_schemas::pack::AgentKeys;
use tally_schemas::report::Verdict;
use tally_verifier::{verify, VerifyOptions};

/// Arguments of `tally-bench verify`.
#[derive(Debug, clap::Args)]
pub(crate) struct VerifyArgs {
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

/// Runs `tally-bench verify`.
///
/// # Errors
/// I/O errors, a child that fails, a generated pack that does not pass.
pub(crate) fn run(v: &VerifyArgs) -> anyhow::Result<ExitCode> {
    match &v.one {
        Some(dir) => verify_one(dir, v.threads),
        None => bench(v),
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

/// CPU seconds (user + system) from a `/proc/.../stat` line: fields 14 and
/// 15 after the command name, in clock ticks of 1/100 s (Linux's
/// `USER_HZ` on every architecture tally runs on).
fn stat_cpu_secs(path: &str) -> f64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            let after = s.rsplit_once(')')?.1;
            let f: Vec<&str> = after.split_whitespace().collect();
            let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
            Some(ticks as f64 / 100.0)
        })
        .unwrap_or(0.0)
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
    // The whole process (the workers have exited, their time stays in the
    // total), and the main thread, which read the pack and ran the ordered
    // half of the checks.
    let cpu = stat_cpu_secs("/proc/self/stat");
    let reader = stat_cpu_secs(&format!("/proc/self/task/{}/stat", std::process::id()));
    outln!(
        "records={} secs={secs:.3} hwm_kb={} cpu_secs={cpu:.2} reader_cpu_secs={reader:.2} result={result}",
        v.report.records,
        vm_hwm_kb()
    )?;
    Ok(if result == "PASS" {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Strict verifications per second on `threads` cores, decoding the public
/// key for each signature (a key that does not decode, or is weak, counts
/// as a failed verification).
fn raw_rate(sample: &[([u8; 32], Vec<u8>, [u8; 64])], threads: usize) -> f64 {
    rate(sample, threads, |(k, m, sig)| {
        PublicKey::from_bytes(k)
            .is_ok_and(|key| key.verify_raw(m, &Signature::from_bytes(*sig)).is_ok())
    })
}

/// Strict verifications per second on `threads` cores with every key
/// decoded beforehand (the verifier decodes agent-keys.json once).
fn raw_rate_decoded(sample: &[(PublicKey, Vec<u8>, Signature)], threads: usize) -> f64 {
    rate(sample, threads, |(k, m, sig)| k.verify_raw(m, sig).is_ok())
}

/// Successful `check`s per second over `sample`, split across `threads`
/// scoped threads, for about 3 s.
fn rate<T: Sync>(sample: &[T], threads: usize, check: impl Fn(&T) -> bool + Sync) -> f64 {
    let chunk = sample.len().div_ceil(threads.max(1)).max(1);
    let check = &check;
    let started = Instant::now();
    let mut done = 0usize;
    while started.elapsed().as_secs_f64() < 3.0 {
        done += std::thread::scope(|s| {
            let parts: Vec<_> = sample
                .chunks(chunk)
                .map(|part| s.spawn(move || part.iter().filter(|x| check(x)).count()))
                .collect();
            parts
                .into_iter()
                .map(|h| h.join().unwrap_or(0))
                .sum::<usize>()
        });
    }
    done as f64 / started.elapsed().as_secs_f64()
}

/// A raw rate in verifications per wall-clock second and per CPU second.
#[derive(Clone, Copy)]
struct Raw {
    wall: f64,
    cpu: f64,
}

/// Both raw rates (key decoded per signature, keys decoded once), measured
/// one after the other. The per-CPU-second rate divides by this process's
/// CPU time over the measurement (it does nothing else meanwhile), which
/// other people's load on the machine does not change.
fn raw_rates(
    sample: &[([u8; 32], Vec<u8>, [u8; 64])],
    decoded: &[(PublicKey, Vec<u8>, Signature)],
    threads: usize,
) -> (Raw, Raw) {
    let measure = |f: &dyn Fn() -> f64| {
        let cpu0 = stat_cpu_secs("/proc/self/stat");
        let started = Instant::now();
        let wall = f();
        let secs = started.elapsed().as_secs_f64();
        let cpu = stat_cpu_secs("/proc/self/stat") - cpu0;
        Raw {
            wall,
            cpu: if cpu > 0.0 { wall * secs / cpu } else { 0.0 },
        }
    };
    (
        measure(&|| raw_rate(sample, threads)),
        measure(&|| raw_rate_decoded(decoded, threads)),
    )
}

/// One pack's figures.
struct Row {
    n: u64,
    mb: f64,
    secs: f64,
    rate: f64,
    cpu_rate: f64,
    cores: f64,
    reader_share: f64,
    rss_mb: f64,
    raw: Raw,
    raw_decoded: Raw,
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
    outln!(
        "tally bench verify: {threads} threads, {} agents, packs in {}",
        args.agents,
        dir.display()
    )?;
    let mut rows = Vec::new();
    let sample = bench_sample(20_000, args.agents);
    let decoded: Vec<(PublicKey, Vec<u8>, Signature)> = sample
        .iter()
        .map(|(k, m, s)| {
            PublicKey::from_bytes(k)
                .map(|k| (k, m.clone(), Signature::from_bytes(*s)))
                .context("a bench key that does not decode")
        })
        .collect::<anyhow::Result<_>>()?;
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
            outln!(
                "generated {n} records in {:.1} s",
                started.elapsed().as_secs_f64()
            )?;
        }
        let bytes = std::fs::metadata(d.join("pack.jsonl"))?.len();
        let before = raw_rates(&sample, &decoded, threads);
        let output = Command::new(std::env::current_exe()?)
            .args(["verify", "--threads", &threads.to_string(), "--one"])
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
        let after = raw_rates(&sample, &decoded, threads);
        let (records, secs, hwm) = (field("records=")?, field("secs=")?, field("hwm_kb=")?);
        let (cpu, reader) = (field("cpu_secs=")?, field("reader_cpu_secs=")?);
        let mean = |a: Raw, b: Raw| Raw {
            wall: f64::midpoint(a.wall, b.wall),
            cpu: f64::midpoint(a.cpu, b.cpu),
        };
        let raw = mean(before.0, after.0);
        let raw_decoded = mean(before.1, after.1);
        let rate = records / secs;
        let row = Row {
            n,
            mb: bytes as f64 / 1e6,
            secs,
            rate,
            cpu_rate: if cpu > 0.0 { records / cpu } else { 0.0 },
            cores: cpu / secs,
            reader_share: if cpu > 0.0 { reader / cpu } else { 0.0 },
            rss_mb: hwm / 1024.0,
            raw,
            raw_decoded,
        };
        outln!(
            "{n:>9} records  {:>7.1} MB  {secs:>7.2} s  {rate:>6.0} records/s ({:.0} per CPU s)  {:.2} cores ({:.0}% reading)  peak RSS {:>5.1} MB",
            row.mb,
            row.cpu_rate,
            row.cores,
            100.0 * row.reader_share,
            row.rss_mb,
        )?;
        outln!(
            "          raw strict Ed25519 {:.0}/s ({:.0} before, {:.0} after; {:.0} per CPU s): ratio {:.2}, per CPU s {:.2}; keys decoded once {:.0}/s ({:.0}, {:.0}; {:.0} per CPU s): ratio {:.2}, per CPU s {:.2}",
            raw.wall,
            before.0.wall,
            after.0.wall,
            raw.cpu,
            rate / raw.wall,
            row.cpu_rate / raw.cpu,
            raw_decoded.wall,
            before.1.wall,
            after.1.wall,
            raw_decoded.cpu,
            rate / raw_decoded.wall,
            row.cpu_rate / raw_decoded.cpu,
        )?;
        rows.push(row);
    }
    outln!()?;
    outln!("Raw rate: strict Ed25519 on {threads} threads over the same signed records, the mean of a measurement before and after the pack. A: key decoded for each signature; B: keys decoded once. \"per CPU s\": records (or signatures) per CPU second, which other load on the machine does not change.")?;
    outln!()?;
    outln!("| records | pack size | verify time | records/s | CPU used (cores) | reading thread | peak RSS (VmHWM) | raw A/s | ratio A | raw B/s | ratio B | ratio A per CPU s | ratio B per CPU s |")?;
    outln!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    for r in rows {
        outln!(
            "| {} | {:.0} MB | {:.2} s | {:.0} | {:.2} | {:.0}% | {:.1} MB | {:.0} | {:.2} | {:.0} | {:.2} | {:.2} | {:.2} |",
            r.n,
            r.mb,
            r.secs,
            r.rate,
            r.cores,
            100.0 * r.reader_share,
            r.rss_mb,
            r.raw.wall,
            r.rate / r.raw.wall,
            r.raw_decoded.wall,
            r.rate / r.raw_decoded.wall,
            r.cpu_rate / r.raw.cpu,
            r.cpu_rate / r.raw_decoded.cpu,
        )?;
    }
    Ok(ExitCode::SUCCESS)
}
