//! The log's JSON proof answers, docs/protocol.md §7.5:
//! `GET /v1/proof/consistency?from=M[&to=N]` and
//! `GET /v1/proof/inclusion?index=I|leaf_hash=H[&size=S]`.
//!
//! A reader checks the proof itself against two checkpoints it verified
//! with the pinned key (§7.5: a proof is never trusted because the log
//! served it); parsing only makes sure the answer is what §7.5 says.

use serde::{Deserialize, Serialize};

use super::{parse_versioned, BodyError};
use crate::hash::Hash;
use crate::limits::MAX_PROOF_HASHES;
use crate::tree::{LeafIndex, TreeSize};

/// Version of the JSON proof answers. Before it, the answers had no `v`;
/// readers refuse one without it.
pub const PROOF_JSON_VERSION: u64 = 1;

/// `{"v":1,"from":M,"to":N,"consistency":[…]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsistencyProofAnswer {
    /// Version, 1.
    pub v: u64,
    /// The older tree size, as asked (at least 1).
    pub from: TreeSize,
    /// The newer tree size: as asked, or the latest checkpoint's.
    pub to: TreeSize,
    /// The RFC 9162 consistency proof, at most [`MAX_PROOF_HASHES`] hashes.
    pub consistency: Vec<Hash>,
}

/// `{"v":1,"index":I,"size":S,"leaf_hash":H,"inclusion":[…]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InclusionProofAnswer {
    /// Version, 1.
    pub v: u64,
    /// The leaf's index, below `size`.
    pub index: LeafIndex,
    /// The tree size the proof is for (at least 1).
    pub size: TreeSize,
    /// The leaf's hash (§7.2).
    pub leaf_hash: Hash,
    /// The RFC 9162 inclusion proof, at most [`MAX_PROOF_HASHES`] hashes.
    pub inclusion: Vec<Hash>,
}

fn check_proof(what: &'static str, name: &str, proof: &[Hash]) -> Result<(), BodyError> {
    if proof.len() > MAX_PROOF_HASHES {
        return Err(BodyError::schema(
            what,
            format!(
                "{name} has {} hashes, more than {MAX_PROOF_HASHES}",
                proof.len()
            ),
        ));
    }
    Ok(())
}

impl ConsistencyProofAnswer {
    /// The answer for a proof from `from` to `to`.
    #[must_use]
    pub fn new(from: TreeSize, to: TreeSize, consistency: Vec<Hash>) -> Self {
        Self {
            v: PROOF_JSON_VERSION,
            from,
            to,
            consistency,
        }
    }

    /// Parses the answer as §7.5 says: the JSON rules of §2, `v` first and
    /// 1, exactly the four members with their types, `from` at least 1 and
    /// not above `to`, at most [`MAX_PROOF_HASHES`] hashes.
    ///
    /// # Errors
    /// [`BodyError`] naming the first rule broken.
    pub fn from_json(bytes: &[u8]) -> Result<Self, BodyError> {
        const WHAT: &str = "consistency proof answer";
        let a: Self = parse_versioned(bytes, WHAT, PROOF_JSON_VERSION)?;
        if a.from.get() == 0 || a.from > a.to {
            return Err(BodyError::schema(
                WHAT,
                format!(
                    "from {} and to {} must satisfy 1 <= from <= to",
                    a.from, a.to
                ),
            ));
        }
        check_proof(WHAT, "consistency", &a.consistency)?;
        Ok(a)
    }
}

impl InclusionProofAnswer {
    /// Parses the answer as §7.5 says: the JSON rules of §2, `v` first and
    /// 1, exactly the five members with their types, `index` below `size`,
    /// at most [`MAX_PROOF_HASHES`] hashes.
    ///
    /// # Errors
    /// [`BodyError`] naming the first rule broken.
    pub fn from_json(bytes: &[u8]) -> Result<Self, BodyError> {
        const WHAT: &str = "inclusion proof answer";
        let a: Self = parse_versioned(bytes, WHAT, PROOF_JSON_VERSION)?;
        if a.index.get() >= a.size.get() {
            return Err(BodyError::schema(
                WHAT,
                format!("index {} is not below size {}", a.index, a.size),
            ));
        }
        check_proof(WHAT, "inclusion", &a.inclusion)?;
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(i: u8) -> String {
        Hash::sha256(&[i]).to_hex()
    }

    #[test]
    fn proof_answers_are_read_with_their_rules() {
        let c = format!(r#"{{"v":1,"from":3,"to":7,"consistency":["{}"]}}"#, h(1));
        let a = ConsistencyProofAnswer::from_json(c.as_bytes()).unwrap();
        assert_eq!(
            a,
            ConsistencyProofAnswer::new(
                TreeSize::new(3),
                TreeSize::new(7),
                vec![Hash::sha256(&[1])]
            )
        );
        let i = format!(
            r#"{{"v":1,"index":5,"size":21,"leaf_hash":"{}","inclusion":["{}"]}}"#,
            h(0),
            h(1)
        );
        let a = InclusionProofAnswer::from_json(i.as_bytes()).unwrap();
        assert_eq!((a.index.get(), a.size.get()), (5, 21));
        let many: Vec<String> = (0..65).map(h).collect();
        for (bad, why) in [
            (c.replace("\"from\":3", "\"from\":0"), "1 <= from <= to"),
            (c.replace("\"from\":3", "\"from\":8"), "1 <= from <= to"),
            (
                c.replace(&format!("[\"{}\"]", h(1)), &format!("{many:?}")),
                "65 hashes",
            ),
            (c.replace("\"v\":1", "\"v\":0"), "version 0"),
        ] {
            let err = ConsistencyProofAnswer::from_json(bad.as_bytes()).unwrap_err();
            assert!(err.to_string().contains(why), "{bad}: {err}");
        }
        for (bad, why) in [
            (i.replace("\"index\":5", "\"index\":21"), "not below size"),
            (i.replace("\"size\":21", "\"size\":0"), "not below size"),
            (
                i.replace(&format!("[\"{}\"]", h(1)), &format!("{many:?}")),
                "65 hashes",
            ),
            (
                i.replace(",\"inclusion\"", ",\"x\":1,\"inclusion\""),
                "unknown field `x`",
            ),
        ] {
            let err = InclusionProofAnswer::from_json(bad.as_bytes()).unwrap_err();
            assert!(err.to_string().contains(why), "{bad}: {err}");
        }
    }
}
