//! Merkle tree arithmetic over stored hashes (RFC 9162 §2.1, in the Go
//! sumdb/tlog stored-hash layout): roots, inclusion and consistency proofs,
//! the hashes a batch adds, and C2SP tlog-tiles tile contents. Every function
//! reads O(log n) stored hashes, never a whole level.
//!
//! The math is `tlog_tiles`'s port of Go's `sumdb/tlog`; this module adapts it
//! to [`LogStore`] and to tally's `Hash` and surfaces storage errors instead
//! of losing them.

use std::cell::RefCell;

use tally_schemas::{Hash, LeafIndex, TreeSize};
use tlog_tiles::HashReader;

use crate::store::{LogStore, StoreError};

/// Height of every C2SP tile: 2^8 = 256 hashes or entries.
pub const TILE_HEIGHT: u8 = 8;
/// Number of hashes (or entries) in a full tile.
pub const TILE_WIDTH: u64 = 1 << TILE_HEIGHT;

fn to_tlog(h: Hash) -> tlog_tiles::Hash {
    tlog_tiles::Hash(*h.as_bytes())
}

fn from_tlog(h: tlog_tiles::Hash) -> Hash {
    Hash::from_bytes(h.0)
}

/// A `tlog_tiles::HashReader` over a store, optionally with the hashes of a
/// batch not yet committed laid over it (from stored-hash index `first` on).
pub(crate) struct StoredHashes<'a> {
    store: &'a dyn LogStore,
    first: u64,
    overlay: &'a [Hash],
    /// Stored hashes already read (the old tree's frontier), by stored-hash index.
    known: &'a [(u64, Hash)],
    error: RefCell<Option<StoreError>>,
}

impl<'a> StoredHashes<'a> {
    pub(crate) fn new(store: &'a dyn LogStore) -> Self {
        Self::with_overlay(store, u64::MAX, &[])
    }

    pub(crate) fn with_overlay(store: &'a dyn LogStore, first: u64, overlay: &'a [Hash]) -> Self {
        Self {
            store,
            first,
            overlay,
            known: &[],
            error: RefCell::new(None),
        }
    }

    /// A reader over a batch just built: its hashes, the old tree's frontier
    /// (every stored hash a root, inclusion or consistency proof at the new
    /// size needs from before the batch), and the store as a fallback.
    pub(crate) fn for_batch(store: &'a dyn LogStore, batch: &'a BatchHashes) -> Self {
        Self {
            store,
            first: batch.first,
            overlay: &batch.hashes,
            known: &batch.frontier,
            error: RefCell::new(None),
        }
    }

    /// Turns a `tlog_tiles` error back into the storage error that caused it.
    fn lift(&self, e: tlog_tiles::Error) -> StoreError {
        self.error
            .borrow_mut()
            .take()
            .unwrap_or_else(|| StoreError::Corrupt(format!("tree math over stored hashes: {e}")))
    }
}

impl HashReader for StoredHashes<'_> {
    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<tlog_tiles::Hash>, tlog_tiles::Error> {
        let mut out = vec![tlog_tiles::Hash::default(); indexes.len()];
        let mut from_store = Vec::new();
        let mut slots = Vec::new();
        for (slot, &i) in indexes.iter().enumerate() {
            if i >= self.first {
                let k = usize::try_from(i - self.first).ok();
                match k.and_then(|k| self.overlay.get(k)) {
                    Some(h) => out[slot] = to_tlog(*h),
                    None => {
                        *self.error.borrow_mut() = Some(StoreError::Corrupt(format!(
                            "stored hash {i} is not in the batch"
                        )));
                        return Err(tlog_tiles::Error::IndexesNotInTree);
                    }
                }
            } else if let Some((_, h)) = self.known.iter().find(|(k, _)| *k == i) {
                out[slot] = to_tlog(*h);
            } else {
                from_store.push(i);
                slots.push(slot);
            }
        }
        if !from_store.is_empty() {
            match self.store.read_hashes(&from_store) {
                Ok(hashes) if hashes.len() == from_store.len() => {
                    for (slot, h) in slots.into_iter().zip(hashes) {
                        out[slot] = to_tlog(h);
                    }
                }
                Ok(_) => {
                    *self.error.borrow_mut() =
                        Some(StoreError::Corrupt("short read of stored hashes".into()));
                    return Err(tlog_tiles::Error::IndexesNotInTree);
                }
                Err(e) => {
                    *self.error.borrow_mut() = Some(e);
                    return Err(tlog_tiles::Error::IndexesNotInTree);
                }
            }
        }
        Ok(out)
    }
}

