//! The key-change fence in the database (migration 0005, table
//! `log_agent_fence`; docs/protocol.md §4.1 "Key changes"; contract rule 8
//! of [`crate::store`]). One row per agent: the latest `time` of its
//! committed records and its key version.
//!
//! Two transactions meet at an agent's row, and the row lock orders them:
//! - the sequencer's commit ([`check_and_record`], inside
//!   `PostgresStore::commit_batches`) upserts the rows of its batch's
//!   agents, raising `latest_time`, and refuses the batch when a record was
//!   admitted under another key version than the row's;
//! - a key change (the registry's, through [`lock_agent`] and
//!   [`bump_key_version`]) locks the row first, reads `latest_time`,
//!   checks its instant against it, writes the new ranges and bumps the
//!   version, all in one transaction.
//!
//! So either the commit locks the row first, and the key change, waiting
//! for it, reads a `latest_time` that counts the committed records; or the
//! key change does, and the commit, waiting for it, sees the new version
//! and refuses the records admitted under the old ranges, which their
//! front checks again.

use std::collections::{BTreeMap, HashMap};

use tally_schemas::{AgentName, UnixMillis};
use tokio_postgres::{GenericClient, Transaction};

use super::sql::backend;
use crate::store::{BatchWrite, KeyVersion, StoreError};

/// Each agent of `batches` (sorted, once) and the latest `time` of its
/// entries there, as the arrays of [`check_and_record`].
pub(super) fn latest_times(batches: &[BatchWrite]) -> (Vec<&str>, Vec<i64>) {
    let mut latest: BTreeMap<&str, i64> = BTreeMap::new();
    for e in batches.iter().flat_map(|b| &b.entries) {
        let t = e.time.as_millis();
        latest
            .entry(e.agent.as_str())
            .and_modify(|m| *m = (*m).max(t))
            .or_insert(t);
    }
    latest.into_iter().unzip()
}

/// Inside a commit transaction: raises each agent's `latest_time` (locking
/// its row until the commit, in name order) and checks every expected key
/// version against the row's.
///
/// # Errors
/// [`StoreError::KeysChanged`] naming the agents whose version moved (the
/// caller drops the transaction: nothing is written);
/// [`StoreError::Backend`].
pub(super) async fn check_and_record(
    tx: &Transaction<'_>,
    agents: &[&str],
    times: &[i64],
    expected: &[&(AgentName, KeyVersion)],
) -> Result<(), StoreError> {
    if agents.is_empty() {
        return Ok(());
    }
    let rows = tx
        .query(
            "INSERT INTO log_agent_fence (agent, latest_time)
             SELECT * FROM unnest($1::text[], $2::bigint[])
             ON CONFLICT (agent) DO UPDATE
                 SET latest_time = greatest(log_agent_fence.latest_time, EXCLUDED.latest_time)
             RETURNING agent, key_version",
            &[&agents, &times],
        )
        .await
        .map_err(|e| backend(&e))?;
    let current: HashMap<String, i64> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let mut changed: Vec<(AgentName, KeyVersion)> = expected
        .iter()
        .filter_map(|(agent, v)| match current.get(agent.as_str()) {
            Some(&now) if now != v.get() => Some((agent.clone(), KeyVersion::new(now))),
            // Current, or an agent with no entry in the batch (nothing of
            // it is written).
            _ => None,
        })
        .collect();
    if changed.is_empty() {
        return Ok(());
    }
    changed.sort();
    changed.dedup();
    Err(StoreError::KeysChanged(changed))
}

/// For a key change of `agent`, first thing in its transaction: locks the
/// agent's row (making it if the agent has none yet) until the transaction
/// ends, and returns its key version and the latest `time` of its
/// committed records (`None` without records), as committed when the lock
/// was granted.
///
/// # Errors
/// The database's.
pub async fn lock_agent(
    tx: &Transaction<'_>,
    agent: &str,
) -> Result<(KeyVersion, Option<UnixMillis>), tokio_postgres::Error> {
    tx.execute(
        "INSERT INTO log_agent_fence (agent) VALUES ($1) ON CONFLICT (agent) DO NOTHING",
        &[&agent],
    )
    .await?;
    let row = tx
        .query_one(
            "SELECT key_version, latest_time FROM log_agent_fence WHERE agent = $1 FOR UPDATE",
            &[&agent],
        )
        .await?;
    Ok((
        KeyVersion::new(row.get(0)),
        row.get::<_, Option<i64>>(1).map(UnixMillis::new),
    ))
}

/// For a key change of `agent`, in the transaction that writes its new
/// ranges, after [`lock_agent`]: increments its key version, so that every
/// record admitted under the old ranges and not yet committed is refused
/// by the commit; returns the new version.
///
/// # Errors
/// The database's.
pub async fn bump_key_version(
    tx: &Transaction<'_>,
    agent: &str,
) -> Result<KeyVersion, tokio_postgres::Error> {
    let row = tx
        .query_one(
            "UPDATE log_agent_fence SET key_version = key_version + 1 WHERE agent = $1
             RETURNING key_version",
            &[&agent],
        )
        .await?;
    Ok(KeyVersion::new(row.get(0)))
}

/// Every agent's key version, or `None` when the database has no log
/// tables yet (a registry opened on a database the log never opened);
/// agents without a row are at version 0.
///
/// # Errors
/// The database's.
pub async fn key_versions(
    c: &impl GenericClient,
) -> Result<Option<Vec<(String, KeyVersion)>>, tokio_postgres::Error> {
    let exists: bool = c
        .query_one("SELECT to_regclass('log_agent_fence') IS NOT NULL", &[])
        .await?
        .get(0);
    if !exists {
        return Ok(None);
    }
    let rows = c
        .query(
            "SELECT agent, key_version FROM log_agent_fence WHERE key_version <> 0",
            &[],
        )
        .await?;
    Ok(Some(
        rows.iter()
            .map(|r| (r.get(0), KeyVersion::new(r.get(1))))
            .collect(),
    ))
}
