//! C2SP checkpoints in C2SP signed notes, docs/protocol.md §7.
//!
//! - c2sp.org/tlog-checkpoint: the body is `origin\nsize\nbase64(root)\n` plus
//!   optional extension lines.
//! - c2sp.org/signed-note: Ed25519 signatures (algorithm byte 0x01), key id
//!   `SHA-256(name ‖ "\n" ‖ 0x01 ‖ key)[:4]`, keys written as Go sumdb `vkey`
//!   and `skey` strings.
//!
//! Note parsing and framing come from Cloudflare's `signed_note`; the
//! signature check plugged into it is ours and strict (`verify_strict`).

use std::fmt;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use rand_core::CryptoRngCore;

use crate::hash::Hash;
use crate::keys::{PublicKey, SecretKey, Signature};
use crate::tree::TreeSize;

/// The signed-note algorithm byte for Ed25519.
const ALG_ED25519: u8 = 0x01;

/// Maximum size of a signed checkpoint note in bytes.
pub const MAX_CHECKPOINT_NOTE_BYTES: usize = 8192;

/// Why a key string, checkpoint or note was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoteError {
    /// A vkey or skey string that is not in the Go sumdb format.
    #[error("malformed {what}: {reason}")]
    KeyFormat {
        /// `vkey` or `skey`.
        what: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// A checkpoint body that is not C2SP tlog-checkpoint.
    #[error("malformed checkpoint: {reason}")]
    CheckpointFormat {
        /// What is wrong.
        reason: &'static str,
    },
    /// A note that is not C2SP signed-note.
    #[error("malformed signed note")]
    NoteFormat,
    /// The note carries no signature by the trusted key.
    #[error("checkpoint is not signed by the trusted key {key}")]
    NotSignedByKey {
        /// `name+keyid` of the trusted key.
        key: String,
    },
    /// The trusted key's signature is present but does not verify.
    #[error("checkpoint signature by {key} does not verify")]
    BadSignature {
        /// `name+keyid` of the trusted key.
        key: String,
    },
    /// The checkpoint names another log than the key.
    #[error("checkpoint origin {origin:?} is not the trusted key's name {key_name:?}")]
    OriginMismatch {
        /// Origin line of the checkpoint.
        origin: String,
        /// Name of the trusted key.
        key_name: String,
    },
}

/// Reports whether `name` is a valid signed-note key name: non-empty, no
/// Unicode spaces, no `+`.
#[must_use]
pub fn is_valid_key_name(name: &str) -> bool {
    signed_note::is_key_name_valid(name)
}

fn note_key_id(name: &str, public: &PublicKey) -> u32 {
    key_id_for_algorithm(ALG_ED25519, name, public)
}

/// The signed-note key id of an Ed25519 `public` key named `name` under
/// signature algorithm byte `algorithm` (0x01 for notes, 0x04 for C2SP
/// cosignature/v1): `SHA-256(name ‖ "\n" ‖ algorithm ‖ key)[:4]`.
#[must_use]
pub fn key_id_for_algorithm(algorithm: u8, name: &str, public: &PublicKey) -> u32 {
    let mut encoded = vec![algorithm];
    encoded.extend_from_slice(&public.to_bytes());
    signed_note::key_id(name, &encoded)
}

/// Splits a vkey `name+hex8(id)+base64(algorithm ‖ 32-byte key)` whose
/// algorithm byte must be `algorithm`, and checks the id against the key.
///
/// # Errors
/// [`NoteError::KeyFormat`] naming what is malformed.
pub fn parse_vkey_with_algorithm(
    vkey: &str,
    algorithm: u8,
) -> Result<(String, PublicKey), NoteError> {
    let (name, id, key) = split_key(vkey, "vkey", algorithm)?;
    let public = PublicKey::from_bytes(&key).map_err(|_| NoteError::KeyFormat {
        what: "vkey",
        reason: "key is not a valid Ed25519 point",
    })?;
    if key_id_for_algorithm(algorithm, &name, &public) != id {
        return Err(NoteError::KeyFormat {
            what: "vkey",
            reason: "key id does not match the key",
        });
    }
    Ok((name, public))
}

