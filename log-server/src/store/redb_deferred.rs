//! The index rows of layout 4 that are not in their tables yet
//! (docs/storage.md, "Deferred index rows"): an entry's three `ids` rows
//! (nonce, record hash, leaf hash) and its `chains` row.
//!
//! A commit writes these rows into this in-memory set, not into the
//! tables. The `ids` keys are random digests and the `chains` keys are
//! spread over every agent, so a row written by each commit dirties its own
//! B-tree page. Once the rows cover a generation of entries, they are
//! written into their tables in key order, a slice per commit (the merge):
//! each slice is a contiguous key range of each table, so its rows share
//! pages, and a page is written once per slice rather than once per row.
//! The slice that completes a merge also stores `meta.ids_to`, the end of
//! the entries the tables cover.
//!
//! The set is never the only copy: every row is derived from an entry, so
//! opening the file rebuilds it from the entries `ids_to..tree_size`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// An `ids` row: (kind byte ‖ digest prefix, leaf index).
pub(crate) type IdRow = ([u8; 16], u64);

/// A `chains` row: (agent, seq) → (leaf index, record hash). The derived
/// order is the table's key order (agent bytes, then seq).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ChainRow {
    pub(crate) agent: String,
    pub(crate) seq: u64,
    pub(crate) index: u64,
    pub(crate) hash: [u8; 32],
}

/// Entries whose rows are held in memory before a merge starts, unless
/// `TALLY_LOG_IDS_GENERATION` says otherwise (tests set it small).
pub const DEFAULT_IDS_GENERATION: u64 = 32_768;

/// `ids` rows a commit writes of a running merge: at least this many
/// (few, so that the small commits of a light load each carry a small
/// slice and a merge does not lengthen their fsyncs all at once)...
const MERGE_MIN_ROWS: usize = 64;
/// ...and at least this many per entry the commit appends (three rows
/// each), so a merge ends before the next generation is full. A commit
/// writes the same share of the merge's `chains` rows.
const MERGE_ROWS_PER_ENTRY: usize = 8;

/// A generation being written into the tables.
struct Merging {
    /// The `ids` rows of entries `from..to`, sorted.
    rows: Arc<[IdRow]>,
    /// Rows `..next` are in the table.
    next: usize,
    /// The `chains` rows of the same entries, sorted.
    chains: Arc<[ChainRow]>,
    /// Chain rows `..chains_next` are in the table.
    chains_next: usize,
    /// `meta.ids_to` once every row is in the tables.
    to: u64,
}

/// What one commit writes of the running merge.
pub(crate) struct MergeStep {
    rows: Arc<[IdRow]>,
    range: std::ops::Range<usize>,
    chains: Arc<[ChainRow]>,
    chain_range: std::ops::Range<usize>,
    /// The merge's `to`, which names it.
    merge: u64,
}

impl MergeStep {
    /// The `ids` rows to write, in key order.
    pub(crate) fn rows(&self) -> &[IdRow] {
        &self.rows[self.range.clone()]
    }

    /// The `chains` rows to write, in key order.
    pub(crate) fn chain_rows(&self) -> &[ChainRow] {
        &self.chains[self.chain_range.clone()]
    }

    /// `Some(ids_to)` when this step completes the merge.
    pub(crate) fn completes(&self) -> Option<u64> {
        (self.range.end == self.rows.len()).then_some(self.merge)
    }
}

/// A chain row found in memory: (seq, leaf index, record hash).
pub(crate) type ChainHit = (u64, u64, [u8; 32]);

/// The rows of the entries `ids_to..` (of the tree size, and of a commit
/// under way).
pub(crate) struct PendingRows {
    generation: u64,
    /// The first entry of `fresh` (the end of `merging`, else `ids_to`).
    fresh_from: u64,
    /// `ids` rows not yet part of a merge.
    fresh: BTreeSet<IdRow>,
    /// `chains` rows not yet part of a merge: agent → seq → (leaf index,
    /// record hash).
    fresh_chains: HashMap<String, BTreeMap<u64, (u64, [u8; 32])>>,
    merging: Option<Merging>,
}

