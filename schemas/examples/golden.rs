//! Writes tally's golden vectors to testdata/golden/: records of every kind
//! and refused records, an entry, a checkpoint, a receipt, a small pack with
//! its agent-keys.json and head.json. Everything is deterministic (fixed
//! seeds, times, nonces and salts), so CI reruns this and fails on any diff:
//!
//!     cargo run -p tally-schemas --example golden -- testdata/golden
//!
//! Each case file is one JSON object: `description`, `expect` (`"valid"` or
//! the stable error code), and the object under `input` (or `input_text`
//! when the case is not representable as a JSON value, such as a duplicate
//! key), plus the derived values a second implementation must reproduce.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use tally_schemas::canonical::canonicalize;
use tally_schemas::hash::salted_hash;
use tally_schemas::pack::{
    AgentKey, AgentKeyList, AgentKeys, Head, HeadAgent, PackAgent, PackCheckpoint, PackEnd,
    PackHeader, PackLine, PackReceipt, PackRecord, Witnessed, PACK_VERSION,
};
use tally_schemas::record::{
    Decision, KeyRotation, NoteBody, Outcome, OutcomeStatus, ToolEntry, ToolList,
    RECORD_SIGNATURE_DOMAIN,
};
use tally_schemas::tools::digest_tool_definition;
use tally_schemas::tree::reference;
use tally_schemas::{
    AgentName, Body, Checkpoint, Entry, Hash, LeafIndex, Nonce, NoteSigner, Receipt, Record,
    SecretKey, Seq, TreeSize, UnixMillis, UnsignedRecord,
};

const T0: i64 = 1_796_025_600_000; // 2026-11-30T08:00:00.000Z
const ORIGIN: &str = "log.tally.test/v1";

fn agent_key() -> SecretKey {
    SecretKey::from_seed(&[0x11; 32])
}

fn rotated_key() -> SecretKey {
    SecretKey::from_seed(&[0x22; 32])
}

fn log_signer() -> NoteSigner {
    // The key of the signed-note vectors, so both sets share one vkey.
    NoteSigner::from_secret(ORIGIN, SecretKey::from_seed(&[0x01; 32])).expect("valid origin")
}

fn nonce(i: u8) -> Nonce {
    Nonce::from_bytes((0..16).map(|b| b ^ i).collect()).expect("16 bytes")
}

fn salt(i: u8) -> [u8; 16] {
    [i; 16]
}

struct Chain {
    records: Vec<Record>,
    key: SecretKey,
}

impl Chain {
    fn push(&mut self, ms: i64, body: Body) -> Record {
        let seq = self.records.len() as u64;
        let unsigned = UnsignedRecord {
            agent: AgentName::new("claims-bot").expect("valid"),
            key_id: self.key.public_key().key_id(),
            seq: Seq::new(seq).expect("small"),
            prev: self.records.last().map(Record::hash),
            time: UnixMillis::new(T0 + ms),
            nonce: nonce(seq as u8),
            body,
        };
        let record = unsigned.sign(&self.key).expect("valid record");
        self.records.push(record.clone());
        record
    }
}

fn tool_definitions() -> Vec<Value> {
    vec![
        json!({"name": "lookup_claim", "description": "Fetch a claim by id.",
               "inputSchema": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}}),
        json!({"name": "refund", "description": "Refund a claim.",
               "inputSchema": {"type": "object", "properties": {"id": {"type": "string"}, "amount": {"type": "number"}}},
               "annotations": {"destructiveHint": true}}),
        json!({"name": "send_notification", "description": "Notify the customer.",
               "inputSchema": {"type": "object"}}),
    ]
}

fn build_chain() -> Chain {
    let mut chain = Chain {
        records: Vec::new(),
        key: agent_key(),
    };
    let tools = tool_definitions()
        .iter()
        .map(|d| {
            let (name, digest, parts) = digest_tool_definition(d).expect("valid definition");
            ToolEntry {
                recorded: name != "send_notification",
                name,
                digest,
                parts,
            }
        })
        .collect();
    chain.push(
        0,
        Body::Tools(ToolList {
            list_id: "list-1".into(),
            part: 0,
            parts: 1,
            tools,
        }),
    );
    let args = canonicalize(&json!({"id": "C-1001"})).expect("canonical");
    let decision = chain.push(
        1000,
        Body::Decision(Decision {
            call_id: "1".into(),
            tool: "lookup_claim".into(),
            input_hash: salted_hash(&salt(1), &args),
        }),
    );
    let result =
        canonicalize(&json!({"content": [{"type": "text", "text": "claim C-1001: open"}]}))
            .expect("c");
    chain.push(
        1250,
        Body::Outcome(Outcome {
            call_id: "1".into(),
            decision: decision.hash(),
            status: OutcomeStatus::Ok,
            output_hash: Some(salted_hash(&salt(2), &result)),
        }),
    );
    let args = canonicalize(&json!({"id": "C-1001", "amount": 42.5})).expect("canonical");
    let decision = chain.push(
        2000,
        Body::Decision(Decision {
            call_id: "2".into(),
            tool: "refund".into(),
            input_hash: salted_hash(&salt(3), &args),
        }),
    );
    chain.push(
        2100,
        Body::Outcome(Outcome {
            call_id: "2".into(),
            decision: decision.hash(),
            status: OutcomeStatus::Error,
            output_hash: Some(salted_hash(
                &salt(4),
                &canonicalize(&json!({"code": -32000, "message": "over limit"})).expect("c"),
            )),
        }),
    );
    chain.push(
        3000,
        Body::Note(NoteBody {
            text: "Escalated refund to a person.\nTicket T-9.".into(),
        }),
    );
    let new = rotated_key().public_key();
    chain.push(
        4000,
        Body::KeyRotation(KeyRotation {
            new_key_id: new.key_id(),
            new_public_key: new,
        }),
    );
    chain.key = rotated_key();
    chain.push(
        5000,
        Body::Note(NoteBody {
            text: "first record under the new key".into(),
        }),
    );
    chain
}

