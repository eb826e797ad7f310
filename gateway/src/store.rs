//! The agent's local chain store: one redb file per agent that
//! holds its records (docs/protocol.md §3), the salts and optional contents
//! behind their salted hashes (§6.1), the witness's receipts (§8) and the
//! sync state. Every record is committed here durably before it is sent to
//! a witness. The gateway forwards a call once its decision is in the record
//! journal beside the store (crate::journal) and commits it here right
//! after; [`ChainStore::open`] replays that journal first, so a crash between
//! the two loses nothing.
//!
//! Tables (keys big-endian by redb's `u64` encoding):
//!
//! | table | key | value |
//! |---|---|---|
//! | `records` | seq | canonical record bytes |
//! | `secrets` | seq | JSON `{"salt": hex, "content": value?, "proof": {"salt", "content"?}?}` for decisions, outcomes and claims |
//! | `receipts` | seq | receipt JSON as the witness sent it (accepted before it is stored) |
//! | `superseded_receipts` | seq | a receipt replaced after the witness lost the record (sync rewind) |
//! | `open_decisions` | call id | seq of a decision that has no outcome yet |
//! | `meta` | name | `sync_cursor` (u64 BE: lowest seq without a receipt), `sync_error`, `fork` (UTF-8 JSON); `tools_fingerprint` (hex), written by releases before tool sources and no longer read |
//!
//! redb holds a lock on the file, so one process at a time writes an
//! agent's chain, which is what a linear chain needs.

use std::path::{Path, PathBuf};

use redb::{
    Database, ReadableDatabase as _, ReadableTable as _, ReadableTableMetadata as _,
    TableDefinition,
};
use serde::{Deserialize, Serialize};
use tally_schemas::{Hash, Record, Seq, UnixMillis};

pub use crate::appended::{Appended, Secret};

const RECORDS: TableDefinition<u64, &[u8]> = TableDefinition::new("records");
const SECRETS: TableDefinition<u64, &[u8]> = TableDefinition::new("secrets");
const RECEIPTS: TableDefinition<u64, &[u8]> = TableDefinition::new("receipts");
const OPEN_DECISIONS: TableDefinition<&str, u64> = TableDefinition::new("open_decisions");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const SUPERSEDED: TableDefinition<u64, &[u8]> = TableDefinition::new("superseded_receipts");

const SYNC_CURSOR: &str = "sync_cursor";
const SYNC_ERROR: &str = "sync_error";
const FORK: &str = "fork";

/// Why the store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// redb refused (I/O error, full disk, read-only file, lock held by
    /// another process, …).
    #[error("local chain store: {0}")]
    Db(String),
    /// Stored bytes do not parse: the file was damaged or edited.
    #[error("local chain store is damaged: {0}")]
    Corrupt(String),
    /// Another writer (a process, or another handle in this one) has the
    /// store open: it is the agent's owner, reached over its socket
    /// (crate::chain).
    #[error("local chain store {0}: another writer has it open")]
    Locked(String),
}

macro_rules! db_err {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self {
                Self::Db(e.to_string())
            }
        }
    )*};
}
db_err!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

/// The last sync error, as shown by `tally status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncErrorNote {
    /// When it happened (local clock).
    pub time: UnixMillis,
    /// The record being synced, when there was one.
    pub seq: Option<u64>,
    /// A stable code (`chain_conflict`, `transport`, `receipt_invalid`, …).
    pub code: String,
    /// What went wrong.
    pub message: String,
}

/// The summary `tally status` prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreStatus {
    /// Number of records.
    pub records: u64,
    /// Head seq and hash.
    pub head: Option<(u64, Hash)>,
    /// Records with a receipt.
    pub receipted: u64,
    /// Lowest seq without a receipt.
    pub sync_cursor: u64,
    /// The last sync error, if the last attempt failed.
    pub last_sync_error: Option<SyncErrorNote>,
    /// Set when the witness's view of the chain differs from ours.
    pub fork: Option<SyncErrorNote>,
    /// Receipts kept after the witness lost the records they were for.
    pub superseded_receipts: u64,
}

