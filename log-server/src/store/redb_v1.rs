//! Migration of a redb log file from storage layout 1 to the current
//! layout (the tables of layout 2, with every `ids` and `chains` row in
//! its table)
//! (docs/storage.md, "Migration from layout 1"). It runs when the file is
//! opened, before the log signs or serves anything.
//!
//! Layout 1 kept what layout 2 keeps in `leaves`, `chains` and `ids` in
//! seven tables (`hashes`, `receipt_sizes`, `chain_heads`, `agent_seq`,
//! `nonces`, `record_hashes`, `leaf_hashes`); `meta`, `entries` and
//! `checkpoints` are the same in both and are not rewritten.
//!
//! Each step carries a chunk of entries, in index order, into the new
//! tables and records how far it got (`meta.migrated_to`) in the same
//! durable transaction, so a crash at any moment leaves either the step
//! done or not started, and the next open goes on from `migrated_to`. The
//! last step checks the new tables against the old ones, deletes the old
//! ones and sets `meta.layout` to the current layout, again in one transaction. Until then the
//! file is still a complete layout 1 file (the old tables are only read),
//! so a layout 1 build can still open it.

use redb::{Database, ReadableTable, ReadableTableMetadata, TableDefinition};
use tally_schemas::hash::leaf_hash;
use tally_schemas::{Entry, Hash};

use super::redb_layout::{
    backend, hashes_of_leaf, id_key, leaf_row, meta_u64, nonce_key, CHAINS, ENTRIES, IDS, ID_LEAF,
    ID_RECORD, LAYOUT_VERSION, LEAVES, META,
};
use super::StoreError;
use tally_schemas::TreeSize;

/// Layout 1 `hashes`: stored-hash index → hash.
pub(crate) const V1_HASHES: TableDefinition<u64, [u8; 32]> = TableDefinition::new("hashes");
/// Layout 1 `receipt_sizes`: leaf index → receipt checkpoint size.
pub(crate) const V1_RECEIPT_SIZES: TableDefinition<u64, u64> =
    TableDefinition::new("receipt_sizes");
/// Layout 1 `chain_heads`: agent → (seq, record hash, leaf index).
pub(crate) const V1_CHAIN_HEADS: TableDefinition<&str, (u64, [u8; 32], u64)> =
    TableDefinition::new("chain_heads");
/// Layout 1 `agent_seq`: (agent, seq) → leaf index.
pub(crate) const V1_AGENT_SEQ: TableDefinition<(&str, u64), u64> =
    TableDefinition::new("agent_seq");
/// Layout 1 `nonces`: nonce bytes → leaf index.
pub(crate) const V1_NONCES: TableDefinition<&[u8], u64> = TableDefinition::new("nonces");
/// Layout 1 `record_hashes`: record hash → leaf index.
pub(crate) const V1_RECORD_HASHES: TableDefinition<[u8; 32], u64> =
    TableDefinition::new("record_hashes");
/// Layout 1 `leaf_hashes`: leaf hash → leaf index.
pub(crate) const V1_LEAF_HASHES: TableDefinition<[u8; 32], u64> =
    TableDefinition::new("leaf_hashes");

fn corrupt(what: String) -> StoreError {
    StoreError::Corrupt(format!("migrating layout 1: {what}"))
}

/// Migrates `db` (layout 1, possibly part-migrated) to the current layout, `chunk`
/// entries per durable transaction.
///
/// # Errors
/// [`StoreError::Corrupt`] when the layout 1 tables are incomplete or
/// disagree with each other (nothing is deleted then); [`StoreError::Backend`].
pub(crate) fn migrate(db: &Database, chunk: u64) -> Result<(), StoreError> {
    migrate_some(db, chunk, usize::MAX).map(|_| ())
}

/// At most `steps` durable steps of [`migrate`]; `Ok(true)` once the file
/// is of the current layout. Tests use it (feature `testing`) to stop a migration
/// half-way.
///
/// # Errors
/// As [`migrate`].
#[cfg(feature = "testing")]
pub fn migrate_steps(db: &Database, chunk: u64, steps: usize) -> Result<bool, StoreError> {
    migrate_some(db, chunk, steps)
}

/// What [`migrate`] and the tests' `migrate_steps` run.
fn migrate_some(db: &Database, chunk: u64, steps: usize) -> Result<bool, StoreError> {
    let chunk = chunk.max(1);
    let mut announced = false;
    for _ in 0..steps {
        let tx = db.begin_write().map_err(backend)?;
        let (size, from) = {
            let meta = tx.open_table(META).map_err(backend)?;
            (
                meta_u64(&meta, "tree_size")?,
                meta_u64(&meta, "migrated_to")?,
            )
        };
        if !announced {
            tracing::info!(
                entries = size,
                done = from,
                "migrating the log store from layout 1 to layout {LAYOUT_VERSION}"
            );
            announced = true;
        }
        if from >= size {
            finish(&tx, size)?;
            tx.commit().map_err(backend)?;
            tracing::info!(
                entries = size,
                "log store migrated to layout {LAYOUT_VERSION}"
            );
            return Ok(true);
        }
        let to = size.min(from.saturating_add(chunk));
        carry(&tx, from, to)?;
        tx.open_table(META)
            .map_err(backend)?
            .insert("migrated_to", to)
            .map_err(backend)?;
        tx.commit().map_err(backend)?;
        tracing::info!(
            done = to,
            entries = size,
            "migrating the log store to layout {LAYOUT_VERSION}"
        );
    }
    Ok(false)
}

