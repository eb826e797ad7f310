#![no_main]
//! Fuzz target: MCP tool definitions under their limits
//! (`TOOL_DEFINITION_LIMITS`, then `digest_tool_definition`); the digests of
//! a definition's canonical bytes must be the digests of the definition.

use libfuzzer_sys::fuzz_target;
use tally_schemas::canonical::{canonicalize, parse_strict, Limits};
use tally_schemas::tools::{digest_tool_definition, TOOL_DEFINITION_LIMITS};

/// Canonical output can be up to 4 times its input (see the canonical
/// target), so the re-parse gets room for it.
const REPARSE: Limits = Limits {
    max_bytes: 8 * TOOL_DEFINITION_LIMITS.max_bytes,
    max_depth: TOOL_DEFINITION_LIMITS.max_depth,
};

fuzz_target!(|data: &[u8]| {
    let Ok(definition) = parse_strict(data, TOOL_DEFINITION_LIMITS) else {
        return;
    };
    if let Ok(digests) = digest_tool_definition(&definition) {
        let bytes = canonicalize(&definition).expect("digested, so canonicalisable");
        let again = parse_strict(&bytes, REPARSE).expect("canonical output parses");
        assert_eq!(
            digest_tool_definition(&again).expect("digests again"),
            digests
        );
    }
});
