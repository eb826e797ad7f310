//! Check 6, `witness_signatures` (docs/protocol.md §7.4 and §11): the
//! header checkpoint and every checkpoint line verify with the pinned log
//! key, whose name is the pack's origin; with a trust file's quorum
//! (§11.1), the header checkpoint also carries enough witness
//! cosignatures.
//!
//! A checkpoint that does not verify fails here, and what the other checks
//! do next depends on why (§7.4): an *unverified* checkpoint (well formed,
//! not signed by the pinned key) still gives its size and root to the
//! checks that use them; a *malformed* one gives nothing.

use tally_schemas::note::{
    open_checkpoint, peek_checkpoint, Checkpoint, NoteError, NoteVerifier, SignedNote,
};
use tally_schemas::report::{CheckId, CheckResult};

use super::plural;
use crate::tally::Tally;
use crate::trust::WitnessPolicy;

pub(crate) struct WitnessSignatures<'a> {
    tally: Tally,
    key: &'a NoteVerifier,
    origin: String,
    verified: u64,
    /// With a trust file: how many of its witnesses cosigned the header
    /// checkpoint, and its quorum (said in the pass message).
    quorum: Option<(usize, usize)>,
}

/// The names and key ids of the keys that signed `note` (`name+hash`,
/// comma-separated), for a message about a note the pinned key did not sign.
pub(crate) fn signers(note: &str) -> String {
    SignedNote::parse(note)
        .map(|n| {
            n.signatures
                .iter()
                .map(|s| format!("{}+{:08x}", s.name, s.key_id))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}

impl<'a> WitnessSignatures<'a> {
    /// `origin` is the pack header's.
    pub(crate) fn new(key: &'a NoteVerifier, origin: &str) -> Self {
        let mut tally = Tally::new(CheckId::WitnessSignatures);
        if origin != key.name() {
            tally.fail(
                None,
                format!(
                    "the pack's origin {origin:?} is not the pinned key's name {:?}",
                    key.name()
                ),
            );
        }
        Self {
            tally,
            key,
            origin: origin.to_owned(),
            verified: 0,
            quorum: None,
        }
    }

    /// Opens a checkpoint of the pack (`what` names it in messages): the
    /// checkpoint when it verifies or is only unverified, `None` when it is
    /// malformed.
    pub(crate) fn open(&mut self, note: &str, what: &str) -> Option<Checkpoint> {
        match open_checkpoint(note, self.key) {
            Ok(cp) => {
                if cp.origin != self.origin {
                    self.tally.fail(
                        None,
                        format!(
                            "{what} names origin {:?}, the pack's is {:?}",
                            cp.origin, self.origin
                        ),
                    );
                }
                self.verified += 1;
                Some(cp)
            }
            Err(e @ NoteError::NotSignedByKey { .. }) => {
                // Name the keys that did sign: the usual cause is a pack
                // from another log, or another log's key given.
                let signers = signers(note);
                self.tally.fail(
                    None,
                    format!(
                        "{what}: {e}; it is signed by {signers}: the pack comes from another log than the pinned key's, or the key given is not this log's (give the witness key its `tally serve` printed, or its keys.json's)"
                    ),
                );
                peek_checkpoint(note).ok()
            }
            Err(e) => {
                self.tally.fail(None, format!("{what}: {e}"));
                peek_checkpoint(note).ok()
            }
        }
    }

    /// The trust file's quorum of cosignatures on the header checkpoint.
    pub(crate) fn cosignatures(&mut self, policy: &WitnessPolicy, note: &str) {
        match policy.check(note) {
            Ok(count) => self.quorum = Some((count, policy.quorum)),
            Err(e) => self.tally.fail(None, format!("pack checkpoint: {e}")),
        }
    }

    pub(crate) fn finish(self) -> CheckResult {
        let quorum = match self.quorum {
            Some((count, quorum)) if quorum > 0 => format!(
                "; the pack checkpoint is cosigned by {count} of the trust file's cosigners (`witness` lines), its quorum is {quorum}"
            ),
            _ => String::new(),
        };
        self.tally.finish(format!(
            "{} verify with the pinned key {}{quorum}",
            plural(self.verified, "checkpoint", "checkpoints"),
            self.key.name()
        ))
    }
}
