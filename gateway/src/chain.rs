//! One agent's chain, written by every tool source on this host at once
//! (docs/architecture.md "Several writers, one chain"; docs/operations.md
//! "Several writers for one agent").
//!
//! An agent has one chain (docs/protocol.md §3): one `seq` after another,
//! each `prev` the record before it. Several processes record for it (one
//! `tally gateway` per MCP server, `tally record`, the SDKs), so exactly one
//! of them holds the chain store and signs; the others hand it their
//! records over a Unix socket beside the store and wait for its answer.
//!
//! - The *owner* is whichever writer opened `chain.redb`: redb's file lock
//!   (an `flock`, released by the kernel when the process dies, so no lock
//!   is ever stale) makes it one at a time. It runs the chain writer
//!   ([`crate::recorder`], with the record journal), the one sync task of
//!   the agent, and a listener on `writer.sock`.
//! - Every other writer is a *member*: it connects, says who it is, and
//!   sends each append as a frame. The owner queues the frames of one
//!   connection in order and answers each once its record is in the
//!   journal (or committed with fsync, when the member asks for that), so
//!   "recorded" means the same for every writer: a decision is durable
//!   before its call is forwarded.
//! - When the owner goes (stopped, or killed at any moment), its members'
//!   connections end. Each member then tries to open the store; the one that
//!   gets it replays the journal the owner left and becomes the owner, the
//!   others connect to it. Requests a member had sent without an answer are
//!   sent again, marked as retries: the new owner answers a retried append
//!   with the record already in the chain when its body is there (bodies
//!   carry fresh salts, so a body names one request), so a record is never
//!   written twice.
//!
//! Every writer goes through [`AgentChain`]: the gateway's transports (via
//! [`crate::calls`]), `tally record`, `tally agent sync` and the SDKs.
//!
//! The socket frames: a 4-byte big-endian length, then that many bytes of
//! JSON ([`Request`] from a member, [`Answer`] from the owner). A frame is
//! at most [`MAX_FRAME`] bytes.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tally_schemas::canonical;
use tally_schemas::record::ToolEntry;
use tally_schemas::time::Clock;
use tally_schemas::{AgentName, Body, Hash, Record, RecordKind, SecretKey};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot, watch};

use crate::journal::Journal;
use crate::recorder::{answer, AppendError, Recorder, RecorderHandle};
use crate::state::StateDir;
use crate::store::{ChainStore, Secret, StoreError, StoreStatus, SyncErrorNote};
use crate::sync::{SyncProgress, Syncer};

/// Largest frame on the writer socket: a record is at most 32 KiB, but a
/// secret may carry the call's content (`--store-content`).
pub const MAX_FRAME: usize = 64 << 20;
/// How long a member keeps trying to reach (or become) the owner before
/// its requests fail.
const ESTABLISH_FOR: Duration = Duration::from_secs(10);
/// How far back a new owner looks for a retried append's record.
const RETRY_LOOKBACK: usize = 8192;
/// How long closing waits for a member's requests to be answered.
const CLOSE_WAIT: Duration = Duration::from_secs(5);
use tally_schemas::limits::DEFAULT_TOOL_LIST_LEASE_MS as DEFAULT_SOURCE_LEASE_MS;

fn source_label(source: Option<&str>) -> String {
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

/// A tool source's list, declared through [`AgentChain::declare_tools`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeclaredTools {
    /// The source's name (docs/protocol.md §5.3), or none for the agent's
    /// unnamed source.
    pub source: Option<String>,
    /// How long the declaration holds, in milliseconds (none: the
    /// protocol's default).
    pub lease_ms: Option<u64>,
    /// The tools, in the source's order.
    pub entries: Vec<ToolEntry>,
}

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
}

