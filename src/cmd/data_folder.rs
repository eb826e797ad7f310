//! The data folder `tally serve` runs on, claimed before anything is made
//! in it (docs/operations.md, "The data folder"):
//!
//! - One `serve` at a time: an exclusive lock (flock) on [`LOCK_FILE`],
//!   which holds the pid of the `serve` that has it, so that a second one
//!   says which process uses the folder instead of failing inside the log's
//!   database.
//! - A first start is all or nothing. It begins in a folder that is empty
//!   (or missing), writes [`FIRST_START_MARKER`] before anything else, and
//!   removes it once the default project's API key has been shown. A first
//!   start that fails before that removes everything it made; one that was
//!   killed leaves the marker, and the next start, knowing that nothing was
//!   ever served from the folder (nobody had its key), empties it and
//!   starts over, saying so.

use std::fs::{self, File, OpenOptions};
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

/// The lock file, holding the pid of the `serve` that uses the folder.
pub(crate) const LOCK_FILE: &str = "serve.lock";
/// Present while a first start has not yet shown the API key.
pub(crate) const FIRST_START_MARKER: &str = "first-start.incomplete";

/// A claimed data folder: locked for this process until it ends.
#[derive(Debug)]
pub(crate) struct DataFolder {
    dir: PathBuf,
    _lock: Flock<File>,
    /// Set during a first start, until [`DataFolder::first_start_done`].
    first_start: Option<FirstStart>,
    notice: Option<String>,
}

#[derive(Debug)]
struct FirstStart {
    /// The folder did not exist: remove it whole on failure.
    created_dir: bool,
}

impl DataFolder {
    /// Creates the folder if needed (mode 0700), takes its lock, and on a
    /// first start writes the marker. A folder whose marker an earlier
    /// first start left is emptied first.
    ///
    /// # Errors
    /// Another `serve` holds the folder (naming its pid), or the folder or
    /// its lock file cannot be made.
    pub(crate) fn claim(dir: &Path) -> anyhow::Result<Self> {
        let created_dir = !dir.exists();
        if created_dir {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .with_context(|| format!("creating the data folder {}", dir.display()))?;
        }
        let lock_path = dir.join(LOCK_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&lock_path)
            .with_context(|| format!("opening {}", lock_path.display()))?;
        let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => l,
            Err((mut file, Errno::EWOULDBLOCK)) => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                let who = match pid.trim() {
                    "" => "another `tally serve`".to_owned(),
                    p => format!("another `tally serve` (pid {p})"),
                };
                return Err(anyhow!(
                    "{who} is using the data folder {}; stop it first, or give this one another --data-dir",
                    dir.display()
                ));
            }
            Err((_, e)) => {
                return Err(anyhow!("locking {}: {e}", lock_path.display()));
            }
        };
        lock.set_len(0)
            .and_then(|()| lock.seek(SeekFrom::Start(0)).map(|_| ()))
            .and_then(|()| writeln!(lock, "{}", std::process::id()))
            .and_then(|()| lock.sync_all())
            .with_context(|| format!("writing {}", lock_path.display()))?;

        let marker = dir.join(FIRST_START_MARKER);
        let mut notice = None;
        if marker.exists() {
            empty_except_lock(dir)?;
            notice = Some(format!(
                "the first start of {} did not finish (it stopped before the API key was shown, so nothing was ever served from it): starting it again",
                dir.display()
            ));
        }
        let first_start = if others(dir)?.is_empty() {
            File::create(&marker)
                .and_then(|f| f.sync_all())
                .and_then(|()| File::open(dir)?.sync_all())
                .with_context(|| format!("writing {}", marker.display()))?;
            Some(FirstStart { created_dir })
        } else {
            None
        };
        Ok(Self {
            dir: dir.to_owned(),
            _lock: lock,
            first_start,
            notice,
        })
    }

    /// What to tell the operator about the folder before starting, if anything.
    #[must_use]
    pub(crate) fn notice(&self) -> Option<&str> {
        self.notice.as_deref()
    }

    /// The first start showed the API key: keep what it made.
    ///
    /// # Errors
    /// When the marker cannot be removed (the start must not go on: the
    /// next one would empty a folder that served requests).
    pub(crate) fn first_start_done(&mut self) -> anyhow::Result<()> {
        if self.first_start.is_some() {
            let marker = self.dir.join(FIRST_START_MARKER);
            fs::remove_file(&marker)
                .and_then(|()| File::open(&self.dir)?.sync_all())
                .with_context(|| format!("removing {}", marker.display()))?;
            self.first_start = None;
        }
        Ok(())
    }
}

