//! Proof latency on large logs (docs/benchmarks.md "Proofs at 1M and 10M
//! entries": a 10-million-entry log answers a proof in about a
//! millisecond). Appending 10M signed records through the
//! sequencer would take hours on this machine, so this fills a real redb
//! store through the same `LogStore::commit_batch` path with synthetic
//! entries (small leaf data, every index table written), then times
//! inclusion and consistency proofs read from that store and checks every
//! proof against the tree's root.
//!
//!     cargo run --release -p tally-log --example proofs_at_scale
//!
//! Environment: `TALLY_PROOF_SIZES` (default `1000,100000,1000000,10000000`),
//! `TALLY_PROOF_SAMPLES` (default 2000), `TALLY_PROOF_DIR` (default a temp
//! folder under /var/tmp; the 10M store takes a few GB).

use std::time::Instant;

use tally_log::store::redb::RedbStore;
use tally_log::tree;
use tally_schemas::hash::leaf_hash;
use tally_schemas::tree::{verify_consistency, verify_inclusion};
use tally_schemas::{LeafIndex, TreeSize};

#[path = "../benches/support/args.rs"]
mod args;
#[path = "../benches/support/bulk_fill.rs"]
mod bulk_fill;

use args::{env_list, percentile};
use bulk_fill::{fill, synthetic_canonical};

/// A deterministic pseudo-random sequence (splitmix64), so runs are comparable.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn main() {
    let sizes = env_list("TALLY_PROOF_SIZES", "1000,100000,1000000,10000000");
    let samples = env_list("TALLY_PROOF_SAMPLES", "2000")[0] as usize;
    let base = std::env::var("TALLY_PROOF_DIR").unwrap_or_else(|_| "/var/tmp".into());
    let dir = tempfile::Builder::new()
        .prefix("tally-proofs-")
        .tempdir_in(base)
        .expect("temp dir");
    let store = RedbStore::open(&dir.path().join("log.redb")).expect("open store");
    println!("| log size | fill s | inclusion p50 | inclusion p99 | consistency p50 | consistency p99 | proof hashes |");
    println!("|---|---|---|---|---|---|---|");
    let mut filled = 0u64;
    let mut rng = 7u64;
    for size in sizes {
        let t = Instant::now();
        fill(&store, filled, size);
        filled = size;
        let fill_s = t.elapsed().as_secs_f64();
        let n = TreeSize::new(size);
        let root = tree::root(&store, n).expect("root");
        let (mut incl, mut cons) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
        let mut hashes = 0;
        for _ in 0..samples {
            let i = next(&mut rng) % size;
            let t = Instant::now();
            let proof =
                tree::inclusion_proof(&store, LeafIndex::new(i), n).expect("inclusion proof");
            incl.push(t.elapsed());
            hashes = proof.len();
            let leaf = leaf_hash(&synthetic_canonical(i));
            verify_inclusion(LeafIndex::new(i), n, &leaf, &proof, &root).expect("proof checks");

            let m = 1 + next(&mut rng) % size;
            let t = Instant::now();
            let proof =
                tree::consistency_proof(&store, TreeSize::new(m), n).expect("consistency proof");
            cons.push(t.elapsed());
            if samples <= 200 || i % 10 == 0 {
                let old_root = tree::root(&store, TreeSize::new(m)).expect("root");
                verify_consistency(TreeSize::new(m), n, &old_root, &root, &proof)
                    .expect("proof checks");
            }
        }
        incl.sort();
        cons.sort();
        println!(
            "| {size} | {fill_s:.1} | {:.1} µs | {:.1} µs | {:.1} µs | {:.1} µs | {hashes} |",
            percentile(&incl, 0.5).as_secs_f64() * 1e6,
            percentile(&incl, 0.99).as_secs_f64() * 1e6,
            percentile(&cons, 0.5).as_secs_f64() * 1e6,
            percentile(&cons, 0.99).as_secs_f64() * 1e6,
        );
    }
}
