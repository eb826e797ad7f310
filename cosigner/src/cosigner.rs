//! The add-checkpoint rules of c2sp.org/tlog-witness (docs/protocol.md §14,
//! docs/api.md "The cosigner"), without HTTP: [`Cosigner::add_checkpoint`]
//! takes a request body and returns the cosignature line or the refusal
//! with the status the protocol gives it.

use std::sync::Arc;

use tally_schemas::cosignature::{AddCheckpointRequest, CosignatureSigner};
use tally_schemas::note::{Checkpoint, NoteSignature, SignedNote};
use tally_schemas::time::Clock;
use tally_schemas::tree::TreeSize;

use crate::config::{LogConfig, Logs};
use crate::metrics::Metrics;
use crate::state::{AdvanceError, Cosigned, State, StateError};

/// Why an add-checkpoint request was refused, in the protocol's order of
/// checks. [`AddCheckpointError::status`] and [`AddCheckpointError::code`]
/// give the HTTP answer.
#[derive(Debug, thiserror::Error)]
pub enum AddCheckpointError {
    /// The body is not an add-checkpoint request, the note not a signed
    /// note or its text not a checkpoint (400 `malformed`).
    #[error("{reason}")]
    Malformed {
        /// What is wrong.
        reason: String,
    },
    /// The cosigner is not configured for this origin (404 `unknown_origin`).
    #[error("this cosigner does not cosign for origin {origin:?}")]
    UnknownOrigin {
        /// The checkpoint's first line.
        origin: String,
    },
    /// No signature by a key configured for the origin (403 `not_signed`).
    #[error("the checkpoint carries no signature by a key configured for origin {origin:?}")]
    NotSigned {
        /// The origin.
        origin: String,
    },
    /// A signature line names a configured key but does not verify
    /// (403 `bad_signature`).
    #[error("the signature by {key} does not verify")]
    BadSignature {
        /// `name+keyid` of the key.
        key: String,
    },
    /// The old size is larger than the checkpoint's (400 `old_size_too_large`).
    #[error("old size {old} is larger than the checkpoint's size {size}")]
    OldSizeTooLarge {
        /// The request's old size.
        old: TreeSize,
        /// The checkpoint's size.
        size: TreeSize,
    },
    /// The old size is not the size last cosigned (409, body: that size).
    #[error("old size {old} is not the size last cosigned, {known}")]
    Conflict {
        /// The request's old size.
        old: TreeSize,
        /// The size last cosigned for the origin.
        known: TreeSize,
    },
    /// The checkpoint is not consistent with the one last cosigned, or its
    /// proof is malformed for the sizes (422 `inconsistent`).
    #[error("{0}")]
    Inconsistent(String),
    /// The state could not be read or written (500; nothing was cosigned).
    #[error("state: {0}")]
    State(#[from] StateError),
}

impl AddCheckpointError {
    /// The HTTP status of the answer.
    #[must_use]
    pub fn status(&self) -> u16 {
        match self {
            Self::Malformed { .. } | Self::OldSizeTooLarge { .. } => 400,
            Self::NotSigned { .. } | Self::BadSignature { .. } => 403,
            Self::UnknownOrigin { .. } => 404,
            Self::Conflict { .. } => 409,
            Self::Inconsistent(_) => 422,
            Self::State(_) => 500,
        }
    }

    /// The stable error code (docs/api.md, "The cosigner").
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::Malformed { .. } => "malformed",
            Self::UnknownOrigin { .. } => "unknown_origin",
            Self::NotSigned { .. } => "not_signed",
            Self::BadSignature { .. } => "bad_signature",
            Self::OldSizeTooLarge { .. } => "old_size_too_large",
            Self::Conflict { .. } => "conflict",
            Self::Inconsistent(_) => "inconsistent",
            Self::State(_) => "internal",
        }
    }
}

/// A cosigner: its key, the logs it cosigns for and its state.
pub struct Cosigner {
    signer: CosignatureSigner,
    logs: Logs,
    state: State,
    clock: Arc<dyn Clock>,
    metrics: Metrics,
}

impl std::fmt::Debug for Cosigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cosigner")
            .field("key", &self.signer.verifier().vkey())
            .field("logs", &self.logs.len())
            .finish_non_exhaustive()
    }
}

impl Cosigner {
    /// A cosigner over an opened state.
    #[must_use]
    pub fn new(signer: CosignatureSigner, logs: Logs, state: State, clock: Arc<dyn Clock>) -> Self {
        Self {
            signer,
            logs,
            state,
            clock,
            metrics: Metrics::default(),
        }
    }

    /// The cosigner's signing key.
    #[must_use]
    pub fn signer(&self) -> &CosignatureSigner {
        &self.signer
    }

    /// The configured logs.
    #[must_use]
    pub fn logs(&self) -> &Logs {
        &self.logs
    }

