//! The one place the verifier checks an Ed25519 signature, docs/protocol.md
//! §3.1 and §4.3: strict verification, one signature at a time. Signatures
//! are spread over cores by running many single verifications in parallel,
//! never by batch verification, whose accept/reject set differs from strict
//! single verification on edge cases (mixed-order `R`). A key that signs
//! several records gets a table of its multiples
//! (`tally_schemas::batch_sig::PreparedKey`): the same strict equation and
//! checks, faster per signature ([`PreparedKeys`]). testdata/sigs/ holds the
//! edge-case corpus that pins this behaviour for both paths.

use std::collections::HashMap;

use tally_schemas::batch_sig::{PreparedKey, PREPARE_MIN_SIGNATURES};
use tally_schemas::keys::{PublicKey, Signature};
use tally_schemas::record::RECORD_SIGNATURE_DOMAIN;
use tally_schemas::Record;

/// Whether `sig` is a strictly valid signature of `message` by the key whose
/// 32-byte encoding is `public_key`. A key that does not decode to a point is
/// refused like a bad signature.
#[must_use]
pub fn verify_message(public_key: &[u8; 32], message: &[u8], sig: &[u8; 64]) -> bool {
    PublicKey::from_bytes(public_key).is_ok_and(|key| {
        key.verify_raw(message, &Signature::from_bytes(*sig))
            .is_ok()
    })
}

/// `"tally/record/v1\n" ‖ JCS(record without sig)`, the message a record
/// signs.
///
/// JCS sorts members, so the top-level `"sig"` member sits between `seq` and
/// `time`, and no body has a member named `sig`; inside JSON strings every
/// `"` is escaped, so the bytes `,"sig":"` occur only there. Cutting that
/// member out of the record's canonical bytes gives the canonical bytes
/// without it, without re-serialising the record. If the cut does not find
/// exactly the record's own signature, the bytes are re-serialised instead.
#[must_use]
pub fn record_message(record: &Record) -> Option<Vec<u8>> {
    const KEY: &[u8] = b",\"sig\":\"";
    let canonical = record.canonical_bytes();
    let sig = record.signature().to_base64();
    let spliced = canonical
        .windows(KEY.len())
        .position(|w| w == KEY)
        .and_then(|at| {
            let value_start = at + KEY.len();
            let value_end = value_start + sig.len();
            (canonical.get(value_start..value_end) == Some(sig.as_bytes())
                && canonical.get(value_end) == Some(&b'"'))
            .then_some((at, value_end + 1))
        });
    let mut message = Vec::with_capacity(RECORD_SIGNATURE_DOMAIN.len() + canonical.len());
    message.extend_from_slice(RECORD_SIGNATURE_DOMAIN);
    match spliced {
        Some((from, to)) => {
            message.extend_from_slice(&canonical[..from]);
            message.extend_from_slice(&canonical[to..]);
        }
        None => message.extend_from_slice(&record.unsigned().signing_bytes().ok()?),
    }
    Some(message)
}

/// Whether `record`'s signature verifies strictly with `key`
/// (`"tally/record/v1\n" ‖ JCS(record without sig)`).
#[must_use]
pub fn verify_record(record: &Record, key: &PublicKey) -> bool {
    record_message(record).is_some_and(|m| key.verify_raw(&m, record.signature()).is_ok())
}

/// Checks many signatures on `threads` cores (0: all), each one strictly and
/// on its own; the result for item `i` is exactly `verify_message` of item `i`.
#[must_use]
pub fn verify_many(items: &[([u8; 32], Vec<u8>, [u8; 64])], threads: usize) -> Vec<bool> {
    let threads = crate::pool::thread_count(threads).min(items.len().max(1));
    let chunk = items.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = items
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|(k, m, sg)| verify_message(k, m, sg))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    })
}

/// Keys prepared for fast strict verification, per worker thread: a key is
/// prepared once it has signed [`PREPARE_MIN_SIGNATURES`] records, at most
/// [`MAX_PREPARED_KEYS`] of them (about 30 KiB each), so memory is bounded
/// whatever the pack; other keys are verified with `verify_strict` directly.
#[derive(Default)]
pub struct PreparedKeys {
    prepared: HashMap<[u8; 32], PreparedKey>,
    seen: HashMap<[u8; 32], usize>,
}

/// Most keys one [`PreparedKeys`] prepares.
pub const MAX_PREPARED_KEYS: usize = 128;

impl PreparedKeys {
    /// Whether `record`'s signature verifies strictly with `key`: exactly
    /// [`verify_record`]'s answer.
    pub fn verify_record(&mut self, record: &Record, key: &PublicKey) -> bool {
        let id = key.to_bytes();
        if !self.prepared.contains_key(&id) {
            let seen = self.seen.entry(id).or_insert(0);
            *seen += 1;
            if *seen < PREPARE_MIN_SIGNATURES || self.prepared.len() >= MAX_PREPARED_KEYS {
                return verify_record(record, key);
            }
            self.seen.remove(&id);
            self.prepared.insert(id, PreparedKey::new(key));
        }
        let Some(prepared) = self.prepared.get(&id) else {
            return verify_record(record, key);
        };
        record_message(record).is_some_and(|m| prepared.verify_raw(&m, record.signature()).is_ok())
    }
}
