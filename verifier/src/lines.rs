//! Reading a pack as JSON Lines with a bound on each line, docs/protocol.md
//! §9.1 ("each line is at most 131,072 bytes"). A longer line is skipped up
//! to its newline without being buffered, so a hostile pack cannot make the
//! verifier hold more than one line.

use std::io::{self, BufRead};

/// One line as read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Line {
    /// The line's bytes, without the newline. `terminated` is false for a
    /// last line that has no newline.
    Text { terminated: bool },
    /// The line was longer than the limit; its length in bytes.
    TooLong { len: u64 },
    /// End of input.
    Eof,
}

/// Reads the next line into `buf` (cleared first). Returns the line kind and
/// the number of bytes consumed, newline included.
pub(crate) fn read_line<R: BufRead + ?Sized>(
    input: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> io::Result<(Line, u64)> {
    buf.clear();
    let mut consumed: u64 = 0;
    let mut too_long = false;
    loop {
        let chunk = match input.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            let line = if consumed == 0 {
                Line::Eof
            } else if too_long {
                Line::TooLong { len: consumed }
            } else {
                Line::Text { terminated: false }
            };
            return Ok((line, consumed));
        }
        let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        let body = if done {
            &chunk[..take - 1]
        } else {
            &chunk[..take]
        };
        if !too_long {
            if buf.len() + body.len() > max {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(body);
            }
        }
        input.consume(take);
        consumed += take as u64;
        if done {
            let line = if too_long {
                Line::TooLong { len: consumed - 1 }
            } else {
                Line::Text { terminated: true }
            };
            return Ok((line, consumed));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_bounds_and_skips_long_lines() {
        let data = b"ab\n0123456789\ncd";
        let mut r = io::BufReader::with_capacity(3, &data[..]);
        let mut buf = Vec::new();
        assert_eq!(
            read_line(&mut r, &mut buf, 5).unwrap(),
            (Line::Text { terminated: true }, 3)
        );
        assert_eq!(buf, b"ab");
        assert_eq!(
            read_line(&mut r, &mut buf, 5).unwrap(),
            (Line::TooLong { len: 10 }, 11)
        );
        assert!(buf.is_empty());
        assert_eq!(
            read_line(&mut r, &mut buf, 5).unwrap(),
            (Line::Text { terminated: false }, 2)
        );
        assert_eq!(buf, b"cd");
        assert_eq!(read_line(&mut r, &mut buf, 5).unwrap(), (Line::Eof, 0));
        let exact = b"12345\n";
        let mut r = &exact[..];
        assert_eq!(
            read_line(&mut r, &mut buf, 5).unwrap().0,
            Line::Text { terminated: true }
        );
    }
}
