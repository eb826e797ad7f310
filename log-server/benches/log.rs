//! `cargo bench -p tally-log`: the log's durable append rate, the batch
//! sizes group commit reaches, append latency p50/p99 and proof latency, at
//! several log sizes, next to the raw redb single-transaction durable commit
//! rate measured in the same run (docs/benchmarks.md, "## Log").
//!
//! Records are signed before the clock starts: signing is the agent's work
//! and admission the witness's, so the figure is the log engine's.
//!
//! Environment: `TALLY_BENCH_SIZES` (default `1000,100000`): log sizes to
//! measure at; `TALLY_BENCH_APPENDS` (default 20000): appends measured per
//! size; `TALLY_BENCH_CLIENTS` (default 256): concurrent appenders;
//! `TALLY_BENCH_BULK_FROM` (default 1000000): from this size on, the redb
//! store is filled with synthetic entries through `LogStore::commit_batch`
//! (support/bulk_fill.rs) instead of through the append path, so a 10M-entry
//! start takes minutes, not hours; the measured appends then go through the
//! sequencer as usual. `TALLY_BENCH_DIR` (default the system temp folder):
//! where the stores go (the 10M store takes a few GB).

use std::sync::Arc;
use std::time::{Duration, Instant};

use redb::{Database, TableDefinition};
use tally_log::store::memory::MemoryStore;
use tally_log::store::redb::RedbStore;
use tally_log::{AppendError, Appended, BatchItem, Log, LogConfig};
use tally_schemas::record::NoteBody;
use tally_schemas::{
    AgentName, Body, Hash, LeafIndex, Nonce, NoteSigner, Record, SecretKey, Seq, TreeSize,
    UnixMillis, UnsignedRecord,
};

#[path = "support/args.rs"]
mod args;
#[path = "support/bulk_fill.rs"]
mod bulk_fill;

use args::{env_list, percentile};

