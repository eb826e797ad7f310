//! Tool-interface continuity, docs/protocol.md §5.7 and docs/operations.md
//! "Approved tool definitions": an approved baseline of a source's tool
//! definitions (the lockfile), a policy mapping each observation to an
//! effect, and the session state that enforces it (which tools are paused,
//! whether the session is paused or denied, whether the check is stale).
//! Each check gives a `tool_check` body that the caller writes through the
//! agent's chain; this module does no I/O besides reading the two files.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tally_schemas::record::{
    CheckEffect, CheckException, CheckFinding, CheckObservation, CheckTrigger, ToolCheck,
    ToolPartDigests,
};
use tally_schemas::tools::digest_tool_definition;
use tally_schemas::{Hash, PublicKey, SecretKey, Signature, UnixMillis};

use crate::calls::Refusal;

/// The lockfile format version.
pub const LOCK_VERSION: u64 = 1;
/// The policy format version.
pub const POLICY_VERSION: u64 = 1;
/// Domain separation prefix of a lockfile signature: the approver signs
/// `"tally/tools-lock/v1\n" ‖ JCS(lockfile without "signature")`.
pub const LOCK_SIGNATURE_DOMAIN: &[u8] = b"tally/tools-lock/v1\n";
/// A baseline's maximum age when the policy gives none, in days.
pub const DEFAULT_MAX_AGE_DAYS: u64 = 90;
/// Largest lockfile or policy file read, in bytes.
pub const MAX_FILE_BYTES: usize = 16 << 20;

/// Why a lockfile or policy cannot be used; the gateway refuses to start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {file}: {message}")]
pub struct GuardError {
    /// Stable code: `bad_lockfile` or `bad_policy`.
    pub code: &'static str,
    /// The file.
    pub file: String,
    /// What is wrong.
    pub message: String,
}

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
    fn signed_bytes(&self) -> Vec<u8> {
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

/// An approved exception: `observation` of `tool` proceeds, recorded as
/// such, until `until`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyException {
    /// The tool (the server's name); absent for a source-wide observation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The observation it covers.
    pub observation: String,
    /// Who approved it.
    pub by: String,
    /// Until when (RFC 3339, UTC).
    pub until: UnixMillis,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    tally_tools_policy: u64,
    #[serde(default)]
    effects: BTreeMap<String, String>,
    #[serde(default)]
    max_age_days: Option<u64>,
    #[serde(default)]
    require_signature: bool,
    #[serde(default)]
    approver_keys: Vec<String>,
    #[serde(default)]
    exceptions: Vec<PolicyException>,
}

/// A policy: an effect per observation (docs/operations.md "Approved tool definitions").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    effects: BTreeMap<CheckObservation, CheckEffect>,
    /// A baseline's maximum age, in days.
    pub max_age_days: u64,
    /// Whether an unsigned lockfile is refused (`signature_missing`).
    pub require_signature: bool,
    /// The keys whose signatures are accepted.
    pub approver_keys: Vec<PublicKey>,
    exceptions: Vec<(Option<String>, CheckObservation, CheckException, UnixMillis)>,
}

/// The effect of `o` when the policy names none, docs/operations.md
/// "Approved tool definitions".
#[must_use]
pub const fn default_effect(o: CheckObservation) -> CheckEffect {
    use CheckObservation as O;
    match o {
        O::Unchanged | O::ToolRemoved | O::ServerVersionChanged => CheckEffect::Proceed,
        O::ToolAdded | O::DescriptionChanged | O::SchemaChanged | O::AnnotationsChanged => {
            CheckEffect::PauseTool
        }
        O::ServerIdentityChanged | O::SignatureInvalid | O::KeyUnknown | O::SignatureMissing => {
            CheckEffect::Deny
        }
        O::BaselineExpired | O::ListTruncated | O::ListMalformed | O::ServerUnavailable => {
            CheckEffect::PauseSession
        }
    }
}

fn observation_named(name: &str) -> Option<CheckObservation> {
    CheckObservation::ALL
        .into_iter()
        .find(|o| o.as_str() == name)
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            effects: CheckObservation::ALL
                .into_iter()
                .map(|o| (o, default_effect(o)))
                .collect(),
            max_age_days: DEFAULT_MAX_AGE_DAYS,
            require_signature: false,
            approver_keys: Vec::new(),
            exceptions: Vec::new(),
        }
    }
}

