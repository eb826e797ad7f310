//! Syncing the local chain to the witness (docs/protocol.md §8;
//! docs/operations.md "Syncing").
//!
//! Records go to the witness in seq order, starting at the sync cursor (the
//! lowest seq without an accepted receipt). A record is never skipped or
//! reordered: when the witness refuses one for good, syncing halts and says
//! why. A record whose answer was lost is simply sent again, at any later
//! time: the witness answers an exact resubmission with its original
//! receipt (protocol.md §8), which acceptance takes however old it is. Each receipt is accepted with [`crate::acceptance::accept_receipt_with`]
//! before it is stored and the cursor moves. Transient failures retry with
//! exponential backoff.
//!
//! The backlog goes in batches (`POST /v1/records/batch`, protocol.md
//! §8.1) of up to a window of records ([`DEFAULT_WINDOW`], at most
//! `MAX_BATCH_RECORDS` and `MAX_BATCH_BYTES`), in chain order, one batch
//! at a time: the witness admits a batch's records of one agent in seq
//! order and answers each, so nothing overtakes its predecessor and one
//! request carries a whole window. The receipts are accepted in order up
//! to the first record that got none; that record decides what happens
//! next, as with one post at a time (its successors in the batch are
//! `prior_record_refused` and go again). A witness without the batch route
//! (`404`) is sent one record at a time, in order.
//!
//! On `chain_conflict` the witness returns its head of the chain:
//! - a head that is one of our records, behind the cursor: the witness lost
//!   records it had receipted; the cursor rewinds and they are sent again
//!   (the old receipts are kept as evidence);
//! - a head we do not have, or a different record at that seq: a fork.
//!   Syncing stops and `tally status` reports it until resolved by hand.
//!
//! The pinned log keys can be retired after they were pinned. The syncer
//! refetches the witness's key directory (`/.well-known/tally/keys`) before
//! its first post, again every [`KEY_CHECK_INTERVAL`] while it posts, and at
//! once when a receipt is not accepted as untrusted, then judges that
//! receipt again. Only retirements of pinned keys are taken
//! ([`WitnessTrust::apply_directory`]), and written back to the agent's
//! configuration; a new key is reported, never trusted.

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tally_schemas::time::Clock;
use tally_schemas::AgentName;
use tokio::sync::{watch, Notify};

use crate::acceptance::{
    accept_receipt_with, parse_receipt, DirectoryReview, OpenedNote, ReceiptRejection, WitnessTrust,
};
use crate::state::StateDir;
use crate::store::{ChainStore, SyncErrorNote};
use crate::witness::{WitnessClient, WitnessError};
use tally_schemas::api::ChainHead;
use tally_schemas::batch::BatchRequest;
use tally_schemas::limits::MAX_BATCH_BYTES;

/// How often a syncer that is posting refetches the witness's key directory.
pub const KEY_CHECK_INTERVAL: Duration = Duration::from_secs(600);
/// How soon a key directory fetch that failed is tried again.
const KEY_CHECK_RETRY: Duration = Duration::from_secs(30);
/// Records sent in one batch by default: the most a batch may hold.
pub const DEFAULT_WINDOW: usize = tally_schemas::limits::MAX_BATCH_RECORDS;

/// What a sync task has achieved, watched by `--strict` calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncProgress {
    /// Every record below this seq has an accepted receipt.
    pub cursor: u64,
    /// The last failure, cleared by the next success.
    pub failure: Option<SyncErrorNote>,
    /// Set when syncing stopped for good (fork, refused record, bad receipt).
    pub halted: Option<SyncErrorNote>,
    /// Sync attempts finished so far (each post, or each look that found
    /// nothing to send): a waiter that allows one try waits for the next.
    pub attempts: u64,
}

/// Everything a sync task needs.
pub struct Syncer {
    store: Arc<ChainStore>,
    agent: String,
    client: WitnessClient,
    trust: RwLock<WitnessTrust>,
    /// Where retirements of pinned keys are written back.
    pins: Option<(StateDir, AgentName)>,
    key_check: Mutex<KeyCheck>,
    window: usize,
    /// Cleared when the witness has no batch route (an older witness).
    batches: std::sync::atomic::AtomicBool,
    clock: Arc<dyn Clock>,
    max_skew_ms: u64,
    progress: watch::Sender<SyncProgress>,
    /// Cuts a backoff wait short: someone waits for a receipt now.
    nudge: Notify,
    /// Cuts the linger after a commit short: a writer waits for a receipt.
    hurry: Notify,
    /// The checkpoint of the last batch's receipts, its signature checked.
    opened: OpenedNote,
}