fn split_key(
    text: &str,
    what: &'static str,
    algorithm: u8,
) -> Result<(String, u32, [u8; 32]), NoteError> {
    let bad = |reason| NoteError::KeyFormat { what, reason };
    // Names never contain '+', base64 may: split from the left.
    let mut parts = text.splitn(3, '+');
    let (Some(name), Some(hexid), Some(b64)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad("expected name+keyid+key"));
    };
    if !is_valid_key_name(name) {
        return Err(bad("invalid key name"));
    }
    if hexid.len() != 8
        || !hexid
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return Err(bad("key id must be 8 lowercase hex digits"));
    }
    let id =
        u32::from_str_radix(hexid, 16).map_err(|_| bad("key id must be 8 lowercase hex digits"))?;
    let raw = BASE64.decode(b64).map_err(|_| bad("key is not base64"))?;
    if raw.len() != 33 {
        return Err(bad("key must be 33 bytes: algorithm byte and 32 key bytes"));
    }
    if raw[0] != algorithm {
        return Err(bad("unexpected signature algorithm byte"));
    }
    let mut key = [0u8; 32];
    key.copy_from_slice(&raw[1..]);
    Ok((name.to_owned(), id, key))
}

/// A trusted note verifier key: `name+keyid+base64(0x01 ‖ key)`.
#[derive(Clone, PartialEq, Eq)]
pub struct NoteVerifier {
    name: String,
    id: u32,
    key: PublicKey,
}

impl NoteVerifier {
    /// Builds the verifier for `public` under `name`.
    ///
    /// # Errors
    /// [`NoteError::KeyFormat`] for an invalid key name.
    pub fn new(name: &str, public: PublicKey) -> Result<Self, NoteError> {
        if !is_valid_key_name(name) {
            return Err(NoteError::KeyFormat {
                what: "vkey",
                reason: "invalid key name",
            });
        }
        Ok(Self {
            name: name.to_owned(),
            id: note_key_id(name, &public),
            key: public,
        })
    }

    /// Parses a vkey string.
    ///
    /// # Errors
    /// [`NoteError::KeyFormat`] when it is malformed or its key id does not
    /// match the key.
    pub fn from_vkey(vkey: &str) -> Result<Self, NoteError> {
        let (name, public) = parse_vkey_with_algorithm(vkey, ALG_ED25519)?;
        Self::new(&name, public)
    }

    /// The vkey string.
    #[must_use]
    pub fn vkey(&self) -> String {
        let mut encoded = vec![ALG_ED25519];
        encoded.extend_from_slice(&self.key.to_bytes());
        format!("{}+{:08x}+{}", self.name, self.id, BASE64.encode(encoded))
    }

    /// The key name (for a log, its origin).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The 32-bit signed-note key id.
    #[must_use]
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The public key.
    #[must_use]
    pub fn public_key(&self) -> &PublicKey {
        &self.key
    }

    fn label(&self) -> String {
        format!("{}+{:08x}", self.name, self.id)
    }
}

impl fmt::Debug for NoteVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NoteVerifier({})", self.vkey())
    }
}

impl signed_note::Verifier for NoteVerifier {
    fn name(&self) -> &str {
        &self.name
    }
    fn key_id(&self) -> u32 {
        self.id
    }
    fn verify(&self, msg: &[u8], sig: &[u8]) -> bool {
        let Ok(bytes) = <[u8; 64]>::try_from(sig) else {
            return false;
        };
        self.key
            .verify_raw(msg, &Signature::from_bytes(bytes))
            .is_ok()
    }
}

/// A note signing key: `PRIVATE+KEY+name+keyid+base64(0x01 ‖ seed)`.
#[derive(Clone)]
pub struct NoteSigner {
    verifier: NoteVerifier,
    key: SecretKey,
}

