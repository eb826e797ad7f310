//! `tally gateway`: run an MCP server behind the recording stdio proxy
//! (tally_gateway::proxy), or stand in front of a remote one as a recording
//! Streamable HTTP proxy with `--upstream URL` (tally_gateway::http). Both
//! record through the same core (tally_gateway::calls).

use super::out::errln;
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tally_gateway::action::ProofPath;
use tally_gateway::calls::{ActionConfig, CallRecorder};
use tally_gateway::chain::{AgentChain, ChainOptions, WriterInfo};
use tally_gateway::http::{HttpConfig, HttpGateway, HttpLimits, ProbeResult};
use tally_gateway::process::run_gateway;
use tally_gateway::proxy::{ProxyConfig, ProxyDeps, StrictPolicy};
use tally_gateway::toolcheck::{Enforcer, ServerId, ToolGuard};
use tally_schemas::time::{Clock as _, SystemClock};
use tally_schemas::{AgentName, Body, UnixMillis};
use tokio::sync::Notify;

use super::agent::{parse_agent, runtime, StateArgs};

/// The last sync when the gateway ends: one try, at most this long.
const FINAL_SYNC: Duration = Duration::from_secs(3);

/// Arguments of `tally gateway`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Every tools/call gets a signed decision record in the agent's local chain BEFORE it is \
forwarded; if that record cannot be written, the call is answered with a JSON-RPC error \
(code -32001) and the server never sees it. When the call ends an outcome record says \
how: ok, error, cancelled, server_exited, client_gone or not_run. Tool lists are recorded \
with per-part definition digests, again whenever they change.

Durability: by default a decision is forwarded once it is written to the record journal \
(.tally/agents/NAME/chain.journal) with one write(), so it survives the gateway being \
killed at any moment; it is committed to chain.redb with fsync right after. A power loss \
or kernel crash can lose the records of the last few milliseconds before that fsync. \
--sync-before-forward waits for the fsync before forwarding instead (survives power loss; \
costs one fsync per call).

Several gateways (one per MCP server, as an MCP host starts them), `tally record` and the \
SDKs can record for one agent at once: the first to open the agent's chain holds it and \
signs, the others hand it their records over .tally/agents/NAME/writer.sock; if it stops \
or is killed, another takes over without losing a record (`tally status` shows them).

