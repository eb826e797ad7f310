//! Prepared keys kept across requests, for the admission path's strict
//! signature checks (docs/protocol.md §4.3).
//!
//! A [`PreparedKey`] answers exactly what `verify_strict` answers, faster
//! per signature, but preparing it costs about as much as
//! [`PREPARE_MIN_SIGNATURES`] verifications' worth of savings (measured
//! with `schemas/examples/sig_rate.rs`). An agent posts the same key for
//! many records over many requests, so the witness keeps the tables of its
//! busiest keys: a key is prepared once it has signed
//! [`PREPARE_MIN_SIGNATURES`] checked records, whichever requests they came
//! in, and at most [`MAX_PREPARED_KEYS`] keys are kept (about 30 KiB each),
//! so memory is bounded whatever the agents. Every other key is checked
//! with `verify_strict` itself. Either way the answer is the same.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tally_schemas::batch_sig::{PreparedKey, PREPARE_MIN_SIGNATURES};
use tally_schemas::{PublicKey, Signature};

/// Most keys the witness keeps prepared (about 30 KiB each: 15 MiB).
pub(crate) const MAX_PREPARED_KEYS: usize = 512;

/// Most keys whose uses are counted before the counts start over, so the
/// counts are bounded too.
const MAX_COUNTED_KEYS: usize = 65_536;

#[derive(Default)]
struct Inner {
    prepared: HashMap<[u8; 32], Arc<PreparedKey>>,
    uses: HashMap<[u8; 32], usize>,
}

/// The witness's prepared keys (see the module docs).
#[derive(Default)]
pub(crate) struct PreparedKeys {
    inner: Mutex<Inner>,
}

impl PreparedKeys {
    /// Whether `signature` over `signed` by `key` verifies strictly: exactly
    /// `key.verify_raw(signed, signature).is_ok()`.
    pub(crate) fn verify(&self, key: &PublicKey, signed: &[u8], signature: &Signature) -> bool {
        match self.prepared(key) {
            Some(p) => p.verify_raw(signed, signature).is_ok(),
            None => key.verify_raw(signed, signature).is_ok(),
        }
    }

    /// The key's table, if it has one or has now earned one. The table is
    /// built outside the lock.
    fn prepared(&self, key: &PublicKey) -> Option<Arc<PreparedKey>> {
        let id = key.to_bytes();
        {
            let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(p) = inner.prepared.get(&id) {
                return Some(Arc::clone(p));
            }
            if inner.prepared.len() >= MAX_PREPARED_KEYS {
                return None;
            }
            if inner.uses.len() >= MAX_COUNTED_KEYS && !inner.uses.contains_key(&id) {
                inner.uses.clear();
            }
            let uses = inner.uses.entry(id).or_insert(0);
            *uses += 1;
            if *uses < PREPARE_MIN_SIGNATURES {
                return None;
            }
            inner.uses.remove(&id);
        }
        let p = Arc::new(PreparedKey::new(key));
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if inner.prepared.len() >= MAX_PREPARED_KEYS {
            return Some(p);
        }
        Some(Arc::clone(inner.prepared.entry(id).or_insert(p)))
    }

    /// How many keys are prepared now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .prepared
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_schemas::SecretKey;

    #[test]
    fn answers_as_verify_strict_before_and_after_a_key_is_prepared() {
        let cache = PreparedKeys::default();
        let k = SecretKey::from_seed(&[5u8; 32]);
        let public = k.public_key();
        for n in 0..(PREPARE_MIN_SIGNATURES + 8) {
            let msg = format!("message {n}").into_bytes();
            let sig = k.sign_raw(&msg);
            assert!(cache.verify(&public, &msg, &sig), "good signature {n}");
            let mut other = msg.clone();
            other.push(b'!');
            assert!(!cache.verify(&public, &other, &sig), "wrong message {n}");
        }
        assert_eq!(cache.len(), 1, "the key earned a table");
    }

    #[test]
    fn keeps_at_most_the_bound_and_still_answers() {
        let cache = PreparedKeys::default();
        for i in 0..(MAX_PREPARED_KEYS + 2) {
            let mut seed = [0u8; 32];
            seed[..8].copy_from_slice(&(i as u64).to_le_bytes());
            let k = SecretKey::from_seed(&seed);
            let public = k.public_key();
            // Count the key up to its table without paying for signatures.
            {
                let mut inner = cache.inner.lock().unwrap();
                inner
                    .uses
                    .insert(public.to_bytes(), PREPARE_MIN_SIGNATURES - 1);
            }
            let sig = k.sign_raw(b"m");
            assert!(cache.verify(&public, b"m", &sig));
            assert!(!cache.verify(&public, b"n", &sig));
        }
        assert_eq!(cache.len(), MAX_PREPARED_KEYS);
    }
}
