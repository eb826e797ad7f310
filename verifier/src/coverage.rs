//! Coverage, docs/protocol.md §11 after the table: per agent, which declared
//! tools are recorded, which recorded tools were never declared, how tool
//! definitions changed between complete tool lists, and which named tool
//! sources are live (§5.3). A statement, never a failure. Memory per agent:
//! the latest complete list of the unnamed source and of at most
//! `MAX_SOURCES_PER_AGENT` named sources, the lists being assembled, and the
//! set of tool names decisions used.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use tally_schemas::limits::MAX_SOURCES_PER_AGENT;
use tally_schemas::record::{ToolEntry, ToolList};
use tally_schemas::UnixMillis;

/// Lists assembled at once per agent; an agent that starts more drops the
/// oldest unfinished one (it could never be "the last complete list" anyway
/// unless finished, and finishing it later restarts it).
const MAX_LISTS_IN_PROGRESS: usize = 8;
/// Change lines kept per agent.
const MAX_CHANGE_LINES: usize = 1000;

#[derive(Debug)]
struct Building {
    parts: u32,
    source: Option<String>,
    lease_ms: Option<u64>,
    got: BTreeMap<u32, Vec<ToolEntry>>,
    started: u64,
}

/// A source's latest complete list (§5.3).
#[derive(Debug)]
struct Declared {
    tools: BTreeMap<String, ToolEntry>,
    /// The `time` of the record that completed it.
    time: UnixMillis,
    /// The seq of that record.
    seq: u64,
    /// Its place among the agent's `tools` records in pack order: of two
    /// lists naming one tool, the later one's entry is taken.
    order: u64,
    /// The lease, for a named source.
    lease_ms: u64,
}

impl Declared {
    /// Whether a named source's list still holds at `at`: `at` is at most
    /// its completing time plus its lease.
    fn live_at(&self, at: UnixMillis) -> bool {
        let lease = i64::try_from(self.lease_ms).unwrap_or(i64::MAX);
        at.as_millis() <= self.time.as_millis().saturating_add(lease)
    }
}

/// Coverage state of one agent.
#[derive(Debug, Default)]
pub(crate) struct Coverage {
    building: HashMap<String, Building>,
    /// The unnamed source's latest list; it never expires.
    unnamed: Option<Declared>,
    /// Each named source's latest list, by source name.
    named: BTreeMap<String, Declared>,
    changes: Vec<String>,
    changes_dropped: u64,
    /// Tools of decisions that were not in a live named source's list at
    /// the decision's own point.
    called: BTreeSet<String>,
    counter: u64,
    /// The `time` of the agent's record read last.
    now: Option<UnixMillis>,
}

