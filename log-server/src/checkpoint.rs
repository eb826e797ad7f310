//! Checkpointing (docs/storage.md, "Write path" steps 5–6 and "Recovery";
//! docs/protocol.md §7.3): signing a C2SP checkpoint only over a tree that
//! is durable and proven consistent with the last one signed, storing it,
//! and recovering the latest checkpoint from storage at open and after a
//! write error.

use tally_schemas::note::open_checkpoint;
use tally_schemas::tree::verify_consistency;
use tally_schemas::{Checkpoint, Hash, NoteSigner, TreeSize};

use crate::error::OpenError;
use crate::store::{LogStore, StoreError};
use crate::tree::{self, StoredHashes};

/// A checkpoint the log signed and stored, with its note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedCheckpoint {
    /// The parsed body.
    pub checkpoint: Checkpoint,
    /// The signed note, as served at `/checkpoint`.
    pub note: String,
}

/// Recovery: check the latest signed checkpoint against storage, and sign
/// one over the stored size if it is newer, after proving it consistent.
/// Returns the latest checkpoint.
///
/// # Errors
/// [`OpenError`] when storage fails or does not extend what was signed.
pub(crate) fn recover(
    store: &dyn LogStore,
    signer: &NoteSigner,
) -> Result<SignedCheckpoint, OpenError> {
    let size = store.size()?;
    let previous = match store.latest_checkpoint()? {
        None => None,
        Some((cs, note)) => {
            let cp = open_checkpoint(&note, signer.verifier())
                .map_err(|source| OpenError::ForeignCheckpoint { size: cs, source })?;
            if cp.size != cs {
                return Err(OpenError::Store(StoreError::Corrupt(format!(
                    "checkpoint stored under size {cs} says size {}",
                    cp.size
                ))));
            }
            if cs > size {
                return Err(OpenError::CheckpointBeyondStorage {
                    checkpoint_size: cs,
                    tree_size: size,
                });
            }
            let stored_root = tree::root(store, cs)?;
            if stored_root != cp.root {
                return Err(OpenError::RootMismatch {
                    size: cs,
                    checkpoint_root: cp.root,
                    stored_root,
                });
            }
            if cs == size {
                return Ok(SignedCheckpoint {
                    checkpoint: cp,
                    note,
                });
            }
            Some(cp)
        }
    };
    let new_root = tree::root(store, size)?;
    if let Some(prev) = &previous {
        check_extends(&StoredHashes::new(store), prev, size, &new_root)?;
    }
    sign_and_store(store, signer, size, new_root)
}

/// Proves the tree of `size` with `new_root`, read through `reader`,
/// consistent with `prev`.
///
/// # Errors
/// [`OpenError::Inconsistent`], or storage failure.
pub(crate) fn check_extends(
    reader: &StoredHashes<'_>,
    prev: &Checkpoint,
    size: TreeSize,
    new_root: &Hash,
) -> Result<(), OpenError> {
    if prev.size.get() == 0 {
        return Ok(());
    }
    let proof = tree::consistency_proof_with(reader, prev.size, size)?;
    verify_consistency(prev.size, size, &prev.root, new_root, &proof).map_err(|source| {
        OpenError::Inconsistent {
            from: prev.size,
            to: size,
            source,
        }
    })
}

/// Signs a checkpoint of `size` and `root` and stores it (durable with the
/// next batch: the note is a deterministic function of durable state).
///
/// # Errors
/// [`OpenError::Sign`], or storage refusing the note.
pub(crate) fn sign_and_store(
    store: &dyn LogStore,
    signer: &NoteSigner,
    size: TreeSize,
    root: Hash,
) -> Result<SignedCheckpoint, OpenError> {
    let checkpoint = Checkpoint::new(signer.verifier().name(), size, root);
    let note = signer
        .sign_checkpoint(&checkpoint)
        .map_err(OpenError::Sign)?;
    store.put_checkpoint(size, &note)?;
    Ok(SignedCheckpoint { checkpoint, note })
}

/// An [`OpenError`] met while appending, as the storage error appends report.
pub(crate) fn open_error_to_store(e: OpenError) -> StoreError {
    match e {
        OpenError::Store(s) => s,
        other => StoreError::Corrupt(other.to_string()),
    }
}
