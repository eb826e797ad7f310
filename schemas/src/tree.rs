//! Merkle tree sizes, indexes and proof checking, RFC 9162 §2.1.
//!
//! Verification follows RFC 9162 §2.1.3.2 (inclusion) and §2.1.4.2
//! (consistency) with exact proof lengths: a proof with a hash too many or too
//! few is refused, not ignored. [`reference`] is the naive recursive tree of
//! RFC 9162 §2.1.1–2.1.4, kept as the oracle for property tests.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

use crate::hash::{node_hash, Hash};
use crate::limits::MAX_COUNTER;

/// The number of leaves in a tree. On the wire at most
/// [`MAX_COUNTER`](crate::limits::MAX_COUNTER), 2^53 − 1.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize)]
#[serde(transparent)]
pub struct TreeSize(u64);

/// The 0-based position of a leaf in the log. On the wire at most
/// [`MAX_COUNTER`](crate::limits::MAX_COUNTER), 2^53 − 1.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize)]
#[serde(transparent)]
pub struct LeafIndex(u64);

/// Reads a counter and refuses one above 2^53 − 1, like [`crate::Seq`], so a
/// size or index that exists came from an exact wire integer.
fn bounded_counter<'de, D: Deserializer<'de>>(d: D, what: &str) -> Result<u64, D::Error> {
    let n = u64::deserialize(d)?;
    if n > MAX_COUNTER {
        return Err(serde::de::Error::custom(format!(
            "{what} {n} is above the limit of {MAX_COUNTER} (2^53 - 1)"
        )));
    }
    Ok(n)
}

impl<'de> Deserialize<'de> for TreeSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        bounded_counter(d, "tree size").map(Self)
    }
}

impl<'de> Deserialize<'de> for LeafIndex {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        bounded_counter(d, "leaf index").map(Self)
    }
}

impl TreeSize {
    /// Wraps a count.
    #[must_use]
    pub const fn new(n: u64) -> Self {
        Self(n)
    }
    /// The count.
    #[must_use]
    pub const fn get(self) -> u64 {
        self.0
    }
    /// Whether `index` is a leaf of a tree of this size.
    #[must_use]
    pub const fn contains(self, index: LeafIndex) -> bool {
        index.0 < self.0
    }
    /// The index the next appended leaf will get.
    #[must_use]
    pub const fn next_index(self) -> LeafIndex {
        LeafIndex(self.0)
    }
}

impl LeafIndex {
    /// Wraps an index.
    #[must_use]
    pub const fn new(i: u64) -> Self {
        Self(i)
    }
    /// The index.
    #[must_use]
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Debug for TreeSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TreeSize({})", self.0)
    }
}
impl fmt::Display for TreeSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
impl fmt::Debug for LeafIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeafIndex({})", self.0)
    }
}
impl fmt::Display for LeafIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The root hash of the empty tree, `SHA-256("")` (RFC 9162 §2.1.1).
#[must_use]
pub fn empty_root() -> Hash {
    Hash::sha256(b"")
}

/// Why a proof was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    /// The leaf index is not below the tree size.
    #[error("leaf index {index} is not in a tree of size {size}")]
    IndexBeyondSize {
        /// The index.
        index: u64,
        /// The size.
        size: u64,
    },
    /// The older size is larger than the newer.
    #[error("size {old} is larger than size {new}")]
    SizesOutOfOrder {
        /// First size.
        old: u64,
        /// Second size.
        new: u64,
    },
    /// RFC 9162 defines no consistency proof from the empty tree: every tree
    /// extends it, so there is nothing to prove.
    #[error("a consistency proof from the empty tree is meaningless")]
    FromEmptyTree,
    /// The proof has the wrong number of hashes for these sizes.
    #[error("proof has {got} hashes, {want} expected for these sizes")]
    WrongLength {
        /// Hashes given.
        got: usize,
        /// Hashes needed.
        want: usize,
    },
    /// The proof does not lead to the expected root(s).
    #[error("proof does not match the root hash")]
    RootMismatch,
}

/// The number of hashes in an inclusion proof for `index` in a tree of `size`.
fn inclusion_proof_len(index: u64, size: u64) -> usize {
    // RFC 9162 §2.1.3.2: the path length is the bits of index ^ (size - 1),
    // minus the levels skipped where the node has no right sibling.
    let last = size - 1;
    let inner = u64::BITS - (index ^ last).leading_zeros();
    let border = (index >> inner).count_ones();
    (inner + border) as usize
}

