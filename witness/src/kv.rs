//! The storage seam under the registry (module `registry`) and the
//! console's auditor links (tally-console's `store`): both keep rows of
//! `table, key -> bytes`, all of them also in memory. A [`KvStore`] holds
//! those rows either in a redb file of the data folder (the default:
//! `witness.redb`, `console.redb`) or in the PostgreSQL database the log is
//! in (docs/storage.md, "The registry and the console on PostgreSQL"),
//! which several `tally serve` fronts share.
//!
//! The rules (who may register what, error codes, caching) stay in the
//! stores above; a backend only applies a list of [`KvOp`]s in one
//! transaction, each with an [`Expect`]ation on the row's current value. An
//! expectation that does not hold fails the whole write with
//! [`KvError::Conflict`], so of two fronts that write the same row from the
//! same view, exactly one wins, decided by the database.
//!
//! On PostgreSQL each store's rows carry a generation counter, incremented
//! in the same transaction as every write; a watcher thread reads it every
//! [`WATCH_PERIOD`] and the store reloads its memory copy when another
//! front changed it (docs/operations.md, "Running on PostgreSQL", says what
//! that bounds).

use std::path::Path;
use std::sync::{Mutex, Weak};
use std::time::Duration;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use tally_log::store::postgres::fence;
use tally_log::store::postgres::{migrate, ConnectError, Connector, MigrateError, PgRuntime};
use tally_log::KeyVersion;
use tally_schemas::UnixMillis;
use tokio_postgres::Client;

/// How often a store on PostgreSQL checks whether another front wrote.
pub const WATCH_PERIOD: Duration = Duration::from_millis(500);

/// What a write expects a row to hold before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// Anything, or nothing.
    Any,
    /// No row.
    Absent,
    /// Exactly these bytes.
    Equals(Vec<u8>),
}

/// One row written (`value: Some`) or deleted (`None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvOp {
    /// The table (`projects`, `auditor_links`, ...).
    pub table: &'static str,
    /// The row's key.
    pub key: String,
    /// The new value; `None` deletes the row.
    pub value: Option<Vec<u8>>,
    /// What the row must hold for the write to go ahead.
    pub expect: Expect,
}

/// All rows of a store, read in one transaction.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The store's generation when read (always 0 for redb).
    pub generation: i64,
    /// `(table, key, value)`.
    pub rows: Vec<(String, String, Vec<u8>)>,
    /// The registry's on PostgreSQL: every agent's key version that is not
    /// 0, read in the same transaction as the rows (docs/protocol.md §4.1;
    /// `tally_log::store::postgres::fence`). Empty otherwise.
    pub key_versions: Vec<(String, KeyVersion)>,
}

/// What a fenced write ([`KvStore::apply_fenced`]) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FencedWrite {
    /// The store's new generation.
    pub generation: i64,
    /// The agent's new key version.
    pub key_version: KeyVersion,
}

/// Why a store failed.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    /// The backend failed (or the connection did).
    #[error("{0}")]
    Storage(String),
    /// An expectation of a write did not hold: another writer got there first.
    #[error("changed by another writer: {0}")]
    Conflict(String),
}

fn storage<E: std::fmt::Display>(e: E) -> KvError {
    KvError::Storage(e.to_string())
}

/// Where a store's rows live.
pub enum KvStore {
    /// A redb file.
    Redb(RedbKv),
    /// A PostgreSQL database.
    Postgres(Box<PostgresKv>),
}

impl std::fmt::Debug for KvStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Redb(_) => f.write_str("KvStore::Redb"),
            Self::Postgres(_) => f.write_str("KvStore::Postgres"),
        }
    }
}

