//! Strict Ed25519 verification of many signatures at once, docs/protocol.md
//! §4.3: the same accept/reject set as [`PublicKey::verify_raw`]
//! (ed25519-dalek `verify_strict`), faster when one key signs many messages.
//!
//! # Why not ed25519-dalek's batch verification
//! Batch verification checks one random linear combination
//! `Σ zᵢ([sᵢ]B − Rᵢ − [kᵢ]Aᵢ) = 0` of the signatures' equations. When `Rᵢ`
//! carries a small torsion component `T` (a mixed-order `R`, which is not
//! small order and so passes every encoding and small-order check that
//! `verify_strict` makes before its equation), the combination cancels `T`
//! whenever `zᵢ` is a multiple of its order: with probability 1/2 for an
//! order-2 `T`, and ed25519-dalek derives `zᵢ` from the inputs, so the
//! signer can simply retry until it does. `verify_strict` refuses such a
//! signature (its equation is exact, `R = [s]B − [k]A`), so batch verification
//! can accept what strict verification refuses. Excluding mixed-order `R`
//! up front costs a scalar multiplication per signature, about what batching
//! saves. `tests/it/batch_sig.rs` builds such signatures and shows both.
//!
//! # What this does instead
//! It computes the strict equation itself, for each signature, exactly as
//! `verify_strict` does, but with `[k]A` taken from a table precomputed once
//! per key ([`PreparedKey`], radix-16 like the base point's own table):
//! 1. `S` must be canonical (`S < ℓ`);
//! 2. `A` must not be of small order (checked once, when the key is prepared);
//! 3. `k = SHA-512(R ‖ A ‖ M) mod ℓ`, over the bytes of `R` and `A` as given;
//! 4. `R' = [S]B − [k]A`, and the encoding of `R'` must equal the 32 bytes of
//!    `R` (so `R` is canonical and decodes to `R'`);
//! 5. `R'` must not be of small order (what `verify_strict` checks on the
//!    decoded `R`, which is `R'`).
//!
//! This is the same test as `verify_strict`, step for step, with the same
//! arithmetic results; only the way `[k]A` is multiplied differs. Two
//! fixed-base multiplications (about 64 point additions each, no doublings)
//! replace one double-scalar multiplication (about 250 doublings), and `R`
//! is never decompressed. A prepared key verifies about 1.3–1.7 times as
//! fast as `verify_strict`, but preparing it (256 table points, each
//! normalised with a field inversion) costs about 20 verifications and
//! 30 KiB: it pays for itself only after some 45–90 signatures
//! (`examples/sig_rate.rs` prints the figures), so a key is prepared only
//! once it signs [`PREPARE_MIN_SIGNATURES`] messages. The edge-case corpus (testdata/sigs/), mixed-order
//! and small-order cases and random mutations are checked against
//! `verify_strict` in `tests/it/batch_sig.rs`.

use std::collections::HashMap;

use curve25519_dalek::edwards::{CompressedEdwardsY, EdwardsBasepointTable, EdwardsPoint};
use curve25519_dalek::scalar::Scalar;
use curve25519_dalek::traits::BasepointTable as _;
use sha2::{Digest, Sha512};

use crate::keys::{BadSignature, PublicKey, Signature};

/// A public key with a table of multiples of `−A`, for verifying many
/// signatures by it. About 30 KiB.
#[derive(Clone)]
pub struct PreparedKey {
    key: PublicKey,
    /// `A` is of small order: `verify_strict` refuses every signature.
    weak: bool,
    minus_a: Box<EdwardsBasepointTable>,
}

impl std::fmt::Debug for PreparedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedKey")
            .field("key", &self.key)
            .field("weak", &self.weak)
            .finish_non_exhaustive()
    }
}

impl PreparedKey {
    /// Precomputes the table for `key` (about the cost of 20 verifications:
    /// see the module docs).
    #[must_use]
    pub fn new(key: &PublicKey) -> Self {
        let point = EdwardsPoint::from(*key.as_dalek());
        Self {
            key: *key,
            weak: point.is_small_order(),
            minus_a: Box::new(EdwardsBasepointTable::create(&-point)),
        }
    }

    /// The key.
    #[must_use]
    pub fn public_key(&self) -> &PublicKey {
        &self.key
    }

    /// Strict verification of `signature` over `signed`: exactly what
    /// [`PublicKey::verify_raw`] answers (see the module docs).
    ///
    /// # Errors
    /// [`BadSignature`] when `verify_strict` would refuse it.
    pub fn verify_raw(&self, signed: &[u8], signature: &Signature) -> Result<(), BadSignature> {
        self.verify_parts(&[signed], signature)
    }

