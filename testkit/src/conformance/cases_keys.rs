//! Cases of agent-keys.json (protocol.md §9.3, §4.3) and of checks 2
//! (`agent_keys`) and 3 (`record_signatures`).

use std::collections::BTreeMap;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tally_schemas::keys::KEY_ID_DOMAIN;
use tally_schemas::pack::AgentKeys;
use tally_schemas::UnixMillis;

use super::base::{case, finish, finish_with, small, Base, SMALL_COVERAGE};
use super::case::{Case, Expected};
use crate::fixture::{self, key_from_label, note, PackSpec};

/// ℓ, the order of the prime subgroup, little-endian.
const ELL: [u8; 32] = [
    0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9, 0xde, 0x14,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
];

/// The signature with `S + ℓ` for `S`: the same signature to a lax
/// verifier, a non-canonical one to a strict verifier (§4.3).
fn s_plus_ell(sig: &[u8; 64]) -> [u8; 64] {
    let mut out = *sig;
    let mut carry = 0u16;
    for i in 0..32 {
        let v = u16::from(sig[32 + i]) + u16::from(ELL[i]) + carry;
        out[32 + i] = (v & 0xff) as u8;
        carry = v >> 8;
    }
    out
}

/// The JSON of the base's agent-keys.json, to edit.
fn keys_value(b: &Base) -> Value {
    serde_json::to_value(&b.keys).expect("serialisable")
}

fn keys_bytes(v: &Value) -> Vec<u8> {
    super::base::canon(v)
}

