//! Batch admission on the wire, docs/protocol.md §8.1: the request that
//! carries many records in one `POST /v1/records/batch`, and its answer,
//! one item per record in the request's order (a receipt, §8, or a refusal
//! with the status and code the one-record route would give).
//!
//! The request is `{"v":1,"records":[R, …]}` with 1 to
//! [`MAX_BATCH_RECORDS`] records in at most [`MAX_BATCH_BYTES`]. The whole
//! body is parsed strictly (§2): a body that is not strict JSON, or not of
//! that shape, is refused as a whole; a member that is strict JSON but not
//! a valid record is refused alone, in its place of the answer.
//!
//! The answer is `{"v":1,"results":[A, …]}` where each `A` is
//! `{"status":200,"receipt":{…}}` or `{"status":S,"error":{"code",…}}`.

use serde_json::{Map, Value};

use crate::canonical::{self, CanonicalError, Limits};
use crate::entry::Receipt;
use crate::limits::{
    MAX_BATCH_ANSWER_BYTES, MAX_BATCH_BYTES, MAX_BATCH_RECORDS, MAX_DEPTH, MAX_WIRE_OBJECT_BYTES,
};
use crate::record::{Cursor, Record, RecordError};

/// The format version of batch requests and answers.
pub const BATCH_VERSION: u64 = 1;

/// Bytes of a batch request besides its records and their commas:
/// `{"records":[` and `],"v":1}`.
pub const BATCH_REQUEST_OVERHEAD: usize = 20;

/// Bounds of a batch request: a record nests two levels below the top
/// (object, array), and keeps its own [`MAX_DEPTH`].
const REQUEST_LIMITS: Limits = Limits {
    max_bytes: MAX_BATCH_BYTES,
    max_depth: MAX_DEPTH + 2,
};

const ANSWER_LIMITS: Limits = Limits {
    max_bytes: MAX_BATCH_ANSWER_BYTES,
    max_depth: MAX_DEPTH + 3,
};

/// Why a batch request or answer was refused as a whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// Not strict JSON (or over [`MAX_BATCH_BYTES`], or too deep).
    #[error("{0}")]
    Canonical(#[from] CanonicalError),
    /// `v` is an integer other than 1.
    #[error("batch format version {found} is not supported (this build reads version 1)")]
    UnsupportedVersion {
        /// The version as written.
        found: String,
    },
    /// Not an object of the batch shape.
    #[error("{message}")]
    Schema {
        /// What is wrong.
        message: String,
    },
    /// No records.
    #[error("a batch holds at least one record")]
    Empty,
    /// More than [`MAX_BATCH_RECORDS`] records.
    #[error("a batch of {count} records is more than the limit of {max}")]
    TooManyRecords {
        /// Records in the request.
        count: usize,
        /// [`MAX_BATCH_RECORDS`].
        max: usize,
    },
}

fn schema(message: impl Into<String>) -> BatchError {
    BatchError::Schema {
        message: message.into(),
    }
}

/// Takes the members of a `{"v":1,<name>:[…]}` object.
fn members(value: Value, name: &str) -> Result<Vec<Value>, BatchError> {
    let Value::Object(mut obj) = value else {
        return Err(schema("expected a JSON object"));
    };
    match obj.get("v") {
        None => return Err(schema("missing field `v` (the format version)")),
        Some(v) if v.as_u64() == Some(BATCH_VERSION) => {}
        Some(v) if v.as_u64().is_some() => {
            return Err(BatchError::UnsupportedVersion {
                found: v.to_string(),
            })
        }
        Some(v) => {
            return Err(schema(format!(
                "field `v` must be a positive integer, got {v}"
            )))
        }
    }
    if let Some(other) = obj.keys().find(|k| *k != "v" && *k != name) {
        let other: String = other.chars().take(40).collect();
        return Err(schema(format!(
            "unknown field `{other}`, expected `v` or `{name}`"
        )));
    }
    match obj.remove(name) {
        Some(Value::Array(items)) => Ok(items),
        Some(_) => Err(schema(format!("field `{name}` must be an array"))),
        None => Err(schema(format!("missing field `{name}`"))),
    }
}

