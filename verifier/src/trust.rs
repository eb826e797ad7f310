//! The pinned trust file of docs/protocol.md §11.1: the log's checkpoint key
//! and, optionally, independent witnesses (C2SP tlog-cosignature/v1 keys)
//! with the number of them that must cosign the pack's checkpoint.
//!
//! ```text
//! # tally trust file
//! version 1
//! log tally.local/log+1a2b3c4d+AX...
//! witness witness.example/w1+5e6f7a8b+BH...
//! quorum 1
//! ```
//!
//! The `version` directive came after the first files were written, so a
//! file without one is read as version 1.

use std::collections::BTreeSet;

/// The trust file version this build reads.
pub const TRUST_FILE_VERSION: u64 = 1;

use tally_schemas::note::{NoteVerifier, SignedNote};

pub use tally_schemas::cosignature::{cosignature_message, ALG_COSIGNATURE_V1};

/// A cosigner's key (C2SP tlog-cosignature/v1), listed as `witness` in the
/// trust file; the type and the signed message live in tally-schemas
/// (`cosignature`), shared with `tally cosigner`.
pub type WitnessKey = tally_schemas::cosignature::CosignatureVerifier;

/// Why a trust file or a witness key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrustError {
    /// A line that is not `log`, `witness` or `quorum` with one value.
    #[error("trust file line {line}: {reason}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// No `log` line, or more than one.
    #[error("trust file must have exactly one `log` line")]
    LogKey,
    /// A `version` directive naming a version this build does not read.
    #[error("unsupported trust file version {found} (this build reads version {supported})")]
    UnsupportedVersion {
        /// The version the file names.
        found: u64,
        /// The version this build reads.
        supported: u64,
    },
    /// A quorum larger than the number of distinct witness names.
    #[error("quorum {quorum} is more than the {witnesses} cosigners listed (`witness` lines)")]
    Quorum {
        /// The quorum.
        quorum: usize,
        /// Distinct witness names listed.
        witnesses: usize,
    },
}

/// Independent witnesses and how many must cosign.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WitnessPolicy {
    /// The witnesses' keys.
    pub witnesses: Vec<WitnessKey>,
    /// How many distinct witnesses must cosign.
    pub quorum: usize,
}

impl WitnessPolicy {
    /// Checks that at least `quorum` listed witnesses validly cosigned the
    /// signed checkpoint `note`.
    ///
    /// # Errors
    /// A message saying how many valid cosignatures were found, or which one
    /// is invalid.
    pub fn check(&self, note: &str) -> Result<usize, String> {
        if self.quorum == 0 {
            return Ok(0);
        }
        let parsed = SignedNote::parse(note).map_err(|e| e.to_string())?;
        // Each listed key's first line is checked (§7.4); a witness counts
        // once however many of its keys cosigned.
        let mut names = BTreeSet::new();
        for w in &self.witnesses {
            let Some(line) = parsed.signature_by(w.name(), w.id()) else {
                continue;
            };
            if w.verify_cosignature(parsed.text.as_bytes(), &line.signature)
                .is_err()
            {
                return Err(format!(
                    "the cosignature of cosigner {} does not verify",
                    w.name()
                ));
            }
            names.insert(w.name());
        }
        let count = names.len();
        if count < self.quorum {
            return Err(format!(
                "{count} of the {} trusted cosigners (`witness` lines) cosigned it, the trust file requires {}",
                self.witnesses.len(),
                self.quorum
            ));
        }
        Ok(count)
    }
}

/// A parsed trust file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustFile {
    /// The log's checkpoint key.
    pub log: NoteVerifier,
    /// The witnesses and quorum (quorum 0 when none are listed).
    pub witnesses: WitnessPolicy,
}

