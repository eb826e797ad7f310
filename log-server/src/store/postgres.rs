//! The PostgreSQL [`LogStore`] (docs/storage.md, "PostgreSQL layout";
//! docs/operations.md, "Running on PostgreSQL"): the log's entries, stored
//! hashes and checkpoint notes in tables of one database, created by the
//! SQL migrations under `log-server/migrations/` (applied in order at open,
//! recorded in `tally_schema_version`).
//!
//! # Driver and threads
//! The driver is `tokio-postgres`. The trait is blocking and is called
//! both from plain threads (the sequencer) and from tokio worker threads
//! (the witness's admission path reads the log in place), so the store owns
//! a small tokio runtime of its own that drives the connections' sockets,
//! and a caller waits for its query with `futures::executor::block_on`: a
//! `tokio_postgres::Client`'s futures only talk to the connection task over
//! channels, so waiting on them needs no runtime on the calling thread and
//! never nests one runtime in another (which the blocking `postgres` crate
//! would do, and panic, on a worker thread).
//!
//! # Writes
//! A batch is one transaction that locks the `tree_size` row first
//! (`SELECT … FOR UPDATE`), compares it with the batch's old size, inserts
//! every row with arrays (`unnest`), and commits with PostgreSQL's default
//! `synchronous_commit = on`, so `Ok` means durable (contract rule 1).
//! Checkpoint notes are written with `synchronous_commit = off`: durable
//! with the next synchronous commit, as the contract allows.

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tally_schemas::{AgentName, Hash, LeafIndex, Nonce, Seq, TreeSize};
use tokio_postgres::Client;

mod conn;
pub mod fence;
mod lease;
mod lease_table;
mod pending;
mod sql;
mod tls;
pub use conn::{migrate, ConnectError, MigrateError, PgRuntime};
pub use lease_table::LeaseOptions;
use lease_table::{check_lease, holder_name, ttl_ms, LeaseState};
use sql::{backend, big, corrupt, hash_of, unbig};
pub use tls::{Connector, PgConnection, PgTlsStream, SslMode};

use super::{
    check_put_checkpoint, check_put_cosignature, BatchWrite, ChainHead, Found, Lease, LogStore,
    Lookup, SharedStore, StoreError,
};

/// The migrations of the schema, in the order they are applied. Version
/// `n` is the `n`-th file; a database at a higher version than this build
/// knows is refused.
pub const MIGRATIONS: &[(&str, &str)] = &[
    (
        "0001_log.sql",
        include_str!("../../migrations/0001_log.sql"),
    ),
    (
        "0002_lease.sql",
        include_str!("../../migrations/0002_lease.sql"),
    ),
    (
        "0003_cosignatures.sql",
        include_str!("../../migrations/0003_cosignatures.sql"),
    ),
    (
        "0004_pending.sql",
        include_str!("../../migrations/0004_pending.sql"),
    ),
    (
        "0005_agent_fence.sql",
        include_str!("../../migrations/0005_agent_fence.sql"),
    ),
];

/// The schema version this build writes (tests only, feature `testing`:
/// the migration itself records each version it applies).
#[cfg(any(test, feature = "testing"))]
#[must_use]
pub fn schema_version() -> i32 {
    i32::try_from(MIGRATIONS.len()).unwrap_or(i32::MAX)
}

/// The channel a front notifies after inserting requests into
/// `tally_pending` (module `pending`).
pub const PENDING_CHANNEL: &str = "tally_pending";
/// The channel the sequencer notifies after writing answers.
pub const ANSWERS_CHANNEL: &str = "tally_answers";

pub use super::OpenRow;

/// Connections that serve reads, beside the one that writes.
const READERS: usize = 3;

/// An advisory lock key (any constant) that serialises migrations between
/// processes opening the same database at once.
const MIGRATION_LOCK: i64 = 0x7461_6c6c_795f_6d67;

/// Hides the password of a connection URL or key/value string, for
/// messages (`user:***@`, `password=***`).
#[must_use]
pub fn redact_url(url: &str) -> String {
    tls::redact(url)
}

