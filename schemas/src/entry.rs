//! Log entries (leaves) and receipts, docs/protocol.md §7–§8.
//!
//! An entry is the record as received plus what the witness adds: the log
//! index and the witness's receive time. Its canonical bytes are the leaf, so
//! a checkpoint commits to the nonce, the agent's time and the witness's time
//! of every record beneath it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::canonical::{self, CanonicalError, Limits};
use crate::hash::{leaf_hash, leaf_hash_of_parts, Hash};
use crate::limits::{MAX_ENTRY_BYTES, MAX_PROOF_HASHES};
use crate::note::{open_checkpoint, Checkpoint, NoteError, NoteVerifier};
use crate::record::{
    check_version, put_counter, put_hashes, put_hex, put_str, put_time, Cursor, Nonce, Record,
    RecordError,
};
use crate::time::UnixMillis;
use crate::tree::{verify_inclusion, LeafIndex, ProofError};

/// The entry format version.
pub const ENTRY_VERSION: u64 = 1;
/// The receipt format version.
pub const RECEIPT_VERSION: u64 = 1;

/// Why an entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// Not strict JSON.
    #[error(transparent)]
    Canonical(#[from] CanonicalError),
    /// A format version this build does not read.
    #[error(
        "entry format version {found} is not supported (this build reads version {ENTRY_VERSION})"
    )]
    UnsupportedVersion {
        /// The `v` field as written.
        found: String,
    },
    /// Fields missing, unknown or of the wrong type.
    #[error("entry does not match the v1 schema: {message}")]
    Schema {
        /// What is wrong.
        message: String,
    },
    /// The record inside is not valid.
    #[error("entry's record: {0}")]
    Record(#[from] RecordError),
    /// The canonical entry does not fit a C2SP entry bundle.
    #[error("entry is {size} bytes in canonical form, more than the limit of {max}")]
    TooLarge {
        /// Canonical size.
        size: usize,
        /// The limit.
        max: usize,
    },
}

#[derive(Serialize)]
struct EntryWire<'a> {
    v: u64,
    index: LeafIndex,
    received: UnixMillis,
    record: &'a Record,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryWireIn {
    #[allow(dead_code)] // checked before this struct is decoded
    v: u64,
    index: LeafIndex,
    received: UnixMillis,
    record: Value,
}

/// A log entry: `{"v":1,"index":…,"received":…,"record":{…}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    index: LeafIndex,
    received: UnixMillis,
    record: Record,
    canonical: Vec<u8>,
}

/// The leaf data of an entry, `JCS({"index","received","record","v":1})`
/// (§7.1): the one place these bytes are built. The members are written in
/// JCS order around the record's canonical bytes, without re-serialising the
/// record; a test holds this equal to the general canonicaliser. The size
/// bound (`MAX_ENTRY_BYTES`) is the caller's: [`Entry::new`] refuses a
/// larger entry, a verifier fails the proof of one.
#[must_use]
pub fn leaf_data(index: LeafIndex, received: UnixMillis, record: &Record) -> Vec<u8> {
    let head = entry_head(index, received);
    let record = record.canonical_bytes();
    let mut out = Vec::with_capacity(head.len() + record.len() + ENTRY_TAIL.len());
    out.extend_from_slice(&head);
    out.extend_from_slice(record);
    out.extend_from_slice(ENTRY_TAIL);
    out
}

/// The leaf hash of [`leaf_data`]`(index, received, record)` and that
/// entry's length in bytes, hashed from its three pieces in place instead
/// of copying the record into one buffer first.
#[must_use]
pub fn entry_leaf_hash(index: LeafIndex, received: UnixMillis, record: &Record) -> (Hash, usize) {
    let head = entry_head(index, received);
    let record = record.canonical_bytes();
    let hash = leaf_hash_of_parts(&[&head, record, ENTRY_TAIL]);
    (hash, head.len() + record.len() + ENTRY_TAIL.len())
}

