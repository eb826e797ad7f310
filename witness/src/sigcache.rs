//! Prepared keys kept across requests, for the admission path's strict
//! signature checks (docs/protocol.md §4.3).
//!
//! A [`PreparedKey`] answers exactly what `verify_strict` answers, faster
//! per signature, but preparing it costs about as much as
//! [`PREPARE_MIN_SIGNATURES`] verifications' worth of savings (measured
//! with `schemas/examples/sig_rate.rs`). An agent posts the same key for
//! many records over many requests, so the witness keeps the tables of its
//! busiest keys: a key earns a table once it has signed
//! [`PREPARE_MIN_SIGNATURES`] checked records, whichever requests they came
//! in. Every other key is checked with `verify_strict` itself. Either way
//! the answer is the same.
//!
//! - **Off the request path.** A table is built by one background thread,
//!   never by the request that earned it: agents that start together earn
//!   their tables together, and building a few hundred at 2–3 ms each inside
//!   admission held every request behind them for a fraction of a second.
//!   Until its table is ready a key is checked with `verify_strict`. The
//!   thread rests three times as long as each table took, so it takes at
//!   most a quarter of one core from admission (a few hundred keys that earn
//!   tables together get them over a few seconds).
//! - **Bounded.** At most [`MAX_PREPARED_KEYS`] tables are kept (about 30 KiB
//!   each), and at most [`MAX_WAITING_KEYS`] wait to be built. A key that
//!   earns a table when all are taken gets the slot of a table unused for
//!   [`IDLE_EVICTION`] (the one unused the longest), or none: tables are not
//!   traded between keys that are all busy, which would rebuild a table at
//!   every turn and cost more than it saves.

use std::collections::{HashMap, HashSet};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tally_schemas::batch_sig::{PreparedKey, PREPARE_MIN_SIGNATURES};
use tally_schemas::{PublicKey, Record};

/// Most keys the witness keeps prepared (about 30 KiB each: 15 MiB).
pub(crate) const MAX_PREPARED_KEYS: usize = 512;

/// Most keys waiting for the background thread to build their tables.
pub(crate) const MAX_WAITING_KEYS: usize = 1024;

/// A table unused for this long may give its slot to a key that earned one.
pub(crate) const IDLE_EVICTION: Duration = Duration::from_secs(60);

/// How many times as long as it took to build a table the background
/// thread rests before the next.
const BUILD_REST: u32 = 3;

/// Most keys whose uses are counted before the counts start over, so the
/// counts are bounded too.
const MAX_COUNTED_KEYS: usize = 65_536;

/// A prepared table and when it was last used.
struct Slot {
    key: Arc<PreparedKey>,
    used: Instant,
}

#[derive(Default)]
struct Inner {
    prepared: HashMap<[u8; 32], Slot>,
    /// Keys sent to the background thread and not yet built.
    waiting: HashSet<[u8; 32]>,
    uses: HashMap<[u8; 32], usize>,
}

impl Inner {
    /// Frees a slot for a new table if all are taken: the slot of the table
    /// unused the longest, if it has been unused for [`IDLE_EVICTION`].
    /// Returns whether a slot is free.
    fn make_room(&mut self, now: Instant) -> bool {
        if self.prepared.len() + self.waiting.len() < MAX_PREPARED_KEYS {
            return true;
        }
        let oldest = self
            .prepared
            .iter()
            .min_by_key(|(_, slot)| slot.used)
            .map(|(id, slot)| (*id, slot.used));
        match oldest {
            Some((id, used)) if now.saturating_duration_since(used) >= IDLE_EVICTION => {
                self.prepared.remove(&id);
                true
            }
            _ => false,
        }
    }
}

/// The witness's prepared keys (see the module docs).
pub(crate) struct PreparedKeys {
    inner: Arc<Mutex<Inner>>,
    /// To the background thread that builds tables.
    build: SyncSender<PublicKey>,
}

impl Default for PreparedKeys {
    fn default() -> Self {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let (build, keys) = sync_channel(MAX_WAITING_KEYS);
        let shared = Arc::clone(&inner);
        // The thread ends when the cache is dropped (the channel closes).
        // If it cannot be started, keys stay waiting and are checked with
        // `verify_strict`: slower, never wrong.
        let _ = std::thread::Builder::new()
            .name("tally-prepare-keys".into())
            .spawn(move || build_tables(&keys, &shared));
        Self { inner, build }
    }
}

