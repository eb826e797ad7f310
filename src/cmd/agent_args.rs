//! The arguments every agent-side command shares: the state directory and
//! the agent (`agent` re-exports them; `agent_admin`, `record`, `gateway`
//! and `disclose` take them).

use std::path::PathBuf;

use anyhow::Context;
use tally_gateway::state::StateDir;
use tally_schemas::AgentName;

/// Where the agent's local state lives; shared by every agent-side command.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct StateArgs {
    /// The local state directory (keys, chain stores, witness config)
    /// [default: $TALLY_STATE_DIR, else .tally in the current folder].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

/// The environment variable that names the state directory.
pub(crate) const STATE_DIR_ENV: &str = "TALLY_STATE_DIR";

impl StateArgs {
    /// The state directory, and how it was chosen (quoted when an agent is
    /// not found in it).
    #[must_use]
    pub(crate) fn dir(&self) -> StateDir {
        if let Some(dir) = &self.state_dir {
            return StateDir::with_lookup(dir, "given with --state-dir");
        }
        match std::env::var_os(STATE_DIR_ENV).filter(|v| !v.is_empty()) {
            Some(dir) => StateDir::with_lookup(PathBuf::from(dir), "from TALLY_STATE_DIR"),
            None => StateDir::with_lookup(
                ".tally",
                "the default, .tally in the current folder: neither --state-dir nor TALLY_STATE_DIR is set",
            ),
        }
    }
}

/// Parses an agent name for clap.
///
/// # Errors
/// The protocol's rule for agent names, as text.
pub(crate) fn parse_agent(s: &str) -> Result<AgentName, String> {
    AgentName::new(s).map_err(|e| e.to_string())
}

/// The agent of an `agent` subcommand: a word (`tally agent sync NAME`) or
/// `--agent NAME`, as every other command takes it.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct AgentArg {
    /// The agent's name (or give it with --agent).
    #[arg(
        value_name = "AGENT",
        value_parser = parse_agent,
        required_unless_present = "agent_flag",
        conflicts_with = "agent_flag"
    )]
    name: Option<AgentName>,
    /// The agent's name (the same as giving it as a word).
    #[arg(long = "agent", id = "agent_flag", value_name = "AGENT", value_parser = parse_agent)]
    flag: Option<AgentName>,
}

impl AgentArg {
    /// The agent.
    ///
    /// # Errors
    /// When neither form was given (clap refuses that first).
    pub(crate) fn get(&self) -> anyhow::Result<&AgentName> {
        self.name
            .as_ref()
            .or(self.flag.as_ref())
            .context("give the agent: NAME or --agent NAME")
    }
}
