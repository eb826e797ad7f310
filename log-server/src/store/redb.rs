//! The redb [`LogStore`], the default backend: one file, one durable
//! (`Durability::Immediate`) write transaction per group commit; checkpoint
//! notes are written with `Durability::None` and persisted by the next one.
//! Its tables, keys and encodings (layout version 4) are documented in
//! docs/storage.md, which is the contract for this file. A file of layout
//! version 1, 2 or 3 is migrated when it is opened (`super::redb_v1`;
//! layouts 2 and 3 need a row or two).
//!
//! A commit writes two B-tree rows per entry, at the end of their tables:
//! the entry and its leaf row (receipt size and the stored hashes the leaf
//! appends). The entry's chain row and its three rows of the merged index
//! `ids`, keyed by 16-byte prefixes (nonce, record hash, leaf hash), are
//! held in memory and written into their tables a generation at a time, in
//! key order (`super::redb_deferred`, docs/storage.md "Deferred index
//! rows"). An `ids` prefix can be shared by two entries, so every index hit
//! is confirmed against the entry before it is answered; a chain row held
//! in memory is answered only to a read whose tree holds its entry.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use redb::{
    Database, Durability, ReadTransaction, ReadableDatabase, ReadableTable, ReadableTableMetadata,
};
use tally_schemas::{AgentName, Entry, Hash, LeafIndex, Nonce, Seq, TreeSize};

pub use super::redb_deferred::DEFAULT_IDS_GENERATION;
use super::redb_deferred::{ChainRow, IdRow, PendingRows};
use super::redb_layout::{
    backend, hashes_of_leaf, id_key, meta_u64, nonce_key, write_leaf_row, CHAINS, CHECKPOINTS,
    COSIGNATURES, ENTRIES, IDS, ID_LEAF, ID_RECORD, LEAVES, META,
};
pub use super::redb_layout::{DEFAULT_MIGRATION_CHUNK, LAYOUT_VERSION};
use super::{
    check_put_checkpoint, check_put_cosignature, BatchWrite, ChainHead, Found, LogStore, Lookup,
    StoreError,
};

/// The default read cache of a redb log (`LogConfig::cache_bytes`): 64 MiB.
pub(crate) const DEFAULT_CACHE_BYTES: usize = 64 * 1024 * 1024;

fn corrupt(what: String) -> StoreError {
    StoreError::Corrupt(what)
}