/// A [`LogStore`] in a PostgreSQL database.
pub struct PostgresStore {
    /// Drives the connections (module `conn`).
    pg: PgRuntime,
    writer: Mutex<Option<Client>>,
    readers: Vec<Mutex<Option<Arc<Client>>>>,
    next_reader: AtomicUsize,
    lease: Option<Arc<LeaseState>>,
    /// Opened for a front ([`PostgresStore::open_front`]): the log opens a
    /// front over it.
    front: bool,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore").finish_non_exhaustive()
    }
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        // Release the lease so that a standby takes over at once.
        self.release_lease();
    }
}

impl PostgresStore {
    /// Connects to the database at `url` (a `postgres://` URL or a libpq
    /// key/value string), applies the migrations it lacks, and creates the
    /// log's tables on first use.
    ///
    /// # Errors
    /// [`StoreError::Backend`] when the URL does not parse or the server
    /// cannot be reached; [`StoreError::Corrupt`] when the database holds a
    /// newer schema than this build knows.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        Self::open_with(url, Some(LeaseOptions::default()))
    }

    /// [`PostgresStore::open`] with lease options; `None` opens the store
    /// without the lease: it reads, and every write is refused
    /// (`StoreError::Conflict`). With `wait: false`, a lease held by
    /// another live process is an error naming the holder.
    ///
    /// # Errors
    /// As [`PostgresStore::open`], and [`StoreError::Conflict`] when the
    /// lease is held elsewhere and `wait` is false.
    pub fn open_with(url: &str, lease: Option<LeaseOptions>) -> Result<Self, StoreError> {
        let connector = Connector::parse(url, "tally").map_err(|e| {
            StoreError::Backend(format!(
                "not a PostgreSQL connection URL ({}): {e}",
                redact_url(url)
            ))
        })?;
        let pg = PgRuntime::new(connector, "tally-postgres", "")
            .map_err(|e| StoreError::Backend(format!("postgresql runtime: {e}")))?;
        let store = Self {
            pg,
            writer: Mutex::new(None),
            readers: (0..READERS).map(|_| Mutex::new(None)).collect(),
            next_reader: AtomicUsize::new(0),
            lease: None,
            front: false,
        };
        store.migrate()?;
        match lease {
            Some(options) => store.take_lease(options),
            None => Ok(store),
        }
    }

    /// Opens the store for a front (docs/operations.md, "Running on
    /// PostgreSQL", "Several fronts"): it reads at once, and writes only
    /// once [`Lease::try_lease`] has taken the lease.
    ///
    /// # Errors
    /// As [`PostgresStore::open`].
    pub fn open_front(url: &str, ttl: Duration) -> Result<Self, StoreError> {
        let mut store = Self::open_with(url, None)?;
        store.front = true;
        store.lease = Some(Arc::new(LeaseState {
            token: AtomicI64::new(0),
            holder: holder_name(),
            ttl_ms: ttl_ms(ttl),
        }));
        Ok(store)
    }

    fn connect(&self) -> Result<Client, StoreError> {
        self.pg.connect().map_err(|e| match e {
            ConnectError::Closed => StoreError::Backend("postgresql store is closed".into()),
            ConnectError::Postgres(e) => StoreError::Backend(self.pg.connector().explain(&e)),
            ConnectError::Task(e) => StoreError::Backend(format!("postgresql connect: {e}")),
        })
    }

    /// Runs `f` with the writing connection (reconnecting if it closed).
    fn write<T>(
        &self,
        f: impl AsyncFnOnce(&mut Client) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut slot = self
            .writer
            .lock()
            .map_err(|_| StoreError::Backend("postgresql writer lock poisoned".into()))?;
        if slot.as_ref().is_none_or(Client::is_closed) {
            *slot = Some(self.connect()?);
        }
        let client = slot
            .as_mut()
            .ok_or_else(|| StoreError::Backend("postgresql writer connection missing".into()))?;
        futures::executor::block_on(f(client))
    }

    /// Runs `f` with one of the reading connections.
    fn read<T>(
        &self,
        f: impl AsyncFnOnce(&Client) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let i = self.next_reader.fetch_add(1, Ordering::Relaxed) % self.readers.len();
        let client = {
            let mut slot = self.readers[i]
                .lock()
                .map_err(|_| StoreError::Backend("postgresql reader lock poisoned".into()))?;
            if slot.as_ref().is_none_or(|c| c.is_closed()) {
                *slot = Some(Arc::new(self.connect()?));
            }
            slot.as_ref()
                .map(Arc::clone)
                .ok_or_else(|| StoreError::Backend("postgresql reader connection missing".into()))?
        };
        futures::executor::block_on(f(&client))
    }

    /// Applies the migrations the database lacks, under an advisory lock.
    fn migrate(&self) -> Result<(), StoreError> {
        self.write(async |c| {
            migrate(c, MIGRATION_LOCK, "tally_schema_version", MIGRATIONS)
                .await
                .map_err(|e| match e {
                    MigrateError::Postgres(e) => backend(&e),
                    MigrateError::Newer { current, known } => StoreError::Corrupt(format!(
                        "the database has schema version {current}; this build knows versions up to {known}: \
                         run a newer tally"
                    )),
                    MigrateError::Failed { name, source } => StoreError::Backend(format!(
                        "migration {name} failed: {}",
                        backend(&source)
                    )),
                })
        })
    }
}

