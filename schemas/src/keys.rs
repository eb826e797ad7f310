//! Ed25519 keys, signatures and key ids, docs/protocol.md §4.
//!
//! Verification is always `verify_strict` (ed25519-dalek): it refuses
//! small-order public keys and non-canonical `R`/`S` encodings, so a record has
//! one valid signature per key and message, and every verifier of tally agrees
//! on which signatures are good.

use std::fmt;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey};
use rand_core::CryptoRngCore;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

/// Domain separation for the key id of an agent key.
pub const KEY_ID_DOMAIN: &[u8] = b"tally/key-id/v1\n";

/// Bad key or signature text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Not standard padded base64 of the right length.
    #[error("{what} must be standard base64 of {len} bytes")]
    Encoding {
        /// What was being parsed.
        what: &'static str,
        /// The expected length in bytes.
        len: usize,
    },
    /// The 32 bytes are not a valid Ed25519 point.
    #[error("public key is not a valid Ed25519 point")]
    InvalidPoint,
    /// The 32 bytes encode a point of small order, or encode a point in a
    /// non-canonical way (§4.3): no signature would ever verify strictly.
    #[error("weak public key: {0}")]
    WeakKey(UnusableKey),
    /// A key id that is not 16 lowercase hex digits.
    #[error("a key id must be 16 lowercase hex digits, got {got:?}")]
    KeyId {
        /// The offending text, cut to 80 characters.
        got: String,
    },
}

/// Why a public key is refused where keys are registered (the witness's
/// agent registration and rotation, docs/api.md "Agents and their keys"):
/// under strict verification (§4.3) no signature made by a key generator
/// verifies under it, so registering it can only hide a mistake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UnusableKey {
    /// The point has small order (the eight points of the curve's torsion
    /// subgroup, in any encoding): strict verification refuses it.
    #[error("the public key is a point of small order; no signature verifies under it strictly")]
    SmallOrder,
    /// The 32 bytes are not the canonical encoding of their point (the `y`
    /// coordinate is not reduced modulo p, or `x` is 0 with its sign bit
    /// set); no key generator writes such bytes.
    #[error("the public key is not the canonical encoding of its curve point")]
    NonCanonical,
}

impl UnusableKey {
    /// A stable name of the reason (`small_order`, `non_canonical`).
    #[must_use]
    pub const fn code(&self) -> &'static str {
        match self {
            Self::SmallOrder => "small_order",
            Self::NonCanonical => "non_canonical",
        }
    }
}

/// A signature that does not verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("Ed25519 signature does not verify (strict)")]
pub struct BadSignature;

fn decode_fixed<const N: usize>(text: &str, what: &'static str) -> Result<[u8; N], KeyError> {
    let bytes = BASE64
        .decode(text)
        .map_err(|_| KeyError::Encoding { what, len: N })?;
    // Refuse non-canonical base64 (stray low bits in the last character), so a
    // value has one spelling.
    if BASE64.encode(&bytes) != text {
        return Err(KeyError::Encoding { what, len: N });
    }
    bytes
        .try_into()
        .map_err(|_| KeyError::Encoding { what, len: N })
}

/// An Ed25519 public key. On the wire: standard base64 of its 32 bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PublicKey(VerifyingKey);

impl PublicKey {
    /// Parses 32 bytes: the canonical encoding of a curve point that is not
    /// of small order (§4.3).
    ///
    /// # Errors
    /// [`KeyError::InvalidPoint`] when the bytes do not decode to a curve
    /// point; [`KeyError::WeakKey`] for a small-order point or a
    /// non-canonical encoding (§4.3).
    pub fn from_bytes(bytes: &[u8; 32]) -> Result<Self, KeyError> {
        let key = VerifyingKey::from_bytes(bytes).map_err(|_| KeyError::InvalidPoint)?;
        match weakness(&key, bytes) {
            Some(why) => Err(KeyError::WeakKey(why)),
            None => Ok(Self(key)),
        }
    }

    /// Parses the wire form.
    ///
    /// # Errors
    /// [`KeyError`] for bad base64 or an invalid point.
    pub fn from_base64(text: &str) -> Result<Self, KeyError> {
        Self::from_bytes(&decode_fixed::<32>(text, "public key")?)
    }

    /// The 32 bytes.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    /// The wire form.
    #[must_use]
    pub fn to_base64(&self) -> String {
        BASE64.encode(self.0.as_bytes())
    }

