//! The witness: record admission (docs/api.md "POST /v1/records" and
//! "POST /v1/records/batch") and what the routes read.
//!
//! There is one admission path, and a single record is a batch of one.
//! Each request first passes its own checks (body size, the key's rate
//! limit, the parse: [`Witness::admit_as`] for one record,
//! [`Witness::admit_batch`] for a batch); then every record goes through
//! one ordered list of checks (`Witness::check`: the project's quota, agent
//! registered to the key's project, the key active at the record's time,
//! the strict signature, the clock skew), and the records that pass are
//! queued under their agents' fences as one group commit
//! ([`tally_log::Log::enqueue_batch_fenced`]), which checks chain, nonce
//! and idempotency atomically and resolves only once the entries are
//! durable and covered by a signed checkpoint. An exact resubmission of a
//! record already in the log gets its original receipt whatever those
//! checks say now (protocol.md §8): a record one of them refuses is looked
//! up in the log before the refusal is answered, and one that passes them
//! all is recognised by the log's append. Records that pass, almost all of
//! them, are not looked up twice.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use rand_core::CryptoRngCore;
use tally_log::{BatchItem, ChainHead, KeyVersion, Log};
use tally_schemas::batch::BatchRequest;
use tally_schemas::batch_sig::PreparedKey;
use tally_schemas::time::Clock;
use tally_schemas::{AgentName, Hash, LeafIndex, Receipt, Record, UnixMillis};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::agent_fence::KeyChanges;
use crate::config::WitnessConfig;
use crate::error::WitnessError;
use crate::keydir::KeyDirectory;
use crate::metrics::Metrics;
use crate::ratelimit::RateLimiter;
use crate::registry::{Principal, Registry, Secret};

/// How many times a record is admitted again after its agent's keys
/// changed between its check and its commit (protocol.md §4.1); past that
/// it is answered `sequencer_unavailable`, and sending it again is safe.
const KEY_CHANGE_ATTEMPTS: usize = 4;

/// Randomness for API keys, injected.
pub type Rng = Box<dyn CryptoRngCore + Send>;

/// The witness's state, shared by every route.
pub struct Witness {
    log: Arc<Log>,
    registry: Arc<Registry>,
    clock: Arc<dyn Clock>,
    rng: Mutex<Rng>,
    config: WitnessConfig,
    limiter: RateLimiter,
    quotas: crate::quota::Quotas,
    metrics: Metrics,
    in_flight: Arc<Semaphore>,
    keys: KeyDirectory,
    /// The per-agent fences between admission and key changes.
    key_changes: KeyChanges,
    /// The last receive time handed to the log. Receive times are taken and
    /// records queued under this lock, so `received` never decreases in log
    /// order (check 9 of the verifier), even if the clock steps back.
    last_received: Mutex<UnixMillis>,
    /// Asking cosigners, when `tally serve` has any (protocol.md §14.5).
    cosigning: std::sync::OnceLock<Arc<crate::cosigning::Cosigning>>,
}

impl std::fmt::Debug for Witness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Witness")
            .field("origin", &self.log.origin())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// A member of an admission (a single record is a batch of one): its
/// record, or why it did not parse.
type Member = Result<Record, WitnessError>;

/// A record of an admission after the checks made before the fences: the
/// record to queue, or its refusal with its agent and seq (to keep its
/// place).
type CheckedRecord = Result<Record, (AgentName, tally_schemas::Seq, WitnessError)>;

/// What [`Witness::check`] leaves for the fenced part of an admission.
struct Checked {
    /// Answers known already, by the request's order (`None`: still open).
    answers: Vec<Option<Result<Admitted, WitnessError>>>,
    /// The records still to queue or to hold a place for, with their place
    /// in the request.
    records: Vec<(usize, CheckedRecord)>,
}

/// An admitted record's receipt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    /// The receipt (for a retry, the one first issued).
    pub receipt: Receipt,
    /// Whether the record was already in the log.
    pub duplicate: bool,
}

