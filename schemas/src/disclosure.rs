//! A disclosure file, docs/protocol.md §6.3: the content of one call (its
//! arguments, its result or error, or both) with the salts its salted hashes
//! were made with (§6.1), so that anyone holding the pack can recompute the
//! hashes the records carry. `tally disclose` writes one from the agent's
//! local store; `tally verify --disclosure FILE` checks it.

use serde::{Deserialize, Serialize};

use crate::canonical::{canonicalize, parse_strict, CanonicalError, Limits};
use crate::hash::{salted_hash, SALT_LEN};
use crate::Hash;

/// The disclosure format version.
pub const DISCLOSURE_VERSION: u64 = 1;

/// Largest disclosure file read, in bytes. The protocol bounds no content
/// (§6.1); this bounds what one verifier run reads into memory.
pub const MAX_DISCLOSURE_BYTES: usize = 64 << 20;

/// Deepest nesting read: the content's own depth 128 (§6.1, "SHOULD accept
/// at least depth 128") under the file's two levels.
pub const MAX_DISCLOSURE_DEPTH: usize = 130;

/// One disclosed half of a call: the record it belongs to, the salt and the
/// content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DisclosedPart {
    /// The seq of the record whose salted hash this is: the decision for
    /// `input`, the outcome for `output`.
    pub seq: u64,
    /// The 16 salt bytes, lowercase hex.
    pub salt: String,
    /// The content that was hashed (any JSON value).
    pub content: serde_json::Value,
}

/// A disclosure file (§6.3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Disclosure {
    /// Format version, 1.
    pub v: u64,
    /// The agent whose chain holds the call.
    pub agent: String,
    /// The call's `call_id`.
    pub call_id: String,
    /// The tool call's arguments and the salt of the decision's
    /// `input_hash`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<DisclosedPart>,
    /// The result or error and the salt of the outcome's `output_hash`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<DisclosedPart>,
}

/// Why a disclosure file is not one.
#[derive(Debug, thiserror::Error)]
pub enum DisclosureError {
    /// Not strict JSON (§2), or too big or too deep.
    #[error("not a disclosure file: {0}")]
    Json(#[from] CanonicalError),
    /// JSON, but not of the shape of §6.3.
    #[error("not a disclosure file: {0}")]
    Shape(String),
}

impl DisclosedPart {
    /// The salt's bytes, when it is 32 lowercase hex digits.
    #[must_use]
    pub fn salt_bytes(&self) -> Option<[u8; SALT_LEN]> {
        if self.salt.len() != SALT_LEN * 2 || self.salt.bytes().any(|b| b.is_ascii_uppercase()) {
            return None;
        }
        let mut out = [0u8; SALT_LEN];
        hex::decode_to_slice(&self.salt, &mut out).ok()?;
        Some(out)
    }

    /// `SHA-256(salt ‖ JCS(content))` (§6.1).
    ///
    /// # Errors
    /// The content has no canonical form.
    pub fn hash(&self) -> Result<Hash, DisclosureError> {
        let salt = self
            .salt_bytes()
            .ok_or_else(|| DisclosureError::Shape("salt: not 32 lowercase hex digits".into()))?;
        Ok(salted_hash(&salt, &canonicalize(&self.content)?))
    }
}

impl Disclosure {
    /// Parses and checks the shape of a disclosure file: strict JSON, the
    /// members of §6.3, version 1, at least one part, salts of 16 bytes.
    ///
    /// # Errors
    /// [`DisclosureError`] saying what is wrong.
    pub fn from_json(bytes: &[u8]) -> Result<Self, DisclosureError> {
        let value = parse_strict(
            bytes,
            Limits {
                max_bytes: MAX_DISCLOSURE_BYTES,
                max_depth: MAX_DISCLOSURE_DEPTH,
            },
        )?;
        let d: Self =
            serde_json::from_value(value).map_err(|e| DisclosureError::Shape(e.to_string()))?;
        if d.v != DISCLOSURE_VERSION {
            return Err(DisclosureError::Shape(format!(
                "version {} (this build reads version {DISCLOSURE_VERSION})",
                d.v
            )));
        }
        if d.input.is_none() && d.output.is_none() {
            return Err(DisclosureError::Shape(
                "it discloses nothing: neither input nor output".into(),
            ));
        }
        for (name, part) in [("input", &d.input), ("output", &d.output)] {
            if let Some(p) = part {
                if p.salt_bytes().is_none() {
                    return Err(DisclosureError::Shape(format!(
                        "{name}.salt: not 32 lowercase hex digits"
                    )));
                }
            }
        }
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_hashes_as_section_6_1_says() {
        let p = DisclosedPart {
            seq: 1,
            salt: "00".repeat(16),
            content: serde_json::json!({"b": 1, "a": "x"}),
        };
        let mut by_hand = vec![0u8; 16];
        by_hand.extend_from_slice(br#"{"a":"x","b":1}"#);
        assert_eq!(p.hash().unwrap(), Hash::sha256(&by_hand));
    }

    #[test]
    fn shape_errors_are_named() {
        let e = Disclosure::from_json(br#"{"v":1,"agent":"a","call_id":"c"}"#).unwrap_err();
        assert!(e.to_string().contains("discloses nothing"), "{e}");
        let e = Disclosure::from_json(
            br#"{"v":1,"agent":"a","call_id":"c","input":{"seq":0,"salt":"AB","content":1}}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("input.salt"), "{e}");
        let e = Disclosure::from_json(br#"{"v":2,"agent":"a","call_id":"c"}"#).unwrap_err();
        assert!(e.to_string().contains("version 2"), "{e}");
        let e = Disclosure::from_json(br#"{"v":1,"v":1}"#).unwrap_err();
        assert!(matches!(e, DisclosureError::Json(_)), "{e}");
    }
}
