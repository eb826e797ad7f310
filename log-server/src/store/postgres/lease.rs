//! The sequencer's lease on PostgreSQL (docs/storage.md, "PostgreSQL
//! layout", `log_lease`; docs/operations.md, "Several fronts, one
//! sequencer"): taking it, renewing it on a connection of its own, the
//! fencing check every write makes in its transaction, and the
//! [`Lease`] trait the fronts use.

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Client;

use super::{backend, PostgresStore};
use crate::store::{Lease, StoreError};

/// How a store takes the sequencer's lease (docs/operations.md, "Running
/// on PostgreSQL"). Only the holder of the lease writes: every write
/// transaction checks, under a share lock on the lease row, that the
/// lease is unexpired and its token is this store's, so a process that
/// lost it (paused past its expiry, cut off from the database) can never
/// commit a batch or store a checkpoint after another took over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseOptions {
    /// How long a lease lasts unless renewed; it is renewed every third
    /// of it. A dead holder's lease is taken over after at most this long.
    pub ttl: Duration,
    /// At open, wait for a lease held by another process to expire or be
    /// released (a standby) instead of failing.
    pub wait: bool,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(10),
            wait: false,
        }
    }
}

/// The lease this store holds: its token (0 while it holds none).
#[derive(Debug)]
pub(super) struct LeaseState {
    pub(super) token: AtomicI64,
    pub(super) holder: String,
    pub(super) ttl_ms: i64,
}

/// Takes the lease if it is free or expired; `Some(token)` when taken.
async fn try_acquire(c: &Client, lease: &LeaseState) -> Result<Option<i64>, StoreError> {
    let row = c
        .query_opt(
            "UPDATE log_lease SET token = token + 1, holder = $1,
                 expires_at = clock_timestamp() + $2::float8 * interval '1 millisecond'
             WHERE id = 1 AND expires_at <= clock_timestamp()
             RETURNING token",
            &[&lease.holder, &(lease.ttl_ms as f64)],
        )
        .await
        .map_err(|e| backend(&e))?;
    Ok(row.map(|r| r.get(0)))
}

/// Extends the lease `token` if it is still unexpired; whether it was.
async fn try_renew(c: &Client, lease: &LeaseState, token: i64) -> Result<bool, StoreError> {
    let n = c
        .execute(
            "UPDATE log_lease SET expires_at = clock_timestamp() + $2::float8 * interval '1 millisecond'
             WHERE id = 1 AND token = $1 AND expires_at > clock_timestamp()",
            &[&token, &(lease.ttl_ms as f64)],
        )
        .await
        .map_err(|e| backend(&e))?;
    Ok(n == 1)
}

/// Who holds the lease and for how much longer, for messages.
async fn lease_holder(c: &Client) -> Result<String, StoreError> {
    let row = c
        .query_one(
            "SELECT holder, token,
                    greatest(0, extract(epoch FROM expires_at - clock_timestamp()))::float8
             FROM log_lease WHERE id = 1",
            &[],
        )
        .await
        .map_err(|e| backend(&e))?;
    let (holder, token, left): (String, i64, f64) = (row.get(0), row.get(1), row.get(2));
    Ok(format!("{holder} (token {token}, {left:.1}s left)"))
}

/// A ttl as whole milliseconds, at least 300.
pub(super) fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX).max(300)
}

