//! Agents and their keys: registration, ownership, and the key changes
//! (rotation, retirement) that `key_changes` makes (docs/protocol.md §4.1).

use super::*;

impl Registry {
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
        let written = self.kv().apply_fenced(agent.as_str(), |latest| {
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

pub(super) fn name_free(c: &Cache, project: &str, agent: &AgentName) -> Result<(), WitnessError> {
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

pub(super) fn owned(c: &Cache, project: &str, agent: &AgentName) -> Result<AgentRow, WitnessError> {
    match c.agents.get(agent) {
        Some(row) if row.project == project => Ok(row.clone()),
        _ => Err(WitnessError::AgentNotAllowed {
            agent: agent.clone(),
        }),
    }
}

/// `row` after `change` at `at`: a rotation ends every key valid at `at`
/// and adds the new key from `at` on (refusing a key already listed, or one
/// key too many); a retirement ends every key valid at `at`.
pub(super) fn changed_row(
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
pub(super) fn end_keys_at(row: &mut AgentRow, at: UnixMillis) -> Result<(), WitnessError> {
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