    /// The key id of this key, docs/protocol.md §4.2.
    #[must_use]
    pub fn key_id(&self) -> KeyId {
        let mut h = Sha256::new();
        h.update(KEY_ID_DOMAIN);
        h.update(self.0.as_bytes());
        let digest = h.finalize();
        let mut id = [0u8; 8];
        id.copy_from_slice(&digest[..8]);
        KeyId(id)
    }

    /// Strict Ed25519 verification of `signature` over `domain ‖ message`.
    ///
    /// # Errors
    /// [`BadSignature`] when it does not verify under `verify_strict`.
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

    /// Strict Ed25519 verification over `signed` exactly as given.
    ///
    /// # Errors
    /// [`BadSignature`] when it does not verify under `verify_strict`.
    pub fn verify_raw(&self, signed: &[u8], signature: &Signature) -> Result<(), BadSignature> {
        self.0
            .verify_strict(signed, &ed25519_dalek::Signature::from_bytes(&signature.0))
            .map_err(|_| BadSignature)
    }

    /// The underlying dalek key.
    #[must_use]
    pub fn as_dalek(&self) -> &VerifyingKey {
        &self.0
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.to_base64())
    }
}

impl Serialize for PublicKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_base64())
    }
}

impl<'de> Deserialize<'de> for PublicKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::from_base64(&text).map_err(serde::de::Error::custom)
    }
}

/// An Ed25519 signature. On the wire: standard base64 of its 64 bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Signature([u8; 64]);

impl Signature {
    /// Wraps raw bytes.
    #[must_use]
    pub const fn from_bytes(bytes: [u8; 64]) -> Self {
        Self(bytes)
    }

    /// The raw bytes.
    #[must_use]
    pub const fn as_bytes(&self) -> &[u8; 64] {
        &self.0
    }

    /// Parses the wire form.
    ///
    /// # Errors
    /// [`KeyError::Encoding`] for anything but canonical base64 of 64 bytes.
    pub fn from_base64(text: &str) -> Result<Self, KeyError> {
        decode_fixed::<64>(text, "signature").map(Self)
    }

    /// The wire form.
    #[must_use]
    pub fn to_base64(&self) -> String {
        BASE64.encode(self.0)
    }
}

impl fmt::Debug for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Signature({})", self.to_base64())
    }
}

impl Serialize for Signature {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_base64())
    }
}

impl<'de> Deserialize<'de> for Signature {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::from_base64(&text).map_err(serde::de::Error::custom)
    }
}

/// The id of an agent key: the first 8 bytes of
/// `SHA-256("tally/key-id/v1\n" ‖ public key)`, as 16 lowercase hex digits.
/// An id names a key; it is never trusted in place of the key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId([u8; 8]);

impl KeyId {
    /// Parses the wire form.
    ///
    /// # Errors
    /// [`KeyError::KeyId`] for anything but 16 lowercase hex digits.
    pub fn from_hex(text: &str) -> Result<Self, KeyError> {
        let err = || KeyError::KeyId {
            got: text.chars().take(80).collect(),
        };
        if text.len() != 16 || !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(err());
        }
        let mut id = [0u8; 8];
        hex::decode_to_slice(text, &mut id).map_err(|_| err())?;
        Ok(Self(id))
    }

    /// The wire form.
    #[must_use]
    pub fn to_hex(&self) -> String {
        crate::hash::lower_hex(&self.0)
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({})", self.to_hex())
    }
}

impl Serialize for KeyId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for KeyId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::from_hex(&text).map_err(serde::de::Error::custom)
    }
}

/// Why a decoded point is a *weak* Ed25519 public key (§4.3), small order
/// first; `None` for a usable key. Weak: a point of small order (the
/// identity and the seven other torsion points), or any point written in a
/// non-canonical way (a `y` coordinate of `p` or more, or the sign bit set
/// on `x = 0`). Strict verification accepts no signature under such a key,
/// so tally refuses it wherever a public key appears. Bytes that are not a
/// point are not weak; they are invalid ([`PublicKey::from_bytes`] says
/// which).
fn weakness(key: &VerifyingKey, bytes: &[u8; 32]) -> Option<UnusableKey> {
    if key.is_weak() {
        Some(UnusableKey::SmallOrder)
    } else if key.to_edwards().compress().to_bytes() != *bytes {
        Some(UnusableKey::NonCanonical)
    } else {
        None
    }
}

/// An Ed25519 private key (an agent's, or the log's).
#[derive(Clone)]
pub struct SecretKey(SigningKey);

