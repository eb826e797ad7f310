//! A newcomer's first hour through the real `tally` binary: the mistakes a
//! new user makes (a port in use, a witness that is down, a wrong API key, a
//! command run from another folder, `| head`, files given in the wrong
//! place, a second `serve`, an export over an existing pack) each end in a
//! clear message and leave no state half made.

use crate::common;

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Server, TALLY};

/// What a finished `tally` command left.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn show(&self) -> String {
        format!(
            "exit {:?}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// `tally ARGS` in `dir`, with no TALLY_* variable but those in `env`.
fn command(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(TALLY);
    c.current_dir(dir).args(args);
    for var in [
        "TALLY_API_KEY",
        "TALLY_WITNESS_URL",
        "TALLY_STATE_DIR",
        "TALLY_DATA_DIR",
        "TALLY_LISTEN",
        "TALLY_CONFIG",
        "TALLY_ADMIN_TOKEN",
        "RUST_BACKTRACE",
    ] {
        c.env_remove(var);
    }
    c.envs(env.iter().copied());
    c
}

fn run(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let out = command(dir, args, env).output().expect("run tally");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `tally ARGS` with its standard output a pipe nobody reads, as when
/// `| head` has exited. The read end is closed before the start, so the
/// first write fails whatever the scheduling (closed after the start, a
/// fast command could fill the pipe's buffer and exit 0 before the close).
fn run_into_closed_pipe(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let (read, write) = nix::unistd::pipe().expect("pipe");
    drop(read);
    let child = command(dir, args, env)
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tally");
    let out = child.wait_with_output().expect("wait for tally");
    Run {
        code: out.status.code(),
        stdout: String::new(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A loopback address where nothing listens.
fn closed_port() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    addr.to_string()
}

/// A `tally serve` whose log lines go to a file, killed on drop.
struct LoggedServer {
    child: Child,
    url: String,
    banner: String,
    log: PathBuf,
}

impl Drop for LoggedServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl LoggedServer {
    #[allow(clippy::zombie_processes)] // reaped by Drop
    fn start(data: &Path, log: &Path) -> Self {
        let mut child = command(
            data.parent().unwrap(),
            &[
                "serve",
                "--data-dir",
                data.to_str().unwrap(),
                "--listen",
                "127.0.0.1:0",
            ],
            &[("RUST_LOG", "info")],
        )
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("start tally serve");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut banner = String::new();
        loop {
            let mut line = String::new();
            assert_ne!(
                out.read_line(&mut line).unwrap(),
                0,
                "tally serve exited at start: {banner}{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
            banner.push_str(&line);
            if let Some(rest) = line.strip_prefix("tally: listening on ") {
                let url = rest.split_whitespace().next().unwrap().to_owned();
                std::thread::spawn(move || for _ in out.lines() {});
                return Self {
                    child,
                    url,
                    banner,
                    log: log.to_owned(),
                };
            }
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }
}

fn banner_value(banner: &str, label: &str) -> Option<String> {
    banner.lines().find_map(|l| {
        l.trim_start()
            .strip_prefix(label)
            .map(|v| v.trim().to_owned())
    })
}

/// A witness, a work folder whose `.tally` holds agent `bot`, registered.
struct Setup {
    tmp: tempfile::TempDir,
    server: Server,
    api_key: String,
}

impl Setup {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("work")).unwrap();
        std::fs::create_dir(tmp.path().join("other")).unwrap();
        let server = Server::start(&tmp.path().join("data"), &[]);
        let api_key = server.banner_value("API key");
        let s = Self {
            tmp,
            server,
            api_key,
        };
        s.add_agent("bot");
        s
    }

    fn work(&self) -> PathBuf {
        self.tmp.path().join("work")
    }

    fn other(&self) -> PathBuf {
        self.tmp.path().join("other")
    }

    fn init(&self, dir: &Path, agent: &str) -> Run {
        run(
            dir,
            &[
                "agent",
                "init",
                agent,
                "--witness",
                &self.server.url,
                "--api-key",
                &self.api_key,
            ],
            &[],
        )
    }

    fn add_agent(&self, agent: &str) {
        let r = self.init(&self.work(), agent);
        assert_eq!(r.code, Some(0), "{}", r.show());
        let public = r
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("public key: "))
            .unwrap_or_else(|| panic!("no public key: {}", r.show()))
            .trim()
            .to_owned();
        let r = run(
            &self.work(),
            &[
                "agent",
                "add",
                agent,
                "--public-key",
                &public,
                "--witness",
                &self.server.url,
                "--api-key",
                &self.api_key,
            ],
            &[],
        );
        assert_eq!(r.code, Some(0), "{}", r.show());
    }
}

/// A witness that is up but answers nothing: it accepts each connection and
/// closes it at once, and counts them.
struct SlammingDoor {
    addr: String,
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SlammingDoor {
    fn open() -> Self {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (a, s) = (Arc::clone(&accepted), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            for conn in l.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                if conn.is_ok() {
                    a.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        Self {
            addr,
            accepted,
            stop,
            thread: Some(thread),
        }
    }

    fn close(mut self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(&self.addr);
        self.thread.take().unwrap().join().unwrap();
        self.accepted.load(Ordering::SeqCst)
    }
}

// Trap: a first start that fails must leave nothing half made, so the next
// start is a first start again and shows the API key.
#[test]
fn a_first_start_that_cannot_bind_makes_nothing_and_the_next_shows_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("tally-data");
    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = held.local_addr().unwrap().to_string();
    let r = run(
        tmp.path(),
        &["serve", "--data-dir", "tally-data", "--listen", &addr],
        &[],
    );
    assert_eq!(r.code, Some(2), "{}", r.show());
    assert!(r.stderr.contains(&addr), "{}", r.show());
    assert!(
        !data.exists(),
        "a failed first start made {}",
        data.display()
    );

    // Bad TLS files: the same.
    let bogus = tmp.path().join("bogus.pem");
    std::fs::write(&bogus, "not a certificate\n").unwrap();
    let r = run(
        tmp.path(),
        &[
            "serve",
            "--data-dir",
            "tally-data",
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            bogus.to_str().unwrap(),
            "--tls-key",
            bogus.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(r.code, Some(2), "{}", r.show());
    assert!(
        !data.exists(),
        "a failed first start made {}",
        data.display()
    );

    drop(held);
    let server = Server::start(&data, &[]);
    assert!(
        server.banner.contains("first start")
            && server.banner_value("API key").starts_with("tally_"),
        "{}",
        server.banner
    );
}

#[test]
fn a_first_start_that_cannot_show_the_key_is_started_again() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("tally-data");
    // Standard output closed before the banner: the key cannot be shown.
    let r = run_into_closed_pipe(
        tmp.path(),
        &[
            "serve",
            "--data-dir",
            "tally-data",
            "--listen",
            "127.0.0.1:0",
        ],
        &[],
    );
    assert!(!r.stderr.contains("panicked"), "{}", r.show());
    assert_ne!(r.code, Some(0), "{}", r.show());
    assert!(!data.exists(), "left {} half made", data.display());
    let server = Server::start(&data, &[]);
    assert!(
        server.banner_value("API key").starts_with("tally_"),
        "{}",
        server.banner
    );
    server.kill9();

    // A first start killed before it showed the key leaves its marker: the
    // next start makes the data folder again (nobody ever had its key).
    std::fs::write(data.join("first-start.incomplete"), "").unwrap();
    let again = Server::start(&data, &[]);
    assert!(
        again.banner.contains("did not finish")
            && again.banner_value("API key").starts_with("tally_"),
        "{}",
        again.banner
    );
    assert!(!data.join("first-start.incomplete").exists());
    drop(again);
    let third = Server::start(&data, &[]);
    assert!(
        banner_value(&third.banner, "API key").is_none(),
        "{}",
        third.banner
    );
}

// Trap: a second `serve` on a data folder in use.
#[test]
fn a_second_serve_on_a_held_data_folder_says_who_holds_it() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("tally-data");
    let first = Server::start(&data, &[]);
    let r = run(
        tmp.path(),
        &[
            "serve",
            "--data-dir",
            "tally-data",
            "--listen",
            "127.0.0.1:0",
        ],
        &[],
    );
    assert_eq!(r.code, Some(2), "{}", r.show());
    let pid = first.child.id().to_string();
    assert!(
        r.stderr.contains("another `tally serve`")
            && r.stderr.contains(&format!("pid {pid}"))
            && r.stderr.contains("tally-data"),
        "{}",
        r.show()
    );
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.show());
    assert!(r.stdout.is_empty(), "{}", r.show());
    // The same command again, port included (a second plain `tally
    // serve`): the port is met first, and the message is the same.
    let listen = first.url.trim_start_matches("http://").to_owned();
    let r = run(
        tmp.path(),
        &["serve", "--data-dir", "tally-data", "--listen", &listen],
        &[],
    );
    assert_eq!(r.code, Some(2), "{}", r.show());
    assert!(
        r.stderr
            .contains(&format!("another `tally serve` (pid {pid})"))
            && r.stderr.contains("tally-data")
            && !r.stderr.contains("Address already in use"),
        "{}",
        r.show()
    );
}

// Trap: recording blocks on a witness that is down.
#[test]
fn recording_without_wait_receipt_does_not_wait_for_a_witness_that_is_down() {
    let s = Setup::new();
    let work = s.work();
    let r = run(
        &work,
        &["record", "note", "up", "--agent", "bot", "--wait-receipt"],
        &[],
    );
    assert_eq!(r.code, Some(0), "{}", r.show());
    // The agent's pinned witness moves (TALLY_WITNESS_URL would not move
    // it: docs/operations.md, "The agent's witness").
    let config = work.join(".tally/agents/bot/config.json");
    let up: serde_json::Value = serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    let repoint = |url: &str| {
        let mut c = up.clone();
        c["witness"]["url"] = url.into();
        std::fs::write(&config, serde_json::to_vec(&c).unwrap()).unwrap();
    };

    // A witness that slams the door: one try, no retries.
    let door = SlammingDoor::open();
    let url = format!("http://{}", door.addr);
    repoint(&url);
    let r = run(&work, &["record", "note", "door", "--agent", "bot"], &[]);
    let tries = door.close();
    assert_eq!(r.code, Some(0), "{}", r.show());
    // The key directory and the one record not yet receipted: two
    // requests, no retry loop.
    assert!(tries <= 2, "{tries} connections: {}", r.show());
    let out: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(out["receipt"], "pending", "{}", r.show());

    // A witness that is down.
    let down = format!("http://{}", closed_port());
    repoint(&down);
    let r = run(&work, &["record", "note", "down", "--agent", "bot"], &[]);
    assert_eq!(r.code, Some(0), "{}", r.show());
    for says in ["local chain", "tally agent sync --agent bot"] {
        assert!(r.stderr.contains(says), "{says}: {}", r.show());
    }
    // --wait-receipt waits, fails with exit 1, and says where the record is.
    let r = run(
        &work,
        &[
            "record",
            "note",
            "waited",
            "--agent",
            "bot",
            "--wait-receipt",
            "--sync-timeout",
            "1",
        ],
        &[],
    );
    assert_eq!(r.code, Some(1), "{}", r.show());
    assert!(r.stderr.contains("local chain"), "{}", r.show());
    std::fs::write(&config, serde_json::to_vec(&up).unwrap()).unwrap();

    // Back up: `agent sync` takes the agent as --agent or as a word.
    for args in [
        &["agent", "sync", "--agent", "bot"][..],
        &["agent", "sync", "bot"][..],
    ] {
        let r = run(&work, args, &[]);
        assert_eq!(r.code, Some(0), "{}", r.show());
        assert!(
            r.stdout.contains("synced: 4 records, all receipted"),
            "{}",
            r.show()
        );
    }
}

// Trap: agent setup that stores a bad key, or re-keys an existing agent.
#[test]
fn agent_init_checks_the_api_key_and_never_rekeys_a_registered_agent() {
    let s = Setup::new();
    let work = s.work();
    let agents = work.join(".tally/agents");

    // A key the witness does not know: refused, nothing written.
    let wrong = format!("tally_0123456789abcdef_{}", "0".repeat(48));
    let r = run(
        &work,
        &[
            "agent",
            "init",
            "bot2",
            "--witness",
            &s.server.url,
            "--api-key",
            &wrong,
        ],
        &[],
    );
    assert_eq!(r.code, Some(2), "{}", r.show());
    assert!(
        r.stderr.contains("API key") && r.stderr.contains("401"),
        "{}",
        r.show()
    );
    assert!(
        !r.stderr.contains(&wrong),
        "the key is echoed: {}",
        r.show()
    );
    assert!(!agents.join("bot2").exists(), "{}", r.show());

    // A witness that is not there: refused, nothing written.
    let r = run(
        &work,
        &[
            "agent",
            "init",
            "bot3",
            "--witness",
            &format!("http://{}", closed_port()),
            "--api-key",
            &s.api_key,
        ],
        &[],
    );
    assert_eq!(r.code, Some(2), "{}", r.show());
    assert!(r.stderr.contains("unreachable"), "{}", r.show());
    assert!(!agents.join("bot3").exists(), "{}", r.show());

    // From another folder: the agent is registered with a key kept
    // elsewhere; a second key is refused.
    let other = s.other();
    let r = s.init(&other, "bot");
    assert_eq!(r.code, Some(2), "{}", r.show());
    assert!(
        r.stderr.contains("already registered") && r.stderr.contains("--state-dir"),
        "{}",
        r.show()
    );
    assert!(!other.join(".tally/agents/bot").exists(), "{}", r.show());

    // Other commands from another folder say where they looked, and never
    // advise `agent init` for an agent that may exist elsewhere.
    for args in [
        &["record", "note", "x", "--agent", "bot"][..],
        &["agent", "sync", "--agent", "bot"][..],
        &["status", "--agent", "bot"][..],
    ] {
        let r = run(&other, args, &[]);
        assert_eq!(r.code, Some(2), "{args:?}: {}", r.show());
        let looked = other.canonicalize().unwrap().join(".tally");
        for says in [looked.to_str().unwrap(), "--state-dir", "TALLY_STATE_DIR"] {
            assert!(r.stderr.contains(says), "{args:?}: {says}: {}", r.show());
        }
        assert!(!r.stderr.contains("agent init"), "{args:?}: {}", r.show());
    }
    let state = work.join(".tally");
    let r = run(
        &other,
        &["record", "note", "x", "--agent", "bot", "--wait-receipt"],
        &[("TALLY_STATE_DIR", state.to_str().unwrap())],
    );
    assert_eq!(r.code, Some(0), "{}", r.show());
}

// Trap: a closed standard output panics and leaves state half made.
#[test]
fn no_command_panics_on_a_closed_pipe_and_agent_init_is_all_or_nothing() {
    let s = Setup::new();
    let work = s.work();
    let r = run_into_closed_pipe(
        &work,
        &[
            "agent",
            "init",
            "piped",
            "--witness",
            &s.server.url,
            "--api-key",
            &s.api_key,
        ],
        &[],
    );
    assert!(r.stderr.is_empty(), "{}", r.show());
    assert_eq!(r.code, Some(141), "{}", r.show());
    // Everything init writes is there: key, witness and API key.
    let r = run(&work, &["status", "--agent", "piped", "--json"], &[]);
    assert_eq!(r.code, Some(0), "{}", r.show());
    let status: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(
        status["agents"][0]["witness"]["url"],
        s.server.url.as_str(),
        "{}",
        r.show()
    );
    assert!(work.join(".tally/agents/piped/api-key").exists());

    let r = run(
        &work,
        &["record", "note", "n", "--agent", "bot", "--wait-receipt"],
        &[],
    );
    assert_eq!(r.code, Some(0), "{}", r.show());
    let valid = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/conformance/valid");
    let vkey = std::fs::read_to_string(valid.join("log.vkey")).unwrap();
    let key_env = [
        ("TALLY_API_KEY", s.api_key.as_str()),
        ("TALLY_WITNESS_URL", s.server.url.as_str()),
    ];
    for args in [
        &["status"][..],
        &["status", "--json", "--records"][..],
        &["export", "--agent", "bot", "-o", "-"][..],
        &["keys", "export", "-o", "-"][..],
        &[
            "verify",
            valid.join("pack.jsonl").to_str().unwrap(),
            "--agent-keys",
            valid.join("agent-keys.json").to_str().unwrap(),
            "--witness-key",
            vkey.trim(),
        ][..],
        &["--help"][..],
    ] {
        let r = run_into_closed_pipe(&work, args, &key_env);
        assert!(!r.stderr.contains("panicked"), "{args:?}: {}", r.show());
        assert!(
            r.code == Some(141) || (args == ["--help"] && r.code == Some(0)),
            "{args:?}: {}",
            r.show()
        );
    }
}

// Trap: a command line from an old benchmark note. The benchmarks are the
// `tally-bench` binary, not part of the product (docs/benchmarks.md):
// `tally --help` does not list them and `tally bench` is a usage error.
#[test]
fn the_product_binary_has_no_benchmarks() {
    let work = tempfile::tempdir().unwrap();
    let help = run(work.path(), &["--help"], &[]);
    assert_eq!(help.code, Some(0), "{}", help.show());
    assert!(help.stdout.contains("  serve "), "{}", help.show());
    assert!(
        !help
            .stdout
            .lines()
            .any(|l| l.trim_start().starts_with("bench")),
        "{}",
        help.show()
    );
    let old = run(work.path(), &["bench", "verify", "--sizes", "10"], &[]);
    assert_eq!(old.code, Some(2), "{}", old.show());
    assert!(
        old.stderr.contains("unrecognized subcommand 'bench'"),
        "{}",
        old.show()
    );
}

// Trap: wrong files look like failed packs.
#[test]
fn wrong_files_for_verify_are_usage_errors_that_name_the_file() {
    let valid = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/conformance/valid");
    let pack = valid.join("pack.jsonl");
    let keys = valid.join("agent-keys.json");
    let head = valid.join("head.json");
    let vkey = std::fs::read_to_string(valid.join("log.vkey")).unwrap();
    let (pack, keys, head) = (
        pack.to_str().unwrap(),
        keys.to_str().unwrap(),
        head.to_str().unwrap(),
    );
    let vkey = vkey.trim();
    let cases: [(&str, Vec<&str>, &[&str]); 6] = [
        (
            "agent-keys.json as the pack",
            vec![keys, "--agent-keys", keys],
            &[
                "agent-keys.json",
                "agent keys",
                "not a pack",
                "--agent-keys",
            ],
        ),
        (
            "head.json as the pack",
            vec![head, "--agent-keys", keys],
            &["head.json", "not a pack", "--head"],
        ),
        (
            "pack and agent keys swapped",
            vec![keys, "--agent-keys", pack],
            &["pack.jsonl", "is a pack", "swapped"],
        ),
        (
            "a pack as head.json",
            vec![pack, "--agent-keys", keys, "--head", pack],
            &["pack.jsonl", "is a pack", "--head"],
        ),
        (
            "agent keys as head.json",
            vec![pack, "--agent-keys", keys, "--head", keys],
            &["agent-keys.json", "agent keys", "--head"],
        ),
        (
            "head.json as agent keys",
            vec![pack, "--agent-keys", head],
            &["head.json", "--agent-keys"],
        ),
    ];
    let here = std::env::current_dir().unwrap();
    for (what, args, says) in cases {
        let mut all = vec!["verify"];
        all.extend(args);
        all.extend(["--witness-key", vkey]);
        let r = run(&here, &all, &[]);
        assert_eq!(r.code, Some(2), "{what}: {}", r.show());
        assert!(r.stdout.is_empty(), "{what}: {}", r.show());
        for s in says {
            assert!(r.stderr.contains(s), "{what}: {s}: {}", r.show());
        }
        assert!(
            !r.stderr.contains("trailing characters"),
            "{what}: {}",
            r.show()
        );
    }
}

// Trap: `tally export` silently overwrites an existing file.
#[test]
fn export_refuses_to_overwrite_a_file_without_force() {
    let s = Setup::new();
    let work = s.work();
    let r = run(
        &work,
        &["record", "note", "n", "--agent", "bot", "--wait-receipt"],
        &[],
    );
    assert_eq!(r.code, Some(0), "{}", r.show());
    let env = [
        ("TALLY_API_KEY", s.api_key.as_str()),
        ("TALLY_WITNESS_URL", s.server.url.as_str()),
    ];
    let pack = work.join("pack.jsonl");
    std::fs::write(&pack, "evidence\n").unwrap();
    let r = run(
        &work,
        &["export", "--agent", "bot", "-o", "pack.jsonl"],
        &env,
    );
    assert_eq!(r.code, Some(2), "{}", r.show());
    assert!(
        r.stderr.contains("pack.jsonl") && r.stderr.contains("--force"),
        "{}",
        r.show()
    );
    assert_eq!(std::fs::read_to_string(&pack).unwrap(), "evidence\n");
    let r = run(
        &work,
        &["export", "--agent", "bot", "-o", "pack.jsonl", "--force"],
        &env,
    );
    assert_eq!(r.code, Some(0), "{}", r.show());
    assert!(std::fs::read_to_string(&pack)
        .unwrap()
        .starts_with("{\"agents\""));
}

// Trap: `serve` says nothing when it refuses an agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_logs_refusals_with_401_and_403_without_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let server = LoggedServer::start(&tmp.path().join("data"), &tmp.path().join("serve.log"));
    let api_key = banner_value(&server.banner, "API key").unwrap();
    // An agent with a key that is not registered: 403 agent_not_allowed.
    let r = run(
        &work,
        &[
            "agent",
            "init",
            "ghost",
            "--witness",
            &server.url,
            "--api-key",
            &api_key,
        ],
        &[],
    );
    assert_eq!(r.code, Some(0), "{}", r.show());
    let r = run(&work, &["record", "note", "boo", "--agent", "ghost"], &[]);
    assert_eq!(r.code, Some(0), "{}", r.show());
    // A revoked or mistyped API key: 401.
    let wrong = format!("tally_0123456789abcdef_{}", "7".repeat(48));
    let r = run(
        &work,
        &["record", "note", "boo", "--agent", "ghost"],
        &[("TALLY_API_KEY", &wrong)],
    );
    assert_eq!(r.code, Some(0), "{}", r.show());
    // Many refusals do not flood the log.
    let http = reqwest::Client::new();
    for _ in 0..200 {
        let _ = http
            .get(format!("{}/v1/agents", server.url))
            .bearer_auth(&wrong)
            .send()
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let log = loop {
        let log = server.log_text();
        if log.contains("counted, not logged") || Instant::now() > deadline {
            break log;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let refusals: Vec<&str> = log.lines().filter(|l| l.contains("refused")).collect();
    let forbidden = refusals
        .iter()
        .find(|l| l.contains("403"))
        .unwrap_or_else(|| panic!("no 403 line in {log}"));
    for says in ["/v1/records", "agent_not_allowed", "ghost", "default"] {
        assert!(forbidden.contains(says), "{says}: {forbidden}");
    }
    let unauthorized = refusals
        .iter()
        .find(|l| l.contains("401"))
        .unwrap_or_else(|| panic!("no 401 line in {log}"));
    for says in ["/v1/records", "unauthorized", "0123456789abcdef"] {
        assert!(unauthorized.contains(says), "{says}: {unauthorized}");
    }
    assert!(
        !log.contains(&"7".repeat(48)),
        "the secret is logged: {log}"
    );
    assert!(
        refusals.len() < 50,
        "{} refusal lines: {log}",
        refusals.len()
    );
    assert!(log.contains("counted, not logged"), "{log}");
}

// The salted hashes `tally record` writes recompute from the salt (and
// content) it keeps, as protocol.md §6.1 says anyone can recompute them.
#[test]
fn recorded_hashes_recompute_from_the_kept_salt_and_content() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let r = run(dir, &["agent", "init", "bot"], &[]);
    assert_eq!(r.code, Some(0), "{}", r.show());
    let r = run(
        dir,
        &[
            "record",
            "decision",
            "--agent",
            "bot",
            "--tool",
            "refund",
            "--call-id",
            "c1",
            "--input",
            r#"{ "b": [1, 2.50], "a": "\u00e9" }"#,
            "--store-content",
        ],
        &[],
    );
    assert_eq!(r.code, Some(0), "{}", r.show());
    let r = run(
        dir,
        &[
            "record",
            "outcome",
            "--agent",
            "bot",
            "--call-id",
            "c1",
            "--status",
            "ok",
            "--output",
            r#"{"z": {}, "y": -0}"#,
        ],
        &[],
    );
    assert_eq!(r.code, Some(0), "{}", r.show());

    let state = tally_gateway::state::StateDir::new(dir.join(".tally"));
    let agent = tally_schemas::AgentName::new("bot").unwrap();
    let store = tally_gateway::store::ChainStore::open(&state.agent(&agent).store()).unwrap();
    let records = store.records(0, 10).unwrap();
    assert_eq!(records.len(), 2);
    for (seq, member, canonical, kept) in [
        (0u64, "input_hash", r#"{"a":"é","b":[1,2.5]}"#, true),
        (1, "output_hash", r#"{"y":0,"z":{}}"#, false),
    ] {
        let secret = store.secret(seq).unwrap().expect("the salt is kept");
        let salt: [u8; 16] = hex::decode(&secret.salt).unwrap().try_into().unwrap();
        let body = serde_json::to_value(&records[seq as usize].body).unwrap();
        assert_eq!(
            body[member],
            tally_schemas::hash::salted_hash(&salt, canonical.as_bytes()).to_hex(),
            "{member}"
        );
        assert_eq!(secret.content.is_some(), kept, "{member}");
    }
}

/// A script that starts `serve` and waits for its port to accept before
/// running the next command finds the data folder ready: the port is bound
/// first (so a port in use fails before anything is made) but accepts only
/// once the admin token and the first API key are written.
#[test]
fn the_port_accepts_only_once_the_data_folder_is_ready() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("tally-data");
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut child = command(
        tmp.path(),
        &["serve", "--data-dir", "tally-data", "--listen", &addr],
        &[],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(&addr).is_err() {
        assert!(Instant::now() < deadline, "serve never accepted on {addr}");
        assert!(child.try_wait().unwrap().is_none(), "serve exited");
        std::thread::sleep(Duration::from_millis(1));
    }
    let token_there = data.join("admin.token").exists();
    let created = run(
        tmp.path(),
        &[
            "project",
            "create",
            "scripted",
            "--witness",
            &format!("http://{addr}"),
            "--data-dir",
            "tally-data",
        ],
        &[],
    );
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        token_there,
        "the port accepted before admin.token was written"
    );
    assert_eq!(created.code, Some(0), "{}", created.show());
}

/// The quickstart's `TALLY_WITNESS_URL` and `TALLY_API_KEY` for one
/// witness, still exported while an agent is set up for another: the agent
/// stays with the witness it was pinned to (its records never land in the
/// other log), `agent add` refuses to register its key on the other one,
/// naming both and the variable, and `tally status` says where each
/// setting came from (docs/operations.md, "The agent's witness").
#[test]
fn an_agent_pinned_to_one_witness_is_not_moved_by_the_environment() {
    let tmp = tempfile::tempdir().unwrap();
    let a = Server::start(&tmp.path().join("a"), &[]);
    let b = Server::start(&tmp.path().join("b"), &[]);
    let (key_a, key_b) = (a.banner_value("API key"), b.banner_value("API key"));
    // Two installs, two origins.
    assert_ne!(a.banner_value("origin"), b.banner_value("origin"));
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let env = [
        ("TALLY_WITNESS_URL", a.url.as_str()),
        ("TALLY_API_KEY", key_a.as_str()),
    ];
    let r = run(
        &work,
        &[
            "agent",
            "init",
            "pg-a",
            "--witness",
            &b.url,
            "--api-key",
            &key_b,
        ],
        &env,
    );
    assert_eq!(r.code, Some(0), "{}", r.show());
    let public = r
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("public key: "))
        .unwrap()
        .trim()
        .to_owned();

    // Registering on the witness of the environment: refused.
    let r = run(
        &work,
        &["agent", "add", "pg-a", "--public-key", &public],
        &env,
    );
    assert_eq!(r.code, Some(2), "{}", r.show());
    assert!(
        r.stderr.contains(&a.url)
            && r.stderr.contains(&b.url)
            && r.stderr.contains("TALLY_WITNESS_URL")
            && r.stderr.contains("nothing was registered"),
        "{}",
        r.show()
    );
    let r = run(
        &work,
        &[
            "agent",
            "add",
            "pg-a",
            "--public-key",
            &public,
            "--witness",
            &b.url,
            "--api-key",
            &key_b,
        ],
        &env,
    );
    assert_eq!(r.code, Some(0), "{}", r.show());

    // A record with the other witness still in the environment goes to
    // the pinned one, receipted by it, and says what it ignored.
    let r = run(
        &work,
        &[
            "record",
            "note",
            "--agent",
            "pg-a",
            "hello",
            "--wait-receipt",
        ],
        &env,
    );
    assert_eq!(r.code, Some(0), "{}", r.show());
    assert!(
        r.stderr.contains("TALLY_WITNESS_URL names the witness at") && r.stderr.contains(&b.url),
        "{}",
        r.show()
    );
    let r = run(&work, &["status"], &env);
    assert!(
        r.stdout.contains("not yet receipted: 0")
            && r.stdout.contains(&format!("witness: {}", b.url))
            && r.stdout.contains("pinned by `tally agent init --witness`")
            && r.stdout
                .contains("API key: stored by `tally agent init --api-key`")
            && r.stdout
                .contains("note: TALLY_WITNESS_URL names the witness at"),
        "{}",
        r.show()
    );
    // Without the other witness in the environment, no note.
    let r = run(&work, &["status"], &[]);
    assert!(!r.stdout.contains("note:"), "{}", r.show());
    assert!(r.stdout.contains("API key: stored by"), "{}", r.show());
}

/// A pack exported from one witness, taken to another: `tally head`
/// refuses to make head.json there, naming both logs, and `tally verify`
/// with the other witness's key names who did sign the pack and the head
/// (docs/operations.md, "Exports for auditors").
#[test]
fn a_pack_from_another_witness_is_named_as_such() {
    let tmp = tempfile::tempdir().unwrap();
    let a = Server::start(&tmp.path().join("a"), &[]);
    let b = Server::start(&tmp.path().join("b"), &[]);
    let (key_a, key_b) = (a.banner_value("API key"), b.banner_value("API key"));
    let (origin_a, origin_b) = (a.banner_value("origin"), b.banner_value("origin"));
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let env = [
        ("TALLY_WITNESS_URL", a.url.as_str()),
        ("TALLY_API_KEY", key_a.as_str()),
    ];
    let r = run(
        &work,
        &[
            "agent",
            "init",
            "bot",
            "--witness",
            &a.url,
            "--api-key",
            &key_a,
        ],
        &env,
    );
    assert_eq!(r.code, Some(0), "{}", r.show());
    let public = r
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("public key: "))
        .unwrap()
        .trim()
        .to_owned();
    let r = run(
        &work,
        &["agent", "add", "bot", "--public-key", &public],
        &env,
    );
    assert_eq!(r.code, Some(0), "{}", r.show());
    let r = run(
        &work,
        &[
            "record",
            "note",
            "--agent",
            "bot",
            "hello",
            "--wait-receipt",
        ],
        &env,
    );
    assert_eq!(r.code, Some(0), "{}", r.show());
    for args in [
        &["export", "--agent", "bot", "-o", "pack.jsonl"][..],
        &["keys", "export", "-o", "agent-keys.json"][..],
        &["head", "--pack", "pack.jsonl", "-o", "head.json"][..],
    ] {
        let r = run(&work, args, &env);
        assert_eq!(r.code, Some(0), "{}", r.show());
    }

    // head.json from the other witness: refused before asking, naming both logs.
    let r = run(
        &work,
        &[
            "head",
            "--pack",
            "pack.jsonl",
            "-o",
            "head-b.json",
            "--witness",
            &b.url,
            "--api-key",
            &key_b,
        ],
        &env,
    );
    assert_eq!(r.code, Some(2), "{}", r.show());
    assert!(
        r.stderr.contains(&origin_a)
            && r.stderr.contains(&origin_b)
            && r.stderr.contains("the witness that exported the pack"),
        "{}",
        r.show()
    );
    assert!(!work.join("head-b.json").exists());

    // Verified with the other witness's key: each failing check says who signed.
    let vkey_b = b.banner_value("witness key");
    let r = run(
        &work,
        &[
            "verify",
            "pack.jsonl",
            "--agent-keys",
            "agent-keys.json",
            "--head",
            "head.json",
            "--witness-key",
            &vkey_b,
        ],
        &env,
    );
    assert_eq!(r.code, Some(1), "{}", r.show());
    let line = |check: &str| {
        r.stdout
            .lines()
            .find(|l| l.starts_with(&format!("{check}: fail")))
            .unwrap_or_else(|| panic!("no failing {check} line: {}", r.show()))
            .to_owned()
    };
    for check in ["witness_signatures", "head"] {
        let l = line(check);
        assert!(
            l.contains(&format!("it is signed by {origin_a}+")),
            "{check}: {l}"
        );
    }
}

/// A witness whose log goes back (a data folder restored from a backup):
/// the agent's next sync sends the lost records again, and `tally status`
/// says what the superseded receipts mean and what to do
/// (docs/operations.md, "Superseded receipts").
#[test]
fn superseded_receipts_say_what_happened_and_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let state = tmp.path().join("state");
    let server = Server::start(&data, &[]);
    let key = server.banner_value("API key");
    common::add_agent(&server, &key, &state, "bot");
    let listen = server.url.trim_start_matches("http://").to_owned();
    assert!(server.sigterm().success());
    let backup = tmp.path().join("backup");
    common::copy_dir(&data, &backup);
    let server = Server::start_at(&data, &listen, &[]);
    common::record_notes(&state, "bot", 2);
    assert!(server.sigterm().success());
    std::fs::remove_dir_all(&data).unwrap();
    common::copy_dir(&backup, &data);
    let server = Server::start_at(&data, &listen, &[]);
    // The next record meets the witness's shorter chain: the two it lost
    // are sent again before it.
    common::record_notes(&state, "bot", 1);
    let env = [("TALLY_STATE_DIR", state.to_str().unwrap())];
    let r = run(tmp.path(), &["status"], &env);
    assert!(
        r.stdout.contains("!!! 2 receipts were superseded")
            && r.stdout.contains(&format!("the witness at {}", server.url))
            && r.stdout.contains("ask the witness's operator")
            && r.stdout.contains("Superseded receipts"),
        "{}",
        r.show()
    );
    drop(server);
}

/// A wrong `TALLY_API_KEY` in the environment: `record` keeps the record
/// (exit 0) and names the variable and what to do; `export`'s 401 says
/// which key was refused and what to do.
#[test]
fn a_wrong_api_key_in_the_environment_is_named_with_a_next_step() {
    let s = Setup::new();
    let work = s.work();
    let wrong = format!("tally_0123456789abcdef_{}", "7".repeat(48));
    let r = run(
        &work,
        &["record", "note", "hello", "--agent", "bot"],
        &[("TALLY_API_KEY", &wrong)],
    );
    assert_eq!(r.code, Some(0), "{}", r.show());
    assert!(
        r.stderr.contains("[unauthorized]")
            && r.stderr
                .contains("the API key presented is from TALLY_API_KEY")
            && r.stderr.contains("unset TALLY_API_KEY"),
        "{}",
        r.show()
    );
    assert!(
        !r.stderr.contains(&wrong),
        "the key is echoed: {}",
        r.show()
    );
    let r = run(
        &work,
        &["export", "--agent", "bot", "-o", "pack.jsonl"],
        &[
            ("TALLY_API_KEY", &wrong),
            ("TALLY_WITNESS_URL", &s.server.url),
        ],
    );
    assert_eq!(r.code, Some(2), "{}", r.show());
    assert!(
        r.stderr.contains("401")
            && r.stderr
                .contains("the API key from TALLY_API_KEY is not a current key")
            && r.stderr.contains(&s.server.url),
        "{}",
        r.show()
    );
}

/// `agent sync` against a witness that accepts connections and never
/// answers says at once what it waits for and how long, and then what to
/// do; it waits no longer than --timeout.
#[test]
fn agent_sync_against_a_hung_witness_says_what_it_waits_for() {
    let s = Setup::new();
    let work = s.work();
    let hung = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", hung.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in hung.incoming() {
            held.push(c);
        }
    });
    let config = work.join(".tally/agents/bot/config.json");
    let mut c: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    c["witness"]["url"] = url.as_str().into();
    std::fs::write(&config, serde_json::to_vec(&c).unwrap()).unwrap();
    let r = run(
        &work,
        &["record", "note", "held", "--agent", "bot", "--no-sync"],
        &[],
    );
    assert_eq!(r.code, Some(0), "{}", r.show());
    let started = Instant::now();
    let r = run(&work, &["agent", "sync", "bot", "--timeout", "2"], &[]);
    assert!(started.elapsed() < Duration::from_secs(15), "{}", r.show());
    assert_eq!(r.code, Some(1), "{}", r.show());
    assert!(
        r.stderr.contains(&format!(
            "sending 1 record(s) of bot to the witness at {url}"
        )) && r.stderr.contains("waiting up to 2 s"),
        "{}",
        r.show()
    );
    assert!(
        r.stdout.contains("did not answer") && r.stdout.contains("safe in the local chain"),
        "{}",
        r.show()
    );
}

