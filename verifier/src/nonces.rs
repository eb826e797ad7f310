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
//! This set is the one part of the verifier's memory that grows with the
//! pack: 16 bytes per record (docs/benchmarks.md).

const AGENT_BITS: u32 = 12;
const OFFSET_BITS: u32 = 24;
const LOW_BITS: u32 = AGENT_BITS + OFFSET_BITS;

#[derive(Debug, Default)]
pub(crate) struct NonceSet {
    entries: Vec<u128>,
}

impl NonceSet {
    /// Adds a record's nonce fingerprint; `agent` and `offset` must fit the
    /// limits above (the caller refuses packs beyond them as `schema`).
    pub(crate) fn push(&mut self, fingerprint: u128, agent: usize, offset: u64) {
        let low = ((agent as u128 & ((1 << AGENT_BITS) - 1)) << OFFSET_BITS)
            | (u128::from(offset) & ((1 << OFFSET_BITS) - 1));
        self.entries
            .push((fingerprint >> LOW_BITS << LOW_BITS) | low);
    }

    /// The pairs `(first, again)` of records that share a nonce, each as
    /// `(agent position, seq offset)`, first use first in sort order.
    pub(crate) fn duplicates(mut self) -> Vec<((usize, u64), (usize, u64))> {
        self.entries.sort_unstable();
        let split = |e: u128| {
            let agent = ((e >> OFFSET_BITS) & ((1 << AGENT_BITS) - 1)) as usize;
            let offset = (e & ((1 << OFFSET_BITS) - 1)) as u64;
            (agent, offset)
        };
        let mut out = Vec::new();
        for pair in self.entries.windows(2) {
            if pair[0] >> LOW_BITS == pair[1] >> LOW_BITS {
                out.push((split(pair[0]), split(pair[1])));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_repeats_and_names_both() {
        let mut s = NonceSet::default();
        s.push(u128::MAX - 5, 1, 7);
        s.push(42 << 64, 0, 0);
        s.push(u128::MAX - 9, 3, 2); // same top 92 bits as the first
        s.push(43 << 64, 0, 1);
        let d = s.duplicates();
        assert_eq!(d, vec![((1, 7), (3, 2))]);
        let mut none = NonceSet::default();
        none.push(1 << 100, 0, 0);
        none.push(2 << 100, 0, 1);
        assert!(none.duplicates().is_empty());
    }
}
