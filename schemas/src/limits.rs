//! Every numeric limit of the protocol, docs/protocol.md §10. Each one is a
//! named constant so that the docs, the schemas and the code cite one place.

/// Maximum size of a record's canonical form, in bytes. Chosen so that an
/// entry (record plus witness fields) always fits a C2SP entry bundle, whose
/// uint16 length prefix caps an entry at 65,535 bytes.
pub const MAX_RECORD_BYTES: usize = 32_768;

/// Maximum size of an entry's canonical form (C2SP tlog-tiles entry bundles).
pub const MAX_ENTRY_BYTES: usize = 65_535;

/// Maximum size of any other JSON wire object (receipt, a pack line other
/// than the header), and of an HTTP request body, in bytes.
pub const MAX_WIRE_OBJECT_BYTES: usize = 131_072;

/// Maximum size of a pack's header line, which lists every agent of the pack
/// (up to [`MAX_AGENTS_PER_PACK`]); every other pack line keeps
/// [`MAX_WIRE_OBJECT_BYTES`]. The worst case (4,096 agents with 64-byte
/// names and the largest seqs, origin and checkpoint) is 647,267 bytes;
/// schemas/tests/it/limits.rs builds it.
pub const MAX_PACK_HEADER_BYTES: usize = 1 << 20;

/// Maximum size of agent-keys.json. The worst case (4,096 agents with
/// 64-byte names, 64 keys each with both validity ends) is 44,703,774
/// bytes; schemas/tests/it/limits.rs builds it.
pub const MAX_AGENT_KEYS_BYTES: usize = 64 << 20;

/// Maximum size of head.json. It holds one record (up to
/// [`MAX_RECORD_BYTES`]) and an inclusion proof per agent, for up to
/// [`MAX_AGENTS_PER_PACK`] agents: the worst case is 152,256,783 bytes
/// (145.2 MiB); schemas/tests/it/limits.rs builds it.
pub const MAX_HEAD_BYTES: usize = 160 << 20;

/// Largest list answer of the witness's API a client reads (`GET
/// /v1/agents`, `/v1/projects`, `/v1/read-tokens`; docs/api.md): the lists
/// grow with the witness, so their bound is agent-keys.json's.
pub const MAX_LIST_ANSWER_BYTES: usize = MAX_AGENT_KEYS_BYTES;

/// Maximum nesting depth of arrays and objects in any wire object.
pub const MAX_DEPTH: usize = 16;

/// Maximum nesting depth accepted when canonicalising a tool definition,
/// whose input schema is the MCP server's and may nest deeply.
pub const MAX_TOOL_DEFINITION_DEPTH: usize = 128;

/// Maximum size of one tool definition, in bytes, before it is digested.
pub const MAX_TOOL_DEFINITION_BYTES: usize = 1_048_576;

/// Maximum number of tools in one `tools` record.
pub const MAX_TOOLS_PER_RECORD: usize = 48;

/// Maximum number of parts (records) one tool list spans.
pub const MAX_TOOL_LIST_PARTS: u32 = 64;

/// Maximum number of tools in a tool list (all parts together).
pub const MAX_TOOLS_PER_LIST: usize = MAX_TOOLS_PER_RECORD * MAX_TOOL_LIST_PARTS as usize;

/// Shortest lease a `tools` record's `lease_ms` may give, in ms (§5.3).
pub const MIN_TOOL_LIST_LEASE_MS: u64 = 1_000;

/// Longest lease a `tools` record's `lease_ms` may give, in ms (24 h, §5.3).
pub const MAX_TOOL_LIST_LEASE_MS: u64 = 86_400_000;

/// The lease of a named source's tool list that omits `lease_ms` (§5.3).
pub const DEFAULT_TOOL_LIST_LEASE_MS: u64 = MAX_TOOL_LIST_LEASE_MS;

/// Named tool sources whose latest list coverage tracks per agent (§5.3,
/// §11); a further source makes it forget the one completed earliest.
pub const MAX_SOURCES_PER_AGENT: usize = 64;

/// Maximum length of an agent name, in bytes.
pub const MAX_AGENT_NAME_BYTES: usize = 64;

/// Maximum length of a tool name, call id or list id, in bytes.
pub const MAX_NAME_BYTES: usize = 256;

/// Maximum length of a note's text, in bytes.
pub const MAX_NOTE_TEXT_BYTES: usize = 4096;

/// Minimum and maximum nonce length, in bytes.
pub const MIN_NONCE_BYTES: usize = 16;
/// See [`MIN_NONCE_BYTES`].
pub const MAX_NONCE_BYTES: usize = 64;

/// The largest integer magnitude JSON numbers may carry, 2^53 − 1 (I-JSON,
/// RFC 7493); also `canonical::MAX_SAFE_INTEGER`.
pub const MAX_SAFE_INTEGER: u64 = 9_007_199_254_740_991;

/// Largest sequence number, log index or tree size: 2^53 − 1, so every
/// integer on the wire is exact in a double.
pub const MAX_COUNTER: u64 = MAX_SAFE_INTEGER;

/// Maximum number of records in one pack.
pub const MAX_RECORDS_PER_PACK: u64 = 16_777_216;

/// Maximum number of agents in one pack, in one agent-keys file and in one
/// head file.
pub const MAX_AGENTS_PER_PACK: usize = 4096;

/// Maximum number of keys listed for one agent in agent-keys.json.
pub const MAX_KEYS_PER_AGENT: usize = 64;

/// Maximum number of hashes in one proof (a tree of 2^63 leaves needs 63).
pub const MAX_PROOF_HASHES: usize = 64;

/// Default bound on |witness time − agent time|, in milliseconds.
pub const DEFAULT_MAX_SKEW_MS: u64 = 300_000;

/// Most records in one batch request (`POST /v1/records/batch`,
/// docs/protocol.md §8.1).
pub const MAX_BATCH_RECORDS: usize = 256;

/// Maximum size of a batch request body, in bytes (docs/protocol.md §8.1).
/// A client splits its backlog so that each batch stays within both this
/// and [`MAX_BATCH_RECORDS`].
pub const MAX_BATCH_BYTES: usize = 1 << 20;

/// Maximum size of a batch answer, in bytes: [`MAX_BATCH_RECORDS`] answers
/// of at most [`MAX_WIRE_OBJECT_BYTES`] each.
pub const MAX_BATCH_ANSWER_BYTES: usize = MAX_BATCH_RECORDS * MAX_WIRE_OBJECT_BYTES;
