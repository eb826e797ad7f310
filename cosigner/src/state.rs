//! The cosigner's persistent state (docs/storage.md, "The cosigner's
//! state"): for each log origin, the latest checkpoint it cosigned, in one
//! redb file (`state.redb`).
//!
//! [`State::advance`] is the compare-and-swap of c2sp.org/tlog-witness: in
//! one redb write transaction (redb allows one at a time, so nothing else
//! can run in between) it reads the stored size and root, checks the
//! request's old size against the size, checks the consistency proof
//! against the root, makes the cosignature and commits durably
//! (`Durability::Immediate`, fsync'd). The cosignature is made inside the
//! transaction but leaves the process only after the commit returns, so a
//! crash at any point leaves either the old state and no cosignature, or
//! the new state, whose cosignature a retry of the request gets again.
//! The stored size therefore never goes down and two stored checkpoints of
//! one log are always consistent.
//!
//! The file also names the cosigner key it belongs to: `init` makes the key
//! and the state together, and `open` refuses a state made for another key.

use std::path::{Path, PathBuf};

use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, TableError};
use tally_schemas::hash::Hash;
use tally_schemas::note::Checkpoint;
use tally_schemas::tree::{empty_root, verify_consistency, ProofError, TreeSize};

/// `meta`: `"layout"` → layout version, `"cosigner"` → the cosigner's vkey.
const META: TableDefinition<&str, &str> = TableDefinition::new("meta");
/// `logs`: origin → (size, root, timestamp of the cosignature, cosigned note).
const LOGS: TableDefinition<&str, (u64, [u8; 32], u64, &str)> = TableDefinition::new("logs");

/// The layout version this build writes and reads.
pub const LAYOUT_VERSION: &str = "1";

/// The latest checkpoint cosigned for one log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cosigned {
    /// Its tree size.
    pub size: TreeSize,
    /// Its root hash.
    pub root: Hash,
    /// The timestamp (POSIX seconds) of the cosignature.
    pub timestamp: u64,
    /// The checkpoint note with the log's verified signatures and the
    /// cosignature, as the monitoring route serves it.
    pub note: String,
}

/// Why the state file could not be made, opened, read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// `create` found a file already there.
    #[error("{path} already exists: a cosigner's state is made once, by `tally cosigner init`")]
    Exists {
        /// The file.
        path: PathBuf,
    },
    /// `open` found no file.
    #[error("{path} is missing")]
    Missing {
        /// The file.
        path: PathBuf,
    },
    /// The file belongs to another cosigner key.
    #[error("{path} is the state of cosigner key {stored}, not of {key}")]
    OtherKey {
        /// The file.
        path: PathBuf,
        /// The vkey stored in it.
        stored: String,
        /// The vkey of the key file.
        key: String,
    },
    /// Another process (a running cosigner) has the file open.
    #[error("{path} is in use by another process (a running cosigner)")]
    InUse {
        /// The file.
        path: PathBuf,
    },
    /// A layout this build does not read.
    #[error("{path}: state layout {found:?}, this build reads layout {LAYOUT_VERSION}")]
    Layout {
        /// The file.
        path: PathBuf,
        /// The layout found (empty when none).
        found: String,
    },
    /// redb or the file system failed.
    #[error("state file {path}: {reason}")]
    Storage {
        /// The file.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
}

/// Why [`State::advance`] refused a checkpoint. Nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum AdvanceError {
    /// The request's old size is not the size last cosigned (409).
    #[error("old size {old} is not the size last cosigned, {known}")]
    Conflict {
        /// The request's old size.
        old: TreeSize,
        /// The size last cosigned (0 for none).
        known: TreeSize,
    },
    /// A checkpoint of size 0 whose root is not SHA-256("") (422).
    #[error("a checkpoint of size 0 must have the empty tree's root")]
    EmptyTreeRoot,
    /// Old size 0 with a non-empty proof (422).
    #[error("from old size 0 the consistency proof must be empty, got {hashes} hashes")]
    ProofFromEmptyTree {
        /// Hashes sent.
        hashes: usize,
    },
    /// The proof does not show the checkpoint extends the one cosigned (422).
    #[error(
        "the checkpoint of size {size} is not consistent with the cosigned size {known}: {source}"
    )]
    Inconsistent {
        /// The size last cosigned.
        known: TreeSize,
        /// The new checkpoint's size.
        size: TreeSize,
        /// Why the proof fails.
        source: ProofError,
    },
    /// The state could not be read or written.
    #[error(transparent)]
    State(#[from] StateError),
}

