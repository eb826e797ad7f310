//! Auditor links of the console (docs/console.md "Access"): a read-only link
//! with an unguessable token, scoped to chosen agents of one project and a
//! time range, with an expiry, revocable at once.
//!
//! Stored in `console.redb` in the witness's data folder (the log and the
//! registry own their files), table `auditor_links`: link id (16 hex) →
//! JSON [`AuditorLink`]. The token is `<id>_<secret>`: a 64-bit public id
//! and a 256-bit secret, shown once when the link is made; only SHA-256 of
//! the whole token is stored, looked up by id and compared in constant time.
//! Every row is also held in memory; a change is written (durably) before
//! the memory copy changes, so a revoked link is refused by the very next
//! request and stays revoked across restarts.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Mutex, RwLock};

use rand_core::CryptoRngCore;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tally_schemas::{AgentName, UnixMillis};

/// `auditor_links`: link id → JSON [`AuditorLink`].
const LINKS: TableDefinition<&str, &[u8]> = TableDefinition::new("auditor_links");

/// Most live links (neither revoked nor expired) per project; making one
/// more refuses until one is revoked or expires.
pub const MAX_LINKS_PER_PROJECT: usize = 1000;
/// Most links kept per project, ended ones included: making a link past it
/// deletes the project's oldest ended links (their rows are history only).
pub const MAX_KEPT_LINKS_PER_PROJECT: usize = 10_000;

/// Why the link store failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkStoreError {
    /// redb failed.
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
}

fn storage<E: std::fmt::Display>(e: E) -> LinkStoreError {
    LinkStoreError::Storage(e.to_string())
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
}

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
    db: Database,
    links: RwLock<BTreeMap<String, AuditorLink>>,
    write: Mutex<()>,
    /// [`MAX_LINKS_PER_PROJECT`] and [`MAX_KEPT_LINKS_PER_PROJECT`] (tests
    /// lower them).
    caps: (usize, usize),
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
    /// Opens (or creates) the store and loads it into memory.
    ///
    /// # Errors
    /// [`LinkStoreError`] when the file cannot be opened or a row is corrupt.
    pub fn open(path: &Path) -> Result<Self, LinkStoreError> {
        let db = Database::create(path).map_err(storage)?;
        let tx = db.begin_write().map_err(storage)?;
        tx.open_table(LINKS).map_err(storage)?;
        tx.commit().map_err(storage)?;
        let mut links = BTreeMap::new();
        {
            let rx = db.begin_read().map_err(storage)?;
            let t = rx.open_table(LINKS).map_err(storage)?;
            for row in t.iter().map_err(storage)? {
                let (k, v) = row.map_err(storage)?;
                let link: AuditorLink =
                    serde_json::from_slice(v.value()).map_err(|e| LinkStoreError::Corrupt {
                        id: k.value().to_owned(),
                        reason: e.to_string(),
                    })?;
                links.insert(k.value().to_owned(), link);
            }
        }
        Ok(Self {
            db,
            links: RwLock::new(links),
            write: Mutex::new(()),
            caps: (MAX_LINKS_PER_PROJECT, MAX_KEPT_LINKS_PER_PROJECT),
        })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, AuditorLink>> {
        self.links
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn put(&self, id: &str, link: &AuditorLink) -> Result<(), LinkStoreError> {
        self.put_removing(id, link, &[])
    }

    /// Writes `link` and deletes the links `remove` in one transaction.
    fn put_removing(
        &self,
        id: &str,
        link: &AuditorLink,
        remove: &[String],
    ) -> Result<(), LinkStoreError> {
        let bytes = serde_json::to_vec(link).map_err(storage)?;
        let tx = self.db.begin_write().map_err(storage)?;
        {
            let mut t = tx.open_table(LINKS).map_err(storage)?;
            for old in remove {
                t.remove(old.as_str()).map_err(storage)?;
            }
            t.insert(id, bytes.as_slice()).map_err(storage)?;
        }
        tx.commit().map_err(storage)?;
        let mut links = self
            .links
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for old in remove {
            links.remove(old);
        }
        links.insert(id.to_owned(), link.clone());
        Ok(())
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
        let _w = self
            .write
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut ended: Vec<(UnixMillis, String)> = Vec::new();
        let mut live = 0;
        for (id, l) in self.read().iter().filter(|(_, l)| l.project == new.project) {
            if l.usable_at(now) {
                live += 1;
            } else {
                ended.push((l.created, id.clone()));
            }
        }
        let (max_live, max_kept) = self.caps;
        if live >= max_live {
            return Err(LinkStoreError::TooMany);
        }
        let kept = live + ended.len();
        ended.sort();
        let remove: Vec<String> = ended
            .into_iter()
            .take((kept + 1).saturating_sub(max_kept))
            .map(|(_, id)| id)
            .collect();
        let (id, token) = loop {
            let mut id = [0u8; 8];
            let mut secret = [0u8; 32];
            rng.fill_bytes(&mut id);
            rng.fill_bytes(&mut secret);
            let id = hex::encode(id);
            if !self.read().contains_key(&id) {
                let token = format!("{id}_{}", hex::encode(secret));
                break (id, token);
            }
        };
        let link = AuditorLink {
            project: new.project,
            agents: new.agents,
            since: new.since,
            until: new.until,
            created: now,
            expires: new.expires,
            revoked: None,
            label: new.label,
            token_sha256: sha256_hex(&token),
        };
        self.put_removing(&id, &link, &remove)?;
        Ok((id, token))
    }

    /// The link a token opens, if the token is well formed, known, matches
    /// in constant time, and the link is neither revoked nor expired.
    #[must_use]
    pub fn open_token(&self, token: &str, now: UnixMillis) -> Option<(String, AuditorLink)> {
        let id = token_id(token)?;
        let presented = Sha256::digest(token.as_bytes());
        let links = self.read();
        let link = links.get(id)?;
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
            .iter()
            .filter(|(_, l)| l.project == project)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        out.sort_by(|a, b| b.1.created.cmp(&a.1.created).then(a.0.cmp(&b.0)));
        out
    }

    /// Revokes a link of `project` (idempotent: the first revocation time stays).
    ///
    /// # Errors
    /// [`LinkStoreError::NotFound`] for an id that is not the project's; storage failure.
    pub fn revoke(&self, project: &str, id: &str, now: UnixMillis) -> Result<(), LinkStoreError> {
        let _w = self
            .write
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut link = match self.read().get(id) {
            Some(l) if l.project == project => l.clone(),
            _ => return Err(LinkStoreError::NotFound),
        };
        if link.revoked.is_some() {
            return Ok(());
        }
        link.revoked = Some(now);
        self.put(id, &link)
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

    #[test]
    fn console_links_open_expire_revoke_and_persist() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("console.redb");
        let store = LinkStore::open(&path).unwrap();
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
        let store = LinkStore::open(&path).unwrap();
        assert!(store.open_token(&token, UnixMillis::new(2_000)).is_none());
        let listed = store.list("p");
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].1.revoked, Some(UnixMillis::new(3_000)));
        assert!(store.list("q").is_empty());
    }

    #[test]
    fn console_links_cap_counts_live_links_and_prunes_the_oldest_ended() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("console.redb");
        let mut store = LinkStore::open(&path).unwrap();
        store.caps = (2, 3);
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
        let store = LinkStore::open(&path).unwrap();
        assert_eq!(ids(&store), want, "the deletion is durable");
        assert_eq!(store.list("q").len(), 1);
    }
}
