//! The record journal: an append-only file beside the chain store
//! (`chain.journal` next to `chain.redb`) that lets the gateway forward a
//! call as soon as its decision is in the operating system, without waiting
//! for an fsync.
//!
//! The chain writer signs a batch of records and appends their frames with
//! one `write()`. Once that returns, the records survive the death of the
//! process (kill -9, a panic, an OOM kill): the bytes are in the kernel's
//! page cache and reach the file whatever happens to the process. The
//! writer answers then; a second thread commits the same records to
//! chain.redb durably (with fsync) right after. A power loss or kernel crash
//! before that commit can lose the records of the last commit interval
//! (docs/threat-model.md); `--sync-before-forward` keeps the fully durable
//! order instead.
//!
//! [`crate::store::ChainStore::open`] replays the journal into the store
//! before anything else touches the chain, so every reader (`tally status`,
//! sync, the next gateway run) sees what a crashed gateway journaled.
//!
//! A frame, all integers big-endian:
//!
//! ```text
//! magic        4 bytes  "tj1\n"
//! record_len   u32      length of the record's canonical bytes
//! secret_len   u32      length of the secret's JSON, 0 when there is none
//! checksum     32 bytes SHA-256(record_len ‖ secret_len ‖ record ‖ secret)
//! record       record_len bytes
//! secret       secret_len bytes: {"salt": hex, "content"?: value}
//! ```
//!
//! Reading stops at the first frame that is short or does not check: a
//! `write()` cut off by the death of the process (or lost pages after a
//! power loss) leaves a torn tail, and nothing after it was ever answered.

use std::fs::{File, OpenOptions};
use std::io::{Read as _, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use tally_schemas::{Hash, Record};

use crate::store::{Appended, Secret};

const MAGIC: &[u8; 4] = b"tj1\n";
const HEADER_LEN: usize = 4 + 4 + 4 + 32;

/// Where the chain writer journals records. [`Journal`] is the real file;
/// tests use others to inject failures.
pub trait JournalSink: Send + 'static {
    /// Appends `frames` (whole frames) with one write. On error nothing of
    /// them may remain: the sink cuts the file back to its old length, or
    /// returns [`JournalError::Broken`] when it cannot.
    ///
    /// # Errors
    /// [`JournalError`] when the frames are not (all) written.
    fn append(&mut self, frames: &[u8]) -> Result<(), JournalError>;
    /// Empties the journal (every record in it is committed to the store).
    ///
    /// # Errors
    /// [`JournalError`] when it cannot be truncated.
    fn clear(&mut self) -> Result<(), JournalError>;
    /// Bytes in the journal.
    fn len(&self) -> u64;
    /// Whether the journal is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why the journal failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    /// The write failed and the journal is as it was before it.
    #[error("record journal: {0}")]
    Io(String),
    /// The write failed and part of it may remain in the journal.
    #[error("record journal is in an unknown state: {0}")]
    Broken(String),
}

/// The journal file.
#[derive(Debug)]
pub struct Journal {
    file: File,
    len: u64,
}

impl Journal {
    /// Opens (or creates, mode 0600: secrets go through it) the journal at
    /// `path` for appending.
    ///
    /// # Errors
    /// The OS error.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(path)?;
        let len = file.metadata()?.len();
        Ok(Self { file, len })
    }
}

impl JournalSink for Journal {
    fn append(&mut self, frames: &[u8]) -> Result<(), JournalError> {
        match self.file.write_all(frames) {
            Ok(()) => {
                self.len += frames.len() as u64;
                Ok(())
            }
            Err(e) => match self.file.set_len(self.len) {
                Ok(()) => Err(JournalError::Io(e.to_string())),
                Err(e2) => Err(JournalError::Broken(format!(
                    "{e}; and cutting the journal back failed: {e2}"
                ))),
            },
        }
    }

    fn clear(&mut self) -> Result<(), JournalError> {
        self.file
            .set_len(0)
            .map_err(|e| JournalError::Io(e.to_string()))?;
        self.len = 0;
        Ok(())
    }

    fn len(&self) -> u64 {
        self.len
    }
}

/// Appends the frame of `appended` to `out`.
///
/// # Errors
/// When the secret cannot be serialised or a part is over 4 GiB.
pub fn encode(appended: &Appended, out: &mut Vec<u8>) -> Result<(), String> {
    let record = appended.record.canonical_bytes();
    let secret = match &appended.secret {
        Some(s) => serde_json::to_vec(s).map_err(|e| e.to_string())?,
        None => Vec::new(),
    };
    let record_len = u32::try_from(record.len()).map_err(|_| "record too large".to_owned())?;
    let secret_len = u32::try_from(secret.len())
        .map_err(|_| "content too large for the record journal".to_owned())?;
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&record_len.to_be_bytes());
    out.extend_from_slice(&secret_len.to_be_bytes());
    out.extend_from_slice(checksum(record_len, secret_len, record, &secret).as_bytes());
    out.extend_from_slice(record);
    out.extend_from_slice(&secret);
    Ok(())
}

fn checksum(record_len: u32, secret_len: u32, record: &[u8], secret: &[u8]) -> Hash {
    let mut buf = Vec::with_capacity(8 + record.len() + secret.len());
    buf.extend_from_slice(&record_len.to_be_bytes());
    buf.extend_from_slice(&secret_len.to_be_bytes());
    buf.extend_from_slice(record);
    buf.extend_from_slice(secret);
    Hash::sha256(&buf)
}

