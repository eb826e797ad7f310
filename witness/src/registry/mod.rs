//! The witness's own tables: projects, API keys, the admin token and the
//! agents registered to each project with their public keys and validity
//! ranges (docs/operations.md "The data folder"; the keys end up in
//! agent-keys.json, docs/protocol.md §9.3).
//!
//! Stored in a redb file of its own (`witness.redb`, next to the log's
//! `log.redb`), because the log engine owns its file; or, with `--store
//! postgres://…`, in the log's PostgreSQL database, shared by every front
//! (module `kv`; docs/storage.md, "The registry and the console on
//! PostgreSQL"). Rows are JSON values under string keys, so that an
//! operator can read them with any redb tool or `psql`. Everything is also
//! held in memory: admission reads only the cache, and a write goes to the
//! store (durably) before the cache changes. Every write expects the rows
//! it read to be unchanged, so of conflicting writes through two fronts the
//! database lets one through; a front reloads its cache within
//! [`crate::kv::WATCH_PERIOD`] of another front's write.
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
use std::sync::Arc;

use rand_core::CryptoRngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tally_schemas::limits::MAX_KEYS_PER_AGENT;
use tally_schemas::pack::AgentKey;
use tally_schemas::{AgentName, PublicKey, UnixMillis};

use tally_log::KeyVersion;

use crate::cached_table::{CachedTable, Rows, Watch};
use crate::error::{RegistryError, WitnessError};
use crate::kv::{Expect, KvError, KvOp, KvStore, Snapshot};

/// `projects`: project name → JSON [`ProjectRow`].
const PROJECTS: &str = "projects";
/// `api_keys`: key id (16 hex) → JSON [`ApiKeyRow`].
const API_KEYS: &str = "api_keys";
/// `agents`: agent name → JSON [`AgentRow`].
const AGENTS: &str = "agents";
/// `meta`: `admin_token_sha256` → 32 bytes; `first_start` → JSON
/// [`FirstStartPlace`].
const META: &str = "meta";
/// `read_tokens`: token id (16 hex) → JSON [`ReadTokenRow`].
const READ_TOKENS: &str = "read_tokens";
/// The registry's tables (docs/storage.md).
pub const TABLES: &[&str] = &[PROJECTS, API_KEYS, AGENTS, META, READ_TOKENS];
/// The meta row of the admin token's hash.
const ADMIN_TOKEN_ROW: &str = "admin_token_sha256";
/// The meta row of [`FirstStartPlace`].
const FIRST_START_ROW: &str = "first_start";

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

/// A change of an agent's keys (made through `key_changes`, which
/// checks it against the log first).
#[derive(Debug, Clone, Copy)]
pub(crate) enum KeyChange {
    /// A new key from `at` on; every key valid at `at` ends there.
    Rotate(PublicKey),
    /// Every key valid at `at` ends there.
    Retire,
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

/// Where and when the registry's first start happened (meta row
/// `first_start`), so that another front on the same PostgreSQL database
/// can say where the default project's API key was shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FirstStartPlace {
    /// The machine (its host name).
    pub host: String,
    /// The data folder of the `tally serve` that made it (its admin.token).
    pub data_dir: String,
    /// When.
    pub at: UnixMillis,
    /// The public id of the API key it made.
    pub api_key_id: String,
    /// Whether the key was shown (else the start did not finish, and a
    /// front on a shared database makes them anew).
    pub shown: bool,
}

#[derive(Default)]
struct Cache {
    projects: BTreeMap<String, ProjectRow>,
    api_keys: HashMap<String, ApiKeyRow>,
    agents: BTreeMap<AgentName, AgentRow>,
    admin_sha256: Option<[u8; 32]>,
    first_start: Option<FirstStartPlace>,
    read_tokens: BTreeMap<String, ReadTokenRow>,
    /// Every row's stored bytes, which a write expects unchanged.
    raw: HashMap<(&'static str, String), Vec<u8>>,
    /// On PostgreSQL, the key version of each agent whose keys changed
    /// (others are at version 0), as read with `agents`: admission notes it
    /// beside the ranges it checked (docs/protocol.md §4.1).
    key_versions: HashMap<AgentName, KeyVersion>,
}

/// The table name as the static str the ops carry.
fn table_name(t: &str) -> Option<&'static str> {
    TABLES.iter().copied().find(|n| *n == t)
}

