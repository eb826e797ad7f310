//! Tests of the witness's admission that need its crate-private parts.

use std::sync::atomic::{AtomicI64, Ordering};

use rand_core::OsRng;
use tally_schemas::record::NoteBody;
use tally_schemas::{Body, Nonce, SecretKey, Seq, UnsignedRecord};

use super::*;
use crate::config::ServeConfig;

#[derive(Debug)]
struct TestClock(AtomicI64);

impl Clock for TestClock {
    fn now(&self) -> UnixMillis {
        UnixMillis::new(self.0.load(Ordering::SeqCst))
    }
}

/// A key change that no longer covers an admitted record's time (the
/// API refuses to make one; an older witness did not) does not stop the
/// record's retry from getting its original receipt. Made here through
/// the registry itself, which the HTTP tests cannot reach.
#[tokio::test]
async fn a_retry_gets_its_receipt_after_its_key_stopped_covering_its_time() {
    const T0: i64 = 1_796_025_600_000;
    let dir = tempfile::tempdir().unwrap();
    let config = ServeConfig {
        data_dir: dir.path().to_owned(),
        ..ServeConfig::default()
    };
    let clock = Arc::new(TestClock(AtomicI64::new(T0)));
    let opened = crate::server::open(&config, None, clock, Box::new(OsRng)).unwrap();
    let (w, first) = (opened.witness, opened.first_start.unwrap());
    let key = first.api_key.token;
    let agent = AgentName::new("retro-bot").unwrap();
    let secret = SecretKey::generate(&mut OsRng);
    w.registry()
        .add_agent(
            "default",
            &agent,
            secret.public_key(),
            UnixMillis::new(T0 - 1),
        )
        .unwrap();
    let draft = |text: &str| {
        UnsignedRecord {
            agent: agent.clone(),
            key_id: secret.public_key().key_id(),
            seq: Seq::GENESIS,
            prev: None,
            time: UnixMillis::new(T0),
            nonce: Nonce::random(&mut OsRng),
            body: Body::Note(NoteBody { text: text.into() }),
        }
        .sign(&secret)
        .unwrap()
    };
    let r0 = draft("answer lost");
    let admitted = w.admit(Some(&key), r0.canonical_bytes()).await.unwrap();
    assert!(!admitted.duplicate);

    w.registry()
        .retire_agent("default", &agent, UnixMillis::new(T0))
        .unwrap();
    let refused = w.admit(Some(&key), draft("new").canonical_bytes()).await;
    assert!(
        matches!(refused, Err(WitnessError::KeyNotActive { .. })),
        "{refused:?}"
    );
    let again = w.admit(Some(&key), r0.canonical_bytes()).await.unwrap();
    assert!(again.duplicate);
    assert_eq!(again.receipt, admitted.receipt);
}
