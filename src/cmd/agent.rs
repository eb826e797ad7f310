//! `tally agent …`: the agent's identity and local state (docs/operations.md
//! "The agent side: `tally gateway` and `.tally/`").
//! `init` makes the key and pins the witness's log key; `sync` pushes the
//! local chain to the witness. Witness-side administration (`add`,
//! `rotate`, `retire`) belongs in this group too: add a variant to
//! [`AgentCommand`] and an arm to [`run`].

use super::out::{errln, outln};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use tally_gateway::chain::{AgentChain, ChainOptions, Waited, WriterInfo};
use tally_gateway::state::{AgentConfig, PinnedKey, WitnessConfig};
use tally_gateway::store::SyncErrorNote;
use tally_gateway::witness::WitnessClient;
use tally_schemas::api::{AgentList, ApiBody as _};
use tally_schemas::display::escape;
use tally_schemas::time::SystemClock;
use tally_schemas::{AgentName, SecretKey, UnixMillis};

pub(crate) use super::agent_args::{parse_agent, AgentArg, StateArgs};

/// Arguments of `tally agent`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    pub command: AgentCommand,
}

/// The `tally agent` subcommands.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum AgentCommand {
    /// Make an agent's signing key (mode 0600) in the local state directory,
    /// print its public key and the command that registers it with a
    /// witness, and with --witness pin the witness's log key (trust on first
    /// use). With --witness everything is checked first, and nothing is
    /// written when a check fails: the witness must answer, know the API
    /// key, and not have the agent registered already with a key kept in
    /// another state directory. Run again with --witness to configure a
    /// witness for an existing agent; an existing key is never replaced.
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
pub(crate) struct InitArgs {
    /// The agent's name (its chain's name).
    #[command(flatten)]
    pub agent: AgentArg,
    /// The witness's base URL; its key directory is fetched once and its
    /// current log key pinned.
    #[arg(long)]
    pub witness: Option<String>,
    /// The API key for the witness, checked with it before anything is
    /// written (stored with mode 0600; TALLY_API_KEY overrides it at run
    /// time, and is checked when this is not given).
    #[arg(long, requires = "witness")]
    pub api_key: Option<String>,
    #[command(flatten)]
    pub state: StateArgs,
}

/// Arguments of `tally agent sync`.
#[derive(Debug, clap::Args)]
pub(crate) struct SyncArgs {
    /// The agent.
    #[command(flatten)]
    pub agent: AgentArg,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 30)]
    pub timeout: u64,
    /// Most records sent to the witness in one batch request (1 to 256; 1:
    /// one record per request).
    #[arg(long, default_value_t = tally_gateway::sync::DEFAULT_WINDOW)]
    pub window: usize,
    #[command(flatten)]
    pub state: StateArgs,
}

/// Runs `tally agent …`.
///
/// # Errors
/// I/O, state and witness errors (exit 2).
pub(crate) fn run(args: &Args) -> anyhow::Result<ExitCode> {
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

/// The witness as `agent init --witness` found it: its configuration to
/// pin, and what it says about the agent.
struct CheckedWitness {
    config: WitnessConfig,
    /// `None` without an API key to ask with.
    registration: Option<Registration>,
}

/// The agent on the witness, as the project of the API key sees it.
enum Registration {
    /// Not registered in this project (maybe in another one, which the
    /// witness does not reveal).
    NotRegistered,
    /// Registered, with these key ids (and their `not_after`).
    Registered {
        project: String,
        keys: Vec<(String, Option<String>)>,
    },
}

/// Fetches and pins the witness's log key and, with an API key, checks the
/// key and asks whether `agent` is registered. Writes nothing.
fn check_witness(
    url: &str,
    api_key: Option<(&str, &str)>,
    agent: &AgentName,
) -> anyhow::Result<CheckedWitness> {
    let rt = runtime()?;
    let dir = rt
        .block_on(async { WitnessClient::new(url, None)?.key_directory().await })
        .with_context(|| {
            format!(
                "fetching {url}/.well-known/tally/keys; nothing was written (is `tally serve` running there?)"
            )
        })?;
    // KeyDirectory::from_json checked every key (a vkey named after the
    // origin, protocol.md §4.5).
    let pinned: Vec<PinnedKey> = dir
        .current()
        .map(|k| PinnedKey {
            vkey: k.vkey.vkey(),
            not_before: Some(k.not_before),
            not_after: None,
        })
        .collect();
    if pinned.is_empty() {
        bail!("the witness at {url} lists no current log key");
    }
    let registration = match api_key {
        Some((key, from)) => Some(rt.block_on(registration(url, key, from, agent))?),
        None => None,
    };
    Ok(CheckedWitness {
        config: WitnessConfig {
            url: url.trim_end_matches('/').to_owned(),
            origin: dir.origin,
            keys: pinned,
        },
        registration,
    })
}

/// Asks the witness for the API key's project's agents (`GET /v1/agents`,
/// docs/api.md): a refused key is an error here, not a sync error later.
async fn registration(
    url: &str,
    api_key: &str,
    from: &str,
    agent: &AgentName,
) -> anyhow::Result<Registration> {
    let base = url.trim_end_matches('/');
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(30))
        .build()
        .context("building the HTTP client")?;
    let resp = http
        .get(format!("{base}/v1/agents"))
        .bearer_auth(api_key)
        .send()
        .await
        .with_context(|| format!("checking the API key with the witness at {base}"))?;
    let status = resp.status();
    if status == reqwest::StatusCode::UNAUTHORIZED {
        bail!(
            "the witness at {base} refused the API key {from} (401 unauthorized: it is not a current key of any project); nothing was written. Give the key `tally serve` printed on its first start, or make one with `tally project new-key PROJECT`"
        );
    }
    let what = || format!("the witness's answer to GET {base}/v1/agents");
    let body = super::project::read_bounded(resp, AgentList::LIMITS.max_bytes)
        .await
        .with_context(what)?;
    if !status.is_success() {
        return Err(super::project::refusal(status.as_u16(), &body).context(what()));
    }
    let list = AgentList::from_json(&body).with_context(what)?;
    Ok(match list.agents.into_iter().find(|a| a.agent == *agent) {
        None => Registration::NotRegistered,
        Some(a) => Registration::Registered {
            project: a.project,
            keys: a
                .keys
                .into_iter()
                .map(|k| (k.key_id.to_string(), k.not_after.map(|t| t.to_string())))
                .collect(),
        },
    })
}

