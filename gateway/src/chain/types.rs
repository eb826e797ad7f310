//! The chain's types and the requests its writers pass (what a writer
//! asks, where the answer goes), shared by the handle (`chain`'s mod.rs),
//! the owner, the member and the wire format, which depend on these and
//! not on each other's files.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tally_schemas::disclosure::Disclosure;
use tally_schemas::time::Clock;
use tally_schemas::{AgentName, Body, Hash, Record, SecretKey};
use tokio::sync::oneshot;

use crate::disclose::Parts;
use crate::recorder::{answer, AppendError};
use crate::state::StateDir;
use crate::store::{Secret, StoreError, StoreStatus, SyncErrorNote};
use crate::toollist::DeclaredTools;

/// Largest frame on the writer socket: a record is at most 32 KiB, but a
/// secret may carry the call's content (`--store-content`).
pub const MAX_FRAME: usize = 64 << 20;
/// How long a member keeps trying to reach (or become) the owner before
/// its requests fail.
pub(super) const ESTABLISH_FOR: Duration = Duration::from_secs(10);
/// How far back a new owner looks for a retried append's record.
pub(super) const RETRY_LOOKBACK: usize = 8192;
/// How long closing waits for a member's requests to be answered.
pub(super) const CLOSE_WAIT: Duration = Duration::from_secs(5);
pub(super) use tally_schemas::limits::DEFAULT_TOOL_LIST_LEASE_MS as DEFAULT_SOURCE_LEASE_MS;

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(super) fn source_label(source: Option<&str>) -> String {
    match source {
        Some(s) => format!("{s:?}"),
        None => "(unnamed)".into(),
    }
}

/// Why the chain could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    /// Local state (key, configuration).
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    /// The agent's syncer could not be set up.
    #[error(transparent)]
    Setup(#[from] crate::SetupError),
    /// The store.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Neither the store nor its owner could be reached.
    #[error("{0}")]
    Unreachable(String),
}

/// Who a writer is, as `tally status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriterInfo {
    /// `gateway`, `record`, `sync`, `sdk`, …
    pub kind: String,
    /// The tool source it declares (docs/protocol.md §5.3), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

impl WriterInfo {
    /// A writer of `kind` with no tool source.
    #[must_use]
    pub fn new(kind: &str) -> Self {
        Self {
            kind: kind.to_owned(),
            source: None,
        }
    }
}

/// One writer of the chain, as the owner sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriterStatus {
    /// Its process id.
    pub pid: u32,
    /// Who it is.
    #[serde(flatten)]
    pub info: WriterInfo,
    /// Whether it holds the store (and runs the sync).
    pub owner: bool,
    /// Records it appended through this owner.
    pub records: u64,
    /// Its last record's seq.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seq: Option<u64>,
}

/// What the owner says of the chain, for `tally status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChainStatus {
    /// The owner's process id: the one process that syncs.
    pub owner_pid: u32,
    /// Whether the owner syncs (a witness is configured).
    pub syncing: bool,
    /// Every writer connected, the owner first.
    pub writers: Vec<WriterStatus>,
    /// The store.
    pub store: StoreStatus,
    /// The sync task's last failure, if it has not succeeded since.
    #[serde(default)]
    pub sync_failure: Option<SyncErrorNote>,
}

/// How waiting for a receipt ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Waited {
    /// The record (and every one before it) has an accepted receipt: the
    /// record's, as the witness sent it, when the owner has it.
    Receipted {
        /// The receipt's JSON.
        #[serde(default)]
        receipt: Option<String>,
    },
    /// No witness is configured for the agent.
    NoWitness,
    /// Syncing stopped for good.
    Halted {
        /// Why.
        note: SyncErrorNote,
    },
    /// With one try: the try failed.
    Failed {
        /// Why.
        note: SyncErrorNote,
    },
    /// No receipt within the time allowed.
    TimedOut {
        /// The last sync failure, if any.
        last: Option<SyncErrorNote>,
    },
}

pub(super) type AppendFuture = Pin<Box<dyn Future<Output = Result<Record, AppendError>> + Send>>;
pub(super) type AppendReply = oneshot::Sender<Result<Record, AppendError>>;
pub(super) type DeclareFuture = Pin<Box<dyn Future<Output = Result<bool, AppendError>> + Send>>;

/// What a writer asks of the chain.
pub(super) enum Cmd {
    Append {
        body: Box<Body>,
        secret: Option<Secret>,
        durable: bool,
        reply: Option<AppendReply>,
    },
    Wait {
        seq: u64,
        timeout: Duration,
        one_try: bool,
        reply: oneshot::Sender<Waited>,
    },
    Status {
        reply: oneshot::Sender<Result<ChainStatus, String>>,
    },
    Declare {
        tools: DeclaredTools,
        reply: oneshot::Sender<Result<bool, AppendError>>,
    },
    OpenDecision {
        call_id: String,
        reply: oneshot::Sender<Result<Option<Hash>, String>>,
    },
    Disclose {
        agent: AgentName,
        call_id: String,
        parts: Parts,
        reply: oneshot::Sender<Result<Disclosure, String>>,
    },
    Close {
        reply: oneshot::Sender<()>,
    },
}

/// What a writer's driver knows to (re)establish its role.
pub(super) struct Ctx {
    pub(super) state: StateDir,
    pub(super) agent: AgentName,
    pub(super) key: SecretKey,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) me: WriterInfo,
    pub(super) final_sync: Duration,
    pub(super) window: Option<usize>,
}

/// Where the answer to a request goes, whatever its kind: failing one
/// is [`Reply::fail`], for a command and for a member's pending request.
pub(super) enum Reply {
    Append(Option<AppendReply>),
    Wait(oneshot::Sender<Waited>),
    Status(oneshot::Sender<Result<ChainStatus, String>>),
    Declare(oneshot::Sender<Result<bool, AppendError>>),
    OpenDecision(oneshot::Sender<Result<Option<Hash>, String>>),
    Disclose(oneshot::Sender<Result<Disclosure, String>>),
    Close(oneshot::Sender<()>),
}

impl Reply {
    /// Answers that the request could not be carried out, saying `why`.
    pub(super) fn fail(self, why: &str) {
        match self {
            Self::Append(reply) => answer(reply, Err(AppendError::Unavailable(why.into()))),
            Self::Wait(reply) => {
                let _ = reply.send(Waited::TimedOut {
                    last: Some(SyncErrorNote {
                        time: tally_schemas::UnixMillis::new(0),
                        seq: None,
                        code: "unavailable".into(),
                        message: why.into(),
                    }),
                });
            }
            Self::Status(reply) => {
                let _ = reply.send(Err(why.into()));
            }
            Self::Declare(reply) => {
                let _ = reply.send(Err(AppendError::Unavailable(why.into())));
            }
            Self::OpenDecision(reply) => {
                let _ = reply.send(Err(why.into()));
            }
            Self::Disclose(reply) => {
                let _ = reply.send(Err(why.into()));
            }
            Self::Close(reply) => {
                let _ = reply.send(());
            }
        }
    }
}
