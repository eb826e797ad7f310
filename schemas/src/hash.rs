//! SHA-256 hashes and the hash constructions of docs/protocol.md §3 and §6.
//!
//! RFC 6962/9162 §2.1.1 domain-separates leaves (`0x00`) from interior nodes
//! (`0x01`); record hashes and salted content hashes are plain SHA-256 over
//! bytes that are already unambiguous (canonical JSON, or a fixed-size salt).

use std::fmt;

use rand_core::CryptoRngCore;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

use crate::canonical::{canonicalize, CanonicalError};

/// Length in bytes of every hash in tally.
pub const HASH_LEN: usize = 32;

/// A SHA-256 value. On the wire: 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Hash([u8; HASH_LEN]);

/// A hash string that is not 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a hash must be 64 lowercase hex digits, got {got:?}")]
pub struct HashParseError {
    /// The offending text, cut to 80 characters.
    pub got: String,
}

impl Hash {
    /// Wraps raw bytes.
    #[must_use]
    pub const fn from_bytes(bytes: [u8; HASH_LEN]) -> Self {
        Self(bytes)
    }

    /// The raw bytes.
    #[must_use]
    pub const fn as_bytes(&self) -> &[u8; HASH_LEN] {
        &self.0
    }

    /// SHA-256 of `data`.
    #[must_use]
    pub fn sha256(data: &[u8]) -> Self {
        Self(Sha256::digest(data).into())
    }

    /// Lowercase hex, the wire form.
    #[must_use]
    pub fn to_hex(&self) -> String {
        lower_hex(&self.0)
    }

    /// Parses the wire form: exactly 64 lowercase hex digits.
    ///
    /// # Errors
    /// [`HashParseError`] for any other text, including uppercase hex, which
    /// would give one hash two spellings.
    pub fn from_hex(text: &str) -> Result<Self, HashParseError> {
        let err = || HashParseError {
            got: text.chars().take(80).collect(),
        };
        if text.len() != 2 * HASH_LEN {
            return Err(err());
        }
        // One pass (a pack line holds a score of hashes): any digit that is
        // not lowercase hex sets a high bit in `bad`.
        let mut out = [0u8; HASH_LEN];
        let mut bad = 0u8;
        for (byte, pair) in out.iter_mut().zip(text.as_bytes().chunks_exact(2)) {
            let (hi, lo) = (hex_digit(pair[0]), hex_digit(pair[1]));
            bad |= hi | lo;
            *byte = (hi << 4) | (lo & 0x0f);
        }
        if bad > 0x0f {
            return Err(err());
        }
        Ok(Self(out))
    }
}

/// The lowercase hex digits, by value.
pub(crate) const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

/// `bytes` as lowercase hex, written into a string of the right size
/// (`hex::encode` collects an iterator of chars, which showed in the
/// witness's profile at a few hashes per record).
#[must_use]
pub(crate) fn lower_hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(2 * bytes.len());
    for &b in bytes {
        out.push(char::from(HEX_DIGITS[usize::from(b >> 4)]));
        out.push(char::from(HEX_DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

/// The value of a lowercase hex digit, or 0xff for any other byte.
const fn hex_digit(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        _ => 0xff,
    }
}

impl fmt::Display for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hash({})", self.to_hex())
    }
}

impl Serialize for Hash {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for Hash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::from_hex(&text).map_err(serde::de::Error::custom)
    }
}

/// RFC 9162 §2.1.1: the hash of a leaf, `SHA-256(0x00 ‖ entry)`.
#[must_use]
pub fn leaf_hash(entry: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update([0x00]);
    h.update(entry);
    Hash(h.finalize().into())
}

/// [`leaf_hash`] of the pieces of an entry read end to end.
#[must_use]
pub fn leaf_hash_of_parts(parts: &[&[u8]]) -> Hash {
    let mut h = Sha256::new();
    h.update([0x00]);
    for part in parts {
        h.update(part);
    }
    Hash(h.finalize().into())
}

/// RFC 9162 §2.1.1: the hash of an interior node, `SHA-256(0x01 ‖ left ‖ right)`.
#[must_use]
pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update([0x01]);
    h.update(left.0);
    h.update(right.0);
    Hash(h.finalize().into())
}

/// Length in bytes of the salt of a salted content hash.
pub const SALT_LEN: usize = 16;

