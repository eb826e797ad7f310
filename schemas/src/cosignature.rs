//! C2SP cosignatures and the add-checkpoint request of the C2SP witness
//! protocol, docs/protocol.md §14.
//!
//! - c2sp.org/tlog-cosignature, the Ed25519 type (`cosignature/v1`): key id
//!   `SHA-256(name ‖ "\n" ‖ 0x04 ‖ key)[:4]`, a signature line carrying
//!   `key id ‖ timestamp (u64, big-endian) ‖ Ed25519 signature`, and the
//!   signed message built by [`cosignature_message`], the one place that
//!   builds it: the cosigner signs it and the verifier's trust file
//!   (§11.1) and the monitor check it.
//! - c2sp.org/tlog-witness `add-checkpoint`: the request body
//!   ([`AddCheckpointRequest`]) a log sends to a cosigner, and the answer
//!   (signature lines) it gets back.
//!
//! C2SP calls a party that cosigns a "witness"; in tally the witness is the
//! server that admits records (`tally serve`), so the party that cosigns is
//! called a *cosigner* throughout.

use std::fmt;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use rand_core::CryptoRngCore;

use crate::hash::Hash;
use crate::keys::{PublicKey, SecretKey, Signature};
use crate::note::{
    encode_vkey, is_valid_key_name, key_id_for_algorithm, parse_vkey_with_algorithm, NoteError,
    MAX_CHECKPOINT_NOTE_BYTES,
};
use crate::tree::TreeSize;

/// The signed-note signature type byte of a C2SP Ed25519 cosignature
/// (`cosignature/v1`).
pub const ALG_COSIGNATURE_V1: u8 = 0x04;

/// Most consistency proof lines in an add-checkpoint request (the client
/// "MUST NOT send more than 63").
pub const MAX_ADD_CHECKPOINT_PROOF_LINES: usize = 63;

/// Largest add-checkpoint request body: the old size line, 63 proof lines
/// of 45 bytes, the empty line and a note of at most
/// [`MAX_CHECKPOINT_NOTE_BYTES`], rounded up.
pub const MAX_ADD_CHECKPOINT_BODY_BYTES: usize = 16_384;

/// The message a `cosignature/v1` signature signs:
/// `"cosignature/v1\ntime " ‖ decimal(timestamp) ‖ "\n" ‖ checkpoint body`,
/// where the body is the whole note text (with its extension lines, ending
/// in `\n`, without the signature lines).
#[must_use]
pub fn cosignature_message(timestamp: u64, checkpoint_body: &[u8]) -> Vec<u8> {
    let mut m = format!("cosignature/v1\ntime {timestamp}\n").into_bytes();
    m.extend_from_slice(checkpoint_body);
    m
}

/// A cosigner's public key (C2SP tlog-cosignature, Ed25519): the key that
/// checks its cosignature lines. In a trust file it is a `witness` line
/// (§11.1).
#[derive(Clone, PartialEq, Eq)]
pub struct CosignatureVerifier {
    name: String,
    id: u32,
    key: PublicKey,
}

impl fmt::Debug for CosignatureVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CosignatureVerifier({}+{:08x})", self.name, self.id)
    }
}

impl CosignatureVerifier {
    /// A cosigner key from its name and public key.
    ///
    /// # Errors
    /// [`NoteError::KeyFormat`] when the name is not a valid key name.
    pub fn new(name: &str, key: PublicKey) -> Result<Self, NoteError> {
        if !is_valid_key_name(name) {
            return Err(NoteError::KeyFormat {
                what: "vkey",
                reason: "invalid key name",
            });
        }
        Ok(Self {
            name: name.to_owned(),
            id: key_id_for_algorithm(ALG_COSIGNATURE_V1, name, &key),
            key,
        })
    }

    /// Parses `name+hex8(id)+base64(0x04 ‖ key)`.
    ///
    /// # Errors
    /// [`NoteError::KeyFormat`] naming what is malformed.
    pub fn from_vkey(vkey: &str) -> Result<Self, NoteError> {
        let (name, key) = parse_vkey_with_algorithm(vkey, ALG_COSIGNATURE_V1)?;
        Self::new(&name, key)
    }

    /// The vkey string.
    #[must_use]
    pub fn vkey(&self) -> String {
        encode_vkey(ALG_COSIGNATURE_V1, &self.name, &self.key)
    }

    /// The cosigner's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The note key id.
    #[must_use]
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The public key.
    #[must_use]
    pub fn public_key(&self) -> &PublicKey {
        &self.key
    }

