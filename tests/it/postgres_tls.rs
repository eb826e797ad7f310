//! TLS to PostgreSQL through the real binary (docs/operations.md, "TLS to
//! the database"), on a real server started with `ssl = on` and a
//! certificate for `localhost` made for the test (tally-testkit's
//! `PgServer::start_tls`):
//! - `tally store copy` and `tally serve` with `sslmode=verify-full` and
//!   the test CA as `sslrootcert`: the copy is checked, the server serves
//!   and ingests, and `pg_stat_ssl` shows every connection of its database
//!   (the log's, the LISTEN ones, the registry's) encrypted;
//! - `verify-ca` accepts the certificate for another name;
//! - clear errors at start, with the password hidden: `require` against a
//!   server without TLS, `verify-full` against a certificate for another
//!   host name, a CA that did not sign the certificate, an unreadable
//!   `sslrootcert`.

use crate::common;

use common::{add_agent, record_notes, tally, Server};
use tally_testkit::postgres::PgServer;

/// Connections to `db` other than psql's own: (encrypted, plain).
fn tls_connections(pg: &PgServer, db: &str) -> (u64, u64) {
    let out = pg.psql(
        "postgres",
        &format!(
            "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl) \
             FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.datname = '{db}' AND a.pid <> pg_backend_pid()"
        ),
    );
    let (tls, plain) = out.trim().split_once('|').expect("two counts");
    (tls.parse().unwrap(), plain.parse().unwrap())
}

/// The application names of the connections to `db`.
fn applications(pg: &PgServer, db: &str) -> String {
    pg.psql(
        "postgres",
        &format!(
            "SELECT string_agg(DISTINCT application_name, ',' ORDER BY application_name) \
             FROM pg_stat_activity WHERE datname = '{db}' AND pid <> pg_backend_pid()"
        ),
    )
    .trim()
    .to_owned()
}

/// The URL of `db` on `pg` as `host`, reaching 127.0.0.1 whatever `host`
/// resolves to, with the TLS query `tls`.
fn url(pg: &PgServer, host: &str, db: &str, tls: &str) -> String {
    format!(
        "postgres://tally:secret-pw@{host}:{}/{db}?hostaddr=127.0.0.1&{tls}",
        pg.port()
    )
}

#[test]
fn store_copy_and_serve_over_verify_full_tls_and_every_connection_is_encrypted() {
    let _alone = common::not_beside_heavy();
    if tally_testkit::postgres::skipped() {
        eprintln!("SKIPPED: PostgreSQL TLS tests (TALLY_SKIP_POSTGRES=1)");
        return;
    }
    let pg = PgServer::start_tls();
    let db_url = pg.fresh_database();
    let db = db_url.rsplit('/').next().unwrap().to_owned();
    let ca = pg.ca_file();
    let tls_url = url(
        &pg,
        "localhost",
        &db,
        &format!("sslmode=verify-full&sslrootcert={}", ca.display()),
    );
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let state = tmp.path().join("state");

    // A redb log with three records, copied into the database over TLS.
    let server = Server::start(&data, &["--rate-limit", "0"]);
    let api_key = server.banner_value("API key");
    add_agent(&server, &api_key, &state, "bot");
    record_notes(&state, "bot", 3);
    let listen = server.url.trim_start_matches("http://").to_owned();
    assert!(server.sigterm().success());
    let (ok, out, err) = tally(
        &[
            "store",
            "copy",
            "--from",
            data.to_str().unwrap(),
            "--to",
            &tls_url,
        ],
        &[],
    );
    assert!(ok, "store copy over TLS failed: {out}{err}");
    assert!(out.contains("checked: size 3"), "{out}");
    assert!(!format!("{out}{err}").contains("secret-pw"), "{out}{err}");

    // Served from the database over TLS: it ingests.
    let server = Server::start_at(&data, &listen, &["--store", &tls_url, "--rate-limit", "0"]);
    assert!(server.banner.contains("tree size 3"), "{}", server.banner);
    assert!(!server.banner.contains("secret-pw"), "{}", server.banner);
    assert!(
        !server.banner.contains("warning"),
        "verify-full draws no warning: {}",
        server.banner
    );
    record_notes(&state, "bot", 2);
    assert_eq!(pg.psql(&db, "SELECT count(*) FROM log_entries").trim(), "5");
    let (encrypted, plain) = tls_connections(&pg, &db);
    assert_eq!(plain, 0, "a connection of tally serve is not encrypted");
    // The writer, a reader, two LISTEN connections, the registry's.
    assert!(encrypted >= 4, "only {encrypted} TLS connections");
    assert_eq!(applications(&pg, &db), "tally,tally-registry");
    assert!(server.sigterm().success());

    // verify-ca checks the chain only: 127.0.0.1 is not the certificate's
    // name, and it connects.
    let ca_only = url(
        &pg,
        "127.0.0.1",
        &db,
        &format!("sslmode=verify-ca&sslrootcert={}", ca.display()),
    );
    let server = Server::start_at(&data, &listen, &["--store", &ca_only, "--rate-limit", "0"]);
    assert!(server.banner.contains("tree size 5"), "{}", server.banner);
    let (encrypted, plain) = tls_connections(&pg, &db);
    assert!(
        encrypted >= 1 && plain == 0,
        "{encrypted} TLS, {plain} plain"
    );
    assert!(server.sigterm().success());
}

