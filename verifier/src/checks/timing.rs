//! Check 9, `timing` (docs/protocol.md §11): for every witnessed record
//! `|received − time| ≤ S` (milliseconds; equality passes); `received`
//! never decreases in log order, which is pack order (§9.1): each witnessed
//! record's `received` is at least every `received` before it; every
//! outcome's `time` and `received` are not before those of the decision it
//! answers (check 10's [`Answer`]).

use tally_schemas::report::{CheckId, CheckResult};
use tally_schemas::time::UnixMillis;

use super::outcomes::Answer;
use super::Facts;
use crate::tally::Tally;

pub(crate) struct Timing {
    tally: Tally,
    max_skew_ms: u64,
    last_received: Option<UnixMillis>,
}

impl Timing {
    pub(crate) fn new(max_skew_ms: u64) -> Self {
        Self {
            tally: Tally::new(CheckId::Timing),
            max_skew_ms,
            last_received: None,
        }
    }

    pub(crate) fn record(&mut self, f: &Facts<'_>) {
        let Some(w) = f.witnessed() else { return };
        let rec = f.record();
        let skew = w.received.abs_diff(rec.time);
        if skew > self.max_skew_ms {
            self.tally.fail(
                f.named(),
                format!(
                    "received {} is {skew} ms from the agent's time {} (bound {} ms)",
                    w.received, rec.time, self.max_skew_ms
                ),
            );
        }
        if let Some(last) = self.last_received {
            if w.received < last {
                self.tally.fail(
                    f.named(),
                    format!(
                        "received {} is before the previous entry's {last}",
                        w.received
                    ),
                );
            }
        }
        self.last_received = Some(self.last_received.map_or(w.received, |l| l.max(w.received)));
    }

    /// An outcome against the decision it answers.
    pub(crate) fn outcome(&mut self, f: &Facts<'_>, answer: &Answer) {
        let Some((time, received)) = answer.answered else {
            return;
        };
        let rec = f.record();
        if rec.time < time {
            self.tally.fail(
                f.named(),
                format!("outcome time {} is before its decision's {time}", rec.time),
            );
        }
        if let (Some(r), Some(dr)) = (f.witnessed().map(|w| w.received), received) {
            if r < dr {
                self.tally.fail(
                    f.named(),
                    format!("outcome received {r} is before its decision's {dr}"),
                );
            }
        }
    }

    pub(crate) fn finish(self) -> CheckResult {
        self.tally.finish(format!(
            "witness times within {} ms of agent times and never decreasing; outcomes follow their decisions",
            self.max_skew_ms
        ))
    }
}
