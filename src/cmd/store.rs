//! `tally store copy`: carry a data folder's log (`log.redb`) into
//! PostgreSQL and prove the copy is the same log (docs/operations.md,
//! "Running on PostgreSQL"). The original batch boundaries are kept, so
//! every entry keeps its receipt size and every receipt its checkpoint
//! note; then the copy is checked against the source: size, root
//! recomputed from the copied stored hashes against the signed checkpoint,
//! every entry's bytes, receipt size and stored hash, and every
//! checkpoint note the receipts use.
//!
//! Then the registry (`witness.redb`) and the console's auditor links
//! (`console.redb`) are copied into the same database, each in one
//! transaction, and checked row for row (docs/storage.md).
//!
//! A copy cut short (a crash, Ctrl-C) goes on where it stopped when run
//! again: a destination that already holds a prefix of the source log (the
//! same root at its size) is extended, and registry rows already there
//! with the same value are kept; anything else is refused.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context};
use tally_log::store::postgres::{redact_url, PostgresStore};
use tally_log::store::redb::RedbStore;
use tally_log::store::{BatchWrite, LogStore, NewEntry};
use tally_schemas::{Entry, Hash, LeafIndex, TreeSize};

use super::out::{errln, outln};

/// Arguments of `tally store`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    pub command: StoreCommand,
}

/// `tally store` subcommands.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum StoreCommand {
    /// Copy a data folder's log (log.redb), registry (witness.redb) and
    /// auditor links (console.redb) into a PostgreSQL database and check
    /// the copy: same size, root, entries, receipt sizes, stored hashes and
    /// checkpoint notes; the same registry and link rows. Stop `tally
    /// serve` on the folder first.
    /// Then `tally serve --data-dir DIR` serves it from the database: the
    /// URL is recorded in DIR/store.url, and log.redb is refused from then on.
    Copy {
        /// The data folder whose log.redb is copied.
        #[arg(long, value_name = "DIR")]
        from: PathBuf,
        /// The PostgreSQL database: postgres://user@host:port/database.
        /// It must be empty, or hold an earlier, unfinished copy of the
        /// same log (which is then completed).
        #[arg(long, value_name = "postgres://...")]
        to: String,
        /// Most entries per PostgreSQL transaction.
        #[arg(long, default_value_t = 5000)]
        chunk: usize,
    },
}

/// Runs `tally store`.
///
/// # Errors
/// A source that cannot be opened (missing, held by `tally serve`), an
/// unreachable or non-empty destination, or a copy that does not check.
pub(crate) fn run(args: &Args) -> anyhow::Result<ExitCode> {
    match &args.command {
        StoreCommand::Copy { from, to, chunk } => copy(from, to, (*chunk).max(1)),
    }
}

