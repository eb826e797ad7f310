//! `tally agent …`: the agent's identity and local state (issue 6 §1).
//! `init` makes the key and pins the witness's log key; `sync` pushes the
//! local chain to the witness. Witness-side administration (`add`,
//! `rotate`, `retire`) belongs in this group too: add a variant to
//! [`AgentCommand`] and an arm to [`run`].

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use tally_gateway::state::{AgentConfig, PinnedKey, StateDir, WitnessConfig};
use tally_gateway::store::ChainStore;
use tally_gateway::sync::Step;
use tally_gateway::witness::WitnessClient;
use tally_schemas::display::escape;
use tally_schemas::note::NoteVerifier;
use tally_schemas::time::SystemClock;
use tally_schemas::{AgentName, SecretKey};

/// Where the agent's local state lives; shared by every agent-side command.
#[derive(Debug, Clone, clap::Args)]
pub struct StateArgs {
    /// The local state directory (keys, chain store, witness config).
    #[arg(long, env = "TALLY_STATE_DIR", default_value = ".tally")]
    pub state_dir: PathBuf,
}

impl StateArgs {
    /// The state directory.
    #[must_use]
    pub fn dir(&self) -> StateDir {
        StateDir::new(&self.state_dir)
    }
}

/// Parses an agent name for clap.
///
/// # Errors
/// The protocol's rule for agent names, as text.
pub fn parse_agent(s: &str) -> Result<AgentName, String> {
    AgentName::new(s).map_err(|e| e.to_string())
}

/// Arguments of `tally agent`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: AgentCommand,
}

/// The `tally agent` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum AgentCommand {
    /// Make an agent's signing key (mode 0600) in the local state directory,
    /// print its public key and the command that registers it with a
    /// witness, and with --witness pin the witness's log key (trust on first
    /// use). Run again with --witness to configure a witness for an existing
    /// agent; an existing key is never replaced.
    Init(InitArgs),
    /// Send the agent's records that have no receipt yet to the witness,
    /// accept the receipts, and print what is left.
    Sync(SyncArgs),
    /// Register an agent's public key with the witness, in the API key's
    /// project (witness side; see also `rotate`, `retire`).
    Add(super::agent_admin::AddArgs),
    /// Rotate a registered agent's key: the current key ends at --at (default
    /// now) and the new one starts there.
    Rotate(super::agent_admin::RotateArgs),
    /// Retire a registered agent: its keys end at --at (default now), so no
    /// record timed later is admitted.
    Retire(super::agent_admin::RetireArgs),
}

/// Arguments of `tally agent init`.
#[derive(Debug, clap::Args)]
pub struct InitArgs {
    /// The agent's name (its chain's name).
    #[arg(value_parser = parse_agent)]
    pub agent: AgentName,
    /// The witness's base URL; its key directory is fetched once and its
    /// current log key pinned.
    #[arg(long)]
    pub witness: Option<String>,
    /// The API key for the witness (stored with mode 0600; TALLY_API_KEY
    /// overrides it at run time).
    #[arg(long, requires = "witness")]
    pub api_key: Option<String>,
    #[command(flatten)]
    pub state: StateArgs,
}

/// Arguments of `tally agent sync`.
#[derive(Debug, clap::Args)]
pub struct SyncArgs {
    /// The agent.
    #[arg(value_parser = parse_agent)]
    pub agent: AgentName,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 30)]
    pub timeout: u64,
    /// Records posted to the witness at once (1: one at a time).
    #[arg(long, default_value_t = tally_gateway::sync::DEFAULT_WINDOW)]
    pub window: usize,
    #[command(flatten)]
    pub state: StateArgs,
}

/// Runs `tally agent …`.
///
/// # Errors
/// I/O, state and witness errors (exit 2).
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    match &args.command {
        AgentCommand::Init(a) => init(a),
        AgentCommand::Sync(a) => sync(a),
        AgentCommand::Add(a) => super::agent_admin::add(a),
        AgentCommand::Rotate(a) => super::agent_admin::rotate(a),
        AgentCommand::Retire(a) => super::agent_admin::retire(a),
    }
}

pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

fn init(args: &InitArgs) -> anyhow::Result<ExitCode> {
    let state = args.state.dir();
    let agent = &args.agent;
    let key = match state.load_key(agent) {
        Ok(k) => {
            println!(
                "agent {agent} already has a key in {}; it is kept",
                state.root().display()
            );
            k
        }
        Err(tally_gateway::state::StateError::NotInitialised { .. }) => {
            let k = SecretKey::generate(&mut rand_core::OsRng);
            state.create_agent(agent, &k)?;
            println!("created agent {agent} in {}", state.root().display());
            k
        }
        Err(e) => return Err(e.into()),
    };
    let public = key.public_key();
    println!("public key: {}", public.to_base64());
    println!("key id:     {}", public.key_id());
    println!(
        "key file:   {} (mode 0600)",
        state.agent(agent).key().display()
    );
    println!();
    println!("register it with the witness (operator):");
    println!(
        "  tally agent add {agent} --public-key {}",
        public.to_base64()
    );

    if let Some(url) = &args.witness {
        let dir = runtime()?
            .block_on(async { WitnessClient::new(url, None)?.key_directory().await })
            .with_context(|| format!("fetching {url}/.well-known/tally/keys"))?;
        let mut pinned = Vec::new();
        for k in dir.keys.iter().filter(|k| k.not_after.is_none()) {
            let v = NoteVerifier::from_vkey(&k.vkey)
                .with_context(|| format!("the witness's key {:?}", k.vkey))?;
            if v.name() != dir.origin {
                bail!(
                    "the witness's key {} is not named after its origin {}",
                    k.vkey,
                    dir.origin
                );
            }
            pinned.push(PinnedKey {
                vkey: v.vkey(),
                not_before: k.not_before,
                not_after: None,
            });
        }
        if pinned.is_empty() {
            bail!("the witness at {url} lists no current log key");
        }
        let mut config = state.load_config(agent).unwrap_or(AgentConfig {
            v: 1,
            agent: agent.clone(),
            witness: None,
        });
        config.witness = Some(WitnessConfig {
            url: url.trim_end_matches('/').to_owned(),
            origin: dir.origin.clone(),
            keys: pinned.clone(),
        });
        state.save_config(&config)?;
        if let Some(api_key) = &args.api_key {
            state.save_api_key(agent, api_key)?;
        }
        println!();
        println!("witness: {url} (log {})", escape(&dir.origin));
        println!(
            "pinned log key (trust on first use: compare it with the one your operator published):"
        );
        for p in &pinned {
            println!("  {}", escape(&p.vkey));
        }
    } else {
        println!();
        println!("no witness configured: records stay local until `tally agent init {agent} --witness URL`");
    }
    Ok(ExitCode::SUCCESS)
}

fn sync(args: &SyncArgs) -> anyhow::Result<ExitCode> {
    let state = args.state.dir();
    let store = Arc::new(ChainStore::open(&state.agent(&args.agent).store())?);
    let Some(syncer) = tally_gateway::open_syncer(
        &state,
        &args.agent,
        Arc::clone(&store),
        Arc::new(SystemClock),
    )?
    else {
        bail!(
            "no witness configured for agent {} (tally agent init {} --witness URL)",
            args.agent,
            args.agent
        );
    };
    let syncer = syncer.with_window(args.window);
    let step = runtime()?.block_on(async {
        syncer
            .sync_until_idle(tokio::time::Instant::now() + Duration::from_secs(args.timeout))
            .await
    });
    let status = store.status()?;
    let pending = status.records.saturating_sub(status.sync_cursor);
    match step {
        Step::Idle | Step::Progress => {
            println!("synced: {} records, all receipted", status.records);
            Ok(ExitCode::SUCCESS)
        }
        Step::Retry(n) | Step::Halt(n) => {
            println!(
                "{pending} of {} records not yet receipted: [{}] {}",
                status.records,
                escape(&n.code),
                escape(&n.message)
            );
            Ok(ExitCode::from(1))
        }
    }
}
