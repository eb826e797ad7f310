//! Entries and receipts read back from storage (docs/protocol.md §8): the
//! receipt of a stored entry is rebuilt byte for byte as first issued, from
//! its entry, its receipt size, the checkpoint note stored at that size and
//! the inclusion proof in that tree.

use tally_schemas::entry::RECEIPT_VERSION;
use tally_schemas::{Checkpoint, Entry, Hash, LeafIndex, NoteSigner, Receipt};

use crate::error::ReadError;
use crate::store::{LogStore, StoreError};
use crate::tree;

/// The entry stored at `index`, parsed.
///
/// # Errors
/// [`ReadError`] when storage fails or the entry does not parse.
pub(crate) fn read_entry(
    store: &dyn LogStore,
    index: LeafIndex,
) -> Result<Option<Entry>, ReadError> {
    let next = LeafIndex::new(index.get().saturating_add(1));
    let Some(bytes) = store.entries(index, next)?.into_iter().next() else {
        return Ok(None);
    };
    let entry =
        Entry::from_json(&bytes).map_err(|source| ReadError::CorruptEntry { index, source })?;
    if entry.index() != index {
        return Err(ReadError::Store(StoreError::Corrupt(format!(
            "entry stored at {index} says index {}",
            entry.index()
        ))));
    }
    Ok(Some(entry))
}

/// Rebuilds the receipt first issued for `index` from storage.
///
/// Its checkpoint note is always stored (recovery stores the note of the
/// only batch that can be beyond the latest stored checkpoint). Should one
/// still be missing, it is re-signed from the stored tree: the note is a
/// deterministic function of the tree of that size and the key, so these are
/// the bytes first issued, and any tree the store holds is consistent with
/// every checkpoint signed over it.
///
/// # Errors
/// [`ReadError`] when storage fails or is inconsistent.
pub(crate) fn stored_receipt(
    store: &dyn LogStore,
    signer: &NoteSigner,
    index: LeafIndex,
) -> Result<Option<(Entry, Receipt)>, ReadError> {
    let Some(entry) = read_entry(store, index)? else {
        return Ok(None);
    };
    let size = store.receipt_size(index)?.ok_or_else(|| {
        ReadError::Store(StoreError::Corrupt(format!(
            "entry {index} has no receipt size"
        )))
    })?;
    let note = match store.checkpoint(size)? {
        Some(note) => note,
        None if size <= store.size()? => {
            let root = tree::root(store, size)?;
            signer
                .sign_checkpoint(&Checkpoint::new(signer.verifier().name(), size, root))
                .map_err(|_| ReadError::MissingCheckpoint { index, size })?
        }
        None => return Err(ReadError::MissingCheckpoint { index, size }),
    };
    let inclusion = tree::inclusion_proof(store, index, size)?;
    let receipt = make_receipt(&entry, note, inclusion);
    Ok(Some((entry, receipt)))
}

/// The receipt of `entry` under the checkpoint `note`, with its inclusion proof.
pub(crate) fn make_receipt(entry: &Entry, checkpoint: String, inclusion: Vec<Hash>) -> Receipt {
    Receipt {
        v: RECEIPT_VERSION,
        record_hash: entry.record().hash(),
        nonce: entry.record().nonce.clone(),
        index: entry.index(),
        received: entry.received(),
        checkpoint,
        inclusion,
    }
}
