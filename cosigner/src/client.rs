//! The log's side of c2sp.org/tlog-witness: send a checkpoint to a
//! cosigner's `add-checkpoint`, follow a `409` to the size the cosigner
//! holds, and check the cosignature it returns with the cosigner's key
//! before the log keeps it (docs/protocol.md §14.3).
//!
//! ```text
//! let client = CosignerClient::new(url, cosigner_key, Duration::from_secs(10))?;
//! let got = client
//!     .request_cosignature(&note, believed_size, |old| log.consistency_proof(old, size))
//!     .await?;
//! let cosigned_note = attach_cosignature(&note, &got.line);
//! // and remember got.size as the size this cosigner holds
//! ```

use std::time::Duration;

use tally_schemas::cosignature::{parse_conflict_size, AddCheckpointRequest, CosignatureVerifier};
use tally_schemas::hash::Hash;
use tally_schemas::note::{peek_checkpoint, Checkpoint, NoteError, SignedNote};
use tally_schemas::tree::TreeSize;

/// Largest answer body read from a cosigner.
pub const MAX_ANSWER_BYTES: usize = 65_536;

/// A cosignature the cosigner returned, checked with its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cosignature {
    /// The signature line, `— <name> <base64>\n`, to append to the note.
    pub line: String,
    /// Its timestamp (POSIX seconds).
    pub timestamp: u64,
    /// The checkpoint size it cosigns (the cosigner now holds this size).
    pub size: TreeSize,
}

/// Why no cosignature was obtained.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The cosigner holds another size than the old size sent (409).
    #[error("the cosigner holds size {known}")]
    Conflict {
        /// The size it last cosigned.
        known: TreeSize,
    },
    /// The cosigner holds a larger tree than this checkpoint: it cosigned a
    /// later checkpoint of this origin, and will not go back.
    #[error("the cosigner holds size {known}, larger than this checkpoint's {size}")]
    Ahead {
        /// The size it holds.
        known: TreeSize,
        /// The checkpoint's size.
        size: TreeSize,
    },
    /// Any other refusal, with the cosigner's status and body.
    #[error("the cosigner refused with {status}: {body}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// The answer body (cut to 512 bytes).
        body: String,
    },
    /// The request did not complete (connection, timeout).
    #[error("cosigner unreachable: {0}")]
    Transport(String),
    /// A 200 answer without a valid cosignature by the cosigner's key.
    #[error("bad answer from the cosigner: {0}")]
    BadAnswer(String),
    /// The note to send is not a checkpoint.
    #[error("the note is not a checkpoint: {0}")]
    Note(#[from] NoteError),
    /// The log could not give a consistency proof.
    #[error("no consistency proof from size {from}: {reason}")]
    Proof {
        /// The old size.
        from: TreeSize,
        /// Why.
        reason: String,
    },
}

/// A client of one cosigner.
#[derive(Debug, Clone)]
pub struct CosignerClient {
    http: reqwest::Client,
    url: String,
    key: CosignatureVerifier,
}

/// `note` with the cosignature `line` appended after its signature lines.
#[must_use]
pub fn attach_cosignature(note: &str, line: &str) -> String {
    format!("{note}{line}")
}

