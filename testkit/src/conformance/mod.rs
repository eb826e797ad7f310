//! The conformance corpus, testdata/conformance/ (docs/protocol.md §9–§12):
//! one folder per case with the inputs of one `tally verify` run and the
//! result the protocol prescribes for them, so that any implementation of
//! the verifier can be run over it (testdata/conformance/README.md is the
//! runner contract).
//!
//! Every case names the rule it tests (a protocol.md section and a
//! sentence) and states the status of each of the twelve checks, the
//! coverage lines and the number of records verified, or that the run is a
//! usage error (exit 2). Those expectations are written here, by hand, from
//! the rule: the generator never runs a verifier. The inputs are built
//! deterministically with [`crate::fixture`], so regenerating gives the
//! checked-in bytes, which CI checks.

mod base;
mod cases_actions;
mod cases_chain;
mod cases_checkpoints;
mod cases_coverage;
mod cases_disclosure;
mod cases_head;
mod cases_keys;
mod cases_outcomes;
mod cases_pack;
mod cases_receipts;
mod cases_sources;
mod cases_tool_checks;
mod cases_trust;

use std::fmt::Write as _;

use serde_json::json;

/// The checks in the order of protocol.md §11's table.
pub const CHECKS: [&str; 12] = [
    "schema",
    "agent_keys",
    "record_signatures",
    "record_hashes",
    "chain",
    "witness_signatures",
    "inclusion",
    "receipts",
    "timing",
    "outcomes",
    "head",
    "log_consistency",
];

/// A check's status (§11).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    /// `pass`.
    Pass,
    /// `fail`.
    Fail,
    /// `pending`.
    Pending,
    /// `not_checked` (`not checked` in the text form).
    NotChecked,
}

impl Status {
    /// The status as the JSON report spells it.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Fail => "fail",
            Self::Pending => "pending",
            Self::NotChecked => "not_checked",
        }
    }
}

/// What a run over a case must give.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expected {
    /// A report: each check's status in table order, the coverage lines
    /// (without the `coverage: ` prefix) and the records verified.
    Report {
        /// Statuses, in the order of [`CHECKS`].
        checks: [Status; 12],
        /// Coverage lines.
        coverage: Vec<String>,
        /// Records that passed check 1's per-record rules.
        records: u64,
    },
    /// A usage error: exit 2 and no report.
    UsageError,
}

impl Expected {
    /// Every check passes; `head` is `pass` when head.json is given, else
    /// `not_checked`.
    #[must_use]
    pub fn passing(head: bool, coverage: &[&str], records: u64) -> Self {
        let mut checks = [Status::Pass; 12];
        if !head {
            checks[10] = Status::NotChecked;
        }
        Self::Report {
            checks,
            coverage: coverage.iter().map(|s| (*s).to_owned()).collect(),
            records,
        }
    }

    /// These checks `fail`.
    #[must_use]
    pub fn fail(self, ids: &[&str]) -> Self {
        self.set(ids, Status::Fail)
    }

    /// These checks are `pending`.
    #[must_use]
    pub fn pending(self, ids: &[&str]) -> Self {
        self.set(ids, Status::Pending)
    }

    /// These checks are `not_checked`.
    #[must_use]
    pub fn not_checked(self, ids: &[&str]) -> Self {
        self.set(ids, Status::NotChecked)
    }

    /// The records verified are `n`.
    #[must_use]
    pub fn records(mut self, n: u64) -> Self {
        if let Self::Report { records, .. } = &mut self {
            *records = n;
        }
        self
    }

    /// The coverage lines are these.
    #[must_use]
    pub fn coverage(mut self, lines: &[&str]) -> Self {
        if let Self::Report { coverage, .. } = &mut self {
            *coverage = lines.iter().map(|s| (*s).to_owned()).collect();
        }
        self
    }

