//! The one place the verifier checks an Ed25519 signature, docs/protocol.md
//! §3.1 and §4.3: strict verification, one signature at a time. Signatures
//! are spread over cores by running many single verifications in parallel,
//! never by batch verification, whose accept/reject set differs from strict
//! single verification on edge cases (mixed-order `R`). A record's signature
//! is checked by `tally_schemas::batch_sig::PreparedKey`: `verify_strict`'s
//! equation and checks without its decompression of `R`, over the record's
//! signed message hashed from its pieces in place
//! (`Record::signed_message_parts`). testdata/sigs/ holds the edge-case
//! corpus that pins this behaviour.

use tally_schemas::batch_sig::PreparedKey;
use tally_schemas::keys::PublicKey;
use tally_schemas::Record;

/// Whether `sig` is a strictly valid signature of `message` by the key whose
/// 32-byte encoding is `public_key`. Bytes that are not a usable key (§4.3:
/// no point, a small-order point, a non-canonical encoding) are refused like
/// a bad signature. Tests only (feature `testing`): they hold it to the
/// edge-case corpus beside [`verify_record`].
#[cfg(any(test, feature = "testing"))]
#[must_use]
pub fn verify_message(public_key: &[u8; 32], message: &[u8], sig: &[u8; 64]) -> bool {
    PublicKey::from_bytes(public_key).is_ok_and(|key| {
        key.verify_raw(message, &tally_schemas::keys::Signature::from_bytes(*sig))
            .is_ok()
    })
}

/// Whether `record`'s signature verifies strictly with `key`
/// (`"tally/record/v1\n" ‖ JCS(record without sig)`): exactly
/// `key.verify_raw(&record.signed_message(), record.signature()).is_ok()`.
#[must_use]
pub fn verify_record(record: &Record, key: &PublicKey) -> bool {
    PreparedKey::new(key).verify_record(record)
}

/// Checks many signatures on `threads` cores (0: all), each one strictly and
/// on its own; the result for item `i` is exactly `verify_message` of item `i`.
/// Tests only (feature `testing`): the verifier spreads its checks over
/// cores in its pipeline (`pool`).
#[cfg(any(test, feature = "testing"))]
#[must_use]
pub fn verify_many(items: &[([u8; 32], Vec<u8>, [u8; 64])], threads: usize) -> Vec<bool> {
    let threads = crate::threads::thread_count(threads).min(items.len().max(1));
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
