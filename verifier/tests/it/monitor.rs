//! The monitor against a log served by a tiny HTTP server in the test: it
//! follows growth (from the empty tree, through equal sizes), and catches a
//! forked history, a rollback and a checkpoint signed by another key, with
//! the consistency proof from the JSON route and rebuilt from tiles.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use tally_schemas::cosignature::CosignatureSigner;
use tally_schemas::hash::leaf_hash;
use tally_schemas::note::{Checkpoint, NoteSigner};
use tally_schemas::tree::{reference, TreeSize};
use tally_schemas::Hash;
use tally_testkit::fixture::{key_from_label, log_signer};
use tally_verifier::monitor::{
    load_state, tile_path, Checked, Cosignatures, Monitor, MonitorError, ProofSource, Round,
};
use tally_verifier::trust::TrustFile;

const ORIGIN: &str = "tally.local/log";

/// One round's outcome, read from [`Monitor::check_round`] as `tally
/// monitor` reads it (docs/operations.md, "Monitoring").
trait CheckOnce {
    fn check_once(&self) -> Result<Round, MonitorError>;
}

impl CheckOnce for Monitor {
    fn check_once(&self) -> Result<Round, MonitorError> {
        self.check_round().map(|c| c.round)
    }
}

struct View {
    leaves: Vec<Hash>,
    signer: NoteSigner,
    /// Cosigners whose cosignature lines the checkpoint carries.
    cosigners: Vec<CosignatureSigner>,
}

impl View {
    fn respond(&self, path: &str) -> Option<Vec<u8>> {
        let n = self.leaves.len();
        if path == "/checkpoint" {
            let cp = Checkpoint::new(
                ORIGIN,
                TreeSize::new(n as u64),
                reference::root(&self.leaves),
            );
            let mut note = self.signer.sign_checkpoint(&cp).unwrap();
            for (i, c) in self.cosigners.iter().enumerate() {
                note.push_str(&c.cosign(cp.to_body().as_bytes(), 1_800_000_000 + i as u64));
            }
            return Some(note.into_bytes());
        }
        if let Some(q) = path.strip_prefix("/v1/proof/consistency?") {
            let mut from = None;
            let mut to = None;
            for kv in q.split('&') {
                match kv.split_once('=') {
                    Some(("from", v)) => from = v.parse::<usize>().ok(),
                    Some(("to", v)) => to = v.parse::<usize>().ok(),
                    _ => {}
                }
            }
            let (m, to) = (from?, to?);
            if to != n || m > n {
                return None;
            }
            let proof: Vec<String> = reference::consistency_proof(m, &self.leaves)
                .iter()
                .map(Hash::to_hex)
                .collect();
            return Some(
                serde_json::json!({"v": 1, "from": m, "to": to, "consistency": proof})
                    .to_string()
                    .into_bytes(),
            );
        }
        let rest = path.strip_prefix("/tile/")?;
        let (level, rest) = rest.split_once('/')?;
        let level: u32 = level.parse().ok()?;
        let (index_part, width) = match rest.split_once(".p/") {
            Some((i, w)) => (i, w.parse::<usize>().ok()?),
            None => (rest, 256),
        };
        let index: usize = index_part.replace(['x', '/'], "").parse().ok()?;
        let span = 1usize << (8 * level);
        let nodes = n / span;
        if index * 256 + width > nodes {
            return None;
        }
        let mut body = Vec::new();
        for j in index * 256..index * 256 + width {
            body.extend_from_slice(
                reference::root(&self.leaves[j * span..(j + 1) * span]).as_bytes(),
            );
        }
        Some(body)
    }
}

fn serve(view: Arc<Mutex<View>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request = String::new();
            if reader.read_line(&mut request).is_err() {
                continue;
            }
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).is_err() || h == "\r\n" || h.is_empty() {
                    break;
                }
            }
            let path = request.split_whitespace().nth(1).unwrap_or("/").to_owned();
            let answer = view.lock().unwrap().respond(&path);
            let _ = match answer {
                Some(body) => {
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    stream
                        .write_all(head.as_bytes())
                        .and_then(|()| stream.write_all(&body))
                }
                None => stream.write_all(
                    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                ),
            };
        }
    });
    format!("http://{addr}")
}