impl CosignerClient {
    /// A client of the cosigner whose submission prefix is `url` (e.g.
    /// `http://127.0.0.1:7880`) and whose key is `key`; every request is
    /// bounded by `timeout`.
    ///
    /// # Errors
    /// [`ClientError::Transport`] when the HTTP client cannot be built.
    pub fn new(
        url: &str,
        key: CosignatureVerifier,
        timeout: Duration,
    ) -> Result<Self, ClientError> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .build()
            .map_err(|e| ClientError::Transport(e.to_string()))?;
        Ok(Self {
            http,
            url: url.trim_end_matches('/').to_owned(),
            key,
        })
    }

    /// The cosigner's key.
    #[must_use]
    pub fn key(&self) -> &CosignatureVerifier {
        &self.key
    }

    /// One add-checkpoint request. A `409` is [`ClientError::Conflict`]
    /// with the cosigner's size; a `200` must carry a cosignature line by
    /// this cosigner's key over the checkpoint, whose signature verifies
    /// (lines by other keys are ignored, as the protocol says).
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn add_checkpoint(
        &self,
        request: &AddCheckpointRequest,
    ) -> Result<Cosignature, ClientError> {
        let checkpoint = peek_checkpoint(&request.note)?;
        let mut answer = self
            .http
            .post(format!("{}/add-checkpoint", self.url))
            .body(request.to_body())
            .send()
            .await
            .map_err(|e| ClientError::Transport(e.to_string()))?;
        let status = answer.status().as_u16();
        let mut body = Vec::new();
        while let Some(chunk) = answer
            .chunk()
            .await
            .map_err(|e| ClientError::Transport(e.to_string()))?
        {
            if body.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(ClientError::BadAnswer(format!(
                    "answer larger than {MAX_ANSWER_BYTES} bytes"
                )));
            }
            body.extend_from_slice(&chunk);
        }
        match status {
            200 => self.check_answer(&request.note, &checkpoint, &body),
            409 => {
                let known =
                    parse_conflict_size(&body).map_err(|e| ClientError::BadAnswer(e.to_owned()))?;
                Err(ClientError::Conflict { known })
            }
            _ => Err(ClientError::Refused {
                status,
                body: String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned(),
            }),
        }
    }

    /// Asks for a cosignature of `note` (a checkpoint the log signed),
    /// starting from the size the log believes the cosigner holds
    /// (`believed`, 0 when it knows nothing). On a `409` it asks
    /// `proof_from` for the consistency proof from the cosigner's size to
    /// the checkpoint's and tries once more. Sizes 0 and equal sizes need
    /// no proof and `proof_from` is not called for them.
    ///
    /// # Errors
    /// [`ClientError`]; [`ClientError::Ahead`] when the cosigner already
    /// holds a larger tree.
    pub async fn request_cosignature<E: std::fmt::Display>(
        &self,
        note: &str,
        believed: TreeSize,
        mut proof_from: impl FnMut(TreeSize) -> Result<Vec<Hash>, E>,
    ) -> Result<Cosignature, ClientError> {
        let size = peek_checkpoint(note)?.size;
        let mut request = |old: TreeSize| -> Result<AddCheckpointRequest, ClientError> {
            let proof = if old.get() == 0 || old == size {
                Vec::new()
            } else {
                proof_from(old).map_err(|e| ClientError::Proof {
                    from: old,
                    reason: e.to_string(),
                })?
            };
            Ok(AddCheckpointRequest {
                old_size: old,
                proof,
                note: note.to_owned(),
            })
        };
        let first = request(believed.min(size))?;
        match self.add_checkpoint(&first).await {
            Err(ClientError::Conflict { known }) if known > size => {
                Err(ClientError::Ahead { known, size })
            }
            Err(ClientError::Conflict { known }) => self.add_checkpoint(&request(known)?).await,
            other => other,
        }
    }

    fn check_answer(
        &self,
        note: &str,
        checkpoint: &Checkpoint,
        body: &[u8],
    ) -> Result<Cosignature, ClientError> {
        let bad = |m: &str| ClientError::BadAnswer(m.to_owned());
        let text = std::str::from_utf8(body).map_err(|_| bad("not UTF-8"))?;
        if text.is_empty() || !text.ends_with('\n') {
            return Err(bad("signature lines must end in a newline"));
        }
        // Appended to the note, the lines must still make a valid signed
        // note (protocol.md §7.4); read that way, each is a signature line.
        let before = SignedNote::parse(note)
            .map_err(ClientError::Note)?
            .signatures
            .len();
        let cosigned = SignedNote::parse(&attach_cosignature(note, text))
            .map_err(|_| bad("the lines do not extend the note as signature lines"))?;
        // Only the answer's lines, not lines the note already had.
        let Some(sig) = cosigned.signatures[before..]
            .iter()
            .find(|l| l.name == self.key.name() && l.key_id == self.key.id())
        else {
            return Err(bad("no cosignature by the cosigner's key"));
        };
        let timestamp = self
            .key
            .verify_cosignature(cosigned.text.as_bytes(), &sig.signature)
            .map_err(|_| bad("the cosignature does not verify with the cosigner's key"))?;
        if timestamp == 0 {
            return Err(bad("the cosignature has timestamp 0"));
        }
        Ok(Cosignature {
            line: sig.to_line(),
            timestamp,
            size: checkpoint.size,
        })
    }
}
