//! The redb [`LogStore`], the default backend: one file, one durable
//! (`Durability::Immediate`) write transaction per group commit; checkpoint
//! notes are written with `Durability::None` and persisted by the next one. Its tables,
//! keys and encodings are documented in docs/storage.md, which is the
//! contract for this file.

use std::path::Path;

use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
};
use tally_schemas::{AgentName, Hash, LeafIndex, Nonce, Seq, TreeSize};

use super::{check_put_checkpoint, BatchWrite, ChainHead, Found, LogStore, Lookup, StoreError};

/// `meta`: named counters. `tree_size` = number of committed entries;
/// `layout` = the storage layout version.
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// `hashes`: stored-hash index (sumdb/tlog layout) → 32-byte hash.
const HASHES: TableDefinition<u64, [u8; 32]> = TableDefinition::new("hashes");
/// `entries`: leaf index → the entry's canonical JSON bytes (the leaf data).
const ENTRIES: TableDefinition<u64, &[u8]> = TableDefinition::new("entries");
/// `receipt_sizes`: leaf index → size of the checkpoint its receipt names.
const RECEIPT_SIZES: TableDefinition<u64, u64> = TableDefinition::new("receipt_sizes");
/// `checkpoints`: tree size → signed checkpoint note (UTF-8 text).
const CHECKPOINTS: TableDefinition<u64, &str> = TableDefinition::new("checkpoints");
/// `chain_heads`: agent name → (seq, record hash, leaf index).
const CHAIN_HEADS: TableDefinition<&str, (u64, [u8; 32], u64)> =
    TableDefinition::new("chain_heads");
/// `agent_seq`: (agent name, seq) → leaf index.
const AGENT_SEQ: TableDefinition<(&str, u64), u64> = TableDefinition::new("agent_seq");
/// `nonces`: nonce bytes → leaf index of the record that used it.
const NONCES: TableDefinition<&[u8], u64> = TableDefinition::new("nonces");
/// `record_hashes`: record hash → leaf index.
const RECORD_HASHES: TableDefinition<[u8; 32], u64> = TableDefinition::new("record_hashes");
/// `leaf_hashes`: leaf hash → leaf index.
const LEAF_HASHES: TableDefinition<[u8; 32], u64> = TableDefinition::new("leaf_hashes");

/// The storage layout version written in `meta.layout`.
pub const LAYOUT_VERSION: u64 = 1;

fn backend<E: std::fmt::Display>(e: E) -> StoreError {
    StoreError::Backend(e.to_string())
}

/// A [`LogStore`] in one redb file.
pub struct RedbStore {
    db: Database,
}

impl RedbStore {
    /// Opens (or creates) the log file at `path` and checks its layout version.
    ///
    /// # Errors
    /// [`StoreError::Backend`] when the file cannot be opened (held by another
    /// process, unreadable); [`StoreError::Corrupt`] for another layout version.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_with_cache(path, crate::log::DEFAULT_CACHE_BYTES)
    }

    /// [`RedbStore::open`] with a page cache of at most `cache_bytes`.
    ///
    /// # Errors
    /// As [`RedbStore::open`].
    pub fn open_with_cache(path: &Path, cache_bytes: usize) -> Result<Self, StoreError> {
        let db = redb::Builder::new()
            .set_cache_size(cache_bytes)
            .create(path)
            .map_err(backend)?;
        let tx = db.begin_write().map_err(backend)?;
        {
            let mut meta = tx.open_table(META).map_err(backend)?;
            let layout = meta.get("layout").map_err(backend)?.map(|g| g.value());
            match layout {
                None => {
                    meta.insert("layout", LAYOUT_VERSION).map_err(backend)?;
                    meta.insert("tree_size", 0).map_err(backend)?;
                }
                Some(LAYOUT_VERSION) => {}
                Some(other) => {
                    return Err(StoreError::Corrupt(format!(
                        "storage layout version {other}, this build reads {LAYOUT_VERSION}"
                    )))
                }
            }
            // Create every table so that readers never meet a missing one.
            tx.open_table(HASHES).map_err(backend)?;
            tx.open_table(ENTRIES).map_err(backend)?;
            tx.open_table(RECEIPT_SIZES).map_err(backend)?;
            tx.open_table(CHECKPOINTS).map_err(backend)?;
            tx.open_table(CHAIN_HEADS).map_err(backend)?;
            tx.open_table(AGENT_SEQ).map_err(backend)?;
            tx.open_table(NONCES).map_err(backend)?;
            tx.open_table(RECORD_HASHES).map_err(backend)?;
            tx.open_table(LEAF_HASHES).map_err(backend)?;
        }
        tx.commit().map_err(backend)?;
        Ok(Self { db })
    }

    fn read<T>(
        &self,
        f: impl FnOnce(&redb::ReadTransaction) -> Result<T, redb::Error>,
    ) -> Result<T, StoreError> {
        let tx = self.db.begin_read().map_err(backend)?;
        f(&tx).map_err(backend)
    }

    fn lookup<K: redb::Key + 'static>(
        &self,
        table: TableDefinition<K, u64>,
        key: K::SelfType<'_>,
    ) -> Result<Option<LeafIndex>, StoreError> {
        self.read(|tx| {
            let t = tx.open_table(table)?;
            Ok(t.get(key)?.map(|g| LeafIndex::new(g.value())))
        })
    }
}

