//! Several active fronts on one shared store (docs/operations.md,
//! "Running on PostgreSQL"; docs/storage.md, "Several fronts: the `Lease`
//! and `HandOver` traits"). This module names no backend: it works through
//! [`SharedStore`] (PostgreSQL, or the memory store's fronts in tests).
//!
//! Every front admits records and serves reads; the one holding the lease
//! also sequences. A front's thread (this module) takes the appends its
//! [`crate::Log`] queues and:
//! - as the **sequencer**, hands them to a sequencer thread
//!   ([`crate::sequencer::run`], unchanged), and also feeds it the requests
//!   other fronts left in `tally_pending`, in id order, writing each
//!   request's answers (entry index and receipt, or refusal, per item)
//!   back once its group commit is durable and signed;
//! - as a **follower**, hands them over (on PostgreSQL, into
//!   `tally_pending`: one row per request, so a batch keeps its order),
//!   waits for their answers, which carry the receipts the sequencer's
//!   front built, and answers with each once it checks (record, log key,
//!   inclusion proof); an answer without one, or one that does not check,
//!   has its receipt built from the log's tables (the stored receipt size,
//!   checkpoint note and inclusion proof, as for a retry). Past
//!   the waiting bound it answers [`AppendError::Unavailable`]; the
//!   request stays and is integrated later, so sending the record again is
//!   safe. It follows the latest checkpoint (checked: signature, root
//!   recomputed from storage, consistency with the one before) so its
//!   reads serve what is signed.
//!
//! A follower tries the lease every quarter of its ttl and, once it has it,
//! recovers as at open (root recomputed, consistency proven, then signing)
//! and starts sequencing; a sequencer whose lease was lost (the store
//! fences its writes) stops its sequencer thread and follows. Answers that
//! are not final (a storage error, a fenced write) are never written: the
//! request stays open for the next sequencer, whose rules find a record
//! already committed and answer with its original entry.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tally_schemas::entry::EntryError;
use tally_schemas::note::open_checkpoint;
use tally_schemas::{
    AgentName, Checkpoint, Entry, Hash, LeafIndex, Nonce, Receipt, Record, Seq, UnixMillis,
};
use tokio::sync::{mpsc, oneshot, Notify};

use crate::checkpoint::{check_extends, recover, SignedCheckpoint};
use crate::error::{AppendError, OpenError};
use crate::item::{Appended, BatchItem};
use crate::receipt::{read_entry, stored_receipt};
use crate::sequencer::{self, BatchAnswers, Job, Shared};
use crate::store::{KeyVersion, LogStore, SharedStore, StoreError};
use crate::tree::{self, StoredHashes};

/// How a front waits (docs/operations.md, "Running on PostgreSQL").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrontOptions {
    /// How long a follower waits for the sequencer's answer before it
    /// answers [`AppendError::Unavailable`].
    pub(crate) wait: Duration,
    /// How often a front looks at `tally_pending` when no notification
    /// came (LISTEN/NOTIFY is the fast path; this is the fallback).
    pub(crate) poll: Duration,
}

impl FrontOptions {
    /// The defaults for a lease of `ttl`: a takeover takes at most the ttl
    /// plus the new sequencer's recovery, so a follower waits twice the
    /// ttl plus 2 s.
    #[must_use]
    pub(crate) fn for_ttl(ttl: Duration) -> Self {
        Self {
            wait: ttl * 2 + Duration::from_secs(2),
            poll: Duration::from_millis(50),
        }
    }
}

/// Answered rows nobody came back for are deleted after this long.
const ANSWERED_KEEP_SECS: f64 = 3600.0;
/// Most open requests taken from `tally_pending` at once.
const PUMP_ROWS: i64 = 256;

/// One item of a request, as stored in `tally_pending.items`.
#[derive(Serialize, Deserialize)]
enum WireItem {
    /// A record admitted by the front without a key version: its canonical
    /// JSON.
    R(String),
    /// A record admitted by the front under its agent's key version
    /// (contract rule 8 of [`crate::store`]): its canonical JSON and the
    /// version.
    F(String, i64),
    /// A record the front refused, holding its agent's place.
    X(AgentName, u64),
}