fn plural(n: usize, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

/// The change lines of `new` against `old`, the same source's previous list
/// (§11).
fn change_lines(
    old: &BTreeMap<String, ToolEntry>,
    new: &BTreeMap<String, ToolEntry>,
    seq: u64,
) -> Vec<String> {
    let mut lines = Vec::new();
    for (name, entry) in new {
        match old.get(name) {
            None => lines.push(format!("tool {name} added at seq {seq}")),
            Some(prev) if prev.digest != entry.digest || prev.parts != entry.parts => {
                let parts = prev.parts.changed_parts(&entry.parts);
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
    for name in old.keys().filter(|n| !new.contains_key(*n)) {
        lines.push(format!("tool {name} removed at seq {seq}"));
    }
    lines
}

impl Coverage {
    /// A record of the agent made at `time` is read; every record passes
    /// here before its body is looked at.
    pub(crate) fn record(&mut self, time: UnixMillis) {
        self.now = Some(time);
    }

    /// A decision called `tool` (at the time of the record last given to
    /// [`Coverage::record`]).
    pub(crate) fn called(&mut self, tool: &str) {
        if self.called.contains(tool) {
            return;
        }
        // A tool of a named source live now was declared when it was
        // called, even if its source drops out later (§11).
        let declared_now = self.now.is_some_and(|now| {
            self.named
                .values()
                .any(|d| d.live_at(now) && d.tools.contains_key(tool))
        });
        if !declared_now {
            self.called.insert(tool.to_owned());
        }
    }

    /// A `tools` record at `seq` (made at the time last given to
    /// [`Coverage::record`]).
    pub(crate) fn tools(&mut self, seq: u64, list: &ToolList) {
        self.counter += 1;
        let restart = self.building.get(&list.list_id).is_some_and(|b| {
            b.parts != list.parts || b.source != list.source || b.lease_ms != list.lease_ms
        });
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
                source: list.source.clone(),
                lease_ms: list.lease_ms,
                got: BTreeMap::new(),
                started: counter,
            });
        b.got.insert(list.part, list.tools.clone());
        if b.got.len() as u32 != b.parts {
            return;
        }
        let Some(done) = self.building.remove(&list.list_id) else {
            return;
        };
        let mut tools = BTreeMap::new();
        for entry in done.got.into_values().flatten() {
            tools.entry(entry.name.clone()).or_insert(entry);
        }
        let declared = Declared {
            tools,
            time: self.now.unwrap_or(UnixMillis::new(0)),
            seq,
            order: counter,
            lease_ms: list.lease().unwrap_or(0),
        };
        let previous = match done.source {
            None => self.unnamed.as_ref(),
            Some(ref s) => self.named.get(s),
        };
        if let Some(old) = previous {
            for line in change_lines(&old.tools, &declared.tools, seq) {
                if self.changes.len() < MAX_CHANGE_LINES {
                    self.changes.push(line);
                } else {
                    self.changes_dropped += 1;
                }
            }
        }
        match done.source {
            None => self.unnamed = Some(declared),
            Some(source) => {
                if !self.named.contains_key(&source) && self.named.len() >= MAX_SOURCES_PER_AGENT {
                    // Forget the source whose latest list completed earliest.
                    if let Some(oldest) = self
                        .named
                        .iter()
                        .min_by_key(|(_, d)| d.order)
                        .map(|(k, _)| k.clone())
                    {
                        self.named.remove(&oldest);
                    }
                }
                self.named.insert(source, declared);
            }
        }
    }

    /// The declared tools at the agent's last record: the unnamed list and
    /// every live named list, the later list's entry for a name two share.
    fn declared(&self) -> BTreeMap<&str, &ToolEntry> {
        let mut lists: Vec<&Declared> = self.unnamed.iter().collect();
        if let Some(now) = self.now {
            lists.extend(self.named.values().filter(|d| d.live_at(now)));
        }
        lists.sort_by_key(|d| d.order);
        let mut union = BTreeMap::new();
        for d in lists {
            for (name, entry) in &d.tools {
                union.insert(name.as_str(), entry);
            }
        }
        union
    }

    /// The coverage lines for `agent`, without the `coverage: ` prefix.
    pub(crate) fn lines(&self, agent: &str) -> Vec<String> {
        let mut out = Vec::new();
        if self.unnamed.is_none() && self.named.is_empty() {
            out.push(format!(
                "{agent}: no tool list was declared, so the pack cannot show which of the agent's tools are recorded"
            ));
        } else {
            let declared = self.declared();
            let not_recorded: Vec<&str> = declared
                .values()
                .filter(|t| !t.recorded)
                .map(|t| t.name.as_str())
                .collect();
            let undeclared: Vec<&str> = self
                .called
                .iter()
                .filter(|n| !declared.contains_key(n.as_str()))
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
                out.push(format!(
                    "{agent}: {what} not recorded: {}",
                    not_recorded.join(", ")
                ));
            }
            if !undeclared.is_empty() {
                let k = undeclared.len();
                let what = plural(k, "recorded tool is", "recorded tools are");
                out.push(format!(
                    "{agent}: {what} not in the declared tool list: {}",
                    undeclared.join(", ")
                ));
            }
            for (source, d) in &self.named {
                let live = self.now.is_some_and(|now| d.live_at(now));
                out.push(if live {
                    format!(
                        "{agent}: tool source {source}: {}, declared at seq {}",
                        plural(d.tools.len(), "tool", "tools"),
                        d.seq
                    )
                } else {
                    format!(
                        "{agent}: tool source {source} dropped out: declared at seq {}, its lease of {} ms ended before the agent's last record",
                        d.seq, d.lease_ms
                    )
                });
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

#[cfg(test)]
mod tests {
    use super::*;
    use tally_schemas::record::ToolPartDigests;
    use tally_schemas::Hash;

    const HOUR: i64 = 3_600_000;

    fn entry(name: &str, recorded: bool, version: &str) -> ToolEntry {
        ToolEntry {
            name: name.into(),
            recorded,
            digest: Hash::sha256(format!("{name}{version}").as_bytes()),
            parts: ToolPartDigests {
                description: Some(Hash::sha256(version.as_bytes())),
                ..ToolPartDigests::default()
            },
        }
    }

    fn list(
        list_id: &str,
        source: Option<&str>,
        lease_ms: Option<u64>,
        tools: &[(&str, bool)],
    ) -> ToolList {
        ToolList {
            list_id: list_id.into(),
            part: 0,
            parts: 1,
            tools: tools.iter().map(|(n, r)| entry(n, *r, "1")).collect(),
            source: source.map(String::from),
            lease_ms,
        }
    }

    /// An agent's records, fed as verify.rs feeds them: seq from 0.
    struct Agent {
        c: Coverage,
        seq: u64,
    }

    impl Agent {
        fn new() -> Self {
            Self {
                c: Coverage::default(),
                seq: 0,
            }
        }
        fn tools(&mut self, at: i64, l: &ToolList) -> &mut Self {
            self.c.record(UnixMillis::new(at));
            self.c.tools(self.seq, l);
            self.seq += 1;
            self
        }
        fn call(&mut self, at: i64, tool: &str) -> &mut Self {
            self.c.record(UnixMillis::new(at));
            self.c.called(tool);
            self.seq += 1;
            self
        }
        fn note(&mut self, at: i64) -> &mut Self {
            self.c.record(UnixMillis::new(at));
            self.seq += 1;
            self
        }
        fn lines(&self) -> Vec<String> {
            self.c.lines("a")
        }
    }

    #[test]
    fn without_a_named_source_the_lines_are_those_of_before() {
        let mut a = Agent::new();
        assert_eq!(
            a.call(0, "x").lines(),
            ["a: no tool list was declared, so the pack cannot show which of the agent's tools are recorded"]
        );
        a.tools(1, &list("l1", None, None, &[("x", true), ("y", false)]))
            .call(100 * HOUR, "z")
            .tools(
                200 * HOUR,
                &list("l2", None, None, &[("x", true), ("w", true)]),
            );
        // The unnamed list never expires, and adds no source line.
        assert_eq!(
            a.note(10_000 * HOUR).lines(),
            [
                "a: 1 recorded tool is not in the declared tool list: z",
                "a: tool w added at seq 3",
                "a: tool y removed at seq 3",
            ]
        );
    }

    #[test]
    fn the_declared_tools_are_the_union_of_the_live_sources() {
        let mut a = Agent::new();
        a.tools(0, &list("l1", Some("git"), None, &[("git.log", true)]))
            .tools(
                1,
                &list(
                    "l2",
                    Some("docs"),
                    Some(HOUR as u64),
                    &[("docs.search", false)],
                ),
            )
            .tools(2, &list("l3", None, None, &[("local", true)]))
            .call(3, "git.log");
        assert_eq!(
            a.lines(),
            [
                "a: 1 declared tool is not recorded: docs.search",
                "a: tool source docs: 1 tool, declared at seq 1",
                "a: tool source git: 1 tool, declared at seq 0",
            ]
        );
    }

    #[test]
    fn a_source_past_its_lease_drops_out_and_its_earlier_calls_stay_declared() {
        let mut a = Agent::new();
        let lease = 1_000;
        a.tools(
            0,
            &list("l1", Some("docs"), Some(lease), &[("search", false)]),
        )
        .tools(0, &list("l2", Some("git"), None, &[("log", true)]))
        // At the lease's last millisecond the source is still live.
        .call(1_000, "search")
        .call(1_001, "fetch");
        assert_eq!(
            a.lines(),
            [
                "a: 1 recorded tool is not in the declared tool list: fetch",
                "a: tool source docs dropped out: declared at seq 0, its lease of 1000 ms ended before the agent's last record",
                "a: tool source git: 1 tool, declared at seq 1",
            ]
        );
        // A call after the drop-out counts in U.
        a.call(2_000, "search");
        assert_eq!(
            a.lines()[0],
            "a: 2 recorded tools are not in the declared tool list: fetch, search"
        );
        // With every named source gone, D is empty but the summary stays.
        let mut b = Agent::new();
        b.tools(0, &list("l1", Some("s"), Some(lease), &[("t", true)]))
            .call(1, "t")
            .note(5_000);
        assert_eq!(
            b.lines(),
            [
                "a: all 0 declared tools are recorded",
                "a: tool source s dropped out: declared at seq 0, its lease of 1000 ms ended before the agent's last record",
            ]
        );
    }

    #[test]
    fn a_source_without_lease_ms_holds_for_24_hours() {
        let mut a = Agent::new();
        a.tools(0, &list("l1", Some("s"), None, &[("t", true)]))
            .note(24 * HOUR);
        assert_eq!(
            a.lines(),
            [
                "a: all 1 declared tool is recorded",
                "a: tool source s: 1 tool, declared at seq 0",
            ]
        );
        a.note(24 * HOUR + 1);
        assert_eq!(
            a.lines(),
            [
                "a: all 0 declared tools are recorded",
                "a: tool source s dropped out: declared at seq 0, its lease of 86400000 ms ended before the agent's last record",
            ]
        );
    }

    #[test]
    fn a_redeclaration_renews_the_lease() {
        let mut a = Agent::new();
        let l = |id: &str| list(id, Some("s"), Some(1_000), &[("t", true), ("u", true)]);
        a.tools(0, &l("l1")).tools(900, &l("l2")).note(1_500);
        assert_eq!(
            a.lines(),
            [
                "a: all 2 declared tools are recorded",
                "a: tool source s: 2 tools, declared at seq 1",
            ]
        );
        // A lapsed source that declares again is live again.
        a.note(5_000).tools(6_000, &l("l3"));
        assert_eq!(a.lines()[1], "a: tool source s: 2 tools, declared at seq 4");
    }

    #[test]
    fn of_two_lists_naming_one_tool_the_later_one_is_taken() {
        let mut a = Agent::new();
        a.tools(0, &list("l1", Some("one"), None, &[("search", true)]))
            .tools(1, &list("l2", Some("two"), None, &[("search", false)]));
        assert_eq!(a.lines()[0], "a: 1 declared tool is not recorded: search");
        // The first source declares again: its entry is now the later one.
        a.tools(2, &list("l3", Some("one"), None, &[("search", true)]));
        assert_eq!(a.lines()[0], "a: all 1 declared tool is recorded");
        // The unnamed list's entry is taken when it completed last.
        a.tools(3, &list("l4", None, None, &[("search", false)]));
        assert_eq!(a.lines()[0], "a: 1 declared tool is not recorded: search");
    }

    #[test]
    fn change_lines_compare_lists_of_one_source() {
        let mut a = Agent::new();
        a.tools(0, &list("l1", Some("one"), None, &[("x", true)]))
            .tools(1, &list("l2", Some("two"), None, &[("y", true)]))
            .tools(2, &list("l3", None, None, &[("z", true)]));
        // Three first lists: nothing to compare with.
        assert_eq!(a.lines().len(), 3);
        let mut changed = list("l4", Some("one"), None, &[("x", true), ("w", true)]);
        changed.tools[0] = entry("x", true, "2");
        a.tools(3, &changed)
            .tools(4, &list("l5", Some("two"), None, &[]));
        assert_eq!(
            a.lines(),
            [
                "a: all 3 declared tools are recorded",
                "a: tool source one: 2 tools, declared at seq 3",
                "a: tool source two: 0 tools, declared at seq 4",
                "a: tool w added at seq 3",
                "a: tool x changed at seq 3: description",
                "a: tool y removed at seq 4",
            ]
        );
    }

    #[test]
    fn a_part_of_another_source_or_lease_restarts_its_list() {
        let part = |p: u32, source: Option<&str>, lease: Option<u64>, tool: &str| ToolList {
            list_id: "l".into(),
            part: p,
            parts: 2,
            tools: vec![entry(tool, true, "1")],
            source: source.map(String::from),
            lease_ms: lease,
        };
        let mut a = Agent::new();
        a.tools(0, &part(0, Some("s"), None, "x"))
            .tools(1, &part(1, Some("r"), None, "y"));
        assert!(a.lines()[0].contains("no tool list was declared"));
        a.tools(2, &part(0, Some("r"), Some(2_000), "z"));
        assert!(a.lines()[0].contains("no tool list was declared"));
        a.tools(3, &part(1, Some("r"), Some(2_000), "w"));
        assert_eq!(
            a.lines(),
            [
                "a: all 2 declared tools are recorded",
                "a: tool source r: 2 tools, declared at seq 3",
            ]
        );
        // Without a source the part starts the list again as well.
        let mut b = Agent::new();
        b.tools(0, &part(0, Some("s"), None, "x"))
            .tools(1, &part(1, None, None, "y"));
        assert!(b.lines()[0].contains("no tool list was declared"));
    }

    #[test]
    fn at_most_64_named_sources_are_kept_the_earliest_forgotten() {
        let mut a = Agent::new();
        for i in 0..=MAX_SOURCES_PER_AGENT {
            let name = format!("s{i:02}");
            a.tools(
                0,
                &list(&format!("l{i}"), Some(&name), None, &[(&name, true)]),
            );
        }
        let lines = a.lines();
        assert_eq!(a.c.named.len(), MAX_SOURCES_PER_AGENT);
        assert_eq!(lines[0], "a: all 64 declared tools are recorded");
        assert_eq!(lines[1], "a: tool source s01: 1 tool, declared at seq 1");
        assert_eq!(lines.len(), 1 + MAX_SOURCES_PER_AGENT);
        // A calling of the forgotten source's tool counts in U.
        a.call(1, "s00");
        assert_eq!(
            a.lines()[0],
            "a: 1 recorded tool is not in the declared tool list: s00"
        );
        // A source that declares again is not a new one: nothing forgotten.
        a.tools(2, &list("again", Some("s01"), None, &[("s01", true)]));
        assert_eq!(a.c.named.len(), MAX_SOURCES_PER_AGENT);
        assert!(a.c.named.contains_key("s02"));
    }
}
