//! Check 3, `record_signatures` (docs/protocol.md §3.1, §4.3 and §11):
//! every record's signature verifies strictly with the trusted key its
//! `key_id` names. The verification runs on the worker threads
//! ([`crate::sig::verify_record`]); this counts what they found.
//!
//! A record whose `key_id` names no trusted key is not judged here (check 2
//! fails it). When at least one record reached this check and none named a
//! trusted key, the check is `not checked`: the input it needs, a trusted
//! key, was not given. A pack with no records passes.

use tally_schemas::report::{CheckId, CheckResult};

use super::{plural, Facts};
use crate::tally::Tally;

pub(crate) struct RecordSignatures {
    tally: Tally,
    verified: u64,
    no_trusted_key: u64,
}

impl RecordSignatures {
    pub(crate) fn new() -> Self {
        Self {
            tally: Tally::new(CheckId::RecordSignatures),
            verified: 0,
            no_trusted_key: 0,
        }
    }

    pub(crate) fn record(&mut self, f: &Facts<'_>) {
        match f.work.sig_ok {
            Some(true) => self.verified += 1,
            Some(false) => self
                .tally
                .fail(f.named(), "signature does not verify (strict Ed25519)"),
            None => self.no_trusted_key += 1,
        }
    }

    pub(crate) fn finish(mut self) -> CheckResult {
        if self.verified == 0 && self.no_trusted_key > 0 && !self.tally.failed() {
            self.tally.not_checked(
                "no record names a trusted key, so no signature could be checked (see agent_keys)",
            );
        }
        let mut message = format!(
            "{} verify (strict Ed25519)",
            plural(self.verified, "signature", "signatures")
        );
        if self.no_trusted_key > 0 {
            message.push_str(&format!(
                "; {} not checked: no trusted key (see agent_keys)",
                plural(self.no_trusted_key, "record", "records")
            ));
        }
        self.tally.finish(message)
    }
}
