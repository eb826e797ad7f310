//! Cases of checks 4 (`record_hashes`) and 5 (`chain`): edited records,
//! reordered, dropped, duplicated and spliced lines, forks, anchors and key
//! rotations (protocol.md §3, §5.5, §11).

use std::collections::BTreeMap;

use serde_json::json;
use tally_schemas::pack::AgentKey;
use tally_schemas::record::{Body, Outcome, OutcomeStatus};
use tally_schemas::UnixMillis;

use super::base::{case, finish, finish_with, small, Base, BASE_RECORDS, SMALL_COVERAGE};
use super::case::{Case, Expected};
use crate::fixture::{self, decision, key_from_label, note, outcome, PackSpec};

const NO_LIST_CLAIMS: &str =
    "claims-bot: no tool list was declared, so the pack cannot show which of the agent's tools are recorded";

#[allow(clippy::too_many_lines)]
pub(super) fn cases(b: &Base) -> Vec<Case> {
    let mut out = Vec::new();
    let mut add = |name: &str, section, rule: &str, description: &str, pack: Vec<u8>, e| {
        out.push(case(name, section, rule, description, b.inputs(pack), e));
    };

    // --- records edited without re-signing ------------------------------
    {
        let mut l = b.lines();
        let i = l.find("claims-bot", 3);
        l.edit(i, |v| {
            v["record"]["body"]["text"] = json!("reviewing claim 43")
        });
        add(
            "record-edit-note-text",
            "§11 checks 3, 4, 5, 7 and 8",
            "A record edited after signing breaks its signature, its entry, its receipt and the next record's prev link.",
            "claims-bot#3's note text is edited in the middle of the chain",
            l.join(),
            b.passing().fail(&[
                "record_signatures",
                "record_hashes",
                "chain",
                "inclusion",
                "receipts",
            ]),
        );
    }
    {
        let mut l = b.lines();
        let i = l.find("claims-bot", 1);
        l.edit(i, |v| v["record"]["body"]["tool"] = json!("refund"));
        add(
            "record-edit-decision-tool",
            "§11 checks 3, 4, 5, 7, 8 and 10",
            "Every hash that refers to an edited decision breaks: the next record's prev, its receipt, and its outcome's decision hash (so the outcome names no open decision: an orphan).",
            "claims-bot#1's tool is changed from lookup_claim to refund; the edited decision is then open, within the grace window",
            l.join(),
            b.passing().fail(&[
                "record_signatures",
                "record_hashes",
                "chain",
                "inclusion",
                "receipts",
                "outcomes",
            ]),
        );
    }
    {
        let mut l = b.lines();
        let i = l.find("claims-bot", 8);
        l.edit(i, |v| v["record"]["body"]["status"] = json!("error"));
        add(
            "record-edit-outcome-status",
            "§11 checks 3, 4, 7, 8 and 11",
            "Editing the last record of a chain breaks its signature, entry and receipt; head.json holds the original at the same seq: a fork.",
            "claims-bot#8's status is changed from ok to error",
            l.join(),
            b.passing().fail(&[
                "record_signatures",
                "record_hashes",
                "inclusion",
                "receipts",
                "head",
            ]),
        );
    }
    {
        let mut l = b.lines();
        let i = l.find("claims-bot", 3);
        let j = l.find("claims-bot", 4);
        let (si, sj) = (
            l.value(i)["record"]["sig"].clone(),
            l.value(j)["record"]["sig"].clone(),
        );
        l.edit(i, |v| v["record"]["sig"] = sj);
        l.edit(j, |v| v["record"]["sig"] = si);
        add(
            "signatures-swapped",
            "§11 checks 3, 4, 5, 7, 8 and 10",
            "A signature is part of the record hash: swapping two records' signatures breaks both signatures and every hash that refers to either.",
            "claims-bot#3 (a note) and #4 (a decision) swap signatures",
            l.join(),
            b.passing().fail(&[
                "record_signatures",
                "record_hashes",
                "chain",
                "inclusion",
                "receipts",
                "outcomes",
            ]),
        );
    }

    // --- lines moved, dropped, repeated ----------------------------------
    {
        let mut l = b.lines();
        let i = l.find("claims-bot", 3);
        let j = l.find("claims-bot", 4);
        l.0.swap(i, j);
        add(
            "records-reordered-same-agent",
            "§11 checks 5, 7 and 9",
            "A chain is read in pack order: a record whose seq is not above every earlier seq of its agent fails chain; log indexes and receive times then go backwards too.",
            "claims-bot#3 and #4 swap places (their prev links still recompute)",
            l.join(),
            b.passing().fail(&["chain", "inclusion", "timing"]),
        );
    }
    {
        let mut l = b.lines();
        let i = l.find("claims-bot", 3);
        l.remove(i);
        l.bump_end(-1, 0);
        add(
            "record-dropped",
            "§11 check 5",
            "Per agent the records are exactly first_seq..=last_seq: a record missing from the middle is a gap.",
            "claims-bot#3 is removed (the end line's count adjusted)",
            l.join(),
            b.passing().fail(&["chain"]).records(BASE_RECORDS - 1),
        );
    }
    {
        let mut l = b.lines();
        let i = l.find("claims-bot", 8);
        l.remove(i);
        l.bump_end(-1, 0);
        add(
            "record-dropped-at-the-end",
            "§11 checks 5 and 10",
            "Records missing at the end of an agent's range fail chain; the decision their outcome answered is then open (pending within the grace window).",
            "claims-bot#8 (the last outcome) is removed but the header still claims it",
            l.join(),
            b.passing()
                .fail(&["chain"])
                .pending(&["outcomes"])
                .records(BASE_RECORDS - 1),
        );
    }
    {
        let mut l = b.lines();
        let i = l.find("claims-bot", 3);
        let dup = l.0[i].clone();
        l.0.insert(i + 1, dup);
        l.bump_end(1, 0);
        add(
            "record-duplicated",
            "§11 checks 5, 7 and 8",
            "Each seq appears once: a repeated record fails chain, repeats an index (inclusion) and a nonce (receipts).",
            "the record line of claims-bot#3 appears twice in a row",
            l.join(),
            b.passing()
                .fail(&["chain", "inclusion", "receipts"])
                .records(BASE_RECORDS + 1),
        );
    }
    {
        // An outcome read before its own decision: pack order decides.
        let mut l = b.lines();
        let i = l.find("claims-bot", 1);
        let j = l.find("claims-bot", 2);
        l.0.swap(i, j);
        add(
            "outcome-before-its-decision",
            "§11 checks 5, 7 and 10",
            "An outcome is judged against the decisions read before it in pack order: at first_seq 0, one whose decision comes later in the pack is an orphan (check 10 fails), and the decision read after it stays open.",
            "the lines of claims-bot#1 (a decision) and #2 (its outcome) are swapped",
            l.join(),
            b.passing().fail(&["chain", "inclusion", "timing", "outcomes"]),
        );
    }
    {
        // Two identical decision lines: the second does not extend the
        // chain, so it opens no second decision (§11, the chain walk and
        // the open decisions): one outcome answers the one decision.
        let mut l = b.lines();
        let i = l.find("claims-bot", 1);
        let dup = l.0[i].clone();
        l.0.insert(i + 1, dup);
        l.bump_end(1, 0);
        add(
            "decision-line-repeated",
            "§11 checks 4, 5, 7, 8 and 10",
            "A record that does not extend the chain is not used by the checks that read the chain walk or the open decisions (4, 5's links, 10): a repeated decision line is one open decision, answered by its one outcome; it fails chain, inclusion and receipts as any repeated record does.",
            "the record line of claims-bot#1, a decision, appears twice in a row",
            l.join(),
            b.passing()
                .fail(&["chain", "inclusion", "receipts"])
                .records(BASE_RECORDS + 1),
        );
    }
    {
        // Check 4 on a record that does not extend the chain: its `prev`
        // has no place to be compared with, but its receipt's record_hash
        // (and an outcome's `decision`) is compared as for any record.
        let mut l = b.lines();
        let i = l.find("claims-bot", 3);
        let dup = l.0[i].clone();
        l.0.insert(i + 1, dup);
        l.bump_end(1, 0);
        l.edit(i + 1, |v| {
            v["receipt"]["record_hash"] = json!(fixture::digest("another record").to_hex());
        });
        add(
            "record-duplicated-receipt-names-another-hash",
            "§11 checks 4, 5, 7 and 8",
            "Check 4 judges every hash a record line carries that refers to a record, whether or not the record extends the chain; only a non-extending record's prev is not compared (it follows nothing). A repeated record whose receipt names another record hash fails record_hashes too.",
            "as record-duplicated, with the repeated line's receipt naming another record hash",
            l.join(),
            b.passing()
                .fail(&["record_hashes", "chain", "inclusion", "receipts"])
                .records(BASE_RECORDS + 1),
        );
    }
    {
        let mut l = b.lines();
        let i = l.find("claims-bot", 3);
        let j = l.find("mail-bot", 3);
        l.0[i] = l.0[j].clone();
        add(
            "spliced-from-other-agent",
            "§11 checks 5, 7 and 8",
            "A record copied into another place of the pack repeats its agent's seq, its index and its nonce, and leaves a gap where it stands.",
            "claims-bot#3 is replaced by a copy of mail-bot#3",
            l.join(),
            b.passing().fail(&["chain", "inclusion", "receipts"]),
        );
    }
    out.extend(scenario_cases(b));
    out
}