impl Rows for Cache {
    type Error = RegistryError;

    fn from_snapshot(snapshot: Snapshot) -> Result<Self, RegistryError> {
        let mut c = Self::default();
        for (table, key, value) in snapshot.rows {
            let Some(table) = table_name(&table) else {
                continue;
            };
            c.set(table, &key, Some(&value))?;
        }
        for (agent, version) in snapshot.key_versions {
            // A fence row of a name that is no agent's (the log's own).
            if let Ok(agent) = AgentName::new(&agent) {
                c.key_versions.insert(agent, version);
            }
        }
        Ok(c)
    }

    fn set(
        &mut self,
        table: &'static str,
        key: &str,
        value: Option<&[u8]>,
    ) -> Result<(), RegistryError> {
        Cache::set(self, table, key, value)
    }
}

impl Cache {
    /// What a write of `table/key` expects: the bytes read, or no row.
    fn expect(&self, table: &'static str, key: &str) -> Expect {
        match self.raw.get(&(table, key.to_owned())) {
            Some(v) => Expect::Equals(v.clone()),
            None => Expect::Absent,
        }
    }

    /// Sets (or with `None` removes) one row, decoded.
    fn set(
        &mut self,
        table: &'static str,
        key: &str,
        value: Option<&[u8]>,
    ) -> Result<(), RegistryError> {
        let k = key.to_owned();
        match (table, value) {
            (PROJECTS, Some(v)) => {
                self.projects.insert(k.clone(), decode(table, key, v)?);
            }
            (PROJECTS, None) => {
                self.projects.remove(key);
            }
            (API_KEYS, Some(v)) => {
                self.api_keys.insert(k.clone(), decode(table, key, v)?);
            }
            (API_KEYS, None) => {
                self.api_keys.remove(key);
            }
            (READ_TOKENS, Some(v)) => {
                self.read_tokens.insert(k.clone(), decode(table, key, v)?);
            }
            (READ_TOKENS, None) => {
                self.read_tokens.remove(key);
            }
            (AGENTS, v) => {
                let name = AgentName::new(key).map_err(|e| RegistryError::Corrupt {
                    table: AGENTS,
                    key: k.clone(),
                    reason: e.to_string(),
                })?;
                match v {
                    Some(v) => {
                        self.agents.insert(name, decode(table, key, v)?);
                    }
                    None => {
                        self.agents.remove(&name);
                    }
                }
            }
            (META, v) if key == ADMIN_TOKEN_ROW => {
                self.admin_sha256 = v
                    .map(|v| {
                        v.try_into().map_err(|_| RegistryError::Corrupt {
                            table: META,
                            key: k.clone(),
                            reason: "not 32 bytes".into(),
                        })
                    })
                    .transpose()?;
            }
            (META, v) if key == FIRST_START_ROW => {
                self.first_start = v.map(|v| decode(table, key, v)).transpose()?;
            }
            // Rows of meta this build does not know, or of other tables.
            _ => {}
        }
        match value {
            Some(v) => self.raw.insert((table, k), v.to_vec()),
            None => self.raw.remove(&(table, k)),
        };
        Ok(())
    }
}

/// Whether a write that does not hold its expectation is tried again on a
/// fresh view (its rules then decide, e.g. `exists`), or refused with
/// `concurrent_change`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnConflict {
    Retry,
    Refuse,
}

/// The registry: projects, API keys, agents. See the module docs.
pub struct Registry {
    table: Arc<CachedTable<Cache>>,
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

/// A write of `row` at `table/key`, expecting `expect`.
fn put<T: Serialize>(
    table: &'static str,
    key: &str,
    row: &T,
    expect: Expect,
) -> Result<KvOp, RegistryError> {
    Ok(KvOp {
        table,
        key: key.to_owned(),
        value: Some(encode(row)?),
        expect,
    })
}

impl Registry {
    /// Opens (or creates) the registry file and loads it into memory.
    ///
    /// # Errors
    /// [`RegistryError`] when the file cannot be opened or a row is corrupt.
    pub fn open(path: &Path) -> Result<Arc<Self>, RegistryError> {
        Self::open_on(KvStore::open_redb(path, TABLES)?)
    }

