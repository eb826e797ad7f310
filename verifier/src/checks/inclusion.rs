//! Check 7, `inclusion` (docs/protocol.md §7.2, §9.1 and §11): every
//! witnessed record's rebuilt entry (§8 step 4) is proven at its `index` in
//! the pack's checkpoint, by an inclusion proof of at most 64 hashes; each
//! witnessed record's index is above every index before it in the pack; no
//! witnessed record follows a pending one. The proofs are checked on the
//! worker threads ([`crate::pool::prove_entry`]); this judges what they
//! found and the order.

use tally_schemas::report::{CheckId, CheckResult};
use tally_schemas::tree::TreeSize;

use super::{plural, Facts};
use crate::tally::Tally;

pub(crate) struct Inclusion {
    tally: Tally,
    saw_pending: bool,
    last_index: Option<u64>,
    entries: u64,
}

impl Inclusion {
    pub(crate) fn new() -> Self {
        Self {
            tally: Tally::new(CheckId::Inclusion),
            saw_pending: false,
            last_index: None,
            entries: 0,
        }
    }

    pub(crate) fn record(&mut self, f: &Facts<'_>) {
        let Some(w) = f.witnessed() else {
            self.saw_pending = true;
            return;
        };
        if self.saw_pending {
            self.tally.fail(
                f.named(),
                "a witnessed record after an unwitnessed one (pack order, §9.1)",
            );
        }
        let index = w.index.get();
        if let Some(last) = self.last_index {
            if index <= last {
                self.tally.fail(
                    f.named(),
                    format!("index {index} does not increase (previous entry {last})"),
                );
            }
        }
        self.last_index = Some(self.last_index.map_or(index, |l| l.max(index)));
        match &f.work.inclusion {
            Some(Ok(())) => self.entries += 1,
            Some(Err(e)) => self.tally.fail(f.named(), e.clone()),
            None => {}
        }
    }

    /// `pack_size` is the pack checkpoint's size, when it could be read.
    pub(crate) fn finish(self, pack_size: Option<TreeSize>) -> CheckResult {
        let size = pack_size.map_or_else(|| "?".to_owned(), |s| s.to_string());
        self.tally.finish(format!(
            "{} proven in the pack checkpoint (size {size}), indexes increasing",
            plural(self.entries, "entry", "entries")
        ))
    }
}
