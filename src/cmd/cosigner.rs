//! `tally cosigner …`: run a C2SP tlog-witness (a *cosigner* in tally's
//! words, since tally's witness is `tally serve`) for any C2SP log:
//! `init` makes its key and state, `add-log`/`remove-log` edit the logs it
//! cosigns for, `show` prints them, `serve` answers add-checkpoint
//! (docs/operations.md, "Running a cosigner").

use super::out::{errln, outln};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use rand_core::OsRng;
use tally_cosigner::config::Logs;
use tally_cosigner::files;
use tally_cosigner::http::{router, AppState};
use tally_cosigner::server::Limits;
use tally_schemas::note::NoteVerifier;
use tally_schemas::time::SystemClock;

/// The cosigner's data folder; shared by every subcommand.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct DirArgs {
    /// The cosigner's data folder (its key, its state, logs.toml).
    #[arg(long, env = "TALLY_COSIGNER_DIR", default_value = "tally-cosigner")]
    pub data_dir: PathBuf,
}

/// Arguments of `tally cosigner`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    pub command: CosignerCommand,
}

/// The `tally cosigner` subcommands.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum CosignerCommand {
    /// Make a new cosigner: its Ed25519 key (cosignature/v1, mode 0600),
    /// its state file and an empty logs.toml, together, in the data folder;
    /// print its public key (the vkey logs and auditors pin). Refuses a
    /// folder that already holds any of them.
    Init(InitArgs),
    /// Add a log to cosign for (its checkpoint origin and key), or another
    /// key to a log already listed. A running cosigner reads logs.toml when
    /// it starts: restart it.
    AddLog(AddLogArgs),
    /// Stop cosigning for a log. Its state is kept: adding it again later
    /// carries on from the checkpoint last cosigned.
    RemoveLog(RemoveLogArgs),
    /// Print the cosigner's key, its logs and the checkpoint last cosigned
    /// for each (the state is readable only while the cosigner is stopped).
    Show(DirArgs),
    /// Serve c2sp.org/tlog-witness: POST /add-checkpoint, GET
    /// /<origin hash>/checkpoint, /metrics, /healthz.
    Serve(ServeArgs),
}

/// Arguments of `tally cosigner init`.
#[derive(Debug, clap::Args)]
pub(crate) struct InitArgs {
    #[command(flatten)]
    pub dir: DirArgs,
    /// The cosigner's name, a schema-less URL that identifies it (for
    /// example cosigner.example.com/c1); it is the key name of its
    /// cosignature lines.
    #[arg(long)]
    pub name: String,
}

/// Arguments of `tally cosigner add-log`.
#[derive(Debug, clap::Args)]
pub(crate) struct AddLogArgs {
    #[command(flatten)]
    pub dir: DirArgs,
    /// The log's checkpoint key as a vkey (Ed25519, name+id+base64); repeat
    /// for a log signed by several keys. For a tally log it is the witness
    /// key `tally serve` prints.
    #[arg(long = "key", value_name = "VKEY", required = true)]
    pub keys: Vec<String>,
    /// The log's checkpoint origin (first line of its checkpoints)
    /// [default: the name of the first key, as for tally logs].
    #[arg(long)]
    pub origin: Option<String>,
}

/// Arguments of `tally cosigner remove-log`.
#[derive(Debug, clap::Args)]
pub(crate) struct RemoveLogArgs {
    #[command(flatten)]
    pub dir: DirArgs,
    /// The log's checkpoint origin.
    #[arg(long)]
    pub origin: String,
}

/// Arguments of `tally cosigner serve`.
#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    pub dir: DirArgs,
    /// Address to listen on (port 0 picks a free port, printed at start).
    #[arg(long, env = "TALLY_COSIGNER_LISTEN", default_value = "127.0.0.1:7880")]
    pub listen: SocketAddr,
    /// Connections served at once; more wait to be accepted.
    #[arg(long, default_value_t = 256)]
    pub max_connections: usize,
    /// Seconds a client has to send a request's headers.
    #[arg(long, value_name = "S", default_value_t = 10)]
    pub header_timeout: u64,
    /// Seconds for one request, body included (408 after).
    #[arg(long, value_name = "S", default_value_t = 30)]
    pub request_timeout: u64,
    /// Testing only: milliseconds to wait between committing the new state
    /// and sending the cosignature (the crash tests kill the process there).
    #[arg(long, hide = true, value_name = "MS")]
    pub testing_pause_before_answer_ms: Option<u64>,
}

/// Runs `tally cosigner`.
///
/// # Errors
/// Usage, key, state and file errors (exit 2).
pub(crate) fn run(args: &Args) -> anyhow::Result<ExitCode> {
    match &args.command {
        CosignerCommand::Init(a) => init(a),
        CosignerCommand::AddLog(a) => add_log(a),
        CosignerCommand::RemoveLog(a) => remove_log(a),
        CosignerCommand::Show(a) => show(a),
        CosignerCommand::Serve(a) => serve(a),
    }
}