/// An export made while a configured cosigner is down warns that the pack
/// lacks its cosignature (docs/api.md "Exports"), instead of a pack that
/// later fails `verify --trust` without a word.
#[test]
fn an_export_without_a_cosigners_signature_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let cosigner = tmp.path().join("cosigner");
    let r = run(
        tmp.path(),
        &[
            "cosigner",
            "init",
            "--name",
            "cosigner.example/c1",
            "--data-dir",
            cosigner.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(r.code, Some(0), "{}", r.show());
    let vkey = r
        .stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("cosigner key"))
        .unwrap()
        .trim()
        .to_owned();
    // Never started: its URL refuses connections.
    let down = format!("name=c1,vkey={vkey},url=http://{}", closed_port());
    let data = tmp.path().join("data");
    let server = Server::start(&data, &["--cosigner", &down, "--export-cosign-wait", "1"]);
    let key = server.banner_value("API key");
    let state = tmp.path().join("state");
    common::add_agent(&server, &key, &state, "bot");
    common::record_notes(&state, "bot", 1);
    let env = [
        ("TALLY_WITNESS_URL", server.url.as_str()),
        ("TALLY_API_KEY", key.as_str()),
    ];
    let r = run(
        tmp.path(),
        &["export", "--agent", "bot", "-o", "pack.jsonl"],
        &env,
    );
    assert_eq!(r.code, Some(0), "{}", r.show());
    assert!(
        r.stderr.contains("lacks the cosignature of c1") && r.stderr.contains("verify --trust"),
        "{}",
        r.show()
    );
}

