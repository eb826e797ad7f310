//! Action tools (docs/protocol.md §5.2 "Action outcomes", §5.6): reading a
//! call's proof from its result, resolving the outcome's `state`, and
//! finding a model turn's claims of action tools it did not call. One
//! implementation for the gateway and both SDKs (gateway/src/sdk.rs), so a
//! proof path or a claim phrase means the same everywhere.

use rand_core::CryptoRngCore;
use serde_json::Value;
use tally_schemas::record::{ActionState, OutcomeStatus};
use tally_schemas::Hash;

use crate::store::Secret;

/// Longest proof path, in bytes.
const MAX_PATH_BYTES: usize = 256;
/// Most steps in a proof path.
const MAX_PATH_STEPS: usize = 16;

/// Where in a result an action's proof is: a member name (`message_id`),
/// or a path of member names and array indices (`$.receipt.ids[0]`,
/// `receipt.ids.0`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProofPath {
    steps: Vec<Step>,
    text: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Member(String),
    Index(usize),
}

impl ProofPath {
    /// Parses a path: an optional leading `$` or `$.`, then member names
    /// separated by `.`, each optionally followed by `[n]` indices; a step
    /// that is all digits reads an array index when the value there is an
    /// array.
    ///
    /// # Errors
    /// A sentence saying what is wrong (empty, too long, an empty step, an
    /// unclosed or non-numeric index).
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.len() > MAX_PATH_BYTES {
            return Err(format!(
                "proof path is {} bytes, more than {MAX_PATH_BYTES}",
                text.len()
            ));
        }
        let body = text
            .strip_prefix("$.")
            .or_else(|| text.strip_prefix('$'))
            .unwrap_or(text);
        if body.is_empty() {
            return Err("proof path is empty".into());
        }
        let mut steps = Vec::new();
        for part in body.split('.') {
            let (name, mut rest) = match part.split_once('[') {
                Some((_, "")) => return Err(format!("proof path {text:?} has an unclosed [")),
                Some((n, r)) => (n, r),
                None => (part, ""),
            };
            if name.is_empty() && rest.is_empty() {
                return Err(format!("proof path {text:?} has an empty step"));
            }
            if !name.is_empty() {
                steps.push(Step::Member(name.to_owned()));
            }
            while !rest.is_empty() {
                let Some((index, after)) = rest.split_once(']') else {
                    return Err(format!("proof path {text:?} has an unclosed ["));
                };
                let index: usize = index
                    .parse()
                    .map_err(|_| format!("proof path {text:?}: [{index}] is not an array index"))?;
                steps.push(Step::Index(index));
                rest = match after.strip_prefix('[') {
                    Some(r) => r,
                    None if after.is_empty() => "",
                    None => return Err(format!("proof path {text:?}: {after:?} after ]")),
                };
            }
        }
        if steps.len() > MAX_PATH_STEPS {
            return Err(format!(
                "proof path {text:?} has more than {MAX_PATH_STEPS} steps"
            ));
        }
        Ok(Self {
            steps,
            text: text.to_owned(),
        })
    }

    /// The path as written.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The value at this path in `result`, if there is one.
    #[must_use]
    pub fn read<'a>(&self, result: &'a Value) -> Option<&'a Value> {
        let mut at = result;
        for step in &self.steps {
            at = match (step, at) {
                (Step::Member(name), Value::Object(o)) => o.get(name)?,
                (Step::Member(name), Value::Array(a)) => a.get(name.parse::<usize>().ok()?)?,
                (Step::Index(i), Value::Array(a)) => a.get(*i)?,
                _ => return None,
            };
        }
        Some(at)
    }
}

/// The proof text of a value (§5.2): a non-empty string that is valid
/// text (1–256 bytes, no control character) as it is, a number as its
/// JSON text; anything else is no proof.
#[must_use]
pub fn proof_text(value: &Value) -> Option<String> {
    let text = match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => return None,
    };
    let ok = !text.is_empty()
        && text.len() <= tally_schemas::limits::MAX_NAME_BYTES
        && !text.chars().any(char::is_control);
    ok.then_some(text)
}