--name-prefix P puts P before every tool name this gateway records (P + name, in \
decisions and in the tool list), so two servers' tools of one name stay apart in the \
records and in coverage. Each gateway declares its server's tool list under its own source \
name (--source, default the prefix, else the server's command or URL); the agent's declared \
tools are the union of its sources' lists, and a source that stops drops out when its \
lease (--source-lease, default 24 h) ends; a running gateway declares again before then.

--record-only-prefix P: only tools whose (server's) name starts with P are recorded. The \
other tools are still declared in the recorded tool list, with recorded=false, and calls \
to them are forwarded without records, so an auditor's coverage line names them.

With a witness configured (tally agent init NAME --witness URL) records are synced in the \
background; --strict makes each call wait for its decision's receipt and accept it \
(pinned log key, inclusion, record hash and nonce, witness time) before forwarding.

Tool checks: --lock FILE (a baseline made by `tally tools approve`) with --policy FILE \
compares the server's tools with the approved definitions at start, after initialize, at \
every tools/list and after notifications/tools/list_changed, and applies the policy: a \
paused tool is left out of the tool list the client sees and its calls are refused with a \
JSON-RPC error (code -32001, data.tally tool_paused) that says why; a paused session refuses \
every call; a denied one stops (exit 3 when denied at start). Each check is a tool_check \
record in the agent's chain. A lockfile or policy that cannot be read stops the gateway \
before it starts (exit 2): it never runs unchecked.

Remote servers (MCP Streamable HTTP): --upstream URL makes the gateway an HTTP endpoint \
(--listen, default 127.0.0.1:7879, loopback only unless --allow-remote) that the MCP client \
is pointed at instead of the server; the upstream URL's path is the MCP endpoint. Requests \
and answers pass through unchanged (JSON or SSE streams, session ids, GET streams, resumption, \
DELETE), and so do the client's own headers, auth included: they are forwarded, never \
recorded. Calls are kept apart per session. Over HTTP a call can also end http_error: the \
upstream answered its request with an HTTP error or not with MCP, or could not be reached. \
At start the gateway checks that the upstream answers a JSON-RPC ping like an MCP endpoint \
(exit 2 otherwise). --tls-cert/--tls-key serve HTTPS; --upstream-ca trusts a private CA for \
the upstream.

Examples:
  tally gateway --agent claims-bot -- npx @modelcontextprotocol/server-everything stdio
  tally gateway --agent claims-bot --upstream https://tools.example.com/mcp --listen 127.0.0.1:7879")]
pub(crate) struct Args {
    /// The agent whose chain records the calls (see `tally agent init`).
    #[arg(long, value_parser = parse_agent)]
    pub agent: AgentName,
    /// Forward a call only after its decision is receipted by the witness
    /// and the receipt is accepted; otherwise refuse it (outcome not_run).
    #[arg(long)]
    pub strict: bool,
    /// Like --strict, for these tools only (comma-separated names).
    #[arg(long, value_delimiter = ',')]
    pub strict_tools: Vec<String>,
    /// How long a strict call waits for its receipt, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub strict_timeout_ms: u64,
    /// Put this before every recorded tool name, to keep several servers'
    /// tools apart (see below).
    #[arg(long, value_name = "P")]
    pub name_prefix: Option<String>,
    /// Record only tools whose name (as the server gives it) starts with
    /// this (see below).
    #[arg(long, value_name = "P")]
    pub record_only_prefix: Option<String>,
    /// The tool source this gateway declares its server's tools under
    /// [default: the --name-prefix, else the server's command or URL].
    #[arg(long, value_name = "NAME")]
    pub source: Option<String>,
    /// Seconds a declaration of this gateway's tools holds unless declared
    /// again (1 to 86400); a running gateway declares again every half.
    #[arg(long, value_name = "SECS", default_value_t = 86_400, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub source_lease: u64,
    /// Also keep call arguments and results in the local store, so a call
    /// can be disclosed later (salts are always kept).
    #[arg(long)]
    pub store_content: bool,
    /// An action tool (docs/protocol.md §5.2), repeatable: TOOL=PATH reads
    /// the call's proof (the id the other system gave back) at PATH of the
    /// result's structuredContent (a member name, or a path such as
    /// $.receipt.ids[0]); TOOL alone has no proof to read. TOOL is the
    /// name as recorded (after --name-prefix). Its outcomes carry a state:
    /// posted (proof there), unknown (none), failed.
    #[arg(long = "action", value_name = "TOOL[=PATH]", value_parser = parse_action)]
    pub actions: Vec<(String, Option<ProofPath>)>,
    /// Put action proofs in outcomes in clear, not salted-hashed.
    #[arg(long)]
    pub proof_in_clear: bool,
    /// Forward a call only once its decision is committed to chain.redb with
    /// fsync (survives a power loss), not as soon as it is in the record
    /// journal (survives the gateway's death; see below).
    #[arg(long)]
    pub sync_before_forward: bool,
    /// An approved tool baseline (`tally tools approve`): check the
    /// server's tools against it (with --policy; see below).
    #[arg(long, value_name = "FILE", requires = "policy")]
    pub lock: Option<PathBuf>,
    /// The policy that says what each difference from --lock does.
    #[arg(long, value_name = "FILE", requires = "lock")]
    pub policy: Option<PathBuf>,
    #[command(flatten)]
    pub state: StateArgs,
    #[command(flatten)]
    pub http: HttpArgs,
    /// The MCP server command and its arguments (after --), for stdio.
    #[arg(
        last = true,
        required_unless_present = "upstream",
        conflicts_with = "upstream"
    )]
    pub command: Vec<OsString>,
}

/// Where the HTTP gateway listens unless told otherwise: loopback only.
const DEFAULT_LISTEN: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::LOCALHOST,
    7879,
));

/// Arguments of the Streamable HTTP mode.
#[derive(Debug, clap::Args)]
pub(crate) struct HttpArgs {
    /// A remote MCP server's Streamable HTTP endpoint (e.g. https://host/mcp):
    /// serve HTTP in front of it instead of running a server over stdio.
    #[arg(long, value_name = "URL")]
    pub upstream: Option<String>,
    /// Where the HTTP gateway listens [default: 127.0.0.1:7879] (port 0:
    /// any free port, printed at start).
    #[arg(long, value_name = "ADDR", requires = "upstream")]
    pub listen: Option<SocketAddr>,
    /// Allow --listen on an address that is not loopback (anyone who reaches
    /// it can make calls recorded in the agent's chain: use TLS and an
    /// upstream that authenticates).
    #[arg(long, requires = "upstream")]
    pub allow_remote: bool,
    /// PEM certificate chain: serve HTTPS (with --tls-key).
    #[arg(long, value_name = "FILE", requires_all = ["upstream", "tls_key"])]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificate(s) to trust for the upstream, besides the built-in roots.
    #[arg(long, value_name = "FILE", requires = "upstream")]
    pub upstream_ca: Option<PathBuf>,
    /// An Origin allowed besides local ones (repeatable); requests from
    /// other origins get 403 (DNS-rebinding protection).
    #[arg(long, value_name = "ORIGIN", requires = "upstream")]
    pub allow_origin: Vec<String>,
    /// Largest request body accepted from a client.
    #[arg(long, default_value_t = HttpLimits::default().max_body_bytes, requires = "upstream")]
    pub max_body_bytes: usize,
    /// Largest JSON answer or SSE event read from the upstream.
    #[arg(long, default_value_t = HttpLimits::default().max_answer_bytes, requires = "upstream")]
    pub max_answer_bytes: usize,
    /// Most MCP sessions at once.
    #[arg(long, default_value_t = HttpLimits::default().max_sessions, requires = "upstream")]
    pub max_sessions: usize,
    /// Most requests in flight at once (open streams included).
    #[arg(long, default_value_t = HttpLimits::default().max_in_flight, requires = "upstream")]
    pub max_in_flight: usize,
    /// Seconds a session may stay idle (no request, no open stream) before
    /// it is forgotten and its open calls end client_gone.
    #[arg(long, default_value_t = HttpLimits::default().session_idle.as_secs(), requires = "upstream")]
    pub session_idle_secs: u64,
}