fn leaves(n: usize, tag: &str) -> Vec<Hash> {
    (0..n)
        .map(|i| leaf_hash(format!("{tag} {i}").as_bytes()))
        .collect()
}

fn run(source: ProofSource) {
    let signer = log_signer(ORIGIN, "log");
    let view = Arc::new(Mutex::new(View {
        leaves: Vec::new(),
        signer: signer.clone(),
        cosigners: Vec::new(),
    }));
    let url = serve(view.clone());
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let monitor = Monitor::new(&url, signer.verifier().clone(), state.clone(), source);
    let set = |l: Vec<Hash>| view.lock().unwrap().leaves = l;

    // The empty log, then growth from it without a proof.
    assert!(matches!(monitor.check_once().unwrap(), Round::First(cp) if cp.size.get() == 0));
    set(leaves(5, "a"));
    assert!(matches!(
        monitor.check_once().unwrap(),
        Round::Advanced { from: 0, .. }
    ));
    // Growth with proofs, across tile boundaries and a level-1 tile.
    for n in [7, 256, 300, 1000, 1030] {
        set(leaves(n, "a"));
        match monitor.check_once().unwrap() {
            Round::Advanced { to, .. } => assert_eq!(to.size.get(), n as u64),
            other => panic!("size {n}: {other:?}"),
        }
    }
    // Equal size: unchanged.
    assert!(matches!(monitor.check_once().unwrap(), Round::Unchanged(_)));
    let saved = load_state(&state).unwrap().unwrap();

    // A fork: leaf 700 rewritten, the tree extended, signed by the same key.
    let mut forked = leaves(1100, "a");
    forked[700] = leaf_hash(b"rewritten");
    set(forked);
    match monitor.check_once().unwrap() {
        Round::Inconsistent(e) => {
            assert_eq!(e.old, saved);
            assert!(e.new.contains("\n1100\n"), "{}", e.new);
            let text = e.to_string();
            assert!(
                text.starts_with("INCONSISTENT: size 1100 is not consistent with size 1030"),
                "{text}"
            );
        }
        other => panic!("fork not caught: {other:?}"),
    }
    assert_eq!(
        load_state(&state).unwrap().unwrap(),
        saved,
        "nothing saved on a fork"
    );
    // It keeps alerting.
    assert!(matches!(
        monitor.check_once().unwrap(),
        Round::Inconsistent(_)
    ));

    // The same size with another root.
    let mut same = leaves(1030, "a");
    same[3] = leaf_hash(b"split view");
    set(same);
    assert!(
        matches!(monitor.check_once().unwrap(), Round::Inconsistent(e) if e.reason.contains("different roots"))
    );

    // A rollback.
    set(leaves(900, "a"));
    assert!(
        matches!(monitor.check_once().unwrap(), Round::Inconsistent(e) if e.reason.contains("shrank"))
    );

    // Another key.
    set(leaves(1040, "a"));
    view.lock().unwrap().signer = log_signer(ORIGIN, "impostor");
    assert!(matches!(
        monitor.check_once(),
        Err(MonitorError::Checkpoint(_))
    ));
    view.lock().unwrap().signer = signer;

    // The honest log again: it advances from the last verified state.
    assert!(matches!(
        monitor.check_once().unwrap(),
        Round::Advanced { from: 1030, .. }
    ));
}

#[test]
fn json_proofs_follow_growth_and_catch_a_fork() {
    run(ProofSource::Json);
}

#[test]
fn tile_proofs_follow_growth_and_catch_a_fork() {
    run(ProofSource::Tiles);
}

#[test]
fn an_empty_checkpoint_with_a_wrong_root_is_refused() {
    let signer = log_signer(ORIGIN, "log");
    let bad = signer
        .sign_checkpoint(&Checkpoint::new(
            ORIGIN,
            TreeSize::new(0),
            Hash::sha256(b"not empty"),
        ))
        .unwrap();
    struct Fixed(String);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let body = Fixed(bad);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut line = String::new();
            let _ = r.read_line(&mut line);
            loop {
                let mut h = String::new();
                if r.read_line(&mut h).is_err() || h == "\r\n" || h.is_empty() {
                    break;
                }
            }
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.0.len()
            );
            let _ = s
                .write_all(head.as_bytes())
                .and_then(|()| s.write_all(body.0.as_bytes()));
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let monitor = Monitor::new(
        &format!("http://{addr}"),
        signer.verifier().clone(),
        dir.path().join("state"),
        ProofSource::Json,
    );
    assert!(matches!(
        monitor.check_once().unwrap(),
        Round::Inconsistent(_)
    ));
    assert!(load_state(&dir.path().join("state")).unwrap().is_none());
}

