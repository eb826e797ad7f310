//! Check 2, `agent_keys` (docs/protocol.md §9.3 and §11): every record's
//! `key_id` is a key agent-keys.json lists for its agent, active at the
//! record's `time` (`not_before ≤ time < not_after`); agent-keys.json is for
//! the pack's origin. The lookup itself runs on the worker threads
//! ([`crate::pool::lookup_key`]); this judges what it found.

use tally_schemas::report::{CheckId, CheckResult};

use super::{plural, Facts};
use crate::pool::KeyStatus;
use crate::tally::Tally;

pub(crate) struct AgentKeys {
    tally: Tally,
    records: u64,
}

impl AgentKeys {
    /// `keys_origin` is agent-keys.json's origin, `pack_origin` the header's.
    pub(crate) fn new(keys_origin: &str, pack_origin: &str) -> Self {
        let mut tally = Tally::new(CheckId::AgentKeys);
        if keys_origin != pack_origin {
            tally.fail(
                None,
                format!(
                    "agent-keys.json is for origin {keys_origin:?}, the pack's is {pack_origin:?}"
                ),
            );
        }
        Self { tally, records: 0 }
    }

    pub(crate) fn record(&mut self, f: &Facts<'_>) {
        self.records += 1;
        let rec = f.record();
        match f.work.key {
            KeyStatus::Active => {}
            KeyStatus::UnknownAgent => self.tally.fail(
                f.named(),
                format!(
                    "agent-keys.json has no keys for agent {}; get them from the operator (`tally keys export`) and pass them with --agent-keys",
                    rec.agent
                ),
            ),
            KeyStatus::UnknownKey => self.tally.fail(
                f.named(),
                format!("key {} is not listed for {} in agent-keys.json", rec.key_id, rec.agent),
            ),
            KeyStatus::Inactive => self.tally.fail(
                f.named(),
                format!("key {} was not active at the record's time {}", rec.key_id, rec.time),
            ),
        }
    }

    pub(crate) fn finish(self) -> CheckResult {
        self.tally.finish(format!(
            "{} signed by keys listed in agent-keys.json and active at the record's time",
            plural(self.records, "record", "records")
        ))
    }
}
