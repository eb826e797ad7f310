//! The sequencer's lease on PostgreSQL, the store's side (docs/operations.md,
//! "Several fronts, one sequencer"): taking it at open, keeping it, and
//! the [`Lease`] trait the fronts use; the table's rows are `lease_table.rs`.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::lease_table::{
    holder_name, lease_holder, renew_lease, try_acquire, ttl_ms, LeaseOptions, LeaseState,
};
use super::sql::backend;
use super::PostgresStore;
use crate::store::{Lease, StoreError};

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
