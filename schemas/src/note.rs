//! C2SP checkpoints in C2SP signed notes, docs/protocol.md §7.4.
//!
//! - c2sp.org/tlog-checkpoint: the body is `origin\nsize\nbase64(root)\n` plus
//!   optional extension lines.
//! - c2sp.org/signed-note: Ed25519 signatures (algorithm byte 0x01), key id
//!   `SHA-256(name ‖ "\n" ‖ 0x01 ‖ key)[:4]`, keys written as Go sumdb `vkey`
//!   and `skey` strings; C2SP tlog-cosignature/v1 keys (0x04) and the
//!   message a cosignature signs.
//!
//! Notes are read by [`SignedNote::parse`], which implements the grammar
//! §7.4 writes out: the one Go's golang.org/x/mod/sumdb/note accepts, plus
//! tally's size bound. It is ours rather than the `signed_note` crate's
//! because that crate refuses a signature line whose base64 has non-zero
//! unused bits, which Go (the reference) accepts: a third party's
//! cosignature line written that way would otherwise make tally refuse a
//! note every other checker reads. Signing still goes through `signed_note`.
//! Every signature check is ours and strict (`verify_strict`).

use std::fmt;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use rand_core::CryptoRngCore;

use crate::hash::Hash;
use crate::keys::{PublicKey, SecretKey, Signature};
use crate::tree::TreeSize;

/// The signed-note algorithm byte for Ed25519.
pub const ALG_ED25519: u8 = 0x01;

/// Maximum size of a signed checkpoint note in bytes.
pub const MAX_CHECKPOINT_NOTE_BYTES: usize = 8192;

/// Signature lines a note may carry at most: the limit of Go's
/// golang.org/x/mod/sumdb/note (C2SP signed-note asks for at least 16).
pub const MAX_NOTE_SIGNATURES: usize = 100;

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
    /// A note that breaks the signed-note grammar of §7.4.
    #[error("malformed signed note: {reason}")]
    NoteFormat {
        /// The rule broken.
        reason: &'static str,
    },
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

/// The vkey string `name+hex8(key id)+base64(algorithm ‖ 32-byte key)` of an
/// Ed25519 `public` key under signature algorithm byte `algorithm` (§4.4,
/// and §11.1 for cosignature/v1 keys): the one place it is written.
#[must_use]
pub fn encode_vkey(algorithm: u8, name: &str, public: &PublicKey) -> String {
    let mut encoded = vec![algorithm];
    encoded.extend_from_slice(&public.to_bytes());
    format!(
        "{name}+{:08x}+{}",
        key_id_for_algorithm(algorithm, name, public),
        BASE64.encode(encoded)
    )
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
        encode_vkey(ALG_ED25519, &self.name, &self.key)
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

    /// Whether `signature` (the bytes of a signature line after the key id)
    /// is a 64-byte Ed25519 signature by this key that verifies strictly
    /// (§4.3) over the note text `text`.
    #[must_use]
    pub fn verifies(&self, text: &[u8], signature: &[u8]) -> bool {
        <[u8; 64]>::try_from(signature).is_ok_and(|sig| {
            self.key
                .verify_raw(text, &Signature::from_bytes(sig))
                .is_ok()
        })
    }

    /// `name+hex8(key id)`: the key as people, and Go's note package, name
    /// it (the vkey without its key bytes).
    #[must_use]
    pub fn label(&self) -> String {
        format!("{}+{:08x}", self.name, self.id)
    }
}

/// On the wire a log key is its vkey string (§4.4, §4.5).
impl serde::Serialize for NoteVerifier {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.vkey())
    }
}

impl<'de> serde::Deserialize<'de> for NoteVerifier {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::from_vkey(&text).map_err(|e| serde::de::Error::custom(format!("vkey: {e}")))
    }
}

impl fmt::Debug for NoteVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NoteVerifier({})", self.vkey())
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
        let bad = |_| NoteError::NoteFormat {
            reason: "the text is not note text",
        };
        let mut note = signed_note::Note::new(text.as_bytes(), &[]).map_err(bad)?;
        note.add_sigs(&[self]).map_err(bad)?;
        String::from_utf8(note.to_bytes()).map_err(|_| NoteError::NoteFormat {
            reason: "not UTF-8",
        })
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

/// One signature line of a signed note: `— <name> base64(key id ‖ signature)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoteSignature {
    /// The key name.
    pub name: String,
    /// The 4-byte key id, big-endian.
    pub key_id: u32,
    /// The bytes after the key id (at least one).
    pub signature: Vec<u8>,
}

impl NoteSignature {
    /// The signature line, `— <name> base64(key id ‖ signature)\n`, in
    /// canonical base64.
    #[must_use]
    pub fn to_line(&self) -> String {
        let mut raw = self.key_id.to_be_bytes().to_vec();
        raw.extend_from_slice(&self.signature);
        format!("\u{2014} {} {}\n", self.name, BASE64.encode(raw))
    }
}

/// A signed note split by the grammar of §7.4 into its text and signature
/// lines. Nothing in it is verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedNote {
    /// The note text, ending in a newline (without the blank line).
    pub text: String,
    /// The signature lines in order.
    pub signatures: Vec<NoteSignature>,
}

