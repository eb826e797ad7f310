//! The cosigner's routes without sockets (`Router` + `oneshot`) over a real
//! redb state file: every answer of c2sp.org/tlog-witness add-checkpoint,
//! the monitoring route, and the state across reopening; plus the
//! compare-and-swap under concurrent requests from two forks.

use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use axum::http::Request;
use base64::Engine as _;
use http_body_util::BodyExt as _;
use tally_cosigner::config::{origin_hash, Logs};
use tally_cosigner::cosigner::Cosigner;
use tally_cosigner::http::{router, AppState};
use tally_cosigner::state::State;
use tally_schemas::cosignature::{AddCheckpointRequest, CosignatureSigner, CosignatureVerifier};
use tally_schemas::hash::leaf_hash;
use tally_schemas::keys::SecretKey;
use tally_schemas::note::{Checkpoint, NoteSigner};
use tally_schemas::time::UnixMillis;
use tally_schemas::tree::{empty_root, reference, TreeSize};
use tally_schemas::Hash;
use tally_testkit::clock::{FixedClock, TestClock};
use tower::ServiceExt as _;

const ORIGIN: &str = "log.example/tree";
const NOW: i64 = 1_800_000_000_000;

struct TestLog {
    signer: NoteSigner,
    leaves: Vec<Hash>,
}

impl TestLog {
    fn new(seed: u8) -> Self {
        Self {
            signer: NoteSigner::from_secret(ORIGIN, SecretKey::from_seed(&[seed; 32])).unwrap(),
            leaves: Vec::new(),
        }
    }

    fn grow(&mut self, n: usize, tag: &str) {
        for i in 0..n {
            let k = self.leaves.len();
            self.leaves
                .push(leaf_hash(format!("{tag} {k} {i}").as_bytes()));
        }
    }

    fn note(&self) -> String {
        let cp = Checkpoint::new(
            ORIGIN,
            TreeSize::new(self.leaves.len() as u64),
            reference::root(&self.leaves),
        );
        self.signer.sign_checkpoint(&cp).unwrap()
    }

    fn proof(&self, from: usize) -> Vec<Hash> {
        if from == 0 || from == self.leaves.len() {
            return Vec::new();
        }
        reference::consistency_proof(from, &self.leaves)
    }

    fn request(&self, old: usize) -> String {
        AddCheckpointRequest {
            old_size: TreeSize::new(old as u64),
            proof: self.proof(old),
            note: self.note(),
        }
        .to_body()
    }
}

fn cosigner_key() -> CosignatureSigner {
    CosignatureSigner::from_secret("cosigner.example/c1", SecretKey::from_seed(&[9; 32])).unwrap()
}

fn make(dir: &Path, log: &TestLog) -> Arc<Cosigner> {
    let key = cosigner_key();
    let path = dir.join("state.redb");
    let state = if path.exists() {
        State::open(&path, &key.verifier().vkey()).unwrap()
    } else {
        State::create(&path, &key.verifier().vkey()).unwrap()
    };
    let mut logs = Logs::default();
    logs.add(ORIGIN, &[log.signer.verifier().clone()]).unwrap();
    Arc::new(Cosigner::new(
        key,
        logs,
        state,
        Arc::new(FixedClock(UnixMillis::new(NOW))),
    ))
}

async fn call(c: &Arc<Cosigner>, method: &str, path: &str, body: Vec<u8>) -> (u16, String, String) {
    let app = router(AppState {
        cosigner: Arc::clone(c),
        pause_before_answer: None,
    });
    let resp = app
        .oneshot(
            Request::builder()
                .method(method)
                .uri(path)
                .body(Body::from(body))
                .unwrap(),
        )
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let ct = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, ct, String::from_utf8(body.to_vec()).unwrap())
}

async fn add(c: &Arc<Cosigner>, body: &str) -> (u16, String, String) {
    call(c, "POST", "/add-checkpoint", body.as_bytes().to_vec()).await
}