/// The root hash of the tree of `size` leaves.
///
/// # Errors
/// [`StoreError`] when a stored hash cannot be read.
pub fn root(store: &dyn LogStore, size: TreeSize) -> Result<Hash, StoreError> {
    root_with(&StoredHashes::new(store), size)
}

/// The root of the tree of `size` leaves with a batch's hashes laid over the store.
pub(crate) fn root_with(reader: &StoredHashes<'_>, size: TreeSize) -> Result<Hash, StoreError> {
    tlog_tiles::tree_hash(size.get(), reader)
        .map(from_tlog)
        .map_err(|e| reader.lift(e))
}

/// RFC 9162 inclusion proof of leaf `index` in the tree of `size`. The
/// caller checks `index < size <= stored size`.
///
/// # Errors
/// [`StoreError`] when a stored hash cannot be read or the arguments are out of range.
pub fn inclusion_proof(
    store: &dyn LogStore,
    index: LeafIndex,
    size: TreeSize,
) -> Result<Vec<Hash>, StoreError> {
    inclusion_proof_with(&StoredHashes::new(store), index, size)
}

/// [`inclusion_proof`] over a given hash reader.
pub(crate) fn inclusion_proof_with(
    reader: &StoredHashes<'_>,
    index: LeafIndex,
    size: TreeSize,
) -> Result<Vec<Hash>, StoreError> {
    if !size.contains(index) {
        return Err(StoreError::Conflict(format!(
            "leaf {index} is not in a tree of size {size}"
        )));
    }
    tlog_tiles::prove_record(size.get(), index.get(), reader)
        .map(|p| p.into_iter().map(from_tlog).collect())
        .map_err(|e| reader.lift(e))
}

/// [`consistency_proof`] over a given hash reader.
pub(crate) fn consistency_proof_with(
    reader: &StoredHashes<'_>,
    from: TreeSize,
    to: TreeSize,
) -> Result<Vec<Hash>, StoreError> {
    if from.get() == 0 || from > to {
        return Err(StoreError::Conflict(format!(
            "no consistency proof from size {from} to {to}"
        )));
    }
    tlog_tiles::prove_tree(to.get(), from.get(), reader)
        .map(|p| p.into_iter().map(from_tlog).collect())
        .map_err(|e| reader.lift(e))
}

/// RFC 9162 consistency proof from the tree of `from` leaves to the tree of
/// `to` leaves, `0 < from <= to`; empty when they are equal.
///
/// # Errors
/// [`StoreError`] when a stored hash cannot be read or the sizes are out of range.
pub fn consistency_proof(
    store: &dyn LogStore,
    from: TreeSize,
    to: TreeSize,
) -> Result<Vec<Hash>, StoreError> {
    consistency_proof_with(&StoredHashes::new(store), from, to)
}

