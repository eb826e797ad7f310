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
use tally_schemas::hash::salted_hash;
use tally_schemas::limits::MAX_TOOLS_PER_RECORD;
use tally_schemas::pack::{
    AgentKey, AgentKeyList, AgentKeys, Head, HeadAgent, PackAgent, PackCheckpoint, PackEnd,
    PackHeader, PackLine, PackReceipt, PackRecord, Witnessed, PACK_VERSION,
};
use tally_schemas::record::{
    ActionState, Claim, Decision, KeyRotation, NoteBody, Outcome, OutcomeStatus, ToolEntry,
    ToolList, RECORD_SIGNATURE_DOMAIN,
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
    agent: &'static str,
    records: Vec<Record>,
    key: SecretKey,
}

impl Chain {
    fn push(&mut self, ms: i64, body: Body) -> Record {
        let seq = self.records.len() as u64;
        let unsigned = UnsignedRecord {
            agent: AgentName::new(self.agent).expect("valid"),
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
        agent: "claims-bot",
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
            source: None,
            lease_ms: None,
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
            state: None,
            proof: None,
            proof_hash: None,
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
            state: None,
            proof: None,
            proof_hash: None,
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

/// Refused cases built from other kinds of record: `(file name,
/// description, code, input, schema_refuses)`. Inputs that are strings go
/// under `input_text`.
fn more_invalid_cases(
    tools: &Record,
    decision: &Record,
    note: &Record,
    rotation: &Record,
) -> Vec<(&'static str, &'static str, &'static str, Value, bool)> {
    let edit = |r: &Record, f: &dyn Fn(&mut Value)| {
        let mut v = to_value(r);
        f(&mut v);
        v
    };
    let text = |r: &Record| String::from_utf8(r.canonical_bytes().to_vec()).expect("utf-8");
    let note_text = text(note);
    let deep = format!("{}1{}", "[".repeat(16), "]".repeat(16));
    let big_tools: Vec<Value> = (0..MAX_TOOLS_PER_RECORD)
        .map(|i| {
            let h = Hash::sha256(&[i as u8]).to_hex();
            json!({
                "name": format!("{i:02}{}", "t".repeat(254)),
                "recorded": true,
                "digest": h,
                "parts": {"title": h, "description": h, "input_schema": h,
                          "output_schema": h, "annotations": h, "meta": h},
            })
        })
        .collect();
    vec![
        (
            "refused-lease-without-source",
            "a tools record with lease_ms and no source (protocol.md §5.3)",
            "invalid_field",
            edit(tools, &|v| v["body"]["lease_ms"] = json!(60_000)),
            true,
        ),
        (
            "refused-lease-below-its-range",
            "a tools record of source crm with lease_ms 999, below 1,000 (protocol.md §5.3)",
            "invalid_field",
            edit(tools, &|v| {
                v["body"]["source"] = json!("crm");
                v["body"]["lease_ms"] = json!(999);
            }),
            true,
        ),
        (
            "refused-non-finite-number",
            "seq written as 1e400, which is not a finite double",
            "non_finite_number",
            Value::String(note_text.replacen("\"seq\":5", "\"seq\":1e400", 1)),
            true,
        ),
        (
            "refused-too-deep",
            "the note text replaced by arrays nested 16 deep: 18 levels with the record and body, over the limit of 16",
            "too_deep",
            Value::String(
                String::from_utf8(
                    canonicalize(&edit(note, &|v| {
                        v["body"]["text"] = serde_json::from_str(&deep).expect("json");
                    }))
                    .expect("canonical"),
                )
                .expect("utf-8"),
            ),
            true,
        ),
        (
            "refused-too-large",
            "a tools record of 48 tools with 256-byte names and every part digest: its canonical form is over 32,768 bytes",
            "too_large",
            Value::String(
                String::from_utf8(
                    canonicalize(&edit(tools, &|v| v["body"]["tools"] = json!(big_tools)))
                        .expect("canonical"),
                )
                .expect("utf-8"),
            ),
            true,
        ),
        (
            "refused-control-character-in-name",
            "a decision whose tool name holds U+0007",
            "invalid_field",
            edit(decision, &|v| v["body"]["tool"] = json!("lookup\u{7}claim")),
            true,
        ),
        (
            "refused-control-character-in-note",
            "a note whose text holds U+001B (newline and tab are the only controls allowed)",
            "invalid_field",
            edit(note, &|v| v["body"]["text"] = json!("colour \u{1b}[31m red")),
            false,
        ),
        (
            "refused-bad-agent-name",
            "an agent name that starts with a dash",
            "schema",
            edit(note, &|v| v["agent"] = json!("-claims-bot")),
            true,
        ),
        (
            "refused-too-many-tools",
            "a tools record listing 49 tools (at most 48 per record)",
            "invalid_field",
            edit(tools, &|v| {
                let one = v["body"]["tools"][0].clone();
                v["body"]["tools"] = Value::Array(
                    (0..=MAX_TOOLS_PER_RECORD)
                        .map(|i| {
                            let mut t = one.clone();
                            t["name"] = json!(format!("tool-{i}"));
                            t
                        })
                        .collect(),
                );
            }),
            true,
        ),
        (
            "refused-part-not-below-parts",
            "a tools record claiming part 1 of a 1-part list",
            "invalid_field",
            edit(tools, &|v| v["body"]["part"] = json!(1)),
            false,
        ),
        (
            "refused-key-rotation-id-mismatch",
            "a key_rotation whose new_key_id is not the id of new_public_key",
            "invalid_field",
            edit(rotation, &|v| {
                v["body"]["new_key_id"] = json!(agent_key().public_key().key_id().to_hex());
            }),
            false,
        ),
    ]
}

/// The second chain, of agent `tool-bot`: a tool list in two parts, then a
/// decision and an outcome for each outcome status beyond ok and error, then
/// a one-part list of a named source with a lease.
fn build_second_chain() -> (Vec<Record>, Vec<(String, Record)>) {
    let mut chain = Chain {
        agent: "tool-bot",
        records: Vec::new(),
        key: agent_key(),
    };
    let entries: Vec<ToolEntry> = tool_definitions()
        .iter()
        .map(|d| {
            let (name, digest, parts) = digest_tool_definition(d).expect("valid definition");
            ToolEntry {
                recorded: true,
                name,
                digest,
                parts,
            }
        })
        .collect();
    let mut fixtures = Vec::new();
    for (part, tools) in [entries[..2].to_vec(), entries[2..].to_vec()]
        .into_iter()
        .enumerate()
    {
        let r = chain.push(
            part as i64,
            Body::Tools(ToolList {
                list_id: "list-2".into(),
                part: part as u32,
                parts: 2,
                tools,
                source: None,
                lease_ms: None,
            }),
        );
        fixtures.push((format!("tools-part-{part}-of-2"), r));
    }
    let statuses = [
        (OutcomeStatus::Cancelled, "cancelled"),
        (OutcomeStatus::ServerExited, "server-exited"),
        (OutcomeStatus::ClientGone, "client-gone"),
        (OutcomeStatus::Timeout, "timeout"),
        (OutcomeStatus::NotRun, "not-run"),
        (OutcomeStatus::HttpError, "http-error"),
    ];
    for (i, (status, name)) in statuses.into_iter().enumerate() {
        let call_id = format!("s{i}");
        let ms = 1000 * (i as i64 + 1);
        let decision = chain.push(
            ms,
            Body::Decision(Decision {
                call_id: call_id.clone(),
                tool: "lookup_claim".into(),
                input_hash: salted_hash(&salt(10 + i as u8), b"{}"),
            }),
        );
        let outcome = chain.push(
            ms + 100,
            Body::Outcome(Outcome {
                call_id,
                decision: decision.hash(),
                status,
                output_hash: None,
                state: None,
                proof: None,
                proof_hash: None,
            }),
        );
        fixtures.push((format!("outcome-{name}"), outcome));
    }
    // A list of a named tool source with its lease (protocol.md §5.3): the
    // members in JCS order, lease_ms first and source after parts.
    let named = chain.push(
        10_000,
        Body::Tools(ToolList {
            list_id: "list-3".into(),
            part: 0,
            parts: 1,
            tools: entries[..1].to_vec(),
            source: Some("claims-gateway".into()),
            lease_ms: Some(3_600_000),
        }),
    );
    fixtures.push(("tools-named-source".into(), named));
    // An action tool's outcomes (protocol.md §5.2): posted with the proof's
    // salted hash (the proof as a JSON string), posted with the proof in
    // clear; then a claim (§5.6) whose turn hash is the text's salted hash.
    let proof = canonicalize(&json!("msg-0042")).expect("canonical");
    for (i, (name, clear)) in [
        ("outcome-posted-proof-hash", false),
        ("outcome-posted-proof", true),
    ]
    .into_iter()
    .enumerate()
    {
        let call_id = format!("a{i}");
        let ms = 11_000 + 1000 * i as i64;
        let decision = chain.push(
            ms,
            Body::Decision(Decision {
                call_id: call_id.clone(),
                tool: "send_notification".into(),
                input_hash: salted_hash(&salt(20 + i as u8), b"{}"),
            }),
        );
        let outcome = chain.push(
            ms + 100,
            Body::Outcome(Outcome {
                call_id,
                decision: decision.hash(),
                status: OutcomeStatus::Ok,
                output_hash: None,
                state: Some(ActionState::Posted),
                proof: clear.then(|| "msg-0042".into()),
                proof_hash: (!clear).then(|| salted_hash(&salt(30), &proof)),
            }),
        );
        fixtures.push((name.into(), outcome));
    }
    let turn = canonicalize(&json!("I've sent the email to the customer")).expect("canonical");
    let claim = chain.push(
        14_000,
        Body::Claim(Claim {
            tool: "send_notification".into(),
            turn_hash: salted_hash(&salt(31), &turn),
        }),
    );
    fixtures.push(("claim".into(), claim));
    (chain.records, fixtures)
}

/// hashes/: salted content hashes and tool definition digests.
fn write_hashes(dir: &Path) {
    let salted = [
        (
            "salted-hash-input",
            "the salted hash of a tool call's arguments: SHA-256(salt || JCS(arguments))",
            salt(3),
            json!({"id": "C-1001", "amount": 42.5, "note": null}),
        ),
        (
            "salted-hash-output",
            "the salted hash of a result whose canonical form escapes and reorders: SHA-256(salt || JCS(result))",
            salt(4),
            json!({"isError": false, "content": [{"type": "text", "text": "caf\u{e9} \"quoted\"\n\u{1f}", "n": 1e21}]}),
        ),
        (
            "salted-hash-proof",
            "the salted hash of an action's proof (protocol.md §5.2): the proof as a JSON string",
            salt(30),
            json!("msg-0042"),
        ),
        (
            "salted-hash-claim-turn",
            "the salted hash of a claim's turn (protocol.md §5.6): the turn's text as a JSON string",
            salt(31),
            json!("I've sent the email to the customer"),
        ),
    ];
    for (name, description, salt, content) in salted {
        let canonical = canonicalize(&content).expect("canonical");
        write(
            dir,
            &format!("{name}.json"),
            &json!({
                "description": description,
                "expect": "valid",
                "salt_hex": hex::encode(salt),
                "content": content,
                "canonical_content": String::from_utf8(canonical.clone()).expect("utf-8"),
                "hash": salted_hash(&salt, &canonical).to_hex(),
            }),
        );
    }
    let definitions = [
        (
            "tool-digest-full",
            "an MCP tool definition with every digested part, and a member (icons) that counts only in the whole digest",
            json!({
                "name": "refund",
                "title": "Refund a claim",
                "description": "Refund part or all of a claim.",
                "inputSchema": {"type": "object", "properties": {"id": {"type": "string"}, "amount": {"type": "number", "minimum": 0.01}}, "required": ["id"]},
                "outputSchema": {"type": "object", "properties": {"refunded": {"type": "number"}}},
                "annotations": {"destructiveHint": true, "idempotentHint": false},
                "_meta": {"vendor.example/tier": "gold"},
                "icons": [{"src": "https://example.invalid/r.png"}],
            }),
        ),
        (
            "tool-digest-minimal",
            "an MCP tool definition with a name and an input schema only: absent parts have no digest",
            json!({"name": "ping", "inputSchema": {"type": "object"}}),
        ),
    ];
    for (name, description, definition) in definitions {
        let (tool, digest, parts) = digest_tool_definition(&definition).expect("valid");
        write(
            dir,
            &format!("{name}.json"),
            &json!({
                "description": description,
                "expect": "valid",
                "definition": definition,
                "canonical": String::from_utf8(canonicalize(&definition).expect("c")).expect("utf-8"),
                "name": tool,
                "digest": digest.to_hex(),
                "parts": to_value(&parts),
            }),
        );
    }
}

/// The golden pack: the golden chain's 8 records, every one witnessed
/// with its receipt, under the checkpoint of size 8, receipts issued in two
/// batches; with its agent-keys.json (the rotation's two keys, their
/// validity ranges meeting), head.json and the log's vkey.
pub struct GoldenPack {
    /// pack.jsonl.
    pub pack: Vec<u8>,
    /// agent-keys.json.
    pub keys: AgentKeys,
    /// head.json: the same checkpoint, so it proves the pack's end.
    pub head: Head,
    /// The log key.
    pub vkey: String,
}

/// Pretty JSON of a document with a final newline, as the golden files are
/// written.
#[must_use]
pub fn pretty<T: serde::Serialize>(value: &T) -> Vec<u8> {
    let mut text = serde_json::to_string_pretty(&to_value(value)).expect("json");
    text.push('\n');
    text.into_bytes()
}

/// The log of the golden chain: one entry per record, received 150 ms after
/// its time.
fn golden_log(chain: &Chain) -> (Vec<Entry>, Vec<Hash>) {
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
    (entries, leaves)
}

/// The golden pack (the conformance corpus's `golden-pack` case).
///
/// # Panics
/// Never: every value is fixed and valid.
#[must_use]
pub fn golden_pack() -> GoldenPack {
    let chain = build_chain();
    let signer = log_signer();
    let (entries, leaves) = golden_log(&chain);
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

    GoldenPack {
        pack,
        keys,
        head,
        vkey: signer.verifier().vkey(),
    }
}

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
