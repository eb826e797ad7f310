//! An incremental reader of Server-Sent Events (the WHATWG HTML "event
//! stream interpretation"), used by the Streamable HTTP proxy to observe the
//! JSON-RPC messages an upstream streams while the bytes pass through to the
//! client unchanged. It only reads: the proxy never re-writes an event.
//!
//! Lines end with CRLF, LF or CR; `data` lines are joined with LF; an event
//! is dispatched at a blank line; comments (`:`) and unknown fields are
//! ignored; `id` sets the last event id (not when it contains NUL). An event
//! whose buffered lines exceed the reader's bound makes it fail.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Event {
    /// The `event` field (`message` when absent).
    pub event: String,
    /// The `data` lines joined with LF.
    pub data: String,
    /// The last event id after this event (the stream's, not only this
    /// event's: an event without `id` keeps the previous one).
    pub id: Option<String>,
    /// Whether this event itself carried an `id` field.
    pub has_id: bool,
}

/// The stream broke the reader's bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an event stream line or event is larger than {0} bytes")]
pub(crate) struct TooLarge(pub usize);

/// The incremental reader.
#[derive(Debug)]
pub(crate) struct SseReader {
    max_event_bytes: usize,
    line: Vec<u8>,
    /// The previous chunk ended with CR: an LF starting the next one is
    /// part of the same line end.
    after_cr: bool,
    event: String,
    data: String,
    has_data: bool,
    has_id: bool,
    event_bytes: usize,
    last_id: Option<String>,
}

impl SseReader {
    /// A reader that refuses events (all their lines together) over
    /// `max_event_bytes`.
    #[must_use]
    pub(crate) fn new(max_event_bytes: usize) -> Self {
        Self {
            max_event_bytes,
            line: Vec::new(),
            after_cr: false,
            event: String::new(),
            data: String::new(),
            has_data: false,
            has_id: false,
            event_bytes: 0,
            last_id: None,
        }
    }

    /// Feeds `chunk`; returns the events it completes.
    ///
    /// # Errors
    /// [`TooLarge`] when an event grows past the bound.
    pub(crate) fn feed(&mut self, chunk: &[u8]) -> Result<Vec<Event>, TooLarge> {
        let mut out = Vec::new();
        let mut rest = chunk;
        if self.after_cr {
            self.after_cr = false;
            if let Some(stripped) = rest.strip_prefix(b"\n") {
                rest = stripped;
            }
        }
        while let Some(pos) = rest.iter().position(|&b| b == b'\n' || b == b'\r') {
            self.push_line_bytes(&rest[..pos])?;
            let line = std::mem::take(&mut self.line);
            self.line_done(&line, &mut out);
            let was_cr = rest[pos] == b'\r';
            rest = &rest[pos + 1..];
            if was_cr {
                match rest.first() {
                    Some(b'\n') => rest = &rest[1..],
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
        }
        self.push_line_bytes(rest)?;
        Ok(out)
    }

    fn push_line_bytes(&mut self, bytes: &[u8]) -> Result<(), TooLarge> {
        self.event_bytes += bytes.len();
        if self.event_bytes > self.max_event_bytes {
            return Err(TooLarge(self.max_event_bytes));
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    fn line_done(&mut self, line: &[u8], out: &mut Vec<Event>) {
        if line.is_empty() {
            if self.has_data || self.has_id {
                let data = std::mem::take(&mut self.data);
                let event = std::mem::take(&mut self.event);
                out.push(Event {
                    event: if event.is_empty() {
                        "message".to_owned()
                    } else {
                        event
                    },
                    data,
                    id: self.last_id.clone(),
                    has_id: self.has_id,
                });
            }
            self.event.clear();
            self.data.clear();
            self.has_data = false;
            self.has_id = false;
            self.event_bytes = 0;
            return;
        }
        if line[0] == b':' {
            return;
        }
        let text = String::from_utf8_lossy(line);
        let (field, value) = match text.find(':') {
            Some(i) => {
                let v = &text[i + 1..];
                (&text[..i], v.strip_prefix(' ').unwrap_or(v))
            }
            None => (&text[..], ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => value.clone_into(&mut self.event),
            "id" if !value.contains('\0') => {
                self.last_id = Some(value.to_owned());
                self.has_id = true;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(r: &mut SseReader, chunks: &[&[u8]]) -> Vec<Event> {
        chunks.iter().flat_map(|c| r.feed(c).unwrap()).collect()
    }

    #[test]
    fn events_split_anywhere_and_every_line_end_read_the_same() {
        let text = b"id: 1\r\nevent: message\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\n: comment\n\ndata:x\r\rid:2\ndata\n\n";
        let whole = all(&mut SseReader::new(1 << 20), &[text]);
        for split in 0..text.len() {
            let parts = all(
                &mut SseReader::new(1 << 20),
                &[&text[..split], &text[split..]],
            );
            assert_eq!(parts, whole, "split at {split}");
        }
        let bytewise: Vec<&[u8]> = text.chunks(1).collect();
        assert_eq!(all(&mut SseReader::new(1 << 20), &bytewise), whole);
        assert_eq!(whole.len(), 3);
        assert_eq!(whole[0].data, "{\"a\":\n1}");
        assert_eq!(whole[0].id.as_deref(), Some("1"));
        assert!(whole[0].has_id);
        assert_eq!(whole[1].data, "x");
        assert_eq!(whole[1].id.as_deref(), Some("1"));
        assert!(!whole[1].has_id);
        assert_eq!(whole[2].data, "");
        assert_eq!(whole[2].id.as_deref(), Some("2"));
    }

    #[test]
    fn a_priming_event_has_an_id_and_no_data() {
        let ev = all(&mut SseReader::new(64), &[b"id: abc\ndata:\n\n"]);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].data, "");
        assert_eq!(ev[0].id.as_deref(), Some("abc"));
    }

    #[test]
    fn an_event_over_the_bound_fails() {
        let mut r = SseReader::new(16);
        assert!(r.feed(b"data: 0123456789").is_ok());
        assert_eq!(r.feed(b"abcdef\n"), Err(TooLarge(16)));
    }
}