/// The background thread: builds each key's table and puts it in place,
/// resting [`BUILD_REST`] times as long as each table took, so that it uses
/// at most a quarter of one core however many keys earn tables at once.
fn build_tables(keys: &Receiver<PublicKey>, inner: &Mutex<Inner>) {
    for key in keys {
        let started = Instant::now();
        let table = Arc::new(PreparedKey::new(&key));
        let took = started.elapsed();
        let mut inner = inner.lock().unwrap_or_else(PoisonError::into_inner);
        let id = key.to_bytes();
        inner.waiting.remove(&id);
        inner.prepared.insert(
            id,
            Slot {
                key: table,
                used: Instant::now(),
            },
        );
        drop(inner);
        std::thread::sleep(took * BUILD_REST);
    }
}

impl PreparedKeys {
    /// Whether `signature` over `signed` by `key` verifies strictly: exactly
    /// `key.verify_raw(signed, signature).is_ok()`.
    #[cfg(test)]
    pub(crate) fn verify(
        &self,
        key: &PublicKey,
        signed: &[u8],
        signature: &tally_schemas::Signature,
    ) -> bool {
        match self.prepared(key) {
            Some(p) => p.verify_raw(signed, signature).is_ok(),
            None => key.verify_raw(signed, signature).is_ok(),
        }
    }

    /// Whether `record`'s signature by `key` verifies strictly: exactly
    /// `key.verify_raw(&record.signed_message(), record.signature()).is_ok()`.
    /// With a table, the message is hashed in its pieces where they lie
    /// ([`Record::signed_message_parts`]), not copied into one first.
    pub(crate) fn verify_record(&self, key: &PublicKey, record: &Record) -> bool {
        match self.prepared(key) {
            Some(p) => p
                .verify_parts(&record.signed_message_parts(), record.signature())
                .is_ok(),
            None => key
                .verify_raw(&record.signed_message(), record.signature())
                .is_ok(),
        }
    }

    /// The key's table, if it has one; counts the use, and sends a key that
    /// has now earned a table to the background thread.
    fn prepared(&self, key: &PublicKey) -> Option<Arc<PreparedKey>> {
        let id = key.to_bytes();
        let now = Instant::now();
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = inner.prepared.get_mut(&id) {
            slot.used = now;
            return Some(Arc::clone(&slot.key));
        }
        if inner.waiting.contains(&id) {
            return None;
        }
        if inner.uses.len() >= MAX_COUNTED_KEYS && !inner.uses.contains_key(&id) {
            inner.uses.clear();
        }
        let uses = inner.uses.entry(id).or_insert(0);
        *uses += 1;
        if *uses < PREPARE_MIN_SIGNATURES || !inner.make_room(now) {
            return None;
        }
        match self.build.try_send(*key) {
            Ok(()) => {
                inner.uses.remove(&id);
                inner.waiting.insert(id);
            }
            // Too many waiting (or no thread): the key keeps its count and
            // asks again at its next signature.
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {}
        }
        None
    }

