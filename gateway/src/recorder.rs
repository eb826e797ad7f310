//! The chain writer (issue 6 §1, docs/protocol.md §3): the one place where
//! an agent's records get their seq, prev, time and nonce, are signed, and
//! are committed to the local store.
//!
//! It runs on its own thread because a durable commit blocks on fsync.
//! Requests queue on a channel; the thread takes every request waiting and
//! commits them in one transaction (group commit), then answers each. A
//! caller that awaits [`RecorderHandle::append`] gets its record only after
//! it is durable, which is what "fail closed" needs: a decision that did not
//! commit is never forwarded.

use std::sync::Arc;
use std::thread::JoinHandle;

use rand_core::OsRng;
use tally_schemas::record::RecordError;
use tally_schemas::time::Clock;
use tally_schemas::{
    AgentName, Body, Hash, Nonce, Record, SecretKey, Seq, UnixMillis, UnsignedRecord,
};
use tokio::sync::{mpsc, oneshot, Notify};

use crate::store::{Appended, ChainWriter, Secret, StoreError};

/// Most records committed in one transaction.
const MAX_GROUP: usize = 256;

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
        let (reply, rx) = oneshot::channel();
        self.send(Request::Append {
            body: Box::new(body),
            secret,
            reply: Some(reply),
        })?;
        rx.await.map_err(|_| {
            AppendError::Unavailable("the chain writer stopped before answering".into())
        })?
    }

    /// Appends a record without waiting. Failures are reported on standard
    /// error by the writer; requests are committed in the order sent.
    ///
    /// # Errors
    /// [`AppendError::Unavailable`] when the writer is not running.
    pub fn append_detached(&self, body: Body, secret: Option<Secret>) -> Result<(), AppendError> {
        self.send(Request::Append {
            body: Box::new(body),
            secret,
            reply: None,
        })
    }
}

/// The running chain writer; [`Recorder::close`] drains and stops it.
pub struct Recorder {
    handle: RecorderHandle,
    thread: Option<JoinHandle<()>>,
}

struct Writer<W: ChainWriter> {
    agent: AgentName,
    key: SecretKey,
    clock: Arc<dyn Clock>,
    store: W,
    head: Option<(Seq, Hash, UnixMillis)>,
    broken: Option<String>,
    committed: Arc<Notify>,
}

impl<W: ChainWriter> Writer<W> {
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
            match self.store.append(&appended) {
                Ok(()) => {
                    for (reply, record) in replies {
                        answer(reply, Ok(record));
                    }
                    self.committed.notify_one();
                }
                Err(e) => {
                    let message = e.to_string();
                    // The batch did not land (or we cannot tell): take the
                    // head from the store again rather than guess.
                    self.head = saved_head;
                    match self.store.head() {
                        Ok(h) => self.head = h,
                        Err(e2) => {
                            self.broken =
                                Some(format!("{message}; and reading the head back failed: {e2}"))
                        }
                    }
                    for (reply, _) in replies {
                        answer(reply, Err(AppendError::Store(message.clone())));
                    }
                }
            }
        }
    }
}

fn answer(
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
    /// Starts the writer for `agent` signing with `key` over `store`.
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
        let committed = Arc::new(Notify::new());
        let (tx, rx) = mpsc::unbounded_channel();
        let writer = Writer {
            agent,
            key,
            clock,
            store,
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
            },
            thread: Some(thread),
        })
    }

    /// A handle to send appends.
    #[must_use]
    pub fn handle(&self) -> RecorderHandle {
        self.handle.clone()
    }

    /// Commits everything queued so far, then stops the writer.
    pub fn close(mut self) {
        let _ = self.handle.send(Request::Close);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = self.handle.send(Request::Close);
            let _ = t.join();
        }
    }
}