/// The receipt size in a `leaves` row.
fn row_receipt_size(index: u64, row: &[u8]) -> Result<TreeSize, StoreError> {
    row.get(..8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(|b| TreeSize::new(u64::from_le_bytes(b)))
        .ok_or_else(|| corrupt(format!("leaf row {index} is too short")))
}

/// The stored hash at `level` in a `leaves` row.
fn row_hash(index: u64, row: &[u8], level: usize) -> Result<Hash, StoreError> {
    row.get(8 + 32 * level..8 + 32 * (level + 1))
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .map(Hash::from_bytes)
        .ok_or_else(|| corrupt(format!("leaf row {index} has no hash at level {level}")))
}

/// The three `ids` rows of an entry.
fn id_rows(nonce: &Nonce, record_hash: &Hash, leaf_hash: &Hash, index: u64) -> [IdRow; 3] {
    [
        (nonce_key(nonce), index),
        (id_key(ID_RECORD, record_hash), index),
        (id_key(ID_LEAF, leaf_hash), index),
    ]
}

/// A [`LogStore`] in one redb file.
pub struct RedbStore {
    db: Database,
    /// The `ids` and `chains` rows not in their tables yet; `None` after a
    /// failed commit, until they are rebuilt from the file (contract rule 5 of
    /// [`super`]: the commit may have landed or not).
    pending: RwLock<Option<PendingRows>>,
    /// Entries per merge of [`PendingRows`].
    generation: u64,
}

impl RedbStore {
    /// Opens (or creates) the log file at `path`, migrating a file of an
    /// older layout version first (docs/storage.md, "Migration from layout
    /// 1", "Migration from layouts 2 and 3"; resumable: a migration cut
    /// short by a crash goes on at the next open).
    ///
    /// # Errors
    /// [`StoreError::Backend`] when the file cannot be opened (held by another
    /// process, unreadable); [`StoreError::Corrupt`] for an unknown layout
    /// version or a layout 1 file that does not migrate.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_with_cache(path, DEFAULT_CACHE_BYTES)
    }

    /// [`RedbStore::open`] with a page cache of at most `cache_bytes`.
    ///
    /// # Errors
    /// As [`RedbStore::open`].
    pub fn open_with_cache(path: &Path, cache_bytes: usize) -> Result<Self, StoreError> {
        let generation = std::env::var("TALLY_LOG_IDS_GENERATION")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|v| *v > 0)
            .unwrap_or(DEFAULT_IDS_GENERATION);
        Self::open_with(path, cache_bytes, generation)
    }

    /// [`RedbStore::open_with_cache`] whose in-memory `ids` rows are written
    /// into the table every `generation` entries (docs/storage.md,
    /// "Deferred index rows"; tests make it small).
    ///
    /// # Errors
    /// As [`RedbStore::open`].
    pub fn open_with(path: &Path, cache_bytes: usize, generation: u64) -> Result<Self, StoreError> {
        let db = redb::Builder::new()
            .set_cache_size(cache_bytes)
            .create(path)
            .map_err(backend)?;
        let tx = db.begin_write().map_err(backend)?;
        let layout = {
            let mut meta = tx.open_table(META).map_err(backend)?;
            let layout = meta.get("layout").map_err(backend)?.map(|g| g.value());
            if layout.is_none() {
                meta.insert("layout", LAYOUT_VERSION).map_err(backend)?;
                meta.insert("tree_size", 0).map_err(backend)?;
                meta.insert("ids_to", 0).map_err(backend)?;
            }
            // Create every table so that readers never meet a missing one.
            tx.open_table(ENTRIES).map_err(backend)?;
            tx.open_table(CHECKPOINTS).map_err(backend)?;
            tx.open_table(COSIGNATURES).map_err(backend)?;
            tx.open_table(LEAVES).map_err(backend)?;
            tx.open_table(CHAINS).map_err(backend)?;
            tx.open_table(IDS).map_err(backend)?;
            layout.unwrap_or(LAYOUT_VERSION)
        };
        tx.commit().map_err(backend)?;
        match layout {
            LAYOUT_VERSION => {}
            2 | 3 => migrate_in_place(&db, layout)?,
            1 => {
                let chunk = std::env::var("TALLY_LOG_MIGRATION_CHUNK")
                    .ok()
                    .and_then(|v| v.parse::<u64>().ok())
                    .filter(|v| *v > 0)
                    .unwrap_or(DEFAULT_MIGRATION_CHUNK);
                super::redb_v1::migrate(&db, chunk)?;
            }
            other => {
                return Err(StoreError::Corrupt(format!(
                    "storage layout version {other}, this build reads 1, 2 and 3 (and migrates them) and {LAYOUT_VERSION}"
                )))
            }
        }
        let pending = load_pending(&db, generation)?;
        Ok(Self {
            db,
            pending: RwLock::new(Some(pending)),
            generation,
        })
    }

    /// Writes every `ids` and `chains` row held in memory into their tables
    /// now, in one durable transaction, and sets `meta.ids_to` to the tree size
    /// (docs/storage.md, "Deferred index rows"). The benchmarks' bulk
    /// filler calls it: its synthetic entries are not entries a later open
    /// could rebuild the rows from.
    ///
    /// # Errors
    /// [`StoreError::Backend`] when the write fails (the rows are then
    /// rebuilt from the file at their next use).
    #[cfg(any(test, feature = "testing"))]
    pub fn write_index_rows(&self) -> Result<(), StoreError> {
        drop(self.pending()?);
        let result = (|| {
            let tx = self.db.begin_write().map_err(backend)?;
            // Read inside the write transaction: every commit before it
            // has added its rows, and none can add more until it ends.
            let (rows, chain_rows) = {
                let pending = self.pending()?;
                let pending = loaded(pending.as_ref())?;
                (pending.all_id_rows(), pending.all_chain_rows())
            };
            let size = {
                let mut meta = tx.open_table(META).map_err(backend)?;
                let size = meta_u64(&meta, "tree_size")?;
                let mut ids = tx.open_table(IDS).map_err(backend)?;
                for key in rows.iter().filter(|r| r.1 < size) {
                    ids.insert(*key, ()).map_err(backend)?;
                }
                let mut chains = tx.open_table(CHAINS).map_err(backend)?;
                for r in chain_rows.iter().filter(|r| r.index < size) {
                    insert_chain_row(&mut chains, r)?;
                }
                meta.insert("ids_to", size).map_err(backend)?;
                size
            };
            tx.commit().map_err(backend)?;
            Ok(size)
        })();
        // As in `commit_batch`: rows leave memory after the commit.
        let mut guard = self.pending_write();
        match (&result, guard.as_mut()) {
            (Ok(size), Some(pending)) => pending.drop_below(*size),
            _ => *guard = None,
        }
        result.map(|_| ())
    }

    /// The in-memory index rows, rebuilt from the file first when a failed
    /// commit left them unknown.
    fn pending(&self) -> Result<RwLockReadGuard<'_, Option<PendingRows>>, StoreError> {
        loop {
            let p = self.pending.read().unwrap_or_else(|e| e.into_inner());
            if p.is_some() {
                return Ok(p);
            }
            drop(p);
            let mut w = self.pending_write();
            if w.is_none() {
                *w = Some(load_pending(&self.db, self.generation)?);
            }
        }
    }

    /// The in-memory index rows, write-locked. A lock poisoned by a panic
    /// is used as it is: the rows are rebuilt after any failed commit.
    fn pending_write(&self) -> RwLockWriteGuard<'_, Option<PendingRows>> {
        self.pending.write().unwrap_or_else(|e| e.into_inner())
    }

    /// `f` over one read of the file and the index rows that go with it:
    /// the rows are read-locked before the read begins and until `f` ends,
    /// and rows leave memory only after the commit that put them in the
    /// table, so every row is in this read's table or in memory.
    fn read_ids<T>(
        &self,
        f: impl FnOnce(&ReadTransaction, &PendingRows) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let guard = self.pending()?;
        let pending = loaded(guard.as_ref())?;
        let tx = self.db.begin_read().map_err(backend)?;
        f(&tx, pending)
    }

    fn read<T>(
        &self,
        f: impl FnOnce(&ReadTransaction) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let tx = self.db.begin_read().map_err(backend)?;
        f(&tx)
    }
}