/// One answer, as stored in `tally_pending.answers`.
#[derive(Serialize, Deserialize)]
enum WireAnswer {
    Ok {
        index: u64,
        duplicate: bool,
        /// The receipt the sequencer's front answered with: the waiting
        /// front checks it against the record it handed over and the log
        /// key (docs/storage.md "Hand-over between fronts") and answers with
        /// it, without reading the log's tables. Answers written without
        /// one (by an earlier build) have their receipt built from storage.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        receipt: Option<Receipt>,
    },
    NonceReplayed {
        nonce: Nonce,
        first_index: u64,
    },
    ChainConflict {
        agent: AgentName,
        head_seq: Option<u64>,
        head_hash: Option<Hash>,
    },
    PriorRecordRefused {
        agent: AgentName,
        seq: u64,
    },
    RefusedByCaller,
    KeyChanged {
        agent: AgentName,
    },
    TooLarge {
        size: usize,
        max: usize,
    },
    LogFull,
}

fn encode_items(items: &[BatchItem], fences: &[Option<KeyVersion>]) -> Result<String, AppendError> {
    let wire: Vec<WireItem> = items
        .iter()
        .enumerate()
        .map(|(k, i)| match i {
            BatchItem::Record(r) => {
                let json = String::from_utf8_lossy(r.canonical_bytes()).into_owned();
                match fences.get(k).copied().flatten() {
                    Some(v) => WireItem::F(json, v.get()),
                    None => WireItem::R(json),
                }
            }
            BatchItem::Refused { agent, seq } => WireItem::X(agent.clone(), seq.get()),
        })
        .collect();
    serde_json::to_string(&wire)
        .map_err(|e| AppendError::Storage(StoreError::Corrupt(format!("encoding items: {e}"))))
}

/// A stored request's items and the key version each was admitted under.
type DecodedItems = (Vec<BatchItem>, Vec<Option<KeyVersion>>);

fn decode_items(text: &str) -> Result<DecodedItems, String> {
    let wire: Vec<WireItem> = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let record = |json: &str| {
        Record::from_json(json.as_bytes())
            .map(BatchItem::Record)
            .map_err(|e| e.to_string())
    };
    wire.into_iter()
        .map(|w| match w {
            WireItem::R(json) => Ok((record(&json)?, None)),
            WireItem::F(json, v) => Ok((record(&json)?, Some(KeyVersion::new(v)))),
            WireItem::X(agent, seq) => Seq::new(seq)
                .map(|seq| (BatchItem::Refused { agent, seq }, None))
                .map_err(|e| e.to_string()),
        })
        .collect::<Result<Vec<_>, String>>()
        .map(|pairs| pairs.into_iter().unzip())
}

/// The answers to store for one request, or `None` while one of them is
/// not final (the request then stays open for the next attempt).
pub(crate) fn encode_answers(answers: &BatchAnswers) -> Option<String> {
    let wire: Option<Vec<WireAnswer>> = answers
        .iter()
        .map(|a| match a {
            Ok(a) => Some(WireAnswer::Ok {
                index: a.entry.index().get(),
                duplicate: a.duplicate,
                receipt: Some(a.receipt.clone()),
            }),
            Err(AppendError::NonceReplayed { nonce, first_index }) => {
                Some(WireAnswer::NonceReplayed {
                    nonce: nonce.clone(),
                    first_index: first_index.get(),
                })
            }
            Err(AppendError::ChainConflict {
                agent,
                head_seq,
                head_hash,
            }) => Some(WireAnswer::ChainConflict {
                agent: agent.clone(),
                head_seq: head_seq.map(Seq::get),
                head_hash: *head_hash,
            }),
            Err(AppendError::PriorRecordRefused { agent, seq }) => {
                Some(WireAnswer::PriorRecordRefused {
                    agent: agent.clone(),
                    seq: seq.get(),
                })
            }
            Err(AppendError::RefusedByCaller) => Some(WireAnswer::RefusedByCaller),
            Err(AppendError::KeyChanged { agent }) => Some(WireAnswer::KeyChanged {
                agent: agent.clone(),
            }),
            Err(AppendError::Entry(EntryError::TooLarge { size, max })) => {
                Some(WireAnswer::TooLarge {
                    size: *size,
                    max: *max,
                })
            }
            Err(AppendError::LogFull) => Some(WireAnswer::LogFull),
            Err(_) => None,
        })
        .collect();
    serde_json::to_string(&wire?).ok()
}

