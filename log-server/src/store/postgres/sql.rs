//! Small conversions between the log's values and PostgreSQL's: errors as
//! [`StoreError`], `bigint` columns, stored hashes.

use tally_schemas::Hash;

use crate::store::StoreError;

pub(super) fn backend(e: &tokio_postgres::Error) -> StoreError {
    match e.as_db_error() {
        Some(db) => StoreError::Backend(format!(
            "postgresql: {} ({}){}",
            db.message(),
            db.code().code(),
            db.detail().map(|d| format!(": {d}")).unwrap_or_default()
        )),
        None => StoreError::Backend(format!("postgresql: {e}")),
    }
}

pub(super) fn corrupt(what: String) -> StoreError {
    StoreError::Corrupt(what)
}

/// A u64 as PostgreSQL's `bigint`.
pub(super) fn big(v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::Conflict(format!("{v} does not fit a bigint")))
}

/// A stored `bigint` as a u64.
pub(super) fn unbig(v: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| corrupt(format!("{what} is negative ({v})")))
}

pub(super) fn hash_of(bytes: &[u8], what: &str) -> Result<Hash, StoreError> {
    <[u8; 32]>::try_from(bytes)
        .map(Hash::from_bytes)
        .map_err(|_| corrupt(format!("{what} is not 32 bytes")))
}
