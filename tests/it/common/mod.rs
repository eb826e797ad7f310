//! Helpers shared by the end-to-end tests of the real `tally` binary: a
//! `tally serve` on a free loopback port, killed on drop, and a way to run
//! other `tally` commands.

// Each test binary uses a different part of this module.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) mod agent;
pub(crate) mod hostile;
pub(crate) mod kill9;

pub(crate) const TALLY: &str = env!("CARGO_BIN_EXE_tally");

/// One test process runs every suite, as many tests at once as there are
/// cores. The suites that load the machine on their own -- the attack suite
/// (thousands of sockets, the shared open-file limit), the kill -9 loops and
/// the PostgreSQL failover loop -- hold [`heavy`] for the whole test, so that
/// they run one at a time and beside no test that holds [`not_beside_heavy`].
static HEAVY: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Held for the whole of a heavy suite's test (see [`HEAVY`]).
pub(crate) async fn heavy() -> tokio::sync::RwLockWriteGuard<'static, ()> {
    HEAVY.write().await
}

/// Held by a test that must not run beside a heavy suite, though it may run
/// beside others of its kind: the PostgreSQL tests of `tally serve`, which
/// share the one PostgreSQL server (tally_testkit::postgres::shared) that the
/// failover loop loads, and time server starts and lease expiries. For a
/// synchronous test (outside a tokio runtime).
pub(crate) fn not_beside_heavy() -> tokio::sync::RwLockReadGuard<'static, ()> {
    HEAVY.blocking_read()
}

/// [`not_beside_heavy`] for a test that runs inside a tokio runtime.
pub(crate) async fn not_beside_heavy_async() -> tokio::sync::RwLockReadGuard<'static, ()> {
    HEAVY.read().await
}

/// `POST /v1/records` of `record`, as an agent posts it.
pub(crate) async fn post_record(
    http: &reqwest::Client,
    url: &str,
    api_key: &str,
    record: &tally_schemas::Record,
) -> reqwest::Result<reqwest::Response> {
    http.post(format!("{url}/v1/records"))
        .bearer_auth(api_key)
        .body(record.canonical_bytes().to_vec())
        .send()
        .await
}

/// A running `tally serve`, killed on drop.
pub(crate) struct Server {
    pub child: Child,
    pub url: String,
    pub banner: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    // The child is returned inside `Self`, which reaps it (Drop, kill9, sigterm).
    #[allow(clippy::zombie_processes)]
    pub(crate) fn start(data: &Path, extra: &[&str]) -> Self {
        Self::start_at(data, "127.0.0.1:0", extra)
    }

    /// [`Server::start`] on a given listen address (a restart on the port
    /// the agents' state names).
    #[allow(clippy::zombie_processes)]
    pub(crate) fn start_at(data: &Path, listen: &str, extra: &[&str]) -> Self {
        Self::start_with_env(data, listen, extra, &[])
    }

    /// [`Server::start_at`] with extra environment variables for the
    /// server (e.g. `TALLY_REGISTRY_RELOAD_MS`).
    #[allow(clippy::zombie_processes)]
    pub(crate) fn start_with_env(
        data: &Path,
        listen: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let mut child = Command::new(TALLY)
            .arg("serve")
            .arg("--data-dir")
            .arg(data)
            // The address asked for, unless the test passes its own --listen.
            .args(if extra.contains(&"--listen") {
                vec![]
            } else {
                vec!["--listen", listen]
            })
            .args(extra)
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start tally serve");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut banner = String::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut line = String::new();
            if out.read_line(&mut line).unwrap() == 0 {
                let _ = child.kill();
                let _ = child.wait();
                panic!("tally serve exited at start: {banner}");
            }
            banner.push_str(&line);
            if let Some(rest) = line.strip_prefix("tally: listening on ") {
                let url = rest.split_whitespace().next().unwrap().to_owned();
                // Keep draining stdout so the server never blocks on a full pipe.
                std::thread::spawn(move || for _ in out.lines() {});
                return Self { child, url, banner };
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("no listening line: {banner}");
            }
        }
    }

    pub(crate) fn banner_value(&self, label: &str) -> String {
        self.banner
            .lines()
            .find_map(|l| {
                l.trim_start()
                    .strip_prefix(label)
                    .map(|v| v.trim().to_owned())
            })
            .unwrap_or_else(|| panic!("no {label} in banner:\n{}", self.banner))
    }

    /// SIGKILL, as a crash would.
    pub(crate) fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Sends `sig` (as `kill` spells it: `-STOP`, `-CONT`, ...) to the server.
    pub(crate) fn signal(&self, sig: &str) {
        assert!(Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success());
    }

    pub(crate) fn sigterm(mut self) -> std::process::ExitStatus {
        self.signal("-TERM");
        let status = self.child.wait().unwrap();
        std::mem::forget(self);
        status
    }
}

