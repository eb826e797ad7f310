//! Receipt acceptance, docs/protocol.md §8: the one function the gateway,
//! its sync and `tally record` use to decide whether a witness's receipt
//! really covers one of the agent's records.
//!
//! A receipt is accepted when (§8 steps 1–5) its version is 1; it names the
//! record's hash and echoes its nonce; its checkpoint verifies with a pinned
//! log key that was not retired when the witness received the record; the
//! rebuilt entry is proven at its index by the inclusion proof; and the
//! witness's receive time is within the skew bound of the record's own
//! time and not ahead of the local clock by more than it (so the original
//! receipt of a record whose answer was lost is accepted however late it
//! is fetched again). The
//! binding and proof checks are [`Receipt::verify`] in tally-schemas; this
//! module adds the trust policy (which keys, retirement, freshness).
//!
//! The pinned keys are the trust anchor. [`WitnessTrust::apply_directory`]
//! takes a freshly fetched key directory into account only to retire them:
//! a pinned key the directory lists as retired stops being trusted for
//! receipts from its retirement on, and a key the agent did not pin is never
//! trusted however the directory lists it (the user re-pins it, `tally
//! agent init NAME --witness URL`).

use tally_schemas::canonical::{parse_strict, Limits};
use tally_schemas::entry::ReceiptError;
use tally_schemas::note::{peek_checkpoint, NoteError, NoteVerifier};
use tally_schemas::{Checkpoint, Receipt, Record, UnixMillis};

use tally_schemas::api::KeyDirectory;

/// A log key the agent trusts, with the validity range the witness's key
/// directory gave for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustedLogKey {
    /// The key.
    pub verifier: NoteVerifier,
    /// The key signs from this time on, when known.
    pub not_before: Option<UnixMillis>,
    /// The key was retired at this time; `None` while it is current.
    pub not_after: Option<UnixMillis>,
}

/// The pinned log keys of one witness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WitnessTrust {
    keys: Vec<TrustedLogKey>,
}

impl WitnessTrust {
    /// Trust exactly these keys.
    #[must_use]
    pub fn new(keys: Vec<TrustedLogKey>) -> Self {
        Self { keys }
    }

    /// The keys.
    #[must_use]
    pub fn keys(&self) -> &[TrustedLogKey] {
        &self.keys
    }

    /// Takes a freshly fetched key directory into account: a pinned key the
    /// directory lists with a retirement time is retired then (a
    /// retirement only ever moves earlier: a directory cannot bring a
    /// retired key back); keys that are not pinned are reported, never
    /// trusted.
    ///
    /// # Errors
    /// A message, and nothing changed, when the directory is for another
    /// log than the pinned keys or lists a key that does not parse.
    pub fn apply_directory(&mut self, dir: &KeyDirectory) -> Result<DirectoryReview, String> {
        if !self.keys.iter().any(|k| k.verifier.name() == dir.origin) {
            return Err(format!(
                "the witness's key directory is for log {:?}, not the pinned one",
                dir.origin
            ));
        }
        let mut listed = Vec::with_capacity(dir.keys.len());
        for k in &dir.keys {
            if k.vkey.name() != dir.origin {
                return Err(format!(
                    "the witness's key directory lists {} under origin {}",
                    k.vkey.vkey(),
                    dir.origin
                ));
            }
            listed.push((&k.vkey, k.not_after));
        }
        let mut review = DirectoryReview::default();
        for pinned in self
            .keys
            .iter_mut()
            .filter(|k| k.verifier.name() == dir.origin)
        {
            let entry = listed.iter().find(|(v, _)| **v == pinned.verifier);
            match entry {
                None => review.missing.push(pinned.verifier.vkey()),
                Some((_, Some(retired))) => {
                    if pinned.not_after.is_none_or(|t| *retired < t) {
                        pinned.not_after = Some(*retired);
                        review.retired.push((pinned.verifier.vkey(), *retired));
                    }
                }
                Some((_, None)) => {}
            }
        }
        for (v, not_after) in &listed {
            if not_after.is_none() && !self.keys.iter().any(|k| k.verifier == **v) {
                review.unpinned.push(v.vkey());
            }
        }
        Ok(review)
    }
}

/// What a key directory said that matters to the pinned keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirectoryReview {
    /// Pinned keys newly retired, with their retirement time.
    pub retired: Vec<(String, UnixMillis)>,
    /// Current keys of the witness that are not pinned (a rotation the user
    /// has not re-pinned; never trusted).
    pub unpinned: Vec<String>,
    /// Pinned keys the directory no longer lists (left as they are).
    pub missing: Vec<String>,
}

