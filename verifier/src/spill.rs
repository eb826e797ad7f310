//! Sorting more fixed-size items than the verifier will hold in memory: the
//! part of checks 8 and 10 (docs/protocol.md §11) that looks across a whole
//! pack (no nonce in two records; a second outcome for an answered
//! decision) is a sort, and this keeps it within a fixed budget whatever the
//! pack's size (DESIGN: "memory bounded independent of pack size").
//!
//! Items collect in memory up to the budget; then they are sorted and
//! written as one run to an anonymous temporary file (unlinked at once, gone
//! when the verifier exits). Reading back merges the runs and the items
//! still in memory, smallest first, so the sequence is the one a sort of
//! everything in memory would give. Runs are merged sixteen at a time into
//! longer ones as they accumulate (sixteen runs of one length make one run
//! of the next), so however large the pack, few files are open and the
//! merge's read buffers stay small. A pack that never fills the budget
//! never touches the disk.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};

/// The default budget of one [`Spill`], in bytes of items.
pub(crate) const DEFAULT_BUDGET_BYTES: usize = 256 << 10;

/// The largest encoded item.
pub(crate) const MAX_ITEM_BYTES: usize = 128;

/// Runs of one length merged into one longer run.
const FAN_IN: usize = 16;

/// Bytes read ahead from each run while merging.
const RUN_READ_BUFFER: usize = 8 << 10;

/// An item of fixed encoded size; the encoding need not keep the order,
/// the merge compares decoded items.
pub(crate) trait Item: Copy + Ord {
    /// Encoded size in bytes, at most `MAX_ITEM_BYTES`.
    const BYTES: usize;
    fn put(&self, out: &mut [u8]);
    fn get(bytes: &[u8]) -> Self;
}

impl Item for u64 {
    const BYTES: usize = 8;
    fn put(&self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_le_bytes());
    }
    fn get(bytes: &[u8]) -> Self {
        let mut b = [0u8; 8];
        b.copy_from_slice(bytes);
        Self::from_le_bytes(b)
    }
}

impl Item for u128 {
    const BYTES: usize = 16;
    fn put(&self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_le_bytes());
    }
    fn get(bytes: &[u8]) -> Self {
        let mut b = [0u8; 16];
        b.copy_from_slice(bytes);
        Self::from_le_bytes(b)
    }
}

struct Run {
    file: File,
    items: u64,
    /// 0 for a run written from memory, n + 1 for a merge of runs of level n.
    level: u32,
}

impl Run {
    fn source<T>(self) -> Source<T> {
        Source::Run {
            reader: BufReader::with_capacity(RUN_READ_BUFFER, self.file),
            left: self.items,
        }
    }
}

/// Writes `items` in order to a new anonymous temporary file.
fn write_run<T: Item>(
    items: impl IntoIterator<Item = io::Result<T>>,
    level: u32,
) -> io::Result<Run> {
    let mut out = BufWriter::with_capacity(64 << 10, tempfile::tempfile()?);
    let mut buf = [0u8; MAX_ITEM_BYTES];
    let mut count = 0u64;
    for item in items {
        item?.put(&mut buf[..T::BYTES]);
        out.write_all(&buf[..T::BYTES])?;
        count += 1;
    }
    let mut file = out.into_inner().map_err(io::IntoInnerError::into_error)?;
    file.seek(SeekFrom::Start(0))?;
    Ok(Run {
        file,
        items: count,
        level,
    })
}

/// A multiset of items that sorts within a memory budget.
pub(crate) struct Spill<T: Item> {
    /// Items held in memory before a run is written.
    capacity: usize,
    memory: Vec<T>,
    runs: Vec<Run>,
    /// The first I/O error while spilling; reported by [`Spill::sorted`].
    error: Option<io::Error>,
}

impl<T: Item> Spill<T> {
    /// A set that keeps at most `budget_bytes` of items in memory (at least
    /// one item).
    pub(crate) fn new(budget_bytes: usize) -> Self {
        Self {
            capacity: (budget_bytes / std::mem::size_of::<T>()).max(1),
            memory: Vec::new(),
            runs: Vec::new(),
            error: None,
        }
    }

    /// Adds an item.
    pub(crate) fn push(&mut self, item: T) {
        if self.error.is_some() {
            return;
        }
        self.memory.push(item);
        if self.memory.len() >= self.capacity {
            if let Err(e) = self.spill() {
                self.error = Some(e);
            }
        }
    }

    /// Number of runs written to disk so far.
    #[cfg(test)]
    pub(crate) fn runs(&self) -> usize {
        self.runs.len()
    }

