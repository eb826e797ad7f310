//! `tally tools`: approving a tool source's definitions as a baseline (a
//! lockfile, docs/operations.md "Approved tool definitions") that `tally gateway
//! --lock FILE --policy FILE` enforces (docs/protocol.md §5.7), and the
//! approver's signing key.
//!
//! `tally tools approve` starts the MCP server once over stdio (the command
//! after `--`), reaches it over Streamable HTTP (`--url`), or reads the agent's latest recorded tool list
//! (`--from-agent`, digests only), lists its tools, shows what differs from the baseline
//! already in `--out` per tool and part (the lines of a changed
//! description), refuses definitions holding invisible or
//! terminal-controlling characters unless `--accept-hidden` (they are
//! listed either way), and writes the lockfile, signed with `--sign-key`.

use std::ffi::OsString;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::{json, Value};
use tally_gateway::toolcheck::{LockedTool, Lockfile, ServerId, ServerInfo};
use tally_schemas::time::{Clock as _, SystemClock};
use tally_schemas::SecretKey;

use super::out::{errln, outln};

/// How long the server has to answer each request while approving.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);
/// Pages of `tools/list` read at most (docs/protocol.md §5.3 allows 64 records).
const MAX_PAGES: usize = 64;
/// The MCP protocol version `tally tools approve` speaks.
const PROTOCOL_VERSION: &str = "2025-06-18";
/// Largest HTTP answer read while approving.
const MAX_ANSWER_BYTES: usize = 16 << 20;

/// Arguments of `tally tools`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    command: Sub,
}

#[derive(Debug, clap::Subcommand)]
enum Sub {
    /// Approve an MCP server's tool definitions: start it once over stdio
    /// (the command after --) or reach it over Streamable HTTP (--url), list
    /// its tools, show the difference from the baseline in --out, and write
    /// the lockfile.
    Approve(ApproveArgs),
    /// Make an approver's signing key (prints its public key, for a
    /// policy's approver_keys).
    Keygen(KeygenArgs),
}

#[derive(Debug, clap::Args)]
#[command(after_help = "\
A definition holding invisible characters (zero-width, bidirectional controls, tag \
characters, soft hyphen, BOM) or terminal-controlling ones (ESC and the other C0/C1 \
controls besides tab and newline) is listed and refused (exit 4) unless --accept-hidden.

Example:
  tally tools approve --out everything.lock --source everything --by alice \\
      --sign-key alice.key -- npx @modelcontextprotocol/server-everything stdio")]
struct ApproveArgs {
    /// The lockfile to write; a baseline already there is what the
    /// differences are shown against.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// The tool source, as the gateway declares it (its --source).
    #[arg(long, value_name = "NAME")]
    source: Option<String>,
    /// Who approves (recorded in the lockfile).
    #[arg(long, value_name = "NAME")]
    by: String,
    /// Sign the lockfile with this approver key (from `tally tools keygen`).
    #[arg(long, value_name = "FILE")]
    sign_key: Option<PathBuf>,
    /// Approve definitions with invisible or terminal-controlling
    /// characters (they are listed first).
    #[arg(long)]
    accept_hidden: bool,
    /// Show the differences and findings, write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Take the tools from this agent's latest recorded tool list of
    /// --source (digests only) instead of starting the server; the command
    /// after -- (or --url) then only names the server the lockfile is for.
    #[arg(long, value_name = "AGENT", value_parser = super::agent::parse_agent, requires = "source")]
    from_agent: Option<tally_schemas::AgentName>,
    /// With --from-agent: the recorded names carry this --name-prefix,
    /// which the lockfile leaves out (it holds the server's names).
    #[arg(long, value_name = "P", requires = "from_agent")]
    name_prefix: Option<String>,
    /// The server is a Streamable HTTP endpoint at this URL: its tools are
    /// listed once over HTTP (or, with --from-agent, read from the records).
    #[arg(long, value_name = "URL", conflicts_with = "command")]
    url: Option<String>,
    #[command(flatten)]
    state: super::agent::StateArgs,
    /// The MCP server command and its arguments (after --), exactly as the
    /// gateway will run it.
    #[arg(last = true, required_unless_present = "url")]
    command: Vec<OsString>,
}

#[derive(Debug, clap::Args)]
struct KeygenArgs {
    /// Where to write the key (refuses to overwrite).
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
}