impl KvStore {
    /// Opens (creating) the redb file at `path` with `tables`.
    ///
    /// # Errors
    /// [`KvError::Storage`] when the file cannot be opened (e.g. another
    /// process has it open).
    pub fn open_redb(path: &Path, tables: &'static [&'static str]) -> Result<Self, KvError> {
        RedbKv::open(path, tables).map(Self::Redb)
    }

    /// Opens the existing redb file at `path` for reading its rows (a table
    /// it lacks has none), without creating or changing anything.
    ///
    /// # Errors
    /// [`KvError::Storage`] when the file is missing, held by another
    /// process, or not a redb file.
    pub fn open_redb_existing(
        path: &Path,
        tables: &'static [&'static str],
    ) -> Result<Self, KvError> {
        let db = Database::open(path).map_err(storage)?;
        Ok(Self::Redb(RedbKv { db, tables }))
    }

    /// Connects to the PostgreSQL database at `url`, applies the migrations
    /// under `witness/migrations/` it lacks, and serves the rows of
    /// `tables`, counted under `scope` (`registry` or `console`).
    ///
    /// # Errors
    /// [`KvError::Storage`] for a bad URL, an unreachable server, a failed
    /// migration, or a database whose schema is newer than this build.
    pub fn open_postgres(
        url: &str,
        scope: &'static str,
        tables: &'static [&'static str],
    ) -> Result<Self, KvError> {
        PostgresKv::open(url, scope, tables).map(|p| Self::Postgres(Box::new(p)))
    }

    /// Whether other processes may write the same rows (PostgreSQL).
    #[must_use]
    pub fn is_shared(&self) -> bool {
        matches!(self, Self::Postgres(_))
    }

    /// Every row, with the generation they were read at.
    ///
    /// # Errors
    /// [`KvError::Storage`].
    pub fn snapshot(&self) -> Result<Snapshot, KvError> {
        match self {
            Self::Redb(r) => r.snapshot(),
            Self::Postgres(p) => p.snapshot(),
        }
    }

    /// Applies `ops` in one durable transaction if every expectation
    /// holds; returns the store's new generation (0 for redb).
    ///
    /// # Errors
    /// [`KvError::Conflict`] (nothing written) when one does not;
    /// [`KvError::Storage`] when the backend fails.
    pub fn apply(&self, ops: &[KvOp]) -> Result<i64, KvError> {
        match self {
            Self::Redb(r) => r.apply(ops).map(|()| 0),
            Self::Postgres(p) => p.apply(ops),
        }
    }

    /// A change of `agent`'s keys on PostgreSQL, in ONE transaction
    /// (docs/protocol.md §4.1; `tally_log::store::postgres::fence`): locks
    /// the agent's fence row, hands `plan` the latest `time` of the agent's
    /// committed records as of that lock, applies the ops `plan` returns
    /// (expectations as [`KvStore::apply`]), increments the agent's key
    /// version, and commits. `Ok(Err(e))` when `plan` refused (nothing
    /// written).
    ///
    /// # Errors
    /// [`KvError::Conflict`] when an expectation does not hold;
    /// [`KvError::Storage`] when the backend fails, and on redb, whose one
    /// process fences key changes in its memory.
    pub fn apply_fenced<E>(
        &self,
        agent: &str,
        plan: impl FnOnce(Option<UnixMillis>) -> Result<Vec<KvOp>, E>,
    ) -> Result<Result<FencedWrite, E>, KvError> {
        match self {
            Self::Redb(_) => Err(KvError::Storage(
                "a fenced key change needs the PostgreSQL store".into(),
            )),
            Self::Postgres(p) => p.apply_fenced(agent, plan),
        }
    }

    /// The store's current generation (0 for redb, which only this process writes).
    ///
    /// # Errors
    /// [`KvError::Storage`].
    pub fn generation(&self) -> Result<i64, KvError> {
        match self {
            Self::Redb(_) => Ok(0),
            Self::Postgres(p) => p.generation(),
        }
    }

    /// Takes the first-start lock (PostgreSQL: a session advisory lock, so
    /// that one front at a time runs a first start, and a front that died
    /// during one releases it); waits while another front holds it. A
    /// no-op on redb, whose file one process holds.
    ///
    /// # Errors
    /// [`KvError::Storage`].
    pub fn lock_first_start(&self) -> Result<(), KvError> {
        match self {
            Self::Redb(_) => Ok(()),
            Self::Postgres(p) => p.lock_first_start(),
        }
    }

    /// Releases the first-start lock, if held.
    pub fn unlock_first_start(&self) {
        if let Self::Postgres(p) = self {
            p.unlock_first_start();
        }
    }
}

/// Runs `refresh` on the store behind `weak` every `period` (the
/// default is [`WATCH_PERIOD`]) until the store is dropped, on a thread of
/// its own.
pub fn spawn_watcher_every<T: Send + Sync + 'static>(
    name: &str,
    period: Duration,
    weak: Weak<T>,
    refresh: impl Fn(&T) + Send + 'static,
) {
    let spawned = std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || loop {
            std::thread::sleep(period);
            match weak.upgrade() {
                Some(store) => refresh(&store),
                None => return,
            }
        });
    if let Err(e) = spawned {
        tracing::error!("cannot start {name}: {e}; changes made through other fronts are seen only after a restart");
    }
}

/// [`KvStore`] in a redb file: one redb table per table, `&str -> &[u8]`.
pub struct RedbKv {
    db: Database,
    tables: &'static [&'static str],
}