/// Renews the lease `token` every third of its ttl on `client`, until this
/// store gives it up or loses it. A lease that expired unrenewed (the
/// process was paused, starved or cut off) is taken again with a new token
/// if nobody else took it (the log re-reads the store before its next
/// write, as after any failed write); one that another process took is
/// lost: the token goes to 0 and every write is fenced from then on.
async fn renew_lease(client: Client, lease: Arc<LeaseState>, mut token: i64) {
    let period = Duration::from_millis((lease.ttl_ms / 3).max(100) as u64);
    loop {
        tokio::time::sleep(period).await;
        if lease.token.load(Ordering::SeqCst) != token {
            return;
        }
        match try_renew(&client, &lease, token).await {
            Ok(true) => {}
            Ok(false) => {
                let _ = lease
                    .token
                    .compare_exchange(token, 0, Ordering::SeqCst, Ordering::SeqCst);
                match try_acquire(&client, &lease).await {
                    Ok(Some(t))
                        if lease
                            .token
                            .compare_exchange(0, t, Ordering::SeqCst, Ordering::SeqCst)
                            .is_ok() =>
                    {
                        tracing::warn!(
                            old = token,
                            new = t,
                            "the log's lease expired before it was renewed; took it again"
                        );
                        token = t;
                    }
                    _ => {
                        tracing::error!(
                            token,
                            "lost the log's lease to another process: this process no longer sequences"
                        );
                        return;
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "renewing the log's lease failed; retrying"),
        }
    }
}

/// The fencing check of every write, inside its transaction.
pub(super) async fn check_lease(
    tx: &tokio_postgres::Transaction<'_>,
    lease: Option<&LeaseState>,
) -> Result<(), StoreError> {
    let Some(lease) = lease else {
        return Err(StoreError::Conflict(
            "this store was opened without the sequencer's lease: it cannot write".into(),
        ));
    };
    let mine = lease.token.load(Ordering::SeqCst);
    let row = tx
        .query_opt(
            "SELECT token FROM log_lease WHERE id = 1 AND expires_at > clock_timestamp() FOR SHARE",
            &[],
        )
        .await
        .map_err(|e| backend(&e))?;
    match row.map(|r| r.get::<_, i64>(0)) {
        Some(t) if mine != 0 && t == mine => Ok(()),
        _ => Err(StoreError::Fenced(format!(
            "this process no longer holds the log's lease (its token was {mine}); \
             another sequencer may have taken over"
        ))),
    }
}

/// This process, as a lease holder: host, pid and a per-open counter.
pub(super) fn holder_name() -> String {
    static OPENED: AtomicUsize = AtomicUsize::new(0);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "host".into());
    format!(
        "{host}:{}:{}",
        std::process::id(),
        OPENED.fetch_add(1, Ordering::Relaxed)
    )
}

impl PostgresStore {
    /// Takes the lease (waiting for it if asked), then keeps renewing it on
    /// a connection of its own.
    pub(super) fn take_lease(mut self, options: LeaseOptions) -> Result<Self, StoreError> {
        let lease = Arc::new(LeaseState {
            token: AtomicI64::new(0),
            holder: holder_name(),
            ttl_ms: ttl_ms(options.ttl),
        });
        self.lease = Some(Arc::clone(&lease));
        let mut said = false;
        loop {
            match self.acquire_once()? {
                Ok(()) => {
                    if said {
                        tracing::warn!(token = self.lease_token(), "took over the log's lease");
                    }
                    return Ok(self);
                }
                Err(holder) if !options.wait => {
                    return Err(StoreError::Conflict(format!(
                        "the log in this database is sequenced by another process: {holder}"
                    )))
                }
                Err(holder) => {
                    if !said {
                        tracing::warn!("standing by: the log's lease is held by {holder}");
                        said = true;
                    }
                    std::thread::sleep(Duration::from_millis(
                        (lease.ttl_ms / 4).clamp(100, 1000) as u64
                    ));
                }
            }
        }
    }

    /// One attempt at the lease: `Ok(Ok(()))` when taken (renewal then
    /// runs until it is lost), `Ok(Err(holder))` when another holds it.
    fn acquire_once(&self) -> Result<Result<(), String>, StoreError> {
        let Some(lease) = self.lease.as_ref().map(Arc::clone) else {
            return Ok(Err("nobody: this store was opened without a lease".into()));
        };
        let got = self.write(async |c| match try_acquire(c, &lease).await? {
            Some(t) => Ok(Ok(t)),
            None => Ok(Err(lease_holder(c).await?)),
        })?;
        let token = match got {
            Ok(token) => token,
            Err(holder) => return Ok(Err(holder)),
        };
        let client = match self.connect() {
            Ok(c) => c,
            Err(e) => {
                // Give it back rather than hold it unrenewed.
                let _ = self.write(async |c| {
                    c.execute(
                        "UPDATE log_lease SET expires_at = '-infinity' WHERE id = 1 AND token = $1",
                        &[&token],
                    )
                    .await
                    .map_err(|e| backend(&e))
                });
                return Err(e);
            }
        };
        lease.token.store(token, Ordering::SeqCst);
        let rt = self
            .pg
            .runtime()
            .ok_or_else(|| StoreError::Backend("postgresql store is closed".into()))?;
        rt.spawn(renew_lease(client, lease, token));
        Ok(Ok(()))
    }

    /// The fencing token of the lease this store holds (0: none).
    #[must_use]
    pub fn lease_token(&self) -> i64 {
        self.lease
            .as_ref()
            .map_or(0, |l| l.token.load(Ordering::SeqCst))
    }
}

impl Lease for PostgresStore {
    /// Takes the lease if this store holds none and it is free or expired,
    /// and then keeps renewing it; whether this store holds it now. A store
    /// opened without a lease never holds one.
    ///
    /// # Errors
    /// [`StoreError::Backend`] when the database cannot be reached.
    fn try_lease(&self) -> Result<bool, StoreError> {
        if self.lease.is_none() {
            return Ok(false);
        }
        if self.lease_token() != 0 {
            return Ok(true);
        }
        Ok(self.acquire_once()?.is_ok())
    }

    /// Who holds the lease, for messages.
    ///
    /// # Errors
    /// [`StoreError::Backend`] when the database cannot be reached.
    fn lease_holder(&self) -> Result<String, StoreError> {
        self.read(async |c| lease_holder(c).await)
    }

    /// The lease's time to live (the default when opened without one).
    fn lease_ttl(&self) -> Duration {
        self.lease
            .as_ref()
            .map_or(LeaseOptions::default().ttl, |l| {
                Duration::from_millis(u64::try_from(l.ttl_ms).unwrap_or(u64::MAX))
            })
    }

    /// Gives the lease up, if this store holds it: writes are fenced from
    /// now on, and another process may take it at once.
    fn release_lease(&self) {
        if let Some(lease) = &self.lease {
            let token = lease.token.swap(0, Ordering::SeqCst);
            if token != 0 {
                let _ = self.write(async |c| {
                    c.execute(
                        "UPDATE log_lease SET expires_at = '-infinity' WHERE id = 1 AND token = $1",
                        &[&token],
                    )
                    .await
                    .map_err(|e| backend(&e))
                });
            }
        }
    }

    fn lease_token(&self) -> i64 {
        PostgresStore::lease_token(self)
    }
}
