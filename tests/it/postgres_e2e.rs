//! `tally serve --store postgres://...` through the real binary, on a real
//! PostgreSQL server (tally-testkit's harness; docs/operations.md "Running
//! on PostgreSQL"): records posted, a pack exported and verified, the same
//! log after a restart (configured by the config file's `store` key), and
//! clear errors for a bad or unreachable store.

use crate::common;

use std::path::Path;

use common::{add_agent, record_notes, tally, Server};

/// `tally keys export`, `tally export` and `tally verify`: the verify report.
fn export_and_verify(
    server: &Server,
    api_key: &str,
    vkey: &str,
    dir: &Path,
    agent: &str,
) -> String {
    let env = [
        ("TALLY_WITNESS_URL", server.url.as_str()),
        ("TALLY_API_KEY", api_key),
    ];
    let keys = dir.join("keys.json");
    let pack = dir.join("pack.jsonl");
    let (ok, _, err) = tally(&["keys", "export", "-o", keys.to_str().unwrap()], &env);
    assert!(ok, "keys export: {err}");
    let (ok, _, err) = tally(
        &[
            "export",
            "--agent",
            agent,
            "-o",
            pack.to_str().unwrap(),
            "--force",
        ],
        &env,
    );
    assert!(ok, "export: {err}");
    let (ok, out, err) = tally(
        &[
            "verify",
            pack.to_str().unwrap(),
            "--agent-keys",
            keys.to_str().unwrap(),
            "--witness-key",
            vkey,
        ],
        &[],
    );
    assert!(ok, "verify failed: {out}{err}");
    assert!(out.lines().last().unwrap().starts_with("PASS"), "{out}");
    out
}

fn checkpoint(url: &str) -> String {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        reqwest::get(format!("{url}/checkpoint"))
            .await
            .unwrap()
            .error_for_status()
            .unwrap()
            .text()
            .await
            .unwrap()
    })
}

#[test]
fn serve_on_postgres_exports_a_pack_that_verifies_and_restarts_on_the_same_log() {
    let _alone = common::not_beside_heavy();
    let Some(db_url) = tally_testkit::postgres::database() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let state = tmp.path().join("state");
    let server = Server::start(&data, &["--store", &db_url, "--rate-limit", "0"]);
    assert!(
        server
            .banner
            .contains("tally: the log is in PostgreSQL: postgres://"),
        "{}",
        server.banner
    );
    let api_key = server.banner_value("API key");
    let vkey = server.banner_value("witness key");
    add_agent(&server, &api_key, &state, "bot");
    record_notes(&state, "bot", 5);
    let report = export_and_verify(&server, &api_key, &vkey, tmp.path(), "bot");
    assert!(report.contains("5 records"), "{report}");
    let before = checkpoint(&server.url);
    let listen = server.url.trim_start_matches("http://").to_owned();
    assert!(server.sigterm().success());
    // The log is in PostgreSQL, not in the data folder.
    assert!(!data.join("log.redb").exists());
    let pg = tally_testkit::postgres::shared();
    let db = db_url.rsplit('/').next().unwrap();
    assert_eq!(pg.psql(db, "SELECT count(*) FROM log_entries").trim(), "5");

    // Restart, with the store named by the config file this time.
    let config = tmp.path().join("tally.toml");
    std::fs::write(
        &config,
        format!("store = \"{db_url}\"\nrate_limit = {{ per_second = 0, burst = 1 }}\n"),
    )
    .unwrap();
    // A clean stop released the lease (ttl 10 s): the restart does not wait.
    let restarted = std::time::Instant::now();
    let server = Server::start_at(&data, &listen, &["--config", config.to_str().unwrap()]);
    assert!(
        restarted.elapsed() < std::time::Duration::from_secs(6),
        "the restart waited {:?} for the lease",
        restarted.elapsed()
    );
    assert!(server.banner.contains("tree size 5"), "{}", server.banner);
    assert_eq!(checkpoint(&server.url), before);
    record_notes(&state, "bot", 2);
    let report = export_and_verify(&server, &api_key, &vkey, tmp.path(), "bot");
    assert!(report.contains("7 records"), "{report}");
    assert!(server.sigterm().success());
    assert_eq!(pg.psql(db, "SELECT count(*) FROM log_entries").trim(), "7");
}

#[test]
fn a_bad_or_unreachable_store_is_a_clear_error_at_start() {
    let _alone = common::not_beside_heavy();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let (ok, _, err) = tally(
        &[
            "serve",
            "--data-dir",
            data.to_str().unwrap(),
            "--store",
            "mysql://x/y",
        ],
        &[],
    );
    assert!(!ok);
    assert!(
        err.contains("expected `redb`") && err.contains("PostgreSQL URL"),
        "{err}"
    );
    // Nothing listens on this port: the start fails, naming PostgreSQL, and
    // leaves no half-made data folder behind.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (ok, _, err) = tally(
        &[
            "serve",
            "--data-dir",
            data.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--store",
            &format!("postgres://tally:pw@127.0.0.1:{port}/nowhere"),
        ],
        &[],
    );
    assert!(!ok);
    assert!(err.contains("postgresql"), "{err}");
    assert!(!err.contains(":pw@"), "the password leaked: {err}");
    assert!(
        !data.exists(),
        "a failed first start left {}",
        data.display()
    );
}

