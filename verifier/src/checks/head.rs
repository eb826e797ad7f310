//! Check 11, `head` (docs/protocol.md §9.4 and §11): with head.json, the
//! head checkpoint verifies with the pinned key and extends the pack's;
//! each head record is trusted, signed and proven in it; every header agent
//! appears, and for each, with `h` the head record's seq, `w` the agent's
//! highest witnessed seq in the pack (the first record in pack order with
//! that seq, when a fork repeats it) and `L` the header's `last_seq`:
//! `h < w` fails (the head is older), `h = w` with another record hash fails
//! (a fork), `h > L` fails when the head record was logged inside the pack's
//! tree or received by the pack's `created` time (records were cut from the
//! end). An agent with no witnessed record in the pack has no `w`: only the
//! last rule applies. Without head.json the check is `not checked`.
//!
//! head.json itself was read strictly (§9.4: a malformed checkpoint or an
//! over-long proof is a usage error), so everything judged here is evidence.

use std::collections::HashMap;

use tally_schemas::limits::MAX_PROOF_HASHES;
use tally_schemas::note::{open_checkpoint, peek_checkpoint, NoteError, NoteVerifier};
use tally_schemas::pack::Head;
use tally_schemas::report::{CheckId, CheckResult, RecordRef};
use tally_schemas::time::UnixMillis;
use tally_schemas::tree::{verify_consistency, InclusionPaths, TreeSize};
use tally_schemas::Hash;

use super::log_consistency::LogConsistency;
use super::witness_signatures::signers;
use super::{Agent, Facts};
use crate::pool::{self, Context, KeyStatus};
use crate::sig::verify_record;
use crate::tally::Tally;

pub(crate) struct HeadCheck {
    tally: Tally,
    /// Per agent, the highest witnessed seq and the hash of the first
    /// record in pack order with it.
    witnessed: Vec<Option<(u64, Hash)>>,
}

/// What the pack says that check 11 compares the head with.
pub(crate) struct PackSide<'a> {
    pub agents: &'a [Agent],
    /// The pack checkpoint's size and root, when they could be read.
    pub tree: Option<(TreeSize, Hash)>,
    pub created: UnixMillis,
    /// The pack header's origin.
    pub origin: &'a str,
}

impl HeadCheck {
    pub(crate) fn new(agents: usize) -> Self {
        Self {
            tally: Tally::new(CheckId::Head),
            witnessed: vec![None; agents],
        }
    }

    /// Keeps `w`.
    pub(crate) fn record(&mut self, f: &Facts<'_>) {
        if f.witnessed().is_none() {
            return;
        }
        let w = &mut self.witnessed[f.agent];
        if w.is_none_or(|(seq, _)| f.seq() > seq) {
            *w = Some((f.seq(), f.hash));
        }
    }

    /// No head.json was given.
    pub(crate) fn not_given(&mut self) {
        self.tally.not_checked(
            "no head.json given (--head), so the pack cannot show that nothing was cut from the end",
        );
    }