/// Moves a layout 2 or 3 file to the current layout in one transaction,
/// rewriting no row (docs/storage.md, "Migration from layouts 2 and 3").
/// Both hold every entry's `chains` row, which layout 4 allows (the rows
/// of the entries from `ids_to` on may be in the tables or not). Layout 2
/// also holds every `ids` row, so its `ids_to` is the tree size; layout 3
/// keeps its own.
fn migrate_in_place(db: &Database, from: u64) -> Result<(), StoreError> {
    let tx = db.begin_write().map_err(backend)?;
    let size = {
        let mut meta = tx.open_table(META).map_err(backend)?;
        let size = meta_u64(&meta, "tree_size")?;
        if from == 2 {
            meta.insert("ids_to", size).map_err(backend)?;
        }
        meta.insert("layout", LAYOUT_VERSION).map_err(backend)?;
        size
    };
    tx.commit().map_err(backend)?;
    tracing::info!(
        entries = size,
        "log store moved from layout {from} to layout {LAYOUT_VERSION} (no row rewritten)"
    );
    Ok(())
}

/// Writes a `chains` row into its table.
fn insert_chain_row(
    chains: &mut redb::Table<'_, (&'static str, u64), (u64, [u8; 32])>,
    r: &ChainRow,
) -> Result<(), StoreError> {
    chains
        .insert((r.agent.as_str(), r.seq), (r.index, r.hash))
        .map_err(backend)?;
    Ok(())
}

