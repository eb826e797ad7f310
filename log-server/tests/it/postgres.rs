//! The PostgreSQL backend's own behaviour, on a real server (tally-testkit's
//! harness): migrations and their version, the compare-and-swap between two
//! processes' stores on one database, calls from a tokio worker thread, and
//! clear errors for a bad URL or an unreachable server. The log's contract
//! over this backend is the shared suite (backends.rs, batch.rs).

use crate::common;

use std::sync::Arc;

use common::{now, signer, Agent, AppendOne};
use std::time::{Duration, Instant};
use tally_log::store::postgres::{
    redact_url, schema_version, LeaseOptions, PostgresStore, MIGRATIONS,
};
use tally_log::store::{BatchWrite, LogStore, StoreError};
use tally_log::{AppendError, BatchItem, KeyVersion, Log, LogConfig};
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
fn a_store_without_the_lease_reads_and_a_stale_writer_is_refused() {
    let Some(url) = database() else { return };
    let a: Arc<dyn LogStore> = Arc::new(PostgresStore::open(&url).unwrap());
    // The second store holds no lease: it reads, and cannot write.
    let b = PostgresStore::open_with(&url, None).unwrap();
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
    // The other store sees the writes; without the lease it writes nothing.
    assert_eq!(b.size().unwrap(), TreeSize::new(3));
    let (size, note) = b.latest_checkpoint().unwrap().unwrap();
    assert_eq!(size, TreeSize::new(3));
    assert_eq!(note, log.latest_checkpoint().note);
    match b.put_checkpoint(size, &note) {
        Err(StoreError::Conflict(m)) => assert!(m.contains("without the sequencer's lease"), "{m}"),
        other => panic!("{other:?}"),
    }
    // The lease holder cannot write at a stale size (the compare-and-swap),
    // nor store a second note for a signed size, nor one beyond the tree.
    let stale = BatchWrite {
        old_size: TreeSize::new(2),
        entries: Vec::new(),
        hashes: Vec::new(),
        receipt_size: TreeSize::new(2),
        key_versions: Vec::new(),
    };
    match a.commit_batch(&stale) {
        Err(StoreError::Conflict(m)) => assert!(m.contains("the stored size is 3"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        a.put_checkpoint(TreeSize::new(3), "another note\n"),
        Err(StoreError::Conflict(_))
    ));
    assert!(matches!(
        a.put_checkpoint(TreeSize::new(4), "beyond\n"),
        Err(StoreError::Conflict(_))
    ));
    // The same note again is a no-op.
    a.put_checkpoint(size, &note).unwrap();
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

#[test]
fn a_store_whose_lease_was_taken_over_cannot_write() {
    let Some(url) = database() else { return };
    let a: Arc<dyn LogStore> = Arc::new(PostgresStore::open(&url).unwrap());
    let log = Log::open(Arc::clone(&a), signer(), LogConfig::default()).unwrap();
    let mut agent = Agent::new("alpha");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async { log.append(agent.next(), now()).await.unwrap() });
    // A second sequencer is refused while the lease is held.
    match PostgresStore::open(&url) {
        Err(StoreError::Conflict(m)) => assert!(m.contains("sequenced by another process"), "{m}"),
        other => panic!("{other:?}"),
    }
    // Another process takes the lease over (as after an expiry): a's next
    // write is fenced inside its own transaction, and nothing lands.
    let pg = tally_testkit::postgres::shared();
    let db = url.rsplit('/').next().unwrap();
    let _ = pg.psql(db, "UPDATE log_lease SET token = token + 1, holder = 'other', expires_at = clock_timestamp() + interval '1 minute'");
    let got = rt.block_on(async { log.append(agent.next(), now()).await });
    assert!(got.is_err(), "a deposed sequencer committed: {got:?}");
    assert!(
        matches!(got, Err(AppendError::Storage(StoreError::Fenced(_)))),
        "{got:?}"
    );
    assert_eq!(pg.psql(db, "SELECT count(*) FROM log_entries").trim(), "1");
    assert_eq!(
        pg.psql(db, "SELECT max(size) FROM log_checkpoints").trim(),
        "1"
    );
    log.shutdown();
}

#[test]
fn a_standby_takes_the_lease_when_the_holder_releases_it_or_it_expires() {
    let Some(url) = database() else { return };
    // A ttl long enough that a holder starved of CPU on a loaded machine
    // still renews in time (it renews every third of a ttl): with a short
    // one the standby took over a lease whose renewal was merely late,
    // which is the lease working, not failing.
    let ttl = Duration::from_secs(4);
    let a = PostgresStore::open_with(&url, Some(LeaseOptions { ttl, wait: false })).unwrap();
    let first = a.lease_token();
    assert!(first > 0);
    let standby = {
        let url = url.clone();
        std::thread::spawn(move || {
            PostgresStore::open_with(&url, Some(LeaseOptions { ttl, wait: true })).unwrap()
        })
    };
    // While `a` renews, the standby waits well past one ttl.
    std::thread::sleep(ttl + ttl / 2);
    assert!(
        !standby.is_finished(),
        "the standby took a lease that was being renewed"
    );
    let released = Instant::now();
    drop(a);
    let b = standby.join().unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(3),
        "{:?}",
        released.elapsed()
    );
    assert_eq!(b.lease_token(), first + 1);
    // Expiry without release: a holder that stops renewing (as a killed
    // process does) is replaced after the ttl.
    let pg = tally_testkit::postgres::shared();
    let db = url.rsplit('/').next().unwrap();
    let _ = pg.psql(db, "UPDATE log_lease SET holder = 'gone', token = token + 1, expires_at = clock_timestamp() + interval '1 second'");
    let waited = Instant::now();
    let c = PostgresStore::open_with(&url, Some(LeaseOptions { ttl, wait: true })).unwrap();
    assert!(
        waited.elapsed() >= Duration::from_millis(500),
        "{:?}",
        waited.elapsed()
    );
    assert_eq!(c.lease_token(), first + 3);
    drop(b);
}