/// `tally serve --store URL` on a fresh data folder: must fail; its stderr.
fn serve_fails(url: &str) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let (ok, out, err) = tally(
        &[
            "serve",
            "--data-dir",
            data.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--store",
            url,
        ],
        &[],
    );
    assert!(!ok, "tally serve started with {url}: {out}");
    assert!(!err.contains("secret-pw"), "the password leaked: {err}");
    assert!(!err.contains("panicked"), "{err}");
    // One message, not the same cause once per error type wrapping it.
    assert_eq!(err.matches("storage backend").count(), 1, "{err}");
    assert!(!data.exists(), "a failed start left {}", data.display());
    err
}

#[test]
fn tls_that_cannot_be_had_or_checked_is_a_clear_error_at_start() {
    let _alone = common::not_beside_heavy();
    if tally_testkit::postgres::skipped() {
        eprintln!("SKIPPED: PostgreSQL TLS tests (TALLY_SKIP_POSTGRES=1)");
        return;
    }
    // require against a server without TLS.
    let plain = tally_testkit::postgres::shared();
    let db_url = plain.fresh_database();
    let db = db_url.rsplit('/').next().unwrap().to_owned();
    let err = serve_fails(&url(plain, "localhost", &db, "sslmode=require"));
    assert!(
        err.contains("server does not support TLS") && err.contains("sslmode=require"),
        "{err}"
    );

    let pg = PgServer::start_tls();
    let db_url = pg.fresh_database();
    let db = db_url.rsplit('/').next().unwrap().to_owned();
    let ca = pg.ca_file();
    // verify-full to a name the certificate does not carry.
    let err = serve_fails(&url(
        &pg,
        "127.0.0.1",
        &db,
        &format!("sslmode=verify-full&sslrootcert={}", ca.display()),
    ));
    assert!(
        err.contains("invalid peer certificate")
            && err.contains("not valid for name")
            && err.contains("sslmode=verify-full"),
        "{err}"
    );
    // A CA that did not sign the server's certificate.
    let err = serve_fails(&url(
        &pg,
        "localhost",
        &db,
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            pg.other_ca_file().display()
        ),
    ));
    assert!(
        err.contains("invalid peer certificate") && err.contains("UnknownIssuer"),
        "{err}"
    );
    // The built-in roots do not know the test CA either.
    let err = serve_fails(&url(&pg, "localhost", &db, "sslmode=verify-full"));
    assert!(
        err.contains("UnknownIssuer") && err.contains("Mozilla roots"),
        "{err}"
    );
    // An sslrootcert that cannot be read.
    let missing = pg.dir().join("no-such-ca.pem");
    let err = serve_fails(&url(
        &pg,
        "localhost",
        &db,
        &format!("sslmode=verify-full&sslrootcert={}", missing.display()),
    ));
    assert!(
        err.contains(&format!(
            "sslrootcert {}: cannot read it",
            missing.display()
        )),
        "{err}"
    );
    // Nothing was written through any of them.
    assert_eq!(
        pg.psql(
            &db,
            "SELECT count(*) FROM pg_tables WHERE tablename = 'log_entries'"
        )
        .trim(),
        "0"
    );
}
