//! The tool policy of docs/operations.md "Approved tool definitions": its
//! format, the default effect of each observation, and approved exceptions.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tally_schemas::record::{CheckEffect, CheckException, CheckObservation};
use tally_schemas::{PublicKey, UnixMillis};

use super::GuardError;

/// The policy format version.
pub const POLICY_VERSION: u64 = 1;
/// A baseline's maximum age when the policy gives none, in days.
pub const DEFAULT_MAX_AGE_DAYS: u64 = 90;

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
    pub(super) fn effect(
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
