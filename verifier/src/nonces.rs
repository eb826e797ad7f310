//! The nonce-uniqueness rule of docs/protocol.md §11 check 8 ("no nonce
//! appears in two records") over a whole pack, in 16 bytes per record.
//!
//! Each record contributes one `u128`: the top 92 bits of a 128-bit keyed
//! fingerprint of its nonce (SipHash keyed at random for each run, so a pack
//! cannot be built to collide), then the agent's position in the header (12
//! bits, `MAX_AGENTS_PER_PACK` = 4096) and the record's seq offset from the
//! agent's `first_seq` (24 bits, `MAX_RECORDS_PER_PACK` = 2^24). Sorting the
//! vector at the end puts equal fingerprints side by side and still names
//! both records. Two different nonces share 92 bits with probability about
//! n²/2^93 (2^-45 at the 16.7-million-record limit); that would show as a
//! false `fail` naming two records a person can compare, never a false pass.
//! The set is kept within a memory budget by [`crate::spill`]: past it,
//! sorted runs go to a temporary file and are merged at the end, which gives
//! the same sorted sequence, and so the same pairs, as one sort in memory.

use std::io;

use crate::spill::Spill;

const AGENT_BITS: u32 = 12;
const OFFSET_BITS: u32 = 24;
const LOW_BITS: u32 = AGENT_BITS + OFFSET_BITS;

pub(crate) struct NonceSet {
    entries: Spill<u128>,
}

fn split(e: u128) -> (usize, u64) {
    let agent = ((e >> OFFSET_BITS) & ((1 << AGENT_BITS) - 1)) as usize;
    let offset = (e & ((1 << OFFSET_BITS) - 1)) as u64;
    (agent, offset)
}

impl NonceSet {
    /// A set that keeps at most `budget_bytes` in memory.
    pub(crate) fn new(budget_bytes: usize) -> Self {
        Self {
            entries: Spill::new(budget_bytes),
        }
    }

    /// Adds a record's nonce fingerprint; `agent` and `offset` must fit the
    /// limits above (the caller refuses packs beyond them as `schema`).
    pub(crate) fn push(&mut self, fingerprint: u128, agent: usize, offset: u64) {
        let low = ((agent as u128 & ((1 << AGENT_BITS) - 1)) << OFFSET_BITS)
            | (u128::from(offset) & ((1 << OFFSET_BITS) - 1));
        self.entries
            .push((fingerprint >> LOW_BITS << LOW_BITS) | low);
    }

    /// Calls `found(first, again)` for each pair of records that share a
    /// nonce, each as `(agent position, seq offset)`, first use first in
    /// sort order.
    ///
    /// # Errors
    /// An I/O error of the temporary file.
    pub(crate) fn duplicates(
        self,
        mut found: impl FnMut((usize, u64), (usize, u64)),
    ) -> io::Result<()> {
        let mut sorted = self.entries.sorted()?;
        let mut last: Option<u128> = None;
        while let Some(e) = sorted.next_item()? {
            if let Some(p) = last {
                if p >> LOW_BITS == e >> LOW_BITS {
                    found(split(p), split(e));
                }
            }
            last = Some(e);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(s: NonceSet) -> Vec<((usize, u64), (usize, u64))> {
        let mut out = Vec::new();
        s.duplicates(|a, b| out.push((a, b))).unwrap();
        out
    }

    #[test]
    fn finds_repeats_and_names_both() {
        let mut s = NonceSet::new(1 << 20);
        s.push(u128::MAX - 5, 1, 7);
        s.push(42 << 64, 0, 0);
        s.push(u128::MAX - 9, 3, 2); // same top 92 bits as the first
        s.push(43 << 64, 0, 1);
        assert_eq!(pairs(s), vec![((1, 7), (3, 2))]);
        let mut none = NonceSet::new(1 << 20);
        none.push(1 << 100, 0, 0);
        none.push(2 << 100, 0, 1);
        assert!(pairs(none).is_empty());
    }

    #[test]
    fn a_repeat_is_found_across_spilled_runs() {
        // Four entries a run: the two uses of one nonce land in runs far
        // apart, and the answer is the one an in-memory sort gives.
        let fingerprint = |i: u64| u128::from(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)) << 64;
        let mut small = NonceSet::new(4 * 16);
        let mut large = NonceSet::new(1 << 20);
        for i in 0..1000u64 {
            let fp = if i == 977 {
                fingerprint(3)
            } else {
                fingerprint(i)
            };
            small.push(fp, (i % 5) as usize, i / 5);
            large.push(fp, (i % 5) as usize, i / 5);
        }
        // 250 runs of 4, merged sixteen at a time: 15 of 64 and 10 of 4.
        assert_eq!(small.entries.runs(), 25);
        assert_eq!(large.entries.runs(), 0);
        let found = pairs(small);
        assert_eq!(found, vec![((2, 195), (3, 0))]);
        assert_eq!(found, pairs(large));
    }
}
