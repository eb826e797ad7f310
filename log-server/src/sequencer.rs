//! The sequencer: the log's single writer thread and its group commit
//! (docs/storage.md, "Write path" and "Batches").
//!
//! Order of operations for one group commit, and why:
//! 1. Look up every queued record in storage, in one read.
//! 2. Classify each against storage plus the commit so far
//!    ([`crate::rules`]): retry, refusal, or new. The records of one batch
//!    are classified together, each agent's in seq order.
//! 3. Commit the new entries, their stored hashes and index rows in one
//!    durable transaction (compare-and-swap on the tree size; the redb
//!    store keeps its `ids` and `chains` rows in memory until a merge, docs/storage.md
//!    "Deferred index rows"). A shared
//!    store also checks there that every record was admitted under its
//!    agent's current key version (contract rule 8 of [`crate::store`]);
//!    when one was not, nothing is written, and the commit is classified
//!    and tried again with those records answered
//!    [`AppendError::KeyChanged`] (their front checks them again).
//! 4. Prove the new tree consistent with the last signed checkpoint, sign a
//!    checkpoint over the new size, and store it ([`crate::checkpoint`]).
//!    Nothing is signed over state that is not on disk.
//! 5. Only then resolve each append with its entry and receipt.
//!
//! A batch is never split across commits, so the new entries of one batch
//! share one checkpoint. After any storage error the writer re-reads
//! storage and runs recovery (the same as at open) before the next commit,
//! since a failed write may have landed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use tally_schemas::{
    AgentName, Entry, Hash, LeafIndex, NoteSigner, Record, Seq, TreeSize, UnixMillis,
};
use tokio::sync::{mpsc, oneshot, watch};

use crate::checkpoint::{
    check_extends, open_error_to_store, recover, sign_and_store, SignedCheckpoint,
};
use crate::error::AppendError;
use crate::item::{Appended, BatchItem};
use crate::receipt::{make_receipt, stored_receipt};
use crate::rules::{admission_order, CommitRules, Decision};
use crate::store::{BatchWrite, Found, KeyVersion, LogStore, Lookup, NewEntry, StoreError};
use crate::tree::{self, StoredHashes};

/// The answers of one batch, in its items' order.
pub(crate) type BatchAnswers = Vec<Result<Appended, AppendError>>;

/// One queued batch (a single append is a batch of one).
pub(crate) struct Job {
    pub(crate) items: Vec<BatchItem>,
    /// The key version each item was admitted under (contract rule 8 of
    /// [`crate::store`]), by the items' order; empty, or `None` for an
    /// item, when not fenced by the store.
    pub(crate) fences: Vec<Option<KeyVersion>>,
    pub(crate) received: UnixMillis,
    pub(crate) reply: oneshot::Sender<BatchAnswers>,
}

impl Job {
    /// The key version item `i` was admitted under, if fenced.
    fn fence(&self, i: usize) -> Option<KeyVersion> {
        self.fences.get(i).copied().flatten()
    }
}

/// How many times one group commit is tried again after a shared store
/// refused it because keys changed (each time without the records admitted
/// under the old keys).
const KEY_CHANGE_ROUNDS: usize = 16;

#[derive(Default)]
pub(crate) struct Stats {
    pub(crate) batches: AtomicU64,
    pub(crate) entries: AtomicU64,
    pub(crate) largest: AtomicU64,
}

/// What the writer and the readers share.
pub(crate) struct Shared {
    pub(crate) store: Arc<dyn LogStore>,
    pub(crate) signer: NoteSigner,
    pub(crate) latest: RwLock<Arc<SignedCheckpoint>>,
    /// The size of each newly signed checkpoint, for whoever follows them
    /// (the cosigning task, protocol.md §14.5).
    pub(crate) signed: watch::Sender<TreeSize>,
    /// The checkpoint `/checkpoint` serves once cosigning is on: the latest
    /// one cosigners were asked about, with their lines (§14.5).
    pub(crate) published: RwLock<Option<Arc<SignedCheckpoint>>>,
    pub(crate) stats: Stats,
}

