//! Per-check bookkeeping for the report of docs/protocol.md §11: what failed
//! or is pending, naming at most 100 records per check and a few reasons for
//! the message, with counts that stay exact however many records fail.

use std::fmt::Write as _;

use tally_schemas::report::{CheckId, CheckResult, CheckStatus, RecordRef};

/// At most this many records are named per check (§11).
pub(crate) const MAX_NAMED_RECORDS: usize = 100;
/// At most this many reasons are spelled out in a check's message.
const MAX_REASONS: usize = 3;

/// `agent#seq@index`, the way §11 names a record.
pub(crate) fn ref_text(r: &RecordRef) -> String {
    match r.index {
        Some(i) => format!("{}#{}@{}", r.agent, r.seq, i),
        None => format!("{}#{}", r.agent, r.seq),
    }
}

#[derive(Debug, Default)]
struct Items {
    count: u64,
    records: Vec<RecordRef>,
    reasons: Vec<String>,
}

impl Items {
    fn add(&mut self, record: Option<RecordRef>, reason: String) {
        self.count += 1;
        let reason = match &record {
            Some(r) => format!("{}: {reason}", ref_text(r)),
            None => reason,
        };
        if let Some(r) = record {
            if self.records.len() < MAX_NAMED_RECORDS && !self.records.contains(&r) {
                self.records.push(r);
            }
        }
        if self.reasons.len() < MAX_REASONS {
            self.reasons.push(reason);
        }
    }

    fn message(&self, what: &str) -> String {
        let mut m = format!("{} {what}: {}", self.count, self.reasons.join("; "));
        if self.count > self.reasons.len() as u64 {
            let _ = write!(m, "; and {} more", self.count - self.reasons.len() as u64);
        }
        m
    }
}

/// The running state of one check.
#[derive(Debug)]
pub(crate) struct Tally {
    id: CheckId,
    failures: Items,
    pending: Items,
    not_checked: Option<String>,
}

impl Tally {
    pub(crate) fn new(id: CheckId) -> Self {
        Self {
            id,
            failures: Items::default(),
            pending: Items::default(),
            not_checked: None,
        }
    }

    pub(crate) fn fail(&mut self, record: Option<RecordRef>, reason: impl Into<String>) {
        self.failures.add(record, reason.into());
    }

    pub(crate) fn pending(&mut self, record: Option<RecordRef>, reason: impl Into<String>) {
        self.pending.add(record, reason.into());
    }

    pub(crate) fn not_checked(&mut self, reason: impl Into<String>) {
        self.not_checked = Some(reason.into());
    }

    pub(crate) fn failed(&self) -> bool {
        self.failures.count > 0
    }

    /// The result; `pass_message` says what a pass covered.
    pub(crate) fn finish(self, pass_message: String) -> CheckResult {
        let (status, message, records) = if self.failures.count > 0 {
            let mut message = self.failures.message("failed");
            let mut records = self.failures.records;
            for r in self.pending.records {
                if records.len() >= MAX_NAMED_RECORDS {
                    break;
                }
                if !records.contains(&r) {
                    records.push(r);
                }
            }
            if self.pending.count > 0 {
                let _ = write!(message, " (also {} pending)", self.pending.count);
            }
            (CheckStatus::Fail, message, records)
        } else if let Some(reason) = self.not_checked {
            (CheckStatus::NotChecked, reason, Vec::new())
        } else if self.pending.count > 0 {
            (
                CheckStatus::Pending,
                self.pending.message("pending"),
                self.pending.records,
            )
        } else {
            (CheckStatus::Pass, pass_message, Vec::new())
        };
        CheckResult {
            id: self.id,
            status,
            message,
            records,
        }
    }
}