#[test]
fn cosignatures_are_checked_against_the_trust_files_quorum() {
    let signer = log_signer(ORIGIN, "log");
    let c1 = CosignatureSigner::from_secret("cosigner.example/c1", key_from_label("c1")).unwrap();
    let c2 = CosignatureSigner::from_secret("cosigner.example/c2", key_from_label("c2")).unwrap();
    let view = Arc::new(Mutex::new(View {
        leaves: leaves(9, "a"),
        signer: signer.clone(),
        cosigners: vec![c1.clone(), c2.clone()],
    }));
    let url = serve(view.clone());
    let dir = tempfile::tempdir().unwrap();
    let trust = |quorum: usize| {
        TrustFile::parse(&format!(
            "log {}\nwitness {}\nwitness {}\nquorum {quorum}\n",
            signer.verifier().vkey(),
            c1.verifier().vkey(),
            c2.verifier().vkey()
        ))
        .unwrap()
    };
    let round = |quorum: usize, state: &str| -> Checked {
        let t = trust(quorum);
        Monitor::new(&url, t.log, dir.path().join(state), ProofSource::Json)
            .with_cosigners(t.witnesses)
            .check_round()
            .unwrap()
    };
    // Both cosigned: quorum 2 is met.
    let checked = round(2, "s1");
    assert_eq!(
        checked.cosignatures,
        Some(Cosignatures::Met {
            count: 2,
            quorum: 2
        })
    );
    assert!(matches!(checked.round, Round::First(_)));

    // One cosigner gone: quorum 2 fails, quorum 1 passes; the consistency
    // round goes on either way.
    view.lock().unwrap().cosigners.pop();
    view.lock().unwrap().leaves = leaves(12, "a");
    let checked = round(2, "s1");
    match &checked.cosignatures {
        Some(Cosignatures::NotMet { note, reason }) => {
            assert!(reason.contains("1 of the 2"), "{reason}");
            assert!(
                note.contains("\n12\n"),
                "the checkpoint is kept as evidence"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(checked.round, Round::Advanced { from: 9, .. }));
    assert!(matches!(
        round(1, "s1").cosignatures,
        Some(Cosignatures::Met { count: 1, .. })
    ));

    // A line under c2's name but made with c1's key has another key id:
    // it is no cosignature of c2's, and is ignored.
    let impostor =
        CosignatureSigner::from_secret("cosigner.example/c2", key_from_label("c1")).unwrap();
    view.lock().unwrap().cosigners = vec![c1.clone(), impostor];
    match round(2, "s1").cosignatures {
        Some(Cosignatures::NotMet { reason, .. }) => {
            assert!(reason.contains("1 of the 2"), "{reason}")
        }
        other => panic!("{other:?}"),
    }

    // A line with c2's name and key id whose signature does not verify
    // fails the check, even with quorum 1 (§11.1).
    view.lock().unwrap().cosigners = vec![c1.clone(), c2.clone()];
    let note = String::from_utf8(view.lock().unwrap().respond("/checkpoint").unwrap()).unwrap();
    let last = note.trim_end().rsplit(' ').next().unwrap().to_owned();
    let mut raw = base64::engine::general_purpose::STANDARD
        .decode(&last)
        .unwrap();
    raw[20] ^= 1;
    let tampered = note.replace(
        &last,
        &base64::engine::general_purpose::STANDARD.encode(raw),
    );
    assert!(trust(1)
        .witnesses
        .check(&tampered)
        .unwrap_err()
        .contains("does not verify"));

    // Without cosigners (quorum 0) nothing is checked.
    let checked = round(0, "s2");
    assert_eq!(checked.cosignatures, None);
}

#[test]
fn tile_paths_follow_c2sp() {
    assert_eq!(tile_path(0, 5, 256), "tile/0/005");
    assert_eq!(tile_path(1, 1_234_067, 256), "tile/1/x001/x234/067");
    assert_eq!(tile_path(0, 1000, 7), "tile/0/x001/000.p/7");
}
