//! Turning an MCP `tools/list` answer into `tools` record bodies,
//! docs/protocol.md §5.3 and §6.2: one entry per tool with its whole and
//! per-part definition digests, split into parts of at most 48 tools that
//! each fit a record, all sharing one fresh list id.

use rand_core::{OsRng, RngCore as _};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tally_schemas::limits::{MAX_RECORD_BYTES, MAX_TOOLS_PER_RECORD, MAX_TOOL_LIST_PARTS};
use tally_schemas::record::{ToolEntry, ToolList};
use tally_schemas::tools::digest_tool_definition;
use tally_schemas::{Body, Hash};

/// A tool source's list, declared through `AgentChain::declare_tools`
/// (`chain`, which re-exports it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeclaredTools {
    /// The source's name (docs/protocol.md §5.3), or none for the agent's
    /// unnamed source.
    pub source: Option<String>,
    /// How long the declaration holds, in milliseconds (none: the
    /// protocol's default).
    pub lease_ms: Option<u64>,
    /// The tools, in the source's order.
    pub entries: Vec<ToolEntry>,
}

/// Whether `name` is a valid tool name (docs/protocol.md §5: 1–256 bytes,
/// no control character).
///
/// # Errors
/// Why not.
pub fn check_tool_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 256 {
        return Err(format!("{} bytes, not 1 to 256", name.len()));
    }
    if name.chars().any(char::is_control) {
        return Err("it holds a control character".into());
    }
    Ok(())
}

/// Room left in a record for the tool entries: the record's other members
/// (names, hashes, nonce, signature, list id) take well under 2 KiB.
const TOOLS_BYTES_BUDGET: usize = MAX_RECORD_BYTES - 2048;

/// Why a tool list could not be recorded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ToolListError {
    /// A name with the source's prefix is not a valid tool name.
    #[error("tool {name:?} with the prefix {prefix:?} is not a valid tool name: {reason}")]
    BadPrefixedName {
        /// The server's name.
        name: String,
        /// The prefix.
        prefix: String,
        /// Why.
        reason: String,
    },
    /// A definition could not be digested.
    #[error("tool definition {index}: {reason}")]
    Definition {
        /// Position in the list.
        index: usize,
        /// Why.
        reason: String,
    },
    /// Two tools share a name.
    #[error("the server lists tool {0:?} twice")]
    DuplicateName(String),
    /// More tools than 64 records can hold.
    #[error("the list needs more than {MAX_TOOL_LIST_PARTS} records")]
    TooManyParts,
}

/// A digested tool list, ready to be recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DigestedList {
    /// The entries, in the server's order.
    pub entries: Vec<ToolEntry>,
    /// A digest of names, definitions and recorded flags: equal lists have
    /// equal fingerprints, so an unchanged list is not recorded again.
    pub fingerprint: String,
}

/// Digests `tools` (the `result.tools` array of one or more pages);
/// `recorded` says whether calls to a tool name are recorded.
///
/// # Errors
/// [`ToolListError`] for undigestable or duplicate definitions.
#[cfg(test)]
pub(crate) fn digest_list(
    tools: &[Value],
    recorded: impl Fn(&str) -> bool,
) -> Result<DigestedList, ToolListError> {
    digest_list_as(tools, "", recorded)
}

/// [`digest_list`], each name with `prefix` before it (the server's names
/// are recorded as `prefix` + name; `recorded` sees the server's name).
///
/// # Errors
/// [`ToolListError`] for undigestable or duplicate definitions, and names
/// the prefix makes invalid.
pub(crate) fn digest_list_as(
    tools: &[Value],
    prefix: &str,
    recorded: impl Fn(&str) -> bool,
) -> Result<DigestedList, ToolListError> {
    let mut entries = Vec::with_capacity(tools.len());
    let mut seen = std::collections::BTreeSet::new();
    for (index, def) in tools.iter().enumerate() {
        let (server_name, digest, parts) =
            digest_tool_definition(def).map_err(|e| ToolListError::Definition {
                index,
                reason: e.to_string(),
            })?;
        let name = format!("{prefix}{server_name}");
        if !prefix.is_empty() {
            crate::calls::check_tool_name(&name).map_err(|reason| {
                ToolListError::BadPrefixedName {
                    name: server_name.clone(),
                    prefix: prefix.to_owned(),
                    reason,
                }
            })?;
        }
        if !seen.insert(name.clone()) {
            return Err(ToolListError::DuplicateName(name));
        }
        entries.push(ToolEntry {
            recorded: recorded(&server_name),
            name,
            digest,
            parts,
        });
    }
    let fingerprint = fingerprint(&entries);
    Ok(DigestedList {
        entries,
        fingerprint,
    })
}

impl DigestedList {
    /// The list as declared by `source` with `lease_ms`.
    pub(crate) fn declared(self, source: Option<String>, lease_ms: Option<u64>) -> DeclaredTools {
        DeclaredTools {
            source,
            lease_ms,
            entries: self.entries,
        }
    }
}