/// How long the background sync waits after a commit before sending, unless
/// a writer waits for a receipt (docs/operations.md "Syncing"). Calls a few
/// milliseconds apart then go to the witness in one batch instead of one
/// batch each, which on a small machine takes the witness's and the
/// receipts' work off the path of the next calls (docs/benchmarks.md,
/// "Several writers").
pub const SYNC_LINGER: Duration = Duration::from_millis(100);

struct KeyCheck {
    interval: Duration,
    /// When the key directory is next due; `None`: before the first post.
    next: Option<tokio::time::Instant>,
}

/// The result of one attempt.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing left to send.
    Idle,
    /// A receipt was accepted (or the cursor was rewound); go on at once.
    Progress,
    /// A transient failure; try again later.
    Retry(SyncErrorNote),
    /// Stop syncing.
    Halt(SyncErrorNote),
}

impl Syncer {
    /// A sync task for `agent`'s chain in `store`.
    #[must_use]
    pub fn new(
        store: Arc<ChainStore>,
        agent: &str,
        client: WitnessClient,
        trust: WitnessTrust,
        clock: Arc<dyn Clock>,
        max_skew_ms: u64,
    ) -> Self {
        let cursor = store.sync_cursor().unwrap_or(0);
        let (progress, _) = watch::channel(SyncProgress {
            cursor,
            ..SyncProgress::default()
        });
        Self {
            store,
            agent: agent.to_owned(),
            client,
            trust: RwLock::new(trust),
            pins: None,
            key_check: Mutex::new(KeyCheck {
                interval: KEY_CHECK_INTERVAL,
                next: None,
            }),
            window: DEFAULT_WINDOW,
            batches: std::sync::atomic::AtomicBool::new(true),
            clock,
            max_skew_ms,
            progress,
            nudge: Notify::new(),
            hurry: Notify::new(),
            opened: OpenedNote::default(),
        }
    }

    /// Writes retirements of pinned keys learned from the key directory
    /// back to `agent`'s configuration in `state`.
    #[must_use]
    pub fn with_pin_file(mut self, state: StateDir, agent: AgentName) -> Self {
        self.pins = Some((state, agent));
        self
    }

    /// Sends up to `window` records in one batch request (1 to
    /// `MAX_BATCH_RECORDS`; default [`DEFAULT_WINDOW`]).
    #[must_use]
    pub fn with_window(mut self, window: usize) -> Self {
        self.window = window.clamp(1, tally_schemas::limits::MAX_BATCH_RECORDS);
        self
    }

    /// Refetches the key directory this often while posting (default
    /// [`KEY_CHECK_INTERVAL`]; tests only, feature `testing`).
    #[cfg(any(test, feature = "testing"))]
    #[must_use]
    pub fn with_key_check_interval(self, interval: Duration) -> Self {
        self.lock_key_check().interval = interval;
        self
    }

