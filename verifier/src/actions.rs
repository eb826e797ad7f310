//! The action statement, docs/protocol.md §11 after coverage: per agent, how
//! its action calls resolved by their own receipts (outcomes with `state`,
//! §5.2) and which text turns claimed an action with no call (`claim`
//! records, §5.6). A statement, never a failure: it informs the auditor
//! the way coverage does. Memory per agent: three counters and at most
//! `MAX_CLAIMS_NAMED` claim names.

use tally_schemas::record::{ActionState, Claim, Outcome};

/// Claims named per agent; more are counted.
const MAX_CLAIMS_NAMED: usize = 100;

/// Action state of one agent.
#[derive(Debug, Default)]
pub(crate) struct Actions {
    posted: u64,
    unknown: u64,
    failed: u64,
    claims: Vec<String>,
    claims_dropped: u64,
}

impl Actions {
    /// An outcome record of the agent.
    pub(crate) fn outcome(&mut self, o: &Outcome) {
        match o.state {
            Some(ActionState::Posted) => self.posted += 1,
            Some(ActionState::Unknown) => self.unknown += 1,
            Some(ActionState::Failed) => self.failed += 1,
            None => {}
        }
    }

    /// A claim record of the agent at `seq`.
    pub(crate) fn claim(&mut self, seq: u64, c: &Claim) {
        if self.claims.len() < MAX_CLAIMS_NAMED {
            self.claims.push(format!("{} at seq {seq}", c.tool));
        } else {
            self.claims_dropped += 1;
        }
    }

    /// The statement lines for `agent`, without the `coverage: ` prefix;
    /// none for an agent with no action outcome and no claim, so packs
    /// without them read as before.
    pub(crate) fn lines(&self, agent: &str) -> Vec<String> {
        let mut out = Vec::new();
        let calls = self.posted + self.unknown + self.failed;
        let claims = self.claims.len() as u64 + self.claims_dropped;
        if calls == 0 && claims == 0 {
            return out;
        }
        out.push(format!(
            "{agent}: action calls: {} posted, {} unknown, {} failed",
            self.posted, self.unknown, self.failed
        ));
        if claims == 0 {
            out.push(format!("{agent}: no claim without a call"));
        } else {
            let what = if claims == 1 {
                "1 claim without a call".to_owned()
            } else {
                format!("{claims} claims without a call")
            };
            let more = if self.claims_dropped > 0 {
                format!(" and {} more", self.claims_dropped)
            } else {
                String::new()
            };
            out.push(format!("{agent}: {what}: {}{more}", self.claims.join(", ")));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_schemas::record::OutcomeStatus;
    use tally_schemas::Hash;

    fn outcome(state: Option<ActionState>) -> Outcome {
        Outcome {
            call_id: "1".into(),
            decision: Hash::sha256(b"d"),
            status: OutcomeStatus::Ok,
            output_hash: None,
            state,
            proof: None,
            proof_hash: None,
        }
    }

    #[test]
    fn no_action_no_line() {
        let mut a = Actions::default();
        a.outcome(&outcome(None));
        assert!(a.lines("bot").is_empty());
    }

    #[test]
    fn counts_and_claims_are_stated() {
        let mut a = Actions::default();
        a.outcome(&outcome(Some(ActionState::Posted)));
        a.outcome(&outcome(Some(ActionState::Posted)));
        a.outcome(&outcome(Some(ActionState::Unknown)));
        a.outcome(&outcome(Some(ActionState::Failed)));
        a.outcome(&outcome(None));
        assert_eq!(
            a.lines("bot"),
            [
                "bot: action calls: 2 posted, 1 unknown, 1 failed",
                "bot: no claim without a call"
            ]
        );
        let claim = Claim {
            tool: "send_email".into(),
            turn_hash: Hash::sha256(b"t"),
        };
        a.claim(7, &claim);
        a.claim(9, &claim);
        assert_eq!(
            a.lines("bot")[1],
            "bot: 2 claims without a call: send_email at seq 7, send_email at seq 9"
        );
    }

    #[test]
    fn claims_beyond_the_cap_are_counted() {
        let mut a = Actions::default();
        let claim = Claim {
            tool: "pay".into(),
            turn_hash: Hash::sha256(b"t"),
        };
        for seq in 0..(MAX_CLAIMS_NAMED as u64 + 3) {
            a.claim(seq, &claim);
        }
        let lines = a.lines("bot");
        assert_eq!(lines[0], "bot: action calls: 0 posted, 0 unknown, 0 failed");
        assert!(lines[1].starts_with("bot: 103 claims without a call: pay at seq 0,"));
        assert!(lines[1].ends_with("pay at seq 99 and 3 more"));
    }
}
