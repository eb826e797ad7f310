//! The golden chains: the records the vectors are cut from.

use serde_json::{json, Value};
use tally_schemas::canonical::canonicalize;
use tally_schemas::hash::salted_hash;
use tally_schemas::record::{
    ActionState, Claim, Decision, KeyRotation, NoteBody, Outcome, OutcomeStatus, ToolEntry,
    ToolList,
};
use tally_schemas::tools::digest_tool_definition;
use tally_schemas::{AgentName, Body, Record, SecretKey, Seq, UnixMillis, UnsignedRecord};

use super::fixtures::*;

pub(super) struct Chain {
    pub(super) agent: &'static str,
    pub(super) records: Vec<Record>,
    pub(super) key: SecretKey,
}

impl Chain {
    pub(super) fn push(&mut self, ms: i64, body: Body) -> Record {
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

pub(super) fn build_chain() -> Chain {
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

/// The second chain, of agent `tool-bot`: a tool list in two parts, then a
/// decision and an outcome for each outcome status beyond ok and error, then
/// a one-part list of a named source with a lease.
pub(super) fn build_second_chain() -> (Vec<Record>, Vec<(String, Record)>) {
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
