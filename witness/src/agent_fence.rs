//! The per-agent fence between admission and key changes (the module
//! docs of `key_changes` say what it orders): an admission holds an
//! agent's fence from its last look at the agent's keys until its record
//! is queued and counted; a key change holds it from its check until the
//! new ranges are written. Kept apart from `key_changes` so that admission
//! (module `witness`) and key changes (which call the witness) do not
//! import each other.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use tally_schemas::{AgentName, UnixMillis};
use tokio::sync::{Mutex, OwnedMutexGuard};

/// What the witness knows of one agent's admitted record times.
#[derive(Debug, Default)]
pub struct AgentTimes {
    /// The latest `time` of the agent's records queued since the start.
    queued: Option<UnixMillis>,
    /// The latest `time` among the records the log held when first read;
    /// `None` until read.
    pub(crate) stored: Option<Option<UnixMillis>>,
}

impl AgentTimes {
    /// Counts a record of the agent handed to the log's queue.
    pub fn queued(&mut self, time: UnixMillis) {
        self.queued = self.queued.max(Some(time));
    }

    /// The latest admitted record time, once the stored records were read.
    pub(crate) fn latest(&self) -> Option<Option<UnixMillis>> {
        self.stored.map(|stored| stored.max(self.queued))
    }
}

/// The fence of one agent, held by an admission or a key change.
pub(crate) type Fence = OwnedMutexGuard<AgentTimes>;

/// The per-agent fences. See the module docs.
#[derive(Debug, Default)]
pub struct KeyChanges {
    agents: RwLock<HashMap<AgentName, Arc<Mutex<AgentTimes>>>>,
}

impl KeyChanges {
    /// Waits for `agent`'s fence. The map grows by one entry per agent that
    /// reaches this point, which only registered agents do.
    pub async fn fence(&self, agent: &AgentName) -> Fence {
        let existing = self
            .agents
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(agent)
            .cloned();
        let lock = match existing {
            Some(lock) => lock,
            None => Arc::clone(
                self.agents
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .entry(agent.clone())
                    .or_default(),
            ),
        };
        lock.lock_owned().await
    }
}