/// Writes the current layout's rows of entries `from..to` (all in the tables).
fn carry(tx: &redb::WriteTransaction, from: u64, to: u64) -> Result<(), StoreError> {
    let entries = tx.open_table(ENTRIES).map_err(backend)?;
    let old_hashes = tx.open_table(V1_HASHES).map_err(backend)?;
    let receipt_sizes = tx.open_table(V1_RECEIPT_SIZES).map_err(backend)?;
    let mut leaves = tx.open_table(LEAVES).map_err(backend)?;
    let mut chains = tx.open_table(CHAINS).map_err(backend)?;
    let mut ids = tx.open_table(IDS).map_err(backend)?;
    for i in from..to {
        let bytes = entries
            .get(i)
            .map_err(backend)?
            .ok_or_else(|| corrupt(format!("entry {i} is missing")))?
            .value()
            .to_vec();
        let entry = Entry::from_json(&bytes)
            .map_err(|e| corrupt(format!("entry {i} does not parse: {e}")))?;
        if entry.index().get() != i {
            return Err(corrupt(format!(
                "entry stored at {i} says index {}",
                entry.index()
            )));
        }
        let record = entry.record();
        let leaf = leaf_hash(&bytes);
        let mut hashes = Vec::with_capacity(hashes_of_leaf(i));
        for level in 0..hashes_of_leaf(i) {
            let level8 = u8::try_from(level).map_err(|_| corrupt("tree too deep".into()))?;
            let at = tlog_tiles::stored_hash_index(level8, i >> level);
            let h = old_hashes
                .get(at)
                .map_err(backend)?
                .ok_or_else(|| corrupt(format!("stored hash {at} is missing")))?
                .value();
            hashes.push(Hash::from_bytes(h));
        }
        if hashes[0] != leaf {
            return Err(corrupt(format!(
                "the stored leaf hash of entry {i} is not its hash"
            )));
        }
        let receipt = receipt_sizes
            .get(i)
            .map_err(backend)?
            .ok_or_else(|| corrupt(format!("entry {i} has no receipt size")))?
            .value();
        leaves
            .insert(i, leaf_row(TreeSize::new(receipt), &hashes).as_slice())
            .map_err(backend)?;
        chains
            .insert(
                (record.agent.as_str(), record.seq.get()),
                (i, *record.hash().as_bytes()),
            )
            .map_err(backend)?;
        ids.insert((nonce_key(&record.nonce), i), ())
            .map_err(backend)?;
        ids.insert((id_key(ID_RECORD, &record.hash()), i), ())
            .map_err(backend)?;
        ids.insert((id_key(ID_LEAF, &leaf), i), ())
            .map_err(backend)?;
    }
    Ok(())
}

/// Checks the new tables against the old ones, deletes the old ones and
/// sets the layout to 2.
fn finish(tx: &redb::WriteTransaction, size: u64) -> Result<(), StoreError> {
    {
        let leaves = tx.open_table(LEAVES).map_err(backend)?;
        let chains = tx.open_table(CHAINS).map_err(backend)?;
        let ids = tx.open_table(IDS).map_err(backend)?;
        let old_hashes = tx.open_table(V1_HASHES).map_err(backend)?;
        let agent_seq = tx.open_table(V1_AGENT_SEQ).map_err(backend)?;
        let nonces = tx.open_table(V1_NONCES).map_err(backend)?;
        let heads = tx.open_table(V1_CHAIN_HEADS).map_err(backend)?;
        let count = |what: &str, got: u64, want: u64| {
            if got == want {
                Ok(())
            } else {
                Err(corrupt(format!("{what}: {got} rows, {want} expected")))
            }
        };
        count("leaves", leaves.len().map_err(backend)?, size)?;
        count(
            "stored hashes",
            old_hashes.len().map_err(backend)?,
            tlog_tiles::stored_hash_count(size),
        )?;
        count(
            "chains",
            chains.len().map_err(backend)?,
            agent_seq.len().map_err(backend)?,
        )?;
        count("chains", chains.len().map_err(backend)?, size)?;
        count("nonces", nonces.len().map_err(backend)?, size)?;
        count("ids", ids.len().map_err(backend)?, 3 * size)?;
        // Every old chain head is the last row of its agent's new chain.
        for row in heads.iter().map_err(backend)? {
            let (agent, head) = row.map_err(backend)?;
            let (seq, hash, index) = head.value();
            let agent = agent.value();
            let last = chains
                .range((agent, 0)..=(agent, u64::MAX))
                .map_err(backend)?
                .next_back()
                .transpose()
                .map_err(backend)?
                .map(|(k, v)| (k.value().1, v.value()));
            if last != Some((seq, (index, hash))) {
                return Err(corrupt(format!(
                    "the chain head of {agent} is seq {seq} at {index}, the migrated chain ends at {last:?}"
                )));
            }
        }
    }
    tx.delete_table(V1_HASHES).map_err(backend)?;
    tx.delete_table(V1_RECEIPT_SIZES).map_err(backend)?;
    tx.delete_table(V1_CHAIN_HEADS).map_err(backend)?;
    tx.delete_table(V1_AGENT_SEQ).map_err(backend)?;
    tx.delete_table(V1_NONCES).map_err(backend)?;
    tx.delete_table(V1_RECORD_HASHES).map_err(backend)?;
    tx.delete_table(V1_LEAF_HASHES).map_err(backend)?;
    let mut meta = tx.open_table(META).map_err(backend)?;
    meta.remove("migrated_to").map_err(backend)?;
    // Every entry's `ids` and `chains` rows are in their tables.
    meta.insert("ids_to", size).map_err(backend)?;
    meta.insert("layout", LAYOUT_VERSION).map_err(backend)?;
    Ok(())
}

