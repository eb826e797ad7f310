//! Property tests: canonicalisation is idempotent; records of every kind,
//! entries, receipts, pack lines, agent-keys.json and head.json survive
//! parse(serialize(x)) unchanged; and proofs made by the naive RFC 9162 tree
//! always check while any altered proof does not.

use proptest::prelude::*;
use serde_json::{Map, Number, Value};
use tally_schemas::canonical::{canonicalize, parse_strict, Limits, MAX_SAFE_INTEGER};
use tally_schemas::hash::leaf_hash;
use tally_schemas::pack::{
    AgentKey, AgentKeyList, AgentKeys, Head, HeadAgent, PackAgent, PackCheckpoint, PackEnd,
    PackHeader, PackLine, PackReceipt, PackRecord, Witnessed, PACK_VERSION,
};
use tally_schemas::record::{
    Decision, KeyRotation, NoteBody, Outcome, OutcomeStatus, ToolEntry, ToolList, ToolPartDigests,
};
use tally_schemas::tree::{reference, verify_consistency, verify_inclusion, LeafIndex, TreeSize};
use tally_schemas::{
    AgentName, Body, Checkpoint, Entry, Hash, Nonce, NoteSigner, Receipt, Record, SecretKey, Seq,
    UnixMillis, UnsignedRecord,
};

const LIMITS: Limits = Limits {
    max_bytes: 1 << 20,
    max_depth: 16,
};

fn json_value() -> impl Strategy<Value = Value> {
    let safe = MAX_SAFE_INTEGER as i64;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-safe..=safe).prop_map(|n| Value::Number(n.into())),
        any::<f64>()
            // JCS writes integral doubles below 1e21 as integer literals,
            // and those beyond 2^53-1 are refused by design.
            .prop_filter("finite, and not an integer beyond 2^53-1", |f| {
                f.is_finite() && !(f.fract() == 0.0 && f.abs() > MAX_SAFE_INTEGER as f64)
            })
            .prop_map(|f| Value::Number(Number::from_f64(f).expect("finite"))),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn hash() -> impl Strategy<Value = Hash> {
    any::<[u8; 32]>().prop_map(Hash::from_bytes)
}

fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9_ ./:-]{1,40}"
}

fn body() -> impl Strategy<Value = Body> {
    prop_oneof![
        (text(), text(), hash()).prop_map(|(call_id, tool, input_hash)| Body::Decision(Decision {
            call_id,
            tool,
            input_hash
        })),
        (text(), hash(), 0usize..8, proptest::option::of(hash())).prop_map(
            |(call_id, decision, s, output_hash)| {
                let status = [
                    OutcomeStatus::Ok,
                    OutcomeStatus::Error,
                    OutcomeStatus::Cancelled,
                    OutcomeStatus::ServerExited,
                    OutcomeStatus::ClientGone,
                    OutcomeStatus::Timeout,
                    OutcomeStatus::HttpError,
                    OutcomeStatus::NotRun,
                ][s];
                Body::Outcome(Outcome {
                    call_id,
                    decision,
                    status,
                    output_hash,
                    state: None,
                    proof: None,
                    proof_hash: None,
                })
            }
        ),
        "[^\\x00-\\x08\\x0b-\\x1f\\x7f-\\u{9f}]{1,200}"
            .prop_map(|text| Body::Note(NoteBody { text })),
        tool_list().prop_map(Body::Tools),
        any::<[u8; 32]>().prop_map(|seed| {
            let new_public_key = SecretKey::from_seed(&seed).public_key();
            Body::KeyRotation(KeyRotation {
                new_key_id: new_public_key.key_id(),
                new_public_key,
            })
        }),
    ]
}

fn part_digests() -> impl Strategy<Value = ToolPartDigests> {
    let part = || proptest::option::of(hash());
    (part(), part(), part(), part(), part(), part()).prop_map(
        |(title, description, input_schema, output_schema, annotations, meta)| ToolPartDigests {
            title,
            description,
            input_schema,
            output_schema,
            annotations,
            meta,
        },
    )
}

