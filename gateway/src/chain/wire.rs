//! The writer socket's frames: a 4-byte big-endian length, then that many
//! bytes of JSON, a [`Request`] from a member or an [`Answer`] from the
//! owner, at most [`MAX_FRAME`] bytes (docs/architecture.md "Several
//! writers, one chain").

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tally_schemas::disclosure::Disclosure;
use tally_schemas::{AgentName, Record, RecordKind};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::{ChainStatus, DeclaredTools, Waited, WriterInfo, MAX_FRAME};
use crate::disclose::Parts;
use crate::recorder::AppendError;
use crate::store::Secret;

/// A request from a member to the owner.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// The first frame: who the member is.
    Hello {
        /// Its process id.
        pid: u32,
        /// Who it is.
        info: WriterInfo,
    },
    /// Append a record with this body.
    Append {
        /// The member's id for the request, echoed in the answer.
        id: u64,
        /// The record's kind.
        kind: RecordKind,
        /// The body, as in a record.
        body: Value,
        /// Its salt (and content).
        #[serde(default)]
        secret: Option<Secret>,
        /// Answer only once the record is committed with fsync.
        #[serde(default)]
        durable: bool,
        /// Sent before, to an owner that went without answering.
        #[serde(default)]
        retry: bool,
    },
    /// Wait for the receipt of the record at `seq`.
    Wait {
        /// Echoed.
        id: u64,
        /// The record.
        seq: u64,
        /// How long.
        timeout_ms: u64,
        /// Answer after the first sync attempt that fails.
        one_try: bool,
    },
    /// The chain's status.
    Status {
        /// Echoed.
        id: u64,
    },
    /// Declare a tool source's list.
    Declare {
        /// Echoed.
        id: u64,
        /// The list.
        tools: DeclaredTools,
    },
    /// The record hash of the open decision with this call id.
    OpenDecision {
        /// Echoed.
        id: u64,
        /// The call id.
        call_id: String,
    },
    /// A call's content and salts from the store (docs/protocol.md §6.3).
    Disclose {
        /// Echoed.
        id: u64,
        /// The agent the call must be of.
        agent: AgentName,
        /// The call id.
        call_id: String,
        /// Which parts.
        parts: Parts,
    },
}

impl Request {
    pub(super) fn id(&self) -> Option<u64> {
        match self {
            Self::Hello { .. } => None,
            Self::Append { id, .. }
            | Self::Wait { id, .. }
            | Self::Status { id }
            | Self::Declare { id, .. }
            | Self::OpenDecision { id, .. }
            | Self::Disclose { id, .. } => Some(*id),
        }
    }
}

/// An answer from the owner.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Answer {
    /// To `hello`.
    Welcome {
        /// The owner's process id.
        owner_pid: u32,
    },
    /// The record appended (canonical JSON).
    Appended {
        /// Echoed.
        id: u64,
        /// The record.
        record: String,
    },
    /// The request failed.
    Refused {
        /// Echoed.
        id: u64,
        /// A stable code.
        code: String,
        /// Why.
        message: String,
    },
    /// To `wait`.
    Waited {
        /// Echoed.
        id: u64,
        /// How it ended.
        waited: Waited,
    },
    /// To `status`.
    Status {
        /// Echoed.
        id: u64,
        /// The status.
        status: Box<ChainStatus>,
    },
    /// To `declare`: whether a new list was recorded.
    Declared {
        /// Echoed.
        id: u64,
        /// False when the same list was declared recently.
        recorded: bool,
    },
    /// To `open_decision`.
    Found {
        /// Echoed.
        id: u64,
        /// The decision's record hash, hex; none when there is none.
        hash: Option<String>,
    },
    /// To `disclose`.
    Disclosed {
        /// Echoed.
        id: u64,
        /// The disclosure.
        disclosure: Box<Disclosure>,
    },
}

pub(super) async fn write_frame<W: tokio::io::AsyncWrite + Unpin, T: Serialize>(
    w: &mut W,
    value: &T,
) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    if bytes.len() > MAX_FRAME {
        return Err(std::io::Error::other(format!(
            "a frame of {} bytes is over the writer socket's limit of {MAX_FRAME}",
            bytes.len()
        )));
    }
    let len = u32::try_from(bytes.len()).map_err(std::io::Error::other)?;
    let mut out = Vec::with_capacity(4 + bytes.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&bytes);
    w.write_all(&out).await?;
    w.flush().await
}

/// Reads one frame; `None` at a clean end of the stream.
pub(super) async fn read_frame<R: tokio::io::AsyncRead + Unpin, T: for<'de> Deserialize<'de>>(
    r: &mut R,
) -> std::io::Result<Option<T>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::other(format!(
            "a frame of {len} bytes is over the writer socket's limit"
        )));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf).await?;
    serde_json::from_slice(&buf)
        .map(Some)
        .map_err(|e| std::io::Error::other(format!("a frame that does not parse: {e}")))
}

pub(super) fn refused(id: u64, e: &AppendError) -> Answer {
    Answer::Refused {
        id,
        code: e.code().to_owned(),
        message: e.to_string(),
    }
}

pub(super) fn appended(id: u64, r: Result<Record, AppendError>) -> Answer {
    match r {
        Ok(record) => Answer::Appended {
            id,
            record: String::from_utf8_lossy(record.canonical_bytes()).into_owned(),
        },
        Err(e) => refused(id, &e),
    }
}