/// `record --wait-receipt` against a witness that does not answer (one
/// failing over, say) says after 2 s what it waits for, instead of sitting
/// silent for the whole --sync-timeout.
#[test]
fn wait_receipt_says_that_it_waits() {
    let s = Setup::new();
    let work = s.work();
    let hung = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", hung.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in hung.incoming() {
            held.push(c);
        }
    });
    let config = work.join(".tally/agents/bot/config.json");
    let mut c: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    c["witness"]["url"] = url.as_str().into();
    std::fs::write(&config, serde_json::to_vec(&c).unwrap()).unwrap();
    let r = run(
        &work,
        &[
            "record",
            "note",
            "waited",
            "--agent",
            "bot",
            "--wait-receipt",
            "--sync-timeout",
            "4",
        ],
        &[],
    );
    assert_eq!(r.code, Some(1), "{}", r.show());
    assert!(
        r.stderr.contains(&format!(
            "no receipt yet for bot's record seq 0 from the witness at {url}"
        )) && r.stderr.contains("up to 4 s"),
        "{}",
        r.show()
    );
    // One more record without --wait-receipt: its one 2 s try gives up
    // ([timeout]), and `tally status` does not say "none" as if all were well.
    let r = run(&work, &["record", "note", "one try", "--agent", "bot"], &[]);
    assert_eq!(r.code, Some(0), "{}", r.show());
    let r = run(&work, &["status"], &[]);
    assert!(
        !r.stdout.contains("last sync error: none\n")
            && (r.stdout.contains("not yet receipted")
                && r.stdout.contains("tally agent sync bot")
                || r.stdout.contains("last sync error: 2")),
        "{}",
        r.show()
    );
}
