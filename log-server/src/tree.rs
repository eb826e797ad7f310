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
    let r = StoredHashes::new(store);
    tlog_tiles::tree_hash(size.get(), &r)
        .map(from_tlog)
        .map_err(|e| r.lift(e))
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
    if !size.contains(index) {
        return Err(StoreError::Conflict(format!(
            "leaf {index} is not in a tree of size {size}"
        )));
    }
    let r = StoredHashes::new(store);
    tlog_tiles::prove_record(size.get(), index.get(), &r)
        .map(|p| p.into_iter().map(from_tlog).collect())
        .map_err(|e| r.lift(e))
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
    if from.get() == 0 || from > to {
        return Err(StoreError::Conflict(format!(
            "no consistency proof from size {from} to {to}"
        )));
    }
    let r = StoredHashes::new(store);
    tlog_tiles::prove_tree(to.get(), from.get(), &r)
        .map(|p| p.into_iter().map(from_tlog).collect())
        .map_err(|e| r.lift(e))
}

/// The stored hashes that appending `leaves` to a tree of `old_size` adds, in
/// stored-hash order starting at `stored_hash_count(old_size)`.
///
/// # Errors
/// [`StoreError`] when an earlier stored hash cannot be read.
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