/// One part of a tool list: names unique (a map), part below parts, and
/// a lease only beside a source (docs/protocol.md §5.3).
fn tool_list() -> impl Strategy<Value = ToolList> {
    (
        text(),
        1u32..=64,
        any::<u32>(),
        prop::collection::btree_map(text(), (any::<bool>(), hash(), part_digests()), 0..6),
        proptest::option::of((text(), proptest::option::of(1_000u64..=86_400_000))),
    )
        .prop_map(|(list_id, parts, part, tools, source)| ToolList {
            list_id,
            part: part % parts,
            parts,
            tools: tools
                .into_iter()
                .map(|(name, (recorded, digest, parts))| ToolEntry {
                    name,
                    recorded,
                    digest,
                    parts,
                })
                .collect(),
            lease_ms: source.as_ref().and_then(|(_, lease)| *lease),
            source: source.map(|(name, _)| name),
        })
}

fn record() -> impl Strategy<Value = Record> {
    (
        any::<[u8; 32]>(),
        "[a-z0-9][a-z0-9._-]{0,20}",
        0u64..1_000_000,
        hash(),
        0i64..=253_402_300_799_999,
        prop::collection::vec(any::<u8>(), 16..=64),
        body(),
    )
        .prop_map(|(seed, agent, seq, prev, time, nonce, body)| {
            let key = SecretKey::from_seed(&seed);
            UnsignedRecord {
                agent: AgentName::new(&agent).expect("pattern matches the rule"),
                key_id: key.public_key().key_id(),
                seq: Seq::new(seq).expect("small"),
                prev: (seq > 0).then_some(prev),
                time: UnixMillis::new(time),
                nonce: Nonce::from_bytes(nonce).expect("16..=64"),
                body,
            }
            .sign(&key)
            .expect("valid by construction")
        })
}

fn time() -> impl Strategy<Value = UnixMillis> {
    (0i64..=253_402_300_799_999).prop_map(UnixMillis::new)
}

fn counter() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..1_000_000, Just(MAX_SAFE_INTEGER)]
}

fn proof() -> impl Strategy<Value = Vec<Hash>> {
    prop::collection::vec(hash(), 0..8)
}

fn nonce() -> impl Strategy<Value = Nonce> {
    prop::collection::vec(any::<u8>(), 16..=64).prop_map(|b| Nonce::from_bytes(b).expect("16..=64"))
}

fn agent() -> impl Strategy<Value = AgentName> {
    "[a-zA-Z0-9][a-zA-Z0-9._-]{0,63}".prop_map(|a| AgentName::new(&a).expect("valid"))
}

/// Any string: checkpoint notes and origins are not opened when a document
/// is parsed, only when it is checked.
fn note_text() -> impl Strategy<Value = String> {
    any::<String>()
}

fn witnessed() -> impl Strategy<Value = Witnessed> {
    (counter(), time(), proof()).prop_map(|(index, received, inclusion)| Witnessed {
        index: LeafIndex::new(index),
        received,
        inclusion,
    })
}

fn entry() -> impl Strategy<Value = Entry> {
    (counter(), time(), record()).prop_map(|(index, received, record)| {
        Entry::new(LeafIndex::new(index), received, record).expect("a record fits an entry")
    })
}

fn receipt() -> impl Strategy<Value = Receipt> {
    (hash(), nonce(), counter(), time(), note_text(), proof()).prop_map(
        |(record_hash, nonce, index, received, checkpoint, inclusion)| Receipt {
            v: 1,
            record_hash,
            nonce,
            index: LeafIndex::new(index),
            received,
            checkpoint,
            inclusion,
        },
    )
}

