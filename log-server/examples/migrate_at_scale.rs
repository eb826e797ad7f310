//! How long the layout 1 → layout 2 migration takes (docs/storage.md,
//! "Migration from layout 1"; docs/benchmarks.md, "## Log"): writes a
//! layout 1 redb file of N real entries (signed notes of 256 agents, in
//! group commits of 256, every layout 1 table written), then times
//! `RedbStore::open`, which migrates it, and checks a sample of lookups.
//! A benchmark, not a test.
//!
//!     cargo run --release -p tally-log --example migrate_at_scale
//!     # TALLY_MIGRATE_ENTRIES=1000000 TALLY_BENCH_DIR=/var/tmp

use std::time::Instant;

use tally_log::store::redb::RedbStore;
use tally_log::store::redb_v1::write_v1_for_tests;
use tally_log::LogStore;
use tally_schemas::record::NoteBody;
use tally_schemas::{
    AgentName, Body, Entry, Hash, LeafIndex, Nonce, SecretKey, Seq, UnixMillis, UnsignedRecord,
};

fn main() {
    let n: u64 = std::env::var("TALLY_MIGRATE_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let dir = match std::env::var_os("TALLY_BENCH_DIR") {
        Some(base) => tempfile::tempdir_in(base),
        None => tempfile::tempdir(),
    }
    .expect("temp dir");
    let path = dir.path().join("log.redb");
    let agents: Vec<(AgentName, SecretKey)> = (0..256u32)
        .map(|k| {
            (
                AgentName::new(&format!("agent-{k}")).expect("name"),
                SecretKey::from_seed(&[(k % 251) as u8 + 1; 32]),
            )
        })
        .collect();
    let mut prev: Vec<Option<Hash>> = vec![None; agents.len()];
    let t = Instant::now();
    let mut entries = Vec::with_capacity(n as usize);
    let mut nonces = Vec::new();
    for i in 0..n {
        let k = (i % 256) as usize;
        let (name, key) = &agents[k];
        let nonce = Nonce::from_bytes(Hash::sha256(&i.to_be_bytes()).as_bytes()[..16].to_vec())
            .expect("nonce");
        let record = UnsignedRecord {
            agent: name.clone(),
            key_id: key.public_key().key_id(),
            seq: Seq::new(i / 256).expect("seq"),
            prev: prev[k],
            time: UnixMillis::new(1_796_025_600_000 + i as i64),
            nonce: nonce.clone(),
            body: Body::Note(NoteBody {
                text: format!("migration benchmark record {i}"),
            }),
        }
        .sign(key)
        .expect("sign");
        prev[k] = Some(record.hash());
        if i % 9973 == 0 {
            nonces.push((nonce, i));
        }
        let entry = Entry::new(
            LeafIndex::new(i),
            UnixMillis::new(1_796_025_600_000 + i as i64),
            record,
        )
        .expect("entry");
        let receipt = ((i / 256 + 1) * 256).min(n);
        entries.push((entry.canonical_bytes().to_vec(), receipt));
    }
    println!("signed {n} records in {:.1} s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    write_v1_for_tests(&path, &entries, &[]).expect("layout 1 file");
    drop(entries);
    let v1_bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    println!(
        "wrote the layout 1 file in {:.1} s: {:.1} MiB",
        t.elapsed().as_secs_f64(),
        v1_bytes as f64 / 1048576.0
    );
    let t = Instant::now();
    let store = RedbStore::open(&path).expect("migrate");
    let secs = t.elapsed().as_secs_f64();
    for (nonce, i) in &nonces {
        assert_eq!(
            store.index_of_nonce(nonce).expect("lookup"),
            Some(LeafIndex::new(*i))
        );
    }
    drop(store);
    let v2_bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    println!(
        "migrated {n} entries to layout 2 in {secs:.1} s ({:.0} entries/s); file {:.1} MiB",
        n as f64 / secs,
        v2_bytes as f64 / 1048576.0
    );
}
