//! The document size limits of docs/protocol.md §10 against the documents
//! they bound: each test builds the largest document the other limits allow
//! (4,096 agents with 64-byte names, 64 keys each, records of
//! `MAX_RECORD_BYTES`, proofs of `MAX_PROOF_HASHES` hashes, the largest
//! counters and times) and shows that it parses and is under its limit; then
//! that the count and uniqueness rules refuse with their typed errors.
//!
//! The origin and checkpoint strings are taken at `MAX_CHECKPOINT_NOTE_BYTES`
//! with every byte escaped as `\u00XX`: more than any real checkpoint note can
//! take on the wire, so the bound holds for every real document. head.json's
//! checkpoint must be a well-formed note (§9.4), so its worst case is the
//! valid note that takes the most bytes in JSON.

use tally_schemas::canonical::{canonicalize, CanonicalError};
use tally_schemas::hash::Hash;
use tally_schemas::limits::{
    MAX_AGENTS_PER_PACK, MAX_AGENT_KEYS_BYTES, MAX_AGENT_NAME_BYTES, MAX_COUNTER, MAX_HEAD_BYTES,
    MAX_KEYS_PER_AGENT, MAX_NAME_BYTES, MAX_NONCE_BYTES, MAX_PACK_HEADER_BYTES, MAX_PROOF_HASHES,
    MAX_RECORD_BYTES, MAX_TOOLS_PER_RECORD, MAX_WIRE_OBJECT_BYTES,
};
use tally_schemas::note::{Checkpoint, NoteSigner, MAX_CHECKPOINT_NOTE_BYTES};
use tally_schemas::pack::{
    AgentKey, AgentKeyList, AgentKeys, Head, HeadAgent, PackAgent, PackEnd, PackError, PackHeader,
    PackLine, Witnessed, PACK_VERSION,
};
use tally_schemas::record::{NoteBody, ToolEntry, ToolList, ToolPartDigests};
use tally_schemas::time::MAX_TIME;
use tally_schemas::{
    AgentName, Body, LeafIndex, Nonce, Record, SecretKey, Seq, TreeSize, UnsignedRecord,
};

/// A string of `MAX_CHECKPOINT_NOTE_BYTES` characters that each take six
/// bytes in JSON.
fn worst_string() -> String {
    "\u{1}".repeat(MAX_CHECKPOINT_NOTE_BYTES)
}

/// The `i`th agent name, `MAX_AGENT_NAME_BYTES` long.
fn agent(i: usize) -> AgentName {
    AgentName::new(&format!("{i:0width$}", width = MAX_AGENT_NAME_BYTES)).unwrap()
}

fn max_seq() -> Seq {
    Seq::new(MAX_COUNTER).unwrap()
}

fn proof() -> Vec<Hash> {
    (0..MAX_PROOF_HASHES)
        .map(|i| Hash::sha256(&i.to_be_bytes()))
        .collect()
}

#[test]
fn worst_case_pack_header_fits_its_limit() {
    let header = PackLine::Header(PackHeader {
        v: PACK_VERSION,
        origin: worst_string(),
        checkpoint: worst_string(),
        created: MAX_TIME,
        agents: (0..MAX_AGENTS_PER_PACK)
            .map(|i| PackAgent {
                agent: agent(i),
                first_seq: max_seq(),
                last_seq: max_seq(),
            })
            .collect(),
    });
    let bytes = header.to_json().unwrap();
    eprintln!("worst-case pack header line: {} bytes", bytes.len());
    assert!(bytes.len() > MAX_WIRE_OBJECT_BYTES);
    assert!(bytes.len() <= MAX_PACK_HEADER_BYTES, "{}", bytes.len());
    assert_eq!(PackLine::from_json(&bytes), Ok(header));

    // One byte over the header limit is refused before decoding; any other
    // line keeps the wire limit.
    let mut over = bytes.clone();
    over.resize(MAX_PACK_HEADER_BYTES + 1, b' ');
    assert_eq!(
        PackLine::from_json(&over),
        Err(PackError::Canonical(CanonicalError::TooLarge {
            size: MAX_PACK_HEADER_BYTES + 1,
            max: MAX_PACK_HEADER_BYTES
        }))
    );
    let mut end = PackLine::End(PackEnd {
        checkpoints: 0,
        records: 0,
    })
    .to_json()
    .unwrap();
    let at_limit = end.len() + (MAX_WIRE_OBJECT_BYTES - end.len());
    end.resize(at_limit, b' ');
    assert!(PackLine::from_json(&end).is_ok());
    end.push(b' ');
    assert_eq!(
        PackLine::from_json(&end),
        Err(PackError::Canonical(CanonicalError::TooLarge {
            size: MAX_WIRE_OBJECT_BYTES + 1,
            max: MAX_WIRE_OBJECT_BYTES
        }))
    );
}