/// Where appends go. The redb [`ChainStore`] is the real one; tests wrap it
/// to inject failures.
pub trait ChainWriter: Send + 'static {
    /// The current head (seq, hash, time), `None` for an empty chain.
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot be read.
    fn head(&self) -> Result<Option<(Seq, Hash, UnixMillis)>, StoreError>;
    /// Appends `batch` atomically and durably: all of it or none.
    ///
    /// # Errors
    /// [`StoreError`] when the transaction did not commit.
    fn append(&self, batch: &[Appended]) -> Result<(), StoreError>;
}

/// The redb chain store of one agent.
#[derive(Debug)]
pub struct ChainStore {
    db: Database,
    recovered: JournalRecovery,
    /// Receipts were committed without a sync of the file since the last
    /// [`ChainStore::persist`].
    deferred: std::sync::atomic::AtomicBool,
}

impl Drop for ChainStore {
    fn drop(&mut self) {
        // Closing writes out deferred receipts (a failure leaves them to be
        // fetched again at the next sync).
        let _ = self.persist();
    }
}

/// What [`ChainStore::open`] took over from the record journal of a run
/// that ended before committing everything it journaled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JournalRecovery {
    /// Records committed to the store from the journal.
    pub records: u64,
    /// Bytes of a torn last write, dropped (nothing in them was answered).
    pub torn_bytes: u64,
}

/// The record journal of the store at `store_path`: the same name with the
/// extension `journal` (`chain.redb` → `chain.journal`).
#[must_use]
pub fn journal_path(store_path: &Path) -> PathBuf {
    store_path.with_extension("journal")
}

fn parse_record(bytes: &[u8]) -> Result<Record, StoreError> {
    Record::from_json(bytes).map_err(|e| StoreError::Corrupt(format!("stored record: {e}")))
}

