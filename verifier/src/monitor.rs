//! The checkpoint monitor (`tally monitor`): follows a log's signed
//! checkpoints and proves each one consistent with the last one it verified,
//! docs/protocol.md §7.2–§7.4. A split view or a rewritten history shows as
//! two signed checkpoints that no consistency proof can join; the monitor
//! keeps both as evidence.
//!
//! Consistency comes from the log's JSON route
//! (`GET {log}/v1/proof/consistency?from=M&to=N`, §7.5, parsed strictly by
//! [`parse_consistency_proof`]), or, with `from_tiles`, is
//! rebuilt from C2SP tlog-tiles (`/tile/<L>/<N>[.p/<W>]`, height 8): the
//! RFC 9162 proof's nodes are computed from tile hashes and the proof is
//! checked like any other, so a lying tile cannot make an inconsistent pair
//! pass. The last verified checkpoint is persisted atomically (temporary
//! file, fsync, rename, fsync of the directory).
//!
//! Edges per RFC 9162 and §7.2: an empty first checkpoint must have root
//! SHA-256(""); any tree extends the empty tree without a proof; equal sizes
//! need equal roots; a smaller size is a rollback.
//!
//! A log that serves its reads to read-token holders only (a witness run
//! with `--log-read token`) is read with [`Monitor::with_read_token`], sent
//! as `Authorization: Bearer` on every request.
//!
//! With a trust file's cosigners ([`Monitor::with_cosigners`], §11.1 and
//! §14) each checkpoint fetched is also checked for a quorum of valid
//! cosignatures ([`Checked::cosignatures`]); a shortfall is reported, and
//! does not stop the consistency check or the saving of the state.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tally_schemas::api::ConsistencyProofAnswer;
use tally_schemas::hash::node_hash;
use tally_schemas::limits::MAX_WIRE_OBJECT_BYTES;
use tally_schemas::note::{
    open_checkpoint, Checkpoint, NoteError, NoteVerifier, MAX_CHECKPOINT_NOTE_BYTES,
};
use tally_schemas::tree::{empty_root, verify_consistency};
use tally_schemas::Hash;

use crate::trust::WitnessPolicy;

/// Tile height of C2SP tlog-tiles.
pub const TILE_HEIGHT: u32 = 8;
const TILE_WIDTH: u64 = 1 << TILE_HEIGHT;

/// Why a monitoring round could not complete (as opposed to finding an
/// inconsistency, which is a [`Round::Inconsistent`]).
#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    /// The log could not be reached or answered with an error.
    #[error("GET {url}: {reason}")]
    Http {
        /// The URL.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// The log's answer is malformed.
    #[error("GET {url}: {reason}")]
    BadResponse {
        /// The URL.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// The checkpoint does not verify with the pinned key.
    #[error("the log's checkpoint does not verify: {0}")]
    Checkpoint(#[from] NoteError),
    /// The state file could not be read or written.
    #[error("state file {path}: {reason}")]
    State {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

/// Two signed checkpoints that cannot both be honest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evidence {
    /// The last verified checkpoint (signed note).
    pub old: String,
    /// The new checkpoint (signed note).
    pub new: String,
    /// Why they are inconsistent.
    pub reason: String,
}

impl std::fmt::Display for Evidence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "INCONSISTENT: {}\n--- last verified checkpoint ---\n{}--- new checkpoint ---\n{}",
            self.reason, self.old, self.new
        )
    }
}

/// What one round found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Round {
    /// No state yet: the checkpoint was verified and saved.
    First(Checkpoint),
    /// Same size and root as the last verified checkpoint.
    Unchanged(Checkpoint),
    /// A larger tree, proven consistent; saved.
    Advanced {
        /// Size before.
        from: u64,
        /// The new checkpoint.
        to: Checkpoint,
    },
    /// The log is inconsistent with what it signed before. Nothing saved.
    Inconsistent(Evidence),
}

/// A round's result with the cosignature check of the checkpoint fetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// The consistency result.
    pub round: Round,
    /// `None` without cosigners to check (no trust file, or quorum 0).
    pub cosignatures: Option<Cosignatures>,
}

/// Whether the checkpoint fetched carries the trust file's quorum of
/// cosignatures (§11.1: valid cosignatures by at least `quorum` distinct
/// listed cosigner names, and no listed key's line that fails).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cosignatures {
    /// The quorum is met.
    Met {
        /// Distinct cosigners whose cosignature verified.
        count: usize,
        /// The quorum.
        quorum: usize,
    },
    /// The quorum is not met, or a listed cosigner's line does not verify.
    NotMet {
        /// The checkpoint (signed note) as fetched, as evidence.
        note: String,
        /// Why.
        reason: String,
    },
}