/// The entry's members before the record, in JCS order. (A time outside
/// the wire range, which no parsed entry holds, is spelled as `Display`
/// spells it.)
fn entry_head(index: LeafIndex, received: UnixMillis) -> Vec<u8> {
    use std::io::Write as _;
    let mut head = Vec::with_capacity(80);
    head.extend_from_slice(b"{\"index\":");
    // Writing to a Vec cannot fail.
    let _ = write!(head, "{}", index.get());
    head.extend_from_slice(b",\"received\":\"");
    match received.rfc3339_bytes() {
        Ok(text) => head.extend_from_slice(&text),
        Err(_) => head.extend_from_slice(received.to_string().as_bytes()),
    }
    head.extend_from_slice(b"\",\"record\":");
    head
}

/// The entry's member after the record, and its end.
const ENTRY_TAIL: &[u8] = b",\"v\":1}";

impl Entry {
    /// Builds the entry the witness appends for `record`.
    ///
    /// # Errors
    /// [`EntryError::TooLarge`] when it would not fit an entry bundle.
    pub fn new(index: LeafIndex, received: UnixMillis, record: Record) -> Result<Self, EntryError> {
        let canonical = leaf_data(index, received, &record);
        if canonical.len() > MAX_ENTRY_BYTES {
            return Err(EntryError::TooLarge {
                size: canonical.len(),
                max: MAX_ENTRY_BYTES,
            });
        }
        Ok(Self {
            index,
            received,
            record,
            canonical,
        })
    }

    /// Parses an entry from bytes (a tile's entry bundle holds canonical ones).
    ///
    /// # Errors
    /// [`EntryError`] naming the first rule broken.
    pub fn from_json(bytes: &[u8]) -> Result<Self, EntryError> {
        Self::from_value(canonical::parse_strict(bytes, Limits::WIRE)?)
    }

    /// Parses an entry from a strictly parsed JSON value.
    ///
    /// # Errors
    /// [`EntryError`] naming the first rule broken.
    pub fn from_value(value: Value) -> Result<Self, EntryError> {
        check_version(&value, ENTRY_VERSION, |found| {
            EntryError::UnsupportedVersion { found }
        })
        .map_err(|e| e.unwrap_or_else(|message| EntryError::Schema { message }))?;
        let wire: EntryWireIn = serde_json::from_value(value).map_err(|e| EntryError::Schema {
            message: e.to_string(),
        })?;
        Self::new(wire.index, wire.received, Record::from_value(wire.record)?)
    }

    /// The log index.
    #[must_use]
    pub fn index(&self) -> LeafIndex {
        self.index
    }

    /// The witness's receive time.
    #[must_use]
    pub fn received(&self) -> UnixMillis {
        self.received
    }

    /// The record.
    #[must_use]
    pub fn record(&self) -> &Record {
        &self.record
    }

    /// The canonical bytes: the leaf data.
    #[must_use]
    pub fn canonical_bytes(&self) -> &[u8] {
        &self.canonical
    }

    /// `SHA-256(0x00 ‖ canonical bytes)`.
    #[must_use]
    pub fn leaf_hash(&self) -> Hash {
        leaf_hash(&self.canonical)
    }
}

impl Serialize for Entry {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        EntryWire {
            v: ENTRY_VERSION,
            index: self.index,
            received: self.received,
            record: &self.record,
        }
        .serialize(s)
    }
}

/// What the witness returns for an admitted record: proof that the record's
/// entry is in a checkpoint signed after the entry was durably committed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Receipt {
    /// Format version, 1.
    pub v: u64,
    /// The record hash this receipt is for.
    pub record_hash: Hash,
    /// The record's nonce, echoed.
    pub nonce: Nonce,
    /// The entry's log index.
    pub index: LeafIndex,
    /// The witness's receive time, as written in the entry.
    pub received: UnixMillis,
    /// The signed checkpoint note the entry is proven in.
    pub checkpoint: String,
    /// RFC 9162 inclusion proof of the entry in that checkpoint.
    pub inclusion: Vec<Hash>,
}

