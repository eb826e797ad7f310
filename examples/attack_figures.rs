//! The figures of docs/benchmarks.md "Hostile connections": a release
//! `tally serve` on loopback, hostile clients on plain sockets (the attack
//! suite's, tests/it/common/hostile.rs), and an agent posting valid records
//! one after another during each attack. Prints, per attack, the valid
//! posts' p50/p99 (and their ratio to the same server before the attack),
//! `/healthz`, the server's RSS, and how the hostile connections ended.
//!
//!     cargo build --release --bin tally
//!     cargo run --release --example attack_figures [-- --tally target/release/tally --posts 500]
//!
//! Needs an open-file hard limit of at least 12,000 (`ulimit -Hn`). The
//! server runs with its default limits except `--header-timeout 60` and
//! `--body-timeout 60`, so that every hostile connection is still held while
//! the agent posts (opening thousands takes seconds); the defaults (10 s)
//! would close them sooner, which only makes the attack weaker.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tally_schemas::note::NoteVerifier;

#[path = "../tests/it/common/agent.rs"]
#[allow(dead_code)] // the example uses part of the test agent
mod agent;
#[path = "../tests/it/common/hostile.rs"]
mod hostile;

use agent::Agent;
use hostile::{open_held, probe, rss_kib, Attack};

struct Server {
    child: Child,
    url: String,
    api_key: String,
    log_key: NoteVerifier,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[allow(clippy::zombie_processes)] // reaped by Server's Drop
fn start(tally: &PathBuf, extra: &[&str]) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(tally)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--header-timeout",
            "60",
            "--body-timeout",
            "60",
        ])
        .args(extra)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start tally serve");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut banner = String::new();
    loop {
        let mut line = String::new();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "tally serve exited: {banner}"
        );
        banner.push_str(&line);
        if let Some(rest) = line.strip_prefix("tally: listening on ") {
            let url = rest.split_whitespace().next().unwrap().to_owned();
            std::thread::spawn(move || for _ in out.lines() {});
            let value = |label: &str| {
                banner
                    .lines()
                    .find_map(|l| {
                        l.trim_start()
                            .strip_prefix(label)
                            .map(|v| v.trim().to_owned())
                    })
                    .unwrap()
            };
            return Server {
                api_key: value("API key"),
                log_key: NoteVerifier::from_vkey(&value("witness key")).unwrap(),
                child,
                url,
                _dir: dir,
            };
        }
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let mut tally = std::env::current_exe()
        .ok()
        .and_then(|p| Some(p.parent()?.parent()?.join("tally")))
        .unwrap_or_else(|| PathBuf::from("target/release/tally"));
    let mut posts = 500usize;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--tally" => tally = PathBuf::from(args.next().expect("--tally PATH")),
            "--posts" => posts = args.next().and_then(|v| v.parse().ok()).expect("--posts N"),
            other => panic!("unknown argument {other}"),
        }
    }
    let nofile = hostile::raise_nofile(12_000).unwrap_or_else(|e| panic!("{e}"));
    println!(
        "tally: {} ; open-file limit {nofile}; {posts} valid posts per row",
        tally.display()
    );

    type Scenario = (&'static str, Vec<(Attack, usize)>);
    let key_placeholder = String::from("KEY");
    let scenarios: Vec<Scenario> = vec![
        ("no attack (baseline)", vec![]),
        ("10,000 idle connections", vec![(Attack::Idle, 10_000)]),
        (
            "5,000 held slow bodies (with an API key)",
            vec![(
                Attack::SlowBody {
                    key: Some(key_placeholder.clone()),
                },
                5_000,
            )],
        ),
        (
            "slow bodies without a key, 1,000 clients reconnecting",
            vec![(Attack::SlowBody { key: None }, 1_000)],
        ),
        ("2,000 slowloris", vec![(Attack::Slowloris, 2_000)]),
        (
            "2,000 large unfinished heads (15 KB)",
            vec![(Attack::LargeHead { bytes: 15_000 }, 2_000)],
        ),
        (
            "5,000 held slow bodies + 2,000 slowloris",
            vec![
                (
                    Attack::SlowBody {
                        key: Some(key_placeholder.clone()),
                    },
                    5_000,
                ),
                (Attack::Slowloris, 2_000),
            ],
        ),
    ];

    println!();
    println!("| attack | valid posts p50 ms | p99 ms | p99 / baseline p99 | failed posts | /healthz ok | server RSS MiB (before → during) | hostile connections closed by the server during the run |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut baseline_p99 = None;
    for (name, attacks) in scenarios {
        let server = start(&tally, &[]);
        let http = reqwest::Client::new();
        let mut agent = Agent::new("figures-bot");
        agent.register(&http, &server.url, &server.api_key).await;
        let addr = hostile::addr_of(&server.url);
        // Warm up: connections, the log, the first checkpoints.
        let _ = probe(
            &http,
            &server.url,
            &server.api_key,
            &mut agent,
            &server.log_key,
            20,
            Duration::ZERO,
        )
        .await;
        let pid = server.child.id();
        let before = rss_kib(pid);
        let opened_at = Instant::now();
        let mut held = Vec::new();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let churn_count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut churned = false;
        for (attack, n) in &attacks {
            match attack {
                // Answered at once: the attacker keeps reconnecting.
                Attack::SlowBody { key: None } => {
                    churned = true;
                    for _ in 0..*n {
                        let (stop, count) = (
                            std::sync::Arc::clone(&stop),
                            std::sync::Arc::clone(&churn_count),
                        );
                        held.push(tokio::spawn(async move {
                            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                                let _ = hostile::hold_one(
                                    addr,
                                    &Attack::SlowBody { key: None },
                                    Duration::from_secs(60),
                                )
                                .await;
                                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            }
                            hostile::Held {
                                closed_after: None,
                                status: None,
                            }
                        }));
                    }
                }
                Attack::SlowBody { key: Some(_) } => {
                    let attack = Attack::SlowBody {
                        key: Some(server.api_key.clone()),
                    };
                    held.extend(open_held(addr, &attack, *n, 200, Duration::from_secs(300)).await);
                }
                other => {
                    held.extend(open_held(addr, other, *n, 200, Duration::from_secs(300)).await)
                }
            }
        }
        let opened = opened_at.elapsed();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let p = probe(
            &http,
            &server.url,
            &server.api_key,
            &mut agent,
            &server.log_key,
            posts,
            Duration::from_millis(5),
        )
        .await;
        let during = rss_kib(pid);
        // How many hostile connections the server closed while we measured.
        let finished = held.iter().filter(|h| h.is_finished()).count();
        let total = held.len();
        for h in &held {
            h.abort();
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let closed_early = if churned {
            format!(
                "{} connections made and answered",
                churn_count.load(std::sync::atomic::Ordering::SeqCst)
            )
        } else if total > 0 {
            format!(
                "{finished} of {total} (opened in {:.1} s)",
                opened.as_secs_f64()
            )
        } else {
            String::new()
        };
        let p99 = p.percentile(99.0);
        let ratio = match baseline_p99 {
            None => {
                baseline_p99 = Some(p99);
                "1.00".to_owned()
            }
            Some(b) => format!(
                "{:.2}",
                p99.as_secs_f64() / Duration::as_secs_f64(&b).max(1e-6)
            ),
        };
        println!(
            "| {name} | {} | {} | {ratio} | {} | {}/{} | {} → {} | {closed_early} |",
            ms(p.percentile(50.0)),
            ms(p99),
            p.failures.len(),
            p.healthz_ok,
            p.healthz_total,
            before / 1024,
            during / 1024,
        );
        if !p.failures.is_empty() {
            eprintln!(
                "{name}: first failures: {:?}",
                p.failures.iter().take(3).collect::<Vec<_>>()
            );
        }
        drop(server);
        // Let the client's sockets go before the next row.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
