//! The witness's own tables: projects, API keys, the admin token and the
//! agents registered to each project with their public keys and validity
//! ranges (docs/operations.md "The data folder"; the keys end up in
//! agent-keys.json, docs/protocol.md §9.3).
//!
//! Stored in a redb file of its own (`witness.redb`, next to the log's
//! `log.redb`), because the log engine owns its file. Rows are JSON values
//! under string keys, so that an operator can read them with any redb tool.
//! Everything is also held in memory: admission reads only the cache, and a
//! write goes to disk (durably) before the cache changes.
//!
//! API keys are `tally_<16 hex id>_<48 hex secret>`: 192 random bits of
//! secret, shown once, stored as SHA-256 of the whole key, looked up by the
//! public id and compared in constant time (`subtle`). Read tokens
//! (`tallyread_<16 hex id>_<48 hex secret>`, docs/operations.md "Who can
//! read the log") are made, stored and checked the same way. Agent names are
//! unique across the witness, because the log's chains are keyed by agent
//! name (docs/api.md "Agents and their keys" says what another project is
//! told about a taken name).
//!
//! The registry writes what it is told; the rule that a key change never
//! reaches back before admitted history (docs/protocol.md §4.1) is enforced
//! by its caller, `key_changes`, which knows the log. So rotation and
//! retirement are visible only inside the crate: every other path to them
//! goes through `key_changes::change_keys`.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Mutex, RwLock};

use rand_core::CryptoRngCore;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tally_schemas::limits::MAX_KEYS_PER_AGENT;
use tally_schemas::pack::AgentKey;
use tally_schemas::{AgentName, PublicKey, UnixMillis};

use crate::error::{RegistryError, WitnessError};

/// `projects`: project name → JSON [`ProjectRow`].
const PROJECTS: TableDefinition<&str, &[u8]> = TableDefinition::new("projects");
/// `api_keys`: key id (16 hex) → JSON [`ApiKeyRow`].
const API_KEYS: TableDefinition<&str, &[u8]> = TableDefinition::new("api_keys");
/// `agents`: agent name → JSON [`AgentRow`].
const AGENTS: TableDefinition<&str, &[u8]> = TableDefinition::new("agents");
/// `meta`: `admin_token_sha256` → 32 bytes.
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
/// `read_tokens`: token id (16 hex) → JSON [`ReadTokenRow`].
const READ_TOKENS: TableDefinition<&str, &[u8]> = TableDefinition::new("read_tokens");

/// Prefix of API keys.
pub const API_KEY_PREFIX: &str = "tally_";
/// Prefix of the admin token.
pub const ADMIN_TOKEN_PREFIX: &str = "tallyadm_";
/// Prefix of read tokens.
pub const READ_TOKEN_PREFIX: &str = "tallyread_";
/// Longest read-token label, in bytes.
pub const MAX_LABEL_BYTES: usize = 128;

/// Name of the project created on first start.
pub const DEFAULT_PROJECT: &str = "default";

/// A project.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectRow {
    /// When it was created.
    pub created: UnixMillis,
}

/// A stored API key (its hash, never the key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyRow {
    /// The project it posts for.
    pub project: String,
    /// SHA-256 of the whole key, hex.
    pub sha256: String,
    /// When it was made.
    pub created: UnixMillis,
    /// When it was revoked, if it was.
    pub revoked: Option<UnixMillis>,
}

/// A stored read token (its hash, never the token): it lets its holder
/// read the whole log when the witness runs with `--log-read token`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadTokenRow {
    /// Who it was given to, for people (e.g. `monitor at example.org`).
    pub label: String,
    /// SHA-256 of the whole token, hex.
    pub sha256: String,
    /// When it was made.
    pub created: UnixMillis,
    /// When it was revoked, if it was.
    pub revoked: Option<UnixMillis>,
}

/// A registered agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentRow {
    /// Its project.
    pub project: String,
    /// Its keys, oldest first, with their validity ranges.
    pub keys: Vec<AgentKey>,
}