/// Checks a 200 answer: one line by the cosigner's key over `note`'s body,
/// timestamped `NOW` in seconds.
fn check_cosignature(answer: &str, note: &str) {
    let body = note.split("\n\n").next().unwrap().to_owned() + "\n";
    let sig = signed_note::Signature::from_bytes(answer.trim_end_matches('\n').as_bytes()).unwrap();
    assert_eq!(answer.matches('\n').count(), 1, "{answer}");
    let key: CosignatureVerifier = cosigner_key().verifier().clone();
    assert_eq!((sig.name(), sig.id()), (key.name(), key.id()));
    assert_eq!(
        key.verify_cosignature(body.as_bytes(), sig.signature()),
        Ok((NOW / 1000) as u64)
    );
}

#[tokio::test]
async fn every_answer_of_add_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = TestLog::new(1);
    let c = make(dir.path(), &log);

    // A first checkpoint (old size 0, no proof) is cosigned.
    log.grow(5, "a");
    let (status, ct, answer) = add(&c, &log.request(0)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(ct, "text/plain; charset=utf-8");
    check_cosignature(&answer, &log.note());

    // The same checkpoint again (old = size, same root): cosigned again.
    let (status, _, answer) = add(&c, &log.request(5)).await;
    assert_eq!(status, 200, "{answer}");

    // Grown, with the proof from 5.
    log.grow(8, "a");
    let (status, _, answer) = add(&c, &log.request(5)).await;
    assert_eq!(status, 200, "{answer}");
    check_cosignature(&answer, &log.note());

    // A wrong old size: 409 with the size held, as text/x.tlog.size.
    for old in [0, 5, 12] {
        let (status, ct, answer) = add(&c, &log.request(old)).await;
        assert_eq!(
            (status, ct.as_str(), answer.as_str()),
            (409, "text/x.tlog.size", "13\n")
        );
    }

    // Old size above the checkpoint's: 400.
    let mut body = log.request(13);
    body = body.replacen("old 13\n", "old 14\n", 1);
    let (status, _, answer) = add(&c, &body).await;
    assert_eq!(status, 400, "{answer}");
    assert!(answer.starts_with("old_size_too_large: "), "{answer}");

    // A proof that does not verify: 422, state unchanged.
    log.grow(3, "a");
    let mut bad = AddCheckpointRequest::parse(log.request(13).as_bytes()).unwrap();
    bad.proof[0] = Hash::sha256(b"not a node");
    let (status, _, answer) = add(&c, &bad.to_body()).await;
    assert_eq!(status, 422, "{answer}");
    assert!(answer.starts_with("inconsistent: "), "{answer}");
    // One hash too few: 422 too.
    bad.proof.pop();
    let (status, _, _) = add(&c, &bad.to_body()).await;
    assert_eq!(status, 422);
    let (status, _, answer) = add(&c, &log.request(13)).await;
    assert_eq!(status, 200, "the state did not move: {answer}");

    // Same size, different root: 422.
    let mut other = TestLog::new(1);
    other.grow(16, "fork");
    let (status, _, answer) = add(&c, &other.request(16)).await;
    assert_eq!(status, 422, "{answer}");

    // Unknown origin: 404. A key the cosigner does not know: 403.
    let stranger = NoteSigner::from_secret("other.example/log", SecretKey::from_seed(&[2; 32]))
        .unwrap()
        .sign_checkpoint(&Checkpoint::new(
            "other.example/log",
            TreeSize::new(0),
            empty_root(),
        ))
        .unwrap();
    let (status, _, answer) = add(&c, &format!("old 0\n\n{stranger}")).await;
    assert_eq!(status, 404, "{answer}");
    assert!(answer.starts_with("unknown_origin: "), "{answer}");
    let mut impostor = TestLog::new(3);
    impostor.grow(20, "x");
    let (status, _, answer) = add(&c, &impostor.request(16)).await;
    assert_eq!(status, 403, "{answer}");
    assert!(answer.starts_with("not_signed: "), "{answer}");

    // A signature line by the log's key (name and id) that does not verify:
    // 403, also when a valid line by that key follows (the first line of a
    // key is the one checked, as in Go's note.Open).
    let note = log.note();
    let (text, sigs) = note.split_once("\n\n").unwrap();
    let mut raw = base64::engine::general_purpose::STANDARD
        .decode(sigs.trim_end().rsplit(' ').next().unwrap())
        .unwrap();
    raw[10] ^= 1;
    let broken = format!(
        "{text}\n\n\u{2014} {ORIGIN} {}\n{sigs}",
        base64::engine::general_purpose::STANDARD.encode(raw)
    );
    let (status, _, answer) = add(&c, &format!("old 16\n\n{broken}")).await;
    assert_eq!(status, 403, "{answer}");
    assert!(answer.starts_with("bad_signature: "), "{answer}");

    // Malformed bodies: 400.
    for body in [
        "".to_owned(),
        "old 16\n".to_owned(),
        format!("old 016\n\n{note}"),
        format!("new 16\n\n{note}"),
        format!("old 16\nnot base64\n\n{note}"),
        "old 16\n\nlog.example/tree\n16\nnot a root\n\n— x AAAA\n".to_owned(),
        format!("old 16\n\n{}", note.replace("\n\n", "\n")),
    ] {
        let (status, ct, answer) = add(&c, &body).await;
        assert_eq!(status, 400, "{body:?}: {answer}");
        assert_eq!(ct, "text/plain; charset=utf-8");
    }
    let (status, _, _) = call(&c, "POST", "/add-checkpoint", vec![0xff, 0xfe, b'\n']).await;
    assert_eq!(status, 400);

    // Too large: 413, before parsing.
    let (status, _, answer) = call(&c, "POST", "/add-checkpoint", vec![b'a'; 20_000]).await;
    assert_eq!(status, 413, "{answer}");

    // Other methods and paths.
    let (status, _, _) = call(&c, "GET", "/add-checkpoint", Vec::new()).await;
    assert_eq!(status, 405);
    let (status, _, _) = call(&c, "GET", "/nowhere", Vec::new()).await;
    assert_eq!(status, 404);

    // The empty tree must have the empty root; size 0 from a fresh log.
    let dir2 = tempfile::tempdir().unwrap();
    let empty_log = TestLog::new(1);
    let c2 = make(dir2.path(), &empty_log);
    let wrong_empty = empty_log
        .signer
        .sign_checkpoint(&Checkpoint::new(
            ORIGIN,
            TreeSize::new(0),
            Hash::sha256(b"x"),
        ))
        .unwrap();
    let (status, _, answer) = add(&c2, &format!("old 0\n\n{wrong_empty}")).await;
    assert_eq!(status, 422, "{answer}");
    let (status, _, answer) = add(&c2, &empty_log.request(0)).await;
    assert_eq!(status, 200, "{answer}");
    // From old size 0 a proof must be empty.
    let mut grown = TestLog::new(1);
    grown.grow(4, "g");
    let (status, _, answer) = add(
        &c2,
        &format!(
            "old 0\n{}\n\n{}",
            base64::engine::general_purpose::STANDARD.encode([0u8; 32]),
            grown.note()
        ),
    )
    .await;
    assert_eq!(status, 422, "{answer}");
}