fn to_value<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("serialisable")
}

fn write(dir: &Path, name: &str, value: &Value) {
    let mut text = serde_json::to_string_pretty(value).expect("json");
    text.push('\n');
    fs::write(dir.join(name), text).expect("write golden file");
}

fn valid_record_case(description: &str, record: &Record, key: &SecretKey) -> Value {
    let signing = record.unsigned().signing_bytes().expect("canonical");
    let mut signed_message = RECORD_SIGNATURE_DOMAIN.to_vec();
    signed_message.extend_from_slice(&signing);
    json!({
        "description": description,
        "expect": "valid",
        "public_key": key.public_key().to_base64(),
        "input": to_value(record),
        "canonical": String::from_utf8(record.canonical_bytes().to_vec()).expect("utf-8"),
        "signed_message_hex": hex::encode(signed_message),
        "record_hash": record.hash().to_hex(),
    })
}

fn invalid_cases(sample: &Record) -> Vec<(&'static str, &'static str, &'static str, Value)> {
    let good = to_value(sample);
    let with = |f: &dyn Fn(&mut serde_json::Map<String, Value>)| {
        let mut v = good.clone();
        f(v.as_object_mut().expect("object"));
        v
    };
    let text = String::from_utf8(sample.canonical_bytes().to_vec()).expect("utf-8");
    vec![
        (
            "refused-unknown-field",
            "a member the v1 schema does not list",
            "schema",
            with(&|o| {
                o.insert("extra".into(), json!(1));
            }),
        ),
        (
            "refused-missing-prev",
            "prev omitted after seq 0 (it is always present)",
            "invalid_field",
            with(&|o| {
                o.remove("prev");
            }),
        ),
        (
            "refused-prev-at-genesis",
            "seq 0 with a prev hash",
            "invalid_field",
            with(&|o| {
                o.insert("seq".into(), json!(0));
            }),
        ),
        (
            "refused-uppercase-hash",
            "a hash in uppercase hex (one spelling per value)",
            "schema",
            with(&|o| {
                let p = o["prev"].as_str().expect("prev").to_uppercase();
                o.insert("prev".into(), json!(p));
            }),
        ),
        (
            "refused-time-without-millis",
            "a time without its three fractional digits",
            "schema",
            with(&|o| {
                o.insert("time".into(), json!("2026-11-30T08:00:01Z"));
            }),
        ),
        (
            "refused-short-nonce",
            "a nonce of 8 bytes",
            "schema",
            with(&|o| {
                o.insert("nonce".into(), json!("0011223344556677"));
            }),
        ),
        (
            "refused-version-2",
            "a record from a newer format version",
            "unsupported_version",
            with(&|o| {
                o.insert("v".into(), json!(2));
            }),
        ),
        (
            "refused-wrong-type",
            "seq as a string",
            "schema",
            with(&|o| {
                o.insert("seq".into(), json!("1"));
            }),
        ),
        (
            "refused-unknown-kind",
            "a kind the v1 schema does not list",
            "schema",
            with(&|o| {
                o.insert("kind".into(), json!("payment"));
            }),
        ),
        (
            "refused-duplicate-key",
            "the member seq written twice",
            "duplicate_key",
            Value::String(text.replacen("\"seq\":", "\"seq\":5,\"seq\":", 1)),
        ),
        (
            "refused-big-integer",
            "seq written as 2^60, beyond 2^53-1",
            "integer_out_of_range",
            Value::String(text.replacen(
                &format!("\"seq\":{}", sample.seq),
                "\"seq\":1152921504606846976",
                1,
            )),
        ),
        (
            "refused-truncated",
            "the record cut in half",
            "malformed_json",
            Value::String(text[..text.len() / 2].to_owned()),
        ),
    ]
}