/// A salted content hash, docs/protocol.md §6: `SHA-256(salt ‖ canonical content)`.
///
/// The 16 random salt bytes keep a guessable content (a short tool input, say)
/// from being confirmed by hashing candidates; the salt stays with the agent.
#[must_use]
pub fn salted_hash(salt: &[u8; SALT_LEN], canonical_content: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update(salt);
    h.update(canonical_content);
    Hash(h.finalize().into())
}

/// A salted content hash with the salt it was made with, docs/protocol.md
/// §6.1. The salt stays with the agent, beside the content (or without it).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SaltedHash {
    /// `SHA-256(salt ‖ JCS(content))`.
    pub hash: Hash,
    /// The 16 random salt bytes.
    pub salt: [u8; SALT_LEN],
}

impl SaltedHash {
    /// The salted hash of `content` (any JSON value: a tool call's
    /// arguments, a result, an error) under a fresh salt from `rng`: the one
    /// place a producer builds `SHA-256(salt ‖ JCS(content))`.
    ///
    /// # Errors
    /// [`CanonicalError`] when `content` has no canonical form (§6.1: an
    /// integer beyond ±(2^53 − 1), a non-finite number); no hash is made.
    pub fn of_content<T: Serialize + ?Sized>(
        content: &T,
        rng: &mut impl CryptoRngCore,
    ) -> Result<Self, CanonicalError> {
        let canonical = canonicalize(content)?;
        let mut salt = [0u8; SALT_LEN];
        rng.fill_bytes(&mut salt);
        Ok(Self {
            hash: salted_hash(&salt, &canonical),
            salt,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_rejects_other_spellings() {
        let h = Hash::sha256(b"abc");
        assert_eq!(
            h.to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(Hash::from_hex(&h.to_hex()), Ok(h));
        assert!(Hash::from_hex(&h.to_hex().to_uppercase()).is_err());
        assert!(Hash::from_hex("ab").is_err());
        assert!(Hash::from_hex(&format!("{}0", h.to_hex())).is_err());
        // Every byte at every place: only 0-9 and a-f read.
        for at in [0, 1, 37, 63] {
            for c in 0u8..=255 {
                let mut text = h.to_hex().into_bytes();
                text[at] = c;
                let Ok(text) = String::from_utf8(text) else {
                    continue;
                };
                let ok = c.is_ascii_digit() || (b'a'..=b'f').contains(&c);
                assert_eq!(Hash::from_hex(&text).is_ok(), ok, "{c} at {at}");
                if ok {
                    assert_eq!(Hash::from_hex(&text).unwrap().to_hex(), text);
                }
            }
        }
    }

    #[test]
    fn lower_hex_spells_every_byte_as_the_hex_crate_does() {
        let every: Vec<u8> = (0u8..=255).collect();
        assert_eq!(lower_hex(&every), hex::encode(&every));
        assert_eq!(lower_hex(&[]), "");
    }

    #[test]
    fn leaf_and_node_hashes_match_rfc6962_empty_leaf() {
        // SHA-256(0x00) is the leaf hash of the empty entry (RFC 6962 test data).
        assert_eq!(
            leaf_hash(b"").to_hex(),
            "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"
        );
        let l = leaf_hash(b"");
        let mut buf = vec![1u8];
        buf.extend_from_slice(l.as_bytes());
        buf.extend_from_slice(l.as_bytes());
        assert_eq!(node_hash(&l, &l), Hash::sha256(&buf));
    }

    #[test]
    fn a_salted_content_hash_is_sha256_of_salt_and_canonical_content() {
        let spaced: serde_json::Value =
            serde_json::from_str(r#"{ "b": [1, 2.50, "\u00e9"], "a": null }"#).unwrap();
        let mut rng = rand_core::OsRng;
        let one = SaltedHash::of_content(&spaced, &mut rng).unwrap();
        let mut by_hand = one.salt.to_vec();
        by_hand.extend_from_slice("{\"a\":null,\"b\":[1,2.5,\"é\"]}".as_bytes());
        assert_eq!(one.hash, Hash::sha256(&by_hand));
        // A fresh salt each time, so the same content hashes differently.
        let two = SaltedHash::of_content(&spaced, &mut rng).unwrap();
        assert_ne!(one.salt, two.salt);
        assert_ne!(one.hash, two.hash);
        // Content without a canonical form gets no hash.
        let big: serde_json::Value = serde_json::from_str("9007199254740993").unwrap();
        assert!(SaltedHash::of_content(&big, &mut rng).is_err());
    }
}
