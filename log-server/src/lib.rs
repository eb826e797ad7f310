//! # tally-log
//!
//! The durable Merkle log of tally (docs/storage.md is its contract,
//! docs/protocol.md §7–§8 the wire it produces): storage behind the
//! [`store::LogStore`] trait (redb by default, in-memory for tests and
//! baselines; the fault-injecting one is in the dev-only tally-testkit), one sequencer with group commit ([`Log`]), single records or
//! batches of many, C2SP checkpoints signed only over durable state, crash
//! recovery, RFC 9162 proofs, and the C2SP tlog-tiles read routes
//! ([`http::router`]).
//!
//! It is an engine: no auth, no admission. The witness checks a record's
//! schema, signature, key and time, then calls
//! [`Log::enqueue_batch_fenced`] with one record or many.
//!
//! - `log`: [`Log`], its append API and the Rust read API.
//! - `sequencer`: the writer thread and group commit.
//! - `rules`: the pure admission rules (retry, nonce replay, chain conflict).
//! - `checkpoint`: checkpoint signing and recovery.
//! - `front`: several active fronts on one PostgreSQL database (the
//!   sequencer's hand-over table, promotion and demotion).
//! - [`store`]: the storage contract and its backends.
//! - [`tree`]: roots, proofs and tiles over stored hashes.
//! - [`http`]: the read routes; `tile_path`: the C2SP tile path grammar
//!   ([`http::parse_tile_path`]).
//! - `error`: typed errors ([`AppendError`], [`OpenError`], [`ReadError`],
//!   [`ProofRequestError`]).

mod checkpoint;
mod error;
mod front;
pub mod http;
mod item;
mod log;
mod receipt;
mod rules;
mod sequencer;
pub mod store;
mod tile_path;
pub mod tree;

pub use error::{AppendError, OpenError, ProofRequestError, ReadError};
pub use item::{Appended, BatchItem};
pub use log::{ChainEntries, ChainEntry, Log, LogConfig, LogStats, PendingBatch, SignedCheckpoint};
pub use store::{ChainHead, KeyVersion, LogStore, StoreError};