/// Runs `tally tools`.
///
/// # Errors
/// A server that cannot be started or listed, an unreadable file (exit 2).
pub(crate) fn run(args: &Args) -> anyhow::Result<ExitCode> {
    match &args.command {
        Sub::Approve(a) => approve(a),
        Sub::Keygen(a) => keygen(a),
    }
}

fn keygen(args: &KeygenArgs) -> anyhow::Result<ExitCode> {
    let key = SecretKey::generate(&mut rand_core::OsRng);
    let text = hex::encode(key.seed());
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&args.out)
        .with_context(|| format!("--out {}", args.out.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    writeln!(f, "{text}")?;
    outln!("{}", key.public_key().to_base64())?;
    Ok(ExitCode::SUCCESS)
}

fn read_sign_key(path: &Path) -> anyhow::Result<SecretKey> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("--sign-key {}", path.display()))?;
    let seed: [u8; 32] = hex::decode(text.trim())
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--sign-key {}: not a key from tally tools keygen (32 bytes in hex)",
                path.display()
            )
        })?;
    Ok(SecretKey::from_seed(&seed))
}

fn approve(args: &ApproveArgs) -> anyhow::Result<ExitCode> {
    let key = args.sign_key.as_deref().map(read_sign_key).transpose()?;
    if let Some(s) = &args.source {
        tally_gateway::calls::check_tool_name(s)
            .map_err(|why| anyhow::anyhow!("--source {s:?} is not a valid source name: {why}"))?;
    }
    let previous = match std::fs::read(&args.out) {
        Ok(bytes) => Some(
            Lockfile::parse(&bytes, &args.out.display().to_string())
                .map_err(|e| anyhow::anyhow!("{e}"))?,
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("--out {}", args.out.display())),
    };
    let argv: Vec<String> = args
        .command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let server = match &args.url {
        Some(u) => ServerId::Url(u.clone()),
        None => ServerId::Command(argv),
    };
    let mut lock = match &args.from_agent {
        Some(agent) => {
            let tools = recorded_tools(args, agent)?;
            outln!("from the recorded list: digests only, so no description lines and no check for hidden characters")?;
            Lockfile::from_tools(
                tools,
                args.source.clone(),
                server,
                previous.as_ref().and_then(|p| p.server_info.clone()),
                args.by.clone(),
                SystemClock.now(),
            )
        }
        None => {
            let (tools, info) = match &args.url {
                Some(u) => list_http_tools(u)?,
                None => list_server_tools(&args.command)?,
            };
            Lockfile::from_definitions(
                &tools,
                args.source.clone(),
                server,
                info,
                args.by.clone(),
                SystemClock.now(),
            )
            .map_err(|e| anyhow::anyhow!("the server's tool list cannot be approved: {e}"))?
        }
    };

    let hidden = hidden_characters(&lock.tools);
    for h in &hidden {
        outln!("hidden: {h}")?;
    }
    match &previous {
        Some(p) => {
            let lines = diff(p, &lock);
            if lines.is_empty() {
                outln!("unchanged: {} tools as approved before", lock.tools.len())?;
            }
            for l in lines {
                outln!("{l}")?;
            }
        }
        None => {
            for t in &lock.tools {
                outln!("tool {}: new", t.name)?;
            }
        }
    }
    if !hidden.is_empty() && !args.accept_hidden {
        errln!(
            "tally: tools approve: {} invisible or terminal-controlling characters in the definitions (listed above); nothing written. Approve them with --accept-hidden only after reading the list",
            hidden.len()
        );
        return Ok(ExitCode::from(4));
    }
    if args.dry_run {
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(k) = &key {
        lock.sign(k);
    }
    let mut text = serde_json::to_vec_pretty(&lock)?;
    text.push(b'\n');
    let tmp = args.out.with_extension("lock.tmp");
    std::fs::write(&tmp, &text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &args.out).with_context(|| format!("writing {}", args.out.display()))?;
    errln!(
        "tally: tools approve: {} tools approved by {} in {}{}",
        lock.tools.len(),
        lock.approved_by,
        args.out.display(),
        if key.is_some() { ", signed" } else { "" }
    );
    Ok(ExitCode::SUCCESS)
}

/// The tools of `agent`'s latest complete recorded list of `--source`
/// (protocol.md §5.3: all parts of one `list_id`), names without
/// `--name-prefix`.
fn recorded_tools(
    args: &ApproveArgs,
    agent: &tally_schemas::AgentName,
) -> anyhow::Result<Vec<LockedTool>> {
    use tally_schemas::record::ToolEntry;
    use tally_schemas::Body;
    let state = args.state.dir();
    let path = state.agent(agent).store();
    if !path.exists() {
        anyhow::bail!("agent {agent} has no recorded chain");
    }
    let store = tally_gateway::store::ChainStore::open(&path).map_err(|e| {
        anyhow::anyhow!("agent {agent}: {e} (a writer holds the chain: stop it, or approve by starting the server)")
    })?;
    let mut building: std::collections::BTreeMap<
        String,
        (u32, std::collections::BTreeMap<u32, Vec<ToolEntry>>),
    > = std::collections::BTreeMap::new();
    let mut latest: Option<Vec<ToolEntry>> = None;
    let mut from = 0;
    loop {
        let batch = store.records(from, 1024)?;
        if batch.is_empty() {
            break;
        }
        from = batch.last().map_or(from, |r| r.seq.get() + 1);
        for r in batch {
            let Body::Tools(t) = &r.body else { continue };
            if t.source != args.source {
                continue;
            }
            let entry = building
                .entry(t.list_id.clone())
                .or_insert_with(|| (t.parts, std::collections::BTreeMap::new()));
            entry.1.insert(t.part, t.tools.clone());
            if entry.1.len() == entry.0 as usize {
                let (_, parts) = building.remove(&t.list_id).unwrap_or_default();
                latest = Some(parts.into_values().flatten().collect());
            }
        }
    }
    let entries = latest.ok_or_else(|| {
        anyhow::anyhow!(
            "agent {agent} has no complete tool list of source {:?}",
            args.source.as_deref().unwrap_or("")
        )
    })?;
    let prefix = args.name_prefix.as_deref().unwrap_or("");
    let mut seen = std::collections::BTreeSet::new();
    Ok(entries
        .into_iter()
        .filter_map(|e| {
            let name = e.name.strip_prefix(prefix)?.to_owned();
            seen.insert(name.clone()).then_some(LockedTool {
                name,
                digest: e.digest,
                parts: e.parts,
                definition: None,
            })
        })
        .collect())
}

/// The differences of `new` from `old`, per tool and part, with the
/// lines of a changed description when both definitions are known.
fn diff(old: &Lockfile, new: &Lockfile) -> Vec<String> {
    let mut out = Vec::new();
    if old.server != new.server {
        out.push(format!("server: was {}, now {}", old.server, new.server));
    }
    if old.server_info != new.server_info {
        let show = |i: &Option<ServerInfo>| {
            i.as_ref().map_or("(none)".to_owned(), |i| {
                format!("{} {}", i.name, i.version.as_deref().unwrap_or(""))
            })
        };
        out.push(format!(
            "server info: was {}, now {}",
            show(&old.server_info),
            show(&new.server_info)
        ));
    }
    let by_name = |l: &Lockfile| -> std::collections::BTreeMap<String, LockedTool> {
        l.tools
            .iter()
            .map(|t| (t.name.clone(), t.clone()))
            .collect()
    };
    let (o, n) = (by_name(old), by_name(new));
    for (name, t) in &n {
        let Some(before) = o.get(name) else {
            out.push(format!("tool {name}: added"));
            continue;
        };
        if before.digest == t.digest {
            continue;
        }
        let parts = before.parts.changed_parts(&t.parts);
        out.push(format!("tool {name}: changed: {}", parts.join(", ")));
        if parts.contains(&"description") {
            let text = |t: &LockedTool| {
                t.definition
                    .as_ref()
                    .and_then(|d| d.get("description"))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            };
            if let (Some(a), Some(b)) = (text(before), text(t)) {
                for line in line_diff(&a, &b) {
                    out.push(format!("  {line}"));
                }
            }
        }
    }
    for name in o.keys() {
        if !n.contains_key(name) {
            out.push(format!("tool {name}: removed"));
        }
    }
    out
}

/// The lines of `a` not in `b` (`- `) and of `b` not in `a` (`+ `), in
/// order: the lines of a changed description, shown escaped.
fn line_diff(a: &str, b: &str) -> Vec<String> {
    let (la, lb): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let mut out: Vec<String> = la
        .iter()
        .filter(|l| !lb.contains(l))
        .map(|l| format!("- {}", tally_schemas::display::escape(l)))
        .collect();
    out.extend(
        lb.iter()
            .filter(|l| !la.contains(l))
            .map(|l| format!("+ {}", tally_schemas::display::escape(l))),
    );
    out
}

/// Whether `c` is invisible or controls a terminal (tab and newline are
/// neither here).
fn is_hidden(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{8}' | '\u{b}'..='\u{1f}' | '\u{7f}'..='\u{9f}'
        | '\u{ad}' | '\u{34f}' | '\u{61c}' | '\u{115f}' | '\u{1160}' | '\u{17b4}' | '\u{17b5}'
        | '\u{180b}'..='\u{180f}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}'
        | '\u{2060}'..='\u{206f}' | '\u{3164}' | '\u{fe00}'..='\u{fe0f}' | '\u{feff}'
        | '\u{ffa0}' | '\u{fff0}'..='\u{fffb}' | '\u{e0000}'..='\u{e0fff}')
}

