//! The PostgreSQL backend's own behaviour, on a real server (tally-testkit's
//! harness): migrations and their version, the compare-and-swap between two
//! processes' stores on one database, calls from a tokio worker thread, and
//! clear errors for a bad URL or an unreachable server. The log's contract
//! over this backend is the shared suite (backends.rs, batch.rs).

mod common;

use std::sync::Arc;

use common::{now, signer, Agent};
use tally_log::store::postgres::{redact_url, schema_version, PostgresStore, MIGRATIONS};
use tally_log::store::{BatchWrite, LogStore, StoreError};
use tally_log::{Log, LogConfig};
use tally_schemas::TreeSize;

fn database() -> Option<String> {
    tally_testkit::postgres::database()
}

#[test]
fn migrations_are_recorded_once_and_a_newer_schema_is_refused() {
    let Some(url) = database() else { return };
    let store = PostgresStore::open(&url).unwrap();
    drop(store);
    // Opening again applies nothing twice.
    let _again = PostgresStore::open(&url).unwrap();
    let pg = tally_testkit::postgres::shared();
    let db = url.rsplit('/').next().unwrap();
    let versions = pg.psql(
        db,
        "SELECT string_agg(version || ':' || name, ',' ORDER BY version) FROM tally_schema_version",
    );
    let want: Vec<String> = MIGRATIONS
        .iter()
        .enumerate()
        .map(|(i, (name, _))| format!("{}:{name}", i + 1))
        .collect();
    assert_eq!(versions.trim(), want.join(","));
    assert_eq!(schema_version() as usize, MIGRATIONS.len());
    let _ = pg.psql(
        db,
        "INSERT INTO tally_schema_version (version, name) VALUES (99, 'future.sql')",
    );
    match PostgresStore::open(&url) {
        Err(StoreError::Corrupt(m)) => assert!(m.contains("schema version 99"), "{m}"),
        other => panic!("a newer schema must be refused, got {other:?}"),
    }
}

#[test]
fn a_stale_writer_on_another_connection_is_refused() {
    let Some(url) = database() else { return };
    let a: Arc<dyn LogStore> = Arc::new(PostgresStore::open(&url).unwrap());
    let b = PostgresStore::open(&url).unwrap();
    let log = Log::open(Arc::clone(&a), signer(), LogConfig::default()).unwrap();
    let mut agent = Agent::new("alpha");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for _ in 0..3 {
            log.append(agent.next(), now()).await.unwrap();
        }
    });
    // The other store sees the writes, and cannot write at a stale size.
    assert_eq!(b.size().unwrap(), TreeSize::new(3));
    let stale = BatchWrite {
        old_size: TreeSize::new(2),
        entries: Vec::new(),
        hashes: Vec::new(),
        receipt_size: TreeSize::new(2),
    };
    assert!(matches!(
        b.commit_batch(&stale),
        Err(StoreError::Conflict(_))
    ));
    // Nor store a second note for a signed size, nor one beyond the tree.
    assert!(matches!(
        b.put_checkpoint(TreeSize::new(3), "another note\n"),
        Err(StoreError::Conflict(_))
    ));
    assert!(matches!(
        b.put_checkpoint(TreeSize::new(4), "beyond\n"),
        Err(StoreError::Conflict(_))
    ));
    let (size, note) = b.latest_checkpoint().unwrap().unwrap();
    assert_eq!(size, TreeSize::new(3));
    assert_eq!(note, log.latest_checkpoint().note);
    b.put_checkpoint(size, &note).unwrap();
    log.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_can_be_called_on_a_tokio_worker_thread() {
    let Some(url) = database() else { return };
    // Opening, reading and dropping on a runtime thread must not panic
    // (no runtime is started or blocked on inside this one).
    let store = PostgresStore::open(&url).unwrap();
    assert_eq!(store.size().unwrap(), TreeSize::new(0));
    assert!(store.latest_checkpoint().unwrap().is_none());
    drop(store);
}

#[test]
fn a_bad_url_or_an_unreachable_server_is_a_clear_error() {
    match PostgresStore::open("postgres://user:secret@127.0.0.1:notaport/db") {
        Err(StoreError::Backend(m)) => {
            assert!(m.contains("not a PostgreSQL connection URL"), "{m}");
            assert!(!m.contains("secret"), "the password leaked: {m}");
        }
        other => panic!("{other:?}"),
    }
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    match PostgresStore::open(&format!("postgres://tally@127.0.0.1:{port}/x")) {
        Err(StoreError::Backend(m)) => assert!(m.contains("postgresql"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        redact_url("postgres://u:pw@h:1/d"),
        "postgres://u:***@h:1/d"
    );
}