/// Writes a layout 1 file for tests: the same rows the layout 1 store
/// wrote, for entries given as canonical bytes with their receipt sizes
/// (which must be the sizes of the batches they were committed in). Only
/// with the feature `testing`, which only dev-dependencies turn on.
#[cfg(feature = "testing")]
pub fn write_v1_for_tests(
    path: &std::path::Path,
    entries: &[(Vec<u8>, u64)],
    checkpoints: &[(u64, String)],
) -> Result<(), StoreError> {
    let db = Database::create(path).map_err(backend)?;
    let tx = db.begin_write().map_err(backend)?;
    {
        let mut meta = tx.open_table(META).map_err(backend)?;
        meta.insert("layout", 1).map_err(backend)?;
        meta.insert("tree_size", entries.len() as u64)
            .map_err(backend)?;
        let mut t_entries = tx.open_table(ENTRIES).map_err(backend)?;
        let mut hashes = tx.open_table(V1_HASHES).map_err(backend)?;
        let mut receipts = tx.open_table(V1_RECEIPT_SIZES).map_err(backend)?;
        let mut heads = tx.open_table(V1_CHAIN_HEADS).map_err(backend)?;
        let mut agent_seq = tx.open_table(V1_AGENT_SEQ).map_err(backend)?;
        let mut nonces = tx.open_table(V1_NONCES).map_err(backend)?;
        let mut records = tx.open_table(V1_RECORD_HASHES).map_err(backend)?;
        let mut leaf_hashes = tx.open_table(V1_LEAF_HASHES).map_err(backend)?;
        let mut cps = tx
            .open_table(super::redb_layout::CHECKPOINTS)
            .map_err(backend)?;
        let mut stored: Vec<Hash> = Vec::new();
        for (i, (bytes, receipt)) in entries.iter().enumerate() {
            let i = i as u64;
            let entry = Entry::from_json(bytes).map_err(|e| corrupt(e.to_string()))?;
            let record = entry.record();
            let leaf = leaf_hash(bytes);
            // The stored hashes appending leaf i adds (Go sumdb/tlog).
            let mut h = leaf;
            stored.push(h);
            let mut n = i;
            let mut level = 0u8;
            while n & 1 == 1 {
                let left = stored[usize::try_from(tlog_tiles::stored_hash_index(level, n - 1))
                    .map_err(|_| corrupt("index".into()))?];
                h = tally_schemas::hash::node_hash(&left, &h);
                stored.push(h);
                n >>= 1;
                level += 1;
            }
            t_entries.insert(i, bytes.as_slice()).map_err(backend)?;
            receipts.insert(i, *receipt).map_err(backend)?;
            agent_seq
                .insert((record.agent.as_str(), record.seq.get()), i)
                .map_err(backend)?;
            heads
                .insert(
                    record.agent.as_str(),
                    (record.seq.get(), *record.hash().as_bytes(), i),
                )
                .map_err(backend)?;
            nonces.insert(record.nonce.as_bytes(), i).map_err(backend)?;
            records
                .insert(*record.hash().as_bytes(), i)
                .map_err(backend)?;
            leaf_hashes.insert(*leaf.as_bytes(), i).map_err(backend)?;
        }
        for (k, h) in stored.iter().enumerate() {
            hashes.insert(k as u64, *h.as_bytes()).map_err(backend)?;
        }
        for (size, note) in checkpoints {
            cps.insert(*size, note.as_str()).map_err(backend)?;
        }
    }
    tx.commit().map_err(backend)
}