pub(crate) fn tally(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(TALLY)
        .args(args)
        .envs(env.iter().copied())
        .env_remove("TALLY_API_KEY")
        .env_remove("TALLY_WITNESS_URL")
        .envs(env.iter().copied())
        .output()
        .expect("run tally");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `tally-bench` (the benchmarks, `bench/`: another package, so cargo
/// gives these tests no `CARGO_BIN_EXE_` for it) as [`tally`] runs `tally`.
pub(crate) fn tally_bench(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(tally_bench_binary())
        .args(args)
        .env_remove("TALLY_API_KEY")
        .env_remove("TALLY_WITNESS_URL")
        .output()
        .expect("run tally-bench");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The `tally-bench` binary, built once per test process by the cargo that
/// runs these tests, into this build's target folder and profile (this
/// executable is `<target>/<profile>/deps/it-<hash>`), so it is never a
/// stale copy.
fn tally_bench_binary() -> &'static Path {
    static BIN: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test executable's path");
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("the test executable is in <target>/<profile>/deps");
        let target = profile_dir.parent().expect("a target folder");
        let mut build = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        build
            .args([
                "build",
                "--locked",
                "-p",
                "tally-bench",
                "--bin",
                "tally-bench",
            ])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("CARGO_TARGET_DIR", target);
        match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => {}
            Some("release") => {
                build.arg("--release");
            }
            Some(other) => {
                build.args(["--profile", other]);
            }
            None => panic!("no profile folder in {}", exe.display()),
        }
        let out = build.output().expect("run cargo build -p tally-bench");
        assert!(
            out.status.success(),
            "cargo build -p tally-bench: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        profile_dir.join("tally-bench")
    })
}

/// Registers `agent` (its key kept in `state`) with the witness at `server`
/// using the project API key `key`.
pub(crate) fn add_agent(server: &Server, key: &str, state: &Path, agent: &str) {
    let env = [("TALLY_STATE_DIR", state.to_str().unwrap())];
    let (ok, out, err) = tally(
        &[
            "agent",
            "init",
            agent,
            "--witness",
            &server.url,
            "--api-key",
            key,
        ],
        &env,
    );
    assert!(ok, "agent init: {err}");
    let public = out
        .lines()
        .find_map(|l| l.strip_prefix("public key: "))
        .unwrap_or_else(|| panic!("no public key in {out}"))
        .trim()
        .to_owned();
    let (ok, _, err) = tally(
        &[
            "agent",
            "add",
            agent,
            "--public-key",
            &public,
            "--witness",
            &server.url,
            "--api-key",
            key,
        ],
        &[],
    );
    assert!(ok, "agent add: {err}");
}

/// Records `n` notes for `agent` (state in `state`), waiting for each receipt.
pub(crate) fn record_notes(state: &Path, agent: &str, n: usize) {
    let env = [("TALLY_STATE_DIR", state.to_str().unwrap())];
    for i in 0..n {
        let (ok, _, err) = tally(
            &[
                "record",
                "note",
                "--agent",
                agent,
                &format!("note {i}"),
                "--wait-receipt",
            ],
            &env,
        );
        assert!(ok, "record note: {err}");
    }
}

/// Copies the files of folder `from` into `to` (a data folder copied while
/// its server is stopped).
pub(crate) fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}