    /// [`PreparedKey::verify_raw`] over the pieces of `signed` read end to
    /// end (as [`crate::Record::signed_message_parts`] gives them), which
    /// are hashed in place instead of copied into one message first.
    ///
    /// # Errors
    /// [`BadSignature`] when `verify_strict` would refuse the joined message.
    pub fn verify_parts(
        &self,
        signed: &[&[u8]],
        signature: &Signature,
    ) -> Result<(), BadSignature> {
        let bytes = signature.as_bytes();
        let mut r_bytes = [0u8; 32];
        r_bytes.copy_from_slice(&bytes[..32]);
        let mut s_bytes = [0u8; 32];
        s_bytes.copy_from_slice(&bytes[32..]);
        let s: Option<Scalar> = Scalar::from_canonical_bytes(s_bytes).into();
        let Some(s) = s else {
            return Err(BadSignature);
        };
        if self.weak {
            return Err(BadSignature);
        }
        let mut h = Sha512::new();
        h.update(r_bytes);
        h.update(self.key.as_dalek().as_bytes());
        for part in signed {
            h.update(part);
        }
        let k = Scalar::from_bytes_mod_order_wide(&h.finalize().into());
        let expected = EdwardsPoint::mul_base(&s) + self.minus_a.mul_base(&k);
        if expected.compress() != CompressedEdwardsY(r_bytes) || expected.is_small_order() {
            return Err(BadSignature);
        }
        Ok(())
    }

    /// [`PreparedKey::verify_raw`] over `domain ‖ message`, as [`PublicKey::verify`].
    ///
    /// # Errors
    /// [`BadSignature`] when `verify_strict` would refuse it.
    pub fn verify(
        &self,
        domain: &[u8],
        message: &[u8],
        signature: &Signature,
    ) -> Result<(), BadSignature> {
        let mut signed = Vec::with_capacity(domain.len() + message.len());
        signed.extend_from_slice(domain);
        signed.extend_from_slice(message);
        self.verify_raw(&signed, signature)
    }
}

/// One signature to check: `signature` by `key` over `signed` (the domain
/// and message already joined, as [`PublicKey::verify_raw`] takes them).
#[derive(Debug, Clone, Copy)]
pub struct SignedMessage<'a> {
    /// The signer's key.
    pub key: &'a PublicKey,
    /// The exact bytes signed.
    pub signed: &'a [u8],
    /// The signature.
    pub signature: &'a Signature,
}

/// A key signing at least this many messages of a [`verify_batch`] call is
/// prepared; below it, preparing costs more than it saves. The break-even
/// measured by `examples/sig_rate.rs` on the 2-core machine of
/// docs/benchmarks.md was 45–90 signatures (a lower threshold made batches
/// with a few records per key several times slower: docs/benchmarks.md,
/// "Batches").
pub const PREPARE_MIN_SIGNATURES: usize = 64;

/// Checks every signature strictly; item `i` of the answer is exactly
/// `items[i].key.verify_raw(items[i].signed, items[i].signature).is_ok()`.
/// Keys that sign at least [`PREPARE_MIN_SIGNATURES`] of the items are
/// prepared once ([`PreparedKey`]); the others are verified one at a time.
/// Runs on the calling thread.
#[must_use]
pub fn verify_batch(items: &[SignedMessage<'_>]) -> Vec<bool> {
    let mut uses: HashMap<[u8; 32], usize> = HashMap::new();
    for item in items {
        *uses.entry(item.key.to_bytes()).or_default() += 1;
    }
    let mut prepared: HashMap<[u8; 32], PreparedKey> = HashMap::new();
    items
        .iter()
        .map(|item| {
            let id = item.key.to_bytes();
            if uses.get(&id).copied().unwrap_or(0) >= PREPARE_MIN_SIGNATURES {
                prepared
                    .entry(id)
                    .or_insert_with(|| PreparedKey::new(item.key))
                    .verify_raw(item.signed, item.signature)
                    .is_ok()
            } else {
                item.key.verify_raw(item.signed, item.signature).is_ok()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::SecretKey;

    #[test]
    fn a_prepared_key_accepts_what_it_signed_and_nothing_else() {
        let k = SecretKey::from_seed(&[9u8; 32]);
        let p = PreparedKey::new(&k.public_key());
        for n in 0..20u8 {
            let msg = vec![n; usize::from(n) * 7];
            let sig = k.sign_raw(&msg);
            assert!(p.verify_raw(&msg, &sig).is_ok());
            let mut other = msg.clone();
            other.push(1);
            assert!(p.verify_raw(&other, &sig).is_err());
        }
        // In pieces, split anywhere, the same answers.
        let msg = b"pieces of one message".to_vec();
        let sig = k.sign_raw(&msg);
        for cut in 0..=msg.len() {
            let (a, b) = msg.split_at(cut);
            assert!(p.verify_parts(&[a, b], &sig).is_ok());
            assert!(p.verify_parts(&[b, a], &sig).is_err() || a.is_empty() || b.is_empty());
            assert!(p.verify_parts(&[a, b, b"x"], &sig).is_err());
        }
        let sig = k.sign(b"d\n", b"m");
        assert!(p.verify(b"d\n", b"m", &sig).is_ok());
        assert!(p.verify(b"e\n", b"m", &sig).is_err());
    }
}
