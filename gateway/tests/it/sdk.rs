//! The blocking writer the language SDKs wrap (gateway/src/sdk.rs), from
//! plain threads as a binding calls it.

use std::time::Duration;

use serde_json::json;
use tally_gateway::sdk::{SdkAgent, SdkError, SdkOptions, SdkTool};
use tally_gateway::state::StateDir;
use tally_gateway::store::ChainStore;
use tally_schemas::{AgentName, Body, SecretKey};

fn setup() -> (tempfile::TempDir, SdkOptions) {
    let dir = tempfile::tempdir().unwrap();
    StateDir::new(dir.path())
        .create_agent_with(
            &AgentName::new("py-bot").unwrap(),
            &SecretKey::from_seed(&[6; 32]),
            None,
            None,
        )
        .unwrap();
    let options = SdkOptions {
        state_dir: Some(dir.path().to_owned()),
        source: Some("prog".into()),
        ..SdkOptions::default()
    };
    (dir, options)
}

#[test]
fn a_missing_agent_says_where_it_looked() {
    let (dir, options) = setup();
    let e = SdkAgent::open("nobody", options).unwrap_err();
    assert_eq!(e.code(), "agent_not_found");
    assert!(e.to_string().contains(dir.path().to_str().unwrap()), "{e}");
}

#[test]
fn calls_from_threads_and_a_second_writer_make_one_chain() {
    let (dir, options) = setup();
    let a = std::sync::Arc::new(SdkAgent::open("py-bot", options.clone()).unwrap());
    let b = SdkAgent::open("py-bot", options).unwrap();
    let tools = ["lookup", "refund"].map(|n| SdkTool {
        name: n.into(),
        recorded: n == "lookup",
        definition: json!({"name": n, "description": format!("{n} things")}),
    });
    assert!(a.declare_tools(&tools).unwrap());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let a = std::sync::Arc::clone(&a);
            std::thread::spawn(move || {
                for i in 0..25 {
                    let call = a
                        .decide(
                            "lookup",
                            None,
                            format!("{{\"i\":{i},\"t\":{t}}}").as_bytes(),
                        )
                        .unwrap();
                    let status = if i % 5 == 0 { "error" } else { "ok" };
                    a.outcome(&call, status, Some(b"{\"found\":true}")).unwrap();
                }
            })
        })
        .collect();
    b.note("from the second writer").unwrap();
    for t in threads {
        t.join().unwrap();
    }
    // Bad input is a clear error, and nothing is written for it.
    let e = b.decide("lookup", None, b"{\"a\":1,\"a\":2}").unwrap_err();
    assert_eq!(e.code(), "bad_content", "{e}");
    let e = b.decide("bad\u{7}name", None, b"{}").unwrap_err();
    assert_eq!(e.code(), "invalid", "{e}");
    let call = b.decide("refund", Some("r-1"), b"{}").unwrap();
    assert_eq!(
        b.outcome(&call, "exploded", None).unwrap_err().code(),
        "invalid"
    );
    b.outcome(&call, "ok", None).unwrap();
    // No witness: sync says so rather than wait.
    let s = b.sync(Duration::from_millis(100)).unwrap();
    assert!(!s.complete && s.error.unwrap().contains("no_witness"));
    b.close();
    assert!(matches!(b.note("after close"), Err(SdkError::Closed)));
    a.close();
    let store = ChainStore::open(
        &StateDir::new(dir.path())
            .agent(&AgentName::new("py-bot").unwrap())
            .store(),
    )
    .unwrap();
    let records = store.records(0, usize::MAX).unwrap();
    let kinds = |k: &str| records.iter().filter(|r| r.kind().as_str() == k).count();
    assert_eq!(
        (
            kinds("tools"),
            kinds("decision"),
            kinds("outcome"),
            kinds("note")
        ),
        (1, 101, 101, 1)
    );
    let Body::Tools(list) = &records[0].body else {
        panic!("the declaration is first");
    };
    assert_eq!(list.source.as_deref(), Some("prog"));
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r.seq.get(), i as u64);
    }
}