/// Raw redb: one durable write transaction per row, as fast as it goes.
fn raw_redb_commits_per_sec(dir: &std::path::Path) -> f64 {
    const T: TableDefinition<u64, &[u8]> = TableDefinition::new("t");
    let db = Database::create(dir.join("raw.redb")).unwrap();
    let payload = vec![7u8; 600];
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < Duration::from_secs(3) {
        let tx = db.begin_write().unwrap();
        {
            let mut t = tx.open_table(T).unwrap();
            t.insert(n, payload.as_slice()).unwrap();
        }
        tx.commit().unwrap();
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

/// Chains of pre-signed records, one per client.
struct Chains {
    agents: Vec<(AgentName, SecretKey, u64, Option<Hash>)>,
}

impl Chains {
    fn new(clients: usize) -> Self {
        Self {
            agents: (0..clients)
                .map(|k| {
                    (
                        AgentName::new(&format!("bench-{k}")).unwrap(),
                        SecretKey::from_seed(&[(k % 251) as u8 + 1; 32]),
                        0,
                        None,
                    )
                })
                .collect(),
        }
    }

    /// `per` next records for each client.
    fn sign(&mut self, per: u64) -> Vec<Vec<Record>> {
        self.agents
            .iter_mut()
            .enumerate()
            .map(|(k, (name, key, seq, prev))| {
                (0..per)
                    .map(|_| {
                        let mut nonce =
                            Hash::sha256(format!("{k}/{seq}").as_bytes()).as_bytes()[..16].to_vec();
                        nonce[0] ^= 0x80;
                        let r = UnsignedRecord {
                            agent: name.clone(),
                            key_id: key.public_key().key_id(),
                            seq: Seq::new(*seq).unwrap(),
                            prev: *prev,
                            time: UnixMillis::new(1_796_025_600_000 + *seq as i64),
                            nonce: Nonce::from_bytes(nonce).unwrap(),
                            body: Body::Note(NoteBody {
                                text: format!("benchmark record {seq} of {name}"),
                            }),
                        }
                        .sign(key)
                        .unwrap();
                        *seq += 1;
                        *prev = Some(r.hash());
                        r
                    })
                    .collect()
            })
            .collect()
    }
}

/// Appends one record the way the witness does: a batch of one
/// (`Log::enqueue_batch_fenced`, docs/storage.md "Batches").
async fn append(log: &Log, record: Record) -> Result<Appended, AppendError> {
    let answers = log
        .enqueue_batch_fenced(
            vec![BatchItem::Record(record)],
            Vec::new(),
            UnixMillis::now(),
        )?
        .await?;
    answers
        .into_iter()
        .next()
        .unwrap_or(Err(AppendError::Closed))
}

/// Appends every chain concurrently; returns per-append latencies and the wall time.
async fn run_appends(log: &Arc<Log>, chains: Vec<Vec<Record>>) -> (Vec<Duration>, Duration) {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for chain in chains {
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(chain.len());
            for r in chain {
                let t = Instant::now();
                loop {
                    match append(&log, r.clone()).await {
                        Ok(_) => break,
                        Err(AppendError::Overloaded { .. }) => tokio::task::yield_now().await,
                        Err(e) => panic!("append failed: {e}"),
                    }
                }
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    (all, start.elapsed())
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing
    // useful either way, so only run when invoked as a benchmark.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let sizes = env_list("TALLY_BENCH_SIZES", "1000,100000");
    let appends = env_list("TALLY_BENCH_APPENDS", "20000")
        .first()
        .copied()
        .unwrap_or(20_000);
    let clients = env_list("TALLY_BENCH_CLIENTS", "256")
        .first()
        .copied()
        .unwrap_or(256) as usize;
    let bulk_from = env_list("TALLY_BENCH_BULK_FROM", "1000000")
        .first()
        .copied()
        .unwrap_or(1_000_000);
    let dir = match std::env::var_os("TALLY_BENCH_DIR") {
        Some(base) => tempfile::tempdir_in(base),
        None => tempfile::tempdir(),
    }
    .unwrap();
    let raw = raw_redb_commits_per_sec(dir.path());
    println!("raw redb durable single-transaction commits: {raw:.0}/s");
    println!(
        "| store | log size at start | appends | appends/s | ratio to raw redb commits/s | batches | mean batch | largest batch | append p50 | append p99 | inclusion p50 | inclusion p99 | consistency p50 | consistency p99 |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // The in-memory store at the first size shows the engine's CPU ceiling
    // (no fsync); the redb rows are the durable figures.
    let runs: Vec<(bool, u64)> = sizes
        .first()
        .map(|s| (true, *s))
        .into_iter()
        .chain(sizes.iter().map(|s| (false, *s)))
        .collect();
    for (memory, size) in runs {
        let path = dir.path().join(format!("log-{size}.redb"));
        let signer =
            NoteSigner::from_secret("bench.example/log", SecretKey::from_seed(&[3; 32])).unwrap();
        let bulk = !memory && size >= bulk_from;
        let mut fill_s = None;
        if bulk {
            // Synthetic entries straight into the store (not timed as appends).
            let t = Instant::now();
            let store = RedbStore::open(&path).unwrap();
            bulk_fill::fill(&store, 0, size);
            drop(store);
            fill_s = Some(t.elapsed().as_secs_f64());
        }
        let log = if memory {
            Arc::new(Log::open(Arc::new(MemoryStore::new()), signer, LogConfig::default()).unwrap())
        } else {
            Arc::new(Log::open_redb(&path, signer, LogConfig::default()).unwrap())
        };
        let mut chains = Chains::new(clients);
        // Fill to `size` through the same append path (not timed).
        let mut filled = if bulk { size } else { 0 };
        while filled < size {
            let per = ((size - filled).div_ceil(clients as u64)).min(200);
            let batch = chains.sign(per);
            filled += per * clients as u64;
            rt.block_on(run_appends(&log, batch));
        }
        let start_size = log.latest_checkpoint().checkpoint.size.get();
        let before = log.stats();
        let measured = chains.sign((appends / clients as u64).max(1));
        let (mut lat, wall) = rt.block_on(run_appends(&log, measured));
        let after = log.stats();
        lat.sort_unstable();
        let n = lat.len() as f64;
        let rate = n / wall.as_secs_f64();
        let batches = after.batches - before.batches;
        let tree = log.latest_checkpoint().checkpoint.size.get();
        // Proof latency: random indexes and sizes at the final tree size.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut incl, mut cons) = (Vec::new(), Vec::new());
        for _ in 0..5000 {
            let i = next() % tree;
            let t = Instant::now();
            log.inclusion_proof(LeafIndex::new(i), None).unwrap();
            incl.push(t.elapsed());
            let m = 1 + next() % tree;
            let t = Instant::now();
            log.consistency_proof(TreeSize::new(m), None).unwrap();
            cons.push(t.elapsed());
        }
        incl.sort_unstable();
        cons.sort_unstable();
        println!(
            "| {} | {start_size} | {} | {rate:.0} | {:.2} | {batches} | {:.1} | {} | {:.2} ms | {:.2} ms | {:.1} µs | {:.1} µs | {:.1} µs | {:.1} µs |",
            if memory { "memory" } else { "redb" },
            lat.len(),
            rate / raw,
            (after.entries - before.entries) as f64 / batches.max(1) as f64,
            after.largest_batch,
            percentile(&lat, 0.5).as_secs_f64() * 1e3,
            percentile(&lat, 0.99).as_secs_f64() * 1e3,
            percentile(&incl, 0.5).as_secs_f64() * 1e6,
            percentile(&incl, 0.99).as_secs_f64() * 1e6,
            percentile(&cons, 0.5).as_secs_f64() * 1e6,
            percentile(&cons, 0.99).as_secs_f64() * 1e6,
        );
        log.shutdown();
        if let Some(secs) = fill_s {
            println!("(bulk fill of {size} synthetic entries: {secs:.0} s)");
        }
        if !memory {
            let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            println!(
                "(redb file at {tree} entries: {:.1} MiB, {:.0} bytes/entry)",
                bytes as f64 / 1048576.0,
                bytes as f64 / tree as f64
            );
        }
    }
}
