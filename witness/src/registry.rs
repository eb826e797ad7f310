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
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use rand_core::CryptoRngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tally_schemas::limits::MAX_KEYS_PER_AGENT;
use tally_schemas::pack::AgentKey;
use tally_schemas::{AgentName, PublicKey, UnixMillis};

use tally_log::KeyVersion;

use crate::error::{RegistryError, WitnessError};
use crate::key_changes::KeyChange;
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

impl Cache {
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
    kv: KvStore,
    cache: RwLock<Cache>,
    /// Serialises this process's writes (and reloads); between processes
    /// the database's expectations decide.
    write: Mutex<()>,
    /// The generation the cache was loaded at (PostgreSQL).
    generation: AtomicI64,
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
        let snapshot = kv.snapshot()?;
        let generation = snapshot.generation;
        let shared = kv.is_shared();
        let registry = Arc::new(Self {
            kv,
            cache: RwLock::new(Cache::from_snapshot(snapshot)?),
            write: Mutex::new(()),
            generation: AtomicI64::new(generation),
        });
        if shared {
            crate::kv::spawn_watcher_every(
                "tally-registry-watch",
                reload_period(),
                Arc::downgrade(&registry),
                |r: &Self| {
                    if let Err(e) = r.refresh_if_changed() {
                        tracing::warn!("reloading the registry: {e}");
                    }
                },
            );
        }
        Ok(registry)
    }

    /// Whether other processes share the registry (PostgreSQL).
    #[must_use]
    pub fn is_shared(&self) -> bool {
        self.kv.is_shared()
    }

    /// Reloads the memory copy when another process wrote since it was
    /// loaded (one cheap query otherwise). The watcher calls it every
    /// [`crate::kv::WATCH_PERIOD`].
    ///
    /// # Errors
    /// [`RegistryError`] when the database fails or a row is corrupt (the
    /// memory copy is then kept as it was).
    pub fn refresh_if_changed(&self) -> Result<(), RegistryError> {
        if self.kv.generation()? != self.generation.load(Ordering::SeqCst) {
            let _w = self.writer();
            self.reload()?;
        }
        Ok(())
    }

    /// Reloads everything; the caller holds the write lock.
    fn reload(&self) -> Result<(), RegistryError> {
        let snapshot = self.kv.snapshot()?;
        let generation = snapshot.generation;
        let cache = Cache::from_snapshot(snapshot)?;
        *self.cache_mut() = cache;
        self.generation.store(generation, Ordering::SeqCst);
        Ok(())
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

    /// The one write path: `plan` decides, from the memory copy, the rows
    /// to write (each expecting the value it read) or refuses; the store
    /// applies them in one transaction; then the memory copy takes them.
    /// When another process changed one of the rows first, the memory copy
    /// is reloaded and, with [`OnConflict::Retry`], `plan` decides again.
    fn write<T>(
        &self,
        on_conflict: OnConflict,
        what: impl Fn() -> String,
        mut plan: impl FnMut(&Cache) -> Result<(Vec<KvOp>, T), WitnessError>,
    ) -> Result<T, WitnessError> {
        let _w = self.writer();
        let mut attempts = 0;
        loop {
            let (ops, out) = plan(&self.read())?;
            if ops.is_empty() {
                // Nothing to change (e.g. revoked already): no write, so
                // no other front reloads for it.
                return Ok(out);
            }
            match self.kv.apply(&ops) {
                Ok(generation) => {
                    self.took(&ops, generation)?;
                    return Ok(out);
                }
                Err(KvError::Conflict(_)) => {
                    self.reload()?;
                    attempts += 1;
                    if on_conflict == OnConflict::Refuse || attempts >= 5 {
                        return Err(WitnessError::ConcurrentChange { what: what() });
                    }
                }
                Err(e) => return Err(RegistryError::from(e).into()),
            }
        }
    }

    /// The memory copy takes rows just written at `generation`.
    fn took(&self, ops: &[KvOp], generation: i64) -> Result<(), RegistryError> {
        let mut c = self.cache_mut();
        for op in ops {
            c.set(op.table, &op.key, op.value.as_deref())?;
        }
        // Up to date only if nobody else wrote in between; else the
        // watcher reloads.
        let _ = self.generation.compare_exchange(
            generation - 1,
            generation,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
        Ok(())
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
        self.first_start_in(now, rng, None)
    }

    /// [`Registry::first_start`], recording the data folder it happens in
    /// (see [`Registry::first_start_place`]). On a shared registry one
    /// front at a time runs it (an advisory lock held until
    /// [`Registry::first_start_shown`]), and a first start whose key was
    /// never shown (the front died) is made anew: nobody can hold its key.
    ///
    /// # Errors
    /// [`RegistryError`] when the write fails.
    pub fn first_start_in<R: CryptoRngCore + ?Sized>(
        &self,
        now: UnixMillis,
        rng: &mut R,
        data_dir: Option<&Path>,
    ) -> Result<Option<FirstStart>, RegistryError> {
        self.kv.lock_first_start()?;
        let made = self.first_start_locked(now, rng, data_dir);
        if !matches!(made, Ok(Some(_))) {
            self.kv.unlock_first_start();
        }
        made
    }

    fn first_start_locked<R: CryptoRngCore + ?Sized>(
        &self,
        now: UnixMillis,
        rng: &mut R,
        data_dir: Option<&Path>,
    ) -> Result<Option<FirstStart>, RegistryError> {
        let _w = self.writer();
        self.reload()?;
        let c = self.read();
        let unfinished = match &c.first_start {
            Some(p) if !p.shown && self.kv.is_shared() => Some(p.clone()),
            _ => None,
        };
        if unfinished.is_none() && !c.projects.is_empty() {
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
        let place = FirstStartPlace {
            host: host_name(),
            data_dir: data_dir
                .map(|d| d.display().to_string())
                .unwrap_or_default(),
            at: now,
            api_key_id: api_key.id.clone(),
            shown: false,
        };
        let mut ops = Vec::new();
        if let Some(old) = &unfinished {
            ops.push(KvOp {
                table: API_KEYS,
                key: old.api_key_id.clone(),
                value: None,
                expect: Expect::Any,
            });
        }
        let project_expect = if unfinished.is_some() {
            c.expect(PROJECTS, DEFAULT_PROJECT)
        } else {
            Expect::Absent
        };
        ops.push(put(PROJECTS, DEFAULT_PROJECT, &project, project_expect)?);
        ops.push(put(API_KEYS, &api_key.id, &key_row, Expect::Absent)?);
        ops.push(KvOp {
            table: META,
            key: ADMIN_TOKEN_ROW.into(),
            value: Some(admin_token.sha256.to_vec()),
            expect: c.expect(META, ADMIN_TOKEN_ROW),
        });
        ops.push(put(
            META,
            FIRST_START_ROW,
            &place,
            c.expect(META, FIRST_START_ROW),
        )?);
        drop(c);
        match self.kv.apply(&ops) {
            Ok(generation) => self.took(&ops, generation)?,
            // Another front made them first (it could not have held the lock).
            Err(KvError::Conflict(_)) => {
                self.reload()?;
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        }
        Ok(Some(FirstStart {
            api_key,
            admin_token,
        }))
    }

    /// The first start's key was shown: records it (so that no other front
    /// makes the default project anew) and releases the first-start lock.
    ///
    /// # Errors
    /// [`RegistryError`] when the write fails.
    pub fn first_start_shown(&self) -> Result<(), RegistryError> {
        let done = self.write(
            OnConflict::Refuse,
            || "the first start".into(),
            |c| match &c.first_start {
                Some(p) if !p.shown => {
                    let place = FirstStartPlace {
                        shown: true,
                        ..p.clone()
                    };
                    Ok((
                        vec![put(
                            META,
                            FIRST_START_ROW,
                            &place,
                            c.expect(META, FIRST_START_ROW),
                        )?],
                        (),
                    ))
                }
                _ => Ok((Vec::new(), ())),
            },
        );
        self.kv.unlock_first_start();
        done.map_err(|e| RegistryError::Storage(e.to_string()))
    }

    /// Where and when the first start that made the default project ran,
    /// if this build recorded it.
    #[must_use]
    pub fn first_start_place(&self) -> Option<FirstStartPlace> {
        self.read().first_start.clone()
    }

    /// The project and key id of an API key, compared in constant time
    /// against the stored hash. `None` for an unknown, malformed or revoked key.
    #[must_use]
    pub fn authenticate(&self, token: &str) -> Option<Principal> {
        let presented = sha256(token);
        let id = key_id_of(token, API_KEY_PREFIX)?;
        self.authenticate_hash(id, &presented)
    }

    /// [`Self::authenticate`] from what a console session keeps instead of
    /// the key: its public id and its SHA-256 (compared in constant time).
    #[must_use]
    pub fn authenticate_hash(&self, key_id: &str, key_sha256: &[u8; 32]) -> Option<Principal> {
        let cache = self.read();
        let row = cache.api_keys.get(key_id)?;
        (hash_matches(key_sha256, &row.sha256) && row.revoked.is_none()).then(|| Principal {
            project: row.project.clone(),
            key_id: key_id.to_owned(),
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
        self.write(
            OnConflict::Retry,
            || "a read token".into(),
            |_| {
                let token = Secret::generate(READ_TOKEN_PREFIX, rng);
                let row = ReadTokenRow {
                    label: label.to_owned(),
                    sha256: hex::encode(token.sha256),
                    created: now,
                    revoked: None,
                };
                Ok((
                    vec![put(READ_TOKENS, &token.id, &row, Expect::Absent)?],
                    token,
                ))
            },
        )
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
    /// reads nothing (on other fronts of a shared registry, within the
    /// watch period). Revoking twice keeps the first time.
    ///
    /// # Errors
    /// [`WitnessError::NotFound`] for an unknown id.
    pub fn revoke_read_token(&self, id: &str, now: UnixMillis) -> Result<(), WitnessError> {
        self.write(
            OnConflict::Retry,
            || format!("read token {id}"),
            |c| {
                let mut row =
                    c.read_tokens.get(id).cloned().ok_or_else(|| {
                        WitnessError::NotFound(format!("no read token with id {id}"))
                    })?;
                if row.revoked.is_some() {
                    return Ok((Vec::new(), ()));
                }
                row.revoked = Some(now);
                Ok((
                    vec![put(READ_TOKENS, id, &row, c.expect(READ_TOKENS, id))?],
                    (),
                ))
            },
        )
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
        self.write(
            OnConflict::Retry,
            || format!("project {name}"),
            |c| {
                if c.projects.contains_key(name) {
                    return Err(WitnessError::Exists {
                        what: "project",
                        name: name.to_owned(),
                    });
                }
                let project = ProjectRow { created: now };
                let (key, row) = new_key_row(name, now, rng);
                Ok((
                    vec![
                        put(PROJECTS, name, &project, Expect::Absent)?,
                        put(API_KEYS, &key.id, &row, Expect::Absent)?,
                    ],
                    key,
                ))
            },
        )
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
        self.write(
            OnConflict::Retry,
            || format!("project {project}"),
            |c| {
                if !c.projects.contains_key(project) {
                    return Err(WitnessError::NotFound(format!(
                        "no project named {project}"
                    )));
                }
                let (key, row) = new_key_row(project, now, rng);
                Ok((
                    vec![
                        // The project must still be there when the key lands.
                        KvOp {
                            table: PROJECTS,
                            key: project.to_owned(),
                            value: c.raw.get(&(PROJECTS, project.to_owned())).cloned(),
                            expect: c.expect(PROJECTS, project),
                        },
                        put(API_KEYS, &key.id, &row, Expect::Absent)?,
                    ],
                    key,
                ))
            },
        )
    }

    /// Revokes an API key by its public id (on other fronts of a shared
    /// registry, within the watch period).
    ///
    /// # Errors
    /// [`WitnessError::NotFound`] for an unknown id.
    pub fn revoke_api_key(&self, id: &str, now: UnixMillis) -> Result<(), WitnessError> {
        self.write(
            OnConflict::Retry,
            || format!("API key {id}"),
            |c| {
                let mut row =
                    c.api_keys.get(id).cloned().ok_or_else(|| {
                        WitnessError::NotFound(format!("no API key with id {id}"))
                    })?;
                if row.revoked.is_some() {
                    return Ok((Vec::new(), ()));
                }
                row.revoked = Some(now);
                Ok((vec![put(API_KEYS, id, &row, c.expect(API_KEYS, id))?], ()))
            },
        )
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

    /// Runs `f` on the agent's registration and its key version (always 0
    /// on redb), read together (docs/protocol.md §4.1).
    pub fn with_agent_version<T>(
        &self,
        agent: &AgentName,
        f: impl FnOnce(Option<&AgentRow>, KeyVersion) -> T,
    ) -> T {
        let c = self.read();
        let version = c.key_versions.get(agent).copied().unwrap_or_default();
        f(c.agents.get(agent), version)
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
        name_free(&self.read(), project, agent)
    }

    /// Registers `agent` in `project` with its first key, valid from
    /// `not_before`. The routes go through `key_changes::add_agent`, which
    /// also refuses a name the log already holds a chain for. Of two
    /// registrations of one name at once (through two fronts of a shared
    /// registry too), exactly one is made; the other gets the answer of
    /// [`Registry::check_name_free`].
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
        self.write(
            OnConflict::Retry,
            || format!("agent {agent}"),
            |c| {
                name_free(c, project, agent)?;
                let row = AgentRow {
                    project: project.to_owned(),
                    keys: vec![AgentKey {
                        key_id: public_key.key_id(),
                        public_key,
                        not_before,
                        not_after: None,
                    }],
                };
                Ok((
                    vec![put(AGENTS, agent.as_str(), &row, Expect::Absent)?],
                    row,
                ))
            },
        )
    }

    /// The agent's registration when it belongs to `project`.
    ///
    /// # Errors
    /// [`WitnessError::AgentNotAllowed`] otherwise, also for a name that is
    /// not registered at all (so names in other projects are not revealed).
    pub fn owned_agent(&self, project: &str, agent: &AgentName) -> Result<AgentRow, WitnessError> {
        owned(&self.read(), project, agent)
    }

    /// Rotates `agent`'s key at `at`: every key still valid at `at` ends
    /// there, and `public_key` is valid from `at` on. The caller has checked
    /// `at` against the agent's admitted records (`key_changes`). Of a
    /// rotation and a retirement (or two rotations) of one agent at once,
    /// through any fronts, exactly one is made: the other is refused with
    /// `concurrent_change`.
    ///
    /// # Errors
    /// [`WitnessError::AgentNotAllowed`] when the agent is not the project's;
    /// [`WitnessError::UnusableKey`] for a key no signature can verify under;
    /// [`WitnessError::Exists`] when the key is already listed;
    /// `BadRequest` when `at` is before the current key's start or the agent
    /// has too many keys; [`WitnessError::ConcurrentChange`] as above.
    pub(crate) fn rotate_key(
        &self,
        project: &str,
        agent: &AgentName,
        public_key: PublicKey,
        at: UnixMillis,
    ) -> Result<AgentRow, WitnessError> {
        self.write(
            OnConflict::Refuse,
            || format!("agent {agent}"),
            |c| {
                let row = changed_row(
                    owned(c, project, agent)?,
                    agent,
                    KeyChange::Rotate(public_key),
                    at,
                )?;
                Ok((
                    vec![put(
                        AGENTS,
                        agent.as_str(),
                        &row,
                        c.expect(AGENTS, agent.as_str()),
                    )?],
                    row,
                ))
            },
        )
    }

    /// A rotation or retirement of `agent`'s keys on a shared registry
    /// (PostgreSQL), fenced in the database (docs/protocol.md §4.1): in one
    /// transaction, the agent's fence row is locked, `decide` gets the
    /// latest `time` of the agent's committed records as of that lock and
    /// chooses the instant (or refuses), the new ranges are written and the
    /// agent's key version is incremented, so that every record admitted
    /// under the old ranges and not yet committed is checked again. The
    /// memory copy takes the new row and version.
    ///
    /// # Errors
    /// As [`Registry::rotate_key`], and what `decide` returns.
    pub(crate) fn change_keys_fenced(
        &self,
        project: &str,
        agent: &AgentName,
        change: KeyChange,
        decide: impl FnOnce(Option<UnixMillis>) -> Result<UnixMillis, WitnessError>,
    ) -> Result<AgentRow, WitnessError> {
        let _w = self.writer();
        let (row, expect) = {
            let c = self.read();
            (owned(&c, project, agent)?, c.expect(AGENTS, agent.as_str()))
        };
        let mut made = None;
        let written = self.kv.apply_fenced(agent.as_str(), |latest| {
            let at = decide(latest)?;
            let row = changed_row(row, agent, change, at)?;
            let op = put(AGENTS, agent.as_str(), &row, expect)?;
            made = Some(row);
            Ok::<_, WitnessError>(vec![op])
        });
        match written {
            Ok(Ok(w)) => {
                let row =
                    made.ok_or_else(|| WitnessError::internal(&"a key change wrote no row"))?;
                let op = put(AGENTS, agent.as_str(), &row, Expect::Any)?;
                self.took(std::slice::from_ref(&op), w.generation)?;
                self.cache_mut()
                    .key_versions
                    .insert(agent.clone(), w.key_version);
                Ok(row)
            }
            Ok(Err(refused)) => Err(refused),
            Err(KvError::Conflict(_)) => {
                self.reload()?;
                Err(WitnessError::ConcurrentChange {
                    what: format!("agent {agent}"),
                })
            }
            Err(e) => Err(RegistryError::from(e).into()),
        }
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
        self.write(
            OnConflict::Refuse,
            || format!("agent {agent}"),
            |c| {
                let row = changed_row(owned(c, project, agent)?, agent, KeyChange::Retire, at)?;
                Ok((
                    vec![put(
                        AGENTS,
                        agent.as_str(),
                        &row,
                        c.expect(AGENTS, agent.as_str()),
                    )?],
                    row,
                ))
            },
        )
    }
}

fn new_key_row<R: CryptoRngCore + ?Sized>(
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

fn name_free(c: &Cache, project: &str, agent: &AgentName) -> Result<(), WitnessError> {
    match c.agents.get(agent) {
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

fn owned(c: &Cache, project: &str, agent: &AgentName) -> Result<AgentRow, WitnessError> {
    match c.agents.get(agent) {
        Some(row) if row.project == project => Ok(row.clone()),
        _ => Err(WitnessError::AgentNotAllowed {
            agent: agent.clone(),
        }),
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

/// This machine's host name, for [`FirstStartPlace`].
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "this machine".into())
}

/// Whether `presented` equals the stored hex SHA-256, in constant time.
fn hash_matches(presented: &[u8; 32], stored_hex: &str) -> bool {
    let mut stored = [0u8; 32];
    hex::decode_to_slice(stored_hex, &mut stored).is_ok() && bool::from(presented.ct_eq(&stored))
}

/// `row` after `change` at `at`: a rotation ends every key valid at `at`
/// and adds the new key from `at` on (refusing a key already listed, or one
/// key too many); a retirement ends every key valid at `at`.
fn changed_row(
    mut row: AgentRow,
    agent: &AgentName,
    change: KeyChange,
    at: UnixMillis,
) -> Result<AgentRow, WitnessError> {
    match change {
        KeyChange::Rotate(public_key) => {
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
        }
        KeyChange::Retire => end_keys_at(&mut row, at)?,
    }
    Ok(row)
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
    use std::time::{Duration, Instant};
    use tally_schemas::SecretKey;

    /// One fresh registry on one backend: opened (and reopened) at will,
    /// and its stored bytes, to show that no secret is in them.
    struct Backend {
        name: &'static str,
        open: Box<dyn Fn() -> Arc<Registry>>,
        stored: Box<dyn Fn() -> Vec<u8>>,
        _dir: Option<tempfile::TempDir>,
    }

    fn redb() -> Backend {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.redb");
        let p2 = path.clone();
        Backend {
            name: "redb",
            open: Box::new(move || Registry::open(&path).unwrap()),
            stored: Box::new(move || std::fs::read(&p2).unwrap()),
            _dir: Some(dir),
        }
    }

    fn postgres() -> Option<Backend> {
        let url = tally_testkit::postgres::database()?;
        let db = url.rsplit('/').next().unwrap().to_owned();
        Some(Backend {
            name: "postgres",
            open: Box::new(move || Registry::open_postgres(&url).unwrap()),
            stored: Box::new(move || {
                tally_testkit::postgres::shared()
                    .psql(
                        &db,
                        "SELECT string_agg(tbl || key || encode(value, 'escape'), ' ') FROM registry_rows",
                    )
                    .into_bytes()
            }),
            _dir: None,
        })
    }

    /// Every backend-independent test runs on a redb file and on a real
    /// PostgreSQL database (skipped, saying so, only with TALLY_SKIP_POSTGRES=1).
    fn backends() -> Vec<Backend> {
        let mut v = vec![redb()];
        v.extend(postgres());
        v
    }

    #[test]
    fn keys_are_shown_once_stored_hashed_and_checked() {
        for b in backends() {
            let r = (b.open)();
            let first = r
                .first_start(UnixMillis::new(1), &mut OsRng)
                .unwrap()
                .unwrap();
            r.first_start_shown().unwrap();
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
            // The plain key is nowhere in the store.
            drop(r);
            let bytes = (b.stored)();
            assert!(!bytes.is_empty(), "{}", b.name);
            let secret_part = first.api_key.token.rsplit('_').next().unwrap();
            assert!(
                !bytes
                    .windows(secret_part.len())
                    .any(|w| w == secret_part.as_bytes()),
                "{}",
                b.name
            );
            // And it survives a reopen.
            let r = (b.open)();
            assert!(r.authenticate(&first.api_key.token).is_some());
            let place = r.first_start_place().unwrap();
            assert!(place.shown);
            assert_eq!(place.api_key_id, first.api_key.id());
            r.revoke_api_key(first.api_key.id(), UnixMillis::new(3))
                .unwrap();
            assert!(r.authenticate(&first.api_key.token).is_none());
        }
    }

    #[test]
    fn read_tokens_are_shown_once_stored_hashed_checked_and_revoked() {
        for b in backends() {
            let r = (b.open)();
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
            let bytes = (b.stored)();
            let secret = t.token.rsplit('_').next().unwrap();
            assert!(!bytes.windows(secret.len()).any(|w| w == secret.as_bytes()));
            let r = (b.open)();
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
    }

    #[test]
    fn a_name_is_told_apart_only_for_its_own_project_and_weak_keys_are_refused() {
        for b in backends() {
            let r = (b.open)();
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
        }
        let mut identity = [0u8; 32];
        identity[0] = 1;
        // A weak key cannot reach the registry: parsing refuses it.
        assert!(PublicKey::from_bytes(&identity).is_err());
    }

    #[test]
    fn rotate_and_retire_set_validity_ranges() {
        for b in backends() {
            let r = (b.open)();
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
            // What was written is what a reopened registry reads.
            drop(r);
            assert_eq!((b.open)().agent(&a), Some(row), "{}", b.name);
        }
    }

    /// Waits (at most `bound`) for `cond`; how long it took.
    fn within(bound: Duration, cond: impl Fn() -> bool) -> Option<Duration> {
        let start = Instant::now();
        while start.elapsed() < bound {
            if cond() {
                return Some(start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Two fronts on one database: what one writes, the other sees within
    /// the watch period (docs/operations.md "Running on PostgreSQL"),
    /// revocations included; and the first start happens once.
    #[test]
    fn postgres_fronts_share_registrations_and_revocations() {
        let Some(b) = postgres() else { return };
        let (a, z) = ((b.open)(), (b.open)());
        let first = a
            .first_start_in(UnixMillis::new(1), &mut OsRng, Some(Path::new("/srv/a")))
            .unwrap()
            .unwrap();
        a.first_start_shown().unwrap();
        // The other front makes nothing and knows where the key was shown.
        assert!(z
            .first_start_in(UnixMillis::new(2), &mut OsRng, Some(Path::new("/srv/z")))
            .unwrap()
            .is_none());
        let place = z.first_start_place().unwrap();
        assert_eq!(place.data_dir, "/srv/a");
        assert!(place.shown);
        assert!(z.authenticate(&first.api_key.token).is_some());
        assert!(z.is_admin(&first.admin_token.token));
        // A registration, a key and a read token made through one front...
        let bot = AgentName::new("bot").unwrap();
        let k = SecretKey::generate(&mut OsRng).public_key();
        a.add_agent("default", &bot, k, UnixMillis::new(5)).unwrap();
        let key = a
            .new_api_key("default", UnixMillis::new(5), &mut OsRng)
            .unwrap();
        let read = z
            .create_read_token("monitor", UnixMillis::new(5), &mut OsRng)
            .unwrap();
        // ...are seen by the other within the bound.
        let bound = crate::kv::WATCH_PERIOD * 4;
        assert!(within(bound, || z.agent(&bot).is_some()).is_some());
        assert!(within(bound, || z.authenticate(&key.token).is_some()).is_some());
        assert!(within(bound, || a.authenticate_reader(&read.token).is_some()).is_some());
        // A revocation through one front is refused by the other.
        a.revoke_api_key(key.id(), UnixMillis::new(6)).unwrap();
        z.revoke_read_token(read.id(), UnixMillis::new(6)).unwrap();
        let seen = within(bound, || z.authenticate(&key.token).is_none());
        eprintln!("an API key revoked through one front was refused by the other after {seen:?} (watch period {:?})", crate::kv::WATCH_PERIOD);
        assert!(seen.is_some());
        // Revoking again changes nothing, and writes nothing other fronts
        // would reload for.
        let generation = a.kv.generation().unwrap();
        a.revoke_api_key(key.id(), UnixMillis::new(7)).unwrap();
        assert_eq!(a.kv.generation().unwrap(), generation);
        assert!(within(bound, || a.authenticate_reader(&read.token).is_none()).is_some());
        // A third front opened now reads everything at once.
        let c = (b.open)();
        assert!(c.agent(&bot).is_some());
        assert!(c.authenticate(&key.token).is_none());
        assert!(c.authenticate(&first.api_key.token).is_some());
    }

    /// Conflicting writes through two handles on one database (each with
    /// its own connection and its own in-memory copy): exactly one wins.
    #[test]
    fn postgres_conflicting_writes_have_exactly_one_winner() {
        let Some(b) = postgres() else { return };
        let fronts = [(b.open)(), (b.open)()];
        fronts[0]
            .first_start(UnixMillis::new(0), &mut OsRng)
            .unwrap();
        fronts[0]
            .create_project("other", UnixMillis::new(0), &mut OsRng)
            .unwrap();
        for f in &fronts {
            f.refresh_if_changed().unwrap();
        }
        for round in 0..20 {
            // The same name through both fronts, for two projects.
            let name = AgentName::new(&format!("racer-{round}")).unwrap();
            let results: Vec<_> = std::thread::scope(|s| {
                let hs: Vec<_> = fronts
                    .iter()
                    .zip(["default", "other"])
                    .map(|(f, project)| {
                        let name = name.clone();
                        s.spawn(move || {
                            let k = SecretKey::generate(&mut OsRng).public_key();
                            f.add_agent(project, &name, k, UnixMillis::new(0))
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let wins = results.iter().filter(|r| r.is_ok()).count();
            assert_eq!(wins, 1, "round {round}: {results:?}");
            assert!(
                results
                    .iter()
                    .any(|r| matches!(r, Err(WitnessError::NameUnavailable { .. }))),
                "{results:?}"
            );
            // Both fronts agree on the owner.
            let winner = results.iter().find_map(|r| r.as_ref().ok()).unwrap();
            for f in &fronts {
                f.refresh_if_changed().unwrap();
                assert_eq!(f.agent(&name).as_ref(), Some(winner));
            }
            // A rotation racing a retirement of that agent: one is made.
            let project = winner.project.clone();
            let results: Vec<_> = std::thread::scope(|s| {
                let (p0, p1) = (&project, &project);
                let (n0, n1) = (&name, &name);
                let f0 = &fronts[0];
                let f1 = &fronts[1];
                let h0 = s.spawn(move || {
                    let k = SecretKey::generate(&mut OsRng).public_key();
                    f0.rotate_key(p0, n0, k, UnixMillis::new(100))
                });
                let h1 = s.spawn(move || f1.retire_agent(p1, n1, UnixMillis::new(200)));
                vec![h0.join().unwrap(), h1.join().unwrap()]
            });
            let wins: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
            assert_eq!(wins.len(), 1, "round {round}: {results:?}");
            assert!(
                results
                    .iter()
                    .any(|r| matches!(r, Err(WitnessError::ConcurrentChange { .. }))),
                "{results:?}"
            );
            for f in &fronts {
                f.refresh_if_changed().unwrap();
                assert_eq!(f.agent(&name).as_ref(), Some(wins[0]));
            }
        }
    }

    #[test]
    fn postgres_a_first_start_that_was_never_shown_is_made_anew() {
        let Some(b) = postgres() else { return };
        let a = (b.open)();
        let lost = a
            .first_start(UnixMillis::new(1), &mut OsRng)
            .unwrap()
            .unwrap();
        // The front dies before showing the key: its session (and the
        // first-start lock) ends with it.
        drop(a);
        let z = (b.open)();
        let again = z
            .first_start(UnixMillis::new(2), &mut OsRng)
            .unwrap()
            .expect("made anew");
        z.first_start_shown().unwrap();
        assert!(z.authenticate(&lost.api_key.token).is_none());
        assert!(!z.is_admin(&lost.admin_token.token));
        assert!(z.authenticate(&again.api_key.token).is_some());
        assert_eq!(z.projects().len(), 1);
        drop(z);
        // Once shown, never again.
        assert!((b.open)()
            .first_start(UnixMillis::new(3), &mut OsRng)
            .unwrap()
            .is_none());
    }
}
