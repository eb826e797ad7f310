//! The logs a cosigner cosigns for: `logs.toml` in its data folder
//! (docs/operations.md, "Running a cosigner").
//!
//! ```toml
//! [[log]]
//! origin = "tally.local/log"
//! keys = ["tally.local/log+1a2b3c4d+AX..."]
//! ```
//!
//! Each log is its checkpoint origin (the first line of its checkpoints)
//! and the signed-note keys (Ed25519, type 0x01) that may sign them; the
//! key names need not equal the origin (C2SP allows a log whose key is
//! named otherwise). The file is edited by `tally cosigner add-log` and
//! `remove-log`, or by hand, and read when the cosigner starts.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tally_schemas::hash::Hash;
use tally_schemas::note::NoteVerifier;

/// One configured log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// The checkpoint origin.
    pub origin: String,
    /// The keys whose signature makes a checkpoint of this origin the log's.
    pub keys: Vec<NoteVerifier>,
}

impl LogConfig {
    /// The lowercase hex SHA-256 of the origin, as the monitoring route
    /// names a log (c2sp.org/tlog-witness, "Monitor Retrieval Mechanism").
    #[must_use]
    pub fn origin_hash(&self) -> String {
        origin_hash(&self.origin)
    }
}

/// Lowercase hex SHA-256 of `origin`.
#[must_use]
pub fn origin_hash(origin: &str) -> String {
    Hash::sha256(origin.as_bytes()).to_hex()
}

/// Why `logs.toml` could not be read, changed or written.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read or written.
    #[error("{path}: {reason}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// The file is not a valid list of logs.
    #[error("{path}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default, rename = "log")]
    logs: Vec<FileLog>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileLog {
    origin: String,
    keys: Vec<String>,
}

/// The configured logs, by origin.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Logs {
    by_origin: BTreeMap<String, LogConfig>,
}

/// Checks that `origin` can be a checkpoint's first line: not empty, no
/// control characters (so no newline), no leading or trailing space.
///
/// # Errors
/// A message saying what is wrong.
pub fn check_origin(origin: &str) -> Result<(), String> {
    if origin.is_empty() {
        return Err("an origin must not be empty".into());
    }
    if origin.chars().any(char::is_control) {
        return Err(format!("origin {origin:?} has a control character"));
    }
    if origin.trim() != origin {
        return Err(format!("origin {origin:?} starts or ends with white space"));
    }
    Ok(())
}

impl Logs {
    /// The log of `origin`.
    #[must_use]
    pub fn get(&self, origin: &str) -> Option<&LogConfig> {
        self.by_origin.get(origin)
    }

    /// The log whose origin hashes to `hash` (lowercase hex).
    #[must_use]
    pub fn by_origin_hash(&self, hash: &str) -> Option<&LogConfig> {
        self.by_origin.values().find(|l| l.origin_hash() == hash)
    }

    /// The logs, ordered by origin.
    pub fn iter(&self) -> impl Iterator<Item = &LogConfig> {
        self.by_origin.values()
    }

    /// How many logs.
    #[must_use]
    pub fn len(&self) -> usize {
        self.by_origin.len()
    }