/// The key id of 32 raw bytes, whatever they are (§4.2).
fn key_id_of(bytes: &[u8; 32]) -> String {
    let mut h = Sha256::new();
    h.update(KEY_ID_DOMAIN);
    h.update(bytes);
    hex::encode(&h.finalize()[..8])
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The time of `agent#seq` in the base pack, in Unix milliseconds.
fn time_of(b: &Base, agent: &str, seq: u64) -> i64 {
    b.fx.entries
        .iter()
        .find(|e| e.record.agent.as_str() == agent && e.record.seq.get() == seq)
        .map(|e| e.record.time.as_millis())
        .expect("record in the base")
}

#[allow(clippy::too_many_lines)]
pub(super) fn cases(b: &Base) -> Vec<Case> {
    let mut out = Vec::new();
    let pack = b.lines().join();
    let mut with_keys = |name: &str, section, rule: &str, description: &str, keys: Vec<u8>, e| {
        let mut i = b.inputs(pack.clone());
        i.agent_keys = keys;
        out.push(case(name, section, rule, description, i, e));
    };
    let edited = |f: &dyn Fn(&mut AgentKeys)| {
        let mut k = b.keys.clone();
        f(&mut k);
        fixture::to_json(&k)
    };

    // --- check 2 -----------------------------------------------------------
    with_keys(
        "agent-keys-missing-agent",
        "§11 checks 2 and 11",
        "A record whose agent has no entry in agent-keys.json fails agent_keys; a head record's key must be trusted too.",
        "agent-keys.json has no entry for mail-bot",
        edited(&|k| k.agents.retain(|a| a.agent.as_str() != "mail-bot")),
        b.passing().fail(&["agent_keys", "head"]),
    );
    with_keys(
        "key-only-in-pack",
        "§5.5, §11 checks 2 and 11",
        "Trust never comes from the pack: a key a key_rotation names is trusted only when agent-keys.json lists it.",
        "mail-bot rotated to a key that agent-keys.json does not list",
        edited(&|k| {
            for a in &mut k.agents {
                if a.agent.as_str() == "mail-bot" {
                    a.keys.truncate(1);
                }
            }
        }),
        b.passing().fail(&["agent_keys", "head"]),
    );
    let set_claims = |f: &dyn Fn(&mut tally_schemas::pack::AgentKey)| {
        edited(&|k| {
            for a in &mut k.agents {
                if a.agent.as_str() == "claims-bot" {
                    f(&mut a.keys[0]);
                }
            }
        })
    };
    with_keys(
        "key-retired-before-most-records",
        "§9.3, §11 checks 2 and 11",
        "A key is active at t when not_before ≤ t < not_after; records signed outside that range fail agent_keys.",
        "claims-bot's key is retired 5 s after the epoch, before most of its records",
        set_claims(&|k| k.not_after = Some(UnixMillis::new(fixture::EPOCH_MS + 5_000))),
        b.passing().fail(&["agent_keys", "head"]),
    );
    let t0 = time_of(b, "claims-bot", 0);
    let t8 = time_of(b, "claims-bot", 8);
    with_keys(
        "key-not-yet-valid",
        "§9.3, §11 check 2",
        "A record made before its key's not_before fails agent_keys.",
        "claims-bot's key is valid from 1 ms after its first record's time",
        set_claims(&|k| k.not_before = UnixMillis::new(t0 + 1)),
        b.passing().fail(&["agent_keys"]),
    );
    with_keys(
        "key-valid-from-the-record-time",
        "§9.3, §11 check 2",
        "not_before is inclusive: a record made at exactly not_before passes.",
        "claims-bot's key is valid from its first record's time exactly",
        set_claims(&|k| k.not_before = UnixMillis::new(t0)),
        b.passing(),
    );
    with_keys(
        "key-retired-at-the-record-time",
        "§9.3, §11 checks 2 and 11",
        "not_after is exclusive: a record made at exactly not_after fails agent_keys (and so does the same record in head.json).",
        "claims-bot's key is retired at its last record's time exactly",
        set_claims(&|k| k.not_after = Some(UnixMillis::new(t8))),
        b.passing().fail(&["agent_keys", "head"]),
    );
    with_keys(
        "key-retired-just-after-the-record-time",
        "§9.3, §11 check 2",
        "A record made 1 ms before not_after passes.",
        "claims-bot's key is retired 1 ms after its last record's time",
        set_claims(&|k| k.not_after = Some(UnixMillis::new(t8 + 1))),
        b.passing(),
    );
    with_keys(
        "key-never-active",
        "§9.3, §11 checks 2 and 11",
        "A key with not_after ≤ not_before is never active.",
        "claims-bot's key has not_before = not_after = its first record's time",
        set_claims(&|k| {
            k.not_before = UnixMillis::new(t0);
            k.not_after = Some(UnixMillis::new(t0));
        }),
        b.passing().fail(&["agent_keys", "head"]),
    );
    with_keys(
        "agent-keys-other-origin",
        "§11 check 2",
        "agent-keys.json's origin must equal the pack's; otherwise agent_keys fails.",
        "agent-keys.json is for origin other.example/log",
        edited(&|k| k.origin = "other.example/log".into()),
        b.passing().fail(&["agent_keys"]),
    );
    {
        let claims_key = b.keys.agents[0].keys[0].clone();
        with_keys(
            "agent-keys-same-key-for-two-agents",
            "§9.3",
            "The same key may be listed for two agents.",
            "claims-bot's key is also listed for mail-bot",
            edited(&|k| {
                for a in &mut k.agents {
                    if a.agent.as_str() == "mail-bot" {
                        a.keys.push(claims_key.clone());
                    }
                }
            }),
            b.passing(),
        );
    }
    with_keys(
        "agent-keys-in-any-order",
        "§9.3",
        "agent-keys.json may list its agents in any order, and agents the pack does not hold.",
        "the agents are listed in reverse order, after an agent that is not in the pack",
        {
            let mut v = keys_value(b);
            let agents = v["agents"].as_array_mut().expect("agents");
            agents.reverse();
            agents.push(json!({"agent": "zz-unused", "keys": []}));
            keys_bytes(&v)
        },
        b.passing(),
    );
    with_keys(
        "no-record-names-a-trusted-key",
        "§11 checks 2, 3 and 11",
        "When no record names a trusted key, record_signatures is not checked (agent_keys fails each record).",
        "agent-keys.json lists, for each agent, only a key none of its records names",
        edited(&|k| {
            for (i, a) in k.agents.iter_mut().enumerate() {
                let other = key_from_label(&format!("unused/{i}")).public_key();
                a.keys = vec![tally_schemas::pack::AgentKey {
                    key_id: other.key_id(),
                    public_key: other,
                    not_before: UnixMillis::new(fixture::EPOCH_MS),
                    not_after: None,
                }];
            }
        }),
        b.passing()
            .fail(&["agent_keys", "head"])
            .not_checked(&["record_signatures"]),
    );

    // --- agent-keys.json refused as a whole (exit 2) ------------------------
    let usage = |name: &str, rule: &str, description: &str, keys: Vec<u8>| {
        let mut i = b.inputs(pack.clone());
        i.agent_keys = keys;
        case(name, "§9.3", rule, description, i, Expected::UsageError)
    };
    let mut refused = vec![
        usage(
            "agent-keys-duplicate-agent",
            "agent-keys.json that lists an agent twice is refused as a whole: a usage error (exit 2).",
            "claims-bot is listed twice",
            edited(&|k| {
                let again = k.agents[0].clone();
                k.agents.push(again);
            }),
        ),
        usage(
            "agent-keys-duplicate-key-id",
            "agent-keys.json that lists one key id twice for an agent is refused as a whole.",
            "claims-bot's key is listed twice, with different validity",
            edited(&|k| {
                let mut again = k.agents[0].keys[0].clone();
                again.not_before = UnixMillis::new(fixture::EPOCH_MS + 1);
                k.agents[0].keys.push(again);
            }),
        ),
        usage(
            "agent-keys-key-id-mismatch",
            "Each key_id must be the key id of its public_key (§4.2); otherwise the file is refused.",
            "claims-bot's key_id is mail-bot's",
            {
                let mut v = keys_value(b);
                let other = v["agents"][1]["keys"][0]["key_id"].clone();
                v["agents"][0]["keys"][0]["key_id"] = other;
                keys_bytes(&v)
            },
        ),
        usage(
            "agent-keys-version-2",
            "agent-keys.json of another version is refused (§12).",
            "v is 2",
            {
                let mut v = keys_value(b);
                v["v"] = json!(2);
                keys_bytes(&v)
            },
        ),
        usage(
            "agent-keys-unknown-member",
            "agent-keys.json has exactly the members §9.3 lists (§2).",
            "a key gains a member \"comment\"",
            {
                let mut v = keys_value(b);
                v["agents"][0]["keys"][0]["comment"] = json!("primary");
                keys_bytes(&v)
            },
        ),
        usage(
            "agent-keys-not-after-omitted",
            "not_after is always present: null for a key in use, never omitted.",
            "claims-bot's key has no not_after member",
            {
                let mut v = keys_value(b);
                v["agents"][0]["keys"][0]
                    .as_object_mut()
                    .expect("key")
                    .remove("not_after");
                keys_bytes(&v)
            },
        ),
        usage(
            "agent-keys-too-many-keys",
            "An agent lists at most MAX_KEYS_PER_AGENT (64) keys.",
            "claims-bot lists 65 keys",
            edited(&|k| {
                for i in 0..64 {
                    let key = key_from_label(&format!("extra/{i}")).public_key();
                    k.agents[0].keys.push(tally_schemas::pack::AgentKey {
                        key_id: key.key_id(),
                        public_key: key,
                        not_before: UnixMillis::new(fixture::EPOCH_MS),
                        not_after: None,
                    });
                }
            }),
        ),
        usage(
            "agent-keys-too-many-agents",
            "agent-keys.json lists at most MAX_AGENTS_PER_PACK (4,096) agents.",
            "4,097 agents are listed (most of them with no keys)",
            {
                let mut v = keys_value(b);
                let agents = v["agents"].as_array_mut().expect("agents");
                for i in 0..(4_097 - agents.len()) {
                    agents.push(json!({"agent": format!("k{i:04}"), "keys": []}));
                }
                keys_bytes(&v)
            },
        ),
    ];
    {
        // Public keys that are not usable (§4.3), each with its own key id
        // so that only the key itself is wrong.
        let good = b.keys.agents[0].keys[0].public_key.to_bytes();
        let mut identity = [0u8; 32];
        identity[0] = 1;
        // y = p + 1: the identity written with a non-canonical y.
        let mut p_plus_1 = [0xffu8; 32];
        p_plus_1[0] = 0xee;
        p_plus_1[31] = 0x7f;
        // A y whose x² is not a square: no point (found by trying y = 2, 3, …).
        let not_a_point = (2u8..)
            .map(|y| {
                let mut b = [0u8; 32];
                b[0] = y;
                b
            })
            .find(|b| {
                tally_schemas::PublicKey::from_bytes(b)
                    == Err(tally_schemas::keys::KeyError::InvalidPoint)
            })
            .expect("some small y is not on the curve");
        for (name, rule, description, bytes, b64_text) in [
            (
                "agent-keys-small-order-key",
                "A public key must be usable (§4.3): the identity, a point of small order, is refused, and so is the file.",
                "claims-bot's key is the identity point (y = 1)",
                identity,
                None,
            ),
            (
                "agent-keys-non-canonical-key",
                "A public key must be a canonical encoding (§4.3): the identity written with y = p + 1 is refused.",
                "claims-bot's key is the identity written with a non-canonical y",
                p_plus_1,
                None,
            ),
            (
                "agent-keys-key-not-a-point",
                "A public key must decode to a curve point; 32 bytes that do not are refused.",
                "claims-bot's key is 32 bytes that are no point",
                not_a_point,
                None,
            ),
            (
                "agent-keys-non-canonical-base64",
                "A public key is canonical base64 (unused bits zero, §2).",
                "claims-bot's key is its own bytes in base64 with one unused bit set",
                good,
                Some({
                    let text = b64(&good);
                    let alphabet =
                        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
                    let mut chars: Vec<char> = text.chars().collect();
                    let i = chars.len() - 2;
                    let pos = alphabet.find(chars[i]).expect("base64");
                    chars[i] = alphabet.chars().nth(pos ^ 1).expect("base64");
                    chars.into_iter().collect::<String>()
                }),
            ),
        ] {
            let mut v = keys_value(b);
            v["agents"][0]["keys"][0]["public_key"] = json!(b64_text.unwrap_or_else(|| b64(&bytes)));
            v["agents"][0]["keys"][0]["key_id"] = json!(key_id_of(&bytes));
            refused.push(usage(name, rule, description, keys_bytes(&v)));
        }
    }
    out.extend(refused);
    out.extend(signature_cases());
    out.extend(zero_records());
    out.extend(weak_rotation());
    out
}

/// Check 3 on a scenario of its own: a signature that does not verify,
/// lax or strict, on a record that is otherwise in order (witnessed with
/// its receipt, linked to by the next record).
fn signature_cases() -> Vec<Case> {
    let mut out = Vec::new();
    type Tamper = fn(&[u8; 64]) -> [u8; 64];
    let cases: [(&str, &str, &str, Tamper); 2] = [
        (
            "signature-does-not-verify",
            "Every record's signature verifies with the trusted key its key_id names; otherwise record_signatures fails.",
            "claims-bot#1's signature has one bit flipped (the log witnessed it as it is)",
            |s| {
                let mut t = *s;
                t[10] ^= 1;
                t
            },
        ),
        (
            "signature-s-not-canonical",
            "Verification is strict (§4.3): a signature with S + ℓ in place of S, which lax RFC 8032 verifiers accept, fails record_signatures.",
            "claims-bot#1's signature has ℓ added to its S (the log witnessed it as it is)",
            s_plus_ell,
        ),
    ];
    for (name, rule, description, tamper) in cases {
        let mut fx = small();
        let bad = fx.make_with_signature("claims-bot", note("signed oddly"), tamper);
        fx.append(bad, None);
        fx.tick(1000);
        fx.log("claims-bot", note("after it"));
        out.push(case(
            name,
            "§3.1, §4.3, §11 check 3",
            rule,
            description,
            finish(&mut fx),
            Expected::passing(true, &SMALL_COVERAGE, 3).fail(&["record_signatures"]),
        ));
    }
    out
}

/// A `key_rotation` to a weak key (§5.5): the record is refused, so it can
/// only be pending; it is signed validly by the agent's key.
fn weak_rotation() -> Vec<Case> {
    use tally_schemas::record::{Body, KeyRotation, RECORD_SIGNATURE_DOMAIN};
    let mut fx = small();
    fx.log("claims-bot", note("one"));
    let real = key_from_label("claims-bot/2").public_key();
    let draft = fx.draft(
        "claims-bot",
        Body::KeyRotation(KeyRotation {
            new_key_id: real.key_id(),
            new_public_key: real,
        }),
    );
    let mut identity = [0u8; 32];
    identity[0] = 1;
    let mut unsigned: Value =
        serde_json::from_slice(&draft.signing_bytes().expect("in range")).expect("JSON");
    unsigned["body"]["new_public_key"] = json!(b64(&identity));
    unsigned["body"]["new_key_id"] = json!(key_id_of(&identity));
    let sig = fx
        .agent_key("claims-bot")
        .sign(RECORD_SIGNATURE_DOMAIN, &super::base::canon(&unsigned));
    let mut record = unsigned;
    record["sig"] = json!(sig.to_base64());
    let line = super::base::canon(
        &json!({"type": "record", "record": record, "witnessed": null, "receipt": null}),
    );
    let mut inputs = finish(&mut fx);
    let mut l = super::base::Lines(super::cases_pack::split(&inputs.pack));
    let at = l.0.len() - 1;
    l.0.insert(at, line);
    l.set_last_seq("claims-bot", 2);
    l.bump_end(1, 0);
    inputs.pack = l.join();
    vec![case(
        "key-rotation-to-a-weak-key",
        "§4.3, §5.5, §11 check 1",
        "A key_rotation's new_public_key must be a usable key (§4.3): a rotation to the identity point is refused as a record, even validly signed, and fails check 1.",
        "claims-bot signs a key_rotation to the identity point (with its matching key id) at seq 2, pending; the header claims it, so the chain then misses seq 2",
        inputs,
        Expected::passing(true, &SMALL_COVERAGE, 2).fail(&["schema", "chain"]),
    )]
}

/// A pack with no records at all.
fn zero_records() -> Vec<Case> {
    let mut fx = small();
    fx.log("claims-bot", note("one"));
    fx.commit();
    let spec = PackSpec {
        ranges: Some(BTreeMap::new()),
        created: Some(fx.now),
        ..PackSpec::default()
    };
    vec![case(
        "zero-records",
        "§9.1, §11 check 3",
        "A pack may hold no agent and no record; every check then passes, record_signatures included (not checked is only for records none of which names a trusted key).",
        "a header with no agents, no checkpoint or record lines, and an end line counting none; head.json lists claims-bot, which is not in the pack and so only checked",
        finish_with(&fx, &spec),
        Expected::passing(true, &[], 0),
    )]
}
