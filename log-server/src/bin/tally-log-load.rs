//! `tally-log-load`: a load generator over a redb log file, the process the
//! kill -9 test (log-server/tests/it/kill9.rs) starts and kills. It opens the
//! log (recovering it), resumes each agent's chain from its stored head, and
//! appends from several concurrent agents until killed or until `--records`
//! are acknowledged. After each append resolves it prints one JSON line,
//! `{"record":…,"receipt":…}`, and flushes: a complete line is an
//! acknowledged receipt.
//!
//! Usage: `tally-log-load LOG_FILE [--agents N] [--records N]`

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use tally_log::{Log, LogConfig};
use tally_schemas::record::NoteBody;
use tally_schemas::{
    AgentName, Body, Hash, Nonce, NoteSigner, SecretKey, Seq, UnixMillis, UnsignedRecord,
};

/// The log key of the harness, fixed so that the parent can check receipts.
pub const LOAD_LOG_SEED: [u8; 32] = [0x4c; 32];
/// The origin of the harness log.
pub const LOAD_ORIGIN: &str = "tally.test/kill9";

fn usage() -> ExitCode {
    eprintln!("usage: tally-log-load LOG_FILE [--agents N] [--records N]");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next().map(PathBuf::from) else {
        return usage();
    };
    let (mut agents, mut records) = (4usize, u64::MAX);
    while let Some(flag) = args.next() {
        let value = args.next().and_then(|v| v.parse::<u64>().ok());
        match (flag.as_str(), value) {
            ("--agents", Some(v)) if (1..=64).contains(&v) => agents = v as usize,
            ("--records", Some(v)) => records = v,
            _ => return usage(),
        }
    }
    let signer = match NoteSigner::from_secret(LOAD_ORIGIN, SecretKey::from_seed(&LOAD_LOG_SEED)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tally-log-load: {e}");
            return ExitCode::from(2);
        }
    };
    let log = match Log::open_redb(&path, signer, LogConfig::default()) {
        Ok(l) => Arc::new(l),
        Err(e) => {
            eprintln!("tally-log-load: cannot open {}: {e}", path.display());
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
            eprintln!("tally-log-load: {e}");
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
            eprintln!("tally-log-load: {e}");
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
        let got = log
            .append(record.clone(), UnixMillis::now())
            .await
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