impl RedbKv {
    fn open(path: &Path, tables: &'static [&'static str]) -> Result<Self, KvError> {
        let db = Database::create(path).map_err(storage)?;
        let tx = db.begin_write().map_err(storage)?;
        for t in tables {
            tx.open_table(def(t)).map_err(storage)?;
        }
        tx.commit().map_err(storage)?;
        Ok(Self { db, tables })
    }

    fn snapshot(&self) -> Result<Snapshot, KvError> {
        let rx = self.db.begin_read().map_err(storage)?;
        let mut rows = Vec::new();
        for t in self.tables {
            let table = match rx.open_table(def(t)) {
                Ok(table) => table,
                Err(redb::TableError::TableDoesNotExist(_)) => continue,
                Err(e) => return Err(storage(e)),
            };
            for row in table.iter().map_err(storage)? {
                let (k, v) = row.map_err(storage)?;
                rows.push(((*t).to_owned(), k.value().to_owned(), v.value().to_vec()));
            }
        }
        Ok(Snapshot {
            generation: 0,
            rows,
            key_versions: Vec::new(),
        })
    }

    fn apply(&self, ops: &[KvOp]) -> Result<(), KvError> {
        let tx = self.db.begin_write().map_err(storage)?;
        for op in ops {
            let mut t = tx.open_table(def(op.table)).map_err(storage)?;
            let current = t
                .get(op.key.as_str())
                .map_err(storage)?
                .map(|v| v.value().to_vec());
            let holds = match &op.expect {
                Expect::Any => true,
                Expect::Absent => current.is_none(),
                Expect::Equals(want) => current.as_ref() == Some(want),
            };
            if !holds {
                // Dropping the transaction aborts it: nothing is written.
                return Err(KvError::Conflict(format!("{}/{}", op.table, op.key)));
            }
            match &op.value {
                Some(v) => {
                    t.insert(op.key.as_str(), v.as_slice()).map_err(storage)?;
                }
                None => {
                    t.remove(op.key.as_str()).map_err(storage)?;
                }
            }
        }
        tx.commit().map_err(storage)
    }
}

fn def(name: &str) -> TableDefinition<'_, &'static str, &'static [u8]> {
    TableDefinition::new(name)
}

/// The migrations of the registry's schema, in order; version `n` is the
/// `n`-th file. A database at a higher version than this build knows is
/// refused.
pub const MIGRATIONS: &[(&str, &str)] = &[
    (
        "0001_registry.sql",
        include_str!("../migrations/0001_registry.sql"),
    ),
    (
        "0002_console_sessions.sql",
        include_str!("../migrations/0002_console_sessions.sql"),
    ),
];

/// Advisory lock keys (any constants, distinct from the log's).
const MIGRATION_LOCK: i64 = 0x7461_6c6c_795f_7267;
const FIRST_START_LOCK: i64 = 0x7461_6c6c_795f_6673;

fn pg(e: &tokio_postgres::Error) -> KvError {
    match e.as_db_error() {
        Some(db) => KvError::Storage(format!(
            "postgresql: {} ({})",
            db.message(),
            db.code().code()
        )),
        None => KvError::Storage(format!("postgresql: {e}")),
    }
}

/// [`KvStore`] in PostgreSQL: table `registry_rows (tbl, key, value)` and
/// the counter `registry_generation (scope, gen)` (migration
/// `0001_registry.sql`). Like the log's store, it drives its connection on
/// a small runtime of its own and callers wait with
/// `futures::executor::block_on`, so it may be called from any thread.
pub struct PostgresKv {
    /// Drives the connection (the log's `store::postgres::PgRuntime`).
    pg: PgRuntime,
    scope: &'static str,
    tables: Vec<String>,
    client: Mutex<Option<Client>>,
    /// The connection holding the first-start lock, while held.
    first_start: Mutex<Option<Client>>,
}

