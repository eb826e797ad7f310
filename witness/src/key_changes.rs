//! Key changes that never rewrite witnessed history (docs/protocol.md §4.1
//! "Key changes"; docs/threat-model.md "Key changes and history").
//!
//! Registering an agent, rotating its key and retiring it set the validity
//! ranges that agent-keys.json carries, and check 2 of the verifier judges
//! every record of the agent against those ranges, the records admitted
//! before the change included. So a change may take effect only after the
//! latest `time` of every record the witness has admitted for the agent, and
//! not before the witness clock minus the skew bound; an earlier instant is
//! refused with `retroactive_key_change`. Without an instant, a change takes
//! effect at the later of now and just after that latest record.
//!
//! The latest record time is the larger of two figures: the records of the
//! agent queued for the log since this process started (counted by
//! admission), and the records the log held when this process first needed
//! the figure (read once per agent from its chain). Records queued but then
//! refused by the log are counted too: that only makes a change wait longer.
//!
//! Admission and key changes meet at a per-agent fence (`agent_fence`): an
//! admission holds it from its last look at the agent's keys until its
//! record is in the log's queue and counted; a key change holds it from its
//! check against the count until the registry has durably written the new
//! ranges. So a record admitted while a key change runs is either counted
//! before the change is checked, or itself checked against the new ranges.
//! That fence, and the figure above, are this process's: they hold for a
//! log only this process writes (redb).
//!
//! On PostgreSQL, where several fronts admit records into one log, the
//! fence is the database's (`tally_log::store::postgres::fence`, table
//! `log_agent_fence`): each agent has a key version, which every key
//! change increments, and the latest `time` of its committed records, which
//! the sequencer's commit raises. Admission notes the key version it
//! checked the key against (`Registry::with_agent_version`) and hands it
//! to the log with the record; the commit transaction refuses a record
//! admitted under an older version (`AppendError::KeyChanged`), and the
//! front that admitted it reloads the registry and admits it again (under
//! the new ranges, or refused `key_not_active`), as if it had arrived after
//! the change. A key change is one transaction that locks the agent's row
//! first, then reads the latest committed time from it, checks its instant
//! ([`effective_at`]), writes the new ranges and bumps the version
//! (`Registry::change_keys_fenced`). The row lock orders the two: a record
//! and a key change of its agent, through any two fronts, are either
//! committed before the change reads the time, or checked again against
//! the new ranges. Records queued but not committed are not counted there:
//! they are checked again instead.

use std::sync::Arc;

use tally_log::Log;
use tally_schemas::time::MAX_TIME;
use tally_schemas::{AgentName, PublicKey, Seq, UnixMillis};

use crate::agent_fence::Fence;
use crate::error::{blocking, WitnessError};
use crate::registry::{AgentRow, KeyChange};
use crate::witness::Witness;

/// The latest `time` among `agent`'s records in the log (blocking: reads
/// the whole chain, once per agent and process).
fn latest_stored_time(log: &Log, agent: &AgentName) -> Result<Option<UnixMillis>, WitnessError> {
    let mut latest = None;
    for item in log.chain_entries(agent, Seq::GENESIS, None) {
        let time = item?.entry.record().time;
        latest = latest.max(Some(time));
    }
    Ok(latest)
}

/// `agent`'s fence, with the stored record times read.
async fn fence_with_history(w: &Arc<Witness>, agent: &AgentName) -> Result<Fence, WitnessError> {
    let fence = w.key_changes().fence(agent).await;
    if fence.stored.is_some() {
        return Ok(fence);
    }
    // The chain is read without the fence, so admissions of the agent go
    // on meanwhile: whatever they queue is counted in `queued`, and the
    // read sees at least every record stored before this process started.
    drop(fence);
    let (log, a) = (Arc::clone(w.log()), agent.clone());
    let stored = blocking(move || latest_stored_time(&log, &a)).await?;
    let mut fence = w.key_changes().fence(agent).await;
    fence.stored.get_or_insert(stored);
    Ok(fence)
}

