//! The agent's local state directory (`.tally/` by default; docs/operations.md
//! "The agent side: `tally gateway` and `.tally/`"): the
//! agent's signing key, its witness configuration (URL, API key, the pinned
//! log keys of docs/protocol.md §4.4) and the path of its chain store.
//!
//! Layout, one folder per agent:
//!
//! ```text
//! <state>/agents/<agent>/agent.key    {"v":1,"agent":…,"seed":base64}  mode 0600
//! <state>/agents/<agent>/config.json  {"v":1,"agent":…,"witness":{…}|null}
//! <state>/agents/<agent>/api-key      the witness API key, mode 0600 (optional)
//! <state>/agents/<agent>/chain.redb   the chain store (crate::store)
//! <state>/agents/<agent>/chain.journal records written but not yet committed
//!                                     to chain.redb (crate::journal), mode 0600
//! ```
//!
//! A new agent's folder is made whole or not at all: its files are written
//! into a hidden temporary folder beside it, which is then renamed
//! ([`StateDir::create_agent_with`]).
//!
//! Where the state directory is (`--state-dir`, `TALLY_STATE_DIR` or
//! `.tally` in the current folder) is the CLI's choice; it says which with
//! [`StateDir::with_lookup`], so that an agent that is not found names the
//! folder looked in and why, and how to point at another one.
//!
//! The witness API key can also come from `TALLY_API_KEY` and the URL from
//! `TALLY_WITNESS_URL`; the pinned keys only ever come from `config.json`,
//! written by `tally agent init --witness`. Syncing refetches the witness's
//! key directory and writes retirements of pinned keys back
//! ([`StateDir::record_key_retirements`]); it never adds a key.

use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use tally_schemas::note::NoteVerifier;
use tally_schemas::{AgentName, SecretKey, UnixMillis};

use crate::acceptance::{TrustedLogKey, WitnessTrust};

/// Environment variable that overrides the witness API key.
pub const API_KEY_ENV: &str = "TALLY_API_KEY";
/// Environment variable that overrides the witness URL.
pub const WITNESS_URL_ENV: &str = "TALLY_WITNESS_URL";

/// Why local state could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The agent has no key in this state directory. The message never
    /// advises `tally agent init`: run in another folder than the agent's,
    /// that would make a second key for an agent the witness already knows.
    #[error("agent {agent} has no key in {} ({lookup}; {found}); if {agent} was set up in another folder, run the command there, or give that folder's state directory with --state-dir DIR or TALLY_STATE_DIR=DIR", dir.display())]
    NotInitialised {
        /// The agent.
        agent: String,
        /// The state directory, absolute.
        dir: PathBuf,
        /// How that directory was chosen.
        lookup: String,
        /// What the directory holds: no such folder, or which agents.
        found: String,
    },
    /// The agent already has a key; keys are never overwritten.
    #[error("agent {agent} already has a key at {path}; it is never overwritten")]
    KeyExists {
        /// The agent.
        agent: String,
        /// The key file.
        path: PathBuf,
    },
    /// A state file does not hold what it should.
    #[error("{path}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> StateError + '_ {
    move |source| StateError::Io {
        path: path.to_owned(),
        source,
    }
}

/// A pinned log key as kept in `config.json`: the vkey and the time range
/// the key directory gave for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinnedKey {
    /// The C2SP vkey.
    pub vkey: String,
    /// Start of the key's validity, when the directory said.
    pub not_before: Option<UnixMillis>,
    /// End of the key's validity (retirement); `None` while current.
    pub not_after: Option<UnixMillis>,
}

/// The witness an agent syncs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WitnessConfig {
    /// Base URL, e.g. `http://127.0.0.1:8080`.
    pub url: String,
    /// The log's origin, as the key directory named it.
    pub origin: String,
    /// Log keys pinned at `agent init` (trust on first use).
    pub keys: Vec<PinnedKey>,
}

impl WitnessConfig {
    /// The trust anchors for receipt acceptance.
    ///
    /// # Errors
    /// [`StateError::Corrupt`] when a pinned vkey does not parse.
    pub fn trust(&self, path: &Path) -> Result<WitnessTrust, StateError> {
        let keys = self
            .keys
            .iter()
            .map(|k| {
                Ok(TrustedLogKey {
                    verifier: NoteVerifier::from_vkey(&k.vkey).map_err(|e| {
                        StateError::Corrupt {
                            path: path.to_owned(),
                            reason: format!("pinned vkey {:?}: {e}", k.vkey),
                        }
                    })?,
                    not_before: k.not_before,
                    not_after: k.not_after,
                })
            })
            .collect::<Result<Vec<_>, StateError>>()?;
        Ok(WitnessTrust::new(keys))
    }
}