#[test]
fn store_copy_carries_a_redb_log_into_postgres_and_serves_the_same_receipts() {
    let _alone = common::not_beside_heavy();
    let Some(db_url) = tally_testkit::postgres::database() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let state = tmp.path().join("state");
    let server = Server::start(&data, &["--rate-limit", "0"]);
    let api_key = server.banner_value("API key");
    let vkey = server.banner_value("witness key");
    add_agent(&server, &api_key, &state, "bot");
    record_notes(&state, "bot", 7);
    let on_redb = export_and_verify(&server, &api_key, &vkey, tmp.path(), "bot");
    let pack_redb = std::fs::read(tmp.path().join("pack.jsonl")).unwrap();
    let cp_redb = checkpoint(&server.url);
    let listen = server.url.trim_start_matches("http://").to_owned();

    // While the server holds the folder, the copy is refused.
    let from = data.to_str().unwrap();
    let (ok, _, err) = tally(&["store", "copy", "--from", from, "--to", &db_url], &[]);
    assert!(!ok);
    assert!(err.contains("stop `tally serve`"), "{err}");
    assert!(server.sigterm().success());

    // Two entries per transaction, so the copy takes several.
    let (ok, out, err) = tally(
        &[
            "store", "copy", "--from", from, "--to", &db_url, "--chunk", "2",
        ],
        &[],
    );
    assert!(ok, "store copy: {out}{err}");
    assert!(out.contains("copied 7 of 7 entries"), "{out}");
    assert!(out.contains("checked: size 7"), "{out}");
    // Again: the destination already holds the whole log; nothing to add.
    let (ok, out, err) = tally(&["store", "copy", "--from", from, "--to", &db_url], &[]);
    assert!(ok, "second copy: {out}{err}");
    assert!(out.contains("holds the first 7 entries"), "{out}");

    // Served from PostgreSQL: the same checkpoint, and a pack with the
    // same receipts, byte for byte.
    let server = Server::start_at(&data, &listen, &["--store", &db_url, "--rate-limit", "0"]);
    assert_eq!(checkpoint(&server.url), cp_redb);
    let on_pg = export_and_verify(&server, &api_key, &vkey, tmp.path(), "bot");
    assert_eq!(on_pg, on_redb);
    let pack_pg = std::fs::read(tmp.path().join("pack.jsonl")).unwrap();
    let receipts = |pack: &[u8]| -> Vec<String> {
        String::from_utf8_lossy(pack)
            .lines()
            .filter(|l| l.contains("\"receipt\""))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(
        receipts(&pack_pg).len(),
        7,
        "{}",
        String::from_utf8_lossy(&pack_pg)
    );
    assert_eq!(receipts(&pack_pg), receipts(&pack_redb));
    // And it goes on appending.
    record_notes(&state, "bot", 1);
    assert!(server.sigterm().success());

    // A database holding another log is refused: one longer than the
    // source, and one shorter whose root is not the source's.
    let other = tmp.path().join("other");
    let server = Server::start(&other, &[]);
    let key = server.banner_value("API key");
    add_agent(&server, &key, &tmp.path().join("other-state"), "bot");
    record_notes(&tmp.path().join("other-state"), "bot", 1);
    let other_listen = server.url.trim_start_matches("http://").to_owned();
    assert!(server.sigterm().success());
    let (ok, _, err) = tally(
        &[
            "store",
            "copy",
            "--from",
            other.to_str().unwrap(),
            "--to",
            &db_url,
        ],
        &[],
    );
    assert!(!ok);
    assert!(
        err.contains("holds a log of 8 entries, more than the 1"),
        "{err}"
    );
    let server = Server::start_at(&other, &other_listen, &[]);
    record_notes(&tmp.path().join("other-state"), "bot", 8);
    assert!(server.sigterm().success());
    let (ok, _, err) = tally(
        &[
            "store",
            "copy",
            "--from",
            other.to_str().unwrap(),
            "--to",
            &db_url,
        ],
        &[],
    );
    assert!(!ok);
    assert!(err.contains("not an unfinished copy of this log"), "{err}");
    assert!(err.contains("root at size 8 differs"), "{err}");
}

fn signal(server: &Server, sig: &str) {
    let pid = server.child.id().to_string();
    assert!(std::process::Command::new("kill")
        .args([sig, &pid])
        .status()
        .unwrap()
        .success());
}

#[test]
fn a_sequencer_paused_past_its_lease_is_fenced_and_a_standby_takes_over() {
    let _alone = common::not_beside_heavy();
    let Some(db_url) = tally_testkit::postgres::database() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (data_a, data_b) = (tmp.path().join("a"), tmp.path().join("b"));
    let (state, state2) = (tmp.path().join("state"), tmp.path().join("state2"));
    let args = [
        "--store",
        db_url.as_str(),
        "--lease-ttl",
        "2",
        "--rate-limit",
        "0",
    ];
    let a = Server::start(&data_a, &args);
    let api_key = a.banner_value("API key");
    let vkey = a.banner_value("witness key");
    add_agent(&a, &api_key, &state, "bot");
    record_notes(&state, "bot", 3);
    // The second front gets the same log key and registry (a copy of the
    // data folder taken while the first is stopped).
    let listen_a = a.url.trim_start_matches("http://").to_owned();
    assert!(a.sigterm().success());
    common::copy_dir(&data_a, &data_b);
    let a = Server::start_at(&data_a, &listen_a, &args);
    let standby = {
        let data_b = data_b.clone();
        let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
        std::thread::spawn(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            Server::start(&data_b, &args)
        })
    };
    // While the sequencer renews its lease, the standby does not start.
    std::thread::sleep(std::time::Duration::from_secs(5));
    assert!(
        !standby.is_finished(),
        "the standby started while the lease was held"
    );

    // Pause the sequencer past its lease: the standby takes over.
    signal(&a, "-STOP");
    let paused = std::time::Instant::now();
    let b = standby.join().unwrap();
    let takeover = paused.elapsed();
    assert!(
        takeover < std::time::Duration::from_secs(10),
        "{takeover:?}"
    );
    eprintln!("standby took over {takeover:?} after the sequencer was paused (lease ttl 2s)");
    add_agent(&b, &api_key, &state2, "bot2");
    record_notes(&state2, "bot2", 3);
    let pg = tally_testkit::postgres::shared();
    let db = db_url.rsplit('/').next().unwrap();
    let count = || {
        pg.psql(db, "SELECT count(*) FROM log_entries")
            .trim()
            .to_owned()
    };
    let latest = || {
        pg.psql(db, "SELECT max(size) FROM log_checkpoints")
            .trim()
            .to_owned()
    };
    assert_eq!(count(), "6");
    assert_eq!(latest(), "6");

    // Resumed, the deposed sequencer must not commit or sign anything.
    signal(&a, "-CONT");
    let env = [("TALLY_STATE_DIR", state.to_str().unwrap())];
    for i in 0..3 {
        let (_, out, err) = tally(
            &["record", "note", "--agent", "bot", &format!("late {i}")],
            &env,
        );
        // Refused (the front answers an error): the record stays pending.
        assert!(
            out.contains("\"receipt\":\"pending\"") && out.contains("sync_error"),
            "a deposed sequencer answered: {out}{err}"
        );
    }
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert_eq!(count(), "6");
    assert_eq!(latest(), "6");

    // The new sequencer goes on, and both agents' packs verify.
    record_notes(&state2, "bot2", 1);
    assert_eq!(count(), "7");
    let report = export_and_verify(&b, &api_key, &vkey, tmp.path(), "bot2");
    assert!(report.contains("4 records"), "{report}");
    let report = export_and_verify(&b, &api_key, &vkey, tmp.path(), "bot");
    assert!(report.contains("3 records"), "{report}");
    drop(a);
    assert!(b.sigterm().success());
}

