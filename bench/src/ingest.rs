//! `tally-bench ingest`: the ingest benchmark of docs/benchmarks.md
//! "Ingest" (not a test).
//! It pre-signs records for many agents, posts them over keep-alive HTTP at
//! a set concurrency to a witness (one it starts, the `tally` binary's
//! `tally serve` on a temp data folder, or `--witness URL`), and reports records/s, latency
//! p50/p99/p999 and errors; in the same run it measures the raw strict
//! Ed25519 verifications/s of one process on all cores, and prints the ratio
//! (DESIGN.md's target: at least 0.5). While posting it also times a small
//! durable write (4 KiB and `fdatasync`, every 10 ms) on the witness's disk:
//! a receipt waits for its group commit's sync, so the disk's own stalls are
//! the floor under the latency percentiles. Results: docs/benchmarks.md
//! "Ingest".

use crate::out::outln;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rand_core::{OsRng, RngCore};
use serde_json::json;
use tally_schemas::record::NoteBody;
use tally_schemas::record::RECORD_SIGNATURE_DOMAIN;
use tally_schemas::{AgentName, Body, Nonce, Record, SecretKey, Seq, UnixMillis, UnsignedRecord};

/// Arguments of `tally-bench ingest`.
#[derive(Debug, clap::Args)]
pub(crate) struct IngestArgs {
    /// Records to post in all.
    #[arg(long, default_value_t = 40_000)]
    pub records: usize,
    /// Agents (chains); each is posted in order, so at most one record per
    /// agent is in flight.
    #[arg(long, default_value_t = 256)]
    pub agents: usize,
    /// Requests in flight.
    #[arg(long, default_value_t = 128)]
    pub concurrency: usize,
    /// Records per request: 1 posts each record to `POST /v1/records`; more
    /// sends each worker's records (its agents' chains in order) to `POST
    /// /v1/records/batch` in batches of this many (at most 256).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub batch: u16,
    /// Offered load in records per second, spread evenly over the workers
    /// (default: as fast as the witness answers). Latency is then measured
    /// from each request's scheduled start, so a witness that falls behind
    /// shows it in the percentiles.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Seconds of the raw verification measurement.
    #[arg(long, default_value_t = 3.0)]
    pub verify_secs: f64,
    /// Post to this witness instead of starting one (it needs --api-key, its
    /// rate limit should be off, and its --max-skew must cover the run: the
    /// records are all signed, with the time they were signed, before
    /// posting starts). Repeat it for several fronts of one log on
    /// PostgreSQL: the workers, and so the agents, are split between them
    /// evenly, and each agent is registered on every front (201, or 409
    /// when the fronts share one registry).
    #[arg(long = "witness", value_name = "URL", requires = "api_key")]
    pub witness: Vec<String>,
    /// API key of --witness (the same on every front).
    #[arg(long, env = "TALLY_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// The `tally` binary whose `tally serve` is the witness, when the bench
    /// starts one (without --witness). Default: `tally` beside this
    /// executable, where `cargo build --release -p tally -p tally-bench`
    /// puts both.
    #[arg(long, value_name = "PATH", conflicts_with = "witness")]
    pub tally: Option<PathBuf>,
}

struct Started {
    child: Child,
    dir: tempfile::TempDir,
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `tally` binary to start: `--tally`, else `tally` beside this
/// executable.
fn tally_binary(named: Option<&Path>) -> anyhow::Result<PathBuf> {
    let path = match named {
        Some(p) => p.to_owned(),
        None => std::env::current_exe()
            .context("finding the tally binary")?
            .with_file_name("tally"),
    };
    if !path.is_file() {
        bail!(
            "no tally binary at {}: build it beside tally-bench (`cargo build --release -p tally -p tally-bench`) or name one with --tally PATH",
            path.display()
        );
    }
    Ok(path)
}

fn start_witness(tally: &Path) -> anyhow::Result<(Started, String, String)> {
    let dir = tempfile::tempdir().context("making a temp data folder")?;
    let mut child = Command::new(tally)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--rate-limit",
            "0",
            "--max-in-flight",
            "100000",
            // Records are signed before posting starts; a long run (a million
            // records) posts the last ones many minutes after their time.
            "--max-skew",
            "86400",
        ])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting tally serve")?;
    let mut out = BufReader::new(child.stdout.take().context("no stdout")?);
    let mut key = None;
    loop {
        let mut line = String::new();
        if out.read_line(&mut line)? == 0 {
            let _ = child.kill();
            let _ = child.wait();
            bail!("tally serve exited at start");
        }
        if let Some(k) = line.trim_start().strip_prefix("API key") {
            key = Some(k.trim().to_owned());
        }
        if let Some(rest) = line.strip_prefix("tally: listening on ") {
            let url = rest
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned();
            std::thread::spawn(move || for _ in out.lines() {});
            let key = key.context("no API key in the banner")?;
            return Ok((Started { child, dir }, url, key));
        }
    }
}

