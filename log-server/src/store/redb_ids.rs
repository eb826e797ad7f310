//! The `ids` rows of layout 3 that are not in the table yet
//! (docs/storage.md, "Deferred index rows").
//!
//! A commit writes an entry's three `ids` rows (nonce, record hash, leaf
//! hash) into this in-memory set, not into the table. The keys are random
//! digests, so a row written by each commit dirties its own B-tree page.
//! Once the rows cover a generation of entries, they are written into the
//! table in key order, a slice per commit (the merge): each slice is a
//! contiguous key range, so its rows share pages, and a page is written once
//! per slice rather than once per row. The slice that completes a merge
//! also stores `meta.ids_to`, the end of the entries the table covers.
//!
//! The set is never the only copy: every row is derived from an entry, so
//! opening the file rebuilds it from the entries `ids_to..tree_size`.

use std::collections::BTreeSet;
use std::sync::Arc;

/// An `ids` row: (kind byte ‖ digest prefix, leaf index).
pub(crate) type IdRow = ([u8; 16], u64);

/// Entries whose rows are held in memory before a merge starts, unless
/// `TALLY_LOG_IDS_GENERATION` says otherwise (tests set it small).
pub const DEFAULT_IDS_GENERATION: u64 = 32_768;

/// Rows a commit writes of a running merge: at least this many...
const MERGE_MIN_ROWS: usize = 1_024;
/// ...and at least this many per entry the commit appends (three rows
/// each), so a merge ends before the next generation is full.
const MERGE_ROWS_PER_ENTRY: usize = 8;

/// A generation being written into the table.
struct Merging {
    /// The rows of entries `from..to`, sorted.
    rows: Arc<[IdRow]>,
    /// Rows `..next` are in the table.
    next: usize,
    /// `meta.ids_to` once every row is in the table.
    to: u64,
}

/// What one commit writes of the running merge.
pub(crate) struct MergeStep {
    rows: Arc<[IdRow]>,
    range: std::ops::Range<usize>,
    /// The merge's `to`, which names it.
    merge: u64,
}

impl MergeStep {
    /// The rows to write, in key order.
    pub(crate) fn rows(&self) -> &[IdRow] {
        &self.rows[self.range.clone()]
    }

    /// `Some(ids_to)` when this step completes the merge.
    pub(crate) fn completes(&self) -> Option<u64> {
        (self.range.end == self.rows.len()).then_some(self.merge)
    }
}

/// The rows of the entries `ids_to..` (of the tree size, and of a commit
/// under way).
pub(crate) struct PendingIds {
    generation: u64,
    /// The first entry of `fresh` (the end of `merging`, else `ids_to`).
    fresh_from: u64,
    /// Rows not yet part of a merge.
    fresh: BTreeSet<IdRow>,
    merging: Option<Merging>,
}

impl PendingIds {
    /// An empty set over a table that covers the entries `..ids_to`.
    pub(crate) fn new(ids_to: u64, generation: u64) -> Self {
        Self {
            generation: generation.max(1),
            fresh_from: ids_to,
            fresh: BTreeSet::new(),
            merging: None,
        }
    }

    /// Adds a row.
    pub(crate) fn insert(&mut self, row: IdRow) {
        self.fresh.insert(row);
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

    /// Every row held, sorted.
    pub(crate) fn rows(&self) -> Vec<IdRow> {
        let mut out: Vec<IdRow> = self
            .merging
            .as_ref()
            .map_or_else(Vec::new, |m| m.rows.to_vec());
        out.extend(self.fresh.iter().copied());
        out.sort_unstable();
        out
    }

    /// Rows held, of the merge and of the fresh set.
    pub(crate) fn len(&self) -> usize {
        self.fresh.len() + self.merging.as_ref().map_or(0, |m| m.rows.len())
    }

    /// The slice of the merge that a commit appending `appending` entries
    /// to a tree of `size` writes. It first starts a merge of the fresh rows
    /// when none runs and they cover a generation of entries (all of them
    /// entries `..size`, committed: call it before inserting the commit's
    /// own rows).
    pub(crate) fn step(&mut self, size: u64, appending: usize) -> Option<MergeStep> {
        if self.merging.is_none() && size.saturating_sub(self.fresh_from) >= self.generation {
            let rows: Vec<IdRow> = std::mem::take(&mut self.fresh).into_iter().collect();
            self.merging = Some(Merging {
                rows: rows.into(),
                next: 0,
                to: size,
            });
            self.fresh_from = size;
        }
        let m = self.merging.as_ref()?;
        let take = MERGE_MIN_ROWS.max(MERGE_ROWS_PER_ENTRY.saturating_mul(appending));
        let end = m.rows.len().min(m.next.saturating_add(take));
        Some(MergeStep {
            rows: m.rows.clone(),
            range: m.next..end,
            merge: m.to,
        })
    }

    /// Records that `step` is in the table (its commit succeeded). A step
    /// that is not the running merge's next one changes nothing (its rows
    /// stay in memory, and writing them again is a no-op).
    pub(crate) fn advance(&mut self, step: &MergeStep) {
        let Some(m) = &mut self.merging else { return };
        if m.to != step.merge || m.next != step.range.start {
            return;
        }
        if step.range.end == m.rows.len() {
            self.merging = None;
        } else {
            m.next = step.range.end;
        }
    }

    /// Drops the rows of the entries before `ids_to` (the table now holds
    /// them all), keeping any of later entries.
    pub(crate) fn drop_below(&mut self, ids_to: u64) {
        if self.merging.as_ref().is_some_and(|m| m.to <= ids_to) {
            self.merging = None;
        }
        self.fresh.retain(|r| r.1 >= ids_to);
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
    fn filled(n: u64) -> PendingIds {
        let mut p = PendingIds::new(0, 1);
        for i in (0..n).rev() {
            let mut k = [0u8; 16];
            k[8..].copy_from_slice(&i.to_be_bytes());
            p.insert((k, i));
        }
        p
    }

    #[test]
    fn candidates_come_from_the_merge_and_the_fresh_rows() {
        let mut p = PendingIds::new(10, 2);
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
        let mut p = PendingIds::new(0, 4);
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
        let mut p = PendingIds::new(0, 2);
        p.insert((key(1), 0));
        p.insert((key(2), 1));
        assert!(p.step(2, 1).is_some());
        p.insert((key(3), 2));
        p.drop_below(2);
        assert!(p.candidates(key(1)).is_empty());
        assert_eq!(p.candidates(key(3)), vec![2]);
        assert_eq!(p.len(), 1);
    }

    #[test]
    fn a_large_commit_takes_a_larger_slice() {
        let mut p = filled(3 * MERGE_MIN_ROWS as u64);
        let s = p.step(1, MERGE_MIN_ROWS).expect("a merge runs");
        assert_eq!(s.completes(), Some(1));
        assert_eq!(s.rows().len(), 3 * MERGE_MIN_ROWS);
    }
}