    fn spill(&mut self) -> io::Result<()> {
        self.memory.sort_unstable();
        let run = write_run(self.memory.drain(..).map(Ok), 0)?;
        self.runs.push(run);
        loop {
            let n = self.runs.len();
            if n < FAN_IN {
                break;
            }
            let level = self.runs[n - 1].level;
            if self.runs[n - FAN_IN..].iter().any(|r| r.level != level) {
                break;
            }
            let group = self.runs.split_off(n - FAN_IN);
            let mut merged: Sorted<T> = Sorted::new(group.into_iter().map(Run::source).collect())?;
            let run = write_run(
                std::iter::from_fn(|| merged.next_item().transpose()),
                level + 1,
            )?;
            self.runs.push(run);
        }
        Ok(())
    }

    /// Every item, smallest first.
    ///
    /// # Errors
    /// An I/O error from writing a run earlier, or from reading one back.
    pub(crate) fn sorted(mut self) -> io::Result<Sorted<T>> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.memory.sort_unstable();
        let mut sources = Vec::with_capacity(self.runs.len() + 1);
        sources.push(Source::Memory(std::mem::take(&mut self.memory).into_iter()));
        sources.extend(self.runs.into_iter().map(Run::source));
        Sorted::new(sources)
    }
}

enum Source<T> {
    Memory(std::vec::IntoIter<T>),
    Run { reader: BufReader<File>, left: u64 },
}

impl<T: Item> Source<T> {
    fn next(&mut self) -> io::Result<Option<T>> {
        match self {
            Self::Memory(items) => Ok(items.next()),
            Self::Run { reader, left } => {
                if *left == 0 {
                    return Ok(None);
                }
                let mut buf = [0u8; MAX_ITEM_BYTES];
                reader.read_exact(&mut buf[..T::BYTES])?;
                *left -= 1;
                Ok(Some(T::get(&buf[..T::BYTES])))
            }
        }
    }
}

/// The merge of the runs and the items kept in memory.
pub(crate) struct Sorted<T: Item> {
    sources: Vec<Source<T>>,
    heads: BinaryHeap<Reverse<(T, usize)>>,
}

impl<T: Item> Sorted<T> {
    fn new(mut sources: Vec<Source<T>>) -> io::Result<Self> {
        let mut heads = BinaryHeap::with_capacity(sources.len());
        for (i, source) in sources.iter_mut().enumerate() {
            if let Some(item) = source.next()? {
                heads.push(Reverse((item, i)));
            }
        }
        Ok(Self { sources, heads })
    }

    /// The next item in order, `None` at the end.
    ///
    /// # Errors
    /// An I/O error reading a run.
    pub(crate) fn next_item(&mut self) -> io::Result<Option<T>> {
        let Some(Reverse((item, from))) = self.heads.pop() else {
            return Ok(None);
        };
        if let Some(next) = self.sources[from].next()? {
            self.heads.push(Reverse((next, from)));
        }
        Ok(Some(item))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain<T: Item>(s: Spill<T>) -> Vec<T> {
        let mut sorted = s.sorted().unwrap();
        let mut out = Vec::new();
        while let Some(x) = sorted.next_item().unwrap() {
            out.push(x);
        }
        out
    }

    #[test]
    fn merges_runs_and_memory_into_one_sorted_sequence() {
        let mut items: Vec<u64> = (0..1000u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) % 300)
            .collect();
        let mut s = Spill::new(8 * 64);
        for &x in &items {
            s.push(x);
        }
        assert_eq!(s.runs(), 15, "64 items a run, 40 left in memory");
        items.sort_unstable();
        assert_eq!(drain(s), items);
        let empty: Spill<u128> = Spill::new(1);
        assert!(drain(empty).is_empty());
        let mut one_each = Spill::new(1);
        for x in [3u128, 1, 2] {
            one_each.push(x);
        }
        assert_eq!(one_each.runs(), 3);
        assert_eq!(drain(one_each), vec![1, 2, 3]);
        // One item a run: sixteen runs of a length merge into one longer
        // run, so 1000 runs become 3 of 256, 14 of 16 and 8 of 1.
        let mut many = Spill::new(1);
        let mut all: Vec<u64> = (0..1000u64).map(|i| (i * 7919) % 1009).collect();
        for &x in &all {
            many.push(x);
        }
        assert_eq!(many.runs(), 3 + 14 + 8);
        all.sort_unstable();
        assert_eq!(drain(many), all);
    }
}
