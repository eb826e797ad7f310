//! The parallel half of `verify`: parsing a pack line and every check that
//! needs only that line and the trust anchors (strict signature, key lookup,
//! entry rebuild and inclusion proof, nonce fingerprint) run on worker
//! threads; the ordered half (chains, receipts, timing, outcomes) runs on
//! the reading thread over the results, in pack order. docs/protocol.md §11.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::mpsc::{channel, sync_channel, Receiver, SyncSender};
use std::sync::Mutex;

pub(crate) use crate::threads::thread_count;

use tally_schemas::entry::entry_leaf_hash;
use tally_schemas::limits::{MAX_ENTRY_BYTES, MAX_PROOF_HASHES};
use tally_schemas::pack::{AgentKey, PackCheckpoint, PackEnd, PackError, PackLine, PackRecord};
use tally_schemas::time::UnixMillis;
use tally_schemas::tree::{InclusionPaths, LeafIndex, TreeSize};
use tally_schemas::{Hash, Record};

/// Lines per batch handed to a worker, at most. Small enough that the
/// batches in flight (queued, being worked, results waiting) hold a few
/// megabytes; large enough that handing them over costs nothing measurable.
pub(crate) const BATCH_LINES: usize = 128;
/// Bytes of lines per batch, at least once reached (a batch is sent when it
/// has `BATCH_LINES` lines or this many bytes, so one batch holds at most
/// this plus one line).
pub(crate) const BATCH_BYTES: usize = 256 << 10;

/// What the workers share: the trust anchors and the pack's tree.
pub(crate) struct Context {
    /// Trusted keys by agent name (from agent-keys.json only).
    pub keys: HashMap<String, Vec<AgentKey>>,
    /// The pack checkpoint's size and root, when it could be read.
    pub pack_tree: Option<(TreeSize, Hash)>,
    /// Keys of the nonce fingerprint (random per run, so nobody can aim a
    /// collision at it).
    pub nonce_keys: (RandomState, RandomState),
}

impl Context {
    pub(crate) fn fingerprint(&self, bytes: &[u8]) -> u128 {
        (u128::from(self.nonce_keys.0.hash_one(bytes)) << 64)
            | u128::from(self.nonce_keys.1.hash_one(bytes))
    }
}

/// Whether a record's key is trusted and active, per agent-keys.json.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyStatus {
    UnknownAgent,
    UnknownKey,
    Inactive,
    Active,
}

/// One record line after the parallel checks.
pub(crate) struct RecordWork {
    /// The line as parsed (boxed by the parser; kept in its box).
    pub line: Box<PackRecord>,
    pub key: KeyStatus,
    /// `None` when no trusted key is named (the record is `agent_keys`'s).
    pub sig_ok: Option<bool>,
    /// `None` for a record that is not witnessed.
    pub inclusion: Option<Result<(), String>>,
    pub nonce_fp: u128,
}

/// One pack line after the parallel half.
pub(crate) enum Parsed {
    Header,
    Checkpoint(Box<PackCheckpoint>),
    Record(RecordWork),
    End(PackEnd),
    Bad(String),
    TooLong(u64),
}

/// A line as handed to a worker: its place in the batch's bytes.
pub(crate) enum RawLine {
    Text(std::ops::Range<usize>),
    TooLong(u64),
}

/// Lines read one after another, with their bytes end to end in one buffer
/// (one allocation per batch, not one per line).
#[derive(Default)]
pub(crate) struct Batch {
    pub data: Vec<u8>,
    pub lines: Vec<RawLine>,
}

impl Batch {
    pub(crate) fn with_capacity(bytes: usize) -> Self {
        Self {
            data: Vec::with_capacity(bytes),
            lines: Vec::with_capacity(BATCH_LINES),
        }
    }

    pub(crate) fn is_full(&self) -> bool {
        self.lines.len() >= BATCH_LINES || self.data.len() >= BATCH_BYTES
    }
}