    fn set(mut self, ids: &[&str], status: Status) -> Self {
        if let Self::Report { checks, .. } = &mut self {
            for id in ids {
                let i = CHECKS
                    .iter()
                    .position(|c| c == id)
                    .unwrap_or_else(|| panic!("no check {id}"));
                checks[i] = status;
            }
        }
        self
    }

    /// The exit code: 0 pass, 1 fail, 2 usage error.
    #[must_use]
    pub fn exit(&self) -> u8 {
        match self {
            Self::Report { checks, .. } => u8::from(checks.contains(&Status::Fail)),
            Self::UsageError => 2,
        }
    }
}

/// How the log key is pinned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogKey {
    /// `--witness-key log.vkey`, the file holding the vkey.
    Vkey(String),
    /// `--trust trust.txt`, the file holding a trust file (§11.1).
    Trust(Vec<u8>),
}

/// The inputs of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inputs {
    /// pack.jsonl.
    pub pack: Vec<u8>,
    /// agent-keys.json.
    pub agent_keys: Vec<u8>,
    /// head.json, passed with `--head` when present.
    pub head: Option<Vec<u8>>,
    /// The pinned log key.
    pub log_key: LogKey,
    /// `--max-skew` in seconds.
    pub max_skew: u64,
    /// `--grace` in seconds.
    pub grace: u64,
}

/// One case of the corpus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Case {
    /// Folder name.
    pub name: String,
    /// The protocol.md section of the rule tested, e.g. `§11 check 4`.
    pub section: &'static str,
    /// The rule, in a sentence.
    pub rule: String,
    /// What this case does to exercise it.
    pub description: String,
    /// The inputs.
    pub inputs: Inputs,
    /// The result the rule prescribes.
    pub expected: Expected,
    /// Disclosure files given with `--disclosure` (§6.3), in order, with
    /// the status each must get; empty for most cases.
    pub disclosures: Vec<DisclosureCase>,
}

/// A disclosure file of a case and the status it must get (§6.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DisclosureCase {
    /// Its file name in the case folder.
    pub file: String,
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// `match`, `mismatch` or `not_in_pack`.
    pub status: &'static str,
}

/// A file name for [`Case::files`], whose other names are static (the
/// generator runs once; the few names it leaks are its disclosure files).
fn leak(name: &str) -> &'static str {
    Box::leak(name.to_owned().into_boxed_str())
}

impl Case {
    /// The exit code: that of the checks, and 1 when a disclosure must not
    /// match (§6.3).
    #[must_use]
    pub fn exit(&self) -> u8 {
        match self.expected.exit() {
            0 if self.disclosures.iter().any(|d| d.status != "match") => 1,
            e => e,
        }
    }

    /// The files of the case folder, in the order they are listed.
    #[must_use]
    pub fn files(&self) -> Vec<(&'static str, Vec<u8>)> {
        let i = &self.inputs;
        let mut out = vec![
            ("pack.jsonl", i.pack.clone()),
            ("agent-keys.json", i.agent_keys.clone()),
        ];
        if let Some(h) = &i.head {
            out.push(("head.json", h.clone()));
        }
        match &i.log_key {
            LogKey::Vkey(v) => out.push(("log.vkey", format!("{v}\n").into_bytes())),
            LogKey::Trust(t) => out.push(("trust.txt", t.clone())),
        }
        for d in &self.disclosures {
            out.push((leak(&d.file), d.bytes.clone()));
        }
        out.push(("options.json", self.options_json()));
        out.push(("expected.json", self.expected_json()));
        out
    }

