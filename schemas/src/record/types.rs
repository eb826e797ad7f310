//! The record's types, [`UnsignedRecord`] and [`Record`], without their
//! behaviour (in `record`'s mod.rs): the reader and the writer (`fast.rs`,
//! `write.rs`) depend on these and not on mod.rs.

use std::ops::Deref;

use crate::hash::Hash;
use crate::keys::{KeyId, Signature};
use crate::time::UnixMillis;

use super::body::Body;
use super::fields::{AgentName, Nonce, Seq};

/// Everything in a record except its signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsignedRecord {
    /// The agent (chain) name.
    pub agent: AgentName,
    /// Id of the key that signs the record.
    pub key_id: KeyId,
    /// Position in the agent's chain.
    pub seq: Seq,
    /// Record hash of the previous record in the chain; `None` only at seq 0.
    pub prev: Option<Hash>,
    /// The agent's clock when it made the record.
    pub time: UnixMillis,
    /// Fresh random bytes.
    pub nonce: Nonce,
    /// The kind-specific body.
    pub body: Body,
}

/// A structurally valid, signed record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub(super) unsigned: UnsignedRecord,
    pub(super) sig: Signature,
    pub(super) canonical: Vec<u8>,
    /// Where the `,"sig":"…"` member is in `canonical`
    /// ([`Record::signed_message_parts`]).
    pub(super) sig_member: std::ops::Range<usize>,
    pub(super) hash: Hash,
}

impl Deref for Record {
    type Target = UnsignedRecord;
    fn deref(&self) -> &UnsignedRecord {
        &self.unsigned
    }
}
