//! Why a record, or its signature, was refused; every file of `record`
//! depends on these.

use crate::canonical::CanonicalError;
#[cfg(doc)]
use crate::limits::MAX_RECORD_BYTES;

/// The record format version this crate reads and writes.
pub const RECORD_VERSION: u64 = 1;

/// Why a record was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// Not strict JSON, or too large or deep to decode.
    #[error(transparent)]
    Canonical(#[from] CanonicalError),
    /// A format version this build does not read.
    #[error("record format version {found} is not supported (this build reads version {RECORD_VERSION})")]
    UnsupportedVersion {
        /// The `v` field as written.
        found: String,
    },
    /// Missing or unknown fields, or fields of the wrong type or spelling.
    #[error("record does not match the v1 schema: {message}")]
    Schema {
        /// What serde or the round trip said.
        message: String,
    },
    /// A field breaks a rule of its kind.
    #[error("record field {field}: {reason}")]
    Invalid {
        /// The field's path, e.g. `body.tools`.
        field: &'static str,
        /// The rule broken.
        reason: String,
    },
    /// The canonical form is larger than [`MAX_RECORD_BYTES`].
    #[error("record is {size} bytes in canonical form, more than the limit of {max}")]
    TooLarge {
        /// Canonical size.
        size: usize,
        /// The limit.
        max: usize,
    },
}

impl RecordError {
    /// A stable, snake_case code for this error, used in API error bodies
    /// and golden vectors.
    #[must_use]
    pub const fn code(&self) -> &'static str {
        match self {
            Self::Canonical(e) => e.code(),
            Self::UnsupportedVersion { .. } => "unsupported_version",
            Self::Schema { .. } => "schema",
            Self::Invalid { .. } => "invalid_field",
            Self::TooLarge { .. } => "too_large",
        }
    }
}