/// Computes the root implied by an inclusion proof (RFC 9162 §2.1.3.2).
///
/// # Errors
/// [`ProofError::IndexBeyondSize`] or [`ProofError::WrongLength`].
pub fn root_from_inclusion_proof(
    index: LeafIndex,
    size: TreeSize,
    leaf: &Hash,
    proof: &[Hash],
) -> Result<Hash, ProofError> {
    if !size.contains(index) {
        return Err(ProofError::IndexBeyondSize {
            index: index.0,
            size: size.0,
        });
    }
    let want = inclusion_proof_len(index.0, size.0);
    if proof.len() != want {
        return Err(ProofError::WrongLength {
            got: proof.len(),
            want,
        });
    }
    let mut state = PathState {
        fnode: index.0,
        snode: size.0 - 1,
        hash: *leaf,
    };
    for p in proof {
        state.step(p);
    }
    Ok(state.hash)
}

/// Where the walk of RFC 9162 §2.1.3.2 stands before a proof hash: the
/// node positions `fn` and `sn` and the hash `r` computed so far. The rest
/// of the walk depends only on this state and the proof hashes left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PathState {
    fnode: u64,
    snode: u64,
    hash: Hash,
}

impl PathState {
    /// One step of the walk, with the proof hash `p`.
    fn step(&mut self, p: &Hash) {
        if self.fnode & 1 == 1 || self.fnode == self.snode {
            self.hash = node_hash(p, &self.hash);
            while self.fnode & 1 == 0 && self.fnode != 0 {
                self.fnode >>= 1;
                self.snode >>= 1;
            }
        } else {
            self.hash = node_hash(&self.hash, p);
        }
        self.fnode >>= 1;
        self.snode >>= 1;
    }
}

/// Checks many inclusion proofs, giving exactly [`verify_inclusion`]'s
/// answers, faster when consecutive proofs are into the same tree: the
/// proofs of neighbouring leaves share their upper part, which is hashed
/// once. It keeps the walk of the last proof that reached its root (the
/// state before each step, and the proof); a later proof into the same tree
/// (size and root) that comes to the same state with the same proof hashes
/// left would finish that walk the same way, at that root, so it is
/// accepted there. Anything else (no such state, another tree, a proof that
/// fails) is walked to the end, and a proof that does not reach its root is
/// handed to [`verify_inclusion`] for its error.
#[derive(Debug, Default, Clone)]
pub struct InclusionPaths {
    /// The tree the last accepted walk reached, if any.
    tree: Option<(TreeSize, Hash)>,
    /// The state before each step of that walk, and its proof.
    states: Vec<PathState>,
    proof: Vec<Hash>,
    /// The walk under way (kept to reuse its allocation).
    walk: Vec<PathState>,
}

impl InclusionPaths {
    /// [`verify_inclusion`], remembering the walk of an accepted proof.
    ///
    /// # Errors
    /// The [`ProofError`] [`verify_inclusion`] gives.
    pub fn verify(
        &mut self,
        index: LeafIndex,
        size: TreeSize,
        leaf: &Hash,
        proof: &[Hash],
        root: &Hash,
    ) -> Result<(), ProofError> {
        if !size.contains(index) || proof.len() != inclusion_proof_len(index.0, size.0) {
            return verify_inclusion(index, size, leaf, proof, root);
        }
        // Step `t` of this walk lines up with step `j = t + last - len` of
        // the last one: both have `len - t` hashes left.
        let same_tree = self.tree == Some((size, *root));
        let (last, len) = (self.states.len(), proof.len());
        let mut state = PathState {
            fnode: index.0,
            snode: size.0 - 1,
            hash: *leaf,
        };
        self.walk.clear();
        for (t, p) in proof.iter().enumerate() {
            if same_tree && t + last >= len {
                let j = t + last - len;
                if self.states[j] == state && self.proof[j..] == proof[t..] {
                    // The rest is the last walk's, which reached `root`.
                    // Keep this walk's steps below it for the next proof.
                    self.walk.extend_from_slice(&self.states[j..]);
                    self.remember(size, root, proof);
                    return Ok(());
                }
            }
            self.walk.push(state);
            state.step(p);
        }
        if state.hash != *root {
            return verify_inclusion(index, size, leaf, proof, root);
        }
        self.remember(size, root, proof);
        Ok(())
    }

    /// Keeps the walk just made (in `walk`) and its proof for the next one.
    fn remember(&mut self, size: TreeSize, root: &Hash, proof: &[Hash]) {
        std::mem::swap(&mut self.walk, &mut self.states);
        self.proof.clear();
        self.proof.extend_from_slice(proof);
        self.tree = Some((size, *root));
    }
}

/// Checks that `leaf` is at `index` in the tree of `size` with `root`.
///
/// # Errors
/// A [`ProofError`] saying why not.
pub fn verify_inclusion(
    index: LeafIndex,
    size: TreeSize,
    leaf: &Hash,
    proof: &[Hash],
    root: &Hash,
) -> Result<(), ProofError> {
    if root_from_inclusion_proof(index, size, leaf, proof)? == *root {
        Ok(())
    } else {
        Err(ProofError::RootMismatch)
    }
}

