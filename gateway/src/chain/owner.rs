//! The writer that holds an agent's chain: it opened `chain.redb`, runs
//! the recorder with the journal and the agent's one sync task, and serves
//! the other writers on `writer.sock` (docs/architecture.md "Several
//! writers, one chain").

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tally_schemas::disclosure::Disclosure;
use tally_schemas::{canonical, AgentName, Body, Hash, Record};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, watch};

use super::wire::{appended, read_frame, refused, write_frame, Answer, Request};
use super::{
    lock, source_label, AppendFuture, ChainStatus, Cmd, Ctx, DeclareFuture, DeclaredTools, Waited,
    WriterStatus, CLOSE_WAIT, DEFAULT_SOURCE_LEASE_MS, RETRY_LOOKBACK,
};
use crate::disclose::Parts;
use crate::journal::Journal;
use crate::recorder::{answer, AppendError, Recorder, RecorderHandle};
use crate::store::{ChainStore, Secret};
use crate::sync::{SyncProgress, Syncer};

/// How an owner is set up: by [`AgentChain::open`] from the agent's state
/// folder, or by [`AgentChain::with_writer`] over a chain writer a test
/// made.
pub(super) struct OwnerCore {
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
    /// One past the highest seq this owner has answered an append with:
    /// a read of the store waits until it is committed that far.
    appended_to: std::sync::atomic::AtomicU64,
}

/// A tool source's last declaration, as its owner remembers it.
struct Declared {
    fingerprint: String,
    at: tokio::time::Instant,
    lease: Duration,
    names: std::collections::BTreeSet<String>,
}

fn body_hash(body: &Body) -> Hash {
    Hash::sha256(&canonical::canonicalize(body).unwrap_or_default())
}

impl OwnerCore {
    /// A core writing through `handle`; `store` keeps the status and the
    /// retries' lookups; `progress` is the sync task's (`syncer`'s, when
    /// this core runs it).
    pub(super) fn new(
        handle: RecorderHandle,
        store: Option<Arc<ChainStore>>,
        syncer: Option<Arc<Syncer>>,
        progress: Option<watch::Receiver<SyncProgress>>,
    ) -> Self {
        Self {
            handle,
            store,
            syncer,
            progress,
            writers: Mutex::new(BTreeMap::new()),
            recent: Mutex::new(None),
            declared: Mutex::new(HashMap::new()),
            closing: watch::channel(false).0,
            appended_to: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Queues an append now; the future resolves with its record.
    pub(super) fn append(
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
            core.appended_to
                .fetch_max(record.seq.get() + 1, std::sync::atomic::Ordering::SeqCst);
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
    pub(super) fn find_recent(&self, body: &Body) -> Option<Record> {
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

    pub(super) async fn wait(&self, seq: u64, timeout: Duration, one_try: bool) -> Waited {
        let Some(mut progress) = self.progress.clone() else {
            return Waited::NoWitness;
        };
        // Cut a backoff short for a waiter that allows retries; one that
        // allows one try gets the attempt its record's commit starts, and
        // no other (`tally record` without --wait-receipt: docs/operations.md
        // "Syncing").
        if let Some(s) = &self.syncer {
            // Every waiter cuts the linger after a commit short (a receipt
            // is wanted now); only one that allows retries cuts a backoff.
            s.hurry();
            if !one_try {
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

    pub(super) fn open_decision(&self, call_id: &str) -> Result<Option<Hash>, String> {
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

    /// A call's content and salts (docs/protocol.md §6.3), read from the
    /// store this writer holds once every record it has answered is
    /// committed there (a call made a moment ago is in the journal first).
    pub(super) async fn disclose(
        self: Arc<Self>,
        agent: AgentName,
        call_id: String,
        parts: Parts,
    ) -> Result<Disclosure, String> {
        let store = self
            .store
            .clone()
            .ok_or_else(|| "no chain store".to_owned())?;
        let end = self.appended_to.load(std::sync::atomic::Ordering::SeqCst);
        if end > 0 {
            self.handle
                .wait_committed(end - 1)
                .await
                .map_err(|e| e.to_string())?;
        }
        tokio::task::spawn_blocking(move || {
            crate::disclose::disclose(&store, &agent, &call_id, parts)
        })
        .await
        .map_err(|e| e.to_string())?
    }

    pub(super) fn status(&self) -> Result<ChainStatus, String> {
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
    pub(super) fn declare(
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

    pub(super) fn dispatch(self: &Arc<Self>, writer: u64, cmd: Cmd) {
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
            Cmd::Disclose {
                agent,
                call_id,
                parts,
                reply,
            } => {
                let core = Arc::clone(self);
                tokio::spawn(async move {
                    let _ = reply.send(core.disclose(agent, call_id, parts).await);
                });
            }
            Cmd::Close { reply } => {
                let _ = reply.send(());
            }
        }
    }
}

/// The owner's running parts, stopped by [`Owner::close`].
pub(super) struct Owner {
    pub(super) core: Arc<OwnerCore>,
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
    pub(super) async fn close(mut self) {
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
            Request::Disclose {
                agent,
                call_id,
                parts,
                ..
            } => {
                let (core, tx) = (Arc::clone(&core), out_tx.clone());
                tokio::spawn(async move {
                    let _ = tx.send(match core.disclose(agent, call_id, parts).await {
                        Ok(d) => Answer::Disclosed {
                            id,
                            disclosure: Box::new(d),
                        },
                        Err(message) => Answer::Refused {
                            id,
                            code: "disclose".into(),
                            message,
                        },
                    });
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

pub(super) async fn become_owner(ctx: &Ctx, store: ChainStore) -> Result<Owner, String> {
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
    let progress = syncer.as_ref().map(|s| s.progress());
    let core = Arc::new(OwnerCore::new(
        handle,
        Some(Arc::clone(&store)),
        syncer,
        progress,
    ));
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