/// `config.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// Format version, 1.
    pub v: u64,
    /// The agent.
    pub agent: AgentName,
    /// The witness, once one is configured. Nothing is sent before.
    pub witness: Option<WitnessConfig>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyFile {
    v: u64,
    agent: AgentName,
    seed: String,
}

/// The state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    root: PathBuf,
    /// How `root` was chosen, for messages.
    lookup: String,
}

/// One agent's files in the state directory.
#[derive(Debug, Clone)]
pub struct AgentPaths {
    /// The agent.
    pub agent: AgentName,
    /// Its folder.
    pub dir: PathBuf,
}

impl AgentPaths {
    /// The key file.
    #[must_use]
    pub fn key(&self) -> PathBuf {
        self.dir.join("agent.key")
    }
    /// The configuration.
    #[must_use]
    pub fn config(&self) -> PathBuf {
        self.dir.join("config.json")
    }
    /// The API key file.
    #[must_use]
    pub fn api_key(&self) -> PathBuf {
        self.dir.join("api-key")
    }
    /// The chain store.
    #[must_use]
    pub fn store(&self) -> PathBuf {
        self.dir.join("chain.redb")
    }
    /// The record journal beside the chain store.
    #[must_use]
    pub fn journal(&self) -> PathBuf {
        crate::store::journal_path(&self.store())
    }
    /// The socket on which the writer that holds the chain store takes
    /// the other writers' records (crate::chain).
    #[must_use]
    pub fn socket(&self) -> PathBuf {
        self.dir.join("writer.sock")
    }
}

/// Writes `bytes` to `path` through a temporary file and a rename, so a
/// reader never sees half a file; `mode` applies to the new file.
fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), StateError> {
    let tmp = path.with_extension("tmp");
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io_err(&tmp))?;
    f.write_all(bytes).map_err(io_err(&tmp))?;
    f.sync_all().map_err(io_err(&tmp))?;
    fs::rename(&tmp, path).map_err(io_err(path))
}

/// Writes a new file (never an existing one) with `mode`, durably.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), StateError> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(io_err(path))?;
    f.write_all(bytes).map_err(io_err(path))?;
    f.sync_all().map_err(io_err(path))
}