impl TrustFile {
    /// Parses a trust file (§11.1): lines end in LF or CRLF; words are
    /// separated by spaces and tabs; a line whose first word starts with `#`
    /// is a comment.
    ///
    /// # Errors
    /// [`TrustError`] naming the first line that is wrong.
    pub fn parse(text: &str) -> Result<Self, TrustError> {
        let mut log = None;
        let mut logs = 0;
        let mut witnesses: Vec<WitnessKey> = Vec::new();
        let mut quorum = None;
        let mut directives = 0usize;
        for (i, raw) in text.split('\n').enumerate() {
            let raw = raw.strip_suffix('\r').unwrap_or(raw);
            let bad = |reason: String| TrustError::Line {
                line: i + 1,
                reason,
            };
            let mut words = raw.split([' ', '\t']).filter(|w| !w.is_empty());
            let Some(kw) = words.next() else {
                continue;
            };
            if kw.starts_with('#') {
                continue;
            }
            directives += 1;
            let (Some(value), None) = (words.next(), words.next()) else {
                return Err(bad("expected a keyword and one value".into()));
            };
            match kw {
                "version" => {
                    if directives > 1 {
                        return Err(bad("`version` must be the first directive".into()));
                    }
                    let found = decimal(value)
                        .ok_or_else(|| bad("version must be a decimal number".into()))?;
                    if found != TRUST_FILE_VERSION {
                        return Err(TrustError::UnsupportedVersion {
                            found,
                            supported: TRUST_FILE_VERSION,
                        });
                    }
                }
                "log" => {
                    logs += 1;
                    log = Some(NoteVerifier::from_vkey(value).map_err(|e| bad(e.to_string()))?);
                }
                "witness" => {
                    let w = WitnessKey::from_vkey(value).map_err(|e| bad(e.to_string()))?;
                    if witnesses.contains(&w) {
                        return Err(bad(format!("witness {} is listed twice", w.vkey())));
                    }
                    witnesses.push(w);
                }
                "quorum" => {
                    if quorum.is_some() {
                        return Err(bad("a second quorum line".into()));
                    }
                    quorum = Some(
                        decimal(value)
                            .ok_or_else(|| bad("quorum must be a decimal number".into()))?,
                    );
                }
                other => {
                    return Err(bad(format!(
                        "unknown keyword {other:?} (version, log, witness, quorum)"
                    )))
                }
            }
        }
        let (Some(log), 1) = (log, logs) else {
            return Err(TrustError::LogKey);
        };
        // Cosignatures are counted per witness name (a witness may be listed
        // with more than one key), so the quorum is bounded by the names.
        let names = witnesses
            .iter()
            .map(WitnessKey::name)
            .collect::<BTreeSet<_>>()
            .len();
        let quorum = match quorum {
            None => names,
            Some(q) => usize::try_from(q).unwrap_or(usize::MAX),
        };
        if quorum > names {
            return Err(TrustError::Quorum {
                quorum,
                witnesses: names,
            });
        }
        Ok(Self {
            log,
            witnesses: WitnessPolicy { witnesses, quorum },
        })
    }
}