/// Cases on scenarios of their own.
#[allow(clippy::too_many_lines)]
fn scenario_cases(b: &Base) -> Vec<Case> {
    let mut out = Vec::new();
    {
        let mut fx = small();
        super::base::call(&mut fx, "1");
        let old = fx.agent_key("claims-bot");
        fx.rotate("claims-bot", "claims-bot/2");
        let d = fx.draft("claims-bot", note("still on the old key"));
        let r = fx.sign(d, Some(&old));
        fx.append(r, None);
        fx.tick(1000);
        out.push(case(
            "rotation-not-followed",
            "§5.5, §11 check 5",
            "After a key_rotation at seq k, the records from k+1 on are signed by new_key_id; one signed by another key fails chain (even when agent-keys.json trusts that key).",
            "after rotating, claims-bot signs its next record with the old key, which is still trusted",
            finish(&mut fx),
            Expected::passing(true, &SMALL_COVERAGE, 5).fail(&["chain"]),
        ));
    }
    {
        let mut fx = small();
        super::base::call(&mut fx, "1");
        let k2 = key_from_label("claims-bot/other");
        for text in ["on another key", "still on it"] {
            let d = fx.draft("claims-bot", note(text));
            let r = fx.sign(d, Some(&k2));
            fx.append(r, None);
            fx.tick(1000);
        }
        let mut inputs = finish(&mut fx);
        let mut keys = fx.agent_keys();
        keys.agents[0].keys.push(AgentKey {
            key_id: k2.public_key().key_id(),
            public_key: k2.public_key(),
            not_before: UnixMillis::new(fixture::EPOCH_MS),
            not_after: None,
        });
        inputs.agent_keys = fixture::to_json(&keys);
        out.push(case(
            "key-change-without-rotation",
            "§11 checks 2 and 5",
            "A change of signing key without a key_rotation record is not a chain failure: agent-keys.json alone says which keys may sign when (check 2).",
            "claims-bot's last two records are signed by a second key that agent-keys.json lists, with no key_rotation before them",
            inputs,
            Expected::passing(true, &SMALL_COVERAGE, 5),
        ));
    }
    {
        let mut fx = small();
        fx.log("claims-bot", note("one"));
        let mut fork = fx.clone();
        fx.log("claims-bot", note("two"));
        fork.skip_nonces(100);
        let other = fork.make("claims-bot", note("two, forked"));
        fx.append(other, None);
        fx.tick(1000);
        out.push(case(
            "fork-two-records-one-seq",
            "§11 checks 5 and 11",
            "Two records with one seq are a fork: the second fails chain. In check 11, w is the first record in pack order at the highest witnessed seq, so head.json's record there (the other branch) is a fork too.",
            "the log holds two different records at seq 2 with the same prev; head.json's latest record is the second",
            finish(&mut fx),
            Expected::passing(true, &SMALL_COVERAGE, 4).fail(&["chain", "head"]),
        ));
    }
    {
        let mut fx = small();
        let d = fx.draft("claims-bot", note("links to nothing"));
        let mut d = d;
        d.prev = Some(fixture::digest("not the previous record"));
        let r = fx.sign(d, None);
        fx.append(r, None);
        fx.tick(1000);
        fx.log("claims-bot", note("after it"));
        out.push(case(
            "prev-does-not-link",
            "§11 checks 4 and 5",
            "A record's prev equals the record hash of the agent's record before it; a validly signed record whose prev names something else fails record_hashes and chain.",
            "claims-bot#1, signed and witnessed, has a prev that is not claims-bot#0's hash",
            finish(&mut fx),
            Expected::passing(true, &SMALL_COVERAGE, 3).fail(&["record_hashes", "chain"]),
        ));
    }
    {
        // An outcome read before its own decision in a pack that starts
        // mid-chain: the decision is not yet read, so the outcome is taken
        // as naming one before the pack (check 10's exception), and the
        // decision read after it is open.
        let mut fx = small();
        fx.log("claims-bot", note("anchor"));
        let d = fx.log("claims-bot", decision("5", "lookup_claim"));
        fx.log("claims-bot", outcome("5", &d, OutcomeStatus::Ok));
        fx.commit();
        let mut ranges = BTreeMap::new();
        ranges.insert("claims-bot".to_owned(), (1, 3));
        let spec = PackSpec {
            ranges: Some(ranges),
            created: Some(fx.now),
            ..PackSpec::default()
        };
        let mut inputs = finish_with(&fx, &spec);
        let text = String::from_utf8(inputs.pack.clone()).expect("utf-8");
        let mut lines: Vec<&str> = text.lines().collect();
        let at = |seq: u64| {
            lines
                .iter()
                .position(|l| {
                    let v: serde_json::Value = serde_json::from_str(l).expect("line");
                    v["type"] == "record" && v["record"]["seq"] == seq
                })
                .expect("record line")
        };
        let (i, j) = (at(2), at(3));
        lines.swap(i, j);
        inputs.pack = format!("{}\n", lines.join("\n")).into_bytes();
        out.push(case(
            "outcome-before-its-decision-mid-chain",
            "§9.1, §11 checks 5, 7, 9 and 10",
            "An outcome is judged against the decisions read before it in pack order: in a pack starting after seq 0, one whose decision comes later is taken as naming a decision outside the pack and accepted, and the decision read after it stays open (pending within the grace window).",
            "claims-bot 1..=3, the lines of #2 (a decision) and #3 (its outcome) swapped",
            inputs,
            Expected::passing(true, &[NO_LIST_CLAIMS], 3)
                .fail(&["chain", "inclusion", "timing"])
                .pending(&["outcomes"]),
        ));
    }
    {
        let mut fx = small();
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
        out.push(case(
            "anchor-not-witnessed",
            "§9.1, §11 check 5",
            "A pack that starts mid-chain (first_seq > 0) needs its first record witnessed: the anchor.",
            "a pack of claims-bot#3 alone, which the log has not witnessed",
            finish_with(&fx, &spec),
            Expected::passing(true, &[NO_LIST_CLAIMS], 1)
                .fail(&["chain"])
                .pending(&["receipts"]),
        ));
    }
    {
        let mut fx = small();
        fx.log("claims-bot", note("one"));
        let mut inputs = finish(&mut fx);
        let mut l = super::base::Lines(super::cases_pack::split(&inputs.pack));
        let i = l.find("claims-bot", 0);
        l.remove(i);
        l.bump_end(-1, 0);
        inputs.pack = l.join();
        out.push(case(
            "genesis-missing",
            "§11 check 5",
            "At first_seq 0 the chain starts at its genesis record; without it the chain has a gap.",
            "the header says claims-bot starts at seq 0, but its genesis record (its tool list) is missing",
            inputs,
            Expected::passing(true, &[NO_LIST_CLAIMS], 1).fail(&["chain"]),
        ));
    }
    {
        let mut ranges = BTreeMap::new();
        ranges.insert("claims-bot".to_owned(), (3, 8));
        ranges.insert("mail-bot".to_owned(), (2, 5));
        let spec = PackSpec {
            ranges: Some(ranges),
            ..b.spec.clone()
        };
        let inputs = super::case::Inputs {
            pack: fixture::to_jsonl(&b.fx.pack_lines(&spec)),
            ..b.inputs(Vec::new())
        };
        out.push(case(
            "mid-chain-export",
            "§9.1, §11 checks 5 and 10",
            "A pack may start mid-chain at a witnessed anchor, whose prev is not followed; an outcome naming a decision before the anchor cannot be judged and is accepted.",
            "claims-bot 3..=8 and mail-bot 2..=5; mail-bot#2 answers a decision at seq 1",
            inputs,
            Expected::passing(
                true,
                &[
                    "claims-bot: 1 declared tool is not recorded: send_notification",
                    "mail-bot: no tool list was declared, so the pack cannot show which of the agent's tools are recorded",
                ],
                10,
            ),
        ));
    }
    out.extend(call_id_cases());
    out
}

