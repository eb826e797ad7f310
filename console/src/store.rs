//! Auditor links of the console (docs/console.md "Access"): a read-only link
//! with an unguessable token, scoped to chosen agents of one project and a
//! time range, with an expiry, revocable at once.
//!
//! Stored in `console.redb` in the witness's data folder (the log and the
//! registry own their files), table `auditor_links`: link id (16 hex) →
//! JSON [`AuditorLink`]; with `--store postgres://…`, the same rows are in
//! that database (tally_witness::kv; docs/storage.md), shared by every
//! front, each of which sees another's new or revoked link within the
//! watch period (docs/operations.md "Running on PostgreSQL"). The token is `<id>_<secret>`: a 64-bit public id
//! and a 256-bit secret, shown once when the link is made; only SHA-256 of
//! the whole token is stored, looked up by id and compared in constant time.
//! Every row is also held in memory; a change is written (durably) before
//! the memory copy changes, so a revoked link is refused by the very next
//! request and stays revoked across restarts.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use rand_core::CryptoRngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tally_schemas::{AgentName, UnixMillis};
use tally_witness::cached_table::{CachedTable, Rows, Watch};
use tally_witness::config::StoreChoice;
use tally_witness::kv::{Expect, KvError, KvOp, KvStore, Snapshot};

/// The console's file in the data folder.
pub const CONSOLE_DB: &str = "console.redb";

/// `auditor_links`: link id → JSON [`AuditorLink`].
const LINKS: &str = "auditor_links";
/// The store's tables (docs/storage.md).
pub const TABLES: &[&str] = &[LINKS];

/// Most live links (neither revoked nor expired) per project; making one
/// more refuses until one is revoked or expires.
pub const MAX_LINKS_PER_PROJECT: usize = 1000;
/// Most links kept per project, ended ones included: making a link past it
/// deletes the project's oldest ended links (their rows are history only).
pub const MAX_KEPT_LINKS_PER_PROJECT: usize = 10_000;

/// Why the link store failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkStoreError {
    /// The storage (redb or PostgreSQL) failed.
    #[error("console link store: {0}")]
    Storage(String),
    /// A stored row does not decode.
    #[error("console link store: row {id:?} is corrupt: {reason}")]
    Corrupt {
        /// The link id.
        id: String,
        /// Why.
        reason: String,
    },
    /// The project has too many links.
    #[error("a project has at most {MAX_LINKS_PER_PROJECT} live auditor links; revoke some first")]
    TooMany,
    /// No such link in that project.
    #[error("no such auditor link")]
    NotFound,
    /// A disclosure the link cannot take (another project's agent, too
    /// many, too big, a link that has ended).
    #[error("{0}")]
    Disclosure(String),
}

fn storage<E: std::fmt::Display>(e: E) -> LinkStoreError {
    LinkStoreError::Storage(e.to_string())
}

impl From<KvError> for LinkStoreError {
    fn from(e: KvError) -> Self {
        storage(e)
    }
}

/// One auditor link (its token's hash, never the token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditorLink {
    /// The project whose agents it shows.
    pub project: String,
    /// The agents it shows (at least one).
    pub agents: Vec<AgentName>,
    /// Records the witness received at or after this time; `None`: from the start.
    pub since: Option<UnixMillis>,
    /// Records the witness received before this time; `None`: to the end.
    pub until: Option<UnixMillis>,
    /// When it was made.
    pub created: UnixMillis,
    /// When it stops working.
    pub expires: UnixMillis,
    /// When it was revoked, if it was.
    pub revoked: Option<UnixMillis>,
    /// A label for the operator (not shown to the auditor).
    pub label: String,
    /// SHA-256 of the whole token, hex.
    pub token_sha256: String,
    /// Disclosures (protocol.md §6.3) the operator attached for the
    /// auditor: the link's report checks them against the pack and shows
    /// the content. Absent from rows without any, so those are stored as
    /// before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disclosures: Vec<AttachedDisclosure>,
}

/// A disclosure attached to a link, with the name it was given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachedDisclosure {
    /// A name for it (shown to the auditor; the report's `file`).
    pub name: String,
    /// The disclosure.
    pub disclosure: tally_schemas::disclosure::Disclosure,
}

/// Disclosures attached to one link, at most.
pub const MAX_DISCLOSURES_PER_LINK: usize = 8;

/// Bytes of one link's disclosures (as stored), at most: every link is
/// held in memory.
pub const MAX_DISCLOSURE_BYTES_PER_LINK: usize = 64 << 10;