fn pack_line() -> impl Strategy<Value = PackLine> {
    prop_oneof![
        (
            note_text(),
            note_text(),
            time(),
            prop::collection::btree_map(agent(), (counter(), counter()), 0..5)
        )
            .prop_map(|(origin, checkpoint, created, agents)| {
                PackLine::Header(PackHeader {
                    v: PACK_VERSION,
                    origin,
                    checkpoint,
                    created,
                    agents: agents
                        .into_iter()
                        .map(|(agent, (a, b))| PackAgent {
                            agent,
                            first_seq: Seq::new(a.min(b)).expect("bounded"),
                            last_seq: Seq::new(a.max(b)).expect("bounded"),
                        })
                        .collect(),
                })
            }),
        (note_text(), proof()).prop_map(|(checkpoint, consistency)| {
            PackLine::Checkpoint(PackCheckpoint {
                checkpoint,
                consistency,
            })
        }),
        (
            record(),
            proptest::option::of(witnessed()),
            proptest::option::of((hash(), nonce(), counter(), counter()))
        )
            .prop_map(|(record, witnessed, receipt)| {
                PackLine::Record(Box::new(PackRecord {
                    record,
                    witnessed,
                    receipt: receipt.map(|(record_hash, nonce, index, size)| PackReceipt {
                        record_hash,
                        nonce,
                        index: LeafIndex::new(index),
                        tree_size: TreeSize::new(size),
                    }),
                }))
            }),
        (any::<u32>(), any::<u32>()).prop_map(|(checkpoints, records)| {
            PackLine::End(PackEnd {
                checkpoints: checkpoints.into(),
                records: records.into(),
            })
        }),
    ]
}

fn agent_keys() -> impl Strategy<Value = AgentKeys> {
    let key = (any::<[u8; 32]>(), time(), proptest::option::of(time())).prop_map(
        |(seed, not_before, not_after)| {
            let public_key = SecretKey::from_seed(&seed).public_key();
            AgentKey {
                key_id: public_key.key_id(),
                public_key,
                not_before,
                not_after,
            }
        },
    );
    (
        note_text(),
        // Keyed by agent name and by seed, so that names and key ids are
        // unique as the parser requires.
        prop::collection::btree_map(
            agent(),
            prop::collection::btree_map(any::<[u8; 32]>(), key, 0..4),
            0..4,
        ),
    )
        .prop_map(|(origin, agents)| AgentKeys {
            v: PACK_VERSION,
            origin,
            agents: agents
                .into_iter()
                .map(|(agent, keys)| AgentKeyList {
                    agent,
                    keys: keys.into_values().collect(),
                })
                .collect(),
        })
}

/// A well-formed signed checkpoint note (head.json refuses any other, §9.4).
fn checkpoint_note() -> impl Strategy<Value = String> {
    (
        counter(),
        hash(),
        prop::collection::vec("[ -~]{1,20}", 0..3),
    )
        .prop_map(|(size, root, extensions)| {
            let signer = NoteSigner::from_secret("log.example/p", SecretKey::from_seed(&[4; 32]))
                .expect("valid name");
            let mut cp = Checkpoint::new("log.example/p", TreeSize::new(size), root);
            cp.extensions = extensions;
            signer
                .sign_checkpoint(&cp)
                .expect("origin is the key's name")
        })
}

fn head() -> impl Strategy<Value = Head> {
    (
        checkpoint_note(),
        counter(),
        proof(),
        prop::collection::btree_map(agent(), (record(), witnessed()), 0..3),
    )
        .prop_map(|(checkpoint, from_size, consistency, agents)| Head {
            v: PACK_VERSION,
            checkpoint,
            from_size: TreeSize::new(from_size),
            consistency,
            agents: agents
                .into_iter()
                .map(|(agent, (record, witnessed))| HeadAgent {
                    // The record is re-signed under the map's agent name so
                    // that the head lists each agent once.
                    record: rename(&record, agent),
                    witnessed,
                })
                .collect(),
        })
}