/// Where the consistency proof comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProofSource {
    /// `GET /v1/proof/consistency?from=M&to=N`.
    Json,
    /// Rebuilt from `/tile/<L>/<N>[.p/<W>]`.
    Tiles,
}

/// A monitor of one log.
#[derive(Debug)]
pub struct Monitor {
    base: String,
    key: NoteVerifier,
    state: PathBuf,
    source: ProofSource,
    agent: ureq::Agent,
    read_token: Option<String>,
    cosigners: Option<WitnessPolicy>,
}

/// Reads the last verified checkpoint from `path` (`None` if absent).
///
/// # Errors
/// [`MonitorError::State`] when the file exists but cannot be read.
pub fn load_state(path: &Path) -> Result<Option<String>, MonitorError> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(MonitorError::State {
            path: path.to_owned(),
            reason: e.to_string(),
        }),
    }
}

/// Writes `note` to `path` atomically: a temporary file in the same
/// directory, fsync, rename over `path`, fsync of the directory.
///
/// # Errors
/// [`MonitorError::State`] on any I/O error; `path` is then unchanged.
pub fn save_state(path: &Path, note: &str) -> Result<(), MonitorError> {
    let err = |e: std::io::Error| MonitorError::State {
        path: path.to_owned(),
        reason: e.to_string(),
    };
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map_or_else(|| "state".into(), |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp).map_err(err)?;
    f.write_all(note.as_bytes()).map_err(err)?;
    f.sync_all().map_err(err)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        err(e)
    })?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// The path of a tile: `tile/<L>/<N>[.p/<W>]`, N in 3-digit groups with
/// `x` before all but the last (c2sp.org/tlog-tiles).
#[must_use]
pub fn tile_path(level: u32, index: u64, width: u64) -> String {
    let mut n = index;
    let mut s = format!("{:03}", n % 1000);
    while n >= 1000 {
        n /= 1000;
        s = format!("x{:03}/{s}", n % 1000);
    }
    if width < TILE_WIDTH {
        format!("tile/{level}/{s}.p/{width}")
    } else {
        format!("tile/{level}/{s}")
    }
}