/// Proves an entry at `index` in the tree `(size, root)`; `paths` is the
/// caller's memory of the last proof walked (it changes the speed, never the
/// answer).
pub(crate) fn prove_entry(
    paths: &mut InclusionPaths,
    index: LeafIndex,
    received: UnixMillis,
    record: &Record,
    proof: &[Hash],
    size: TreeSize,
    root: &Hash,
) -> Result<(), String> {
    if proof.len() > MAX_PROOF_HASHES {
        return Err(format!(
            "inclusion proof has {} hashes, more than {MAX_PROOF_HASHES}",
            proof.len()
        ));
    }
    let (leaf, entry_len) = entry_leaf_hash(index, received, record);
    if entry_len > MAX_ENTRY_BYTES {
        return Err(format!(
            "entry is {entry_len} bytes, more than {MAX_ENTRY_BYTES}"
        ));
    }
    paths.verify(index, size, &leaf, proof, root).map_err(|e| {
        format!("entry not proven at index {index} in the checkpoint of size {size}: {e}")
    })
}

/// Looks up the trusted key a record names, and whether it was active.
pub(crate) fn lookup_key<'a>(
    keys: &'a HashMap<String, Vec<AgentKey>>,
    record: &Record,
) -> (KeyStatus, Option<&'a AgentKey>) {
    let Some(list) = keys.get(record.agent.as_str()) else {
        return (KeyStatus::UnknownAgent, None);
    };
    match list.iter().find(|k| k.key_id == record.key_id) {
        None => (KeyStatus::UnknownKey, None),
        Some(k) if k.active_at(record.time) => (KeyStatus::Active, Some(k)),
        Some(k) => (KeyStatus::Inactive, Some(k)),
    }
}

/// What one worker thread keeps from line to line: the last inclusion
/// proof it walked.
#[derive(Default)]
pub(crate) struct Worker {
    paths: InclusionPaths,
}

fn work_record(mut line: Box<PackRecord>, ctx: &Context, worker: &mut Worker) -> RecordWork {
    let record = &line.record;
    let (key, trusted) = lookup_key(&ctx.keys, record);
    let sig_ok = trusted.map(|k| crate::sig::verify_record(record, &k.public_key));
    let inclusion = line.witnessed.as_mut().map(|w| {
        let proven = match &ctx.pack_tree {
            Some((size, root)) => prove_entry(
                &mut worker.paths,
                w.index,
                w.received,
                record,
                &w.inclusion,
                *size,
                root,
            ),
            None => {
                Err("the pack checkpoint could not be read, so no entry can be proven".to_owned())
            }
        };
        // The proof has been checked and no ordered check reads it: it is
        // freed here, on the thread that made it.
        w.inclusion = Vec::new();
        proven
    });
    let nonce_fp = ctx.fingerprint(record.nonce.as_bytes());
    RecordWork {
        line,
        key,
        sig_ok,
        inclusion,
        nonce_fp,
    }
}

/// The parallel half for one line of `data`, on `worker`'s thread.
pub(crate) fn work(line: RawLine, data: &[u8], ctx: &Context, worker: &mut Worker) -> Parsed {
    let bytes = match line {
        RawLine::TooLong(len) => return Parsed::TooLong(len),
        RawLine::Text(range) => &data[range],
    };
    match PackLine::from_json(bytes) {
        Ok(PackLine::Header(_)) => Parsed::Header,
        Ok(PackLine::Checkpoint(c)) => Parsed::Checkpoint(Box::new(c)),
        Ok(PackLine::Record(r)) => Parsed::Record(work_record(r, ctx, worker)),
        Ok(PackLine::End(e)) => Parsed::End(e),
        Err(PackError::UnsupportedVersion { what, found }) => {
            Parsed::Bad(format!("{what} format version {found} is not supported"))
        }
        Err(e) => Parsed::Bad(e.to_string()),
    }
}

/// The bounded queue of batches (made outside the thread scope so that the
/// workers can borrow it).
pub(crate) struct JobQueue {
    tx: Mutex<Option<SyncSender<Job>>>,
    rx: Mutex<Receiver<Job>>,
}