impl Policy {
    /// Reads a policy.
    ///
    /// # Errors
    /// [`GuardError`] `bad_policy`: not a policy, an unknown observation or
    /// effect, `pause_tool` for a source-wide observation, a bad key.
    pub fn parse(bytes: &[u8], file: &str) -> Result<Self, GuardError> {
        let bad = |message: String| GuardError {
            code: "bad_policy",
            file: file.to_owned(),
            message,
        };
        let f: PolicyFile =
            serde_json::from_slice(bytes).map_err(|e| bad(format!("not a tool policy: {e}")))?;
        if f.tally_tools_policy != POLICY_VERSION {
            return Err(bad(format!(
                "policy version {} (this tally reads version {POLICY_VERSION})",
                f.tally_tools_policy
            )));
        }
        let known = || {
            CheckObservation::ALL
                .iter()
                .map(|o| o.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut p = Self::default();
        for (name, effect) in &f.effects {
            let o = observation_named(name)
                .ok_or_else(|| bad(format!("unknown observation {name:?} (known: {})", known())))?;
            let e = match effect.as_str() {
                "proceed" => CheckEffect::Proceed,
                "pause_tool" => CheckEffect::PauseTool,
                "pause_session" => CheckEffect::PauseSession,
                "deny" => CheckEffect::Deny,
                other => {
                    return Err(bad(format!(
                        "observation {name}: unknown effect {other:?} (known: proceed, pause_tool, pause_session, deny; an exception goes in \"exceptions\")"
                    )))
                }
            };
            if e == CheckEffect::PauseTool && !o.per_tool() {
                return Err(bad(format!(
                    "observation {name} is about the whole source, so its effect cannot be pause_tool"
                )));
            }
            p.effects.insert(o, e);
        }
        if let Some(days) = f.max_age_days {
            if days == 0 || days > 36_500 {
                return Err(bad(format!("max_age_days {days} is not within 1 to 36500")));
            }
            p.max_age_days = days;
        }
        p.require_signature = f.require_signature;
        for k in &f.approver_keys {
            p.approver_keys.push(
                PublicKey::from_base64(k).map_err(|e| bad(format!("approver key {k:?}: {e}")))?,
            );
        }
        for x in f.exceptions {
            let o = observation_named(&x.observation).ok_or_else(|| {
                bad(format!(
                    "exception: unknown observation {:?} (known: {})",
                    x.observation,
                    known()
                ))
            })?;
            if o.per_tool() != x.tool.is_some() {
                return Err(bad(format!(
                    "exception for {}: {}",
                    x.observation,
                    if o.per_tool() {
                        "needs a \"tool\""
                    } else {
                        "is about the whole source and takes no \"tool\""
                    }
                )));
            }
            if x.by.trim().is_empty() {
                return Err(bad(format!(
                    "exception for {}: \"by\" is empty",
                    x.observation
                )));
            }
            let until = x
                .until
                .to_rfc3339()
                .map_err(|e| bad(format!("exception until: {e}")))?;
            p.exceptions
                .push((x.tool, o, CheckException { by: x.by, until }, x.until));
        }
        Ok(p)
    }

    /// The effect of `o` for `tool` at `now`, and the exception that gave it.
    fn effect(
        &self,
        o: CheckObservation,
        tool: Option<&str>,
        now: UnixMillis,
    ) -> (CheckEffect, Option<CheckException>) {
        let base = self.effects.get(&o).copied().unwrap_or(default_effect(o));
        if base == CheckEffect::Proceed {
            return (base, None);
        }
        for (t, xo, x, until) in &self.exceptions {
            if *xo == o && t.as_deref() == tool && now.as_millis() <= until.as_millis() {
                return (CheckEffect::Exception, Some(x.clone()));
            }
        }
        (base, None)
    }
}

/// A lockfile and a policy, with their SHA-256 (the check record names both).
#[derive(Debug, Clone)]
pub struct ToolGuard {
    lock: Lockfile,
    lock_hash: Hash,
    policy: Policy,
    policy_hash: Hash,
    approved: HashMap<String, LockedTool>,
}

fn read_file(path: &std::path::Path, code: &'static str) -> Result<Vec<u8>, GuardError> {
    let bad = |message: String| GuardError {
        code,
        file: path.display().to_string(),
        message,
    };
    let meta = std::fs::metadata(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
    if meta.len() > MAX_FILE_BYTES as u64 {
        return Err(bad(format!("larger than {MAX_FILE_BYTES} bytes")));
    }
    std::fs::read(path).map_err(|e| bad(format!("cannot read it: {e}")))
}

impl ToolGuard {
    /// Reads and checks the lockfile and policy files.
    ///
    /// # Errors
    /// [`GuardError`] when either cannot be read or is not valid.
    pub fn load(lock: &std::path::Path, policy: &std::path::Path) -> Result<Self, GuardError> {
        let lb = read_file(lock, "bad_lockfile")?;
        let pb = read_file(policy, "bad_policy")?;
        Self::from_bytes(
            &lb,
            &lock.display().to_string(),
            &pb,
            &policy.display().to_string(),
        )
    }

    /// [`Self::load`] from the files' bytes.
    ///
    /// # Errors
    /// [`GuardError`] when either is not valid.
    pub fn from_bytes(
        lock: &[u8],
        lock_name: &str,
        policy: &[u8],
        policy_name: &str,
    ) -> Result<Self, GuardError> {
        let l = Lockfile::parse(lock, lock_name)?;
        let p = Policy::parse(policy, policy_name)?;
        Ok(Self {
            approved: l
                .tools
                .iter()
                .map(|t| (t.name.clone(), t.clone()))
                .collect(),
            lock: l,
            lock_hash: Hash::sha256(lock),
            policy: p,
            policy_hash: Hash::sha256(policy),
        })
    }

    /// The lockfile.
    #[must_use]
    pub fn lockfile(&self) -> &Lockfile {
        &self.lock
    }

    fn finding(
        &self,
        o: CheckObservation,
        tool: Option<&str>,
        parts: Vec<String>,
        shown: Option<String>,
        now: UnixMillis,
    ) -> CheckFinding {
        let (effect, exception) = self.policy.effect(o, tool, now);
        CheckFinding {
            observation: o,
            effect,
            tool: shown.or_else(|| tool.map(str::to_owned)),
            parts,
            exception,
        }
    }

    /// The source-wide findings known before the server is used: the
    /// server's identity (`server`: the command or URL the runtime uses),
    /// the baseline's age and its signature.
    #[must_use]
    pub fn start_findings(&self, server: &ServerId, now: UnixMillis) -> Vec<CheckFinding> {
        use CheckObservation as O;
        let mut out = Vec::new();
        if *server != self.lock.server {
            out.push(self.finding(O::ServerIdentityChanged, None, Vec::new(), None, now));
        }
        let max_ms = i64::try_from(self.policy.max_age_days)
            .unwrap_or(i64::MAX)
            .saturating_mul(86_400_000);
        if now.as_millis() > self.lock.approved_at.as_millis().saturating_add(max_ms) {
            out.push(self.finding(O::BaselineExpired, None, Vec::new(), None, now));
        }
        match &self.lock.signature {
            None if self.policy.require_signature => {
                out.push(self.finding(O::SignatureMissing, None, Vec::new(), None, now));
            }
            None => {}
            Some(s) => {
                let key = PublicKey::from_base64(&s.key).ok();
                let valid = key.as_ref().is_some_and(|k| {
                    Signature::from_base64(&s.sig)
                        .is_ok_and(|sig| k.verify_raw(&self.lock.signed_bytes(), &sig).is_ok())
                });
                if !valid {
                    out.push(self.finding(O::SignatureInvalid, None, Vec::new(), None, now));
                } else if !key.is_some_and(|k| self.policy.approver_keys.contains(&k)) {
                    out.push(self.finding(O::KeyUnknown, None, Vec::new(), None, now));
                }
            }
        }
        out
    }

    /// The findings from the server's `initialize` result: its name
    /// (identity) and version, against the ones at approval.
    #[must_use]
    pub fn initialize_findings(&self, result: &Value, now: UnixMillis) -> Vec<CheckFinding> {
        use CheckObservation as O;
        let Some(approved) = &self.lock.server_info else {
            return Vec::new();
        };
        let info = result.get("serverInfo");
        let name = info.and_then(|i| i.get("name")).and_then(Value::as_str);
        let version = info.and_then(|i| i.get("version")).and_then(Value::as_str);
        let mut out = Vec::new();
        if name != Some(approved.name.as_str()) {
            out.push(self.finding(O::ServerIdentityChanged, None, Vec::new(), None, now));
        } else if version != approved.version.as_deref() {
            out.push(self.finding(O::ServerVersionChanged, None, Vec::new(), None, now));
        }
        out
    }

    /// The observations for one offered definition: `None` when it is
    /// approved as offered.
    fn tool_observations(&self, def: &Value) -> Result<ToolObservations, String> {
        use CheckObservation as O;
        let (name, digest, parts) = digest_tool_definition(def).map_err(|e| e.to_string())?;
        let Some(approved) = self.approved.get(&name) else {
            return Ok((name, vec![(O::ToolAdded, Vec::new())]));
        };
        if approved.digest == digest {
            return Ok((name, Vec::new()));
        }
        let changed = approved.parts.changed_parts(&parts);
        let mut by: BTreeMap<CheckObservation, Vec<String>> = BTreeMap::new();
        for p in &changed {
            let o = match *p {
                "title" | "description" => O::DescriptionChanged,
                "input_schema" | "output_schema" => O::SchemaChanged,
                _ => O::AnnotationsChanged,
            };
            by.entry(o).or_default().push((*p).to_owned());
        }
        if by.is_empty() {
            // The whole differs but no part does: a member outside the
            // named parts (e.g. the name's spelling is equal; another key).
            by.insert(O::AnnotationsChanged, Vec::new());
        }
        Ok((name, by.into_iter().collect()))
    }

    /// The per-tool findings and the list digest for a complete list, or
    /// `list_malformed` when a definition cannot be read.
    #[must_use]
    pub fn list_findings(
        &self,
        tools: &[Value],
        prefix: &str,
        now: UnixMillis,
    ) -> (Vec<CheckFinding>, Option<Hash>) {
        let mut out = Vec::new();
        let mut offered: BTreeMap<String, Hash> = BTreeMap::new();
        for def in tools {
            let Ok((name, obs)) = self.tool_observations(def) else {
                return (
                    vec![self.finding(
                        CheckObservation::ListMalformed,
                        None,
                        Vec::new(),
                        None,
                        now,
                    )],
                    None,
                );
            };
            let digest = digest_tool_definition(def)
                .map(|(_, d, _)| d)
                .unwrap_or_else(|_| Hash::sha256(b""));
            if offered.insert(name.clone(), digest).is_some() {
                return (
                    vec![self.finding(
                        CheckObservation::ListMalformed,
                        None,
                        Vec::new(),
                        None,
                        now,
                    )],
                    None,
                );
            }
            for (o, parts) in obs {
                out.push(self.finding(o, Some(&name), parts, Some(format!("{prefix}{name}")), now));
            }
        }
        for name in self.approved.keys() {
            if !offered.contains_key(name) {
                out.push(self.finding(
                    CheckObservation::ToolRemoved,
                    Some(name),
                    Vec::new(),
                    Some(format!("{prefix}{name}")),
                    now,
                ));
            }
        }
        out.sort_by(|a, b| (&a.tool, a.observation).cmp(&(&b.tool, b.observation)));
        let digest = list_digest(offered.iter().map(|(n, d)| (n.as_str(), d)));
        (out, Some(digest))
    }

    /// The strongest effect for one offered definition (`pause_tool` hides it).
    #[must_use]
    pub fn tool_effect(&self, def: &Value, now: UnixMillis) -> CheckEffect {
        match self.tool_observations(def) {
            Ok((name, obs)) => obs
                .into_iter()
                .map(|(o, _)| self.policy.effect(o, Some(&name), now).0)
                .max()
                .unwrap_or(CheckEffect::Proceed),
            Err(_) => CheckEffect::PauseTool,
        }
    }

    /// A check body from `findings`.
    #[must_use]
    pub fn body(
        &self,
        source: Option<String>,
        trigger: CheckTrigger,
        offered: Option<Hash>,
        findings: Vec<CheckFinding>,
    ) -> ToolCheck {
        let effect = findings
            .iter()
            .map(|f| f.effect)
            .max()
            .unwrap_or(CheckEffect::Proceed);
        let paused: BTreeSet<String> = findings
            .iter()
            .filter(|f| f.effect == CheckEffect::PauseTool)
            .filter_map(|f| f.tool.clone())
            .collect();
        ToolCheck {
            source,
            trigger,
            baseline: self.lock_hash,
            policy: self.policy_hash,
            offered,
            findings,
            effect,
            paused: paused.into_iter().collect(),
        }
    }
}

/// A tool's server name and its observations, each with the parts it is about.
type ToolObservations = (String, Vec<(CheckObservation, Vec<String>)>);

/// Where a session stands after its checks.
#[derive(Debug, Default)]
struct SessionState {
    /// Source-wide findings that hold for the whole session (start and
    /// `initialize`); repeated in every check.
    standing: Vec<CheckFinding>,
    /// Paused tools (recorded names) and why.
    paused: BTreeMap<String, String>,
    /// The strongest source-wide effect so far.
    session: Option<(CheckEffect, String)>,
    /// A list is awaited: calls wait for it (`notifications/tools/list_changed`
    /// or the session's first list).
    stale: bool,
    /// Checks written.
    checks: u64,
}

/// The enforcement state of one session (a gateway's server, an SDK
/// adapter's client), shared by the transports.
#[derive(Debug)]
pub struct Enforcer {
    guard: ToolGuard,
    source: Option<String>,
    prefix: String,
    state: Mutex<SessionState>,
    fresh: tokio::sync::Notify,
}

/// What a session is told about a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Forward it.
    Forward,
    /// The check is stale: wait for the next list, then ask again.
    Wait,
    /// Refuse it.
    Refuse(Refusal),
}

fn why(f: &CheckFinding) -> String {
    let mut s = f.observation.as_str().to_owned();
    if !f.parts.is_empty() {
        s.push_str(&format!(" ({})", f.parts.join(", ")));
    }
    s
}

impl Enforcer {
    /// An enforcer of `guard` for `source`, tool names recorded as `prefix` + name.
    #[must_use]
    pub fn new(guard: ToolGuard, source: Option<String>, prefix: Option<String>) -> Self {
        Self {
            guard,
            source,
            prefix: prefix.unwrap_or_default(),
            state: Mutex::new(SessionState {
                stale: true,
                ..SessionState::default()
            }),
            fresh: tokio::sync::Notify::new(),
        }
    }

    /// A new session's enforcer under the same baseline and policy: it
    /// keeps this one's source-wide findings (those of the start check)
    /// and awaits its first list.
    #[must_use]
    pub fn fork(&self) -> Self {
        let st = self.lock();
        Self {
            guard: self.guard.clone(),
            source: self.source.clone(),
            prefix: self.prefix.clone(),
            state: Mutex::new(SessionState {
                standing: st.standing.clone(),
                session: st.session.clone(),
                stale: true,
                ..SessionState::default()
            }),
            fresh: tokio::sync::Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, SessionState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The guard.
    #[must_use]
    pub fn guard(&self) -> &ToolGuard {
        &self.guard
    }

    fn apply_session(&self, st: &mut SessionState, findings: &[CheckFinding]) {
        for f in findings.iter().filter(|f| f.tool.is_none()) {
            if f.effect >= CheckEffect::PauseSession
                && st.session.as_ref().is_none_or(|(e, _)| f.effect > *e)
            {
                st.session = Some((f.effect, why(f)));
            }
        }
    }

    /// The check at start, before the server is used: `None` when nothing
    /// differs (no record is needed), else the body to record.
    #[must_use]
    pub fn start(&self, server: &ServerId, now: UnixMillis) -> Option<ToolCheck> {
        let findings = self.guard.start_findings(server, now);
        let mut st = self.lock();
        self.apply_session(&mut st, &findings);
        st.standing.extend(findings.iter().cloned());
        if findings.is_empty() {
            return None;
        }
        st.checks += 1;
        Some(
            self.guard
                .body(self.source.clone(), CheckTrigger::Start, None, findings),
        )
    }

    /// The server's `initialize` result; its findings hold for the
    /// session. Returns the check to record when they deny it (no list
    /// check follows then).
    pub fn initialized(&self, result: &Value, now: UnixMillis) -> Option<ToolCheck> {
        let findings = self.guard.initialize_findings(result, now);
        let mut st = self.lock();
        self.apply_session(&mut st, &findings);
        st.standing.extend(findings);
        if !matches!(st.session, Some((CheckEffect::Deny, _))) {
            return None;
        }
        st.checks += 1;
        let all = st.standing.clone();
        Some(
            self.guard
                .body(self.source.clone(), CheckTrigger::Initialize, None, all),
        )
    }

    /// The list may have changed (`notifications/tools/list_changed`):
    /// calls wait for the next one.
    pub fn list_changed(&self) {
        self.lock().stale = true;
    }

    /// A complete tool list, or `Err(observation)` when none could be read
    /// (`list_malformed`, `server_unavailable`, `list_truncated`). Updates
    /// the paused tools and returns the check to record.
    pub fn list(
        &self,
        trigger: CheckTrigger,
        tools: Result<&[Value], CheckObservation>,
        now: UnixMillis,
    ) -> ToolCheck {
        let (mut findings, offered) = match tools {
            Ok(t) => self.guard.list_findings(t, &self.prefix, now),
            Err(o) => (
                vec![self.guard.finding(o, None, Vec::new(), None, now)],
                None,
            ),
        };
        let mut body;
        {
            let mut st = self.lock();
            let mut all = st.standing.clone();
            all.append(&mut findings);
            self.apply_session(&mut st, &all);
            if offered.is_some() {
                st.paused = all
                    .iter()
                    .filter(|f| f.effect == CheckEffect::PauseTool)
                    .filter_map(|f| f.tool.clone().map(|t| (t, why(f))))
                    .collect();
            }
            st.stale = false;
            st.checks += 1;
            let listed = offered.is_some();
            body = self.guard.body(self.source.clone(), trigger, offered, all);
            if !listed {
                // No list was read: the tools paused before stay paused.
                body.paused = st.paused.keys().cloned().collect();
            }
        }
        self.fresh.notify_waiters();
        body
    }

    /// Waits until the check is no longer stale, at most `timeout`; false
    /// when it still is.
    pub async fn wait_fresh(&self, timeout: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.fresh.notified();
            if !self.lock().stale {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return !self.lock().stale;
            }
        }
    }

    /// Whether the session is denied (it stops).
    #[must_use]
    pub fn denied(&self) -> Option<String> {
        match &self.lock().session {
            Some((CheckEffect::Deny, why)) => Some(why.clone()),
            _ => None,
        }
    }

    /// What to do with a call to `tool` (the recorded name).
    #[must_use]
    pub fn admit(&self, tool: &str) -> Admission {
        let st = self.lock();
        match &st.session {
            Some((CheckEffect::Deny, why)) => {
                return Admission::Refuse(Refusal::new(
                    "session_denied",
                    format!("the tool check denied this session: {why} (the approved baseline does not hold; approve again with tally tools approve)"),
                ))
            }
            Some((_, why)) => {
                return Admission::Refuse(Refusal::new(
                    "session_paused",
                    format!("the tool check paused this session: {why}"),
                ))
            }
            None => {}
        }
        if st.stale {
            return Admission::Wait;
        }
        match st.paused.get(tool) {
            Some(why) => Admission::Refuse(Refusal::new(
                "tool_paused",
                format!("the tool check paused {tool}: {why}; its definition is not the approved one (approve it with tally tools approve)"),
            )),
            None => Admission::Forward,
        }
    }

    /// Filters the tools of one `tools/list` answer page the client is
    /// about to see: paused tools (and every tool of a paused session) are
    /// left out. Returns whether anything was left out.
    pub fn filter_page(&self, msg: &mut Value, now: UnixMillis) -> bool {
        let session_stopped = self.lock().session.is_some();
        let Some(tools) = msg
            .get_mut("result")
            .and_then(|r| r.get_mut("tools"))
            .and_then(Value::as_array_mut)
        else {
            return false;
        };
        let before = tools.len();
        tools.retain(|def| {
            !session_stopped && self.guard.tool_effect(def, now) < CheckEffect::PauseTool
        });
        tools.len() != before
    }

    /// Checks written so far.
    #[must_use]
    pub fn checks(&self) -> u64 {
        self.lock().checks
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(name: &str, desc: &str) -> Value {
        json!({"name": name, "description": desc, "inputSchema": {"type": "object"}})
    }

    fn guard(policy: &str, lock: &Lockfile) -> ToolGuard {
        ToolGuard::from_bytes(
            &serde_json::to_vec(lock).unwrap(),
            "lock",
            policy.as_bytes(),
            "policy",
        )
        .unwrap()
    }

    fn lock_of(tools: &[Value]) -> Lockfile {
        Lockfile::from_definitions(
            tools,
            Some("s".into()),
            ServerId::Command(vec!["srv".into()]),
            None,
            "alice".into(),
            UnixMillis::new(1_000_000),
        )
        .unwrap()
    }

    #[test]
    fn defaults_pause_changed_and_added_tools_and_keep_exceptions_apart() {
        let now = UnixMillis::new(2_000_000);
        let lock = lock_of(&[tool("a", "A"), tool("b", "B"), tool("gone", "G")]);
        let g = guard(r#"{"tally_tools_policy":1}"#, &lock);
        let (f, offered) =
            g.list_findings(&[tool("a", "A"), tool("b", "B!"), tool("c", "C")], "", now);
        let got: Vec<_> = f
            .iter()
            .map(|f| (f.tool.clone().unwrap(), f.observation, f.effect))
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "b".into(),
                    CheckObservation::DescriptionChanged,
                    CheckEffect::PauseTool
                ),
                (
                    "c".into(),
                    CheckObservation::ToolAdded,
                    CheckEffect::PauseTool
                ),
                (
                    "gone".into(),
                    CheckObservation::ToolRemoved,
                    CheckEffect::Proceed
                ),
            ]
        );
        assert!(offered.is_some());
        let g = guard(
            r#"{"tally_tools_policy":1,"exceptions":[{"tool":"b","observation":"description_changed","by":"bob","until":"1970-01-01T00:40:00.000Z"}]}"#,
            &lock,
        );
        let (f, _) = g.list_findings(
            &[tool("a", "A"), tool("b", "B!"), tool("gone", "G")],
            "",
            now,
        );
        assert_eq!(f[0].effect, CheckEffect::Exception);
        assert_eq!(f[0].exception.as_ref().unwrap().by, "bob");
        let body = g.body(None, CheckTrigger::ToolsList, None, f);
        assert_eq!(body.effect, CheckEffect::Exception);
        assert!(body.paused.is_empty());
        // After its end the exception no longer applies.
        let later = UnixMillis::new(2_400_001);
        let (f, _) = g.list_findings(
            &[tool("a", "A"), tool("b", "B!"), tool("gone", "G")],
            "",
            later,
        );
        assert_eq!(f[0].effect, CheckEffect::PauseTool);
    }

    #[test]
    fn start_findings_identity_age_and_signature() {
        let now = UnixMillis::new(2_000_000);
        let mut lock = lock_of(&[tool("a", "A")]);
        let key = SecretKey::from_seed(&[7; 32]);
        lock.sign(&key);
        let known = format!(
            r#"{{"tally_tools_policy":1,"require_signature":true,"approver_keys":["{}"]}}"#,
            key.public_key().to_base64()
        );
        let srv = ServerId::Command(vec!["srv".into()]);
        assert!(guard(&known, &lock).start_findings(&srv, now).is_empty());
        let obs = |g: &ToolGuard, s: &ServerId, t| {
            g.start_findings(s, t)
                .iter()
                .map(|f| (f.observation, f.effect))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            obs(&guard(r#"{"tally_tools_policy":1}"#, &lock), &srv, now),
            vec![(CheckObservation::KeyUnknown, CheckEffect::Deny)]
        );
        assert_eq!(
            obs(
                &guard(&known, &lock),
                &ServerId::Url("http://x".into()),
                now
            ),
            vec![(CheckObservation::ServerIdentityChanged, CheckEffect::Deny)]
        );
        let old = UnixMillis::new(1_000_000 + 91 * 86_400_000);
        assert_eq!(
            obs(&guard(&known, &lock), &srv, old),
            vec![(CheckObservation::BaselineExpired, CheckEffect::PauseSession)]
        );
        let mut tampered = lock.clone();
        tampered.approved_by = "mallory".into();
        assert_eq!(
            obs(&guard(&known, &tampered), &srv, now),
            vec![(CheckObservation::SignatureInvalid, CheckEffect::Deny)]
        );
        let mut unsigned = lock;
        unsigned.signature = None;
        assert_eq!(
            obs(&guard(&known, &unsigned), &srv, now),
            vec![(CheckObservation::SignatureMissing, CheckEffect::Deny)]
        );
    }

    #[test]
    fn bad_policies_and_lockfiles_are_refused_with_their_code() {
        let lock = serde_json::to_vec(&lock_of(&[tool("a", "A")])).unwrap();
        for bad in [
            "{",
            r#"{"tally_tools_policy":2}"#,
            r#"{"tally_tools_policy":1,"effects":{"tool_renamed":"deny"}}"#,
            r#"{"tally_tools_policy":1,"effects":{"tool_added":"ignore"}}"#,
            r#"{"tally_tools_policy":1,"effects":{"baseline_expired":"pause_tool"}}"#,
            r#"{"tally_tools_policy":1,"unknown":1}"#,
            r#"{"tally_tools_policy":1,"approver_keys":["x"]}"#,
        ] {
            let e = ToolGuard::from_bytes(&lock, "l", bad.as_bytes(), "p").unwrap_err();
            assert_eq!(e.code, "bad_policy", "{bad}: {e}");
        }
        let mut l: Value = serde_json::from_slice(&lock).unwrap();
        l["tools"][0]["definition"]["description"] = json!("changed");
        let e = ToolGuard::from_bytes(
            &serde_json::to_vec(&l).unwrap(),
            "l",
            b"{\"tally_tools_policy\":1}",
            "p",
        )
        .unwrap_err();
        assert_eq!(e.code, "bad_lockfile");
        let e = ToolGuard::from_bytes(b"[]", "l", b"{\"tally_tools_policy\":1}", "p").unwrap_err();
        assert_eq!(e.code, "bad_lockfile");
    }

    #[test]
    fn enforcer_hides_paused_tools_and_refuses_their_calls() {
        let now = UnixMillis::new(2_000_000);
        let lock = lock_of(&[tool("a", "A"), tool("b", "B")]);
        let e = Enforcer::new(
            guard(r#"{"tally_tools_policy":1}"#, &lock),
            Some("s".into()),
            None,
        );
        assert_eq!(e.admit("a"), Admission::Wait);
        let offered = [tool("a", "A"), tool("b", "B changed")];
        let body = e.list(CheckTrigger::Initialize, Ok(&offered), now);
        assert_eq!(body.paused, vec!["b".to_owned()]);
        assert_eq!(e.admit("a"), Admission::Forward);
        let Admission::Refuse(r) = e.admit("b") else {
            panic!()
        };
        assert_eq!(r.reason, "tool_paused");
        assert!(
            r.message.contains("description_changed (description)"),
            "{}",
            r.message
        );
        let mut page = json!({"jsonrpc":"2.0","id":1,"result":{"tools": offered}});
        assert!(e.filter_page(&mut page, now));
        assert_eq!(page["result"]["tools"].as_array().unwrap().len(), 1);
        e.list_changed();
        assert_eq!(e.admit("a"), Admission::Wait);
        let body = e.list(
            CheckTrigger::ListChanged,
            Err(CheckObservation::ServerUnavailable),
            now,
        );
        assert_eq!(body.effect, CheckEffect::PauseSession);
        assert_eq!(body.paused, vec!["b".to_owned()]);
        let Admission::Refuse(r) = e.admit("a") else {
            panic!()
        };
        assert_eq!(r.reason, "session_paused");
    }
}
