//! The canonical writer of records: `JCS(record)` for this one fixed shape,
//! docs/protocol.md §2 and §3 (RFC 8785).

use super::{Body, RecordError, ToolEntry, UnsignedRecord};
use crate::keys::Signature;
use crate::limits::MAX_COUNTER;
use crate::time::UnixMillis;

use crate::hash::HEX_DIGITS;

/// Appends `text` as a JSON string in RFC 8785 form (§3.2.2.2): `"` and `\`
/// escaped, U+0008, U+0009, U+000A, U+000C and U+000D as `\b \t \n \f \r`,
/// the other controls below U+0020 as `\u00xx` in lowercase hex, and every
/// other character as itself.
pub(crate) fn put_str(out: &mut Vec<u8>, text: &str) {
    let bytes = text.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut run = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x09 => b"\\t",
            0x0a => b"\\n",
            0x0c => b"\\f",
            0x0d => b"\\r",
            0x00..=0x1f => &[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX_DIGITS[usize::from(b >> 4)],
                HEX_DIGITS[usize::from(b & 0x0f)],
            ],
            _ => continue,
        };
        out.extend_from_slice(&bytes[run..i]);
        out.extend_from_slice(short);
        run = i + 1;
    }
    out.extend_from_slice(&bytes[run..]);
    out.push(b'"');
}

/// Appends `bytes` as a JSON string of lowercase hex.
pub(crate) fn put_hex(out: &mut Vec<u8>, bytes: &[u8]) {
    let start = out.len();
    out.resize(start + 2 * bytes.len() + 2, b'"');
    let digits = &mut out[start + 1..start + 1 + 2 * bytes.len()];
    for (pair, &b) in digits.chunks_exact_mut(2).zip(bytes) {
        pair[0] = HEX_DIGITS[usize::from(b >> 4)];
        pair[1] = HEX_DIGITS[usize::from(b & 0x0f)];
    }
}

/// Appends `hashes` as a JSON array of lowercase hex strings (an inclusion
/// proof's form in receipts and pack lines).
pub(crate) fn put_hashes(out: &mut Vec<u8>, hashes: &[crate::Hash]) {
    out.push(b'[');
    for (i, h) in hashes.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        put_hex(out, h.as_bytes());
    }
    out.push(b']');
}

/// Appends a counter as a JSON integer; `None` above 2^53 − 1, which tally's
/// JSON refuses (§2), so nothing beyond it is ever written.
pub(crate) fn put_counter(out: &mut Vec<u8>, n: u64) -> Option<()> {
    if n > MAX_COUNTER {
        return None;
    }
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = n;
    loop {
        at -= 1;
        // `rest % 10` is below 10, so the cast keeps it.
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
    Some(())
}

/// Appends a time in its one wire spelling (it needs no escaping); `None`
/// for a time outside the wire range.
pub(crate) fn put_time(out: &mut Vec<u8>, time: UnixMillis) -> Option<()> {
    let text = time.rfc3339_bytes().ok()?;
    out.push(b'"');
    out.extend_from_slice(&text);
    out.push(b'"');
    Some(())
}

/// Appends a key or signature (at most 64 bytes) as canonical standard
/// base64 with padding.
fn put_base64(out: &mut Vec<u8>, bytes: &[u8]) {
    use base64::Engine as _;
    let mut text = [0u8; 88];
    out.push(b'"');
    match base64::engine::general_purpose::STANDARD.encode_slice(bytes, &mut text) {
        Ok(n) => out.extend_from_slice(&text[..n]),
        // Longer input than any key or signature: the allocating encoder.
        Err(_) => out.extend_from_slice(
            base64::engine::general_purpose::STANDARD
                .encode(bytes)
                .as_bytes(),
        ),
    }
    out.push(b'"');
}

fn put_u32(out: &mut Vec<u8>, n: u32) {
    // A u32 is always below 2^53.
    let _ = put_counter(out, u64::from(n));
}

fn write_tool(out: &mut Vec<u8>, tool: &ToolEntry) {
    out.extend_from_slice(b"{\"digest\":");
    put_hex(out, tool.digest.as_bytes());
    out.extend_from_slice(b",\"name\":");
    put_str(out, &tool.name);
    out.extend_from_slice(b",\"parts\":{");
    let p = &tool.parts;
    let parts = [
        ("annotations", p.annotations),
        ("description", p.description),
        ("input_schema", p.input_schema),
        ("meta", p.meta),
        ("output_schema", p.output_schema),
        ("title", p.title),
    ];
    let mut first = true;
    for (name, digest) in parts {
        if let Some(d) = digest {
            if !first {
                out.push(b',');
            }
            first = false;
            put_str(out, name);
            out.push(b':');
            put_hex(out, d.as_bytes());
        }
    }
    out.extend_from_slice(b"},\"recorded\":");
    out.extend_from_slice(if tool.recorded { b"true" } else { b"false" });
    out.push(b'}');
}

fn write_body(out: &mut Vec<u8>, body: &Body) -> Result<(), RecordError> {
    match body {
        Body::Decision(d) => {
            out.extend_from_slice(b"{\"call_id\":");
            put_str(out, &d.call_id);
            out.extend_from_slice(b",\"input_hash\":");
            put_hex(out, d.input_hash.as_bytes());
            out.extend_from_slice(b",\"tool\":");
            put_str(out, &d.tool);
        }
        Body::Outcome(o) => {
            out.extend_from_slice(b"{\"call_id\":");
            put_str(out, &o.call_id);
            out.extend_from_slice(b",\"decision\":");
            put_hex(out, o.decision.as_bytes());
            if let Some(h) = &o.output_hash {
                out.extend_from_slice(b",\"output_hash\":");
                put_hex(out, h.as_bytes());
            }
            if let Some(p) = &o.proof {
                out.extend_from_slice(b",\"proof\":");
                put_str(out, p);
            }
            if let Some(h) = &o.proof_hash {
                out.extend_from_slice(b",\"proof_hash\":");
                put_hex(out, h.as_bytes());
            }
            if let Some(state) = o.state {
                out.extend_from_slice(b",\"state\":");
                put_str(out, state.as_str());
            }
            out.extend_from_slice(b",\"status\":");
            put_str(out, o.status.as_str());
        }
        Body::Tools(t) => {
            out.push(b'{');
            if let Some(lease) = t.lease_ms {
                out.extend_from_slice(b"\"lease_ms\":");
                // Only a record built in code, not parsed, can hold a
                // lease beyond 2^53 − 1, which no JSON of tally's holds.
                put_counter(out, lease).ok_or_else(|| RecordError::Invalid {
                    field: "body.lease_ms",
                    reason: format!("{lease} is beyond 2^53 - 1"),
                })?;
                out.push(b',');
            }
            out.extend_from_slice(b"\"list_id\":");
            put_str(out, &t.list_id);
            out.extend_from_slice(b",\"part\":");
            put_u32(out, t.part);
            out.extend_from_slice(b",\"parts\":");
            put_u32(out, t.parts);
            if let Some(source) = &t.source {
                out.extend_from_slice(b",\"source\":");
                put_str(out, source);
            }
            out.extend_from_slice(b",\"tools\":[");
            for (i, tool) in t.tools.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_tool(out, tool);
            }
            out.push(b']');
        }
        Body::Note(n) => {
            out.extend_from_slice(b"{\"text\":");
            put_str(out, &n.text);
        }
        Body::Claim(c) => {
            out.extend_from_slice(b"{\"tool\":");
            put_str(out, &c.tool);
            out.extend_from_slice(b",\"turn_hash\":");
            put_hex(out, c.turn_hash.as_bytes());
        }
        Body::ToolCheck(c) => {
            // Rare records: the general canonicaliser, without its closing
            // brace (added below with the others').
            let bytes = crate::canonical::canonicalize(c).map_err(|e| RecordError::Invalid {
                field: "body",
                reason: e.to_string(),
            })?;
            out.extend_from_slice(&bytes[..bytes.len() - 1]);
        }
        Body::KeyRotation(k) => {
            out.extend_from_slice(b"{\"new_key_id\":");
            put_str(out, &k.new_key_id.to_hex());
            out.extend_from_slice(b",\"new_public_key\":");
            put_base64(out, &k.new_public_key.to_bytes());
        }
    }
    out.push(b'}');
    Ok(())
}