#[test]
fn store_copy_keeps_group_commits_of_many_entries() {
    let _alone = common::not_beside_heavy();
    let Some(db_url) = tally_testkit::postgres::database() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let server = Server::start(&data, &["--rate-limit", "0", "--max-skew", "86400"]);
    let api_key = server.banner_value("API key");
    // Concurrent posts, so that group commits hold many entries.
    let (ok, out, err) = tally(
        &[
            "bench",
            "ingest",
            "--records",
            "1500",
            "--agents",
            "64",
            "--concurrency",
            "64",
            "--verify-secs",
            "0.1",
            "--witness",
            &server.url,
            "--api-key",
            &api_key,
        ],
        &[],
    );
    assert!(ok, "bench ingest: {out}{err}");
    let cp_redb = checkpoint(&server.url);
    let listen = server.url.trim_start_matches("http://").to_owned();
    assert!(server.sigterm().success());
    let (ok, out, err) = tally(
        &[
            "store",
            "copy",
            "--from",
            data.to_str().unwrap(),
            "--to",
            &db_url,
            "--chunk",
            "100",
        ],
        &[],
    );
    assert!(ok, "store copy: {out}{err}");
    assert!(out.contains("checked: size"), "{out}");
    let pg = tally_testkit::postgres::shared();
    let db = db_url.rsplit('/').next().unwrap();
    let entries: u64 = pg
        .psql(db, "SELECT count(*) FROM log_entries")
        .trim()
        .parse()
        .unwrap();
    let batches: u64 = pg
        .psql(db, "SELECT count(DISTINCT receipt_size) FROM log_entries")
        .trim()
        .parse()
        .unwrap();
    assert!(entries >= 1500, "{entries}");
    assert!(
        batches < entries / 2,
        "{entries} entries in {batches} batches: the load made no group commits to copy"
    );
    let server = Server::start_at(&data, &listen, &["--store", &db_url]);
    assert_eq!(checkpoint(&server.url), cp_redb);
    assert!(server.sigterm().success());
}
