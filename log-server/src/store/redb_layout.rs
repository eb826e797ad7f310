//! The tables and keys of a redb log file, storage layout 4
//! (docs/storage.md, "redb layout"), shared by the store (`redb.rs`) and
//! the migration of older layouts (`redb_v1.rs`).

use redb::{ReadableTable, TableDefinition};
use tally_schemas::{Hash, Nonce, TreeSize};

use super::StoreError;

/// `meta`: named counters. `tree_size` = number of committed entries;
/// `layout` = the storage layout version; `ids_to` = `ids` and `chains`
/// hold the rows of the entries before it (the rest are rebuilt from the
/// entries at open); `migrated_to` = while a layout 1 file is being
/// migrated, the entries already carried over.
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// `entries`: leaf index → the entry's canonical JSON bytes (the leaf data).
pub(crate) const ENTRIES: TableDefinition<u64, &[u8]> = TableDefinition::new("entries");
/// `checkpoints`: tree size → signed checkpoint note (UTF-8 text).
pub(crate) const CHECKPOINTS: TableDefinition<u64, &str> = TableDefinition::new("checkpoints");
/// `cosignatures`: (tree size, cosigner key `name+keyid`) → the
/// cosigner's signature line on the checkpoint of that size (UTF-8 text).
/// Added within layout 2: an older build ignores the table.
pub(crate) const COSIGNATURES: TableDefinition<(u64, &str), &str> =
    TableDefinition::new("cosignatures");
/// `leaves`: leaf index → receipt size (u64, little-endian) ‖ the
/// `1 + trailing_ones(index)` stored hashes that appending this leaf adds.
pub(crate) const LEAVES: TableDefinition<u64, &[u8]> = TableDefinition::new("leaves");
/// `chains`: (agent name, seq) → (leaf index, record hash). It holds the
/// rows of the entries before `meta.ids_to`; [`PendingRows`] holds the
/// others. An agent's chain head is its last row in either.
pub(crate) const CHAINS: TableDefinition<(&str, u64), (u64, [u8; 32])> =
    TableDefinition::new("chains");
/// `ids`: (kind byte ‖ the first 15 bytes of a digest, leaf index) → ().
/// Kinds: [`ID_NONCE`] (digest = SHA-256 of the nonce), [`ID_RECORD`]
/// (the record hash), [`ID_LEAF`] (the leaf hash). It holds the rows of the
/// entries before `meta.ids_to`; [`PendingRows`] holds the others.
pub(crate) const IDS: TableDefinition<([u8; 16], u64), ()> = TableDefinition::new("ids");

/// Kind byte of a nonce key in `ids`.
pub(crate) const ID_NONCE: u8 = 1;
/// Kind byte of a record-hash key in `ids`.
pub(crate) const ID_RECORD: u8 = 2;
/// Kind byte of a leaf-hash key in `ids`.
pub(crate) const ID_LEAF: u8 = 3;

/// The storage layout version this build writes (`meta.layout`).
pub const LAYOUT_VERSION: u64 = 4;

/// Entries carried over per transaction when a layout 1 file is migrated,
/// unless `TALLY_LOG_MIGRATION_CHUNK` says otherwise (tests set it small
/// to kill the migration between many commits).
pub const DEFAULT_MIGRATION_CHUNK: u64 = 20_000;

pub(crate) fn backend<E: std::fmt::Display>(e: E) -> StoreError {
    StoreError::Backend(e.to_string())
}

/// The `meta` counter `key` (0 when absent).
pub(crate) fn meta_u64(
    meta: &impl ReadableTable<&'static str, u64>,
    key: &str,
) -> Result<u64, StoreError> {
    Ok(meta.get(key).map_err(backend)?.map_or(0, |g| g.value()))
}

/// The `ids` key of a digest of the given kind.
pub(crate) fn id_key(kind: u8, digest: &Hash) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[0] = kind;
    k[1..].copy_from_slice(&digest.as_bytes()[..15]);
    k
}

/// The `ids` key of a nonce.
pub(crate) fn nonce_key(nonce: &Nonce) -> [u8; 16] {
    id_key(ID_NONCE, &Hash::sha256(nonce.as_bytes()))
}

/// The number of stored hashes leaf `index` appends.
pub(crate) fn hashes_of_leaf(index: u64) -> usize {
    1 + index.trailing_ones() as usize
}

/// A `leaves` row: receipt size, then the leaf's stored hashes.
pub(crate) fn leaf_row(receipt_size: TreeSize, hashes: &[Hash]) -> Vec<u8> {
    let mut row = Vec::with_capacity(8 + 32 * hashes.len());
    write_leaf_row(&mut row, receipt_size, hashes);
    row
}

/// [`leaf_row`] into `row`, which it clears first (a commit reuses one buffer).
pub(crate) fn write_leaf_row(row: &mut Vec<u8>, receipt_size: TreeSize, hashes: &[Hash]) {
    row.clear();
    row.extend_from_slice(&receipt_size.get().to_le_bytes());
    for h in hashes {
        row.extend_from_slice(h.as_bytes());
    }
}
