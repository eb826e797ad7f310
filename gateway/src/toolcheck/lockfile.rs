//! The tool lockfile of docs/protocol.md §5.7 and docs/operations.md
//! "Approved tool definitions": its format, its approver's signature and
//! the list digest.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tally_schemas::record::ToolPartDigests;
use tally_schemas::tools::digest_tool_definition;
use tally_schemas::{Hash, SecretKey, UnixMillis};

use super::GuardError;

/// The lockfile format version.
pub const LOCK_VERSION: u64 = 1;
/// Domain separation prefix of a lockfile signature: the approver signs
/// `"tally/tools-lock/v1\n" ‖ JCS(lockfile without "signature")`.
pub const LOCK_SIGNATURE_DOMAIN: &[u8] = b"tally/tools-lock/v1\n";

/// The server a baseline was approved for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum ServerId {
    /// A stdio server: the command and its arguments.
    Command(Vec<String>),
    /// A Streamable HTTP server: its URL.
    Url(String),
}

impl std::fmt::Display for ServerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Command(argv) => write!(f, "command {argv:?}"),
            Self::Url(u) => write!(f, "URL {u}"),
        }
    }
}

/// `serverInfo` from the server's `initialize` answer, at approval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerInfo {
    /// `serverInfo.name`.
    pub name: String,
    /// `serverInfo.version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// One approved tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockedTool {
    /// The server's name of the tool.
    pub name: String,
    /// `SHA-256(JCS(definition))`, docs/protocol.md §6.2.
    pub digest: Hash,
    /// The part digests.
    pub parts: ToolPartDigests,
    /// The definition as approved, when it was listed from the server
    /// (absent when approved from a recorded list, which holds digests only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub definition: Option<Value>,
}

/// An approver's signature over the lockfile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockSignature {
    /// The approver's public key (base64).
    pub key: String,
    /// The signature (base64) over [`LOCK_SIGNATURE_DOMAIN`] ‖ JCS(lockfile
    /// without `signature`).
    pub sig: String,
}

/// A tool lockfile: the approved baseline of one source's tools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lockfile {
    /// Always [`LOCK_VERSION`].
    pub tally_tools_lock: u64,
    /// The tool source, as the gateway declares it (`--source`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The server it was approved for.
    pub server: ServerId,
    /// The server's `serverInfo` at approval, when it was listed (over stdio or HTTP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_info: Option<ServerInfo>,
    /// When (RFC 3339, UTC).
    pub approved_at: UnixMillis,
    /// By whom.
    pub approved_by: String,
    /// The list digest of the approved tools (docs/protocol.md §5.7).
    pub list_digest: Hash,
    /// The approved tools, sorted by name.
    pub tools: Vec<LockedTool>,
    /// The approver's signature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<LockSignature>,
}

/// The list digest of docs/protocol.md §5.7: SHA-256 of the JCS of
/// `[{"digest","name"}…]` sorted by name.
#[must_use]
pub fn list_digest<'a>(tools: impl IntoIterator<Item = (&'a str, &'a Hash)>) -> Hash {
    let mut pairs: Vec<(&str, &Hash)> = tools.into_iter().collect();
    pairs.sort_by(|a, b| a.0.cmp(b.0));
    let items: Vec<Value> = pairs
        .into_iter()
        .map(|(n, d)| serde_json::json!({"digest": d, "name": n}))
        .collect();
    Hash::sha256(&tally_schemas::canonical::canonicalize(&items).unwrap_or_default())
}

impl Lockfile {
    /// A lockfile for `definitions` (tools as the server listed them).
    ///
    /// # Errors
    /// A message for a definition that cannot be digested or a repeated name.
    pub fn from_definitions(
        definitions: &[Value],
        source: Option<String>,
        server: ServerId,
        server_info: Option<ServerInfo>,
        approved_by: String,
        approved_at: UnixMillis,
    ) -> Result<Self, String> {
        let mut tools = BTreeMap::new();
        for (i, def) in definitions.iter().enumerate() {
            let (name, digest, parts) =
                digest_tool_definition(def).map_err(|e| format!("tool definition {i}: {e}"))?;
            let t = LockedTool {
                name: name.clone(),
                digest,
                parts,
                definition: Some(def.clone()),
            };
            if tools.insert(name.clone(), t).is_some() {
                return Err(format!("the server lists tool {name:?} twice"));
            }
        }
        Ok(Self::from_tools(
            tools.into_values().collect(),
            source,
            server,
            server_info,
            approved_by,
            approved_at,
        ))
    }

    /// A lockfile for `tools` (any order).
    #[must_use]
    pub fn from_tools(
        mut tools: Vec<LockedTool>,
        source: Option<String>,
        server: ServerId,
        server_info: Option<ServerInfo>,
        approved_by: String,
        approved_at: UnixMillis,
    ) -> Self {
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        Self {
            tally_tools_lock: LOCK_VERSION,
            source,
            server,
            server_info,
            approved_at,
            approved_by,
            list_digest: list_digest(tools.iter().map(|t| (t.name.as_str(), &t.digest))),
            tools,
            signature: None,
        }
    }

    /// The bytes an approver signs.
    pub(super) fn signed_bytes(&self) -> Vec<u8> {
        let mut unsigned = self.clone();
        unsigned.signature = None;
        let mut out = LOCK_SIGNATURE_DOMAIN.to_vec();
        out.extend(tally_schemas::canonical::canonicalize(&unsigned).unwrap_or_default());
        out
    }

    /// Signs the lockfile with `key`.
    pub fn sign(&mut self, key: &SecretKey) {
        self.signature = None;
        let sig = key.sign_raw(&self.signed_bytes());
        self.signature = Some(LockSignature {
            key: key.public_key().to_base64(),
            sig: sig.to_base64(),
        });
    }

    /// Reads a lockfile.
    ///
    /// # Errors
    /// [`GuardError`] `bad_lockfile` for anything but a lockfile of this version.
    pub fn parse(bytes: &[u8], file: &str) -> Result<Self, GuardError> {
        let bad = |message: String| GuardError {
            code: "bad_lockfile",
            file: file.to_owned(),
            message,
        };
        let lock: Self =
            serde_json::from_slice(bytes).map_err(|e| bad(format!("not a tool lockfile: {e}")))?;
        if lock.tally_tools_lock != LOCK_VERSION {
            return Err(bad(format!(
                "lockfile version {} (this tally reads version {LOCK_VERSION})",
                lock.tally_tools_lock
            )));
        }
        let mut seen = BTreeSet::new();
        for t in &lock.tools {
            if !seen.insert(t.name.as_str()) {
                return Err(bad(format!("tool {:?} is listed twice", t.name)));
            }
            if let Some(def) = &t.definition {
                let ok = digest_tool_definition(def)
                    .is_ok_and(|(n, d, p)| n == t.name && d == t.digest && p == t.parts);
                if !ok {
                    return Err(bad(format!(
                        "tool {:?}: its definition does not give its digests",
                        t.name
                    )));
                }
            }
        }
        if list_digest(lock.tools.iter().map(|t| (t.name.as_str(), &t.digest))) != lock.list_digest
        {
            return Err(bad("list_digest is not the digest of its tools".into()));
        }
        Ok(lock)
    }
}