impl DirectoryReview {
    /// A sentence about the unpinned keys, for error messages: empty when
    /// there are none.
    #[must_use]
    pub fn unpinned_note(&self) -> String {
        if self.unpinned.is_empty() {
            return String::new();
        }
        format!(
            "; the witness's key directory lists a current log key that is not pinned ({}): if your operator rotated the log key, check it with them and re-pin it with `tally agent init AGENT --witness URL`",
            self.unpinned.join(", ")
        )
    }
}

/// Why a receipt was not accepted. The variant names the class of failure
/// the gateway reports (`--strict` errors say which); the fields are the
/// evidence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReceiptRejection {
    /// The bytes are not a v1 receipt.
    #[error("invalid receipt: {0}")]
    Malformed(String),
    /// The checkpoint is not signed by any pinned log key (or names another log).
    #[error("untrusted receipt: {0}")]
    Untrusted(String),
    /// The checkpoint is signed by a pinned key that was retired (or not yet
    /// valid) when the witness received the record.
    #[error("untrusted receipt: {}", key_validity(.key, *.received, *.not_before, *.not_after))]
    KeyRetired {
        /// `name+id` of the key.
        key: String,
        /// The receipt's time.
        received: UnixMillis,
        /// Start of validity.
        not_before: Option<UnixMillis>,
        /// Retirement.
        not_after: Option<UnixMillis>,
    },
    /// The receipt is for another record (hash or nonce differ).
    #[error("mismatched receipt: {0}")]
    Mismatch(ReceiptError),
    /// The receipt is signed but does not prove the record's entry.
    #[error("invalid receipt: {0}")]
    Invalid(ReceiptError),
    /// The witness's receive time is too far from the record's time, or
    /// ahead of the local clock by more than the skew bound.
    #[error("stale receipt: witness time {received} is {diff_ms} ms from {} {compared_to}, more than {max_skew_ms} ms", if *.ahead_of_local_clock { "local time" } else { "the record's time" })]
    Stale {
        /// The receipt's time.
        received: UnixMillis,
        /// The time it was compared with: the record's, or the local clock.
        compared_to: UnixMillis,
        /// Whether `compared_to` is the local clock (the receipt's time is
        /// ahead of it).
        ahead_of_local_clock: bool,
        /// |received − compared_to|.
        diff_ms: u64,
        /// The bound.
        max_skew_ms: u64,
    },
}

fn key_validity(
    key: &str,
    received: UnixMillis,
    not_before: Option<UnixMillis>,
    not_after: Option<UnixMillis>,
) -> String {
    match (not_before, not_after) {
        (_, Some(t)) if received >= t => format!(
            "its checkpoint is signed by log key {key}, which the witness retired at {t}; the receipt's time {received} is not before that"
        ),
        (Some(t), _) => format!(
            "its checkpoint is signed by log key {key}, which is valid only from {t}; the receipt's time {received} is before that"
        ),
        _ => format!("log key {key} is not valid at the receipt's time {received}"),
    }
}

impl ReceiptRejection {
    /// A stable one-word code for the failure class: `invalid`, `untrusted`,
    /// `mismatched` or `stale`.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::Malformed(_) | Self::Invalid(_) => "invalid",
            Self::Untrusted(_) | Self::KeyRetired { .. } => "untrusted",
            Self::Mismatch(_) => "mismatched",
            Self::Stale { .. } => "stale",
        }
    }
}

/// A receipt that was accepted, with the checkpoint it was proven in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptedReceipt {
    /// The receipt.
    pub receipt: Receipt,
    /// Its verified checkpoint.
    pub checkpoint: Checkpoint,
}

/// Parses receipt bytes strictly (docs/protocol.md §2: no duplicate keys,
/// no unknown members, bounded size and depth).
///
/// # Errors
/// [`ReceiptRejection::Malformed`] saying why.
pub fn parse_receipt(bytes: &[u8]) -> Result<Receipt, ReceiptRejection> {
    let value = parse_strict(bytes, Limits::WIRE)
        .map_err(|e| ReceiptRejection::Malformed(e.to_string()))?;
    serde_json::from_value(value).map_err(|e| ReceiptRejection::Malformed(e.to_string()))
}