/// Why a receipt was not accepted for a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReceiptError {
    /// A format version this build does not read.
    #[error("receipt format version {found} is not supported (this build reads version {RECEIPT_VERSION})")]
    UnsupportedVersion {
        /// The version.
        found: u64,
    },
    /// The receipt names another record.
    #[error("receipt is for record {receipt}, not {record}")]
    RecordMismatch {
        /// Hash named by the receipt.
        receipt: Hash,
        /// Hash of the record.
        record: Hash,
    },
    /// The receipt echoes another nonce.
    #[error("receipt echoes nonce {receipt}, the record's is {record}")]
    NonceMismatch {
        /// Nonce in the receipt.
        receipt: Nonce,
        /// Nonce of the record.
        record: Nonce,
    },
    /// The checkpoint does not verify with the trusted log key.
    #[error("receipt checkpoint: {0}")]
    Checkpoint(#[from] NoteError),
    /// The proof has more hashes than any tree needs.
    #[error("inclusion proof has {0} hashes, more than {MAX_PROOF_HASHES}")]
    ProofTooLong(usize),
    /// The entry is not proven in the checkpoint.
    #[error("inclusion proof: {0}")]
    Inclusion(#[from] ProofError),
    /// The entry cannot be rebuilt.
    #[error("entry: {0}")]
    Entry(#[from] EntryError),
}

/// Why receipt bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReceiptParseError {
    /// Not strict JSON.
    #[error(transparent)]
    Canonical(#[from] CanonicalError),
    /// A format version this build does not read.
    #[error("receipt format version {found} is not supported (this build reads version {RECEIPT_VERSION})")]
    UnsupportedVersion {
        /// The `v` field as written.
        found: String,
    },
    /// Fields missing, unknown or of the wrong type.
    #[error("receipt does not match the v1 schema: {message}")]
    Schema {
        /// What is wrong.
        message: String,
    },
}

impl Receipt {
    /// The receipt's RFC 8785 canonical bytes, what the witness answers
    /// with (docs/protocol.md §8). Written straight from the fields, members
    /// in JCS order (a test holds it byte-equal to the general
    /// canonicaliser); a receipt that writer cannot hold (a counter beyond
    /// 2^53 − 1, a time out of the wire range) goes through
    /// [`canonical::canonicalize`] for its error.
    ///
    /// # Errors
    /// As [`canonical::canonicalize`].
    pub fn to_canonical_json(&self) -> Result<Vec<u8>, CanonicalError> {
        // The note, the proof's hashes (66 bytes each with quotes and
        // comma) and about 200 bytes of other members.
        let mut out = Vec::with_capacity(self.checkpoint.len() + 66 * self.inclusion.len() + 256);
        match self.write_canonical(&mut out) {
            Some(()) => Ok(out),
            None => canonical::canonicalize(self),
        }
    }

    fn write_canonical(&self, out: &mut Vec<u8>) -> Option<()> {
        out.extend_from_slice(b"{\"checkpoint\":");
        put_str(out, &self.checkpoint);
        out.extend_from_slice(b",\"inclusion\":");
        put_hashes(out, &self.inclusion);
        out.extend_from_slice(b",\"index\":");
        put_counter(out, self.index.get())?;
        out.extend_from_slice(b",\"nonce\":");
        put_hex(out, self.nonce.as_bytes());
        out.extend_from_slice(b",\"received\":");
        put_time(out, self.received)?;
        out.extend_from_slice(b",\"record_hash\":");
        put_hex(out, self.record_hash.as_bytes());
        out.extend_from_slice(b",\"v\":");
        put_counter(out, self.v)?;
        out.push(b'}');
        Some(())
    }

    /// Reads a receipt in the one canonical layout [`Receipt::to_canonical_json`]
    /// writes, at `cursor`; accepted only when writing it back gives the
    /// bytes read (so they are canonical JSON of a v1-shaped receipt).
    /// `None` at anything else, which the caller hands to the strict road.
    pub(crate) fn read_canonical(cursor: &mut Cursor<'_>) -> Option<Self> {
        let start = cursor.position();
        cursor.expect(b"{\"checkpoint\":")?;
        let checkpoint = cursor.string()?.into_owned();
        cursor.expect(b",\"inclusion\":[")?;
        let inclusion = cursor.hash_list()?;
        cursor.expect(b",\"index\":")?;
        let index = LeafIndex::new(cursor.counter()?);
        cursor.expect(b",\"nonce\":")?;
        let nonce = cursor.nonce()?;
        cursor.expect(b",\"received\":")?;
        let received = cursor.time()?;
        cursor.expect(b",\"record_hash\":")?;
        let record_hash = cursor.hash()?;
        cursor.expect(b",\"v\":")?;
        let v = cursor.counter()?;
        cursor.expect(b"}")?;
        let receipt = Self {
            v,
            record_hash,
            nonce,
            index,
            received,
            checkpoint,
            inclusion,
        };
        let read = cursor.since(start);
        let mut written = Vec::with_capacity(read.len());
        receipt.write_canonical(&mut written)?;
        (written == read).then_some(receipt)
    }

    /// Decodes a receipt (strict JSON, v1 schema). Decoding proves nothing:
    /// call [`Receipt::verify`].
    ///
    /// # Errors
    /// [`ReceiptParseError`] naming the first rule broken.
    pub fn from_json(bytes: &[u8]) -> Result<Self, ReceiptParseError> {
        let value = canonical::parse_strict(bytes, Limits::WIRE)?;
        check_version(&value, RECEIPT_VERSION, |found| {
            ReceiptParseError::UnsupportedVersion { found }
        })
        .map_err(|e| e.unwrap_or_else(|message| ReceiptParseError::Schema { message }))?;
        serde_json::from_value(value).map_err(|e| ReceiptParseError::Schema {
            message: e.to_string(),
        })
    }

    /// Checks this receipt for `record` under the trusted log key: the
    /// receipt names the record's hash and nonce, the checkpoint is signed by
    /// `log_key`, and the rebuilt entry is proven in it.
    ///
    /// Freshness (witness time against the local clock) and key retirement
    /// are the caller's policy, so they are not checked here.
    ///
    /// # Errors
    /// [`ReceiptError`] saying which binding failed.
    pub fn verify(
        &self,
        record: &Record,
        log_key: &NoteVerifier,
    ) -> Result<(Checkpoint, Entry), ReceiptError> {
        self.check_binding(record)?;
        let checkpoint = open_checkpoint(&self.checkpoint, log_key)?;
        let entry = self.prove(record, &checkpoint)?;
        Ok((checkpoint, entry))
    }

    /// [`Self::verify`] with this receipt's checkpoint note already opened
    /// under the trusted log key: `checkpoint` must be what
    /// `open_checkpoint(&self.checkpoint, log_key)` returned, so that
    /// receipts answered under one checkpoint have its signature checked
    /// once.
    ///
    /// # Errors
    /// [`ReceiptError`] saying which binding failed.
    pub fn verify_opened(
        &self,
        record: &Record,
        checkpoint: &Checkpoint,
    ) -> Result<Entry, ReceiptError> {
        self.check_binding(record)?;
        self.prove(record, checkpoint)
    }

    /// The receipt names `record` (hash and nonce), in a version and with a
    /// proof length this code reads.
    fn check_binding(&self, record: &Record) -> Result<(), ReceiptError> {
        if self.v != RECEIPT_VERSION {
            return Err(ReceiptError::UnsupportedVersion { found: self.v });
        }
        if self.record_hash != record.hash() {
            return Err(ReceiptError::RecordMismatch {
                receipt: self.record_hash,
                record: record.hash(),
            });
        }
        if self.nonce != record.nonce {
            return Err(ReceiptError::NonceMismatch {
                receipt: self.nonce.clone(),
                record: record.nonce.clone(),
            });
        }
        if self.inclusion.len() > MAX_PROOF_HASHES {
            return Err(ReceiptError::ProofTooLong(self.inclusion.len()));
        }
        Ok(())
    }

    /// The entry the witness made of `record`, proven in `checkpoint`.
    fn prove(&self, record: &Record, checkpoint: &Checkpoint) -> Result<Entry, ReceiptError> {
        let entry = Entry::new(self.index, self.received, record.clone())?;
        verify_inclusion(
            self.index,
            checkpoint.size,
            &entry.leaf_hash(),
            &self.inclusion,
            &checkpoint.root,
        )?;
        Ok(entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::SecretKey;
    use crate::record::{AgentName, Body, NoteBody, Seq, UnsignedRecord};

    #[test]
    fn a_receipt_is_written_as_the_general_canonicaliser_writes_it() {
        let every_ascii: String = (0u8..0x80).map(char::from).collect();
        let notes = [
            "example.org/log\n3\nAAAA\n\n\u{2014} example.org/log abc=\n".to_owned(),
            String::new(),
            format!("{every_ascii}\u{e9}\u{2028}\u{1F600}\u{FEFF}"),
        ];
        for (n, note) in notes.into_iter().enumerate() {
            for (index, received, proof) in [
                (0u64, 0i64, 0usize),
                (5, 1_796_025_600_123, 3),
                (9_007_199_254_740_991, 253_402_300_799_999, 63),
            ] {
                let receipt = Receipt {
                    v: RECEIPT_VERSION,
                    record_hash: Hash::sha256(&[n as u8]),
                    nonce: Nonce::from_bytes(vec![0xa5; 16 + n]).unwrap(),
                    index: LeafIndex::new(index),
                    received: UnixMillis::new(received),
                    checkpoint: note.clone(),
                    inclusion: (0..proof).map(|i| Hash::sha256(&[i as u8])).collect(),
                };
                assert_eq!(
                    receipt.to_canonical_json().unwrap(),
                    canonical::canonicalize(&receipt).unwrap(),
                    "{receipt:?}"
                );
            }
        }
        // What the writer cannot hold gets the general canonicaliser's error.
        let mut bad = Receipt {
            v: RECEIPT_VERSION,
            record_hash: Hash::sha256(b"r"),
            nonce: Nonce::from_bytes(vec![1; 16]).unwrap(),
            index: LeafIndex::new(9_007_199_254_740_992),
            received: UnixMillis::new(0),
            checkpoint: String::new(),
            inclusion: Vec::new(),
        };
        assert!(canonical::canonicalize(&bad).is_err());
        assert_eq!(bad.to_canonical_json(), canonical::canonicalize(&bad));
        bad.index = LeafIndex::new(1);
        bad.received = UnixMillis::new(-1);
        assert!(canonical::canonicalize(&bad).is_err());
        assert_eq!(bad.to_canonical_json(), canonical::canonicalize(&bad));
    }

    #[test]
    fn leaf_data_is_the_general_canonicaliser_of_the_entry() {
        let key = SecretKey::from_seed(&[9; 32]);
        for (seq, text) in [(0u64, "plain"), (1, "\"quoted\" \u{e9}\n\ttab \u{1F600}")] {
            let record = UnsignedRecord {
                agent: AgentName::new("a-1").unwrap(),
                key_id: key.public_key().key_id(),
                seq: Seq::new(seq).unwrap(),
                prev: (seq > 0).then(|| Hash::sha256(b"p")),
                time: UnixMillis::new(1_796_025_600_123),
                nonce: Nonce::from_bytes(vec![7; 16]).unwrap(),
                body: Body::Note(NoteBody { text: text.into() }),
            }
            .sign(&key)
            .unwrap();
            for (index, received) in [(0u64, 0i64), (9_007_199_254_740_991, 253_402_300_799_999)] {
                let general = canonical::canonicalize(&EntryWire {
                    v: ENTRY_VERSION,
                    index: LeafIndex::new(index),
                    received: UnixMillis::new(received),
                    record: &record,
                })
                .unwrap();
                let (index, received) = (LeafIndex::new(index), UnixMillis::new(received));
                assert_eq!(leaf_data(index, received, &record), general);
                assert_eq!(
                    entry_leaf_hash(index, received, &record),
                    (leaf_hash(&general), general.len())
                );
            }
        }
    }
}