/// An action outcome's members, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// `state`.
    pub state: ActionState,
    /// `proof`, when kept in clear.
    pub proof: Option<String>,
    /// `proof_hash`, otherwise.
    pub proof_hash: Option<Hash>,
    /// The proof's salt (and the proof when content is kept), for the
    /// local store.
    pub secret: Option<Secret>,
}

/// Resolves an action call's outcome (§5.2): `posted` for status `ok` with
/// a proof, `unknown` for `ok` without one and for the statuses where the
/// call may have run without an answer, `failed` for `error` and
/// `not_run`. The proof is kept in clear when `in_clear`, else salted and
/// hashed (§6.1, the proof as a JSON string) and its salt returned.
#[must_use]
pub fn resolve(
    status: OutcomeStatus,
    proof: Option<String>,
    in_clear: bool,
    keep_content: bool,
    rng: &mut impl CryptoRngCore,
) -> Resolved {
    let state = match status {
        OutcomeStatus::Ok if proof.is_some() => ActionState::Posted,
        OutcomeStatus::Error | OutcomeStatus::NotRun => ActionState::Failed,
        _ => ActionState::Unknown,
    };
    let mut out = Resolved {
        state,
        proof: None,
        proof_hash: None,
        secret: None,
    };
    if state != ActionState::Posted {
        return out;
    }
    let Some(proof) = proof else {
        return out;
    };
    if in_clear {
        out.proof = Some(proof);
        return out;
    }
    match Secret::for_content(&Value::String(proof), keep_content, rng) {
        Ok((hash, secret)) => {
            out.proof_hash = Some(hash);
            out.secret = Some(secret);
        }
        // A string of valid text always has a canonical form; should it
        // not, the call is stated without proof rather than with a wrong one.
        Err(_) => out.state = ActionState::Unknown,
    }
    out
}

/// An action tool as the claim check sees it: its name and the phrases
/// its owner declared ("sent the email", "email is on its way").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ActionTool {
    /// The tool's name.
    pub name: String,
    /// Declared phrases, matched on word boundaries, case-insensitively.
    pub phrases: Vec<String>,
}

/// Words that, up to three words before a match, make it no claim ("I have
/// not sent the email", "I couldn't send").
const NEGATIONS: &[&str] = &[
    "not", "no", "never", "cannot", "can't", "couldn't", "didn't", "don't", "doesn't", "haven't",
    "hasn't", "hadn't", "wasn't", "weren't", "isn't", "aren't", "won't", "wouldn't", "unable",
    "failed", "without", "yet", "before",
];

/// Irregular past forms of verbs tool names start with.
const IRREGULAR: &[(&str, &[&str])] = &[
    ("send", &["sent"]),
    ("pay", &["paid"]),
    ("write", &["wrote", "written"]),
    ("make", &["made"]),
    ("buy", &["bought"]),
    ("put", &["put"]),
    ("set", &["set"]),
    ("give", &["gave", "given"]),
    ("take", &["took", "taken"]),
    ("run", &["ran"]),
    ("do", &["did", "done"]),
    ("get", &["got", "gotten"]),
    ("begin", &["began", "begun"]),
    ("forward", &["forwarded"]),
    ("sell", &["sold"]),
    ("tell", &["told"]),
    ("wire", &["wired"]),
];

/// The past forms a claim of verb `verb` uses.
fn past_forms(verb: &str) -> Vec<String> {
    if let Some((_, forms)) = IRREGULAR.iter().find(|(v, _)| *v == verb) {
        return forms.iter().map(|f| (*f).to_owned()).collect();
    }
    let mut out = Vec::new();
    if let Some(stem) = verb.strip_suffix('e') {
        out.push(format!("{stem}ed"));
    } else if let Some(stem) = verb
        .strip_suffix('y')
        .filter(|s| s.chars().last().is_some_and(|c| !"aeiou".contains(c)))
    {
        out.push(format!("{stem}ied"));
    } else {
        out.push(format!("{verb}ed"));
        if let Some(last) = verb.chars().last().filter(|c| !"aeiouwxy".contains(*c)) {
            out.push(format!("{verb}{last}ed"));
        }
    }
    out
}