/// Base64 of signature lines: the standard alphabet with canonical padding,
/// but non-zero unused bits in the last character accepted, as Go's
/// `base64.StdEncoding` (which golang.org/x/mod/sumdb/note uses) accepts them.
const SIGNATURE_BASE64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_encode_padding(true)
        .with_decode_allow_trailing_bits(true)
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::RequireCanonical),
);

impl SignedNote {
    /// Reads `note` by the signed-note grammar of §7.4: at most
    /// [`MAX_CHECKPOINT_NOTE_BYTES`] bytes; no character below U+0020 but
    /// newline; the text is everything up to and including the first newline
    /// of the last blank line; after it, one to [`MAX_NOTE_SIGNATURES`]
    /// lines `— <name> <base64>\n`, each name a valid key name, each base64
    /// non-empty, padded, decoding to at least 5 bytes.
    ///
    /// # Errors
    /// [`NoteError::NoteFormat`] naming the rule broken.
    pub fn parse(note: &str) -> Result<Self, NoteError> {
        let bad = |reason| NoteError::NoteFormat { reason };
        if note.len() > MAX_CHECKPOINT_NOTE_BYTES {
            return Err(bad("more than 8192 bytes"));
        }
        if note.chars().any(|c| c < '\u{20}' && c != '\n') {
            return Err(bad("a control character other than newline"));
        }
        let (text, block) = note
            .rsplit_once("\n\n")
            .ok_or(bad("no blank line before the signatures"))?;
        let block = block
            .strip_suffix('\n')
            .ok_or(bad("the signature lines do not end in a newline"))?;
        let mut signatures = Vec::new();
        for line in block.split('\n') {
            if signatures.len() == MAX_NOTE_SIGNATURES {
                return Err(bad("more than 100 signature lines"));
            }
            let rest = line.strip_prefix("\u{2014} ").ok_or(bad(
                "a signature line does not start with an em dash and a space",
            ))?;
            let (name, b64) = rest.split_once(' ').unwrap_or((rest, ""));
            if !is_valid_key_name(name) {
                return Err(bad("a signature line's key name is not a valid key name"));
            }
            let raw = SIGNATURE_BASE64
                .decode(b64)
                .map_err(|_| bad("a signature line's signature is not padded standard base64"))?;
            if raw.len() < 5 {
                return Err(bad("a signature line holds fewer than 5 bytes"));
            }
            let mut id = [0u8; 4];
            id.copy_from_slice(&raw[..4]);
            signatures.push(NoteSignature {
                name: name.to_owned(),
                key_id: u32::from_be_bytes(id),
                signature: raw[4..].to_vec(),
            });
        }
        Ok(Self {
            text: format!("{text}\n"),
            signatures,
        })
    }

    /// The first signature line with this key name and key id: the one a
    /// verifier checks (later lines with the same name and id are ignored).
    #[must_use]
    pub fn signature_by(&self, name: &str, key_id: u32) -> Option<&NoteSignature> {
        self.signatures
            .iter()
            .find(|s| s.key_id == key_id && s.name == name)
    }
}

/// Verifies a signed checkpoint note with `key` and returns the checkpoint
/// (§7.4): the note is well formed, its first line by `key`'s name and key
/// id holds a 64-byte signature that verifies strictly over the text, the
/// text is a checkpoint body, and its origin is the key's name. Lines by
/// other keys (witness cosignatures, say) are not read.
///
/// # Errors
/// [`NoteError`] when the note is malformed, not signed by `key`, badly
/// signed, or names another origin.
pub fn open_checkpoint(note: &str, key: &NoteVerifier) -> Result<Checkpoint, NoteError> {
    let parsed = SignedNote::parse(note)?;
    let checkpoint = Checkpoint::from_body(&parsed.text)?;
    let Some(line) = parsed.signature_by(&key.name, key.id) else {
        return Err(NoteError::NotSignedByKey { key: key.label() });
    };
    if !key.verifies(parsed.text.as_bytes(), &line.signature) {
        return Err(NoteError::BadSignature { key: key.label() });
    }
    if checkpoint.origin != key.name {
        return Err(NoteError::OriginMismatch {
            origin: checkpoint.origin,
            key_name: key.name.clone(),
        });
    }
    Ok(checkpoint)
}

