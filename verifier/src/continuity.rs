//! Tool-interface continuity, docs/protocol.md §11 after the table: per
//! agent, the `tool_check` records (§5.7) in the pack, the tools they
//! paused, and the calls made to a tool while its latest check found its
//! definition other than the approved one. A statement, never a failure.
//! Memory per agent: the latest check's findings per source, and the
//! paused names (at most `MAX_NAMES` listed).

use std::collections::{BTreeMap, BTreeSet};

use tally_schemas::record::{CheckEffect, ToolCheck};

/// Paused tool names listed per agent.
const MAX_NAMES: usize = 100;

/// Continuity state of one agent.
#[derive(Debug, Default)]
pub(crate) struct Continuity {
    checks: u64,
    /// Checks whose effect was `deny` or `pause_session`.
    stopped: u64,
    /// Tools any check paused, with the observations that paused them.
    paused: BTreeMap<String, BTreeSet<&'static str>>,
    /// Per source (`None`: the unnamed one), the tools the latest check
    /// found not as approved, with whether an exception let them proceed.
    current: BTreeMap<Option<String>, BTreeMap<String, bool>>,
    /// Decisions for a tool found not as approved, without an exception.
    unapproved_calls: u64,
    /// Decisions for a tool under an approved exception.
    excepted_calls: u64,
}

impl Continuity {
    /// A `tool_check` record.
    pub(crate) fn check(&mut self, c: &ToolCheck) {
        self.checks += 1;
        if c.effect >= CheckEffect::PauseSession {
            self.stopped += 1;
        }
        let mut differing = BTreeMap::new();
        for f in &c.findings {
            let Some(tool) = &f.tool else { continue };
            if f.effect == CheckEffect::PauseTool
                && (self.paused.len() < MAX_NAMES || self.paused.contains_key(tool))
            {
                self.paused
                    .entry(tool.clone())
                    .or_default()
                    .insert(f.observation.as_str());
            }
            if f.observation != tally_schemas::record::CheckObservation::ToolRemoved {
                let excepted = f.effect == CheckEffect::Exception;
                let e = differing.entry(tool.clone()).or_insert(excepted);
                *e = *e && excepted;
            }
        }
        self.current.insert(c.source.clone(), differing);
    }

    /// A `decision` record for `tool`.
    pub(crate) fn called(&mut self, tool: &str) {
        if self.checks == 0 {
            return;
        }
        for found in self.current.values() {
            match found.get(tool) {
                Some(true) => return self.excepted_calls += 1,
                Some(false) => return self.unapproved_calls += 1,
                None => {}
            }
        }
    }

    /// The statement lines for `agent` (none when the pack holds no check).
    pub(crate) fn lines(&self, agent: &str) -> Vec<String> {
        if self.checks == 0 {
            return Vec::new();
        }
        let mut out = vec![format!(
            "{agent}: tool checks: {} run, {} paused or stopped the session; {} to a tool not as approved, {} under an approved exception",
            self.checks,
            self.stopped,
            plural(self.unapproved_calls, "call", "calls"),
            plural(self.excepted_calls, "call", "calls"),
        )];
        if !self.paused.is_empty() {
            let names: Vec<String> = self
                .paused
                .iter()
                .map(|(t, why)| {
                    format!(
                        "{t} ({})",
                        why.iter().copied().collect::<Vec<_>>().join(", ")
                    )
                })
                .collect();
            out.push(format!(
                "{agent}: tool checks paused {}: {}",
                plural(self.paused.len() as u64, "tool", "tools"),
                names.join(", ")
            ));
        }
        out
    }
}

fn plural(n: u64, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}