impl Witness {
    /// A witness over an open log and registry, with an injected clock,
    /// randomness and key directory.
    #[must_use]
    pub fn new(
        log: Arc<Log>,
        registry: Arc<Registry>,
        clock: Arc<dyn Clock>,
        rng: Rng,
        config: WitnessConfig,
        keys: KeyDirectory,
    ) -> Self {
        let metrics = Metrics::default();
        let size = log.latest_checkpoint().checkpoint.size;
        metrics.start_at(size.get());
        let last_received = size
            .get()
            .checked_sub(1)
            .and_then(|i| log.entry(LeafIndex::new(i)).ok().flatten())
            .map_or(UnixMillis::new(0), |e| e.received());
        Self {
            last_received: Mutex::new(last_received),
            limiter: RateLimiter::new(config.rate_limit),
            quotas: crate::quota::Quotas::new(config.project_quota),
            in_flight: Arc::new(Semaphore::new(config.max_in_flight.max(1))),
            log,
            registry,
            clock,
            rng: Mutex::new(rng),
            config,
            metrics,
            keys,
            key_changes: KeyChanges::default(),
            cosigning: std::sync::OnceLock::new(),
        }
    }

    /// Attaches cosigning (once; a second call is ignored). Exports pin the
    /// checkpoint it chooses and `/metrics` and the console show it.
    pub fn set_cosigning(&self, cosigning: Arc<crate::cosigning::Cosigning>) {
        let _ = self.cosigning.set(cosigning);
    }

    /// Cosigning, when configured.
    #[must_use]
    pub fn cosigning(&self) -> Option<&Arc<crate::cosigning::Cosigning>> {
        self.cosigning.get()
    }

    /// The log.
    #[must_use]
    pub fn log(&self) -> &Arc<Log> {
        &self.log
    }

    /// The registry.
    #[must_use]
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The admission limits.
    #[must_use]
    pub fn config(&self) -> &WitnessConfig {
        &self.config
    }

    /// The metrics.
    #[must_use]
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The key directory.
    #[must_use]
    pub fn key_directory(&self) -> &KeyDirectory {
        &self.keys
    }

    /// The fences between admission and key changes (module `key_changes`).
    #[must_use]
    pub fn key_changes(&self) -> &KeyChanges {
        &self.key_changes
    }

    /// The witness clock.
    #[must_use]
    pub fn now(&self) -> UnixMillis {
        self.clock.now()
    }

    /// Makes a secret with the injected randomness.
    pub fn with_rng<T>(&self, f: impl FnOnce(&mut dyn CryptoRngCore) -> T) -> T {
        let mut rng = self
            .rng
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(rng.as_mut())
    }

    /// Creates a project (admin).
    ///
    /// # Errors
    /// As [`Registry::create_project`].
    pub fn create_project(&self, name: &str) -> Result<Secret, WitnessError> {
        let now = self.now();
        self.with_rng(|rng| self.registry.create_project(name, now, rng))
    }

    /// Makes another API key for a project (admin).
    ///
    /// # Errors
    /// As [`Registry::new_api_key`].
    pub fn new_api_key(&self, project: &str) -> Result<Secret, WitnessError> {
        let now = self.now();
        self.with_rng(|rng| self.registry.new_api_key(project, now, rng))
    }

    /// A permit to admit one record, or 503 when too many are in flight.
    ///
    /// # Errors
    /// [`WitnessError::Overloaded`].
    pub fn in_flight_permit(&self) -> Result<OwnedSemaphorePermit, WitnessError> {
        Arc::clone(&self.in_flight)
            .try_acquire_owned()
            .map_err(|_| WitnessError::Overloaded)
    }

    /// Checks a bearer token (the value after `Bearer `).
    ///
    /// # Errors
    /// [`WitnessError::Unauthorized`] when missing or unknown.
    pub fn authenticate(&self, bearer: Option<&str>) -> Result<Principal, WitnessError> {
        bearer
            .and_then(|t| self.registry.authenticate(t))
            .ok_or(WitnessError::Unauthorized)
    }

    /// Checks the admin token.
    ///
    /// # Errors
    /// [`WitnessError::AdminUnauthorized`] when missing or wrong.
    pub fn authenticate_admin(&self, bearer: Option<&str>) -> Result<(), WitnessError> {
        match bearer {
            Some(t) if self.registry.is_admin(t) => Ok(()),
            _ => Err(WitnessError::AdminUnauthorized),
        }
    }

    /// Appends the projects' counts against their quotas to `/metrics`.
    pub fn render_quotas(&self, out: &mut String) {
        self.quotas.render(out, self.now());
    }