impl PostgresStore {
    /// Writes consecutive batches and then checkpoint notes in ONE durable
    /// transaction, with the compare-and-swap of [`LogStore::commit_batch`]
    /// on the first batch's old size. `tally store copy` uses it to carry a
    /// log over with its original batch boundaries (so every receipt size
    /// is kept) without a commit per original batch.
    ///
    /// `notes` are `(size, note)` in increasing size, each above the latest
    /// stored checkpoint and at most the new tree size.
    ///
    /// # Errors
    /// [`StoreError::Conflict`] for a stale old size, batches that do not
    /// follow one another, or notes out of order; [`StoreError::Backend`]
    /// when PostgreSQL fails (the write may or may not have landed).
    pub fn commit_batches(
        &self,
        batches: &[BatchWrite],
        notes: &[(TreeSize, &str)],
    ) -> Result<(), StoreError> {
        let Some(first) = batches.first() else {
            return Err(StoreError::Conflict("no batch to commit".into()));
        };
        let mut size = first.old_size;
        let n: usize = batches.iter().map(|b| b.entries.len()).sum();
        let mut idx = Vec::with_capacity(n);
        let mut canonical = Vec::with_capacity(n);
        let mut leaf = Vec::with_capacity(n);
        let mut record = Vec::with_capacity(n);
        let mut nonce = Vec::with_capacity(n);
        let mut agent = Vec::with_capacity(n);
        let mut seq = Vec::with_capacity(n);
        let mut receipt = Vec::with_capacity(n);
        let mut hashes: Vec<&[u8]> = Vec::new();
        for batch in batches {
            batch.check_shape()?;
            if batch.old_size != size {
                return Err(StoreError::Conflict(format!(
                    "batch at size {} does not follow size {size}",
                    batch.old_size
                )));
            }
            size = batch.new_size();
            let r = big(batch.receipt_size.get())?;
            for e in &batch.entries {
                idx.push(big(e.index.get())?);
                canonical.push(e.canonical.as_slice());
                leaf.push(e.leaf_hash.as_bytes().as_slice());
                record.push(e.record_hash.as_bytes().as_slice());
                nonce.push(e.nonce.as_bytes());
                agent.push(e.agent.as_str());
                seq.push(big(e.seq.get())?);
                receipt.push(r);
            }
            hashes.extend(batch.hashes.iter().map(|h| h.as_bytes().as_slice()));
        }
        let mut last_note = None;
        for (s, _) in notes {
            if *s > size || last_note.is_some_and(|l| *s <= l) {
                return Err(StoreError::Conflict(format!(
                    "checkpoint note at size {s} is out of order or beyond the tree"
                )));
            }
            last_note = Some(*s);
        }
        let note_sizes = notes
            .iter()
            .map(|(s, _)| big(s.get()))
            .collect::<Result<Vec<_>, _>>()?;
        let note_texts: Vec<&str> = notes.iter().map(|(_, n)| *n).collect();
        let old = big(first.old_size.get())?;
        let new = big(size.get())?;
        let first_hash = big(tlog_tiles::stored_hash_count(first.old_size.get()))?;
        let hash_ids: Vec<i64> = (0..hashes.len() as i64).map(|k| first_hash + k).collect();
        let (fence_agents, fence_times) = fence::latest_times(batches);
        let expected: Vec<&(tally_schemas::AgentName, super::KeyVersion)> =
            batches.iter().flat_map(|b| &b.key_versions).collect();
        let lease = self.lease.as_deref();
        self.write(async |c| {
            let tx = c.transaction().await.map_err(|e| backend(&e))?;
            // Two pipelines (docs/storage.md "PostgreSQL layout"): the checks, then
            // the writes. The statements of one pipeline go to the server
            // together instead of one round trip after another; the client
            // library may send them in any order, so nothing in one depends
            // on another, and their answers are judged in a fixed order. Any
            // failure drops `tx`, which rolls everything back.
            let latest_note = async {
                if note_sizes.is_empty() {
                    return Ok(None);
                }
                tx.query_one("SELECT max(size) FROM log_checkpoints", &[])
                    .await
                    .map(|row| row.get::<_, Option<i64>>(0))
            };
            let (leased, stored, fenced, latest_note) = futures::join!(
                check_lease(&tx, lease),
                tree_size(&tx, true),
                // Contract rule 8: the agents' rows are locked until the commit.
                fence::check_and_record(&tx, &fence_agents, &fence_times, &expected),
                latest_note,
            );
            leased?;
            let stored = stored?;
            if stored != first.old_size.get() {
                return Err(StoreError::Conflict(format!(
                    "batch extends size {}, the stored size is {stored}",
                    first.old_size
                )));
            }
            fenced?;
            if latest_note
                .map_err(|e| backend(&e))?
                .is_some_and(|l| l >= note_sizes[0])
            {
                return Err(StoreError::Conflict(format!(
                    "checkpoint note at size {} is not above the latest stored one",
                    note_sizes[0]
                )));
            }
            let entries = async {
                if idx.is_empty() {
                    return Ok(0);
                }
                tx.execute(
                    "INSERT INTO log_entries
                         (idx, canonical, leaf_hash, record_hash, nonce, agent, seq, receipt_size)
                     SELECT * FROM unnest($1::bigint[], $2::bytea[], $3::bytea[], $4::bytea[],
                                          $5::bytea[], $6::text[], $7::bigint[], $8::bigint[])",
                    &[&idx, &canonical, &leaf, &record, &nonce, &agent, &seq, &receipt],
                )
                .await
            };
            let stored_hashes = async {
                if hash_ids.is_empty() {
                    return Ok(0);
                }
                tx.execute(
                    "INSERT INTO log_hashes (id, hash) SELECT * FROM unnest($1::bigint[], $2::bytea[])",
                    &[&hash_ids, &hashes],
                )
                .await
            };
            let stored_notes = async {
                if note_sizes.is_empty() {
                    return Ok(0);
                }
                tx.execute(
                    "INSERT INTO log_checkpoints (size, note) SELECT * FROM unnest($1::bigint[], $2::text[])",
                    &[&note_sizes, &note_texts],
                )
                .await
            };
            let meta = async {
                tx.execute(
                    "UPDATE log_meta SET value = $1 WHERE key = 'tree_size' AND value = $2",
                    &[&new, &old],
                )
                .await
            };
            let (entries, stored_hashes, stored_notes, meta) =
                futures::join!(entries, stored_hashes, stored_notes, meta);
            entries.map_err(|e| backend(&e))?;
            stored_hashes.map_err(|e| backend(&e))?;
            stored_notes.map_err(|e| backend(&e))?;
            meta.map_err(|e| backend(&e))?;
            tx.commit().await.map_err(|e| backend(&e))
        })
    }
}