/// `config.json`'s bytes: pretty JSON and a final newline.
fn config_bytes(config: &AgentConfig, path: &Path) -> Result<Vec<u8>, StateError> {
    let mut text = serde_json::to_vec_pretty(config).map_err(|e| StateError::Corrupt {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    text.push(b'\n');
    Ok(text)
}

impl StateDir {
    /// The state directory at `root` (not created until something is written).
    #[must_use]
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self::with_lookup(root, "the state directory given")
    }

    /// The state directory at `root`, chosen as `lookup` says (e.g. "given
    /// with --state-dir"); messages about a missing agent quote it.
    #[must_use]
    pub fn with_lookup(root: impl Into<PathBuf>, lookup: impl Into<String>) -> Self {
        Self {
            root: root.into(),
            lookup: lookup.into(),
        }
    }

    /// The root folder as an absolute path, for messages.
    #[must_use]
    pub fn absolute(&self) -> PathBuf {
        std::path::absolute(&self.root).unwrap_or_else(|_| self.root.clone())
    }

    /// How the root folder was chosen (see [`StateDir::with_lookup`]).
    #[must_use]
    pub fn lookup(&self) -> &str {
        &self.lookup
    }

    /// The error for an agent without a key here: where it was looked for,
    /// why there, and what is there instead.
    fn not_initialised(&self, agent: &AgentName) -> StateError {
        let found = if self.root.is_dir() {
            match self.agents() {
                Ok(a) if a.is_empty() => "it holds no agent".to_owned(),
                Ok(a) => format!(
                    "it holds {}",
                    a.iter()
                        .map(AgentName::as_str)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                Err(e) => format!("it cannot be listed: {e}"),
            }
        } else {
            "there is no such folder".to_owned()
        };
        StateError::NotInitialised {
            agent: agent.to_string(),
            dir: self.absolute(),
            lookup: self.lookup.clone(),
            found,
        }
    }

    /// The root folder.
    #[must_use]
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The paths of `agent`.
    #[must_use]
    pub fn agent(&self, agent: &AgentName) -> AgentPaths {
        AgentPaths {
            agent: agent.clone(),
            dir: self.root.join("agents").join(agent.as_str()),
        }
    }

    /// The agents that have a key here, by name.
    ///
    /// # Errors
    /// [`StateError::Io`] when the folder exists but cannot be listed.
    pub fn agents(&self) -> Result<Vec<AgentName>, StateError> {
        let dir = self.root.join("agents");
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err(&dir)(e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io_err(&dir))?;
            if let Some(name) = entry
                .file_name()
                .to_str()
                .and_then(|n| AgentName::new(n).ok())
            {
                if entry.path().join("agent.key").exists() {
                    out.push(name);
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// Makes a new agent's folder whole or not at all: its key (mode 0600),
    /// its configuration with `witness`, and `api_key` (mode 0600) when
    /// given are written into a hidden temporary folder beside it, which is
    /// then renamed into place. A failure, or a crash, leaves no agent
    /// folder (at most a hidden `.NAME.new-…` folder, which is not an agent).
    ///
    /// # Errors
    /// [`StateError::KeyExists`] when the agent already has a folder with a
    /// key (a key is never overwritten, even by a racing init);
    /// [`StateError::Io`] when the files cannot be written.
    pub fn create_agent_with(
        &self,
        agent: &AgentName,
        key: &SecretKey,
        witness: Option<WitnessConfig>,
        api_key: Option<&str>,
    ) -> Result<AgentPaths, StateError> {
        let paths = self.agent(agent);
        if paths.key().exists() {
            return Err(StateError::KeyExists {
                agent: agent.to_string(),
                path: paths.key(),
            });
        }
        let parent = self.root.join("agents");
        fs::create_dir_all(&parent).map_err(io_err(&parent))?;
        let mut nonce = [0u8; 8];
        rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut nonce);
        let staging = AgentPaths {
            agent: agent.clone(),
            dir: parent.join(format!(".{agent}.new-{}", hex::encode(nonce))),
        };
        let made = Self::write_agent_files(&staging, key, witness, api_key).and_then(|()| {
            // rename(2) replaces an empty folder but never one with files.
            fs::rename(&staging.dir, &paths.dir).map_err(|e| {
                if paths.key().exists() {
                    StateError::KeyExists {
                        agent: agent.to_string(),
                        path: paths.key(),
                    }
                } else {
                    io_err(&paths.dir)(e)
                }
            })
        });
        if let Err(e) = made {
            let _ = fs::remove_dir_all(&staging.dir);
            return Err(e);
        }
        fs::File::open(&parent)
            .and_then(|d| d.sync_all())
            .map_err(io_err(&parent))?;
        Ok(paths)
    }

    fn write_agent_files(
        paths: &AgentPaths,
        key: &SecretKey,
        witness: Option<WitnessConfig>,
        api_key: Option<&str>,
    ) -> Result<(), StateError> {
        fs::create_dir(&paths.dir).map_err(io_err(&paths.dir))?;
        let key_path = paths.key();
        let file = KeyFile {
            v: 1,
            agent: paths.agent.clone(),
            seed: BASE64.encode(key.seed()),
        };
        let mut text = serde_json::to_vec(&file).map_err(|e| StateError::Corrupt {
            path: key_path.clone(),
            reason: e.to_string(),
        })?;
        text.push(b'\n');
        write_new(&key_path, &text, 0o600)?;
        let config = AgentConfig {
            v: 1,
            agent: paths.agent.clone(),
            witness,
        };
        write_new(
            &paths.config(),
            &config_bytes(&config, &paths.config())?,
            0o644,
        )?;
        if let Some(k) = api_key {
            write_new(&paths.api_key(), format!("{k}\n").as_bytes(), 0o600)?;
        }
        Ok(())
    }

    /// Reads the agent's key.
    ///
    /// # Errors
    /// [`StateError::NotInitialised`] without a key file, [`StateError::Corrupt`]
    /// when it does not parse or names another agent.
    pub fn load_key(&self, agent: &AgentName) -> Result<SecretKey, StateError> {
        let path = self.agent(agent).key();
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(self.not_initialised(agent))
            }
            Err(e) => return Err(io_err(&path)(e)),
        };
        let corrupt = |reason: String| StateError::Corrupt {
            path: path.clone(),
            reason,
        };
        let file: KeyFile = serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
        if file.v != 1 || file.agent != *agent {
            return Err(corrupt(format!(
                "key file is for agent {} (version {})",
                file.agent, file.v
            )));
        }
        let seed: [u8; 32] = BASE64
            .decode(&file.seed)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| corrupt("seed is not base64 of 32 bytes".into()))?;
        Ok(SecretKey::from_seed(&seed))
    }

    /// Reads the agent's configuration.
    ///
    /// # Errors
    /// [`StateError`] when the file is missing or does not parse.
    pub fn load_config(&self, agent: &AgentName) -> Result<AgentConfig, StateError> {
        let path = self.agent(agent).config();
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(self.not_initialised(agent))
            }
            Err(e) => return Err(io_err(&path)(e)),
        };
        let config: AgentConfig =
            serde_json::from_slice(&bytes).map_err(|e| StateError::Corrupt {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        if config.v != 1 || config.agent != *agent {
            return Err(StateError::Corrupt {
                path,
                reason: format!(
                    "configuration is for agent {} (version {})",
                    config.agent, config.v
                ),
            });
        }
        Ok(config)
    }

    /// Writes the agent's configuration atomically.
    ///
    /// # Errors
    /// [`StateError::Io`] when it cannot be written.
    pub fn save_config(&self, config: &AgentConfig) -> Result<(), StateError> {
        let paths = self.agent(&config.agent);
        fs::create_dir_all(&paths.dir).map_err(io_err(&paths.dir))?;
        write_atomic(
            &paths.config(),
            &config_bytes(config, &paths.config())?,
            0o644,
        )
    }

    /// Writes the retirement times of `trust`'s keys into the agent's
    /// pinned keys, where they are earlier than the pinned ones (a
    /// retirement never moves later). Keys that are not pinned are ignored.
    ///
    /// # Errors
    /// [`StateError`] when the configuration cannot be read or written.
    pub fn record_key_retirements(
        &self,
        agent: &AgentName,
        trust: &WitnessTrust,
    ) -> Result<bool, StateError> {
        let mut config = self.load_config(agent)?;
        let Some(witness) = config.witness.as_mut() else {
            return Ok(false);
        };
        let mut changed = false;
        for pinned in &mut witness.keys {
            let Ok(v) = NoteVerifier::from_vkey(&pinned.vkey) else {
                continue;
            };
            let retired = trust
                .keys()
                .iter()
                .find(|k| k.verifier == v)
                .and_then(|k| k.not_after);
            if let Some(t) = retired {
                if pinned.not_after.is_none_or(|old| t < old) {
                    pinned.not_after = Some(t);
                    changed = true;
                }
            }
        }
        if changed {
            self.save_config(&config)?;
        }
        Ok(changed)
    }

    /// Stores the witness API key (mode 0600).
    ///
    /// # Errors
    /// [`StateError::Io`] when it cannot be written.
    pub fn save_api_key(&self, agent: &AgentName, api_key: &str) -> Result<(), StateError> {
        let paths = self.agent(agent);
        fs::create_dir_all(&paths.dir).map_err(io_err(&paths.dir))?;
        write_atomic(&paths.api_key(), format!("{api_key}\n").as_bytes(), 0o600)
    }

    /// The witness settings `agent`'s sync uses, pinned in `config`, and
    /// where each came from (docs/operations.md, "The agent's witness"):
    /// the pinned URL always; `TALLY_API_KEY` when set, unless
    /// `TALLY_WITNESS_URL` names another witness than the pinned one (its
    /// key is then that witness's), else the key stored at `agent init`.
    ///
    /// # Errors
    /// [`StateError::Io`] when the stored key exists but cannot be read.
    pub fn witness_settings(
        &self,
        agent: &AgentName,
        config: &WitnessConfig,
    ) -> Result<WitnessSettings, StateError> {
        let var = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        self.witness_settings_from(agent, config, var(WITNESS_URL_ENV), var(API_KEY_ENV))
    }

    fn witness_settings_from(
        &self,
        agent: &AgentName,
        config: &WitnessConfig,
        env_url: Option<String>,
        env_key: Option<String>,
    ) -> Result<WitnessSettings, StateError> {
        let other_witness = env_url.filter(|u| !same_witness_url(u, &config.url));
        let ignored_env = other_witness.as_ref().map(|u| {
            format!(
                "{WITNESS_URL_ENV} names the witness at {u}, but agent {agent} is pinned to the witness at {} (`tally agent init`): its records go there, with the API key stored at `agent init`{}. To move {agent} to another witness, run `tally agent init {agent} --witness URL --api-key KEY`; otherwise unset {WITNESS_URL_ENV}",
                config.url,
                if env_key.is_some() { ", not TALLY_API_KEY (which goes with the other witness)" } else { "" }
            )
        });
        let (api_key, api_key_from) = match env_key {
            Some(k) if other_witness.is_none() => (Some(k), ApiKeySource::Environment),
            _ => {
                let path = self.agent(agent).api_key();
                match fs::read_to_string(&path) {
                    Ok(text) => match Some(text.trim().to_owned()).filter(|k| !k.is_empty()) {
                        Some(k) => (Some(k), ApiKeySource::Stored),
                        None => (None, ApiKeySource::None),
                    },
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        (None, ApiKeySource::None)
                    }
                    Err(e) => return Err(io_err(&path)(e)),
                }
            }
        };
        Ok(WitnessSettings {
            url: config.url.clone(),
            api_key,
            api_key_from,
            ignored_env,
        })
    }
}

