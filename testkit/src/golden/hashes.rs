//! hashes/: salted content hashes and tool definition digests.

use std::path::Path;

use serde_json::json;
use tally_schemas::canonical::canonicalize;
use tally_schemas::hash::salted_hash;
use tally_schemas::tools::digest_tool_definition;

use super::fixtures::*;

/// hashes/: salted content hashes and tool definition digests.
pub(super) fn write_hashes(dir: &Path) {
    let salted = [
        (
            "salted-hash-input",
            "the salted hash of a tool call's arguments: SHA-256(salt || JCS(arguments))",
            salt(3),
            json!({"id": "C-1001", "amount": 42.5, "note": null}),
        ),
        (
            "salted-hash-output",
            "the salted hash of a result whose canonical form escapes and reorders: SHA-256(salt || JCS(result))",
            salt(4),
            json!({"isError": false, "content": [{"type": "text", "text": "caf\u{e9} \"quoted\"\n\u{1f}", "n": 1e21}]}),
        ),
        (
            "salted-hash-proof",
            "the salted hash of an action's proof (protocol.md §5.2): the proof as a JSON string",
            salt(30),
            json!("msg-0042"),
        ),
        (
            "salted-hash-claim-turn",
            "the salted hash of a claim's turn (protocol.md §5.6): the turn's text as a JSON string",
            salt(31),
            json!("I've sent the email to the customer"),
        ),
    ];
    for (name, description, salt, content) in salted {
        let canonical = canonicalize(&content).expect("canonical");
        write(
            dir,
            &format!("{name}.json"),
            &json!({
                "description": description,
                "expect": "valid",
                "salt_hex": hex::encode(salt),
                "content": content,
                "canonical_content": String::from_utf8(canonical.clone()).expect("utf-8"),
                "hash": salted_hash(&salt, &canonical).to_hex(),
            }),
        );
    }
    let definitions = [
        (
            "tool-digest-full",
            "an MCP tool definition with every digested part, and a member (icons) that counts only in the whole digest",
            json!({
                "name": "refund",
                "title": "Refund a claim",
                "description": "Refund part or all of a claim.",
                "inputSchema": {"type": "object", "properties": {"id": {"type": "string"}, "amount": {"type": "number", "minimum": 0.01}}, "required": ["id"]},
                "outputSchema": {"type": "object", "properties": {"refunded": {"type": "number"}}},
                "annotations": {"destructiveHint": true, "idempotentHint": false},
                "_meta": {"vendor.example/tier": "gold"},
                "icons": [{"src": "https://example.invalid/r.png"}],
            }),
        ),
        (
            "tool-digest-minimal",
            "an MCP tool definition with a name and an input schema only: absent parts have no digest",
            json!({"name": "ping", "inputSchema": {"type": "object"}}),
        ),
    ];
    for (name, description, definition) in definitions {
        let (tool, digest, parts) = digest_tool_definition(&definition).expect("valid");
        write(
            dir,
            &format!("{name}.json"),
            &json!({
                "description": description,
                "expect": "valid",
                "definition": definition,
                "canonical": String::from_utf8(canonicalize(&definition).expect("c")).expect("utf-8"),
                "name": tool,
                "digest": digest.to_hex(),
                "parts": to_value(&parts),
            }),
        );
    }
}
