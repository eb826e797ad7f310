//! Tests of the tool check (docs/protocol.md §5.7, docs/operations.md
//! "Approved tool definitions").

use serde_json::{json, Value};
use tally_schemas::record::{CheckEffect, CheckObservation, CheckTrigger};
use tally_schemas::{SecretKey, UnixMillis};

use super::*;

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
    let (f, offered) = g.list_findings(&[tool("a", "A"), tool("b", "B!"), tool("c", "C")], "", now);
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