impl SecretKey {
    /// A fresh key from `rng`.
    pub fn generate<R: CryptoRngCore + ?Sized>(rng: &mut R) -> Self {
        let mut seed = [0u8; 32];
        rng.fill_bytes(&mut seed);
        Self(SigningKey::from_bytes(&seed))
    }

    /// The key with this 32-byte seed (RFC 8032 private key).
    #[must_use]
    pub fn from_seed(seed: &[u8; 32]) -> Self {
        Self(SigningKey::from_bytes(seed))
    }

    /// The 32-byte seed; keep it secret.
    #[must_use]
    pub fn seed(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    /// The public half.
    #[must_use]
    pub fn public_key(&self) -> PublicKey {
        PublicKey(self.0.verifying_key())
    }

    /// Signs `domain ‖ message`.
    #[must_use]
    pub fn sign(&self, domain: &[u8], message: &[u8]) -> Signature {
        let mut signed = Vec::with_capacity(domain.len() + message.len());
        signed.extend_from_slice(domain);
        signed.extend_from_slice(message);
        self.sign_raw(&signed)
    }

    /// Signs `signed` exactly as given.
    #[must_use]
    pub fn sign_raw(&self, signed: &[u8]) -> Signature {
        Signature(self.0.sign(signed).to_bytes())
    }
}

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretKey(public {})", self.public_key().to_base64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether 32 bytes that decode to a curve point are a weak public key
    /// (§4.3), by the classification [`PublicKey::from_bytes`] refuses.
    fn is_weak_public_key(bytes: &[u8; 32]) -> bool {
        VerifyingKey::from_bytes(bytes).is_ok_and(|key| weakness(&key, bytes).is_some())
    }

    #[test]
    fn sign_verify_and_domain_separation() {
        let k = SecretKey::from_seed(&[7u8; 32]);
        let sig = k.sign(b"tally/test/v1\n", b"hello");
        let pk = k.public_key();
        assert!(pk.verify(b"tally/test/v1\n", b"hello", &sig).is_ok());
        assert!(pk.verify(b"tally/other/v1\n", b"hello", &sig).is_err());
        assert!(pk.verify(b"tally/test/v1\n", b"hellO", &sig).is_err());
        assert_eq!(PublicKey::from_base64(&pk.to_base64()), Ok(pk));
        assert_eq!(Signature::from_base64(&sig.to_base64()), Ok(sig));
        assert_eq!(KeyId::from_hex(&pk.key_id().to_hex()).unwrap(), pk.key_id());
    }

    /// The 32-byte encoding of `y` (little-endian) with the sign bit `sign`.
    fn encode(y: &[u8; 32], sign: bool) -> [u8; 32] {
        let mut b = *y;
        b[31] = (b[31] & 0x7f) | if sign { 0x80 } else { 0 };
        b
    }

    /// `p + k` for small `k`, little-endian (p = 2^255 − 19).
    fn p_plus(k: u8) -> [u8; 32] {
        let mut b = [0xffu8; 32];
        b[31] = 0x7f;
        b[0] = 0xed;
        let (low, carry) = b[0].overflowing_add(k);
        b[0] = low;
        if carry {
            // p + k ≥ 2^255 for k ≥ 19: not a 255-bit value, never asked.
            unreachable!("k below 19");
        }
        b
    }

    #[test]
    fn weak_keys_are_small_order_points_and_non_canonical_encodings() {
        let good = SecretKey::from_seed(&[5u8; 32]).public_key().to_bytes();
        assert!(!is_weak_public_key(&good));
        assert!(PublicKey::from_bytes(&good).is_ok());
        // The identity, canonical (y = 1) and non-canonical (y = p + 1, and
        // the sign bit set on x = 0).
        let mut one = [0u8; 32];
        one[0] = 1;
        for weak in [one, p_plus(1), encode(&one, true)] {
            assert!(is_weak_public_key(&weak), "{weak:?}");
            assert!(matches!(
                PublicKey::from_bytes(&weak),
                Err(KeyError::WeakKey(_))
            ));
            assert!(PublicKey::from_base64(&BASE64.encode(weak)).is_err());
        }
        // Every non-canonical y (p ≤ y < 2^255, both signs) that decodes at
        // all is weak; those that do not decode are invalid.
        for k in 0..19u8 {
            for sign in [false, true] {
                let bytes = encode(&p_plus(k), sign);
                match PublicKey::from_bytes(&bytes) {
                    Ok(_) => panic!("y = p + {k}, sign {sign}: accepted"),
                    Err(e) => assert!(
                        matches!(e, KeyError::WeakKey(_) | KeyError::InvalidPoint),
                        "{e}"
                    ),
                }
            }
        }
    }

