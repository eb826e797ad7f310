//! The one place the verifier checks an Ed25519 signature, docs/protocol.md
//! §3.1 and §4.3: strict verification, one signature at a time. Signatures
//! are spread over cores by running many single verifications in parallel,
//! never by batch verification, whose accept/reject set differs from strict
//! single verification on edge cases (mixed-order `R`). A key that signs
//! several records gets a table of its multiples
//! (`tally_schemas::batch_sig::PreparedKey`): the same strict equation and
//! checks, faster per signature; the tables are made once per verification
//! and shared by its workers ([`KeyTables`], [`PreparedKeys`]). The record's
//! signed message is hashed from its pieces in place
//! (`Record::signed_message_parts`). testdata/sigs/ holds the
//! edge-case corpus that pins this behaviour for both paths.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tally_schemas::batch_sig::{PreparedKey, PREPARE_MIN_SIGNATURES};
use tally_schemas::keys::{PublicKey, Signature};
use tally_schemas::Record;

/// Whether `sig` is a strictly valid signature of `message` by the key whose
/// 32-byte encoding is `public_key`. Bytes that are not a usable key (§4.3:
/// no point, a small-order point, a non-canonical encoding) are refused like
/// a bad signature.
#[must_use]
pub fn verify_message(public_key: &[u8; 32], message: &[u8], sig: &[u8; 64]) -> bool {
    PublicKey::from_bytes(public_key).is_ok_and(|key| {
        key.verify_raw(message, &Signature::from_bytes(*sig))
            .is_ok()
    })
}

/// Whether `record`'s signature verifies strictly with `key`
/// (`"tally/record/v1\n" ‖ JCS(record without sig)`).
#[must_use]
pub fn verify_record(record: &Record, key: &PublicKey) -> bool {
    key.verify_raw(&record.signed_message(), record.signature())
        .is_ok()
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

/// The prepared keys of one verification, shared by its worker threads:
/// a key is prepared once it has signed [`PREPARE_MIN_SIGNATURES`] records
/// (counted over all workers), by the worker that sees the last of them,
/// and at most [`MAX_PREPARED_KEYS`] keys are prepared (about 30 KiB each),
/// so memory is bounded whatever the pack. Each worker reads them through
/// its own [`PreparedKeys`].
#[derive(Default)]
pub struct KeyTables {
    state: Mutex<TablesState>,
}

#[derive(Default)]
struct TablesState {
    prepared: HashMap<[u8; 32], Arc<PreparedKey>>,
    /// Records seen per key not (yet) prepared; `usize::MAX` while a worker
    /// prepares it. Only keys of agent-keys.json are counted.
    seen: HashMap<[u8; 32], usize>,
}

/// Most keys one [`KeyTables`] prepares.
pub const MAX_PREPARED_KEYS: usize = 128;

impl KeyTables {
    /// Counts one more record signed by `key`; the key's table when it has
    /// one, or has just earned one (built outside the lock, so the other
    /// workers go on meanwhile).
    fn prepared(&self, key: &PublicKey) -> Option<Arc<PreparedKey>> {
        let id = key.to_bytes();
        {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(p) = state.prepared.get(&id) {
                return Some(Arc::clone(p));
            }
            if state.prepared.len() >= MAX_PREPARED_KEYS {
                return None;
            }
            let seen = state.seen.entry(id).or_insert(0);
            if *seen == usize::MAX {
                return None;
            }
            *seen += 1;
            if *seen < PREPARE_MIN_SIGNATURES {
                return None;
            }
            *seen = usize::MAX;
        }
        let p = Arc::new(PreparedKey::new(key));
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.seen.remove(&id);
        if state.prepared.len() < MAX_PREPARED_KEYS {
            state.prepared.insert(id, Arc::clone(&p));
        }
        Some(p)
    }
}

/// One worker's view of the [`KeyTables`]: the tables it has used, looked
/// up without the lock, and a buffer for the messages of keys that have
/// none.
#[derive(Default)]
pub struct PreparedKeys {
    tables: Arc<KeyTables>,
    local: HashMap<[u8; 32], Arc<PreparedKey>>,
    message: Vec<u8>,
}

impl PreparedKeys {
    /// A worker's view of `tables`, which other workers share.
    #[must_use]
    pub fn new(tables: Arc<KeyTables>) -> Self {
        Self {
            tables,
            local: HashMap::new(),
            message: Vec::new(),
        }
    }

    /// Whether `record`'s signature verifies strictly with `key`: exactly
    /// [`verify_record`]'s answer.
    pub fn verify_record(&mut self, record: &Record, key: &PublicKey) -> bool {
        let parts = record.signed_message_parts();
        let id = key.to_bytes();
        if let Some(p) = self.local.get(&id) {
            return p.verify_parts(&parts, record.signature()).is_ok();
        }
        if let Some(p) = self.tables.prepared(key) {
            let ok = p.verify_parts(&parts, record.signature()).is_ok();
            self.local.insert(id, p);
            return ok;
        }
        self.message.clear();
        for part in parts {
            self.message.extend_from_slice(part);
        }
        key.verify_raw(&self.message, record.signature()).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_schemas::SecretKey;

    fn key(n: u16) -> PublicKey {
        let mut seed = [7u8; 32];
        seed[..2].copy_from_slice(&n.to_le_bytes());
        SecretKey::from_seed(&seed).public_key()
    }

    #[test]
    fn a_key_is_prepared_once_for_all_workers_and_no_more_keys_than_the_bound() {
        let tables = KeyTables::default();
        let k = key(0);
        // The uses of every worker count: the last of them prepares it.
        for _ in 1..PREPARE_MIN_SIGNATURES {
            assert!(tables.prepared(&k).is_none());
        }
        let first = tables.prepared(&k).expect("prepared at the threshold");
        let again = tables.prepared(&k).expect("kept");
        assert!(Arc::ptr_eq(&first, &again), "prepared once, then shared");
        // Past the bound, keys are verified without a table.
        for n in 1..=u16::try_from(MAX_PREPARED_KEYS).unwrap() + 1 {
            let k = key(n);
            let got: Vec<bool> = (0..PREPARE_MIN_SIGNATURES)
                .map(|_| tables.prepared(&k).is_some())
                .collect();
            let prepared = usize::from(n) < MAX_PREPARED_KEYS;
            assert_eq!(got.last(), Some(&prepared), "key {n}");
            assert!(!got[..got.len() - 1].iter().any(|&g| g));
        }
        let state = tables.state.lock().unwrap();
        assert_eq!(state.prepared.len(), MAX_PREPARED_KEYS);
    }
}