impl NoteSigner {
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
            verifier: NoteVerifier::new(name, key.public_key())?,
            key,
        })
    }

    /// Parses an skey string.
    ///
    /// # Errors
    /// [`NoteError::KeyFormat`] when it is malformed or its key id does not
    /// match the key.
    pub fn from_skey(skey: &str) -> Result<Self, NoteError> {
        let rest = skey
            .strip_prefix("PRIVATE+KEY+")
            .ok_or(NoteError::KeyFormat {
                what: "skey",
                reason: "must start with PRIVATE+KEY+",
            })?;
        let (name, id, seed) = split_key(rest, "skey", ALG_ED25519)?;
        let signer = Self::from_secret(&name, SecretKey::from_seed(&seed))?;
        if signer.verifier.id != id {
            return Err(NoteError::KeyFormat {
                what: "skey",
                reason: "key id does not match the key",
            });
        }
        Ok(signer)
    }

    /// The skey string. It is the private key: store it with mode 0600.
    #[must_use]
    pub fn skey(&self) -> String {
        let mut encoded = vec![ALG_ED25519];
        encoded.extend_from_slice(&self.key.seed());
        format!(
            "PRIVATE+KEY+{}+{:08x}+{}",
            self.verifier.name,
            self.verifier.id,
            BASE64.encode(encoded)
        )
    }

    /// The matching verifier.
    #[must_use]
    pub fn verifier(&self) -> &NoteVerifier {
        &self.verifier
    }

    /// Signs `text` (which must end in a newline) as a one-signature note.
    ///
    /// # Errors
    /// [`NoteError::NoteFormat`] when `text` is not valid note text.
    pub fn sign_note(&self, text: &str) -> Result<String, NoteError> {
        let mut note =
            signed_note::Note::new(text.as_bytes(), &[]).map_err(|_| NoteError::NoteFormat)?;
        note.add_sigs(&[self]).map_err(|_| NoteError::NoteFormat)?;
        String::from_utf8(note.to_bytes()).map_err(|_| NoteError::NoteFormat)
    }

    /// Signs a checkpoint.
    ///
    /// # Errors
    /// [`NoteError::OriginMismatch`] when the checkpoint's origin is not this
    /// key's name.
    pub fn sign_checkpoint(&self, checkpoint: &Checkpoint) -> Result<String, NoteError> {
        if checkpoint.origin != self.verifier.name {
            return Err(NoteError::OriginMismatch {
                origin: checkpoint.origin.clone(),
                key_name: self.verifier.name.clone(),
            });
        }
        self.sign_note(&checkpoint.to_body())
    }
}

impl fmt::Debug for NoteSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NoteSigner({})", self.verifier.vkey())
    }
}

impl signed_note::Signer for NoteSigner {
    fn name(&self) -> &str {
        &self.verifier.name
    }
    fn key_id(&self) -> u32 {
        self.verifier.id
    }
    fn sign(&self, msg: &[u8]) -> Result<Vec<u8>, signature::Error> {
        Ok(self.key.sign_raw(msg).as_bytes().to_vec())
    }
}

/// A C2SP tlog-checkpoint body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The log's origin line (also its key name).
    pub origin: String,
    /// Tree size.
    pub size: TreeSize,
    /// Root hash of the tree of that size.
    pub root: Hash,
    /// Extension lines, in order, without their newlines.
    pub extensions: Vec<String>,
}

impl Checkpoint {
    /// A checkpoint without extension lines.
    #[must_use]
    pub fn new(origin: &str, size: TreeSize, root: Hash) -> Self {
        Self {
            origin: origin.to_owned(),
            size,
            root,
            extensions: Vec::new(),
        }
    }

    /// The body text, every line ending in a newline.
    #[must_use]
    pub fn to_body(&self) -> String {
        let mut s = format!(
            "{}\n{}\n{}\n",
            self.origin,
            self.size.get(),
            BASE64.encode(self.root.as_bytes())
        );
        for e in &self.extensions {
            s.push_str(e);
            s.push('\n');
        }
        s
    }

    /// Parses a body.
    ///
    /// # Errors
    /// [`NoteError::CheckpointFormat`] naming the first rule broken.
    pub fn from_body(text: &str) -> Result<Self, NoteError> {
        let bad = |reason| NoteError::CheckpointFormat { reason };
        let body = text
            .strip_suffix('\n')
            .ok_or(bad("must end with a newline"))?;
        let mut lines = body.split('\n');
        let origin = lines
            .next()
            .filter(|o| !o.is_empty())
            .ok_or(bad("empty origin"))?;
        let size_text = lines.next().ok_or(bad("missing size line"))?;
        let canonical_decimal = !size_text.is_empty()
            && size_text.bytes().all(|b| b.is_ascii_digit())
            && (size_text == "0" || !size_text.starts_with('0'));
        if !canonical_decimal {
            return Err(bad("size must be a decimal number without leading zeros"));
        }
        // A size above 2^53 - 1 could not appear exactly anywhere else on
        // the wire (JSON integers are bounded the same way).
        let size = size_text
            .parse::<u64>()
            .ok()
            .filter(|n| *n <= crate::limits::MAX_COUNTER)
            .ok_or(bad("size out of range (above 2^53 - 1)"))?;
        let root_text = lines.next().ok_or(bad("missing root hash line"))?;
        let root = BASE64
            .decode(root_text)
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .filter(|b| BASE64.encode(b) == root_text)
            .ok_or(bad("root hash must be standard base64 of 32 bytes"))?;
        let extensions: Vec<String> = lines.map(str::to_owned).collect();
        if extensions.iter().any(String::is_empty) {
            return Err(bad("extension lines must not be empty"));
        }
        Ok(Self {
            origin: origin.to_owned(),
            size: TreeSize::new(size),
            root: Hash::from_bytes(root),
            extensions,
        })
    }
}

