//! A table held in memory and written through to a [`KvStore`]: the
//! registry (module `registry`) and the console's auditor links
//! (tally-console's `store`) are each one of these over rows of their own
//! (docs/storage.md, "The registry and the console on PostgreSQL").
//!
//! Reads take only the memory copy. A write decides from the memory copy
//! which rows to write, each expecting the value it read; the store applies
//! them in one durable transaction; only then does the memory copy take
//! them. When another front changed one of the rows first, the store
//! refuses the whole write, the memory copy is reloaded, and the write may
//! decide again. On a shared store (PostgreSQL) a watcher reloads the copy
//! when another front wrote, within its period (docs/operations.md,
//! "Running on PostgreSQL").

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use crate::kv::{KvError, KvOp, KvStore, Snapshot};

/// The rows of a [`CachedTable`], decoded, as its memory copy holds them.
pub trait Rows: Sized + Send + Sync + 'static {
    /// Why a row does not decode, or the store failed.
    type Error: From<KvError> + std::fmt::Display;

    /// The memory copy of every row of `snapshot`.
    ///
    /// # Errors
    /// A row that does not decode.
    fn from_snapshot(snapshot: Snapshot) -> Result<Self, Self::Error>;

    /// Sets (`Some`) or removes (`None`) one row just written.
    ///
    /// # Errors
    /// A value that does not decode.
    fn set(
        &mut self,
        table: &'static str,
        key: &str,
        value: Option<&[u8]>,
    ) -> Result<(), Self::Error>;
}

/// How a shared table watches for other fronts' writes.
#[derive(Debug, Clone, Copy)]
pub struct Watch {
    /// The watcher thread's name.
    pub thread: &'static str,
    /// How often it asks the store for its generation.
    pub period: Duration,
    /// What the table is, for the warning when a reload fails.
    pub what: &'static str,
}

/// A table of rows `R` in memory, written through to a [`KvStore`]. See
/// the module docs.
pub struct CachedTable<R> {
    kv: KvStore,
    rows: RwLock<R>,
    /// Serialises this process's writes (and reloads); between processes
    /// the database's expectations decide.
    write: Mutex<()>,
    /// The generation the memory copy was loaded at (PostgreSQL).
    generation: AtomicI64,
}

impl<R> std::fmt::Debug for CachedTable<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedTable")
            .field("kv", &self.kv)
            .finish_non_exhaustive()
    }
}

impl<R: Rows> CachedTable<R> {
    /// The table over `kv`, loaded into memory; on a shared store, watched
    /// as `watch` says until the table is dropped.
    ///
    /// # Errors
    /// When `kv` fails or a row does not decode.
    pub fn open(kv: KvStore, watch: Watch) -> Result<Arc<Self>, R::Error> {
        let snapshot = kv.snapshot()?;
        let generation = snapshot.generation;
        let shared = kv.is_shared();
        let table = Arc::new(Self {
            kv,
            rows: RwLock::new(R::from_snapshot(snapshot)?),
            write: Mutex::new(()),
            generation: AtomicI64::new(generation),
        });
        if shared {
            let Watch {
                thread,
                period,
                what,
            } = watch;
            crate::kv::spawn_watcher_every(
                thread,
                period,
                Arc::downgrade(&table),
                move |t: &Self| {
                    if let Err(e) = t.refresh_if_changed() {
                        tracing::warn!("reloading {what}: {e}");
                    }
                },
            );
        }
        Ok(table)
    }

    /// Whether other processes share the rows (PostgreSQL).
    #[must_use]
    pub fn is_shared(&self) -> bool {
        self.kv.is_shared()
    }

    /// The store under the table.
    #[must_use]
    pub fn kv(&self) -> &KvStore {
        &self.kv
    }

    /// The memory copy, for reading.
    pub fn read(&self) -> RwLockReadGuard<'_, R> {
        self.rows.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// This process's write lock, for a caller that writes to the store
    /// other than through [`CachedTable::write`] and then [`CachedTable::took`].
    pub fn writer(&self) -> MutexGuard<'_, ()> {
        self.write.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reloads the memory copy when another process wrote since it was
    /// loaded (one cheap query otherwise); the watcher calls it every
    /// period.
    ///
    /// # Errors
    /// When the store fails or a row does not decode (the memory copy is
    /// then kept as it was).
    pub fn refresh_if_changed(&self) -> Result<(), R::Error> {
        if self.kv.generation()? != self.generation.load(Ordering::SeqCst) {
            let _w = self.writer();
            self.reload()?;
        }
        Ok(())
    }

    /// The memory copy, for a change the store already holds; the caller
    /// holds the write lock.
    pub fn rows_mut(&self) -> RwLockWriteGuard<'_, R> {
        self.rows.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reloads everything; the caller holds the write lock.
    ///
    /// # Errors
    /// When the store fails or a row does not decode (the memory copy is
    /// then kept as it was).
    pub fn reload(&self) -> Result<(), R::Error> {
        let snapshot = self.kv.snapshot()?;
        let generation = snapshot.generation;
        let rows = R::from_snapshot(snapshot)?;
        *self.rows_mut() = rows;
        self.generation.store(generation, Ordering::SeqCst);
        Ok(())
    }

    /// The one write path: `plan` decides, from the memory copy, the rows
    /// to write (each expecting the value it read) and what to return, or
    /// refuses; the store applies them in one transaction; then the memory
    /// copy takes them. No rows: nothing is written (and no other front
    /// reloads). When another process changed one of the rows first, the
    /// memory copy is reloaded and `plan` decides again, at most `retries`
    /// times; past that the write fails with `gave_up(conflict)`.
    ///
    /// # Errors
    /// What `plan` refuses with, `gave_up`'s error, or the store's.
    pub fn write<T, E: From<R::Error>>(
        &self,
        retries: usize,
        mut plan: impl FnMut(&R) -> Result<(Vec<KvOp>, T), E>,
        gave_up: impl FnOnce(KvError) -> E,
    ) -> Result<T, E> {
        let _w = self.writer();
        let mut attempts = 0;
        loop {
            let (ops, out) = plan(&self.read())?;
            if ops.is_empty() {
                return Ok(out);
            }
            match self.kv.apply(&ops) {
                Ok(generation) => {
                    self.took(&ops, generation)?;
                    return Ok(out);
                }
                Err(conflict @ KvError::Conflict(_)) => {
                    self.reload()?;
                    if attempts >= retries {
                        return Err(gave_up(conflict));
                    }
                    attempts += 1;
                    tracing::debug!("{conflict}; deciding again");
                }
                Err(e) => return Err(R::Error::from(e).into()),
            }
        }
    }

    /// The memory copy takes rows just written at `generation`; the caller
    /// holds the write lock.
    ///
    /// # Errors
    /// A value that does not decode.
    pub fn took(&self, ops: &[KvOp], generation: i64) -> Result<(), R::Error> {
        let mut rows = self.rows_mut();
        for op in ops {
            rows.set(op.table, &op.key, op.value.as_deref())?;
        }
        // Up to date only if nobody else wrote in between; else the
        // watcher reloads.
        let _ = self.generation.compare_exchange(
            generation - 1,
            generation,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
        Ok(())
    }
}