/// Every invisible or terminal-controlling character in the definitions:
/// tool, JSON path and code point.
fn hidden_characters(tools: &[LockedTool]) -> Vec<String> {
    fn text(s: &str, at: &str, tool: &str, out: &mut Vec<String>) {
        for (i, c) in s.chars().enumerate() {
            if is_hidden(c) {
                out.push(format!(
                    "tool {tool}: {at} character {i}: U+{:04X}",
                    c as u32
                ));
            }
        }
    }
    fn walk(v: &Value, path: &str, tool: &str, out: &mut Vec<String>) {
        match v {
            Value::String(s) => text(s, path, tool, out),
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk(item, &format!("{path}/{i}"), tool, out);
                }
            }
            Value::Object(m) => {
                for (k, item) in m {
                    let at = format!("{path}/{}", tally_schemas::display::escape(k));
                    text(k, &format!("{at} (key)"), tool, out);
                    walk(item, &at, tool, out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    for t in tools {
        if let Some(d) = &t.definition {
            walk(d, "", &tally_schemas::display::escape(&t.name), &mut out);
        }
    }
    out
}

/// Starts `command`, initialises an MCP session over stdio and lists its
/// tools (every page); the server is stopped afterwards.
fn list_server_tools(command: &[OsString]) -> anyhow::Result<(Vec<Value>, Option<ServerInfo>)> {
    let (program, rest) = command
        .split_first()
        .ok_or_else(|| anyhow::anyhow!("no server command after --"))?;
    let mut child = std::process::Command::new(program)
        .args(rest)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", program.to_string_lossy()))?;
    let result = session(&mut child);
    drop(child.stdin.take());
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    result
}

/// One MCP connection while approving: messages go out with `send`; the
/// answer to a request is read with `answer`.
trait Peer {
    fn send(&mut self, msg: &Value) -> anyhow::Result<()>;
    /// The whole JSON-RPC answer to the request `id`.
    fn answer(&mut self, id: &str) -> anyhow::Result<Value>;
}

/// A server started over stdio: one JSON message a line.
struct StdioPeer {
    stdin: std::process::ChildStdin,
    rx: mpsc::Receiver<Value>,
}

impl Peer for StdioPeer {
    fn send(&mut self, msg: &Value) -> anyhow::Result<()> {
        let mut line = serde_json::to_vec(msg)?;
        line.push(b'\n');
        self.stdin
            .write_all(&line)
            .context("writing to the server")?;
        self.stdin.flush().context("writing to the server")
    }

    fn answer(&mut self, id: &str) -> anyhow::Result<Value> {
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let msg = self.rx.recv_timeout(left).map_err(|_| {
                anyhow::anyhow!(
                    "the server did not answer {id} (it exited, or took over {} s)",
                    ANSWER_TIMEOUT.as_secs()
                )
            })?;
            if msg.get("id").and_then(Value::as_str) == Some(id) && msg.get("method").is_none() {
                return Ok(msg);
            }
        }
    }
}

fn session(child: &mut std::process::Child) -> anyhow::Result<(Vec<Value>, Option<ServerInfo>)> {
    let stdin = child.stdin.take().context("the server's input")?;
    let stdout = child.stdout.take().context("the server's output")?;
    let (tx, rx) = mpsc::channel::<Value>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if tx.send(v).is_err() {
                    break;
                }
            }
        }
    });
    list_tools(&mut StdioPeer { stdin, rx })
}

