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

mod member;
mod owner;
mod types;
mod wire;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tally_schemas::disclosure::Disclosure;
use tally_schemas::time::Clock;
use tally_schemas::{AgentName, Body, Hash, Record};
use tokio::sync::{mpsc, oneshot, watch};

use member::{connect, fail_pending, on_answer, send_to_owner, Member, Pending};
use owner::{become_owner, Owner, OwnerCore};
pub use wire::{Answer, Request};

use crate::disclose::Parts;
use crate::recorder::{answer, AppendError, RecorderHandle};
use crate::state::StateDir;
use crate::store::{ChainStore, Secret, StoreError};
use crate::sync::SyncProgress;
pub use crate::toollist::DeclaredTools;

use types::{
    lock, source_label, AppendFuture, AppendReply, Cmd, Ctx, DeclareFuture, Reply, CLOSE_WAIT,
    DEFAULT_SOURCE_LEASE_MS, ESTABLISH_FOR, RETRY_LOOKBACK,
};
pub use types::{ChainError, ChainStatus, Waited, WriterInfo, WriterStatus, MAX_FRAME};

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

fn fail_cmd(cmd: Cmd, why: &str) {
    let reply = match cmd {
        Cmd::Append { reply, .. } => Reply::Append(reply),
        Cmd::Wait { reply, .. } => Reply::Wait(reply),
        Cmd::Status { reply } => Reply::Status(reply),
        Cmd::Declare { reply, .. } => Reply::Declare(reply),
        Cmd::OpenDecision { reply, .. } => Reply::OpenDecision(reply),
        Cmd::Disclose { reply, .. } => Reply::Disclose(reply),
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
                    Pending::Disclose {
                        request:
                            Request::Disclose {
                                agent,
                                call_id,
                                parts,
                                ..
                            },
                        reply,
                    } => o.core.dispatch(
                        0,
                        Cmd::Disclose {
                            agent,
                            call_id,
                            parts,
                            reply,
                        },
                    ),
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
        let core = Arc::new(OwnerCore::new(handle, store, None, progress));
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
            ask_owner(state, agent, "status", |reply| Cmd::Status { reply })
                .await
                .map(Some)
        }
        Err(e) => Err(e.to_string()),
    }
}

/// Asks the writer that holds `agent`'s chain store, over its socket and
/// as a passing client (`kind`), the command `make` builds.
async fn ask_owner<T>(
    state: &StateDir,
    agent: &AgentName,
    kind: &str,
    make: impl FnOnce(oneshot::Sender<Result<T, String>>) -> Cmd,
) -> Result<T, String> {
    let paths = state.agent(agent);
    let mut m = connect(&paths.socket(), &WriterInfo::new(kind))
        .await
        .map_err(|e| {
            format!(
                "another writer holds {} but does not answer on {}: {e}",
                paths.store().display(),
                paths.socket().display()
            )
        })?;
    let mut pending = BTreeMap::new();
    let mut next = 1;
    let (reply, rx) = oneshot::channel();
    send_to_owner(&m, &mut pending, &mut next, make(reply));
    while !pending.is_empty() {
        match m.from_owner.recv().await {
            Some(a) => on_answer(&mut pending, a),
            None => return Err("the chain's owner went away before answering".into()),
        }
    }
    rx.await.map_err(|e| e.to_string())?
}

/// The disclosure of `agent`'s call `call_id` (docs/protocol.md §6.3)
/// without becoming one of its writers: read from the chain store, or
/// asked of the writer that holds it when one runs (a gateway, say).
///
/// # Errors
/// A message for the user: no chain store yet, no such call, content not
/// kept, a holder that does not answer.
pub async fn peek_disclosure(
    state: &StateDir,
    agent: &AgentName,
    call_id: &str,
    parts: Parts,
) -> Result<Disclosure, String> {
    let path = state.agent(agent).store();
    if !path.exists() {
        return Err(format!(
            "agent {agent} has no local chain store yet ({})",
            path.display()
        ));
    }
    let local = {
        let (agent, call_id) = (agent.clone(), call_id.to_owned());
        tokio::task::spawn_blocking(move || {
            ChainStore::open(&path)
                .map(|store| crate::disclose::disclose(&store, &agent, &call_id, parts))
        })
        .await
        .map_err(|e| e.to_string())?
    };
    match local {
        Ok(disclosed) => disclosed,
        Err(StoreError::Locked(_)) => {
            let (who, call_id) = (agent.clone(), call_id.to_owned());
            ask_owner(state, agent, "disclose", move |reply| Cmd::Disclose {
                agent: who,
                call_id,
                parts,
                reply,
            })
            .await
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
