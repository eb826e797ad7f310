//! Comparing a server and its offered tool list with the approved baseline,
//! docs/protocol.md §5.7: the findings, their effects under the policy, and
//! the `tool_check` bodies.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::Value;
use tally_schemas::record::{CheckEffect, CheckFinding, CheckObservation, CheckTrigger, ToolCheck};
use tally_schemas::tools::digest_tool_definition;
use tally_schemas::{Hash, PublicKey, Signature, UnixMillis};

use super::lockfile::{list_digest, LockedTool, Lockfile, ServerId};
use super::policy::Policy;
use super::{GuardError, MAX_FILE_BYTES};

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

    pub(super) fn finding(
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
        let malformed = || {
            let finding =
                self.finding(CheckObservation::ListMalformed, None, Vec::new(), None, now);
            (vec![finding], None)
        };
        for def in tools {
            let Ok((name, obs)) = self.tool_observations(def) else {
                return malformed();
            };
            let digest = digest_tool_definition(def)
                .map(|(_, d, _)| d)
                .unwrap_or_else(|_| Hash::sha256(b""));
            if offered.insert(name.clone(), digest).is_some() {
                return malformed();
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
