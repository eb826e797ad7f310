//! # tally-log
//!
//! The durable Merkle log of tally (issue 3; docs/storage.md is its contract,
//! docs/protocol.md §7–§8 the wire it produces): storage behind the
//! [`store::LogStore`] trait (redb by default, in-memory and fault-injecting
//! for tests), one sequencer with group commit ([`Log`]), C2SP checkpoints
//! signed only over durable state, crash recovery, RFC 9162 proofs, and the
//! C2SP tlog-tiles read routes ([`http::router`]).
//!
//! It is an engine: no auth, no admission. The witness checks a record's
//! schema, signature, key and time, then calls [`Log::append`].
//!
//! - [`store`]: the storage contract and its backends.
//! - [`tree`]: roots, proofs and tiles over stored hashes.
//! - [`log`]: the sequencer, recovery and the Rust read API.
//! - [`http`]: the read routes.
//! - [`error`]: typed errors.

pub mod error;
pub mod http;
pub mod log;
pub mod store;
pub mod tree;

pub use error::{AppendError, OpenError, ProofRequestError, ReadError};
pub use log::{
    Appended, ChainEntries, ChainEntry, Log, LogConfig, LogStats, PendingAppend, SignedCheckpoint,
};
pub use store::{ChainHead, LogStore, StoreError};
