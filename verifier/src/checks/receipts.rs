//! Check 8, `receipts` (docs/protocol.md §8, §9.1 and §11): every witnessed
//! record has a receipt whose `record_hash`, `nonce` and `index` equal the
//! record's hash, nonce and entry index, whose `tree_size` names a
//! checkpoint line read before it, with `index < tree_size`; a record with
//! neither `witnessed` nor `receipt` is `pending`; no nonce appears in two
//! records.
//!
//! A checkpoint line that cannot be read (a malformed note or checkpoint,
//! §7.4, or one beyond the lines the header allows) has no size, so a
//! receipt issued under it names no checkpoint line and fails. An
//! unverified line still has its size (check 6 fails it).

use std::collections::BTreeSet;

use tally_schemas::report::{CheckId, CheckResult, RecordRef};
use tally_schemas::tree::TreeSize;

use super::{plural, Agent, Facts};
use crate::nonces::NonceSet;
use crate::spill::Spill;
use crate::tally::Tally;

const POSITION_BITS: u32 = 36;

/// A record's place in the pack as the nonce set keeps it: the agent's
/// position in the header (12 bits) and the seq's offset from its
/// `first_seq` (24 bits).
fn position((agent, offset): (usize, u64)) -> u128 {
    ((agent as u128) << 24) | u128::from(offset & ((1 << 24) - 1))
}

pub(crate) struct Receipts {
    tally: Tally,
    sizes: BTreeSet<u64>,
    receipts: u64,
    nonces: NonceSet,
    /// Each witnessed record's entry index, keyed by its position as the
    /// nonce set keys it, so a record named for reusing a nonce is named
    /// with its `@index` (§11) without keeping every record in memory.
    indexes: Spill<u128>,
    budget: usize,
}

impl Receipts {
    pub(crate) fn new(budget: usize) -> Self {
        Self {
            tally: Tally::new(CheckId::Receipts),
            sizes: BTreeSet::new(),
            receipts: 0,
            nonces: NonceSet::new(budget),
            indexes: Spill::new(budget),
            budget,
        }
    }

    /// A checkpoint line's size (of one that could be read).
    pub(crate) fn checkpoint_size(&mut self, size: TreeSize) {
        self.sizes.insert(size.get());
    }

    pub(crate) fn record(&mut self, f: &Facts<'_>, agents: &[Agent]) {
        let rec = f.record();
        if let Some(r) = &f.work.line.receipt {
            if r.record_hash != f.hash {
                self.tally.fail(
                    f.named(),
                    format!(
                        "receipt names record hash {}, the record hashes to {}",
                        r.record_hash, f.hash
                    ),
                );
            }
            if r.nonce != rec.nonce {
                self.tally.fail(
                    f.named(),
                    format!(
                        "receipt echoes nonce {}, the record's is {}",
                        r.nonce, rec.nonce
                    ),
                );
            }
            if !self.sizes.contains(&r.tree_size.get()) {
                self.tally.fail(
                    f.named(),
                    format!(
                        "receipt's tree_size {} names no checkpoint line",
                        r.tree_size
                    ),
                );
            }
            if r.index.get() >= r.tree_size.get() {
                self.tally.fail(
                    f.named(),
                    format!(
                        "receipt index {} is not below its tree_size {}",
                        r.index, r.tree_size
                    ),
                );
            }
        }
        match (f.witnessed(), &f.work.line.receipt) {
            (Some(w), Some(r)) => {
                if r.index != w.index {
                    self.tally.fail(
                        f.named(),
                        format!(
                            "receipt gives index {}, the entry is at {}",
                            r.index, w.index
                        ),
                    );
                }
                self.receipts += 1;
            }
            (Some(_), None) => self.tally.fail(f.named(), "witnessed but has no receipt"),
            (None, None) => self.tally.pending(f.named(), "not witnessed yet"),
            (None, Some(_)) => self.tally.fail(
                f.named(),
                "has a receipt but its entry is not in the pack (witnessed is null)",
            ),
        }
        // The seq is within the agent's range, so the offset is below
        // MAX_RECORDS_PER_PACK.
        let offset = f.seq() - agents[f.agent].first_seq;
        self.nonces.push(f.work.nonce_fp, f.agent, offset);
        if let Some(w) = f.witnessed() {
            self.indexes
                .push((position((f.agent, offset)) << 64) | u128::from(w.index.get()));
        }
    }

    /// "No nonce appears in two records". The pairs come out of the nonce
    /// set in the order of its fingerprints, which are keyed at random for
    /// each run; they are sorted by the record that reuses the nonce (header
    /// order of agents, then seq), so that the report is the same on every
    /// run.
    ///
    /// # Errors
    /// An I/O error of the spill file.
    pub(crate) fn finish(mut self, agents: &[Agent]) -> std::io::Result<CheckResult> {
        let mut pairs: Spill<u128> = Spill::new(self.budget);
        let nonces = std::mem::replace(&mut self.nonces, NonceSet::new(0));
        nonces.duplicates(|first, again| {
            pairs.push((position(again) << POSITION_BITS) | position(first));
        })?;
        let mut pairs = pairs.sorted()?;
        // Both are sorted by the reusing record's position: one merge.
        let mut indexes = std::mem::replace(&mut self.indexes, Spill::new(0)).sorted()?;
        let mut next_index = indexes.next_item()?;
        let split = |p: u128| {
            let agent = ((p >> 24) & 0xfff) as usize;
            let offset = (p & ((1 << 24) - 1)) as u64;
            (agent, offset)
        };
        while let Some(p) = pairs.next_item()? {
            let (a1, o1) = split(p & ((1 << POSITION_BITS) - 1));
            let (a2, o2) = split(p >> POSITION_BITS);
            let name = |a: usize, o: u64| {
                agents.get(a).map_or_else(
                    || format!("agent {a}"),
                    |s| format!("{}#{}", s.name, s.first_seq + o),
                )
            };
            let at = position((a2, o2));
            while next_index.is_some_and(|e| e >> 64 < at) {
                next_index = indexes.next_item()?;
            }
            let index = next_index.filter(|e| e >> 64 == at).map(|e| e as u64);
            let again = RecordRef {
                agent: agents.get(a2).map_or_else(String::new, |s| s.name.clone()),
                seq: agents.get(a2).map_or(0, |s| s.first_seq) + o2,
                index,
            };
            let msg = format!("nonce reused: already used by {}", name(a1, o1));
            self.tally.fail(Some(again), msg);
        }
        Ok(self.tally.finish(format!(
            "{} bind their records; no nonce repeats",
            plural(self.receipts, "receipt", "receipts")
        )))
    }
}