/// The stored hashes that appending `leaves` to a tree of `old_size` adds, in
/// stored-hash order starting at `stored_hash_count(old_size)`.
///
/// The product computes them with `extend`; this, leaf by leaf through
/// the store, is the reference the tests and the benchmarks' bulk filler
/// use.
///
/// # Errors
/// [`StoreError`] when an earlier stored hash cannot be read.
#[cfg(any(test, feature = "testing"))]
pub fn batch_hashes(
    store: &dyn LogStore,
    old_size: TreeSize,
    leaves: &[Hash],
) -> Result<Vec<Hash>, StoreError> {
    let first = tlog_tiles::stored_hash_count(old_size.get());
    let mut added: Vec<Hash> = Vec::with_capacity(leaves.len() * 2);
    for (k, leaf) in leaves.iter().enumerate() {
        let n = old_size.get() + k as u64;
        let r = StoredHashes::with_overlay(store, first, &added);
        let new = tlog_tiles::stored_hashes_for_record_hash(n, to_tlog(*leaf), &r)
            .map_err(|e| r.lift(e))?;
        drop(r);
        added.extend(new.into_iter().map(from_tlog));
    }
    Ok(added)
}

/// The stored hashes a batch adds, with the old tree's frontier they were
/// computed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BatchHashes {
    /// Stored-hash index of `hashes[0]`: `stored_hash_count(old_size)`.
    pub(crate) first: u64,
    /// The new stored hashes, in stored-hash order.
    pub(crate) hashes: Vec<Hash>,
    /// `(stored-hash index, hash)` of each maximal complete subtree of the
    /// old tree, left to right.
    pub(crate) frontier: Vec<(u64, Hash)>,
}

/// `(level, stored-hash index)` of the maximal complete subtrees of a tree
/// of `size` leaves, largest (leftmost) first: one per set bit of `size`.
fn frontier_nodes(size: TreeSize) -> Vec<(u8, u64)> {
    let n = size.get();
    (0..64u8)
        .rev()
        .filter(|l| (n >> l) & 1 == 1)
        .map(|l| (l, tlog_tiles::stored_hash_index(l, (n >> l) - 1)))
        .collect()
}

/// The stored hashes that appending `leaves` to a tree of `old_size` adds
/// (the same as `batch_hashes`), computed in memory from the old tree's
/// frontier, which is read from the store in one call: at most 64 hashes,
/// whatever the batch size.
///
/// # Errors
/// [`StoreError`] when a frontier hash cannot be read.
pub(crate) fn extend(
    store: &dyn LogStore,
    old_size: TreeSize,
    leaves: &[Hash],
) -> Result<BatchHashes, StoreError> {
    let nodes = frontier_nodes(old_size);
    let indexes: Vec<u64> = nodes.iter().map(|(_, i)| *i).collect();
    let read = if indexes.is_empty() {
        Vec::new()
    } else {
        store.read_hashes(&indexes)?
    };
    if read.len() != nodes.len() {
        return Err(StoreError::Corrupt("short read of stored hashes".into()));
    }
    // A stack of complete subtrees (level, hash), left to right: appending a
    // leaf pushes it and merges equal levels, each merge being the next
    // stored hash (Go sumdb/tlog order: the leaf, then the subtrees it completes).
    let mut stack: Vec<(u8, Hash)> = nodes
        .iter()
        .map(|(l, _)| *l)
        .zip(read.iter().copied())
        .collect();
    let mut hashes = Vec::with_capacity(leaves.len() * 2 + 1);
    for leaf in leaves {
        hashes.push(*leaf);
        stack.push((0, *leaf));
        while let [.., (left_level, left), (right_level, right)] = stack[..] {
            if left_level != right_level {
                break;
            }
            let node = from_tlog(tlog_tiles::node_hash(to_tlog(left), to_tlog(right)));
            stack.truncate(stack.len() - 2);
            hashes.push(node);
            stack.push((right_level + 1, node));
        }
    }
    Ok(BatchHashes {
        first: tlog_tiles::stored_hash_count(old_size.get()),
        hashes,
        frontier: indexes.into_iter().zip(read).collect(),
    })
}

