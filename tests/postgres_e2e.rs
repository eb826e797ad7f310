//! `tally serve --store postgres://...` through the real binary, on a real
//! PostgreSQL server (tally-testkit's harness; docs/operations.md "Running
//! on PostgreSQL"): records posted, a pack exported and verified, the same
//! log after a restart (configured by the config file's `store` key), and
//! clear errors for a bad or unreachable store.

mod common;

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
    let server = Server::start_at(&data, &listen, &["--config", config.to_str().unwrap()]);
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
