//! The Ed25519 edge-case corpus (testdata/sigs/, docs/protocol.md §4.3): the
//! verifier's parallel path accepts and rejects exactly as strict single
//! verification does, and as each case says.

use std::path::PathBuf;

use ed25519_dalek::{Signature, VerifyingKey};
use tally_verifier::sig::{verify_many, verify_message};

type Case = (String, [u8; 32], Vec<u8>, [u8; 64], bool);

fn load(name: &str) -> Vec<Case> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/sigs")
        .join(name);
    let cases: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    cases
        .iter()
        .map(|c| {
            let h = |k: &str| hex::decode(c[k].as_str().unwrap()).unwrap();
            (
                c["id"].as_str().unwrap().to_owned(),
                h("public_key").try_into().unwrap(),
                h("message"),
                h("signature").try_into().unwrap(),
                c["strict_valid"].as_bool().unwrap(),
            )
        })
        .collect()
}

fn dalek_strict(pk: &[u8; 32], msg: &[u8], sig: &[u8; 64]) -> bool {
    VerifyingKey::from_bytes(pk)
        .is_ok_and(|k| k.verify_strict(msg, &Signature::from_bytes(sig)).is_ok())
}

#[test]
fn edge_cases_accept_and_reject_exactly_as_strict_single_verification() {
    let mut cases = load("speccheck.json");
    cases.extend(load("tally.json"));
    assert!(cases.len() >= 19);
    assert!(cases.iter().any(|c| c.4), "the corpus has an accepted case");
    // Repeat the corpus so every worker gets several cases.
    let items: Vec<([u8; 32], Vec<u8>, [u8; 64])> = cases
        .iter()
        .cycle()
        .take(cases.len() * 8)
        .map(|c| (c.1, c.2.clone(), c.3))
        .collect();
    for threads in [1, 2, 4] {
        let parallel = verify_many(&items, threads);
        assert_eq!(parallel.len(), items.len());
        for (i, got) in parallel.iter().enumerate() {
            let c = &cases[i % cases.len()];
            assert_eq!(*got, c.4, "{} (threads {threads})", c.0);
        }
    }
    for c in &cases {
        assert_eq!(verify_message(&c.1, &c.2, &c.3), c.4, "{}", c.0);
        assert_eq!(
            dalek_strict(&c.1, &c.2, &c.3),
            c.4,
            "{}: dalek verify_strict",
            c.0
        );
    }
}

#[test]
fn the_record_message_is_the_domain_and_the_canonical_record_without_sig() {
    use tally_schemas::record::RECORD_SIGNATURE_DOMAIN;
    use tally_testkit::fixture::{self, decision, note, tool, tools, Fixture};
    let mut fx = Fixture::new("tally.local/log", "log");
    fx.add_agent("a", "a/1");
    let texts = [",\"sig\":\"", "\\\",\"sig\":\"x", "sig", "é\u{2028}\"\\"];
    let mut records = vec![fx.log("a", tools("l", vec![tool("sig", true, "v1")]))];
    for t in texts {
        records.push(fx.log("a", note(t)));
        records.push(fx.log("a", decision(t, t)));
    }
    for r in records {
        let mut want = RECORD_SIGNATURE_DOMAIN.to_vec();
        want.extend_from_slice(&r.unsigned().signing_bytes().unwrap());
        assert_eq!(r.signed_message(), want);
        assert!(tally_verifier::sig::verify_record(
            &r,
            &fixture::key_from_label("a/1").public_key()
        ));
    }
}

#[test]
fn records_are_answered_exactly_as_single_strict_verification_answers() {
    use tally_schemas::keys::Signature as Sig;
    use tally_testkit::fixture::{self, note, Fixture};
    use tally_verifier::sig::verify_record;
    let mut fx = Fixture::new("tally.local/log", "log");
    for a in ["a", "b", "c"] {
        fx.add_agent(a, &format!("{a}/1"));
    }
    let mut accepted = 0;
    let total = 96u8;
    for i in 0..total {
        let agent = ["a", "b", "c"][usize::from(i % 3)];
        let record = fx.log(agent, note(&format!("n{i}")));
        let key = fixture::key_from_label(&format!("{agent}/1")).public_key();
        // Every fourth record gets a flipped bit in R or S.
        let record = if i % 4 == 0 {
            let mut v: serde_json::Value =
                serde_json::from_slice(record.canonical_bytes()).unwrap();
            let mut sig = *record.signature().as_bytes();
            sig[usize::from(i) % 64] ^= 1;
            v["sig"] = serde_json::Value::String(Sig::from_bytes(sig).to_base64());
            tally_schemas::Record::from_value(v).unwrap()
        } else {
            record
        };
        let want = key
            .verify_raw(&record.signed_message(), record.signature())
            .is_ok();
        assert_eq!(verify_record(&record, &key), want, "record {i}");
        // Another agent's key refuses it.
        let other = fixture::key_from_label("b/1").public_key();
        if agent != "b" {
            assert!(!verify_record(&record, &other), "record {i}");
        }
        accepted += usize::from(want);
    }
    assert_eq!(
        accepted,
        usize::from(total) - usize::from(total).div_ceil(4)
    );
}
