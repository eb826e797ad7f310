//! Bulk-fills a real redb log store with synthetic entries through the same
//! `LogStore::commit_batch` the sequencer uses (every table written: entries,
//! leaves and, through its merges and a last
//! `RedbStore::write_index_rows`, chains and the merged index of layout 4), in
//! batches of 100k, without signing or admission. Appending millions of signed
//! records through the sequencer takes hours on a small machine; this takes
//! minutes. Shared by `benches/log.rs` and `examples/proofs_at_scale.rs`.
//!
//! The synthetic chains belong to agents `fill-0` .. `fill-999`, so real
//! chains appended afterwards under other names start at genesis.

use tally_log::store::redb::RedbStore;
use tally_log::store::{BatchWrite, LogStore, NewEntry};
use tally_log::tree;
use tally_schemas::hash::leaf_hash;
use tally_schemas::{AgentName, Hash, LeafIndex, Nonce, Seq, TreeSize};

const CHUNK: u64 = 100_000;
const AGENTS: u64 = 1000;

/// The leaf data of synthetic entry `i`.
pub(crate) fn synthetic_canonical(i: u64) -> Vec<u8> {
    format!("{{\"bench\":{i}}}").into_bytes()
}

/// Grows `store` from `from` to `to` entries.
pub(crate) fn fill(store: &RedbStore, from: u64, to: u64) {
    let mut size = from;
    while size < to {
        let end = (size + CHUNK).min(to);
        let entries: Vec<NewEntry> = (size..end)
            .map(|i| {
                let canonical = synthetic_canonical(i);
                let mut nonce = [0u8; 16];
                nonce[..8].copy_from_slice(&i.to_be_bytes());
                NewEntry {
                    index: LeafIndex::new(i),
                    leaf_hash: leaf_hash(&canonical),
                    record_hash: Hash::sha256(&canonical),
                    nonce: Nonce::from_bytes(nonce.to_vec()).expect("16 bytes"),
                    agent: AgentName::new(&format!("fill-{}", i % AGENTS)).expect("valid"),
                    seq: Seq::new(i / AGENTS).expect("small"),
                    time: tally_schemas::UnixMillis::new(0),
                    canonical,
                }
            })
            .collect();
        let leaves: Vec<Hash> = entries.iter().map(|e| e.leaf_hash).collect();
        let hashes = tree::batch_hashes(store, TreeSize::new(size), &leaves).expect("hashes");
        store
            .commit_batch(&BatchWrite {
                old_size: TreeSize::new(size),
                entries,
                hashes,
                receipt_size: TreeSize::new(end),
                key_versions: Vec::new(),
            })
            .expect("commit");
        size = end;
    }
    // The synthetic entries do not parse as entries, so the index rows
    // still in memory could not be rebuilt when the store is opened again.
    store.write_index_rows().expect("index rows");
}
