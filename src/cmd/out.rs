//! Standard output and standard error for every command, one way for the
//! whole CLI: [`outln!`] and [`stdout`] instead of `println!` and
//! `io::stdout()`, [`errln!`] instead of `eprintln!` (clippy's
//! `print_stdout` and `print_stderr` are denied in `main.rs`).
//!
//! `println!` panics when standard output is a pipe whose reader has gone
//! (`tally … | head`), with a backtrace, in the middle of the command.
//! Here a closed standard output is an error, [`StdoutClosed`], that the
//! command returns like any other with `?`; `main` then exits quietly with
//! status 141, the status of a process killed by SIGPIPE, so shell
//! pipelines see what they see from any Unix tool. Commands finish their
//! writes to disk before they print, so stopping at a print never leaves
//! state half written. A closed standard error is ignored: diagnostics are
//! best effort.

use std::fmt;
use std::io::{self, Write};

/// Exit status when standard output was closed: 128 + SIGPIPE (13).
pub(crate) const STDOUT_CLOSED_EXIT: u8 = 141;

/// The reader of standard output has gone.
#[derive(Debug)]
pub(crate) struct StdoutClosed;

impl fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("standard output was closed")
    }
}

impl std::error::Error for StdoutClosed {}

/// Marks a broken-pipe error of standard output as [`StdoutClosed`].
fn mark(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::BrokenPipe {
        io::Error::new(io::ErrorKind::BrokenPipe, StdoutClosed)
    } else {
        e
    }
}

/// Whether `e` (or an error it wraps) is a closed standard output.
#[must_use]
pub(crate) fn is_stdout_closed(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.is::<StdoutClosed>()
            || c.downcast_ref::<io::Error>()
                .and_then(io::Error::get_ref)
                .is_some_and(|inner| inner.is::<StdoutClosed>())
    })
}

/// Standard output as a writer whose broken-pipe errors are [`StdoutClosed`].
#[derive(Debug)]
pub(crate) struct Stdout(io::StdoutLock<'static>);

/// Locks standard output for a run of writes.
#[must_use]
pub(crate) fn stdout() -> Stdout {
    Stdout(io::stdout().lock())
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf).map_err(mark)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush().map_err(mark)
    }
}

/// Writes one line to standard output (what [`outln!`] expands to).
///
/// # Errors
/// [`StdoutClosed`] (inside an [`io::Error`]) when the reader has gone;
/// other I/O errors as they are.
pub(crate) fn line(args: fmt::Arguments<'_>) -> io::Result<()> {
    let mut out = stdout();
    out.write_fmt(args)?;
    out.write_all(b"\n")?;
    out.flush()
}

/// Writes one line to standard error, ignoring failure (what [`errln!`]
/// expands to).
pub(crate) fn err_line(args: fmt::Arguments<'_>) {
    let mut err = io::stderr().lock();
    let _ = err.write_fmt(args);
    let _ = err.write_all(b"\n");
}

/// `println!` that returns an [`io::Result`] instead of panicking; use it
/// with `?`.
macro_rules! outln {
    () => {
        $crate::cmd::out::line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::cmd::out::line(format_args!($($arg)*))
    };
}

/// `eprintln!` that never panics.
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::cmd::out::err_line(format_args!($($arg)*))
    };
}

pub(crate) use {errln, outln};