/// Runs `tally gateway`; over stdio exits with the server's exit code,
/// over HTTP with 0 once stopped (SIGINT or SIGTERM).
///
/// # Errors
/// A missing agent, a server that cannot be started, or an upstream that is
/// not an MCP endpoint (exit 2).
pub(crate) fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let state = args.state.dir();
    state.load_key(&args.agent)?;
    state.load_config(&args.agent)?;
    if let Some(p) = &args.name_prefix {
        tally_gateway::calls::check_tool_name(p).map_err(|why| {
            anyhow::anyhow!("--name-prefix {p:?} is not a valid tool name prefix: {why}")
        })?;
    }
    let source = match (&args.source, &args.name_prefix) {
        (Some(s), _) => {
            tally_gateway::calls::check_tool_name(s).map_err(|why| {
                anyhow::anyhow!("--source {s:?} is not a valid source name: {why}")
            })?;
            s.clone()
        }
        (None, Some(p)) => p.clone(),
        (None, None) => default_source(args),
    };
    let clock = Arc::new(SystemClock);
    // Read before anything starts: a gateway never runs unchecked when a
    // check was asked for (docs/protocol.md §5.7).
    let tool_check = match (&args.lock, &args.policy) {
        (Some(lock), Some(policy)) => {
            let guard = ToolGuard::load(lock, policy)?;
            Some(Arc::new(Enforcer::new(
                guard,
                Some(source.clone()),
                args.name_prefix.clone(),
            )))
        }
        _ => None,
    };
    let server_id = match &args.http.upstream {
        Some(u) => ServerId::Url(u.clone()),
        None => ServerId::Command(
            args.command
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
        ),
    };
    let rt = runtime()?;

    let strict = if args.strict {
        StrictPolicy::All
    } else if args.strict_tools.is_empty() {
        StrictPolicy::Off
    } else {
        StrictPolicy::Tools(args.strict_tools.iter().cloned().collect::<BTreeSet<_>>())
    };
    let config = ProxyConfig {
        strict,
        name_prefix: args.name_prefix.clone(),
        record_only_prefix: args.record_only_prefix.clone(),
        source: Some(source.clone()),
        source_lease_ms: (args.source_lease != 86_400).then_some(args.source_lease * 1000),
        store_content: args.store_content,
        strict_timeout: Duration::from_millis(args.strict_timeout_ms),
        actions: ActionConfig {
            tools: args.actions.iter().cloned().collect(),
            proof_in_clear: args.proof_in_clear,
        },
        tool_check: tool_check.clone(),
    };

    let exit = rt.block_on(async {
        // A chain that cannot be opened or reached does not stop the
        // gateway: every call is then refused with the reason (fail
        // closed), other traffic still flows.
        let options = ChainOptions {
            me: WriterInfo {
                kind: "gateway".into(),
                source: Some(source),
            },
            durable: args.sync_before_forward,
            final_sync: FINAL_SYNC,
            window: None,
            keep_trying: true,
        };
        let chain = match AgentChain::open(&state, &args.agent, clock, options).await {
            Ok(c) => c,
            Err(e) => {
                errln!("tally: gateway: tools/call will be refused: {e}");
                AgentChain::unavailable(&e.to_string())
            }
        };
        if let Some(check) = &tool_check {
            if let Some(body) = check.start(&server_id, clock_now()) {
                if let Err(e) = chain.append(Body::ToolCheck(body), None).await {
                    errln!("tally: gateway: the tool check could not be recorded: {e}");
                }
            }
            if let Some(why) = check.denied() {
                errln!(
                    "tally: gateway: the tool check denied this session: {why}; the server was not started (approve again with tally tools approve)"
                );
                chain.close().await;
                return Ok(3);
            }
        }
        let deps = ProxyDeps {
            chain: chain.clone(),
            client_gone: Arc::new(Notify::new()),
        };
        let exit = match &args.http.upstream {
            Some(upstream) => run_http(&args.http, upstream, config, deps).await,
            None => run_gateway(config, deps, &args.command)
                .await
                .map(|exit| u8::try_from(exit.code).unwrap_or(1))
                .map_err(anyhow::Error::from),
        };
        // Every queued outcome is committed; the owner gives the sync one
        // try of at most FINAL_SYNC, then hands the chain to another writer.
        chain.close().await;
        exit
    });
    // The reader of our standard input is a blocking thread that may still
    // wait for input the client never sends; do not wait for it.
    rt.shutdown_background();
    Ok(ExitCode::from(exit?))
}

