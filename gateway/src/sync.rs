//! Syncing the local chain to the witness (issue 6 §1, docs/protocol.md §8).
//!
//! Records go to the witness one at a time, in seq order, starting at the
//! sync cursor (the lowest seq without an accepted receipt). A record is
//! never skipped or reordered: when the witness refuses one for good, syncing
//! halts and says why. Each receipt is accepted with
//! [`crate::acceptance::accept_receipt`] before it is stored and the cursor
//! moves. Transient failures retry with exponential backoff.
//!
//! On `chain_conflict` the witness returns its head of the chain:
//! - a head that is one of our records, behind the cursor: the witness lost
//!   records it had receipted; the cursor rewinds and they are sent again
//!   (the old receipts are kept as evidence);
//! - a head we do not have, or a different record at that seq: a fork.
//!   Syncing stops and `tally status` reports it until resolved by hand.

use std::sync::Arc;
use std::time::Duration;

use tally_schemas::time::Clock;
use tokio::sync::{watch, Notify};

use crate::acceptance::{accept_receipt, parse_receipt, WitnessTrust};
use crate::store::{ChainStore, SyncErrorNote};
use crate::witness::{WitnessClient, WitnessError, WitnessHead};

/// What a sync task has achieved, watched by `--strict` calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncProgress {
    /// Every record below this seq has an accepted receipt.
    pub cursor: u64,
    /// The last failure, cleared by the next success.
    pub failure: Option<SyncErrorNote>,
    /// Set when syncing stopped for good (fork, refused record, bad receipt).
    pub halted: Option<SyncErrorNote>,
}

/// Everything a sync task needs.
pub struct Syncer {
    store: Arc<ChainStore>,
    agent: String,
    client: WitnessClient,
    trust: WitnessTrust,
    clock: Arc<dyn Clock>,
    max_skew_ms: u64,
    progress: watch::Sender<SyncProgress>,
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
            trust,
            clock,
            max_skew_ms,
            progress,
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

    /// Sends the record at the cursor, if any, and handles the answer.
    pub async fn step(&self) -> Step {
        let cursor = match self.store.sync_cursor() {
            Ok(c) => c,
            Err(e) => return Step::Retry(self.note(None, "store", e.to_string())),
        };
        let record = match self.store.record(cursor) {
            Ok(Some(r)) => r,
            Ok(None) => return Step::Idle,
            Err(e) => return Step::Retry(self.note(Some(cursor), "store", e.to_string())),
        };
        match self.client.post_record(&record).await {
            Ok(bytes) => {
                let accepted = parse_receipt(&bytes).and_then(|receipt| {
                    accept_receipt(&receipt, &record, &self.trust, self.clock.now(), self.max_skew_ms)
                });
                match accepted {
                    Ok(_) => match self.store.put_receipt(cursor, &bytes) {
                        Ok(new_cursor) => {
                            self.progress.send_modify(|p| {
                                p.cursor = new_cursor;
                                p.failure = None;
                            });
                            Step::Progress
                        }
                        Err(e) => Step::Retry(self.note(Some(cursor), "store", e.to_string())),
                    },
                    Err(rejection) => Step::Halt(self.note(
                        Some(cursor),
                        &format!("receipt_{}", rejection.code()),
                        format!("the witness's receipt for seq {cursor} was not accepted: {rejection}"),
                    )),
                }
            }
            Err(WitnessError::Refused {
                code, head: Some(head), ..
            }) if code == "chain_conflict" => self.resolve_conflict(cursor, head),
            Err(e) if e.is_transient() => Step::Retry(self.note(Some(cursor), &error_code(&e), e.to_string())),
            Err(e) => Step::Halt(self.note(
                Some(cursor),
                &error_code(&e),
                format!("the witness refused seq {cursor} for good, so syncing stopped (records are never skipped): {e}"),
            )),
        }
    }

    fn resolve_conflict(&self, cursor: u64, head: Option<WitnessHead>) -> Step {
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
        match self.store.record(head.seq) {
            Ok(Some(local)) if local.hash() == head.hash => {
                if head.seq + 1 < cursor {
                    self.rewind(cursor, head.seq + 1, &format!("the witness's head is seq {}", head.seq))
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

    fn record_outcome(&self, step: &Step) {
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
    pub async fn run(self: Arc<Self>, wake: Arc<Notify>, mut stop: watch::Receiver<bool>) {
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
            let step = self.step().await;
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
            tokio::select! {
                () = wake.notified(), if wait.is_none() => {}
                () = tokio::time::sleep(wait.unwrap_or_default()), if wait.is_some() => {}
                _ = stop.changed() => return,
            }
        }
    }
}

fn error_code(e: &WitnessError) -> String {
    match e {
        WitnessError::Transport(_) => "transport".into(),
        WitnessError::BadResponse(_) => "bad_response".into(),
        WitnessError::Refused { code, .. } => code.clone(),
    }
}

/// Waits until the record at `seq` has an accepted receipt. Resolves to an
/// error saying why not when syncing halts, or when `timeout` passes.
///
/// # Errors
/// A message for the JSON-RPC error of a refused `--strict` call.
pub async fn wait_for_receipt(
    mut progress: watch::Receiver<SyncProgress>,
    seq: u64,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        {
            let p = progress.borrow_and_update();
            if p.cursor > seq {
                return Ok(());
            }
            if let Some(h) = &p.halted {
                return Err(format!("no valid receipt: {}", h.message));
            }
        }
        match tokio::time::timeout_at(deadline, progress.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err("missing receipt: syncing stopped".into()),
            Err(_) => {
                let last = progress
                    .borrow()
                    .failure
                    .as_ref()
                    .map(|f| format!(" (last sync error: {})", f.message))
                    .unwrap_or_default();
                return Err(format!(
                    "missing receipt: none within {} ms{last}",
                    timeout.as_millis()
                ));
            }
        }
    }
}
