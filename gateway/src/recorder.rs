//! The chain writer (docs/protocol.md §3): the one place where
//! an agent's records get their seq, prev, time and nonce, are signed, and
//! are committed to the local store.
//!
//! It runs on its own thread. Requests queue on a channel; the thread takes
//! every request waiting, signs them as one batch and makes the batch
//! survive a crash, then answers each. A caller that awaits
//! [`RecorderHandle::append`] gets its record only then, which is what
//! "fail closed" needs: a decision that was not written is never forwarded.
//! How a batch is made to survive depends on how the recorder was started:
//!
//! - [`Recorder::start`] commits it to the store durably (fsync) before
//!   answering (`tally record`, and `tally gateway --sync-before-forward`):
//!   an answered record survives a power loss.
//! - [`Recorder::start_journaled`] appends it to the record journal
//!   (crate::journal) with one `write()` and answers, and a second thread
//!   commits it to the store durably right after, grouping whatever is
//!   waiting. An answered record survives the death of the process at once
//!   and a power loss from its store commit on, one fsync later. While a
//!   store commit fails, new appends are refused (fail closed) and the
//!   commit is retried; the journal keeps the records either way.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rand_core::OsRng;
use tally_schemas::record::RecordError;
use tally_schemas::time::Clock;
use tally_schemas::{
    AgentName, Body, Hash, Nonce, Record, SecretKey, Seq, UnixMillis, UnsignedRecord,
};
use tokio::sync::{mpsc, oneshot, Notify};

use crate::journal::{self, JournalError, JournalSink};
use crate::store::{Appended, ChainWriter, Secret, StoreError};

/// Most records signed (and, without a journal, committed) as one batch.
const MAX_GROUP: usize = 256;
/// Most records the journal's committer puts in one store transaction.
const MAX_COMMIT_GROUP: usize = 4096;
/// The journal is emptied once everything in it is committed and it has
/// grown past this; and always when the recorder closes.
const JOURNAL_CLEAR_BYTES: u64 = 1 << 20;

/// Why a record was not appended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AppendError {
    /// The record breaks a protocol rule (too large, a bad name, …).
    #[error("the record is not valid: {0}")]
    Invalid(RecordError),
    /// The store did not commit it.
    #[error("{0}")]
    Store(String),
    /// The chain is at 2^53 − 1 records.
    #[error("the chain is full (seq limit reached)")]
    ChainFull,
    /// The recorder is not running (the store could not be opened, or it
    /// was closed).
    #[error("the local chain store is unavailable: {0}")]
    Unavailable(String),
    /// The writer that holds the agent's chain refused the record
    /// (crate::chain); `code` is [`AppendError::code`] of its error.
    #[error("{message}")]
    Refused {
        /// The stable code.
        code: String,
        /// What it said.
        message: String,
    },
}

impl AppendError {
    /// A stable code: `invalid`, `store`, `chain_full`, `unavailable`, or
    /// the code a remote writer gave.
    #[must_use]
    pub fn code(&self) -> &str {
        match self {
            Self::Invalid(_) => "invalid",
            Self::Store(_) => "store",
            Self::ChainFull => "chain_full",
            Self::Unavailable(_) => "unavailable",
            Self::Refused { code, .. } => code,
        }
    }
}

enum Request {
    Append {
        body: Box<Body>,
        secret: Option<Secret>,
        reply: Option<oneshot::Sender<Result<Record, AppendError>>>,
    },
    Close,
}

/// A cheap, cloneable handle to the chain writer.
#[derive(Clone)]
pub struct RecorderHandle {
    tx: Option<mpsc::UnboundedSender<Request>>,
    unavailable: Arc<str>,
    committed: Arc<Notify>,
    /// With a journal: how far the store commits have come.
    committed_to: Option<tokio::sync::watch::Receiver<u64>>,
}

impl std::fmt::Debug for RecorderHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecorderHandle")
            .field("running", &self.tx.is_some())
            .finish()
    }
}