/// The chain head row `(seq, record_hash, idx)` as a [`ChainHead`].
fn head_of(seq: i64, record_hash: &[u8], idx: i64) -> Result<ChainHead, StoreError> {
    Ok(ChainHead {
        seq: Seq::new(unbig(seq, "seq")?).map_err(|e| corrupt(e.to_string()))?,
        record_hash: hash_of(record_hash, "record hash")?,
        index: LeafIndex::new(unbig(idx, "index")?),
    })
}

async fn tree_size(c: &impl tokio_postgres::GenericClient, lock: bool) -> Result<u64, StoreError> {
    let sql = if lock {
        "SELECT value FROM log_meta WHERE key = 'tree_size' FOR UPDATE"
    } else {
        "SELECT value FROM log_meta WHERE key = 'tree_size'"
    };
    let row = c
        .query_opt(sql, &[])
        .await
        .map_err(|e| backend(&e))?
        .ok_or_else(|| corrupt("log_meta has no tree_size".into()))?;
    unbig(row.get(0), "tree size")
}

async fn opt_index(
    c: &Client,
    sql: &str,
    key: &(dyn tokio_postgres::types::ToSql + Sync),
) -> Result<Option<LeafIndex>, StoreError> {
    let row = c.query_opt(sql, &[key]).await.map_err(|e| backend(&e))?;
    row.map(|r| Ok(LeafIndex::new(unbig(r.get(0), "index")?)))
        .transpose()
}