/// Lowercase words: letters, digits and apostrophes (’ read as ').
fn words(text: &str) -> Vec<String> {
    text.to_lowercase()
        .replace('\u{2019}', "'")
        .split(|c: char| !(c.is_alphanumeric() || c == '\''))
        .filter(|w| !w.is_empty())
        .map(|w| w.trim_matches('\'').to_owned())
        .filter(|w| !w.is_empty())
        .collect()
}

/// A name's words: `send_email`, `send-email`, `sendEmail` → send, email.
fn name_words(name: &str) -> Vec<String> {
    let mut spaced = String::new();
    let mut prev_lower = false;
    for c in name.chars() {
        if c.is_uppercase() && prev_lower {
            spaced.push(' ');
        }
        prev_lower = c.is_lowercase() || c.is_ascii_digit();
        spaced.push(c);
    }
    words(&spaced.replace(['_', '-', '.', '/', ':'], " "))
}

fn negated(turn: &[String], at: usize) -> bool {
    turn[at.saturating_sub(3)..at]
        .iter()
        .any(|w| NEGATIONS.contains(&w.as_str()) || w.ends_with("n't"))
}

/// Whether `turn` (its words) holds `phrase` (its words) at a place no
/// negation comes just before.
fn holds_phrase(turn: &[String], phrase: &[String]) -> bool {
    if phrase.is_empty() || phrase.len() > turn.len() {
        return false;
    }
    (0..=turn.len() - phrase.len())
        .any(|i| turn[i..i + phrase.len()] == *phrase && !negated(turn, i))
}

/// Whether `turn` claims the tool by its name: a past form of the name's
/// first word (its verb), not negated, with each of the name's other words
/// (its object, a plural `s` allowed) within five words before or after
/// it ("sent the email", "the email was sent"). A one-word name is claimed
/// by its past form alone.
fn holds_name(turn: &[String], name: &[String]) -> bool {
    let Some((verb, objects)) = name.split_first() else {
        return false;
    };
    let forms = past_forms(verb);
    turn.iter().enumerate().any(|(i, w)| {
        if !forms.contains(w) || negated(turn, i) {
            return false;
        }
        let near = &turn[i.saturating_sub(5)..(i + 6).min(turn.len())];
        objects.iter().all(|o| {
            let plural = format!("{o}s");
            near.iter().any(|n| n == o || *n == plural)
        })
    })
}