    /// The timestamp of a valid cosignature by this key of `checkpoint_body`,
    /// given the signature bytes after the key id (`timestamp ‖ signature`).
    ///
    /// # Errors
    /// [`NoteError::BadSignature`] when the bytes are not 72 long or the
    /// signature does not verify strictly.
    pub fn verify_cosignature(&self, checkpoint_body: &[u8], sig: &[u8]) -> Result<u64, NoteError> {
        let bad = || NoteError::BadSignature {
            key: format!("{}+{:08x}", self.name, self.id),
        };
        let (ts, s) = split_timestamped(sig).ok_or_else(bad)?;
        self.key
            .verify_raw(&cosignature_message(ts, checkpoint_body), &s)
            .map_err(|_| bad())?;
        Ok(ts)
    }
}

fn split_timestamped(sig: &[u8]) -> Option<(u64, Signature)> {
    let bytes: &[u8; 72] = sig.try_into().ok()?;
    let mut ts = [0u8; 8];
    ts.copy_from_slice(&bytes[..8]);
    let mut s = [0u8; 64];
    s.copy_from_slice(&bytes[8..]);
    Some((u64::from_be_bytes(ts), Signature::from_bytes(s)))
}

impl signed_note::Verifier for CosignatureVerifier {
    fn name(&self) -> &str {
        &self.name
    }
    fn key_id(&self) -> u32 {
        self.id
    }
    fn verify(&self, msg: &[u8], sig: &[u8]) -> bool {
        self.verify_cosignature(msg, sig).is_ok()
    }
}

/// A cosigner's private key. Its text form mirrors the Go sumdb `skey`:
/// `PRIVATE+KEY+name+hex8(id)+base64(0x04 ‖ 32-byte seed)`.
#[derive(Clone)]
pub struct CosignatureSigner {
    verifier: CosignatureVerifier,
    key: SecretKey,
}

impl fmt::Debug for CosignatureSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CosignatureSigner({})", self.verifier.vkey())
    }
}

impl CosignatureSigner {
    /// A fresh key named `name`.
    ///
    /// # Errors
    /// [`NoteError::KeyFormat`] for an invalid key name.
    pub fn generate<R: CryptoRngCore + ?Sized>(name: &str, rng: &mut R) -> Result<Self, NoteError> {
        Self::from_secret(name, SecretKey::generate(rng))
    }

    /// Wraps an existing key.
    ///
    /// # Errors
    /// [`NoteError::KeyFormat`] for an invalid key name.
    pub fn from_secret(name: &str, key: SecretKey) -> Result<Self, NoteError> {
        Ok(Self {
            verifier: CosignatureVerifier::new(name, key.public_key())?,
            key,
        })
    }

    /// Parses the private key text.
    ///
    /// # Errors
    /// [`NoteError::KeyFormat`] when it is malformed, is not a 0x04 key, or
    /// its key id does not match the key.
    pub fn from_skey(skey: &str) -> Result<Self, NoteError> {
        let bad = |reason| NoteError::KeyFormat {
            what: "skey",
            reason,
        };
        let rest = skey
            .strip_prefix("PRIVATE+KEY+")
            .ok_or(bad("must start with PRIVATE+KEY+"))?;
        let mut parts = rest.splitn(3, '+');
        let (Some(name), Some(hexid), Some(b64)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(bad("expected PRIVATE+KEY+name+keyid+key"));
        };
        let raw = BASE64.decode(b64).map_err(|_| bad("key is not base64"))?;
        if raw.len() != 33 || raw[0] != ALG_COSIGNATURE_V1 {
            return Err(bad("key must be 0x04 and a 32-byte seed"));
        }
        let mut seed = [0u8; 32];
        seed.copy_from_slice(&raw[1..]);
        let signer = Self::from_secret(name, SecretKey::from_seed(&seed))
            .map_err(|_| bad("invalid key name"))?;
        if hexid != format!("{:08x}", signer.verifier.id) {
            return Err(bad("key id does not match the key"));
        }
        Ok(signer)
    }

    /// The private key text. Store it with mode 0600.
    #[must_use]
    pub fn skey(&self) -> String {
        let mut raw = vec![ALG_COSIGNATURE_V1];
        raw.extend_from_slice(&self.key.seed());
        format!(
            "PRIVATE+KEY+{}+{:08x}+{}",
            self.verifier.name,
            self.verifier.id,
            BASE64.encode(raw)
        )
    }

    /// The matching public key.
    #[must_use]
    pub fn verifier(&self) -> &CosignatureVerifier {
        &self.verifier
    }

    /// The cosignature line over `checkpoint_body` at `timestamp` (POSIX
    /// seconds): `— <name> base64(key id ‖ timestamp ‖ signature)\n`.
    #[must_use]
    pub fn cosign(&self, checkpoint_body: &[u8], timestamp: u64) -> String {
        let sig = self
            .key
            .sign_raw(&cosignature_message(timestamp, checkpoint_body));
        let mut raw = Vec::with_capacity(76);
        raw.extend_from_slice(&self.verifier.id.to_be_bytes());
        raw.extend_from_slice(&timestamp.to_be_bytes());
        raw.extend_from_slice(sig.as_bytes());
        format!("\u{2014} {} {}\n", self.verifier.name, BASE64.encode(raw))
    }
}

