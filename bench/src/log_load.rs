//! `tally-bench log-load`: a load generator over a redb log file, the
//! process the kill -9 loop (tests/it/kill9.rs, docs/storage.md
//! "Recovery") starts and kills. It opens the log (recovering it), resumes
//! each agent's chain from its stored head, and appends from several
//! concurrent agents until killed or until `--records` are acknowledged.
//! After each append resolves it prints one JSON line,
//! `{"record":…,"receipt":…}`, and flushes: a complete line is an
//! acknowledged receipt. Exit status: 0 when done, 1 when the log cannot be
//! opened or an append fails, 2 for a usage error.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use tally_log::{AppendError, BatchItem, Log, LogConfig};
use tally_schemas::record::NoteBody;
use tally_schemas::{
    AgentName, Body, Hash, Nonce, NoteSigner, SecretKey, Seq, UnixMillis, UnsignedRecord,
};

/// The log key of the harness, fixed so that the parent can check receipts.
const LOAD_LOG_SEED: [u8; 32] = [0x4c; 32];
/// The origin of the harness log.
const LOAD_ORIGIN: &str = "tally.test/kill9";

/// Arguments of `tally-bench log-load`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The redb log file (created when missing).
    #[arg(value_name = "LOG_FILE")]
    pub log_file: PathBuf,
    /// Agents appending at once, each to its own chain (`load-0`, ...).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u8).range(1..=64))]
    pub agents: u8,
    /// Stop once this many records are acknowledged (default: run until killed).
    #[arg(long)]
    pub records: Option<u64>,
}

/// One line on standard error, ignoring failure.
fn say(args: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr(), "tally-bench log-load: {args}");
}

/// Runs `tally-bench log-load`; errors are printed here, as the exit
/// status tells them apart.
pub(crate) fn run(a: &Args) -> ExitCode {
    let (path, agents, records) = (
        a.log_file.clone(),
        usize::from(a.agents),
        a.records.unwrap_or(u64::MAX),
    );
    let signer = match NoteSigner::from_secret(LOAD_ORIGIN, SecretKey::from_seed(&LOAD_LOG_SEED)) {
        Ok(s) => s,
        Err(e) => {
            say(format_args!("{e}"));
            return ExitCode::from(2);
        }
    };
    let log = match Log::open_redb(&path, signer, LogConfig::default()) {
        Ok(l) => Arc::new(l),
        Err(e) => {
            say(format_args!("cannot open {}: {e}", path.display()));
            return ExitCode::from(1);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            say(format_args!("{e}"));
            return ExitCode::from(2);
        }
    };
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let per_agent = records.div_ceil(agents as u64);
    let result: Result<(), String> = rt.block_on(async {
        let mut tasks = Vec::new();
        for k in 0..agents {
            let (log, out) = (log.clone(), out.clone());
            tasks.push(tokio::spawn(async move {
                run_agent(&log, &out, k, per_agent).await
            }));
        }
        for t in tasks {
            t.await.map_err(|e| e.to_string())??;
        }
        Ok(())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            say(format_args!("{e}"));
            ExitCode::from(1)
        }
    }
}

/// Appends `count` records to agent `k`'s chain, resuming from its head.
async fn run_agent(
    log: &Log,
    out: &Mutex<std::io::Stdout>,
    k: usize,
    count: u64,
) -> Result<(), String> {
    let name = AgentName::new(&format!("load-{k}")).map_err(|e| e.to_string())?;
    let key = SecretKey::from_seed(&[k as u8 + 1; 32]);
    let (mut seq, mut prev) = match log.chain_head(&name).map_err(|e| e.to_string())? {
        Some(h) => (h.seq.get() + 1, Some(h.record_hash)),
        None => (0, None),
    };
    let run = UnixMillis::now().as_millis();
    for _ in 0..count {
        let nonce_seed = format!("{name}/{seq}/{run}/{}", std::process::id());
        let nonce =
            Nonce::from_bytes(Hash::sha256(nonce_seed.as_bytes()).as_bytes()[..16].to_vec())
                .map_err(|e| e.to_string())?;
        let record = UnsignedRecord {
            agent: name.clone(),
            key_id: key.public_key().key_id(),
            seq: Seq::new(seq).map_err(|e| e.to_string())?,
            prev,
            time: UnixMillis::now(),
            nonce,
            body: Body::Note(NoteBody {
                text: format!("load {seq}"),
            }),
        }
        .sign(&key)
        .map_err(|e| e.to_string())?;
        // One record, the way the witness appends it: a batch of one
        // (docs/storage.md, "Batches").
        let answers = log
            .enqueue_batch_fenced(
                vec![BatchItem::Record(record.clone())],
                Vec::new(),
                UnixMillis::now(),
            )
            .map_err(|e| e.to_string())?
            .await
            .map_err(|e| e.to_string())?;
        let got = answers
            .into_iter()
            .next()
            .unwrap_or(Err(AppendError::Closed))
            .map_err(|e| e.to_string())?;
        let line = serde_json::json!({ "record": record, "receipt": got.receipt });
        {
            let mut o = out.lock().map_err(|_| "stdout lock poisoned".to_owned())?;
            writeln!(o, "{line}")
                .and_then(|()| o.flush())
                .map_err(|e| e.to_string())?;
        }
        prev = Some(record.hash());
        seq += 1;
    }
    Ok(())
}
