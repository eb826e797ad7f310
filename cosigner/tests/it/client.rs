//! The log's client (`tally_cosigner::client`) against the cosigner served
//! on a loopback socket by `server::serve`: the 409 retry, a cosigner that
//! is ahead, refusals, a line that does not verify with the key the log
//! expects, and the server's limits (body size, slow headers).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tally_cosigner::client::{attach_cosignature, ClientError, CosignerClient};
use tally_cosigner::config::Logs;
use tally_cosigner::cosigner::Cosigner;
use tally_cosigner::http::{router, AppState};
use tally_cosigner::server::{serve, Limits};
use tally_cosigner::state::State;
use tally_schemas::cosignature::{CosignatureSigner, CosignatureVerifier};
use tally_schemas::hash::leaf_hash;
use tally_schemas::keys::SecretKey;
use tally_schemas::note::{Checkpoint, NoteSigner};
use tally_schemas::time::SystemClock;
use tally_schemas::tree::{reference, TreeSize};
use tally_schemas::Hash;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const ORIGIN: &str = "log.example/client";

fn log_key() -> NoteSigner {
    NoteSigner::from_secret(ORIGIN, SecretKey::from_seed(&[1; 32])).unwrap()
}

fn cosigner_key() -> CosignatureSigner {
    CosignatureSigner::from_secret("cosigner.example/c", SecretKey::from_seed(&[2; 32])).unwrap()
}

fn leaves(n: usize) -> Vec<Hash> {
    (0..n)
        .map(|i| leaf_hash(format!("leaf {i}").as_bytes()))
        .collect()
}

fn note(leaves: &[Hash]) -> String {
    log_key()
        .sign_checkpoint(&Checkpoint::new(
            ORIGIN,
            TreeSize::new(leaves.len() as u64),
            reference::root(leaves),
        ))
        .unwrap()
}

fn proof_from(leaves: &[Hash]) -> impl FnMut(TreeSize) -> Result<Vec<Hash>, String> + '_ {
    move |old| Ok(reference::consistency_proof(old.get() as usize, leaves))
}

async fn start(dir: &std::path::Path, limits: Limits) -> SocketAddr {
    let key = cosigner_key();
    let state = State::create(&dir.join("state.redb"), &key.verifier().vkey()).unwrap();
    let mut logs = Logs::default();
    logs.add(ORIGIN, &[log_key().verifier().clone()]).unwrap();
    let cosigner = Arc::new(Cosigner::new(key, logs, state, Arc::new(SystemClock)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = router(AppState {
        cosigner,
        pause_before_answer: None,
    });
    tokio::spawn(serve(listener, app, limits, std::future::pending()));
    addr
}

#[tokio::test]
async fn the_client_follows_409_and_checks_what_it_gets() {
    let dir = tempfile::tempdir().unwrap();
    let addr = start(dir.path(), Limits::default()).await;
    let url = format!("http://{addr}");
    let key: CosignatureVerifier = cosigner_key().verifier().clone();
    let client = CosignerClient::new(&url, key.clone(), Duration::from_secs(10)).unwrap();

    let l8 = leaves(8);
    let got = client
        .request_cosignature(&note(&l8), TreeSize::new(0), proof_from(&l8))
        .await
        .unwrap();
    assert_eq!(got.size.get(), 8);
    assert!(got.timestamp > 1_700_000_000);
    let cosigned = attach_cosignature(&note(&l8), &got.line);
    assert!(tally_schemas::note::open_checkpoint(&cosigned, log_key().verifier()).is_ok());

    // The log believes the cosigner holds 3: 409 names 8, the retry with
    // the proof from 8 is cosigned.
    let l20 = leaves(20);
    let got = client
        .request_cosignature(&note(&l20), TreeSize::new(3), proof_from(&l20))
        .await
        .unwrap();
    assert_eq!(got.size.get(), 20);

    // A checkpoint older than what the cosigner holds: it is ahead.
    match client
        .request_cosignature(&note(&l8), TreeSize::new(8), proof_from(&l8))
        .await
    {
        Err(ClientError::Ahead { known, size }) => {
            assert_eq!((known.get(), size.get()), (20, 8));
        }
        other => panic!("{other:?}"),
    }

    // A proof that does not hold: the refusal's status and body come back.
    let l25 = leaves(25);
    match client
        .request_cosignature(&note(&l25), TreeSize::new(20), |_| {
            Ok::<_, String>(vec![Hash::sha256(b"bad"); 3])
        })
        .await
    {
        Err(ClientError::Refused { status: 422, body }) => {
            assert!(body.starts_with("inconsistent: "), "{body}");
        }
        other => panic!("{other:?}"),
    }

    // A client expecting another cosigner key finds no line of its key.
    let other =
        CosignatureSigner::from_secret("cosigner.example/c", SecretKey::from_seed(&[3; 32]))
            .unwrap();
    let wrong =
        CosignerClient::new(&url, other.verifier().clone(), Duration::from_secs(10)).unwrap();
    match wrong
        .request_cosignature(&note(&l25), TreeSize::new(20), proof_from(&l25))
        .await
    {
        Err(ClientError::BadAnswer(m)) => assert!(m.contains("no cosignature"), "{m}"),
        other => panic!("{other:?}"),
    }

    // Nothing listening: a transport error, not a hang.
    let gone = CosignerClient::new("http://127.0.0.1:9", key, Duration::from_secs(5)).unwrap();
    assert!(matches!(
        gone.request_cosignature(&note(&l25), TreeSize::new(0), proof_from(&l25))
            .await,
        Err(ClientError::Transport(_))
    ));
}

#[tokio::test]
async fn the_server_bounds_bodies_and_slow_clients() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits {
        header_timeout: Duration::from_millis(300),
        request_timeout: Duration::from_millis(500),
        ..Limits::default()
    };
    let addr = start(dir.path(), limits).await;

    // A declared body over the limit is refused without reading it.
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"POST /add-checkpoint HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
        .await
        .unwrap();
    let mut answer = vec![0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let head = String::from_utf8_lossy(&answer[..n]);
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");

    // Headers that never finish: the connection is closed.
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"POST /add-checkpoint HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    assert!(
        closed.is_ok(),
        "the server must close a connection whose headers stall"
    );

    // A body that stalls: 408 once the request time is up.
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"POST /add-checkpoint HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nold 0\n")
        .await
        .unwrap();
    let mut answer = vec![0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let head = String::from_utf8_lossy(&answer[..n]);
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
}

#[tokio::test]
async fn connections_beyond_the_cap_wait_for_a_free_slot() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits {
        max_connections: 1,
        header_timeout: Duration::from_millis(1500),
        ..Limits::default()
    };
    let addr = start(dir.path(), limits).await;
    // The one slot is taken by a client that sends nothing.
    let idle = tokio::net::TcpStream::connect(addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    // Not served while the slot is taken...
    let early = tokio::time::timeout(Duration::from_millis(300), s.read_to_end(&mut answer)).await;
    assert!(early.is_err(), "served beyond the cap: {answer:?}");
    // ...and served once the idle connection is closed for its headers.
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    drop(idle);
}
