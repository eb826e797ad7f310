//! The log asks its cosigners (docs/protocol.md §14.5), end to end
//! through the real binaries: one `tally serve` configured with two
//! `tally cosigner` processes.
//!
//! - agents post; the exported pack verifies with `tally verify --trust`
//!   and quorum 2, and `tally monitor --trust` accepts `/checkpoint`;
//! - one cosigner killed (-9): later packs fail quorum 2 and pass quorum 1,
//!   and `/metrics` shows that cosigner failing;
//! - restarted on its own data folder, the cosigner carries on from its
//!   persisted state and quorum 2 passes again;
//! - tally serve restarted while both cosigners are down: the kept
//!   cosignatures are still served;
//! - both cosigners down: the log keeps admitting records and exporting.

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{add_agent, record_notes, tally, Server, TALLY};
use tally_schemas::note::{peek_checkpoint, SignedNote};

/// A running `tally cosigner serve` on a fixed address, killed on drop.
pub(crate) struct CosignerProc {
    pub(crate) child: Child,
}

impl Drop for CosignerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl CosignerProc {
    // The child is reaped by Drop.
    #[allow(clippy::zombie_processes)]
    pub(crate) fn start(dir: &Path, port: u16) -> Self {
        let mut child = Command::new(TALLY)
            .args(["cosigner", "serve", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--data-dir")
            .arg(dir)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start tally cosigner serve");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert!(
            line.starts_with("tally cosigner: listening on "),
            "no listening line: {line:?}"
        );
        std::thread::spawn(move || for _ in out.lines() {});
        Self { child }
    }
}

/// A loopback port that was free a moment ago (the cosigners need fixed
/// addresses: the log is configured with their URLs and they restart).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `tally cosigner init` + `add-log`; returns the cosigner's vkey.
pub(crate) fn init_cosigner(dir: &Path, name: &str, log_vkey: &str) -> String {
    let d = dir.to_str().unwrap();
    let (ok, out, err) = tally(&["cosigner", "init", "--name", name, "--data-dir", d], &[]);
    assert!(ok, "{err}");
    let vkey = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("cosigner key"))
        .unwrap()
        .trim()
        .to_owned();
    let (ok, _, err) = tally(
        &["cosigner", "add-log", "--data-dir", d, "--key", log_vkey],
        &[],
    );
    assert!(ok, "{err}");
    vkey
}

struct Deployment {
    dir: PathBuf,
    url: String,
    api_key: String,
    log_vkey: String,
    agents: PathBuf,
}

impl Deployment {
    fn env(&self) -> [(&str, &str); 2] {
        [
            ("TALLY_API_KEY", self.api_key.as_str()),
            ("TALLY_WITNESS_URL", self.url.as_str()),
        ]
    }

    /// Writes agent-keys.json (the trusted agent keys).
    fn export_keys(&self) {
        let keys = self.dir.join("agent-keys.json");
        let (ok, _, err) = tally(
            &["keys", "export", "-o", keys.to_str().unwrap()],
            &self.env(),
        );
        assert!(ok, "keys export: {err}");
    }

    /// Exports alpha's pack; returns its path.
    fn export(&self, name: &str) -> PathBuf {
        let pack = self.dir.join(format!("{name}.jsonl"));
        let (ok, _, err) = tally(
            &["export", "--agent", "alpha", "-o", pack.to_str().unwrap()],
            &self.env(),
        );
        assert!(ok, "export: {err}");
        pack
    }

    /// A trust file naming the log key, `cosigners` and `quorum`.
    fn trust(&self, cosigners: &[&str], quorum: usize) -> PathBuf {
        let path = self.dir.join(format!("trust-{quorum}-{}", cosigners.len()));
        let mut text = format!("version 1\nlog {}\n", self.log_vkey);
        for c in cosigners {
            text.push_str(&format!("witness {c}\n"));
        }
        text.push_str(&format!("quorum {quorum}\n"));
        std::fs::write(&path, text).unwrap();
        path
    }

