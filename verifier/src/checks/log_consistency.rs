//! Check 12, `log_consistency` (docs/protocol.md §7.2 and §11): every
//! checkpoint line's size is at most the pack checkpoint's and its
//! consistency proof (at most 64 hashes) verifies; a line of size 0 has
//! root `SHA-256("")` and an empty list; a line of the pack's own size has
//! an empty list and the same root; no two checkpoints of one size (lines,
//! header, head) have different roots, and one of size 0 has the empty
//! tree's.

use std::collections::BTreeMap;

use tally_schemas::limits::MAX_PROOF_HASHES;
use tally_schemas::note::Checkpoint;
use tally_schemas::report::{CheckId, CheckResult};
use tally_schemas::tree::{empty_root, verify_consistency, TreeSize};
use tally_schemas::Hash;

use super::plural;
use crate::tally::Tally;

pub(crate) struct LogConsistency {
    tally: Tally,
    /// The first root seen for each size, and where it was seen.
    roots: BTreeMap<u64, (Hash, String)>,
    lines: u64,
}

impl LogConsistency {
    pub(crate) fn new() -> Self {
        // Size 0 has one root, the empty tree's (§7.2): any checkpoint of
        // size 0 (header, line or head) with another root conflicts with it.
        let roots = BTreeMap::from([(0, (empty_root(), "the empty tree's, §7.2".to_owned()))]);
        Self {
            tally: Tally::new(CheckId::LogConsistency),
            roots,
            lines: 0,
        }
    }

    /// A checkpoint's size and root (`source` names it in messages): two
    /// roots for one size are a split view.
    pub(crate) fn root(&mut self, size: TreeSize, root: Hash, source: String) {
        let size = size.get();
        match self.roots.get(&size) {
            Some((r, first)) if *r != root => {
                let msg = format!("two checkpoints of size {size} have different roots ({first} and {source}): a split view");
                self.tally.fail(None, msg);
            }
            Some(_) => {}
            None => {
                self.roots.insert(size, (root, source));
            }
        }
    }

    /// A checkpoint line that was read; `cp` is `None` when it is malformed,
    /// `pack` the pack checkpoint's size and root when they could be read.
    pub(crate) fn line(
        &mut self,
        n: u64,
        cp: Option<&Checkpoint>,
        consistency: &[Hash],
        pack: Option<(TreeSize, Hash)>,
    ) {
        self.lines += 1;
        let Some(cp) = cp else {
            self.tally.fail(
                None,
                format!("checkpoint line {n}: the checkpoint cannot be read"),
            );
            return;
        };
        let size = cp.size.get();
        self.root(cp.size, cp.root, format!("checkpoint line {n}"));
        let Some((psize, proot)) = pack else {
            self.tally.fail(
                None,
                format!("checkpoint line {n}: the pack checkpoint cannot be read, so nothing is proven against it"),
            );
            return;
        };
        let fail = |msg: String| format!("checkpoint line {n} (size {size}): {msg}");
        if size > psize.get() {
            self.tally.fail(
                None,
                fail(format!("larger than the pack checkpoint's size {psize}")),
            );
        } else if consistency.len() > MAX_PROOF_HASHES {
            self.tally.fail(
                None,
                fail(format!(
                    "consistency proof has {} hashes, more than {MAX_PROOF_HASHES}",
                    consistency.len()
                )),
            );
        } else if size == 0 {
            if cp.root != empty_root() || !consistency.is_empty() {
                self.tally.fail(
                    None,
                    fail("an empty tree must have root SHA-256(\"\") and an empty proof".into()),
                );
            }
        } else if let Err(e) = verify_consistency(cp.size, psize, &cp.root, &proot, consistency) {
            self.tally.fail(
                None,
                fail(format!(
                    "not consistent with the pack checkpoint of size {psize}: {e}"
                )),
            );
        }
    }

    pub(crate) fn finish(self) -> CheckResult {
        self.tally.finish(format!(
            "{} consistent with the pack checkpoint",
            plural(self.lines, "checkpoint line is", "checkpoint lines are")
        ))
    }
}
