//! tally's golden vectors, testdata/golden/: records of every kind and
//! refused records, an entry, a checkpoint, a receipt, refused agent-keys.json
//! and head.json documents; and the golden pack (its agent-keys.json,
//! head.json and vkey), which is the `golden-pack` case of the conformance
//! corpus (testdata/conformance/). Everything is deterministic (fixed seeds,
//! times, nonces and salts), so CI reruns the generator and fails on any diff:
//!
//! ```text
//! cargo run -p tally-testkit --example golden -- testdata/golden
//! ```
//!
//! Each case file is one JSON object: `description`, `expect` (`"valid"` or
//! the stable error code), and the object under `input` (or `input_text`
//! when the case is not representable as a JSON value, such as a duplicate
//! key or a non-finite number, or breaks a bound checked on the bytes, such
//! as depth or size), plus the derived values a second implementation must
//! reproduce. A refused `input` that JSON Schema cannot refuse (a rule the
//! schema cannot state) says so with `"schema_refuses": false`.
//!
//! hashes/ holds salted content hashes (salt and content to hash) and tool
//! definition digests (MCP definition to digests).

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use serde_json::{json, Value};
use tally_schemas::canonical::canonicalize;
use tally_schemas::pack::{AgentKeys, Head};
use tally_schemas::record::RECORD_SIGNATURE_DOMAIN;
use tally_schemas::tree::reference;
use tally_schemas::{Checkpoint, LeafIndex, Receipt, Record, SecretKey, TreeSize, UnixMillis};

mod chain;
mod fixtures;
mod hashes;
mod pack;
mod records;

use chain::{build_chain, build_second_chain};
pub use fixtures::pretty;
use fixtures::*;
use hashes::write_hashes;
use pack::golden_log;
pub use pack::{golden_pack, GoldenPack};
use records::{invalid_cases, more_invalid_cases, valid_record_case};