/// A decimal number of ASCII digits only (no sign), at most 2^53 − 1.
fn decimal(text: &str) -> Option<u64> {
    if text.is_empty() || text.len() > 16 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<u64>()
        .ok()
        .filter(|n| *n <= tally_schemas::limits::MAX_COUNTER)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_schemas::cosignature::CosignatureSigner;
    use tally_schemas::note::{Checkpoint, NoteSigner};
    use tally_schemas::tree::TreeSize;
    use tally_schemas::{Hash, SecretKey};

    #[test]
    fn witness_vkeys_whose_base64_holds_a_plus_round_trip() {
        let key = (0u8..=255)
            .map(|seed| SecretKey::from_seed(&[seed; 32]).public_key())
            .find(|k| {
                let w = WitnessKey::new("witness.example", *k).unwrap();
                w.vkey().rsplit('+').next().unwrap().len() < 40
            })
            .expect("some seed gives a '+' in the key's base64");
        let w = WitnessKey::new("witness.example", key).unwrap();
        assert_eq!(WitnessKey::from_vkey(&w.vkey()).unwrap().vkey(), w.vkey());
    }

    fn cosign(note: &str, name: &str, key: &SecretKey, ts: u64) -> String {
        let signer = CosignatureSigner::from_secret(name, key.clone()).unwrap();
        let body = note.split("\n\n").next().unwrap().to_owned() + "\n";
        format!("{note}{}", signer.cosign(body.as_bytes(), ts))
    }

    #[test]
    fn trust_file_and_cosignature_quorum() {
        let log =
            NoteSigner::from_secret("tally.local/log", SecretKey::from_seed(&[1; 32])).unwrap();
        let w1 = SecretKey::from_seed(&[2; 32]);
        let w2 = SecretKey::from_seed(&[3; 32]);
        let k1 = WitnessKey::new("w1.example", w1.public_key()).unwrap();
        let k2 = WitnessKey::new("w2.example", w2.public_key()).unwrap();
        let text = format!(
            "# pinned\nlog {}\nwitness {}\nwitness {}\nquorum 2\n",
            log.verifier().vkey(),
            k1.vkey(),
            k2.vkey()
        );
        let trust = TrustFile::parse(&text).unwrap();
        assert_eq!(&trust.log, log.verifier());
        let note = log
            .sign_checkpoint(&Checkpoint::new(
                "tally.local/log",
                TreeSize::new(3),
                Hash::sha256(b"r"),
            ))
            .unwrap();
        let one = cosign(&note, "w1.example", &w1, 1_800_000_000);
        let two = cosign(&one, "w2.example", &w2, 1_800_000_001);
        assert_eq!(trust.witnesses.check(&two), Ok(2));
        assert!(trust
            .witnesses
            .check(&one)
            .unwrap_err()
            .contains("1 of the 2"));
        // A cosignature by w2's name but w1's key does not verify.
        let forged = cosign(&one, "w2.example", &w1, 1_800_000_001);
        assert!(trust.witnesses.check(&forged).is_err());
        assert!(TrustFile::parse("witness x\n").is_err());
        assert_eq!(
            TrustFile::parse(&format!("log {}\nquorum 1\n", log.verifier().vkey())),
            Err(TrustError::Quorum {
                quorum: 1,
                witnesses: 0
            })
        );
        assert!(TrustFile::parse(&format!("log {}\nfoo bar\n", log.verifier().vkey())).is_err());
    }

    #[test]
    fn version_directive_is_optional_first_and_only_1() {
        let log =
            NoteSigner::from_secret("tally.local/log", SecretKey::from_seed(&[1; 32])).unwrap();
        let vkey = log.verifier().vkey();
        let w = WitnessKey::new("w1.example", SecretKey::from_seed(&[2; 32]).public_key()).unwrap();
        // Without a version line the file is version 1, as files written
        // before the directive existed are.
        let old = TrustFile::parse(&format!("log {vkey}\n")).unwrap();
        let new = TrustFile::parse(&format!("# c\n\nversion 1\nlog {vkey}\n")).unwrap();
        assert_eq!(old, new);
        assert_eq!(
            TrustFile::parse(&format!("version 2\nlog {vkey}\n")),
            Err(TrustError::UnsupportedVersion {
                found: 2,
                supported: 1
            })
        );
        for bad in [
            format!("log {vkey}\nversion 1\n"),
            format!("version 1\nversion 1\nlog {vkey}\n"),
            format!("version +1\nlog {vkey}\n"),
            format!("version one\nlog {vkey}\n"),
            format!("version 1 2\nlog {vkey}\n"),
        ] {
            assert!(
                matches!(TrustFile::parse(&bad), Err(TrustError::Line { .. })),
                "{bad:?}"
            );
        }
        // CRLF line ends, tabs between words, and indented comments are read.
        let crlf = format!(
            "\t# c\r\nversion\t1\r\n  log  {vkey}\r\nwitness {}\r\n",
            w.vkey()
        );
        let t = TrustFile::parse(&crlf).unwrap();
        assert_eq!(t.witnesses.quorum, 1);
        // A comment after a value is not a comment: three words.
        assert!(TrustFile::parse(&format!("log {vkey} # the log\n")).is_err());
        // The same witness key twice is refused; quorum counts names.
        assert!(matches!(
            TrustFile::parse(&format!("log {vkey}\nwitness {0}\nwitness {0}\n", w.vkey())),
            Err(TrustError::Line { line: 3, .. })
        ));
        let w_other_key =
            WitnessKey::new("w1.example", SecretKey::from_seed(&[3; 32]).public_key()).unwrap();
        let two_keys = format!(
            "log {vkey}\nwitness {}\nwitness {}\n",
            w.vkey(),
            w_other_key.vkey()
        );
        assert_eq!(TrustFile::parse(&two_keys).unwrap().witnesses.quorum, 1);
        assert_eq!(
            TrustFile::parse(&format!("{two_keys}quorum 2\n")),
            Err(TrustError::Quorum {
                quorum: 2,
                witnesses: 1
            })
        );
        assert!(TrustFile::parse(&format!("log {vkey}\nquorum +0\n")).is_err());
    }
}
