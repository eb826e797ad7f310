//! An agent of an end-to-end test: its name, key and chain head, records
//! signed for it, and its registration over HTTP (docs/api.md "Agents").

use rand_core::OsRng;
use serde_json::json;
use tally_schemas::record::NoteBody;
use tally_schemas::{
    AgentName, Body, Hash, Nonce, Record, SecretKey, Seq, UnixMillis, UnsignedRecord,
};

pub(crate) struct Agent {
    pub(crate) name: AgentName,
    pub(crate) key: SecretKey,
    /// The seq of its next record.
    pub(crate) seq: u64,
    /// The hash of its chain's head.
    pub(crate) prev: Option<Hash>,
}

impl Agent {
    /// A new agent with a fresh key and an empty chain.
    pub(crate) fn new(name: &str) -> Self {
        Self {
            name: AgentName::new(name).unwrap(),
            key: SecretKey::generate(&mut OsRng),
            seq: 0,
            prev: None,
        }
    }

    /// The agent's next note, signed with `key`, timed `time`.
    pub(crate) fn record_with(
        &self,
        key: &SecretKey,
        text: &str,
        time: UnixMillis,
        nonce: Nonce,
    ) -> Record {
        UnsignedRecord {
            agent: self.name.clone(),
            key_id: key.public_key().key_id(),
            seq: Seq::new(self.seq).unwrap(),
            prev: self.prev,
            time,
            nonce,
            body: Body::Note(NoteBody {
                text: text.to_owned(),
            }),
        }
        .sign(key)
        .unwrap()
    }

    /// The agent's next note, signed with its key now, with `nonce`.
    pub(crate) fn record(&self, text: &str, nonce: Nonce) -> Record {
        self.record_with(&self.key, text, UnixMillis::now(), nonce)
    }

    /// The agent's next note, signed with its key now, with a fresh nonce;
    /// not yet taken as the head.
    pub(crate) fn draft(&self, text: &str) -> Record {
        self.record(text, Nonce::random(&mut OsRng))
    }

    /// [`Agent::draft`], taken as the chain's head.
    pub(crate) fn next(&mut self, text: &str) -> Record {
        let r = self.draft(text);
        self.accepted(&r);
        r
    }

    /// Takes `r` as the chain's head.
    pub(crate) fn accepted(&mut self, r: &Record) {
        self.seq = r.seq.get() + 1;
        self.prev = Some(r.hash());
    }

    /// Registers the agent at `url` with its key, valid from a minute ago;
    /// asserts `201`.
    pub(crate) async fn register(&self, http: &reqwest::Client, url: &str, api_key: &str) {
        let r = http
            .post(format!("{url}/v1/agents"))
            .bearer_auth(api_key)
            .json(&json!({"agent": self.name, "public_key": self.key.public_key(), "not_before": UnixMillis::new(UnixMillis::now().as_millis() - 60_000)}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 201);
    }
}
