//! The read routes without sockets (`Router` + `oneshot`), and a black-box
//! monitor that rebuilds and checks the log only from its C2SP tiles and
//! checkpoint, as an external tlog-tiles client would (docs/storage.md
//! "HTTP"; docs/protocol.md §7.3–§7.5).

use crate::common;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use common::{futures_join_all, now, signer, Agent, AppendOne};
use http_body_util::BodyExt;
use serde_json::Value;
use tally_log::store::memory::MemoryStore;
use tally_log::store::{BatchWrite, NewEntry};
use tally_log::{http, tree, Log, LogConfig, LogStore};
use tally_schemas::hash::{leaf_hash, node_hash};
use tally_schemas::note::open_checkpoint;
use tally_schemas::tree::{reference, verify_consistency, verify_inclusion};
use tally_schemas::{AgentName, Checkpoint, Entry, Hash, LeafIndex, Nonce, Seq, TreeSize};

struct Got {
    status: StatusCode,
    cache: Option<String>,
    body: Vec<u8>,
}

impl Got {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
    fn code(&self) -> String {
        self.json()["error"]["code"].as_str().unwrap().to_owned()
    }
}

async fn get(app: &Router, uri: &str) -> Got {
    use tower::ServiceExt;
    let resp = app
        .clone()
        .oneshot(Request::get(uri).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let cache = resp
        .headers()
        .get(header::CACHE_CONTROL)
        .map(|v| v.to_str().unwrap().to_owned());
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    Got {
        status,
        cache,
        body,
    }
}

async fn log_with(n: usize) -> (Arc<Log>, Router, Vec<Hash>) {
    let log =
        Arc::new(Log::open(Arc::new(MemoryStore::new()), signer(), LogConfig::default()).unwrap());
    let mut leaves = Vec::new();
    let mut agents: Vec<Agent> = (0..3).map(|i| Agent::new(&format!("agent-{i}"))).collect();
    for i in 0..n {
        let got = log.append(agents[i % 3].next(), now()).await.unwrap();
        leaves.push(got.entry.leaf_hash());
    }
    let app = http::router(log.clone());
    (log, app, leaves)
}

fn hashes_of(bytes: &[u8]) -> Vec<Hash> {
    assert_eq!(bytes.len() % 32, 0);
    bytes
        .chunks(32)
        .map(|c| Hash::from_bytes(c.try_into().unwrap()))
        .collect()
}

fn tile_index(n: u64) -> String {
    // C2SP tlog-tiles: groups of three digits, all but the last prefixed x.
    let mut s = format!("{:03}", n % 1000);
    let mut n = n / 1000;
    while n > 0 {
        s = format!("x{:03}/{s}", n % 1000);
        n /= 1000;
    }
    s
}

/// A monitor that knows only the log's key and URL layout: it fetches the
/// checkpoint, the level-0 and level-1 hash tiles and the entry bundles,
/// checks each entry hashes to its tile's leaf hash, each level-1 hash is the
/// root of its 256 leaves, and the leaves hash to the signed root.
async fn monitor(app: &Router, parse_entries: bool) -> (Checkpoint, Vec<Entry>) {
    let got = get(app, "/checkpoint").await;
    assert_eq!(got.status, StatusCode::OK);
    let cp = open_checkpoint(std::str::from_utf8(&got.body).unwrap(), signer().verifier()).unwrap();
    let size = cp.size.get();
    let mut leaves = Vec::new();
    let mut entries = Vec::new();
    let mut n = 0;
    while n * 256 < size {
        let width = (size - n * 256).min(256);
        let suffix = if width == 256 {
            String::new()
        } else {
            format!(".p/{width}")
        };
        let tile = get(app, &format!("/tile/0/{}{suffix}", tile_index(n))).await;
        assert_eq!(tile.status, StatusCode::OK, "tile 0/{n}");
        let hashes = hashes_of(&tile.body);
        assert_eq!(hashes.len() as u64, width);
        let bundle = get(app, &format!("/tile/entries/{}{suffix}", tile_index(n))).await;
        assert_eq!(bundle.status, StatusCode::OK);
        let mut rest = &bundle.body[..];
        for (k, h) in hashes.iter().enumerate() {
            let len = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
            let data = &rest[2..2 + len];
            rest = &rest[2 + len..];
            assert_eq!(leaf_hash(data), *h, "entry {}", n * 256 + k as u64);
            if parse_entries {
                let entry = Entry::from_json(data).unwrap();
                assert_eq!(entry.index().get(), n * 256 + k as u64);
                entries.push(entry);
            }
        }
        assert!(rest.is_empty(), "bundle {n} has trailing bytes");
        leaves.extend(hashes);
        n += 1;
    }
    assert_eq!(
        reference::root(&leaves),
        cp.root,
        "tiles do not hash to the signed root"
    );
    // Level 1: hash k is the root of leaves 256k..256k+256.
    let mut m = 0;
    while m * 256 < size >> 8 {
        let width = ((size >> 8) - m * 256).min(256);
        let suffix = if width == 256 {
            String::new()
        } else {
            format!(".p/{width}")
        };
        let tile = get(app, &format!("/tile/1/{}{suffix}", tile_index(m))).await;
        assert_eq!(tile.status, StatusCode::OK);
        for (k, h) in hashes_of(&tile.body).iter().enumerate() {
            let start = ((m * 256 + k as u64) * 256) as usize;
            assert_eq!(*h, reference::root(&leaves[start..start + 256]));
        }
        m += 1;
    }
    (cp, entries)
}

#[tokio::test]
async fn a_monitor_rebuilds_and_checks_the_log_from_tiles_alone() {
    let (log, app, leaves) = log_with(300).await;
    let (cp300, entries) = monitor(&app, true).await;
    assert_eq!(cp300.size, TreeSize::new(300));
    assert_eq!(entries.len(), 300);
    assert_eq!(
        entries.iter().map(Entry::leaf_hash).collect::<Vec<_>>(),
        leaves
    );
    let mut agents: Vec<Agent> = (0..3).map(|i| Agent::new(&format!("agent-{i}"))).collect();
    for (i, e) in entries.iter().enumerate() {
        agents[i % 3].resync(e.record().seq, e.record().hash());
    }
    let recs: Vec<_> = (0..400).map(|i| agents[i % 3].next()).collect();
    for got in futures_join_all(recs.into_iter().map(|r| log.append(r, now()))).await {
        got.unwrap();
    }
    let (cp, entries) = monitor(&app, true).await;
    assert_eq!(cp.size, TreeSize::new(700));
    assert_eq!(entries.len(), 700);
    assert_eq!(
        entries[..300]
            .iter()
            .map(Entry::leaf_hash)
            .collect::<Vec<_>>(),
        leaves
    );
    // The monitor proves the new checkpoint consistent with the one it saw.
    let got = get(&app, "/v1/proof/consistency?from=300").await;
    assert_eq!(got.status, StatusCode::OK);
    let body = got.json();
    assert_eq!(body["from"], 300);
    assert_eq!(body["to"], 700);
    let proof: Vec<Hash> = serde_json::from_value(body["consistency"].clone()).unwrap();
    verify_consistency(cp300.size, cp.size, &cp300.root, &cp.root, &proof).unwrap();
}

/// Fills a store with `n` synthetic leaves through the storage API (the
/// store does not parse entries), so higher tile levels can be checked
/// without signing tens of thousands of records in a debug build.
fn synthetic_log(n: u64) -> (Arc<Log>, Vec<Hash>) {
    let store = Arc::new(MemoryStore::new());
    let mut leaves = Vec::new();
    let mut size = 0u64;
    while size < n {
        let take = (n - size).min(4096);
        let mut entries = Vec::new();
        for i in size..size + take {
            let data = format!("synthetic entry {i}").into_bytes();
            let lh = leaf_hash(&data);
            leaves.push(lh);
            entries.push(NewEntry {
                index: LeafIndex::new(i),
                canonical: data,
                leaf_hash: lh,
                record_hash: Hash::sha256(&i.to_be_bytes()),
                nonce: Nonce::from_bytes([i.to_be_bytes(), [7; 8]].concat()).unwrap(),
                agent: AgentName::new("synthetic").unwrap(),
                seq: Seq::new(i).unwrap(),
                time: tally_schemas::UnixMillis::new(0),
            });
        }
        let old = TreeSize::new(size);
        let hashes = tree::batch_hashes(store.as_ref(), old, &leaves[size as usize..]).unwrap();
        let new_size = TreeSize::new(size + take);
        store
            .commit_batch(&BatchWrite {
                old_size: old,
                entries,
                hashes,
                receipt_size: new_size,
                key_versions: Vec::new(),
            })
            .unwrap();
        size += take;
    }
    let log = Arc::new(Log::open(store, signer(), LogConfig::default()).unwrap());
    (log, leaves)
}

#[tokio::test]
async fn tiles_at_every_level_match_the_reference_tree() {
    let n = 65_536 + 256 * 3 + 5;
    let (log, leaves) = synthetic_log(n);
    assert_eq!(
        log.latest_checkpoint().checkpoint.root,
        reference::root(&leaves)
    );
    let app = http::router(log);
    let (cp, _) = monitor(&app, false).await;
    assert_eq!(cp.size.get(), n);
    // Level 2: hash 0 is the root of the first 65,536 leaves; it is the
    // only level-2 hash, so the tile is partial with width 1.
    let got = get(&app, "/tile/2/000.p/1").await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(
        hashes_of(&got.body),
        vec![reference::root(&leaves[..65_536])]
    );
    assert_eq!(
        get(&app, "/tile/2/000.p/2").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(&app, "/tile/3/000.p/1").await.status,
        StatusCode::NOT_FOUND
    );
    // Level 1 tile 1 holds the three full 256-leaf subtrees after 65,536.
    let got = get(&app, "/tile/1/001.p/3").await;
    assert_eq!(got.status, StatusCode::OK);
    let expect: Vec<Hash> = (0..3)
        .map(|k| reference::root(&leaves[65_536 + 256 * k..65_536 + 256 * (k + 1)]))
        .collect();
    assert_eq!(hashes_of(&got.body), expect);
}

#[tokio::test]
async fn tiles_have_the_right_cache_headers_and_refuse_bad_paths() {
    let (_log, app, leaves) = log_with(258).await;
    let full = get(&app, "/tile/0/000").await;
    assert_eq!(full.status, StatusCode::OK);
    assert_eq!(full.cache.as_deref(), Some(http::IMMUTABLE));
    assert_eq!(hashes_of(&full.body), leaves[..256]);
    let partial = get(&app, "/tile/0/001.p/2").await;
    assert_eq!(partial.status, StatusCode::OK);
    assert_eq!(partial.cache.as_deref(), Some(http::SHORT_LIVED));
    assert_eq!(hashes_of(&partial.body), leaves[256..]);
    // A narrower partial tile of an older tree is still served (hashes are immutable).
    assert_eq!(
        hashes_of(&get(&app, "/tile/0/001.p/1").await.body),
        leaves[256..257]
    );
    assert_eq!(
        hashes_of(&get(&app, "/tile/0/000.p/7").await.body),
        leaves[..7]
    );
    let cp = get(&app, "/checkpoint").await;
    assert_eq!(cp.cache.as_deref(), Some(http::SHORT_LIVED));
    let bundle = get(&app, "/tile/entries/001.p/2").await;
    assert_eq!(bundle.status, StatusCode::OK);
    for (path, status, code) in [
        ("/tile/0/001", StatusCode::NOT_FOUND, "tile_not_found"),
        ("/tile/0/001.p/3", StatusCode::NOT_FOUND, "tile_not_found"),
        ("/tile/1/000.p/2", StatusCode::NOT_FOUND, "tile_not_found"),
        (
            "/tile/entries/002.p/1",
            StatusCode::NOT_FOUND,
            "tile_not_found",
        ),
        ("/tile/0/000.p/0", StatusCode::BAD_REQUEST, "bad_tile_path"),
        (
            "/tile/0/000.p/256",
            StatusCode::BAD_REQUEST,
            "bad_tile_path",
        ),
        ("/tile/0/000.p/01", StatusCode::BAD_REQUEST, "bad_tile_path"),
        ("/tile/0/01", StatusCode::BAD_REQUEST, "bad_tile_path"),
        ("/tile/0/1", StatusCode::BAD_REQUEST, "bad_tile_path"),
        ("/tile/0/x000/001", StatusCode::BAD_REQUEST, "bad_tile_path"),
        ("/tile/0/001/001", StatusCode::BAD_REQUEST, "bad_tile_path"),
        ("/tile/00/000", StatusCode::BAD_REQUEST, "bad_tile_path"),
        ("/tile/8/000", StatusCode::BAD_REQUEST, "bad_tile_path"),
        ("/tile/data/000", StatusCode::BAD_REQUEST, "bad_tile_path"),
        ("/tile/8/0/000", StatusCode::BAD_REQUEST, "bad_tile_path"),
        (
            "/tile/0/x999/x999/x999/x999/x999/x999/999",
            StatusCode::BAD_REQUEST,
            "bad_tile_path",
        ),
        (
            "/tile/0/x018/x446/x744/x073/x709/x551/616",
            StatusCode::BAD_REQUEST,
            "bad_tile_path",
        ),
        (
            "/tile/entries/000.p/",
            StatusCode::BAD_REQUEST,
            "bad_tile_path",
        ),
        ("/tile/entries", StatusCode::BAD_REQUEST, "bad_tile_path"),
    ] {
        let got = get(&app, path).await;
        assert_eq!(got.status, status, "{path}");
        assert_eq!(got.code(), code, "{path}");
    }
}

#[tokio::test]
async fn inclusion_proofs_by_index_and_leaf_hash_verify() {
    let (log, app, leaves) = log_with(21).await;
    let cp = log.latest_checkpoint().checkpoint.clone();
    for (uri, index, size) in [
        (
            "/v1/proof/inclusion?index=5&size=21".to_owned(),
            5u64,
            21u64,
        ),
        ("/v1/proof/inclusion?index=5".to_owned(), 5, 21),
        ("/v1/proof/inclusion?size=9&index=8".to_owned(), 8, 9),
        (
            format!("/v1/proof/inclusion?leaf_hash={}", leaves[20]),
            20,
            21,
        ),
        (
            format!("/v1/proof/inclusion?leaf_hash={}&size=4", leaves[3]),
            3,
            4,
        ),
        ("/v1/proof/inclusion?index=0&size=1".to_owned(), 0, 1),
    ] {
        let got = get(&app, &uri).await;
        assert_eq!(got.status, StatusCode::OK, "{uri}");
        let body = got.json();
        assert_eq!(body["index"], index, "{uri}");
        assert_eq!(body["size"], size, "{uri}");
        let leaf: Hash = serde_json::from_value(body["leaf_hash"].clone()).unwrap();
        assert_eq!(leaf, leaves[index as usize]);
        let proof: Vec<Hash> = serde_json::from_value(body["inclusion"].clone()).unwrap();
        let root = if size == 21 {
            cp.root
        } else {
            reference::root(&leaves[..size as usize])
        };
        verify_inclusion(
            LeafIndex::new(index),
            TreeSize::new(size),
            &leaf,
            &proof,
            &root,
        )
        .unwrap();
    }
}

#[tokio::test]
async fn proof_requests_out_of_range_get_clear_4xx_codes() {
    let (_log, app, leaves) = log_with(10).await;
    let unknown = Hash::sha256(b"nope");
    for (uri, status, code) in [
        (
            "/v1/proof/inclusion?index=10",
            StatusCode::BAD_REQUEST,
            "index_beyond_size".to_owned(),
        ),
        (
            "/v1/proof/inclusion?index=3&size=3",
            StatusCode::BAD_REQUEST,
            "index_beyond_size".into(),
        ),
        (
            "/v1/proof/inclusion?index=0&size=11",
            StatusCode::BAD_REQUEST,
            "size_beyond_tree".into(),
        ),
        (
            "/v1/proof/inclusion?index=0&size=0",
            StatusCode::BAD_REQUEST,
            "index_beyond_size".into(),
        ),
        (
            "/v1/proof/inclusion",
            StatusCode::BAD_REQUEST,
            "missing_parameter".into(),
        ),
        (
            "/v1/proof/inclusion?index=1&leaf_hash=00",
            StatusCode::BAD_REQUEST,
            "missing_parameter".into(),
        ),
        (
            "/v1/proof/inclusion?index=-1",
            StatusCode::BAD_REQUEST,
            "bad_parameter".into(),
        ),
        (
            "/v1/proof/inclusion?index=01",
            StatusCode::BAD_REQUEST,
            "bad_parameter".into(),
        ),
        (
            "/v1/proof/inclusion?index=99999999999999999999",
            StatusCode::BAD_REQUEST,
            "bad_parameter".into(),
        ),
        (
            "/v1/proof/inclusion?index=1&index=2",
            StatusCode::BAD_REQUEST,
            "repeated_parameter".into(),
        ),
        (
            "/v1/proof/inclusion?index=1&bogus=2",
            StatusCode::BAD_REQUEST,
            "unknown_parameter".into(),
        ),
        (
            "/v1/proof/inclusion?leaf_hash=XYZ",
            StatusCode::BAD_REQUEST,
            "bad_parameter".into(),
        ),
        (
            "/v1/proof/consistency?from=0&to=5",
            StatusCode::BAD_REQUEST,
            "from_empty_tree".into(),
        ),
        (
            "/v1/proof/consistency?from=6&to=5",
            StatusCode::BAD_REQUEST,
            "sizes_out_of_order".into(),
        ),
        (
            "/v1/proof/consistency?from=6&to=11",
            StatusCode::BAD_REQUEST,
            "size_beyond_tree".into(),
        ),
        (
            "/v1/proof/consistency?from=11",
            StatusCode::BAD_REQUEST,
            "sizes_out_of_order".into(),
        ),
        (
            "/v1/proof/consistency?to=5",
            StatusCode::BAD_REQUEST,
            "missing_parameter".into(),
        ),
        (
            "/v1/proof/consistency?from=1&to=x",
            StatusCode::BAD_REQUEST,
            "bad_parameter".into(),
        ),
    ] {
        let got = get(&app, uri).await;
        assert_eq!(got.status, status, "{uri}");
        assert_eq!(got.code(), code, "{uri}");
        assert!(got.json()["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    let got = get(&app, &format!("/v1/proof/inclusion?leaf_hash={unknown}")).await;
    assert_eq!(
        (got.status, got.code().as_str()),
        (StatusCode::NOT_FOUND, "unknown_leaf_hash")
    );
    // A leaf beyond the requested size is unknown in that tree.
    let got = get(
        &app,
        &format!("/v1/proof/inclusion?leaf_hash={}&size=5", leaves[7]),
    )
    .await;
    assert_eq!(
        (got.status, got.code().as_str()),
        (StatusCode::NOT_FOUND, "unknown_leaf_hash")
    );
    // Equal sizes: the empty proof (RFC 9162 §2.1.4).
    let got = get(&app, "/v1/proof/consistency?from=10&to=10").await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.json()["consistency"], serde_json::json!([]));
    let got = get(&app, "/v1/proof/consistency?from=3&to=7").await;
    let proof: Vec<Hash> = serde_json::from_value(got.json()["consistency"].clone()).unwrap();
    assert_eq!(proof, reference::consistency_proof(3, &leaves[..7]));
}

#[tokio::test]
async fn an_empty_log_serves_its_checkpoint_and_nothing_else() {
    let (_log, app, _) = log_with(0).await;
    let got = get(&app, "/checkpoint").await;
    let cp = open_checkpoint(std::str::from_utf8(&got.body).unwrap(), signer().verifier()).unwrap();
    assert_eq!(cp.size, TreeSize::new(0));
    assert_eq!(cp.root, Hash::sha256(b""));
    assert_eq!(
        get(&app, "/tile/0/000.p/1").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(&app, "/tile/entries/000.p/1").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(&app, "/v1/proof/consistency?from=0&to=0").await.code(),
        "from_empty_tree"
    );
    assert_eq!(
        get(&app, "/v1/proof/inclusion?index=0").await.code(),
        "index_beyond_size"
    );
    // Sanity of the helper used above: a two-leaf root.
    let l = [leaf_hash(b"a"), leaf_hash(b"b")];
    assert_eq!(reference::root(&l), node_hash(&l[0], &l[1]));
}
