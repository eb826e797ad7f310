//! The fast layout reader of records: input already in canonical layout is
//! read straight into the typed fields (docs/protocol.md §3).

use crate::limits::MAX_COUNTER;

use super::{
    ActionState, AgentName, Body, Claim, Decision, KeyRotation, Nonce, NoteBody, Outcome,
    OutcomeStatus, Record, RecordKind, Seq, ToolEntry, ToolList, ToolPartDigests, UnsignedRecord,
};
use crate::hash::Hash;
use crate::keys::{KeyId, PublicKey, Signature};
use crate::time::UnixMillis;

/// A reader for the fast road: it walks bytes expected to be in the one
/// canonical layout and gives up (`None`) at anything else (white space,
/// members out of place, an escape JCS would not write, a number that is
/// not a plain counter). Giving up costs only the strict road; whatever it
/// reads is accepted only after the caller writes it back canonically and
/// compares, so the reader need not be exact, only never wrong about what
/// it did read.
pub(crate) struct Cursor<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `bytes`, which must be UTF-8.
    pub(crate) fn new(bytes: &'a [u8]) -> Option<Self> {
        Some(Self {
            text: std::str::from_utf8(bytes).ok()?,
            at: 0,
        })
    }

    pub(crate) fn at_end(&self) -> bool {
        self.at == self.text.len()
    }

    /// The bytes from `start` up to the cursor.
    pub(crate) fn since(&self, start: usize) -> &'a [u8] {
        &self.text.as_bytes()[start..self.at]
    }

    /// The cursor's offset in the input.
    pub(crate) fn position(&self) -> usize {
        self.at
    }

    /// Consumes `lit` if the input goes on with it.
    pub(crate) fn eat(&mut self, lit: &[u8]) -> bool {
        let found = self.text.as_bytes()[self.at..].starts_with(lit);
        if found {
            self.at += lit.len();
        }
        found
    }

    /// Consumes `lit`, or gives up.
    pub(crate) fn expect(&mut self, lit: &[u8]) -> Option<()> {
        self.eat(lit).then_some(())
    }

    /// A string, with the escapes JCS writes (`\" \\ \b \f \n \r \t` and
    /// `\u00xx` for other controls) decoded; borrowed when it has none.
    pub(crate) fn string(&mut self) -> Option<std::borrow::Cow<'a, str>> {
        let b = self.text.as_bytes();
        if b.get(self.at) != Some(&b'"') {
            return None;
        }
        let start = self.at + 1;
        let len = b[start..]
            .iter()
            .position(|&c| c == b'"' || c == b'\\' || c < 0x20)?;
        if b[start + len] == b'"' {
            self.at = start + len + 1;
            return Some(std::borrow::Cow::Borrowed(&self.text[start..start + len]));
        }
        let mut out = String::from(&self.text[start..start + len]);
        let mut i = start + len;
        loop {
            let c = *b.get(i)?;
            match c {
                b'"' => break,
                b'\\' => {
                    let decoded = match *b.get(i + 1)? {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hex = self.text.get(i + 2..i + 6)?;
                            let v = u8::from_str_radix(hex.strip_prefix("00")?, 16).ok()?;
                            i += 4;
                            (v < 0x20).then_some(char::from(v))?
                        }
                        _ => return None,
                    };
                    out.push(decoded);
                    i += 2;
                }
                0x00..=0x1f => return None,
                _ => {
                    let run = b[i..]
                        .iter()
                        .position(|&c| c == b'"' || c == b'\\' || c < 0x20)?;
                    out.push_str(&self.text[i..i + run]);
                    i += run;
                }
            }
        }
        self.at = i + 1;
        Some(std::borrow::Cow::Owned(out))
    }

    /// A counter: digits only, at most 2^53 − 1.
    pub(crate) fn counter(&mut self) -> Option<u64> {
        let digits = self.text.as_bytes()[self.at..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        if digits == 0 || digits > 16 {
            return None;
        }
        let n = self.text[self.at..self.at + digits].parse::<u64>().ok()?;
        self.at += digits;
        (n <= MAX_COUNTER).then_some(n)
    }

    /// The `len` bytes between a quote here and a quote `len + 1` bytes on:
    /// the only spelling JCS gives a hash or a time. The callers parse them
    /// with parsers that refuse a quote, a backslash or a control character
    /// (hex digits only; the time's digits and punctuation only), so an
    /// escaped or cut string is refused there, which costs only the strict
    /// road.
    fn fixed_string(&mut self, len: usize) -> Option<&'a str> {
        let b = self.text.as_bytes();
        let start = self.at + 1;
        let end = start.checked_add(len)?;
        if b.get(self.at) != Some(&b'"') || b.get(end) != Some(&b'"') {
            return None;
        }
        let text = self.text.get(start..end)?;
        self.at = end + 1;
        Some(text)
    }

    pub(crate) fn hash(&mut self) -> Option<Hash> {
        Hash::from_hex(self.fixed_string(2 * crate::hash::HASH_LEN)?).ok()
    }

    /// The items of an array whose `[` was just read, each read by `item`,
    /// through its `]` (room for `capacity` made first); `None` at the
    /// first item or separator that is not there.
    pub(crate) fn items<T>(
        &mut self,
        capacity: usize,
        mut item: impl FnMut(&mut Self) -> Option<T>,
    ) -> Option<Vec<T>> {
        let mut out = Vec::with_capacity(capacity);
        if self.eat(b"]") {
            return Some(out);
        }
        loop {
            out.push(item(self)?);
            if self.eat(b"]") {
                return Some(out);
            }
            self.expect(b",")?;
        }
    }

    /// The hashes of an array whose `[` was just read, through its `]`.
    pub(crate) fn hash_list(&mut self) -> Option<Vec<Hash>> {
        // A proof in a log of up to 2^32 entries, without growing.
        self.items(32, Self::hash)
    }

    pub(crate) fn nonce(&mut self) -> Option<Nonce> {
        Nonce::from_hex(&self.string()?).ok()
    }

    pub(crate) fn time(&mut self) -> Option<UnixMillis> {
        // `YYYY-MM-DDTHH:MM:SS.mmmZ`
        UnixMillis::parse_rfc3339(self.fixed_string(24)?).ok()
    }

    /// A string naming a variant of a unit enum (its serde name).
    fn variant<T: serde::de::DeserializeOwned>(&mut self) -> Option<T> {
        use serde::de::IntoDeserializer as _;
        let name = self.string()?;
        let d: serde::de::value::StrDeserializer<'_, serde::de::value::Error> =
            name.as_ref().into_deserializer();
        T::deserialize(d).ok()
    }
}