/// The nesting depth of a JSON value (a scalar is 0, `[]` is 1).
fn depth(value: &Value) -> usize {
    match value {
        Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        Value::Object(o) => 1 + o.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// A parsed batch request: its members in order, each a record or the
/// reason it is not one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchRequest {
    /// The members, in the request's order.
    pub records: Vec<Result<Record, RecordError>>,
}

impl BatchRequest {
    /// Parses a batch request body (any white space; strict JSON rules).
    /// Each member is parsed as [`Record::from_value`] parses a record, and
    /// its canonical form is held to the same limits.
    ///
    /// # Errors
    /// [`BatchError`] for a body refused as a whole; a member that is not a
    /// valid record is an `Err` in [`BatchRequest::records`] instead.
    pub fn parse(bytes: &[u8]) -> Result<Self, BatchError> {
        if let Some(request) = Self::from_canonical(bytes) {
            return Ok(request);
        }
        let value = canonical::parse_strict(bytes, REQUEST_LIMITS)?;
        let items = members(value, "records")?;
        if items.is_empty() {
            return Err(BatchError::Empty);
        }
        if items.len() > MAX_BATCH_RECORDS {
            return Err(BatchError::TooManyRecords {
                count: items.len(),
                max: MAX_BATCH_RECORDS,
            });
        }
        let records = items
            .into_iter()
            .map(|item| {
                if depth(&item) > MAX_DEPTH {
                    return Err(RecordError::Canonical(CanonicalError::TooDeep {
                        max: MAX_DEPTH,
                    }));
                }
                Record::from_value(item)
            })
            .collect();
        Ok(Self { records })
    }

    /// The fast road for a body in canonical layout, as
    /// [`BatchRequest::to_json`] writes it: `{"records":[`, records each
    /// read by the record's fast road (accepted only when its canonical
    /// bytes are the bytes read), `],"v":1}`, nothing else. Such a body is
    /// canonical JSON with 1 to [`MAX_BATCH_RECORDS`] valid records, so the
    /// strict road would accept it and read the same records. `None` sends
    /// any other body (other spacing or order, a member that is not a valid
    /// record, too many) down the strict road, which gives the answers.
    pub(crate) fn from_canonical(bytes: &[u8]) -> Option<Self> {
        if bytes.len() > MAX_BATCH_BYTES {
            return None;
        }
        let mut cursor = Cursor::new(bytes)?;
        cursor.expect(b"{\"records\":[")?;
        // Requests are at most a few hundred records; no growing for those.
        let records = cursor.items(MAX_BATCH_RECORDS.min(bytes.len() / 256 + 1), |c| {
            Record::read_canonical(c).map(Ok)
        })?;
        if records.is_empty() || records.len() > MAX_BATCH_RECORDS {
            return None;
        }
        cursor.expect(b",\"v\":1}")?;
        cursor.at_end().then_some(Self { records })
    }

    /// The request body for `records` (already canonical records, so the
    /// body is canonical JSON too). The caller keeps to
    /// [`MAX_BATCH_RECORDS`] and [`MAX_BATCH_BYTES`]
    /// ([`BatchRequest::encoded_len`]).
    #[must_use]
    pub fn to_json<'a>(records: impl IntoIterator<Item = &'a Record>) -> Vec<u8> {
        let mut out = Vec::with_capacity(4096);
        out.extend_from_slice(b"{\"records\":[");
        for (i, r) in records.into_iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(r.canonical_bytes());
        }
        out.extend_from_slice(b"],\"v\":1}");
        out
    }

    /// The size of [`BatchRequest::to_json`]'s body for records of these
    /// canonical sizes.
    #[must_use]
    pub fn encoded_len(record_sizes: impl IntoIterator<Item = usize>) -> usize {
        let (n, sum) = record_sizes
            .into_iter()
            .fold((0usize, 0usize), |(n, s), len| (n + 1, s + len));
        BATCH_REQUEST_OVERHEAD + sum + n.saturating_sub(1)
    }
}