/// The checkpoint of the receipts answered last, opened once (its
/// signature checked) for all the receipts under it.
pub(crate) type OpenedNote = Mutex<Option<(String, Checkpoint)>>;

/// `receipt` if it is the receipt of `record` at `index`, proven under a
/// checkpoint the log key signed: the entry it proves.
fn checked_receipt(
    receipt: &Receipt,
    record: &Record,
    index: u64,
    signer: &tally_schemas::NoteSigner,
    opened: &OpenedNote,
) -> Result<Entry, String> {
    let mut last = opened.lock().unwrap_or_else(PoisonError::into_inner);
    let checkpoint = match &*last {
        Some((note, cp)) if *note == receipt.checkpoint => cp.clone(),
        _ => {
            let cp = open_checkpoint(&receipt.checkpoint, signer.verifier())
                .map_err(|e| e.to_string())?;
            *last = Some((receipt.checkpoint.clone(), cp.clone()));
            cp
        }
    };
    drop(last);
    let entry = receipt
        .verify_opened(record, &checkpoint)
        .map_err(|e| e.to_string())?;
    if entry.index().get() != index {
        return Err(format!(
            "the receipt is for entry {}, the answer says {index}",
            entry.index()
        ));
    }
    Ok(entry)
}

/// A request's stored answers as the log's answers (blocking): each
/// admitted record's receipt as the sequencer's front answered it, once
/// checked, or else built from storage. `records` are the request's items,
/// `None` for an item the front refused.
pub(crate) fn decode_answers(
    store: &dyn LogStore,
    signer: &tally_schemas::NoteSigner,
    opened: &OpenedNote,
    text: &str,
    records: &[Option<Record>],
) -> BatchAnswers {
    let n = records.len();
    let corrupt = |what: String| AppendError::Storage(StoreError::Corrupt(what));
    let wire: Vec<WireAnswer> = match serde_json::from_str(text) {
        Ok(w) => w,
        Err(e) => return vec![Err(corrupt(format!("stored answers: {e}"))); n],
    };
    if wire.len() != n {
        return vec![Err(corrupt(format!("{} answers for {n} items", wire.len()))); n];
    }
    let seq = |s: u64| Seq::new(s).map_err(|e| corrupt(e.to_string()));
    wire.into_iter()
        .zip(records)
        .map(|(w, record)| match w {
            WireAnswer::Ok {
                index,
                duplicate,
                receipt,
            } => {
                if let (Some(receipt), Some(record)) = (receipt, record) {
                    match checked_receipt(&receipt, record, index, signer, opened) {
                        Ok(entry) => {
                            return Ok(Appended {
                                entry,
                                receipt,
                                duplicate,
                            })
                        }
                        Err(why) => tracing::warn!(
                            index,
                            "the sequencer's receipt does not check ({why}); building it from storage"
                        ),
                    }
                }
                match stored_receipt(store, signer, LeafIndex::new(index)) {
                    Ok(Some((entry, receipt))) => Ok(Appended {
                        entry,
                        receipt,
                        duplicate,
                    }),
                    Ok(None) => Err(corrupt(format!("answered entry {index} is not stored"))),
                    Err(e) => Err(AppendError::Storage(match e {
                        crate::ReadError::Store(s) => s,
                        other => StoreError::Corrupt(other.to_string()),
                    })),
                }
            }
            WireAnswer::NonceReplayed { nonce, first_index } => Err(AppendError::NonceReplayed {
                nonce,
                first_index: LeafIndex::new(first_index),
            }),
            WireAnswer::ChainConflict {
                agent,
                head_seq,
                head_hash,
            } => Err(AppendError::ChainConflict {
                agent,
                head_seq: head_seq.map(seq).transpose()?,
                head_hash,
            }),
            WireAnswer::PriorRecordRefused { agent, seq: s } => {
                Err(AppendError::PriorRecordRefused {
                    agent,
                    seq: seq(s)?,
                })
            }
            WireAnswer::RefusedByCaller => Err(AppendError::RefusedByCaller),
            WireAnswer::KeyChanged { agent } => Err(AppendError::KeyChanged { agent }),
            WireAnswer::TooLarge { size, max } => {
                Err(AppendError::Entry(EntryError::TooLarge { size, max }))
            }
            WireAnswer::LogFull => Err(AppendError::LogFull),
        })
        .collect()
}

