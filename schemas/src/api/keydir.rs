//! The key directory, `GET /.well-known/tally/keys`, docs/protocol.md §4.5:
//! the log's checkpoint keys, current and retired, with the time ranges
//! they signed in. The witness keeps it in `keys.json` and serves it; `tally
//! agent init --witness` and the agent's sync read it.

use serde::{Deserialize, Serialize};

use super::{parse_versioned, present, BodyError};
use crate::note::NoteVerifier;
use crate::time::UnixMillis;

/// Format version of the directory.
pub const KEY_DIRECTORY_VERSION: u64 = 1;

/// One checkpoint key of the directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirectoryKey {
    /// The log key (§4.4), written as its vkey.
    pub vkey: NoteVerifier,
    /// The first instant it signed.
    pub not_before: UnixMillis,
    /// The instant it was retired (it signed nothing at or after it); `None`
    /// (`null`, never omitted) for the current key.
    #[serde(deserialize_with = "present")]
    pub not_after: Option<UnixMillis>,
}

/// The whole directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyDirectory {
    /// Version, 1.
    pub v: u64,
    /// The log's origin.
    pub origin: String,
    /// Keys, oldest first.
    pub keys: Vec<DirectoryKey>,
}

impl KeyDirectory {
    /// An empty directory for the log `origin` (not valid on the wire until
    /// a key is added).
    #[must_use]
    pub fn empty(origin: &str) -> Self {
        Self {
            v: KEY_DIRECTORY_VERSION,
            origin: origin.to_owned(),
            keys: Vec::new(),
        }
    }

    /// Parses a directory as §4.5 says: the JSON rules of §2, `v` first,
    /// exactly the members listed, at least one key, and every key named
    /// after `origin` (its key id matching its key is checked by reading
    /// the vkey, §4.4).
    ///
    /// # Errors
    /// [`BodyError`] naming the first rule broken.
    pub fn from_json(bytes: &[u8]) -> Result<Self, BodyError> {
        const WHAT: &str = "key directory";
        let dir: Self = parse_versioned(bytes, WHAT, KEY_DIRECTORY_VERSION)?;
        if dir.keys.is_empty() {
            return Err(BodyError::schema(WHAT, "keys is empty"));
        }
        if let Some(k) = dir.keys.iter().find(|k| k.vkey.name() != dir.origin) {
            return Err(BodyError::schema(
                WHAT,
                format!(
                    "key {} is not named after the origin {:?}",
                    k.vkey.label(),
                    dir.origin
                ),
            ));
        }
        Ok(dir)
    }

    /// The keys that are current (`not_after` is `null`).
    pub fn current(&self) -> impl Iterator<Item = &DirectoryKey> {
        self.keys.iter().filter(|k| k.not_after.is_none())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::note::NoteSigner;

    fn vkey(seed: u8, name: &str) -> String {
        NoteSigner::from_secret(name, crate::keys::SecretKey::from_seed(&[seed; 32]))
            .unwrap()
            .verifier()
            .vkey()
    }

    fn good() -> String {
        format!(
            r#"{{"v": 1, "origin": "tally.local/log",
 "keys": [{{"vkey": "{}", "not_before": "2026-11-01T08:00:00.000Z", "not_after": "2026-11-30T08:00:00.000Z"}},
          {{"vkey": "{}", "not_before": "2026-11-30T08:00:00.000Z", "not_after": null}}]}}"#,
            vkey(1, "tally.local/log"),
            vkey(2, "tally.local/log")
        )
    }

    #[test]
    fn a_directory_is_read_strictly() {
        let good = good();
        let dir = KeyDirectory::from_json(good.as_bytes()).unwrap();
        assert_eq!(dir.keys.len(), 2);
        assert_eq!(dir.current().count(), 1);
        assert_eq!(
            dir.current().next().unwrap().vkey.vkey(),
            vkey(2, "tally.local/log")
        );
        let other_name = vkey(3, "other.log");
        let first = vkey(1, "tally.local/log");
        for (bad, why) in [
            (good.replace(", \"not_after\": null", ""), "not_after"),
            (
                good.replace("\"not_before\": \"2026-11-01T08:00:00.000Z\", ", ""),
                "not_before",
            ),
            (
                good.replace("\"not_after\": null", "\"not_after\": null, \"extra\": 1"),
                "unknown field `extra`",
            ),
            (
                good.replace("\"origin\"", "\"v\": 1, \"origin\""),
                "duplicate",
            ),
            (good.replace("\"v\": 1", "\"v\": 2"), "version 2"),
            (
                good.replace("\"v\": 1", "\"v\": 2, \"new\": true"),
                "version 2",
            ),
            (good.replace("\"v\": 1", "\"v\": 1.0"), "`v`"),
            (
                good.replace(&first, &other_name),
                "not named after the origin",
            ),
            (good.replace(&first, &first.replace("+A", "+B")), "vkey"),
            (
                r#"{"v": 1, "origin": "tally.local/log", "keys": []}"#.to_owned(),
                "keys is empty",
            ),
        ] {
            assert_ne!(bad, good);
            let err = KeyDirectory::from_json(bad.as_bytes()).unwrap_err();
            assert!(err.to_string().contains(why), "{why}: {err}");
        }
    }

    #[test]
    fn what_is_written_reads_back() {
        let dir = KeyDirectory::from_json(good().as_bytes()).unwrap();
        let pretty = serde_json::to_vec_pretty(&dir).unwrap();
        assert_eq!(KeyDirectory::from_json(&pretty).unwrap(), dir);
        let canonical = crate::canonical::canonicalize(&dir).unwrap();
        assert_eq!(KeyDirectory::from_json(&canonical).unwrap(), dir);
    }
}