    /// `tally verify PACK --trust TRUST`: exit code and output.
    fn verify(&self, pack: &Path, trust: &Path) -> (i32, String) {
        let out = Command::new(TALLY)
            .arg("verify")
            .arg(pack)
            .arg("--agent-keys")
            .arg(self.dir.join("agent-keys.json"))
            .arg("--trust")
            .arg(trust)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }
}

/// The cosignature lines (beyond the log's own) of the pack's checkpoint.
fn pack_cosignatures(pack: &Path) -> (u64, usize) {
    let text = std::fs::read_to_string(pack).unwrap();
    let header: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    let note = header["checkpoint"].as_str().unwrap();
    let size = peek_checkpoint(note).unwrap().size.get();
    (size, SignedNote::parse(note).unwrap().signatures.len() - 1)
}

async fn get(url: &str) -> String {
    let r = reqwest::get(url).await.unwrap();
    assert_eq!(r.status().as_u16(), 200, "{url}");
    r.text().await.unwrap()
}

/// The value of the `/metrics` line that starts with `prefix`.
async fn metric(url: &str, prefix: &str) -> Option<u64> {
    let text = get(&format!("{url}/metrics")).await;
    text.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_with_two_cosigners_exports_packs_that_meet_the_quorum_while_they_are_up() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");

    // The log's key first: the cosigners must know it.
    let first = Server::start(&data, &[]);
    let log_vkey = first.banner_value("witness key");
    let api_key = first.banner_value("API key");
    first.kill9();

    let (dir1, dir2) = (dir.path().join("c1"), dir.path().join("c2"));
    let v1 = init_cosigner(&dir1, "cosigner.example/one", &log_vkey);
    let v2 = init_cosigner(&dir2, "cosigner.example/two", &log_vkey);
    // A key nobody at c1's address signs with: c1 answers with its own
    // line, which the log must not take for this one's.
    let v_wrong = init_cosigner(&dir.path().join("c3"), "cosigner.example/wrong", &log_vkey);
    let (p1, p2) = (free_port(), free_port());
    let c1 = CosignerProc::start(&dir1, p1);
    let c2 = CosignerProc::start(&dir2, p2);

    // A log key given as a cosigner key is refused at start, clearly.
    let (ok, _, err) = tally(
        &[
            "serve",
            "--data-dir",
            data.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--cosigner",
            &format!("name=one,vkey={log_vkey},url=http://127.0.0.1:{p1}"),
        ],
        &[],
    );
    assert!(!ok);
    assert!(
        err.contains("cosigner one: vkey is not a C2SP cosignature/v1 key"),
        "{err}"
    );

    let listen = format!("127.0.0.1:{}", free_port());
    let serve_args = [
        "--listen".to_owned(),
        listen,
        "--cosigner".to_owned(),
        format!("name=one,vkey={v1},url=http://127.0.0.1:{p1}"),
        "--cosigner".to_owned(),
        format!("name=two,vkey={v2},url=http://127.0.0.1:{p2}/"),
        "--cosigner".to_owned(),
        format!("name=wrong,vkey={v_wrong},url=http://127.0.0.1:{p1}"),
        "--cosigner-timeout".to_owned(),
        "5".to_owned(),
    ];
    let serve_args: Vec<&str> = serve_args.iter().map(String::as_str).collect();
    let server = Server::start(&data, &serve_args);
    assert!(
        server.banner.contains("asking cosigners one, two, wrong"),
        "{}",
        server.banner
    );
    let d = Deployment {
        dir: dir.path().to_owned(),
        url: server.url.clone(),
        api_key,
        log_vkey: log_vkey.clone(),
        agents: dir.path().join("agents"),
    };
    add_agent(&server, &d.api_key, &d.agents, "alpha");
    d.export_keys();
    record_notes(&d.agents, "alpha", 3);

    // Both up: the pack's checkpoint carries both cosignatures and covers
    // every record; quorum 2 passes.
    let pack = d.export("both-up");
    assert_eq!(pack_cosignatures(&pack), (3, 2));
    let both = d.trust(&[&v1, &v2], 2);
    let (code, out) = d.verify(&pack, &both);
    assert_eq!(code, 0, "{out}");
    // /checkpoint is the cosigned note, and the monitor accepts it.
    let note = get(&format!("{}/checkpoint", d.url)).await;
    assert_eq!(
        SignedNote::parse(&note).unwrap().signatures.len(),
        3,
        "{note}"
    );
    let out = Command::new(TALLY)
        .args(["monitor", "--once", "--log", &d.url, "--trust"])
        .arg(&both)
        .arg("--state")
        .arg(dir.path().join("monitor.state"))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        metric(&d.url, "tally_log_cosigner_cosigned_size{cosigner=\"two\"}").await,
        Some(3)
    );
    // head.json carries the same cosigned checkpoint.
    let head: serde_json::Value = reqwest::Client::new()
        .get(format!("{}/v1/head?from_size=3", d.url))
        .bearer_auth(&d.api_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let head_note = head["checkpoint"].as_str().unwrap();
    assert_eq!(SignedNote::parse(head_note).unwrap().signatures.len(), 3);
    assert!(
        tally_verifier::trust::TrustFile::parse(&std::fs::read_to_string(&both).unwrap())
            .unwrap()
            .witnesses
            .check(head_note)
            .is_ok()
    );
    // The cosigner configured with a key its URL does not sign with never
    // gets a line kept: c1's own line is not taken for it.
    assert_eq!(
        metric(
            &d.url,
            "tally_log_cosigner_cosigned_size{cosigner=\"wrong\"}"
        )
        .await,
        Some(0)
    );
    assert_eq!(
        metric(
            &d.url,
            "tally_log_cosigner_state{cosigner=\"wrong\",state=\"failing\"}"
        )
        .await,
        Some(1)
    );

    // Cosigner two dies: later packs carry one cosignature, fail quorum 2
    // and pass quorum 1.
    let pid2 = c2.child.id();
    drop(c2); // SIGKILL
    record_notes(&d.agents, "alpha", 2);
    let pack = d.export("one-down");
    assert_eq!(pack_cosignatures(&pack), (5, 1));
    let (code, out) = d.verify(&pack, &both);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("1 of the 2 trusted cosigners (`witness` lines) cosigned it"),
        "{out}"
    );
    let (code, out) = d.verify(&pack, &d.trust(&[&v1, &v2], 1));
    assert_eq!(code, 0, "{out}");
    assert!(
        metric(
            &d.url,
            "tally_log_cosigner_consecutive_failures{cosigner=\"two\"}"
        )
        .await
        .unwrap()
            >= 1
    );
    assert_eq!(
        metric(
            &d.url,
            "tally_log_cosigner_state{cosigner=\"two\",state=\"failing\"}"
        )
        .await,
        Some(1)
    );

    // Restarted after the kill -9, two carries on from the size it holds
    // (3): the log's next round proves 3 -> 6 to it, and quorum 2 passes
    // again once its backoff has expired.
    let c2 = CosignerProc::start(&dir2, p2);
    assert_ne!(c2.child.id(), pid2);
    record_notes(&d.agents, "alpha", 1);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let size = metric(&d.url, "tally_log_cosigner_cosigned_size{cosigner=\"two\"}").await;
        if size == Some(6) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "cosigner two never caught up: {size:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let pack = d.export("restarted");
    assert_eq!(pack_cosignatures(&pack), (6, 2));
    let (code, out) = d.verify(&pack, &both);
    assert_eq!(code, 0, "{out}");

    // Both cosigners stopped, then tally serve restarted: the cosignatures
    // were kept in log.redb beside the checkpoint, so /checkpoint and the
    // next pack carry them although nobody can be asked.
    drop(c1);
    drop(c2);
    assert!(server.sigterm().success());
    let server = Server::start(&data, &serve_args);
    assert_eq!(server.url, d.url);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let note = get(&format!("{}/checkpoint", d.url)).await;
        if SignedNote::parse(&note).unwrap().signatures.len() == 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the stored cosignatures were not published: {note}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pack = d.export("after-restart");
    assert_eq!(pack_cosignatures(&pack), (6, 2));
    let (code, out) = d.verify(&pack, &both);
    assert_eq!(code, 0, "{out}");

    // Both down: the log keeps admitting and exporting; the pack has no
    // cosignature, so even quorum 1 fails while the log key alone passes.
    record_notes(&d.agents, "alpha", 3);
    let pack = d.export("both-down");
    assert_eq!(pack_cosignatures(&pack), (9, 0));
    let (code, out) = d.verify(&pack, &d.trust(&[&v1, &v2], 1));
    assert_eq!(code, 1, "{out}");
    let (code, out) = d.verify(&pack, &d.trust(&[], 0));
    assert_eq!(code, 0, "{out}");
    drop(server);
}