/// The latest checkpoint in the store if it is newer than `prev`, checked
/// as a follower must before serving it: its signature under this log's
/// key, the root recomputed from storage, and its consistency with `prev`.
pub(crate) fn follow_checkpoint(
    store: &dyn LogStore,
    signer: &tally_schemas::NoteSigner,
    prev: Option<&SignedCheckpoint>,
) -> Result<Option<SignedCheckpoint>, OpenError> {
    let Some((size, note)) = store.latest_checkpoint()? else {
        return Ok(None);
    };
    if prev.is_some_and(|p| p.checkpoint.size >= size) {
        return Ok(None);
    }
    let cp = open_checkpoint(&note, signer.verifier())
        .map_err(|source| OpenError::ForeignCheckpoint { size, source })?;
    if cp.size != size {
        return Err(OpenError::Store(StoreError::Corrupt(format!(
            "checkpoint stored under size {size} says size {}",
            cp.size
        ))));
    }
    let root = tree::root(store, size)?;
    if root != cp.root {
        return Err(OpenError::RootMismatch {
            size,
            checkpoint_root: cp.root,
            stored_root: root,
        });
    }
    if let Some(p) = prev {
        check_extends(&StoredHashes::new(store), &p.checkpoint, size, &root)?;
    }
    Ok(Some(SignedCheckpoint {
        checkpoint: cp,
        note,
    }))
}

/// The sequencer thread of a front that holds the lease.
pub(crate) struct Sequencing {
    tx: mpsc::UnboundedSender<Job>,
    queued: Arc<AtomicUsize>,
    handle: JoinHandle<()>,
    /// The last receive time handed to it: receive times never decrease in
    /// log order (check 9 of the verifier), whichever front stamped them.
    last_received: UnixMillis,
}

/// A request of this front waiting in `tally_pending`.
struct Waiter {
    reply: oneshot::Sender<BatchAnswers>,
    /// The request's records, `None` for an item the front refused: the
    /// answers' receipts are checked against them.
    records: Vec<Option<Record>>,
    deadline: Instant,
}

/// What a front's thread owns.
pub(crate) struct Front {
    pub(crate) shared: Arc<Shared>,
    pub(crate) pg: Arc<dyn SharedStore>,
    pub(crate) queued: Arc<AtomicUsize>,
    pub(crate) max_batch: usize,
    pub(crate) options: FrontOptions,
    pub(crate) name: String,
    /// Whether this front sequences now ([`crate::Log::watch_sequencing`]).
    pub(crate) sequencing: Arc<tokio::sync::watch::Sender<bool>>,
    /// The checkpoint of the last answered receipts, opened.
    pub(crate) opened: Arc<OpenedNote>,
}

/// Starts sequencing over `shared` after `recover` (the caller holds the
/// lease).
fn start_sequencing(shared: &Arc<Shared>, max_batch: usize) -> Result<Sequencing, OpenError> {
    let store = shared.store.as_ref();
    let cp = recover(store, &shared.signer)?;
    let size = cp.checkpoint.size;
    shared.set_latest(cp);
    let last_received = size
        .get()
        .checked_sub(1)
        .map(|i| read_entry(store, LeafIndex::new(i)))
        .transpose()
        .map_err(|e| {
            OpenError::Store(match e {
                crate::ReadError::Store(s) => s,
                other => StoreError::Corrupt(other.to_string()),
            })
        })?
        .flatten()
        .map_or(UnixMillis::new(0), |e| e.received());
    let (tx, rx) = mpsc::unbounded_channel();
    let queued = Arc::new(AtomicUsize::new(0));
    let (s, q) = (Arc::clone(shared), Arc::clone(&queued));
    let handle = std::thread::Builder::new()
        .name("tally-log-sequencer".into())
        .spawn(move || sequencer::run(&s, rx, &q, max_batch, size))
        .map_err(|e| {
            OpenError::Store(StoreError::Backend(format!(
                "cannot start the sequencer thread: {e}"
            )))
        })?;
    Ok(Sequencing {
        tx,
        queued,
        handle,
        last_received,
    })
}