    /// p = 2^255 - 19, little-endian.
    fn field_prime() -> [u8; 32] {
        let mut p = [0xffu8; 32];
        p[0] = 0xed;
        p[31] = 0x7f;
        p
    }

    #[test]
    fn generated_keys_are_usable() {
        for seed in 0u8..32 {
            let pk = SecretKey::from_seed(&[seed; 32]).public_key();
            assert_eq!(PublicKey::from_bytes(&pk.to_bytes()), Ok(pk), "seed {seed}");
        }
    }

    #[test]
    fn small_order_points_are_unusable_in_every_encoding() {
        // The eight torsion points in canonical encoding (y = 1, y = -1,
        // y = 0 with both signs, and the four of order 8), as listed in
        // "Taming the many EdDSAs" (Chalkias et al., 2020), table 6.
        let canonical = [
            "0100000000000000000000000000000000000000000000000000000000000000",
            "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
            "0000000000000000000000000000000000000000000000000000000000000000",
            "0000000000000000000000000000000000000000000000000000000000000080",
            "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
            "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",
            "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
            "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",
        ];
        let mut seen = 0;
        for hex_key in canonical {
            let mut b = [0u8; 32];
            hex::decode_to_slice(hex_key, &mut b).unwrap();
            // Those that decode (not every sign-bit spelling does) are refused.
            if let Ok(key) = VerifyingKey::from_bytes(&b) {
                seen += 1;
                assert_eq!(
                    PublicKey::from_bytes(&b),
                    Err(KeyError::WeakKey(UnusableKey::SmallOrder)),
                    "{hex_key}"
                );
                // And strict verification agrees: nothing verifies.
                let sig = ed25519_dalek::Signature::from_bytes(&[0u8; 64]);
                assert!(key.verify_strict(b"m", &sig).is_err());
            }
        }
        assert!(seen >= 6, "only {seen} torsion encodings decoded");
        // y = p and y = p + 1: non-canonical spellings of y = 0 and y = 1.
        for k in [0u8, 1] {
            for sign in [0u8, 0x80] {
                let mut b = field_prime();
                b[0] += k;
                b[31] |= sign;
                assert!(VerifyingKey::from_bytes(&b).is_ok(), "decodes");
                assert_eq!(
                    PublicKey::from_bytes(&b),
                    Err(KeyError::WeakKey(UnusableKey::SmallOrder))
                );
            }
        }
    }

    #[test]
    fn non_canonical_encodings_of_ordinary_points_are_unusable() {
        // y in [p, 2^255): y mod p in 0..19. The ones that decode to a
        // point of large order (y = 3, 4, 5, 6, 9, 10, 14, 15, 16, 18) are
        // accepted by the decoder and even by `verify_strict`'s key check,
        // so the canonical-encoding rule is what refuses them.
        let mut large_order = 0;
        for k in 0u8..19 {
            for sign in [0u8, 0x80] {
                let mut b = field_prime();
                b[0] += k;
                b[31] |= sign;
                if VerifyingKey::from_bytes(&b).is_err() {
                    continue;
                }
                let got = PublicKey::from_bytes(&b);
                assert!(got.is_err(), "y = p + {k}, sign {sign}: accepted");
                if got == Err(KeyError::WeakKey(UnusableKey::NonCanonical)) {
                    large_order += 1;
                }
            }
        }
        assert_eq!(large_order, 20);
        // x = 0 with its sign bit set (y = 1 and y = -1): small order first.
        let mut b = [0u8; 32];
        b[0] = 1;
        b[31] = 0x80;
        assert_eq!(
            PublicKey::from_bytes(&b),
            Err(KeyError::WeakKey(UnusableKey::SmallOrder))
        );
        assert_eq!(UnusableKey::NonCanonical.code(), "non_canonical");
        assert_eq!(UnusableKey::SmallOrder.code(), "small_order");
    }

    #[test]
    fn non_canonical_base64_is_refused() {
        let pk = SecretKey::from_seed(&[1u8; 32]).public_key();
        let text = pk.to_base64();
        // The last character before '=' carries 2 unused bits; set one.
        let mut chars: Vec<char> = text.chars().collect();
        let i = chars.len() - 2;
        let alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let pos = alphabet.find(chars[i]).unwrap();
        chars[i] = alphabet.chars().nth(pos ^ 1).unwrap();
        let tweaked: String = chars.into_iter().collect();
        assert!(PublicKey::from_base64(&tweaked).is_err());
    }
}