impl SharedStore for PostgresStore {
    fn log_store(self: Arc<Self>) -> Arc<dyn LogStore> {
        self
    }
}

impl LogStore for PostgresStore {
    fn size(&self) -> Result<TreeSize, StoreError> {
        self.read(async |c| Ok(TreeSize::new(tree_size(c, false).await?)))
    }

    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, StoreError> {
        if indexes.is_empty() {
            return Ok(Vec::new());
        }
        let ids = indexes
            .iter()
            .map(|&i| big(i))
            .collect::<Result<Vec<_>, _>>()?;
        self.read(async |c| {
            let rows = c
                .query(
                    "SELECT id, hash FROM log_hashes WHERE id = ANY($1)",
                    &[&ids],
                )
                .await
                .map_err(|e| backend(&e))?;
            let mut by_id = std::collections::HashMap::with_capacity(rows.len());
            for r in &rows {
                let id: i64 = r.get(0);
                by_id.insert(id, hash_of(r.get(1), "stored hash")?);
            }
            ids.iter()
                .map(|id| {
                    by_id
                        .get(id)
                        .copied()
                        .ok_or_else(|| corrupt(format!("stored hash {id} is missing")))
                })
                .collect()
        })
    }

    fn entries(&self, start: LeafIndex, end: LeafIndex) -> Result<Vec<Vec<u8>>, StoreError> {
        if start >= end {
            return Ok(Vec::new());
        }
        let (s, e) = (big(start.get())?, big(end.get())?);
        self.read(async |c| {
            let rows = c
                .query(
                    "SELECT idx, canonical FROM log_entries WHERE idx >= $1 AND idx < $2 ORDER BY idx",
                    &[&s, &e],
                )
                .await
                .map_err(|e| backend(&e))?;
            let mut out = Vec::with_capacity(rows.len());
            for (k, r) in rows.iter().enumerate() {
                let idx: i64 = r.get(0);
                if idx != s + k as i64 {
                    return Err(corrupt(format!("entry {} is missing", s + k as i64)));
                }
                out.push(r.get::<_, Vec<u8>>(1));
            }
            Ok(out)
        })
    }

    fn receipt_size(&self, index: LeafIndex) -> Result<Option<TreeSize>, StoreError> {
        let i = big(index.get())?;
        self.read(async |c| {
            let row = c
                .query_opt("SELECT receipt_size FROM log_entries WHERE idx = $1", &[&i])
                .await
                .map_err(|e| backend(&e))?;
            row.map(|r| Ok(TreeSize::new(unbig(r.get(0), "receipt size")?)))
                .transpose()
        })
    }

    fn checkpoint(&self, size: TreeSize) -> Result<Option<String>, StoreError> {
        let s = big(size.get())?;
        self.read(async |c| {
            let row = c
                .query_opt("SELECT note FROM log_checkpoints WHERE size = $1", &[&s])
                .await
                .map_err(|e| backend(&e))?;
            Ok(row.map(|r| r.get(0)))
        })
    }

    fn latest_checkpoint(&self) -> Result<Option<(TreeSize, String)>, StoreError> {
        self.read(async |c| {
            let row = c
                .query_opt(
                    "SELECT size, note FROM log_checkpoints ORDER BY size DESC LIMIT 1",
                    &[],
                )
                .await
                .map_err(|e| backend(&e))?;
            row.map(|r| Ok((TreeSize::new(unbig(r.get(0), "checkpoint size")?), r.get(1))))
                .transpose()
        })
    }