/// The tree size of a read.
fn tree_size_in(tx: &ReadTransaction) -> Result<u64, StoreError> {
    meta_u64(&tx.open_table(META).map_err(backend)?, "tree_size")
}

/// The `ids` and `chains` rows of the entries `meta.ids_to..tree_size`,
/// from the entries.
fn load_pending(db: &Database, generation: u64) -> Result<PendingRows, StoreError> {
    let tx = db.begin_read().map_err(backend)?;
    let meta = tx.open_table(META).map_err(backend)?;
    let (ids_to, size) = (meta_u64(&meta, "ids_to")?, meta_u64(&meta, "tree_size")?);
    if ids_to > size {
        return Err(corrupt(format!(
            "the index covers {ids_to} entries, the tree has {size}"
        )));
    }
    let mut pending = PendingRows::new(ids_to, generation);
    let entries = tx.open_table(ENTRIES).map_err(backend)?;
    for row in entries.range(ids_to..size).map_err(backend)? {
        let (k, v) = row.map_err(backend)?;
        let index = k.value();
        let entry = Entry::from_json(v.value())
            .map_err(|e| corrupt(format!("stored entry {index} does not parse: {e}")))?;
        let record = entry.record();
        let record_hash = record.hash();
        for r in id_rows(&record.nonce, &record_hash, &entry.leaf_hash(), index) {
            pending.insert(r);
        }
        pending.insert_chain(
            record.agent.as_str(),
            record.seq.get(),
            index,
            *record_hash.as_bytes(),
        );
    }
    if pending.len() as u64 != 3 * (size - ids_to) || pending.chain_len() as u64 != size - ids_to {
        return Err(corrupt(format!(
            "entries {ids_to}..{size} are not all stored"
        )));
    }
    Ok(pending)
}

/// The leaf indexes filed under `key`: in `ids` (each must be a stored
/// entry), then in memory (an entry of a commit under way may be among
/// those, and is not in this read: `in_table` is false for them).
fn id_candidates(
    ids: &impl ReadableTable<([u8; 16], u64), ()>,
    pending: &PendingRows,
    key: [u8; 16],
) -> Result<Vec<Candidate>, StoreError> {
    let mut out = Vec::new();
    for row in ids.range((key, 0)..=(key, u64::MAX)).map_err(backend)? {
        out.push(Candidate {
            index: row.map_err(backend)?.0.value().1,
            in_table: true,
        });
    }
    out.extend(pending.candidates(key).into_iter().map(|index| Candidate {
        index,
        in_table: false,
    }));
    Ok(out)
}

/// The in-memory index rows of a guard: `None` only between a failed
/// commit and their rebuild at the next use.
fn loaded<T>(rows: Option<T>) -> Result<T, StoreError> {
    rows.ok_or_else(|| backend("the pending index rows are not loaded"))
}

/// An index hit, to be confirmed against its entry.
struct Candidate {
    index: u64,
    in_table: bool,
}

/// The entry at `c.index` in this read, parsed: `None` when an in-memory
/// candidate's entry is not stored (its commit is under way), an error when
/// a table row's is not.
fn candidate_entry(
    entries: &impl ReadableTable<u64, &'static [u8]>,
    c: &Candidate,
) -> Result<Option<Entry>, StoreError> {
    if !c.in_table && entries.get(c.index).map_err(backend)?.is_none() {
        return Ok(None);
    }
    entry_in(entries, c.index).map(Some)
}

/// The entry at `index` of an open `entries` table, parsed.
fn entry_in(
    entries: &impl ReadableTable<u64, &'static [u8]>,
    index: u64,
) -> Result<Entry, StoreError> {
    let row = entries
        .get(index)
        .map_err(backend)?
        .ok_or_else(|| corrupt(format!("indexed entry {index} is not stored")))?;
    Entry::from_json(row.value())
        .map_err(|e| corrupt(format!("stored entry {index} does not parse: {e}")))
}

