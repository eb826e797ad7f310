//! # tally-cosigner
//!
//! `tally cosigner`: a C2SP tlog-witness (c2sp.org/tlog-witness, with
//! Ed25519 cosignatures of c2sp.org/tlog-cosignature), for tally's log or
//! any C2SP log it is configured with. C2SP calls this party a *witness*;
//! tally's witness is the server that admits records (`tally serve`), so
//! here it is a *cosigner* everywhere: commands, files, metrics, docs.
//!
//! A cosigner keeps, per log origin, the latest checkpoint it cosigned. It
//! cosigns a new checkpoint only when the log's key signed it and an RFC
//! 9162 consistency proof shows it extends that one, and it persists the
//! new state before it answers. So no two checkpoints it cosigned for one
//! log are inconsistent, across crashes and restarts; a checkpoint that
//! carries a quorum of cosignatures cannot be one branch of a fork those
//! cosigners saw (docs/threat-model.md).
//!
//! - [`state`]: the redb state and its compare-and-swap (docs/storage.md).
//! - [`config`]: `logs.toml`, the logs it cosigns for.
//! - [`cosigner`]: the add-checkpoint rules without HTTP.
//! - [`http`], [`server`]: the routes (docs/api.md) and bounded serving.
//! - [`client`]: what a log uses to ask a cosigner for a cosignature.
//! - `metrics`: `tally_cosigner_*` Prometheus metrics.
//!
//! The wire formats (the cosignature/v1 message, the request body) are in
//! `tally_schemas::cosignature`, shared with the verifier.

pub mod client;
pub mod config;
pub mod cosigner;
pub mod http;
mod metrics;
pub mod server;
pub mod state;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rand_core::CryptoRngCore;
use tally_schemas::cosignature::CosignatureSigner;
use tally_schemas::note::NoteError;
use tally_schemas::time::Clock;

use crate::config::{ConfigError, Logs};
use crate::cosigner::Cosigner;
use crate::state::{State, StateError};

pub use crate::metrics::Metrics;

/// The files of a cosigner's data folder.
pub mod files {
    /// The private key (`PRIVATE+KEY+name+id+base64(0x04 ‖ seed)`), mode 0600.
    pub const KEY: &str = "cosigner.key";
    /// The redb state: the latest cosigned checkpoint per log.
    pub const STATE: &str = "state.redb";
    /// The logs it cosigns for.
    pub const LOGS: &str = "logs.toml";
}

/// Why a data folder could not be made or opened.
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    /// `init` on a folder that already holds a cosigner file.
    #[error("{path} already exists: this folder already holds a cosigner (init makes a new one only in a folder without its files)")]
    Exists {
        /// The file found.
        path: PathBuf,
    },
    /// Neither key nor state: not a cosigner's folder.
    #[error(
        "{dir} holds no cosigner: run `tally cosigner init --name <name> --data-dir {dir}` first"
    )]
    NotInitialised {
        /// The folder.
        dir: PathBuf,
    },
    /// The key is there but its state is gone.
    #[error(
        "{state} is missing, but the key {key} is there: the cosigner's state is lost. \
             Refusing to start over: with no record of what it cosigned, it could cosign \
             a checkpoint inconsistent with one it cosigned before. Restore the state file \
             if you have the one the cosigner last wrote, or make a new cosigner (a new key) \
             and replace this key where it is trusted (docs/operations.md, \"Running a cosigner\")"
    )]
    LostState {
        /// The key file.
        key: PathBuf,
        /// The missing state file.
        state: PathBuf,
    },
    /// The state is there but the key is gone.
    #[error(
        "{key} is missing, but the state {state} is there: without its key the cosigner \
             cannot sign; restore the key, or make a new cosigner (docs/operations.md)"
    )]
    LostKey {
        /// The missing key file.
        key: PathBuf,
        /// The state file.
        state: PathBuf,
    },
    /// The key file does not parse.
    #[error("{path}: {error}")]
    Key {
        /// The key file.
        path: PathBuf,
        /// Why.
        error: NoteError,
    },
    /// `init` was given a name that cannot be a key name.
    #[error("invalid cosigner name {name:?}: a name is not empty and has no spaces and no '+' (for example cosigner.example.com/c1)")]
    Name {
        /// The name given.
        name: String,
    },
    /// The state file could not be made or opened.
    #[error(transparent)]
    State(#[from] StateError),
    /// logs.toml could not be read or written.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Any other file error.
    #[error("{path}: {reason}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> DataDirError + '_ {
    move |e| DataDirError::Io {
        path: path.to_owned(),
        reason: e.to_string(),
    }
}