/// Appends `JCS(record)`, or `JCS(record without "sig")` when `sig` is
/// `None`: the members in RFC 8785 order (all names are ASCII, so UTF-16
/// order is byte order), the numbers all counters below 2^53. Returns where
/// in `out` the `,"sig":"…"` member went (an empty range where it would go
/// when `sig` is `None`): every other byte is written the same with or
/// without it, so cutting that range out of `JCS(record)` gives
/// `JCS(record without "sig")`.
///
/// # Errors
/// [`RecordError::Invalid`] for a time outside the wire range or a `lease_ms`
/// beyond 2^53 − 1 (only a record built in code, not parsed, can hold one).
pub(super) fn write_canonical(
    u: &UnsignedRecord,
    sig: Option<&Signature>,
    out: &mut Vec<u8>,
) -> Result<std::ops::Range<usize>, RecordError> {
    out.extend_from_slice(b"{\"agent\":");
    put_str(out, u.agent.as_str());
    out.extend_from_slice(b",\"body\":");
    write_body(out, &u.body)?;
    out.extend_from_slice(b",\"key_id\":");
    put_str(out, &u.key_id.to_hex());
    out.extend_from_slice(b",\"kind\":");
    put_str(out, u.body.kind().as_str());
    out.extend_from_slice(b",\"nonce\":");
    put_hex(out, u.nonce.as_bytes());
    out.extend_from_slice(b",\"prev\":");
    match &u.prev {
        Some(h) => put_hex(out, h.as_bytes()),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"seq\":");
    // A `Seq` is at most 2^53 − 1 by construction.
    let _ = put_counter(out, u.seq.get());
    let sig_start = out.len();
    if let Some(sig) = sig {
        out.extend_from_slice(b",\"sig\":");
        put_base64(out, sig.as_bytes());
    }
    let sig_member = sig_start..out.len();
    out.extend_from_slice(b",\"time\":");
    put_time(out, u.time).ok_or_else(|| RecordError::Invalid {
        field: "time",
        reason: format!("{} is outside the years 1970-9999", u.time),
    })?;
    out.extend_from_slice(b",\"v\":1}");
    Ok(sig_member)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canonical;

    #[test]
    fn strings_are_escaped_as_rfc8785_says() {
        let mut texts: Vec<String> = (0u32..0x80)
            .filter_map(char::from_u32)
            .map(|c| format!("a{c}b{c}"))
            .collect();
        texts.extend(
            [
                "",
                "\u{80}\u{9f}\u{2028}\u{2029}\u{feff}",
                "😀é\\\"/",
                "\u{10ffff}",
            ]
            .map(String::from),
        );
        for t in texts {
            let mut out = Vec::new();
            put_str(&mut out, &t);
            assert_eq!(out, canonical::canonicalize(&t).unwrap(), "{t:?}");
        }
        for n in [0, 9, 10, 99, 100, 1 << 32, MAX_COUNTER] {
            let mut out = Vec::new();
            put_counter(&mut out, n).unwrap();
            assert_eq!(out, n.to_string().into_bytes());
        }
        assert_eq!(put_counter(&mut Vec::new(), MAX_COUNTER + 1), None);
    }
}
