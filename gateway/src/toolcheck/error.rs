//! Why a lockfile or policy cannot be used, and how large a file is read:
//! every file of `toolcheck` depends on these.

/// Largest lockfile or policy file read, in bytes.
pub const MAX_FILE_BYTES: usize = 16 << 20;

/// Why a lockfile or policy cannot be used; the gateway refuses to start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {file}: {message}")]
pub struct GuardError {
    /// Stable code: `bad_lockfile` or `bad_policy`.
    pub code: &'static str,
    /// The file.
    pub file: String,
    /// What is wrong.
    pub message: String,
}