    /// The state.
    #[must_use]
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The request counters.
    #[must_use]
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The latest checkpoint cosigned for the configured log whose origin
    /// hashes to `origin_hash`.
    ///
    /// # Errors
    /// [`StateError`] when the state cannot be read.
    pub fn latest_by_origin_hash(&self, origin_hash: &str) -> Result<Option<Cosigned>, StateError> {
        match self.logs.by_origin_hash(origin_hash) {
            Some(log) => self.state.latest(&log.origin),
            None => Ok(None),
        }
    }

    /// Handles one add-checkpoint request body: checks it in the order of
    /// c2sp.org/tlog-witness, and when every check passes persists the new
    /// state and returns the cosignature line (`— <name> <base64>\n`).
    /// Blocking (a durable redb commit): call it off the async runtime.
    ///
    /// # Errors
    /// [`AddCheckpointError`], whose status and code make the answer.
    pub fn add_checkpoint(&self, body: &[u8]) -> Result<String, AddCheckpointError> {
        let result = self.add_checkpoint_inner(body);
        self.metrics.count(match &result {
            Ok(_) => "ok",
            Err(e) => e.code(),
        });
        if let Err(
            e @ (AddCheckpointError::Inconsistent(_) | AddCheckpointError::BadSignature { .. }),
        ) = &result
        {
            // c2sp.org/tlog-witness: a validly signed checkpoint that fails
            // the consistency checks may be proof of log misbehaviour; keep
            // it in the log output.
            tracing::warn!(error = %e, request = %String::from_utf8_lossy(body), "refused a checkpoint");
        }
        result
    }

    fn add_checkpoint_inner(&self, body: &[u8]) -> Result<String, AddCheckpointError> {
        let request =
            AddCheckpointRequest::parse(body).map_err(|e| AddCheckpointError::Malformed {
                reason: e.to_string(),
            })?;
        let origin = request
            .note
            .split_once('\n')
            .map_or(request.note.as_str(), |(first, _)| first);
        let log = self
            .logs
            .get(origin)
            .ok_or_else(|| AddCheckpointError::UnknownOrigin {
                origin: origin.to_owned(),
            })?;
        let (checkpoint, body_text, log_signatures) = open_for_log(&request.note, log)?;
        if request.old_size > checkpoint.size {
            return Err(AddCheckpointError::OldSizeTooLarge {
                old: request.old_size,
                size: checkpoint.size,
            });
        }
        let now = u64::try_from(self.clock.now().as_millis() / 1000).unwrap_or(0);
        let mut line = String::new();
        let stored = self.state.advance(
            &log.origin,
            request.old_size,
            &checkpoint,
            &request.proof,
            |earliest| {
                // Never zero (the protocol forbids it), never before the
                // log's previous cosignature.
                let timestamp = now.max(earliest).max(1);
                line = self.signer.cosign(body_text.as_bytes(), timestamp);
                let mut note = format!("{body_text}\n");
                for sig in &log_signatures {
                    note.push_str(&sig.to_line());
                }
                note.push_str(&line);
                (timestamp, note)
            },
        );
        match stored {
            Ok(cosigned) => {
                self.metrics.cosigned(&log.origin, &cosigned);
                Ok(line)
            }
            Err(AdvanceError::Conflict { old, known }) => {
                Err(AddCheckpointError::Conflict { old, known })
            }
            Err(AdvanceError::State(e)) => Err(AddCheckpointError::State(e)),
            Err(e) => Err(AddCheckpointError::Inconsistent(e.to_string())),
        }
    }
}

/// Verifies the log's signature on `note` with the keys configured for the
/// log (a signature by an unknown key is ignored, one by a configured key
/// that fails refuses the note) and parses its checkpoint. Returns the
/// checkpoint and the note's text (the checkpoint body, as signed) and the log signatures
/// that verified.
fn open_for_log(
    note: &str,
    log: &LogConfig,
) -> Result<(Checkpoint, String, Vec<NoteSignature>), AddCheckpointError> {
    // Read by tally's signed-note grammar (protocol.md §7.4), the one every
    // reader of notes in tally applies.
    let parsed = SignedNote::parse(note).map_err(|e| AddCheckpointError::Malformed {
        reason: format!("the checkpoint is not a C2SP signed note: {e}"),
    })?;
    let mut verified = Vec::new();
    for key in &log.keys {
        let Some(line) = parsed.signature_by(key.name(), key.id()) else {
            continue;
        };
        if !key.verifies(parsed.text.as_bytes(), &line.signature) {
            return Err(AddCheckpointError::BadSignature { key: key.label() });
        }
        verified.push(line.clone());
    }
    if verified.is_empty() {
        return Err(AddCheckpointError::NotSigned {
            origin: log.origin.clone(),
        });
    }
    let checkpoint =
        Checkpoint::from_body(&parsed.text).map_err(|e| AddCheckpointError::Malformed {
            reason: e.to_string(),
        })?;
    Ok((checkpoint, parsed.text, verified))
}