impl Monitor {
    /// A monitor of the log at `base` (e.g. `http://127.0.0.1:8080`),
    /// trusting `key`, keeping state in `state`.
    #[must_use]
    pub fn new(base: &str, key: NoteVerifier, state: PathBuf, source: ProofSource) -> Self {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(30)))
            .http_status_as_error(false)
            .build()
            .new_agent();
        Self {
            base: base.trim_end_matches('/').to_owned(),
            key,
            state,
            source,
            agent,
            read_token: None,
            cosigners: None,
        }
    }

    /// Also checks every checkpoint fetched for `policy`'s quorum of
    /// cosignatures (a trust file's `witness` and `quorum` lines).
    #[must_use]
    pub fn with_cosigners(mut self, policy: WitnessPolicy) -> Self {
        self.cosigners = (policy.quorum > 0).then_some(policy);
        self
    }

    /// Sends `token` as `Authorization: Bearer` with every request (a log
    /// that serves read-token holders only).
    #[must_use]
    pub fn with_read_token(mut self, token: String) -> Self {
        self.read_token = Some(token);
        self
    }

    fn get(&self, path: &str, limit: u64) -> Result<Vec<u8>, MonitorError> {
        let url = format!("{}/{path}", self.base);
        let http = |reason: String| MonitorError::Http {
            url: url.clone(),
            reason,
        };
        let mut request = self.agent.get(&url);
        if let Some(token) = &self.read_token {
            request = request.header("Authorization", &format!("Bearer {token}"));
        }
        let mut resp = request.call().map_err(|e| http(e.to_string()))?;
        if resp.status() == 401 {
            return Err(http(if self.read_token.is_some() {
                "status 401: the log refused the read token (unknown or revoked)".into()
            } else {
                "status 401: the log serves read-token holders only; give it a read token".into()
            }));
        }
        if resp.status() != 200 {
            return Err(http(format!("status {}", resp.status())));
        }
        resp.body_mut()
            .with_config()
            .limit(limit)
            .read_to_vec()
            .map_err(|e| http(e.to_string()))
    }

    /// One round (fetch, verify, prove, save), and the cosignature check
    /// of the checkpoint fetched when cosigners were given
    /// ([`Monitor::with_cosigners`]).
    ///
    /// # Errors
    /// [`MonitorError`] when the log cannot be read, answers malformed data,
    /// signs with another key, or the state file fails.
    pub fn check_round(&self) -> Result<Checked, MonitorError> {
        let note = String::from_utf8(self.get("checkpoint", MAX_CHECKPOINT_NOTE_BYTES as u64)?)
            .map_err(|_| MonitorError::BadResponse {
                url: format!("{}/checkpoint", self.base),
                reason: "not UTF-8".into(),
            })?;
        let new = open_checkpoint(&note, &self.key)?;
        let cosignatures = self
            .cosigners
            .as_ref()
            .map(|policy| match policy.check(&note) {
                Ok(count) => Cosignatures::Met {
                    count,
                    quorum: policy.quorum,
                },
                Err(reason) => Cosignatures::NotMet {
                    note: note.clone(),
                    reason,
                },
            });
        let round = self.consistency_round(note, new)?;
        Ok(Checked {
            round,
            cosignatures,
        })
    }

    fn consistency_round(&self, note: String, new: Checkpoint) -> Result<Round, MonitorError> {
        let Some(old_note) = load_state(&self.state)? else {
            if new.size.get() == 0 && new.root != empty_root() {
                return Ok(Round::Inconsistent(Evidence {
                    old: String::new(),
                    new: note,
                    reason: "an empty tree's root must be SHA-256(\"\")".into(),
                }));
            }
            save_state(&self.state, &note)?;
            return Ok(Round::First(new));
        };
        let old = open_checkpoint(&old_note, &self.key).map_err(|e| MonitorError::State {
            path: self.state.clone(),
            reason: format!("the saved checkpoint does not verify: {e}"),
        })?;
        let evidence = |reason: String| {
            Ok(Round::Inconsistent(Evidence {
                old: old_note.clone(),
                new: note.clone(),
                reason,
            }))
        };
        let (m, n) = (old.size.get(), new.size.get());
        if n < m {
            return evidence(format!("the tree shrank from size {m} to {n} (a rollback)"));
        }
        if n == m {
            return if new.root == old.root {
                Ok(Round::Unchanged(new))
            } else {
                evidence(format!("two checkpoints of size {n} have different roots"))
            };
        }
        if m > 0 {
            let proof = match self.source {
                ProofSource::Json => self.json_proof(m, n)?,
                ProofSource::Tiles => TileReader::new(self, n).consistency_proof(m)?,
            };
            if let Err(e) = verify_consistency(old.size, new.size, &old.root, &new.root, &proof) {
                return evidence(format!("size {n} is not consistent with size {m}: {e}"));
            }
        }
        save_state(&self.state, &note)?;
        Ok(Round::Advanced { from: m, to: new })
    }

    fn json_proof(&self, m: u64, n: u64) -> Result<Vec<Hash>, MonitorError> {
        let path = format!("v1/proof/consistency?from={m}&to={n}");
        let body = self.get(&path, MAX_WIRE_OBJECT_BYTES as u64)?;
        parse_consistency_proof(&body, m, n).map_err(|reason| MonitorError::BadResponse {
            url: format!("{}/{path}", self.base),
            reason,
        })
    }
}

/// Version of the JSON proof answers (§7.5).
pub use tally_schemas::api::PROOF_JSON_VERSION;

/// Parses the answer of `GET /v1/proof/consistency?from=M&to=N`
/// (docs/protocol.md §7.5) strictly, with tally-schemas'
/// [`ConsistencyProofAnswer::from_json`] (the JSON rules of §2, exactly the
/// members `v`, `from`, `to` and `consistency`, `v` = 1, at most
/// `MAX_PROOF_HASHES` hashes), and checks that `from` and `to` are the
/// sizes asked for. The proof itself is checked by the caller against the
/// two checkpoints.
///
/// # Errors
/// A message naming the first rule the answer breaks.
pub fn parse_consistency_proof(body: &[u8], from: u64, to: u64) -> Result<Vec<Hash>, String> {
    let answer = ConsistencyProofAnswer::from_json(body).map_err(|e| e.to_string())?;
    if answer.from.get() != from || answer.to.get() != to {
        return Err(format!(
            "proof is for {}..{}, asked {from}..{to}",
            answer.from, answer.to
        ));
    }
    Ok(answer.consistency)
}

