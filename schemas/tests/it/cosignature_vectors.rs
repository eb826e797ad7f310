//! The cosignature/v1 vectors of testdata/cosignature/, made by an
//! independent Python implementation (testdata/cosignature/README.md):
//! tally must build the same signed message and the same signature line,
//! byte for byte, and its verifier must accept each line and refuse it
//! with any one bit flipped.

use std::path::Path;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde_json::Value;
use tally_schemas::cosignature::{cosignature_message, CosignatureSigner, CosignatureVerifier};
use tally_schemas::keys::SecretKey;

fn cases() -> Vec<(String, Value)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/cosignature");
    let mut out: Vec<(String, Value)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let v = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
            (p.file_name().unwrap().to_string_lossy().into_owned(), v)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn sig_bytes(line: &str, name: &str) -> Vec<u8> {
    let b64 = line
        .strip_prefix(&format!("\u{2014} {name} "))
        .and_then(|l| l.strip_suffix('\n'))
        .expect("a signature line");
    BASE64.decode(b64).unwrap()
}

#[test]
fn tally_builds_the_independent_vectors_byte_for_byte() {
    let cases = cases();
    assert_eq!(cases.len(), 3, "the three vector files");
    for (file, case) in cases {
        let s = |k: &str| case[k].as_str().unwrap().to_owned();
        let (name, body, line) = (
            s("cosigner_name"),
            s("checkpoint_body"),
            s("signature_line"),
        );
        let timestamp = case["timestamp"].as_u64().unwrap();
        let seed: [u8; 32] = hex::decode(s("cosigner_seed")).unwrap().try_into().unwrap();

        assert_eq!(
            cosignature_message(timestamp, body.as_bytes()),
            s("signed_message").into_bytes(),
            "{file}: the signed message"
        );
        let signer = CosignatureSigner::from_secret(&name, SecretKey::from_seed(&seed)).unwrap();
        assert_eq!(
            signer.verifier().vkey(),
            s("cosigner_vkey"),
            "{file}: the vkey"
        );
        assert_eq!(
            signer.cosign(body.as_bytes(), timestamp),
            line,
            "{file}: the line"
        );

        let verifier = CosignatureVerifier::from_vkey(&s("cosigner_vkey")).unwrap();
        let raw = sig_bytes(&line, &name);
        assert_eq!(raw[..4], verifier.id().to_be_bytes(), "{file}: key id");
        assert_eq!(
            verifier.verify_cosignature(body.as_bytes(), &raw[4..]),
            Ok(timestamp),
            "{file}"
        );
        for bit in 0..(raw.len() - 4) * 8 {
            let mut bad = raw[4..].to_vec();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(
                verifier.verify_cosignature(body.as_bytes(), &bad).is_err(),
                "{file}: bit {bit} flipped must not verify"
            );
        }
    }
}

#[test]
fn the_specification_example_line_carries_the_same_timestamp_bytes() {
    // c2sp.org/tlog-cosignature, its example checkpoint's cosignature line.
    let spec = "\u{2014} witness.example.com/w1 jWbPPwAAAABkGFDLEZMHwSRaJNiIDoe9DYn/zXcrtPHeolMI5OWXEhZCB9dlrDJsX3b2oyin1nPZqhf5nNo0xUe+mbIUBkBIfZ+qnA==\n";
    let raw = sig_bytes(spec, "witness.example.com/w1");
    assert_eq!(raw.len(), 4 + 8 + 64);
    assert_eq!(
        u64::from_be_bytes(raw[4..12].try_into().unwrap()),
        1_679_315_147
    );
    let (_, ours) = cases()
        .into_iter()
        .find(|(f, _)| f == "v1-spec-example.json")
        .unwrap();
    let ours = sig_bytes(
        ours["signature_line"].as_str().unwrap(),
        "witness.example.com/w1",
    );
    assert_eq!(raw[4..12], ours[4..12]);
}