impl ChainStore {
    /// Opens (or creates) the store at `path`, then replays its record
    /// journal ([`journal_path`]): records a previous run journaled but did
    /// not commit are committed now, durably, and the journal is emptied.
    ///
    /// # Errors
    /// [`StoreError::Db`] when the file cannot be opened for writing,
    /// including when another process has it open;
    /// [`StoreError::Corrupt`] when the journal holds records that do not
    /// continue the stored chain (or differ from stored ones).
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let db = Database::create(path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => {
                StoreError::Locked(path.display().to_string())
            }
            e => StoreError::Db(e.to_string()),
        })?;
        let tx = db.begin_write()?;
        {
            tx.open_table(RECORDS)?;
            tx.open_table(SECRETS)?;
            tx.open_table(RECEIPTS)?;
            tx.open_table(OPEN_DECISIONS)?;
            tx.open_table(META)?;
            tx.open_table(SUPERSEDED)?;
        }
        tx.commit()?;
        let mut store = Self {
            db,
            recovered: JournalRecovery::default(),
            deferred: std::sync::atomic::AtomicBool::new(false),
        };
        store.recovered = store.replay_journal(&journal_path(path))?;
        Ok(store)
    }

    /// What opening took over from the record journal.
    #[must_use]
    pub fn recovered_from_journal(&self) -> JournalRecovery {
        self.recovered
    }

    fn replay_journal(&self, path: &Path) -> Result<JournalRecovery, StoreError> {
        let contents = crate::journal::read(path).map_err(StoreError::Corrupt)?;
        if contents.records.is_empty() && contents.torn_bytes == 0 {
            return Ok(JournalRecovery::default());
        }
        let mut head = self.head()?;
        let mut missing = Vec::new();
        for a in contents.records {
            let record = &a.record;
            let seq = record.seq.get();
            if let Some((h, _, _)) = head.filter(|(h, _, _)| seq <= h.get()) {
                // Committed before the crash: it must be the very record.
                let stored = self.record(seq)?;
                if stored.as_ref().map(Record::hash) != Some(record.hash()) {
                    return Err(StoreError::Corrupt(format!(
                        "the record journal holds a different record at seq {seq} than the store (head {h})"
                    )));
                }
                continue;
            }
            let extends = match head {
                None => seq == 0 && record.prev.is_none(),
                Some((h, hash, _)) => seq == h.get() + 1 && record.prev == Some(hash),
            };
            if !extends {
                return Err(StoreError::Corrupt(format!(
                    "the record journal's record at seq {seq} does not continue the stored chain (head {:?})",
                    head.map(|(h, _, _)| h.get())
                )));
            }
            head = Some((record.seq, record.hash(), record.time));
            missing.push(a);
        }
        if !missing.is_empty() {
            ChainWriter::append(self, &missing)?;
        }
        // Emptied only once its records are durable here: a crash before
        // this leaves them to be replayed again, which finds them committed.
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .and_then(|f| f.set_len(0))
            .map_err(|e| StoreError::Db(format!("emptying {}: {e}", path.display())))?;
        Ok(JournalRecovery {
            records: missing.len() as u64,
            torn_bytes: contents.torn_bytes,
        })
    }

    /// The record at `seq`.
    ///
    /// # Errors
    /// [`StoreError`] on read failure or a damaged record.
    pub fn record(&self, seq: u64) -> Result<Option<Record>, StoreError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(RECORDS)?;
        t.get(seq)?.map(|v| parse_record(v.value())).transpose()
    }

    /// Records from `from` on, at most `limit`.
    ///
    /// # Errors
    /// [`StoreError`] on read failure or a damaged record.
    pub fn records(&self, from: u64, limit: usize) -> Result<Vec<Record>, StoreError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(RECORDS)?;
        let mut out = Vec::new();
        for item in t.range(from..)?.take(limit) {
            let (_, v) = item?;
            out.push(parse_record(v.value())?);
        }
        Ok(out)
    }

    /// The secret kept for the record at `seq`.
    ///
    /// # Errors
    /// [`StoreError`] on read failure or damaged data.
    pub fn secret(&self, seq: u64) -> Result<Option<Secret>, StoreError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(SECRETS)?;
        t.get(seq)?
            .map(|v| {
                serde_json::from_slice(v.value())
                    .map_err(|e| StoreError::Corrupt(format!("secret {seq}: {e}")))
            })
            .transpose()
    }

    /// The stored receipt bytes of `seq`.
    ///
    /// # Errors
    /// [`StoreError`] on read failure.
    pub fn receipt(&self, seq: u64) -> Result<Option<Vec<u8>>, StoreError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(RECEIPTS)?;
        Ok(t.get(seq)?.map(|v| v.value().to_vec()))
    }

    /// The seq of the open decision (no outcome yet) with this call id.
    ///
    /// # Errors
    /// [`StoreError`] on read failure.
    pub fn open_decision(&self, call_id: &str) -> Result<Option<u64>, StoreError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(OPEN_DECISIONS)?;
        Ok(t.get(call_id)?.map(|v| v.value()))
    }

    fn meta(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(META)?;
        Ok(t.get(key)?.map(|v| v.value().to_vec()))
    }

    fn set_meta(&self, key: &str, value: Option<&[u8]>) -> Result<(), StoreError> {
        if value.is_none() && self.meta(key)?.is_none() {
            // Nothing to clear: no write, so no commit and no sync of the file.
            return Ok(());
        }
        let tx = self.db.begin_write()?;
        {
            let mut t = tx.open_table(META)?;
            match value {
                Some(v) => {
                    t.insert(key, v)?;
                }
                None => {
                    t.remove(key)?;
                }
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Lowest seq without a receipt: the next record to sync.
    ///
    /// # Errors
    /// [`StoreError`] on read failure.
    pub fn sync_cursor(&self) -> Result<u64, StoreError> {
        Ok(match self.meta(SYNC_CURSOR)? {
            Some(b) => u64::from_be_bytes(
                b.as_slice()
                    .try_into()
                    .map_err(|_| StoreError::Corrupt("sync cursor is not 8 bytes".into()))?,
            ),
            None => 0,
        })
    }

    /// Stores accepted receipts, `(seq, receipt)`, in one transaction, and
    /// moves the sync cursor past every receipted record that follows
    /// without a gap.
    ///
    /// # Errors
    /// [`StoreError`] when it did not commit.
    pub fn put_receipts(&self, accepted: &[(u64, &[u8])]) -> Result<u64, StoreError> {
        self.store_receipts(accepted, redb::Durability::Immediate)
    }

    /// [`Self::put_receipts`] without syncing the file: the next durable
    /// commit (the next record), [`Self::persist`] or closing the store
    /// writes them out. A receipt lost in a crash before that is fetched
    /// again, since the witness answers a record it holds with its original
    /// receipt (docs/protocol.md §8; docs/operations.md "Syncing").
    ///
    /// # Errors
    /// [`StoreError`] when it did not commit.
    pub fn put_receipts_deferred(&self, accepted: &[(u64, &[u8])]) -> Result<u64, StoreError> {
        let cursor = self.store_receipts(accepted, redb::Durability::None)?;
        self.deferred
            .store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(cursor)
    }

    /// Writes out what [`Self::put_receipts_deferred`] committed, if
    /// anything: an empty durable commit.
    ///
    /// # Errors
    /// [`StoreError`] when it did not commit.
    pub fn persist(&self) -> Result<(), StoreError> {
        if self
            .deferred
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            self.db.begin_write()?.commit()?;
        }
        Ok(())
    }

    fn store_receipts(
        &self,
        accepted: &[(u64, &[u8])],
        durability: redb::Durability,
    ) -> Result<u64, StoreError> {
        let mut tx = self.db.begin_write()?;
        tx.set_durability(durability)
            .map_err(|e| StoreError::Db(e.to_string()))?;
        let cursor;
        {
            let mut receipts = tx.open_table(RECEIPTS)?;
            for (seq, receipt_json) in accepted {
                receipts.insert(*seq, *receipt_json)?;
            }
            let mut meta = tx.open_table(META)?;
            let mut c = match meta.get(SYNC_CURSOR)? {
                Some(b) => u64::from_be_bytes(b.value().try_into().unwrap_or([0; 8])),
                None => 0,
            };
            while receipts.get(c)?.is_some() {
                c += 1;
            }
            meta.insert(SYNC_CURSOR, c.to_be_bytes().as_slice())?;
            cursor = c;
        }
        tx.commit()?;
        Ok(cursor)
    }

    /// Moves the sync cursor back to `seq` (resync after the witness
    /// reported a shorter chain), so those records are sent again.
    ///
    /// # Errors
    /// [`StoreError`] when it did not commit.
    pub fn rewind_sync_cursor(&self, seq: u64) -> Result<(), StoreError> {
        let tx = self.db.begin_write()?;
        {
            // The old receipts stay, as evidence that the witness once
            // acknowledged these records.
            let mut receipts = tx.open_table(RECEIPTS)?;
            let mut superseded = tx.open_table(SUPERSEDED)?;
            let old: Vec<(u64, Vec<u8>)> = receipts
                .range(seq..)?
                .map(|item| item.map(|(k, v)| (k.value(), v.value().to_vec())))
                .collect::<Result<_, _>>()?;
            for (k, v) in old {
                superseded.insert(k, v.as_slice())?;
                receipts.remove(k)?;
            }
            let mut meta = tx.open_table(META)?;
            meta.insert(SYNC_CURSOR, seq.to_be_bytes().as_slice())?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Records (or clears) the last sync error.
    ///
    /// # Errors
    /// [`StoreError`] when it did not commit.
    pub fn set_sync_error(&self, note: Option<&SyncErrorNote>) -> Result<(), StoreError> {
        let bytes = note.map(|n| serde_json::to_vec(n).unwrap_or_default());
        self.set_meta(SYNC_ERROR, bytes.as_deref())
    }

    /// Records a fork: the witness holds a chain for this agent that is not
    /// ours. Syncing stops until it is resolved by hand.
    ///
    /// # Errors
    /// [`StoreError`] when it did not commit.
    pub fn set_fork(&self, note: Option<&SyncErrorNote>) -> Result<(), StoreError> {
        let bytes = note.map(|n| serde_json::to_vec(n).unwrap_or_default());
        self.set_meta(FORK, bytes.as_deref())
    }

    /// The recorded fork, if any.
    ///
    /// # Errors
    /// [`StoreError`] on read failure.
    pub fn fork(&self) -> Result<Option<SyncErrorNote>, StoreError> {
        Ok(self
            .meta(FORK)?
            .and_then(|b| serde_json::from_slice(&b).ok()))
    }

    /// The summary for `tally status`.
    ///
    /// # Errors
    /// [`StoreError`] on read failure.
    pub fn status(&self) -> Result<StoreStatus, StoreError> {
        let tx = self.db.begin_read()?;
        let records = tx.open_table(RECORDS)?;
        let receipts = tx.open_table(RECEIPTS)?;
        let head = match records.last()? {
            Some((k, v)) => Some((k.value(), parse_record(v.value())?.hash())),
            None => None,
        };
        let meta = tx.open_table(META)?;
        let read_note = |key: &str| -> Result<Option<SyncErrorNote>, StoreError> {
            Ok(meta
                .get(key)?
                .and_then(|b| serde_json::from_slice(b.value()).ok()))
        };
        Ok(StoreStatus {
            records: records.len()?,
            head,
            receipted: receipts.len()?,
            sync_cursor: match meta.get(SYNC_CURSOR)? {
                Some(b) => u64::from_be_bytes(b.value().try_into().unwrap_or([0; 8])),
                None => 0,
            },
            last_sync_error: read_note(SYNC_ERROR)?,
            fork: read_note(FORK)?,
            superseded_receipts: tx.open_table(SUPERSEDED)?.len()?,
        })
    }
}

impl ChainWriter for ChainStore {
    fn head(&self) -> Result<Option<(Seq, Hash, UnixMillis)>, StoreError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(RECORDS)?;
        let last = t.last()?.map(|(_, v)| v.value().to_vec());
        match last {
            Some(bytes) => {
                let r = parse_record(&bytes)?;
                Ok(Some((r.seq, r.hash(), r.time)))
            }
            None => Ok(None),
        }
    }

    fn append(&self, batch: &[Appended]) -> Result<(), StoreError> {
        let tx = self.db.begin_write()?;
        {
            let mut records = tx.open_table(RECORDS)?;
            let mut secrets = tx.open_table(SECRETS)?;
            let mut open = tx.open_table(OPEN_DECISIONS)?;
            for a in batch {
                let seq = a.record.seq.get();
                records.insert(seq, a.record.canonical_bytes())?;
                if let Some(secret) = &a.secret {
                    let bytes =
                        serde_json::to_vec(secret).map_err(|e| StoreError::Db(e.to_string()))?;
                    secrets.insert(seq, bytes.as_slice())?;
                }
                match &a.record.body {
                    tally_schemas::Body::Decision(d) => {
                        open.insert(d.call_id.as_str(), seq)?;
                    }
                    tally_schemas::Body::Outcome(o) => {
                        open.remove(o.call_id.as_str())?;
                    }
                    _ => {}
                }
            }
        }
        tx.commit()?;
        Ok(())
    }
}

impl<T: ChainWriter + Sync> ChainWriter for std::sync::Arc<T> {
    fn head(&self) -> Result<Option<(Seq, Hash, UnixMillis)>, StoreError> {
        (**self).head()
    }
    fn append(&self, batch: &[Appended]) -> Result<(), StoreError> {
        (**self).append(batch)
    }
}