/// A record's fields as the fast road reads them ([`Record::from_json`]).
/// The body's members are all optional because in canonical order `body`
/// comes before `kind`; the kind picks the members afterwards, and a member
/// of another kind makes the bytes differ from the canonical ones.
pub(crate) struct FastRecord {
    agent: AgentName,
    body: FastBody,
    key_id: KeyId,
    kind: RecordKind,
    nonce: Nonce,
    prev: Option<Hash>,
    seq: Seq,
    sig: Signature,
    time: UnixMillis,
}

#[derive(Default)]
struct FastBody {
    call_id: Option<String>,
    input_hash: Option<Hash>,
    tool: Option<String>,
    decision: Option<Hash>,
    status: Option<OutcomeStatus>,
    output_hash: Option<Hash>,
    state: Option<ActionState>,
    proof: Option<String>,
    proof_hash: Option<Hash>,
    turn_hash: Option<Hash>,
    list_id: Option<String>,
    part: Option<u32>,
    parts: Option<u32>,
    tools: Option<Vec<ToolEntry>>,
    source: Option<String>,
    lease_ms: Option<u64>,
    text: Option<String>,
    new_key_id: Option<KeyId>,
    new_public_key: Option<PublicKey>,
}

impl FastBody {
    fn read(c: &mut Cursor<'_>) -> Option<Self> {
        let mut b = Self::default();
        c.expect(b"{")?;
        if c.eat(b"}") {
            return Some(b);
        }
        loop {
            let key = c.string()?;
            c.expect(b":")?;
            match key.as_ref() {
                "call_id" => b.call_id = Some(c.string()?.into_owned()),
                "input_hash" => b.input_hash = Some(c.hash()?),
                "tool" => b.tool = Some(c.string()?.into_owned()),
                "decision" => b.decision = Some(c.hash()?),
                "status" => b.status = Some(c.variant()?),
                "output_hash" => b.output_hash = Some(c.hash()?),
                "state" => b.state = Some(c.variant()?),
                "proof" => b.proof = Some(c.string()?.into_owned()),
                "proof_hash" => b.proof_hash = Some(c.hash()?),
                "turn_hash" => b.turn_hash = Some(c.hash()?),
                "list_id" => b.list_id = Some(c.string()?.into_owned()),
                "part" => b.part = Some(u32::try_from(c.counter()?).ok()?),
                "parts" => b.parts = Some(u32::try_from(c.counter()?).ok()?),
                "tools" => b.tools = Some(read_tools(c)?),
                "source" => b.source = Some(c.string()?.into_owned()),
                "lease_ms" => b.lease_ms = Some(c.counter()?),
                "text" => b.text = Some(c.string()?.into_owned()),
                "new_key_id" => b.new_key_id = Some(KeyId::from_hex(&c.string()?).ok()?),
                "new_public_key" => {
                    b.new_public_key = Some(PublicKey::from_base64(&c.string()?).ok()?);
                }
                _ => return None,
            }
            if c.eat(b"}") {
                return Some(b);
            }
            c.expect(b",")?;
        }
    }
}