/// Decides whether `receipt` is a valid receipt for `record` under `trust`,
/// at local time `now`: the witness's receive time must be within
/// `max_skew_ms` of the record's time (as the witness checked when it
/// admitted it) and no more than `max_skew_ms` ahead of `now`. It may be
/// long before `now`: a retry of a record whose answer was lost gets the
/// original receipt (protocol.md §8).
///
/// # Errors
/// [`ReceiptRejection`] naming the first failed condition.
pub fn accept_receipt(
    receipt: &Receipt,
    record: &Record,
    trust: &WitnessTrust,
    now: UnixMillis,
    max_skew_ms: u64,
) -> Result<AcceptedReceipt, ReceiptRejection> {
    accept_receipt_with(
        receipt,
        record,
        trust,
        now,
        max_skew_ms,
        &OpenedNote::default(),
    )
}

/// The last checkpoint note whose signature checked out, and under which
/// key: the receipts of one batch share one checkpoint (protocol.md §8.1),
/// so its signature is checked once for all of them.
#[derive(Debug, Default)]
pub struct OpenedNote(std::sync::Mutex<Option<(String, NoteVerifier, Checkpoint)>>);

impl OpenedNote {
    fn get(&self, note: &str, key: &NoteVerifier) -> Option<Checkpoint> {
        let last = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        last.as_ref()
            .filter(|(n, k, _)| n == note && k == key)
            .map(|(_, _, c)| c.clone())
    }

    fn put(&self, note: &str, key: &NoteVerifier, checkpoint: &Checkpoint) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some((note.to_owned(), key.clone(), checkpoint.clone()));
    }
}

/// [`accept_receipt`], checking a checkpoint's signature only when `opened`
/// does not hold that note already verified under the same key.
///
/// # Errors
/// [`ReceiptRejection`] naming the first failed condition.
pub fn accept_receipt_with(
    receipt: &Receipt,
    record: &Record,
    trust: &WitnessTrust,
    now: UnixMillis,
    max_skew_ms: u64,
    opened: &OpenedNote,
) -> Result<AcceptedReceipt, ReceiptRejection> {
    if trust.keys.is_empty() {
        return Err(ReceiptRejection::Untrusted(
            "no log key is pinned for this witness (run `tally agent init NAME --witness URL`)"
                .into(),
        ));
    }
    // Only keys named like the checkpoint's origin can sign it; reading the
    // origin before any signature check only chooses which keys to try.
    let origin = peek_checkpoint(&receipt.checkpoint)
        .map_err(|e| ReceiptRejection::Invalid(ReceiptError::Checkpoint(e)))?
        .origin;
    let mut last_untrusted: Option<NoteError> = None;
    for key in trust.keys.iter().filter(|k| k.verifier.name() == origin) {
        let verified = match opened.get(&receipt.checkpoint, &key.verifier) {
            Some(checkpoint) => receipt
                .verify_opened(record, &checkpoint)
                .map(|entry| (checkpoint, entry)),
            None => receipt
                .verify(record, &key.verifier)
                .inspect(|(checkpoint, _)| {
                    opened.put(&receipt.checkpoint, &key.verifier, checkpoint);
                }),
        };
        match verified {
            Ok((checkpoint, _entry)) => {
                let received = receipt.received;
                let too_early = key.not_before.is_some_and(|t| received < t);
                let retired = key.not_after.is_some_and(|t| received >= t);
                if too_early || retired {
                    return Err(ReceiptRejection::KeyRetired {
                        key: key.verifier.label(),
                        received,
                        not_before: key.not_before,
                        not_after: key.not_after,
                    });
                }
                for (compared_to, ahead_of_local_clock) in [(record.time, false), (now, true)] {
                    let diff_ms = received.abs_diff(compared_to);
                    let late = ahead_of_local_clock && received <= compared_to;
                    if diff_ms > max_skew_ms && !late {
                        return Err(ReceiptRejection::Stale {
                            received,
                            compared_to,
                            ahead_of_local_clock,
                            diff_ms,
                            max_skew_ms,
                        });
                    }
                }
                return Ok(AcceptedReceipt {
                    receipt: receipt.clone(),
                    checkpoint,
                });
            }
            Err(ReceiptError::Checkpoint(
                e @ (NoteError::NotSignedByKey { .. }
                | NoteError::BadSignature { .. }
                | NoteError::OriginMismatch { .. }),
            )) => last_untrusted = Some(e),
            Err(e @ (ReceiptError::RecordMismatch { .. } | ReceiptError::NonceMismatch { .. })) => {
                return Err(ReceiptRejection::Mismatch(e))
            }
            Err(e) => return Err(ReceiptRejection::Invalid(e)),
        }
    }
    Err(ReceiptRejection::Untrusted(match last_untrusted {
        Some(e) => e.to_string(),
        None => format!("checkpoint names log {origin:?}, for which no key is pinned"),
    }))
}