/// Initialises an MCP session with `peer` and lists its tools (every page).
fn list_tools(peer: &mut impl Peer) -> anyhow::Result<(Vec<Value>, Option<ServerInfo>)> {
    fn result(peer: &mut impl Peer, id: &str) -> anyhow::Result<Value> {
        let msg = peer.answer(id)?;
        if let Some(e) = msg.get("error") {
            anyhow::bail!("the server answered {id} with an error: {e}");
        }
        msg.get("result")
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("the server's answer to {id} has no result"))
    }
    peer.send(
        &json!({"jsonrpc": "2.0", "id": "approve:initialize", "method": "initialize", "params": {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "tally tools approve", "version": env!("CARGO_PKG_VERSION")},
        }}),
    )?;
    let init = result(peer, "approve:initialize")?;
    let info = init.get("serverInfo").and_then(|i| {
        Some(ServerInfo {
            name: i.get("name")?.as_str()?.to_owned(),
            version: i.get("version").and_then(Value::as_str).map(str::to_owned),
        })
    });
    peer.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))?;
    let mut tools = Vec::new();
    let mut cursor: Option<Value> = None;
    for page in 0.. {
        if page == MAX_PAGES {
            anyhow::bail!("the server's tool list has more than {MAX_PAGES} pages");
        }
        let id = format!("approve:tools/list:{page}");
        let mut req = json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"});
        if let Some(c) = &cursor {
            req["params"] = json!({"cursor": c});
        }
        peer.send(&req)?;
        let result = result(peer, &id)?;
        let Some(items) = result.get("tools").and_then(Value::as_array) else {
            anyhow::bail!("the server's tools/list answer has no tools array");
        };
        tools.extend(items.iter().cloned());
        match result.get("nextCursor").filter(|c| !c.is_null()) {
            Some(c) => cursor = Some(c.clone()),
            None => break,
        }
    }
    Ok((tools, info))
}