/// Times a durable 4 KiB write (`write` then `fdatasync`) in `dir` every
/// 10 ms until `stop`: the disk's own sync latency while the witness uses
/// it. Returns the latencies, sorted; the probe file is removed.
fn probe_disk(dir: &Path, stop: &AtomicBool) -> std::io::Result<Vec<Duration>> {
    let path = dir.join(format!(".tally-bench-disk-probe-{}", std::process::id()));
    let file = std::fs::File::create(&path)?;
    let block = [0x5a_u8; 4096];
    let mut lat = Vec::new();
    let run = (|| {
        while !stop.load(Ordering::Relaxed) {
            let t = Instant::now();
            file.write_all_at(&block, 0)?;
            file.sync_data()?;
            lat.push(t.elapsed());
            std::thread::sleep(Duration::from_millis(10));
        }
        std::io::Result::Ok(())
    })();
    let _ = std::fs::remove_file(&path);
    run?;
    lat.sort_unstable();
    Ok(lat)
}

/// Strict Ed25519 verifications per second, all cores, for `secs`.
fn raw_verify_rate(secs: f64) -> f64 {
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let samples: Arc<Vec<_>> = Arc::new(
        (0..256)
            .map(|i| {
                let key = SecretKey::generate(&mut OsRng);
                let msg = format!("{{\"bench\":{i},\"pad\":\"{}\"}}", "x".repeat(300)).into_bytes();
                let sig = key.sign(RECORD_SIGNATURE_DOMAIN, &msg);
                (key.public_key(), msg, sig)
            })
            .collect(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (samples, stop, count) =
                (Arc::clone(&samples), Arc::clone(&stop), Arc::clone(&count));
            std::thread::spawn(move || {
                let mut n = 0u64;
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..64 {
                        let (pk, msg, sig) = &samples[i % samples.len()];
                        assert!(pk.verify(RECORD_SIGNATURE_DOMAIN, msg, sig).is_ok());
                        i += 1;
                    }
                    n += 64;
                }
                count.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        let _ = h.join();
    }
    count.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// Runs `tally-bench ingest`.
///
/// # Errors
/// When the witness cannot be started or reached (exit 2).
pub(crate) fn ingest(a: &IngestArgs) -> anyhow::Result<ExitCode> {
    let agents = a.agents.max(1);
    let concurrency = a.concurrency.clamp(1, agents);
    let per_agent = a.records.div_ceil(agents);
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let batch = usize::from(a.batch.max(1));
    if let Some(r) = a.rate {
        if !(r.is_finite() && r > 0.0) {
            bail!("--rate must be a positive number of records per second");
        }
    }
    // Found before anything is measured, so that a missing one fails at once.
    let tally = if a.witness.is_empty() {
        Some(tally_binary(a.tally.as_deref())?)
    } else {
        None
    };
    outln!(
        "tally bench ingest: {} records, {agents} agents, concurrency {concurrency}, batch {batch}{}, {threads} cores",
        per_agent * agents,
        a.rate.map_or_else(String::new, |r| format!(", offered {r:.0} records/s"))
    )?;

    outln!(
        "measuring raw strict Ed25519 verification on {threads} threads for {:.1}s ...",
        a.verify_secs
    )?;
    let raw = raw_verify_rate(a.verify_secs);

    let (started, urls, api_key) = match (a.witness.is_empty(), &a.api_key) {
        (false, Some(k)) => (
            None,
            a.witness
                .iter()
                .map(|u| u.trim_end_matches('/').to_owned())
                .collect::<Vec<_>>(),
            k.clone(),
        ),
        _ => {
            let tally = match tally {
                Some(t) => t,
                None => tally_binary(a.tally.as_deref())?,
            };
            let (s, u, k) = start_witness(&tally)?;
            (Some(s), vec![u], k)
        }
    };
    if urls.len() > 1 {
        outln!(
            "fronts:   {} ({}); worker w posts to front w mod {}",
            urls.len(),
            urls.join(", "),
            urls.len()
        )?;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency * 2)
        .timeout(Duration::from_secs(60))
        .build()?;
    let run_id = format!("{:08x}", OsRng.next_u32());

    // Register the agents and pre-sign their chains.
    let keys: Vec<(AgentName, SecretKey)> = (0..agents)
        .map(|i| {
            Ok((
                AgentName::new(&format!("bench-{run_id}-{i}"))?,
                SecretKey::generate(&mut OsRng),
            ))
        })
        .collect::<anyhow::Result<_>>()?;
    // On every front: until the registry is shared, each front has its own
    // (a later front of a shared registry answers 409 exists).
    rt.block_on(async {
        for (name, key) in &keys {
            for (f, url) in urls.iter().enumerate() {
                let r = http
                    .post(format!("{url}/v1/agents"))
                    .bearer_auth(&api_key)
                    .json(&json!({"agent": name, "public_key": key.public_key(), "not_before": UnixMillis::new(UnixMillis::now().as_millis() - 60_000)}))
                    .send()
                    .await?;
                let status = r.status().as_u16();
                let body = r.bytes().await.unwrap_or_default();
                if status != 201 && !(f > 0 && status == 409 && error_code(&body) == "exists") {
                    bail!("registering {name} on {url}: {}", String::from_utf8_lossy(&body));
                }
            }
        }
        anyhow::Ok(())
    })?;
    outln!(
        "agents:   bench-{run_id}-0 .. bench-{run_id}-{} (export them with `tally export --agent ...`)",
        agents - 1
    )?;
    outln!("pre-signing {} records ...", per_agent * agents)?;
    let now = UnixMillis::now();
    let chains: Vec<Vec<Vec<u8>>> = keys
        .iter()
        .map(|(name, key)| {
            let mut prev = None;
            (0..per_agent)
                .map(|s| {
                    let r: Record = UnsignedRecord {
                        agent: name.clone(),
                        key_id: key.public_key().key_id(),
                        seq: Seq::new(s as u64)?,
                        prev,
                        time: now,
                        nonce: Nonce::random(&mut OsRng),
                        body: Body::Note(NoteBody {
                            text: format!("bench record {s}"),
                        }),
                    }
                    .sign(key)?;
                    prev = Some(r.hash());
                    Ok(r.canonical_bytes().to_vec())
                })
                .collect::<anyhow::Result<Vec<_>>>()
        })
        .collect::<anyhow::Result<_>>()?;

    // The disk probe: in the bench's own witness's temp folder, or (with
    // --witness, whose disk this process cannot know) the system temp folder.
    let (probe_dir, probe_where): (PathBuf, &str) = match &started {
        Some(s) => (s.dir.path().to_owned(), "the witness's data folder's disk"),
        None => (
            std::env::temp_dir(),
            "the system temp folder (with --witness, not necessarily the witness's disk)",
        ),
    };
    let probe_stop = Arc::new(AtomicBool::new(false));
    let probe = {
        let stop = Arc::clone(&probe_stop);
        std::thread::spawn(move || probe_disk(&probe_dir, &stop))
    };

    // Post: worker w owns agents w, w+C, …, and posts each chain in order:
    // record s of each of its agents, then record s+1, …; in requests of
    // `batch` records, one request at a time.
    outln!("posting ...")?;
    let chains = Arc::new(chains);
    let errors = Arc::new(std::sync::Mutex::new(BTreeMap::<String, u64>::new()));
    let requests = Arc::new(AtomicU64::new(0));
    // With --rate: each worker starts a request every `gap`.
    let gap = a
        .rate
        .map(|r| Duration::from_secs_f64(concurrency as f64 * batch as f64 / r));
    let t0 = Instant::now();
    let latencies: Vec<Duration> = rt.block_on(async {
        let tasks: Vec<_> = (0..concurrency)
            .map(|w| {
                let (http, url, key, chains, errors, requests) = (
                    http.clone(),
                    urls[w % urls.len()].clone(),
                    api_key.clone(),
                    Arc::clone(&chains),
                    Arc::clone(&errors),
                    Arc::clone(&requests),
                );
                tokio::spawn(async move {
                    let mine: Vec<usize> = (w..chains.len()).step_by(concurrency).collect();
                    let order: Vec<(usize, usize)> = (0..per_agent)
                        .flat_map(|s| mine.iter().map(move |&agent| (agent, s)))
                        .collect();
                    let mut lat = Vec::with_capacity(order.len());
                    // Workers start spread over one gap, not all at once.
                    let first = gap.map(|g| {
                        tokio::time::Instant::now() + g.mul_f64(w as f64 / concurrency as f64)
                    });
                    for (k, group) in order.chunks(batch).enumerate() {
                        let t = match (first, gap) {
                            (Some(first), Some(g)) => {
                                let due = first + g * u32::try_from(k).unwrap_or(u32::MAX);
                                tokio::time::sleep_until(due).await;
                                due.into_std()
                            }
                            _ => Instant::now(),
                        };
                        requests.fetch_add(1, Ordering::Relaxed);
                        let outcomes = if batch == 1 {
                            let (agent, s) = group[0];
                            vec![post_one(&http, &url, &key, chains[agent][s].clone()).await]
                        } else {
                            let records: Vec<&[u8]> = group
                                .iter()
                                .map(|&(agent, s)| chains[agent][s].as_slice())
                                .collect();
                            post_batch(&http, &url, &key, &records).await
                        };
                        let elapsed = t.elapsed();
                        for outcome in outcomes {
                            lat.push(elapsed);
                            if let Err(what) = outcome {
                                *errors
                                    .lock()
                                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                                    .entry(what)
                                    .or_insert(0) += 1;
                            }
                        }
                    }
                    lat
                })
            })
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap_or_default());
        }
        all
    });
    let elapsed = t0.elapsed().as_secs_f64();
    probe_stop.store(true, Ordering::Relaxed);
    let probe = probe
        .join()
        .map_err(|_| anyhow::anyhow!("the disk probe thread panicked"))?
        .with_context(|| format!("timing durable writes in {probe_where}"))?;
    // Summed over the fronts (only the sequencer commits).
    let metrics: Vec<String> = rt.block_on(async {
        let mut all = Vec::new();
        for url in &urls {
            if let Ok(r) = http.get(format!("{url}/metrics")).send().await {
                if let Ok(t) = r.text().await {
                    all.push(t);
                }
            }
        }
        all
    });
    let mut latencies = latencies;
    latencies.sort_unstable();
    let errors = std::mem::take(
        &mut *errors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    let error_count: u64 = errors.values().sum();
    let ok = latencies.len() as u64 - error_count;
    let rate = ok as f64 / elapsed;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let metric = |name: &str| -> Option<f64> {
        metrics
            .iter()
            .map(|m| {
                m.lines()
                    .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
            })
            .sum()
    };
    outln!()?;
    outln!("ingest:   {ok} records in {elapsed:.2}s = {rate:.0} records/s ({error_count} errors)")?;
    outln!(
        "requests: {} ({} per request)",
        requests.load(Ordering::Relaxed),
        if batch == 1 {
            "POST /v1/records, 1 record".to_owned()
        } else {
            format!("POST /v1/records/batch, up to {batch} records")
        }
    )?;
    for (what, n) in &errors {
        outln!("errors:   {n} x {what}")?;
    }
    outln!(
        "latency:  p50 {:.2} ms, p99 {:.2} ms, p999 {:.2} ms (per record: its request's time to answer)",
        ms(percentile(&latencies, 0.50)),
        ms(percentile(&latencies, 0.99)),
        ms(percentile(&latencies, 0.999))
    )?;
    if !probe.is_empty() {
        outln!(
            "disk:     fdatasync of 4 KiB every 10 ms during the run, in {probe_where}: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} syncs); a receipt waits for its commit's sync, so the disk's stalls bound the latency percentiles from below",
            ms(percentile(&probe, 0.50)),
            ms(percentile(&probe, 0.99)),
            ms(probe[probe.len() - 1]),
            probe.len()
        )?;
    }
    if let (Some(b), Some(e)) = (
        metric("tally_log_batches_total "),
        metric("tally_log_entries_total "),
    ) {
        if b > 0.0 {
            outln!(
                "batches:  {b:.0} group commits, {:.1} records per commit on average",
                e / b
            )?;
        }
    }
    outln!("raw:      {raw:.0} strict Ed25519 verifications/s on {threads} threads")?;
    outln!(
        "ratio:    {:.2} (ingest / raw verification; target >= 0.5)",
        rate / raw
    )?;
    if error_count > 0 {
        outln!("FAIL: {error_count} posts were refused or lost, so these figures do not measure ingest")?;
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// Posts one record; `Err` says how it was refused or lost.
async fn post_one(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    body: Vec<u8>,
) -> Result<(), String> {
    match http
        .post(format!("{url}/v1/records"))
        .bearer_auth(key)
        .body(body)
        .send()
        .await
    {
        Ok(r) => {
            let status = r.status().as_u16();
            match r.bytes().await {
                Ok(_) if status == 200 => Ok(()),
                Ok(body) => Err(format!("{status} {}", error_code(&body))),
                Err(e) => Err(format!("{status} body lost: {e}")),
            }
        }
        Err(e) => Err(format!("request failed: {e}")),
    }
}

/// Posts canonical records in one batch; one outcome per record.
async fn post_batch(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    records: &[&[u8]],
) -> Vec<Result<(), String>> {
    let mut body = Vec::with_capacity(records.iter().map(|r| r.len() + 1).sum::<usize>() + 32);
    body.extend_from_slice(b"{\"records\":[");
    for (i, r) in records.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(r);
    }
    body.extend_from_slice(b"],\"v\":1}");
    let all = |what: String| records.iter().map(|_| Err(what.clone())).collect();
    let resp = match http
        .post(format!("{url}/v1/records/batch"))
        .bearer_auth(key)
        .body(body)
        .send()
        .await
    {
        Ok(r) => r,
        Err(e) => return all(format!("request failed: {e}")),
    };
    let status = resp.status().as_u16();
    let bytes = match resp.bytes().await {
        Ok(b) => b,
        Err(e) => return all(format!("{status} body lost: {e}")),
    };
    if status != 200 {
        return all(format!("{status} {} (whole batch)", error_code(&bytes)));
    }
    match tally_schemas::batch::BatchAnswer::from_json(&bytes) {
        Ok(answer) if answer.results.len() == records.len() => answer
            .results
            .into_iter()
            .map(|r| match r {
                tally_schemas::batch::BatchOutcome::Receipt(_) => Ok(()),
                refused @ tally_schemas::batch::BatchOutcome::Refused { .. } => {
                    let status = match &refused {
                        tally_schemas::batch::BatchOutcome::Refused { status, .. } => *status,
                        tally_schemas::batch::BatchOutcome::Receipt(_) => 200,
                    };
                    Err(format!("{status} {}", refused.code().unwrap_or("?")))
                }
            })
            .collect(),
        Ok(_) => all("batch answer with the wrong number of results".into()),
        Err(e) => all(format!("bad batch answer: {e}")),
    }
}

/// The stable `error.code` of a witness error body, or what the body was.
fn error_code(body: &[u8]) -> String {
    use tally_schemas::api::{ErrorBody, ErrorBodyError};
    match ErrorBody::from_json(body) {
        Ok(b) => b.error.code,
        Err(ErrorBodyError::Malformed { code, .. }) => code,
        Err(ErrorBodyError::NotAnErrorBody(_)) => {
            format!("(not a witness error: {} bytes)", body.len())
        }
    }
}