fn init(args: &InitArgs) -> anyhow::Result<ExitCode> {
    let dir = &args.dir.data_dir;
    let signer = tally_cosigner::init(dir, &args.name, &mut OsRng)?;
    outln!("tally cosigner: made a new cosigner in {}", dir.display())?;
    outln!()?;
    outln!("  name          {}", signer.verifier().name())?;
    outln!("  cosigner key  {}", signer.verifier().vkey())?;
    outln!(
        "  private key   {} (mode 0600; back it up: it never changes)",
        dir.join(files::KEY).display(),
    )?;
    // An older copy of the state would let the cosigner cosign checkpoints
    // it had gone past (docs/operations.md, the cosigner's state).
    outln!(
        "  state         {} (never restore an older copy of it: keep it on a replicated disk if you need one)",
        dir.join(files::STATE).display(),
    )?;
    outln!()?;
    outln!("next: add the logs it cosigns for, then serve:")?;
    outln!(
        "  tally cosigner add-log --data-dir {} --key <the log's vkey>",
        dir.display()
    )?;
    outln!("  tally cosigner serve --data-dir {}", dir.display())?;
    outln!(
        "auditors trust it with a line `witness {}` in their trust file",
        signer.verifier().vkey()
    )?;
    Ok(ExitCode::SUCCESS)
}

fn load_logs(dir: &std::path::Path) -> anyhow::Result<Logs> {
    // The key is read first so that a folder without a cosigner gets the
    // message that says to run init.
    tally_cosigner::read_key(dir)?;
    Ok(Logs::load(&dir.join(files::LOGS))?)
}

fn add_log(args: &AddLogArgs) -> anyhow::Result<ExitCode> {
    let dir = &args.dir.data_dir;
    let mut logs = load_logs(dir)?;
    let keys = args
        .keys
        .iter()
        .map(|k| NoteVerifier::from_vkey(k).with_context(|| format!("--key {k}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let origin = args
        .origin
        .clone()
        .unwrap_or_else(|| keys[0].name().to_owned());
    let new = logs.get(&origin).is_none();
    let added = logs
        .add(&origin, &keys)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    logs.save(&dir.join(files::LOGS))?;
    if new {
        outln!("added log {origin:?} with {added} key(s)")?;
    } else {
        outln!("log {origin:?}: {added} new key(s)")?;
    }
    outln!("restart `tally cosigner serve` to use it")?;
    Ok(ExitCode::SUCCESS)
}

fn remove_log(args: &RemoveLogArgs) -> anyhow::Result<ExitCode> {
    let dir = &args.dir.data_dir;
    let mut logs = load_logs(dir)?;
    if !logs.remove(&args.origin) {
        bail!("no log with origin {:?} in {}", args.origin, files::LOGS);
    }
    logs.save(&dir.join(files::LOGS))?;
    outln!(
        "removed log {:?} (its state is kept; restart `tally cosigner serve`)",
        args.origin
    )?;
    Ok(ExitCode::SUCCESS)
}

fn show(args: &DirArgs) -> anyhow::Result<ExitCode> {
    let dir = &args.data_dir;
    let signer = tally_cosigner::read_key(dir)?;
    outln!("cosigner key  {}", signer.verifier().vkey())?;
    let opened = tally_cosigner::open(dir, Arc::new(SystemClock));
    let cosigner = match opened {
        Ok(c) => Some(c),
        Err(tally_cosigner::DataDirError::State(tally_cosigner::state::StateError::InUse {
            ..
        })) => {
            outln!("state         in use by a running cosigner (its /metrics shows the sizes)")?;
            None
        }
        Err(e) => return Err(e.into()),
    };
    let logs = Logs::load(&dir.join(files::LOGS))?;
    if logs.is_empty() {
        outln!("logs          none (tally cosigner add-log)")?;
    }
    for log in logs.iter() {
        outln!()?;
        outln!("log           {}", log.origin)?;
        outln!("  origin hash {}", log.origin_hash())?;
        for k in &log.keys {
            outln!("  key         {}", k.vkey())?;
        }
        if let Some(c) = &cosigner {
            match c.state().latest(&log.origin)? {
                Some(s) => outln!(
                    "  cosigned    size {} root {} at {}",
                    s.size,
                    s.root,
                    s.timestamp
                )?,
                None => outln!("  cosigned    nothing yet")?,
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn serve(args: &ServeArgs) -> anyhow::Result<ExitCode> {
    super::init_server_logs();
    let cosigner = tally_cosigner::open(&args.dir.data_dir, Arc::new(SystemClock))
        .with_context(|| format!("opening the cosigner in {}", args.dir.data_dir.display()))?;
    if cosigner.logs().is_empty() {
        errln!(
            "tally cosigner: warning: no logs configured; every request gets 404 (tally cosigner add-log)"
        );
    }
    let limits = Limits {
        max_connections: args.max_connections.max(1),
        header_timeout: Duration::from_secs(args.header_timeout.max(1)),
        request_timeout: Duration::from_secs(args.request_timeout.max(1)),
        ..Limits::default()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        let addr = listener.local_addr().context("reading the bound address")?;
        outln!(
            "tally cosigner: listening on http://{addr} (key {}, {} logs)",
            cosigner.signer().verifier().vkey(),
            cosigner.logs().len()
        )?;
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        let app = router(AppState {
            cosigner: Arc::new(cosigner),
            pause_before_answer: args
                .testing_pause_before_answer_ms
                .map(Duration::from_millis),
        });
        tally_cosigner::server::serve(listener, app, limits, shutdown_signal()).await;
        outln!("tally cosigner: stopped")?;
        anyhow::Ok(ExitCode::SUCCESS)
    })
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
