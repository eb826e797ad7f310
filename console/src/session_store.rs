//! Where the console's sessions are kept (docs/console.md "Access"): in this
//! process's memory (the default, with the redb store: one process serves
//! the console), or, with `--store postgres://…`, in the table
//! `console_sessions` of that database (migration
//! `witness/migrations/0002_console_sessions.sql`, docs/storage.md), so that
//! every front on it knows every session and a logout through one ends it
//! on all.
//!
//! The rules (expiry, which session a login past the limits ends, the API
//! key's re-check, CSRF) are `auth`'s, one code path for both; a store
//! keeps rows and gives a login what it needs to decide, in one
//! transaction. A row holds no secret: the session's id is the SHA-256 of
//! its token, and the API key is kept as its public id and its SHA-256,
//! as the registry keeps it.

use std::collections::HashMap;
use std::sync::Mutex;

use tally_schemas::UnixMillis;
use tally_witness::kv::{KvError, PostgresKv};

/// Why the session store failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionStoreError {
    /// The database failed or cannot be reached.
    #[error("console sessions: {0}")]
    Storage(String),
}

fn storage<E: std::fmt::Display>(e: E) -> SessionStoreError {
    SessionStoreError::Storage(e.to_string())
}

/// One session as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredSession {
    /// SHA-256 of the session token, hex: the session's id.
    pub id: String,
    /// The project of the API key that logged in.
    pub project: String,
    /// The API key's public id.
    pub key_id: String,
    /// SHA-256 of the API key, hex (what the registry's `api_keys` row holds).
    pub key_sha256: String,
    /// When it was made.
    pub created: UnixMillis,
    /// When it ends.
    pub expires: UnixMillis,
}

/// The live sessions of one API key, for a login's decision: how many, and
/// the oldest (by login order, since clock ties are common).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeySessions {
    /// The key's project.
    pub project: String,
    /// The key's public id.
    pub key_id: String,
    /// How many sessions it holds.
    pub sessions: usize,
    /// The login order of its oldest session.
    pub oldest_order: u64,
    /// That session's id.
    pub oldest_id: String,
}

/// Picks the session a login ends (if any) from the census of every API
/// key that holds sessions.
pub(crate) type Choose<'a> = dyn Fn(&[KeySessions]) -> Option<String> + 'a;

/// Storage of sessions. See the module docs.
pub(crate) trait SessionStore: Send + Sync {
    /// Whether other processes share these sessions (a call may then wait
    /// on the network, so the console makes it off the async workers).
    fn is_shared(&self) -> bool;

    /// A login, in one transaction that no other login (through any front)
    /// interleaves with: deletes the sessions expired at `now`, ends the
    /// session `choose` names from the census of the rest, and stores `new`.
    ///
    /// # Errors
    /// [`SessionStoreError`]; nothing is changed then.
    fn login(
        &self,
        new: &StoredSession,
        now: UnixMillis,
        choose: &Choose<'_>,
    ) -> Result<(), SessionStoreError>;

    /// The session with this id, if stored (expired or not).
    ///
    /// # Errors
    /// [`SessionStoreError`].
    fn get(&self, id: &str) -> Result<Option<StoredSession>, SessionStoreError>;

    /// Ends a session (nothing when there is none).
    ///
    /// # Errors
    /// [`SessionStoreError`].
    fn remove(&self, id: &str) -> Result<(), SessionStoreError>;

    /// Sessions stored now for `project`, expired ones not yet deleted
    /// included.
    #[cfg(test)]
    fn count(&self, project: &str) -> Result<usize, SessionStoreError>;
}

/// The census of `sessions` (see [`KeySessions`]), in a stable order.
fn census<'a>(sessions: impl Iterator<Item = (&'a StoredSession, u64)>) -> Vec<KeySessions> {
    let mut by_key: HashMap<(&str, &str), KeySessions> = HashMap::new();
    for (s, order) in sessions {
        let k = by_key
            .entry((s.project.as_str(), s.key_id.as_str()))
            .or_insert_with(|| KeySessions {
                project: s.project.clone(),
                key_id: s.key_id.clone(),
                sessions: 0,
                oldest_order: u64::MAX,
                oldest_id: String::new(),
            });
        k.sessions += 1;
        if order < k.oldest_order {
            k.oldest_order = order;
            k.oldest_id.clone_from(&s.id);
        }
    }
    let mut out: Vec<KeySessions> = by_key.into_values().collect();
    out.sort_by(|a, b| (&a.project, &a.key_id).cmp(&(&b.project, &b.key_id)));
    out
}

/// Sessions in this process's memory: a restart ends them all.
#[derive(Default)]
pub(crate) struct MemorySessions {
    table: Mutex<MemoryTable>,
}

#[derive(Default)]
struct MemoryTable {
    /// Session id → the session and its login order.
    by_id: HashMap<String, (StoredSession, u64)>,
    logins: u64,
}

