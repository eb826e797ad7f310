//! How every body of the HTTP API is read (protocol.md §2, §12): strict
//! JSON, the members its section lists, the version first; the modules
//! of `api` share it, and `api` re-exports its public names.

use serde::de::DeserializeOwned;
use serde::Deserialize as _;

use crate::canonical::{self, CanonicalError, Limits};
use crate::record::check_version;

/// Why a body of the HTTP API was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// Not strict JSON (§2), or over its size or depth bound.
    #[error("{what} is not strict JSON (protocol.md §2): {source}")]
    Canonical {
        /// Which body.
        what: &'static str,
        /// The rule broken.
        source: CanonicalError,
    },
    /// A format version this build does not read (§12).
    #[error(
        "{what} format version {found} is not supported (this build reads version {supported})"
    )]
    UnsupportedVersion {
        /// Which body.
        what: &'static str,
        /// The `v` member as written.
        found: String,
        /// The version this build reads.
        supported: u64,
    },
    /// A member missing, unknown, of the wrong type or breaking its rule.
    #[error("{what} is malformed: {message}")]
    Schema {
        /// Which body.
        what: &'static str,
        /// What is wrong.
        message: String,
    },
}

impl BodyError {
    /// A stable snake_case code: the [`CanonicalError`] code, or
    /// `unsupported_version` or `schema` (the `reason` of a witness's
    /// `400 malformed`, docs/api.md "Errors").
    #[must_use]
    pub const fn code(&self) -> &'static str {
        match self {
            Self::Canonical { source, .. } => source.code(),
            Self::UnsupportedVersion { .. } => "unsupported_version",
            Self::Schema { .. } => "schema",
        }
    }

    pub(crate) fn schema(what: &'static str, message: impl Into<String>) -> Self {
        Self::Schema {
            what,
            message: message.into(),
        }
    }
}

/// Parses a body of the API that has no `v` member: strict JSON within
/// `limits`, then exactly the members of `T` (its `deny_unknown_fields`).
///
/// # Errors
/// [`BodyError`] naming the first rule broken.
pub fn parse_body<T: DeserializeOwned>(
    bytes: &[u8],
    what: &'static str,
    limits: Limits,
) -> Result<T, BodyError> {
    let value = canonical::parse_strict(bytes, limits)
        .map_err(|source| BodyError::Canonical { what, source })?;
    serde_json::from_value(value).map_err(|e| BodyError::schema(what, e.to_string()))
}

/// As [`parse_body`], for a body with a `v` member: `v` is read first and
/// must be `supported`.
pub(crate) fn parse_versioned<T: DeserializeOwned>(
    bytes: &[u8],
    what: &'static str,
    supported: u64,
) -> Result<T, BodyError> {
    let value = canonical::parse_strict(bytes, Limits::WIRE)
        .map_err(|source| BodyError::Canonical { what, source })?;
    check_version(&value, supported, |found| BodyError::UnsupportedVersion {
        what,
        found,
        supported,
    })
    .map_err(|e| e.unwrap_or_else(|message| BodyError::schema(what, message)))?;
    serde_json::from_value(value).map_err(|e| BodyError::schema(what, e.to_string()))
}

/// Reads a member that may be `null` but must be there: `Some(None)` for
/// `null`; with `#[serde(default)]`, `None` when it is absent (serde alone
/// reads a missing or `null` `Option` member both as `None`).
pub(crate) fn nullable<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// Reads a member that may be `null` but must be there (no
/// `#[serde(default)]`): serde alone reads a missing `Option` as `None`.
pub(crate) fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    Option::<T>::deserialize(d)
}
