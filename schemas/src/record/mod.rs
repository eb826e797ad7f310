//! Records: what an agent signs, docs/protocol.md §3–§5.
//!
//! A [`Record`] that exists has passed every structural rule: strict JSON,
//! the v1 schema with no unknown fields, the per-kind body rules, the size
//! limit, and a round trip (its canonical form re-serialises to the bytes it
//! was parsed from). The signature is checked separately, against a key the
//! caller trusts for the record's `key_id`
//! ([`crate::batch_sig::PreparedKey::verify_record`]).
//!
//! A record's canonical bytes are written by `write_canonical`, a JCS
//! writer for this one fixed shape (members in RFC 8785 order, strings
//! escaped as RFC 8785 §3.2.2.2 says); a test holds it byte-equal to the
//! general canonicaliser. Parsing has two roads with one answer: input that
//! is already canonical is read straight into the typed fields and accepted
//! only if writing those fields back gives the input byte for byte; anything
//! else (other spacing or member order, an error of any kind) goes the
//! strict road through [`canonical::parse_strict`], which gives the errors.
//!
//! The files: `fields.rs` (agent names, seqs, nonces, the text rule),
//! `body.rs` (kinds and bodies, §5), `write.rs` (the canonical writer),
//! `fast.rs` (the fast layout reader), `error.rs` (the errors), `types.rs`
//! (the types [`UnsignedRecord`] and [`Record`], which the others depend
//! on) and this one (what a record does, and its two roads).

mod body;
mod error;
mod fast;
mod fields;
mod types;
mod write;

pub use body::{
    ActionState, Body, CheckEffect, CheckException, CheckFinding, CheckObservation, CheckTrigger,
    Claim, Decision, KeyRotation, NoteBody, Outcome, OutcomeStatus, RecordKind, ToolCheck,
    ToolEntry, ToolList, ToolPartDigests,
};
pub use error::{RecordError, RECORD_VERSION};
pub(crate) use fast::{Cursor, FastRecord};
pub use fields::{AgentName, Nonce, Seq};
pub use types::{Record, UnsignedRecord};
pub(crate) use write::{put_counter, put_hashes, put_hex, put_str, put_time};

use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

use crate::canonical::{self, Limits};
use crate::hash::Hash;
use crate::keys::{KeyId, SecretKey, Signature};
use crate::limits::MAX_RECORD_BYTES;
use crate::time::UnixMillis;

use write::write_canonical;

/// Domain separation prefix of the record signature: the agent signs
/// `"tally/record/v1\n" ‖ JCS(record without "sig")`.
pub const RECORD_SIGNATURE_DOMAIN: &[u8] = b"tally/record/v1\n";

#[derive(Serialize)]
struct WireOut<'a> {
    v: u64,
    kind: RecordKind,
    agent: &'a AgentName,
    key_id: &'a KeyId,
    seq: Seq,
    prev: &'a Option<Hash>,
    time: UnixMillis,
    nonce: &'a Nonce,
    body: &'a Body,
    #[serde(skip_serializing_if = "Option::is_none")]
    sig: Option<&'a Signature>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireIn {
    #[allow(dead_code)] // checked before this struct is decoded
    v: u64,
    kind: RecordKind,
    agent: AgentName,
    key_id: KeyId,
    seq: Seq,
    prev: Option<Hash>,
    time: UnixMillis,
    nonce: Nonce,
    body: Value,
    sig: Signature,
}

impl UnsignedRecord {
    fn wire<'a>(&'a self, sig: Option<&'a Signature>) -> WireOut<'a> {
        WireOut {
            v: RECORD_VERSION,
            kind: self.body.kind(),
            agent: &self.agent,
            key_id: &self.key_id,
            seq: self.seq,
            prev: &self.prev,
            time: self.time,
            nonce: &self.nonce,
            body: &self.body,
            sig,
        }
    }

    /// `JCS(record without "sig")`, the bytes after the signature domain.
    ///
    /// # Errors
    /// [`RecordError::Invalid`] for a time outside the wire range.
    pub fn signing_bytes(&self) -> Result<Vec<u8>, RecordError> {
        let mut out = Vec::with_capacity(512);
        write_canonical(self, None, &mut out)?;
        Ok(out)
    }