/// Checks that the tree of `new_size` with `new_root` extends the tree of
/// `old_size` with `old_root` (RFC 9162 §2.1.4.2).
///
/// Equal sizes need an empty proof and equal roots. A proof from size 0 is
/// refused as meaningless; callers that start from the empty tree accept any
/// later tree without a proof.
///
/// # Errors
/// A [`ProofError`] saying why not.
pub fn verify_consistency(
    old_size: TreeSize,
    new_size: TreeSize,
    old_root: &Hash,
    new_root: &Hash,
    proof: &[Hash],
) -> Result<(), ProofError> {
    let (m, n) = (old_size.0, new_size.0);
    if m > n {
        return Err(ProofError::SizesOutOfOrder { old: m, new: n });
    }
    if m == 0 {
        return Err(ProofError::FromEmptyTree);
    }
    if m == n {
        if !proof.is_empty() {
            return Err(ProofError::WrongLength {
                got: proof.len(),
                want: 0,
            });
        }
        return if old_root == new_root {
            Ok(())
        } else {
            Err(ProofError::RootMismatch)
        };
    }
    // The proof is the old tree's last full subtree node (left out when m is a
    // power of two: that node is the old root) followed by that node's
    // inclusion path in the new tree, both at the node's level.
    let level = m.trailing_zeros();
    let node = (m - 1) >> level;
    let width = ((n - 1) >> level) + 1;
    let want = inclusion_proof_len(node, width) + usize::from(node != 0);
    if proof.len() != want {
        return Err(ProofError::WrongLength {
            got: proof.len(),
            want,
        });
    }
    let (seed, rest) = if m.is_power_of_two() {
        (old_root, proof)
    } else {
        (&proof[0], &proof[1..])
    };
    let mut fnode = m - 1;
    let mut snode = n - 1;
    while fnode & 1 == 1 {
        fnode >>= 1;
        snode >>= 1;
    }
    let (mut fr, mut sr) = (*seed, *seed);
    for c in rest {
        if snode == 0 {
            return Err(ProofError::WrongLength {
                got: proof.len(),
                want,
            });
        }
        if fnode & 1 == 1 || fnode == snode {
            fr = node_hash(c, &fr);
            sr = node_hash(c, &sr);
            while fnode & 1 == 0 && fnode != 0 {
                fnode >>= 1;
                snode >>= 1;
            }
        } else {
            sr = node_hash(&sr, c);
        }
        fnode >>= 1;
        snode >>= 1;
    }
    if snode != 0 || fr != *old_root || sr != *new_root {
        return Err(ProofError::RootMismatch);
    }
    Ok(())
}

/// The naive tree of RFC 9162 §2.1, recomputing every hash from the leaves.
/// It is slow on purpose: it is the oracle other implementations are checked
/// against, not something to serve proofs from.
pub mod reference {
    use super::{node_hash, Hash};

    /// Largest power of two strictly less than `n` (n > 1).
    fn split(n: usize) -> usize {
        let mut k = 1;
        while k << 1 < n {
            k <<= 1;
        }
        k
    }

    /// MTH(D[n]) over leaf hashes.
    #[must_use]
    pub fn root(leaves: &[Hash]) -> Hash {
        match leaves.len() {
            0 => super::empty_root(),
            1 => leaves[0],
            n => {
                let k = split(n);
                node_hash(&root(&leaves[..k]), &root(&leaves[k..]))
            }
        }
    }

    /// PATH(m, D[n]), RFC 9162 §2.1.3.1.
    #[must_use]
    pub fn inclusion_proof(index: usize, leaves: &[Hash]) -> Vec<Hash> {
        let n = leaves.len();
        if n <= 1 {
            return Vec::new();
        }
        let k = split(n);
        if index < k {
            let mut p = inclusion_proof(index, &leaves[..k]);
            p.push(root(&leaves[k..]));
            p
        } else {
            let mut p = inclusion_proof(index - k, &leaves[k..]);
            p.push(root(&leaves[..k]));
            p
        }
    }

    /// PROOF(m, D[n]), RFC 9162 §2.1.4.1, for 0 < m <= n.
    #[must_use]
    pub fn consistency_proof(m: usize, leaves: &[Hash]) -> Vec<Hash> {
        subproof(m, leaves, true)
    }