#[test]
fn a_config_file_cosigner_with_a_bad_vkey_or_url_stops_tally_serve_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let log_vkey = {
        let first = Server::start(&data, &[]);
        let v = first.banner_value("witness key");
        first.kill9();
        v
    };
    let good = init_cosigner(&dir.path().join("c1"), "cosigner.example/one", &log_vkey);
    for (vkey, url, want) in [
        (
            log_vkey.as_str(),
            "http://127.0.0.1:9",
            "cosigner c1: vkey is not a C2SP cosignature/v1 key",
        ),
        ("garbage", "http://127.0.0.1:9", "cosigner c1: vkey"),
        (good.as_str(), "127.0.0.1:9", "cosigner c1: url"),
    ] {
        let config = dir.path().join("tally.toml");
        std::fs::write(
            &config,
            format!("[[cosigner]]\nname = \"c1\"\nvkey = \"{vkey}\"\nurl = \"{url}\"\n"),
        )
        .unwrap();
        let out = Command::new(TALLY)
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&config)
            .arg("--data-dir")
            .arg(&data)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("tally.toml") && err.contains(want), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cosigner_that_never_answers_holds_up_no_receipt_and_no_export() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let first = Server::start(&data, &[]);
    let log_vkey = first.banner_value("witness key");
    let api_key = first.banner_value("API key");
    first.kill9();
    let vkey = init_cosigner(&dir.path().join("c1"), "cosigner.example/mute", &log_vkey);
    // Accepts connections, reads nothing, answers nothing.
    let mute = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = mute.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in mute.incoming() {
            held.push(conn);
        }
    });
    let server = Server::start(
        &data,
        &[
            "--cosigner",
            &format!("name=mute,vkey={vkey},url=http://127.0.0.1:{port}"),
            "--cosigner-timeout",
            "2",
            "--export-cosign-wait",
            "1",
        ],
    );
    let d = Deployment {
        dir: dir.path().to_owned(),
        url: server.url.clone(),
        api_key,
        log_vkey,
        agents: dir.path().join("agents"),
    };
    add_agent(&server, &d.api_key, &d.agents, "alpha");
    d.export_keys();
    // Every record gets its receipt (--wait-receipt) and the export is
    // whole, without the mute cosigner's cosignature.
    record_notes(&d.agents, "alpha", 4);
    let pack = d.export("mute");
    assert_eq!(pack_cosignatures(&pack), (4, 0));
    let (code, out) = d.verify(&pack, &d.trust(&[], 0));
    assert_eq!(code, 0, "{out}");
    let (code, out) = d.verify(&pack, &d.trust(&[&vkey], 1));
    assert_eq!(code, 1, "{out}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(
        &d.url,
        "tally_log_cosigner_state{cosigner=\"mute\",state=\"failing\"}",
    )
    .await
        != Some(1)
    {
        assert!(
            Instant::now() < deadline,
            "the mute cosigner is not failing"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
