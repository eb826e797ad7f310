//! The record's value types: agent names, seqs, nonces, and the rule for
//! free-text fields (docs/protocol.md §2, §3, §5).

use std::fmt;

use rand_core::CryptoRngCore;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::RecordError;
use crate::limits::{MAX_AGENT_NAME_BYTES, MAX_COUNTER, MAX_NONCE_BYTES, MIN_NONCE_BYTES};

/// Checks a free-text field: 1..=max bytes, no control characters (newline
/// and tab allowed where `allow_newlines`).
pub(super) fn check_text(
    field: &'static str,
    text: &str,
    max: usize,
    allow_newlines: bool,
) -> Result<(), RecordError> {
    let invalid = |reason: String| RecordError::Invalid { field, reason };
    if text.is_empty() || text.len() > max {
        return Err(invalid(format!(
            "must be 1 to {max} bytes, is {}",
            text.len()
        )));
    }
    if let Some(c) = text
        .chars()
        .find(|c| c.is_control() && !(allow_newlines && matches!(c, '\n' | '\t')))
    {
        return Err(invalid(format!(
            "contains control character U+{:04X}",
            u32::from(c)
        )));
    }
    Ok(())
}

/// An agent's name: its chain's name, unique in a project. 1 to 64 bytes of
/// `A-Z a-z 0-9 . _ -`, starting with a letter or digit, so it is safe in
/// URLs, file names and log lines.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AgentName(String);

impl AgentName {
    /// Parses a name.
    ///
    /// # Errors
    /// [`RecordError::Invalid`] naming the rule broken.
    pub fn new(name: &str) -> Result<Self, RecordError> {
        let ok_len = !name.is_empty() && name.len() <= MAX_AGENT_NAME_BYTES;
        let ok_chars = name
            .bytes()
            .enumerate()
            .all(|(i, b)| b.is_ascii_alphanumeric() || (i > 0 && matches!(b, b'.' | b'_' | b'-')));
        if ok_len && ok_chars {
            Ok(Self(name.to_owned()))
        } else {
            Err(RecordError::Invalid {
                field: "agent",
                reason: format!(
                    "{name:?} is not 1 to {MAX_AGENT_NAME_BYTES} bytes of A-Z a-z 0-9 . _ - starting with a letter or digit"
                ),
            })
        }
    }

    /// The name.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for AgentName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for AgentName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AgentName({})", self.0)
    }
}

impl Serialize for AgentName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for AgentName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::new(&text).map_err(serde::de::Error::custom)
    }
}

/// A record's 0-based position in its agent's chain.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize)]
#[serde(transparent)]
pub struct Seq(u64);

impl Seq {
    /// The first record of a chain.
    pub const GENESIS: Self = Self(0);

    /// Wraps a sequence number.
    ///
    /// # Errors
    /// [`RecordError::Invalid`] above 2^53 − 1.
    pub fn new(n: u64) -> Result<Self, RecordError> {
        if n > MAX_COUNTER {
            return Err(RecordError::Invalid {
                field: "seq",
                reason: format!("{n} is above 2^53-1"),
            });
        }
        Ok(Self(n))
    }

    /// The number.
    #[must_use]
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The next sequence number, or `None` at the limit.
    #[must_use]
    pub fn next(self) -> Option<Self> {
        Self::new(self.0 + 1).ok()
    }
}

impl fmt::Display for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Debug for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Seq({})", self.0)
    }
}

impl<'de> Deserialize<'de> for Seq {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::new(u64::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// A record's nonce: 16 to 64 random bytes, fresh per record. On the wire:
/// lowercase hex.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nonce(Vec<u8>);

impl Nonce {
    /// 16 fresh random bytes.
    pub fn random<R: CryptoRngCore + ?Sized>(rng: &mut R) -> Self {
        let mut b = vec![0u8; MIN_NONCE_BYTES];
        rng.fill_bytes(&mut b);
        Self(b)
    }

    /// Wraps bytes.
    ///
    /// # Errors
    /// [`RecordError::Invalid`] outside 16..=64 bytes.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, RecordError> {
        if (MIN_NONCE_BYTES..=MAX_NONCE_BYTES).contains(&bytes.len()) {
            Ok(Self(bytes))
        } else {
            Err(RecordError::Invalid {
                field: "nonce",
                reason: format!(
                    "must be {MIN_NONCE_BYTES} to {MAX_NONCE_BYTES} bytes, is {}",
                    bytes.len()
                ),
            })
        }
    }

    /// Parses lowercase hex.
    ///
    /// # Errors
    /// [`RecordError::Invalid`] for other text or lengths.
    pub fn from_hex(text: &str) -> Result<Self, RecordError> {
        if !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(RecordError::Invalid {
                field: "nonce",
                reason: "must be lowercase hex".into(),
            });
        }
        let bytes = hex::decode(text).map_err(|_| RecordError::Invalid {
            field: "nonce",
            reason: "must be lowercase hex of whole bytes".into(),
        })?;
        Self::from_bytes(bytes)
    }

    /// The bytes.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Lowercase hex.
    #[must_use]
    pub fn to_hex(&self) -> String {
        crate::hash::lower_hex(&self.0)
    }
}

impl fmt::Debug for Nonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Nonce({})", self.to_hex())
    }
}

impl fmt::Display for Nonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl Serialize for Nonce {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for Nonce {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::from_hex(&text).map_err(serde::de::Error::custom)
    }
}