/// A Streamable HTTP server (MCP's transport, 2025-06-18): each message is
/// a POST; a request's answer is a JSON body or an event of an SSE stream;
/// the session id the server gives with its `initialize` answer goes with
/// every later message, and the session is ended (DELETE) afterwards.
struct HttpPeer {
    rt: tokio::runtime::Runtime,
    client: reqwest::Client,
    url: reqwest::Url,
    session: Option<String>,
    /// Answers read, by request id.
    answers: std::collections::HashMap<String, Value>,
}

impl HttpPeer {
    fn read(&mut self, resp: reqwest::Response, id: &str) -> anyhow::Result<()> {
        let status = resp.status();
        if !status.is_success() {
            let text = self.rt.block_on(resp.text()).unwrap_or_default();
            anyhow::bail!(
                "the server answered {id} with HTTP {status}: {}",
                text.trim()
            );
        }
        if let Some(sid) = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
        {
            self.session = Some(sid.to_owned());
        }
        let sse = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|c| c.starts_with("text/event-stream"));
        let wanted = Value::String(id.to_owned());
        let found = self.rt.block_on(async {
            let mut resp = resp;
            let mut body: Vec<u8> = Vec::new();
            let mut scanned = 0;
            loop {
                let chunk = tokio::time::timeout(ANSWER_TIMEOUT, resp.chunk())
                    .await
                    .map_err(|_| {
                        anyhow::anyhow!(
                            "the server did not answer {id} in {} s",
                            ANSWER_TIMEOUT.as_secs()
                        )
                    })?
                    .with_context(|| format!("reading the answer to {id}"))?;
                let Some(chunk) = chunk else { break };
                body.extend_from_slice(&chunk);
                anyhow::ensure!(
                    body.len() <= MAX_ANSWER_BYTES,
                    "the answer to {id} is larger than {MAX_ANSWER_BYTES} bytes"
                );
                if sse {
                    // Whole events only: each ends with a blank line (the
                    // bytes before `scanned` are complete and never change).
                    let text = String::from_utf8_lossy(&body).replace("\r\n", "\n");
                    while let Some(end) = text[scanned..].find("\n\n") {
                        let event = &text[scanned..scanned + end];
                        scanned += end + 2;
                        let data: Vec<&str> = event
                            .lines()
                            .filter_map(|l| l.strip_prefix("data:"))
                            .map(|d| d.strip_prefix(' ').unwrap_or(d))
                            .collect();
                        if let Ok(msg) = serde_json::from_str::<Value>(&data.join("\n")) {
                            if msg.get("id") == Some(&wanted) && msg.get("method").is_none() {
                                return Ok(Some(msg));
                            }
                        }
                    }
                }
            }
            if sse {
                return Ok(None);
            }
            Ok(serde_json::from_slice::<Value>(&body).ok())
        })?;
        let msg = found.ok_or_else(|| {
            anyhow::anyhow!("the server's HTTP answer to {id} holds no JSON-RPC answer")
        })?;
        self.answers.insert(id.to_owned(), msg);
        Ok(())
    }
}