impl PostgresKv {
    fn open(
        url: &str,
        scope: &'static str,
        tables: &'static [&'static str],
    ) -> Result<Self, KvError> {
        let redacted = tally_log::store::postgres::redact_url(url);
        let connector = Connector::parse(url, "tally-registry").map_err(|e| {
            KvError::Storage(format!("not a PostgreSQL connection URL ({redacted}): {e}"))
        })?;
        let pg = PgRuntime::new(connector, "tally-registry-pg", " of the registry")
            .map_err(|e| KvError::Storage(format!("postgresql runtime: {e}")))?;
        let kv = Self {
            pg,
            scope,
            tables: tables.iter().map(|t| (*t).to_owned()).collect(),
            client: Mutex::new(None),
            first_start: Mutex::new(None),
        };
        kv.migrate()
            .map_err(|e| KvError::Storage(format!("{redacted}: {e}")))?;
        Ok(kv)
    }

    fn connect(&self) -> Result<Client, KvError> {
        self.pg.connect().map_err(|e| match e {
            ConnectError::Closed => KvError::Storage("postgresql store is closed".into()),
            ConnectError::Postgres(e) if e.as_db_error().is_some() => pg(&e),
            ConnectError::Postgres(e) => KvError::Storage(self.pg.connector().explain(&e)),
            ConnectError::Task(e) => KvError::Storage(format!("postgresql connect: {e}")),
        })
    }

    /// Connects to the database at `url` and applies the migrations it
    /// lacks, for a store with tables of its own beside `registry_rows`
    /// (the console's sessions, `console_sessions`), which it queries
    /// through [`Self::with_client`].
    ///
    /// # Errors
    /// As [`KvStore::open_postgres`].
    pub fn open_migrated(url: &str) -> Result<Self, KvError> {
        Self::open(url, "console", &[])
    }

    /// Runs `f` on this store's connection (reconnecting if it closed),
    /// waiting on the caller's thread; never call it from async code.
    ///
    /// # Errors
    /// What `f` returns, or [`KvError::Storage`] when no connection can be made.
    pub fn with_client<T>(
        &self,
        f: impl AsyncFnOnce(&mut Client) -> Result<T, KvError>,
    ) -> Result<T, KvError> {
        self.with(f)
    }

    /// Runs `f` on the connection (reconnecting if it closed).
    fn with<T>(
        &self,
        f: impl AsyncFnOnce(&mut Client) -> Result<T, KvError>,
    ) -> Result<T, KvError> {
        let mut slot = self
            .client
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if slot.as_ref().is_none_or(Client::is_closed) {
            *slot = Some(self.connect()?);
        }
        let client = slot
            .as_mut()
            .ok_or_else(|| KvError::Storage("postgresql connection missing".into()))?;
        futures::executor::block_on(f(client))
    }

    /// Applies the migrations the database lacks, under an advisory lock.
    fn migrate(&self) -> Result<(), KvError> {
        self.with(async |c| {
            migrate(c, MIGRATION_LOCK, "registry_schema_version", MIGRATIONS)
                .await
                .map_err(|e| match e {
                    MigrateError::Postgres(e) => pg(&e),
                    MigrateError::Newer { current, known } => KvError::Storage(format!(
                        "the database's registry has schema version {current}; this build knows versions up to {known}: run a newer tally"
                    )),
                    MigrateError::Failed { name, source } => {
                        KvError::Storage(format!("migration {name} failed: {}", pg(&source)))
                    }
                })
        })
    }

    fn snapshot(&self) -> Result<Snapshot, KvError> {
        let (scope, tables) = (self.scope, &self.tables);
        self.with(async |c| {
            let tx = c
                .build_transaction()
                .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .await
                .map_err(|e| pg(&e))?;
            let generation: i64 = tx
                .query_one(
                    "SELECT gen FROM registry_generation WHERE scope = $1",
                    &[&scope],
                )
                .await
                .map_err(|e| pg(&e))?
                .get(0);
            let rows = tx
                .query(
                    "SELECT tbl, key, value FROM registry_rows WHERE tbl = ANY($1) ORDER BY tbl, key",
                    &[tables],
                )
                .await
                .map_err(|e| pg(&e))?
                .into_iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect();
            let key_versions = if scope == "registry" {
                fence::key_versions(&tx)
                    .await
                    .map_err(|e| pg(&e))?
                    .unwrap_or_default()
            } else {
                Vec::new()
            };
            tx.commit().await.map_err(|e| pg(&e))?;
            Ok(Snapshot {
                generation,
                rows,
                key_versions,
            })
        })
    }

    fn generation(&self) -> Result<i64, KvError> {
        let scope = self.scope;
        self.with(async |c| {
            Ok(c.query_one(
                "SELECT gen FROM registry_generation WHERE scope = $1",
                &[&scope],
            )
            .await
            .map_err(|e| pg(&e))?
            .get(0))
        })
    }

    fn apply(&self, ops: &[KvOp]) -> Result<i64, KvError> {
        let scope = self.scope;
        self.with(async |c| {
            let tx = c.transaction().await.map_err(|e| pg(&e))?;
            apply_ops(&tx, ops).await?;
            let generation = bump_generation(&tx, scope).await?;
            tx.commit().await.map_err(|e| pg(&e))?;
            Ok(generation)
        })
    }

    fn apply_fenced<E>(
        &self,
        agent: &str,
        plan: impl FnOnce(Option<UnixMillis>) -> Result<Vec<KvOp>, E>,
    ) -> Result<Result<FencedWrite, E>, KvError> {
        let scope = self.scope;
        self.with(async move |c| {
            let tx = c.transaction().await.map_err(|e| pg(&e))?;
            // The lock first: from here on no record of the agent commits
            // until this transaction ends, and the sequencer's commits that
            // came before are counted in `latest`.
            let (_, latest) = fence::lock_agent(&tx, agent).await.map_err(|e| pg(&e))?;
            let ops = match plan(latest) {
                Ok(ops) => ops,
                // Dropping the transaction rolls it back.
                Err(e) => return Ok(Err(e)),
            };
            apply_ops(&tx, &ops).await?;
            let key_version = fence::bump_key_version(&tx, agent)
                .await
                .map_err(|e| pg(&e))?;
            let generation = bump_generation(&tx, scope).await?;
            tx.commit().await.map_err(|e| pg(&e))?;
            Ok(Ok(FencedWrite {
                generation,
                key_version,
            }))
        })
    }

    fn lock_first_start(&self) -> Result<(), KvError> {
        let mut slot = self
            .first_start
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if slot.is_some() {
            return Ok(());
        }
        let client = self.connect()?;
        futures::executor::block_on(
            client.execute("SELECT pg_advisory_lock($1)", &[&FIRST_START_LOCK]),
        )
        .map_err(|e| pg(&e))?;
        *slot = Some(client);
        Ok(())
    }

    fn unlock_first_start(&self) {
        let held = self
            .first_start
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(client) = held {
            // Closing the session would release it too.
            let _ = futures::executor::block_on(
                client.execute("SELECT pg_advisory_unlock($1)", &[&FIRST_START_LOCK]),
            );
        }
    }
}