    fn validate(&self) -> Result<(), RecordError> {
        match (self.seq == Seq::GENESIS, self.prev.is_some()) {
            (true, true) => Err(RecordError::Invalid {
                field: "prev",
                reason: "must be null at seq 0".into(),
            }),
            (false, false) => Err(RecordError::Invalid {
                field: "prev",
                reason: format!("must name the previous record's hash at seq {}", self.seq),
            }),
            _ => self.body.validate(),
        }
    }

    /// Signs the record with `key`, setting `key_id` to that key's id.
    ///
    /// # Errors
    /// [`RecordError`] when the record breaks a structural rule or is too large.
    pub fn sign(mut self, key: &SecretKey) -> Result<Record, RecordError> {
        self.key_id = key.public_key().key_id();
        self.validate()?;
        let sig = key.sign(RECORD_SIGNATURE_DOMAIN, &self.signing_bytes()?);
        Record::assemble(self, sig)
    }
}

impl Record {
    fn assemble(unsigned: UnsignedRecord, sig: Signature) -> Result<Self, RecordError> {
        let mut canonical = Vec::with_capacity(512);
        let sig_member = write_canonical(&unsigned, Some(&sig), &mut canonical)?;
        if canonical.len() > MAX_RECORD_BYTES {
            return Err(RecordError::TooLarge {
                size: canonical.len(),
                max: MAX_RECORD_BYTES,
            });
        }
        let hash = Hash::sha256(&canonical);
        Ok(Self {
            unsigned,
            sig,
            canonical,
            sig_member,
            hash,
        })
    }

    /// Parses a record from JSON bytes (any whitespace; strict JSON rules).
    ///
    /// # Errors
    /// [`RecordError`] naming the first rule broken.
    pub fn from_json(bytes: &[u8]) -> Result<Self, RecordError> {
        if let Some(record) = Self::from_canonical(bytes) {
            return Ok(record);
        }
        Self::from_value(canonical::parse_strict(bytes, Limits::WIRE)?)
    }

    /// The fast road for input that is already canonical: the typed fields
    /// read straight from `bytes`, accepted only when their canonical bytes
    /// are `bytes` exactly. Those bytes have no duplicate member, no number
    /// but the record's own counters, no white space and no other spelling,
    /// so the strict road would accept them and read the same fields. `None`
    /// sends the input down the strict road, which names what is wrong.
    fn from_canonical(bytes: &[u8]) -> Option<Self> {
        let mut cursor = Cursor::new(bytes)?;
        let record = Self::read_canonical(&mut cursor)?;
        cursor.at_end().then_some(record)
    }

    /// The fast road for one record at the cursor (a record alone, or a
    /// member of a batch request): read in canonical layout, accepted only
    /// when its canonical bytes are the bytes the cursor went over.
    pub(crate) fn read_canonical(cursor: &mut Cursor<'_>) -> Option<Self> {
        let start = cursor.position();
        let fields = FastRecord::read(cursor)?;
        let record = fields.into_record()?;
        (record.canonical == cursor.since(start)).then_some(record)
    }

    /// Parses a record from a JSON value that was itself parsed strictly
    /// (see [`canonical::parse_strict`]).
    ///
    /// # Errors
    /// [`RecordError`] naming the first rule broken.
    pub fn from_value(value: Value) -> Result<Self, RecordError> {
        check_version(&value, RECORD_VERSION, |found| {
            RecordError::UnsupportedVersion { found }
        })
        .map_err(|e| e.unwrap_or_else(|message| RecordError::Schema { message }))?;
        let as_given = canonical::canonicalize(&value)?;
        let wire: WireIn = serde_json::from_value(value).map_err(|e| RecordError::Schema {
            message: e.to_string(),
        })?;
        let body = Body::from_value(wire.kind, wire.body).map_err(|e| RecordError::Schema {
            message: format!("body of a {} record: {e}", wire.kind.as_str()),
        })?;
        let unsigned = UnsignedRecord {
            agent: wire.agent,
            key_id: wire.key_id,
            seq: wire.seq,
            prev: wire.prev,
            time: wire.time,
            nonce: wire.nonce,
            body,
        };
        unsigned.validate()?;
        let record = Self::assemble(unsigned, wire.sig)?;
        if record.canonical != as_given {
            // Only a field tally never writes can cause this: an omitted
            // `prev`, say. Refusing keeps "the bytes signed" and "the fields
            // read" the same thing.
            return Err(RecordError::Schema {
                message: "record is not in v1 form (an omitted null field, or a value written in a form tally does not produce)"
                    .into(),
            });
        }
        Ok(record)
    }