/// The action tools a model turn's text claims were done, of those it did
/// not call (`called`): by each tool's name and declared phrases
/// (docs/protocol.md §5.6), deterministic, no model. In the order of
/// `tools`, each once.
#[must_use]
pub fn claimed<'a>(text: &str, called: &[String], tools: &'a [ActionTool]) -> Vec<&'a ActionTool> {
    let turn = words(text);
    tools
        .iter()
        .filter(|t| !called.contains(&t.name))
        .filter(|t| {
            holds_name(&turn, &name_words(&t.name))
                || t.phrases.iter().any(|p| holds_phrase(&turn, &words(p)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::OsRng;
    use serde_json::json;

    fn tool(name: &str, phrases: &[&str]) -> ActionTool {
        ActionTool {
            name: name.into(),
            phrases: phrases.iter().map(|p| (*p).to_owned()).collect(),
        }
    }

    fn names(text: &str, called: &[&str], tools: &[ActionTool]) -> Vec<String> {
        let called: Vec<String> = called.iter().map(|c| (*c).to_owned()).collect();
        claimed(text, &called, tools)
            .into_iter()
            .map(|t| t.name.clone())
            .collect()
    }

    #[test]
    fn paths_read_members_and_indices() {
        let v = json!({"message_id": "m-1", "receipt": {"ids": ["a", 7]}});
        let read = |p: &str| ProofPath::parse(p).expect(p).read(&v).cloned();
        assert_eq!(read("message_id"), Some(json!("m-1")));
        assert_eq!(read("$.receipt.ids[1]"), Some(json!(7)));
        assert_eq!(read("receipt.ids.0"), Some(json!("a")));
        assert_eq!(read("$receipt.ids[0]"), Some(json!("a")));
        assert_eq!(read("receipt.missing"), None);
        assert_eq!(read("message_id.x"), None);
        for bad in ["", "$", "a..b", "a[", "a[x]", "a[1]b"] {
            assert!(ProofPath::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn proof_text_takes_strings_and_numbers_only() {
        assert_eq!(proof_text(&json!("m-1")), Some("m-1".into()));
        assert_eq!(proof_text(&json!(42)), Some("42".into()));
        for no in [
            json!(""),
            json!(null),
            json!(true),
            json!({"id": 1}),
            json!("a\u{7}"),
        ] {
            assert_eq!(proof_text(&no), None, "{no}");
        }
    }

    #[test]
    fn states_follow_status_and_proof() {
        let r =
            |s, p: Option<&str>, clear| resolve(s, p.map(str::to_owned), clear, false, &mut OsRng);
        let posted = r(OutcomeStatus::Ok, Some("m-1"), false);
        assert_eq!(posted.state, ActionState::Posted);
        assert!(posted.proof_hash.is_some() && posted.proof.is_none() && posted.secret.is_some());
        let clear = r(OutcomeStatus::Ok, Some("m-1"), true);
        assert_eq!(clear.proof.as_deref(), Some("m-1"));
        assert_eq!(
            r(OutcomeStatus::Ok, None, false).state,
            ActionState::Unknown
        );
        assert_eq!(
            r(OutcomeStatus::Timeout, Some("m"), false).state,
            ActionState::Unknown
        );
        assert_eq!(
            r(OutcomeStatus::Error, Some("m"), false).state,
            ActionState::Failed
        );
        assert_eq!(
            r(OutcomeStatus::NotRun, None, false).state,
            ActionState::Failed
        );
        let failed = r(OutcomeStatus::Error, Some("m"), false);
        assert!(failed.proof.is_none() && failed.proof_hash.is_none());
    }

    #[test]
    fn a_claim_by_name_is_caught_and_a_call_is_not() {
        let tools = [tool("send_email", &[]), tool("refund", &[])];
        assert_eq!(
            names("I've sent the email to the customer", &[], &tools),
            ["send_email"]
        );
        assert_eq!(names("The emails were sent.", &[], &tools), ["send_email"]);
        assert_eq!(
            names(
                "I’ve sent the email to the customer",
                &["send_email"],
                &tools
            ),
            Vec::<String>::new()
        );
        assert_eq!(names("I refunded the claim.", &[], &tools), ["refund"]);
        for not_a_claim in [
            "I will send the email now",
            "I haven't sent the email yet",
            "I could not send the email",
            "I sent the invoice",
            "Shall I send an email?",
        ] {
            assert_eq!(
                names(not_a_claim, &[], &tools),
                Vec::<String>::new(),
                "{not_a_claim}"
            );
        }
    }

    #[test]
    fn declared_phrases_and_name_shapes() {
        let tools = [
            tool("chargeCard", &["payment went through"]),
            tool("create-ticket", &[]),
        ];
        assert_eq!(
            names("Your payment went through!", &[], &tools),
            ["chargeCard"]
        );
        assert_eq!(names("I charged your card.", &[], &tools), ["chargeCard"]);
        assert_eq!(names("Ticket created: T-9", &[], &tools), ["create-ticket"]);
        assert_eq!(
            names("The payment never went through", &[], &tools),
            Vec::<String>::new()
        );
        assert_eq!(past_forms("submit"), ["submited", "submitted"]);
        assert_eq!(past_forms("apply"), ["applied"]);
    }
}
