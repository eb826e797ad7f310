//! The scenarios most cases start from, and the tools to edit a pack line
//! by line.
//!
//! - [`Base`]: two agents (`claims-bot`, `mail-bot`) with tool lists (one of
//!   which changes), calls, a note and a key rotation, logged under three
//!   checkpoints; then, after the pack was made, more records that only
//!   head.json shows. Every check passes.
//! - [`small`]: one agent (`claims-bot`) that declared one tool; a case adds
//!   records and [`finish`]es it into a pack with its keys and head.

use serde_json::{json, Value};
use tally_schemas::pack::{AgentKeys, Head, PackLine};
use tally_schemas::record::OutcomeStatus;

use super::case::{Case, Expected, Inputs, LogKey};
use crate::fixture::{self, note, tool, tools, Fixture, PackSpec};

/// The log's origin in every case.
pub(super) const ORIGIN: &str = "tally.local/log";

/// The base pack's coverage (§11): claims-bot declared send_notification
/// as not recorded and changed lookup_claim's description in its second
/// list (completed at seq 6); mail-bot records both of its tools.
pub(super) const BASE_COVERAGE: [&str; 3] = [
    "claims-bot: 1 declared tool is not recorded: send_notification",
    "claims-bot: tool lookup_claim changed at seq 6: description",
    "mail-bot: all 2 declared tools are recorded",
];

/// Records in the base pack: claims-bot 0..=8, mail-bot 0..=5.
pub(super) const BASE_RECORDS: u64 = 15;

/// The coverage of a [`small`] scenario whose decisions all call
/// `lookup_claim`, the one tool it declared.
pub(super) const SMALL_COVERAGE: [&str; 1] = ["claims-bot: all 1 declared tool is recorded"];

/// The base scenario.
pub(super) struct Base {
    /// The whole history, including records made after the pack.
    pub fx: Fixture,
    /// What the pack covers.
    pub spec: PackSpec,
    /// head.json: the last checkpoint, from the pack's size.
    pub head: Head,
    /// The pack checkpoint's size.
    pub pack_size: u64,
    /// The valid pack's lines, canonical, without their newlines.
    pub valid: Vec<Vec<u8>>,
    /// agent-keys.json.
    pub keys: AgentKeys,
}

impl Base {
    /// Builds the base scenario: two agents, tool lists (one changes),
    /// calls, a note, a key rotation; three commits; records after the pack
    /// for head.json.
    #[must_use]
    pub(super) fn new() -> Self {
        let mut fx = Fixture::new(ORIGIN, "log");
        fx.add_agent("claims-bot", "claims-bot/1");
        fx.add_agent("mail-bot", "mail-bot/1");
        fx.log(
            "claims-bot",
            tools(
                "claims-tools-1",
                vec![
                    tool("lookup_claim", true, "v1"),
                    tool("refund", true, "v1"),
                    tool("send_notification", false, "v1"),
                ],
            ),
        );
        fx.log(
            "mail-bot",
            tools(
                "mail-tools-1",
                vec![
                    tool("read_inbox", true, "v1"),
                    tool("send_mail", true, "v1"),
                ],
            ),
        );
        fx.call("claims-bot", "1", "lookup_claim");
        fx.commit();
        fx.call("mail-bot", "1", "send_mail");
        fx.log("claims-bot", note("reviewing claim 42"));
        fx.rotate("mail-bot", "mail-bot/2");
        fx.call("claims-bot", "2", "refund");
        fx.commit();
        fx.log(
            "claims-bot",
            tools(
                "claims-tools-2",
                vec![
                    tool("lookup_claim", true, "v2"),
                    tool("refund", true, "v1"),
                    tool("send_notification", false, "v1"),
                ],
            ),
        );
        fx.call("mail-bot", "2", "read_inbox");
        fx.call("claims-bot", "3", "lookup_claim");
        fx.commit();
        let pack_size = *fx.commits.last().expect("commit");
        let spec = PackSpec {
            size: Some(pack_size),
            created: Some(fx.now),
            ..PackSpec::default()
        };
        fx.tick(60_000);
        fx.call("mail-bot", "3", "read_inbox");
        fx.log("mail-bot", note("inbox empty"));
        fx.commit();
        let head = fx.head(pack_size);
        let valid = bytes_of(&fx.pack_lines(&spec));
        let keys = fx.agent_keys();
        Self {
            fx,
            spec,
            head,
            pack_size,
            valid,
            keys,
        }
    }

    /// The valid pack's lines, to edit.
    #[must_use]
    pub(super) fn lines(&self) -> Lines {
        Lines(self.valid.clone())
    }

    /// The log key.
    #[must_use]
    pub(super) fn vkey(&self) -> String {
        self.fx.log.verifier().vkey()
    }

    /// The inputs with this pack and the base's keys, head and log key, at
    /// the default skew and grace.
    #[must_use]
    pub(super) fn inputs(&self, pack: Vec<u8>) -> Inputs {
        Inputs {
            pack,
            agent_keys: fixture::to_json(&self.keys),
            head: Some(fixture::to_json(&self.head)),
            log_key: LogKey::Vkey(self.vkey()),
            max_skew: 300,
            grace: 300,
        }
    }

    /// The base's expectation: everything passes (head when given).
    #[must_use]
    pub(super) fn passing(&self) -> Expected {
        Expected::passing(true, &BASE_COVERAGE, BASE_RECORDS)
    }
}

impl Default for Base {
    fn default() -> Self {
        Self::new()
    }
}

/// A pack's lines, canonical, without their newlines.
#[derive(Debug, Clone)]
pub(super) struct Lines(pub Vec<Vec<u8>>);