fn keys() -> Vec<AgentKey> {
    (0..MAX_KEYS_PER_AGENT)
        .map(|i| {
            let public_key = SecretKey::from_seed(&[u8::try_from(i).unwrap(); 32]).public_key();
            AgentKey {
                key_id: public_key.key_id(),
                public_key,
                not_before: MAX_TIME,
                not_after: Some(MAX_TIME),
            }
        })
        .collect()
}

fn agent_keys(agents: usize, keys_per_agent: usize) -> AgentKeys {
    let keys = keys();
    AgentKeys {
        v: PACK_VERSION,
        origin: worst_string(),
        agents: (0..agents)
            .map(|i| AgentKeyList {
                agent: agent(i),
                keys: keys.iter().cycle().take(keys_per_agent).cloned().collect(),
            })
            .collect(),
    }
}

#[test]
fn worst_case_agent_keys_fits_its_limit() {
    let doc = agent_keys(MAX_AGENTS_PER_PACK, MAX_KEYS_PER_AGENT);
    let bytes = canonicalize(&doc).unwrap();
    eprintln!("worst-case agent-keys.json: {} bytes", bytes.len());
    assert!(bytes.len() <= MAX_AGENT_KEYS_BYTES, "{}", bytes.len());
    assert_eq!(AgentKeys::from_json(&bytes), Ok(doc));
}

#[test]
fn agent_keys_refuses_too_many_and_duplicates() {
    let refuse = |doc: &AgentKeys| AgentKeys::from_json(&canonicalize(doc).unwrap()).unwrap_err();
    assert_eq!(
        refuse(&agent_keys(MAX_AGENTS_PER_PACK + 1, 1)),
        PackError::TooManyAgents {
            what: "agent-keys",
            count: MAX_AGENTS_PER_PACK + 1,
            max: MAX_AGENTS_PER_PACK
        }
    );
    assert_eq!(
        refuse(&agent_keys(2, MAX_KEYS_PER_AGENT + 1)),
        PackError::TooManyKeys {
            agent: agent(0),
            count: MAX_KEYS_PER_AGENT + 1,
            max: MAX_KEYS_PER_AGENT
        }
    );
    let mut twice = agent_keys(3, 2);
    twice.agents[2].agent = agent(0);
    assert_eq!(
        refuse(&twice),
        PackError::DuplicateAgent {
            what: "agent-keys",
            agent: agent(0)
        }
    );
    let mut same_key = agent_keys(2, 3);
    same_key.agents[1].keys[2] = same_key.agents[1].keys[0].clone();
    same_key.agents[1].keys[2].not_after = None;
    let e = refuse(&same_key);
    assert_eq!(
        e,
        PackError::DuplicateKeyId {
            agent: agent(1),
            key_id: same_key.agents[1].keys[0].key_id
        }
    );
    assert_eq!(e.code(), "duplicate_key_id");
}

/// A `tools` record of `agent` whose canonical form is `extra` bytes longer
/// than the same record with the shortest tool names.
fn tools_record(agent: AgentName, extra: usize, key: &SecretKey) -> Record {
    let mut left = extra;
    let tools = (0..MAX_TOOLS_PER_RECORD)
        .map(|i| {
            let prefix = format!("{i:02}");
            let pad = left.min(MAX_NAME_BYTES - prefix.len());
            left -= pad;
            let h = Hash::sha256(prefix.as_bytes());
            ToolEntry {
                name: format!("{prefix}{}", "x".repeat(pad)),
                recorded: true,
                digest: h,
                parts: ToolPartDigests {
                    title: Some(h),
                    description: Some(h),
                    input_schema: Some(h),
                    output_schema: Some(h),
                    annotations: Some(h),
                    meta: Some(h),
                },
            }
        })
        .collect();
    assert_eq!(left, 0, "no room for {extra} more bytes");
    UnsignedRecord {
        agent,
        key_id: key.public_key().key_id(),
        seq: max_seq(),
        prev: Some(Hash::sha256(b"prev")),
        time: MAX_TIME,
        nonce: Nonce::from_bytes(vec![0xab; MAX_NONCE_BYTES]).unwrap(),
        body: Body::Tools(ToolList {
            list_id: "l".repeat(MAX_NAME_BYTES),
            part: 0,
            parts: 1,
            tools,
            source: None,
            lease_ms: None,
        }),
    }
    .sign(key)
    .unwrap()
}

