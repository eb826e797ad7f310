//! What every PostgreSQL store of tally shares: the log's store here, and
//! the registry, the console's links and its sessions (tally-witness `kv`).
//! Each drives its connections on a small runtime of its own
//! ([`PgRuntime`]), and callers wait on their query's future with
//! `futures::executor::block_on`, so a store may be called from any thread,
//! tokio workers included (docs/dependencies.md says why not the blocking
//! `postgres` crate). Each applies its own list of migrations with
//! [`migrate`].

use tokio_postgres::Client;

use super::tls::Connector;

/// The runtime that drives a store's connections, and how it connects.
/// Dropping it shuts the runtime down without blocking (a store may be
/// dropped on a runtime thread).
pub struct PgRuntime {
    rt: Option<tokio::runtime::Runtime>,
    connector: Connector,
    /// Whose connections these are, in messages (`""`: the log's).
    of: &'static str,
}

impl std::fmt::Debug for PgRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgRuntime")
            .field("of", &self.of)
            .finish_non_exhaustive()
    }
}

impl Drop for PgRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// Why [`PgRuntime::connect`] failed.
#[derive(Debug)]
pub enum ConnectError {
    /// The runtime was shut down.
    Closed,
    /// The server refused, or could not be reached.
    Postgres(tokio_postgres::Error),
    /// The connecting task failed.
    Task(String),
}

impl PgRuntime {
    /// A runtime of one worker thread named `thread`, connecting with
    /// `connector`; `of` names the connections in messages (`""`, or
    /// `" of the registry"`).
    ///
    /// # Errors
    /// When the runtime cannot start.
    pub fn new(
        connector: Connector,
        thread: &str,
        of: &'static str,
    ) -> Result<Self, std::io::Error> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(thread)
            .enable_all()
            .build()?;
        Ok(Self {
            rt: Some(rt),
            connector,
            of,
        })
    }

    /// How this runtime connects (for its error messages).
    #[must_use]
    pub fn connector(&self) -> &Connector {
        &self.connector
    }

    /// The runtime, to run a store's background tasks on (`None` once shut
    /// down).
    #[must_use]
    pub fn runtime(&self) -> Option<&tokio::runtime::Runtime> {
        self.rt.as_ref()
    }

    /// Opens a connection driven on this runtime, waiting on the caller's
    /// thread; a connection that ends later is logged.
    ///
    /// # Errors
    /// [`ConnectError`].
    pub fn connect(&self) -> Result<Client, ConnectError> {
        let rt = self.rt.as_ref().ok_or(ConnectError::Closed)?;
        let connector = self.connector.clone();
        let of = self.of;
        let task = rt.spawn(async move {
            let (client, connection) = connector.connect().await?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::warn!("postgresql connection{of} ended: {e}");
                }
            });
            Ok::<_, tokio_postgres::Error>(client)
        });
        match futures::executor::block_on(task) {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(e)) => Err(ConnectError::Postgres(e)),
            Err(e) => Err(ConnectError::Task(e.to_string())),
        }
    }
}

/// Why [`migrate`] failed.
#[derive(Debug)]
pub enum MigrateError {
    /// A statement failed.
    Postgres(tokio_postgres::Error),
    /// The database holds a newer schema than this build knows.
    Newer {
        /// The database's version.
        current: i32,
        /// The newest version this build knows.
        known: i32,
    },
    /// The migration `name` failed.
    Failed {
        /// The migration's file name.
        name: &'static str,
        /// Why.
        source: tokio_postgres::Error,
    },
}

impl From<tokio_postgres::Error> for MigrateError {
    fn from(e: tokio_postgres::Error) -> Self {
        Self::Postgres(e)
    }
}

/// Applies the `migrations` (`(file name, SQL)`, version `n` the `n`-th)
/// the database lacks, in one transaction under the advisory lock `lock`
/// (so that processes opening one database at once migrate it once), and
/// records each in `version_table`, which it creates on first use.
///
/// # Errors
/// [`MigrateError`]; nothing is applied then.
pub async fn migrate(
    c: &mut Client,
    lock: i64,
    version_table: &str,
    migrations: &[(&'static str, &'static str)],
) -> Result<(), MigrateError> {
    let known = i32::try_from(migrations.len()).unwrap_or(i32::MAX);
    let tx = c.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&lock])
        .await?;
    tx.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {version_table} (
             version    integer PRIMARY KEY,
             name       text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now())"
    ))
    .await?;
    let current: i32 = tx
        .query_one(
            &format!("SELECT coalesce(max(version), 0) FROM {version_table}"),
            &[],
        )
        .await?
        .get(0);
    if current > known {
        return Err(MigrateError::Newer { current, known });
    }
    let done = usize::try_from(current).unwrap_or(0);
    for (n, (name, sql)) in migrations.iter().enumerate().skip(done) {
        let version = i32::try_from(n + 1).unwrap_or(i32::MAX);
        tx.batch_execute(sql)
            .await
            .map_err(|source| MigrateError::Failed { name, source })?;
        tx.execute(
            &format!("INSERT INTO {version_table} (version, name) VALUES ($1, $2)"),
            &[&version, name],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
}
