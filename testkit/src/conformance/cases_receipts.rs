//! Cases of checks 7 (`inclusion`) and 8 (`receipts`), protocol.md §8,
//! §9.1 and §11.

use serde_json::{json, Value};
use tally_schemas::note::peek_checkpoint;
use tally_schemas::UnixMillis;

use super::base::{bytes_of, case, finish, small, Base, SMALL_COVERAGE};
use super::case::{Case, Expected};
use crate::fixture::{self, decision, Fixture, PackSpec};

#[allow(clippy::too_many_lines)]
pub(super) fn cases(b: &Base) -> Vec<Case> {
    let mut out = Vec::new();
    let mut add = |name: &str, section, rule: &str, description: &str, pack: Vec<u8>, e| {
        out.push(case(name, section, rule, description, b.inputs(pack), e));
    };
    let edit_claims1 = |f: &dyn Fn(&mut Value)| {
        let mut l = b.lines();
        let i = l.find("claims-bot", 1);
        l.edit(i, |v| f(v));
        l.join()
    };
    let receipts = || b.passing().fail(&["receipts"]);
    let inclusion = || b.passing().fail(&["inclusion"]);

    // --- check 8 -------------------------------------------------------------
    add(
        "receipt-edit-index",
        "§11 check 8",
        "A receipt's index equals the record's entry index.",
        "claims-bot#1's receipt index is off by one",
        edit_claims1(&|v| {
            v["receipt"]["index"] = json!(v["receipt"]["index"].as_u64().expect("i") + 1);
        }),
        receipts(),
    );
    add(
        "receipt-edit-nonce",
        "§11 check 8",
        "A receipt echoes its record's nonce.",
        "claims-bot#1's receipt echoes another nonce",
        edit_claims1(&|v| v["receipt"]["nonce"] = json!("00112233445566778899aabbccddeeff")),
        receipts(),
    );
    add(
        "receipt-edit-record-hash",
        "§11 checks 4 and 8",
        "A receipt's record_hash is its record's hash (a hash that refers to a record: record_hashes fails too).",
        "claims-bot#1's receipt names another record hash",
        edit_claims1(&|v| v["receipt"]["record_hash"] = json!(fixture::digest("other").to_hex())),
        b.passing().fail(&["receipts", "record_hashes"]),
    );
    add(
        "receipt-unknown-tree-size",
        "§11 check 8",
        "A receipt's tree_size names a checkpoint line of the pack.",
        "claims-bot#1's receipt names tree size 7, which no checkpoint line has",
        edit_claims1(&|v| v["receipt"]["tree_size"] = json!(7)),
        receipts(),
    );
    {
        let mut l = b.lines();
        let i = l.find("claims-bot", 8);
        let small_size = peek_checkpoint(l.value(1)["checkpoint"].as_str().expect("note"))
            .expect("checkpoint")
            .size
            .get();
        l.edit(i, |v| v["receipt"]["tree_size"] = json!(small_size));
        add(
            "receipt-index-not-below-tree-size",
            "§11 check 8",
            "A receipt's index is below its tree_size (its checkpoint contains the entry).",
            "claims-bot#8's receipt claims the first, smaller checkpoint line",
            l.join(),
            receipts(),
        );
    }
    add(
        "receipt-missing",
        "§11 check 8",
        "A witnessed record has a receipt.",
        "claims-bot#1's receipt is null while it is witnessed",
        edit_claims1(&|v| v["receipt"] = Value::Null),
        receipts(),
    );
    {
        let mut l = b.lines();
        let i = l.find("claims-bot", 8);
        l.edit(i, |v| v["witnessed"] = Value::Null);
        add(
            "receipt-without-witnessed",
            "§11 check 8",
            "A record with a receipt but witnessed = null fails receipts.",
            "the last record line (claims-bot#8) has its receipt but witnessed is null",
            l.join(),
            receipts(),
        );
    }
    {
        let mut fx = small();
        let d = fx.log("claims-bot", decision("1", "lookup_claim"));
        fx.log(
            "claims-bot",
            fixture::outcome("1", &d, tally_schemas::record::OutcomeStatus::Ok),
        );
        let mut draft = fx.draft("claims-bot", decision("2", "lookup_claim"));
        draft.nonce = d.nonce.clone();
        let r = fx.sign(draft, None);
        fx.append(r.clone(), None);
        fx.tick(1000);
        fx.log(
            "claims-bot",
            fixture::outcome("2", &r, tally_schemas::record::OutcomeStatus::Ok),
        );
        out.push(case(
            "nonce-reused",
            "§11 check 8",
            "No nonce appears in two records of a pack.",
            "a decision reuses an earlier decision's nonce, and the log witnessed it",
            finish(&mut fx),
            Expected::passing(true, &SMALL_COVERAGE, 5).fail(&["receipts"]),
        ));
    }

    // --- check 7 -------------------------------------------------------------
    let mut add = |name: &str, section, rule: &str, description: &str, pack: Vec<u8>, e| {
        out.push(case(name, section, rule, description, b.inputs(pack), e));
    };
    add(
        "witnessed-edit-received",
        "§7.1, §11 check 7",
        "The entry covers the witness's receive time: moving it by 1 ms rebuilds an entry the tree does not hold.",
        "claims-bot#1's received is 1 ms later",
        edit_claims1(&|v| {
            let t = UnixMillis::parse_rfc3339(v["witnessed"]["received"].as_str().expect("t"))
                .expect("time");
            v["witnessed"]["received"] = json!(UnixMillis::new(t.as_millis() + 1).to_string());
        }),
        inclusion(),
    );
    add(
        "inclusion-proof-truncated",
        "§7.2, §11 check 7",
        "An inclusion proof verifies by RFC 9162 §2.1.3.2 with exactly the hashes it needs.",
        "claims-bot#1's inclusion proof loses its last hash",
        edit_claims1(&|v| {
            v["witnessed"]["inclusion"]
                .as_array_mut()
                .expect("proof")
                .pop();
        }),
        inclusion(),
    );
    add(
        "inclusion-proof-padded",
        "§7.2, §11 check 7",
        "An inclusion proof with one hash too many is invalid.",
        "claims-bot#1's inclusion proof gains a hash",
        edit_claims1(&|v| {
            v["witnessed"]["inclusion"]
                .as_array_mut()
                .expect("proof")
                .push(json!(fixture::digest("pad").to_hex()));
        }),
        inclusion(),
    );
    add(
        "inclusion-proof-wrong-hash",
        "§7.2, §11 check 7",
        "Every hash of an inclusion proof counts.",
        "claims-bot#1's inclusion proof has its first hash replaced",
        edit_claims1(&|v| {
            v["witnessed"]["inclusion"][0] = json!(fixture::digest("flip").to_hex());
        }),
        inclusion(),
    );
    add(
        "inclusion-proof-over-64-hashes",
        "§7.2, §10, §11 check 7",
        "An inclusion proof holds at most MAX_PROOF_HASHES (64) hashes.",
        "claims-bot#1's inclusion proof is padded to 65 hashes",
        edit_claims1(&|v| {
            let p = v["witnessed"]["inclusion"].as_array_mut().expect("proof");
            while p.len() < 65 {
                p.push(json!(fixture::digest("pad").to_hex()));
            }
        }),
        inclusion(),
    );
    {
        let mut l = b.lines();
        let i = l.find("claims-bot", 3);
        let j = l.find("mail-bot", 3);
        assert_eq!(j, i + 1, "adjacent lines");
        l.0.swap(i, j);
        add(
            "records-reordered",
            "§9.1, §11 checks 7 and 9",
            "Witnessed records are in increasing log index, and received never decreases in pack order: swapping two adjacent records of different agents breaks both, though each chain is still in order.",
            "claims-bot#3 and mail-bot#3, adjacent in the log, swap places",
            l.join(),
            b.passing().fail(&["inclusion", "timing"]),
        );
    }
    {
        // The same records on another log: the last record's line, with that
        // log's index, receive time, proof and receipt, is spliced in.
        let mut other = Fixture::new(super::base::ORIGIN, "log");
        other.add_agent("billing-bot", "billing-bot/1");
        other.add_agent("claims-bot", "claims-bot/1");
        other.add_agent("mail-bot", "mail-bot/1");
        other.log("billing-bot", fixture::note("another log's first entry"));
        for e in &b.fx.entries {
            other.append(e.record.clone(), Some(e.received.as_millis()));
        }
        other.commit();
        let ol = super::base::Lines(bytes_of(&other.pack_lines(&PackSpec {
            size: Some(b.pack_size + 1),
            ..PackSpec::default()
        })));
        let mut l = b.lines();
        let i = l.find("claims-bot", 8);
        l.0[i] = ol.0[ol.find("claims-bot", 8)].clone();
        add(
            "spliced-from-other-log",
            "§11 checks 7 and 8",
            "An entry is proven in this pack's checkpoint at its index; a line taken from another log that holds the same record elsewhere proves nothing here, and its receipt names no checkpoint line of this pack.",
            "claims-bot#8's line is taken from another log that holds the same record one index later",
            l.join(),
            b.passing().fail(&["inclusion", "receipts"]),
        );
    }
    out
}
