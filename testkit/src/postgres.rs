//! A real PostgreSQL server for tests: `initdb` into a temporary folder, a
//! server on a free loopback port (its Unix socket in that folder too), and
//! a fresh database per caller. No mock: the binaries of Debian's
//! `postgresql` package (`/usr/lib/postgresql/<n>/bin`, or the folder named
//! by `TALLY_PG_BIN`).
//!
//! - Missing binaries FAIL the test with a message saying to install
//!   `postgresql`, unless `TALLY_SKIP_POSTGRES=1` is set (CI never sets it):
//!   then [`database`] returns `None` and the caller reports the skip.
//! - `initdb` and `postgres` refuse to run as root. When the test runs as
//!   root (CI does), the server runs as an unprivileged user (`nobody`, or
//!   `TALLY_PG_USER`) through `runuser`, and its folder is handed to that
//!   user.
//! - One server per test process ([`shared`]), started on first use. A
//!   watchdog process stops it (fast shutdown) and removes its folder when
//!   the test process exits, however it exits; [`PgServer::start`] gives a
//!   private server that [`Drop`] stops.
//! - [`PgServer::start_tls`] gives a private server with `ssl = on` and a
//!   certificate for `localhost` signed by a CA made for the test (the
//!   `openssl` command; [`PgServer::ca_file`]), and a second CA that
//!   signed nothing ([`PgServer::other_ca_file`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The environment variable that turns a missing PostgreSQL into a skip.
pub const SKIP_ENV: &str = "TALLY_SKIP_POSTGRES";

/// Whether PostgreSQL tests are to be skipped (`TALLY_SKIP_POSTGRES=1`).
#[must_use]
pub fn skipped() -> bool {
    std::env::var(SKIP_ENV).is_ok_and(|v| v == "1")
}

/// A running PostgreSQL server in a temporary folder.
pub struct PgServer {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    run_as: Option<String>,
    stopped: std::sync::atomic::AtomicBool,
}

/// The folder of `initdb`, `pg_ctl` and `postgres`.
///
/// # Panics
/// When no PostgreSQL is installed, with a message saying how to get one.
#[must_use]
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TALLY_PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    found.sort();
    match found.pop() {
        Some((_, bin)) => bin,
        None => panic!(
            "PostgreSQL is not installed: these tests start a real server. \
             Install it (`apt-get install -y postgresql`), point TALLY_PG_BIN \
             at the folder holding initdb, or set {SKIP_ENV}=1 to skip them"
        ),
    }
}

fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

static NEXT: AtomicU64 = AtomicU64::new(0);

impl PgServer {
    /// Starts a new server (`initdb`, then `pg_ctl start`).
    ///
    /// # Panics
    /// When PostgreSQL is missing or does not start (with its log).
    #[must_use]
    pub fn start() -> Self {
        Self::start_with(false)
    }

    /// Starts a new server with TLS (`ssl = on`): its certificate names
    /// `localhost` only (DNS), not `127.0.0.1`, and is signed by the CA in
    /// [`PgServer::ca_file`]. Connect with `host=localhost` and
    /// `hostaddr=127.0.0.1` for a name that matches.
    ///
    /// # Panics
    /// As [`PgServer::start`], and when `openssl` fails.
    #[must_use]
    pub fn start_tls() -> Self {
        Self::start_with(true)
    }

