//! Cosigning with several fronts on PostgreSQL, through the real binaries
//! (docs/operations.md, "Cosigners for the log"): two `tally serve` fronts
//! on one database, both started with the same `--cosigner`, one `tally
//! cosigner serve`.
//! - while the first front sequences, it alone asks the cosigner, and both
//!   fronts serve the same cosigned checkpoint, the follower from the
//!   database, its metrics showing the cosigner ok;
//! - the cosigner is down while a checkpoint is signed: the follower,
//!   which asks nothing, counts no failure, and serves the checkpoint
//!   cosigned once the sequencer's retry gets the cosignature;
//! - the sequencer's front is killed (-9): the other takes the lease,
//!   integrates new records, asks the cosigner from the size it had
//!   followed, and serves a checkpoint cosigned after the kill, which a
//!   trust file with the cosigner's key accepts;
//! - the killed front, restarted, follows and serves that cosigned
//!   checkpoint too.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common;
use crate::cosigning_e2e::{free_port, init_cosigner, CosignerProc};

use common::{add_agent, record_notes, Server};
use tally_schemas::note::{peek_checkpoint, SignedNote};

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

/// Waits (up to 30 s) until `url`'s `/checkpoint` is of at least `size`
/// and its cosignatures meet `trust`; returns the note.
async fn cosigned_checkpoint(url: &str, size: u64, trust: &str) -> String {
    let trust = tally_verifier::trust::TrustFile::parse(trust).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let note = get(&format!("{url}/checkpoint")).await;
        let at = peek_checkpoint(&note).unwrap().size.get();
        if at >= size && trust.witnesses.check(&note).is_ok() {
            return note;
        }
        assert!(
            Instant::now() < deadline,
            "{url} serves no cosigned checkpoint of size {size} or more; the latest:\n{note}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Starts a front on `db_url` with `cosigner` (off the async runtime:
/// starting blocks on its banner).
async fn front(data: &Path, db_url: &str, cosigner: &str) -> Server {
    let (data, db_url, cosigner) = (data.to_owned(), db_url.to_owned(), cosigner.to_owned());
    tokio::task::spawn_blocking(move || {
        Server::start(
            &data,
            &[
                "--store",
                &db_url,
                "--lease-ttl",
                "2",
                "--rate-limit",
                "0",
                "--cosigner",
                &cosigner,
                "--cosigner-timeout",
                "5",
            ],
        )
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_front_that_sequences_asks_the_cosigner_and_a_new_sequencer_carries_on() {
    let _alone = common::not_beside_heavy_async().await;
    let Some(db_url) = tally_testkit::postgres::database() else {
        return;
    };
    let db = db_url.rsplit('/').next().unwrap().to_owned();
    let tmp = tempfile::tempdir().unwrap();
    let (a_dir, b_dir) = (tmp.path().join("a"), tmp.path().join("b"));

    // The log's key first (the cosigner must know it); b gets a copy of
    // a's data folder (the same log key).
    let (first, api_key, log_vkey) = {
        let a_dir = a_dir.clone();
        let db_url = db_url.clone();
        tokio::task::spawn_blocking(move || {
            let s = Server::start(&a_dir, &["--store", &db_url]);
            let (k, v) = (s.banner_value("API key"), s.banner_value("witness key"));
            (s, k, v)
        })
        .await
        .unwrap()
    };
    assert!(first.sigterm().success());
    common::copy_dir(&a_dir, &b_dir);
    let c_dir = tmp.path().join("c1");
    let c_vkey = init_cosigner(&c_dir, "cosigner.example/one", &log_vkey);
    let port = free_port();
    let c1 = CosignerProc::start(&c_dir, port);
    let c_url = format!("http://127.0.0.1:{port}");
    let cosigner = format!("name=one,vkey={c_vkey},url={c_url}");
    let trust = format!("version 1\nlog {log_vkey}\nwitness {c_vkey}\nquorum 1\n");

    let a = front(&a_dir, &db_url, &cosigner).await;
    let b = front(&b_dir, &db_url, &cosigner).await;
    for f in [&a, &b] {
        assert!(
            f.banner.contains("asking cosigners one for cosignatures"),
            "{}",
            f.banner
        );
    }
    let pg = tally_testkit::postgres::shared();
    let holder = || {
        pg.psql(&db, "SELECT holder FROM log_lease")
            .trim()
            .to_owned()
    };
    assert!(
        holder().contains(&format!(":{}:", a.child.id())),
        "a sequences: {}",
        holder()
    );

    // Records through a (the sequencer) and through b (a follower).
    let (sa, sb) = (tmp.path().join("agent-a"), tmp.path().join("agent-b"));
    let (a_url, b_url) = (a.url.clone(), b.url.clone());
    {
        let (a2, b2) = (&a, &b);
        let key = api_key.clone();
        tokio::task::block_in_place(|| {
            add_agent(a2, &key, &sa, "alpha");
            add_agent(b2, &key, &sb, "beta");
            record_notes(&sa, "alpha", 2);
            record_notes(&sb, "beta", 2);
        });
    }
    // Both fronts serve the same checkpoint of size 4, cosigned.
    let on_a = cosigned_checkpoint(&a_url, 4, &trust).await;
    let on_b = cosigned_checkpoint(&b_url, 4, &trust).await;
    let size = peek_checkpoint(&on_a).unwrap().size.get();
    if peek_checkpoint(&on_b).unwrap().size.get() == size {
        assert_eq!(
            on_a, on_b,
            "the two fronts serve different notes for size {size}"
        );
    }
    assert_eq!(SignedNote::parse(&on_b).unwrap().signatures.len(), 2);
    // The follower reports the cosigner ok from the cosignatures the
    // sequencer stored.
    let c_metric = |result: &str| {
        let url = c_url.clone();
        let prefix = format!("tally_cosigner_add_checkpoint_requests_total{{result=\"{result}\"}}");
        async move { metric(&url, &prefix).await.unwrap_or(0) }
    };
    assert_eq!(c_metric("conflict").await, 0);
    assert!(c_metric("ok").await >= 1);
    assert_eq!(
        metric(
            &b_url,
            "tally_log_cosigner_state{cosigner=\"one\",state=\"ok\"}"
        )
        .await,
        Some(1)
    );
    assert_eq!(
        metric(
            &b_url,
            "tally_log_cosigner_consecutive_failures{cosigner=\"one\"}"
        )
        .await,
        Some(0)
    );
    assert!(
        metric(&b_url, "tally_log_cosigner_cosigned_size{cosigner=\"one\"}")
            .await
            .unwrap()
            >= 4
    );

    // The cosigner is down while checkpoint 5 is signed; the follower
    // follows it and asks nothing, so it counts no failure; once the
    // cosigner is back the sequencer's retry gets the line, and the
    // follower serves it.
    drop(c1); // SIGKILL
    tokio::task::block_in_place(|| record_notes(&sa, "alpha", 1));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let note = get(&format!("{b_url}/checkpoint")).await;
        if peek_checkpoint(&note).unwrap().size.get() >= 5 {
            break;
        }
        assert!(Instant::now() < deadline, "b does not follow size 5");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        metric(
            &b_url,
            "tally_log_cosigner_consecutive_failures{cosigner=\"one\"}"
        )
        .await,
        Some(0),
        "the follower asked the cosigner"
    );
    assert!(
        metric(
            &a_url,
            "tally_log_cosigner_consecutive_failures{cosigner=\"one\"}"
        )
        .await
        .unwrap()
            >= 1,
        "the sequencer did not ask the cosigner"
    );
    let _c1 = CosignerProc::start(&c_dir, port);
    let on_b = cosigned_checkpoint(&b_url, 5, &trust).await;
    let size = peek_checkpoint(&on_b).unwrap().size.get();
    assert_eq!(
        metric(
            &b_url,
            "tally_log_cosigner_consecutive_failures{cosigner=\"one\"}"
        )
        .await,
        Some(0)
    );

    // The sequencer dies; b takes over.
    let killed = Instant::now();
    a.kill9();
    let b_pid = format!(":{}:", b.child.id());
    while !holder().contains(&b_pid) {
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "b did not take the lease: {}",
            holder()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::task::block_in_place(|| record_notes(&sb, "beta", 2));
    let after = cosigned_checkpoint(&b_url, 7, &trust).await;
    let after_size = peek_checkpoint(&after).unwrap().size.get();
    assert!(after_size >= 7 && after_size > size, "{after}");
    // b asked from the size it had followed: still no conflict, no failure.
    assert_eq!(c_metric("conflict").await, 0);
    assert_eq!(
        metric(
            &b_url,
            "tally_log_cosigner_consecutive_failures{cosigner=\"one\"}"
        )
        .await,
        Some(0)
    );
    assert!(
        metric(&b_url, "tally_log_cosigner_cosigned_size{cosigner=\"one\"}")
            .await
            .unwrap()
            >= 7
    );

    // a, restarted, follows b and serves its cosigned checkpoint.
    let a = front(&a_dir, &db_url, &cosigner).await;
    let on_a = cosigned_checkpoint(&a.url, after_size, &trust).await;
    assert!(peek_checkpoint(&on_a).unwrap().size.get() >= after_size);
    assert!(holder().contains(&b_pid), "b still sequences: {}", holder());
    assert_eq!(c_metric("conflict").await, 0);
    assert!(a.sigterm().success());
    assert!(b.sigterm().success());
}