/// What a journal file holds.
#[derive(Debug, Default)]
pub struct Contents {
    /// The records of the whole frames, in order.
    pub records: Vec<Appended>,
    /// Bytes after the last whole frame (a torn tail), ignored.
    pub torn_bytes: u64,
}

/// Reads the journal at `path`; a missing file is an empty journal.
///
/// # Errors
/// The OS error when it exists but cannot be read; a message when a frame
/// that checks holds a record or secret that does not parse (the file was
/// edited: the checksum guards only against torn writes).
pub fn read(path: &Path) -> Result<Contents, String> {
    let mut bytes = Vec::new();
    match File::open(path) {
        Ok(mut f) => {
            f.read_to_end(&mut bytes)
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Contents::default()),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    }
    let mut out = Contents::default();
    let mut at = 0usize;
    while let Some((appended, next)) = frame_at(&bytes, at)? {
        out.records.push(appended);
        at = next;
    }
    out.torn_bytes = (bytes.len() - at) as u64;
    Ok(out)
}

/// The frame at `at`, and where the next one starts; `None` at the end or
/// at a torn frame.
fn frame_at(bytes: &[u8], at: usize) -> Result<Option<(Appended, usize)>, String> {
    let Some(header) = bytes.get(at..at + HEADER_LEN) else {
        return Ok(None);
    };
    if &header[..4] != MAGIC {
        return Ok(None);
    }
    let word =
        |i: usize| u32::from_be_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
    let (record_len, secret_len) = (word(4), word(8));
    let body = at + HEADER_LEN;
    let record_end = body + record_len as usize;
    let end = record_end + secret_len as usize;
    let (Some(record), Some(secret)) = (bytes.get(body..record_end), bytes.get(record_end..end))
    else {
        return Ok(None);
    };
    if checksum(record_len, secret_len, record, secret).as_bytes()[..] != header[12..44] {
        return Ok(None);
    }
    let record = Record::from_json(record)
        .map_err(|e| format!("record journal: a frame at byte {at} holds no valid record: {e}"))?;
    let secret: Option<Secret> = if secret.is_empty() {
        None
    } else {
        Some(serde_json::from_slice(secret).map_err(|e| {
            format!("record journal: a frame at byte {at} holds no valid secret: {e}")
        })?)
    };
    Ok(Some((Appended { record, secret }, end)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_schemas::record::NoteBody;
    use tally_schemas::{AgentName, Body, Nonce, SecretKey, Seq, UnixMillis, UnsignedRecord};

    fn note(seq: u64, text: &str) -> Appended {
        let key = SecretKey::from_seed(&[3; 32]);
        let record = UnsignedRecord {
            agent: AgentName::new("j").unwrap(),
            key_id: key.public_key().key_id(),
            seq: Seq::new(seq).unwrap(),
            prev: (seq > 0).then(|| Hash::sha256(b"prev")),
            time: UnixMillis::new(1_796_025_600_000),
            nonce: Nonce::from_bytes(vec![u8::try_from(seq).unwrap(); 16]).unwrap(),
            body: Body::Note(NoteBody { text: text.into() }),
        }
        .sign(&key)
        .unwrap();
        Appended {
            record,
            secret: (seq % 2 == 0).then(|| Secret {
                proof: None,
                salt: "00".repeat(16),
                content: Some(serde_json::json!({"seq": seq})),
            }),
        }
    }

    #[test]
    fn frames_round_trip_and_a_torn_tail_is_ignored_wherever_it_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chain.journal");
        let records: Vec<Appended> = (0..3).map(|i| note(i, &format!("n{i}"))).collect();
        let mut bytes = Vec::new();
        let mut ends = Vec::new();
        for r in &records {
            encode(r, &mut bytes).unwrap();
            ends.push(bytes.len());
        }
        for cut in 0..=bytes.len() {
            std::fs::write(&path, &bytes[..cut]).unwrap();
            let got = read(&path).unwrap();
            let whole = ends.iter().filter(|&&e| e <= cut).count();
            assert_eq!(got.records.len(), whole, "cut at {cut}");
            let kept = if whole == 0 { 0 } else { ends[whole - 1] };
            assert_eq!(got.torn_bytes, (cut - kept) as u64);
            for (a, b) in got.records.iter().zip(&records) {
                assert_eq!(a.record, b.record);
                assert_eq!(a.secret, b.secret);
            }
        }
    }

    #[test]
    fn a_flipped_byte_ends_the_journal_there() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chain.journal");
        let mut bytes = Vec::new();
        encode(&note(0, "a"), &mut bytes).unwrap();
        let first = bytes.len();
        encode(&note(1, "b"), &mut bytes).unwrap();
        bytes[first + HEADER_LEN + 3] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let got = read(&path).unwrap();
        assert_eq!(got.records.len(), 1);
        assert_eq!(got.torn_bytes, (bytes.len() - first) as u64);
        assert_eq!(read(&dir.path().join("missing")).unwrap().records.len(), 0);
    }

    #[test]
    fn the_file_appends_clears_and_is_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chain.journal");
        let mut j = Journal::open(&path).unwrap();
        let mut bytes = Vec::new();
        encode(&note(0, "a"), &mut bytes).unwrap();
        j.append(&bytes).unwrap();
        j.append(&bytes).unwrap();
        assert_eq!(j.len(), 2 * bytes.len() as u64);
        assert_eq!(read(&path).unwrap().records.len(), 2);
        j.clear().unwrap();
        assert!(j.is_empty());
        j.append(&bytes).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
}