    /// Opens the registry in the PostgreSQL database at `url` (the log's
    /// database; docs/operations.md "Running on PostgreSQL"), applying the
    /// migrations it lacks, and watches it for writes of other fronts.
    ///
    /// # Errors
    /// [`RegistryError`] when the database cannot be reached or migrated,
    /// or a row is corrupt.
    pub fn open_postgres(url: &str) -> Result<Arc<Self>, RegistryError> {
        Self::open_on(KvStore::open_postgres(url, "registry", TABLES)?)
    }

    /// The registry over `kv`, loaded into memory.
    ///
    /// # Errors
    /// [`RegistryError`] when `kv` fails or a row is corrupt.
    pub fn open_on(kv: KvStore) -> Result<Arc<Self>, RegistryError> {
        let watch = Watch {
            thread: "tally-registry-watch",
            period: reload_period(),
            what: "the registry",
        };
        Ok(Arc::new(Self {
            table: CachedTable::open(kv, watch)?,
        }))
    }

    /// Whether other processes share the registry (PostgreSQL).
    #[must_use]
    pub fn is_shared(&self) -> bool {
        self.table.is_shared()
    }

    /// Reloads the memory copy when another process wrote since it was
    /// loaded (one cheap query otherwise). The watcher calls it every
    /// [`crate::kv::WATCH_PERIOD`].
    ///
    /// # Errors
    /// [`RegistryError`] when the database fails or a row is corrupt (the
    /// memory copy is then kept as it was).
    pub fn refresh_if_changed(&self) -> Result<(), RegistryError> {
        self.table.refresh_if_changed()
    }

    fn kv(&self) -> &KvStore {
        self.table.kv()
    }

    /// Reloads everything; the caller holds the write lock.
    fn reload(&self) -> Result<(), RegistryError> {
        self.table.reload()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Cache> {
        self.table.read()
    }

    fn cache_mut(&self) -> std::sync::RwLockWriteGuard<'_, Cache> {
        self.table.rows_mut()
    }

    fn writer(&self) -> std::sync::MutexGuard<'_, ()> {
        self.table.writer()
    }

    /// The one write path ([`CachedTable::write`]): `plan` decides from the
    /// memory copy; when another process changed one of the rows first,
    /// the memory copy is reloaded and, with [`OnConflict::Retry`], `plan`
    /// decides again (five tries in all), else the write is refused with
    /// `concurrent_change`.
    fn write<T>(
        &self,
        on_conflict: OnConflict,
        what: impl Fn() -> String,
        plan: impl FnMut(&Cache) -> Result<(Vec<KvOp>, T), WitnessError>,
    ) -> Result<T, WitnessError> {
        let retries = match on_conflict {
            OnConflict::Retry => 4,
            OnConflict::Refuse => 0,
        };
        self.table
            .write(retries, plan, |_| WitnessError::ConcurrentChange {
                what: what(),
            })
    }

    /// The memory copy takes rows just written at `generation`.
    fn took(&self, ops: &[KvOp], generation: i64) -> Result<(), RegistryError> {
        self.table.took(ops, generation)
    }
}

/// The environment variable that sets how often a front looks for other
/// fronts' registry writes, in milliseconds (docs/operations.md, "Running
/// on PostgreSQL"): for tests that need a front to stay behind, and for
/// operators who trade that delay for fewer queries. Key changes do not
/// depend on it (docs/protocol.md §4.1).
pub const RELOAD_ENV: &str = "TALLY_REGISTRY_RELOAD_MS";

/// [`crate::kv::WATCH_PERIOD`], or [`RELOAD_ENV`] when set to a whole
/// number of milliseconds (at least 10).
fn reload_period() -> std::time::Duration {
    match std::env::var(RELOAD_ENV).map(|v| v.trim().parse::<u64>()) {
        Ok(Ok(ms)) => std::time::Duration::from_millis(ms.max(10)),
        Ok(Err(_)) => {
            tracing::warn!("{RELOAD_ENV} is not a whole number of milliseconds; using the default");
            crate::kv::WATCH_PERIOD
        }
        Err(_) => crate::kv::WATCH_PERIOD,
    }
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

mod agents;
mod credentials;
#[cfg(test)]
mod tests;