#[tokio::test]
async fn monitoring_route_and_state_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = TestLog::new(1);
    let hash = origin_hash(ORIGIN);
    {
        let c = make(dir.path(), &log);
        let (status, _, _) = call(&c, "GET", &format!("/{hash}/checkpoint"), Vec::new()).await;
        assert_eq!(status, 404, "nothing cosigned yet");
        log.grow(7, "a");
        let (status, _, line) = add(&c, &log.request(0)).await;
        assert_eq!(status, 200);
        let (status, _, served) = call(&c, "GET", &format!("/{hash}/checkpoint"), Vec::new()).await;
        assert_eq!(status, 200);
        assert_eq!(served, format!("{}{line}", log.note()));
        let (_, _, metrics) = call(&c, "GET", "/metrics", Vec::new()).await;
        assert!(
            metrics.contains("tally_cosigner_log_tree_size{origin=\"log.example/tree\"} 7"),
            "{metrics}"
        );
        assert!(metrics.contains("tally_cosigner_add_checkpoint_requests_total{result=\"ok\"} 1"));
    }
    // Reopened: it holds size 7 and refuses to start over from 0.
    let c = make(dir.path(), &log);
    let (status, _, answer) = add(&c, &log.request(0)).await;
    assert_eq!((status, answer.as_str()), (409, "7\n"));
    log.grow(2, "a");
    let (status, _, _) = add(&c, &log.request(7)).await;
    assert_eq!(status, 200);
    // Another key's state file is refused.
    drop(c);
    let other =
        CosignatureSigner::from_secret("cosigner.example/c1", SecretKey::from_seed(&[8; 32]))
            .unwrap();
    assert!(State::open(&dir.path().join("state.redb"), &other.verifier().vkey()).is_err());
}

