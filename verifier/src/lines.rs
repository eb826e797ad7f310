//! Reading a pack as JSON Lines with a bound on each line, docs/protocol.md
//! §9.1 (131,072 bytes; the header line 1,048,576). A longer line is skipped up
//! to its newline without being buffered, so a hostile pack cannot make the
//! verifier hold more than one line.

use std::io::{self, BufRead, Read};

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

/// Reads the next line and appends it to `buf` (so that a batch of lines
/// shares one buffer); a line over `max` leaves `buf` as it was. Returns the
/// line kind and the number of bytes consumed, newline included.
pub(crate) fn read_line<R: BufRead + ?Sized>(
    input: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> io::Result<(Line, u64)> {
    let start = buf.len();
    // `read_until` finds the newline a word at a time; `take` stops it one
    // byte past the limit, so a long line is never buffered whole.
    let limit = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
    let read = (&mut *input).take(limit).read_until(b'\n', buf)?;
    let mut consumed = read as u64;
    if read == 0 {
        return Ok((Line::Eof, 0));
    }
    let terminated = buf.last() == Some(&b'\n');
    if terminated {
        buf.pop();
    }
    if buf.len() - start <= max {
        return Ok((Line::Text { terminated }, consumed));
    }
    buf.truncate(start);
    // Skip the rest of the long line without keeping it.
    let mut newline = terminated;
    while !newline {
        let chunk = match input.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            break;
        }
        let take = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => {
                newline = true;
                i + 1
            }
            None => chunk.len(),
        };
        input.consume(take);
        consumed += take as u64;
    }
    let len = if newline { consumed - 1 } else { consumed };
    Ok((Line::TooLong { len }, consumed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_bounds_and_skips_long_lines() {
        let data = b"ab\n0123456789\ncd";
        let mut r = io::BufReader::with_capacity(3, &data[..]);
        let mut buf = b"xyz".to_vec();
        assert_eq!(
            read_line(&mut r, &mut buf, 5).unwrap(),
            (Line::Text { terminated: true }, 3)
        );
        assert_eq!(buf, b"xyzab");
        assert_eq!(
            read_line(&mut r, &mut buf, 5).unwrap(),
            (Line::TooLong { len: 10 }, 11)
        );
        assert_eq!(buf, b"xyzab", "a long line leaves the buffer as it was");
        assert_eq!(
            read_line(&mut r, &mut buf, 5).unwrap(),
            (Line::Text { terminated: false }, 2)
        );
        assert_eq!(buf, b"xyzabcd");
        assert_eq!(read_line(&mut r, &mut buf, 5).unwrap(), (Line::Eof, 0));
        assert_eq!(buf, b"xyzabcd");
        let exact = b"12345\n";
        let mut r = &exact[..];
        buf.clear();
        assert_eq!(
            read_line(&mut r, &mut buf, 5).unwrap().0,
            Line::Text { terminated: true }
        );
        assert_eq!(buf, b"12345");
        // One byte over the limit, with and without a newline, then EOF.
        let mut r = io::BufReader::with_capacity(2, &b"123456\n1234567"[..]);
        assert_eq!(
            read_line(&mut r, &mut buf, 5).unwrap(),
            (Line::TooLong { len: 6 }, 7)
        );
        assert_eq!(
            read_line(&mut r, &mut buf, 5).unwrap(),
            (Line::TooLong { len: 7 }, 7)
        );
        assert_eq!(read_line(&mut r, &mut buf, 5).unwrap(), (Line::Eof, 0));
        assert_eq!(buf, b"12345");
    }
}