    /// The record's RFC 8785 canonical bytes, signature included.
    #[must_use]
    pub fn canonical_bytes(&self) -> &[u8] {
        &self.canonical
    }

    /// The record hash: `SHA-256(JCS(record))`, signature included.
    #[must_use]
    pub fn hash(&self) -> Hash {
        self.hash
    }

    /// The signature.
    #[must_use]
    pub fn signature(&self) -> &Signature {
        &self.sig
    }

    /// The kind.
    #[must_use]
    pub fn kind(&self) -> RecordKind {
        self.unsigned.body.kind()
    }

    /// The fields without the signature.
    #[must_use]
    pub fn unsigned(&self) -> &UnsignedRecord {
        &self.unsigned
    }

    /// The message the signature is over (§3.1):
    /// `"tally/record/v1\n" ‖ JCS(record without "sig")`. The one place
    /// these bytes are built for a parsed record.
    #[must_use]
    pub fn signed_message(&self) -> Vec<u8> {
        let parts = self.signed_message_parts();
        let mut message = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
        for p in parts {
            message.extend_from_slice(p);
        }
        message
    }

    /// [`Record::signed_message`] as three pieces to be read end to end,
    /// without copying: the domain, then the record's canonical bytes
    /// before and after its `,"sig":"…"` member. The canonical writer puts
    /// every other byte the same with or without that member (JCS sorts
    /// members, so `sig` sits between `seq` and `time`), and it noted where
    /// the member went, so cutting it out gives `JCS(record without "sig")`
    /// exactly; `signing_bytes` writes the same bytes afresh (a test holds
    /// them equal).
    #[must_use]
    pub fn signed_message_parts(&self) -> [&[u8]; 3] {
        [
            RECORD_SIGNATURE_DOMAIN,
            &self.canonical[..self.sig_member.start],
            &self.canonical[self.sig_member.end..],
        ]
    }
}

impl Serialize for Record {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.unsigned.wire(Some(&self.sig)).serialize(s)
    }
}

/// Checks an object's `v` field. `Err(Ok(e))` is a version this build does
/// not read; `Err(Err(message))` is a missing or malformed field.
impl Body {
    /// Parses and checks a body of `kind` from its JSON value, by the rules
    /// of docs/protocol.md §5 (the record-level rules, such as its size,
    /// are checked when it is signed).
    ///
    /// # Errors
    /// [`RecordError::Schema`] when it does not match the kind's schema,
    /// [`RecordError::Invalid`] when a field breaks a rule.
    pub fn from_kind_value(kind: RecordKind, value: Value) -> Result<Self, RecordError> {
        let body = Self::from_value(kind, value).map_err(|e| RecordError::Schema {
            message: e.to_string(),
        })?;
        body.validate()?;
        Ok(body)
    }
}

