//! A record and what the agent keeps beside it: the salt (and, with
//! `--store-content`, the content) behind its salted hashes. The chain
//! store (`store`, which re-exports both) and the record journal
//! (`journal`) hold them.

use rand_core::CryptoRngCore;
use serde::{Deserialize, Serialize};
use tally_schemas::canonical::CanonicalError;
use tally_schemas::hash::SaltedHash;
use tally_schemas::{Hash, Record};

/// The salt (and, with `--store-content`, the content) behind a salted hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Secret {
    /// The 16 salt bytes, hex.
    pub salt: String,
    /// The content that was hashed, when the agent keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<serde_json::Value>,
    /// An action outcome's proof: its own salt (and the proof, when the
    /// agent keeps content), so it can be disclosed alone (docs/protocol.md
    /// §5.2). An outcome without output has an empty `salt` beside it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof: Option<Box<Secret>>,
}

impl Secret {
    /// Hashes `content` under a fresh salt (docs/protocol.md §6.1,
    /// [`SaltedHash::of_content`]) and returns the salted hash with what the
    /// agent keeps: the salt, and the content itself when `keep`.
    ///
    /// # Errors
    /// [`CanonicalError`] when `content` has no canonical form; nothing is
    /// hashed.
    pub fn for_content(
        content: &serde_json::Value,
        keep: bool,
        rng: &mut impl CryptoRngCore,
    ) -> Result<(Hash, Self), CanonicalError> {
        let salted = SaltedHash::of_content(content, rng)?;
        Ok((
            salted.hash,
            Self {
                salt: hex::encode(salted.salt),
                content: keep.then(|| content.clone()),
                proof: None,
            },
        ))
    }
}

/// A record and what goes with it, appended in one transaction.
#[derive(Debug, Clone)]
pub struct Appended {
    /// The signed record.
    pub record: Record,
    /// Its salt and content, for decisions and outcomes.
    pub secret: Option<Secret>,
}