    fn chain_head(&self, agent: &AgentName) -> Result<Option<ChainHead>, StoreError> {
        self.read(async |c| {
            let row = c
                .query_opt(
                    "SELECT seq, record_hash, idx FROM log_entries WHERE agent = $1 \
                     ORDER BY seq DESC LIMIT 1",
                    &[&agent.as_str()],
                )
                .await
                .map_err(|e| backend(&e))?;
            row.map(|r| head_of(r.get(0), r.get(1), r.get(2)))
                .transpose()
        })
    }

    fn agent_indexes(
        &self,
        agent: &AgentName,
        from: Seq,
        limit: usize,
    ) -> Result<Vec<(Seq, LeafIndex)>, StoreError> {
        let from = big(from.get())?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(async |c| {
            let rows = c
                .query(
                    "SELECT seq, idx FROM log_entries WHERE agent = $1 AND seq >= $2 \
                     ORDER BY seq LIMIT $3",
                    &[&agent.as_str(), &from, &limit],
                )
                .await
                .map_err(|e| backend(&e))?;
            rows.iter()
                .map(|r| {
                    Ok((
                        Seq::new(unbig(r.get(0), "seq")?).map_err(|e| corrupt(e.to_string()))?,
                        LeafIndex::new(unbig(r.get(1), "index")?),
                    ))
                })
                .collect()
        })
    }

    fn index_of_nonce(&self, nonce: &Nonce) -> Result<Option<LeafIndex>, StoreError> {
        let key = nonce.as_bytes();
        self.read(async |c| {
            opt_index(c, "SELECT idx FROM log_entries WHERE nonce = $1", &key).await
        })
    }

    fn index_of_record(&self, record_hash: &Hash) -> Result<Option<LeafIndex>, StoreError> {
        let key = record_hash.as_bytes().as_slice();
        self.read(async |c| {
            opt_index(
                c,
                "SELECT idx FROM log_entries WHERE record_hash = $1",
                &key,
            )
            .await
        })
    }

    fn index_of_leaf(&self, leaf_hash: &Hash) -> Result<Option<LeafIndex>, StoreError> {
        let key = leaf_hash.as_bytes().as_slice();
        self.read(async |c| {
            opt_index(c, "SELECT idx FROM log_entries WHERE leaf_hash = $1", &key).await
        })
    }