impl AgentRow {
    /// The key with `key_id`, if registered.
    #[must_use]
    pub fn key(&self, key_id: &tally_schemas::KeyId) -> Option<&AgentKey> {
        self.keys.iter().find(|k| &k.key_id == key_id)
    }
}

/// A freshly made secret (API key or admin token), shown once.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    /// The whole secret, as the client sends it.
    pub token: String,
    id: String,
    sha256: [u8; 32],
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secret")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Secret {
    fn generate<R: CryptoRngCore + ?Sized>(prefix: &str, rng: &mut R) -> Self {
        let mut id = [0u8; 8];
        let mut secret = [0u8; 24];
        rng.fill_bytes(&mut id);
        rng.fill_bytes(&mut secret);
        let id = hex::encode(id);
        let token = format!("{prefix}{id}_{}", hex::encode(secret));
        let sha256 = sha256(&token);
        Self { token, id, sha256 }
    }

    /// The public id part of the key.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.id
    }
}

fn sha256(s: &str) -> [u8; 32] {
    Sha256::digest(s.as_bytes()).into()
}

/// Splits `tally_<id>_<secret>` into its id, if it has that shape.
pub(crate) fn key_id_of<'a>(token: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = token.strip_prefix(prefix)?;
    let (id, secret) = rest.split_once('_')?;
    let hex_ok = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    (hex_ok(id, 16) && hex_ok(secret, 48)).then_some(id)
}

/// What an authenticated API key stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The project.
    pub project: String,
    /// The key's public id (the rate-limit bucket).
    pub key_id: String,
}

/// What the first start created.
#[derive(Debug, Clone)]
pub struct FirstStart {
    /// The default project's API key.
    pub api_key: Secret,
    /// The admin token.
    pub admin_token: Secret,
}

#[derive(Default)]
struct Cache {
    projects: BTreeMap<String, ProjectRow>,
    api_keys: HashMap<String, ApiKeyRow>,
    agents: BTreeMap<AgentName, AgentRow>,
    admin_sha256: Option<[u8; 32]>,
    read_tokens: BTreeMap<String, ReadTokenRow>,
}

/// The registry: projects, API keys, agents. See the module docs.
pub struct Registry {
    db: Database,
    cache: RwLock<Cache>,
    write: Mutex<()>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").finish_non_exhaustive()
    }
}

fn storage<E: std::fmt::Display>(e: E) -> RegistryError {
    RegistryError::Storage(e.to_string())
}

fn decode<T: for<'de> Deserialize<'de>>(
    table: &'static str,
    key: &str,
    bytes: &[u8],
) -> Result<T, RegistryError> {
    serde_json::from_slice(bytes).map_err(|e| RegistryError::Corrupt {
        table,
        key: key.to_owned(),
        reason: e.to_string(),
    })
}

fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, RegistryError> {
    serde_json::to_vec(v).map_err(storage)
}