/// Makes a cosigner in `dir`: a new key named `name`, an empty state that
/// names the key, and an empty `logs.toml`. The state is written before the
/// key, so an interrupted `init` leaves a state without a key, which
/// `open` refuses, never a key without its state being taken for a fresh
/// start.
///
/// # Errors
/// [`DataDirError::Exists`] when any of the files is there already; a bad
/// name ([`DataDirError::Name`]); I/O errors.
pub fn init<R: CryptoRngCore + ?Sized>(
    dir: &Path,
    name: &str,
    rng: &mut R,
) -> Result<CosignatureSigner, DataDirError> {
    let key_path = dir.join(files::KEY);
    let signer = CosignatureSigner::generate(name, rng).map_err(|_| DataDirError::Name {
        name: name.to_owned(),
    })?;
    for f in [files::KEY, files::STATE, files::LOGS] {
        let p = dir.join(f);
        if p.exists() {
            return Err(DataDirError::Exists { path: p });
        }
    }
    if !dir.exists() {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(io(dir))?;
        }
    }
    drop(State::create(
        &dir.join(files::STATE),
        &signer.verifier().vkey(),
    )?);
    Logs::default().save(&dir.join(files::LOGS))?;
    config::write_atomically(
        &key_path,
        format!("{}\n", signer.skey()).as_bytes(),
        Some(0o600),
    )
    .map_err(io(&key_path))?;
    Ok(signer)
}

/// Reads the key of the cosigner in `dir` (without opening its state).
///
/// # Errors
/// [`DataDirError`] when the key is missing or malformed.
pub fn read_key(dir: &Path) -> Result<CosignatureSigner, DataDirError> {
    let key_path = dir.join(files::KEY);
    let state_path = dir.join(files::STATE);
    let text = match std::fs::read_to_string(&key_path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(if state_path.exists() {
                DataDirError::LostKey {
                    key: key_path,
                    state: state_path,
                }
            } else {
                DataDirError::NotInitialised {
                    dir: dir.to_owned(),
                }
            });
        }
        Err(e) => return Err(io(&key_path)(e)),
    };
    CosignatureSigner::from_skey(text.trim()).map_err(|error| DataDirError::Key {
        path: key_path,
        error,
    })
}

/// Opens the cosigner in `dir`: its key, its state (which must exist and
/// name that key) and its logs.
///
/// # Errors
/// [`DataDirError`]: among them [`DataDirError::LostState`] for a key
/// whose state is gone.
pub fn open(dir: &Path, clock: Arc<dyn Clock>) -> Result<Cosigner, DataDirError> {
    let signer = read_key(dir)?;
    let key_path = dir.join(files::KEY);
    let state_path = dir.join(files::STATE);
    if !state_path.exists() {
        return Err(DataDirError::LostState {
            key: key_path,
            state: state_path,
        });
    }
    let state = State::open(&state_path, &signer.verifier().vkey())?;
    let logs = Logs::load(&dir.join(files::LOGS))?;
    let cosigner = Cosigner::new(signer, logs, state, clock);
    for (origin, c) in cosigner.state().all()? {
        cosigner.metrics().cosigned(&origin, &c);
    }
    Ok(cosigner)
}