/// The answer for one record of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOutcome {
    /// Admitted (or an exact resubmission): the receipt's canonical bytes,
    /// the same bytes the one-record route answers with.
    Receipt(Vec<u8>),
    /// Refused: the HTTP status and the error object (`code`, `message`,
    /// evidence) the one-record route would have answered with.
    Refused {
        /// The status.
        status: u16,
        /// The `error` object.
        error: Map<String, Value>,
    },
}

impl BatchOutcome {
    /// The refusal's stable code, if refused.
    #[must_use]
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Receipt(_) => None,
            Self::Refused { error, .. } => error.get("code").and_then(Value::as_str),
        }
    }
}

/// A batch answer: one outcome per record of the request, in its order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchAnswer {
    /// The outcomes.
    pub results: Vec<BatchOutcome>,
}

impl BatchAnswer {
    /// The answer body, canonical JSON (members in RFC 8785 order; each
    /// receipt as given, which is canonical already).
    ///
    /// # Errors
    /// [`CanonicalError`] if an error object does not canonicalise.
    pub fn to_json(&self) -> Result<Vec<u8>, CanonicalError> {
        let mut out = Vec::with_capacity(self.results.len() * 2048 + 32);
        out.extend_from_slice(b"{\"results\":[");
        for (i, r) in self.results.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            match r {
                BatchOutcome::Receipt(receipt) => {
                    out.extend_from_slice(b"{\"receipt\":");
                    out.extend_from_slice(receipt);
                    out.extend_from_slice(b",\"status\":200}");
                }
                BatchOutcome::Refused { status, error } => {
                    out.extend_from_slice(b"{\"error\":");
                    out.extend_from_slice(&canonical::canonicalize(error)?);
                    out.extend_from_slice(format!(",\"status\":{status}}}").as_bytes());
                }
            }
        }
        out.extend_from_slice(b"],\"v\":1}");
        Ok(out)
    }

    /// Parses a batch answer strictly. A receipt is given back as its
    /// canonical bytes (what the witness sent); it is not checked here
    /// (the client accepts it against its record, protocol.md §8).
    ///
    /// # Errors
    /// [`BatchError`] when the answer is not of the batch answer's shape.
    pub fn from_json(bytes: &[u8]) -> Result<Self, BatchError> {
        Self::from_canonical(bytes).map_or_else(|| Self::from_strict(bytes), Ok)
    }

    /// [`BatchAnswer::from_json`] for any layout: strict JSON, then the shape.
    fn from_strict(bytes: &[u8]) -> Result<Self, BatchError> {
        let value = canonical::parse_strict(bytes, ANSWER_LIMITS)?;
        let items = members(value, "results")?;
        let results = items
            .into_iter()
            .enumerate()
            .map(|(i, item)| outcome(item).map_err(|m| schema(format!("results[{i}]: {m}"))))
            .collect::<Result<_, _>>()?;
        Ok(Self { results })
    }

    /// The fast road for an answer in the layout [`BatchAnswer::to_json`]
    /// writes when every record got a receipt: `{"results":[`, then
    /// `{"receipt":R,"status":200}` for each, `],"v":1}`, nothing else,
    /// where each `R` is read by [`Receipt::read_canonical`] (accepted only
    /// when it is canonical), at least one. Such a body is canonical JSON within
    /// [`MAX_BATCH_ANSWER_BYTES`] with receipts within
    /// [`MAX_WIRE_OBJECT_BYTES`], so the strict road would give the same
    /// answer. `None` sends any other body (a refusal among the results,
    /// other spacing or order, an unknown member) down the strict road.
    fn from_canonical(bytes: &[u8]) -> Option<Self> {
        if bytes.len() > MAX_BATCH_ANSWER_BYTES {
            return None;
        }
        let mut cursor = Cursor::new(bytes)?;
        cursor.expect(b"{\"results\":[")?;
        let results = cursor.items(bytes.len() / 1024 + 1, |c| {
            c.expect(b"{\"receipt\":")?;
            let start = c.position();
            Receipt::read_canonical(c)?;
            let receipt = c.since(start);
            c.expect(b",\"status\":200}")?;
            (receipt.len() <= MAX_WIRE_OBJECT_BYTES)
                .then(|| BatchOutcome::Receipt(receipt.to_vec()))
        })?;
        if results.is_empty() {
            return None;
        }
        cursor.expect(b",\"v\":1}")?;
        cursor.at_end().then_some(Self { results })
    }
}