impl Peer for HttpPeer {
    fn send(&mut self, msg: &Value) -> anyhow::Result<()> {
        let mut req = self
            .client
            .post(self.url.clone())
            .header(
                reqwest::header::ACCEPT,
                "application/json, text/event-stream",
            )
            .json(msg);
        if let Some(sid) = &self.session {
            req = req
                .header("mcp-session-id", sid)
                .header("mcp-protocol-version", PROTOCOL_VERSION);
        }
        let resp = self
            .rt
            .block_on(req.send())
            .with_context(|| format!("reaching {}", self.url))?;
        match msg.get("id").and_then(Value::as_str) {
            Some(id) => self.read(resp, id),
            None if resp.status().is_success() => Ok(()),
            None => anyhow::bail!("the server refused a notification: HTTP {}", resp.status()),
        }
    }

    fn answer(&mut self, id: &str) -> anyhow::Result<Value> {
        self.answers
            .remove(id)
            .ok_or_else(|| anyhow::anyhow!("the server did not answer {id}"))
    }
}

/// Lists the tools of the Streamable HTTP server at `url` once.
fn list_http_tools(url: &str) -> anyhow::Result<(Vec<Value>, Option<ServerInfo>)> {
    let parsed = reqwest::Url::parse(url)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https"))
        .ok_or_else(|| anyhow::anyhow!("--url {url}: not an http or https URL"))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the HTTP client")?;
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .build()
        .context("the HTTP client")?;
    let mut peer = HttpPeer {
        rt,
        client,
        url: parsed,
        session: None,
        answers: std::collections::HashMap::new(),
    };
    let listed = list_tools(&mut peer);
    if let Some(sid) = peer.session.clone() {
        // The session is ended; a server that does not allow it says 405.
        let end = peer
            .client
            .delete(peer.url.clone())
            .header("mcp-session-id", sid)
            .send();
        let _ = peer
            .rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(5), end).await });
    }
    listed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_characters_are_named_and_plain_text_is_not() {
        let defs = [
            json!({"name": "ok", "description": "Plain text.\n\tIndented, é, 😀"}),
            json!({"name": "bad", "description": "Hi\u{200b} there\u{1b}[2J", "inputSchema": {"properties": {"x\u{202e}": {}}}}),
        ];
        let lock = Lockfile::from_definitions(
            &defs,
            None,
            ServerId::Url("http://x".into()),
            None,
            "a".into(),
            tally_schemas::UnixMillis::new(0),
        )
        .unwrap();
        let found = hidden_characters(&lock.tools);
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found[0].contains("U+200B"), "{found:?}");
        assert!(found.iter().all(|f| f.starts_with("tool bad:")));
    }

    #[test]
    fn diff_names_parts_and_description_lines() {
        let mk = |desc: &str, schema: Value| {
            Lockfile::from_definitions(
                &[
                    json!({"name": "t", "description": desc, "inputSchema": schema}),
                    json!({"name": "u"}),
                ],
                None,
                ServerId::Url("http://x".into()),
                None,
                "a".into(),
                tally_schemas::UnixMillis::new(0),
            )
            .unwrap()
        };
        let a = mk("one\ntwo", json!({"type": "object"}));
        let b = mk("one\nthree", json!({"type": "object", "required": ["x"]}));
        let d = diff(&a, &b);
        assert_eq!(
            d,
            vec![
                "tool t: changed: description, input_schema".to_owned(),
                "  - two".to_owned(),
                "  + three".to_owned()
            ]
        );
    }
}
