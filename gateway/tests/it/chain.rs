//! Several writers of one agent's chain (gateway/src/chain/): the first
//! to open it owns the store, the others hand it their records over the
//! socket, and the chain stays one line whoever writes and whoever goes.
//! These run every writer in one process (redb's file lock keeps a second
//! open of the store out just as it keeps a second process out); the
//! end-to-end suites run them as separate processes and kill them.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tally_gateway::chain::{AgentChain, Answer, ChainOptions, DeclaredTools, Request, WriterInfo};
use tally_gateway::state::StateDir;
use tally_gateway::store::ChainStore;
use tally_schemas::record::{NoteBody, ToolEntry, ToolPartDigests};
use tally_schemas::time::SystemClock;
use tally_schemas::{AgentName, Body, Hash, Record, SecretKey};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

fn note(text: &str) -> Body {
    Body::Note(NoteBody { text: text.into() })
}

fn setup() -> (tempfile::TempDir, StateDir, AgentName) {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::new(dir.path());
    let agent = AgentName::new("multi").unwrap();
    state
        .create_agent_with(&agent, &SecretKey::from_seed(&[4; 32]), None, None)
        .unwrap();
    (dir, state, agent)
}

async fn open(state: &StateDir, agent: &AgentName, kind: &str) -> AgentChain {
    AgentChain::open(
        state,
        agent,
        Arc::new(SystemClock),
        ChainOptions {
            me: WriterInfo::new(kind),
            durable: false,
            final_sync: Duration::ZERO,
            window: None,
            keep_trying: false,
        },
    )
    .await
    .unwrap()
}

/// Every record of the chain, checked to be one line: seq 0, 1, … with
/// each `prev` the hash of the record before.
fn whole_chain(state: &StateDir, agent: &AgentName) -> Vec<Record> {
    let store = ChainStore::open(&state.agent(agent).store()).unwrap();
    let records = store.records(0, usize::MAX).unwrap();
    let mut prev: Option<Hash> = None;
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r.seq.get(), i as u64);
        assert_eq!(r.prev, prev, "seq {i}");
        prev = Some(r.hash());
    }
    records
}

