//! Tool-definition digests, docs/protocol.md §6.2.
//!
//! A tool's digest is `SHA-256(JCS(definition))` over the whole MCP tool
//! object as the server sent it; each part (`title`, `description`,
//! `inputSchema`, `outputSchema`, `annotations`, `_meta`) is digested the
//! same way on its own, so a changed definition is named, not just noticed.

use serde_json::Value;

use crate::canonical::{self, CanonicalError, Limits};
use crate::hash::Hash;
use crate::limits::{MAX_TOOL_DEFINITION_BYTES, MAX_TOOL_DEFINITION_DEPTH};
use crate::record::ToolPartDigests;

/// Why a tool definition could not be digested.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolDefinitionError {
    /// Not a JSON object with a string `name`.
    #[error("a tool definition must be an object with a string \"name\"")]
    Shape,
    /// The definition holds JSON that cannot be canonicalised.
    #[error(transparent)]
    Canonical(#[from] CanonicalError),
}

/// The limits used when a tool definition arrives as bytes.
pub const TOOL_DEFINITION_LIMITS: Limits = Limits {
    max_bytes: MAX_TOOL_DEFINITION_BYTES,
    max_depth: MAX_TOOL_DEFINITION_DEPTH,
};

/// The name, whole digest and part digests of one MCP tool definition.
///
/// # Errors
/// [`ToolDefinitionError`] when it is not an object with a name, or holds
/// numbers JCS refuses.
pub fn digest_tool_definition(
    definition: &Value,
) -> Result<(String, Hash, ToolPartDigests), ToolDefinitionError> {
    let obj = definition.as_object().ok_or(ToolDefinitionError::Shape)?;
    let name = obj
        .get("name")
        .and_then(Value::as_str)
        .ok_or(ToolDefinitionError::Shape)?;
    let part = |key: &str| -> Result<Option<Hash>, ToolDefinitionError> {
        obj.get(key)
            .map(|v| Ok(Hash::sha256(&canonical::canonicalize(v)?)))
            .transpose()
    };
    let parts = ToolPartDigests {
        title: part("title")?,
        description: part("description")?,
        input_schema: part("inputSchema")?,
        output_schema: part("outputSchema")?,
        annotations: part("annotations")?,
        meta: part("_meta")?,
    };
    let whole = Hash::sha256(&canonical::canonicalize(definition)?);
    Ok((name.to_owned(), whole, parts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_description_is_named() {
        let a =
            serde_json::json!({"name":"echo","description":"Echo","inputSchema":{"type":"object"}});
        let b = serde_json::json!({"name":"echo","description":"Echo!","inputSchema":{"type":"object"}});
        let (na, da, pa) = digest_tool_definition(&a).unwrap();
        let (_, db, pb) = digest_tool_definition(&b).unwrap();
        assert_eq!(na, "echo");
        assert_ne!(da, db);
        assert_eq!(pa.changed_parts(&pb), vec!["description"]);
        assert!(digest_tool_definition(&serde_json::json!({"description": "x"})).is_err());
    }
}
