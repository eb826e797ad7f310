//! `tally serve --tls-cert --tls-key` through the real binary
//! (docs/operations.md "TLS"): a client that trusts the test CA registers an agent,
//! posts a record and gets a receipt that verifies; a client without the CA,
//! and plain HTTP on the same port, get nothing; bad TLS files stop the
//! server at start with a message naming the file.

use std::path::PathBuf;
use std::time::Duration;

use rand_core::OsRng;
use serde_json::json;
use tally_schemas::note::NoteVerifier;
use tally_schemas::record::NoteBody;
use tally_schemas::{AgentName, Body, Nonce, Receipt, SecretKey, Seq, UnixMillis, UnsignedRecord};

use crate::common;

use common::{Server, TALLY};

fn tls_file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/tls")
        .join(name)
}

fn client(trust_test_ca: bool) -> reqwest::Client {
    let mut b = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .tls_built_in_root_certs(false);
    if trust_test_ca {
        let ca = std::fs::read(tls_file("ca.pem")).unwrap();
        b = b.add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap());
    }
    b.build().unwrap()
}

#[tokio::test]
async fn serve_over_tls_admits_records_and_refuses_untrusted_and_plain_clients() {
    let tmp = tempfile::tempdir().unwrap();
    let cert = tls_file("server.pem");
    let key = tls_file("server.key");
    let server = Server::start(
        &tmp.path().join("data"),
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    let url = server.url.clone();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let api_key = server.banner_value("API key");
    let log_key = NoteVerifier::from_vkey(&server.banner_value("witness key")).unwrap();

    let http = client(true);
    let health = http.get(format!("{url}/healthz")).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 200);
    // Over TLS every answer tells browsers to keep to HTTPS
    // (operations.md "TLS").
    assert_eq!(
        health
            .headers()
            .get("strict-transport-security")
            .and_then(|v| v.to_str().ok()),
        Some("max-age=31536000")
    );

    let agent = AgentName::new("tls-bot").unwrap();
    let secret = SecretKey::generate(&mut OsRng);
    let registered = http
        .post(format!("{url}/v1/agents"))
        .bearer_auth(&api_key)
        .json(&json!({"agent": agent, "public_key": secret.public_key(), "not_before": UnixMillis::new(UnixMillis::now().as_millis() - 60_000)}))
        .send()
        .await
        .unwrap();
    assert_eq!(registered.status().as_u16(), 201);
    let record = UnsignedRecord {
        agent,
        key_id: secret.public_key().key_id(),
        seq: Seq::new(0).unwrap(),
        prev: None,
        time: UnixMillis::now(),
        nonce: Nonce::random(&mut OsRng),
        body: Body::Note(NoteBody {
            text: "over TLS".into(),
        }),
    }
    .sign(&secret)
    .unwrap();
    let resp = common::post_record(&http, &url, &api_key, &record)
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let receipt = Receipt::from_json(&resp.bytes().await.unwrap()).unwrap();
    receipt
        .verify(&record, &log_key)
        .expect("the receipt verifies with the witness key from the banner");

    // Without the test CA the server's certificate is not trusted.
    let err = client(false)
        .get(format!("{url}/healthz"))
        .send()
        .await
        .expect_err("a client without the CA must not connect");
    assert!(err.is_connect() || err.is_request(), "{err:?}");

    // Plain HTTP on the TLS port gets no HTTP answer.
    let plain = url.replacen("https://", "http://", 1);
    let got = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
        .get(format!("{plain}/healthz"))
        .send()
        .await;
    assert!(
        got.is_err(),
        "plain HTTP got an answer: {:?}",
        got.map(|r| r.status())
    );
}

#[test]
fn bad_tls_files_stop_serve_at_start_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let not_a_key = tmp.path().join("not-a-key.pem");
    std::fs::write(&not_a_key, "hello\n").unwrap();
    let cert = tls_file("server.pem");
    for (cert, key, names) in [
        (cert.clone(), not_a_key.clone(), not_a_key.clone()),
        (not_a_key.clone(), tls_file("server.key"), not_a_key.clone()),
        (
            cert.clone(),
            tmp.path().join("missing.key"),
            tmp.path().join("missing.key"),
        ),
    ] {
        let out = std::process::Command::new(TALLY)
            .arg("serve")
            .arg("--data-dir")
            .arg(tmp.path().join("data"))
            .args(["--listen", "127.0.0.1:0"])
            .arg("--tls-cert")
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "serve started with {key:?}: {stderr}"
        );
        assert!(
            stderr.contains(names.to_str().unwrap()),
            "the error does not name {names:?}: {stderr}"
        );
    }
}