/// Reads node hashes of the tree of size `size` from tiles.
struct TileReader<'a> {
    monitor: &'a Monitor,
    size: u64,
    tiles: HashMap<(u32, u64), Vec<Hash>>,
}

impl<'a> TileReader<'a> {
    fn new(monitor: &'a Monitor, size: u64) -> Self {
        Self {
            monitor,
            size,
            tiles: HashMap::new(),
        }
    }

    fn tile(&mut self, level: u32, index: u64) -> Result<&Vec<Hash>, MonitorError> {
        if !self.tiles.contains_key(&(level, index)) {
            let nodes = self.size >> (TILE_HEIGHT * level);
            let width = nodes.saturating_sub(index * TILE_WIDTH).min(TILE_WIDTH);
            let path = tile_path(level, index, width);
            let body = self.monitor.get(&path, TILE_WIDTH * 32)?;
            if width == 0 || body.len() as u64 != width * 32 {
                return Err(MonitorError::BadResponse {
                    url: format!("{}/{path}", self.monitor.base),
                    reason: format!(
                        "a tile of width {width} must be {} bytes, got {}",
                        width * 32,
                        body.len()
                    ),
                });
            }
            let hashes = body
                .chunks_exact(32)
                .map(|c| {
                    let mut b = [0u8; 32];
                    b.copy_from_slice(c);
                    Hash::from_bytes(b)
                })
                .collect();
            self.tiles.insert((level, index), hashes);
        }
        Ok(&self.tiles[&(level, index)])
    }

    /// Hash of the perfect subtree at `height` and `index` (its leaves are
    /// `index << height ..`).
    fn node(&mut self, height: u32, index: u64) -> Result<Hash, MonitorError> {
        let level = height / TILE_HEIGHT;
        let sub = height % TILE_HEIGHT;
        let start = index << sub;
        let tile = start / TILE_WIDTH;
        let offset = (start % TILE_WIDTH) as usize;
        let count = 1usize << sub;
        let base = self.monitor.base.clone();
        let hashes = self.tile(level, tile)?;
        let Some(slice) = hashes.get(offset..offset + count) else {
            return Err(MonitorError::BadResponse {
                url: format!("{base}/{}", tile_path(level, tile, hashes.len() as u64)),
                reason: "tile too short for the tree size".into(),
            });
        };
        let mut layer: Vec<Hash> = slice.to_vec();
        while layer.len() > 1 {
            layer = layer
                .chunks_exact(2)
                .map(|p| node_hash(&p[0], &p[1]))
                .collect();
        }
        Ok(layer[0])
    }

    /// RFC 9162 MTH of leaves `[start, end)`, `start` aligned as in the
    /// proofs below.
    fn mth(&mut self, start: u64, end: u64) -> Result<Hash, MonitorError> {
        let n = end - start;
        if n == 0 {
            return Ok(empty_root());
        }
        if n.is_power_of_two() && start % n == 0 {
            return self.node(n.trailing_zeros(), start >> n.trailing_zeros());
        }
        let k = split(n);
        let left = self.mth(start, start + k)?;
        let right = self.mth(start + k, end)?;
        Ok(node_hash(&left, &right))
    }

    /// RFC 9162 §2.1.4.1 SUBPROOF(m, D[start:end], whole).
    fn subproof(
        &mut self,
        m: u64,
        start: u64,
        end: u64,
        whole: bool,
        out: &mut Vec<Hash>,
    ) -> Result<(), MonitorError> {
        let n = end - start;
        if m == n {
            if !whole {
                out.push(self.mth(start, end)?);
            }
            return Ok(());
        }
        let k = split(n);
        if m <= k {
            self.subproof(m, start, start + k, whole, out)?;
            out.push(self.mth(start + k, end)?);
        } else {
            self.subproof(m - k, start + k, end, false, out)?;
            out.push(self.mth(start, start + k)?);
        }
        Ok(())
    }

    fn consistency_proof(mut self, m: u64) -> Result<Vec<Hash>, MonitorError> {
        let mut out = Vec::new();
        let size = self.size;
        self.subproof(m, 0, size, true, &mut out)?;
        Ok(out)
    }
}

/// The largest power of two below `n` (n ≥ 2).
fn split(n: u64) -> u64 {
    let mut k = 1;
    while k << 1 < n {
        k <<= 1;
    }
    k
}
