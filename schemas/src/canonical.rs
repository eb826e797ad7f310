//! Strict JSON parsing and RFC 8785 (JCS) canonicalisation, docs/protocol.md §2.
//!
//! Everything tally hashes or signs is the JCS form of a JSON value. Parsing is
//! stricter than RFC 8259 so that one value has one meaning: invalid UTF-8,
//! duplicate object keys, integer literals beyond ±(2^53−1) and numbers that
//! are not finite doubles are refused, never repaired or rounded. Size and depth
//! are checked on the raw bytes before any decoding.

use std::collections::btree_map::Entry;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Serialize;
use serde_json::{Map, Value};

pub use crate::limits::MAX_SAFE_INTEGER;

/// Bounds checked before a document is decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Maximum size of the document in bytes.
    pub max_bytes: usize,
    /// Maximum nesting of arrays and objects; the top-level value is depth 1.
    pub max_depth: usize,
}

impl Limits {
    /// Limits for tally's own wire objects (records, entries, receipts, pack lines).
    pub const WIRE: Self = Self {
        max_bytes: crate::limits::MAX_WIRE_OBJECT_BYTES,
        max_depth: crate::limits::MAX_DEPTH,
    };
    /// Limits for a pack's header line, which lists every agent of the pack.
    pub const PACK_HEADER: Self = Self {
        max_bytes: crate::limits::MAX_PACK_HEADER_BYTES,
        max_depth: crate::limits::MAX_DEPTH,
    };
    /// Limits for agent-keys.json.
    pub const AGENT_KEYS: Self = Self {
        max_bytes: crate::limits::MAX_AGENT_KEYS_BYTES,
        max_depth: crate::limits::MAX_DEPTH,
    };
    /// Limits for head.json.
    pub const HEAD: Self = Self {
        max_bytes: crate::limits::MAX_HEAD_BYTES,
        max_depth: crate::limits::MAX_DEPTH,
    };
}

/// Why a document was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CanonicalError {
    /// The document is larger than allowed.
    #[error("document is {size} bytes, more than the limit of {max}")]
    TooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// Arrays and objects nest deeper than allowed.
    #[error("document nests deeper than {max} levels")]
    TooDeep {
        /// The limit.
        max: usize,
    },
    /// The bytes are not UTF-8.
    #[error("document is not valid UTF-8 (at byte {offset})")]
    InvalidUtf8 {
        /// Offset of the first bad byte.
        offset: usize,
    },
    /// An object names the same key twice.
    #[error("duplicate object key {key:?}")]
    DuplicateKey {
        /// The repeated key.
        key: String,
    },
    /// An integer literal outside ±(2^53−1), which a double cannot hold exactly.
    #[error("integer {literal} is beyond ±2^53-1 and cannot be represented exactly")]
    IntegerOutOfRange {
        /// The literal as written, cut to 40 characters.
        literal: String,
    },
    /// A number that is not a finite double.
    #[error("number is not a finite double")]
    NonFinite,
    /// Not JSON.
    #[error("malformed JSON at line {line} column {column}: {message}")]
    Syntax {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What the parser said.
        message: String,
    },
}

impl CanonicalError {
    /// A stable, snake_case code for this error, used in API error bodies.
    #[must_use]
    pub const fn code(&self) -> &'static str {
        match self {
            Self::TooLarge { .. } => "too_large",
            Self::TooDeep { .. } => "too_deep",
            Self::InvalidUtf8 { .. } => "invalid_utf8",
            Self::DuplicateKey { .. } => "duplicate_key",
            Self::IntegerOutOfRange { .. } => "integer_out_of_range",
            Self::NonFinite => "non_finite_number",
            Self::Syntax { .. } => "malformed_json",
        }
    }
}

const DUPLICATE_KEY_MARK: &str = "\u{1}duplicate key:";

