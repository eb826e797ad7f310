//! The tampered-pack corpus of testdata/tampered/ (docs/protocol.md §11):
//! one valid pack and cases derived from it, each naming the check that must
//! fail. Built deterministically from `tally_testkit::fixture`, so that
//! regenerating gives the same bytes. Shared by the generator
//! (`cargo run -p tally-verifier --example gen_tampered`) and the tests.

use std::collections::BTreeMap;

use serde_json::{json, Value};
use tally_schemas::pack::{AgentKeys, Head, PackLine};
use tally_schemas::record::OutcomeStatus;
use tally_schemas::UnixMillis;
use tally_testkit::fixture::{self, decision, note, outcome, tool, tools, Fixture, PackSpec};

/// The log's origin in the corpus.
pub const ORIGIN: &str = "tally.local/log";

/// One case directory.
pub struct Case {
    /// Directory name.
    pub name: String,
    /// What was done to the pack.
    pub description: String,
    /// The check that must fail (`schema` with `expect_error` for a usage error).
    pub expect_fail: &'static str,
    /// Other checks that fail too, as a consequence (asserted exactly).
    pub also_fail: Vec<&'static str>,
    /// `Some("unsupported_version")` when verify must refuse (exit 2).
    pub expect_error: Option<&'static str>,
    /// Files of the case: `pack.jsonl`, and `agent-keys.json`/`head.json`
    /// when they differ from the valid ones.
    pub files: Vec<(&'static str, Vec<u8>)>,
}

/// The valid scenario: the fixture, the pack spec, and the head.
pub struct Base {
    pub fx: Fixture,
    pub spec: PackSpec,
    pub head: Head,
    pub pack_size: u64,
}

/// Builds the valid history: two agents, tool lists (one changes), calls,
/// a note, a key rotation; three commits; records after the pack for head.
#[must_use]
pub fn base() -> Base {
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
    Base {
        fx,
        spec,
        head,
        pack_size,
    }
}

fn bytes_of(lines: &[PackLine]) -> Vec<Vec<u8>> {
    lines
        .iter()
        .map(|l| l.to_json().expect("canonical"))
        .collect()
}

fn join(lines: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for l in lines {
        out.extend_from_slice(l);
        out.push(b'\n');
    }
    out
}

fn value(line: &[u8]) -> Value {
    serde_json::from_slice(line).expect("fixture lines are JSON")
}

fn canon(v: &Value) -> Vec<u8> {
    tally_schemas::canonical::canonicalize(v).expect("canonical")
}

/// Edits line `i` as a JSON value.
fn edit(lines: &mut [Vec<u8>], i: usize, f: impl FnOnce(&mut Value)) {
    let mut v = value(&lines[i]);
    f(&mut v);
    lines[i] = canon(&v);
}

/// Index of the record line of `agent` at `seq`.
fn find(lines: &[Vec<u8>], agent: &str, seq: u64) -> usize {
    lines
        .iter()
        .position(|l| {
            let v = value(l);
            v["type"] == "record" && v["record"]["agent"] == agent && v["record"]["seq"] == seq
        })
        .unwrap_or_else(|| panic!("no record {agent}#{seq}"))
}

/// Adds `delta` to the end line's record count.
fn bump_end(lines: &mut [Vec<u8>], records: i64, checkpoints: i64) {
    let last = lines.len() - 1;
    edit(lines, last, |v| {
        let r = v["records"].as_i64().expect("count") + records;
        let c = v["checkpoints"].as_i64().expect("count") + checkpoints;
        v["records"] = json!(r);
        v["checkpoints"] = json!(c);
    });
}

fn set_last_seq(lines: &mut [Vec<u8>], agent: &str, last: u64) {
    edit(lines, 0, |v| {
        for a in v["agents"].as_array_mut().expect("agents") {
            if a["agent"] == agent {
                a["last_seq"] = json!(last);
            }
        }
    });
}

struct Builder {
    cases: Vec<Case>,
}

impl Builder {
    fn add(
        &mut self,
        name: &str,
        expect: &'static str,
        also: &[&'static str],
        description: &str,
        pack: Vec<u8>,
    ) {
        self.add_files(name, expect, also, description, vec![("pack.jsonl", pack)]);
    }

    fn add_files(
        &mut self,
        name: &str,
        expect: &'static str,
        also: &[&'static str],
        description: &str,
        files: Vec<(&'static str, Vec<u8>)>,
    ) {
        self.cases.push(Case {
            name: name.to_owned(),
            description: description.to_owned(),
            expect_fail: expect,
            also_fail: also.to_vec(),
            expect_error: None,
            files,
        });
    }
}

/// Every file of the corpus: `valid/…` and one directory per case.
#[must_use]
#[allow(clippy::too_many_lines)]
pub fn corpus() -> (Vec<(&'static str, Vec<u8>)>, Vec<Case>) {
    let b = base();
    let valid_lines = bytes_of(&b.fx.pack_lines(&b.spec));
    let keys = b.fx.agent_keys();
    let valid = vec![
        ("pack.jsonl", join(&valid_lines)),
        ("agent-keys.json", fixture::to_json(&keys)),
        ("head.json", fixture::to_json(&b.head)),
        (
            "log.vkey",
            format!("{}\n", b.fx.log.verifier().vkey()).into_bytes(),
        ),
    ];
    let mut cb = Builder { cases: Vec::new() };
    let base_lines = || valid_lines.clone();
    let claims_last = {
        let v = value(&valid_lines[0]);
        v["agents"][0]["last_seq"].as_u64().expect("seq")
    };

    // --- schema and versions -------------------------------------------
    {
        let mut l = base_lines();
        edit(&mut l, 0, |v| v["v"] = json!(2));
        cb.cases.push(Case {
            name: "wrong-format-version".into(),
            description: "header v changed to 2: a newer pack format is a usage error (exit 2), never a guess".into(),
            expect_fail: "schema",
            also_fail: vec![],
            expect_error: Some("unsupported_version"),
            files: vec![("pack.jsonl", join(&l))],
        });
    }
    {
        let mut l = base_lines();
        l.pop();
        cb.add(
            "truncated-no-end-line",
            "schema",
            &[],
            "the end line is removed (a truncated pack)",
            join(&l),
        );
    }
    {
        let mut l = base_lines();
        bump_end(&mut l, 1, 0);
        cb.add(
            "end-count-mismatch",
            "schema",
            &[],
            "the end line counts one record more than the pack has",
            join(&l),
        );
    }
    {
        let mut l = base_lines();
        let i = find(&l, "claims-bot", 3);
        let mut t = l[i].clone();
        t.truncate(t.len() / 2);
        l[i] = t;
        cb.add(
            "record-line-not-json",
            "schema",
            &["chain"],
            "the note record claims-bot#3 is cut in half (not JSON); the chain then has a gap",
            join(&l),
        );
    }
    {
        let mut l = base_lines();
        let i = find(&l, "claims-bot", 3);
        let mut t = l[i].clone();
        let close = t.pop().expect("}");
        t.extend_from_slice(b",\"type\":\"record\"");
        t.push(close);
        l[i] = t;
        cb.add(
            "record-line-duplicate-key",
            "schema",
            &["chain"],
            "the record line of claims-bot#3 repeats its \"type\" member (duplicate keys are refused)",
            join(&l),
        );
    }
    {
        let mut l = base_lines();
        let i = find(&l, "claims-bot", 3);
        let mut t = l[i].clone();
        t.resize(t.len() + 140_000, b' ');
        l[i] = t;
        cb.add(
            "record-line-too-long",
            "schema",
            &["chain"],
            "the record line of claims-bot#3 is padded with spaces beyond 131,072 bytes",
            join(&l),
        );
    }
    {
        let mut l = base_lines();
        edit(&mut l, 0, |v| {
            let a = v["agents"].as_array_mut().expect("agents");
            a.reverse();
        });
        cb.add(
            "header-agents-unsorted",
            "schema",
            &[],
            "the header lists its agents out of name order",
            join(&l),
        );
    }
    {
        let mut l = base_lines();
        let i = find(&l, "claims-bot", 3);
        edit(&mut l, i, |v| v["record"]["v"] = json!(2));
        cb.add(
            "record-version-2",
            "schema",
            &["chain"],
            "one record inside a v1 pack claims record format v2",
            join(&l),
        );
    }

    // --- field edits -----------------------------------------------------
    {
        let mut l = base_lines();
        let i = find(&l, "claims-bot", claims_last);
        edit(&mut l, i, |v| {
            v["record"]["body"]["status"] = json!("error")
        });
        cb.add(
            "record-edit-outcome-status",
            "record_signatures",
            &["inclusion", "receipts", "record_hashes", "head"],
            "the last outcome's status is changed from ok to error without re-signing (head.json holds the original)",
            join(&l),
        );
    }
    {
        let mut l = base_lines();
        let i = find(&l, "claims-bot", 3);
        edit(&mut l, i, |v| {
            v["record"]["body"]["text"] = json!("reviewing claim 43")
        });
        cb.add(
            "record-edit-note-text",
            "record_signatures",
            &["inclusion", "receipts", "record_hashes", "chain"],
            "a note's text is edited in the middle of the chain: its signature, entry and receipt no longer match and the next record's prev breaks",
            join(&l),
        );
    }
    {
        let mut l = base_lines();
        let i = find(&l, "claims-bot", 1);
        edit(&mut l, i, |v| v["record"]["body"]["tool"] = json!("refund"));
        cb.add(
            "record-edit-decision-tool",
            "record_signatures",
            &["inclusion", "receipts", "record_hashes", "chain", "outcomes"],
            "a decision's tool name is changed: every hash that refers to it breaks and its outcome no longer names it",
            join(&l),
        );
    }
    {
        let mut l = base_lines();
        let i = find(&l, "claims-bot", 1);
        edit(&mut l, i, |v| {
            v["receipt"]["index"] = json!(v["receipt"]["index"].as_u64().expect("i") + 1)
        });
        cb.add(
            "receipt-edit-index",
            "receipts",
            &[],
            "a receipt's index is off by one",
            join(&l),
        );
    }
    {
        let mut l = base_lines();
        let i = find(&l, "claims-bot", 1);
        edit(&mut l, i, |v| {
            v["receipt"]["nonce"] = json!("00112233445566778899aabbccddeeff")
        });
        cb.add(
            "receipt-edit-nonce",
            "receipts",
            &[],
            "a receipt echoes another nonce",
            join(&l),
        );
    }
    {
        let mut l = base_lines();
        let i = find(&l, "claims-bot", 1);
        edit(&mut l, i, |v| {
            v["receipt"]["record_hash"] = json!(fixture::digest("other").to_hex())
        });
        cb.add(
            "receipt-edit-record-hash",
            "receipts",
            &["record_hashes"],
            "a receipt names another record hash",
            join(&l),
        );
    }
    {
        let mut l = base_lines();
        let i = find(&l, "claims-bot", 1);
        edit(&mut l, i, |v| v["receipt"]["tree_size"] = json!(7));
        cb.add(
            "receipt-unknown-tree-size",
            "receipts",
            &[],
            "a receipt's tree_size names no checkpoint line",
            join(&l),
        );
    }
    {
        let mut l = base_lines();
        let i = find(&l, "claims-bot", claims_last);
        let first_cp = value(&l[1]);
        let small =
            tally_schemas::note::peek_checkpoint(first_cp["checkpoint"].as_str().expect("note"))
                .expect("checkpoint")
                .size
                .get();
        edit(&mut l, i, |v| v["receipt"]["tree_size"] = json!(small));
        cb.add(
            "receipt-index-beyond-tree-size",
            "receipts",
            &[],
            "a receipt claims the first (smaller) checkpoint, which cannot contain its index",
            join(&l),
        );
    }
    {
        let mut l = base_lines();
        let i = find(&l, "claims-bot", 1);
        edit(&mut l, i, |v| v["receipt"] = Value::Null);
        cb.add(
            "receipt-missing",
            "receipts",
            &[],
            "a witnessed record has no receipt",
            join(&l),
        );
    }
    {
        let mut l = base_lines();
        let i = find(&l, "claims-bot", 1);
        edit(&mut l, i, |v| {
            let t = UnixMillis::parse_rfc3339(v["witnessed"]["received"].as_str().expect("t"))
                .expect("time");
            v["witnessed"]["received"] = json!(UnixMillis::new(t.as_millis() + 1).to_string());
        });
        cb.add(
            "witnessed-edit-received",
            "inclusion",
            &[],
            "an entry's receive time is moved by 1 ms: the rebuilt entry is no longer in the tree",
            join(&l),
        );
    }
    {
        let mut l = base_lines();
        let i = find(&l, "claims-bot", 1);
        edit(&mut l, i, |v| {
            let p = v["witnessed"]["inclusion"].as_array_mut().expect("proof");
            p.pop();
        });
        cb.add(
            "inclusion-proof-truncated",
            "inclusion",
            &[],
            "an inclusion proof loses its last hash",
            join(&l),
        );
    }
    {
        let mut l = base_lines();
        let i = find(&l, "claims-bot", 1);
        edit(&mut l, i, |v| {
            let p = v["witnessed"]["inclusion"].as_array_mut().expect("proof");
            p.push(json!(fixture::digest("pad").to_hex()));
        });
        cb.add(
            "inclusion-proof-padded",
            "inclusion",
            &[],
            "an inclusion proof gains a hash",
            join(&l),
        );
    }
    {
        let mut l = base_lines();
        let i = find(&l, "claims-bot", 1);
        edit(&mut l, i, |v| {
            let p = v["witnessed"]["inclusion"].as_array_mut().expect("proof");
            p[0] = json!(fixture::digest("flip").to_hex());
        });
        cb.add(
            "inclusion-proof-wrong-hash",
            "inclusion",
            &[],
            "an inclusion proof's first hash is replaced",
            join(&l),
        );
    }

    // --- checkpoints -----------------------------------------------------
    {
        let mut l = base_lines();
        edit(&mut l, 0, |v| {
            let note = v["checkpoint"].as_str().expect("note").to_owned();
            let cp = tally_schemas::note::peek_checkpoint(&note).expect("cp");
            let from = format!("\n{}\n", cp.size);
            let to = format!("\n{}\n", cp.size.get() + 1);
            v["checkpoint"] = json!(note.replacen(&from, &to, 1));
        });
        cb.add(
            "header-checkpoint-size-edited",
            "witness_signatures",
            &["inclusion", "log_consistency", "head"],
            "the pack checkpoint's size is raised by one without re-signing",
            join(&l),
        );
    }
    {
        let mut l = base_lines();
        edit(&mut l, 1, |v| {
            let note = v["checkpoint"].as_str().expect("note").to_owned();
            let cp = tally_schemas::note::peek_checkpoint(&note).expect("cp");
            let old = base64_of(cp.root.as_bytes());
            let new = base64_of(fixture::digest("root").as_bytes());
            v["checkpoint"] = json!(note.replacen(&old, &new, 1));
        });
        cb.add(
            "checkpoint-line-root-edited",
            "witness_signatures",
            &["log_consistency"],
            "a receipt checkpoint's root hash is replaced without re-signing",
            join(&l),
        );
    }
    {
        let mut l = base_lines();
        edit(&mut l, 1, |v| {
            let p = v["consistency"].as_array_mut().expect("proof");
            p.pop();
        });
        cb.add(
            "consistency-proof-truncated",
            "log_consistency",
            &[],
            "a checkpoint line's consistency proof loses its last hash",
            join(&l),
        );
    }
    {
        let mut l = base_lines();
        edit(&mut l, 1, |v| {
            let p = v["consistency"].as_array_mut().expect("proof");
            p.push(json!(fixture::digest("pad").to_hex()));
        });
        cb.add(
            "consistency-proof-padded",
            "log_consistency",
            &[],
            "a checkpoint line's consistency proof gains a hash",
            join(&l),
        );
    }
    {
        // The same history signed by another key under the same origin.
        let mut other = b.fx.clone();
        other.log = fixture::log_signer(ORIGIN, "impostor-log");
        let l = bytes_of(&other.pack_lines(&b.spec));
        cb.add(
            "foreign-witness-key",
            "witness_signatures",
            &[],
            "every checkpoint is signed by a key other than the pinned one (same origin)",
            join(&l),
        );
    }
    {
        let mut other = b.fx.clone();
        other.origin = "evil.example/log".into();
        other.log = fixture::log_signer("evil.example/log", "log");
        let l = bytes_of(&other.pack_lines(&b.spec));
        cb.add(
            "other-origin",
            "witness_signatures",
            &["agent_keys"],
            "the pack comes from a log with another origin (agent-keys.json names ours)",
            join(&l),
        );
    }
    {
        // A split view: a validly signed checkpoint of the pack's size over
        // a different tree, shipped as a checkpoint line.
        let mut fork = b.fx.clone();
        fork.entries.truncate(0);
        let mut forked = Fixture::new(ORIGIN, "log");
        forked.add_agent("claims-bot", "claims-bot/1");
        for _ in 0..b.pack_size {
            forked.log("claims-bot", note("a different history"));
        }
        let split_note = forked.checkpoint(b.pack_size);
        let mut l = base_lines();
        let cp_line = PackLine::Checkpoint(tally_schemas::pack::PackCheckpoint {
            checkpoint: split_note,
            consistency: Vec::new(),
        })
        .to_json()
        .expect("canonical");
        let last_cp = l
            .iter()
            .rposition(|x| value(x)["type"] == "checkpoint")
            .expect("cp");
        // Replace the pack-size checkpoint line (sizes stay unique).
        l[last_cp] = cp_line;
        drop(fork);
        cb.add(
            "two-checkpoints-same-size",
            "log_consistency",
            &[],
            "a checkpoint line of the pack's size, validly signed, has a different root than the pack checkpoint (a split view)",
            join(&l),
        );
    }
    {
        let l = base_lines();
        let mut l2 = l.clone();
        let newer = b.fx.checkpoint(*b.fx.commits.last().expect("c"));
        let line = PackLine::Checkpoint(tally_schemas::pack::PackCheckpoint {
            checkpoint: newer,
            consistency: Vec::new(),
        })
        .to_json()
        .expect("canonical");
        let last_cp = l2
            .iter()
            .rposition(|x| value(x)["type"] == "checkpoint")
            .expect("cp");
        l2.insert(last_cp + 1, line);
        bump_end(&mut l2, 0, 1);
        cb.add(
            "checkpoint-line-beyond-pack",
            "log_consistency",
            &[],
            "a checkpoint line is newer (larger) than the pack checkpoint",
            join(&l2),
        );
    }

    // --- reorder, drop, duplicate, splice -------------------------------
    {
        let mut l = base_lines();
        let i = find(&l, "claims-bot", 3);
        let j = find(&l, "mail-bot", 3);
        assert_eq!(j, i + 1, "adjacent lines");
        l.swap(i, j);
        cb.add(
            "records-reordered",
            "inclusion",
            &["timing"],
            "two adjacent records of different agents swap places: each chain is still in order, but log indexes and receive times go backwards",
            join(&l),
        );
    }
    {
        let mut l = base_lines();
        let i = find(&l, "claims-bot", 3);
        let j = find(&l, "claims-bot", 4);
        l.swap(i, j);
        cb.add(
            "records-reordered-same-agent",
            "chain",
            &["inclusion", "timing"],
            "two consecutive records of one agent swap places (their prev links still recompute)",
            join(&l),
        );
    }
    {
        let mut l = base_lines();
        let i = find(&l, "claims-bot", 3);
        l.remove(i);
        bump_end(&mut l, -1, 0);
        cb.add(
            "record-dropped",
            "chain",
            &[],
            "a note record is removed from the middle of the chain (end count adjusted)",
            join(&l),
        );
    }
    {
        let mut l = base_lines();
        let i = find(&l, "claims-bot", claims_last);
        l.remove(i);
        bump_end(&mut l, -1, 0);
        cb.add(
            "record-dropped-at-end",
            "chain",
            &[],
            "the agent's last record (an outcome, so its decision is left open within the grace window) is removed but the header still claims it",
            join(&l),
        );
    }
    {
        let mut l = base_lines();
        let i = find(&l, "claims-bot", 3);
        let dup = l[i].clone();
        l.insert(i + 1, dup);
        bump_end(&mut l, 1, 0);
        cb.add(
            "record-duplicated",
            "chain",
            &["inclusion", "receipts"],
            "a record line appears twice",
            join(&l),
        );
    }
    {
        // A record of mail-bot spliced in place of a claims-bot record.
        let mut l = base_lines();
        let i = find(&l, "claims-bot", 3);
        let j = find(&l, "mail-bot", 3);
        l[i] = l[j].clone();
        cb.add(
            "spliced-from-other-agent",
            "chain",
            &["inclusion", "receipts"],
            "claims-bot#3 is replaced by a copy of a mail-bot record",
            join(&l),
        );
    }
    {
        // The same records on another log (same origin and key, but a
        // different history before them): the last record's line, with that
        // log's index, receive time, proof and receipt, is spliced in.
        let mut other = Fixture::new(ORIGIN, "log");
        other.add_agent("billing-bot", "billing-bot/1");
        other.add_agent("claims-bot", "claims-bot/1");
        other.add_agent("mail-bot", "mail-bot/1");
        other.log("billing-bot", note("another log's first entry"));
        for e in &b.fx.entries {
            other.append(e.record.clone(), Some(e.received.as_millis()));
        }
        other.commit();
        let ol = bytes_of(&other.pack_lines(&PackSpec {
            size: Some(b.pack_size + 1),
            ..PackSpec::default()
        }));
        let mut l = base_lines();
        let i = find(&l, "claims-bot", claims_last);
        l[i] = ol[find(&ol, "claims-bot", claims_last)].clone();
        cb.add(
            "spliced-from-other-log",
            "inclusion",
            &["receipts"],
            "the last record's line is taken from another log that holds the same record at another index",
            join(&l),
        );
    }
    {
        let mut l = base_lines();
        let i = find(&l, "claims-bot", 3);
        let j = find(&l, "claims-bot", 4);
        let (si, sj) = (
            value(&l[i])["record"]["sig"].clone(),
            value(&l[j])["record"]["sig"].clone(),
        );
        edit(&mut l, i, |v| v["record"]["sig"] = sj);
        edit(&mut l, j, |v| v["record"]["sig"] = si);
        cb.add(
            "signatures-swapped",
            "record_signatures",
            &["inclusion", "receipts", "record_hashes", "chain", "outcomes"],
            "two records of one agent (a note and a decision) swap signatures; the decision's hash changes, so its outcome no longer names it",
            join(&l),
        );
    }

    // --- keys -----------------------------------------------------------
    {
        let mut k = keys.clone();
        k.agents.retain(|a| a.agent.as_str() != "mail-bot");
        cb.add_files(
            "agent-keys-missing-agent",
            "agent_keys",
            &["head"],
            "agent-keys.json has no entry for mail-bot",
            vec![
                ("pack.jsonl", join(&valid_lines)),
                ("agent-keys.json", fixture::to_json(&k)),
            ],
        );
    }
    {
        let mut k = keys.clone();
        for a in &mut k.agents {
            if a.agent.as_str() == "mail-bot" {
                a.keys.truncate(1);
            }
        }
        cb.add_files(
            "key-only-in-pack",
            "agent_keys",
            &["head"],
            "mail-bot rotated to a key that agent-keys.json does not list; the key appears only in the pack",
            vec![("pack.jsonl", join(&valid_lines)), ("agent-keys.json", fixture::to_json(&k))],
        );
    }
    {
        let mut k = keys.clone();
        for a in &mut k.agents {
            if a.agent.as_str() == "claims-bot" {
                a.keys[0].not_after = Some(UnixMillis::new(fixture::EPOCH_MS + 5_000));
            }
        }
        cb.add_files(
            "key-expired",
            "agent_keys",
            &["head"],
            "claims-bot's key is listed as retired 5 s after the epoch, before most of its records",
            vec![
                ("pack.jsonl", join(&valid_lines)),
                ("agent-keys.json", fixture::to_json(&k)),
            ],
        );
    }
    cb.cases.extend(variant_cases(&keys));

    // --- head -----------------------------------------------------------
    {
        let mut l = base_lines();
        let i = find(&l, "claims-bot", claims_last);
        l.remove(i);
        bump_end(&mut l, -1, 0);
        set_last_seq(&mut l, "claims-bot", claims_last - 1);
        cb.add(
            "cut-end-vs-head",
            "head",
            &[],
            "the last record of claims-bot is cut and the header adjusted; head.json shows it existed",
            join(&l),
        );
    }
    {
        let mut h = b.head.clone();
        h.consistency.pop();
        cb.add_files(
            "head-consistency-truncated",
            "head",
            &[],
            "head.json's consistency proof loses a hash",
            vec![
                ("pack.jsonl", join(&valid_lines)),
                ("head.json", fixture::to_json(&h)),
            ],
        );
    }
    {
        let mut other = b.fx.clone();
        other.log = fixture::log_signer(ORIGIN, "impostor-log");
        let h = other.head(b.pack_size);
        cb.add_files(
            "head-foreign-key",
            "head",
            &[],
            "head.json's checkpoint is signed by a key other than the pinned one",
            vec![
                ("pack.jsonl", join(&valid_lines)),
                ("head.json", fixture::to_json(&h)),
            ],
        );
    }
    {
        let mut h = b.head.clone();
        h.agents.retain(|a| a.record.agent.as_str() != "mail-bot");
        cb.add_files(
            "head-missing-agent",
            "head",
            &[],
            "head.json has no record for mail-bot",
            vec![
                ("pack.jsonl", join(&valid_lines)),
                ("head.json", fixture::to_json(&h)),
            ],
        );
    }
    (valid, cb.cases)
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Cases that need a different history (an agent, or the log, misbehaving
/// while signing validly), each built from scratch.
#[allow(clippy::too_many_lines)]
fn variant_cases(valid_keys: &AgentKeys) -> Vec<Case> {
    let mut out = Vec::new();
    let start = || {
        let mut fx = Fixture::new(ORIGIN, "log");
        fx.add_agent("claims-bot", "claims-bot/1");
        fx.log(
            "claims-bot",
            tools("t", vec![tool("lookup_claim", true, "v1")]),
        );
        fx
    };
    let finish = |fx: &mut Fixture| -> (Vec<u8>, Vec<u8>) {
        fx.commit();
        let size = *fx.commits.last().expect("commit");
        let spec = PackSpec {
            created: Some(fx.now),
            ..PackSpec::default()
        };
        (
            fixture::to_jsonl(&fx.pack_lines(&spec)),
            fixture::to_json(&fx.head(size)),
        )
    };
    let keys_of = |fx: &Fixture| fixture::to_json(&fx.agent_keys());
    let mut case = |name: &str,
                    expect: &'static str,
                    also: &[&'static str],
                    description: &str,
                    fx: &mut Fixture| {
        let (pack, head) = finish(fx);
        out.push(Case {
            name: name.to_owned(),
            description: description.to_owned(),
            expect_fail: expect,
            also_fail: also.to_vec(),
            expect_error: None,
            files: vec![
                ("pack.jsonl", pack),
                ("agent-keys.json", keys_of(fx)),
                ("head.json", head),
            ],
        });
    };
    let _ = valid_keys;

    {
        let mut fx = start();
        let (d, _) = fx.call("claims-bot", "1", "lookup_claim");
        let mut draft = fx.draft("claims-bot", decision("2", "lookup_claim"));
        draft.nonce = d.nonce.clone();
        let r = fx.sign(draft, None);
        fx.append(r.clone(), None);
        fx.tick(1000);
        fx.log("claims-bot", outcome("2", &r, OutcomeStatus::Ok));
        case(
            "nonce-reused",
            "receipts",
            &[],
            "a decision reuses an earlier record's nonce, and the log accepted it",
            &mut fx,
        );
    }
    {
        let mut fx = start();
        let d = fx.make("claims-bot", decision("1", "lookup_claim"));
        let t = d.time.as_millis();
        fx.append(d.clone(), Some(t + 301_000));
        fx.tick(302_000);
        fx.log("claims-bot", outcome("1", &d, OutcomeStatus::Ok));
        case(
            "time-skew",
            "timing",
            &[],
            "a decision is received 301 s after the agent's time (bound 300 s)",
            &mut fx,
        );
    }
    {
        let mut fx = start();
        let (d, _) = fx.call("claims-bot", "1", "lookup_claim");
        let _ = d;
        let r = fx.make("claims-bot", note("late"));
        fx.append(r, Some(fx.now - 10_000));
        fx.tick(1000);
        case(
            "received-goes-backwards",
            "timing",
            &[],
            "the log gives an entry a receive time before the previous entry's",
            &mut fx,
        );
    }
    {
        let mut fx = start();
        let d = fx.log("claims-bot", decision("1", "lookup_claim"));
        fx.tick(-1500);
        let o = fx.make("claims-bot", outcome("1", &d, OutcomeStatus::Ok));
        fx.append(o, Some(d.time.as_millis() + 100));
        fx.tick(10_000);
        case(
            "outcome-before-decision",
            "timing",
            &[],
            "an outcome's agent time is before its decision's",
            &mut fx,
        );
    }
    {
        let mut fx = start();
        fx.call("claims-bot", "1", "lookup_claim");
        let phantom = fixture::digest("a decision that never was");
        fx.log(
            "claims-bot",
            tally_schemas::record::Body::Outcome(tally_schemas::record::Outcome {
                call_id: "9".into(),
                decision: phantom,
                status: OutcomeStatus::Ok,
                output_hash: None,
            }),
        );
        case(
            "orphan-outcome",
            "outcomes",
            &[],
            "an outcome names a decision that is not in the chain",
            &mut fx,
        );
    }
    {
        let mut fx = start();
        fx.log("claims-bot", decision("1", "lookup_claim"));
        fx.tick(600_000);
        fx.log("claims-bot", note("moving on"));
        case(
            "decision-without-outcome",
            "outcomes",
            &[],
            "a decision has no outcome, 10 minutes before the pack was made (grace 300 s)",
            &mut fx,
        );
    }
    {
        let mut fx = start();
        let (d, _) = fx.call("claims-bot", "1", "lookup_claim");
        fx.log("claims-bot", outcome("1", &d, OutcomeStatus::Error));
        case(
            "two-outcomes-one-decision",
            "outcomes",
            &[],
            "a decision gets a second outcome",
            &mut fx,
        );
    }
    {
        let mut fx = start();
        let d = fx.log("claims-bot", decision("1", "lookup_claim"));
        let _ = d;
        fx.log(
            "claims-bot",
            tally_schemas::record::Body::Outcome(tally_schemas::record::Outcome {
                call_id: "1".into(),
                decision: fixture::digest("not the decision"),
                status: OutcomeStatus::Ok,
                output_hash: None,
            }),
        );
        case(
            "outcome-wrong-decision-hash",
            "record_hashes",
            &["outcomes"],
            "the agent signs an outcome whose decision hash is not that of the decision with its call_id",
            &mut fx,
        );
    }
    {
        let mut fx = start();
        fx.call("claims-bot", "1", "lookup_claim");
        let old = fx.agent_key("claims-bot");
        fx.rotate("claims-bot", "claims-bot/2");
        let d = fx.draft("claims-bot", note("still on the old key"));
        let r = fx.sign(d, Some(&old));
        fx.append(r, None);
        fx.tick(1000);
        case(
            "rotation-not-followed",
            "chain",
            &[],
            "after a key_rotation the agent keeps signing with the old key (both keys are trusted)",
            &mut fx,
        );
    }
    {
        let mut fx = start();
        fx.log("claims-bot", note("one"));
        let mut fork = fx.clone();
        fx.log("claims-bot", note("two"));
        fork.skip_nonces(100);
        let other = fork.make("claims-bot", note("two, forked"));
        fx.append(other, None);
        fx.tick(1000);
        case(
            "fork-two-records-one-seq",
            "chain",
            &["head"],
            "the log holds two different records with the same seq and prev (a fork); head.json shows the other branch",
            &mut fx,
        );
    }
    {
        let mut fx = start();
        fx.log("claims-bot", note("one"));
        fx.log("claims-bot", note("two"));
        fx.commit();
        let r = fx.make("claims-bot", note("three, not sent"));
        fx.pending.push(r);
        let mut ranges = BTreeMap::new();
        ranges.insert("claims-bot".to_owned(), (3, 3));
        let spec = PackSpec {
            ranges: Some(ranges),
            created: Some(fx.now),
            ..PackSpec::default()
        };
        let pack = fixture::to_jsonl(&fx.pack_lines(&spec));
        out.push(Case {
            name: "anchor-not-witnessed".into(),
            description: "a pack that starts mid-chain at a record the log has not witnessed"
                .into(),
            expect_fail: "chain",
            also_fail: vec![],
            expect_error: None,
            files: vec![
                ("pack.jsonl", pack),
                ("agent-keys.json", keys_of(&fx)),
                ("head.json", fixture::to_json(&fx.head(3))),
            ],
        });
    }
    {
        let mut fx = start();
        fx.log("claims-bot", note("one"));
        fx.commit();
        let mut ranges = BTreeMap::new();
        ranges.insert("claims-bot".to_owned(), (0, 1));
        let spec = PackSpec {
            created: Some(fx.now),
            ..PackSpec::default()
        };
        let mut lines = bytes_of(&fx.pack_lines(&spec));
        let i = find(&lines, "claims-bot", 0);
        lines.remove(i);
        bump_end(&mut lines, -1, 0);
        let _ = ranges;
        out.push(Case {
            name: "genesis-missing".into(),
            description: "the header says the chain starts at seq 0 but the genesis record is missing".into(),
            expect_fail: "chain",
            also_fail: vec![],
            expect_error: None,
            files: vec![
                ("pack.jsonl", join(&lines)),
                ("agent-keys.json", keys_of(&fx)),
                ("head.json", fixture::to_json(&fx.head(2))),
            ],
        });
    }
    {
        let mut fx = start();
        fx.log("claims-bot", note("one"));
        fx.commit();
        let spec = PackSpec {
            created: Some(fx.now),
            ..PackSpec::default()
        };
        let lines = bytes_of(&fx.pack_lines(&spec));
        let mut l = lines.clone();
        // A record spliced from another agent that the header does not list.
        let mut ofx = Fixture::new(ORIGIN, "log");
        ofx.add_agent("billing-bot", "billing-bot/1");
        ofx.log("billing-bot", note("hello"));
        ofx.commit();
        let ol = bytes_of(&ofx.pack_lines(&PackSpec::default()));
        let rec = ol[ol.len() - 2].clone();
        let at = l.len() - 1;
        l.insert(at, rec);
        bump_end(&mut l, 1, 0);
        out.push(Case {
            name: "record-of-unlisted-agent".into(),
            description: "a record of an agent the header does not list is spliced in".into(),
            expect_fail: "schema",
            also_fail: vec![],
            expect_error: None,
            files: vec![
                ("pack.jsonl", join(&l)),
                ("agent-keys.json", keys_of(&fx)),
                ("head.json", fixture::to_json(&fx.head(2))),
            ],
        });
    }
    out
}

/// The case.json of a case.
#[must_use]
pub fn case_json(c: &Case) -> Vec<u8> {
    let mut v = json!({"description": c.description, "expect_fail": c.expect_fail});
    if !c.also_fail.is_empty() {
        v["also_fail"] = json!(c.also_fail);
    }
    if let Some(e) = c.expect_error {
        v["expect_error"] = json!(e);
    }
    let mut out = serde_json::to_vec_pretty(&v).expect("json");
    out.push(b'\n');
    out
}
