//! Running the MCP server as a child process behind the proxy:
//! its stdin and stdout go through [`crate::proxy::run_proxy`], its stderr
//! passes straight through, SIGTERM, SIGINT and SIGHUP sent to the gateway
//! are passed on to it, and its exit status becomes the gateway's.
//!
//! Shutdown follows the MCP stdio transport: when the client closes its
//! input, the server's input is closed; a server still running
//! [`SHUTDOWN_GRACE`] later gets SIGTERM, and SIGKILL after as long again.

use std::ffi::OsString;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

use crate::proxy::{run_proxy, ProxyConfig, ProxyDeps, ProxyReport};

/// How long a server may take to exit once its input is closed (or its
/// output has ended) before it is sent SIGTERM, then SIGKILL.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Why the server could not be run.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The command is empty.
    #[error("no MCP server command given (tally gateway --agent NAME -- CMD ARGS)")]
    NoCommand,
    /// The command could not be started.
    #[error("cannot start {command}: {source}")]
    Spawn {
        /// The program.
        command: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Waiting for the child failed.
    #[error("waiting for the MCP server: {0}")]
    Wait(std::io::Error),
}

/// How the gateway ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayExit {
    /// The exit code to use: the server's, or 128 + its signal.
    pub code: i32,
    /// What the proxy saw.
    pub report: ProxyReport,
}

fn send_signal(child: &Child, sig: Signal) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = kill(Pid::from_raw(pid), sig);
    }
}

async fn wait_with_escalation(child: &mut Child) -> Result<std::process::ExitStatus, ProcessError> {
    if let Ok(r) = tokio::time::timeout(SHUTDOWN_GRACE, child.wait()).await {
        return r.map_err(ProcessError::Wait);
    }
    send_signal(child, Signal::SIGTERM);
    if let Ok(r) = tokio::time::timeout(SHUTDOWN_GRACE, child.wait()).await {
        return r.map_err(ProcessError::Wait);
    }
    send_signal(child, Signal::SIGKILL);
    child.wait().await.map_err(ProcessError::Wait)
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt as _;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// Runs `command` behind the proxy on this process's stdin and stdout.
///
/// # Errors
/// [`ProcessError`] when the server cannot be started or waited for.
pub async fn run_gateway(
    config: ProxyConfig,
    deps: ProxyDeps,
    command: &[OsString],
) -> Result<GatewayExit, ProcessError> {
    let (program, args) = command.split_first().ok_or(ProcessError::NoCommand)?;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|source| ProcessError::Spawn {
            command: program.to_string_lossy().into_owned(),
            source,
        })?;
    let (Some(server_in), Some(server_out)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(ProcessError::Spawn {
            command: program.to_string_lossy().into_owned(),
            source: std::io::Error::other("no pipes to the child"),
        });
    };
    let mut sigterm = signal(SignalKind::terminate()).map_err(ProcessError::Wait)?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(ProcessError::Wait)?;
    let mut sighup = signal(SignalKind::hangup()).map_err(ProcessError::Wait)?;
    let client_gone = deps.client_gone.clone();
    let proxy = run_proxy(
        config,
        deps,
        tokio::io::stdin(),
        tokio::io::stdout(),
        server_in,
        server_out,
    );
    tokio::pin!(proxy);
    let mut client_gone_at: Option<tokio::time::Instant> = None;
    let report = loop {
        let escalate = client_gone_at.map(|t| t + SHUTDOWN_GRACE);
        tokio::select! {
            report = &mut proxy => break report,
            _ = sigterm.recv() => send_signal(&child, Signal::SIGTERM),
            _ = sigint.recv() => send_signal(&child, Signal::SIGINT),
            _ = sighup.recv() => send_signal(&child, Signal::SIGHUP),
            () = client_gone.notified(), if client_gone_at.is_none() => {
                client_gone_at = Some(tokio::time::Instant::now());
            }
            () = tokio::time::sleep_until(escalate.unwrap_or_else(tokio::time::Instant::now)), if escalate.is_some() => {
                // The client left and the server has not exited: SIGTERM now,
                // SIGKILL one grace period later.
                send_signal(&child, Signal::SIGTERM);
                client_gone_at = None;
                let grace_end = tokio::time::Instant::now() + SHUTDOWN_GRACE;
                tokio::select! {
                    report = &mut proxy => break report,
                    () = tokio::time::sleep_until(grace_end) => send_signal(&child, Signal::SIGKILL),
                }
            }
        }
    };
    let status = wait_with_escalation(&mut child).await?;
    Ok(GatewayExit {
        code: exit_code(status),
        report,
    })
}