/// Opens a front: sequences if it can take the lease, else follows once a
/// signed checkpoint exists (waiting for the first sequencer to sign one).
pub(crate) fn open_role(
    shared: &Arc<Shared>,
    pg: &dyn SharedStore,
    max_batch: usize,
) -> Result<Option<Sequencing>, OpenError> {
    let mut said = false;
    loop {
        if pg.try_lease()? {
            return match start_sequencing(shared, max_batch) {
                Ok(s) => Ok(Some(s)),
                Err(e) => {
                    pg.release_lease();
                    Err(e)
                }
            };
        }
        if let Some(cp) = follow_checkpoint(shared.store.as_ref(), &shared.signer, None)? {
            shared.set_latest(cp);
            tracing::info!(
                "following: the log's lease is held by {}; this front admits records and serves reads",
                pg.lease_holder().unwrap_or_else(|e| e.to_string())
            );
            return Ok(None);
        }
        if !said {
            tracing::warn!("waiting for the sequencer to sign the log's first checkpoint");
            said = true;
        }
        std::thread::sleep(lease_retry(pg));
    }
}

fn lease_retry(pg: &dyn SharedStore) -> Duration {
    (pg.lease_ttl() / 4).clamp(Duration::from_millis(100), Duration::from_secs(1))
}

/// The front's thread: runs until the log's queue closes and every
/// request it holds is answered.
pub(crate) fn run(front: Front, rx: mpsc::UnboundedReceiver<Job>, sequencing: Option<Sequencing>) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("the front's runtime did not start: {e}");
            return;
        }
    };
    rt.block_on(front.main(rx, sequencing));
}