    /// The log keys receipts are accepted under now.
    #[must_use]
    pub fn trust(&self) -> WitnessTrust {
        self.trust
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn lock_key_check(&self) -> std::sync::MutexGuard<'_, KeyCheck> {
        self.key_check
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Fetches the key directory and applies it to the pinned keys (see the
    /// module documentation).
    ///
    /// # Errors
    /// A message when the directory cannot be fetched or is refused.
    pub async fn check_keys(&self) -> Result<DirectoryReview, String> {
        let due = {
            let mut k = self.lock_key_check();
            let now = tokio::time::Instant::now();
            k.next = Some(now + KEY_CHECK_RETRY);
            now + k.interval
        };
        let dir = self
            .client
            .key_directory()
            .await
            .map_err(|e| format!("fetching the witness's key directory: {e}"))?;
        let (review, trust) = {
            let mut t = self
                .trust
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            (t.apply_directory(&dir)?, t.clone())
        };
        self.lock_key_check().next = Some(due);
        for (key, at) in &review.retired {
            eprintln!(
                "tally: agent {}: the witness's key directory retires pinned log key {key} at {at}; receipts it signs from then on are refused",
                self.agent
            );
        }
        if !review.retired.is_empty() {
            if let Some((state, agent)) = &self.pins {
                state
                    .record_key_retirements(agent, &trust)
                    .map_err(|e| format!("recording the retirement of a pinned log key: {e}"))?;
            }
        }
        Ok(review)
    }

    /// Checks the keys when due; a failure leaves the pinned keys as they
    /// are and is tried again later.
    async fn check_keys_when_due(&self) {
        let due = self
            .lock_key_check()
            .next
            .is_none_or(|t| tokio::time::Instant::now() >= t);
        if due {
            if let Err(e) = self.check_keys().await {
                eprintln!("tally: agent {}: {e}", self.agent);
            }
        }
    }

    fn accept(&self, bytes: &[u8], record: &tally_schemas::Record) -> Result<(), ReceiptRejection> {
        let trust = self
            .trust
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        parse_receipt(bytes).and_then(|receipt| {
            accept_receipt_with(
                &receipt,
                record,
                &trust,
                self.clock.now(),
                self.max_skew_ms,
                &self.opened,
            )
            .map(|_| ())
        })
    }

    /// Accepts a receipt; when it is refused as untrusted, refetches the key
    /// directory first and judges it again, so a key retired or replaced
    /// since it was pinned is named in the error.
    ///
    /// # Errors
    /// The rejection's code and the message for the sync error.
    async fn accept_checking_keys(
        &self,
        bytes: &[u8],
        record: &tally_schemas::Record,
    ) -> Result<(), (&'static str, String)> {
        match self.accept(bytes, record) {
            Ok(()) => Ok(()),
            Err(ReceiptRejection::Untrusted(_) | ReceiptRejection::KeyRetired { .. }) => {
                let review = self.check_keys().await;
                match (self.accept(bytes, record), review) {
                    (Ok(()), _) => Ok(()),
                    (Err(r), Ok(review)) => {
                        Err((r.code(), format!("{r}{}", review.unpinned_note())))
                    }
                    (Err(r), Err(e)) => Err((r.code(), format!("{r} ({e})"))),
                }
            }
            Err(r) => Err((r.code(), r.to_string())),
        }
    }

    /// A receiver of progress updates.
    #[must_use]
    pub fn progress(&self) -> watch::Receiver<SyncProgress> {
        self.progress.subscribe()
    }

    fn note(&self, seq: Option<u64>, code: &str, message: String) -> SyncErrorNote {
        SyncErrorNote {
            time: self.clock.now(),
            seq,
            code: code.to_owned(),
            message,
        }
    }

    /// Sends the records from the cursor on (a batch of up to a window of
    /// them), if any, and handles the answers; their receipts are stored
    /// durably before it returns.
    pub async fn step(&self) -> Step {
        self.step_storing(Receipts::Durable).await
    }

    async fn step_storing(&self, receipts: Receipts) -> Step {
        let cursor = match self.store.sync_cursor() {
            Ok(c) => c,
            Err(e) => return Step::Retry(self.note(None, "store", e.to_string())),
        };
        let mut records = match self.store.records(cursor, self.window) {
            Ok(r) if r.is_empty() => return Step::Idle,
            Ok(r) => r,
            Err(e) => return Step::Retry(self.note(Some(cursor), "store", e.to_string())),
        };
        // Within the batch's byte limit (a record alone always fits).
        let mut size = BatchRequest::encoded_len([]);
        let fit = records
            .iter()
            .position(|r| {
                size += r.canonical_bytes().len() + 1;
                size > MAX_BATCH_BYTES
            })
            .unwrap_or(records.len());
        records.truncate(fit.max(1));
        self.check_keys_when_due().await;
        let answers = match self.post(&records).await {
            Ok(a) => a,
            Err(e) => return self.refused(cursor, e),
        };
        let mut accepted: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut halt = None;
        let mut first = None;
        for (record, answer) in records.iter().zip(answers) {
            let seq = record.seq.get();
            match answer {
                Ok(bytes) => {
                    match self.accept_checking_keys(&bytes, record).await {
                        Ok(()) => accepted.push((seq, bytes)),
                        Err((code, message)) => {
                            halt = Some(self.note(
                            Some(seq),
                            &format!("receipt_{code}"),
                            format!("the witness's receipt for seq {seq} was not accepted: {message}"),
                        ));
                            break;
                        }
                    }
                }
                // The first record without a receipt decides; the records
                // after it go again once it is resolved.
                Err(e) => {
                    first = Some((seq, e));
                    break;
                }
            }
        }
        // The receipts accepted before any failure, in one transaction.
        if !accepted.is_empty() {
            let batch: Vec<(u64, &[u8])> =
                accepted.iter().map(|(s, b)| (*s, b.as_slice())).collect();
            let stored = match receipts {
                Receipts::Durable => self.store.put_receipts(&batch),
                Receipts::Deferred => self.store.put_receipts_deferred(&batch),
            };
            match stored {
                Ok(new_cursor) => self.progress.send_modify(|p| {
                    p.cursor = new_cursor;
                    p.failure = None;
                }),
                Err(e) => return Step::Retry(self.note(Some(cursor), "store", e.to_string())),
            }
        }
        match (halt, first) {
            (Some(note), _) => Step::Halt(note),
            (None, None) => Step::Progress,
            (None, Some((seq, e))) => self.refused(seq, e),
        }
    }

    /// Sends `records` (in chain order) in one batch; to a witness without
    /// the batch route, one at a time, stopping at the first refusal.
    async fn post(
        &self,
        records: &[tally_schemas::Record],
    ) -> Result<Vec<Result<Vec<u8>, WitnessError>>, WitnessError> {
        use std::sync::atomic::Ordering;
        if self.batches.load(Ordering::Relaxed) {
            match self.client.post_batch(records).await {
                Err(WitnessError::Refused { status: 404, .. }) => {
                    self.batches.store(false, Ordering::Relaxed);
                }
                other => return other,
            }
        }
        let mut answers = Vec::with_capacity(records.len());
        for record in records {
            let answer = self.client.post_record(record).await;
            let refused = answer.is_err();
            answers.push(answer);
            if refused {
                break;
            }
        }
        Ok(answers)
    }

    /// What to do when the witness did not receipt the record at the cursor.
    fn refused(&self, cursor: u64, e: WitnessError) -> Step {
        match e {
            WitnessError::Refused {
                code, head: Some(head), ..
            } if code == "chain_conflict" => self.resolve_conflict(cursor, head),
            e if e.is_transient() => Step::Retry(self.note(Some(cursor), &error_code(&e), e.to_string())),
            e => Step::Halt(self.note(
                Some(cursor),
                &error_code(&e),
                format!("the witness refused seq {cursor} for good, so syncing stopped (records are never skipped): {e}"),
            )),
        }
    }

    fn resolve_conflict(&self, cursor: u64, head: Option<ChainHead>) -> Step {
        let Some(head) = head else {
            if cursor == 0 {
                return Step::Retry(self.note(
                    Some(0),
                    "chain_conflict",
                    "the witness reported a chain conflict for the genesis record but holds no records".into(),
                ));
            }
            return self.rewind(cursor, 0, "the witness holds no records for this agent");
        };
        let head_seq = head.seq.get();
        match self.store.record(head_seq) {
            Ok(Some(local)) if local.hash() == head.hash => {
                if head_seq + 1 < cursor {
                    self.rewind(cursor, head_seq + 1, &format!("the witness's head is seq {head_seq}"))
                } else {
                    Step::Retry(self.note(
                        Some(cursor),
                        "chain_conflict",
                        format!(
                            "the witness reported a chain conflict at seq {cursor} but its head (seq {}) is our record",
                            head.seq
                        ),
                    ))
                }
            }
            Ok(Some(local)) => Step::Halt(self.fork(format!(
                "FORK: the witness holds a different record at seq {} (hash {}, ours {})",
                head.seq,
                head.hash,
                local.hash()
            ))),
            Ok(None) => Step::Halt(self.fork(format!(
                "FORK: the witness's head of this chain is seq {} (hash {}), beyond our local chain",
                head.seq, head.hash
            ))),
            Err(e) => Step::Retry(self.note(Some(cursor), "store", e.to_string())),
        }
    }

    fn rewind(&self, cursor: u64, to: u64, why: &str) -> Step {
        if let Err(e) = self.store.rewind_sync_cursor(to) {
            return Step::Retry(self.note(Some(cursor), "store", e.to_string()));
        }
        let note = self.note(
            Some(to),
            "witness_behind",
            format!(
                "{why}, behind records it had receipted (up to seq {}); re-sending from seq {to}",
                cursor - 1
            ),
        );
        let _ = self.store.set_sync_error(Some(&note));
        self.progress.send_modify(|p| {
            p.cursor = to;
            p.failure = Some(note);
        });
        Step::Progress
    }

    fn fork(&self, message: String) -> SyncErrorNote {
        let note = self.note(None, "fork", message);
        let _ = self.store.set_fork(Some(&note));
        note
    }

    /// Makes the background task try again now, whatever its backoff.
    pub fn nudge(&self) {
        self.nudge.notify_one();
    }

    /// Makes the background task send now instead of lingering after a
    /// commit (a writer waits for a receipt); leaves a backoff as it is.
    pub fn hurry(&self) {
        self.hurry.notify_one();
    }

    fn record_outcome(&self, step: &Step) {
        self.progress.send_modify(|p| p.attempts += 1);
        match step {
            Step::Retry(n) => {
                let _ = self.store.set_sync_error(Some(n));
                self.progress.send_modify(|p| p.failure = Some(n.clone()));
            }
            Step::Halt(n) => {
                let _ = self.store.set_sync_error(Some(n));
                self.progress.send_modify(|p| {
                    p.failure = Some(n.clone());
                    p.halted = Some(n.clone());
                });
            }
            Step::Progress => {
                if self.progress.borrow().failure.is_none() {
                    let _ = self.store.set_sync_error(None);
                }
            }
            Step::Idle => {}
        }
    }

    /// Syncs until there is nothing left, syncing halts, or `deadline`
    /// passes. Returns the last step.
    pub async fn sync_until_idle(&self, deadline: tokio::time::Instant) -> Step {
        let mut backoff = Duration::from_millis(100);
        loop {
            let step = self.step().await;
            self.record_outcome(&step);
            match step {
                Step::Progress => backoff = Duration::from_millis(100),
                Step::Retry(n) => {
                    if tokio::time::Instant::now() + backoff >= deadline {
                        return Step::Retry(n);
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                other => return other,
            }
        }
    }

    /// Runs in the background: syncs whenever `wake` fires (a commit), retries
    /// with backoff up to 30 s, and stops when `stop` becomes true or syncing halts.
    pub async fn run(self: Arc<Self>, wake: Arc<Notify>, stop: watch::Receiver<bool>) {
        self.run_deferring(wake, stop).await;
        // What the background sync stored without syncing the file is
        // persisted when it stops (docs/operations.md "Syncing").
        if let Err(e) = self.store.persist() {
            eprintln!(
                "tally: agent {}: storing the last receipts: {e} (they are fetched again at the next sync)",
                self.agent
            );
        }
    }

    async fn run_deferring(&self, wake: Arc<Notify>, mut stop: watch::Receiver<bool>) {
        if let Ok(Some(fork)) = self.store.fork() {
            self.progress.send_modify(|p| p.halted = Some(fork.clone()));
            eprintln!(
                "tally: {} (agent {}): not syncing",
                fork.message, self.agent
            );
            return;
        }
        let mut backoff = Duration::from_millis(100);
        loop {
            if *stop.borrow() {
                return;
            }
            let step = self.step_storing(Receipts::Deferred).await;
            self.record_outcome(&step);
            let wait = match step {
                Step::Progress => {
                    backoff = Duration::from_millis(100);
                    continue;
                }
                Step::Idle => None,
                Step::Retry(_) => {
                    let w = backoff;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    Some(w)
                }
                Step::Halt(n) => {
                    eprintln!("tally: syncing agent {} stopped: {}", self.agent, n.message);
                    return;
                }
            };
            let committed = tokio::select! {
                () = wake.notified(), if wait.is_none() => true,
                () = tokio::time::sleep(wait.unwrap_or_default()), if wait.is_some() => false,
                () = self.nudge.notified() => {
                    backoff = Duration::from_millis(100);
                    false
                }
                _ = stop.changed() => return,
            };
            if committed {
                tokio::select! {
                    () = tokio::time::sleep(SYNC_LINGER) => {}
                    () = self.hurry.notified() => {}
                    () = self.nudge.notified() => {}
                    _ = stop.changed() => return,
                }
            }
        }
    }
}

/// How a step stores the receipts it accepted.
#[derive(Debug, Clone, Copy)]
enum Receipts {
    /// Committed and synced to disk before the step returns.
    Durable,
    /// Committed without a sync of the file: the next durable commit of the
    /// store, or [`ChainStore::persist`], writes them out; lost in a crash
    /// before then, they are fetched again (protocol.md §8).
    Deferred,
}

fn error_code(e: &WitnessError) -> String {
    match e {
        WitnessError::Transport(_) => "transport".into(),
        WitnessError::BadResponse(_) => "bad_response".into(),
        WitnessError::Refused { code, .. } => code.clone(),
    }
}