/// Parses `bytes` as one JSON value under tally's strict rules.
///
/// # Errors
/// A [`CanonicalError`] naming the first rule the document breaks.
pub fn parse_strict(bytes: &[u8], limits: Limits) -> Result<Value, CanonicalError> {
    if bytes.len() > limits.max_bytes {
        return Err(CanonicalError::TooLarge {
            size: bytes.len(),
            max: limits.max_bytes,
        });
    }
    let text = std::str::from_utf8(bytes).map_err(|e| CanonicalError::InvalidUtf8 {
        offset: e.valid_up_to(),
    })?;
    let negative_zeros = prescan(text.as_bytes(), limits.max_depth)?;
    // The integer literal `-0` is the integer 0 (§2; JCS writes it `0`).
    // serde_json would read it as the double -0.0, which no integer field
    // takes, so each one's sign becomes a space: insignificant white space
    // where it stands.
    let unsigned;
    let text = if negative_zeros.is_empty() {
        text
    } else {
        let mut bytes = text.as_bytes().to_vec();
        for at in negative_zeros {
            bytes[at] = b' ';
        }
        unsigned = String::from_utf8(bytes).map_err(|e| CanonicalError::InvalidUtf8 {
            offset: e.utf8_error().valid_up_to(),
        })?;
        &unsigned
    };
    let mut de = serde_json::Deserializer::from_str(text);
    // Depth is bounded by the prescan, so serde_json's own recursion guard is
    // never the one that fires.
    let value = StrictValue::deserialize(&mut de).map_err(classify)?;
    de.end().map_err(classify)?;
    Ok(value.0)
}

/// The RFC 8785 canonical bytes of any serialisable value.
///
/// # Errors
/// [`CanonicalError::IntegerOutOfRange`] or [`CanonicalError::NonFinite`] for
/// numbers JCS cannot represent exactly.
pub fn canonicalize<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CanonicalError> {
    let bytes = json_canon::to_vec(value).map_err(|e| {
        let message = e.to_string();
        if message.contains("NaN") || message.contains("Infinit") {
            CanonicalError::NonFinite
        } else {
            CanonicalError::IntegerOutOfRange {
                literal: message.chars().take(40).collect(),
            }
        }
    })?;
    // A double such as 8.2e16 is written by JCS as the integer literal
    // 82000000000000000, which the parser refuses; refuse it here too, so
    // that canonical output always parses back.
    prescan(&bytes, usize::MAX)?;
    Ok(bytes)
}

/// Parses strictly, then canonicalises: the JCS bytes of a document.
///
/// # Errors
/// As [`parse_strict`] and [`canonicalize`].
pub fn canonicalize_bytes(bytes: &[u8], limits: Limits) -> Result<Vec<u8>, CanonicalError> {
    canonicalize(&parse_strict(bytes, limits)?)
}

fn classify(e: serde_json::Error) -> CanonicalError {
    let message = e.to_string();
    if let Some(rest) = message.strip_prefix(DUPLICATE_KEY_MARK) {
        let key = rest.split(" at line ").next().unwrap_or(rest).to_owned();
        return CanonicalError::DuplicateKey { key };
    }
    if message.starts_with("number out of range") {
        return CanonicalError::NonFinite;
    }
    CanonicalError::Syntax {
        line: e.line(),
        column: e.column(),
        message: message
            .split(" at line ")
            .next()
            .unwrap_or(&message)
            .to_owned(),
    }
}