impl Front {
    async fn main(self, mut rx: mpsc::UnboundedReceiver<Job>, mut seq: Option<Sequencing>) {
        let pending_note = self.pg.on_requests().unwrap_or_else(|e| {
            tracing::warn!("listening for handed-over requests failed ({e}); polling only");
            Arc::new(Notify::new())
        });
        let answers_note = self.pg.on_answers().unwrap_or_else(|e| {
            tracing::warn!("listening for answers failed ({e}); polling only");
            Arc::new(Notify::new())
        });
        let mut waiting: HashMap<i64, Waiter> = HashMap::new();
        // Requests of other fronts being integrated here: id -> items.
        let mut pumped: HashMap<i64, usize> = HashMap::new();
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(i64, Option<BatchAnswers>)>();
        let mut closed = false;
        let mut next_lease_try = Instant::now();
        let mut next_gc = Instant::now();
        let mut pump_now = true;
        let mut done: Vec<(i64, Option<BatchAnswers>)> = Vec::new();
        loop {
            let mut jobs = Vec::new();
            let tick = self.options.poll;
            tokio::select! {
                job = rx.recv(), if !closed => match job {
                    Some(j) => jobs.push(j),
                    None => closed = true,
                },
                d = done_rx.recv() => if let Some(d) = d { done.push(d) },
                () = pending_note.notified(), if seq.is_some() => pump_now = true,
                () = answers_note.notified() => {},
                () = tokio::time::sleep(tick) => pump_now = true,
            }
            while let Ok(j) = rx.try_recv() {
                jobs.push(j);
            }
            while let Ok(d) = done_rx.try_recv() {
                done.push(d);
            }

            // Role: a sequencer whose lease is gone follows; a follower
            // tries the lease now and then.
            if seq.is_some() && self.pg.lease_token() == 0 {
                if let Some(s) = seq.take() {
                    tracing::error!(
                        "this front lost the log's lease: it stops sequencing and follows"
                    );
                    self.sequencing.send_replace(false);
                    drop(s.tx);
                    let _ = tokio::task::spawn_blocking(move || s.handle.join()).await;
                }
                // Requests it was integrating go back to whoever sequences.
                pumped.clear();
            }
            if seq.is_none() && !closed && Instant::now() >= next_lease_try {
                next_lease_try = Instant::now() + lease_retry(self.pg.as_ref());
                let (shared, pg, mb) = (
                    Arc::clone(&self.shared),
                    Arc::clone(&self.pg),
                    self.max_batch,
                );
                let got = tokio::task::spawn_blocking(
                    move || -> Result<Option<Sequencing>, OpenError> {
                        if !pg.try_lease()? {
                            return Ok(None);
                        }
                        match start_sequencing(&shared, mb) {
                            Ok(s) => Ok(Some(s)),
                            Err(e) => {
                                pg.release_lease();
                                Err(e)
                            }
                        }
                    },
                )
                .await;
                match got {
                    Ok(Ok(Some(s))) => {
                        tracing::warn!(
                            size = %self.shared.latest().checkpoint.size,
                            "took the log's lease: this front recovered the log and sequences now"
                        );
                        seq = Some(s);
                        self.sequencing.send_replace(true);
                        pump_now = true;
                    }
                    Ok(Ok(None)) => {}
                    Ok(Err(e)) => {
                        tracing::error!(error = %e, "took the log's lease but recovery failed; gave it back")
                    }
                    Err(e) => tracing::error!("lease attempt panicked: {e}"),
                }
            }

            // This front's own requests.
            if !jobs.is_empty() {
                let n: usize = jobs.iter().map(|j| j.items.len()).sum();
                self.queued.fetch_sub(n, Ordering::AcqRel);
                match seq.as_mut() {
                    Some(s) => {
                        for job in jobs {
                            hand_over(s, job);
                        }
                    }
                    None => self.forward(jobs, &mut waiting).await,
                }
            }

            // Requests of other fronts, when sequencing.
            if let Some(s) = seq.as_mut() {
                if !done.is_empty() {
                    let mut rows = Vec::new();
                    for (id, answers) in done.drain(..) {
                        pumped.remove(&id);
                        if let Some(text) = answers.as_ref().and_then(encode_answers) {
                            rows.push((id, text));
                        }
                    }
                    let pg = Arc::clone(&self.pg);
                    if let Ok(Err(e)) =
                        tokio::task::spawn_blocking(move || pg.pending_answer(&rows)).await
                    {
                        tracing::warn!(error = %e, "writing answers to tally_pending failed; the requests stay open");
                    }
                }
                if pump_now && !closed {
                    pump_now = false;
                    let skip: Vec<i64> = pumped.keys().copied().collect();
                    let pg = Arc::clone(&self.pg);
                    match tokio::task::spawn_blocking(move || pg.pending_open(&skip, PUMP_ROWS))
                        .await
                    {
                        Ok(Ok(rows)) => {
                            for (id, received, items) in rows {
                                let (items, fences) = match decode_items(&items) {
                                    Ok(i) => i,
                                    Err(e) => {
                                        tracing::error!(
                                            id,
                                            "tally_pending row does not decode: {e}"
                                        );
                                        continue;
                                    }
                                };
                                let (reply, answer) = oneshot::channel();
                                pumped.insert(id, items.len());
                                let job = Job {
                                    items,
                                    fences,
                                    received: UnixMillis::new(received),
                                    reply,
                                };
                                hand_over(s, job);
                                let d = done_tx.clone();
                                tokio::spawn(async move {
                                    let _ = d.send((id, answer.await.ok()));
                                });
                            }
                        }
                        Ok(Err(e)) => tracing::warn!(error = %e, "reading tally_pending failed"),
                        Err(e) => tracing::error!("reading tally_pending panicked: {e}"),
                    }
                }
                if Instant::now() >= next_gc {
                    next_gc = Instant::now() + Duration::from_secs(60);
                    let pg = Arc::clone(&self.pg);
                    let _ = tokio::task::spawn_blocking(move || {
                        pg.pending_delete(&[], ANSWERED_KEEP_SECS)
                    })
                    .await;
                }
            } else {
                done.clear();
                // Follow the signed checkpoint.
                let shared = Arc::clone(&self.shared);
                let _ = tokio::task::spawn_blocking(move || {
                    let prev = shared.latest();
                    match follow_checkpoint(shared.store.as_ref(), &shared.signer, Some(&prev)) {
                        Ok(Some(cp)) => shared.set_latest(cp),
                        Ok(None) => {}
                        Err(e) => tracing::error!(error = %e, "the stored checkpoint does not extend the one this front serves; not following it"),
                    }
                })
                .await;
            }

            // Answers to this front's waiting requests.
            if !waiting.is_empty() {
                self.collect(&mut waiting).await;
            }

            if closed && waiting.is_empty() && pumped.is_empty() {
                break;
            }
        }
        if let Some(s) = seq.take() {
            self.sequencing.send_replace(false);
            drop(s.tx);
            let _ = tokio::task::spawn_blocking(move || s.handle.join()).await;
        }
    }