/// Why an add-checkpoint request body was refused before its checkpoint
/// was looked at (the answer is `400 Bad Request`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed add-checkpoint request: {reason}")]
pub struct AddCheckpointFormatError {
    /// The first rule the body breaks.
    pub reason: &'static str,
}

/// The body of `POST <prefix>/add-checkpoint` (c2sp.org/tlog-witness):
///
/// ```text
/// old <size>\n
/// <base64 hash>\n        (zero to 63 consistency proof lines)
/// \n
/// <signed checkpoint note>
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddCheckpointRequest {
    /// The size of the last checkpoint the client believes the cosigner
    /// cosigned (0 for none).
    pub old_size: TreeSize,
    /// The RFC 9162 consistency proof from `old_size` to the checkpoint.
    pub proof: Vec<Hash>,
    /// The signed checkpoint note, as the log signed it.
    pub note: String,
}

impl AddCheckpointRequest {
    /// The request body.
    #[must_use]
    pub fn to_body(&self) -> String {
        let mut s = format!("old {}\n", self.old_size.get());
        for h in &self.proof {
            s.push_str(&BASE64.encode(h.as_bytes()));
            s.push('\n');
        }
        s.push('\n');
        s.push_str(&self.note);
        s
    }

    /// Parses a request body. The note is split off but not parsed here:
    /// the cosigner parses it when it verifies the log's signature.
    ///
    /// # Errors
    /// [`AddCheckpointFormatError`] naming the first rule broken: body too
    /// large, not UTF-8, no empty line, a malformed old size line (not
    /// `old`, a space and a decimal without leading zeros of at most
    /// 2^53 − 1), more than 63 proof lines, a proof line that is not the
    /// standard base64 of 32 bytes, an empty or oversized note.
    pub fn parse(body: &[u8]) -> Result<Self, AddCheckpointFormatError> {
        let bad = |reason| AddCheckpointFormatError { reason };
        if body.len() > MAX_ADD_CHECKPOINT_BODY_BYTES {
            return Err(bad("body too large"));
        }
        let text = std::str::from_utf8(body).map_err(|_| bad("body is not UTF-8"))?;
        // Header lines never are empty, so the first empty line ends them.
        let (head, note) = text
            .split_once("\n\n")
            .ok_or(bad("no empty line between the proof and the checkpoint"))?;
        let mut lines = head.split('\n');
        let old = lines
            .next()
            .and_then(|l| l.strip_prefix("old "))
            .ok_or(bad("the first line must be `old <size>`"))?;
        let old_size = canonical_decimal(old).ok_or(bad(
            "the old size must be a decimal number without leading zeros, at most 2^53 - 1",
        ))?;
        let mut proof = Vec::new();
        for line in lines {
            if proof.len() == MAX_ADD_CHECKPOINT_PROOF_LINES {
                return Err(bad("more than 63 consistency proof lines"));
            }
            let hash = BASE64
                .decode(line)
                .ok()
                .and_then(|b| <[u8; 32]>::try_from(b).ok())
                .filter(|b| BASE64.encode(b) == line)
                .ok_or(bad(
                    "a consistency proof line must be the standard base64 of 32 bytes",
                ))?;
            proof.push(Hash::from_bytes(hash));
        }
        if note.is_empty() {
            return Err(bad("no checkpoint after the empty line"));
        }
        if note.len() > MAX_CHECKPOINT_NOTE_BYTES {
            return Err(bad("checkpoint note larger than 8192 bytes"));
        }
        Ok(Self {
            old_size: TreeSize::new(old_size),
            proof,
            note: note.to_owned(),
        })
    }
}

/// A decimal number without sign or leading zeros (`0` itself allowed), at
/// most 2^53 − 1.
fn canonical_decimal(text: &str) -> Option<u64> {
    let digits = !text.is_empty()
        && text.len() <= 16
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    if !digits {
        return None;
    }
    text.parse::<u64>()
        .ok()
        .filter(|n| *n <= crate::limits::MAX_COUNTER)
}