impl Request {
    fn id(&self) -> Option<u64> {
        match self {
            Self::Hello { .. } => None,
            Self::Append { id, .. }
            | Self::Wait { id, .. }
            | Self::Status { id }
            | Self::Declare { id, .. }
            | Self::OpenDecision { id, .. } => Some(*id),
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
}

async fn write_frame<W: tokio::io::AsyncWrite + Unpin, T: Serialize>(
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
async fn read_frame<R: tokio::io::AsyncRead + Unpin, T: for<'de> Deserialize<'de>>(
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

type AppendFuture = Pin<Box<dyn Future<Output = Result<Record, AppendError>> + Send>>;
type AppendReply = oneshot::Sender<Result<Record, AppendError>>;
type DeclareFuture = Pin<Box<dyn Future<Output = Result<bool, AppendError>> + Send>>;

/// What a writer asks of the chain.
enum Cmd {
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
    Close {
        reply: oneshot::Sender<()>,
    },
}

/// How an owner is set up: by [`AgentChain::open`] from the agent's state
/// folder, or by [`AgentChain::with_writer`] over a chain writer a test
/// made.
struct OwnerCore {
    handle: RecorderHandle,
    store: Option<Arc<ChainStore>>,
    syncer: Option<Arc<Syncer>>,
    progress: Option<watch::Receiver<SyncProgress>>,
    writers: Mutex<BTreeMap<u64, WriterStatus>>,
    /// Body hash → record, of the chain's tail when the first retry came.
    recent: Mutex<Option<HashMap<Hash, Record>>>,
    /// Per tool source: the last list declared in this owner's run.
    declared: Mutex<HashMap<Option<String>, Declared>>,
    /// Set when the owner closes: waits end, so nothing holds the store.
    closing: watch::Sender<bool>,
}

/// A tool source's last declaration, as its owner remembers it.
struct Declared {
    fingerprint: String,
    at: tokio::time::Instant,
    lease: Duration,
    names: std::collections::BTreeSet<String>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn body_hash(body: &Body) -> Hash {
    Hash::sha256(&canonical::canonicalize(body).unwrap_or_default())
}

impl OwnerCore {
    /// Queues an append now; the future resolves with its record.
    fn append(
        self: &Arc<Self>,
        writer: u64,
        body: Body,
        secret: Option<Secret>,
        durable: bool,
        retry: bool,
    ) -> Result<AppendFuture, AppendError> {
        if retry {
            if let Some(r) = self.find_recent(&body) {
                return Ok(Box::pin(async move { Ok(r) }));
            }
        }
        let queued = self.handle.append_queued(body, secret)?;
        let core = Arc::clone(self);
        Ok(Box::pin(async move {
            let record = queued.await?;
            if durable {
                core.handle.wait_committed(record.seq.get()).await?;
            }
            if let Some(w) = lock(&core.writers).get_mut(&writer) {
                w.records += 1;
                w.last_seq = Some(record.seq.get());
            }
            // Once retries were asked about, keep their index current, so a
            // member that reconnects to this same owner finds what it sent.
            let mut recent = lock(&core.recent);
            if let Some(index) = recent.as_mut() {
                if index.len() >= 4 * RETRY_LOOKBACK {
                    *recent = None;
                } else {
                    index.insert(body_hash(&record.body), record.clone());
                }
            }
            drop(recent);
            Ok(record)
        }))
    }

    /// The record whose body is `body`, among the last [`RETRY_LOOKBACK`]
    /// of the chain when the first retry came.
    fn find_recent(&self, body: &Body) -> Option<Record> {
        let store = self.store.as_ref()?;
        let mut recent = lock(&self.recent);
        if recent.is_none() {
            let end = store.status().ok()?.records;
            let from = end.saturating_sub(RETRY_LOOKBACK as u64);
            let records = store.records(from, RETRY_LOOKBACK).ok()?;
            *recent = Some(
                records
                    .into_iter()
                    .map(|r| (body_hash(&r.body), r))
                    .collect(),
            );
        }
        recent.as_ref()?.get(&body_hash(body)).cloned()
    }

    async fn wait(&self, seq: u64, timeout: Duration, one_try: bool) -> Waited {
        let Some(mut progress) = self.progress.clone() else {
            return Waited::NoWitness;
        };
        // Cut a backoff short for a waiter that allows retries; one that
        // allows one try gets the attempt its record's commit starts, and
        // no other (`tally record` without --wait-receipt: docs/operations.md
        // "Syncing").
        if !one_try {
            if let Some(s) = &self.syncer {
                s.nudge();
            }
        }
        let start_attempts = progress.borrow().attempts;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut closing = self.closing.subscribe();
        loop {
            {
                let p = progress.borrow_and_update();
                if p.cursor > seq {
                    let receipt = self
                        .store
                        .as_ref()
                        .and_then(|s| s.receipt(seq).ok().flatten())
                        .map(|b| String::from_utf8_lossy(&b).into_owned());
                    return Waited::Receipted { receipt };
                }
                if let Some(h) = &p.halted {
                    return Waited::Halted { note: h.clone() };
                }
                if one_try && p.attempts > start_attempts {
                    if let Some(f) = &p.failure {
                        return Waited::Failed { note: f.clone() };
                    }
                }
            }
            tokio::select! {
                changed = tokio::time::timeout_at(deadline, progress.changed()) => match changed {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) | Err(_) => {
                        return Waited::TimedOut {
                            last: progress.borrow().failure.clone(),
                        }
                    }
                },
                _ = closing.wait_for(|c| *c) => {
                    return Waited::TimedOut {
                        last: progress.borrow().failure.clone(),
                    }
                }
            }
        }
    }

    fn open_decision(&self, call_id: &str) -> Result<Option<Hash>, String> {
        let store = self
            .store
            .as_ref()
            .ok_or_else(|| "no chain store".to_owned())?;
        let Some(seq) = store.open_decision(call_id).map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        Ok(store
            .record(seq)
            .map_err(|e| e.to_string())?
            .map(|r| r.hash()))
    }

    fn status(&self) -> Result<ChainStatus, String> {
        let store = self
            .store
            .as_ref()
            .ok_or_else(|| "no chain store".to_owned())?;
        let s = store.status().map_err(|e| e.to_string())?;
        Ok(ChainStatus {
            owner_pid: std::process::id(),
            syncing: self.syncer.is_some(),
            writers: lock(&self.writers).values().cloned().collect(),
            store: s,
            sync_failure: self
                .progress
                .as_ref()
                .and_then(|p| p.borrow().failure.clone()),
        })
    }

    /// Records `tools` unless the same list of the same source was declared
    /// within half its lease; resolves once the last part is in the journal.
    fn declare(
        self: &Arc<Self>,
        writer: u64,
        tools: DeclaredTools,
    ) -> Result<DeclareFuture, AppendError> {
        let lease = Duration::from_millis(tools.lease_ms.unwrap_or(DEFAULT_SOURCE_LEASE_MS));
        let fingerprint = crate::toollist::fingerprint(&tools.entries);
        let names: std::collections::BTreeSet<String> =
            tools.entries.iter().map(|e| e.name.clone()).collect();
        {
            let declared = lock(&self.declared);
            if let Some(d) = declared.get(&tools.source) {
                // Writers declare again every half lease, so a quarter
                // tells a renewal from a second writer's copy.
                if d.fingerprint == fingerprint && d.at.elapsed() < lease / 4 {
                    return Ok(Box::pin(async { Ok(false) }));
                }
            }
            // Two live sources must not declare one name: the records could
            // not say which source's tool a call went to.
            for (other, d) in declared.iter() {
                if *other == tools.source || d.at.elapsed() >= d.lease {
                    continue;
                }
                if let Some(name) = d.names.intersection(&names).next() {
                    return Err(AppendError::Refused {
                        code: "tool_name_conflict".into(),
                        message: format!(
                            "tool {name:?} of source {} is also declared by the agent's source {}: give the sources distinct --name-prefix values",
                            source_label(tools.source.as_deref()),
                            source_label(other.as_deref())
                        ),
                    });
                }
            }
        }
        let bodies = crate::toollist::list_bodies(&tools).map_err(|e| AppendError::Refused {
            code: "tool_list".into(),
            message: format!("the tool list could not be recorded: {e}"),
        })?;
        let n = bodies.len();
        let mut last = None;
        for (i, body) in bodies.into_iter().enumerate() {
            let fut = self.append(writer, body, None, false, false)?;
            if i + 1 == n {
                last = Some(fut);
            } else {
                tokio::spawn(async move {
                    if let Err(e) = fut.await {
                        eprintln!("tally: the tool list could not be recorded: {e}");
                    }
                });
            }
        }
        let core = Arc::clone(self);
        let source = tools.source.clone();
        Ok(Box::pin(async move {
            if let Some(fut) = last {
                fut.await?;
            }
            lock(&core.declared).insert(
                source,
                Declared {
                    fingerprint,
                    at: tokio::time::Instant::now(),
                    lease,
                    names,
                },
            );
            Ok(true)
        }))
    }

    fn dispatch(self: &Arc<Self>, writer: u64, cmd: Cmd) {
        match cmd {
            Cmd::Append {
                body,
                secret,
                durable,
                reply,
            } => match self.append(writer, *body, secret, durable, false) {
                Ok(fut) => {
                    tokio::spawn(async move {
                        let r = fut.await;
                        answer(reply, r);
                    });
                }
                Err(e) => answer(reply, Err(e)),
            },
            Cmd::Wait {
                seq,
                timeout,
                one_try,
                reply,
            } => {
                let core = Arc::clone(self);
                tokio::spawn(async move {
                    let _ = reply.send(core.wait(seq, timeout, one_try).await);
                });
            }
            Cmd::Status { reply } => {
                let _ = reply.send(self.status());
            }
            Cmd::Declare { tools, reply } => match self.declare(writer, tools) {
                Ok(fut) => {
                    tokio::spawn(async move {
                        let _ = reply.send(fut.await);
                    });
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            Cmd::OpenDecision { call_id, reply } => {
                let _ = reply.send(self.open_decision(&call_id));
            }
            Cmd::Close { reply } => {
                let _ = reply.send(());
            }
        }
    }
}

/// The owner's running parts, stopped by [`Owner::close`].
struct Owner {
    core: Arc<OwnerCore>,
    /// The store, released (its lock with it) before close returns.
    store: Arc<ChainStore>,
    recorder: Option<Recorder>,
    sync_task: Option<tokio::task::JoinHandle<()>>,
    stop_sync: Option<watch::Sender<bool>>,
    accept_task: Option<tokio::task::JoinHandle<()>>,
    shutdown: watch::Sender<bool>,
    conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    socket: Option<PathBuf>,
    final_sync: Duration,
}

impl Owner {
    async fn close(mut self) {
        let _ = self.shutdown.send(true);
        let _ = self.core.closing.send(true);
        // The background sync stops first: closing takes a while (commits,
        // members' last answers) and a retry it started meanwhile would be
        // a try nobody asked for. The last try, when wanted, is below.
        if let Some(s) = self.stop_sync.take() {
            let _ = s.send(true);
        }
        if let Some(t) = self.sync_task.take() {
            t.abort();
            let _ = t.await;
        }
        if let Some(t) = self.accept_task.take() {
            t.abort();
            let _ = t.await;
        }
        if let Some(p) = &self.socket {
            let _ = std::fs::remove_file(p);
        }
        // Everything queued is committed and answered.
        if let Some(r) = self.recorder.take() {
            let _ = tokio::task::spawn_blocking(move || r.close()).await;
        }
        let conns: Vec<_> = std::mem::take(&mut *lock(&self.conns));
        for c in conns {
            let _ = tokio::time::timeout(CLOSE_WAIT, c).await;
        }
        // One last try to send what is left (a post cut short is safe: the
        // witness answers its retry with the same receipt).
        if let Some(s) = &self.core.syncer {
            if !self.final_sync.is_zero() {
                let _ = tokio::time::timeout(
                    self.final_sync,
                    s.sync_until_idle(tokio::time::Instant::now()),
                )
                .await;
            }
        }
        // The store's lock goes with its last reference: wait for the
        // tasks that still hold one to end, so the next writer can open it
        // as soon as this returns.
        let Self { core, store, .. } = self;
        drop(core);
        let deadline = tokio::time::Instant::now() + CLOSE_WAIT;
        while Arc::strong_count(&store) > 1 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// Serves one member's connection until it ends or the owner closes.
async fn serve_member(
    core: Arc<OwnerCore>,
    stream: UnixStream,
    conn_id: u64,
    mut shutdown: watch::Receiver<bool>,
) {
    let (mut rd, mut wr) = stream.into_split();
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<Answer>();
    let writer = tokio::spawn(async move {
        while let Some(a) = out_rx.recv().await {
            if write_frame(&mut wr, &a).await.is_err() {
                break;
            }
        }
    });
    let mut inflight = tokio::task::JoinSet::new();
    // Waits are not answered when the owner closes: the member asks the
    // next owner again.
    let mut waits = tokio::task::JoinSet::new();
    loop {
        let frame = tokio::select! {
            f = read_frame::<_, Request>(&mut rd) => f,
            _ = shutdown.changed() => break,
        };
        let req = match frame {
            Ok(Some(r)) => r,
            Ok(None) => break,
            Err(e) => {
                eprintln!("tally: a writer's connection to the chain owner: {e}");
                break;
            }
        };
        let id = req.id().unwrap_or(0);
        match req {
            Request::Hello { pid, info } => {
                // `tally status` asks and goes: it is not a writer.
                if info.kind != "status" {
                    lock(&core.writers).insert(
                        conn_id,
                        WriterStatus {
                            pid,
                            info,
                            owner: false,
                            records: 0,
                            last_seq: None,
                        },
                    );
                }
                let _ = out_tx.send(Answer::Welcome {
                    owner_pid: std::process::id(),
                });
            }
            Request::Append {
                kind,
                body,
                secret,
                durable,
                retry,
                ..
            } => {
                let parsed = Body::from_kind_value(kind, body).map_err(AppendError::Invalid);
                let queued = parsed.and_then(|b| core.append(conn_id, b, secret, durable, retry));
                let tx = out_tx.clone();
                match queued {
                    Ok(fut) => {
                        inflight.spawn(async move {
                            let r = fut.await;
                            // This owner's writer stopped (it is closing)
                            // without writing the record: no answer, so the
                            // member sends it to the next owner.
                            if !matches!(r, Err(AppendError::Unavailable(_))) {
                                let _ = tx.send(appended(id, r));
                            }
                        });
                    }
                    // Closing: stop reading; the member sends this request,
                    // and any after it, to the next owner.
                    Err(AppendError::Unavailable(_)) => break,
                    Err(e) => {
                        let _ = tx.send(appended(id, Err(e)));
                    }
                }
            }
            Request::Wait {
                seq,
                timeout_ms,
                one_try,
                ..
            } => {
                let core = Arc::clone(&core);
                let tx = out_tx.clone();
                waits.spawn(async move {
                    let waited = core
                        .wait(seq, Duration::from_millis(timeout_ms), one_try)
                        .await;
                    if !*core.closing.borrow() {
                        let _ = tx.send(Answer::Waited { id, waited });
                    }
                });
            }
            Request::Status { .. } => {
                let _ = out_tx.send(match core.status() {
                    Ok(s) => Answer::Status {
                        id,
                        status: Box::new(s),
                    },
                    Err(message) => Answer::Refused {
                        id,
                        code: "status".into(),
                        message,
                    },
                });
            }
            Request::OpenDecision { call_id, .. } => {
                let _ = out_tx.send(match core.open_decision(&call_id) {
                    Ok(h) => Answer::Found {
                        id,
                        hash: h.map(|h| h.to_hex()),
                    },
                    Err(message) => Answer::Refused {
                        id,
                        code: "lookup".into(),
                        message,
                    },
                });
            }
            Request::Declare { tools, .. } => {
                let tx = out_tx.clone();
                match core.declare(conn_id, tools) {
                    Ok(fut) => {
                        inflight.spawn(async move {
                            let _ = tx.send(match fut.await {
                                Ok(recorded) => Answer::Declared { id, recorded },
                                Err(e) => refused(id, &e),
                            });
                        });
                    }
                    Err(AppendError::Unavailable(_)) => break,
                    Err(e) => {
                        let _ = tx.send(refused(id, &e));
                    }
                }
            }
        }
    }
    // Requests already queued are answered before the connection closes;
    // waits are not (the member asks the next owner again).
    waits.abort_all();
    while waits.join_next().await.is_some() {}
    let deadline = tokio::time::Instant::now() + CLOSE_WAIT;
    while let Ok(Some(_)) = tokio::time::timeout_at(deadline, inflight.join_next()).await {}
    inflight.abort_all();
    drop(out_tx);
    let _ = writer.await;
    lock(&core.writers).remove(&conn_id);
}

fn refused(id: u64, e: &AppendError) -> Answer {
    Answer::Refused {
        id,
        code: e.code().to_owned(),
        message: e.to_string(),
    }
}

fn appended(id: u64, r: Result<Record, AppendError>) -> Answer {
    match r {
        Ok(record) => Answer::Appended {
            id,
            record: String::from_utf8_lossy(record.canonical_bytes()).into_owned(),
        },
        Err(e) => refused(id, &e),
    }
}

/// A request a member sent and has no answer to yet.
enum Pending {
    Append {
        request: Request,
        reply: Option<AppendReply>,
    },
    Wait {
        request: Request,
        reply: oneshot::Sender<Waited>,
    },
    Status {
        request: Request,
        reply: oneshot::Sender<Result<ChainStatus, String>>,
    },
    Declare {
        request: Request,
        reply: oneshot::Sender<Result<bool, AppendError>>,
    },
    OpenDecision {
        request: Request,
        reply: oneshot::Sender<Result<Option<Hash>, String>>,
    },
}

impl Pending {
    fn request(&self) -> &Request {
        match self {
            Self::Append { request, .. }
            | Self::Wait { request, .. }
            | Self::Status { request, .. }
            | Self::Declare { request, .. }
            | Self::OpenDecision { request, .. } => request,
        }
    }
}

struct Member {
    to_owner: mpsc::UnboundedSender<Request>,
    from_owner: mpsc::UnboundedReceiver<Answer>,
    tasks: [tokio::task::JoinHandle<()>; 2],
}

impl Drop for Member {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn connect(socket: &Path, me: &WriterInfo) -> std::io::Result<Member> {
    let stream = UnixStream::connect(socket).await?;
    let (mut rd, mut wr) = stream.into_split();
    write_frame(
        &mut wr,
        &Request::Hello {
            pid: std::process::id(),
            info: me.clone(),
        },
    )
    .await?;
    let welcome: Option<Answer> = tokio::time::timeout(Duration::from_secs(2), read_frame(&mut rd))
        .await
        .map_err(|_| std::io::Error::other("the chain owner did not answer"))??;
    let Some(Answer::Welcome { .. }) = welcome else {
        return Err(std::io::Error::other(
            "the chain owner did not welcome this writer",
        ));
    };
    let (to_owner, mut rx) = mpsc::unbounded_channel::<Request>();
    let (tx, from_owner) = mpsc::unbounded_channel::<Answer>();
    let writer = tokio::spawn(async move {
        while let Some(r) = rx.recv().await {
            if write_frame(&mut wr, &r).await.is_err() {
                break;
            }
        }
    });
    let reader = tokio::spawn(async move {
        while let Ok(Some(a)) = read_frame::<_, Answer>(&mut rd).await {
            if tx.send(a).is_err() {
                break;
            }
        }
    });
    Ok(Member {
        to_owner,
        from_owner,
        tasks: [writer, reader],
    })
}

/// What a writer's driver knows to (re)establish its role.
struct Ctx {
    state: StateDir,
    agent: AgentName,
    key: SecretKey,
    clock: Arc<dyn Clock>,
    me: WriterInfo,
    final_sync: Duration,
    window: Option<usize>,
}

enum Role {
    Owner(Owner),
    Member(Member),
    Down(String, tokio::time::Instant),
}

/// Opens the store and becomes the owner, or connects to the owner;
/// keeps trying for [`ESTABLISH_FOR`] while neither works because the
/// store is held and its owner is not (yet) listening.
async fn establish(ctx: &Ctx) -> Role {
    let paths = ctx.state.agent(&ctx.agent);
    let socket = paths.socket();
    let deadline = tokio::time::Instant::now() + ESTABLISH_FOR;
    let mut pause = Duration::from_millis(2);
    loop {
        let store_path = paths.store();
        let opened = tokio::task::spawn_blocking(move || ChainStore::open(&store_path))
            .await
            .unwrap_or_else(|e| Err(StoreError::Db(e.to_string())));
        let why = match opened {
            Ok(store) => match become_owner(ctx, store).await {
                Ok(o) => return Role::Owner(o),
                Err(e) => return Role::Down(e, tokio::time::Instant::now()),
            },
            Err(StoreError::Locked(_)) => match connect(&socket, &ctx.me).await {
                Ok(m) => return Role::Member(m),
                Err(e) => format!(
                    "another writer holds {} but does not answer on {}: {e}",
                    paths.store().display(),
                    socket.display()
                ),
            },
            Err(e) => return Role::Down(e.to_string(), tokio::time::Instant::now()),
        };
        if tokio::time::Instant::now() >= deadline {
            return Role::Down(why, tokio::time::Instant::now());
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

async fn become_owner(ctx: &Ctx, store: ChainStore) -> Result<Owner, String> {
    let paths = ctx.state.agent(&ctx.agent);
    let recovered = store.recovered_from_journal();
    if recovered.records > 0 {
        eprintln!(
            "tally: agent {}: committed {} records that a writer had journaled (it ended before committing them)",
            ctx.agent, recovered.records
        );
    }
    let store = Arc::new(store);
    let journal = Journal::open(&paths.journal())
        .map_err(|e| format!("{}: {e}", paths.journal().display()))?;
    let recorder = Recorder::start_journaled(
        ctx.agent.clone(),
        ctx.key.clone(),
        Arc::clone(&ctx.clock),
        Arc::clone(&store),
        journal,
    )
    .map_err(|e| e.to_string())?;
    let handle = recorder.handle();
    let syncer = crate::open_syncer(
        &ctx.state,
        &ctx.agent,
        Arc::clone(&store),
        Arc::clone(&ctx.clock),
    )
    .map_err(|e| e.to_string())?
    .map(|s| match ctx.window {
        Some(w) => s.with_window(w),
        None => s,
    })
    .map(Arc::new);
    let (stop_sync, stop_rx) = watch::channel(false);
    let sync_task = syncer.clone().map(|s| {
        let wake = handle.committed();
        tokio::spawn(async move { s.run(wake, stop_rx).await })
    });
    let core = Arc::new(OwnerCore {
        handle,
        store: Some(Arc::clone(&store)),
        progress: syncer.as_ref().map(|s| s.progress()),
        syncer,
        writers: Mutex::new(BTreeMap::new()),
        recent: Mutex::new(None),
        declared: Mutex::new(HashMap::new()),
        closing: watch::channel(false).0,
    });
    lock(&core.writers).insert(
        0,
        WriterStatus {
            pid: std::process::id(),
            info: ctx.me.clone(),
            owner: true,
            records: 0,
            last_seq: None,
        },
    );
    let socket = paths.socket();
    // The store's lock is ours, so a socket file left here is stale.
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket).map_err(|e| {
        format!(
            "cannot listen for the agent's other writers on {}: {e}",
            socket.display()
        )
    })?;
    {
        use std::os::unix::fs::PermissionsExt as _;
        let _ = std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600));
    }
    let (shutdown, shutdown_rx) = watch::channel(false);
    let conns = Arc::new(Mutex::new(Vec::new()));
    let accept_task = {
        let core = Arc::clone(&core);
        let conns = Arc::clone(&conns);
        // The key's owner is who may sign as the agent.
        let uid = {
            use std::os::unix::fs::MetadataExt as _;
            std::fs::metadata(paths.key()).map(|m| m.uid()).ok()
        };
        tokio::spawn(async move {
            let mut next = 1u64;
            loop {
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors, say: wait, do not spin.
                        eprintln!("tally: accepting a writer of the agent's chain: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                // Only this user's processes may sign as the agent.
                if uid.is_none() || stream.peer_cred().map(|c| c.uid()).ok() != uid {
                    continue;
                }
                let t = tokio::spawn(serve_member(
                    Arc::clone(&core),
                    stream,
                    next,
                    shutdown_rx.clone(),
                ));
                next += 1;
                let mut c = lock(&conns);
                c.retain(|t: &tokio::task::JoinHandle<()>| !t.is_finished());
                c.push(t);
            }
        })
    };
    Ok(Owner {
        core,
        store,
        recorder: Some(recorder),
        sync_task,
        stop_sync: Some(stop_sync),
        accept_task: Some(accept_task),
        shutdown,
        conns,
        socket: Some(socket),
        final_sync: ctx.final_sync,
    })
}

/// A member's driver: sends `cmd` to the owner, remembering it until it
/// is answered.
fn send_to_owner(m: &Member, pending: &mut BTreeMap<u64, Pending>, next_id: &mut u64, cmd: Cmd) {
    let id = *next_id;
    *next_id += 1;
    let p = match cmd {
        Cmd::Append {
            body,
            secret,
            durable,
            reply,
        } => {
            let kind = body.kind();
            let body = match serde_json::to_value(&*body) {
                Ok(v) => v,
                Err(e) => {
                    answer(reply, Err(AppendError::Store(e.to_string())));
                    return;
                }
            };
            Pending::Append {
                request: Request::Append {
                    id,
                    kind,
                    body,
                    secret,
                    durable,
                    retry: false,
                },
                reply,
            }
        }
        Cmd::Wait {
            seq,
            timeout,
            one_try,
            reply,
        } => Pending::Wait {
            request: Request::Wait {
                id,
                seq,
                timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                one_try,
            },
            reply,
        },
        Cmd::Status { reply } => Pending::Status {
            request: Request::Status { id },
            reply,
        },
        Cmd::Declare { tools, reply } => Pending::Declare {
            request: Request::Declare { id, tools },
            reply,
        },
        Cmd::OpenDecision { call_id, reply } => Pending::OpenDecision {
            request: Request::OpenDecision { id, call_id },
            reply,
        },
        Cmd::Close { reply } => {
            let _ = reply.send(());
            return;
        }
    };
    let _ = m.to_owner.send(p.request().clone());
    pending.insert(id, p);
}

fn on_answer(pending: &mut BTreeMap<u64, Pending>, a: Answer) {
    let id = match &a {
        Answer::Welcome { .. } => return,
        Answer::Appended { id, .. }
        | Answer::Refused { id, .. }
        | Answer::Waited { id, .. }
        | Answer::Status { id, .. }
        | Answer::Declared { id, .. }
        | Answer::Found { id, .. } => *id,
    };
    let Some(p) = pending.remove(&id) else {
        return;
    };
    match (p, a) {
        (Pending::Append { reply, .. }, Answer::Appended { record, .. }) => {
            let r = Record::from_json(record.as_bytes()).map_err(|e| AppendError::Refused {
                code: "bad_answer".into(),
                message: format!("the chain owner answered a record that does not parse: {e}"),
            });
            answer(reply, r);
        }
        (Pending::Append { reply, .. }, Answer::Refused { code, message, .. }) => {
            answer(reply, Err(AppendError::Refused { code, message }));
        }
        (Pending::Wait { reply, .. }, Answer::Waited { waited, .. }) => {
            let _ = reply.send(waited);
        }
        (Pending::Status { reply, .. }, Answer::Status { status, .. }) => {
            let _ = reply.send(Ok(*status));
        }
        (Pending::Status { reply, .. }, Answer::Refused { message, .. }) => {
            let _ = reply.send(Err(message));
        }
        (Pending::Declare { reply, .. }, Answer::Declared { recorded, .. }) => {
            let _ = reply.send(Ok(recorded));
        }
        (Pending::Declare { reply, .. }, Answer::Refused { code, message, .. }) => {
            let _ = reply.send(Err(AppendError::Refused { code, message }));
        }
        (Pending::OpenDecision { reply, .. }, Answer::Found { hash, .. }) => {
            let _ = reply.send(
                hash.map(|h| Hash::from_hex(&h).map_err(|e| e.to_string()))
                    .transpose(),
            );
        }
        (Pending::OpenDecision { reply, .. }, Answer::Refused { message, .. }) => {
            let _ = reply.send(Err(message));
        }
        (p, a) => fail_pending(p, &format!("the chain owner answered out of turn: {a:?}")),
    }
}

/// Where the answer to a request goes, whatever its kind: failing one
/// is [`Reply::fail`], for a command and for a member's pending request.
enum Reply {
    Append(Option<AppendReply>),
    Wait(oneshot::Sender<Waited>),
    Status(oneshot::Sender<Result<ChainStatus, String>>),
    Declare(oneshot::Sender<Result<bool, AppendError>>),
    OpenDecision(oneshot::Sender<Result<Option<Hash>, String>>),
    Close(oneshot::Sender<()>),
}

impl Reply {
    /// Answers that the request could not be carried out, saying `why`.
    fn fail(self, why: &str) {
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
            Self::Close(reply) => {
                let _ = reply.send(());
            }
        }
    }
}

fn fail_pending(p: Pending, why: &str) {
    let reply = match p {
        Pending::Append { reply, .. } => Reply::Append(reply),
        Pending::Wait { reply, .. } => Reply::Wait(reply),
        Pending::Status { reply, .. } => Reply::Status(reply),
        Pending::Declare { reply, .. } => Reply::Declare(reply),
        Pending::OpenDecision { reply, .. } => Reply::OpenDecision(reply),
    };
    reply.fail(why);
}

fn fail_cmd(cmd: Cmd, why: &str) {
    let reply = match cmd {
        Cmd::Append { reply, .. } => Reply::Append(reply),
        Cmd::Wait { reply, .. } => Reply::Wait(reply),
        Cmd::Status { reply } => Reply::Status(reply),
        Cmd::Declare { reply, .. } => Reply::Declare(reply),
        Cmd::OpenDecision { reply, .. } => Reply::OpenDecision(reply),
        Cmd::Close { reply } => Reply::Close(reply),
    };
    reply.fail(why);
}

/// Hands the requests a member had sent to a new role: a new owner in this
/// process takes them itself, a new owner elsewhere gets them again.
fn resend(role: &Role, pending: &mut BTreeMap<u64, Pending>) {
    match role {
        Role::Member(m) => {
            for p in pending.values_mut() {
                if let Pending::Append {
                    request: Request::Append { retry, .. },
                    ..
                } = p
                {
                    *retry = true;
                }
                let _ = m.to_owner.send(p.request().clone());
            }
        }
        Role::Owner(o) => {
            for (_, p) in std::mem::take(pending) {
                match p {
                    Pending::Append {
                        request:
                            Request::Append {
                                kind,
                                body,
                                secret,
                                durable,
                                ..
                            },
                        reply,
                    } => {
                        let queued = Body::from_kind_value(kind, body)
                            .map_err(AppendError::Invalid)
                            .and_then(|b| o.core.append(0, b, secret, durable, true));
                        match queued {
                            Ok(fut) => {
                                tokio::spawn(async move { answer(reply, fut.await) });
                            }
                            Err(e) => answer(reply, Err(e)),
                        }
                    }
                    Pending::Wait {
                        request:
                            Request::Wait {
                                seq,
                                timeout_ms,
                                one_try,
                                ..
                            },
                        reply,
                    } => o.core.dispatch(
                        0,
                        Cmd::Wait {
                            seq,
                            timeout: Duration::from_millis(timeout_ms),
                            one_try,
                            reply,
                        },
                    ),
                    Pending::Status { reply, .. } => o.core.dispatch(0, Cmd::Status { reply }),
                    Pending::Declare {
                        request: Request::Declare { tools, .. },
                        reply,
                    } => o.core.dispatch(0, Cmd::Declare { tools, reply }),
                    Pending::OpenDecision {
                        request: Request::OpenDecision { call_id, .. },
                        reply,
                    } => o.core.dispatch(0, Cmd::OpenDecision { call_id, reply }),
                    p => fail_pending(p, "internal: a pending request of another kind"),
                }
            }
        }
        Role::Down(why, _) => {
            for (_, p) in std::mem::take(pending) {
                fail_pending(p, why);
            }
        }
    }
}

async fn drive(ctx: Ctx, mut role: Role, mut rx: mpsc::UnboundedReceiver<Cmd>) {
    let mut pending: BTreeMap<u64, Pending> = BTreeMap::new();
    let mut next_id = 1u64;
    let mut closing: Option<oneshot::Sender<()>> = None;
    loop {
        match &mut role {
            Role::Owner(o) => {
                let Some(cmd) = rx.recv().await else { break };
                if let Cmd::Close { reply } = cmd {
                    closing = Some(reply);
                    break;
                }
                o.core.dispatch(0, cmd);
            }
            Role::Member(m) => {
                tokio::select! {
                    cmd = rx.recv() => match cmd {
                        None => break,
                        Some(Cmd::Close { reply }) => {
                            closing = Some(reply);
                            break;
                        }
                        Some(cmd) => send_to_owner(m, &mut pending, &mut next_id, cmd),
                    },
                    a = m.from_owner.recv() => match a {
                        Some(a) => on_answer(&mut pending, a),
                        None => {
                            // The owner went: take over, or join whoever did.
                            role = establish(&ctx).await;
                            resend(&role, &mut pending);
                        }
                    },
                }
            }
            Role::Down(why, since) => {
                let Some(cmd) = rx.recv().await else { break };
                if let Cmd::Close { reply } = cmd {
                    closing = Some(reply);
                    break;
                }
                if since.elapsed() > Duration::from_secs(1) {
                    role = establish(&ctx).await;
                    match &role {
                        Role::Owner(o) => o.core.dispatch(0, cmd),
                        Role::Member(m) => send_to_owner(m, &mut pending, &mut next_id, cmd),
                        Role::Down(why, _) => fail_cmd(cmd, why),
                    }
                } else {
                    fail_cmd(cmd, why);
                }
            }
        }
    }
    // Closing: a member waits for its requests to be answered (outcomes
    // sent without waiting among them); an owner commits everything queued.
    match role {
        Role::Member(mut m) => {
            let deadline = tokio::time::Instant::now() + CLOSE_WAIT;
            while !pending.is_empty() {
                match tokio::time::timeout_at(deadline, m.from_owner.recv()).await {
                    Ok(Some(a)) => on_answer(&mut pending, a),
                    Ok(None) => {
                        let role = establish(&ctx).await;
                        resend(&role, &mut pending);
                        match role {
                            Role::Owner(o) => o.close().await,
                            Role::Member(new) => m = new,
                            Role::Down(..) => {}
                        }
                    }
                    Err(_) => break,
                }
            }
            for (_, p) in std::mem::take(&mut pending) {
                fail_pending(p, "the writer closed before the chain's owner answered");
            }
        }
        Role::Owner(o) => o.close().await,
        Role::Down(..) => {}
    }
    if let Some(reply) = closing {
        let _ = reply.send(());
    }
}

/// A handle to an agent's chain, shared by every writer on this host
/// (see the module documentation). Cheap to clone.
#[derive(Clone)]
pub struct AgentChain {
    tx: mpsc::UnboundedSender<Cmd>,
    durable: bool,
    /// Per tool source this writer declared: its last list, declared again
    /// every half lease while the chain is open.
    renewals: Arc<Mutex<HashMap<Option<String>, DeclaredTools>>>,
}

impl std::fmt::Debug for AgentChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentChain").finish_non_exhaustive()
    }
}

/// How a writer opens the chain.
#[derive(Debug, Clone)]
pub struct ChainOptions {
    /// Who it is.
    pub me: WriterInfo,
    /// Answer appends only once committed with fsync (survives a power
    /// loss), not once in the journal (survives this process's death).
    pub durable: bool,
    /// When this writer closes as the owner: one last sync try of at most
    /// this long (zero: none).
    pub final_sync: Duration,
    /// Records per batch request when this writer syncs as the owner
    /// (none: the default window).
    pub window: Option<usize>,
    /// When the chain can be neither opened nor reached: open anyway,
    /// refuse records (fail closed) and try again at each one after a
    /// second, instead of failing (a long-running gateway).
    pub keep_trying: bool,
}

impl AgentChain {
    /// Opens `agent`'s chain in `state` as a writer: the owner when no
    /// other writer holds it, else a member of the owner's. Needs a tokio
    /// runtime.
    ///
    /// # Errors
    /// [`ChainError`] when the agent has no key or configuration, or the
    /// chain can be neither opened nor reached.
    pub async fn open(
        state: &StateDir,
        agent: &AgentName,
        clock: Arc<dyn Clock>,
        options: ChainOptions,
    ) -> Result<Self, ChainError> {
        let key = state.load_key(agent)?;
        state.load_config(agent)?;
        let ctx = Ctx {
            state: state.clone(),
            agent: agent.clone(),
            key,
            clock,
            me: options.me.clone(),
            final_sync: options.final_sync,
            window: options.window,
        };
        let role = establish(&ctx).await;
        if let Role::Down(why, _) = &role {
            if !options.keep_trying {
                return Err(ChainError::Unreachable(why.clone()));
            }
            eprintln!(
                "tally: agent {agent}: records are refused until the chain can be opened or reached (tried again at each record): {why}"
            );
        }
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(drive(ctx, role, rx));
        Ok(Self {
            tx,
            durable: options.durable,
            renewals: Arc::default(),
        })
    }

    /// A chain written by `handle` alone, without a socket: for a writer
    /// whose store a test wraps to inject failures. `store` keeps the
    /// status and retries; `progress` is the sync task's.
    #[must_use]
    pub fn with_writer(
        handle: RecorderHandle,
        store: Option<Arc<ChainStore>>,
        progress: Option<watch::Receiver<SyncProgress>>,
    ) -> Self {
        let core = Arc::new(OwnerCore {
            handle,
            store,
            syncer: None,
            progress,
            writers: Mutex::new(BTreeMap::new()),
            recent: Mutex::new(None),
            declared: Mutex::new(HashMap::new()),
            closing: watch::channel(false).0,
        });
        let (tx, mut rx) = mpsc::unbounded_channel::<Cmd>();
        tokio::spawn(async move {
            while let Some(cmd) = rx.recv().await {
                core.dispatch(0, cmd);
            }
        });
        Self {
            tx,
            durable: false,
            renewals: Arc::default(),
        }
    }

    /// A chain every append to which fails with `reason`: a gateway whose
    /// store cannot be opened refuses every call (fail closed).
    #[must_use]
    pub fn unavailable(reason: &str) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<Cmd>();
        let reason = reason.to_owned();
        tokio::spawn(async move {
            while let Some(cmd) = rx.recv().await {
                fail_cmd(cmd, &reason);
            }
        });
        Self {
            tx,
            durable: false,
            renewals: Arc::default(),
        }
    }

    fn send(&self, cmd: Cmd) -> Result<(), AppendError> {
        self.tx
            .send(cmd)
            .map_err(|_| AppendError::Unavailable("the agent's chain is closed".into()))
    }

    /// Queues a record with `body` now (a writer's records are chained in
    /// the order it queues them) and returns what resolves once it is
    /// recorded (in the journal, or committed with fsync when the chain was
    /// opened `durable`).
    ///
    /// # Errors
    /// [`AppendError::Unavailable`] when the chain is closed; the future,
    /// [`AppendError`] when the record was not recorded.
    pub fn append_queued(
        &self,
        body: Body,
        secret: Option<Secret>,
    ) -> Result<impl Future<Output = Result<Record, AppendError>>, AppendError> {
        let (reply, rx) = oneshot::channel();
        self.send(Cmd::Append {
            body: Box::new(body),
            secret,
            durable: self.durable,
            reply: Some(reply),
        })?;
        Ok(async move {
            rx.await.map_err(|_| {
                AppendError::Unavailable("the chain's writer stopped before answering".into())
            })?
        })
    }

    /// Appends a record with `body`; resolves once it is recorded.
    ///
    /// # Errors
    /// [`AppendError`] when it was not.
    pub async fn append(&self, body: Body, secret: Option<Secret>) -> Result<Record, AppendError> {
        self.append_queued(body, secret)?.await
    }

    /// Appends without waiting; a failure is reported on standard error.
    ///
    /// # Errors
    /// [`AppendError::Unavailable`] when the chain is closed.
    pub fn append_detached(&self, body: Body, secret: Option<Secret>) -> Result<(), AppendError> {
        self.send(Cmd::Append {
            body: Box::new(body),
            secret,
            durable: self.durable,
            reply: None,
        })
    }

    /// Waits up to `timeout` for the receipt of the record at `seq` (and of
    /// every record before it); with `one_try`, answers after the first sync
    /// attempt that fails.
    pub async fn wait_receipt(&self, seq: u64, timeout: Duration, one_try: bool) -> Waited {
        let (reply, rx) = oneshot::channel();
        if self
            .send(Cmd::Wait {
                seq,
                timeout,
                one_try,
                reply,
            })
            .is_err()
        {
            return Waited::TimedOut { last: None };
        }
        rx.await.unwrap_or(Waited::TimedOut { last: None })
    }

    /// The record hash of the open decision (no outcome yet, as committed
    /// to the store) with `call_id`.
    ///
    /// # Errors
    /// A message when the owner cannot say.
    pub async fn open_decision(&self, call_id: &str) -> Result<Option<Hash>, String> {
        let (reply, rx) = oneshot::channel();
        self.send(Cmd::OpenDecision {
            call_id: call_id.to_owned(),
            reply,
        })
        .map_err(|e| e.to_string())?;
        rx.await
            .map_err(|_| "the chain's writer stopped before answering".to_owned())?
    }

    /// The chain's status, from its owner.
    ///
    /// # Errors
    /// A message when the owner cannot say.
    pub async fn status(&self) -> Result<ChainStatus, String> {
        let (reply, rx) = oneshot::channel();
        self.send(Cmd::Status { reply })
            .map_err(|e| e.to_string())?;
        rx.await
            .map_err(|_| "the chain's writer stopped before answering".to_owned())?
    }

    /// Declares a tool source's list (docs/protocol.md §5.3): recorded
    /// unless the same list of the same source was recorded within a
    /// quarter of its lease. The declaration is queued now (before any
    /// record queued after this call) and renewed every half lease while
    /// this chain is open. Resolves to whether it was recorded.
    pub fn declare_tools_queued(
        &self,
        tools: DeclaredTools,
    ) -> impl Future<Output = Result<bool, AppendError>> + Send + 'static {
        let (reply, rx) = oneshot::channel();
        let sent = self.send(Cmd::Declare {
            tools: tools.clone(),
            reply,
        });
        if sent.is_ok() {
            self.keep_declared(tools);
        }
        async move {
            sent?;
            rx.await
                .map_err(|_| AppendError::Unavailable("the chain's writer stopped".into()))?
        }
    }

    /// [`Self::declare_tools_queued`], awaited.
    ///
    /// # Errors
    /// [`AppendError`] when it could not be recorded.
    pub async fn declare_tools(&self, tools: DeclaredTools) -> Result<bool, AppendError> {
        self.declare_tools_queued(tools).await
    }

    fn keep_declared(&self, tools: DeclaredTools) {
        let source = tools.source.clone();
        let first = lock(&self.renewals).insert(source.clone(), tools).is_none();
        if !first {
            return;
        }
        let weak = self.tx.downgrade();
        let renewals = Arc::clone(&self.renewals);
        tokio::spawn(async move {
            loop {
                let lease = lock(&renewals)
                    .get(&source)
                    .and_then(|t| t.lease_ms)
                    .unwrap_or(DEFAULT_SOURCE_LEASE_MS);
                tokio::time::sleep(Duration::from_millis(lease / 2)).await;
                let Some(tx) = weak.upgrade() else { return };
                let Some(tools) = lock(&renewals).get(&source).cloned() else {
                    return;
                };
                let (reply, rx) = oneshot::channel();
                if tx.send(Cmd::Declare { tools, reply }).is_err() {
                    return;
                }
                drop(tx);
                if let Ok(Err(e)) = rx.await {
                    eprintln!(
                        "tally: declaring the tool source {} again: {e}",
                        source_label(source.as_deref())
                    );
                }
            }
        });
    }

    /// Closes this writer: its requests are answered first; an owner
    /// commits everything queued and hands the chain to the next writer.
    pub async fn close(&self) {
        let (reply, rx) = oneshot::channel();
        if self.send(Cmd::Close { reply }).is_ok() {
            let _ = rx.await;
        }
    }
}

/// The status of `agent`'s chain without becoming one of its writers: from
/// its owner when one runs, else read from the store. `None` when the
/// agent has no chain store yet.
///
/// # Errors
/// A message when neither works.
pub async fn peek_status(
    state: &StateDir,
    agent: &AgentName,
) -> Result<Option<ChainStatus>, String> {
    let paths = state.agent(agent);
    let path = paths.store();
    if !path.exists() {
        return Ok(None);
    }
    let opened = {
        let path = path.clone();
        tokio::task::spawn_blocking(move || ChainStore::open(&path))
            .await
            .map_err(|e| e.to_string())?
    };
    match opened {
        Ok(store) => Ok(Some(ChainStatus {
            owner_pid: 0,
            syncing: false,
            writers: Vec::new(),
            store: store.status().map_err(|e| e.to_string())?,
            sync_failure: None,
        })),
        Err(StoreError::Locked(_)) => {
            let m = connect(&paths.socket(), &WriterInfo::new("status"))
                .await
                .map_err(|e| {
                    format!(
                        "another writer holds {} but does not answer on {}: {e}",
                        path.display(),
                        paths.socket().display()
                    )
                })?;
            let mut pending = BTreeMap::new();
            let mut next = 1;
            let (reply, rx) = oneshot::channel();
            let mut m = m;
            send_to_owner(&m, &mut pending, &mut next, Cmd::Status { reply });
            while !pending.is_empty() {
                match m.from_owner.recv().await {
                    Some(a) => on_answer(&mut pending, a),
                    None => return Err("the chain's owner went away before answering".into()),
                }
            }
            rx.await.map_err(|e| e.to_string())?.map(Some)
        }
        Err(e) => Err(e.to_string()),
    }
}

impl ChainStatus {
    /// The owner, and the other writers.
    #[must_use]
    pub fn owner(&self) -> Option<&WriterStatus> {
        self.writers.iter().find(|w| w.owner)
    }
}