    /// The agent, if registered to the principal's project.
    ///
    /// # Errors
    /// [`WitnessError::AgentNotAllowed`] otherwise (unregistered agents get
    /// the same answer, so names in other projects are not revealed).
    pub fn owned_agent(
        &self,
        principal: &Principal,
        agent: &AgentName,
    ) -> Result<(), WitnessError> {
        self.registry.with_agent(agent, |row| match row {
            Some(r) if r.project == principal.project => Ok(()),
            _ => Err(WitnessError::AgentNotAllowed {
                agent: agent.clone(),
            }),
        })
    }

    /// The public key registered for the record's agent and key id, if the
    /// agent is the principal's and the key active at its time, with the
    /// agent's key version those ranges are of (protocol.md §4.1).
    fn registered_key(
        &self,
        principal: &Principal,
        record: &Record,
    ) -> Result<(tally_schemas::PublicKey, KeyVersion), WitnessError> {
        self.registry
            .with_agent_version(&record.agent, |row, version| {
                let row = match row {
                    Some(r) if r.project == principal.project => r,
                    _ => {
                        return Err(WitnessError::AgentNotAllowed {
                            agent: record.agent.clone(),
                        })
                    }
                };
                let key = row
                    .key(&record.key_id)
                    .ok_or_else(|| WitnessError::KeyNotAllowed {
                        agent: record.agent.clone(),
                        key_id: record.key_id,
                    })?;
                if !key.active_at(record.time) {
                    return Err(WitnessError::KeyNotActive {
                        agent: record.agent.clone(),
                        key_id: record.key_id,
                        time: record.time,
                        not_before: key.not_before,
                        not_after: key.not_after,
                    });
                }
                Ok((key.public_key, version))
            })
    }

    /// The key version to hand the log with a record checked under
    /// `version`: on a shared registry the store fences it (protocol.md
    /// §4.1); on redb this process's fence does, and the log is told none.
    fn fence_of(&self, version: KeyVersion) -> Option<KeyVersion> {
        self.registry.is_shared().then_some(version)
    }

    /// On a shared registry, reloads the memory copy now if another front
    /// wrote (instead of at the next watch period), on a blocking thread.
    async fn refresh_registry(&self) {
        if !self.registry.is_shared() {
            return;
        }
        let registry = Arc::clone(&self.registry);
        match tokio::task::spawn_blocking(move || registry.refresh_if_changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("reloading the registry: {e}"),
            Err(e) => tracing::warn!("reloading the registry: {e}"),
        }
    }

    /// The clock skew: the record's time against the witness clock.
    fn check_skew(&self, record: &Record, now: UnixMillis) -> Result<(), WitnessError> {
        if record.time.abs_diff(now) > self.config.max_skew_ms {
            return Err(WitnessError::ClockSkew {
                agent_time: record.time,
                witness_time: now,
                max_skew_ms: self.config.max_skew_ms,
            });
        }
        Ok(())
    }

    /// Admits one record body sent with `bearer`: the API key, then
    /// [`Witness::admit_as`].
    ///
    /// # Errors
    /// Every [`WitnessError`] of the admission table.
    pub async fn admit(
        self: &Arc<Self>,
        bearer: Option<&str>,
        body: &[u8],
    ) -> Result<Admitted, WitnessError> {
        let principal = self.authenticate(bearer)?;
        self.admit_as(&principal, body).await
    }

    /// Admits one record body sent by `principal` (already authenticated):
    /// the request's own checks of docs/api.md (body size, the key's rate
    /// limit, the parse), then the record as a batch of one, through the
    /// same checks (`Witness::check`) and the same commit
    /// (`Witness::commit`) as every batch. The caller has already bounded
    /// the body's size while reading it.
    ///
    /// # Errors
    /// Every [`WitnessError`] of the admission table.
    pub async fn admit_as(
        self: &Arc<Self>,
        principal: &Principal,
        body: &[u8],
    ) -> Result<Admitted, WitnessError> {
        if body.len() > self.config.max_body_bytes {
            return Err(WitnessError::BodyTooLarge {
                size: Some(body.len() as u64),
                max: self.config.max_body_bytes,
            });
        }
        // The token before the parse: a record that fails to parse costs
        // the server as much as one that passes (docs/api.md "POST /v1/records").
        self.limiter
            .take(&principal.key_id, self.now())
            .map_err(|retry_after_ms| WitnessError::RateLimited { retry_after_ms })?;
        let record = Record::from_json(body)?;
        let hash = record.hash();
        let members = vec![Ok(record)];
        // On a registry this process owns, one record's checks run on the
        // request's task: they read storage only for a refused record (one
        // lookup). On a shared registry they may reload it: a blocking
        // thread, as for a batch.
        let checked = if self.registry.is_shared() {
            let me = Arc::clone(self);
            let p = principal.clone();
            tokio::task::spawn_blocking(move || me.check(&p, members))
                .await
                .map_err(|e| WitnessError::internal(&e))?
        } else {
            self.check(principal, members)
        };
        match self.commit(principal, checked).await {
            Ok(mut answers) => answers
                .pop()
                .unwrap_or_else(|| Err(WitnessError::internal(&"the record got no answer"))),
            // The log took nothing (its queue full, shut down): a retry
            // still gets its receipt (protocol.md §8).
            Err(e) => self.unless_admitted(&hash, e),
        }
    }