impl RecorderHandle {
    /// A handle whose every append fails with `reason`: the gateway runs
    /// this way when the store cannot be opened, so every call is refused.
    #[must_use]
    pub fn unavailable(reason: &str) -> Self {
        Self {
            tx: None,
            unavailable: Arc::from(reason),
            committed: Arc::new(Notify::new()),
            committed_to: None,
        }
    }

    /// Resolves once the record at `seq` is committed to the store durably
    /// (fsync): at once without a journal, where every answer already is.
    ///
    /// # Errors
    /// [`AppendError::Store`] when the store has not committed it within a
    /// minute (its commits fail; the record stays in the journal).
    pub async fn wait_committed(&self, seq: u64) -> Result<(), AppendError> {
        let Some(mut rx) = self.committed_to.clone() else {
            return Ok(());
        };
        let waited =
            tokio::time::timeout(Duration::from_secs(60), rx.wait_for(|end| *end > seq)).await;
        match waited {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(AppendError::Store(
                "the chain store's committer stopped before committing the record (it stays in the record journal)".into(),
            )),
            Err(_) => Err(AppendError::Store(
                "the chain store did not commit the record within 60 s (it stays in the record journal)".into(),
            )),
        }
    }

    /// Woken after every commit (the sync task waits on it).
    #[must_use]
    pub fn committed(&self) -> Arc<Notify> {
        Arc::clone(&self.committed)
    }

    fn send(&self, req: Request) -> Result<(), AppendError> {
        match &self.tx {
            Some(tx) => tx
                .send(req)
                .map_err(|_| AppendError::Unavailable("the chain writer has stopped".into())),
            None => Err(AppendError::Unavailable(self.unavailable.to_string())),
        }
    }

    /// Appends a record with `body`; resolves once it is durably committed.
    ///
    /// # Errors
    /// [`AppendError`] when it was not committed.
    pub async fn append(&self, body: Body, secret: Option<Secret>) -> Result<Record, AppendError> {
        self.append_queued(body, secret)?.await
    }

    /// Queues a record with `body` now (records are chained in the order
    /// they are queued) and returns what resolves once it is durably
    /// committed.
    ///
    /// # Errors
    /// [`AppendError::Unavailable`] when the writer is not running; the
    /// returned future, [`AppendError`] when the record was not committed.
    pub fn append_queued(
        &self,
        body: Body,
        secret: Option<Secret>,
    ) -> Result<impl std::future::Future<Output = Result<Record, AppendError>>, AppendError> {
        let (reply, rx) = oneshot::channel();
        self.send(Request::Append {
            body: Box::new(body),
            secret,
            reply: Some(reply),
        })?;
        Ok(async move {
            rx.await.map_err(|_| {
                AppendError::Unavailable("the chain writer stopped before answering".into())
            })?
        })
    }
}

/// The running chain writer; [`Recorder::close`] drains and stops it.
pub struct Recorder {
    handle: RecorderHandle,
    thread: Option<JoinHandle<()>>,
    committer: Option<JoinHandle<()>>,
}

/// Where the writer puts a signed batch before it answers.
enum Sink {
    /// Straight into the store, durably.
    Store(Box<dyn ChainWriter>),
    /// Into the journal; the committer thread takes it to the store.
    Journal(JournalSide),
}

struct JournalSide {
    shared: Arc<JournalShared>,
    to_committer: std::sync::mpsc::Sender<CommitMsg>,
}

/// What the writer and the committer share.
struct JournalShared {
    journal: Mutex<JournalState>,
    /// The store's last refusal, while commits fail; appends are refused
    /// meanwhile, so the records only in the journal stay few.
    commit_error: Mutex<Option<String>>,
    /// Seq + 1 of the last record committed to the store durably.
    committed_to: tokio::sync::watch::Sender<u64>,
}

struct JournalState {
    sink: Box<dyn JournalSink>,
    /// Seq + 1 of the last record journaled (0: none yet).
    journaled_end: u64,
}