fn copy(from: &std::path::Path, to: &str, chunk: usize) -> anyhow::Result<ExitCode> {
    if !(to.starts_with("postgres://") || to.starts_with("postgresql://")) {
        bail!(
            "--to {:?}: expected a PostgreSQL URL (postgres://user@host:port/database)",
            redact_url(to)
        );
    }
    if let Some(moved) = super::data_folder::recorded_store(from)? {
        if moved != to {
            bail!(
                "the log of {} already moved to PostgreSQL at {} (recorded in {}): its log.redb is an old copy, not the log; copy from that database instead (pg_dump), or, only if nothing was ever served from it, delete that file first",
                from.display(),
                redact_url(&moved),
                from.join(super::data_folder::STORE_FILE).display()
            );
        }
    }
    let path = from.join("log.redb");
    if !path.is_file() {
        bail!(
            "{}: no log here (is --from a tally data folder?)",
            path.display()
        );
    }
    let source = RedbStore::open(&path).map_err(|e| {
        let text = e.to_string();
        if text.contains("already open") {
            anyhow::anyhow!(
                "{}: the log is open in another process: stop `tally serve` on this folder first",
                path.display()
            )
        } else {
            anyhow::anyhow!("{}: {text}", path.display())
        }
    })?;
    let dest = PostgresStore::open(to).with_context(|| format!("opening {}", redact_url(to)))?;
    let started = Instant::now();
    let total = source.size()?;
    let mut at = dest.size()?;
    if at > total {
        bail!(
            "{} holds a log of {at} entries, more than the {total} of {}: not a copy of it",
            redact_url(to),
            path.display()
        );
    }
    if at.get() > 0 || dest.latest_checkpoint()?.is_some() {
        same_prefix(&source, &dest, at).with_context(|| {
            format!(
                "{} is not empty and not an unfinished copy of this log",
                redact_url(to)
            )
        })?;
        outln!(
            "tally: {} holds the first {at} entries of this log; going on from there",
            redact_url(to)
        )?;
    }
    if at.get() == 0 && dest.latest_checkpoint()?.is_none() {
        if let Some(note) = source.checkpoint(TreeSize::new(0))? {
            dest.put_checkpoint(TreeSize::new(0), &note)?;
        }
    }
    let mut batches_copied = 0u64;
    let mut reported = at.get();
    while at < total {
        // Whole original batches, up to `chunk` entries (at least one batch).
        let mut batches = Vec::new();
        let mut notes = Vec::new();
        let mut size = at;
        let mut entries = 0usize;
        while size < total && (batches.is_empty() || entries < chunk) {
            let batch = read_batch(&source, size)?;
            entries += batch.entries.len();
            size = batch.new_size();
            if let Some(note) = source.checkpoint(size)? {
                notes.push((size, note));
            }
            batches.push(batch);
        }
        let notes_ref: Vec<(TreeSize, &str)> =
            notes.iter().map(|(s, n)| (*s, n.as_str())).collect();
        dest.commit_batches(&batches, &notes_ref)
            .with_context(|| format!("copying entries {at}..{size}"))?;
        batches_copied += batches.len() as u64;
        at = size;
        if at.get() >= reported + 50_000 {
            reported = at.get();
            errln!("tally: copied {at} of {total} entries");
        }
    }
    // A latest checkpoint above the last batch end (none is expected, but
    // the source is the authority).
    if let Some((size, note)) = source.latest_checkpoint()? {
        if dest.checkpoint(size)?.is_none() {
            dest.put_checkpoint(size, &note)?;
        }
    }
    dest.sync()?;
    let root = check(&source, &dest, chunk)?;
    // The registry and the console's links, after the log: a rerun finds
    // the log copied and goes on with them.
    let registry = copy_rows(
        &from.join(tally_witness::server::files::WITNESS_DB),
        to,
        "registry",
        tally_witness::registry::TABLES,
    )?;
    let links = copy_rows(
        &from.join(tally_console::CONSOLE_DB),
        to,
        "console",
        tally_console::store::TABLES,
    )?;
    outln!(
        "tally: copied {} of {total} entries ({batches_copied} batches) from {} to {} in {:.1}s",
        total.get(),
        path.display(),
        redact_url(to),
        started.elapsed().as_secs_f64()
    )?;
    outln!(
        "tally: checked: size {total}, root {}, every entry, receipt size, stored hash and checkpoint note identical",
        root.to_hex()
    )?;
    outln!("tally: {registry}")?;
    outln!("tally: {links}")?;
    // From now on the folder's log.redb is an old copy: `tally serve` on the
    // folder serves the database without being told, and refuses log.redb.
    super::data_folder::record_store(from, to, "moved there by `tally store copy`")?;
    outln!(
        "tally: recorded in {}: `tally serve --data-dir {}` now serves the log from {} and refuses the old log.redb",
        from.join(super::data_folder::STORE_FILE).display(),
        from.display(),
        redact_url(to)
    )?;
    outln!(
        "next: tally serve --data-dir {} (with the flags it ran with before, --cosigner included; --store is no longer needed)",
        from.display(),
    )?;
    Ok(ExitCode::SUCCESS)
}