impl Lines {
    /// Edits line `i` as a JSON value (written back canonical).
    pub(super) fn edit(&mut self, i: usize, f: impl FnOnce(&mut Value)) {
        let mut v = value(&self.0[i]);
        f(&mut v);
        self.0[i] = canon(&v);
    }

    /// Line `i` as a JSON value.
    #[must_use]
    pub(super) fn value(&self, i: usize) -> Value {
        value(&self.0[i])
    }

    /// The index of the record line of `agent` at `seq`.
    ///
    /// # Panics
    /// When there is none.
    #[must_use]
    pub(super) fn find(&self, agent: &str, seq: u64) -> usize {
        self.0
            .iter()
            .position(|l| {
                serde_json::from_slice::<Value>(l).is_ok_and(|v| {
                    v["type"] == "record"
                        && v["record"]["agent"] == agent
                        && v["record"]["seq"] == seq
                })
            })
            .unwrap_or_else(|| panic!("no record {agent}#{seq}"))
    }

    /// The index of the last line of `kind` (`checkpoint`, `record`).
    ///
    /// # Panics
    /// When there is none.
    #[must_use]
    pub(super) fn last_of(&self, kind: &str) -> usize {
        self.0
            .iter()
            .rposition(|l| serde_json::from_slice::<Value>(l).is_ok_and(|v| v["type"] == kind))
            .unwrap_or_else(|| panic!("no {kind} line"))
    }

    /// Adds to the end line's counts.
    pub(super) fn bump_end(&mut self, records: i64, checkpoints: i64) {
        let last = self.0.len() - 1;
        self.edit(last, |v| {
            let r = v["records"].as_i64().expect("count") + records;
            let c = v["checkpoints"].as_i64().expect("count") + checkpoints;
            v["records"] = json!(r);
            v["checkpoints"] = json!(c);
        });
    }

    /// Sets the header's `last_seq` of `agent`.
    pub(super) fn set_last_seq(&mut self, agent: &str, last: u64) {
        self.edit(0, |v| {
            for a in v["agents"].as_array_mut().expect("agents") {
                if a["agent"] == agent {
                    a["last_seq"] = json!(last);
                }
            }
        });
    }

    /// Removes line `i`.
    pub(super) fn remove(&mut self, i: usize) -> Vec<u8> {
        self.0.remove(i)
    }

    /// The pack: every line followed by a newline.
    #[must_use]
    pub(super) fn join(&self) -> Vec<u8> {
        join(&self.0)
    }
}

/// The canonical bytes of each line.
#[must_use]
pub(super) fn bytes_of(lines: &[PackLine]) -> Vec<Vec<u8>> {
    lines
        .iter()
        .map(|l| l.to_json().expect("canonical"))
        .collect()
}

/// Lines joined, each followed by a newline.
#[must_use]
pub(super) fn join(lines: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for l in lines {
        out.extend_from_slice(l);
        out.push(b'\n');
    }
    out
}

/// A line as a JSON value.
///
/// # Panics
/// When it is not JSON (the scenarios' lines are).
#[must_use]
pub(super) fn value(line: &[u8]) -> Value {
    serde_json::from_slice(line).expect("fixture lines are JSON")
}

/// The canonical bytes of a value.
///
/// # Panics
/// For a value JCS cannot write (the scenarios' values can be).
#[must_use]
pub(super) fn canon(v: &Value) -> Vec<u8> {
    tally_schemas::canonical::canonicalize(v).expect("canonical")
}

/// A case.
#[must_use]
pub(super) fn case(
    name: &str,
    section: &'static str,
    rule: &str,
    description: &str,
    inputs: Inputs,
    expected: Expected,
) -> Case {
    Case {
        name: name.to_owned(),
        section,
        rule: rule.to_owned(),
        description: description.to_owned(),
        inputs,
        expected,
        disclosures: Vec::new(),
    }
}

/// A one-agent scenario: claims-bot declared `lookup_claim` (recorded) in
/// its first record.
#[must_use]
pub(super) fn small() -> Fixture {
    let mut fx = Fixture::new(ORIGIN, "log");
    fx.add_agent("claims-bot", "claims-bot/1");
    fx.log(
        "claims-bot",
        tools("t", vec![tool("lookup_claim", true, "v1")]),
    );
    fx
}

/// Commits the scenario and makes the inputs: the pack of everything logged
/// and pending at the last commit, `created` now; agent-keys.json of every
/// key used; head.json at that commit from the pack's size.
#[must_use]
pub(super) fn finish(fx: &mut Fixture) -> Inputs {
    fx.commit();
    let spec = PackSpec {
        created: Some(fx.now),
        ..PackSpec::default()
    };
    finish_with(fx, &spec)
}

/// As [`finish`] without committing, with a given pack spec.
#[must_use]
pub(super) fn finish_with(fx: &Fixture, spec: &PackSpec) -> Inputs {
    let size = spec
        .size
        .unwrap_or_else(|| *fx.commits.last().expect("commit"));
    Inputs {
        pack: fixture::to_jsonl(&fx.pack_lines(spec)),
        agent_keys: fixture::to_json(&fx.agent_keys()),
        head: Some(fixture::to_json(&fx.head(size))),
        log_key: LogKey::Vkey(fx.log.verifier().vkey()),
        max_skew: 300,
        grace: 300,
    }
}

/// A call of `lookup_claim` whose outcome is `ok`, logged.
pub(super) fn call(fx: &mut Fixture, call_id: &str) {
    let d = fx.log("claims-bot", fixture::decision(call_id, "lookup_claim"));
    fx.log(
        "claims-bot",
        fixture::outcome(call_id, &d, OutcomeStatus::Ok),
    );
}