/// The signed checkpoint note that takes the most bytes in JSON: head.json
/// refuses a note that breaks §7.4 (a control character, say), so its worst
/// case is a valid note of `MAX_CHECKPOINT_NOTE_BYTES` whose extension line
/// is all `"`, two bytes each in JSON.
fn worst_note() -> String {
    let signer = NoteSigner::from_secret("o", SecretKey::from_seed(&[2; 32])).expect("valid name");
    let cp = Checkpoint::new("o", TreeSize::new(MAX_COUNTER), Hash::sha256(b"root"));
    let short = signer.sign_checkpoint(&cp).unwrap();
    let mut cp = cp;
    // One extension line of `n` quotes adds `n + 1` bytes to the note.
    cp.extensions = vec!["\"".repeat(MAX_CHECKPOINT_NOTE_BYTES - short.len() - 1)];
    let note = signer.sign_checkpoint(&cp).unwrap();
    assert_eq!(note.len(), MAX_CHECKPOINT_NOTE_BYTES);
    note
}

fn head(records: Vec<Record>) -> Head {
    Head {
        v: PACK_VERSION,
        checkpoint: worst_note(),
        from_size: TreeSize::new(MAX_COUNTER),
        consistency: proof(),
        agents: records
            .into_iter()
            .map(|record| HeadAgent {
                record,
                witnessed: Witnessed {
                    index: LeafIndex::new(MAX_COUNTER),
                    received: MAX_TIME,
                    inclusion: proof(),
                },
            })
            .collect(),
    }
}

/// `JCS(head)`, written from the records' canonical bytes (as export does)
/// rather than re-serialised: the same bytes (checked below on a small head),
/// in a fraction of the time at 150 MB.
fn head_bytes(doc: &Head) -> Vec<u8> {
    let mut out = b"{\"agents\":[".to_vec();
    for (i, a) in doc.agents.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"record\":");
        out.extend_from_slice(a.record.canonical_bytes());
        out.extend_from_slice(b",\"witnessed\":");
        out.extend_from_slice(&canonicalize(&a.witnessed).unwrap());
        out.push(b'}');
    }
    let rest = canonicalize(&serde_json::json!({
        "checkpoint": doc.checkpoint,
        "consistency": doc.consistency,
        "from_size": doc.from_size,
        "v": doc.v,
    }))
    .unwrap();
    out.extend_from_slice(b"],");
    out.extend_from_slice(&rest[1..]);
    out
}

#[test]
fn worst_case_head_fits_its_limit() {
    let key = SecretKey::from_seed(&[7; 32]);
    let base = tools_record(agent(0), 0, &key).canonical_bytes().len();
    let extra = MAX_RECORD_BYTES - base;
    let small = head(vec![
        tools_record(agent(0), extra, &key),
        tools_record(agent(1), 0, &key),
    ]);
    assert_eq!(head_bytes(&small), canonicalize(&small).unwrap());

    let records: Vec<Record> = (0..MAX_AGENTS_PER_PACK)
        .map(|i| tools_record(agent(i), extra, &key))
        .collect();
    assert!(records
        .iter()
        .all(|r| r.canonical_bytes().len() == MAX_RECORD_BYTES));
    let doc = head(records);
    let bytes = head_bytes(&doc);
    eprintln!("worst-case head.json: {} bytes", bytes.len());
    assert!(bytes.len() <= MAX_HEAD_BYTES, "{}", bytes.len());
    assert_eq!(Head::from_json(&bytes), Ok(doc));
}

/// A small record of `agent`.
fn note_record(agent: AgentName, key: &SecretKey) -> Record {
    UnsignedRecord {
        agent,
        key_id: key.public_key().key_id(),
        seq: Seq::GENESIS,
        prev: None,
        time: MAX_TIME,
        nonce: Nonce::from_bytes(vec![1; 16]).unwrap(),
        body: Body::Note(NoteBody { text: "n".into() }),
    }
    .sign(key)
    .unwrap()
}

#[test]
fn head_refuses_too_many_and_duplicate_agents() {
    let key = SecretKey::from_seed(&[7; 32]);
    let one = note_record(agent(0), &key);
    let bytes = canonicalize(&head(vec![one.clone(); MAX_AGENTS_PER_PACK + 1])).unwrap();
    assert_eq!(
        Head::from_json(&bytes),
        Err(PackError::TooManyAgents {
            what: "head",
            count: MAX_AGENTS_PER_PACK + 1,
            max: MAX_AGENTS_PER_PACK
        })
    );
    let other = note_record(agent(1), &key);
    let bytes = canonicalize(&head(vec![one.clone(), other, one])).unwrap();
    let e = Head::from_json(&bytes).unwrap_err();
    assert_eq!(
        e,
        PackError::DuplicateAgent {
            what: "head",
            agent: agent(0)
        }
    );
    assert_eq!(e.code(), "duplicate_agent");
}