enum CommitMsg {
    Batch(Vec<Appended>),
    Close,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every update under these locks is a single assignment or a whole
    // write, so the data is consistent even after a panic elsewhere.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

struct Writer {
    agent: AgentName,
    key: SecretKey,
    clock: Arc<dyn Clock>,
    sink: Sink,
    head: Option<(Seq, Hash, UnixMillis)>,
    broken: Option<String>,
    committed: Arc<Notify>,
}

impl Writer {
    fn next_unsigned(&self, body: Body) -> Result<UnsignedRecord, AppendError> {
        let (seq, prev, floor) = match self.head {
            None => (Seq::GENESIS, None, UnixMillis::new(0)),
            Some((seq, hash, time)) => {
                (seq.next().ok_or(AppendError::ChainFull)?, Some(hash), time)
            }
        };
        // A record's time never goes before its predecessor's, even if the
        // system clock steps back, so an outcome never precedes its decision.
        let time = self.clock.now().max(floor);
        Ok(UnsignedRecord {
            agent: self.agent.clone(),
            key_id: self.key.public_key().key_id(),
            seq,
            prev,
            time,
            nonce: Nonce::random(&mut OsRng),
            body,
        })
    }

    /// Makes `batch` survive a crash of this process (journal) or of the
    /// machine (store). On error nothing of it was written, except when
    /// `self.broken` is set, after which nothing more is.
    fn persist(&mut self, batch: Vec<Appended>) -> Result<(), String> {
        match &mut self.sink {
            Sink::Store(store) => {
                store.append(&batch).map_err(|e| e.to_string())?;
                self.committed.notify_one();
                Ok(())
            }
            Sink::Journal(side) => {
                if let Some(e) = lock(&side.shared.commit_error).as_ref() {
                    return Err(format!(
                        "the local chain store refuses commits (retrying): {e}"
                    ));
                }
                let mut frames = Vec::with_capacity(1024 * batch.len());
                for a in &batch {
                    journal::encode(a, &mut frames)?;
                }
                let end = batch.last().map_or(0, |a| a.record.seq.get() + 1);
                {
                    let mut j = lock(&side.shared.journal);
                    match j.sink.append(&frames) {
                        Ok(()) => j.journaled_end = end,
                        Err(e @ JournalError::Io(_)) => return Err(e.to_string()),
                        Err(e @ JournalError::Broken(_)) => {
                            self.broken = Some(e.to_string());
                            return Err(e.to_string());
                        }
                    }
                }
                if side.to_committer.send(CommitMsg::Batch(batch)).is_err() {
                    // Journaled, so not lost (the next open commits it),
                    // but nothing more should be.
                    self.broken = Some("the chain store's committer has stopped".into());
                }
                Ok(())
            }
        }
    }