/// Which open decision an outcome is compared with (checks 4 and 10) when
/// two open decisions share a call_id.
fn call_id_cases() -> Vec<Case> {
    let mut out = Vec::new();
    let two_open = || {
        let mut fx = small();
        let d1 = fx.log("claims-bot", decision("7", "lookup_claim"));
        let d2 = fx.log("claims-bot", decision("7", "lookup_claim"));
        (fx, d1, d2)
    };
    for (name, first_answered, description) in [
        (
            "two-open-decisions-one-call-id-answered-in-order",
            true,
            "two decisions with call_id 7 are open; the first outcome answers the first, the second the second",
        ),
        (
            "two-open-decisions-one-call-id-answered-in-reverse",
            false,
            "two decisions with call_id 7 are open; the first outcome answers the second, the second the first",
        ),
    ] {
        let (mut fx, d1, d2) = two_open();
        let (a, z) = if first_answered { (&d1, &d2) } else { (&d2, &d1) };
        fx.log("claims-bot", fixture::outcome("7", a, OutcomeStatus::Ok));
        fx.log("claims-bot", fixture::outcome("7", z, OutcomeStatus::Ok));
        out.push(case(
            name,
            "§11 checks 4 and 10",
            "An outcome is compared with the agent's open decisions that have its call_id: it passes record_hashes when its decision equals any of them, in whatever order they are answered.",
            description,
            finish(&mut fx),
            Expected::passing(true, &SMALL_COVERAGE, 5),
        ));
    }
    {
        let (mut fx, _, _) = two_open();
        fx.log(
            "claims-bot",
            Body::Outcome(Outcome {
                call_id: "7".into(),
                decision: fixture::digest("neither"),
                status: OutcomeStatus::Ok,
                output_hash: None,
                state: None,
                proof: None,
                proof_hash: None,
            }),
        );
        out.push(case(
            "two-open-decisions-one-call-id-outcome-names-neither",
            "§11 checks 4 and 10",
            "An outcome whose decision equals none of the open decisions with its call_id fails record_hashes, and names no decision of the pack (an orphan).",
            "two decisions with call_id 7 are open (within the grace window); an outcome with call_id 7 names a hash that is neither",
            finish(&mut fx),
            Expected::passing(true, &SMALL_COVERAGE, 4).fail(&["record_hashes", "outcomes"]),
        ));
    }
    {
        let mut fx = small();
        fx.log("claims-bot", decision("1", "lookup_claim"));
        fx.log(
            "claims-bot",
            Body::Outcome(Outcome {
                call_id: "1".into(),
                decision: fixture::digest("not the decision"),
                status: OutcomeStatus::Ok,
                output_hash: None,
                state: None,
                proof: None,
                proof_hash: None,
            }),
        );
        out.push(case(
            "outcome-wrong-decision-hash",
            "§11 checks 4 and 10",
            "Each outcome's decision equals the record hash of the open decision with its call_id; otherwise record_hashes fails, and the outcome is an orphan.",
            "the agent signs an outcome whose decision hash is not that of the decision with its call_id",
            finish(&mut fx),
            Expected::passing(true, &SMALL_COVERAGE, 3).fail(&["record_hashes", "outcomes"]),
        ));
    }
    out
}
