//! Property tests: canonicalisation is idempotent, records survive
//! parse(serialize(x)) unchanged, and proofs made by the naive RFC 9162 tree
//! always check while any altered proof does not.

use proptest::prelude::*;
use serde_json::{Map, Number, Value};
use tally_schemas::canonical::{canonicalize, parse_strict, Limits, MAX_SAFE_INTEGER};
use tally_schemas::hash::leaf_hash;
use tally_schemas::record::{Decision, NoteBody, Outcome, OutcomeStatus};
use tally_schemas::tree::{reference, verify_consistency, verify_inclusion, LeafIndex, TreeSize};
use tally_schemas::{
    AgentName, Body, Hash, Nonce, Record, SecretKey, Seq, UnixMillis, UnsignedRecord,
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
        (text(), hash(), 0usize..7, proptest::option::of(hash())).prop_map(
            |(call_id, decision, s, output_hash)| {
                let status = [
                    OutcomeStatus::Ok,
                    OutcomeStatus::Error,
                    OutcomeStatus::Cancelled,
                    OutcomeStatus::ServerExited,
                    OutcomeStatus::ClientGone,
                    OutcomeStatus::Timeout,
                    OutcomeStatus::NotRun,
                ][s];
                Body::Outcome(Outcome {
                    call_id,
                    decision,
                    status,
                    output_hash,
                })
            }
        ),
        "[^\\x00-\\x08\\x0b-\\x1f\\x7f-\\u{9f}]{1,200}"
            .prop_map(|text| Body::Note(NoteBody { text })),
    ]
}

fn record() -> impl Strategy<Value = Record> {
    (
        any::<[u8; 32]>(),
        "[a-z0-9][a-z0-9._-]{0,20}",
        0u64..1_000_000,
        hash(),
        0i64..253_402_300_799_999,
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

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