    fn run(mut self, mut rx: mpsc::UnboundedReceiver<Request>) {
        let mut closing = false;
        while !closing {
            let Some(first) = rx.blocking_recv() else {
                break;
            };
            let mut batch = vec![first];
            while batch.len() < MAX_GROUP {
                match rx.try_recv() {
                    Ok(r) => batch.push(r),
                    Err(_) => break,
                }
            }
            let mut appended: Vec<Appended> = Vec::new();
            let mut replies = Vec::new();
            let saved_head = self.head;
            for req in batch {
                let (body, secret, reply) = match req {
                    Request::Close => {
                        closing = true;
                        continue;
                    }
                    Request::Append {
                        body,
                        secret,
                        reply,
                    } => (body, secret, reply),
                };
                if let Some(reason) = &self.broken {
                    answer(reply, Err(AppendError::Store(reason.clone())));
                    continue;
                }
                let signed = self
                    .next_unsigned(*body)
                    .and_then(|u| u.sign(&self.key).map_err(AppendError::Invalid));
                match signed {
                    Ok(record) => {
                        self.head = Some((record.seq, record.hash(), record.time));
                        appended.push(Appended {
                            record: record.clone(),
                            secret,
                        });
                        replies.push((reply, record));
                    }
                    Err(e) => answer(reply, Err(e)),
                }
            }
            if appended.is_empty() {
                continue;
            }
            match self.persist(appended) {
                Ok(()) => {
                    for (reply, record) in replies {
                        answer(reply, Ok(record));
                    }
                }
                Err(message) => {
                    // The batch did not land (or, for the store, we cannot
                    // tell): take the head from the store again rather than
                    // guess; the journal was cut back, so its head is the old one.
                    self.head = saved_head;
                    if let Sink::Store(store) = &self.sink {
                        match store.head() {
                            Ok(h) => self.head = h,
                            Err(e2) => {
                                self.broken = Some(format!(
                                    "{message}; and reading the head back failed: {e2}"
                                ));
                            }
                        }
                    }
                    for (reply, _) in replies {
                        answer(reply, Err(AppendError::Store(message.clone())));
                    }
                }
            }
        }
        if let Sink::Journal(side) = &self.sink {
            let _ = side.to_committer.send(CommitMsg::Close);
        }
    }
}

/// The journal's second half: commits journaled batches to the store in
/// order, as few transactions as it can, and empties the journal when
/// everything in it is committed.
fn run_committer<W: ChainWriter>(
    store: W,
    rx: std::sync::mpsc::Receiver<CommitMsg>,
    shared: Arc<JournalShared>,
    committed: Arc<Notify>,
) {
    let mut group: Vec<Appended> = Vec::new();
    let mut closing = false;
    let mut backoff = Duration::from_millis(50);
    let mut failures_while_closing = 0u32;
    let mut committed_end = 0u64;
    loop {
        if group.is_empty() {
            if closing {
                // Everything is committed: the journal is not needed.
                let mut j = lock(&shared.journal);
                if j.journaled_end == committed_end {
                    if let Err(e) = j.sink.clear() {
                        eprintln!("tally: could not empty the record journal: {e}");
                    }
                }
                break;
            }
            match rx.recv() {
                Ok(CommitMsg::Batch(b)) => group = b,
                Ok(CommitMsg::Close) | Err(_) => {
                    closing = true;
                    continue;
                }
            }
        }
        while group.len() < MAX_COMMIT_GROUP && !closing {
            match rx.try_recv() {
                Ok(CommitMsg::Batch(b)) => group.extend(b),
                Ok(CommitMsg::Close) => closing = true,
                Err(_) => break,
            }
        }
        match store.append(&group) {
            Ok(()) => {
                committed_end = group
                    .last()
                    .map_or(committed_end, |a| a.record.seq.get() + 1);
                group.clear();
                shared.committed_to.send_replace(committed_end);
                backoff = Duration::from_millis(50);
                if lock(&shared.commit_error).take().is_some() {
                    eprintln!("tally: the local chain store commits again");
                }
                committed.notify_one();
                let mut j = lock(&shared.journal);
                if j.journaled_end == committed_end && j.sink.len() > JOURNAL_CLEAR_BYTES {
                    if let Err(e) = j.sink.clear() {
                        // Harmless: the next open finds these records committed.
                        eprintln!("tally: could not empty the record journal: {e}");
                    }
                }
            }
            Err(e) => {
                let message = e.to_string();
                if lock(&shared.commit_error)
                    .replace(message.clone())
                    .is_none()
                {
                    eprintln!(
                        "tally: committing journaled records to the local chain store failed; retrying, and refusing new records meanwhile: {message}"
                    );
                }
                if closing {
                    failures_while_closing += 1;
                    if failures_while_closing >= 5 {
                        eprintln!(
                            "tally: {} records stay in the record journal; they are committed when the chain store is next opened",
                            group.len()
                        );
                        return;
                    }
                }
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// Sends `result` to `reply`, or, for an append nobody waits for, reports
/// its failure on standard error.
pub(crate) fn answer(
    reply: Option<oneshot::Sender<Result<Record, AppendError>>>,
    result: Result<Record, AppendError>,
) {
    match reply {
        Some(tx) => {
            let _ = tx.send(result);
        }
        None => {
            if let Err(e) = result {
                eprintln!("tally: could not record: {e}");
            }
        }
    }
}

impl Recorder {
    /// Starts the writer for `agent` signing with `key` over `store`: every
    /// append resolves once its record is committed to the store durably.
    ///
    /// # Errors
    /// [`StoreError`] when the chain head cannot be read.
    pub fn start<W: ChainWriter>(
        agent: AgentName,
        key: SecretKey,
        clock: Arc<dyn Clock>,
        store: W,
    ) -> Result<Self, StoreError> {
        let head = store.head()?;
        Self::spawn(agent, key, clock, head, Sink::Store(Box::new(store)), None)
    }

    /// Starts the writer with a record journal: every append resolves once
    /// its record is written to `journal` (it then survives the death of
    /// this process), and a second thread commits it to `store` durably
    /// right after. The journal must be empty: [`crate::store::ChainStore::open`]
    /// replays and empties it.
    ///
    /// # Errors
    /// [`StoreError`] when the chain head cannot be read, or the journal
    /// still holds records.
    pub fn start_journaled<W: ChainWriter, J: JournalSink>(
        agent: AgentName,
        key: SecretKey,
        clock: Arc<dyn Clock>,
        store: W,
        journal: J,
    ) -> Result<Self, StoreError> {
        if !journal.is_empty() {
            return Err(StoreError::Corrupt(
                "the record journal still holds records: open the chain store first, which commits them".into(),
            ));
        }
        let head = store.head()?;
        let shared = Arc::new(JournalShared {
            journal: Mutex::new(JournalState {
                sink: Box::new(journal),
                journaled_end: 0,
            }),
            commit_error: Mutex::new(None),
            committed_to: tokio::sync::watch::channel(0).0,
        });
        let committed_to = shared.committed_to.subscribe();
        let (to_committer, from_writer) = std::sync::mpsc::channel();
        let committed = Arc::new(Notify::new());
        let committer = {
            let shared = Arc::clone(&shared);
            let committed = Arc::clone(&committed);
            std::thread::Builder::new()
                .name("tally-chain-committer".into())
                .spawn(move || run_committer(store, from_writer, shared, committed))
                .map_err(|e| {
                    StoreError::Db(format!("cannot start the chain committer thread: {e}"))
                })?
        };
        let sink = Sink::Journal(JournalSide {
            shared,
            to_committer,
        });
        let mut r = Self::spawn(agent, key, clock, head, sink, Some((committer, committed)))?;
        r.handle.committed_to = Some(committed_to);
        Ok(r)
    }

    fn spawn(
        agent: AgentName,
        key: SecretKey,
        clock: Arc<dyn Clock>,
        head: Option<(Seq, Hash, UnixMillis)>,
        sink: Sink,
        committer: Option<(JoinHandle<()>, Arc<Notify>)>,
    ) -> Result<Self, StoreError> {
        let (committer, committed) = match committer {
            Some((t, n)) => (Some(t), n),
            None => (None, Arc::new(Notify::new())),
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let writer = Writer {
            agent,
            key,
            clock,
            sink,
            head,
            broken: None,
            committed: Arc::clone(&committed),
        };
        let thread = std::thread::Builder::new()
            .name("tally-chain-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(|e| StoreError::Db(format!("cannot start the chain writer thread: {e}")))?;
        Ok(Self {
            handle: RecorderHandle {
                tx: Some(tx),
                unavailable: Arc::from("closed"),
                committed,
                committed_to: None,
            },
            thread: Some(thread),
            committer,
        })
    }

    /// A handle to send appends.
    #[must_use]
    pub fn handle(&self) -> RecorderHandle {
        self.handle.clone()
    }

    /// Commits everything queued so far to the store, then stops the
    /// writer (and the committer: the journal is empty afterwards unless
    /// the store refused the last commits).
    pub fn close(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = self.handle.send(Request::Close);
            let _ = t.join();
        }
        if let Some(t) = self.committer.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.stop();
    }
}
