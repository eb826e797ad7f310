//! Standard output for every subcommand, as the `tally` CLI does it
//! (`src/cmd/out.rs` there): [`outln!`] instead of `println!` (which
//! `main.rs` denies), so that a closed standard output (`tally-bench ... |
//! head`) is an error the command returns with `?`, not a panic, and `main`
//! exits quietly with status 141, as a process killed by SIGPIPE does.

use std::io::{self, Write};

/// Exit status when standard output was closed: 128 + SIGPIPE (13).
pub(crate) const STDOUT_CLOSED_EXIT: u8 = 141;

/// The reader of standard output has gone (a broken pipe of standard
/// output, told apart from one of a socket).
#[derive(Debug)]
struct StdoutClosed;

impl std::fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("standard output was closed")
    }
}

impl std::error::Error for StdoutClosed {}

/// Writes one line to standard output (what [`outln!`] expands to).
///
/// # Errors
/// [`StdoutClosed`] (inside an [`io::Error`]) when the reader has gone;
/// other I/O errors as they are.
pub(crate) fn line(args: std::fmt::Arguments<'_>) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush())
        .map_err(|e| {
            if e.kind() == io::ErrorKind::BrokenPipe {
                io::Error::new(io::ErrorKind::BrokenPipe, StdoutClosed)
            } else {
                e
            }
        })
}

/// Whether `e` (or an error it wraps) is a closed standard output.
pub(crate) fn is_stdout_closed(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.is::<StdoutClosed>()
            || c.downcast_ref::<io::Error>()
                .and_then(io::Error::get_ref)
                .is_some_and(|inner| inner.is::<StdoutClosed>())
    })
}

/// `println!` that returns an [`io::Result`] instead of panicking; use it
/// with `?`.
macro_rules! outln {
    () => {
        $crate::out::line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::out::line(format_args!($($arg)*))
    };
}

pub(crate) use outln;