impl LogStore for RedbStore {
    fn size(&self) -> Result<TreeSize, StoreError> {
        self.read(|tx| {
            let t = tx.open_table(META)?;
            Ok(TreeSize::new(t.get("tree_size")?.map_or(0, |g| g.value())))
        })
    }

    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, StoreError> {
        let found = self.read(|tx| {
            let t = tx.open_table(HASHES)?;
            let mut out = Vec::with_capacity(indexes.len());
            for &i in indexes {
                out.push(t.get(i)?.map(|g| Hash::from_bytes(g.value())));
            }
            Ok(out)
        })?;
        found
            .into_iter()
            .zip(indexes)
            .map(|(h, i)| {
                h.ok_or_else(|| StoreError::Corrupt(format!("stored hash {i} is missing")))
            })
            .collect()
    }

    fn entries(&self, start: LeafIndex, end: LeafIndex) -> Result<Vec<Vec<u8>>, StoreError> {
        if start >= end {
            return Ok(Vec::new());
        }
        self.read(|tx| {
            let t = tx.open_table(ENTRIES)?;
            let mut out = Vec::new();
            for row in t.range(start.get()..end.get())? {
                out.push(row?.1.value().to_vec());
            }
            Ok(out)
        })
    }

    fn receipt_size(&self, index: LeafIndex) -> Result<Option<TreeSize>, StoreError> {
        self.read(|tx| {
            let t = tx.open_table(RECEIPT_SIZES)?;
            Ok(t.get(index.get())?.map(|g| TreeSize::new(g.value())))
        })
    }

    fn checkpoint(&self, size: TreeSize) -> Result<Option<String>, StoreError> {
        self.read(|tx| {
            let t = tx.open_table(CHECKPOINTS)?;
            Ok(t.get(size.get())?.map(|g| g.value().to_owned()))
        })
    }

    fn latest_checkpoint(&self) -> Result<Option<(TreeSize, String)>, StoreError> {
        self.read(|tx| {
            let t = tx.open_table(CHECKPOINTS)?;
            let last = t
                .last()?
                .map(|(k, v)| (TreeSize::new(k.value()), v.value().to_owned()));
            Ok(last)
        })
    }

    fn chain_head(&self, agent: &AgentName) -> Result<Option<ChainHead>, StoreError> {
        let row = self.read(|tx| {
            let t = tx.open_table(CHAIN_HEADS)?;
            Ok(t.get(agent.as_str())?.map(|g| g.value()))
        })?;
        row.map(|(seq, hash, index)| {
            Ok(ChainHead {
                seq: Seq::new(seq).map_err(|e| StoreError::Corrupt(e.to_string()))?,
                record_hash: Hash::from_bytes(hash),
                index: LeafIndex::new(index),
            })
        })
        .transpose()
    }

    fn agent_indexes(
        &self,
        agent: &AgentName,
        from: Seq,
        limit: usize,
    ) -> Result<Vec<(Seq, LeafIndex)>, StoreError> {
        let rows = self.read(|tx| {
            let t = tx.open_table(AGENT_SEQ)?;
            let mut out = Vec::new();
            for row in t
                .range((agent.as_str(), from.get())..=(agent.as_str(), u64::MAX))?
                .take(limit)
            {
                let (k, v) = row?;
                out.push((k.value().1, v.value()));
            }
            Ok(out)
        })?;
        rows.into_iter()
            .map(|(seq, index)| {
                Ok((
                    Seq::new(seq).map_err(|e| StoreError::Corrupt(e.to_string()))?,
                    LeafIndex::new(index),
                ))
            })
            .collect()
    }

    fn index_of_nonce(&self, nonce: &Nonce) -> Result<Option<LeafIndex>, StoreError> {
        self.lookup(NONCES, nonce.as_bytes())
    }

    fn index_of_record(&self, record_hash: &Hash) -> Result<Option<LeafIndex>, StoreError> {
        self.lookup(RECORD_HASHES, *record_hash.as_bytes())
    }

    fn index_of_leaf(&self, leaf_hash: &Hash) -> Result<Option<LeafIndex>, StoreError> {
        self.lookup(LEAF_HASHES, *leaf_hash.as_bytes())
    }