impl Drop for DataFolder {
    /// A first start that did not finish removes what it made.
    fn drop(&mut self) {
        if let Some(first) = &self.first_start {
            let _ = if first.created_dir {
                fs::remove_dir_all(&self.dir)
            } else {
                empty_except_lock(&self.dir).map_err(std::io::Error::other)
            };
            if !first.created_dir {
                let _ = fs::remove_file(self.dir.join(LOCK_FILE));
            }
        }
    }
}

/// Who holds `dir`'s lock, when a `serve` does: "another `tally serve`
/// (pid N)". Touches nothing: a folder or lock file that is not there is
/// held by nobody.
#[must_use]
pub(crate) fn holder(dir: &Path) -> Option<String> {
    let file = File::open(dir.join(LOCK_FILE)).ok()?;
    match Flock::lock(file, FlockArg::LockSharedNonblock) {
        Ok(_unlocked_on_drop) => None,
        Err((mut file, Errno::EWOULDBLOCK)) => {
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            Some(match pid.trim() {
                "" => "another `tally serve`".to_owned(),
                p => format!("another `tally serve` (pid {p})"),
            })
        }
        Err(_) => None,
    }
}

/// The folder's entries other than the lock file.
fn others(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        if entry.file_name() != LOCK_FILE {
            out.push(entry.path());
        }
    }
    Ok(out)
}

/// Removes every entry of `dir` but the lock file.
fn empty_except_lock(dir: &Path) -> anyhow::Result<()> {
    for path in others(dir)? {
        let removed = if path.is_dir() && !path.is_symlink() {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        };
        removed.with_context(|| format!("removing {}", path.display()))?;
    }
    Ok(())
}

/// Where the folder's log is kept when it is not `log.redb`: the PostgreSQL
/// URL `tally store copy` moved it to, or the one `tally serve --store`
/// last served it from (docs/operations.md, "Running on PostgreSQL"). A
/// `serve` without `--store` serves from there, and one told to serve
/// `log.redb` refuses: that copy stopped growing when the log moved.
/// Mode 0600: the URL may hold the database password, as `log.skey` beside
/// it holds the log's key.
pub(crate) const STORE_FILE: &str = "store.url";

/// The PostgreSQL URL recorded in `dir`'s [`STORE_FILE`], if any.
///
/// # Errors
/// The file cannot be read, or holds no PostgreSQL URL.
pub(crate) fn recorded_store(dir: &Path) -> anyhow::Result<Option<String>> {
    let path = dir.join(STORE_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(anyhow!("reading {}: {e}", path.display())),
    };
    let url = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .unwrap_or("");
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(anyhow!(
            "{} holds no PostgreSQL URL: write the URL of the database this folder's log is in (postgres://user@host:port/database) on its own line",
            path.display()
        ));
    }
    Ok(Some(url.to_owned()))
}

/// Records `url` in `dir`'s [`STORE_FILE`] (written whole, then renamed
/// into place, so a crash leaves the old file or the new one).
///
/// # Errors
/// The file cannot be written.
pub(crate) fn record_store(dir: &Path, url: &str, why: &str) -> anyhow::Result<()> {
    let path = dir.join(STORE_FILE);
    let tmp = dir.join(format!("{STORE_FILE}.tmp"));
    let text = format!(
        "# The log of this data folder is in PostgreSQL ({why}).\n\
         # `tally serve` without --store serves it from here, and refuses to serve log.redb.\n\
         {url}\n"
    );
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()).and_then(|()| f.sync_all()))
        .and_then(|()| fs::rename(&tmp, &path))
        .and_then(|()| File::open(dir)?.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}
