//! Cases of the pack's form, protocol.md §9.1 and check 1 (`schema`), the
//! first line, and the pack's version (§12).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{json, Value};
use tally_schemas::limits::{MAX_AGENTS_PER_PACK, MAX_RECORDS_PER_PACK, MAX_WIRE_OBJECT_BYTES};

use super::base::{bytes_of, case, finish, small, value, Base, Lines, BASE_COVERAGE, BASE_RECORDS};
use super::case::{Case, Expected, Status};
use crate::fixture::{self, note, PackSpec};

/// The base coverage with mail-bot's line first (header order).
const MAIL_FIRST: [&str; 3] = [BASE_COVERAGE[2], BASE_COVERAGE[0], BASE_COVERAGE[1]];

/// Only check 1 fails; the rest are not checked (no valid header).
fn headerless() -> Expected {
    Expected::Report {
        checks: [Status::NotChecked; 12],
        coverage: Vec::new(),
        records: 0,
    }
    .fail(&["schema"])
}

#[allow(clippy::too_many_lines)]
pub(super) fn cases(b: &Base) -> Vec<Case> {
    let mut out = Vec::new();
    let mut add = |name: &str, section, rule: &str, description: &str, pack: Vec<u8>, e| {
        out.push(case(name, section, rule, description, b.inputs(pack), e));
    };

    add(
        "valid",
        "§11",
        "A pack that keeps every rule passes all twelve checks; coverage states, per header agent, which tools are recorded and how definitions changed.",
        "the base pack: two agents, tool lists (claims-bot's changes once), calls, a note and a key rotation under three checkpoints, with head.json",
        b.lines().join(),
        b.passing(),
    );
    {
        let mut i = b.inputs(b.lines().join());
        i.head = None;
        out.push(case(
            "valid-without-head",
            "§11 check 11",
            "Without --head, check 11 is not checked and the pack still passes.",
            "the base pack without head.json",
            i,
            Expected::passing(false, &BASE_COVERAGE, BASE_RECORDS),
        ));
    }
    let mut add = |name: &str, section, rule: &str, description: &str, pack: Vec<u8>, e| {
        out.push(case(name, section, rule, description, b.inputs(pack), e));
    };

    // --- the first line and versions ------------------------------------
    for (name, v) in [("pack-version-2", json!(2)), ("pack-version-0", json!(0))] {
        let mut l = b.lines();
        l.edit(0, |h| h["v"] = v.clone());
        add(
            name,
            "§12",
            "A pack header whose v is an integer other than 1, higher or lower, is an unsupported version: a usage error (exit 2), never a guess.",
            &format!("the header's v is {v}"),
            l.join(),
            Expected::UsageError,
        );
    }
    {
        let mut l = b.lines();
        l.edit(0, |h| {
            h.as_object_mut().expect("object").remove("v");
        });
        add(
            "pack-version-missing",
            "§12",
            "A header without v is malformed, not of another version: check 1 fails and every other check is not checked.",
            "the header has no v member",
            l.join(),
            headerless(),
        );
    }
    {
        let mut l = b.lines();
        l.edit(0, |h| h["v"] = json!("1"));
        add(
            "pack-version-string",
            "§12",
            "A v that is not an integer literal (\"1\") makes the header malformed: check 1 fails and every other check is not checked.",
            "the header's v is the string \"1\"",
            l.join(),
            headerless(),
        );
    }
    {
        let mut l = b.lines();
        l.edit(0, |h| {
            h.as_object_mut().expect("object").remove("created");
        });
        add(
            "header-missing-member",
            "§9.1",
            "A first line that is JSON under §2 but not a valid header (a missing member) fails check 1, and every other check is not checked.",
            "the header has no created member",
            l.join(),
            headerless(),
        );
    }
    {
        let mut l = b.lines();
        l.remove(0);
        add(
            "first-line-not-a-header",
            "§9.1",
            "A first line that is JSON but another line type fails check 1, and every other check is not checked.",
            "the header line is removed, so the pack starts with a checkpoint line",
            l.join(),
            headerless(),
        );
    }
    {
        let mut l = b.lines();
        l.0[0].truncate(40);
        add(
            "first-line-not-json",
            "§9.1",
            "A first line that is not JSON is a usage error (exit 2), with no report.",
            "the header line is cut after 40 bytes",
            l.join(),
            Expected::UsageError,
        );
    }
    {
        let mut l = b.lines();
        let close = l.0[0].pop().expect("}");
        l.0[0].extend_from_slice(b",\"type\":\"header\"");
        l.0[0].push(close);
        add(
            "first-line-duplicate-member",
            "§9.1",
            "A first line that breaks a rule of §2 (a duplicate member) is a usage error (exit 2), with no report.",
            "the header line repeats its type member",
            l.join(),
            Expected::UsageError,
        );
    }
    // §2 refuses a number whose canonical form would be an integer literal
    // beyond 2^53 − 1 as it refuses that literal: on the first line, a
    // usage error, in a known member or in one the header does not have.
    for (name, member, lit, where_) in [
        (
            "first-line-exponent-integer-beyond-2-53",
            "x",
            "1e20",
            "an unknown member x",
        ),
        (
            "first-line-negative-exponent-integer-beyond-2-53",
            "x",
            "-1e20",
            "an unknown member x",
        ),
        (
            "first-line-fraction-integer-beyond-2-53",
            "v",
            "9007199254740992.0",
            "its version member v",
        ),
    ] {
        let mut l = b.lines();
        if member == "v" {
            let text = String::from_utf8(l.0[0].clone()).expect("utf-8");
            assert!(text.ends_with("\"v\":1}"), "{text}");
            l.0[0] = format!("{}{lit}}}", &text[..text.len() - 2]).into_bytes();
        } else {
            let close = l.0[0].pop().expect("}");
            l.0[0].extend_from_slice(format!(",\"{member}\":{lit}").as_bytes());
            l.0[0].push(close);
        }
        add(
            name,
            "§2, §9.1",
            "A number whose canonical form would be an integer literal beyond 2^53 − 1 breaks a rule of §2 as that literal does: on the first line it is a usage error (exit 2), with no report, whichever member holds it.",
            &format!("the header line's {where_} is {lit}"),
            l.join(),
            Expected::UsageError,
        );
    }
    add(
        "empty-file",
        "§9.1",
        "An empty file is not a pack: a usage error (exit 2).",
        "pack.jsonl is empty",
        Vec::new(),
        Expected::UsageError,
    );
    {
        let mut l = b.lines();
        let pad = tally_schemas::limits::MAX_PACK_HEADER_BYTES + 1 - l.0[0].len();
        l.0[0].extend(std::iter::repeat_n(b' ', pad));
        add(
            "first-line-over-its-limit",
            "§9.1, §10",
            "A header line over MAX_PACK_HEADER_BYTES (1,048,576 bytes without its newline) is a usage error (exit 2).",
            "the header line is padded with spaces to 1,048,577 bytes",
            l.join(),
            Expected::UsageError,
        );
    }

    // --- line order, counts, the end line --------------------------------
    {
        let mut l = b.lines();
        l.0.pop();
        add(
            "truncated-no-end-line",
            "§9.1",
            "A pack without an end line is truncated and fails check 1.",
            "the end line is removed",
            l.join(),
            b.passing().fail(&["schema"]),
        );
    }
    {
        let mut l = b.lines();
        l.bump_end(1, 0);
        add(
            "end-count-mismatch",
            "§9.1",
            "The end line's counts must equal the checkpoint and record lines that parsed; otherwise check 1 fails.",
            "the end line counts one record more than the pack has",
            l.join(),
            b.passing().fail(&["schema"]),
        );
    }
    {
        let mut l = b.lines();
        let end = l.0.last().expect("end").clone();
        l.0.push(end);
        add(
            "end-line-twice",
            "§9.1",
            "A second end line fails check 1 (the first one's counts are the ones compared).",
            "the end line appears twice",
            l.join(),
            b.passing().fail(&["schema"]),
        );
    }
    {
        let mut l = b.lines();
        let n = l.0.len();
        l.0.swap(n - 1, n - 2);
        add(
            "record-line-after-the-end-line",
            "§9.1",
            "A line after the end line fails check 1; a line that parses is still checked as its type.",
            "the end line and the last record line swap places; the record is otherwise in order",
            l.join(),
            b.passing().fail(&["schema"]),
        );
    }
    {
        let mut pack = b.lines().join();
        pack.pop();
        add(
            "last-line-without-newline",
            "§9.1",
            "Every line ends in LF: a last line without one fails check 1 (and is still read).",
            "the final newline is removed",
            pack,
            b.passing().fail(&["schema"]),
        );
    }
    {
        let mut l = b.lines();
        let i = l.find("claims-bot", 3);
        l.0.insert(i, Vec::new());
        add(
            "empty-line",
            "§9.1",
            "An empty line fails check 1.",
            "an empty line stands before claims-bot#3",
            l.join(),
            b.passing().fail(&["schema"]),
        );
    }
    {
        let mut l = b.lines();
        let header = l.0[0].clone();
        let i = l.find("claims-bot", 3);
        l.0.insert(i, header);
        add(
            "second-header-line",
            "§9.1",
            "A second header line fails check 1.",
            "a copy of the header stands before claims-bot#3",
            l.join(),
            b.passing().fail(&["schema"]),
        );
    }
    {
        let mut l = b.lines();
        let cp = l.last_of("checkpoint");
        let line = l.remove(cp);
        // After the first record line; that record's receipt names the
        // first checkpoint line, which is still before it.
        l.0.insert(cp + 1, line);
        add(
            "checkpoint-line-after-a-record-line",
            "§9.1",
            "Checkpoint lines come before record lines: one after a record line fails check 1, and is still checked as a checkpoint line.",
            "the last checkpoint line (the pack's size) moves after the first record line",
            l.join(),
            b.passing().fail(&["schema"]),
        );
    }
    {
        let mut l = b.lines();
        l.0.swap(1, 2);
        add(
            "checkpoint-sizes-not-increasing",
            "§9.1",
            "Checkpoint lines are in strictly increasing tree size; otherwise check 1 fails.",
            "the first two checkpoint lines swap places",
            l.join(),
            b.passing().fail(&["schema"]),
        );
    }
    {
        let mut l = b.lines();
        let i = l.find("claims-bot", 3);
        l.0.insert(i, br#"{"text":"a comment","type":"comment"}"#.to_vec());
        add(
            "unknown-line-type",
            "§9.1",
            "A line whose type is not header, checkpoint, record or end fails check 1.",
            "a line of type \"comment\" stands before claims-bot#3",
            l.join(),
            b.passing().fail(&["schema"]),
        );
    }

    // --- record lines that do not parse ----------------------------------
    let claims3_gone = || {
        b.passing()
            .fail(&["schema", "chain"])
            .records(BASE_RECORDS - 1)
    };
    {
        let mut l = b.lines();
        let i = l.find("claims-bot", 3);
        let half = l.0[i].len() / 2;
        l.0[i].truncate(half);
        add(
            "record-line-not-json",
            "§9.1",
            "A line that is not JSON fails check 1 and is then ignored: here the chain has a gap where it stood.",
            "the note record claims-bot#3 is cut in half",
            l.join(),
            claims3_gone(),
        );
    }
    {
        let mut l = b.lines();
        let i = l.find("claims-bot", 3);
        let close = l.0[i].pop().expect("}");
        l.0[i].extend_from_slice(b",\"type\":\"record\"");
        l.0[i].push(close);
        add(
            "record-line-duplicate-member",
            "§2, §9.1",
            "A line with a duplicate member breaks §2: it fails check 1 and is ignored.",
            "the record line of claims-bot#3 repeats its type member",
            l.join(),
            claims3_gone(),
        );
    }
    {
        let mut l = b.lines();
        let i = l.find("claims-bot", 3);
        l.0[i].resize(MAX_WIRE_OBJECT_BYTES + 1, b' ');
        add(
            "record-line-over-its-limit",
            "§9.1, §10",
            "A line other than the header over MAX_WIRE_OBJECT_BYTES (131,072 bytes without its newline) fails check 1 and is skipped unread.",
            "the record line of claims-bot#3 is padded with spaces to 131,073 bytes",
            l.join(),
            claims3_gone(),
        );
    }
    {
        let mut l = b.lines();
        let i = l.find("claims-bot", 3);
        l.0[i].resize(MAX_WIRE_OBJECT_BYTES, b' ');
        add(
            "record-line-at-its-limit",
            "§9.1, §10",
            "A line of exactly MAX_WIRE_OBJECT_BYTES (131,072 bytes) is within the limit, and white space between tokens is free.",
            "the record line of claims-bot#3 is padded with spaces to 131,072 bytes",
            l.join(),
            b.passing(),
        );
    }
    {
        let mut l = b.lines();
        let i = l.find("claims-bot", 8);
        l.edit(i, |v| v["extra"] = json!(1));
        add(
            "record-line-unknown-member",
            "§2, §9.1",
            "A record line with a member §9.1 does not list fails check 1 and is ignored.",
            "the last record line of claims-bot (seq 8, an outcome) gains a member \"extra\"; its decision is then open, within the grace window",
            l.join(),
            b.passing()
                .fail(&["schema", "chain"])
                .pending(&["outcomes"])
                .records(BASE_RECORDS - 1),
        );
    }
    {
        let mut l = b.lines();
        let i = l.find("claims-bot", 8);
        let text = String::from_utf8(l.0[i].clone()).expect("utf-8");
        let index = l.value(i)["witnessed"]["index"].as_u64().expect("index");
        l.0[i] = text
            .replacen(
                &format!("\"index\":{index},\"received\""),
                "\"index\":9007199254740992,\"received\"",
                1,
            )
            .into_bytes();
        add(
            "record-line-integer-beyond-2-53",
            "§2, §9.1",
            "An integer literal beyond 2^53 − 1 breaks §2: the line fails check 1 and is ignored.",
            "the witnessed index of claims-bot#8 is written 9007199254740992",
            l.join(),
            b.passing()
                .fail(&["schema", "chain"])
                .pending(&["outcomes"])
                .records(BASE_RECORDS - 1),
        );
    }
    {
        let mut l = b.lines();
        let i = l.find("claims-bot", 3);
        l.edit(i, |v| v["record"]["v"] = json!(2));
        add(
            "record-version-2",
            "§12, §11 check 1",
            "A record of a newer version inside a version-1 pack fails check 1 (the pack is still read).",
            "claims-bot#3 claims record format v2",
            l.join(),
            claims3_gone(),
        );
    }
    {
        let mut l = b.lines();
        let i = l.find("claims-bot", 0);
        let text = String::from_utf8(l.0[i].clone()).expect("utf-8");
        assert!(
            l.value(i)["witnessed"]["index"] == 0,
            "claims-bot#0 is entry 0"
        );
        let text = text
            .replace("\"seq\":0,", "\"seq\":-0,")
            .replace("\"index\":0,", "\"index\":-0,");
        assert_eq!(text.matches("-0,").count(), 3);
        l.0[i] = text.into_bytes();
        add(
            "minus-zero-is-zero",
            "§2",
            "The integer literal -0 is the integer 0 wherever it stands; its canonical form is 0, so hashes and signatures are those of 0.",
            "claims-bot#0's seq and its witnessed and receipt index (all 0) are written -0",
            l.join(),
            b.passing(),
        );
    }
    {
        let mut l = b.lines();
        let i = l.find("claims-bot", 0);
        let text = String::from_utf8(l.0[i].clone()).expect("utf-8");
        l.0[i] = text.replacen("\"seq\":0,", "\"seq\":-0.0,", 1).into_bytes();
        add(
            "minus-zero-point-zero-is-not-an-integer",
            "§2, §3",
            "-0.0 is not an integer literal: where an integer is expected it is refused, like 0.0; the record fails check 1.",
            "claims-bot#0's seq is written -0.0; without its genesis record claims-bot's chain has a gap, and its first tool list is gone",
            l.join(),
            b.passing()
                .fail(&["schema", "chain"])
                .records(BASE_RECORDS - 1)
                .coverage(&[
                    "claims-bot: 1 declared tool is not recorded: send_notification",
                    BASE_COVERAGE[2],
                ]),
        );
    }
    add(
        "non-canonical-spelling",
        "§9.1",
        "A verifier accepts every line that is JSON under §2, canonical or not: white space (space, tab, CR before LF), member order and escape spelling are free.",
        "every line is rewritten with spaces and tabs between tokens, members in reverse order, letters of strings as \\u escapes and CRLF line ends",
        respell(&b.valid),
        b.passing(),
    );

    // --- the header --------------------------------------------------------
    {
        let mut l = b.lines();
        l.edit(0, |v| {
            v["agents"].as_array_mut().expect("agents").reverse();
        });
        add(
            "header-agents-unsorted",
            "§9.1, §11 check 1",
            "Header agents are sorted by name (byte order); otherwise check 1 fails. The header is still used in its order: coverage lines follow it.",
            "the header lists mail-bot before claims-bot",
            l.join(),
            b.passing().fail(&["schema"]).coverage(&MAIL_FIRST),
        );
    }
    {
        let mut l = b.lines();
        l.edit(0, |v| {
            let agents = v["agents"].as_array_mut().expect("agents");
            let mut again = agents[0].clone();
            again["last_seq"] = json!(20);
            agents.insert(1, again);
        });
        add(
            "header-agent-listed-twice",
            "§9.1, §11 check 1",
            "An agent listed twice in the header fails check 1; its first listing counts and later ones are ignored (their ranges are neither claimed nor checked).",
            "claims-bot is listed again after itself with the range 0..=20, which its chain does not reach",
            l.join(),
            b.passing().fail(&["schema"]),
        );
    }
    {
        let mut l = b.lines();
        l.edit(0, |v| {
            v["agents"]
                .as_array_mut()
                .expect("agents")
                .push(json!({"agent": "zeta-bot", "first_seq": 5, "last_seq": 2}));
        });
        let mut coverage = BASE_COVERAGE.to_vec();
        coverage.push(NO_LIST_ZETA);
        add(
            "header-range-inverted-no-records",
            "§9.1, §11 checks 1 and 5",
            "A header agent with first_seq > last_seq fails check 1; its range is empty, so it claims no record and chain expects none. It is still a header agent: it has its coverage line, and check 11 looks for it in head.json.",
            "zeta-bot is listed with first_seq 5 and last_seq 2 and has no records (and no record in head.json)",
            l.join(),
            b.passing().fail(&["schema", "head"]).coverage(&coverage),
        );
    }
    {
        let mut l = b.lines();
        l.edit(0, |v| {
            for a in v["agents"].as_array_mut().expect("agents") {
                if a["agent"] == "mail-bot" {
                    a["first_seq"] = json!(6);
                    a["last_seq"] = json!(0);
                }
            }
        });
        add(
            "header-range-inverted-with-records",
            "§9.1, §11 checks 1, 5 and 11",
            "Records of an agent whose range is empty (first_seq > last_seq) are all outside it: each fails check 1 and no other check sees them; chain expects none. head.json's newer mail-bot record, logged after the pack, shows nothing cut.",
            "mail-bot's range is written 6..=0",
            l.join(),
            b.passing()
                .fail(&["schema"])
                .records(9)
                .coverage(&[
                    BASE_COVERAGE[0],
                    BASE_COVERAGE[1],
                    "mail-bot: no tool list was declared, so the pack cannot show which of the agent's tools are recorded",
                ]),
        );
    }
    {
        let mut l = b.lines();
        l.set_last_seq("claims-bot", 7);
        add(
            "record-outside-its-range",
            "§11 checks 1 and 11",
            "A record whose seq is outside its agent's header range fails check 1. head.json shows the record the header leaves out was logged inside the pack's tree: cut from the end.",
            "the header says claims-bot 0..=7 but claims-bot#8 is in the pack; its decision #7 is then open, within the grace window",
            l.join(),
            b.passing()
                .fail(&["schema", "head"])
                .pending(&["outcomes"])
                .records(BASE_RECORDS - 1),
        );
    }
    {
        let mut l = b.lines();
        l.set_last_seq("claims-bot", MAX_RECORDS_PER_PACK);
        add(
            "header-claims-too-many-records",
            "§9.1, §10, §11 checks 1 and 5",
            "The header's ranges add up to at most MAX_RECORDS_PER_PACK (16,777,216) records; otherwise check 1 fails.",
            "the header claims claims-bot 0..=16777216 (16,777,217 records); the chain then misses everything after seq 8",
            l.join(),
            b.passing().fail(&["schema", "chain"]),
        );
    }
    {
        let mut l = b.lines();
        let fillers = MAX_AGENTS_PER_PACK + 1 - 2;
        l.edit(0, |v| {
            let agents = v["agents"].as_array_mut().expect("agents");
            let mail = agents.pop().expect("mail-bot");
            for i in 0..fillers {
                agents.push(json!({"agent": format!("f{i:04}"), "first_seq": 0, "last_seq": 0}));
            }
            agents.push(mail);
        });
        let mut coverage = vec![BASE_COVERAGE[0], BASE_COVERAGE[1]];
        let names: Vec<String> = (0..fillers)
            .map(|i| format!("f{i:04}: no tool list was declared, so the pack cannot show which of the agent's tools are recorded"))
            .collect();
        coverage.extend(names.iter().map(String::as_str));
        coverage.push(BASE_COVERAGE[2]);
        add(
            "header-too-many-agents",
            "§9.1, §10, §11 check 1",
            "A header lists at most MAX_AGENTS_PER_PACK (4,096) agents; otherwise check 1 fails (the header is still used).",
            "4,095 agents claiming one record each (which the pack does not hold, and head.json does not list) are listed between claims-bot and mail-bot: 4,097 agents in all",
            l.join(),
            b.passing()
                .fail(&["schema", "chain", "head"])
                .coverage(&coverage),
        );
    }

    out.extend(small_cases());
    out
}

const NO_LIST_ZETA: &str =
    "zeta-bot: no tool list was declared, so the pack cannot show which of the agent's tools are recorded";

/// Cases on a one- or two-agent scenario of their own.
fn small_cases() -> Vec<Case> {
    let mut out = Vec::new();
    {
        // Pending records of two agents, interleaved across agents.
        let mut fx = small();
        fx.add_agent("audit-bot", "audit-bot/1");
        fx.log("audit-bot", note("started"));
        fx.log("claims-bot", note("one"));
        fx.commit();
        for (agent, text) in [
            ("claims-bot", "two, not sent"),
            ("audit-bot", "second, not sent"),
            ("claims-bot", "three, not sent"),
        ] {
            let r = fx.make(agent, note(text));
            fx.pending.push(r);
            fx.tick(1000);
        }
        let spec = PackSpec {
            created: Some(fx.now),
            ..PackSpec::default()
        };
        let mut inputs = super::base::finish_with(&fx, &spec);
        // The fixture writes pending records by agent and seq; put them in
        // the order they were made instead.
        let mut l = Lines(split(&inputs.pack));
        let a = l.find("audit-bot", 1);
        let c2 = l.find("claims-bot", 2);
        let moved = l.remove(a);
        l.0.insert(c2 + 1 - usize::from(a < c2), moved);
        assert_eq!(l.find("audit-bot", 1), l.find("claims-bot", 2) + 1);
        inputs.pack = l.join();
        out.push(case(
            "pending-records-in-any-agent-order",
            "§9.1, §11 check 1",
            "Pending records follow the witnessed ones; their order across agents is not checked (within an agent, chain requires increasing seq). Pending records make receipts pending.",
            "three pending records, claims-bot#2, audit-bot#1, claims-bot#3, in the order they were made",
            inputs,
            Expected::passing(
                true,
                &[
                    "audit-bot: no tool list was declared, so the pack cannot show which of the agent's tools are recorded",
                    "claims-bot: all 1 declared tool is recorded",
                ],
                6,
            )
            .pending(&["receipts"]),
        ));
    }
    {
        // A witnessed record after a pending one.
        let mut fx = small();
        let pending = fx.make("claims-bot", note("not sent"));
        fx.tick(1000);
        fx.log("claims-bot", note("sent, after one that was not"));
        fx.pending.push(pending);
        let mut inputs = finish(&mut fx);
        let mut l = Lines(split(&inputs.pack));
        let p = l.find("claims-bot", 1);
        let line = l.remove(p);
        let w = l.find("claims-bot", 2);
        l.0.insert(w, line);
        inputs.pack = l.join();
        out.push(case(
            "witnessed-record-after-a-pending-one",
            "§9.1, §11 check 7",
            "Witnessed records come before pending ones: a witnessed record after a pending one fails inclusion.",
            "claims-bot#1 is pending and stands before the witnessed claims-bot#2 (whose prev links to it)",
            inputs,
            Expected::passing(true, &super::base::SMALL_COVERAGE, 3)
                .fail(&["inclusion"])
                .pending(&["receipts"]),
        ));
    }
    {
        // More checkpoint lines than records claimed.
        let mut fx = small();
        fx.commit();
        fx.log("claims-bot", note("one"));
        fx.commit();
        fx.log("claims-bot", note("two"));
        fx.commit();
        let mut ranges = BTreeMap::new();
        ranges.insert("claims-bot".to_owned(), (2, 2));
        let spec = PackSpec {
            ranges: Some(ranges),
            created: Some(fx.now),
            ..PackSpec::default()
        };
        let mut inputs = super::base::finish_with(&fx, &spec);
        let mut l = Lines(split(&inputs.pack));
        for size in [2u64, 1] {
            let line =
                tally_schemas::pack::PackLine::Checkpoint(tally_schemas::pack::PackCheckpoint {
                    checkpoint: fx.checkpoint(size),
                    consistency: fx.consistency(size, 3),
                })
                .to_json()
                .expect("canonical");
            l.0.insert(1, line);
        }
        l.bump_end(0, 2);
        inputs.pack = l.join();
        out.push(case(
            "more-checkpoint-lines-than-records-claimed",
            "§9.1, §11 checks 1 and 8",
            "A pack has at most as many checkpoint lines as records its header claims: the first beyond fails check 1, and it and every later checkpoint line are not read, so a receipt naming one of their sizes names no checkpoint line.",
            "a pack of claims-bot#2 alone (mid-chain) with three checkpoint lines (sizes 1, 2, 3); its receipt names size 3",
            inputs,
            Expected::passing(
                true,
                &["claims-bot: no tool list was declared, so the pack cannot show which of the agent's tools are recorded"],
                1,
            )
            .fail(&["schema", "receipts"]),
        ));
    }
    {
        let mut fx = small();
        fx.log("claims-bot", note("one"));
        let mut inputs = finish(&mut fx);
        let mut ofx = fixture::Fixture::new(super::base::ORIGIN, "log");
        ofx.add_agent("billing-bot", "billing-bot/1");
        ofx.log("billing-bot", note("hello"));
        ofx.commit();
        let ol = bytes_of(&ofx.pack_lines(&PackSpec::default()));
        let mut l = Lines(split(&inputs.pack));
        let at = l.0.len() - 1;
        l.0.insert(at, ol[ol.len() - 2].clone());
        l.bump_end(1, 0);
        inputs.pack = l.join();
        out.push(case(
            "record-of-an-unlisted-agent",
            "§11 check 1",
            "Every record's agent is listed in the header; a record of another agent fails check 1 and no other check sees it.",
            "a record of billing-bot, which the header does not list, is spliced in before the end line",
            inputs,
            Expected::passing(true, &super::base::SMALL_COVERAGE, 2).fail(&["schema"]),
        ));
    }
    {
        let mut fx = small();
        fx.log("claims-bot", note("one"));
        let big = oversized_record_line(&mut fx);
        let mut inputs = finish(&mut fx);
        let mut l = Lines(split(&inputs.pack));
        let at = l.0.len() - 1;
        l.0.insert(at, big);
        inputs.pack = l.join();
        out.push(case(
            "record-over-32768-bytes",
            "§3, §10, §11 check 1",
            "A record over MAX_RECORD_BYTES (32,768 bytes in canonical form) is refused (§3), even validly signed: its line fails check 1 and is not counted.",
            "a pending tools record of 48 tools with long names and every part digest, signed by claims-bot, follows the others; the header does not claim it",
            inputs,
            Expected::passing(true, &super::base::SMALL_COVERAGE, 2).fail(&["schema"]),
        ));
    }
    {
        let mut fx = small();
        let mut inputs = finish(&mut fx);
        let mut l = Lines(split(&inputs.pack));
        let at = l.0.len() - 1;
        let deep = format!(
            "{{\"type\":\"record\",\"record\":{}1{}}}",
            "[".repeat(16),
            "]".repeat(16)
        );
        l.0.insert(at, deep.into_bytes());
        inputs.pack = l.join();
        out.push(case(
            "line-nested-too-deep",
            "§2, §10, §11 check 1",
            "A line nests at most MAX_DEPTH (16) levels, the line's object being level 1; a deeper one breaks §2 and fails check 1.",
            "a record line whose record is 16 nested arrays (17 levels) stands before the end line",
            inputs,
            Expected::passing(true, &super::base::SMALL_COVERAGE, 1).fail(&["schema"]),
        ));
    }
    out
}

/// A `tools` record of 48 tools with 256-byte names and every part digest:
/// over `MAX_RECORD_BYTES` in canonical form, signed by claims-bot's key
/// anyway (the fixture refuses to make one), as its pack line.
fn oversized_record_line(fx: &mut fixture::Fixture) -> Vec<u8> {
    use tally_schemas::record::{
        Body, ToolEntry, ToolList, ToolPartDigests, RECORD_SIGNATURE_DOMAIN,
    };
    let d = |l: String| Some(fixture::digest(&l));
    let tools = (0..48)
        .map(|i| ToolEntry {
            name: format!("{i:02}{}", "t".repeat(254)),
            recorded: true,
            digest: fixture::digest(&format!("{i}")),
            parts: ToolPartDigests {
                title: d(format!("{i}/title")),
                description: d(format!("{i}/description")),
                input_schema: d(format!("{i}/input")),
                output_schema: d(format!("{i}/output")),
                annotations: d(format!("{i}/annotations")),
                meta: d(format!("{i}/meta")),
            },
        })
        .collect();
    let draft = fx.draft(
        "claims-bot",
        Body::Tools(ToolList {
            list_id: "big".into(),
            part: 0,
            parts: 1,
            tools,
            source: None,
            lease_ms: None,
        }),
    );
    let unsigned = draft.signing_bytes().expect("in range");
    let sig = fx
        .agent_key("claims-bot")
        .sign(RECORD_SIGNATURE_DOMAIN, &unsigned);
    let mut record: Value = serde_json::from_slice(&unsigned).expect("JSON");
    record["sig"] = json!(sig.to_base64());
    assert!(super::base::canon(&record).len() > tally_schemas::limits::MAX_RECORD_BYTES);
    super::base::canon(
        &json!({"type": "record", "record": record, "witnessed": null, "receipt": null}),
    )
}

/// The lines of a pack (without their newlines).
pub(super) fn split(pack: &[u8]) -> Vec<Vec<u8>> {
    pack.strip_suffix(b"\n")
        .unwrap_or(pack)
        .split(|b| *b == b'\n')
        .map(<[u8]>::to_vec)
        .collect()
}

/// Each line written in another spelling of the same JSON: tabs and spaces
/// between tokens, members in reverse order, ASCII letters of strings as
/// `\u` escapes, and a CR before each LF.
fn respell(lines: &[Vec<u8>]) -> Vec<u8> {
    fn write(v: &Value, out: &mut String) {
        match v {
            Value::Object(m) => {
                out.push_str("{ ");
                for (i, (k, x)) in m.iter().rev().enumerate() {
                    if i > 0 {
                        out.push_str(" ,\t");
                    }
                    string(k, out);
                    out.push_str(" :\t");
                    write(x, out);
                }
                out.push_str(" }");
            }
            Value::Array(a) => {
                out.push_str("[ ");
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push_str(" , ");
                    }
                    write(x, out);
                }
                out.push_str(" ]");
            }
            Value::String(s) => string(s, out),
            other => out.push_str(&other.to_string()),
        }
    }
    fn string(s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                'a'..='z' | 'A'..='Z' => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                _ => {
                    let one = serde_json::to_string(&c.to_string()).expect("a string");
                    out.push_str(&one[1..one.len() - 1]);
                }
            }
        }
        out.push('"');
    }
    let mut out = Vec::new();
    for l in lines {
        let mut text = String::new();
        write(&value(l), &mut text);
        out.extend_from_slice(text.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}
