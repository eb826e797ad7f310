//! What a conformance case is: its inputs, the result the protocol
//! prescribes for them, and how both are written out.

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