    /// Inserts this front's requests into `tally_pending` (a follower).
    async fn forward(&self, jobs: Vec<Job>, waiting: &mut HashMap<i64, Waiter>) {
        let mut rows = Vec::with_capacity(jobs.len());
        let mut kept = Vec::with_capacity(jobs.len());
        for job in jobs {
            match encode_items(&job.items, &job.fences) {
                Ok(text) => {
                    rows.push((job.received.as_millis(), text));
                    kept.push(job);
                }
                Err(e) => {
                    let _ = job
                        .reply
                        .send(job.items.iter().map(|_| Err(e.clone())).collect());
                }
            }
        }
        let (pg, name) = (Arc::clone(&self.pg), self.name.clone());
        let ids = tokio::task::spawn_blocking(move || pg.pending_insert(&name, &rows)).await;
        let ids = match ids {
            Ok(Ok(ids)) if ids.len() == kept.len() => ids,
            other => {
                let why = match other {
                    Ok(Err(e)) => e.to_string(),
                    Ok(Ok(_)) => "short insert".into(),
                    Err(e) => e.to_string(),
                };
                tracing::warn!("handing records to the sequencer failed: {why}");
                for job in kept {
                    let e =
                        AppendError::Unavailable(format!("handing the record over failed: {why}"));
                    let _ = job
                        .reply
                        .send(job.items.iter().map(|_| Err(e.clone())).collect());
                }
                return;
            }
        };
        let deadline = Instant::now() + self.options.wait;
        for (id, job) in ids.into_iter().zip(kept) {
            waiting.insert(
                id,
                Waiter {
                    reply: job.reply,
                    records: job
                        .items
                        .into_iter()
                        .map(|i| match i {
                            BatchItem::Record(r) => Some(r),
                            BatchItem::Refused { .. } => None,
                        })
                        .collect(),
                    deadline,
                },
            );
        }
    }

    /// Resolves this front's requests that have answers, and those past the
    /// waiting bound.
    async fn collect(&self, waiting: &mut HashMap<i64, Waiter>) {
        let ids: Vec<i64> = waiting.keys().copied().collect();
        let pg = Arc::clone(&self.pg);
        let answered = match tokio::task::spawn_blocking(move || pg.pending_answers(&ids)).await {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "reading answers from tally_pending failed");
                Vec::new()
            }
            Err(_) => Vec::new(),
        };
        let mut finished = Vec::with_capacity(answered.len());
        for (id, text) in answered {
            let Some(w) = waiting.remove(&id) else {
                continue;
            };
            finished.push(id);
            let shared = Arc::clone(&self.shared);
            let opened = Arc::clone(&self.opened);
            // Receipts are checked, or built from storage, off this thread.
            tokio::task::spawn_blocking(move || {
                let answers = decode_answers(
                    shared.store.as_ref(),
                    &shared.signer,
                    &opened,
                    &text,
                    &w.records,
                );
                let _ = w.reply.send(answers);
            });
        }
        if !finished.is_empty() {
            let pg = Arc::clone(&self.pg);
            tokio::task::spawn_blocking(move || {
                if let Err(e) = pg.pending_delete(&finished, ANSWERED_KEEP_SECS) {
                    tracing::warn!(error = %e, "deleting answered requests failed; they are deleted later");
                }
            });
        }
        let now = Instant::now();
        let late: Vec<i64> = waiting
            .iter()
            .filter(|(_, w)| w.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in late {
            if let Some(w) = waiting.remove(&id) {
                let e = AppendError::Unavailable(format!(
                    "no sequencer answered within {:?} (request {id} stays queued)",
                    self.options.wait
                ));
                let _ = w
                    .reply
                    .send(w.records.iter().map(|_| Err(e.clone())).collect());
            }
        }
    }
}

/// Gives `job` to the sequencer thread, with a receive time no earlier than
/// the last one handed to it.
fn hand_over(s: &mut Sequencing, mut job: Job) {
    if job.received < s.last_received {
        job.received = s.last_received;
    }
    s.last_received = job.received;
    let n = job.items.len();
    s.queued.fetch_add(n, Ordering::AcqRel);
    if let Err(mpsc::error::SendError(job)) = s.tx.send(job) {
        s.queued.fetch_sub(n, Ordering::AcqRel);
        let e = AppendError::Unavailable("this front stopped sequencing".into());
        let _ = job
            .reply
            .send(job.items.iter().map(|_| Err(e.clone())).collect());
    }
}
