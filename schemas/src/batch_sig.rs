//! Strict Ed25519 verification of many signatures, docs/protocol.md §4.3:
//! the same accept/reject set as [`PublicKey::verify_raw`] (ed25519-dalek
//! `verify_strict`), one signature at a time, a little faster per signature.
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
//! It computes each signature's own strict equation, exactly as
//! `verify_strict` does, with one decompression fewer:
//! 1. `S` must be canonical (`S < ℓ`);
//! 2. `A` must not be of small order (checked once, when the key is
//!    prepared, with `−A` kept decoded);
//! 3. `k = SHA-512(R ‖ A ‖ M) mod ℓ`, over the bytes of `R` and `A` as given;
//! 4. `R' = [S]B − [k]A`, computed as `verify_strict` computes it
//!    (`EdwardsPoint::vartime_double_scalar_mul_basepoint`), and the encoding
//!    of `R'` must equal the 32 bytes of `R`;
//! 5. `R'` must not be of small order.
//!
//! `verify_strict` also decompresses `R` first and refuses an `R` that does
//! not decompress or is of small order. Both are implied here: the encoding
//! of a point is canonical and decompresses to that point, so when `R`'s
//! bytes are `R'`'s encoding, `R` decompresses to `R'`, whose order step 5
//! checks. Skipping that decompression (a square root, about the cost of the
//! field inversion in step 4's encoding) makes a prepared key about 1.2
//! times as fast per signature as `verify_strict`, and preparing a key costs
//! next to nothing (a small-order test), so every key is prepared.
//! (`examples/sig_rate.rs` prints the figures.) An earlier version kept a
//! table of multiples of `−A` per key, radix 16 like the base point's: a
//! little slower per signature on AVX2 arithmetic (1.06–1.09 times
//! `verify_strict` beside 1.16–1.17 for this path, docs/benchmarks.md), and
//! 30 KiB and about 1.3 ms to build per key, so it paid off only after some
//! 45–90 signatures by one key. The edge-case
//! corpus (testdata/sigs/), mixed-order and small-order cases and random
//! mutations are checked against `verify_strict` in `tests/it/batch_sig.rs`.

use curve25519_dalek::edwards::{CompressedEdwardsY, EdwardsPoint};
use curve25519_dalek::scalar::Scalar;
use sha2::{Digest, Sha512};

use crate::keys::{BadSignature, PublicKey, Signature};

/// A public key decoded for the strict equation: `−A`, and whether `A` is
/// of small order. About 200 bytes.
#[derive(Clone, Copy)]
pub struct PreparedKey {
    key: PublicKey,
    /// `A` is of small order: `verify_strict` refuses every signature.
    weak: bool,
    minus_a: EdwardsPoint,
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
    /// Prepares `key` (a small-order test: about a fiftieth of a
    /// verification).
    #[must_use]
    pub fn new(key: &PublicKey) -> Self {
        let point = EdwardsPoint::from(*key.as_dalek());
        Self {
            key: *key,
            weak: point.is_small_order(),
            minus_a: -point,
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
        let expected = EdwardsPoint::vartime_double_scalar_mul_basepoint(&k, &self.minus_a, &s);
        if expected.compress() != CompressedEdwardsY(r_bytes) || expected.is_small_order() {
            return Err(BadSignature);
        }
        Ok(())
    }

    /// Whether `record`'s signature verifies strictly with this key: exactly
    /// `key.verify_raw(&record.signed_message(), record.signature()).is_ok()`,
    /// over the message's pieces where they lie
    /// ([`crate::Record::signed_message_parts`]).
    #[must_use]
    pub fn verify_record(&self, record: &crate::Record) -> bool {
        self.verify_parts(&record.signed_message_parts(), record.signature())
            .is_ok()
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

    #[test]
    fn a_record_is_answered_as_verify_strict_answers_it() {
        use crate::record::NoteBody;
        use crate::{AgentName, Body, Nonce, Record, Seq, UnixMillis, UnsignedRecord};
        let k = SecretKey::from_seed(&[6u8; 32]);
        let public = k.public_key();
        let record = |n: u8| {
            UnsignedRecord {
                agent: AgentName::new("sig-bot").unwrap(),
                key_id: public.key_id(),
                seq: Seq::GENESIS,
                prev: None,
                time: UnixMillis::new(1_796_025_600_000),
                nonce: Nonce::from_bytes(vec![n; 16]).unwrap(),
                body: Body::Note(NoteBody {
                    text: format!("note {n} \u{2028}\",\"sig\":\""),
                }),
            }
            .sign(&k)
            .unwrap()
        };
        let prepared = PreparedKey::new(&public);
        for n in 0..16 {
            let good = record(n);
            assert!(public
                .verify_raw(&good.signed_message(), good.signature())
                .is_ok());
            assert!(prepared.verify_record(&good), "good record {n}");
            // The key's valid signature of another record, put on this one.
            let other = record(n + 100);
            let text = String::from_utf8(good.canonical_bytes().to_vec()).unwrap();
            let swapped = text.replace(
                &good.signature().to_base64(),
                &other.signature().to_base64(),
            );
            let forged = Record::from_json(swapped.as_bytes()).unwrap();
            assert!(public
                .verify_raw(&forged.signed_message(), forged.signature())
                .is_err());
            assert!(!prepared.verify_record(&forged), "swapped signature {n}");
            // Another key refuses it.
            let stranger = PreparedKey::new(&SecretKey::from_seed(&[7u8; 32]).public_key());
            assert!(!stranger.verify_record(&good));
        }
    }
}
