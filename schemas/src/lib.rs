//! # tally-schemas
//!
//! The shared core of tally: every object that is hashed, signed or parsed by
//! more than one part of the system, and the math to check it. Its contract
//! is docs/protocol.md; each module names the section it implements.
//!
//! - [`canonical`]: strict JSON and RFC 8785 canonicalisation.
//! - [`api`]: the HTTP APIs' JSON bodies: the error body, the key
//!   directory, the JSON proof answers and the admin API.
//! - [`hash`], [`keys`]: SHA-256 constructions, Ed25519 keys and key ids.
//! - [`batch_sig`]: strict verification of many signatures, each by its own equation.
//! - [`record`], [`tools`]: records, bodies, tool-definition digests.
//! - [`entry`]: log entries (leaves) and receipts.
//! - [`note`]: C2SP checkpoints and signed notes.
//! - [`cosignature`]: C2SP cosignatures (`cosignature/v1`) and the
//!   add-checkpoint request of the C2SP witness protocol.
//! - [`tree`]: RFC 9162 inclusion and consistency proof checking.
//! - [`pack`], [`report`]: packs, agent-keys.json, head.json, the report.
//! - [`limits`]: every numeric limit.
//! - [`display`]: the characters text output escapes, and their escape.
//!
//! It does no I/O: no files, no sockets. Time comes from an injected
//! [`time::Clock`]; the one direct read of the system clock is
//! [`time::UnixMillis::now`], for callers without one (the CLI). `cargo tree -p tally-schemas -e normal` shows no
//! tokio, axum or redb.

pub mod api;
pub mod audit;
pub mod batch;
pub mod batch_sig;
pub mod canonical;
pub mod cosignature;
pub mod disclosure;
pub mod display;
pub mod entry;
pub mod hash;
pub mod keys;
pub mod limits;
#[cfg(test)]
mod mutate;
pub mod note;
pub mod pack;
pub mod record;
pub mod report;
pub mod time;
pub mod tools;
pub mod tree;

pub use entry::{Entry, Receipt};
pub use hash::Hash;
pub use keys::{KeyError, KeyId, PublicKey, SecretKey, Signature, UnusableKey};
pub use note::{Checkpoint, NoteSigner, NoteVerifier};
pub use record::{AgentName, Body, Nonce, Record, RecordKind, Seq, UnsignedRecord};
pub use time::UnixMillis;
pub use tree::{LeafIndex, TreeSize};