/// The checkpoint body of a note, without checking any signature. For
/// display and routing, and for the checks that go on with what a note
/// claims after its signature failed; never trust what it returns.
///
/// # Errors
/// [`NoteError`] when the note or body is malformed.
pub fn peek_checkpoint(note: &str) -> Result<Checkpoint, NoteError> {
    Checkpoint::from_body(&SignedNote::parse(note)?.text)
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

    fn signed() -> (NoteSigner, String) {
        let signer =
            NoteSigner::from_secret("log.example/a", SecretKey::from_seed(&[3; 32])).unwrap();
        let cp = Checkpoint::new("log.example/a", TreeSize::new(5), Hash::sha256(b"x"));
        let note = signer.sign_checkpoint(&cp).unwrap();
        (signer, note)
    }

    /// A signature line for `name` holding `raw` (key id and signature).
    fn line(name: &str, raw: &[u8]) -> String {
        format!("\u{2014} {name} {}\n", BASE64.encode(raw))
    }

    /// The base64 of the last signature line with one unused bit set.
    fn with_stray_bit(note: &str) -> String {
        let (head, last) = note.trim_end_matches('\n').rsplit_once(' ').unwrap();
        let alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut chars: Vec<char> = last.chars().collect();
        let i = chars.iter().position(|c| *c == '=').unwrap() - 1;
        let pos = alphabet.find(chars[i]).unwrap();
        chars[i] = alphabet.chars().nth(pos ^ 1).unwrap();
        format!("{head} {}\n", chars.into_iter().collect::<String>())
    }

    #[test]
    fn the_note_grammar_is_gos() {
        let (signer, note) = signed();
        let key = signer.verifier();
        let cp = open_checkpoint(&note, key).unwrap();
        // Non-zero unused bits in a signature's base64: accepted, in the log's
        // own line and in a line of an unknown key, as Go's note.Open does.
        let stray = with_stray_bit(&note);
        assert_ne!(stray, note);
        assert_eq!(open_checkpoint(&stray, key), Ok(cp.clone()));
        let unknown = format!("{note}{}", line("w.example", &[1u8; 76]));
        assert_eq!(
            open_checkpoint(&with_stray_bit(&unknown), key),
            Ok(cp.clone())
        );
        let malformed = |n: &str| {
            matches!(
                open_checkpoint(n, key),
                Err(NoteError::NoteFormat { .. } | NoteError::CheckpointFormat { .. })
            )
        };
        // An unknown key's line that breaks the grammar makes the note malformed.
        let mut bad_b64 = format!("{note}{}", line("w.example", &[1u8; 76]));
        bad_b64.insert(bad_b64.len() - 3, '*');
        assert!(malformed(&bad_b64));
        let unpadded = format!("{note}{}", line("w.example", &[1u8; 76])).replace("=\n", "\n");
        assert!(malformed(&unpadded));
        assert!(malformed(&format!(
            "{note}{}",
            line("w.example", &[1u8; 4])
        )));
        assert!(!malformed(&format!(
            "{note}{}",
            line("w.example", &[1u8; 5])
        )));
        assert!(malformed(&format!("{note}{}", line("w+x", &[1u8; 8]))));
        assert!(malformed(&format!("{note}\u{2014} w.example\n")));
        assert!(malformed(&format!("{note}- w.example AAAAAAAA\n")));
        assert!(malformed(note.trim_end_matches('\n')));
        assert!(malformed(&note.replacen("\n\n", "\n", 1)));
        assert!(malformed(&note.replacen(
            "log.example/a\n",
            "log.example/a\t\n",
            1
        )));
        assert!(malformed(&note.replacen("\n5\n", "\n05\n", 1)));
        let too_many = format!("{note}{}", line("w.example", &[1u8; 8]).repeat(100));
        assert!(malformed(&too_many));
        let just_enough = format!("{note}{}", line("w.example", &[1u8; 8]).repeat(99));
        assert_eq!(open_checkpoint(&just_enough, key), Ok(cp.clone()));
        let long = format!("{note}{}", line("w.example", &[1u8; 8000]));
        assert!(long.len() > MAX_CHECKPOINT_NOTE_BYTES);
        assert!(malformed(&long));
        // Characters from U+007F up are not control characters to the grammar.
        assert!(SignedNote::parse("a\u{7f}\u{85}\n\n\u{2014} k AAAAAAA=\n").is_ok());
    }

    #[test]
    fn the_first_line_of_the_pinned_key_decides() {
        let (signer, note) = signed();
        let key = signer.verifier();
        let own = note.split("\n\n").nth(1).unwrap().to_owned();
        let mut raw = key.id().to_be_bytes().to_vec();
        raw.extend_from_slice(&[7u8; 64]);
        let forged = line(key.name(), &raw);
        // A repeat after a good line is ignored; a bad first line fails.
        assert!(open_checkpoint(&format!("{note}{forged}"), key).is_ok());
        let body = note.split("\n\n").next().unwrap();
        let bad_first = format!("{body}\n\n{forged}{own}");
        assert!(matches!(
            open_checkpoint(&bad_first, key),
            Err(NoteError::BadSignature { .. })
        ));
        // A line of the pinned name and id whose signature is not 64 bytes
        // does not verify: it is a bad signature, not a malformed note.
        raw.truncate(4 + 63);
        let short = format!("{body}\n\n{}", line(key.name(), &raw));
        assert!(matches!(
            open_checkpoint(&short, key),
            Err(NoteError::BadSignature { .. })
        ));
        // The pinned name with another key id is another key: not signed.
        let mut other = (key.id() ^ 1).to_be_bytes().to_vec();
        other.extend_from_slice(&[7u8; 64]);
        let other = format!("{body}\n\n{}", line(key.name(), &other));
        assert!(matches!(
            open_checkpoint(&other, key),
            Err(NoteError::NotSignedByKey { .. })
        ));
    }
}