    /// The answer to a record that a check refused with `refusal`: the
    /// original receipt of the record with `hash` if the log holds it
    /// (covered by the latest checkpoint), since a retry gets its receipt
    /// whatever the checks say now (protocol.md §8), else the refusal.
    /// Only refused records are looked up here: a retry that passes every
    /// check, and one still in the batch being committed, is recognised by
    /// the log's append.
    fn unless_admitted(
        &self,
        hash: &Hash,
        refusal: WitnessError,
    ) -> Result<Admitted, WitnessError> {
        let Some(index) = self.log.index_of_record(hash)? else {
            return Err(refusal);
        };
        match self.log.receipt(index)? {
            Some((_, receipt)) => Ok(Admitted {
                receipt,
                duplicate: true,
            }),
            None => Err(refusal),
        }
    }

    /// [`Witness::unless_admitted`] for record `i` of an admission: a
    /// retry's receipt is written to `answers` and `None` returned (it is
    /// not queued again, and takes no place in the batch); else the
    /// refusal, with the agent and seq whose place it holds, so that the
    /// agent's later records are refused after it.
    fn held_unless_admitted(
        &self,
        answers: &mut [Option<Result<Admitted, WitnessError>>],
        i: usize,
        record: &Record,
        refusal: WitnessError,
    ) -> Option<(AgentName, tally_schemas::Seq, WitnessError)> {
        match self.unless_admitted(&record.hash(), refusal) {
            Ok(a) => {
                answers[i] = Some(Ok(a));
                None
            }
            Err(e) => Some((record.agent.clone(), record.seq, e)),
        }
    }

    /// [`Witness::admit_as`] with metrics and the receipt's canonical bytes
    /// (the same bytes for every retry).
    ///
    /// # Errors
    /// As [`Witness::admit_as`].
    pub async fn admit_measured(
        self: &Arc<Self>,
        principal: &Principal,
        body: &[u8],
        started: Instant,
    ) -> Result<Vec<u8>, WitnessError> {
        let result = self.admit_as(principal, body).await.and_then(|a| {
            a.receipt
                .to_canonical_json()
                .map_err(|e| WitnessError::internal(&e))
        });
        let (status, code) = match &result {
            Ok(_) => (200, "ok"),
            Err(e) => {
                let (s, c) = e.status_and_code();
                (s.as_u16(), c)
            }
        };
        self.metrics.admission(status, code, started.elapsed());
        result
    }

    /// Counts a refusal that happened before [`Witness::admit_measured`]
    /// (too large a body, no permit).
    pub fn count_refusal(&self, e: &WitnessError, started: Instant) {
        let (s, c) = e.status_and_code();
        self.metrics.admission(s.as_u16(), c, started.elapsed());
    }

    /// Admits a batch request body (docs/api.md "POST /v1/records/batch";
    /// docs/protocol.md §8.1) sent by `principal`: one answer per record, in
    /// the request's order. The request's own checks
    /// (`Witness::parse_batch`), then each record through the checks of
    /// `Witness::check`, as a single record is; the records that pass are
    /// handed to [`Log::enqueue_batch_fenced`] as one group commit,
    /// received at one instant. A record refused here keeps its place in
    /// its agent's seq order ([`BatchItem::Refused`]), so that the agent's
    /// later records in the batch are refused with `prior_record_refused`.
    ///
    /// # Errors
    /// For the batch as a whole: body size, strict JSON and the batch shape,
    /// too many records, the key's rate limit (one token per record), a full
    /// log queue, shutdown.
    pub async fn admit_batch(
        self: &Arc<Self>,
        principal: &Principal,
        body: Vec<u8>,
    ) -> Result<Vec<Result<Admitted, WitnessError>>, WitnessError> {
        let me = Arc::clone(self);
        let p = principal.clone();
        let checked = tokio::task::spawn_blocking(move || {
            let members = me.parse_batch(&p, &body)?;
            Ok::<_, WitnessError>(me.check(&p, members))
        })
        .await
        .map_err(|e| WitnessError::internal(&e))??;
        self.commit(principal, checked).await
    }