    /// The PEM file of the CA that signed a TLS server's certificate.
    #[must_use]
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("tls").join("ca.pem")
    }

    /// The PEM file of a CA that signed nothing this server presents.
    #[must_use]
    pub fn other_ca_file(&self) -> PathBuf {
        self.dir.join("tls").join("other-ca.pem")
    }

    fn start_with(tls: bool) -> Self {
        let bin = bin_dir();
        let run_as = running_as_root()
            .then(|| std::env::var("TALLY_PG_USER").unwrap_or_else(|_| "nobody".into()));
        let dir = std::env::temp_dir().join(format!(
            "tally-pg-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the server's folder");
        if let Some(user) = &run_as {
            let ok = Command::new("chown")
                .arg(format!("{user}:"))
                .arg(&dir)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "chown {user}: {} failed", dir.display());
        }
        let server = Self {
            dir,
            bin,
            port: 0,
            run_as,
            stopped: false.into(),
        };
        server.watchdog();
        let data = server.dir.join("data");
        let out = server
            .pg("initdb")
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "tally", "-E", "UTF8", "--no-sync"])
            .args(["--locale", "C"])
            .output()
            .expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let mut server = server;
        let ssl = if tls {
            let (cert, key) = server.make_certificates();
            format!(
                " -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
                cert.display(),
                key.display()
            )
        } else {
            String::new()
        };
        for attempt in 0..5 {
            server.port = free_port();
            let opts = format!(
                "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=300 \
                 -c shared_buffers=32MB{ssl}",
                server.port,
                server.dir.display()
            );
            let status = server
                .pg("pg_ctl")
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(server.dir.join("server.log"))
                .args(["-o", &opts, "-w", "-t", "60", "start"])
                .stdout(Stdio::null())
                .status()
                .expect("run pg_ctl");
            if status.success() {
                return server;
            }
            // The port may have been taken between the probe and the start.
            eprintln!("postgres did not start (attempt {attempt}); retrying on another port");
        }
        panic!(
            "PostgreSQL did not start; its log:\n{}",
            std::fs::read_to_string(server.dir.join("server.log")).unwrap_or_default()
        );
    }

    /// Makes the test CA, a second CA, and the server's certificate and
    /// key (owned by the server's user, mode 0600, as PostgreSQL demands)
    /// in `tls/`; returns the certificate's and the key's paths.
    fn make_certificates(&self) -> (PathBuf, PathBuf) {
        let tls = self.dir.join("tls");
        std::fs::create_dir_all(&tls).expect("create the tls folder");
        std::fs::write(
            tls.join("openssl.cnf"),
            "[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = tally test\n\
             [ca_ext]\nbasicConstraints = critical,CA:TRUE\nkeyUsage = critical,keyCertSign,cRLSign\n\
             subjectKeyIdentifier = hash\n\
             [server_ext]\nbasicConstraints = critical,CA:FALSE\nkeyUsage = critical,digitalSignature\n\
             extendedKeyUsage = serverAuth\nsubjectAltName = DNS:localhost\n\
             subjectKeyIdentifier = hash\nauthorityKeyIdentifier = keyid\n",
        )
        .expect("write openssl.cnf");
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(&tls)
                .stdin(Stdio::null())
                .output()
                .expect("run openssl (install it: apt-get install openssl)");
            assert!(
                out.status.success(),
                "openssl {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        for (name, subject) in [
            ("ca", "/CN=tally test CA"),
            ("other-ca", "/CN=tally other CA"),
        ] {
            let (key, pem) = (format!("{name}.key"), format!("{name}.pem"));
            let mut args = vec![
                "req",
                "-x509",
                "-config",
                "openssl.cnf",
                "-extensions",
                "ca_ext",
            ];
            args.extend(ec);
            args.extend([
                "-keyout", &key, "-out", &pem, "-days", "3", "-subj", subject,
            ]);
            openssl(&args);
        }
        let mut args = vec!["req", "-new", "-config", "openssl.cnf"];
        args.extend(ec);
        args.extend([
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ]);
        openssl(&args);
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-set_serial",
            "4242",
            "-days",
            "3",
            "-extfile",
            "openssl.cnf",
            "-extensions",
            "server_ext",
            "-out",
            "server.crt",
        ]);
        let (cert, key) = (tls.join("server.crt"), tls.join("server.key"));
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))
                .expect("chmod the server key");
        }
        if let Some(user) = &self.run_as {
            let ok = Command::new("chown")
                .arg(format!("{user}:"))
                .arg(&cert)
                .arg(&key)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "chown {user}: the server's certificate failed");
        }
        (cert, key)
    }

    /// A command for the binary `name`, as the server's user.
    fn pg(&self, name: &str) -> Command {
        let exe = self.bin.join(name);
        let mut c = match &self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        c.current_dir(&self.dir).stdin(Stdio::null());
        c
    }

    /// Stops the server and removes its folder when this process is gone.
    fn watchdog(&self) {
        let script = r#"
            while kill -0 "$1" 2>/dev/null && [ -d "$2" ]; do sleep 0.5; done
            if [ -f "$2/data/postmaster.pid" ]; then
              pid=$(head -1 "$2/data/postmaster.pid")
              kill -INT "$pid" 2>/dev/null
              i=0; while kill -0 "$pid" 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
            fi
            rm -rf "$2"
        "#;
        // Never waited for: it outlives this process on purpose (init
        // reaps it).
        #[allow(clippy::zombie_processes)]
        let _watchdog = Command::new("sh")
            .args(["-c", script, "tally-pg-watchdog"])
            .arg(std::process::id().to_string())
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the PostgreSQL watchdog");
    }

    /// The server's port on 127.0.0.1.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's folder (its data folder is `data/` inside).
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The URL of database `db`, as user `tally` (trust authentication).
    #[must_use]
    pub fn url(&self, db: &str) -> String {
        format!("postgres://tally@127.0.0.1:{}/{db}", self.port)
    }

    /// Runs `sql` in database `db` with `psql`, returning its output.
    ///
    /// # Panics
    /// When psql fails.
    #[must_use]
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let psql = if self.bin.join("psql").exists() {
            self.bin.join("psql")
        } else {
            PathBuf::from("psql")
        };
        let out = Command::new(psql)
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "tally",
            ])
            .args(["-d", db, "-c", sql])
            .stdin(Stdio::null())
            .output()
            .expect("run psql");
        assert!(
            out.status.success(),
            "psql {sql:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Creates a new, empty database and returns its URL.
    #[must_use]
    pub fn fresh_database(&self) -> String {
        let name = format!(
            "t{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let _ = self.psql("postgres", &format!("CREATE DATABASE {name}"));
        self.url(&name)
    }

    /// Stops the server (fast shutdown) and waits for it.
    pub fn stop(&self) {
        if self.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        let started = Instant::now();
        let _ = self
            .pg("pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "fast", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if started.elapsed() > Duration::from_secs(30) {
            eprintln!("PostgreSQL took {:?} to stop", started.elapsed());
        }
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The server shared by every test of this process, started on first use.
///
/// # Panics
/// As [`PgServer::start`].
pub fn shared() -> &'static PgServer {
    static SERVER: OnceLock<PgServer> = OnceLock::new();
    SERVER.get_or_init(PgServer::start)
}

/// A fresh database on the [`shared`] server, or `None` when PostgreSQL
/// tests are skipped (`TALLY_SKIP_POSTGRES=1`; the caller says so).
///
/// # Panics
/// When PostgreSQL is missing and the tests are not skipped.
#[must_use]
pub fn database() -> Option<String> {
    if skipped() {
        eprintln!("SKIPPED: PostgreSQL tests ({SKIP_ENV}=1)");
        return None;
    }
    Some(shared().fresh_database())
}