impl Registry {
    /// Opens (or creates) the registry file and loads it into memory.
    ///
    /// # Errors
    /// [`RegistryError`] when the file cannot be opened or a row is corrupt.
    pub fn open(path: &Path) -> Result<Self, RegistryError> {
        let db = Database::create(path).map_err(storage)?;
        let tx = db.begin_write().map_err(storage)?;
        {
            tx.open_table(PROJECTS).map_err(storage)?;
            tx.open_table(API_KEYS).map_err(storage)?;
            tx.open_table(AGENTS).map_err(storage)?;
            tx.open_table(META).map_err(storage)?;
            tx.open_table(READ_TOKENS).map_err(storage)?;
        }
        tx.commit().map_err(storage)?;
        let mut cache = Cache::default();
        {
            let rx = db.begin_read().map_err(storage)?;
            let t = rx.open_table(PROJECTS).map_err(storage)?;
            for row in t.iter().map_err(storage)? {
                let (k, v) = row.map_err(storage)?;
                cache.projects.insert(
                    k.value().to_owned(),
                    decode("projects", k.value(), v.value())?,
                );
            }
            let t = rx.open_table(API_KEYS).map_err(storage)?;
            for row in t.iter().map_err(storage)? {
                let (k, v) = row.map_err(storage)?;
                cache.api_keys.insert(
                    k.value().to_owned(),
                    decode("api_keys", k.value(), v.value())?,
                );
            }
            let t = rx.open_table(AGENTS).map_err(storage)?;
            for row in t.iter().map_err(storage)? {
                let (k, v) = row.map_err(storage)?;
                let name = AgentName::new(k.value()).map_err(|e| RegistryError::Corrupt {
                    table: "agents",
                    key: k.value().to_owned(),
                    reason: e.to_string(),
                })?;
                cache
                    .agents
                    .insert(name, decode("agents", k.value(), v.value())?);
            }
            let t = rx.open_table(READ_TOKENS).map_err(storage)?;
            for row in t.iter().map_err(storage)? {
                let (k, v) = row.map_err(storage)?;
                cache.read_tokens.insert(
                    k.value().to_owned(),
                    decode("read_tokens", k.value(), v.value())?,
                );
            }
            let t = rx.open_table(META).map_err(storage)?;
            if let Some(v) = t.get("admin_token_sha256").map_err(storage)? {
                let h: [u8; 32] = v.value().try_into().map_err(|_| RegistryError::Corrupt {
                    table: "meta",
                    key: "admin_token_sha256".into(),
                    reason: "not 32 bytes".into(),
                })?;
                cache.admin_sha256 = Some(h);
            }
        }
        Ok(Self {
            db,
            cache: RwLock::new(cache),
            write: Mutex::new(()),
        })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Cache> {
        self.cache
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn cache_mut(&self) -> std::sync::RwLockWriteGuard<'_, Cache> {
        self.cache
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn writer(&self) -> std::sync::MutexGuard<'_, ()> {
        self.write
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// On a registry with no project: creates the default project, its first
    /// API key and the admin token, and returns them (the only time they are
    /// shown). `None` when projects already exist.
    ///
    /// # Errors
    /// [`RegistryError`] when the write fails.
    pub fn first_start<R: CryptoRngCore + ?Sized>(
        &self,
        now: UnixMillis,
        rng: &mut R,
    ) -> Result<Option<FirstStart>, RegistryError> {
        let _w = self.writer();
        if !self.read().projects.is_empty() {
            return Ok(None);
        }
        let api_key = Secret::generate(API_KEY_PREFIX, rng);
        let admin_token = Secret::generate(ADMIN_TOKEN_PREFIX, rng);
        let project = ProjectRow { created: now };
        let key_row = ApiKeyRow {
            project: DEFAULT_PROJECT.into(),
            sha256: hex::encode(api_key.sha256),
            created: now,
            revoked: None,
        };
        let tx = self.db.begin_write().map_err(storage)?;
        {
            tx.open_table(PROJECTS)
                .map_err(storage)?
                .insert(DEFAULT_PROJECT, encode(&project)?.as_slice())
                .map_err(storage)?;
            tx.open_table(API_KEYS)
                .map_err(storage)?
                .insert(api_key.id.as_str(), encode(&key_row)?.as_slice())
                .map_err(storage)?;
            tx.open_table(META)
                .map_err(storage)?
                .insert("admin_token_sha256", admin_token.sha256.as_slice())
                .map_err(storage)?;
        }
        tx.commit().map_err(storage)?;
        let mut c = self.cache_mut();
        c.projects.insert(DEFAULT_PROJECT.into(), project);
        c.api_keys.insert(api_key.id.clone(), key_row);
        c.admin_sha256 = Some(admin_token.sha256);
        Ok(Some(FirstStart {
            api_key,
            admin_token,
        }))
    }

    /// The project and key id of an API key, compared in constant time
    /// against the stored hash. `None` for an unknown, malformed or revoked key.
    #[must_use]
    pub fn authenticate(&self, token: &str) -> Option<Principal> {
        let presented = sha256(token);
        let id = key_id_of(token, API_KEY_PREFIX)?;
        let cache = self.read();
        let row = cache.api_keys.get(id)?;
        (hash_matches(&presented, &row.sha256) && row.revoked.is_none()).then(|| Principal {
            project: row.project.clone(),
            key_id: id.to_owned(),
        })
    }

    /// The id of a read token, compared in constant time against the stored
    /// hash. `None` for an unknown, malformed or revoked token.
    #[must_use]
    pub fn authenticate_reader(&self, token: &str) -> Option<String> {
        let presented = sha256(token);
        let id = key_id_of(token, READ_TOKEN_PREFIX)?;
        let cache = self.read();
        let row = cache.read_tokens.get(id)?;
        (hash_matches(&presented, &row.sha256) && row.revoked.is_none()).then(|| id.to_owned())
    }

    /// Makes a read token (shown once; stored as its SHA-256).
    ///
    /// # Errors
    /// `BadRequest` `bad_label` for a label over [`MAX_LABEL_BYTES`] or with
    /// a control character; storage failures.
    pub fn create_read_token<R: CryptoRngCore + ?Sized>(
        &self,
        label: &str,
        now: UnixMillis,
        rng: &mut R,
    ) -> Result<Secret, WitnessError> {
        if label.len() > MAX_LABEL_BYTES || label.chars().any(char::is_control) {
            return Err(WitnessError::BadRequest {
                code: "bad_label",
                message: format!(
                    "a label is at most {MAX_LABEL_BYTES} bytes without control characters"
                ),
            });
        }
        let _w = self.writer();
        let token = Secret::generate(READ_TOKEN_PREFIX, rng);
        let row = ReadTokenRow {
            label: label.to_owned(),
            sha256: hex::encode(token.sha256),
            created: now,
            revoked: None,
        };
        self.put(READ_TOKENS, &token.id, &row)?;
        self.cache_mut().read_tokens.insert(token.id.clone(), row);
        Ok(token)
    }

    /// The read tokens (hashes withheld), by id.
    #[must_use]
    pub fn read_tokens(&self) -> Vec<(String, ReadTokenRow)> {
        self.read()
            .read_tokens
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Revokes a read token by its public id; from the next request on it
    /// reads nothing. Revoking twice keeps the first time.
    ///
    /// # Errors
    /// [`WitnessError::NotFound`] for an unknown id.
    pub fn revoke_read_token(&self, id: &str, now: UnixMillis) -> Result<(), WitnessError> {
        let _w = self.writer();
        let mut row = self
            .read()
            .read_tokens
            .get(id)
            .cloned()
            .ok_or_else(|| WitnessError::NotFound(format!("no read token with id {id}")))?;
        row.revoked.get_or_insert(now);
        self.put(READ_TOKENS, id, &row)?;
        self.cache_mut().read_tokens.insert(id.to_owned(), row);
        Ok(())
    }

    /// Whether `token` is the admin token (constant-time comparison).
    #[must_use]
    pub fn is_admin(&self, token: &str) -> bool {
        let presented = sha256(token);
        match self.read().admin_sha256 {
            Some(stored) => presented.ct_eq(&stored).into(),
            None => false,
        }
    }

    /// The projects, by name.
    #[must_use]
    pub fn projects(&self) -> Vec<(String, ProjectRow)> {
        self.read()
            .projects
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Creates a project and its first API key.
    ///
    /// # Errors
    /// [`WitnessError::Exists`] when the name is taken; `BadRequest` for a bad name.
    pub fn create_project<R: CryptoRngCore + ?Sized>(
        &self,
        name: &str,
        now: UnixMillis,
        rng: &mut R,
    ) -> Result<Secret, WitnessError> {
        check_project_name(name)?;
        let _w = self.writer();
        if self.read().projects.contains_key(name) {
            return Err(WitnessError::Exists {
                what: "project",
                name: name.to_owned(),
            });
        }
        let project = ProjectRow { created: now };
        let (key, row) = self.new_key_row(name, now, rng);
        let tx = self.db.begin_write().map_err(storage)?;
        {
            tx.open_table(PROJECTS)
                .map_err(storage)?
                .insert(name, encode(&project)?.as_slice())
                .map_err(storage)?;
            tx.open_table(API_KEYS)
                .map_err(storage)?
                .insert(key.id.as_str(), encode(&row)?.as_slice())
                .map_err(storage)?;
        }
        tx.commit().map_err(storage)?;
        let mut c = self.cache_mut();
        c.projects.insert(name.to_owned(), project);
        c.api_keys.insert(key.id.clone(), row);
        Ok(key)
    }

    fn new_key_row<R: CryptoRngCore + ?Sized>(
        &self,
        project: &str,
        now: UnixMillis,
        rng: &mut R,
    ) -> (Secret, ApiKeyRow) {
        let key = Secret::generate(API_KEY_PREFIX, rng);
        let row = ApiKeyRow {
            project: project.to_owned(),
            sha256: hex::encode(key.sha256),
            created: now,
            revoked: None,
        };
        (key, row)
    }

    /// Makes another API key for an existing project.
    ///
    /// # Errors
    /// [`WitnessError::NotFound`] for an unknown project.
    pub fn new_api_key<R: CryptoRngCore + ?Sized>(
        &self,
        project: &str,
        now: UnixMillis,
        rng: &mut R,
    ) -> Result<Secret, WitnessError> {
        let _w = self.writer();
        if !self.read().projects.contains_key(project) {
            return Err(WitnessError::NotFound(format!(
                "no project named {project}"
            )));
        }
        let (key, row) = self.new_key_row(project, now, rng);
        self.put(API_KEYS, &key.id, &row)?;
        self.cache_mut().api_keys.insert(key.id.clone(), row);
        Ok(key)
    }

    /// Revokes an API key by its public id.
    ///
    /// # Errors
    /// [`WitnessError::NotFound`] for an unknown id.
    pub fn revoke_api_key(&self, id: &str, now: UnixMillis) -> Result<(), WitnessError> {
        let _w = self.writer();
        let mut row = self
            .read()
            .api_keys
            .get(id)
            .cloned()
            .ok_or_else(|| WitnessError::NotFound(format!("no API key with id {id}")))?;
        row.revoked.get_or_insert(now);
        self.put(API_KEYS, id, &row)?;
        self.cache_mut().api_keys.insert(id.to_owned(), row);
        Ok(())
    }

    fn put<T: Serialize>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        key: &str,
        row: &T,
    ) -> Result<(), RegistryError> {
        let tx = self.db.begin_write().map_err(storage)?;
        tx.open_table(table)
            .map_err(storage)?
            .insert(key, encode(row)?.as_slice())
            .map_err(storage)?;
        tx.commit().map_err(storage)
    }

    /// The agent's registration, if any (from memory).
    #[must_use]
    pub fn agent(&self, agent: &AgentName) -> Option<AgentRow> {
        self.read().agents.get(agent).cloned()
    }

    /// Runs `f` on the agent's registration without cloning it.
    pub fn with_agent<T>(&self, agent: &AgentName, f: impl FnOnce(Option<&AgentRow>) -> T) -> T {
        f(self.read().agents.get(agent))
    }

    /// The agents of `project`, by name.
    #[must_use]
    pub fn agents_of(&self, project: &str) -> Vec<(AgentName, AgentRow)> {
        self.read()
            .agents
            .iter()
            .filter(|(_, r)| r.project == project)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Whether `agent` may be registered by `project`: `Exists` when the
    /// project already holds it, `NameUnavailable` when another project
    /// does (the same answer as for a name the log already has a chain
    /// for, docs/api.md "Agents and their keys").
    ///
    /// # Errors
    /// As above.
    pub fn check_name_free(&self, project: &str, agent: &AgentName) -> Result<(), WitnessError> {
        match self.read().agents.get(agent) {
            None => Ok(()),
            Some(row) if row.project == project => Err(WitnessError::Exists {
                what: "agent",
                name: agent.to_string(),
            }),
            Some(_) => Err(WitnessError::NameUnavailable {
                agent: agent.clone(),
            }),
        }
    }

    /// Registers `agent` in `project` with its first key, valid from
    /// `not_before`. The routes go through `key_changes::add_agent`, which
    /// also refuses a name the log already holds a chain for.
    ///
    /// # Errors
    /// As [`Registry::check_name_free`]. (A [`PublicKey`] is never weak:
    /// parsing refuses small-order points and non-canonical encodings.)
    pub fn add_agent(
        &self,
        project: &str,
        agent: &AgentName,
        public_key: PublicKey,
        not_before: UnixMillis,
    ) -> Result<AgentRow, WitnessError> {
        let _w = self.writer();
        self.check_name_free(project, agent)?;
        let row = AgentRow {
            project: project.to_owned(),
            keys: vec![AgentKey {
                key_id: public_key.key_id(),
                public_key,
                not_before,
                not_after: None,
            }],
        };
        self.put(AGENTS, agent.as_str(), &row)?;
        self.cache_mut().agents.insert(agent.clone(), row.clone());
        Ok(row)
    }

    /// The agent's registration when it belongs to `project`.
    ///
    /// # Errors
    /// [`WitnessError::AgentNotAllowed`] otherwise, also for a name that is
    /// not registered at all (so names in other projects are not revealed).
    pub fn owned_agent(&self, project: &str, agent: &AgentName) -> Result<AgentRow, WitnessError> {
        match self.read().agents.get(agent) {
            Some(row) if row.project == project => Ok(row.clone()),
            _ => Err(WitnessError::AgentNotAllowed {
                agent: agent.clone(),
            }),
        }
    }

    /// Rotates `agent`'s key at `at`: every key still valid at `at` ends
    /// there, and `public_key` is valid from `at` on. The caller has checked
    /// `at` against the agent's admitted records (`key_changes`).
    ///
    /// # Errors
    /// [`WitnessError::AgentNotAllowed`] when the agent is not the project's;
    /// [`WitnessError::UnusableKey`] for a key no signature can verify under;
    /// [`WitnessError::Exists`] when the key is already listed;
    /// `BadRequest` when `at` is before the current key's start or the agent
    /// has too many keys.
    pub(crate) fn rotate_key(
        &self,
        project: &str,
        agent: &AgentName,
        public_key: PublicKey,
        at: UnixMillis,
    ) -> Result<AgentRow, WitnessError> {
        let _w = self.writer();
        let mut row = self.owned_agent(project, agent)?;
        if row.key(&public_key.key_id()).is_some() {
            return Err(WitnessError::Exists {
                what: "key",
                name: public_key.key_id().to_string(),
            });
        }
        if row.keys.len() >= MAX_KEYS_PER_AGENT {
            return Err(WitnessError::BadRequest {
                code: "too_many_keys",
                message: format!("agent {agent} already has {MAX_KEYS_PER_AGENT} keys, the most agent-keys.json may list"),
            });
        }
        end_keys_at(&mut row, at)?;
        row.keys.push(AgentKey {
            key_id: public_key.key_id(),
            public_key,
            not_before: at,
            not_after: None,
        });
        self.put(AGENTS, agent.as_str(), &row)?;
        self.cache_mut().agents.insert(agent.clone(), row.clone());
        Ok(row)
    }

    /// Retires `agent` at `at`: every key still valid at `at` ends there, so
    /// no record timed `at` or later is admitted. The caller has checked
    /// `at` against the agent's admitted records (`key_changes`).
    ///
    /// # Errors
    /// As [`Registry::rotate_key`].
    pub(crate) fn retire_agent(
        &self,
        project: &str,
        agent: &AgentName,
        at: UnixMillis,
    ) -> Result<AgentRow, WitnessError> {
        let _w = self.writer();
        let mut row = self.owned_agent(project, agent)?;
        end_keys_at(&mut row, at)?;
        self.put(AGENTS, agent.as_str(), &row)?;
        self.cache_mut().agents.insert(agent.clone(), row.clone());
        Ok(row)
    }
}

/// Whether `presented` equals the stored hex SHA-256, in constant time.
fn hash_matches(presented: &[u8; 32], stored_hex: &str) -> bool {
    let mut stored = [0u8; 32];
    hex::decode_to_slice(stored_hex, &mut stored).is_ok() && bool::from(presented.ct_eq(&stored))
}

/// Ends every key valid at `at` there; refuses an `at` before a key's start
/// (that would leave a key whose range is empty or reversed).
fn end_keys_at(row: &mut AgentRow, at: UnixMillis) -> Result<(), WitnessError> {
    for k in &mut row.keys {
        if k.not_after.is_none_or(|end| end > at) {
            if at < k.not_before {
                return Err(WitnessError::BadRequest {
                    code: "bad_time",
                    message: format!(
                        "{at} is before key {} became valid ({})",
                        k.key_id, k.not_before
                    ),
                });
            }
            k.not_after = Some(at);
        }
    }
    Ok(())
}

/// Project names: 1–64 bytes of `a-z 0-9 . _ -`, starting with a letter or digit.
///
/// # Errors
/// `BadRequest` naming the rule.
pub fn check_project_name(name: &str) -> Result<(), WitnessError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        });
    if ok {
        Ok(())
    } else {
        Err(WitnessError::BadRequest {
            code: "bad_name",
            message:
                "a project name is 1 to 64 bytes of a-z 0-9 . _ -, starting with a letter or digit"
                    .into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::OsRng;
    use tally_schemas::SecretKey;

    fn reg() -> (tempfile::TempDir, Registry) {
        let dir = tempfile::tempdir().unwrap();
        let r = Registry::open(&dir.path().join("w.redb")).unwrap();
        (dir, r)
    }

    #[test]
    fn keys_are_shown_once_stored_hashed_and_checked() {
        let (dir, r) = reg();
        let first = r
            .first_start(UnixMillis::new(1), &mut OsRng)
            .unwrap()
            .unwrap();
        assert!(r
            .first_start(UnixMillis::new(2), &mut OsRng)
            .unwrap()
            .is_none());
        let p = r.authenticate(&first.api_key.token).unwrap();
        assert_eq!(p.project, DEFAULT_PROJECT);
        assert!(r.is_admin(&first.admin_token.token));
        assert!(!r.is_admin(&first.api_key.token));
        // One flipped character of the secret is refused.
        let mut wrong = first.api_key.token.clone();
        let last = wrong.pop().unwrap();
        wrong.push(if last == '0' { '1' } else { '0' });
        assert!(r.authenticate(&wrong).is_none());
        assert!(r.authenticate("").is_none());
        assert!(r.authenticate("tally_").is_none());
        // The plain key is nowhere in the file.
        drop(r);
        let bytes = std::fs::read(dir.path().join("w.redb")).unwrap();
        let secret_part = first.api_key.token.rsplit('_').next().unwrap();
        assert!(!bytes
            .windows(secret_part.len())
            .any(|w| w == secret_part.as_bytes()));
        // And it survives a reopen.
        let r = Registry::open(&dir.path().join("w.redb")).unwrap();
        assert!(r.authenticate(&first.api_key.token).is_some());
        r.revoke_api_key(first.api_key.id(), UnixMillis::new(3))
            .unwrap();
        assert!(r.authenticate(&first.api_key.token).is_none());
    }

    #[test]
    fn read_tokens_are_shown_once_stored_hashed_checked_and_revoked() {
        let (dir, r) = reg();
        let first = r
            .first_start(UnixMillis::new(1), &mut OsRng)
            .unwrap()
            .unwrap();
        let t = r
            .create_read_token("monitor", UnixMillis::new(5), &mut OsRng)
            .unwrap();
        assert!(t.token.starts_with(READ_TOKEN_PREFIX));
        assert_eq!(r.authenticate_reader(&t.token).as_deref(), Some(t.id()));
        // Each kind of token is accepted only where it is expected.
        assert!(r.authenticate(&t.token).is_none());
        assert!(!r.is_admin(&t.token));
        assert!(r.authenticate_reader(&first.api_key.token).is_none());
        assert!(r.authenticate_reader(&first.admin_token.token).is_none());
        let mut wrong = t.token.clone();
        let last = wrong.pop().unwrap();
        wrong.push(if last == '0' { '1' } else { '0' });
        assert!(r.authenticate_reader(&wrong).is_none());
        assert!(matches!(
            r.create_read_token("a\u{7}b", UnixMillis::new(5), &mut OsRng),
            Err(WitnessError::BadRequest {
                code: "bad_label",
                ..
            })
        ));
        drop(r);
        let bytes = std::fs::read(dir.path().join("w.redb")).unwrap();
        let secret = t.token.rsplit('_').next().unwrap();
        assert!(!bytes.windows(secret.len()).any(|w| w == secret.as_bytes()));
        let r = Registry::open(&dir.path().join("w.redb")).unwrap();
        assert!(r.authenticate_reader(&t.token).is_some());
        r.revoke_read_token(t.id(), UnixMillis::new(9)).unwrap();
        r.revoke_read_token(t.id(), UnixMillis::new(10)).unwrap();
        assert!(r.authenticate_reader(&t.token).is_none());
        let list = r.read_tokens();
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].1.label, "monitor");
        assert_eq!(list[0].1.revoked, Some(UnixMillis::new(9)));
        assert!(matches!(
            r.revoke_read_token("0000000000000000", UnixMillis::new(9)),
            Err(WitnessError::NotFound(_))
        ));
    }

    #[test]
    fn a_name_is_told_apart_only_for_its_own_project_and_weak_keys_are_refused() {
        let (_d, r) = reg();
        r.first_start(UnixMillis::new(0), &mut OsRng).unwrap();
        let a = AgentName::new("bot").unwrap();
        let k = SecretKey::generate(&mut OsRng).public_key();
        r.add_agent("default", &a, k, UnixMillis::new(0)).unwrap();
        assert!(matches!(
            r.add_agent("default", &a, k, UnixMillis::new(0)),
            Err(WitnessError::Exists { what: "agent", .. })
        ));
        assert!(matches!(
            r.add_agent("other", &a, k, UnixMillis::new(0)),
            Err(WitnessError::NameUnavailable { .. })
        ));
        let mut identity = [0u8; 32];
        identity[0] = 1;
        // A weak key cannot reach the registry: parsing refuses it.
        assert!(PublicKey::from_bytes(&identity).is_err());
    }

    #[test]
    fn rotate_and_retire_set_validity_ranges() {
        let (_d, r) = reg();
        r.first_start(UnixMillis::new(0), &mut OsRng).unwrap();
        let a = AgentName::new("bot").unwrap();
        let k1 = SecretKey::generate(&mut OsRng).public_key();
        let k2 = SecretKey::generate(&mut OsRng).public_key();
        r.add_agent("default", &a, k1, UnixMillis::new(100))
            .unwrap();
        assert!(matches!(
            r.add_agent("default", &a, k1, UnixMillis::new(100)),
            Err(WitnessError::Exists { .. })
        ));
        assert!(matches!(
            r.rotate_key("other", &a, k2, UnixMillis::new(200)),
            Err(WitnessError::AgentNotAllowed { .. })
        ));
        assert!(matches!(
            r.rotate_key("default", &a, k2, UnixMillis::new(50)),
            Err(WitnessError::BadRequest { .. })
        ));
        let row = r
            .rotate_key("default", &a, k2, UnixMillis::new(200))
            .unwrap();
        assert_eq!(row.keys[0].not_after, Some(UnixMillis::new(200)));
        assert_eq!(row.keys[1].not_before, UnixMillis::new(200));
        assert!(row.keys[1].not_after.is_none());
        let row = r.retire_agent("default", &a, UnixMillis::new(300)).unwrap();
        assert_eq!(row.keys[0].not_after, Some(UnixMillis::new(200)));
        assert_eq!(row.keys[1].not_after, Some(UnixMillis::new(300)));
        assert!(!row.keys[1].active_at(UnixMillis::new(300)));
        assert!(row.keys[1].active_at(UnixMillis::new(299)));
    }
}