/// `record` as made by `agent` (signed again with a fixed key).
fn rename(record: &Record, agent: AgentName) -> Record {
    let mut unsigned = record.unsigned().clone();
    unsigned.agent = agent;
    unsigned
        .sign(&SecretKey::from_seed(&[9; 32]))
        .expect("still valid")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn entries_survive_parse_of_serialize(e in entry()) {
        prop_assert_eq!(&Entry::from_json(e.canonical_bytes()).unwrap(), &e);
        let pretty = serde_json::to_vec_pretty(&e).unwrap();
        prop_assert_eq!(&Entry::from_json(&pretty).unwrap(), &e);
    }

    #[test]
    fn receipts_survive_parse_of_serialize(r in receipt()) {
        let bytes = canonicalize(&r).unwrap();
        prop_assert_eq!(&Receipt::from_json(&bytes).unwrap(), &r);
    }

    #[test]
    fn pack_lines_survive_parse_of_serialize(l in pack_line()) {
        let bytes = l.to_json().unwrap();
        let parsed = PackLine::from_json(&bytes).unwrap();
        prop_assert_eq!(&parsed, &l);
        prop_assert_eq!(parsed.to_json().unwrap(), bytes);
    }

    #[test]
    fn agent_keys_survive_parse_of_serialize(k in agent_keys()) {
        let bytes = canonicalize(&k).unwrap();
        prop_assert_eq!(&AgentKeys::from_json(&bytes).unwrap(), &k);
        let pretty = serde_json::to_vec_pretty(&k).unwrap();
        prop_assert_eq!(&AgentKeys::from_json(&pretty).unwrap(), &k);
    }

    #[test]
    fn heads_survive_parse_of_serialize(h in head()) {
        let bytes = canonicalize(&h).unwrap();
        prop_assert_eq!(&Head::from_json(&bytes).unwrap(), &h);
    }

    #[test]
    fn canonicalisation_is_idempotent(v in json_value()) {
        let once = canonicalize(&v).unwrap();
        let reparsed = parse_strict(&once, LIMITS).unwrap();
        prop_assert_eq!(canonicalize(&reparsed).unwrap(), once.clone());
        // Pretty-printed input canonicalises to the same bytes.
        let pretty = serde_json::to_vec_pretty(&v).unwrap();
        let from_pretty = canonicalize(&parse_strict(&pretty, LIMITS).unwrap()).unwrap();
        prop_assert_eq!(from_pretty, once);
    }

    #[test]
    fn records_survive_parse_of_serialize(r in record()) {
        let canonical = r.canonical_bytes().to_vec();
        prop_assert_eq!(&Record::from_json(&canonical).unwrap(), &r);
        let pretty = serde_json::to_vec_pretty(&r).unwrap();
        let again = Record::from_json(&pretty).unwrap();
        prop_assert_eq!(again.hash(), r.hash());
        prop_assert_eq!(&again, &r);
    }

    #[test]
    fn naive_tree_proofs_check_and_altered_ones_do_not(
        n in 1usize..400,
        i_frac in 0.0f64..1.0,
        m_frac in 0.0f64..1.0,
        flip in any::<(usize, u8)>(),
    ) {
        let leaves: Vec<Hash> = (0..n).map(|k| leaf_hash(&(k as u64).to_be_bytes())).collect();
        let root = reference::root(&leaves);
        let i = ((n as f64) * i_frac) as usize % n;
        let proof = reference::inclusion_proof(i, &leaves);
        let (idx, size) = (LeafIndex::new(i as u64), TreeSize::new(n as u64));
        prop_assert!(verify_inclusion(idx, size, &leaves[i], &proof, &root).is_ok());
        if !proof.is_empty() {
            let mut bad = proof.clone();
            let k = flip.0 % bad.len();
            let mut bytes = *bad[k].as_bytes();
            bytes[usize::from(flip.1) % 32] ^= 1;
            bad[k] = Hash::from_bytes(bytes);
            prop_assert!(verify_inclusion(idx, size, &leaves[i], &bad, &root).is_err());
        }
        let m = 1 + ((n as f64) * m_frac) as usize % n;
        let cproof = reference::consistency_proof(m, &leaves);
        let old_root = reference::root(&leaves[..m]);
        let (old, new) = (TreeSize::new(m as u64), TreeSize::new(n as u64));
        prop_assert!(verify_consistency(old, new, &old_root, &root, &cproof).is_ok());
        if !cproof.is_empty() {
            let mut bad = cproof.clone();
            let k = flip.0 % bad.len();
            let mut bytes = *bad[k].as_bytes();
            bytes[usize::from(flip.1) % 32] ^= 1;
            bad[k] = Hash::from_bytes(bytes);
            prop_assert!(verify_consistency(old, new, &old_root, &root, &bad).is_err());
        }
    }
}