#[test]
fn concurrent_requests_from_two_forks_cosign_one_branch_only() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = TestLog::new(1);
    a.grow(4, "base");
    let mut b = TestLog::new(1);
    b.leaves = a.leaves.clone();
    let c = make(dir.path(), &a);
    c.add_checkpoint(a.request(0).as_bytes()).unwrap();
    // Each round both branches grow by one and race from the size held.
    // The first round's race picks a branch; from then on only that
    // branch's requests can be cosigned.
    let mut winners = Vec::new();
    for step in 0..20usize {
        a.grow(1, &format!("a{step}"));
        b.grow(1, &format!("b{step}"));
        let (ra, rb) = (a.request(4 + step), b.request(4 + step));
        let (ca, cb) = (Arc::clone(&c), Arc::clone(&c));
        let ta = std::thread::spawn(move || ca.add_checkpoint(ra.as_bytes()).is_ok());
        let tb = std::thread::spawn(move || cb.add_checkpoint(rb.as_bytes()).is_ok());
        winners.push((ta.join().unwrap(), tb.join().unwrap()));
    }
    let first = winners[0];
    assert!(
        first.0 != first.1,
        "exactly one of the first pair: {winners:?}"
    );
    assert!(
        winners.iter().all(|w| *w == first),
        "every later round goes to the same branch: {winners:?}"
    );
    let held = c.state().latest(ORIGIN).unwrap().unwrap();
    let branch = if first.0 { &a } else { &b };
    assert_eq!(held.root, reference::root(&branch.leaves));
}

#[test]
fn cosignature_timestamps_of_a_log_never_go_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = TestLog::new(1);
    let key = cosigner_key();
    let state = State::create(&dir.path().join("state.redb"), &key.verifier().vkey()).unwrap();
    let mut logs = Logs::default();
    logs.add(ORIGIN, &[log.signer.verifier().clone()]).unwrap();
    let clock = Arc::new(TestClock::at(NOW));
    let c = Cosigner::new(key.clone(), logs, state, clock.clone());
    let timestamp = |line: &str| {
        let sig = signed_note::Signature::from_bytes(line.trim_end().as_bytes()).unwrap();
        u64::from_be_bytes(sig.signature()[..8].try_into().unwrap())
    };
    log.grow(2, "a");
    let first = c.add_checkpoint(log.request(0).as_bytes()).unwrap();
    assert_eq!(timestamp(&first), (NOW / 1000) as u64);
    // The clock steps back an hour: the next cosignature keeps the time of
    // the last one rather than claim an earlier view.
    clock.set(NOW - 3_600_000);
    log.grow(2, "a");
    let second = c.add_checkpoint(log.request(2).as_bytes()).unwrap();
    assert_eq!(timestamp(&second), (NOW / 1000) as u64);
    // A clock at or before the epoch still gives a timestamp of at least 1.
    let dir2 = tempfile::tempdir().unwrap();
    let state = State::create(&dir2.path().join("state.redb"), &key.verifier().vkey()).unwrap();
    let mut logs = Logs::default();
    logs.add(ORIGIN, &[log.signer.verifier().clone()]).unwrap();
    let c = Cosigner::new(key, logs, state, Arc::new(TestClock::at(-5)));
    let line = c.add_checkpoint(log.request(0).as_bytes()).unwrap();
    assert_eq!(timestamp(&line), 1);
}