/// The instant a change of `agent`'s keys takes effect: `at` when it does
/// not reach back before the agent's latest admitted record or the skew
/// bound, else a refusal; without `at`, the later of now and just after
/// that record.
fn effective_at(
    w: &Witness,
    agent: &AgentName,
    latest: Option<UnixMillis>,
    at: Option<UnixMillis>,
) -> Result<UnixMillis, WitnessError> {
    let now = w.now().as_millis();
    let skew = i64::try_from(w.config().max_skew_ms).unwrap_or(i64::MAX);
    let after_latest = latest.map_or(i64::MIN, |t| t.as_millis().saturating_add(1));
    let earliest = now.saturating_sub(skew).max(after_latest);
    let wanted = at.map_or(now.max(after_latest), UnixMillis::as_millis);
    if wanted < earliest || wanted > MAX_TIME.as_millis() {
        return Err(WitnessError::RetroactiveKeyChange {
            agent: agent.clone(),
            at: UnixMillis::new(wanted.min(MAX_TIME.as_millis())),
            earliest_at: UnixMillis::new(earliest.clamp(0, MAX_TIME.as_millis())),
            latest_record_time: latest,
        });
    }
    Ok(UnixMillis::new(wanted))
}

/// Rotates or retires `agent`'s keys for `project` at `at` (default: see
/// [`effective_at`]), never before a record the witness admitted.
///
/// # Errors
/// `AgentNotAllowed`, `UnusableKey` (rotate), `RetroactiveKeyChange`, and
/// the registry's refusals (`Exists`, `bad_time`, `too_many_keys`).
pub(crate) async fn change_keys(
    w: &Arc<Witness>,
    project: &str,
    agent: &AgentName,
    change: KeyChange,
    at: Option<UnixMillis>,
) -> Result<AgentRow, WitnessError> {
    w.registry().owned_agent(project, agent)?;
    if w.registry().is_shared() {
        // The database's fence (module docs): the check runs inside the
        // key change's transaction, against the latest committed time.
        let (reg, project, a) = (Arc::clone(w.registry()), project.to_owned(), agent.clone());
        let witness = Arc::clone(w);
        return blocking(move || {
            reg.change_keys_fenced(&project, &a, change, |latest| {
                effective_at(&witness, &a, latest, at)
            })
        })
        .await;
    }
    let fence = fence_with_history(w, agent).await?;
    let latest = fence.latest().flatten();
    let at = effective_at(w, agent, latest, at)?;
    // Written durably with the fence held: no record of the agent is
    // queued between the check above and the new ranges being in force.
    let (reg, project, a) = (Arc::clone(w.registry()), project.to_owned(), agent.clone());
    let row = blocking(move || match change {
        KeyChange::Rotate(public_key) => reg.rotate_key(&project, &a, public_key, at),
        KeyChange::Retire => reg.retire_agent(&project, &a, at),
    })
    .await?;
    drop(fence);
    Ok(row)
}

/// Registers `agent` in `project` with its first key, valid from
/// `not_before` (default: the witness clock minus the skew bound, so records
/// the agent signed shortly before it was registered are admitted). A name
/// another project holds, or one the log already has a chain for, is
/// `name_unavailable`; one the project holds is `exists`.
///
/// # Errors
/// `UnusableKey`, `Exists`, `NameUnavailable`, storage failures.
pub(crate) async fn add_agent(
    w: &Arc<Witness>,
    project: &str,
    agent: &AgentName,
    public_key: PublicKey,
    not_before: Option<UnixMillis>,
) -> Result<AgentRow, WitnessError> {
    w.registry().check_name_free(project, agent)?;
    // A chain without a registration (a registry restored from an older
    // backup than the log) keeps its name: a new key list for it would
    // make its records fail check 2.
    let (log, a) = (Arc::clone(w.log()), agent.clone());
    if blocking(move || Ok::<_, WitnessError>(log.chain_head(&a)?))
        .await?
        .is_some()
    {
        return Err(WitnessError::NameUnavailable {
            agent: agent.clone(),
        });
    }
    let not_before = not_before.unwrap_or_else(|| {
        let skew = i64::try_from(w.config().max_skew_ms).unwrap_or(i64::MAX);
        UnixMillis::new(w.now().as_millis().saturating_sub(skew).max(0))
    });
    let (reg, project, a) = (Arc::clone(w.registry()), project.to_owned(), agent.clone());
    blocking(move || reg.add_agent(&project, &a, public_key, not_before)).await
}