/// Splits a declared list into `tools` bodies under one fresh list id.
///
/// # Errors
/// [`ToolListError::TooManyParts`] when it does not fit 64 records.
pub(crate) fn list_bodies(list: &DeclaredTools) -> Result<Vec<Body>, ToolListError> {
    {
        let mut chunks: Vec<Vec<ToolEntry>> = Vec::new();
        let mut current: Vec<ToolEntry> = Vec::new();
        let mut bytes = 0usize;
        for entry in &list.entries {
            let size = serde_json::to_vec(entry).map_or(TOOLS_BYTES_BUDGET, |v| v.len() + 1);
            if !current.is_empty()
                && (current.len() == MAX_TOOLS_PER_RECORD || bytes + size > TOOLS_BYTES_BUDGET)
            {
                chunks.push(std::mem::take(&mut current));
                bytes = 0;
            }
            bytes += size;
            current.push(entry.clone());
        }
        // An empty list is still one (empty) part: the server has no tools.
        chunks.push(current);
        let parts = u32::try_from(chunks.len()).map_err(|_| ToolListError::TooManyParts)?;
        if parts > MAX_TOOL_LIST_PARTS {
            return Err(ToolListError::TooManyParts);
        }
        let mut id = [0u8; 16];
        OsRng.fill_bytes(&mut id);
        let list_id = hex::encode(id);
        Ok(chunks
            .into_iter()
            .zip(0u32..)
            .map(|(tools, part)| {
                Body::Tools(ToolList {
                    list_id: list_id.clone(),
                    part,
                    parts,
                    tools,
                    source: list.source.clone(),
                    // A lease only goes with a source (docs/protocol.md §5.3).
                    lease_ms: list.source.as_ref().and(list.lease_ms),
                })
            })
            .collect())
    }
}

/// SHA-256 of the entries' canonical JSON.
pub(crate) fn fingerprint(entries: &[ToolEntry]) -> String {
    let bytes = tally_schemas::canonical::canonicalize(entries).unwrap_or_default();
    Hash::sha256(&bytes).to_hex()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(name: &str, desc: &str) -> Value {
        json!({"name": name, "description": desc, "inputSchema": {"type": "object"}})
    }

    #[test]
    fn splits_into_parts_of_at_most_48_with_one_list_id() {
        let tools: Vec<Value> = (0..100).map(|i| tool(&format!("t{i}"), "d")).collect();
        let list = digest_list(&tools, |_| true).unwrap();
        let bodies = list_bodies(&list.declared(None, None)).unwrap();
        assert_eq!(bodies.len(), 3);
        let ids: std::collections::BTreeSet<_> = bodies
            .iter()
            .map(|b| match b {
                Body::Tools(t) => {
                    assert!(t.tools.len() <= 48);
                    assert_eq!(t.parts, 3);
                    t.list_id.clone()
                }
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(ids.len(), 1);
    }

    #[test]
    fn long_definitions_still_fit_a_record() {
        let long = "x".repeat(250);
        let tools: Vec<Value> = (0..48)
            .map(|i| {
                json!({"name": format!("{long}{i}"), "title": "t", "description": "d", "inputSchema": {},
                       "outputSchema": {}, "annotations": {}, "_meta": {}})
            })
            .collect();
        let bodies =
            list_bodies(&digest_list(&tools, |_| true).unwrap().declared(None, None)).unwrap();
        assert!(bodies.len() >= 2);
        let key = tally_schemas::SecretKey::from_seed(&[1; 32]);
        for (i, body) in bodies.into_iter().enumerate() {
            let u = tally_schemas::UnsignedRecord {
                agent: tally_schemas::AgentName::new("a").unwrap(),
                key_id: key.public_key().key_id(),
                seq: tally_schemas::Seq::new(i as u64).unwrap(),
                prev: (i > 0).then(|| tally_schemas::Hash::sha256(b"p")),
                time: tally_schemas::UnixMillis::new(0),
                nonce: tally_schemas::Nonce::from_bytes(vec![0; 16]).unwrap(),
                body,
            };
            u.sign(&key).unwrap();
        }
    }

    #[test]
    fn fingerprint_follows_definitions_and_recorded_flags() {
        let a = digest_list(&[tool("x", "one")], |_| true).unwrap();
        let b = digest_list(&[tool("x", "two")], |_| true).unwrap();
        let c = digest_list(&[tool("x", "one")], |_| false).unwrap();
        assert_ne!(a.fingerprint, b.fingerprint);
        assert_ne!(a.fingerprint, c.fingerprint);
        assert_eq!(
            a.fingerprint,
            digest_list(&[tool("x", "one")], |_| true)
                .unwrap()
                .fingerprint
        );
        assert!(matches!(
            digest_list(&[tool("x", "1"), tool("x", "2")], |_| true),
            Err(ToolListError::DuplicateName(_))
        ));
        assert!(digest_list(&[json!({"description": "no name"})], |_| true).is_err());
    }
}