/// `tally agent init`: everything the witness must confirm is checked
/// first, then the files are written (a new agent's all at once), and only
/// then is anything printed, so a failure or a closed standard output
/// never leaves an agent half set up.
fn init(args: &InitArgs) -> anyhow::Result<ExitCode> {
    let state = args.state.dir();
    let agent = args.agent.get()?;
    let existing = match state.load_key(agent) {
        Ok(k) => Some(k),
        Err(tally_gateway::state::StateError::NotInitialised { .. }) => None,
        Err(e) => return Err(e.into()),
    };
    let env_key = std::env::var(tally_gateway::state::API_KEY_ENV)
        .ok()
        .filter(|k| !k.is_empty());
    let api_key = match (&args.api_key, &env_key) {
        (Some(k), _) => Some((k.as_str(), "given with --api-key")),
        (None, Some(k)) => Some((k.as_str(), "from TALLY_API_KEY")),
        (None, None) => None,
    };
    let checked = match &args.witness {
        Some(url) => Some(check_witness(url, api_key, agent)?),
        None => None,
    };
    let mut warning = None;
    if let Some(Registration::Registered { project, keys }) =
        checked.as_ref().and_then(|c| c.registration.as_ref())
    {
        let ids = keys
            .iter()
            .map(|(id, _)| id.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        match &existing {
            None => bail!(
                "agent {agent} is already registered with the witness (project {project}, key id {ids}), and its key is not in {}: it is in the state directory of the folder where {agent} was set up. Run the command there, or give that state directory with --state-dir DIR or TALLY_STATE_DIR=DIR. Nothing was written: a second key for {agent} would be refused by the witness",
                state.absolute().display()
            ),
            Some(k) => {
                let id = k.public_key().key_id().to_string();
                match keys.iter().find(|(kid, _)| *kid == id) {
                    Some((_, None)) => {}
                    Some((_, Some(end))) => {
                        warning = Some(format!(
                            "agent {agent}'s key {id} was retired on the witness at {end}: records it signs later are refused"
                        ));
                    }
                    None => {
                        warning = Some(format!(
                            "agent {agent} is registered with the witness (project {project}) under key id {ids}, not under this key ({id}): records it signs are refused (403 key_not_allowed) until the operator rotates to it with `tally agent rotate {agent} --public-key {}`",
                            k.public_key().to_base64()
                        ));
                    }
                }
            }
        }
    }

    // Write: a new agent whole or not at all; an existing one keeps its key.
    let witness_config = checked.as_ref().map(|c| c.config.clone());
    let stored_api_key = args.api_key.as_deref();
    let (key, created) = match existing {
        Some(k) => {
            if let Some(config) = witness_config {
                if let Some(k) = stored_api_key {
                    state.save_api_key(agent, k)?;
                }
                state.save_config(&AgentConfig {
                    v: 1,
                    agent: agent.clone(),
                    witness: Some(config),
                })?;
            }
            (k, false)
        }
        None => {
            let k = SecretKey::generate(&mut rand_core::OsRng);
            state.create_agent_with(agent, &k, witness_config, stored_api_key)?;
            (k, true)
        }
    };

    // Print.
    let root = state.root().display();
    if created {
        outln!("created agent {agent} in {root}")?;
    } else {
        outln!("agent {agent} already has a key in {root}; it is kept")?;
    }
    let public = key.public_key();
    outln!("public key: {}", public.to_base64())?;
    outln!("key id:     {}", public.key_id())?;
    outln!(
        "key file:   {} (mode 0600)",
        state.agent(agent).key().display()
    )?;
    outln!()?;
    match checked.as_ref().and_then(|c| c.registration.as_ref()) {
        Some(Registration::Registered { project, .. }) if warning.is_none() => {
            outln!("registered with the witness in project {project} under this key")?;
        }
        _ => {
            outln!("register it with the witness (operator):")?;
            outln!(
                "  tally agent add {agent} --public-key {}",
                public.to_base64()
            )?;
        }
    }
    match &checked {
        Some(c) => {
            outln!()?;
            outln!(
                "witness: {} (log {})",
                escape(&c.config.url),
                escape(&c.config.origin)
            )?;
            outln!(
                "pinned log key (trust on first use: compare it with the one your operator published):"
            )?;
            for p in &c.config.keys {
                outln!("  {}", escape(&p.vkey))?;
            }
            if api_key.is_none() {
                outln!("no API key: give --api-key, or TALLY_API_KEY when records are synced")?;
            }
        }
        None => {
            outln!()?;
            outln!("no witness configured: records stay local until `tally agent init {agent} --witness URL`")?;
        }
    }
    if let Some(w) = warning {
        errln!("tally: warning: {w}");
    }
    Ok(ExitCode::SUCCESS)
}

fn sync(args: &SyncArgs) -> anyhow::Result<ExitCode> {
    let state = args.state.dir();
    let agent = args.agent.get()?;
    state.load_key(agent)?;
    let Some(witness) = state.load_config(agent)?.witness else {
        bail!("no witness configured for agent {agent} (tally agent init {agent} --witness URL)");
    };
    let url = state.witness_settings(agent, &witness)?.url;
    let rt = runtime()?;
    // Syncing is the chain owner's: this process when no other writer holds
    // the chain, else the running writer, asked to send everything now.
    let (waited, status) = rt.block_on(async {
        let chain = AgentChain::open(
            &state,
            agent,
            Arc::new(SystemClock),
            ChainOptions {
                me: WriterInfo::new("sync"),
                durable: false,
                final_sync: Duration::ZERO,
                window: Some(args.window),
                keep_trying: false,
            },
        )
        .await?;
        let before = chain.status().await.map_err(anyhow::Error::msg)?;
        let unsent = before
            .store
            .records
            .saturating_sub(before.store.sync_cursor);
        if unsent > 0 {
            // A witness that accepts and never answers would otherwise
            // leave the command silent for the whole --timeout.
            errln!(
                "tally: sending {unsent} record(s) of {agent} to the witness at {url}; waiting up to {} s for the receipts (--timeout)",
                args.timeout
            );
        }
        let waited = match before.store.head {
            Some((head, _)) => {
                chain
                    .wait_receipt(head, Duration::from_secs(args.timeout), false)
                    .await
            }
            None => Waited::Receipted { receipt: None },
        };
        let after = chain.status().await.map_err(anyhow::Error::msg);
        chain.close().await;
        anyhow::Ok((waited, after?))
    })?;
    let records = status.store.records;
    let pending = records.saturating_sub(status.store.sync_cursor);
    let failed = match waited {
        Waited::Receipted { .. } => None,
        Waited::Halted { note } | Waited::Failed { note } => Some(note),
        Waited::TimedOut { last } => Some(last.unwrap_or(SyncErrorNote {
            time: UnixMillis::new(0),
            seq: None,
            code: "timeout".into(),
            message: format!(
                "no receipt within {} s: the witness at {url} did not answer (it is slow, or holds connections without answering); the records are safe in the local chain: run `tally agent sync {agent}` again later, or with a longer --timeout",
                args.timeout
            ),
        })),
        Waited::NoWitness => bail!("no witness configured for agent {agent}"),
    };
    match failed {
        None => {
            outln!("synced: {records} records, all receipted")?;
            Ok(ExitCode::SUCCESS)
        }
        Some(n) => {
            outln!(
                "{pending} of {records} records not yet receipted: [{}] {}",
                escape(&n.code),
                escape(&n.message)
            )?;
            Ok(ExitCode::from(1))
        }
    }
}