impl Shared {
    pub(crate) fn latest(&self) -> Arc<SignedCheckpoint> {
        match self.latest.read() {
            Ok(g) => Arc::clone(&g),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    pub(crate) fn set_latest(&self, cp: SignedCheckpoint) {
        let size = cp.checkpoint.size;
        let cp = Arc::new(cp);
        match self.latest.write() {
            Ok(mut g) => *g = cp,
            Err(poisoned) => *poisoned.into_inner() = cp,
        }
        self.signed.send_replace(size);
    }
}

struct WriterState {
    size: TreeSize,
    healthy: bool,
}

/// The writer thread's loop: takes queued batches, up to `max_batch`
/// records per commit (a batch is never split), until the queue closes.
/// `queued` counts the records waiting, for the queue's capacity.
pub(crate) fn run(
    shared: &Shared,
    mut rx: mpsc::UnboundedReceiver<Job>,
    queued: &AtomicUsize,
    max_batch: usize,
    size: TreeSize,
) {
    let mut state = WriterState {
        size,
        healthy: true,
    };
    let mut carry: Option<Job> = None;
    loop {
        let first = match carry.take() {
            Some(job) => job,
            None => match rx.blocking_recv() {
                Some(job) => job,
                None => break,
            },
        };
        let mut records = first.items.len();
        let mut jobs = vec![first];
        while records < max_batch {
            match rx.try_recv() {
                Ok(job) if records + job.items.len() > max_batch => {
                    carry = Some(job);
                    break;
                }
                Ok(job) => {
                    records += job.items.len();
                    jobs.push(job);
                }
                Err(_) => break,
            }
        }
        queued.fetch_sub(records, Ordering::AcqRel);
        commit(shared, &mut state, jobs);
    }
}

fn fail_all(jobs: Vec<Job>, err: &AppendError) {
    for job in jobs {
        let answers = job.items.iter().map(|_| Err(err.clone())).collect();
        let _ = job.reply.send(answers);
    }
}

/// One group commit over `jobs`.
fn commit(shared: &Shared, state: &mut WriterState, jobs: Vec<Job>) {
    let store = shared.store.as_ref();
    if !state.healthy {
        match recover(store, &shared.signer) {
            Ok(cp) => {
                state.size = cp.checkpoint.size;
                shared.set_latest(cp);
                state.healthy = true;
            }
            Err(e) => {
                tracing::error!(error = %e, "log recovery failed; refusing appends");
                fail_all(jobs, &AppendError::Storage(open_error_to_store(e)));
                return;
            }
        }
    }

    // Agents whose keys changed after some of this commit's records were
    // admitted, with their current key versions (a shared store says so
    // when it refuses the commit: contract rule 8).
    let mut changed: HashMap<AgentName, KeyVersion> = HashMap::new();
    let mut rounds = 0;
    let old_size = state.size;
    let (rules, decided, committed) = loop {
        // 1. Everything classification needs from storage, in one read.
        // Storage cannot change meanwhile: this thread is its only writer.
        let found = match lookup_all(store, &jobs) {
            Ok(f) => f,
            Err(e) => {
                fail_all(jobs, &AppendError::Storage(e));
                return;
            }
        };

        // 2. Classify, batch by batch, each in its admission order.
        let mut rules = CommitRules::new(old_size);
        let mut found = found.into_iter();
        let mut decided: Vec<Vec<Decision>> = Vec::with_capacity(jobs.len());
        for job in &jobs {
            let found_here: Vec<Option<Found>> = job
                .items
                .iter()
                .map(|item| match item {
                    BatchItem::Record(_) => found.next(),
                    BatchItem::Refused { .. } => None,
                })
                .collect();
            decided.push(classify_batch(&mut rules, job, &found_here, &changed));
        }

        // 3–4. Commit and sign.
        if rules.entries().is_empty() {
            break (rules, decided, None);
        }
        let key_versions = admitted_under(&jobs, &decided, rules.entries());
        match commit_and_sign(shared, state, old_size, rules.entries(), key_versions) {
            Ok(c) => break (rules, decided, Some(c)),
            Err(StoreError::KeysChanged(now)) if rounds < KEY_CHANGE_ROUNDS => {
                // Nothing was written: classify again without the records
                // admitted under the old keys.
                rounds += 1;
                changed.extend(now);
            }
            Err(e) => {
                tracing::warn!(error = %e, "group commit failed; the writer will recover before the next one");
                state.healthy = false;
                let err = AppendError::Storage(e);
                for (job, decisions) in jobs.into_iter().zip(decided) {
                    let answers = decisions
                        .into_iter()
                        .map(|d| match d {
                            Decision::New(_) | Decision::Again(_) => Err(err.clone()),
                            Decision::Existing(index) => existing(store, &shared.signer, index),
                            Decision::Refused(e) => Err(e),
                        })
                        .collect();
                    let _ = job.reply.send(answers);
                }
                return;
            }
        }
    };

    // 5. Resolve. Each entry is moved into the last answer that names it
    // (a record sent twice in one commit is named twice), not copied.
    let mut entries: Vec<Option<Entry>> = rules.into_entries().into_iter().map(Some).collect();
    let mut uses = vec![0usize; entries.len()];
    for d in decided.iter().flatten() {
        if let Decision::New(pos) | Decision::Again(pos) = d {
            if let Some(n) = uses.get_mut(*pos) {
                *n += 1;
            }
        }
    }
    for (job, decisions) in jobs.into_iter().zip(decided) {
        let answers = decisions
            .into_iter()
            .map(|d| match d {
                Decision::New(pos) | Decision::Again(pos) => {
                    let duplicate = matches!(d, Decision::Again(_));
                    let (Some(c), Some(Some(entry))) = (&committed, entries.get(pos)) else {
                        return Err(AppendError::Storage(StoreError::Corrupt(
                            "no checkpoint after commit".into(),
                        )));
                    };
                    // The proof is computed from the batch's own hashes and
                    // the old tree's frontier, not read back from storage.
                    let reader = StoredHashes::for_batch(store, &c.hashes);
                    let inclusion = tree::inclusion_proof_with(&reader, entry.index(), c.size)
                        .map_err(AppendError::Storage)?;
                    let receipt = make_receipt(entry, c.note.clone(), inclusion);
                    uses[pos] -= 1;
                    let entry = if uses[pos] == 0 {
                        entries[pos].take()
                    } else {
                        entries[pos].clone()
                    };
                    Ok(Appended {
                        entry: entry.ok_or_else(|| {
                            AppendError::Storage(StoreError::Corrupt(
                                "an entry answered twice".into(),
                            ))
                        })?,
                        receipt,
                        duplicate,
                    })
                }
                Decision::Existing(index) => existing(store, &shared.signer, index),
                Decision::Refused(e) => Err(e),
            })
            .collect();
        let _ = job.reply.send(answers);
    }
}

/// Every queued record's lookup answers, in the jobs' order, in one read.
fn lookup_all(store: &dyn LogStore, jobs: &[Job]) -> Result<Vec<Found>, StoreError> {
    let lookups: Vec<Lookup<'_>> = jobs
        .iter()
        .flat_map(|j| j.items.iter())
        .filter_map(|item| match item {
            BatchItem::Record(r) => Some(Lookup {
                record_hash: r.hash(),
                nonce: &r.nonce,
                agent: &r.agent,
                seq: r.seq,
            }),
            BatchItem::Refused { .. } => None,
        })
        .collect();
    let found = store.lookup(&lookups)?;
    if found.len() != lookups.len() {
        return Err(StoreError::Corrupt("short lookup answer".into()));
    }
    Ok(found)
}

/// The key versions the new entries' records were admitted under, per
/// agent, once each (for [`BatchWrite::key_versions`]).
fn admitted_under(
    jobs: &[Job],
    decided: &[Vec<Decision>],
    entries: &[Entry],
) -> Vec<(AgentName, KeyVersion)> {
    let mut out: Vec<(AgentName, KeyVersion)> = Vec::new();
    for (job, decisions) in jobs.iter().zip(decided) {
        for (i, d) in decisions.iter().enumerate() {
            if let (Decision::New(pos), Some(v)) = (d, job.fence(i)) {
                if let Some(e) = entries.get(*pos) {
                    let agent = &e.record().agent;
                    if !out.iter().any(|(a, w)| a == agent && *w == v) {
                        out.push((agent.clone(), v));
                    }
                }
            }
        }
    }
    out
}

/// Classifies one batch's items in its admission order
/// ([`admission_order`]); the answer is in the items' order. Once a record
/// of an agent is refused (or was refused by the caller), the agent's later
/// records in the batch are refused with `PriorRecordRefused`. A new
/// record of an agent whose keys `changed` after the batch's records of it
/// were admitted is refused with `KeyChanged`, and so is every other new
/// record of that agent in the batch (its admitting front checks them
/// again, in order); a record already in the log still gets its entry.
fn classify_batch(
    rules: &mut CommitRules,
    job: &Job,
    found: &[Option<Found>],
    changed: &HashMap<AgentName, KeyVersion>,
) -> Vec<Decision> {
    let keys: Vec<(&AgentName, Seq)> = job
        .items
        .iter()
        .map(|item| match item {
            BatchItem::Record(r) => (&r.agent, r.seq),
            BatchItem::Refused { agent, seq } => (agent, *seq),
        })
        .collect();
    let stale: Vec<&AgentName> = job
        .items
        .iter()
        .enumerate()
        .filter_map(|(i, item)| match (item, job.fence(i)) {
            (BatchItem::Record(r), Some(v))
                if changed.get(&r.agent).is_some_and(|now| *now != v) =>
            {
                Some(&r.agent)
            }
            _ => None,
        })
        .collect();
    let mut refused: HashMap<&AgentName, Seq> = HashMap::new();
    let mut out: Vec<Option<Decision>> = job.items.iter().map(|_| None).collect();
    for i in admission_order(&keys) {
        let d = match (&job.items[i], found.get(i).and_then(Option::as_ref)) {
            (BatchItem::Record(r), Some(f)) if f.record.is_none() && stale.contains(&&r.agent) => {
                Decision::Refused(AppendError::KeyChanged {
                    agent: r.agent.clone(),
                })
            }
            (BatchItem::Record(r), Some(f)) => {
                let d = rules.classify(r, job.received, f, refused.get(&r.agent).copied());
                if matches!(d, Decision::Refused(_)) {
                    refused.entry(&r.agent).or_insert(r.seq);
                }
                d
            }
            (BatchItem::Refused { agent, seq }, _) => {
                refused.entry(agent).or_insert(*seq);
                Decision::Refused(AppendError::RefusedByCaller)
            }
            (BatchItem::Record(_), None) => Decision::Refused(AppendError::Storage(
                StoreError::Corrupt("no lookup answer for a record".into()),
            )),
        };
        out[i] = Some(d);
    }
    out.into_iter()
        .map(|d| {
            d.unwrap_or_else(|| {
                Decision::Refused(AppendError::Storage(StoreError::Corrupt(
                    "an item was not classified".into(),
                )))
            })
        })
        .collect()
}

/// The receipt first issued for a record committed at `index`.
fn existing(
    store: &dyn LogStore,
    signer: &NoteSigner,
    index: LeafIndex,
) -> Result<Appended, AppendError> {
    match stored_receipt(store, signer, index)? {
        Some((entry, receipt)) => Ok(Appended {
            entry,
            receipt,
            duplicate: true,
        }),
        None => Err(AppendError::Storage(StoreError::Corrupt(format!(
            "record indexed at {index} has no entry"
        )))),
    }
}

/// A committed batch: its size, its checkpoint note, and its hashes.
struct Committed {
    size: TreeSize,
    note: String,
    hashes: tree::BatchHashes,
}

/// Steps 3 and 4. On success the writer's size is the new size and the
/// returned checkpoint is stored (durably with the next commit).
fn commit_and_sign(
    shared: &Shared,
    state: &mut WriterState,
    old_size: TreeSize,
    entries: &[Entry],
    key_versions: Vec<(AgentName, KeyVersion)>,
) -> Result<Committed, StoreError> {
    let store = shared.store.as_ref();
    let new_entries: Vec<NewEntry> = entries
        .iter()
        .map(|e| {
            let r: &Record = e.record();
            NewEntry {
                index: e.index(),
                canonical: e.canonical_bytes().to_vec(),
                leaf_hash: e.leaf_hash(),
                record_hash: r.hash(),
                nonce: r.nonce.clone(),
                agent: r.agent.clone(),
                seq: r.seq,
                time: r.time,
            }
        })
        .collect();
    let leaves: Vec<Hash> = new_entries.iter().map(|e| e.leaf_hash).collect();
    let hashes = tree::extend(store, old_size, &leaves)?;
    let n = new_entries.len() as u64;
    let new_size = TreeSize::new(old_size.get() + n);
    let batch = BatchWrite {
        old_size,
        entries: new_entries,
        hashes: hashes.hashes.clone(),
        receipt_size: new_size,
        key_versions,
    };
    // The one durable write of the commit. It also persists the previous
    // commit's checkpoint note, stored without a sync of its own.
    store.commit_batch(&batch)?;
    drop(batch);
    state.size = new_size;

    // The batch is durable. Recompute the new root and prove it extends the
    // last signed checkpoint (the batch's hashes and the old frontier are
    // the bytes just committed and read; they are kept only to save reads).
    let reader = StoredHashes::for_batch(store, &hashes);
    let new_root = tree::root_with(&reader, new_size)?;
    let prev = shared.latest();
    check_extends(&reader, &prev.checkpoint, new_size, &new_root).map_err(open_error_to_store)?;
    drop(reader);
    // Signing is deterministic, so this note is a function of durable state:
    // storing it without its own fsync loses nothing a crash cannot rebuild
    // (recovery re-signs the same bytes). docs/storage.md, "Write path".
    let signed =
        sign_and_store(store, &shared.signer, new_size, new_root).map_err(open_error_to_store)?;
    let note = signed.note.clone();
    shared.set_latest(signed);

    let stats = &shared.stats;
    stats.batches.fetch_add(1, Ordering::Relaxed);
    stats.entries.fetch_add(n, Ordering::Relaxed);
    stats.largest.fetch_max(n, Ordering::Relaxed);
    Ok(Committed {
        size: new_size,
        note,
        hashes,
    })
}