    fn lookup(&self, lookups: &[Lookup<'_>]) -> Result<Vec<Found>, StoreError> {
        if lookups.is_empty() {
            return Ok(Vec::new());
        }
        let records: Vec<&[u8]> = lookups
            .iter()
            .map(|l| l.record_hash.as_bytes().as_slice())
            .collect();
        let nonces: Vec<&[u8]> = lookups.iter().map(|l| l.nonce.as_bytes()).collect();
        let agents: Vec<&str> = lookups.iter().map(|l| l.agent.as_str()).collect();
        // One statement, so one snapshot answers every lookup.
        self.read(async |c| {
            let rows = c
                .query(
                    "SELECT q.ord,
                            (SELECT idx FROM log_entries WHERE record_hash = q.rh),
                            (SELECT idx FROM log_entries WHERE nonce = q.nonce),
                            h.seq, h.record_hash, h.idx
                     FROM unnest($1::bytea[], $2::bytea[], $3::text[])
                          WITH ORDINALITY AS q(rh, nonce, agent, ord)
                     LEFT JOIN LATERAL (
                         SELECT seq, record_hash, idx FROM log_entries e
                         WHERE e.agent = q.agent ORDER BY seq DESC LIMIT 1
                     ) h ON true
                     ORDER BY q.ord",
                    &[&records, &nonces, &agents],
                )
                .await
                .map_err(|e| backend(&e))?;
            if rows.len() != lookups.len() {
                return Err(StoreError::Backend(format!(
                    "postgresql answered {} of {} lookups",
                    rows.len(),
                    lookups.len()
                )));
            }
            rows.iter()
                .map(|r| {
                    let index = |v: Option<i64>| -> Result<Option<LeafIndex>, StoreError> {
                        v.map(|i| Ok(LeafIndex::new(unbig(i, "index")?)))
                            .transpose()
                    };
                    let head = match (
                        r.get::<_, Option<i64>>(3),
                        r.get::<_, Option<&[u8]>>(4),
                        r.get::<_, Option<i64>>(5),
                    ) {
                        (Some(seq), Some(h), Some(idx)) => Some(head_of(seq, h, idx)?),
                        _ => None,
                    };
                    Ok(Found {
                        record: index(r.get(1))?,
                        nonce: index(r.get(2))?,
                        head,
                    })
                })
                .collect()
        })
    }

    fn commit_batch(&self, batch: &BatchWrite) -> Result<(), StoreError> {
        self.commit_batches(std::slice::from_ref(batch), &[])
    }

    fn put_checkpoint(&self, size: TreeSize, note: &str) -> Result<(), StoreError> {
        let s = big(size.get())?;
        let lease = self.lease.as_deref();
        self.write(async |c| {
            let tx = c.transaction().await.map_err(|e| backend(&e))?;
            check_lease(&tx, lease).await?;
            // Durable with the next synchronous commit (contract rule 1).
            tx.batch_execute("SET LOCAL synchronous_commit = off")
                .await
                .map_err(|e| backend(&e))?;
            let tree = TreeSize::new(tree_size(&tx, true).await?);
            let existing: Option<String> = tx
                .query_opt("SELECT note FROM log_checkpoints WHERE size = $1", &[&s])
                .await
                .map_err(|e| backend(&e))?
                .map(|r| r.get(0));
            let latest = tx
                .query_opt("SELECT max(size) FROM log_checkpoints", &[])
                .await
                .map_err(|e| backend(&e))?
                .and_then(|r| r.get::<_, Option<i64>>(0))
                .map(|v| unbig(v, "checkpoint size").map(TreeSize::new))
                .transpose()?;
            if check_put_checkpoint(size, note, tree, existing.as_deref(), latest)? {
                return Ok(());
            }
            tx.execute(
                "INSERT INTO log_checkpoints (size, note) VALUES ($1, $2)",
                &[&s, &note],
            )
            .await
            .map_err(|e| backend(&e))?;
            tx.commit().await.map_err(|e| backend(&e))
        })
    }

    fn put_cosignature(
        &self,
        size: TreeSize,
        cosigner: &str,
        line: &str,
    ) -> Result<(), StoreError> {
        let s = big(size.get())?;
        let lease = self.lease.as_deref();
        self.write(async |c| {
            let tx = c.transaction().await.map_err(|e| backend(&e))?;
            check_lease(&tx, lease).await?;
            // As for checkpoint notes: durable with the next synchronous
            // commit; a cosignature lost before that is asked for again.
            tx.batch_execute("SET LOCAL synchronous_commit = off")
                .await
                .map_err(|e| backend(&e))?;
            let stored = tx
                .query_opt("SELECT 1 FROM log_checkpoints WHERE size = $1", &[&s])
                .await
                .map_err(|e| backend(&e))?
                .is_some();
            let existing: Option<String> = tx
                .query_opt(
                    "SELECT line FROM log_cosignatures WHERE size = $1 AND cosigner = $2",
                    &[&s, &cosigner],
                )
                .await
                .map_err(|e| backend(&e))?
                .map(|r| r.get(0));
            if check_put_cosignature(size, cosigner, line, stored, existing.as_deref())? {
                return Ok(());
            }
            tx.execute(
                "INSERT INTO log_cosignatures (size, cosigner, line) VALUES ($1, $2, $3)",
                &[&s, &cosigner, &line],
            )
            .await
            .map_err(|e| backend(&e))?;
            tx.commit().await.map_err(|e| backend(&e))
        })
    }

    fn cosignatures(&self, size: TreeSize) -> Result<Vec<(String, String)>, StoreError> {
        let s = big(size.get())?;
        self.read(async |c| {
            let rows = c
                .query(
                    "SELECT cosigner, line FROM log_cosignatures WHERE size = $1 ORDER BY cosigner COLLATE \"C\"",
                    &[&s],
                )
                .await
                .map_err(|e| backend(&e))?;
            Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
        })
    }

    fn shared(self: Arc<Self>) -> Option<Arc<dyn SharedStore>> {
        if self.front {
            Some(self)
        } else {
            None
        }
    }

    fn sync(&self) -> Result<(), StoreError> {
        // A synchronous commit flushes the WAL, and with it every earlier
        // asynchronous commit (the checkpoint notes).
        self.write(async |c| {
            c.execute(
                "UPDATE log_meta SET value = value + 1 WHERE key = 'syncs'",
                &[],
            )
            .await
            .map_err(|e| backend(&e))
            .map(drop)
        })
    }
}