/// Writes the golden vectors to `out` (testdata/golden): `records/`,
/// `log/`, `hashes/` and `pack/` (the refused agent-keys.json and head.json
/// documents; the golden pack itself is a conformance case).
///
/// # Panics
/// On an I/O error, or when a vector does not say what the generator
/// claims of it.
pub fn write_golden(out: &Path) {
    let records_dir = out.join("records");
    let log_dir = out.join("log");
    let pack_dir = out.join("pack");
    let hashes_dir = out.join("hashes");
    for d in [&records_dir, &log_dir, &pack_dir, &hashes_dir] {
        if d.exists() {
            fs::remove_dir_all(d).expect("clean");
        }
        fs::create_dir_all(d).expect("mkdir");
    }

    let chain = build_chain();
    let names = [
        "tools",
        "decision",
        "outcome-ok",
        "decision-2",
        "outcome-error",
        "note",
        "key-rotation",
        "note-after-rotation",
    ];
    for (i, (record, name)) in chain.records.iter().zip(names).enumerate() {
        let key = if i < 7 { agent_key() } else { rotated_key() };
        let case = valid_record_case(
            &format!("a valid {} record at seq {i}", record.kind().as_str()),
            record,
            &key,
        );
        write(&records_dir, &format!("{i:02}-{name}.json"), &case);
    }
    let mut bad_sig = to_value(&chain.records[1]);
    let other = SecretKey::from_seed(&[0x33; 32]).sign(RECORD_SIGNATURE_DOMAIN, b"something else");
    bad_sig["sig"] = json!(other.to_base64());
    write(
        &records_dir,
        "bad-signature.json",
        &json!({
            "description": "a well-formed record whose signature does not verify with its key",
            "expect": "bad_signature",
            "public_key": agent_key().public_key().to_base64(),
            "input": bad_sig,
        }),
    );
    for (name, description, code, input) in invalid_cases(&chain.records[2]) {
        let field = if input.is_string() {
            "input_text"
        } else {
            "input"
        };
        write(
            &records_dir,
            &format!("{name}.json"),
            &json!({"description": description, "expect": code, field: input}),
        );
    }
    let (_, second) = build_second_chain();
    for (i, (name, record)) in second.iter().enumerate() {
        let case = valid_record_case(
            &format!(
                "a valid {} record of a second agent ({name})",
                record.kind().as_str()
            ),
            record,
            &agent_key(),
        );
        write(&records_dir, &format!("{:02}-{name}.json", 10 + i), &case);
    }
    let more = more_invalid_cases(
        &chain.records[0],
        &chain.records[1],
        &chain.records[5],
        &chain.records[6],
    );
    for (name, description, code, input, schema_refuses) in more {
        // The generator checks its own claim, so a fixture never states a
        // code the parser does not give.
        let got = match &input {
            Value::String(text) => Record::from_json(text.as_bytes()),
            value => Record::from_value(value.clone()),
        }
        .expect_err(name);
        assert_eq!(got.code(), code, "{name}: {got}");
        let mut case = json!({"description": description, "expect": code});
        if input.is_string() {
            case["input_text"] = input;
        } else {
            case["input"] = input;
            if !schema_refuses {
                case["schema_refuses"] = json!(false);
            }
        }
        write(&records_dir, &format!("{name}.json"), &case);
    }
    write_hashes(&hashes_dir);

    let (entries, leaves) = golden_log(&chain);
    let signer = log_signer();
    let checkpoint_at = |n: usize| {
        let cp = Checkpoint::new(
            ORIGIN,
            TreeSize::new(n as u64),
            reference::root(&leaves[..n]),
        );
        (
            cp.clone(),
            signer.sign_checkpoint(&cp).expect("origin matches"),
        )
    };
    // The log: one entry per record, receipts issued in two batches (after
    // the 5th record and after the 8th), the pack under the last checkpoint.

    write(
        &log_dir,
        "entry.json",
        &json!({
            "description": "the entry for the record at seq 1, log index 1",
            "expect": "valid",
            "input": to_value(&entries[1]),
            "canonical": String::from_utf8(entries[1].canonical_bytes().to_vec()).expect("utf-8"),
            "leaf_hash": entries[1].leaf_hash().to_hex(),
        }),
    );
    let (cp5, note5) = checkpoint_at(5);
    write(
        &log_dir,
        "checkpoint.json",
        &json!({
            "description": "a checkpoint over the first 5 entries, signed by the log key",
            "expect": "valid",
            "vkey": signer.verifier().vkey(),
            "body": cp5.to_body(),
            "note": note5,
        }),
    );
    let receipt = Receipt {
        v: 1,
        record_hash: chain.records[1].hash(),
        nonce: chain.records[1].nonce.clone(),
        index: LeafIndex::new(1),
        received: entries[1].received(),
        checkpoint: note5.clone(),
        inclusion: reference::inclusion_proof(1, &leaves[..5]),
    };
    receipt
        .verify(&chain.records[1], signer.verifier())
        .expect("golden receipt verifies");
    write(
        &log_dir,
        "receipt.json",
        &json!({
            "description": "the receipt for the record at seq 1 under the checkpoint of size 5",
            "expect": "valid",
            "vkey": signer.verifier().vkey(),
            "record": to_value(&chain.records[1]),
            "input": to_value(&receipt),
        }),
    );

    let GoldenPack { keys, head, .. } = golden_pack();
    // Refused agent-keys and head documents: an agent or key listed twice
    // leaves which entry counts to the reader, so each is refused.
    let mut twice = keys.clone();
    twice.agents.push(twice.agents[0].clone());
    let mut same_key = keys.clone();
    let mut repeated = same_key.agents[0].keys[0].clone();
    repeated.not_before = UnixMillis::new(T0);
    same_key.agents[0].keys.push(repeated);
    let mut head_twice = head.clone();
    head_twice.agents.push(head_twice.agents[0].clone());
    let refused: [(&str, &str, &str, Value, bool); 3] = [
        (
            "refused-agent-keys-duplicate-agent.json",
            "agent-keys.json listing the agent claims-bot twice",
            "duplicate_agent",
            to_value(&twice),
            true,
        ),
        (
            "refused-agent-keys-duplicate-key-id.json",
            "agent-keys.json listing one key twice for claims-bot, with different validity",
            "duplicate_key_id",
            to_value(&same_key),
            true,
        ),
        (
            "refused-head-duplicate-agent.json",
            "head.json listing the agent claims-bot twice",
            "duplicate_agent",
            to_value(&head_twice),
            false,
        ),
    ];
    for (name, description, code, input, is_keys) in refused {
        let bytes = canonicalize(&input).expect("canonical");
        let got = if is_keys {
            AgentKeys::from_json(&bytes).map(|_| ())
        } else {
            Head::from_json(&bytes).map(|_| ())
        }
        .expect_err(name);
        assert_eq!(got.code(), code, "{name}: {got}");
        write(
            &pack_dir,
            name,
            &json!({
                "description": description,
                "expect": code,
                "document": if is_keys { "agent-keys" } else { "head" },
                "input": input,
            }),
        );
    }
    let mut index = BTreeMap::new();
    index.insert("records", fs::read_dir(&records_dir).expect("dir").count());
    println!(
        "wrote golden vectors to {}: {index:?} record cases, log/, hashes/, pack/",
        out.display()
    );
}