fn outcome(item: Value) -> Result<BatchOutcome, String> {
    let Value::Object(mut obj) = item else {
        return Err("expected an object".into());
    };
    let status = obj
        .remove("status")
        .and_then(|s| s.as_u64())
        .and_then(|s| u16::try_from(s).ok())
        .filter(|s| (100..600).contains(s))
        .ok_or("missing or bad `status`")?;
    let (receipt, error) = (obj.remove("receipt"), obj.remove("error"));
    if !obj.is_empty() {
        return Err("unknown member beside `status`, `receipt`, `error`".into());
    }
    match (status, receipt, error) {
        (200, Some(receipt @ Value::Object(_)), None) => {
            let bytes = canonical::canonicalize(&receipt).map_err(|e| e.to_string())?;
            if bytes.len() > MAX_WIRE_OBJECT_BYTES {
                return Err("receipt is too large".into());
            }
            Ok(BatchOutcome::Receipt(bytes))
        }
        (200, _, _) => Err("status 200 carries a `receipt` object and nothing else".into()),
        (status, None, Some(Value::Object(error)))
            if error.get("code").is_some_and(Value::is_string) =>
        {
            Ok(BatchOutcome::Refused { status, error })
        }
        _ => Err("a refusal carries an `error` object with a `code` and no receipt".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::NoteBody;
    use crate::{AgentName, Body, Nonce, SecretKey, Seq, UnixMillis, UnsignedRecord};

    fn record(n: u64) -> Record {
        let key = SecretKey::from_seed(&[3; 32]);
        UnsignedRecord {
            agent: AgentName::new(&format!("batch-bot-{n}")).unwrap(),
            key_id: key.public_key().key_id(),
            seq: Seq::GENESIS,
            prev: None,
            time: UnixMillis::new(1_796_025_600_000),
            nonce: Nonce::from_bytes(vec![n as u8; 16]).unwrap(),
            body: Body::Note(NoteBody {
                text: format!("n{n}"),
            }),
        }
        .sign(&key)
        .unwrap()
    }

    #[test]
    fn a_request_round_trips_and_its_length_is_predicted() {
        let rs: Vec<Record> = (0..3).map(record).collect();
        let body = BatchRequest::to_json(&rs);
        assert_eq!(
            body.len(),
            BatchRequest::encoded_len(rs.iter().map(|r| r.canonical_bytes().len()))
        );
        assert_eq!(
            canonical::canonicalize_bytes(&body, REQUEST_LIMITS).unwrap(),
            body
        );
        let parsed = BatchRequest::parse(&body).unwrap();
        let back: Vec<Record> = parsed.records.into_iter().map(Result::unwrap).collect();
        assert_eq!(back, rs);
    }

    #[test]
    fn the_fast_road_reads_what_the_strict_road_reads_and_nothing_else() {
        let rs: Vec<Record> = (0..5).map(record).collect();
        let body = BatchRequest::to_json(&rs);
        let fast =
            BatchRequest::from_canonical(&body).expect("a canonical body takes the fast road");
        // The same body with one space is read by the strict road alone.
        let spaced = [b"{ ".as_slice(), &body[1..]].concat();
        assert!(BatchRequest::from_canonical(&spaced).is_none());
        let strict = BatchRequest::parse(&spaced).unwrap();
        assert_eq!(fast, strict);
        assert_eq!(BatchRequest::parse(&body).unwrap(), strict);

        // Anything but the exact layout goes the strict road, which answers.
        let good = String::from_utf8(rs[0].canonical_bytes().to_vec()).unwrap();
        let other_layouts = [
            format!("{{\"records\":[{good}],\"v\":2}}"),
            format!("{{\"records\":[{good}],\"v\":1}} "),
            format!("{{\"records\":[{good},7],\"v\":1}}"),
            format!("{{\"records\":[{good} ],\"v\":1}}"),
            format!("{{\"records\":[{}],\"v\":1}}", good.replacen(':', ": ", 1)),
            "{\"records\":[],\"v\":1}".to_owned(),
        ];
        for text in &other_layouts {
            assert!(
                BatchRequest::from_canonical(text.as_bytes()).is_none(),
                "{text}"
            );
        }
        // A duplicate member is still read twice (the log refuses the
        // second); the strict road reads it the same way.
        let twice = BatchRequest::to_json([&rs[0], &rs[0]]);
        assert_eq!(
            BatchRequest::from_canonical(&twice).unwrap(),
            BatchRequest::parse(&[b"{ ".as_slice(), &twice[1..]].concat()).unwrap()
        );

        // The count limit holds on both roads.
        let max: Vec<Record> = (0..MAX_BATCH_RECORDS as u64).map(record).collect();
        let body = BatchRequest::to_json(&max);
        assert_eq!(
            BatchRequest::from_canonical(&body).unwrap().records.len(),
            MAX_BATCH_RECORDS
        );
        let over = BatchRequest::to_json(max.iter().chain([&rs[0]]));
        assert!(BatchRequest::from_canonical(&over).is_none());
        assert!(matches!(
            BatchRequest::parse(&over),
            Err(BatchError::TooManyRecords { count: 257, .. })
        ));
    }

    #[test]
    fn whole_body_refusals_and_member_refusals_are_told_apart() {
        assert!(matches!(
            BatchRequest::parse(b"{\"v\":1,\"records\":[]}"),
            Err(BatchError::Empty)
        ));
        assert!(matches!(
            BatchRequest::parse(b"{\"v\":2,\"records\":[1]}"),
            Err(BatchError::UnsupportedVersion { .. })
        ));
        assert!(matches!(
            BatchRequest::parse(b"{\"v\":1,\"records\":[],\"x\":1}"),
            Err(BatchError::Schema { .. })
        ));
        assert!(matches!(
            BatchRequest::parse(b"{\"v\":1,\"v\":1,\"records\":[]}"),
            Err(BatchError::Canonical(_))
        ));
        let many = format!(
            "{{\"v\":1,\"records\":[{}1]}}",
            "1,".repeat(MAX_BATCH_RECORDS)
        );
        assert!(matches!(
            BatchRequest::parse(many.as_bytes()),
            Err(BatchError::TooManyRecords { count: 257, .. })
        ));
        let good = String::from_utf8(record(0).canonical_bytes().to_vec()).unwrap();
        let body = format!("{{\"v\":1,\"records\":[{good},{{\"v\":1}},7]}}");
        let parsed = BatchRequest::parse(body.as_bytes()).unwrap();
        assert!(parsed.records[0].is_ok());
        assert!(parsed.records[1].is_err());
        assert!(parsed.records[2].is_err());
    }

    #[test]
    fn an_answer_round_trips() {
        let mut error = Map::new();
        error.insert("code".into(), Value::from("chain_conflict"));
        error.insert("message".into(), Value::from("m"));
        let answer = BatchAnswer {
            results: vec![
                BatchOutcome::Receipt(b"{\"a\":1}".to_vec()),
                BatchOutcome::Refused { status: 409, error },
            ],
        };
        let bytes = answer.to_json().unwrap();
        assert_eq!(BatchAnswer::from_json(&bytes).unwrap(), answer);
        assert_eq!(answer.results[1].code(), Some("chain_conflict"));
        assert!(BatchAnswer::from_json(b"{\"v\":1,\"results\":[{\"status\":200}]}").is_err());
    }

    /// Receipts as the witness writes them, with notes that need escapes
    /// and proofs of 0 to 63 hashes.
    fn receipts() -> Vec<crate::entry::Receipt> {
        let controls: String = (0u8..0x20).map(char::from).collect();
        let notes = [
            "example.org/log\n3\nAAAA\n\n\u{2014} example.org/log abc=\n".to_owned(),
            format!("{controls}\"\\/\u{7f}\u{e9}\u{2028}\u{1F600}\u{FEFF}"),
            String::new(),
        ];
        notes
            .into_iter()
            .zip([(0u64, 0usize), (5, 3), (9_007_199_254_740_991, 63)])
            .map(|(checkpoint, (index, proof))| crate::entry::Receipt {
                v: 1,
                record_hash: crate::Hash::sha256(checkpoint.as_bytes()),
                nonce: record(0).nonce.clone(),
                index: crate::tree::LeafIndex::new(index),
                received: crate::UnixMillis::new(1_796_025_600_123),
                inclusion: (0..proof)
                    .map(|i| crate::Hash::sha256(&[u8::try_from(i).unwrap()]))
                    .collect(),
                checkpoint,
            })
            .collect()
    }

    #[test]
    fn an_answer_of_receipts_takes_the_fast_road_to_the_strict_roads_answer() {
        let answer = BatchAnswer {
            results: receipts()
                .iter()
                .map(|r| BatchOutcome::Receipt(r.to_canonical_json().unwrap()))
                .collect(),
        };
        let bytes = answer.to_json().unwrap();
        assert_eq!(BatchAnswer::from_canonical(&bytes), Some(answer.clone()));
        assert_eq!(BatchAnswer::from_strict(&bytes), Ok(answer.clone()));
        assert_eq!(BatchAnswer::from_json(&bytes), Ok(answer));
    }

    #[test]
    fn the_fast_road_answers_as_the_strict_road_or_not_at_all() {
        let two: Vec<Vec<u8>> = receipts()
            .into_iter()
            .filter(|r| r.inclusion.len() < 10)
            .map(|r| r.to_canonical_json().unwrap())
            .collect();
        let body = BatchAnswer {
            results: two.into_iter().map(BatchOutcome::Receipt).collect(),
        }
        .to_json()
        .unwrap();
        let text = String::from_utf8(body.clone()).unwrap();
        // Whole-body variants the fast road must leave to the strict road.
        let left = [
            text.replacen("{\"results\"", "{ \"results\"", 1),
            text.replacen("],\"v\":1}", "],\"v\":2}", 1),
            text.replacen(",\"status\":200}", ",\"status\":201}", 1),
            text.replacen("\"v\":1},", "\"v\":1,\"x\":0},", 1),
            text.replacen("{\"checkpoint\":", "{\"a\":0,\"checkpoint\":", 1),
            text.replacen("\\u0001", "\\u0001\\ud83d", 1),
            format!("{text} "),
            "{\"results\":[],\"v\":1}".to_owned(),
            text.replacen(
                "],\"v\":1}",
                ",{\"error\":{\"code\":\"chain_conflict\"},\"status\":409}],\"v\":1}",
                1,
            ),
        ];
        for variant in &left {
            assert_ne!(variant, &text);
            assert_eq!(
                BatchAnswer::from_canonical(variant.as_bytes()),
                None,
                "{variant}"
            );
        }
        // Every byte changed to a few others: whatever the fast road reads,
        // the strict road reads the same.
        let mut fast = 0;
        for i in 0..body.len() {
            for b in [b' ', b'0', b'A', b'a', b'"', b'\\', b'}', b'f'] {
                let mut m = body.clone();
                m[i] = b;
                if let Some(answer) = BatchAnswer::from_canonical(&m) {
                    assert_eq!(BatchAnswer::from_strict(&m), Ok(answer), "byte {i} to {b}");
                    fast += 1;
                }
            }
        }
        // Hex digits and the note's letters change into other valid ones.
        assert!(fast > 100, "only {fast} mutated bodies took the fast road");
    }
}