    fn options_json(&self) -> Vec<u8> {
        let i = &self.inputs;
        let (witness_key, trust) = match &i.log_key {
            LogKey::Vkey(_) => (json!("log.vkey"), json!(null)),
            LogKey::Trust(_) => (json!(null), json!("trust.txt")),
        };
        let head = if i.head.is_some() {
            json!("head.json")
        } else {
            json!(null)
        };
        let mut out = String::from("{\n");
        let _ = writeln!(out, "  \"pack\": \"pack.jsonl\",");
        let _ = writeln!(out, "  \"agent_keys\": \"agent-keys.json\",");
        let _ = writeln!(out, "  \"witness_key\": {witness_key},");
        let _ = writeln!(out, "  \"trust\": {trust},");
        let _ = writeln!(out, "  \"head\": {head},");
        if !self.disclosures.is_empty() {
            let names: Vec<String> = self
                .disclosures
                .iter()
                .map(|d| serde_json::to_string(&d.file).expect("a string"))
                .collect();
            let _ = writeln!(out, "  \"disclosures\": [{}],", names.join(", "));
        }
        let _ = writeln!(out, "  \"max_skew\": {},", i.max_skew);
        let _ = writeln!(out, "  \"grace\": {}", i.grace);
        out.push_str("}\n");
        out.into_bytes()
    }

    fn expected_json(&self) -> Vec<u8> {
        let s = |t: &str| serde_json::to_string(t).expect("a string");
        let mut out = String::from("{\n");
        let _ = writeln!(out, "  \"section\": {},", s(self.section));
        let _ = writeln!(out, "  \"rule\": {},", s(&self.rule));
        let _ = writeln!(out, "  \"description\": {},", s(&self.description));
        let _ = write!(out, "  \"exit\": {}", self.exit());
        match &self.expected {
            Expected::UsageError => out.push('\n'),
            Expected::Report {
                checks,
                coverage,
                records,
            } => {
                let result = if self.exit() == 0 { "PASS" } else { "FAIL" };
                let _ = write!(out, ",\n  \"result\": \"{result}\",\n  \"checks\": [\n");
                for (i, (id, st)) in CHECKS.iter().zip(checks).enumerate() {
                    let comma = if i + 1 < CHECKS.len() { "," } else { "" };
                    let _ = writeln!(
                        out,
                        "    {{\"id\": \"{id}\", \"status\": \"{}\"}}{comma}",
                        st.as_str()
                    );
                }
                out.push_str("  ],\n  \"coverage\": [");
                for (i, line) in coverage.iter().enumerate() {
                    out.push_str(if i == 0 { "\n    " } else { ",\n    " });
                    out.push_str(&s(line));
                }
                out.push_str(if coverage.is_empty() {
                    "],\n"
                } else {
                    "\n  ],\n"
                });
                if self.disclosures.is_empty() {
                    let _ = writeln!(out, "  \"records\": {records}");
                } else {
                    let _ = writeln!(out, "  \"records\": {records},");
                    out.push_str("  \"disclosures\": [\n");
                    for (i, d) in self.disclosures.iter().enumerate() {
                        let comma = if i + 1 < self.disclosures.len() {
                            ","
                        } else {
                            ""
                        };
                        let _ = writeln!(
                            out,
                            "    {{\"file\": {}, \"status\": \"{}\"}}{comma}",
                            s(&d.file),
                            d.status
                        );
                    }
                    out.push_str("  ]\n");
                }
            }
        }
        out.push_str("}\n");
        out.into_bytes()
    }
}

/// Every case, in name order; names are unique.
///
/// # Panics
/// If two cases share a name (a generator bug).
#[must_use]
pub fn corpus() -> Vec<Case> {
    let b = base::Base::new();
    let mut cases = Vec::new();
    cases.extend(cases_pack::cases(&b));
    cases.extend(cases_keys::cases(&b));
    cases.extend(cases_chain::cases(&b));
    cases.extend(cases_checkpoints::cases(&b));
    cases.extend(cases_receipts::cases(&b));
    cases.extend(cases_outcomes::cases());
    cases.extend(cases_head::cases(&b));
    cases.extend(cases_coverage::cases());
    cases.extend(cases_disclosure::cases());
    cases.extend(cases_sources::cases(&b));
    cases.extend(cases_actions::cases());
    cases.extend(cases_tool_checks::cases());
    cases.push(golden_pack_case());
    cases.extend(cases_trust::cases(&b));
    cases.sort_by(|a, b| a.name.cmp(&b.name));
    for w in cases.windows(2) {
        assert_ne!(w[0].name, w[1].name, "two cases named {}", w[0].name);
    }
    cases
}