fn texts(records: &[Record]) -> Vec<String> {
    records
        .iter()
        .filter_map(|r| match &r.body {
            Body::Note(n) => Some(n.text.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_writers_at_once_make_one_linear_chain() {
    let (_dir, state, agent) = setup();
    let owner = open(&state, &agent, "gateway").await;
    let mut writers = vec![owner.clone()];
    for _ in 0..3 {
        writers.push(open(&state, &agent, "gateway").await);
    }
    let status = owner.status().await.unwrap();
    assert_eq!(status.writers.len(), 4, "{status:?}");
    assert_eq!(status.writers.iter().filter(|w| w.owner).count(), 1);
    let mut tasks = Vec::new();
    for (w, chain) in writers.iter().enumerate() {
        let chain = chain.clone();
        tasks.push(tokio::spawn(async move {
            let mut seqs = Vec::new();
            for i in 0..50 {
                let r = chain
                    .append(note(&format!("w{w}-{i}")), None)
                    .await
                    .unwrap();
                seqs.push(r.seq.get());
            }
            seqs
        }));
    }
    for t in tasks {
        let seqs = t.await.unwrap();
        // A writer's records keep its order.
        assert!(seqs.windows(2).all(|p| p[0] < p[1]), "{seqs:?}");
    }
    for w in writers.iter().rev() {
        w.close().await;
    }
    let records = whole_chain(&state, &agent);
    assert_eq!(records.len(), 200);
    let unique: BTreeSet<_> = texts(&records).into_iter().collect();
    assert_eq!(unique.len(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_owner_goes_a_member_takes_the_chain_over() {
    let (_dir, state, agent) = setup();
    let first = open(&state, &agent, "gateway").await;
    let second = open(&state, &agent, "record").await;
    let third = open(&state, &agent, "sdk").await;
    first.append(note("a"), None).await.unwrap();
    second.append(note("b"), None).await.unwrap();
    first.close().await;
    // The members' next records go through whichever of them took over.
    let c = second.append(note("c"), None).await.unwrap();
    let d = third.append(note("d"), None).await.unwrap();
    assert_eq!((c.seq.get(), d.seq.get()), (2, 3));
    let status = third.status().await.unwrap();
    assert_eq!(status.writers.len(), 2, "{status:?}");
    assert_eq!(status.owner_pid, std::process::id());
    second.close().await;
    third.append(note("e"), None).await.unwrap();
    third.close().await;
    assert_eq!(
        texts(&whole_chain(&state, &agent)),
        ["a", "b", "c", "d", "e"]
    );
}

async fn frame(stream: &mut tokio::net::UnixStream, request: &Request) -> Answer {
    let bytes = serde_json::to_vec(request).unwrap();
    stream
        .write_all(&u32::try_from(bytes.len()).unwrap().to_be_bytes())
        .await
        .unwrap();
    stream.write_all(&bytes).await.unwrap();
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).await.unwrap();
    let mut buf = vec![0u8; u32::from_be_bytes(len) as usize];
    stream.read_exact(&mut buf).await.unwrap();
    serde_json::from_slice(&buf).unwrap()
}

async fn member_socket(state: &StateDir, agent: &AgentName) -> tokio::net::UnixStream {
    let mut s = tokio::net::UnixStream::connect(state.agent(agent).socket())
        .await
        .unwrap();
    let hello = Request::Hello {
        pid: std::process::id(),
        info: WriterInfo::new("test"),
    };
    assert!(matches!(
        frame(&mut s, &hello).await,
        Answer::Welcome { .. }
    ));
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_retried_after_its_owner_went_is_not_written_twice() {
    let (_dir, state, agent) = setup();
    let owner = open(&state, &agent, "gateway").await;
    owner.append(note("before"), None).await.unwrap();
    let append = |retry| Request::Append {
        id: 7,
        kind: tally_schemas::RecordKind::Note,
        body: serde_json::json!({"text": "sent once"}),
        secret: None,
        durable: false,
        retry,
    };
    let mut s = member_socket(&state, &agent).await;
    let Answer::Appended { record, .. } = frame(&mut s, &append(false)).await else {
        panic!("not appended");
    };
    let first = Record::from_json(record.as_bytes()).unwrap();
    // The owner goes (its answer could have been lost with it); a new one
    // is asked again, as a retry, and answers the record already there.
    drop(s);
    owner.close().await;
    let next = open(&state, &agent, "gateway").await;
    let mut s = member_socket(&state, &agent).await;
    let Answer::Appended { record, .. } = frame(&mut s, &append(true)).await else {
        panic!("not appended");
    };
    assert_eq!(Record::from_json(record.as_bytes()).unwrap(), first);
    // Not a retry: a second record with the same body is a new record.
    let Answer::Appended { record, .. } = frame(&mut s, &append(false)).await else {
        panic!("not appended");
    };
    assert_eq!(Record::from_json(record.as_bytes()).unwrap().seq.get(), 2);
    drop(s);
    next.close().await;
    assert_eq!(
        texts(&whole_chain(&state, &agent)),
        ["before", "sent once", "sent once"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_frame_that_does_not_parse_is_refused_not_written() {
    let (_dir, state, agent) = setup();
    let owner = open(&state, &agent, "gateway").await;
    let mut s = member_socket(&state, &agent).await;
    let bad = Request::Append {
        id: 1,
        kind: tally_schemas::RecordKind::Note,
        body: serde_json::json!({"text": "x", "extra": 1}),
        secret: None,
        durable: false,
        retry: false,
    };
    let Answer::Refused { code, message, .. } = frame(&mut s, &bad).await else {
        panic!("a body with an unknown member was appended");
    };
    assert_eq!(code, "invalid", "{message}");
    drop(s);
    owner.close().await;
    assert!(whole_chain(&state, &agent).is_empty());
}

fn tool(name: &str) -> ToolEntry {
    ToolEntry {
        name: name.into(),
        recorded: true,
        digest: Hash::sha256(name.as_bytes()),
        parts: ToolPartDigests::default(),
    }
}

fn declared(source: &str, names: &[&str]) -> DeclaredTools {
    DeclaredTools {
        source: Some(source.into()),
        lease_ms: Some(60_000),
        entries: names.iter().map(|n| tool(n)).collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sources_declare_their_own_lists_and_may_not_share_a_name() {
    let (_dir, state, agent) = setup();
    let a = open(&state, &agent, "gateway").await;
    let b = open(&state, &agent, "gateway").await;
    assert!(a
        .declare_tools(declared("fs.", &["fs.read"]))
        .await
        .unwrap());
    assert!(b
        .declare_tools(declared("web.", &["web.get"]))
        .await
        .unwrap());
    // The same list of the same source again, at once: not recorded again.
    assert!(!a
        .declare_tools(declared("fs.", &["fs.read"]))
        .await
        .unwrap());
    let e = b
        .declare_tools(declared("other", &["fs.read"]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), "tool_name_conflict", "{e}");
    assert!(e.to_string().contains("fs.read"), "{e}");
    a.close().await;
    b.close().await;
    let records = whole_chain(&state, &agent);
    let lists: Vec<_> = records
        .iter()
        .filter_map(|r| match &r.body {
            Body::Tools(t) => Some(t.tools.iter().map(|e| e.name.clone()).collect::<Vec<_>>()),
            _ => None,
        })
        .collect();
    assert_eq!(
        lists,
        [vec!["fs.read".to_owned()], vec!["web.get".to_owned()]]
    );
}

/// A disclosure (docs/protocol.md §6.3) asked for while a writer holds the
/// store: `peek_disclosure` cannot open the store (its lock is held), asks
/// the holder over its socket, and gets the call's content with the salt
/// the decision's hash was made with; a call the chain does not hold is
/// named in the holder's refusal. Once the holder is gone, the same comes
/// from the store directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disclosure_is_read_by_the_writer_that_holds_the_store() {
    use tally_gateway::chain::peek_disclosure;
    use tally_gateway::disclose::Parts;
    use tally_gateway::store::Secret;
    use tally_schemas::hash::salted_hash;
    use tally_schemas::record::Decision;

    let (_dir, state, agent) = setup();
    let holder = open(&state, &agent, "gateway").await;
    let input = serde_json::json!({"message": "hello <b>there</b>"});
    let salt = [7u8; 16];
    let canonical = tally_schemas::canonical::canonicalize(&input).unwrap();
    holder
        .append(
            Body::Decision(Decision {
                call_id: "c1".into(),
                tool: "echo".into(),
                input_hash: salted_hash(&salt, &canonical),
            }),
            Some(Secret {
                salt: hex::encode(salt),
                content: Some(input.clone()),
                proof: None,
            }),
        )
        .await
        .unwrap();
    let parts = Parts {
        input: true,
        output: false,
    };
    let d = peek_disclosure(&state, &agent, "c1", parts).await.unwrap();
    let part = d.input.expect("the input");
    assert_eq!(part.content, input);
    assert_eq!(part.salt, hex::encode(salt));
    assert_eq!((d.agent.as_str(), d.call_id.as_str()), ("multi", "c1"));
    let missing = peek_disclosure(&state, &agent, "c9", parts)
        .await
        .unwrap_err();
    assert!(missing.contains("holds no call \"c9\""), "{missing}");

    holder.close().await;
    let again = peek_disclosure(&state, &agent, "c1", parts).await.unwrap();
    assert_eq!(again.input.unwrap().content, input);
}