fn main() {
    let out: PathBuf = std::env::args()
        .nth(1)
        .map_or_else(|| PathBuf::from("testdata/golden"), PathBuf::from);
    let records_dir = out.join("records");
    let log_dir = out.join("log");
    let pack_dir = out.join("pack");
    for d in [&records_dir, &log_dir, &pack_dir] {
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

    // The log: one entry per record, receipts issued in two batches (after
    // the 5th record and after the 8th), the pack under the last checkpoint.
    let signer = log_signer();
    let entries: Vec<Entry> = chain
        .records
        .iter()
        .enumerate()
        .map(|(i, r)| {
            Entry::new(
                LeafIndex::new(i as u64),
                UnixMillis::new(r.time.as_millis() + 150),
                r.clone(),
            )
            .expect("fits")
        })
        .collect();
    let leaves: Vec<Hash> = entries.iter().map(Entry::leaf_hash).collect();
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
    let batches = [5usize, 8];
    let receipt_size = |i: usize| *batches.iter().find(|&&b| i < b).expect("covered");

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

    // The pack: all 8 records under the checkpoint of size 8.
    let pack_size = 8usize;
    let (_, pack_note) = checkpoint_at(pack_size);
    let mut lines = vec![PackLine::Header(PackHeader {
        v: PACK_VERSION,
        origin: ORIGIN.into(),
        checkpoint: pack_note.clone(),
        created: UnixMillis::new(T0 + 60_000),
        agents: vec![PackAgent {
            agent: AgentName::new("claims-bot").expect("valid"),
            first_seq: Seq::GENESIS,
            last_seq: Seq::new(7).expect("small"),
        }],
    })];
    for &b in &batches {
        lines.push(PackLine::Checkpoint(PackCheckpoint {
            checkpoint: checkpoint_at(b).1,
            consistency: if b == pack_size {
                Vec::new()
            } else {
                reference::consistency_proof(b, &leaves[..pack_size])
            },
        }));
    }
    for (i, e) in entries.iter().enumerate() {
        lines.push(PackLine::Record(Box::new(PackRecord {
            record: e.record().clone(),
            witnessed: Some(Witnessed {
                index: e.index(),
                received: e.received(),
                inclusion: reference::inclusion_proof(i, &leaves[..pack_size]),
            }),
            receipt: Some(PackReceipt {
                record_hash: e.record().hash(),
                nonce: e.record().nonce.clone(),
                index: e.index(),
                tree_size: TreeSize::new(receipt_size(i) as u64),
            }),
        })));
    }
    lines.push(PackLine::End(PackEnd {
        checkpoints: batches.len() as u64,
        records: entries.len() as u64,
    }));
    let mut pack = Vec::new();
    for l in &lines {
        pack.extend_from_slice(&l.to_json().expect("canonical"));
        pack.push(b'\n');
    }
    fs::write(pack_dir.join("pack.jsonl"), pack).expect("write pack");

    let keys = AgentKeys {
        v: PACK_VERSION,
        origin: ORIGIN.into(),
        agents: vec![AgentKeyList {
            agent: AgentName::new("claims-bot").expect("valid"),
            keys: vec![
                AgentKey {
                    key_id: agent_key().public_key().key_id(),
                    public_key: agent_key().public_key(),
                    not_before: UnixMillis::new(T0 - 86_400_000),
                    not_after: Some(UnixMillis::new(T0 + 4500)),
                },
                AgentKey {
                    key_id: rotated_key().public_key().key_id(),
                    public_key: rotated_key().public_key(),
                    not_before: UnixMillis::new(T0 + 4000),
                    not_after: None,
                },
            ],
        }],
    };
    write(&pack_dir, "agent-keys.json", &to_value(&keys));

    // head.json: the same 8 entries plus nothing new, so the head proves the
    // pack's end; from_size == to size gives an empty consistency proof.
    let head = Head {
        v: PACK_VERSION,
        checkpoint: pack_note,
        from_size: TreeSize::new(pack_size as u64),
        consistency: Vec::new(),
        agents: vec![HeadAgent {
            record: chain.records[7].clone(),
            witnessed: Witnessed {
                index: entries[7].index(),
                received: entries[7].received(),
                inclusion: reference::inclusion_proof(7, &leaves[..pack_size]),
            },
        }],
    };
    write(&pack_dir, "head.json", &to_value(&head));
    fs::write(
        pack_dir.join("log.vkey"),
        format!("{}\n", signer.verifier().vkey()),
    )
    .expect("write vkey");

    let mut index = BTreeMap::new();
    index.insert("records", fs::read_dir(&records_dir).expect("dir").count());
    println!(
        "wrote golden vectors to {}: {index:?} record cases, log/, pack/",
        out.display()
    );
}