/// Copies the rows of the redb file `path` (the registry's or the
/// console's, `tables`) into the PostgreSQL database at `url`, in one
/// transaction, then checks that the database holds exactly the file's rows.
/// Rows already there with the same value are kept (a rerun after an
/// interrupted copy, or after a complete one, adds nothing); a row with
/// another value, or one the file lacks, means the database holds another
/// registry (e.g. a `tally serve` already ran on it), and is refused.
/// Returns what to tell the operator.
fn copy_rows(
    path: &std::path::Path,
    url: &str,
    scope: &'static str,
    tables: &'static [&'static str],
) -> anyhow::Result<String> {
    use std::collections::BTreeMap;
    use tally_witness::kv::{Expect, KvOp, KvStore};
    let what = if scope == "registry" {
        "the registry"
    } else {
        "the console's auditor links"
    };
    if !path.is_file() {
        return Ok(format!(
            "{} not found: no rows of {what} to copy",
            path.display()
        ));
    }
    let source = KvStore::open_redb_existing(path, tables).map_err(|e| {
        let text = e.to_string();
        if text.contains("already open") || text.contains("lock") {
            anyhow::anyhow!(
                "{}: open in another process: stop `tally serve` on this folder first",
                path.display()
            )
        } else {
            anyhow::anyhow!("{}: {text}", path.display())
        }
    })?;
    let dest = KvStore::open_postgres(url, scope, tables)
        .with_context(|| format!("opening {} for {what}", redact_url(url)))?;
    type Rows = BTreeMap<(String, String), Vec<u8>>;
    let rows = |kv: &KvStore| -> anyhow::Result<Rows> {
        Ok(kv
            .snapshot()?
            .rows
            .into_iter()
            .map(|(t, k, v)| ((t, k), v))
            .collect())
    };
    let want = rows(&source)?;
    let have = rows(&dest)?;
    let refuse = |t: &str, k: &str, why: &str| {
        anyhow::anyhow!(
            "{} holds {what} that is not a copy of {}: row {t}/{k} {why}; copy into an empty database",
            redact_url(url),
            path.display()
        )
    };
    if let Some((t, k)) = have.keys().find(|key| !want.contains_key(*key)) {
        return Err(refuse(t, k, "is not in the source"));
    }
    let mut ops = Vec::new();
    let mut kept = 0usize;
    for ((t, k), v) in &want {
        match have.get(&(t.clone(), k.clone())) {
            Some(there) if there == v => kept += 1,
            Some(_) => return Err(refuse(t, k, "has another value")),
            None => {
                let table = tables
                    .iter()
                    .copied()
                    .find(|n| n == t)
                    .with_context(|| format!("{}: unknown table {t}", path.display()))?;
                ops.push(KvOp {
                    table,
                    key: k.clone(),
                    value: Some(v.clone()),
                    expect: Expect::Absent,
                });
            }
        }
    }
    if !ops.is_empty() {
        dest.apply(&ops)
            .with_context(|| format!("copying {what} into {}", redact_url(url)))?;
    }
    let copied = rows(&dest)?;
    if copied != want {
        bail!(
            "check failed: {what} in the database differs from {}",
            path.display()
        );
    }
    Ok(format!(
        "copied {} rows of {what} ({kept} already there); checked: the same {} rows",
        ops.len(),
        want.len()
    ))
}

/// The source's batch that starts at `size`: the entries whose receipt
/// size is the same, which is where the original group commit ended.
fn read_batch(source: &RedbStore, size: TreeSize) -> anyhow::Result<BatchWrite> {
    let at = LeafIndex::new(size.get());
    let end = source
        .receipt_size(at)?
        .with_context(|| format!("entry {size} has no receipt size"))?;
    if end <= size {
        bail!("entry {size} has receipt size {end}, not beyond it: the source is corrupt");
    }
    let rows = source.entries(at, LeafIndex::new(end.get()))?;
    if rows.len() as u64 != end.get() - size.get() {
        bail!("entries {size}..{end} are not all stored: the source is corrupt");
    }
    let mut entries = Vec::with_capacity(rows.len());
    for (k, canonical) in rows.into_iter().enumerate() {
        let index = LeafIndex::new(size.get() + k as u64);
        if k > 0 && source.receipt_size(index)? != Some(end) {
            bail!("entry {index} is not in the batch ending at {end}: the source is corrupt");
        }
        let entry = Entry::from_json(&canonical)
            .map_err(|e| anyhow::anyhow!("entry {index} does not parse: {e}"))?;
        if entry.index() != index {
            bail!("entry stored at {index} says index {}", entry.index());
        }
        let record = entry.record();
        entries.push(NewEntry {
            index,
            leaf_hash: entry.leaf_hash(),
            record_hash: record.hash(),
            nonce: record.nonce.clone(),
            agent: record.agent.clone(),
            seq: record.seq,
            time: record.time,
            canonical,
        });
    }
    let first = tlog_tiles::stored_hash_count(size.get());
    let last = tlog_tiles::stored_hash_count(end.get());
    let hashes = source.read_hashes(&(first..last).collect::<Vec<_>>())?;
    Ok(BatchWrite {
        old_size: size,
        entries,
        hashes,
        receipt_size: end,
        // Copied, not admitted: nothing to fence (the agents' latest
        // record times are still kept).
        key_versions: Vec::new(),
    })
}