/// The rows of a running merge (if any) and the fresh rows, sorted.
#[cfg(any(test, feature = "testing"))]
fn sorted<T: Ord + Clone>(merging: Option<&[T]>, fresh: impl Iterator<Item = T>) -> Vec<T> {
    let mut out: Vec<T> = merging.map_or_else(Vec::new, <[T]>::to_vec);
    out.extend(fresh);
    out.sort_unstable();
    out
}

/// The rows of `agent` in a sorted slice of chain rows.
fn agent_rows<'a>(rows: &'a [ChainRow], agent: &str) -> &'a [ChainRow] {
    let lo = rows.partition_point(|r| r.agent.as_str() < agent);
    let hi = lo + rows[lo..].partition_point(|r| r.agent.as_str() == agent);
    &rows[lo..hi]
}

impl PendingRows {
    /// An empty set over tables that cover the entries `..ids_to`.
    pub(crate) fn new(ids_to: u64, generation: u64) -> Self {
        Self {
            generation: generation.max(1),
            fresh_from: ids_to,
            fresh: BTreeSet::new(),
            fresh_chains: HashMap::new(),
            merging: None,
        }
    }

    /// Adds an `ids` row.
    pub(crate) fn insert(&mut self, row: IdRow) {
        self.fresh.insert(row);
    }

    /// Adds a `chains` row.
    pub(crate) fn insert_chain(&mut self, agent: &str, seq: u64, index: u64, hash: [u8; 32]) {
        let rows = match self.fresh_chains.get_mut(agent) {
            Some(rows) => rows,
            None => self.fresh_chains.entry(agent.to_owned()).or_default(),
        };
        rows.insert(seq, (index, hash));
    }

    /// The leaf indexes filed under `key` here (an entry of a commit under
    /// way may be among them: callers confirm each against the entry).
    pub(crate) fn candidates(&self, key: [u8; 16]) -> Vec<u64> {
        let mut out: Vec<u64> = Vec::new();
        if let Some(m) = &self.merging {
            let start = m.rows.partition_point(|r| r.0 < key);
            out.extend(
                m.rows[start..]
                    .iter()
                    .take_while(|r| r.0 == key)
                    .map(|r| r.1),
            );
        }
        out.extend(self.fresh.range((key, 0)..=(key, u64::MAX)).map(|r| r.1));
        out
    }

    /// `agent`'s chain row with the highest seq held here among the entries
    /// `..below` (a reader's tree size: rows of a commit under way are at or
    /// beyond it).
    pub(crate) fn chain_head(&self, agent: &str, below: u64) -> Option<ChainHit> {
        let fresh = self.fresh_chains.get(agent).and_then(|rows| {
            rows.iter()
                .rev()
                .find(|(_, v)| v.0 < below)
                .map(|(seq, v)| (*seq, v.0, v.1))
        });
        let merging = self.merging.as_ref().and_then(|m| {
            agent_rows(&m.chains, agent)
                .iter()
                .rev()
                .find(|r| r.index < below)
                .map(|r| (r.seq, r.index, r.hash))
        });
        fresh.max(merging)
    }

    /// `agent`'s chain row at `seq` held here, if its entry is before
    /// `below`: (leaf index, record hash).
    pub(crate) fn chain_row(&self, agent: &str, seq: u64, below: u64) -> Option<(u64, [u8; 32])> {
        let fresh = self
            .fresh_chains
            .get(agent)
            .and_then(|rows| rows.get(&seq).copied());
        let merging = || {
            self.merging.as_ref().and_then(|m| {
                let rows = agent_rows(&m.chains, agent);
                let at = rows.partition_point(|r| r.seq < seq);
                rows.get(at)
                    .filter(|r| r.seq == seq)
                    .map(|r| (r.index, r.hash))
            })
        };
        fresh.or_else(merging).filter(|(index, _)| *index < below)
    }