/// Whether two witness URLs name the same witness (a trailing `/` aside).
#[must_use]
pub fn same_witness_url(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

/// Where the API key an agent's sync presents came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiKeySource {
    /// `TALLY_API_KEY`.
    Environment,
    /// The file `agent init --api-key` wrote.
    Stored,
    /// Nowhere: the witness answers 401.
    None,
}

impl ApiKeySource {
    /// How `tally status` says it.
    #[must_use]
    pub fn describe(self) -> &'static str {
        match self {
            Self::Environment => "from TALLY_API_KEY",
            Self::Stored => "stored by `tally agent init --api-key`",
            Self::None => "none: give it with `tally agent init AGENT --witness URL --api-key KEY`",
        }
    }
}

/// The witness an agent's sync talks to, and with which API key
/// ([`StateDir::witness_settings`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WitnessSettings {
    /// The pinned witness's URL (the environment never overrides it).
    pub url: String,
    /// The API key presented, if any.
    pub api_key: Option<String>,
    /// Where the API key came from.
    pub api_key_from: ApiKeySource,
    /// Set when `TALLY_WITNESS_URL` names another witness than the pinned
    /// one: what was not used, and what to do.
    pub ignored_env: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn key_is_private_and_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path());
        let agent = AgentName::new("bot-1").unwrap();
        let key = SecretKey::from_seed(&[9; 32]);
        let paths = state.create_agent_with(&agent, &key, None, None).unwrap();
        let mode = fs::metadata(paths.key()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(state.load_key(&agent).unwrap().seed(), key.seed());
        assert!(matches!(
            state.create_agent_with(&agent, &SecretKey::from_seed(&[1; 32]), None, None),
            Err(StateError::KeyExists { .. })
        ));
        assert_eq!(state.load_key(&agent).unwrap().seed(), key.seed());
        assert_eq!(state.agents().unwrap(), vec![agent.clone()]);
        assert_eq!(state.load_config(&agent).unwrap().witness, None);
    }

    #[test]
    fn the_pinned_witness_wins_over_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path());
        let agent = AgentName::new("bot").unwrap();
        let witness = WitnessConfig {
            url: "http://127.0.0.1:2/".into(),
            origin: "tally.local/log".into(),
            keys: Vec::new(),
        };
        let key = SecretKey::from_seed(&[3; 32]);
        state
            .create_agent_with(&agent, &key, Some(witness.clone()), Some("tally_b"))
            .unwrap();
        let other = Some("http://127.0.0.1:1".to_owned());
        let env_key = Some("tally_a".to_owned());
        // Another witness in the environment: neither it nor its key is used.
        let s = state
            .witness_settings_from(&agent, &witness, other, env_key.clone())
            .unwrap();
        assert_eq!(s.url, witness.url);
        assert_eq!(s.api_key.as_deref(), Some("tally_b"));
        assert_eq!(s.api_key_from, ApiKeySource::Stored);
        let note = s.ignored_env.unwrap();
        assert!(
            note.contains("http://127.0.0.1:1")
                && note.contains("http://127.0.0.1:2/")
                && note.contains(WITNESS_URL_ENV)
                && note.contains("not TALLY_API_KEY"),
            "{note}"
        );
        // The pinned witness in the environment (a `/` aside), or none:
        // TALLY_API_KEY overrides the stored key.
        for env_url in [Some("http://127.0.0.1:2".to_owned()), None] {
            let s = state
                .witness_settings_from(&agent, &witness, env_url, env_key.clone())
                .unwrap();
            assert_eq!(s.api_key.as_deref(), Some("tally_a"));
            assert_eq!(s.api_key_from, ApiKeySource::Environment);
            assert_eq!(s.ignored_env, None);
        }
    }

    #[test]
    fn a_new_agent_is_made_whole_and_never_over_an_existing_one() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path());
        let agent = AgentName::new("bot").unwrap();
        let witness = WitnessConfig {
            url: "http://127.0.0.1:1".into(),
            origin: "tally.local/log".into(),
            keys: Vec::new(),
        };
        let key = SecretKey::from_seed(&[3; 32]);
        let paths = state
            .create_agent_with(&agent, &key, Some(witness.clone()), Some("tally_k"))
            .unwrap();
        assert_eq!(state.load_key(&agent).unwrap().seed(), key.seed());
        assert_eq!(state.load_config(&agent).unwrap().witness, Some(witness));
        assert_eq!(fs::read_to_string(paths.api_key()).unwrap(), "tally_k\n");
        for f in [paths.key(), paths.api_key()] {
            let mode = fs::metadata(&f).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", f.display());
        }
        // Nothing but the agent's folder is left beside it.
        let names: Vec<_> = fs::read_dir(dir.path().join("agents"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("bot")]);
        assert!(matches!(
            state.create_agent_with(&agent, &SecretKey::from_seed(&[4; 32]), None, None),
            Err(StateError::KeyExists { .. })
        ));
        assert_eq!(state.load_key(&agent).unwrap().seed(), key.seed());
        // A staging folder a crash left behind is not an agent.
        let stale = dir.path().join("agents/.other.new-0011223344556677");
        fs::create_dir_all(&stale).unwrap();
        fs::write(stale.join("agent.key"), b"{}").unwrap();
        assert_eq!(state.agents().unwrap(), vec![agent]);
    }

    #[test]
    fn a_missing_agent_names_where_it_was_looked_for_and_never_advises_init() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::with_lookup(dir.path().join(".tally"), "from TALLY_STATE_DIR");
        let agent = AgentName::new("bot").unwrap();
        let e = state.load_key(&agent).unwrap_err().to_string();
        for says in [
            dir.path().join(".tally").to_str().unwrap(),
            "from TALLY_STATE_DIR",
            "there is no such folder",
            "--state-dir",
        ] {
            assert!(e.contains(says), "{says}: {e}");
        }
        state
            .create_agent_with(
                &AgentName::new("other").unwrap(),
                &SecretKey::from_seed(&[5; 32]),
                None,
                None,
            )
            .unwrap();
        let e = state.load_config(&agent).unwrap_err().to_string();
        assert!(e.contains("it holds other"), "{e}");
        assert!(!e.contains("agent init"), "{e}");
    }

    #[test]
    fn missing_and_corrupt_state_are_errors_not_panics() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path());
        let agent = AgentName::new("a").unwrap();
        assert!(matches!(
            state.load_key(&agent),
            Err(StateError::NotInitialised { .. })
        ));
        fs::create_dir_all(state.agent(&agent).dir).unwrap();
        fs::write(state.agent(&agent).key(), b"{not json").unwrap();
        assert!(matches!(
            state.load_key(&agent),
            Err(StateError::Corrupt { .. })
        ));
        fs::write(
            state.agent(&agent).key(),
            br#"{"v":1,"agent":"other","seed":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}"#,
        )
        .unwrap();
        assert!(matches!(
            state.load_key(&agent),
            Err(StateError::Corrupt { .. })
        ));
    }
}
