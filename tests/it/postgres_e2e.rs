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
    // The registry (project, its key, the admin token's hash, the agent)
    // and the console's links came too, and were checked.
    assert!(
        out.contains("rows of the registry (0 already there); checked: the same"),
        "{out}"
    );
    assert!(out.contains("of the console's auditor links"), "{out}");
    let pg = tally_testkit::postgres::shared();
    let db = db_url.rsplit('/').next().unwrap();
    assert_eq!(
        pg.psql(db, "SELECT key FROM registry_rows WHERE tbl = 'agents'")
            .trim(),
        "bot"
    );
    // Again: the destination already holds the whole log and registry;
    // nothing to add.
    let (ok, out, err) = tally(&["store", "copy", "--from", from, "--to", &db_url], &[]);
    assert!(ok, "second copy: {out}{err}");
    assert!(out.contains("holds the first 7 entries"), "{out}");
    assert!(out.contains("copied 0 rows of the registry"), "{out}");
    // A registry copy that lacks rows (as a copy cut short before the
    // registry's transaction would) is completed; one with a row changed
    // is refused.
    let _ = pg.psql(db, "DELETE FROM registry_rows WHERE tbl = 'agents'");
    let (ok, out, err) = tally(&["store", "copy", "--from", from, "--to", &db_url], &[]);
    assert!(ok, "third copy: {out}{err}");
    assert!(out.contains("copied 1 rows of the registry"), "{out}");
    let row = "tbl = 'projects' AND key = 'default'";
    let original = pg.psql(
        db,
        &format!("SELECT encode(value, 'hex') FROM registry_rows WHERE {row}"),
    );
    let _ = pg.psql(
        db,
        &format!("UPDATE registry_rows SET value = 'x' WHERE {row}"),
    );
    let (ok, out, err) = tally(&["store", "copy", "--from", from, "--to", &db_url], &[]);
    assert!(!ok, "{out}");
    assert!(
        err.contains("not a copy of") && err.contains("row projects/default has another value"),
        "{err}"
    );
    let _ = pg.psql(
        db,
        &format!(
            "UPDATE registry_rows SET value = decode('{}', 'hex') WHERE {row}",
            original.trim()
        ),
    );

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

