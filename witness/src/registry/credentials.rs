//! Credentials: the first start, API keys, the admin token, read tokens
//! and projects (docs/operations.md "Who can read the log").

use super::*;

impl Registry {
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
        self.kv().lock_first_start()?;
        let made = self.first_start_locked(now, rng, data_dir);
        if !matches!(made, Ok(Some(_))) {
            self.kv().unlock_first_start();
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
            Some(p) if !p.shown && self.kv().is_shared() => Some(p.clone()),
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
        match self.kv().apply(&ops) {
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
        self.kv().unlock_first_start();
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
}

pub(super) fn new_key_row<R: CryptoRngCore + ?Sized>(
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

/// This machine's host name, for [`FirstStartPlace`].
pub(super) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "this machine".into())
}

/// Whether `presented` equals the stored hex SHA-256, in constant time.
pub(super) fn hash_matches(presented: &[u8; 32], stored_hex: &str) -> bool {
    let mut stored = [0u8; 32];
    hex::decode_to_slice(stored_hex, &mut stored).is_ok() && bool::from(presented.ct_eq(&stored))
}