/// The destination's `size` entries are the source's: the same root at
/// that size, and the same checkpoint note there if it has one.
fn same_prefix(source: &dyn LogStore, dest: &dyn LogStore, size: TreeSize) -> anyhow::Result<()> {
    let (a, b) = (
        tally_log::tree::root(source, size)?,
        tally_log::tree::root(dest, size)?,
    );
    if a != b {
        bail!("the root at size {size} differs");
    }
    if let Some((s, note)) = dest.latest_checkpoint()? {
        if source.checkpoint(s)?.as_deref() != Some(note.as_str()) {
            bail!("its checkpoint at size {s} is not the source's");
        }
    }
    Ok(())
}

/// Checks the copy against the source; returns the root.
fn check(source: &dyn LogStore, dest: &dyn LogStore, chunk: usize) -> anyhow::Result<Hash> {
    let size = source.size()?;
    if dest.size()? != size {
        bail!(
            "check failed: the copy has {} entries, the source {size}",
            dest.size()?
        );
    }
    let latest = source.latest_checkpoint()?;
    if dest.latest_checkpoint()? != latest {
        bail!("check failed: the latest checkpoint differs");
    }
    let root = tally_log::tree::root(dest, size)?;
    if let Some((cp_size, note)) = &latest {
        let cp = tally_schemas::note::peek_checkpoint(note)
            .map_err(|e| anyhow::anyhow!("the latest checkpoint does not parse: {e}"))?;
        let at = tally_log::tree::root(dest, *cp_size)?;
        if cp.size != *cp_size || cp.root != at {
            bail!("check failed: the copy's root at size {cp_size} is not the signed checkpoint's");
        }
    }
    if tally_log::tree::root(source, size)? != root {
        bail!("check failed: the roots differ");
    }
    let step = chunk as u64;
    let mut start = 0u64;
    let mut sizes = std::collections::BTreeSet::new();
    while start < size.get() {
        let end = (start + step).min(size.get());
        let (a, b) = (
            source.entries(LeafIndex::new(start), LeafIndex::new(end))?,
            dest.entries(LeafIndex::new(start), LeafIndex::new(end))?,
        );
        if a != b {
            bail!("check failed: entries {start}..{end} differ");
        }
        for i in start..end {
            let (ra, rb) = (
                source.receipt_size(LeafIndex::new(i))?,
                dest.receipt_size(LeafIndex::new(i))?,
            );
            if ra != rb {
                bail!("check failed: the receipt size of entry {i} differs");
            }
            if let Some(r) = ra {
                sizes.insert(r);
            }
        }
        let ids: Vec<u64> =
            (tlog_tiles::stored_hash_count(start)..tlog_tiles::stored_hash_count(end)).collect();
        if source.read_hashes(&ids)? != dest.read_hashes(&ids)? {
            bail!("check failed: stored hashes of entries {start}..{end} differ");
        }
        start = end;
    }
    for s in sizes {
        if source.checkpoint(s)? != dest.checkpoint(s)? {
            bail!("check failed: the checkpoint note at size {s} differs");
        }
    }
    Ok(root)
}