/// Parses the `text/x.tlog.size` body of a `409 Conflict` answer: the
/// cosigner's size in decimal and a newline.
///
/// # Errors
/// A message when the body is not exactly that.
pub fn parse_conflict_size(body: &[u8]) -> Result<TreeSize, &'static str> {
    std::str::from_utf8(body)
        .ok()
        .and_then(|t| t.strip_suffix('\n'))
        .and_then(canonical_decimal)
        .map(TreeSize::new)
        .ok_or("a 409 answer must be a decimal size and a newline")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::note::{Checkpoint, NoteSigner};

    fn body() -> String {
        Checkpoint::new("log.example/a", TreeSize::new(7), Hash::sha256(b"r")).to_body()
    }

    #[test]
    fn cosign_then_verify_and_refuse_changes() {
        let signer =
            CosignatureSigner::from_secret("cosigner.example/c1", SecretKey::from_seed(&[5; 32]))
                .unwrap();
        let line = signer.cosign(body().as_bytes(), 1_800_000_000);
        let sig = signed_note::Signature::from_bytes(line.trim_end().as_bytes()).unwrap();
        assert_eq!(sig.name(), "cosigner.example/c1");
        assert_eq!(sig.id(), signer.verifier().id());
        assert_eq!(
            signer
                .verifier()
                .verify_cosignature(body().as_bytes(), sig.signature()),
            Ok(1_800_000_000)
        );
        let other = body().replace("\n7\n", "\n8\n");
        assert!(signer
            .verifier()
            .verify_cosignature(other.as_bytes(), sig.signature())
            .is_err());
        let mut later = sig.signature().to_vec();
        later[7] ^= 1;
        assert!(signer
            .verifier()
            .verify_cosignature(body().as_bytes(), &later)
            .is_err());
        assert!(signer
            .verifier()
            .verify_cosignature(body().as_bytes(), &later[..71])
            .is_err());
    }

    #[test]
    fn keys_round_trip_and_ids_differ_from_note_keys() {
        let signer =
            CosignatureSigner::from_secret("cosigner.example/c1", SecretKey::from_seed(&[6; 32]))
                .unwrap();
        let again = CosignatureSigner::from_skey(&signer.skey()).unwrap();
        assert_eq!(again.verifier(), signer.verifier());
        assert_eq!(
            CosignatureVerifier::from_vkey(&signer.verifier().vkey()).unwrap(),
            *signer.verifier()
        );
        let note_key =
            NoteSigner::from_secret("cosigner.example/c1", SecretKey::from_seed(&[6; 32])).unwrap();
        assert_ne!(note_key.verifier().id(), signer.verifier().id());
        // A note (0x01) skey is not a cosigner key, and the other way round.
        assert!(CosignatureSigner::from_skey(&note_key.skey()).is_err());
        assert!(NoteSigner::from_skey(&signer.skey()).is_err());
        let forged_id = signer
            .skey()
            .replace(&format!("{:08x}", signer.verifier().id()), "00000000");
        assert!(CosignatureSigner::from_skey(&forged_id).is_err());
    }

    #[test]
    fn add_checkpoint_request_round_trips_and_refuses_malformed_bodies() {
        let note = NoteSigner::from_secret("log.example/a", SecretKey::from_seed(&[1; 32]))
            .unwrap()
            .sign_note(&body())
            .unwrap();
        let req = AddCheckpointRequest {
            old_size: TreeSize::new(3),
            proof: vec![Hash::sha256(b"a"), Hash::sha256(b"b")],
            note: note.clone(),
        };
        assert_eq!(
            AddCheckpointRequest::parse(req.to_body().as_bytes()),
            Ok(req)
        );
        let empty = AddCheckpointRequest::parse(format!("old 0\n\n{note}").as_bytes()).unwrap();
        assert!(empty.proof.is_empty());
        let h = BASE64.encode([0u8; 32]);
        let too_many = format!("old 1\n{}\n{note}", format!("{h}\n").repeat(64));
        for bad in [
            format!("old 01\n\n{note}"),
            format!("old -1\n\n{note}"),
            format!("old 1 \n\n{note}"),
            format!("Old 1\n\n{note}"),
            format!("old 9007199254740992\n\n{note}"),
            format!("old 1\n{}\n\n{note}", &h[..43]),
            format!("old 1\n{h}x\n\n{note}"),
            format!("old 1\n{h}\n{note}"),
            "old 1\n\n".to_owned(),
            too_many,
        ] {
            assert!(
                AddCheckpointRequest::parse(bad.as_bytes()).is_err(),
                "{bad:?}"
            );
        }
        assert!(AddCheckpointRequest::parse(b"old 1\n\n\xff\n").is_err());
        let sixty_three = format!("old 1\n{}\n{note}", format!("{h}\n").repeat(63));
        assert_eq!(
            AddCheckpointRequest::parse(sixty_three.as_bytes())
                .unwrap()
                .proof
                .len(),
            63
        );
    }

    #[test]
    fn conflict_size_bodies() {
        assert_eq!(parse_conflict_size(b"12\n"), Ok(TreeSize::new(12)));
        assert_eq!(parse_conflict_size(b"0\n"), Ok(TreeSize::new(0)));
        for bad in [&b"12"[..], b"012\n", b"12\n\n", b" 12\n", b""] {
            assert!(parse_conflict_size(bad).is_err());
        }
    }
}
