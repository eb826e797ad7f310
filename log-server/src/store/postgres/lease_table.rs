//! The `log_lease` table (docs/storage.md, "PostgreSQL layout";
//! docs/operations.md, "Several fronts, one sequencer"): taking the
//! sequencer's lease, renewing it on a connection of its own, and the
//! fencing check every write makes in its transaction. The store's side,
//! the [`crate::store::Lease`] trait, is in `lease.rs`.

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Client;

use super::sql::backend;
use crate::store::StoreError;

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
pub(super) async fn try_acquire(c: &Client, lease: &LeaseState) -> Result<Option<i64>, StoreError> {
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
pub(super) async fn lease_holder(c: &Client) -> Result<String, StoreError> {
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
pub(super) async fn renew_lease(client: Client, lease: Arc<LeaseState>, mut token: i64) {
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
