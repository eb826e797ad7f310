//! The key directory served at `/.well-known/tally/keys` (docs/protocol.md
//! §4.5, docs/api.md): the log's checkpoint keys, current and retired, with
//! the time ranges they signed in. Its format, [`KeyDirectory`], is defined
//! once in tally-schemas; this module keeps it as `keys.json` in the data
//! folder: the current key is added on start if it is not listed, and any
//! other key still open is closed at that moment (a key rotation).

use std::path::Path;

use tally_schemas::note::NoteVerifier;
use tally_schemas::UnixMillis;

pub(crate) use tally_schemas::api::{DirectoryKey, KeyDirectory};

/// Why the directory file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyDirectoryError {
    /// I/O.
    #[error("{path}: {source}")]
    Io {
        /// File.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// Not a directory file.
    #[error("{path}: {message}")]
    Parse {
        /// File.
        path: String,
        /// Why.
        message: String,
    },
}

/// The witness's `keys.json`: the directory's file (its format is the wire
/// format, [`KeyDirectory`]).
pub(crate) trait KeyDirectoryFile: Sized {
    /// Loads `path` (or starts an empty directory) and makes sure `current`
    /// is listed as the open key from `now`; writes the file back if it
    /// changed.
    ///
    /// # Errors
    /// [`KeyDirectoryError`] for I/O or a malformed file.
    fn load_or_init(
        path: &Path,
        current: &NoteVerifier,
        now: UnixMillis,
    ) -> Result<Self, KeyDirectoryError>;
}

impl KeyDirectoryFile for KeyDirectory {
    fn load_or_init(
        path: &Path,
        current: &NoteVerifier,
        now: UnixMillis,
    ) -> Result<Self, KeyDirectoryError> {
        let io = |source| KeyDirectoryError::Io {
            path: path.display().to_string(),
            source,
        };
        let mut dir = match std::fs::read(path) {
            Ok(bytes) => Self::from_json(&bytes).map_err(|e| KeyDirectoryError::Parse {
                path: path.display().to_string(),
                message: e.to_string(),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Self::empty(current.name()),
            Err(e) => return Err(io(e)),
        };
        let listed_open = dir
            .keys
            .iter()
            .any(|k| k.vkey == *current && k.not_after.is_none());
        if !listed_open {
            for k in &mut dir.keys {
                k.not_after.get_or_insert(now);
            }
            dir.keys.push(DirectoryKey {
                vkey: current.clone(),
                not_before: now,
                not_after: None,
            });
            dir.origin = current.name().to_owned();
            let text = serde_json::to_vec_pretty(&dir).map_err(|e| KeyDirectoryError::Parse {
                path: path.display().to_string(),
                message: e.to_string(),
            })?;
            let tmp = path.with_extension("json.tmp");
            std::fs::write(&tmp, text).map_err(io)?;
            std::fs::rename(&tmp, path).map_err(io)?;
        }
        Ok(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::OsRng;
    use tally_schemas::NoteSigner;

    #[test]
    fn lists_the_current_key_and_closes_the_old_one_on_rotation() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("keys.json");
        let k1 = NoteSigner::generate("tally.local/log", &mut OsRng).unwrap();
        let a = KeyDirectory::load_or_init(&p, k1.verifier(), UnixMillis::new(10)).unwrap();
        assert_eq!(a.keys.len(), 1);
        let again = KeyDirectory::load_or_init(&p, k1.verifier(), UnixMillis::new(20)).unwrap();
        assert_eq!(a, again);
        let k2 = NoteSigner::generate("tally.local/log", &mut OsRng).unwrap();
        let b = KeyDirectory::load_or_init(&p, k2.verifier(), UnixMillis::new(30)).unwrap();
        assert_eq!(b.keys.len(), 2);
        assert_eq!(b.keys[0].not_after, Some(UnixMillis::new(30)));
        assert_eq!(b.keys[1].vkey, *k2.verifier());
        assert!(b.keys[1].not_after.is_none());
    }
}