pub(crate) fn check_version<E>(
    value: &Value,
    supported: u64,
    unsupported: impl FnOnce(String) -> E,
) -> Result<(), Result<E, String>> {
    let Some(obj) = value.as_object() else {
        return Err(Err("expected a JSON object".into()));
    };
    match obj.get("v") {
        None => Err(Err("missing field `v` (the format version)".into())),
        Some(v) if v.as_u64() == Some(supported) => Ok(()),
        Some(v) if v.as_u64().is_some() => Err(Ok(unsupported(v.to_string()))),
        Some(v) => Err(Err(format!(
            "field `v` must be a positive integer, got {v}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SecretKey {
        SecretKey::from_seed(&[7; 32])
    }

    fn signed(seq: u64, body: Body) -> Record {
        UnsignedRecord {
            agent: AgentName::new("claims-bot.v2").unwrap(),
            key_id: key().public_key().key_id(),
            seq: Seq::new(seq).unwrap(),
            prev: (seq > 0).then(|| Hash::sha256(b"prev")),
            time: UnixMillis::new(1_795_000_000_123),
            nonce: Nonce::from_bytes((0..24).collect()).unwrap(),
            body,
        }
        .sign(&key())
        .unwrap()
    }

    fn digest(label: &str) -> Hash {
        Hash::sha256(label.as_bytes())
    }

    /// One record of every kind and shape, with text that needs escaping.
    fn samples() -> Vec<Record> {
        let tool = |name: &str, all: bool| ToolEntry {
            name: name.into(),
            recorded: all,
            digest: digest(name),
            parts: if all {
                ToolPartDigests {
                    title: Some(digest("t")),
                    description: Some(digest("d")),
                    input_schema: Some(digest("i")),
                    output_schema: Some(digest("o")),
                    annotations: Some(digest("a")),
                    meta: Some(digest("m")),
                }
            } else {
                ToolPartDigests {
                    input_schema: Some(digest("i")),
                    ..ToolPartDigests::default()
                }
            },
        };
        let new_key = SecretKey::from_seed(&[9; 32]).public_key();
        vec![
            signed(
                0,
                Body::Tools(ToolList {
                    list_id: "list \"1\"".into(),
                    part: 0,
                    parts: 2,
                    tools: vec![tool("refund", true), tool("zé\\ro", false)],
                    source: None,
                    lease_ms: None,
                }),
            ),
            signed(
                1,
                Body::Decision(Decision {
                    call_id: "42".into(),
                    tool: "refund/é😀\u{2028}".into(),
                    input_hash: digest("in"),
                }),
            ),
            signed(
                2,
                Body::Outcome(Outcome {
                    call_id: "42".into(),
                    decision: digest("d"),
                    status: OutcomeStatus::ServerExited,
                    output_hash: Some(digest("out")),
                    state: None,
                    proof: None,
                    proof_hash: None,
                }),
            ),
            signed(
                3,
                Body::Outcome(Outcome {
                    call_id: "43".into(),
                    decision: digest("d2"),
                    status: OutcomeStatus::NotRun,
                    output_hash: None,
                    state: None,
                    proof: None,
                    proof_hash: None,
                }),
            ),
            signed(
                4,
                Body::Note(NoteBody {
                    text: "line 1\nline\t2 \"quoted\" back\\slash é".into(),
                }),
            ),
            signed(
                5,
                Body::KeyRotation(KeyRotation {
                    new_key_id: new_key.key_id(),
                    new_public_key: new_key,
                }),
            ),
            signed(
                9_007_199_254_740_991,
                Body::Note(NoteBody { text: "max".into() }),
            ),
            signed(
                6,
                Body::Tools(ToolList {
                    list_id: "l2".into(),
                    part: 1,
                    parts: 2,
                    tools: vec![tool("search", true)],
                    source: Some("gateway \"docs\"/é😀".into()),
                    lease_ms: Some(86_400_000),
                }),
            ),
            signed(
                7,
                Body::Tools(ToolList {
                    list_id: "l3".into(),
                    part: 0,
                    parts: 1,
                    tools: vec![],
                    source: Some("sdk".into()),
                    lease_ms: None,
                }),
            ),
            signed(
                8,
                Body::Tools(ToolList {
                    list_id: "l4".into(),
                    part: 0,
                    parts: 1,
                    tools: vec![tool("a", false)],
                    source: Some("s".into()),
                    lease_ms: Some(1_000),
                }),
            ),
        ]
    }

    /// A named source's list (docs/protocol.md §5.3): the members in JCS
    /// order, the lease's default, and the refusals.
    #[test]
    fn a_tools_source_and_lease_are_read_written_and_refused_as_section_5_3_says() {
        let r = &samples()[9];
        let text = String::from_utf8(r.canonical_bytes().to_vec()).unwrap();
        assert!(
            text.contains(
                "\"body\":{\"lease_ms\":1000,\"list_id\":\"l4\",\"part\":0,\"parts\":1,\"source\":\"s\",\"tools\":["
            ),
            "{text}"
        );
        let Body::Tools(t) = &r.body else { panic!() };
        assert_eq!(t.lease(), Some(1_000));
        let Body::Tools(t) = &samples()[8].body else {
            panic!()
        };
        assert_eq!(t.lease(), Some(crate::limits::DEFAULT_TOOL_LIST_LEASE_MS));
        let Body::Tools(t) = &samples()[0].body else {
            panic!()
        };
        assert_eq!(t.lease(), None);
        // Without either member the bytes are those of a record of before.
        let t0 = String::from_utf8(samples()[0].canonical_bytes().to_vec()).unwrap();
        assert!(t0.contains("\"body\":{\"list_id\":"), "{t0}");
        assert!(!t0.contains("source") && !t0.contains("lease_ms"));

        let cases: Vec<(String, &str)> = vec![
            (text.replace(",\"source\":\"s\"", ""), "invalid_field"),
            (
                text.replace("\"lease_ms\":1000,", "\"lease_ms\":999,"),
                "invalid_field",
            ),
            (
                text.replace("\"lease_ms\":1000,", "\"lease_ms\":86400001,"),
                "invalid_field",
            ),
            (
                text.replace("\"lease_ms\":1000,", "\"lease_ms\":-1,"),
                "schema",
            ),
            (
                text.replace("\"lease_ms\":1000,", "\"lease_ms\":1e3,"),
                "schema",
            ),
            (
                text.replace("\"lease_ms\":1000,", "\"lease_ms\":null,"),
                "schema",
            ),
            // With the lease beside it, the null source is read as no
            // source first: a lease without a source.
            (
                text.replace("\"source\":\"s\"", "\"source\":null"),
                "invalid_field",
            ),
            (
                text.replace("\"lease_ms\":1000,", "")
                    .replace("\"source\":\"s\"", "\"source\":null"),
                "schema",
            ),
            (
                text.replace("\"source\":\"s\"", "\"source\":\"\""),
                "invalid_field",
            ),
            (
                text.replace("\"source\":\"s\"", "\"source\":\"s\\u0007\""),
                "invalid_field",
            ),
            (
                text.replace(
                    "\"source\":\"s\"",
                    &format!("\"source\":\"{}\"", "s".repeat(257)),
                ),
                "invalid_field",
            ),
            (text.replace("\"source\":\"s\"", "\"source\":7"), "schema"),
        ];
        for (bytes, code) in cases {
            assert_ne!(bytes, text);
            assert!(
                Record::from_canonical(bytes.as_bytes()).is_none(),
                "{bytes}"
            );
            let fast = Record::from_json(bytes.as_bytes());
            assert_eq!(fast, strict(bytes.as_bytes()));
            assert_eq!(fast.unwrap_err().code(), code, "{bytes}");
        }
        // 256 bytes is still a source; and a decision's body may not hold one.
        let long = text.replace(
            "\"source\":\"s\"",
            &format!("\"source\":\"{}\"", "s".repeat(256)),
        );
        assert!(Record::from_json(long.as_bytes()).is_ok());
        let d = String::from_utf8(samples()[1].canonical_bytes().to_vec()).unwrap();
        let d = d.replace("\"body\":{", "\"body\":{\"source\":\"s\",");
        assert!(Record::from_canonical(d.as_bytes()).is_none());
        assert_eq!(
            Record::from_json(d.as_bytes()).unwrap_err().code(),
            "schema"
        );
    }

    #[test]
    fn the_record_writer_is_the_general_canonicaliser() {
        for r in samples() {
            let general = canonical::canonicalize(&r).unwrap();
            assert_eq!(
                String::from_utf8(r.canonical_bytes().to_vec()).unwrap(),
                String::from_utf8(general.clone()).unwrap()
            );
            assert_eq!(r.hash(), Hash::sha256(&general));
            assert_eq!(
                r.unsigned().signing_bytes().unwrap(),
                canonical::canonicalize(&r.unsigned().wire(None)).unwrap()
            );
            let mut message = RECORD_SIGNATURE_DOMAIN.to_vec();
            message.extend_from_slice(&r.unsigned().signing_bytes().unwrap());
            assert_eq!(r.signed_message(), message);
        }
    }

    fn strict(bytes: &[u8]) -> Result<Record, RecordError> {
        Record::from_value(canonical::parse_strict(bytes, Limits::WIRE)?)
    }

    #[test]
    fn canonical_input_takes_the_fast_road_to_the_same_record() {
        for r in samples() {
            let bytes = r.canonical_bytes();
            assert_eq!(Record::from_canonical(bytes).as_ref(), Some(&r));
            assert_eq!(strict(bytes).as_ref(), Ok(&r));
            // Other spacing is not canonical: the strict road reads it.
            let pretty = serde_json::to_vec_pretty(&r).unwrap();
            assert!(Record::from_canonical(&pretty).is_none());
            assert_eq!(Record::from_json(&pretty).as_ref(), Ok(&r));
        }
    }

    #[test]
    fn every_refusal_comes_from_the_strict_road_unchanged() {
        let r = &samples()[2];
        let text = String::from_utf8(r.canonical_bytes().to_vec()).unwrap();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (
                text.replace("\"seq\":2,", "\"seq\":2,\"seq\":2,").into(),
                "duplicate_key",
            ),
            (
                text.replace("\"body\":{", "\"body\":{\"status\":\"ok\",")
                    .into(),
                "duplicate_key",
            ),
            (
                text.replace("\"seq\":2,", "\"seq\":9007199254740992,")
                    .into(),
                "integer_out_of_range",
            ),
            (
                text.replace("\"seq\":2,", "\"seq\":2e400,").into(),
                "non_finite_number",
            ),
            (
                text.replace("\"v\":1}", "\"v\":2}").into(),
                "unsupported_version",
            ),
            (text.replace("\"seq\":2,", "\"seq\":2.0,").into(), "schema"),
            (
                text.replace(
                    "\"status\":\"server_exited\"",
                    "\"output_hash\":null,\"status\":\"server_exited\"",
                )
                .into(),
                "duplicate_key",
            ),
            (
                text.replace(",\"output_hash\":", ",\"extra\":1,\"output_hash\":")
                    .into(),
                "schema",
            ),
            (
                {
                    let at = text.find(",\"prev\":").unwrap();
                    format!("{}{}", &text[..at], &text[at + 74..]).into()
                },
                "invalid_field",
            ),
            (
                text.replace("\"call_id\":\"42\"", "\"call_id\":\"\"")
                    .into(),
                "invalid_field",
            ),
            (
                {
                    let mut b = text.clone().into_bytes();
                    let at = text.find("\"42\"").unwrap() + 1;
                    b[at] = 0xff;
                    b
                },
                "invalid_utf8",
            ),
        ];
        for (bytes, code) in cases {
            assert_ne!(bytes, text.as_bytes());
            assert!(
                Record::from_canonical(&bytes).is_none(),
                "{}",
                String::from_utf8_lossy(&bytes)
            );
            let fast = Record::from_json(&bytes);
            assert_eq!(fast, strict(&bytes));
            assert_eq!(
                fast.unwrap_err().code(),
                code,
                "{}",
                String::from_utf8_lossy(&bytes)
            );
        }
        // An explicit null where the writer omits the member, and an omitted
        // prev, are not v1 form.
        let r3 = &samples()[3];
        let t3 = String::from_utf8(r3.canonical_bytes().to_vec()).unwrap();
        let null = t3.replace(",\"status\":", ",\"output_hash\":null,\"status\":");
        assert!(Record::from_canonical(null.as_bytes()).is_none());
        assert_eq!(
            Record::from_json(null.as_bytes()).unwrap_err().code(),
            "schema"
        );
    }

    #[test]
    fn mutated_input_is_never_accepted_by_the_fast_road_alone() {
        // Whatever the fast road accepts, the strict road accepts as the
        // same record: flip, cut and repeat bytes of canonical records.
        let mut fast_hits = 0;
        for r in samples() {
            let base = r.canonical_bytes().to_vec();
            for m in crate::mutate::mutations(&base, 0x9e37_79b9_7f4a_7c15, 3000, 12) {
                if let Some(fast) = Record::from_canonical(&m) {
                    fast_hits += 1;
                    assert_eq!(strict(&m), Ok(fast), "{}", String::from_utf8_lossy(&m));
                }
            }
        }
        // Some mutations (a digit of seq or time, a hex digit) stay
        // canonical and must agree; most do not.
        assert!(fast_hits > 0);
    }
}