/// Verifies a signed checkpoint note with `key` and returns the checkpoint.
/// Signatures by other keys (witness cosignatures, say) are ignored here.
///
/// # Errors
/// [`NoteError`] when the note is malformed, not signed by `key`, badly
/// signed, or names another origin.
pub fn open_checkpoint(note: &str, key: &NoteVerifier) -> Result<Checkpoint, NoteError> {
    if note.len() > MAX_CHECKPOINT_NOTE_BYTES {
        return Err(NoteError::NoteFormat);
    }
    let parsed =
        signed_note::Note::from_bytes(note.as_bytes()).map_err(|_| NoteError::NoteFormat)?;
    let trusted = signed_note::VerifierList::new(vec![Box::new(key.clone())]);
    match parsed.verify(&trusted) {
        Ok(_) => {}
        Err(signed_note::NoteError::InvalidSignature { .. }) => {
            return Err(NoteError::BadSignature { key: key.label() })
        }
        Err(signed_note::NoteError::UnverifiedNote) => {
            return Err(NoteError::NotSignedByKey { key: key.label() })
        }
        Err(_) => return Err(NoteError::NoteFormat),
    }
    let text = std::str::from_utf8(parsed.text()).map_err(|_| NoteError::NoteFormat)?;
    let checkpoint = Checkpoint::from_body(text)?;
    if checkpoint.origin != key.name {
        return Err(NoteError::OriginMismatch {
            origin: checkpoint.origin,
            key_name: key.name.clone(),
        });
    }
    Ok(checkpoint)
}

/// The checkpoint body of a note, without checking any signature. For
/// display and routing only; never trust what it returns.
///
/// # Errors
/// [`NoteError`] when the note or body is malformed.
pub fn peek_checkpoint(note: &str) -> Result<Checkpoint, NoteError> {
    let parsed =
        signed_note::Note::from_bytes(note.as_bytes()).map_err(|_| NoteError::NoteFormat)?;
    Checkpoint::from_body(std::str::from_utf8(parsed.text()).map_err(|_| NoteError::NoteFormat)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_open_and_refuse_other_keys() {
        let signer =
            NoteSigner::from_secret("log.example/a", SecretKey::from_seed(&[3; 32])).unwrap();
        let cp = Checkpoint::new("log.example/a", TreeSize::new(5), Hash::sha256(b"x"));
        let note = signer.sign_checkpoint(&cp).unwrap();
        assert_eq!(open_checkpoint(&note, signer.verifier()), Ok(cp.clone()));
        let other =
            NoteSigner::from_secret("log.example/a", SecretKey::from_seed(&[4; 32])).unwrap();
        assert!(matches!(
            open_checkpoint(&note, other.verifier()),
            Err(NoteError::NotSignedByKey { .. })
        ));
        assert_eq!(
            NoteSigner::from_skey(&signer.skey()).unwrap().skey(),
            signer.skey()
        );
        assert_eq!(
            NoteVerifier::from_vkey(&signer.verifier().vkey()).unwrap(),
            *signer.verifier()
        );
        let forged = note.replace("\n5\n", "\n6\n");
        assert!(matches!(
            open_checkpoint(&forged, signer.verifier()),
            Err(NoteError::BadSignature { .. })
        ));
    }

    #[test]
    fn checkpoint_body_rules() {
        let root = BASE64.encode([0u8; 32]);
        assert!(Checkpoint::from_body(&format!("o\n01\n{root}\n")).is_err());
        assert!(Checkpoint::from_body(&format!("o\n1\n{root}")).is_err());
        assert!(Checkpoint::from_body(&format!("o\n1\n{root}\n\n")).is_err());
        assert!(Checkpoint::from_body(&format!("\n1\n{root}\n")).is_err());
        let max = Checkpoint::from_body(&format!("o\n9007199254740991\n{root}\n")).unwrap();
        assert_eq!(max.size.get(), crate::limits::MAX_COUNTER);
        for too_big in [
            "9007199254740992",
            "18446744073709551615",
            "18446744073709551616",
        ] {
            assert_eq!(
                Checkpoint::from_body(&format!("o\n{too_big}\n{root}\n")),
                Err(NoteError::CheckpointFormat {
                    reason: "size out of range (above 2^53 - 1)"
                }),
                "{too_big}"
            );
        }
        let cp = Checkpoint::from_body(&format!("o\n1\n{root}\next one\n")).unwrap();
        assert_eq!(cp.extensions, vec!["ext one".to_owned()]);
        assert_eq!(Checkpoint::from_body(&cp.to_body()).unwrap(), cp);
    }
}
