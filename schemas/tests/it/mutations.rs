//! Every parser meets mutated golden fixtures (flipped, cut, repeated and
//! inserted bytes) and must answer with a value or an error, never a panic.
//! The cargo-fuzz targets in fuzz/ go further; this runs in every CI build.

use std::fs;
use std::path::Path;

use proptest::prelude::*;
use tally_schemas::note::{peek_checkpoint, Checkpoint, NoteSigner, NoteVerifier};
use tally_schemas::pack::{AgentKeys, Head, PackLine};
use tally_schemas::{Entry, Receipt, Record};

fn fixtures() -> Vec<Vec<u8>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/golden");
    let mut out = Vec::new();
    for sub in ["records", "log", "pack"] {
        for e in fs::read_dir(root.join(sub)).unwrap() {
            let bytes = fs::read(e.unwrap().path()).unwrap();
            out.extend(
                bytes
                    .split(|b| *b == b'\n')
                    .filter(|l| l.len() > 2)
                    .map(<[u8]>::to_vec),
            );
            out.push(bytes);
        }
    }
    out
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Cut(usize),
    Insert(usize, Vec<u8>),
    Repeat(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        any::<usize>().prop_map(Mutation::Cut),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        (any::<usize>(), 1usize..64).prop_map(|(i, n)| Mutation::Repeat(i, n)),
    ]
}

fn apply(mut bytes: Vec<u8>, muts: &[Mutation]) -> Vec<u8> {
    for m in muts {
        if bytes.is_empty() {
            break;
        }
        let at = |i: usize| i % bytes.len();
        match m {
            Mutation::Flip(i, b) => {
                let k = at(*i);
                bytes[k] ^= b | 1;
            }
            Mutation::Cut(i) => bytes.truncate(at(*i)),
            Mutation::Insert(i, b) => {
                let k = at(*i);
                bytes.splice(k..k, b.iter().copied());
            }
            Mutation::Repeat(i, n) => {
                let k = at(*i);
                let end = (k + n).min(bytes.len());
                let chunk = bytes[k..end].to_vec();
                bytes.splice(k..k, chunk);
            }
        }
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn parsers_never_panic(pick in any::<usize>(), muts in prop::collection::vec(mutation(), 1..4)) {
        let all = fixtures();
        let input = apply(all[pick % all.len()].clone(), &muts);
        let _ = Record::from_json(&input);
        let _ = Entry::from_json(&input);
        let _ = Receipt::from_json(&input);
        let _ = PackLine::from_json(&input);
        let _ = AgentKeys::from_json(&input);
        let _ = Head::from_json(&input);
        if let Ok(text) = std::str::from_utf8(&input) {
            let _ = peek_checkpoint(text);
            let _ = Checkpoint::from_body(text);
            let _ = NoteVerifier::from_vkey(text);
            let _ = NoteSigner::from_skey(text);
        }
    }
}