/// Applies `ops` inside `tx`, each only if its expectation holds.
///
/// # Errors
/// [`KvError::Conflict`] at the first that does not (the caller drops the
/// transaction, which rolls it back); [`KvError::Storage`].
async fn apply_ops(tx: &tokio_postgres::Transaction<'_>, ops: &[KvOp]) -> Result<(), KvError> {
    for op in ops {
        let (t, k) = (op.table, op.key.as_str());
        let n = match (&op.expect, &op.value) {
            (Expect::Any, Some(v)) => {
                tx.execute(
                    "INSERT INTO registry_rows (tbl, key, value) VALUES ($1, $2, $3)
                     ON CONFLICT (tbl, key) DO UPDATE SET value = EXCLUDED.value",
                    &[&t, &k, v],
                )
                .await
            }
            (Expect::Any, None) => tx
                .execute(
                    "DELETE FROM registry_rows WHERE tbl = $1 AND key = $2",
                    &[&t, &k],
                )
                .await
                .map(|_| 1),
            (Expect::Absent, Some(v)) => {
                tx.execute(
                    "INSERT INTO registry_rows (tbl, key, value) VALUES ($1, $2, $3)
                     ON CONFLICT (tbl, key) DO NOTHING",
                    &[&t, &k, v],
                )
                .await
            }
            (Expect::Absent, None) => tx
                .query_opt(
                    "SELECT 1 FROM registry_rows WHERE tbl = $1 AND key = $2 FOR UPDATE",
                    &[&t, &k],
                )
                .await
                .map(|r| u64::from(r.is_none())),
            (Expect::Equals(old), Some(v)) => {
                tx.execute(
                    "UPDATE registry_rows SET value = $4
                     WHERE tbl = $1 AND key = $2 AND value = $3",
                    &[&t, &k, old, v],
                )
                .await
            }
            (Expect::Equals(old), None) => {
                tx.execute(
                    "DELETE FROM registry_rows WHERE tbl = $1 AND key = $2 AND value = $3",
                    &[&t, &k, old],
                )
                .await
            }
        }
        .map_err(|e| pg(&e))?;
        if n != 1 {
            return Err(KvError::Conflict(format!("{t}/{k}")));
        }
    }
    Ok(())
}

/// Increments the generation of `scope` inside `tx`; the new value.
///
/// # Errors
/// [`KvError::Storage`].
async fn bump_generation(
    tx: &tokio_postgres::Transaction<'_>,
    scope: &str,
) -> Result<i64, KvError> {
    Ok(tx
        .query_one(
            "UPDATE registry_generation SET gen = gen + 1 WHERE scope = $1 RETURNING gen",
            &[&scope],
        )
        .await
        .map_err(|e| pg(&e))?
        .get(0))
}