impl AuditorLink {
    /// Whether the link lets an auditor in at `now`.
    #[must_use]
    pub fn usable_at(&self, now: UnixMillis) -> bool {
        self.revoked.is_none() && now < self.expires
    }
}

/// What the operator asks for when making a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewLink {
    /// The project.
    pub project: String,
    /// The agents (already checked to be the project's).
    pub agents: Vec<AgentName>,
    /// Start of the time range, inclusive.
    pub since: Option<UnixMillis>,
    /// End of the time range, exclusive.
    pub until: Option<UnixMillis>,
    /// Expiry.
    pub expires: UnixMillis,
    /// Operator's label.
    pub label: String,
}

/// The auditor-link store. See the module docs.
pub struct LinkStore {
    table: Arc<CachedTable<Links>>,
    /// [`MAX_LINKS_PER_PROJECT`] and [`MAX_KEPT_LINKS_PER_PROJECT`] (tests
    /// lower them).
    caps: Mutex<(usize, usize)>,
}

/// The links in memory, with each row's stored bytes (which a write
/// expects unchanged).
#[derive(Default)]
struct Links {
    links: BTreeMap<String, AuditorLink>,
    raw: BTreeMap<String, Vec<u8>>,
}

impl Rows for Links {
    type Error = LinkStoreError;

    fn from_snapshot(snapshot: Snapshot) -> Result<Self, LinkStoreError> {
        let mut l = Self::default();
        for (table, key, value) in snapshot.rows {
            if table == LINKS {
                l.set_link(&key, Some(&value))?;
            }
        }
        Ok(l)
    }

    fn set(
        &mut self,
        table: &'static str,
        key: &str,
        value: Option<&[u8]>,
    ) -> Result<(), LinkStoreError> {
        if table == LINKS {
            self.set_link(key, value)?;
        }
        Ok(())
    }
}

impl Links {
    fn set_link(&mut self, id: &str, value: Option<&[u8]>) -> Result<(), LinkStoreError> {
        match value {
            Some(v) => {
                let link: AuditorLink =
                    serde_json::from_slice(v).map_err(|e| LinkStoreError::Corrupt {
                        id: id.to_owned(),
                        reason: e.to_string(),
                    })?;
                self.links.insert(id.to_owned(), link);
                self.raw.insert(id.to_owned(), v.to_vec());
            }
            None => {
                self.links.remove(id);
                self.raw.remove(id);
            }
        }
        Ok(())
    }

    fn expect(&self, id: &str) -> Expect {
        self.raw
            .get(id)
            .map_or(Expect::Absent, |v| Expect::Equals(v.clone()))
    }
}

impl std::fmt::Debug for LinkStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkStore").finish_non_exhaustive()
    }
}

fn sha256_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The id of a token shaped `<16 hex>_<64 hex>`, if it has that shape.
fn token_id(token: &str) -> Option<&str> {
    let (id, secret) = token.split_once('_')?;
    (is_lower_hex(id, 16) && is_lower_hex(secret, 64)).then_some(id)
}

impl LinkStore {
    /// Opens (or creates) the store's redb file and loads it into memory.
    ///
    /// # Errors
    /// [`LinkStoreError`] when the file cannot be opened or a row is corrupt.
    pub fn open(path: &Path) -> Result<Arc<Self>, LinkStoreError> {
        Self::open_on(KvStore::open_redb(path, TABLES).map_err(storage)?)
    }

    /// Opens the store in the PostgreSQL database at `url` (the log's and
    /// the registry's; docs/operations.md "Running on PostgreSQL"), and
    /// watches it for links made or revoked through other fronts.
    ///
    /// # Errors
    /// [`LinkStoreError`] when the database cannot be reached or migrated,
    /// or a row is corrupt.
    pub fn open_postgres(url: &str) -> Result<Arc<Self>, LinkStoreError> {
        Self::open_on(KvStore::open_postgres(url, "console", TABLES).map_err(storage)?)
    }

    /// The store `tally serve` uses: `console.redb` in `data_dir`, or the
    /// PostgreSQL database of `store`.
    ///
    /// # Errors
    /// As [`LinkStore::open`] and [`LinkStore::open_postgres`].
    pub fn open_for(data_dir: &Path, store: &StoreChoice) -> Result<Arc<Self>, LinkStoreError> {
        match store {
            StoreChoice::Redb => Self::open(&data_dir.join(CONSOLE_DB)),
            StoreChoice::Postgres(url) => Self::open_postgres(url),
        }
    }