impl MemorySessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryTable> {
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl SessionStore for MemorySessions {
    fn is_shared(&self) -> bool {
        false
    }

    fn login(
        &self,
        new: &StoredSession,
        now: UnixMillis,
        choose: &Choose<'_>,
    ) -> Result<(), SessionStoreError> {
        let mut table = self.lock();
        table.by_id.retain(|_, (s, _)| s.expires > now);
        let ended = choose(&census(table.by_id.values().map(|(s, o)| (s, *o))));
        if let Some(id) = ended {
            table.by_id.remove(&id);
        }
        table.logins += 1;
        let order = table.logins;
        table.by_id.insert(new.id.clone(), (new.clone(), order));
        Ok(())
    }

    fn get(&self, id: &str) -> Result<Option<StoredSession>, SessionStoreError> {
        Ok(self.lock().by_id.get(id).map(|(s, _)| s.clone()))
    }

    fn remove(&self, id: &str) -> Result<(), SessionStoreError> {
        self.lock().by_id.remove(id);
        Ok(())
    }

    #[cfg(test)]
    fn count(&self, project: &str) -> Result<usize, SessionStoreError> {
        Ok(self
            .lock()
            .by_id
            .values()
            .filter(|(s, _)| s.project == project)
            .count())
    }
}

/// Sessions in the PostgreSQL database every front shares: table
/// `console_sessions`, on a connection of their own.
pub(crate) struct PostgresSessions {
    db: PostgresKv,
}

impl PostgresSessions {
    /// Connects to the database at `url`, applying the migrations it lacks.
    ///
    /// # Errors
    /// [`SessionStoreError`] for a bad URL, an unreachable server or a
    /// failed migration.
    pub(crate) fn open(url: &str) -> Result<Self, SessionStoreError> {
        Ok(Self {
            db: PostgresKv::open_migrated(url).map_err(storage)?,
        })
    }
}

/// A driver error as the store reports it (with the server's message and
/// SQLSTATE when the server refused).
fn pg(e: tokio_postgres::Error) -> KvError {
    KvError::Storage(match e.as_db_error() {
        Some(db) => format!("postgresql: {} ({})", db.message(), db.code().code()),
        None => format!("postgresql: {e}"),
    })
}

impl SessionStore for PostgresSessions {
    fn is_shared(&self) -> bool {
        true
    }

    fn login(
        &self,
        new: &StoredSession,
        now: UnixMillis,
        choose: &Choose<'_>,
    ) -> Result<(), SessionStoreError> {
        self.db
            .with_client(async |c| {
                let tx = c.transaction().await.map_err(pg)?;
                // Logins take turns, so two through two fronts at once
                // cannot both pass a limit; reads (every page's session
                // check) are not held up. Dropping `tx` rolls back.
                tx.batch_execute("LOCK TABLE console_sessions IN SHARE ROW EXCLUSIVE MODE")
                    .await
                    .map_err(pg)?;
                tx.execute(
                    "DELETE FROM console_sessions WHERE expires_ms <= $1",
                    &[&now.as_millis()],
                )
                .await
                .map_err(pg)?;
                let rows = tx
                    .query(
                        "SELECT DISTINCT ON (project, key_id)
                                project, key_id,
                                count(*) OVER (PARTITION BY project, key_id),
                                login_order, id
                         FROM console_sessions
                         ORDER BY project, key_id, login_order",
                        &[],
                    )
                    .await
                    .map_err(pg)?;
                let census: Vec<KeySessions> = rows
                    .iter()
                    .map(|r| KeySessions {
                        project: r.get(0),
                        key_id: r.get(1),
                        sessions: usize::try_from(r.get::<_, i64>(2)).unwrap_or(usize::MAX),
                        oldest_order: u64::try_from(r.get::<_, i64>(3)).unwrap_or(0),
                        oldest_id: r.get(4),
                    })
                    .collect();
                if let Some(id) = choose(&census) {
                    tx.execute("DELETE FROM console_sessions WHERE id = $1", &[&id])
                        .await
                        .map_err(pg)?;
                }
                tx.execute(
                    "INSERT INTO console_sessions
                         (id, project, key_id, key_sha256, created_ms, expires_ms)
                     VALUES ($1, $2, $3, $4, $5, $6)",
                    &[
                        &new.id,
                        &new.project,
                        &new.key_id,
                        &new.key_sha256,
                        &new.created.as_millis(),
                        &new.expires.as_millis(),
                    ],
                )
                .await
                .map_err(pg)?;
                tx.commit().await.map_err(pg)
            })
            .map_err(storage)
    }

    fn get(&self, id: &str) -> Result<Option<StoredSession>, SessionStoreError> {
        self.db
            .with_client(async |c| {
                let row = c
                    .query_opt(
                        "SELECT project, key_id, key_sha256, created_ms, expires_ms
                         FROM console_sessions WHERE id = $1",
                        &[&id],
                    )
                    .await
                    .map_err(pg)?;
                Ok(row.map(|r| StoredSession {
                    id: id.to_owned(),
                    project: r.get(0),
                    key_id: r.get(1),
                    key_sha256: r.get(2),
                    created: UnixMillis::new(r.get(3)),
                    expires: UnixMillis::new(r.get(4)),
                }))
            })
            .map_err(storage)
    }

    fn remove(&self, id: &str) -> Result<(), SessionStoreError> {
        self.db
            .with_client(async |c| {
                c.execute("DELETE FROM console_sessions WHERE id = $1", &[&id])
                    .await
                    .map_err(pg)?;
                Ok(())
            })
            .map_err(storage)
    }

    #[cfg(test)]
    fn count(&self, project: &str) -> Result<usize, SessionStoreError> {
        self.db
            .with_client(async |c| {
                let n: i64 = c
                    .query_one(
                        "SELECT count(*) FROM console_sessions WHERE project = $1",
                        &[&project],
                    )
                    .await
                    .map_err(pg)?
                    .get(0);
                Ok(usize::try_from(n).unwrap_or(usize::MAX))
            })
            .map_err(storage)
    }
}

#[cfg(test)]
mod tests;