fn read_tools(c: &mut Cursor<'_>) -> Option<Vec<ToolEntry>> {
    c.expect(b"[")?;
    c.items(0, |c| {
        c.expect(b"{\"digest\":")?;
        let digest = c.hash()?;
        c.expect(b",\"name\":")?;
        let name = c.string()?.into_owned();
        c.expect(b",\"parts\":{")?;
        let mut parts = ToolPartDigests::default();
        if !c.eat(b"}") {
            loop {
                let key = c.string()?;
                c.expect(b":")?;
                let h = Some(c.hash()?);
                match key.as_ref() {
                    "annotations" => parts.annotations = h,
                    "description" => parts.description = h,
                    "input_schema" => parts.input_schema = h,
                    "meta" => parts.meta = h,
                    "output_schema" => parts.output_schema = h,
                    "title" => parts.title = h,
                    _ => return None,
                }
                if c.eat(b"}") {
                    break;
                }
                c.expect(b",")?;
            }
        }
        c.expect(b",\"recorded\":")?;
        let recorded = if c.eat(b"true") {
            true
        } else {
            c.expect(b"false")?;
            false
        };
        c.expect(b"}")?;
        Some(ToolEntry {
            name,
            recorded,
            digest,
            parts,
        })
    })
}

impl FastRecord {
    /// Reads a record object in canonical layout at the cursor.
    pub(crate) fn read(c: &mut Cursor<'_>) -> Option<Self> {
        c.expect(b"{\"agent\":")?;
        let agent = AgentName::new(&c.string()?).ok()?;
        c.expect(b",\"body\":")?;
        let body = FastBody::read(c)?;
        c.expect(b",\"key_id\":")?;
        let key_id = KeyId::from_hex(&c.string()?).ok()?;
        c.expect(b",\"kind\":")?;
        let kind = c.variant()?;
        c.expect(b",\"nonce\":")?;
        let nonce = c.nonce()?;
        c.expect(b",\"prev\":")?;
        let prev = if c.eat(b"null") {
            None
        } else {
            Some(c.hash()?)
        };
        c.expect(b",\"seq\":")?;
        let seq = Seq::new(c.counter()?).ok()?;
        c.expect(b",\"sig\":")?;
        let sig = Signature::from_base64(&c.string()?).ok()?;
        c.expect(b",\"time\":")?;
        let time = c.time()?;
        c.expect(b",\"v\":1}")?;
        Some(Self {
            agent,
            body,
            key_id,
            kind,
            nonce,
            prev,
            seq,
            sig,
            time,
        })
    }
}

impl FastRecord {
    /// The record these fields make, or `None` when a member its kind needs
    /// is missing or a rule is broken (the strict road then says which).
    /// The caller still compares the canonical bytes with its input.
    pub(crate) fn into_record(self) -> Option<Record> {
        let b = self.body;
        let body = match self.kind {
            RecordKind::Decision => Body::Decision(Decision {
                call_id: b.call_id?,
                tool: b.tool?,
                input_hash: b.input_hash?,
            }),
            RecordKind::Outcome => Body::Outcome(Outcome {
                call_id: b.call_id?,
                decision: b.decision?,
                status: b.status?,
                output_hash: b.output_hash,
                state: b.state,
                proof: b.proof,
                proof_hash: b.proof_hash,
            }),
            RecordKind::Claim => Body::Claim(Claim {
                tool: b.tool?,
                turn_hash: b.turn_hash?,
            }),
            RecordKind::Tools => Body::Tools(ToolList {
                list_id: b.list_id?,
                part: b.part?,
                parts: b.parts?,
                tools: b.tools?,
                source: b.source,
                lease_ms: b.lease_ms,
            }),
            RecordKind::Note => Body::Note(NoteBody { text: b.text? }),
            RecordKind::KeyRotation => Body::KeyRotation(KeyRotation {
                new_key_id: b.new_key_id?,
                new_public_key: b.new_public_key?,
            }),
            // Its members are not read here: the strict road reads it.
            RecordKind::ToolCheck => return None,
        };
        let unsigned = UnsignedRecord {
            agent: self.agent,
            key_id: self.key_id,
            seq: self.seq,
            prev: self.prev,
            time: self.time,
            nonce: self.nonce,
            body,
        };
        unsigned.validate().ok()?;
        Record::assemble(unsigned, self.sig).ok()
    }
}