#[test]
fn a_sequencer_paused_past_its_lease_is_fenced_and_the_other_front_takes_over() {
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
    // The second front starts at once and follows: it admits and serves
    // reads, and hands records to the sequencer (a).
    let b = Server::start(&data_b, &args);
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
    let token = || pg.psql(db, "SELECT token FROM log_lease").trim().to_owned();
    let token_a = token();

    // Pause the sequencer past its lease: b takes the lease, recovers and
    // sequences, in the same process; its records are answered.
    a.signal("-STOP");
    let paused = std::time::Instant::now();
    add_agent(&b, &api_key, &state2, "bot2");
    record_notes(&state2, "bot2", 3);
    let takeover = paused.elapsed();
    assert!(
        takeover < std::time::Duration::from_secs(10),
        "{takeover:?}"
    );
    assert_ne!(token(), token_a, "b answered without taking the lease");
    eprintln!("b sequenced {takeover:?} after the sequencer was paused (lease ttl 2s)");
    assert_eq!(count(), "6");
    assert_eq!(latest(), "6");

    // Resumed, the deposed sequencer must not commit or sign anything
    // itself: its writes are fenced; it notices it lost the lease and
    // follows, handing its records to b. A record it was committing when
    // fenced is answered 503 sequencer_unavailable (left pending by the
    // CLI), never a receipt b did not sign, never a second root.
    a.signal("-CONT");
    let env = [("TALLY_STATE_DIR", state.to_str().unwrap())];
    for i in 0..3 {
        let (_, out, err) = tally(
            &["record", "note", "--agent", "bot", &format!("late {i}")],
            &env,
        );
        assert!(
            out.contains("\"receipt\":\"pending\"") || out.contains("\"index\""),
            "{out}{err}"
        );
        assert!(
            !out.contains("internal"),
            "a 500 from the deposed sequencer: {out}{err}"
        );
    }
    std::thread::sleep(std::time::Duration::from_secs(1));
    // Every entry is covered by the latest checkpoint, one note per size
    // (the primary key), and the lease is still b's.
    assert_eq!(count(), latest());
    assert_ne!(token(), token_a);

    // b goes on, and both agents' packs verify.
    let bots = |agent: &str| {
        pg.psql(
            db,
            &format!("SELECT count(*) FROM log_entries WHERE agent = '{agent}'"),
        )
        .trim()
        .to_owned()
    };
    record_notes(&state2, "bot2", 1);
    let report = export_and_verify(&b, &api_key, &vkey, tmp.path(), "bot2");
    assert!(report.contains("4 records"), "{report}");
    let report = export_and_verify(&b, &api_key, &vkey, tmp.path(), "bot");
    assert!(
        report.contains(&format!("{} records", bots("bot"))),
        "{report}"
    );
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
    let (ok, out, err) = common::tally_bench(&[
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
    ]);
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

/// Two fronts on one database share the registry (docs/operations.md
/// "Running on PostgreSQL", "What is where"): the second front's data
/// folder gets the log key and key directory only, never witness.redb.
/// A registration, a new API key and a revocation made through the first
/// front hold on the second (served once the first stops cleanly and
/// releases the lease), and the second says where the first start's key
/// was shown instead of making another.
#[test]
fn a_second_front_serves_the_registry_made_through_the_first_without_witness_redb() {
    let _alone = common::not_beside_heavy();
    let Some(db_url) = tally_testkit::postgres::database() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (data_a, data_b) = (tmp.path().join("a"), tmp.path().join("b"));
    let state = tmp.path().join("state");
    let args = ["--store", db_url.as_str(), "--rate-limit", "0"];
    let a = Server::start(&data_a, &args);
    let api_key = a.banner_value("API key");
    let vkey = a.banner_value("witness key");
    add_agent(&a, &api_key, &state, "bot");
    record_notes(&state, "bot", 2);
    // An extra API key made, and then revoked, through the first front.
    let admin = [
        ("TALLY_WITNESS_URL", a.url.as_str()),
        ("TALLY_DATA_DIR", data_a.to_str().unwrap()),
    ];
    let (ok, out, err) = tally(&["project", "new-key", "default"], &admin);
    assert!(ok, "new-key: {out}{err}");
    let extra = out
        .lines()
        .find_map(|l| l.strip_prefix("API key: "))
        .unwrap()
        .trim()
        .to_owned();
    let extra_id = extra.split('_').nth(1).unwrap().to_owned();
    let (ok, out, err) = tally(&["project", "revoke-key", &extra_id], &admin);
    assert!(ok, "revoke-key: {out}{err}");
    // And one made and kept.
    let (ok, out, err) = tally(&["project", "new-key", "default"], &admin);
    assert!(ok, "new-key: {out}{err}");
    let kept = out
        .lines()
        .find_map(|l| l.strip_prefix("API key: "))
        .unwrap()
        .trim()
        .to_owned();
    // Nothing of the registry or the console is in the data folder.
    for file in ["witness.redb", "console.redb", "log.redb"] {
        assert!(!data_a.join(file).exists(), "{file} in the data folder");
    }
    let pg = tally_testkit::postgres::shared();
    let db = db_url.rsplit('/').next().unwrap();
    assert_eq!(
        pg.psql(
            db,
            "SELECT count(*) FROM registry_rows WHERE tbl = 'agents'"
        )
        .trim(),
        "1"
    );

    // The second front: the log key and key directory, nothing else.
    std::fs::create_dir_all(&data_b).unwrap();
    for file in ["log.skey", "keys.json"] {
        std::fs::copy(data_a.join(file), data_b.join(file)).unwrap();
    }
    // The first stops cleanly (releasing the lease); the second serves on
    // its address, where the agent's state points.
    let listen = a.url.trim_start_matches("http://").to_owned();
    assert!(a.sigterm().success());
    let b = Server::start_at(&data_b, &listen, &args);
    assert!(
        !b.banner.contains("API key   "),
        "a second front made another key:\n{}",
        b.banner
    );
    assert!(
        b.banner.contains("was set up by the first start on")
            && b.banner.contains(data_a.to_str().unwrap()),
        "{}",
        b.banner
    );
    assert!(!data_b.join("admin.token").exists());
    // The agent registered through the first front posts through the second.
    record_notes(&state, "bot", 2);
    let report = export_and_verify(&b, &api_key, &vkey, tmp.path(), "bot");
    assert!(report.contains("4 records"), "{report}");
    // The kept key works here, the revoked one is refused.
    let state2 = tmp.path().join("state2");
    add_agent(&b, &kept, &state2, "bot2");
    record_notes(&state2, "bot2", 1);
    let env = [("TALLY_STATE_DIR", state2.to_str().unwrap())];
    let (ok, _, err) = tally(
        &[
            "agent",
            "init",
            "bot3",
            "--witness",
            &b.url,
            "--api-key",
            &extra,
        ],
        &env,
    );
    assert!(!ok, "a key revoked through the first front was accepted");
    assert!(err.contains("unauthorized") || err.contains("401"), "{err}");
    // A registration through the second front of a name the first made
    // is refused, as on one front.
    let state3 = tmp.path().join("state3");
    let (ok, out, err) = tally(
        &["agent", "init", "dup"],
        &[("TALLY_STATE_DIR", state3.to_str().unwrap())],
    );
    assert!(ok, "{err}");
    let public = out
        .lines()
        .find_map(|l| l.strip_prefix("public key: "))
        .unwrap()
        .trim()
        .to_owned();
    let (ok, _, err) = tally(
        &[
            "agent",
            "add",
            "bot",
            "--public-key",
            &public,
            "--witness",
            &b.url,
            "--api-key",
            &kept,
        ],
        &[],
    );
    assert!(!ok);
    assert!(err.contains("exists"), "{err}");
    assert!(b.sigterm().success());
}

/// After `tally store copy`, the data folder knows where its log is: a
/// restart without `--store` serves the database (not the old log.redb,
/// which would roll the log back), `--store redb` is refused naming the
/// database, and so is a copy of the old log.redb into another database
/// (docs/operations.md, "Where the folder's log is").
#[test]
fn a_folder_whose_log_moved_serves_the_database_and_refuses_its_old_redb() {
    let _alone = common::not_beside_heavy();
    let Some(db_url) = tally_testkit::postgres::database() else {
        return;
    };
    let other_db = tally_testkit::postgres::database().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let state = tmp.path().join("state");
    let server = Server::start(&data, &["--rate-limit", "0"]);
    let api_key = server.banner_value("API key");
    add_agent(&server, &api_key, &state, "bot");
    record_notes(&state, "bot", 3);
    let listen = server.url.trim_start_matches("http://").to_owned();
    assert!(server.sigterm().success());
    let from = data.to_str().unwrap();
    let (ok, out, err) = tally(&["store", "copy", "--from", from, "--to", &db_url], &[]);
    assert!(ok, "store copy: {out}{err}");
    assert!(out.contains("store.url"), "{out}");
    assert!(
        out.contains(&format!("next: tally serve --data-dir {from} (")),
        "{out}"
    );

    // A restart with no flag, as after a reboot: the database, and the
    // log grows there.
    let server = Server::start_at(&data, &listen, &["--rate-limit", "0"]);
    assert!(
        server.banner.contains("is in PostgreSQL at") && server.banner.contains("tree size 3"),
        "{}",
        server.banner
    );
    record_notes(&state, "bot", 2);
    assert!(server.sigterm().success());
    let server = Server::start_at(&data, &listen, &[]);
    assert!(server.banner.contains("tree size 5"), "{}", server.banner);
    assert!(server.sigterm().success());

    // The old log.redb (3 entries) is refused, naming where the log is.
    for (args, env) in [
        (vec!["--store", "redb"], vec![]),
        (vec![], vec![("TALLY_STORE", "redb")]),
    ] {
        let mut argv = vec!["serve", "--data-dir", from, "--listen", "127.0.0.1:0"];
        argv.extend(args);
        let (ok, out, err) = tally(&argv, &env);
        assert!(!ok, "served the old log.redb: {out}");
        let db = db_url.rsplit('/').next().unwrap();
        assert!(
            err.contains("moved to PostgreSQL at")
                && err.contains(db)
                && err.contains("roll the log back")
                && err.contains("store.url"),
            "{err}"
        );
    }
    // Copying the old log.redb elsewhere would fork the log: refused.
    let (ok, _, err) = tally(&["store", "copy", "--from", from, "--to", &other_db], &[]);
    assert!(!ok);
    assert!(err.contains("already moved to PostgreSQL"), "{err}");

    // A folder that started on PostgreSQL needs the flag once.
    let pg_first = tmp.path().join("pg-first");
    let server = Server::start(&pg_first, &["--store", &other_db]);
    let key = server.banner_value("API key");
    let pg_state = tmp.path().join("pg-state");
    add_agent(&server, &key, &pg_state, "bot");
    record_notes(&pg_state, "bot", 1);
    let listen = server.url.trim_start_matches("http://").to_owned();
    assert!(server.sigterm().success());
    let server = Server::start_at(&pg_first, &listen, &[]);
    assert!(
        server.banner.contains("is in PostgreSQL at") && server.banner.contains("tree size 1"),
        "{}",
        server.banner
    );
    assert!(server.sigterm().success());
}

/// A second front on the database started with a data folder of its own
/// but without the first front's log.skey is told to copy it and
/// keys.json, and leaves no half-made folder (docs/operations.md, "Running
/// on PostgreSQL").
#[test]
fn a_front_without_the_shared_log_key_is_told_to_copy_it() {
    let _alone = common::not_beside_heavy();
    let Some(db_url) = tally_testkit::postgres::database() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let first = Server::start(&tmp.path().join("a"), &["--store", &db_url]);
    let second = tmp.path().join("b");
    let (ok, out, err) = tally(
        &[
            "serve",
            "--data-dir",
            second.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--store",
            &db_url,
        ],
        &[],
    );
    assert!(!ok, "{out}");
    assert!(
        err.contains("had no log.skey") && err.contains("Copy log.skey and keys.json"),
        "{err}"
    );
    assert!(
        !second.exists(),
        "a failed first start left {}",
        second.display()
    );
    assert!(first.sigterm().success());
}