    /// `(seq, leaf index)` of `agent`'s chain rows held here with
    /// `seq >= from` and entries before `below`, in seq order, at most
    /// `limit`.
    pub(crate) fn chain_rows(
        &self,
        agent: &str,
        from: u64,
        below: u64,
        limit: usize,
    ) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        if let Some(m) = &self.merging {
            let rows = agent_rows(&m.chains, agent);
            let at = rows.partition_point(|r| r.seq < from);
            out.extend(
                rows[at..]
                    .iter()
                    .filter(|r| r.index < below)
                    .take(limit)
                    .map(|r| (r.seq, r.index)),
            );
        }
        if let Some(rows) = self.fresh_chains.get(agent) {
            out.extend(
                rows.range(from..)
                    .filter(|(_, v)| v.0 < below)
                    .take(limit)
                    .map(|(seq, v)| (*seq, v.0)),
            );
        }
        out.sort_unstable();
        out.dedup();
        out.truncate(limit);
        out
    }

    /// Every `ids` row held, sorted.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn all_id_rows(&self) -> Vec<IdRow> {
        let merging = self.merging.as_ref().map(|m| &m.rows[..]);
        sorted(merging, self.fresh.iter().copied())
    }

    /// Every `chains` row held, sorted.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn all_chain_rows(&self) -> Vec<ChainRow> {
        let merging = self.merging.as_ref().map(|m| &m.chains[..]);
        sorted(merging, self.fresh_chain_rows())
    }

    /// The fresh `chains` rows, unsorted.
    fn fresh_chain_rows(&self) -> impl Iterator<Item = ChainRow> + '_ {
        self.fresh_chains.iter().flat_map(|(agent, rows)| {
            rows.iter().map(move |(seq, (index, hash))| ChainRow {
                agent: agent.clone(),
                seq: *seq,
                index: *index,
                hash: *hash,
            })
        })
    }

    /// `ids` rows held, of the merge and of the fresh set.
    pub(crate) fn len(&self) -> usize {
        self.fresh.len() + self.merging.as_ref().map_or(0, |m| m.rows.len())
    }

    /// `chains` rows held, of the merge and of the fresh set.
    pub(crate) fn chain_len(&self) -> usize {
        self.fresh_chains.values().map(BTreeMap::len).sum::<usize>()
            + self.merging.as_ref().map_or(0, |m| m.chains.len())
    }

    /// The slice of the merge that a commit appending `appending` entries
    /// to a tree of `size` writes. It first starts a merge of the fresh rows
    /// when none runs and they cover a generation of entries (all of them
    /// entries `..size`, committed: call it before inserting the commit's
    /// own rows).
    pub(crate) fn step(&mut self, size: u64, appending: usize) -> Option<MergeStep> {
        if self.merging.is_none() && size.saturating_sub(self.fresh_from) >= self.generation {
            let rows: Vec<IdRow> = std::mem::take(&mut self.fresh).into_iter().collect();
            let mut chains: Vec<ChainRow> = self.fresh_chain_rows().collect();
            self.fresh_chains.clear();
            chains.sort_unstable();
            self.merging = Some(Merging {
                rows: rows.into(),
                next: 0,
                chains: chains.into(),
                chains_next: 0,
                to: size,
            });
            self.fresh_from = size;
        }
        let m = self.merging.as_ref()?;
        let take = MERGE_MIN_ROWS.max(MERGE_ROWS_PER_ENTRY.saturating_mul(appending));
        let end = m.rows.len().min(m.next.saturating_add(take));
        // The same share of the chain rows (one per entry to the `ids`
        // rows' three), all of them with the last `ids` slice.
        let chain_end = if end == m.rows.len() {
            m.chains.len()
        } else {
            let share = (m.chains.len() as u128 * end as u128 / m.rows.len() as u128) as usize;
            share.clamp(m.chains_next, m.chains.len())
        };
        Some(MergeStep {
            rows: m.rows.clone(),
            range: m.next..end,
            chains: m.chains.clone(),
            chain_range: m.chains_next..chain_end,
            merge: m.to,
        })
    }

    /// Records that `step` is in the tables (its commit succeeded). A step
    /// that is not the running merge's next one changes nothing (its rows
    /// stay in memory, and writing them again is a no-op).
    pub(crate) fn advance(&mut self, step: &MergeStep) {
        let Some(m) = &mut self.merging else { return };
        if m.to != step.merge
            || m.next != step.range.start
            || m.chains_next != step.chain_range.start
        {
            return;
        }
        if step.range.end == m.rows.len() {
            self.merging = None;
        } else {
            m.next = step.range.end;
            m.chains_next = step.chain_range.end;
        }
    }

    /// Drops the rows of the entries before `ids_to` (the tables now hold
    /// them all), keeping any of later entries.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn drop_below(&mut self, ids_to: u64) {
        if self.merging.as_ref().is_some_and(|m| m.to <= ids_to) {
            self.merging = None;
        }
        self.fresh.retain(|r| r.1 >= ids_to);
        self.fresh_chains.retain(|_, rows| {
            rows.retain(|_, v| v.0 >= ids_to);
            !rows.is_empty()
        });
        self.fresh_from = self.fresh_from.max(ids_to);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> [u8; 16] {
        let mut k = [0u8; 16];
        k[0] = 1;
        k[1] = b;
        k
    }

    /// A set of generation 1 holding rows `0..n`, each under its own key
    /// (the index, big-endian), inserted from the last.
    fn filled(n: u64) -> PendingRows {
        let mut p = PendingRows::new(0, 1);
        for i in (0..n).rev() {
            let mut k = [0u8; 16];
            k[8..].copy_from_slice(&i.to_be_bytes());
            p.insert((k, i));
        }
        p
    }

    #[test]
    fn candidates_come_from_the_merge_and_the_fresh_rows() {
        let mut p = PendingRows::new(10, 2);
        p.insert((key(7), 10));
        p.insert((key(9), 11));
        assert!(p.step(12, 1).is_some());
        p.insert((key(7), 12));
        assert_eq!(p.candidates(key(7)), vec![10, 12]);
        assert_eq!(p.candidates(key(9)), vec![11]);
        assert!(p.candidates(key(8)).is_empty());
        assert_eq!(p.len(), 3);
    }

    #[test]
    fn no_merge_starts_before_a_generation_of_entries() {
        let mut p = PendingRows::new(0, 4);
        for i in 0..3 {
            p.insert((key(i as u8), i));
        }
        assert!(p.step(3, 1).is_none());
        let s = p.step(4, 1).expect("a generation of four entries");
        assert_eq!(s.rows().len(), 3);
        assert_eq!(s.completes(), Some(4));
        p.advance(&s);
        assert_eq!(p.len(), 0);
        assert!(p.step(4, 1).is_none());
    }

    #[test]
    fn a_merge_goes_in_key_order_slices_and_ends_with_its_last() {
        let n = MERGE_MIN_ROWS as u64 * 2 + 5;
        let mut p = filled(n);
        let mut written: Vec<IdRow> = Vec::new();
        let mut steps = 0;
        loop {
            let s = p.step(n, 1).expect("a merge runs");
            written.extend_from_slice(s.rows());
            steps += 1;
            let done = s.completes();
            p.advance(&s);
            if let Some(to) = done {
                assert_eq!(to, n);
                break;
            }
            // Until the merge ends, its rows are still answered here.
            assert_eq!(p.len() as u64, n);
        }
        assert_eq!(steps, 3);
        assert!(written.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(written.len() as u64, n);
        assert_eq!(p.len(), 0);
    }

    #[test]
    fn a_step_that_is_not_the_next_one_changes_nothing() {
        let mut p = filled(3 * MERGE_MIN_ROWS as u64);
        let first = p.step(1, 1).expect("a merge runs");
        p.advance(&first);
        // The same step again (a commit that raced): nothing moves.
        p.advance(&first);
        let second = p.step(1, 1).expect("still running");
        assert_eq!(second.range.start, MERGE_MIN_ROWS);
        assert_eq!(p.len(), 3 * MERGE_MIN_ROWS);
    }

    #[test]
    fn drop_below_keeps_the_rows_of_later_entries() {
        let mut p = PendingRows::new(0, 2);
        p.insert((key(1), 0));
        p.insert((key(2), 1));
        assert!(p.step(2, 1).is_some());
        p.insert((key(3), 2));
        p.drop_below(2);
        assert!(p.candidates(key(1)).is_empty());
        assert_eq!(p.candidates(key(3)), vec![2]);
        assert_eq!(p.len(), 1);
    }

    /// A set of generation 2 with chain rows of agents `a` (seq 0..3 at
    /// indexes 0, 2, 4) and `b` (seq 0..2 at indexes 1, 3), a merge of the
    /// first four entries started, and entry 4 fresh.
    fn chains() -> PendingRows {
        let mut p = PendingRows::new(0, 4);
        for (agent, seq, index) in [("a", 0, 0), ("b", 0, 1), ("a", 1, 2), ("b", 1, 3)] {
            p.insert((key(index as u8), index));
            p.insert_chain(agent, seq, index, [index as u8; 32]);
        }
        assert!(p.step(4, 1).is_some());
        p.insert((key(4), 4));
        p.insert_chain("a", 2, 4, [4; 32]);
        p
    }

    #[test]
    fn chain_rows_come_from_the_merge_and_the_fresh_rows_below_a_reads_size() {
        let p = chains();
        assert_eq!(p.chain_len(), 5);
        assert_eq!(p.chain_head("a", 5), Some((2, 4, [4; 32])));
        // Entry 4 is not in a read of size 4 (its commit is under way).
        assert_eq!(p.chain_head("a", 4), Some((1, 2, [2; 32])));
        assert_eq!(p.chain_head("b", 5), Some((1, 3, [3; 32])));
        assert_eq!(p.chain_head("c", 5), None);
        assert_eq!(p.chain_row("a", 2, 5), Some((4, [4; 32])));
        assert_eq!(p.chain_row("a", 2, 4), None);
        assert_eq!(p.chain_row("b", 0, 5), Some((1, [1; 32])));
        assert_eq!(p.chain_row("b", 2, 5), None);
        assert_eq!(p.chain_rows("a", 0, 5, 10), vec![(0, 0), (1, 2), (2, 4)]);
        assert_eq!(p.chain_rows("a", 1, 5, 1), vec![(1, 2)]);
        assert_eq!(p.chain_rows("a", 1, 4, 10), vec![(1, 2)]);
        let all: Vec<(String, u64)> = p
            .all_chain_rows()
            .into_iter()
            .map(|r| (r.agent, r.seq))
            .collect();
        let want = [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)];
        assert_eq!(all, want.map(|(a, s)| (a.to_owned(), s)));
    }

    #[test]
    fn a_merge_writes_the_chain_rows_in_key_order_and_the_last_with_the_last_ids_slice() {
        let mut p = PendingRows::new(0, 1);
        // Three ids rows and one chain row per entry, as a commit adds them.
        let n = MERGE_MIN_ROWS as u64 + 5;
        for i in 0..n {
            for kind in 1..=3 {
                let mut k = [0u8; 16];
                k[0] = kind;
                k[8..].copy_from_slice(&i.to_be_bytes());
                p.insert((k, i));
            }
            p.insert_chain(&format!("agent-{}", i % 7), i / 7, i, [0; 32]);
        }
        let mut written: Vec<ChainRow> = Vec::new();
        loop {
            let s = p.step(n, 1).expect("a merge runs");
            written.extend_from_slice(s.chain_rows());
            let done = s.completes();
            p.advance(&s);
            if done.is_some() {
                break;
            }
            // A slice of a third of the ids rows carries a third of the
            // chain rows.
            assert_eq!(written.len(), s.range.end / 3);
        }
        assert_eq!(written.len() as u64, n);
        assert!(written.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(p.chain_len(), 0);
    }

    #[test]
    fn drop_below_keeps_the_chain_rows_of_later_entries() {
        let mut p = chains();
        p.drop_below(4);
        assert_eq!(p.chain_len(), 1);
        assert_eq!(p.chain_head("a", 5), Some((2, 4, [4; 32])));
        assert_eq!(p.chain_head("b", 5), None);
    }

    #[test]
    fn a_large_commit_takes_a_larger_slice() {
        let mut p = filled(3 * MERGE_MIN_ROWS as u64);
        let s = p.step(1, MERGE_MIN_ROWS).expect("a merge runs");
        assert_eq!(s.completes(), Some(1));
        assert_eq!(s.rows().len(), 3 * MERGE_MIN_ROWS);
    }
}