/// The open state file.
#[derive(Debug)]
pub struct State {
    db: Database,
    path: PathBuf,
}

impl State {
    /// Makes a new state file for the cosigner key `vkey`.
    ///
    /// # Errors
    /// [`StateError::Exists`] when there is a file at `path`;
    /// [`StateError::Storage`] on any I/O error.
    pub fn create(path: &Path, vkey: &str) -> Result<Self, StateError> {
        if path.exists() {
            return Err(StateError::Exists {
                path: path.to_owned(),
            });
        }
        let db = Database::create(path).or_state(path)?;
        let mut tx = db.begin_write().or_state(path)?;
        tx.set_durability(Durability::Immediate).or_state(path)?;
        {
            let mut meta = tx.open_table(META).or_state(path)?;
            meta.insert("layout", LAYOUT_VERSION).or_state(path)?;
            meta.insert("cosigner", vkey).or_state(path)?;
            tx.open_table(LOGS).or_state(path)?;
        }
        tx.commit().or_state(path)?;
        Ok(Self {
            db,
            path: path.to_owned(),
        })
    }

    /// Opens the state file of the cosigner key `vkey`. It is never made
    /// here: a missing file is lost state, not a fresh start.
    ///
    /// # Errors
    /// [`StateError::Missing`], [`StateError::OtherKey`],
    /// [`StateError::Layout`] or [`StateError::Storage`].
    pub fn open(path: &Path, vkey: &str) -> Result<Self, StateError> {
        if !path.exists() {
            return Err(StateError::Missing {
                path: path.to_owned(),
            });
        }
        let db = match Database::open(path) {
            Ok(db) => db,
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                return Err(StateError::InUse {
                    path: path.to_owned(),
                })
            }
            Err(e) => return Err(e).or_state(path),
        };
        let (layout, stored) = {
            let tx = db.begin_read().or_state(path)?;
            let meta = match tx.open_table(META) {
                Ok(t) => t,
                Err(TableError::TableDoesNotExist(_)) => {
                    return Err(StateError::Layout {
                        path: path.to_owned(),
                        found: String::new(),
                    })
                }
                Err(e) => return Err(e).or_state(path),
            };
            let get = |k: &str| -> Result<String, StateError> {
                Ok(meta
                    .get(k)
                    .or_state(path)?
                    .map(|v| v.value().to_owned())
                    .unwrap_or_default())
            };
            (get("layout")?, get("cosigner")?)
        };
        if layout != LAYOUT_VERSION {
            return Err(StateError::Layout {
                path: path.to_owned(),
                found: layout,
            });
        }
        if stored != vkey {
            return Err(StateError::OtherKey {
                path: path.to_owned(),
                stored,
                key: vkey.to_owned(),
            });
        }
        Ok(Self {
            db,
            path: path.to_owned(),
        })
    }

    /// The latest checkpoint cosigned for `origin`, if any.
    ///
    /// # Errors
    /// [`StateError::Storage`].
    pub fn latest(&self, origin: &str) -> Result<Option<Cosigned>, StateError> {
        let path = &self.path;
        let tx = self.db.begin_read().or_state(path)?;
        let logs = tx.open_table(LOGS).or_state(path)?;
        Ok(logs.get(origin).or_state(path)?.map(|v| {
            let (size, root, timestamp, note) = v.value();
            Cosigned {
                size: TreeSize::new(size),
                root: Hash::from_bytes(root),
                timestamp,
                note: note.to_owned(),
            }
        }))
    }

    /// Every log with a cosigned checkpoint, by origin.
    ///
    /// # Errors
    /// [`StateError::Storage`].
    pub fn all(&self) -> Result<Vec<(String, Cosigned)>, StateError> {
        let path = &self.path;
        let tx = self.db.begin_read().or_state(path)?;
        let logs = tx.open_table(LOGS).or_state(path)?;
        let mut out = Vec::new();
        for row in logs.iter().or_state(path)? {
            let (k, v) = row.or_state(path)?;
            let (size, root, timestamp, note) = v.value();
            out.push((
                k.value().to_owned(),
                Cosigned {
                    size: TreeSize::new(size),
                    root: Hash::from_bytes(root),
                    timestamp,
                    note: note.to_owned(),
                },
            ));
        }
        Ok(out)
    }

    /// The compare-and-swap: checks `checkpoint` of `origin` against the
    /// latest cosigned one (`old_size` must equal its size; `proof` must be
    /// empty from size 0, else an RFC 9162 consistency proof from it), then
    /// calls `cosign` with the earliest timestamp it may use (the stored
    /// cosignature's, so that a log's cosignatures never go back in time)
    /// for the cosignature's timestamp and the note to store, and commits
    /// durably. Returns what was stored.
    ///
    /// # Errors
    /// [`AdvanceError`]; nothing is written then.
    pub fn advance(
        &self,
        origin: &str,
        old_size: TreeSize,
        checkpoint: &Checkpoint,
        proof: &[Hash],
        cosign: impl FnOnce(u64) -> (u64, String),
    ) -> Result<Cosigned, AdvanceError> {
        let path = &self.path;
        let mut tx = self.db.begin_write().or_state(path)?;
        tx.set_durability(Durability::Immediate).or_state(path)?;
        let stored = {
            let mut logs = tx.open_table(LOGS).or_state(path)?;
            let (known, known_root, known_ts) = match logs.get(origin).or_state(path)? {
                Some(v) => {
                    let (size, root, ts, _) = v.value();
                    (TreeSize::new(size), Hash::from_bytes(root), ts)
                }
                None => (TreeSize::new(0), empty_root(), 0),
            };
            if old_size != known {
                return Err(AdvanceError::Conflict {
                    old: old_size,
                    known,
                });
            }
            if checkpoint.size.get() == 0 && checkpoint.root != empty_root() {
                return Err(AdvanceError::EmptyTreeRoot);
            }
            if old_size.get() == 0 {
                // The empty tree is consistent with every tree.
                if !proof.is_empty() {
                    return Err(AdvanceError::ProofFromEmptyTree {
                        hashes: proof.len(),
                    });
                }
            } else {
                verify_consistency(known, checkpoint.size, &known_root, &checkpoint.root, proof)
                    .map_err(|source| AdvanceError::Inconsistent {
                        known,
                        size: checkpoint.size,
                        source,
                    })?;
            }
            let (timestamp, note) = cosign(known_ts);
            logs.insert(
                origin,
                (
                    checkpoint.size.get(),
                    *checkpoint.root.as_bytes(),
                    timestamp,
                    note.as_str(),
                ),
            )
            .or_state(path)?;
            Cosigned {
                size: checkpoint.size,
                root: checkpoint.root,
                timestamp,
                note,
            }
        };
        tx.commit().or_state(path)?;
        Ok(stored)
    }
}

/// Turns any redb error into [`StateError::Storage`] naming the file.
trait OrState<T> {
    fn or_state(self, path: &Path) -> Result<T, StateError>;
}

impl<T, E: Into<redb::Error>> OrState<T> for Result<T, E> {
    fn or_state(self, path: &Path) -> Result<T, StateError> {
        self.map_err(|e| StateError::Storage {
            path: path.to_owned(),
            reason: e.into().to_string(),
        })
    }
}