    /// Judges head.json against the pack.
    #[allow(clippy::too_many_lines)]
    pub(crate) fn check(
        &mut self,
        head: &Head,
        key: &NoteVerifier,
        keys: &Context,
        pack: &PackSide<'_>,
        consistency: &mut LogConsistency,
    ) {
        let cp = match open_checkpoint(&head.checkpoint, key) {
            Ok(cp) => Some(cp),
            Err(e @ NoteError::NotSignedByKey { .. }) => {
                let peeked = peek_checkpoint(&head.checkpoint).ok();
                let why = match &peeked {
                    Some(cp) if cp.origin != pack.origin => format!(
                        "head.json comes from the log {:?}, the pack from {:?}: make head.json with the witness that exported the pack (`tally head --pack PACK --witness URL`)",
                        cp.origin, pack.origin
                    ),
                    _ => "the key given is not this log's (give the witness key its `tally serve` printed, or its keys.json's)".to_owned(),
                };
                self.tally.fail(
                    None,
                    format!(
                        "head checkpoint: {e}; it is signed by {}: {why}",
                        signers(&head.checkpoint)
                    ),
                );
                peeked
            }
            Err(e) => {
                self.tally.fail(None, format!("head checkpoint: {e}"));
                peek_checkpoint(&head.checkpoint).ok()
            }
        };
        // head.json was refused if its checkpoint was malformed.
        let Some(cp) = cp else { return };
        consistency.root(cp.size, cp.root, "the head checkpoint".into());
        match pack.tree {
            None => self.tally.fail(None, "the pack checkpoint cannot be read"),
            Some((psize, _)) if head.from_size != psize => self.tally.fail(
                None,
                format!(
                    "from_size {} is not the pack checkpoint's size {psize}: head.json was made for another pack (an older export?); make it again for this one with `tally head --pack PACK -o head.json`",
                    head.from_size
                ),
            ),
            Some(_) if head.consistency.len() > MAX_PROOF_HASHES => self
                .tally
                .fail(None, "the head's consistency proof is too long"),
            Some((psize, _)) if psize.get() == 0 => {
                if !head.consistency.is_empty() {
                    self.tally.fail(
                        None,
                        "from size 0 the consistency proof must be empty (no proof from the empty tree exists)",
                    );
                }
            }
            Some((psize, proot)) => {
                if let Err(e) =
                    verify_consistency(psize, cp.size, &proot, &cp.root, &head.consistency)
                {
                    self.tally.fail(
                        None,
                        format!("the head checkpoint (size {}) does not extend the pack's (size {psize}): {e}", cp.size),
                    );
                }
            }
        }
        let mut by_agent: HashMap<&str, (u64, Hash, u64, UnixMillis)> = HashMap::new();
        for ha in &head.agents {
            let r = &ha.record;
            let rref = RecordRef {
                agent: r.agent.as_str().to_owned(),
                seq: r.seq.get(),
                index: Some(ha.witnessed.index.get()),
            };
            let (status, trusted) = pool::lookup_key(&keys.keys, r);
            if status != KeyStatus::Active {
                self.tally.fail(
                    Some(rref.clone()),
                    "head record's key is not a trusted key active at its time",
                );
            }
            if trusted.is_some_and(|k| !verify_record(r, &k.public_key)) {
                self.tally.fail(
                    Some(rref.clone()),
                    "head record's signature does not verify",
                );
            }
            if let Err(e) = pool::prove_entry(
                &mut InclusionPaths::default(),
                ha.witnessed.index,
                ha.witnessed.received,
                r,
                &ha.witnessed.inclusion,
                cp.size,
                &cp.root,
            ) {
                self.tally
                    .fail(Some(rref.clone()), format!("head record: {e}"));
            }
            by_agent.insert(
                r.agent.as_str(),
                (
                    r.seq.get(),
                    r.hash(),
                    ha.witnessed.index.get(),
                    ha.witnessed.received,
                ),
            );
        }
        let psize = pack.tree.map_or(0, |(s, _)| s.get());
        for (a, w) in pack.agents.iter().zip(&self.witnessed) {
            let Some(&(h, hash, index, received)) = by_agent.get(a.name.as_str()) else {
                self.tally
                    .fail(None, format!("agent {} is not in head.json", a.name));
                continue;
            };
            let rref = RecordRef {
                agent: a.name.clone(),
                seq: h,
                index: Some(index),
            };
            match *w {
                Some((wseq, _)) if h < wseq => self.tally.fail(
                    Some(rref),
                    format!(
                        "head record is older than the pack's last witnessed record (seq {wseq})"
                    ),
                ),
                Some((wseq, whash)) if h == wseq && hash != whash => self.tally.fail(
                    Some(rref),
                    format!("head record at seq {h} differs from the pack's (a fork)"),
                ),
                _ if h > a.last_seq && (index < psize || received <= pack.created) => {
                    self.tally.fail(
                        Some(rref),
                        format!(
                            "records {}..={h} were cut from the end: the head record was logged at index {index}, inside the pack's tree or before the pack was made",
                            a.last_seq + 1
                        ),
                    );
                }
                _ => {}
            }
        }
    }

    pub(crate) fn finish(self) -> CheckResult {
        self.tally.finish(
            "the head checkpoint extends the pack's, and no record is cut from the end".into(),
        )
    }
}