    /// How many keys are prepared now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .prepared
            .len()
    }

    /// Waits until no key waits for its table (tests).
    #[cfg(test)]
    fn settle(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .waiting
            .is_empty()
        {
            assert!(Instant::now() < deadline, "tables never built");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_schemas::SecretKey;

    fn key(i: usize) -> SecretKey {
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&(i as u64).to_le_bytes());
        SecretKey::from_seed(&seed)
    }

    /// Counts `public` up to one use short of its table.
    fn almost_earned(cache: &PreparedKeys, public: &PublicKey) {
        let mut inner = cache.inner.lock().unwrap();
        inner
            .uses
            .insert(public.to_bytes(), PREPARE_MIN_SIGNATURES - 1);
    }

    /// Runs `check` on the key's first [`PREPARE_MIN_SIGNATURES`] uses (no
    /// table yet), then, once the table the key earned is built, on 8 more.
    fn before_and_after_its_table(cache: &PreparedKeys, check: impl Fn(usize)) {
        for n in 0..PREPARE_MIN_SIGNATURES {
            check(n);
        }
        cache.settle();
        assert_eq!(cache.len(), 1, "the key earned a table");
        for n in 0..8 {
            check(PREPARE_MIN_SIGNATURES + n);
        }
    }

    #[test]
    fn a_record_is_answered_as_verify_strict_answers_before_and_after_its_key_is_prepared() {
        use tally_schemas::record::NoteBody;
        use tally_schemas::{AgentName, Body, Nonce, Seq, UnixMillis, UnsignedRecord};
        let cache = PreparedKeys::default();
        let k = SecretKey::from_seed(&[6u8; 32]);
        let public = k.public_key();
        let record = |n: usize| {
            UnsignedRecord {
                agent: AgentName::new("sig-bot").unwrap(),
                key_id: public.key_id(),
                seq: Seq::GENESIS,
                prev: None,
                time: UnixMillis::new(1_796_025_600_000),
                nonce: Nonce::from_bytes(vec![n as u8; 16]).unwrap(),
                body: Body::Note(NoteBody {
                    text: format!("note {n}"),
                }),
            }
            .sign(&k)
            .unwrap()
        };
        let check = |n: usize| {
            let good = record(n);
            assert!(cache.verify_record(&public, &good), "good record {n}");
            // The key's signature of another record, put on this one.
            let other = record(n + 1000);
            let text = String::from_utf8(good.canonical_bytes().to_vec()).unwrap();
            let swapped = text.replace(
                &good.signature().to_base64(),
                &other.signature().to_base64(),
            );
            let forged = Record::from_json(swapped.as_bytes()).unwrap();
            assert!(public
                .verify_raw(&forged.signed_message(), forged.signature())
                .is_err());
            assert!(
                !cache.verify_record(&public, &forged),
                "swapped signature {n}"
            );
        };
        before_and_after_its_table(&cache, check);
    }

    #[test]
    fn answers_as_verify_strict_before_and_after_a_key_is_prepared() {
        let cache = PreparedKeys::default();
        let k = SecretKey::from_seed(&[5u8; 32]);
        let public = k.public_key();
        let check = |n: usize| {
            let msg = format!("message {n}").into_bytes();
            let sig = k.sign_raw(&msg);
            assert!(cache.verify(&public, &msg, &sig), "good signature {n}");
            let mut other = msg.clone();
            other.push(b'!');
            assert!(!cache.verify(&public, &other, &sig), "wrong message {n}");
        };
        before_and_after_its_table(&cache, check);
    }

    #[test]
    fn keeps_at_most_the_bound_and_still_answers() {
        let cache = PreparedKeys::default();
        for i in 0..(MAX_PREPARED_KEYS + 2) {
            let k = key(i);
            let public = k.public_key();
            almost_earned(&cache, &public);
            let sig = k.sign_raw(b"m");
            assert!(cache.verify(&public, b"m", &sig));
            assert!(!cache.verify(&public, b"n", &sig));
            cache.settle();
        }
        assert_eq!(cache.len(), MAX_PREPARED_KEYS);
    }

    #[test]
    fn an_idle_table_gives_its_slot_to_a_key_that_earned_one() {
        let cache = PreparedKeys::default();
        for i in 0..MAX_PREPARED_KEYS {
            let k = key(i);
            almost_earned(&cache, &k.public_key());
            assert!(cache.verify(&k.public_key(), b"m", &k.sign_raw(b"m")));
        }
        cache.settle();
        assert_eq!(cache.len(), MAX_PREPARED_KEYS);
        let newcomer = key(MAX_PREPARED_KEYS);
        let public = newcomer.public_key();
        // Every table was used just now: the newcomer gets none.
        almost_earned(&cache, &public);
        assert!(cache.verify(&public, b"m", &newcomer.sign_raw(b"m")));
        cache.settle();
        assert!(!cache
            .inner
            .lock()
            .unwrap()
            .prepared
            .contains_key(&public.to_bytes()));
        // Key 0's table falls idle past the bound: the newcomer takes its slot.
        {
            let mut inner = cache.inner.lock().unwrap();
            let idle = Instant::now().checked_sub(IDLE_EVICTION).unwrap();
            inner
                .prepared
                .get_mut(&key(0).public_key().to_bytes())
                .unwrap()
                .used = idle;
        }
        almost_earned(&cache, &public);
        assert!(cache.verify(&public, b"m", &newcomer.sign_raw(b"m")));
        cache.settle();
        let inner = cache.inner.lock().unwrap();
        assert!(inner.prepared.contains_key(&public.to_bytes()));
        assert!(!inner.prepared.contains_key(&key(0).public_key().to_bytes()));
        assert_eq!(inner.prepared.len(), MAX_PREPARED_KEYS);
    }
}