    /// A batch request's own checks, before its records': the key's rate
    /// limit, paid before the parse by size (one token per
    /// `max_body_bytes`, the most one record may take, of the body), so
    /// that a batch that fails to parse costs its sender as much as the
    /// records it could hold; the parse (strict JSON, the batch's shape,
    /// the number of records); then one more token per record beyond that,
    /// as debt (docs/api.md "POST /v1/records/batch"). Returns each member:
    /// its record, or why it did not parse.
    fn parse_batch(&self, principal: &Principal, body: &[u8]) -> Result<Vec<Member>, WitnessError> {
        let by_size = body
            .len()
            .div_ceil(self.config.max_body_bytes.max(1))
            .max(1);
        self.limiter
            .take_n(&principal.key_id, by_size, self.now())
            .map_err(|retry_after_ms| WitnessError::RateLimited { retry_after_ms })?;
        let request = BatchRequest::parse(body)?;
        let n = request.records.len();
        self.limiter
            .charge(&principal.key_id, n.saturating_sub(by_size), self.now());
        Ok(request
            .records
            .into_iter()
            .map(|member| member.map_err(WitnessError::from))
            .collect())
    }

    /// The checks of every record of an admission (one record, or each of
    /// a batch), in the order docs/api.md gives, made before the agents'
    /// fences: the project's quota, the agent registered to the key's
    /// project, the key registered for the agent and active at the
    /// record's time (on a shared registry, a key not found is looked for
    /// once more after reloading it: one registered through another front),
    /// the strict signature (protocol.md §4.3, schemas/src/batch_sig.rs),
    /// the clock skew at this instant. Blocking: a refused record is looked
    /// up in the log, since it may be a retry (protocol.md §8), and the
    /// registry may be reloaded. [`Witness::queue`] looks at the keys and
    /// the skew once more under the fences.
    fn check(&self, principal: &Principal, members: Vec<Member>) -> Checked {
        let n = members.len();
        let mut answers: Vec<Option<Result<Admitted, WitnessError>>> = vec![None; n];
        let mut records: Vec<(usize, CheckedRecord)> = Vec::with_capacity(n);
        let mut keys: Vec<(usize, tally_schemas::PublicKey)> = Vec::with_capacity(n);
        let mut refreshed = false;
        let now = self.now();
        for (i, member) in members.into_iter().enumerate() {
            let record = match member {
                Ok(r) => r,
                Err(e) => {
                    answers[i] = Some(Err(e));
                    continue;
                }
            };
            // The project's quota; a retry of an admitted record still
            // gets its receipt.
            let size = record.canonical_bytes().len() as u64;
            if let Err(e) = self.quotas.charge(&principal.project, 1, size, now) {
                if let Some(held) = self.held_unless_admitted(&mut answers, i, &record, e) {
                    records.push((i, Err(held)));
                }
                continue;
            }
            if let Err(e) = self.owned_agent(principal, &record.agent) {
                records.push((i, Err((record.agent.clone(), record.seq, e))));
                continue;
            }
            let mut found = self.registered_key(principal, &record);
            if matches!(found, Err(WitnessError::KeyNotAllowed { .. }))
                && !refreshed
                && self.registry.is_shared()
            {
                // A front whose copy of a shared registry is behind does
                // not know a key registered through another front yet: it
                // looks once more after reloading, once per admission.
                refreshed = true;
                if let Err(e) = self.registry.refresh_if_changed() {
                    tracing::warn!("reloading the registry: {e}");
                }
                found = self.registered_key(principal, &record);
            }
            match found {
                Ok((key, _)) => {
                    keys.push((records.len(), key));
                    records.push((i, Ok(record)));
                }
                Err(e) => {
                    if let Some(held) = self.held_unless_admitted(&mut answers, i, &record, e) {
                        records.push((i, Err(held)));
                    }
                }
            }
        }
        // The registry answers the key registered under the record's key
        // id, so the ids match; the signature is checked strictly.
        let mut signed = vec![false; records.len()];
        for (k, key) in &keys {
            if let Ok(r) = &records[*k].1 {
                signed[*k] = key.key_id() == r.key_id && PreparedKey::new(key).verify_record(r);
            }
        }
        // The clock skew at this instant, outside the receive-time lock, so
        // that a refused record is looked up outside it; the fenced part
        // checks it again at the receive time.
        let now = self.now();
        let mut checked = Vec::with_capacity(records.len());
        for ((i, slot), signed) in records.into_iter().zip(signed) {
            let record = match slot {
                Ok(r) => r,
                Err(held) => {
                    checked.push((i, Err(held)));
                    continue;
                }
            };
            let refusal = if signed {
                self.check_skew(&record, now).err()
            } else {
                Some(WitnessError::BadSignature {
                    agent: record.agent.clone(),
                    key_id: record.key_id,
                })
            };
            match refusal {
                None => checked.push((i, Ok(record))),
                Some(e) => {
                    if let Some(held) = self.held_unless_admitted(&mut answers, i, &record, e) {
                        checked.push((i, Err(held)));
                    }
                }
            }
        }
        Checked {
            answers,
            records: checked,
        }
    }