/// A numbered batch of lines.
type Job = (u64, Batch);

impl JobQueue {
    /// A queue holding at most `depth` batches.
    pub(crate) fn new(depth: usize) -> Self {
        let (tx, rx) = sync_channel(depth);
        Self {
            tx: Mutex::new(Some(tx)),
            rx: Mutex::new(rx),
        }
    }
}

/// A batch of lines in, its results out, in the order sent.
pub(crate) struct Pipeline<'a> {
    jobs: Option<SyncSender<Job>>,
    results: Receiver<(u64, Vec<Parsed>)>,
    sent: u64,
    next: u64,
    waiting: std::collections::BTreeMap<u64, Vec<Parsed>>,
    /// Batches sent whose results have not been taken in order: queued,
    /// being worked on, or done and waiting for an earlier one.
    max_in_flight: u64,
    _scope: std::marker::PhantomData<&'a ()>,
}

impl<'a> Pipeline<'a> {
    /// Starts `threads` workers in `scope`, taking jobs from `queue`.
    pub(crate) fn start<'env>(
        scope: &'a std::thread::Scope<'a, 'env>,
        ctx: &'a Context,
        queue: &'a JobQueue,
        threads: usize,
    ) -> Self
    where
        'env: 'a,
    {
        let (res_tx, res_rx) = channel();
        for _ in 0..threads {
            let res_tx = res_tx.clone();
            let rx = &queue.rx;
            scope.spawn(move || {
                let mut worker = Worker::default();
                loop {
                    let job = rx
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .recv();
                    let Ok((id, batch)) = job else { break };
                    let data = &batch.data;
                    let out: Vec<Parsed> = batch
                        .lines
                        .into_iter()
                        .map(|l| work(l, data, ctx, &mut worker))
                        .collect();
                    if res_tx.send((id, out)).is_err() {
                        break;
                    }
                }
            });
        }
        let jobs = queue
            .tx
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        Self {
            jobs,
            results: res_rx,
            sent: 0,
            next: 0,
            waiting: std::collections::BTreeMap::new(),
            max_in_flight: 4 * threads as u64,
            _scope: std::marker::PhantomData,
        }
    }

    /// Hands a batch to the workers, and returns the results that came
    /// back in order meanwhile. It blocks while `max_in_flight` batches are
    /// out: the queue alone would not bound memory, because when one worker
    /// stalls (the machine is busy) the others go on, and their results
    /// wait for the stalled one's.
    pub(crate) fn send(&mut self, batch: Batch) -> Vec<Vec<Parsed>> {
        let mut done = Vec::new();
        while self.sent - self.next >= self.max_in_flight {
            match self.results.recv() {
                Ok((id, out)) => {
                    self.waiting.insert(id, out);
                    done.extend(self.take_in_order());
                }
                Err(_) => break,
            }
        }
        if let Some(jobs) = &self.jobs {
            if jobs.send((self.sent, batch)).is_ok() {
                self.sent += 1;
            }
        }
        done
    }

    /// Results ready in order, without blocking.
    pub(crate) fn ready(&mut self) -> Vec<Vec<Parsed>> {
        while let Ok((id, out)) = self.results.try_recv() {
            self.waiting.insert(id, out);
        }
        self.take_in_order()
    }

    /// Closes the queue and waits for every remaining result, in order.
    pub(crate) fn finish(&mut self) -> Vec<Vec<Parsed>> {
        self.jobs = None;
        let mut out = Vec::new();
        while self.next < self.sent {
            out.extend(self.take_in_order());
            if self.next >= self.sent {
                break;
            }
            match self.results.recv() {
                Ok((id, batch)) => {
                    self.waiting.insert(id, batch);
                }
                Err(_) => break,
            }
        }
        out
    }

    fn take_in_order(&mut self) -> Vec<Vec<Parsed>> {
        let mut out = Vec::new();
        while let Some(batch) = self.waiting.remove(&self.next) {
            out.push(batch);
            self.next += 1;
        }
        out
    }
}