/// The entry filed under `key` whose parsed entry `matches`: the
/// candidates of [`id_candidates`], each confirmed against its entry.
fn find_entry(
    ids: &impl ReadableTable<([u8; 16], u64), ()>,
    entries: &impl ReadableTable<u64, &'static [u8]>,
    pending: &PendingRows,
    key: [u8; 16],
    matches: impl Fn(&Entry) -> bool,
) -> Result<Option<LeafIndex>, StoreError> {
    for c in id_candidates(ids, pending, key)? {
        if candidate_entry(entries, &c)?.is_some_and(|e| matches(&e)) {
            return Ok(Some(LeafIndex::new(c.index)));
        }
    }
    Ok(None)
}

/// [`find_entry`] in one read, opening its tables.
fn find_entry_in(
    tx: &ReadTransaction,
    pending: &PendingRows,
    key: [u8; 16],
    matches: impl Fn(&Entry) -> bool,
) -> Result<Option<LeafIndex>, StoreError> {
    let ids = tx.open_table(IDS).map_err(backend)?;
    let entries = tx.open_table(ENTRIES).map_err(backend)?;
    find_entry(&ids, &entries, pending, key, matches)
}

/// The head of `agent`'s chain in a read of tree size `size`: the last of
/// its rows in the `chains` table and in memory.
fn chain_head_of(
    chains: &impl ReadableTable<(&'static str, u64), (u64, [u8; 32])>,
    pending: &PendingRows,
    size: u64,
    agent: &AgentName,
) -> Result<Option<ChainHead>, StoreError> {
    let stored = chains
        .range((agent.as_str(), 0)..=(agent.as_str(), u64::MAX))
        .map_err(backend)?
        .next_back()
        .transpose()
        .map_err(backend)?
        .map(|(k, v)| {
            let (index, hash) = v.value();
            (k.value().1, index, hash)
        });
    let head = stored.max(pending.chain_head(agent.as_str(), size));
    head.map(|(seq, index, hash)| {
        Ok(ChainHead {
            seq: Seq::new(seq).map_err(|e| corrupt(e.to_string()))?,
            record_hash: Hash::from_bytes(hash),
            index: LeafIndex::new(index),
        })
    })
    .transpose()
}

impl LogStore for RedbStore {
    fn size(&self) -> Result<TreeSize, StoreError> {
        self.read(|tx| {
            let meta = tx.open_table(META).map_err(backend)?;
            Ok(TreeSize::new(meta_u64(&meta, "tree_size")?))
        })
    }

    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, StoreError> {
        self.read(|tx| {
            let leaves = tx.open_table(LEAVES).map_err(backend)?;
            let mut out = Vec::with_capacity(indexes.len());
            let mut last: Option<(u64, Vec<u8>)> = None;
            for &i in indexes {
                let (level, n) = tlog_tiles::split_stored_hash_index(i);
                // Stored hash (level, n) is appended by the leaf that
                // completes that subtree: ((n + 1) << level) − 1.
                let leaf = n
                    .checked_add(1)
                    .filter(|m| m.leading_zeros() >= u32::from(level))
                    .map(|m| (m << level) - 1)
                    .ok_or_else(|| corrupt(format!("stored hash {i} is out of range")))?;
                if last.as_ref().is_none_or(|(at, _)| *at != leaf) {
                    let row = leaves
                        .get(leaf)
                        .map_err(backend)?
                        .ok_or_else(|| corrupt(format!("stored hash {i} is missing")))?
                        .value()
                        .to_vec();
                    last = Some((leaf, row));
                }
                let row = last.as_ref().map(|(_, r)| r.as_slice()).unwrap_or_default();
                out.push(row_hash(leaf, row, usize::from(level))?);
            }
            Ok(out)
        })
    }

    fn entries(&self, start: LeafIndex, end: LeafIndex) -> Result<Vec<Vec<u8>>, StoreError> {
        if start >= end {
            return Ok(Vec::new());
        }
        self.read(|tx| {
            let t = tx.open_table(ENTRIES).map_err(backend)?;
            let mut out = Vec::new();
            for row in t.range(start.get()..end.get()).map_err(backend)? {
                out.push(row.map_err(backend)?.1.value().to_vec());
            }
            Ok(out)
        })
    }

    fn receipt_size(&self, index: LeafIndex) -> Result<Option<TreeSize>, StoreError> {
        self.read(|tx| {
            let t = tx.open_table(LEAVES).map_err(backend)?;
            let row = t.get(index.get()).map_err(backend)?;
            row.map(|r| row_receipt_size(index.get(), r.value()))
                .transpose()
        })
    }

    fn checkpoint(&self, size: TreeSize) -> Result<Option<String>, StoreError> {
        self.read(|tx| {
            let t = tx.open_table(CHECKPOINTS).map_err(backend)?;
            Ok(t.get(size.get())
                .map_err(backend)?
                .map(|g| g.value().to_owned()))
        })
    }

    fn latest_checkpoint(&self) -> Result<Option<(TreeSize, String)>, StoreError> {
        self.read(|tx| {
            let t = tx.open_table(CHECKPOINTS).map_err(backend)?;
            let last = t
                .last()
                .map_err(backend)?
                .map(|(k, v)| (TreeSize::new(k.value()), v.value().to_owned()));
            Ok(last)
        })
    }

    fn chain_head(&self, agent: &AgentName) -> Result<Option<ChainHead>, StoreError> {
        self.read_ids(|tx, pending| {
            let chains = tx.open_table(CHAINS).map_err(backend)?;
            chain_head_of(&chains, pending, tree_size_in(tx)?, agent)
        })
    }

    fn agent_indexes(
        &self,
        agent: &AgentName,
        from: Seq,
        limit: usize,
    ) -> Result<Vec<(Seq, LeafIndex)>, StoreError> {
        self.read_ids(|tx, pending| {
            let t = tx.open_table(CHAINS).map_err(backend)?;
            // The first `limit` of the rows in the table and in memory (a
            // row can be in both while a merge runs).
            let mut rows: Vec<(u64, u64)> =
                pending.chain_rows(agent.as_str(), from.get(), tree_size_in(tx)?, limit);
            for row in t
                .range((agent.as_str(), from.get())..=(agent.as_str(), u64::MAX))
                .map_err(backend)?
                .take(limit)
            {
                let (k, v) = row.map_err(backend)?;
                rows.push((k.value().1, v.value().0));
            }
            rows.sort_unstable();
            rows.dedup();
            rows.into_iter()
                .take(limit)
                .map(|(seq, index)| {
                    Ok((
                        Seq::new(seq).map_err(|e| corrupt(e.to_string()))?,
                        LeafIndex::new(index),
                    ))
                })
                .collect()
        })
    }

    fn index_of_nonce(&self, nonce: &Nonce) -> Result<Option<LeafIndex>, StoreError> {
        self.read_ids(|tx, pending| {
            find_entry_in(tx, pending, nonce_key(nonce), |e| {
                e.record().nonce == *nonce
            })
        })
    }

    fn index_of_record(&self, record_hash: &Hash) -> Result<Option<LeafIndex>, StoreError> {
        self.read_ids(|tx, pending| {
            find_entry_in(tx, pending, id_key(ID_RECORD, record_hash), |e| {
                e.record().hash() == *record_hash
            })
        })
    }

    fn index_of_leaf(&self, leaf_hash: &Hash) -> Result<Option<LeafIndex>, StoreError> {
        self.read_ids(|tx, pending| {
            let ids = tx.open_table(IDS).map_err(backend)?;
            let leaves = tx.open_table(LEAVES).map_err(backend)?;
            for c in id_candidates(&ids, pending, id_key(ID_LEAF, leaf_hash))? {
                let i = c.index;
                let Some(row) = leaves.get(i).map_err(backend)? else {
                    if c.in_table {
                        return Err(corrupt(format!("indexed leaf {i} is not stored")));
                    }
                    continue;
                };
                if row_hash(i, row.value(), 0)? == *leaf_hash {
                    return Ok(Some(LeafIndex::new(i)));
                }
            }
            Ok(None)
        })
    }

    fn lookup(&self, lookups: &[Lookup<'_>]) -> Result<Vec<Found>, StoreError> {
        self.read_ids(|tx, pending| {
            // Each table is opened once for the whole batch, each agent's
            // head read once (this read sees one state), and the nonce
            // index, whose keys are random, is searched in key order so
            // that neighbouring searches walk the same pages.
            let size = tree_size_in(tx)?;
            let chains = tx.open_table(CHAINS).map_err(backend)?;
            let ids = tx.open_table(IDS).map_err(backend)?;
            let entries = tx.open_table(ENTRIES).map_err(backend)?;
            let mut heads: HashMap<&str, Option<ChainHead>> = HashMap::new();
            let mut out = Vec::with_capacity(lookups.len());
            let mut nonces: Vec<([u8; 16], usize)> = Vec::new();
            for (k, l) in lookups.iter().enumerate() {
                // A committed record with this hash is the agent's entry at
                // this seq: the hash covers both.
                let row = match pending.chain_row(l.agent.as_str(), l.seq.get(), size) {
                    Some(row) => Some(row),
                    None => chains
                        .get((l.agent.as_str(), l.seq.get()))
                        .map_err(backend)?
                        .map(|g| g.value()),
                };
                let record = row
                    .filter(|(_, h)| *h == *l.record_hash.as_bytes())
                    .map(|(i, _)| LeafIndex::new(i));
                let head = match heads.get(l.agent.as_str()) {
                    Some(h) => h.clone(),
                    None => {
                        let h = chain_head_of(&chains, pending, size, l.agent)?;
                        heads.insert(l.agent.as_str(), h.clone());
                        h
                    }
                };
                if record.is_none() {
                    nonces.push((nonce_key(l.nonce), k));
                }
                out.push(Found {
                    record,
                    // The same record, so the same nonce.
                    nonce: record,
                    head,
                });
            }
            nonces.sort_unstable();
            for (key, k) in nonces {
                let nonce = lookups[k].nonce;
                out[k].nonce =
                    find_entry(&ids, &entries, pending, key, |e| e.record().nonce == *nonce)?;
            }
            Ok(out)
        })
    }

    fn sync(&self) -> Result<(), StoreError> {
        // An empty durable commit persists every earlier non-durable one.
        let tx = self.db.begin_write().map_err(backend)?;
        tx.commit().map_err(backend)
    }

    fn commit_batch(&self, batch: &BatchWrite) -> Result<(), StoreError> {
        batch.check_shape()?;
        drop(self.pending()?);
        let tx = self.db.begin_write().map_err(backend)?;
        let step = {
            let mut meta = tx.open_table(META).map_err(backend)?;
            let stored = meta_u64(&meta, "tree_size")?;
            if stored != batch.old_size.get() {
                // Dropping `tx` aborts it.
                return Err(StoreError::Conflict(format!(
                    "batch extends size {}, the stored size is {stored}",
                    batch.old_size
                )));
            }
            let mut leaves = tx.open_table(LEAVES).map_err(backend)?;
            if leaves.len().map_err(backend)? != stored {
                return Err(StoreError::Corrupt(
                    "the number of leaf rows does not match the tree size".into(),
                ));
            }
            let mut entries = tx.open_table(ENTRIES).map_err(backend)?;
            // The entries and leaf rows go in index order, at the end of
            // their tables; the chain and `ids` rows go into memory below.
            let mut row = Vec::new();
            let mut next_hash = 0usize;
            for e in &batch.entries {
                let i = e.index.get();
                let count = hashes_of_leaf(i);
                let hashes = batch
                    .hashes
                    .get(next_hash..next_hash + count)
                    .ok_or_else(|| {
                        StoreError::Conflict("batch has too few stored hashes".into())
                    })?;
                next_hash += count;
                entries.insert(i, e.canonical.as_slice()).map_err(backend)?;
                write_leaf_row(&mut row, batch.receipt_size, hashes);
                leaves.insert(i, row.as_slice()).map_err(backend)?;
            }
            if next_hash != batch.hashes.len() {
                return Err(StoreError::Conflict(
                    "batch has stored hashes beyond its entries".into(),
                ));
            }
            // This commit's slice of a running merge of the in-memory
            // rows: a contiguous key range of each table, in key order.
            let step = loaded(self.pending_write().as_mut())?.step(stored, batch.entries.len());
            if let Some(step) = &step {
                let mut ids = tx.open_table(IDS).map_err(backend)?;
                for key in step.rows() {
                    ids.insert(*key, ()).map_err(backend)?;
                }
                let mut chains = tx.open_table(CHAINS).map_err(backend)?;
                for r in step.chain_rows() {
                    insert_chain_row(&mut chains, r)?;
                }
                if let Some(to) = step.completes() {
                    meta.insert("ids_to", to).map_err(backend)?;
                }
            }
            meta.insert("tree_size", batch.new_size().get())
                .map_err(backend)?;
            step
        };
        // The new entries' `ids` and chain rows go into memory before the
        // commit, so that a read which sees the entries finds them; a read
        // before it skips them (their entries are not in that read: its
        // tree size is below them). Rows of a merge leave memory only
        // after the commit that put them in the table: a read holds the
        // lock from before its transaction begins (`read_ids`), so it
        // either ends before they leave or begins after that commit.
        {
            let mut guard = self.pending_write();
            let pending = loaded(guard.as_mut())?;
            for e in &batch.entries {
                for r in id_rows(&e.nonce, &e.record_hash, &e.leaf_hash, e.index.get()) {
                    pending.insert(r);
                }
                pending.insert_chain(
                    e.agent.as_str(),
                    e.seq.get(),
                    e.index.get(),
                    *e.record_hash.as_bytes(),
                );
            }
        }
        let result = tx.commit().map_err(backend);
        let mut guard = self.pending_write();
        match (&result, guard.as_mut()) {
            (Ok(()), Some(pending)) => {
                if let Some(step) = &step {
                    pending.advance(step);
                }
            }
            // The commit may have landed or not: rebuild from the file.
            _ => *guard = None,
        }
        result
    }

    fn put_checkpoint(&self, size: TreeSize, note: &str) -> Result<(), StoreError> {
        let mut tx = self.db.begin_write().map_err(backend)?;
        // No fsync of its own: the next batch's durable commit persists it,
        // and recovery re-signs a note lost before that (the same bytes).
        tx.set_durability(Durability::None).map_err(backend)?;
        {
            let meta = tx.open_table(META).map_err(backend)?;
            let tree_size = TreeSize::new(meta_u64(&meta, "tree_size")?);
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

    fn put_cosignature(
        &self,
        size: TreeSize,
        cosigner: &str,
        line: &str,
    ) -> Result<(), StoreError> {
        let mut tx = self.db.begin_write().map_err(backend)?;
        // As for checkpoint notes: the next durable commit persists it, and
        // a cosignature lost before that is asked for again.
        tx.set_durability(Durability::None).map_err(backend)?;
        {
            let stored = tx
                .open_table(CHECKPOINTS)
                .map_err(backend)?
                .get(size.get())
                .map_err(backend)?
                .is_some();
            let mut t = tx.open_table(COSIGNATURES).map_err(backend)?;
            let existing = t
                .get((size.get(), cosigner))
                .map_err(backend)?
                .map(|g| g.value().to_owned());
            if check_put_cosignature(size, cosigner, line, stored, existing.as_deref())? {
                return Ok(());
            }
            t.insert((size.get(), cosigner), line).map_err(backend)?;
        }
        tx.commit().map_err(backend)
    }

    fn cosignatures(&self, size: TreeSize) -> Result<Vec<(String, String)>, StoreError> {
        self.read(|tx| {
            let t = tx.open_table(COSIGNATURES).map_err(backend)?;
            let mut out = Vec::new();
            for row in t.range((size.get(), "")..).map_err(backend)? {
                let (k, v) = row.map_err(backend)?;
                let (row_size, cosigner) = k.value();
                if row_size != size.get() {
                    break;
                }
                out.push((cosigner.to_owned(), v.value().to_owned()));
            }
            Ok(out)
        })
    }
}