    /// No logs at all.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.by_origin.is_empty()
    }

    /// Adds `keys` to the log `origin`, adding the log when it is new.
    /// Returns how many keys were new.
    ///
    /// # Errors
    /// A message for a bad origin or no keys.
    pub fn add(&mut self, origin: &str, keys: &[NoteVerifier]) -> Result<usize, String> {
        check_origin(origin)?;
        if keys.is_empty() {
            return Err("a log needs at least one key".into());
        }
        let log = self
            .by_origin
            .entry(origin.to_owned())
            .or_insert_with(|| LogConfig {
                origin: origin.to_owned(),
                keys: Vec::new(),
            });
        let mut added = 0;
        for k in keys {
            if !log.keys.contains(k) {
                log.keys.push(k.clone());
                added += 1;
            }
        }
        Ok(added)
    }

    /// Removes the log `origin`; false when it was not configured.
    pub fn remove(&mut self, origin: &str) -> bool {
        self.by_origin.remove(origin).is_some()
    }

    /// Parses the text of `logs.toml`.
    ///
    /// # Errors
    /// A message naming the first problem: TOML syntax, an unknown member,
    /// a bad origin, an origin listed twice, a log without keys, a key that
    /// is not an Ed25519 note vkey, a key listed twice for one log.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: File = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut logs = Self::default();
        for (i, l) in file.logs.iter().enumerate() {
            let at = |m: String| format!("log {} ({:?}): {m}", i + 1, l.origin);
            check_origin(&l.origin).map_err(at)?;
            if logs.by_origin.contains_key(&l.origin) {
                return Err(at("this origin is listed twice".into()));
            }
            let mut keys = Vec::new();
            for k in &l.keys {
                let key = NoteVerifier::from_vkey(k).map_err(|e| at(format!("key {k:?}: {e}")))?;
                if keys.contains(&key) {
                    return Err(at(format!("key {k:?} is listed twice")));
                }
                keys.push(key);
            }
            logs.add(&l.origin, &keys).map_err(at)?;
        }
        Ok(logs)
    }

    /// The text of `logs.toml` for these logs.
    #[must_use]
    pub fn to_toml(&self) -> String {
        let file = File {
            logs: self
                .by_origin
                .values()
                .map(|l| FileLog {
                    origin: l.origin.clone(),
                    keys: l.keys.iter().map(NoteVerifier::vkey).collect(),
                })
                .collect(),
        };
        let body = if file.logs.is_empty() {
            String::new()
        } else {
            toml::to_string(&file).unwrap_or_default()
        };
        format!(
            "# The logs this cosigner cosigns for: each log's checkpoint origin and the\n\
             # keys that sign its checkpoints. Edited by `tally cosigner add-log` and\n\
             # `remove-log`; read when `tally cosigner serve` starts.\n{body}"
        )
    }

    /// Reads `logs.toml`.
    ///
    /// # Errors
    /// [`ConfigError::Io`] when it cannot be read (a missing file too),
    /// [`ConfigError::Invalid`] when it does not parse.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Io {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        Self::parse(&text).map_err(|reason| ConfigError::Invalid {
            path: path.to_owned(),
            reason,
        })
    }

    /// Writes `logs.toml` atomically (temporary file, fsync, rename, fsync
    /// of the folder).
    ///
    /// # Errors
    /// [`ConfigError::Io`]; the file is then unchanged.
    pub fn save(&self, path: &Path) -> Result<(), ConfigError> {
        write_atomically(path, self.to_toml().as_bytes(), None).map_err(|e| ConfigError::Io {
            path: path.to_owned(),
            reason: e.to_string(),
        })
    }
}

/// Writes `contents` to `path` through a temporary file in the same folder:
/// write, fsync, rename over `path`, fsync of the folder. With `mode`, the
/// file gets that Unix mode from its creation.
///
/// # Errors
/// Any I/O error; `path` is then unchanged.
pub fn write_atomically(path: &Path, contents: &[u8], mode: Option<u32>) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(mode.unwrap_or(0o644));
    }
    #[cfg(not(unix))]
    let _ = mode;
    let result = (|| {
        let mut f = opts.open(&tmp)?;
        f.write_all(contents)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        if let Ok(d) = std::fs::File::open(dir) {
            d.sync_all()?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_schemas::keys::SecretKey;
    use tally_schemas::note::NoteSigner;

    fn key(seed: u8, name: &str) -> NoteVerifier {
        NoteSigner::from_secret(name, SecretKey::from_seed(&[seed; 32]))
            .unwrap()
            .verifier()
            .clone()
    }

    #[test]
    fn round_trip_and_refusals() {
        let mut logs = Logs::default();
        assert_eq!(
            logs.add("tally.local/log", &[key(1, "tally.local/log")]),
            Ok(1)
        );
        assert_eq!(
            logs.add("go.sum database tree", &[key(2, "sum.golang.org")]),
            Ok(1)
        );
        assert_eq!(
            logs.add("tally.local/log", &[key(1, "tally.local/log")]),
            Ok(0)
        );
        let text = logs.to_toml();
        assert_eq!(Logs::parse(&text), Ok(logs.clone()));
        assert_eq!(
            logs.by_origin_hash(&origin_hash("go.sum database tree"))
                .unwrap()
                .keys[0]
                .name(),
            "sum.golang.org"
        );
        let k = key(1, "a").vkey();
        for bad in [
            format!("[[log]]\norigin = \"a\"\nkeys = [\"{k}\"]\n[[log]]\norigin = \"a\"\nkeys = [\"{k}\"]\n"),
            "[[log]]\norigin = \"a\"\nkeys = []\n".to_owned(),
            format!("[[log]]\norigin = \"\"\nkeys = [\"{k}\"]\n"),
            format!("[[log]]\norigin = \"a\\nb\"\nkeys = [\"{k}\"]\n"),
            format!("[[log]]\norigin = \"a\"\nkeys = [\"{k}\", \"{k}\"]\n"),
            "[[log]]\norigin = \"a\"\nkeys = [\"not a key\"]\n".to_owned(),
            format!("[[log]]\norigin = \"a\"\nkeys = [\"{k}\"]\nurl = \"x\"\n"),
            "listen = 1\n".to_owned(),
        ] {
            assert!(Logs::parse(&bad).is_err(), "{bad}");
        }
        assert!(Logs::parse("").unwrap().is_empty());
    }
}
