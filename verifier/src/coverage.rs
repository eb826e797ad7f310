//! Coverage, docs/protocol.md §11 after the table: per agent, which declared
//! tools are recorded, which recorded tools were never declared, and how tool
//! definitions changed between complete tool lists (§5.3). A statement, never
//! a failure. Memory per agent: the last complete list, the lists being
//! assembled, and the set of tool names decisions used.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use tally_schemas::record::{ToolEntry, ToolList};

/// Lists assembled at once per agent; an agent that starts more drops the
/// oldest unfinished one (it could never be "the last complete list" anyway
/// unless finished, and finishing it later restarts it).
const MAX_LISTS_IN_PROGRESS: usize = 8;
/// Change lines kept per agent.
const MAX_CHANGE_LINES: usize = 1000;

#[derive(Debug)]
struct Building {
    parts: u32,
    got: BTreeMap<u32, Vec<ToolEntry>>,
    started: u64,
}

/// Coverage state of one agent.
#[derive(Debug, Default)]
pub(crate) struct Coverage {
    building: HashMap<String, Building>,
    current: Option<BTreeMap<String, ToolEntry>>,
    changes: Vec<String>,
    changes_dropped: u64,
    called: BTreeSet<String>,
    counter: u64,
}

fn plural(n: usize, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

impl Coverage {
    /// A decision called `tool`.
    pub(crate) fn called(&mut self, tool: &str) {
        if !self.called.contains(tool) {
            self.called.insert(tool.to_owned());
        }
    }

    /// A `tools` record at `seq`.
    pub(crate) fn tools(&mut self, seq: u64, list: &ToolList) {
        self.counter += 1;
        let restart = self
            .building
            .get(&list.list_id)
            .is_some_and(|b| b.parts != list.parts);
        if restart {
            self.building.remove(&list.list_id);
        }
        if !self.building.contains_key(&list.list_id)
            && self.building.len() >= MAX_LISTS_IN_PROGRESS
        {
            if let Some(oldest) = self
                .building
                .iter()
                .min_by_key(|(_, b)| b.started)
                .map(|(k, _)| k.clone())
            {
                self.building.remove(&oldest);
            }
        }
        let counter = self.counter;
        let b = self
            .building
            .entry(list.list_id.clone())
            .or_insert_with(|| Building {
                parts: list.parts,
                got: BTreeMap::new(),
                started: counter,
            });
        b.got.insert(list.part, list.tools.clone());
        if b.got.len() as u32 == b.parts {
            let Some(done) = self.building.remove(&list.list_id) else {
                return;
            };
            let mut tools = BTreeMap::new();
            for entry in done.got.into_values().flatten() {
                tools.entry(entry.name.clone()).or_insert(entry);
            }
            if let Some(old) = &self.current {
                let mut lines = Vec::new();
                for (name, new) in &tools {
                    match old.get(name) {
                        None => lines.push(format!("tool {name} added at seq {seq}")),
                        Some(prev) if prev.digest != new.digest || prev.parts != new.parts => {
                            let parts = prev.parts.changed_parts(&new.parts);
                            let what = if parts.is_empty() {
                                "definition".to_owned()
                            } else {
                                parts.join(", ")
                            };
                            lines.push(format!("tool {name} changed at seq {seq}: {what}"));
                        }
                        Some(_) => {}
                    }
                }
                for name in old.keys().filter(|n| !tools.contains_key(*n)) {
                    lines.push(format!("tool {name} removed at seq {seq}"));
                }
                for line in lines {
                    if self.changes.len() < MAX_CHANGE_LINES {
                        self.changes.push(line);
                    } else {
                        self.changes_dropped += 1;
                    }
                }
            }
            self.current = Some(tools);
        }
    }

    /// The coverage lines for `agent`, without the `coverage: ` prefix.
    pub(crate) fn lines(&self, agent: &str) -> Vec<String> {
        let mut out = Vec::new();
        match &self.current {
            None => out.push(format!(
                "{agent}: no tool list was declared, so the pack cannot show which of the agent's tools are recorded"
            )),
            Some(declared) => {
                let not_recorded: Vec<&str> = declared
                    .values()
                    .filter(|t| !t.recorded)
                    .map(|t| t.name.as_str())
                    .collect();
                let undeclared: Vec<&str> = self
                    .called
                    .iter()
                    .filter(|n| !declared.contains_key(*n))
                    .map(String::as_str)
                    .collect();
                if not_recorded.is_empty() && undeclared.is_empty() {
                    let n = declared.len();
                    out.push(if n == 1 {
                        format!("{agent}: all 1 declared tool is recorded")
                    } else {
                        format!("{agent}: all {n} declared tools are recorded")
                    });
                }
                if !not_recorded.is_empty() {
                    let k = not_recorded.len();
                    let what = plural(k, "declared tool is", "declared tools are");
                    out.push(format!("{agent}: {what} not recorded: {}", not_recorded.join(", ")));
                }
                if !undeclared.is_empty() {
                    let k = undeclared.len();
                    let what = plural(k, "recorded tool is", "recorded tools are");
                    out.push(format!(
                        "{agent}: {what} not in the declared tool list: {}",
                        undeclared.join(", ")
                    ));
                }
            }
        }
        out.extend(self.changes.iter().map(|c| format!("{agent}: {c}")));
        if self.changes_dropped > 0 {
            out.push(format!(
                "{agent}: {} more tool changes not listed",
                self.changes_dropped
            ));
        }
        out
    }
}