/// One pass over the raw text outside strings: nesting depth and the
/// magnitude of integer literals. Malformed JSON is left for the parser.
/// Returns where the integer literals `-0` stand (the offsets of their `-`).
fn prescan(b: &[u8], max_depth: usize) -> Result<Vec<usize>, CanonicalError> {
    let mut negative_zeros = Vec::new();
    let mut depth = 0usize;
    let mut i = 0usize;
    while i < b.len() {
        match b[i] {
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'{' | b'[' => {
                depth += 1;
                if depth > max_depth {
                    return Err(CanonicalError::TooDeep { max: max_depth });
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i + 1 < b.len()
                    && matches!(b[i + 1], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    i += 1;
                }
                let literal = &b[start..=i];
                check_integer_literal(literal)?;
                if literal == b"-0" {
                    negative_zeros.push(start);
                }
            }
            _ => {}
        }
        i += 1;
    }
    Ok(negative_zeros)
}

/// Refuses an integer literal (no fraction, no exponent) beyond ±(2^53−1):
/// a double cannot hold every such integer, so `9007199254740993` would
/// silently become `9007199254740992`. Run on input, and on canonical output,
/// where JCS writes integral doubles below 10^21 as integer literals.
///
/// A literal with a fraction or exponent is refused when its double is
/// integral and its canonical form would be such an integer literal
/// (2^53 ≤ |v| < 10^21: `1e20`, `9007199254740992.0`), as §2 says; it
/// breaks a rule of §2 as much as `9007199254740992` does, so it is refused
/// where that is, when parsing.
fn check_integer_literal(lit: &[u8]) -> Result<(), CanonicalError> {
    if lit.iter().any(|c| matches!(c, b'.' | b'e' | b'E')) {
        // 2^53 as a double; JCS writes integral doubles below 10^21
        // without an exponent.
        const TWO_53: f64 = 9_007_199_254_740_992.0;
        let v = std::str::from_utf8(lit)
            .ok()
            .and_then(|t| t.parse::<f64>().ok())
            .map_or(0.0, f64::abs);
        if v.is_finite() && v.fract() == 0.0 && (TWO_53..1e21).contains(&v) {
            return Err(CanonicalError::IntegerOutOfRange {
                literal: String::from_utf8_lossy(lit).chars().take(40).collect(),
            });
        }
        return Ok(());
    }
    let digits = lit.strip_prefix(b"-").unwrap_or(lit);
    let too_big = digits.len() > 16
        || std::str::from_utf8(digits)
            .ok()
            .and_then(|d| d.parse::<u64>().ok())
            .is_some_and(|n| n > MAX_SAFE_INTEGER);
    if too_big {
        return Err(CanonicalError::IntegerOutOfRange {
            literal: String::from_utf8_lossy(lit).chars().take(40).collect(),
        });
    }
    Ok(())
}

/// A `serde_json::Value` whose objects were checked for duplicate keys.
struct StrictValue(Value);

impl<'de> Deserialize<'de> for StrictValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = StrictValue;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<StrictValue, E> {
        Ok(StrictValue(Value::Bool(v)))
    }

    fn visit_i64<E>(self, v: i64) -> Result<StrictValue, E> {
        Ok(StrictValue(Value::from(v)))
    }

    fn visit_u64<E>(self, v: u64) -> Result<StrictValue, E> {
        Ok(StrictValue(Value::from(v)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<StrictValue, E> {
        serde_json::Number::from_f64(v)
            .map(|n| StrictValue(Value::Number(n)))
            .ok_or_else(|| E::custom("number out of range"))
    }

    fn visit_str<E>(self, v: &str) -> Result<StrictValue, E> {
        Ok(StrictValue(Value::String(v.to_owned())))
    }

    fn visit_string<E>(self, v: String) -> Result<StrictValue, E> {
        Ok(StrictValue(Value::String(v)))
    }

    fn visit_unit<E>(self) -> Result<StrictValue, E> {
        Ok(StrictValue(Value::Null))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<StrictValue, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(StrictValue(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(StrictValue(Value::Array(out)))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<StrictValue, A::Error> {
        let mut seen = std::collections::BTreeMap::new();
        while let Some(key) = map.next_key::<String>()? {
            match seen.entry(key) {
                Entry::Occupied(e) => {
                    return Err(de::Error::custom(format!(
                        "{DUPLICATE_KEY_MARK}{}",
                        e.key()
                    )));
                }
                Entry::Vacant(slot) => {
                    let StrictValue(v) = map.next_value()?;
                    slot.insert(v);
                }
            }
        }
        Ok(StrictValue(Value::Object(
            seen.into_iter().collect::<Map<_, _>>(),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lim() -> Limits {
        Limits {
            max_bytes: 1 << 20,
            max_depth: 64,
        }
    }

    #[test]
    fn refuses_what_could_be_read_two_ways() {
        assert_eq!(
            parse_strict(br#"{"a":1,"a":2}"#, lim()),
            Err(CanonicalError::DuplicateKey { key: "a".into() })
        );
        assert!(matches!(
            parse_strict(br#"{"n":9007199254740992}"#, lim()),
            Err(CanonicalError::IntegerOutOfRange { .. })
        ));
        assert!(matches!(
            parse_strict(b"-1152921504606846976", lim()),
            Err(CanonicalError::IntegerOutOfRange { .. })
        ));
        assert!(parse_strict(b"9007199254740991", lim()).is_ok());
        assert!(parse_strict(b"-9007199254740991", lim()).is_ok());
        assert_eq!(
            parse_strict(b"1e400", lim()),
            Err(CanonicalError::NonFinite)
        );
        assert_eq!(
            parse_strict(b"\"\xff\"", lim()),
            Err(CanonicalError::InvalidUtf8 { offset: 1 })
        );
        assert!(matches!(
            parse_strict(br#"{"a":1"#, lim()),
            Err(CanonicalError::Syntax { .. })
        ));
        assert!(matches!(
            parse_strict(br#"{"a":1} x"#, lim()),
            Err(CanonicalError::Syntax { .. })
        ));
    }

    #[test]
    fn a_number_whose_canonical_form_is_too_large_an_integer_is_refused_when_parsed() {
        for lit in [
            "1e20",
            "-1e20",
            "9007199254740992.0",
            "9.007199254740992e15",
            "1E20",
        ] {
            let doc = format!(r#"{{"unknown":{lit}}}"#);
            assert!(
                matches!(
                    parse_strict(doc.as_bytes(), lim()),
                    Err(CanonicalError::IntegerOutOfRange { .. })
                ),
                "{lit}"
            );
        }
        // Below 2^53, not integral, or written with an exponent by JCS: kept.
        for lit in [
            "9007199254740991.0",
            "1e15",
            "0.5",
            "1e21",
            "1e30",
            "-1e300",
            "1.5e15",
        ] {
            assert!(parse_strict(lit.as_bytes(), lim()).is_ok(), "{lit}");
        }
    }

    #[test]
    fn the_integer_literal_minus_zero_is_the_integer_zero() {
        // Where an integer is expected, `-0` reads as 0; `-0.0` is a double.
        let v = parse_strict(br#"{"a":-0,"b":[-0],"c":-0.0,"d":"-0","e":-0e0}"#, lim()).unwrap();
        assert_eq!(v["a"].as_u64(), Some(0));
        assert_eq!(v["b"][0].as_u64(), Some(0));
        assert_eq!(v["c"].as_u64(), None);
        assert_eq!(v["d"], "-0");
        assert_eq!(v["e"].as_u64(), None);
        assert_eq!(
            canonicalize(&v).unwrap(),
            br#"{"a":0,"b":[0],"c":0,"d":"-0","e":0}"#
        );
        assert_eq!(parse_strict(b"-0", lim()).unwrap().as_u64(), Some(0));
        assert!(parse_strict(b"-", lim()).is_err());
        assert!(parse_strict(b"-00", lim()).is_err());
    }

    #[test]
    fn bounds_are_checked_before_decoding() {
        let deep = "[".repeat(10_000) + &"]".repeat(10_000);
        assert_eq!(
            parse_strict(deep.as_bytes(), lim()),
            Err(CanonicalError::TooDeep { max: 64 })
        );
        let big = vec![b' '; (1 << 20) + 1];
        assert!(matches!(
            parse_strict(&big, lim()),
            Err(CanonicalError::TooLarge { .. })
        ));
        // Brackets and digits inside strings are text, not structure.
        let s = format!("\"{}{}\"", "[".repeat(100), "99999999999999999999");
        assert!(parse_strict(s.as_bytes(), lim()).is_ok());
    }

    #[test]
    fn canonical_form_sorts_keys_and_formats_numbers() {
        let v = parse_strict(br#"{"b":[1.0,2e1,-0],"a":"\u00e9"}"#, lim()).unwrap();
        assert_eq!(
            String::from_utf8(canonicalize(&v).unwrap()).unwrap(),
            "{\"a\":\"\u{e9}\",\"b\":[1,20,0]}"
        );
    }
}