/// A LISTEN connection that drops (the server restarted, a proxy cut it,
/// an operator terminated it) is reopened, and notifications wake the
/// listener again (docs/storage.md, "PostgreSQL layout": the hand-over's
/// notifications).
#[test]
fn a_dropped_listen_connection_is_reopened() {
    let Some(url) = database() else { return };
    let pg = tally_testkit::postgres::shared();
    let db = url.rsplit('/').next().unwrap();
    let store = PostgresStore::open_with(&url, None).unwrap();
    let woken = store.listen("tally_test_reopen").unwrap();
    let listener = || {
        pg.psql(
            db,
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
             AND query = 'LISTEN tally_test_reopen' AND state = 'idle'",
        )
        .trim()
        .to_owned()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let wait = |d: Duration| {
        rt.block_on(async { tokio::time::timeout(d, woken.notified()).await.is_ok() })
    };
    // A notification wakes it.
    let first = listener();
    assert!(!first.is_empty(), "no LISTEN connection");
    let _ = pg.psql(db, "NOTIFY tally_test_reopen");
    assert!(wait(Duration::from_secs(10)), "not woken before the drop");

    // Cut its connection: a new one LISTENs again.
    let _ = pg.psql(db, &format!("SELECT pg_terminate_backend({first})"));
    let deadline = Instant::now() + Duration::from_secs(20);
    let second = loop {
        let now = listener();
        if !now.is_empty() && now != first {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "the LISTEN connection was not reopened"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // The reopened listener wakes once by itself (notifications may have
    // been missed meanwhile); take that, then a new notification wakes it.
    std::thread::sleep(Duration::from_millis(200));
    let _ = wait(Duration::from_millis(100));
    let _ = pg.psql(db, "NOTIFY tally_test_reopen");
    assert!(
        wait(Duration::from_secs(10)),
        "not woken after the reopen (connection {second})"
    );
}

/// Contract rule 8 (docs/storage.md, "PostgreSQL layout"; protocol.md
/// §4.1): the commit keeps each agent's latest record time, refuses a
/// record admitted under a key version older than its agent's current one
/// (`KeyChanged`, nothing written for it) while the rest of the group
/// commit goes in, and commits the same record once admitted under the
/// current version. Records handed over without a version are not fenced.
#[test]
fn a_commit_refuses_records_admitted_under_an_older_key_version() {
    let Some(url) = database() else { return };
    let store: Arc<dyn LogStore> = Arc::new(PostgresStore::open(&url).unwrap());
    let log = Log::open(Arc::clone(&store), signer(), LogConfig::default()).unwrap();
    let pg = tally_testkit::postgres::shared();
    let db = url.rsplit('/').next().unwrap();
    let sql = |q: &str| pg.psql(db, q).trim().to_owned();
    let (mut fenced, mut bystander) = (Agent::new("fenced"), Agent::new("bystander"));
    let v = |n| Some(KeyVersion::new(n));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let first = fenced.next();
        log.enqueue_fenced(first.clone(), now(), v(0))
            .unwrap()
            .await
            .unwrap();
        assert_eq!(
            sql("SELECT latest_time || ':' || key_version FROM log_agent_fence WHERE agent = 'fenced'"),
            format!("{}:0", first.time.as_millis())
        );

        // A key change of `fenced` (what the registry's transaction does).
        sql("UPDATE log_agent_fence SET key_version = key_version + 1 WHERE agent = 'fenced'");
        let stale = fenced.next();
        let other = bystander.next();
        let answers = log
            .enqueue_batch_fenced(
                vec![
                    BatchItem::Record(stale.clone()),
                    BatchItem::Record(other.clone()),
                ],
                vec![v(0), v(0)],
                now(),
            )
            .unwrap()
            .await
            .unwrap();
        assert!(
            matches!(&answers[0], Err(AppendError::KeyChanged { agent }) if agent.as_str() == "fenced"),
            "{:?}",
            answers[0]
        );
        assert!(answers[1].is_ok(), "{:?}", answers[1]);
        assert_eq!(store.index_of_record(&stale.hash()).unwrap(), None);
        assert_eq!(store.size().unwrap(), TreeSize::new(2));

        // Admitted again under the current version, it is committed; an
        // unfenced record is not checked.
        let again = log
            .enqueue_fenced(stale.clone(), now(), v(1))
            .unwrap()
            .await
            .unwrap();
        assert!(!again.duplicate);
        log.enqueue_fenced(fenced.next(), now(), None)
            .unwrap()
            .await
            .unwrap();
    });
    assert_eq!(store.size().unwrap(), TreeSize::new(4));
    assert_eq!(
        sql("SELECT agent || ':' || key_version FROM log_agent_fence ORDER BY agent"),
        "bystander:0\nfenced:1"
    );
}

/// Migration 5 fills `log_agent_fence` from the log it finds: each agent's
/// latest record time, parsed from the stored entries.
#[test]
fn migration_5_finds_each_agents_latest_record_time() {
    let Some(url) = database() else { return };
    let pg = tally_testkit::postgres::shared();
    let db = url.rsplit('/').next().unwrap();
    let sql = |q: &str| pg.psql(db, q).trim().to_owned();
    let mut latest = std::collections::BTreeMap::new();
    {
        let store: Arc<dyn LogStore> = Arc::new(PostgresStore::open(&url).unwrap());
        let log = Log::open(store, signer(), LogConfig::default()).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut agents = [Agent::new("one"), Agent::new("two")];
        rt.block_on(async {
            for k in 0..6 {
                let a = &mut agents[k % 2];
                let r = a.next();
                let t: &mut i64 = latest.entry(r.agent.to_string()).or_insert(i64::MIN);
                *t = (*t).max(r.time.as_millis());
                log.append(r, now()).await.unwrap();
            }
        });
        log.shutdown();
    }
    // The database as a build before migration 5 left it.
    sql("DROP TABLE log_agent_fence; DELETE FROM tally_schema_version WHERE version = 5");
    let _store = PostgresStore::open(&url).unwrap();
    let want: Vec<String> = latest.iter().map(|(a, t)| format!("{a}:{t}:0")).collect();
    assert_eq!(
        sql("SELECT agent || ':' || latest_time || ':' || key_version FROM log_agent_fence ORDER BY agent"),
        want.join("\n")
    );
}