    fn subproof(m: usize, leaves: &[Hash], whole: bool) -> Vec<Hash> {
        let n = leaves.len();
        if m == n {
            return if whole {
                Vec::new()
            } else {
                vec![root(leaves)]
            };
        }
        let k = split(n);
        if m <= k {
            let mut p = subproof(m, &leaves[..k], whole);
            p.push(root(&leaves[k..]));
            p
        } else {
            let mut p = subproof(m - k, &leaves[k..], false);
            p.push(root(&leaves[..k]));
            p
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::leaf_hash;

    fn leaves(n: usize) -> Vec<Hash> {
        (0..n).map(|i| leaf_hash(&i.to_be_bytes())).collect()
    }

    #[test]
    fn remembered_walks_answer_exactly_as_verify_inclusion() {
        // Proofs in pack order and in other orders, into two trees taken in
        // turn, intact and with one hash, the leaf, the index, the size, the
        // root or the length wrong: each answer is verify_inclusion's.
        let mut paths = InclusionPaths::default();
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut accepted = 0;
        for n in [1usize, 2, 3, 5, 8, 13, 31, 32, 33, 64, 100] {
            let l = leaves(n);
            let smaller = &l[..n.div_ceil(2)];
            let trees = [
                (n, reference::root(&l)),
                (smaller.len(), reference::root(smaller)),
            ];
            let orders: [Vec<usize>; 3] = [
                (0..n).collect(),
                (0..n).rev().collect(),
                (0..2 * n).map(|_| (next() % n as u64) as usize).collect(),
            ];
            for (k, i) in orders.iter().flatten().enumerate() {
                let (size, root) = trees[k % 2];
                let i = *i % size;
                let proof = reference::inclusion_proof(i, &l[..size]);
                let mut cases = vec![(i as u64, size as u64, l[i], proof.clone(), root)];
                if !proof.is_empty() {
                    let mut bad = proof.clone();
                    let at = (next() % proof.len() as u64) as usize;
                    bad[at] = leaf_hash(&[at as u8]);
                    cases.push((i as u64, size as u64, l[i], bad, root));
                    cases.push((i as u64, size as u64, l[i], proof[1..].to_vec(), root));
                }
                let mut longer = proof.clone();
                longer.push(root);
                cases.push((i as u64, size as u64, l[i], longer, root));
                cases.push((i as u64, size as u64, leaf_hash(b"x"), proof.clone(), root));
                cases.push((
                    ((i + 1) % size) as u64,
                    size as u64,
                    l[i],
                    proof.clone(),
                    root,
                ));
                cases.push((i as u64, size as u64 + 1, l[i], proof.clone(), root));
                cases.push((i as u64, size as u64, l[i], proof.clone(), leaf_hash(b"r")));
                cases.push((size as u64, size as u64, l[i], proof, root));
                for (index, size, leaf, proof, root) in cases {
                    let (index, size) = (LeafIndex::new(index), TreeSize::new(size));
                    let want = verify_inclusion(index, size, &leaf, &proof, &root);
                    accepted += usize::from(want.is_ok());
                    assert_eq!(
                        paths.verify(index, size, &leaf, &proof, &root),
                        want,
                        "{index} in {size}"
                    );
                }
            }
        }
        assert!(accepted > 500);
    }

    #[test]
    fn sizes_and_indexes_on_the_wire_stop_at_2_pow_53_minus_1() {
        let max = MAX_COUNTER.to_string();
        assert_eq!(
            serde_json::from_str::<TreeSize>(&max).unwrap(),
            TreeSize::new(MAX_COUNTER)
        );
        assert_eq!(
            serde_json::from_str::<LeafIndex>(&max).unwrap(),
            LeafIndex::new(MAX_COUNTER)
        );
        for over in ["9007199254740992", "18446744073709551615"] {
            assert!(serde_json::from_str::<TreeSize>(over).is_err(), "{over}");
            assert!(serde_json::from_str::<LeafIndex>(over).is_err(), "{over}");
        }
        assert!(serde_json::from_str::<TreeSize>("-1").is_err());
    }

    #[test]
    fn every_inclusion_and_consistency_proof_of_small_trees_checks() {
        for n in 1..=33usize {
            let l = leaves(n);
            let r = reference::root(&l);
            for i in 0..n {
                let p = reference::inclusion_proof(i, &l);
                let (idx, size) = (LeafIndex::new(i as u64), TreeSize::new(n as u64));
                assert_eq!(
                    verify_inclusion(idx, size, &l[i], &p, &r),
                    Ok(()),
                    "{i} in {n}"
                );
                let mut longer = p.clone();
                longer.push(r);
                assert!(verify_inclusion(idx, size, &l[i], &longer, &r).is_err());
                if !p.is_empty() {
                    assert!(verify_inclusion(idx, size, &l[i], &p[1..], &r).is_err());
                }
            }
            for m in 1..=n {
                let p = reference::consistency_proof(m, &l);
                let rm = reference::root(&l[..m]);
                let (old, new) = (TreeSize::new(m as u64), TreeSize::new(n as u64));
                assert_eq!(
                    verify_consistency(old, new, &rm, &r, &p),
                    Ok(()),
                    "{m} -> {n}"
                );
                let mut longer = p.clone();
                longer.push(r);
                assert!(verify_consistency(old, new, &rm, &r, &longer).is_err());
            }
        }
    }
}