    fn open_on(kv: KvStore) -> Result<Arc<Self>, LinkStoreError> {
        let watch = Watch {
            thread: "tally-links-watch",
            period: tally_witness::kv::WATCH_PERIOD,
            what: "the console's auditor links",
        };
        Ok(Arc::new(Self {
            table: CachedTable::open(kv, watch)?,
            caps: Mutex::new((MAX_LINKS_PER_PROJECT, MAX_KEPT_LINKS_PER_PROJECT)),
        }))
    }

    /// Reloads the memory copy when another front wrote since it was
    /// loaded (one cheap query otherwise); the watcher calls it every
    /// [`tally_witness::kv::WATCH_PERIOD`].
    ///
    /// # Errors
    /// [`LinkStoreError::Storage`] or a corrupt row (the copy is then kept).
    pub fn refresh_if_changed(&self) -> Result<(), LinkStoreError> {
        self.table.refresh_if_changed()
    }

    #[cfg(test)]
    fn set_caps(&self, live: usize, kept: usize) {
        *self
            .caps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = (live, kept);
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Links> {
        self.table.read()
    }

    /// The one write path ([`CachedTable::write`]): `plan` decides from the
    /// memory copy; when another front changed one of its rows first, the
    /// copy is reloaded and `plan` decides again, up to five times.
    fn write<T>(
        &self,
        plan: impl FnMut(&Links) -> Result<(Vec<KvOp>, T), LinkStoreError>,
    ) -> Result<T, LinkStoreError> {
        self.table.write(5, plan, LinkStoreError::from)
    }

    /// Makes a link; returns its id and its token (shown once).
    ///
    /// # Errors
    /// [`LinkStoreError::TooMany`] past [`MAX_LINKS_PER_PROJECT`], or storage failure.
    pub fn create(
        &self,
        new: NewLink,
        now: UnixMillis,
        rng: &mut dyn CryptoRngCore,
    ) -> Result<(String, String), LinkStoreError> {
        let (max_live, max_kept) = *self
            .caps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.write(|l| {
            let mut ended: Vec<(UnixMillis, String)> = Vec::new();
            let mut live = 0;
            for (id, link) in l.links.iter().filter(|(_, x)| x.project == new.project) {
                if link.usable_at(now) {
                    live += 1;
                } else {
                    ended.push((link.created, id.clone()));
                }
            }
            if live >= max_live {
                return Err(LinkStoreError::TooMany);
            }
            let kept = live + ended.len();
            ended.sort();
            let mut ops: Vec<KvOp> = ended
                .into_iter()
                .take((kept + 1).saturating_sub(max_kept))
                .map(|(_, id)| KvOp {
                    table: LINKS,
                    expect: l.expect(&id),
                    key: id,
                    value: None,
                })
                .collect();
            let (id, token) = loop {
                let mut id = [0u8; 8];
                let mut secret = [0u8; 32];
                rng.fill_bytes(&mut id);
                rng.fill_bytes(&mut secret);
                let id = hex::encode(id);
                if !l.links.contains_key(&id) {
                    let token = format!("{id}_{}", hex::encode(secret));
                    break (id, token);
                }
            };
            let link = AuditorLink {
                project: new.project.clone(),
                agents: new.agents.clone(),
                since: new.since,
                until: new.until,
                created: now,
                expires: new.expires,
                revoked: None,
                label: new.label.clone(),
                token_sha256: sha256_hex(&token),
                disclosures: Vec::new(),
            };
            ops.push(KvOp {
                table: LINKS,
                key: id.clone(),
                value: Some(serde_json::to_vec(&link).map_err(storage)?),
                expect: Expect::Absent,
            });
            Ok((ops, (id, token)))
        })
    }

    /// The link a token opens, if the token is well formed, known, matches
    /// in constant time, and the link is neither revoked nor expired.
    #[must_use]
    pub fn open_token(&self, token: &str, now: UnixMillis) -> Option<(String, AuditorLink)> {
        let id = token_id(token)?;
        let presented = Sha256::digest(token.as_bytes());
        let links = self.read();
        let link = links.links.get(id)?;
        let mut stored = [0u8; 32];
        hex::decode_to_slice(&link.token_sha256, &mut stored).ok()?;
        let equal: bool = presented.as_slice().ct_eq(&stored).into();
        (equal && link.usable_at(now)).then(|| (id.to_owned(), link.clone()))
    }

    /// The project's links, newest first.
    #[must_use]
    pub fn list(&self, project: &str) -> Vec<(String, AuditorLink)> {
        let mut out: Vec<_> = self
            .read()
            .links
            .iter()
            .filter(|(_, l)| l.project == project)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        out.sort_by(|a, b| b.1.created.cmp(&a.1.created).then(a.0.cmp(&b.0)));
        out
    }

    /// Attaches a disclosure to a live link of `project`; it must name one
    /// of the link's agents.
    ///
    /// # Errors
    /// [`LinkStoreError::NotFound`]; [`LinkStoreError::Disclosure`] for an
    /// agent the link does not show, a link that has ended, or past
    /// [`MAX_DISCLOSURES_PER_LINK`] or [`MAX_DISCLOSURE_BYTES_PER_LINK`];
    /// storage failure.
    pub fn attach_disclosure(
        &self,
        project: &str,
        id: &str,
        attached: AttachedDisclosure,
        now: UnixMillis,
    ) -> Result<(), LinkStoreError> {
        self.write(|l| {
            let mut link = match l.links.get(id) {
                Some(x) if x.project == project => x.clone(),
                _ => return Err(LinkStoreError::NotFound),
            };
            if !link.usable_at(now) {
                return Err(LinkStoreError::Disclosure(
                    "the link has been revoked or has expired".into(),
                ));
            }
            let agent = &attached.disclosure.agent;
            if !link.agents.iter().any(|a| a.as_str() == agent) {
                return Err(LinkStoreError::Disclosure(format!(
                    "the disclosure is of agent {:?}, which the link does not show",
                    tally_schemas::display::escape(agent)
                )));
            }
            if link.disclosures.len() >= MAX_DISCLOSURES_PER_LINK {
                return Err(LinkStoreError::Disclosure(format!(
                    "a link takes at most {MAX_DISCLOSURES_PER_LINK} disclosures"
                )));
            }
            link.disclosures.push(attached.clone());
            let bytes: usize = link
                .disclosures
                .iter()
                .map(|d| serde_json::to_vec(d).map_or(usize::MAX, |v| v.len()))
                .sum();
            if bytes > MAX_DISCLOSURE_BYTES_PER_LINK {
                return Err(LinkStoreError::Disclosure(format!(
                    "a link's disclosures take at most {} KiB",
                    MAX_DISCLOSURE_BYTES_PER_LINK >> 10
                )));
            }
            Ok((
                vec![KvOp {
                    table: LINKS,
                    key: id.to_owned(),
                    value: Some(serde_json::to_vec(&link).map_err(storage)?),
                    expect: l.expect(id),
                }],
                (),
            ))
        })
    }

    /// Revokes a link of `project` (idempotent: the first revocation time stays).
    ///
    /// # Errors
    /// [`LinkStoreError::NotFound`] for an id that is not the project's; storage failure.
    pub fn revoke(&self, project: &str, id: &str, now: UnixMillis) -> Result<(), LinkStoreError> {
        self.write(|l| {
            let mut link = match l.links.get(id) {
                Some(x) if x.project == project => x.clone(),
                _ => return Err(LinkStoreError::NotFound),
            };
            if link.revoked.is_some() {
                return Ok((Vec::new(), ()));
            }
            link.revoked = Some(now);
            Ok((
                vec![KvOp {
                    table: LINKS,
                    key: id.to_owned(),
                    value: Some(serde_json::to_vec(&link).map_err(storage)?),
                    expect: l.expect(id),
                }],
                (),
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::OsRng;

    fn new_link(project: &str) -> NewLink {
        NewLink {
            project: project.into(),
            agents: vec![AgentName::new("bot").unwrap()],
            since: None,
            until: None,
            expires: UnixMillis::new(10_000),
            label: "audit".into(),
        }
    }

    /// One fresh store on each backend, as an opener that reopens it:
    /// a redb file, and a real PostgreSQL database (skipped, saying so,
    /// only with TALLY_SKIP_POSTGRES=1).
    type Opener = Box<dyn Fn() -> Arc<LinkStore>>;

    fn backends() -> Vec<(tempfile::TempDir, Opener)> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("console.redb");
        let mut v: Vec<(tempfile::TempDir, Opener)> =
            vec![(dir, Box::new(move || LinkStore::open(&path).unwrap()))];
        if let Some(url) = tally_testkit::postgres::database() {
            v.push((
                tempfile::tempdir().unwrap(),
                Box::new(move || LinkStore::open_postgres(&url).unwrap()),
            ));
        }
        v
    }

    #[test]
    fn console_links_open_expire_revoke_and_persist() {
        for (_dir, open) in backends() {
            let store = open();
            let (id, token) = store
                .create(new_link("p"), UnixMillis::new(1_000), &mut OsRng)
                .unwrap();
            assert_eq!(token.len(), 16 + 1 + 64);
            assert!(store.open_token(&token, UnixMillis::new(2_000)).is_some());
            // Expired at `expires`.
            assert!(store.open_token(&token, UnixMillis::new(10_000)).is_none());
            // A token with one secret digit changed is refused.
            let mut wrong = token.clone().into_bytes();
            let last = wrong.len() - 1;
            wrong[last] = if wrong[last] == b'0' { b'1' } else { b'0' };
            let wrong = String::from_utf8(wrong).unwrap();
            assert!(store.open_token(&wrong, UnixMillis::new(2_000)).is_none());
            for junk in ["", "_", "x", &token[..20], &token.to_uppercase()] {
                assert!(store.open_token(junk, UnixMillis::new(2_000)).is_none());
            }
            // Another project cannot revoke it.
            assert!(matches!(
                store.revoke("q", &id, UnixMillis::new(3_000)),
                Err(LinkStoreError::NotFound)
            ));
            store.revoke("p", &id, UnixMillis::new(3_000)).unwrap();
            assert!(store.open_token(&token, UnixMillis::new(3_001)).is_none());
            drop(store);
            let store = open();
            assert!(store.open_token(&token, UnixMillis::new(2_000)).is_none());
            let listed = store.list("p");
            assert_eq!(listed.len(), 1);
            assert_eq!(listed[0].1.revoked, Some(UnixMillis::new(3_000)));
            assert!(store.list("q").is_empty());
        }
    }

    #[test]
    fn console_links_cap_counts_live_links_and_prunes_the_oldest_ended() {
        for (_dir, open) in backends() {
            let store = open();
            store.set_caps(2, 3);
            let t = UnixMillis::new;
            let (a, _) = store.create(new_link("p"), t(1_000), &mut OsRng).unwrap();
            let (b, _) = store.create(new_link("p"), t(1_001), &mut OsRng).unwrap();
            // Two live links: a third is refused, in this project only.
            assert!(matches!(
                store.create(new_link("p"), t(1_002), &mut OsRng),
                Err(LinkStoreError::TooMany)
            ));
            store.create(new_link("q"), t(1_002), &mut OsRng).unwrap();
            // A revoked link no longer counts.
            store.revoke("p", &a, t(1_003)).unwrap();
            let (c, _) = store.create(new_link("p"), t(1_004), &mut OsRng).unwrap();
            // Expired links (expiry 10_000) do not count either; three are kept,
            // so the fourth deletes the oldest ended one (a), in the same write.
            let (d, _) = store.create(new_link("p"), t(10_000), &mut OsRng).unwrap();
            let ids = |s: &LinkStore| {
                let mut v: Vec<String> = s.list("p").into_iter().map(|(id, _)| id).collect();
                v.sort();
                v
            };
            let mut want = vec![b.clone(), c.clone(), d.clone()];
            want.sort();
            assert_eq!(ids(&store), want);
            drop(store);
            let store = open();
            assert_eq!(ids(&store), want, "the deletion is durable");
            assert_eq!(store.list("q").len(), 1);
        }
    }

    /// Two fronts on one database: a link made through one opens on the
    /// other, and a revocation through either is refused by both, within
    /// the watch period; revoking on both at once is harmless.
    #[test]
    fn postgres_links_are_shared_between_fronts() {
        let Some(url) = tally_testkit::postgres::database() else {
            return;
        };
        let a = LinkStore::open_postgres(&url).unwrap();
        let z = LinkStore::open_postgres(&url).unwrap();
        let now = UnixMillis::new(1_000);
        let (id, token) = a.create(new_link("p"), now, &mut OsRng).unwrap();
        let bound = tally_witness::kv::WATCH_PERIOD * 4;
        let within = |cond: &dyn Fn() -> bool| {
            let start = std::time::Instant::now();
            while start.elapsed() < bound {
                if cond() {
                    return true;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            false
        };
        assert!(within(&|| z.open_token(&token, now).is_some()));
        std::thread::scope(|s| {
            let h = s.spawn(|| a.revoke("p", &id, UnixMillis::new(2_000)));
            z.revoke("p", &id, UnixMillis::new(2_001)).unwrap();
            h.join().unwrap().unwrap();
        });
        assert!(a.open_token(&token, now).is_none());
        assert!(z.open_token(&token, now).is_none());
        assert!(within(&|| a.list("p") == z.list("p")));
        assert_eq!(a.list("p").len(), 1);
    }
}
