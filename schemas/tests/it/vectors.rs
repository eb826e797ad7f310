//! External vectors, run as they are: RFC 9162 proofs (transparency-dev/merkle),
//! RFC 8785 canonicalisation (cyberphone/json-canonicalization) and C2SP
//! signed-note checkpoints signed by the Go reference. Sources and licences:
//! testdata/vectors/SOURCE.md.

use std::fs;
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde::Deserialize;
use tally_schemas::canonical::{canonicalize_bytes, Limits};
use tally_schemas::hash::Hash;
use tally_schemas::note::{open_checkpoint, NoteSigner, NoteVerifier};
use tally_schemas::tree::{verify_consistency, verify_inclusion, LeafIndex, TreeSize};

fn vectors() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/vectors")
}

fn json_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            json_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "json") {
            out.push(p);
        }
    }
    out.sort();
}

/// A base64 hash from the vectors. The vectors use short "don't care"
/// strings (`ZG9uJ3QgY2FyZSAx`) for values that are not real hashes; those
/// map to the SHA-256 of their bytes, which keeps equal strings equal and
/// never matches a computed root.
fn hash(b64: &str) -> Hash {
    let bytes = BASE64.decode(b64).expect("vector base64");
    match <[u8; 32]>::try_from(bytes.as_slice()) {
        Ok(h) => Hash::from_bytes(h),
        Err(_) => Hash::sha256(&bytes),
    }
}

/// A leaf hash must be exactly 32 bytes: tally's `Hash` type cannot hold
/// anything else, so such a vector fails before any proof math (as the
/// reference verifier's length check does).
fn leaf(b64: &str) -> Option<Hash> {
    let bytes = BASE64.decode(b64).expect("vector base64");
    <[u8; 32]>::try_from(bytes).ok().map(Hash::from_bytes)
}

fn proof(p: &Option<Vec<String>>) -> Vec<Hash> {
    p.as_deref()
        .unwrap_or_default()
        .iter()
        .map(|h| hash(h))
        .collect()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct InclusionCase {
    leaf_idx: u64,
    tree_size: u64,
    root: String,
    leaf_hash: String,
    proof: Option<Vec<String>>,
    desc: String,
    want_err: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ConsistencyCase {
    size1: u64,
    size2: u64,
    root1: String,
    root2: String,
    proof: Option<Vec<String>>,
    desc: String,
    want_err: bool,
}

#[test]
fn rfc9162_inclusion_vectors() {
    let mut files = Vec::new();
    json_files(&vectors().join("rfc9162/inclusion"), &mut files);
    // Exact, so that a lost or added file is noticed.
    assert_eq!(files.len(), 59, "inclusion vectors found");
    let mut failures = Vec::new();
    for f in &files {
        let c: InclusionCase = serde_json::from_slice(&fs::read(f).unwrap()).unwrap();
        let got_err = leaf(&c.leaf_hash).is_none_or(|leaf| {
            verify_inclusion(
                LeafIndex::new(c.leaf_idx),
                TreeSize::new(c.tree_size),
                &leaf,
                &proof(&c.proof),
                &hash(&c.root),
            )
            .is_err()
        });
        if got_err != c.want_err {
            failures.push(format!(
                "{}: {} (want_err {})",
                f.display(),
                c.desc,
                c.want_err
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn rfc9162_consistency_vectors() {
    let mut files = Vec::new();
    json_files(&vectors().join("rfc9162/consistency"), &mut files);
    assert_eq!(files.len(), 57, "consistency vectors found");
    let mut failures = Vec::new();
    for f in &files {
        let c: ConsistencyCase = serde_json::from_slice(&fs::read(f).unwrap()).unwrap();
        let got_err = verify_consistency(
            TreeSize::new(c.size1),
            TreeSize::new(c.size2),
            &hash(&c.root1),
            &hash(&c.root2),
            &proof(&c.proof),
        )
        .is_err();
        if got_err != c.want_err {
            failures.push(format!(
                "{}: {} (want_err {})",
                f.display(),
                c.desc,
                c.want_err
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn rfc8785_vectors_byte_for_byte() {
    let dir = vectors().join("rfc8785");
    let mut inputs = Vec::new();
    json_files(&dir.join("input"), &mut inputs);
    assert_eq!(inputs.len(), 6, "expected the six cyberphone input files");
    let limits = Limits {
        max_bytes: 1 << 20,
        max_depth: 64,
    };
    for input in inputs {
        let name = input.file_name().unwrap().to_str().unwrap().to_owned();
        let got = canonicalize_bytes(&fs::read(&input).unwrap(), limits)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = fs::read(dir.join("output").join(&name)).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&want),
            "{name}"
        );
        let hex_text =
            fs::read_to_string(dir.join("outhex").join(name.replace(".json", ".txt"))).unwrap();
        let want_hex: Vec<u8> = hex_text
            .split_whitespace()
            .map(|b| u8::from_str_radix(b, 16).unwrap())
            .collect();
        assert_eq!(got, want_hex, "{name} (outhex)");
    }
}

#[derive(Deserialize)]
struct NoteCase {
    desc: String,
    skey: String,
    vkey: String,
    text: String,
    note: String,
}

#[test]
fn signed_note_vectors_byte_for_byte() {
    let cases: Vec<NoteCase> =
        serde_json::from_slice(&fs::read(vectors().join("signed-note/checkpoints.json")).unwrap())
            .unwrap();
    assert_eq!(cases.len(), 4, "signed-note vectors found");
    for c in cases {
        let signer = NoteSigner::from_skey(&c.skey).unwrap_or_else(|e| panic!("{}: {e}", c.desc));
        assert_eq!(signer.skey(), c.skey, "{}: skey round trip", c.desc);
        assert_eq!(
            signer.verifier().vkey(),
            c.vkey,
            "{}: vkey from skey",
            c.desc
        );
        let verifier = NoteVerifier::from_vkey(&c.vkey).unwrap();
        assert_eq!(&verifier, signer.verifier(), "{}", c.desc);
        assert_eq!(
            signer.sign_note(&c.text).unwrap(),
            c.note,
            "{}: signed note bytes",
            c.desc
        );
        let cp = open_checkpoint(&c.note, &verifier).unwrap_or_else(|e| panic!("{}: {e}", c.desc));
        assert_eq!(
            cp.to_body(),
            c.text,
            "{}: checkpoint body round trip",
            c.desc
        );
        // One flipped byte of the signature must be refused.
        let mut bad = c.note.clone().into_bytes();
        let at = bad.len() - 10;
        bad[at] = if bad[at] == b'A' { b'B' } else { b'A' };
        assert!(
            open_checkpoint(std::str::from_utf8(&bad).unwrap(), &verifier).is_err(),
            "{}",
            c.desc
        );
    }
}
