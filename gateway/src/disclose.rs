//! One call's content and salts from the agent's local store, as a
//! disclosure (docs/protocol.md §6.3): its arguments and/or its result with
//! the salts of the decision's and the outcome's salted hashes (§6.1). Read
//! by the writer that holds the chain store ([`crate::chain::peek_disclosure`]
//! asks it when another process holds it), and written to a file by
//! `tally disclose`.

use tally_schemas::disclosure::{DisclosedPart, Disclosure, DISCLOSURE_VERSION};
use tally_schemas::display::escape;
use tally_schemas::{AgentName, Body, Record};

use crate::store::ChainStore;

/// Which parts of the call to disclose; neither means both (the output
/// only when the call has one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Parts {
    /// The call's arguments (the decision's `input_hash`).
    pub input: bool,
    /// The call's result or error (the outcome's `output_hash`).
    pub output: bool,
}

/// The latest decision with `call_id` in the store, and its outcome.
fn find(store: &ChainStore, call_id: &str) -> Result<(Option<Record>, Option<Record>), String> {
    let (mut decision, mut outcome) = (None, None);
    let mut from = 0;
    loop {
        let batch = store.records(from, 1024).map_err(|e| e.to_string())?;
        let Some(last) = batch.last() else { break };
        from = last.seq.get() + 1;
        for r in batch {
            match &r.body {
                Body::Decision(d) if d.call_id == call_id => {
                    decision = Some(r);
                    outcome = None;
                }
                Body::Outcome(o) if o.call_id == call_id && decision.is_some() => {
                    outcome = Some(r);
                }
                _ => {}
            }
        }
    }
    Ok((decision, outcome))
}

fn part(store: &ChainStore, r: &Record, what: &str) -> Result<DisclosedPart, String> {
    let seq = r.seq.get();
    let secret = store
        .secret(seq)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("the local store holds no salt for {what} record seq {seq}"))?;
    let Some(content) = secret.content else {
        return Err(format!(
            "the local store keeps the salt of seq {seq} but not its content: the agent ran without --store-content, so the {what} cannot be disclosed"
        ));
    };
    Ok(DisclosedPart {
        seq,
        salt: secret.salt,
        content,
    })
}

/// The disclosure of `agent`'s call `call_id` from `store`.
///
/// # Errors
/// A message for the user: no such call in the chain, another agent's
/// record, content the agent did not keep, no output to disclose, storage.
pub fn disclose(
    store: &ChainStore,
    agent: &AgentName,
    call_id: &str,
    parts: Parts,
) -> Result<Disclosure, String> {
    let (decision, outcome) = find(store, call_id)?;
    let Some(decision) = decision else {
        return Err(format!(
            "agent {agent}'s chain holds no call {:?}: a disclosure is made from the chain of the agent that made the call",
            escape(call_id)
        ));
    };
    if &decision.agent != agent {
        return Err(format!(
            "record seq {} of the store is agent {}'s, not {agent}'s",
            decision.seq.get(),
            decision.agent
        ));
    }
    let both = !parts.input && !parts.output;
    let input = if parts.input || both {
        Some(part(store, &decision, "input")?)
    } else {
        None
    };
    let has_output = |r: &Record| matches!(&r.body, Body::Outcome(o) if o.output_hash.is_some());
    let output = match &outcome {
        Some(o) if has_output(o) && (parts.output || both) => Some(part(store, o, "output")?),
        Some(o) if parts.output => {
            return Err(format!(
            "call {:?} ended {} (seq {}) without a result or error: there is no output to disclose",
            escape(call_id),
            match &o.body {
                Body::Outcome(x) => x.status.as_str(),
                _ => "?",
            },
            o.seq.get()
        ))
        }
        None if parts.output => {
            return Err(format!(
            "call {:?} has no outcome in agent {agent}'s chain yet: there is no output to disclose",
            escape(call_id)
        ))
        }
        _ => None,
    };
    Ok(Disclosure {
        v: DISCLOSURE_VERSION,
        agent: agent.as_str().to_owned(),
        call_id: call_id.to_owned(),
        input,
        output,
    })
}