    /// The checked records of an admission, committed: queued as one group
    /// commit ([`Witness::queue`]) and each answer written by the request's
    /// order. A record whose agent's keys changed (through any front) after
    /// its check is checked against the new ranges and queued again, up to
    /// [`KEY_CHANGE_ATTEMPTS`] times (protocol.md §4.1).
    ///
    /// # Errors
    /// For the admission as a whole: a full log queue, shutdown.
    async fn commit(
        &self,
        principal: &Principal,
        checked: Checked,
    ) -> Result<Vec<Result<Admitted, WitnessError>>, WitnessError> {
        let Checked {
            mut answers,
            mut records,
        } = checked;
        let shared = self.registry.is_shared();
        let mut attempts = 0;
        loop {
            // Copies of the records, to admit again those whose agent's
            // keys changed before they were committed (protocol.md §4.1).
            let copies: Vec<(usize, Record)> = if shared {
                records
                    .iter()
                    .filter_map(|(i, r)| r.as_ref().ok().map(|r| (*i, r.clone())))
                    .collect()
            } else {
                Vec::new()
            };
            let Some((pending, queued_at)) = self.queue(principal, records, &mut answers).await?
            else {
                break;
            };
            let appended = pending.await?;
            let mut again = std::collections::HashSet::new();
            // The receipts of one group commit share their checkpoint note:
            // its size is read once, not once per record.
            let mut peeked: Option<(String, Option<u64>)> = None;
            for (i, result) in queued_at.into_iter().zip(appended) {
                match result {
                    Ok(a) => {
                        if !a.duplicate {
                            let note = &a.receipt.checkpoint;
                            let size = match &peeked {
                                Some((seen, size)) if seen == note => *size,
                                _ => {
                                    let size = tally_schemas::note::peek_checkpoint(note)
                                        .ok()
                                        .map(|c| c.size.get());
                                    peeked = Some((note.clone(), size));
                                    size
                                }
                            };
                            if let Some(size) = size {
                                self.metrics.receipt(a.receipt.index.get(), size);
                            }
                        }
                        answers[i] = Some(Ok(Admitted {
                            receipt: a.receipt,
                            duplicate: a.duplicate,
                        }));
                    }
                    // The refusal this witness made itself stands.
                    Err(tally_log::AppendError::RefusedByCaller) => {}
                    Err(tally_log::AppendError::KeyChanged { .. })
                        if shared && attempts < KEY_CHANGE_ATTEMPTS =>
                    {
                        again.insert(i);
                    }
                    Err(e) => answers[i] = Some(Err(e.into())),
                }
            }
            if again.is_empty() {
                break;
            }
            attempts += 1;
            self.refresh_registry().await;
            records = copies
                .into_iter()
                .filter(|(i, _)| again.contains(i))
                .map(|(i, r)| (i, Ok(r)))
                .collect();
        }
        Ok(answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(WitnessError::internal(&"a record got no answer"))))
            .collect())
    }

    /// The fenced part of an admission: under the fences against key
    /// changes (key_changes.rs) of every agent with a record to queue, the
    /// keys are looked at once more (noting their key versions), the clock
    /// skew is checked at one receive time, and the records are queued as
    /// one group commit, their times counted by their fences before these
    /// open, so that no key change can end a key before a record it
    /// signed. A refusal here is written to `answers` and keeps its place
    /// ([`BatchItem::Refused`]). Returns the pending batch and each item's
    /// place in the request; `None` when no record is left to append (the
    /// log is not asked).
    async fn queue(
        &self,
        principal: &Principal,
        records: Vec<(usize, CheckedRecord)>,
        answers: &mut [Option<Result<Admitted, WitnessError>>],
    ) -> Result<Option<(tally_log::PendingBatch, Vec<usize>)>, WitnessError> {
        // Fences of every agent with a record to queue, taken in name order
        // so that two admissions never wait on each other.
        let mut agents: Vec<AgentName> = records
            .iter()
            .filter_map(|(_, r)| r.as_ref().ok().map(|r| r.agent.clone()))
            .collect();
        agents.sort();
        agents.dedup();
        let mut fences = Vec::with_capacity(agents.len());
        for agent in &agents {
            fences.push(self.key_changes.fence(agent).await);
        }
        let mut versions = Vec::with_capacity(records.len());
        let mut queued = Vec::with_capacity(records.len());
        for (i, r) in records {
            let mut version = None;
            let r = match r {
                Ok(record) => match self.registered_key(principal, &record) {
                    Ok((_, v)) => {
                        version = self.fence_of(v);
                        Ok(record)
                    }
                    // A key change since the checks: a retry still gets
                    // its receipt (protocol.md §8).
                    Err(e) => match self.held_unless_admitted(answers, i, &record, e) {
                        Some(held) => Err(held),
                        None => continue,
                    },
                },
                held => held,
            };
            versions.push(version);
            queued.push((i, r));
        }
        let (pending, queued_at) = {
            let mut last = self
                .last_received
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // Receive times are taken and records queued under this lock,
            // so queue order and receive-time order are one. The queueing
            // itself never waits.
            let now = self.now().max(*last);
            let mut items = Vec::with_capacity(queued.len());
            let mut at = Vec::with_capacity(queued.len());
            let mut fenced = Vec::with_capacity(queued.len());
            for ((i, r), mut version) in queued.into_iter().zip(versions) {
                let r = match r {
                    Ok(record) => match self.check_skew(&record, now) {
                        Ok(()) => Ok(record),
                        // Passed at check's instant, not at this one (a
                        // record at the edge of the bound): a retry still
                        // gets its receipt.
                        Err(e) => match self.held_unless_admitted(answers, i, &record, e) {
                            Some(held) => Err(held),
                            None => continue,
                        },
                    },
                    held => held,
                };
                let item = match r {
                    Ok(record) => BatchItem::Record(record),
                    Err((agent, seq, e)) => {
                        answers[i] = Some(Err(e));
                        version = None;
                        BatchItem::Refused { agent, seq }
                    }
                };
                fenced.push(version);
                items.push(item);
                at.push(i);
            }
            let times: Vec<(AgentName, UnixMillis)> = items
                .iter()
                .filter_map(|item| match item {
                    BatchItem::Record(r) => Some((r.agent.clone(), r.time)),
                    BatchItem::Refused { .. } => None,
                })
                .collect();
            if times.is_empty() {
                // Every answer is known: nothing for the log to append.
                return Ok(None);
            }
            let pending = self.log.enqueue_batch_fenced(items, fenced, now)?;
            *last = now;
            for (agent, time) in times {
                if let Ok(k) = agents.binary_search(&agent) {
                    fences[k].queued(time);
                }
            }
            (pending, at)
        };
        drop(fences);
        Ok(Some((pending, queued_at)))
    }

    /// The committed head of `agent`'s chain, for the principal's own agents.
    ///
    /// # Errors
    /// `AgentNotAllowed`, `NoRecords`, or storage failure.
    pub fn agent_head(
        &self,
        principal: &Principal,
        agent: &AgentName,
    ) -> Result<ChainHead, WitnessError> {
        self.owned_agent(principal, agent)?;
        self.log
            .chain_head(agent)?
            .ok_or_else(|| WitnessError::NoRecords {
                agent: agent.clone(),
                in_range: false,
            })
    }
}

#[cfg(test)]
mod tests;