    fn lookup(&self, lookups: &[Lookup<'_>]) -> Result<Vec<Found>, StoreError> {
        let rows = self.read(|tx| {
            let records = tx.open_table(RECORD_HASHES)?;
            let nonces = tx.open_table(NONCES)?;
            let heads = tx.open_table(CHAIN_HEADS)?;
            let mut out = Vec::with_capacity(lookups.len());
            for l in lookups {
                out.push((
                    records.get(*l.record_hash.as_bytes())?.map(|g| g.value()),
                    nonces.get(l.nonce.as_bytes())?.map(|g| g.value()),
                    heads.get(l.agent.as_str())?.map(|g| g.value()),
                ));
            }
            Ok(out)
        })?;
        rows.into_iter()
            .map(|(record, nonce, head)| {
                Ok(Found {
                    record: record.map(LeafIndex::new),
                    nonce: nonce.map(LeafIndex::new),
                    head: head
                        .map(|(seq, hash, index)| {
                            Ok::<_, StoreError>(ChainHead {
                                seq: Seq::new(seq)
                                    .map_err(|e| StoreError::Corrupt(e.to_string()))?,
                                record_hash: Hash::from_bytes(hash),
                                index: LeafIndex::new(index),
                            })
                        })
                        .transpose()?,
                })
            })
            .collect()
    }

    fn sync(&self) -> Result<(), StoreError> {
        // An empty durable commit persists every earlier non-durable one.
        let tx = self.db.begin_write().map_err(backend)?;
        tx.commit().map_err(backend)
    }

    fn commit_batch(&self, batch: &BatchWrite) -> Result<(), StoreError> {
        batch.check_shape()?;
        let tx = self.db.begin_write().map_err(backend)?;
        {
            let mut meta = tx.open_table(META).map_err(backend)?;
            let stored = meta
                .get("tree_size")
                .map_err(backend)?
                .map_or(0, |g| g.value());
            if stored != batch.old_size.get() {
                // Dropping `tx` aborts it.
                return Err(StoreError::Conflict(format!(
                    "batch extends size {}, the stored size is {stored}",
                    batch.old_size
                )));
            }
            let mut hashes = tx.open_table(HASHES).map_err(backend)?;
            let first = tlog_tiles::stored_hash_count(batch.old_size.get());
            if hashes.len().map_err(backend)? != first {
                return Err(StoreError::Corrupt(
                    "stored hash count does not match the tree size".into(),
                ));
            }
            for (k, h) in batch.hashes.iter().enumerate() {
                hashes
                    .insert(first + k as u64, *h.as_bytes())
                    .map_err(backend)?;
            }
            let mut entries = tx.open_table(ENTRIES).map_err(backend)?;
            let mut receipts = tx.open_table(RECEIPT_SIZES).map_err(backend)?;
            let mut agent_seq = tx.open_table(AGENT_SEQ).map_err(backend)?;
            let mut nonces = tx.open_table(NONCES).map_err(backend)?;
            let mut records = tx.open_table(RECORD_HASHES).map_err(backend)?;
            let mut leaves = tx.open_table(LEAF_HASHES).map_err(backend)?;
            for e in &batch.entries {
                let i = e.index.get();
                entries.insert(i, e.canonical.as_slice()).map_err(backend)?;
                receipts
                    .insert(i, batch.receipt_size.get())
                    .map_err(backend)?;
                agent_seq
                    .insert((e.agent.as_str(), e.seq.get()), i)
                    .map_err(backend)?;
                nonces.insert(e.nonce.as_bytes(), i).map_err(backend)?;
                records
                    .insert(*e.record_hash.as_bytes(), i)
                    .map_err(backend)?;
                leaves.insert(*e.leaf_hash.as_bytes(), i).map_err(backend)?;
            }
            let mut heads = tx.open_table(CHAIN_HEADS).map_err(backend)?;
            for (agent, h) in &batch.heads {
                heads
                    .insert(
                        agent.as_str(),
                        (h.seq.get(), *h.record_hash.as_bytes(), h.index.get()),
                    )
                    .map_err(backend)?;
            }
            meta.insert("tree_size", batch.new_size().get())
                .map_err(backend)?;
        }
        tx.commit().map_err(backend)
    }

    fn put_checkpoint(&self, size: TreeSize, note: &str) -> Result<(), StoreError> {
        let mut tx = self.db.begin_write().map_err(backend)?;
        // No fsync of its own: the next batch's durable commit persists it,
        // and recovery re-signs a note lost before that (the same bytes).
        tx.set_durability(Durability::None).map_err(backend)?;
        {
            let meta = tx.open_table(META).map_err(backend)?;
            let tree_size = TreeSize::new(
                meta.get("tree_size")
                    .map_err(backend)?
                    .map_or(0, |g| g.value()),
            );
            let mut t = tx.open_table(CHECKPOINTS).map_err(backend)?;
            let latest = t
                .last()
                .map_err(backend)?
                .map(|(k, _)| TreeSize::new(k.value()));
            let existing = t
                .get(size.get())
                .map_err(backend)?
                .map(|g| g.value().to_owned());
            if check_put_checkpoint(size, note, tree_size, existing.as_deref(), latest)? {
                return Ok(());
            }
            t.insert(size.get(), note).map_err(backend)?;
        }
        tx.commit().map_err(backend)
    }
}