/// The hashes of tile `(level, n)` of width `width` (C2SP tlog-tiles: the
/// hashes at tree level `8 * level`, indexes `256 n .. 256 n + width`),
/// concatenated. The caller checks the tile lies within the tree.
///
/// # Errors
/// [`StoreError`] when a stored hash cannot be read.
pub fn tile_hashes(
    store: &dyn LogStore,
    level: u8,
    n: u64,
    width: u64,
) -> Result<Vec<u8>, StoreError> {
    let start = n * TILE_WIDTH;
    let indexes: Vec<u64> = (0..width)
        .map(|i| tlog_tiles::stored_hash_index(TILE_HEIGHT * level, start + i))
        .collect();
    let hashes = store.read_hashes(&indexes)?;
    let mut out = Vec::with_capacity(hashes.len() * 32);
    for h in hashes {
        out.extend_from_slice(h.as_bytes());
    }
    Ok(out)
}

/// How many hashes (or, at level "entries", entries) tile `n` of `level` has
/// in a tree of `size` leaves: 0 when it has none yet, up to [`TILE_WIDTH`].
#[must_use]
pub fn tile_width_at(size: TreeSize, level: u8, n: u64) -> u64 {
    let shift = u32::from(TILE_HEIGHT) * u32::from(level);
    let nodes = if shift >= 64 { 0 } else { size.get() >> shift };
    let start = n.saturating_mul(TILE_WIDTH);
    nodes.saturating_sub(start).min(TILE_WIDTH)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::store::{BatchWrite, NewEntry};
    use tally_schemas::{AgentName, Nonce, Seq};

    fn leaf(i: u64) -> Hash {
        from_tlog(tlog_tiles::record_hash(&i.to_be_bytes()))
    }

    /// `extend` (frontier, in memory) adds exactly the hashes `batch_hashes`
    /// (tlog_tiles, reading the store) does, and proofs over its reader match
    /// proofs read from storage, for batches of every shape.
    #[test]
    fn extend_matches_stored_hash_math() {
        let store = MemoryStore::new();
        let agent = AgentName::new("a").unwrap_or_else(|e| panic!("{e}"));
        let mut size = 0u64;
        for batch_len in [1u64, 1, 2, 3, 5, 8, 13, 1, 64, 7, 100, 255, 256, 1] {
            let old = TreeSize::new(size);
            let leaves: Vec<Hash> = (size..size + batch_len).map(leaf).collect();
            let want = batch_hashes(&store, old, &leaves).unwrap_or_else(|e| panic!("{e}"));
            let got = extend(&store, old, &leaves).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(got.hashes, want, "batch of {batch_len} at {size}");
            let new = TreeSize::new(size + batch_len);
            let entries = leaves
                .iter()
                .enumerate()
                .map(|(k, h)| {
                    let i = size + k as u64;
                    NewEntry {
                        index: LeafIndex::new(i),
                        canonical: i.to_be_bytes().to_vec(),
                        leaf_hash: *h,
                        record_hash: leaf(i + 1_000_000),
                        nonce: Nonce::from_bytes(i.to_be_bytes().repeat(2))
                            .unwrap_or_else(|e| panic!("{e}")),
                        agent: agent.clone(),
                        seq: Seq::new(i).unwrap_or_else(|e| panic!("{e}")),
                        time: tally_schemas::UnixMillis::new(0),
                    }
                })
                .collect();
            store
                .commit_batch(&BatchWrite {
                    old_size: old,
                    entries,
                    hashes: want,
                    receipt_size: new,
                    key_versions: Vec::new(),
                })
                .unwrap_or_else(|e| panic!("{e}"));
            let reader = StoredHashes::for_batch(&store, &got);
            assert_eq!(
                root_with(&reader, new).ok(),
                root(&store, new).ok(),
                "root at {new}"
            );
            for i in size..size + batch_len {
                assert_eq!(
                    inclusion_proof_with(&reader, LeafIndex::new(i), new).ok(),
                    inclusion_proof(&store, LeafIndex::new(i), new).ok(),
                );
            }
            if size > 0 {
                assert_eq!(
                    consistency_proof_with(&reader, old, new).ok(),
                    consistency_proof(&store, old, new).ok(),
                );
            }
            size += batch_len;
        }
    }
}