/// The golden pack (testkit/src/golden/): the same chain as the golden
/// record vectors, under one checkpoint, with its pretty-printed
/// agent-keys.json and head.json.
fn golden_pack_case() -> Case {
    let g = crate::golden::golden_pack();
    base::case(
        "golden-pack",
        "§9, §11",
        "The golden pack, made from the golden record vectors (testdata/golden/records), passes every check: a key rotation whose two keys' validity ranges meet, an outcome of every status the chain uses, receipts issued under two checkpoints; pretty-printed agent-keys.json and head.json read as well as canonical ones.",
        "the pack of the golden vectors' claims-bot chain (8 records), with head.json at the pack's own checkpoint",
        Inputs {
            pack: g.pack,
            agent_keys: crate::golden::pretty(&g.keys),
            head: Some(crate::golden::pretty(&g.head)),
            log_key: LogKey::Vkey(g.vkey),
            max_skew: 300,
            grace: 300,
        },
        Expected::passing(
            true,
            &["claims-bot: 1 declared tool is not recorded: send_notification"],
            8,
        ),
    )
}

/// Writes the corpus to `dir` (testdata/conformance): every case folder and
/// INDEX.md, after removing every folder that is there (README.md, which is
/// written by hand, stays).
///
/// # Errors
/// An I/O error.
pub fn write_corpus(dir: &std::path::Path) -> std::io::Result<usize> {
    std::fs::create_dir_all(dir)?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(entry.path())?;
        }
    }
    let cases = corpus();
    for c in &cases {
        let d = dir.join(&c.name);
        std::fs::create_dir_all(&d)?;
        for (name, bytes) in c.files() {
            std::fs::write(d.join(name), bytes)?;
        }
    }
    std::fs::write(dir.join("INDEX.md"), index(&cases))?;
    Ok(cases.len())
}

/// INDEX.md: one row per case (name, section, exit, the checks that do not
/// pass), then the corpus size by check and status.
#[must_use]
pub fn index(cases: &[Case]) -> Vec<u8> {
    let mut out = String::from(
        "# Conformance corpus index\n\nGenerated by `cargo run -p tally-testkit --example conformance`; do not edit.\nSee README.md for how to run it.\n\n",
    );
    let _ = writeln!(out, "{} cases.\n", cases.len());
    out.push_str("## Cases by check and status\n\n| check | pass | fail | pending | not checked |\n|---|---|---|---|---|\n");
    let usage = cases
        .iter()
        .filter(|c| c.expected == Expected::UsageError)
        .count();
    for (i, id) in CHECKS.iter().enumerate() {
        let mut n = [0usize; 4];
        for c in cases {
            if let Expected::Report { checks, .. } = &c.expected {
                n[checks[i] as usize] += 1;
            }
        }
        let _ = writeln!(out, "| {id} | {} | {} | {} | {} |", n[0], n[1], n[2], n[3]);
    }
    let _ = writeln!(
        out,
        "\nExit codes: {} cases exit 0, {} exit 1, {usage} exit 2 (usage errors, no report).\n",
        cases.iter().filter(|c| c.exit() == 0).count(),
        cases.iter().filter(|c| c.exit() == 1).count(),
    );
    out.push_str(
        "## Cases\n\n| case | section | exit | checks that do not pass |\n|---|---|---|---|\n",
    );
    for c in cases {
        let others = match &c.expected {
            Expected::UsageError => "(usage error)".to_owned(),
            Expected::Report { checks, .. } => {
                let v: Vec<String> = CHECKS
                    .iter()
                    .zip(checks)
                    .filter(|(_, s)| **s != Status::Pass)
                    .map(|(id, s)| format!("{id} {}", s.as_str()))
                    .collect();
                v.join(", ")
            }
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {others} |",
            c.name,
            c.section,
            c.exit()
        );
    }
    out.into_bytes()
}