/// The source name of a gateway given neither --source nor --name-prefix:
/// its server's command line, or its upstream URL without credentials or
/// query, cut to a valid name.
fn default_source(args: &Args) -> String {
    let raw = match &args.http.upstream {
        Some(u) => match reqwest::Url::parse(u) {
            Ok(mut url) => {
                let _ = url.set_username("");
                let _ = url.set_password(None);
                url.set_query(None);
                url.set_fragment(None);
                url.to_string()
            }
            Err(_) => u.clone(),
        },
        None => args
            .command
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" "),
    };
    let mut name: String = raw.chars().filter(|c| !c.is_control()).collect();
    if name.is_empty() {
        name = "gateway".into();
    }
    while name.len() > 256 {
        name.pop();
    }
    name
}

/// The Streamable HTTP gateway: checks the upstream, listens, serves until
/// SIGINT or SIGTERM, then ends the calls still open.
async fn run_http(
    args: &HttpArgs,
    upstream: &str,
    config: ProxyConfig,
    deps: ProxyDeps,
) -> anyhow::Result<u8> {
    let url = reqwest::Url::parse(upstream)
        .with_context(|| format!("--upstream {upstream}: not a URL"))?;
    let listen = args.listen.unwrap_or(DEFAULT_LISTEN);
    if !listen.ip().is_loopback() && !args.allow_remote {
        anyhow::bail!(
            "--listen {listen}: not a loopback address; the gateway records calls in the agent's chain for anyone who reaches it: add --allow-remote (with --tls-cert) if that is intended"
        );
    }
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(tally_gateway::http::tls_config(cert, key)?),
        _ => None,
    };
    let upstream_ca_pem = match &args.upstream_ca {
        Some(p) => {
            Some(std::fs::read(p).with_context(|| format!("--upstream-ca {}", p.display()))?)
        }
        None => None,
    };
    let limits = HttpLimits {
        max_body_bytes: args.max_body_bytes,
        max_answer_bytes: args.max_answer_bytes,
        max_sessions: args.max_sessions.max(1),
        max_in_flight: args.max_in_flight.max(1),
        session_idle: Duration::from_secs(args.session_idle_secs.max(1)),
        ..HttpLimits::default()
    };
    let core = CallRecorder::new(config, deps.chain);
    let gateway = HttpGateway::new(
        core,
        HttpConfig {
            upstream: url.clone(),
            upstream_ca_pem,
            allowed_origins: args.allow_origin.clone(),
            loopback_hosts_only: listen.ip().is_loopback(),
            limits,
        },
    )?;
    match gateway.probe().await? {
        ProbeResult::Mcp => {}
        ProbeResult::NeedsAuth(code) => errln!(
            "tally: gateway: the upstream answered {code} without credentials; the client's own auth headers are passed through"
        ),
    }
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("--listen {listen}"))?;
    let local = listener.local_addr()?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    errln!(
        "tally: gateway: listening on {scheme}://{local}{}, forwarding to {url}",
        url.path()
    );
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let stop = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = sigterm.recv() => {}
        }
    };
    let report = tally_gateway::http::serve(gateway, listener, tls, stop).await;
    errln!(
        "tally: gateway: stopped; {} calls ({} cancelled, {} server_exited, {} http_error, {} client_gone)",
        report.calls,
        report.cancelled_calls,
        report.server_exited_calls,
        report.http_error_calls,
        report.client_gone_calls
    );
    Ok(0)
}

/// `--action TOOL[=PATH]`.
fn parse_action(s: &str) -> Result<(String, Option<ProofPath>), String> {
    let (tool, path) = match s.split_once('=') {
        Some((t, p)) => (t, Some(ProofPath::parse(p)?)),
        None => (s, None),
    };
    tally_gateway::calls::check_tool_name(tool)
        .map_err(|why| format!("{tool:?} is not a tool name: {why}"))?;
    Ok((tool.to_owned(), path))
}

fn clock_now() -> UnixMillis {
    SystemClock.now()
}
