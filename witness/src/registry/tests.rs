//! The registry's tests, on every backend.

use super::*;
use rand_core::OsRng;
use std::time::{Duration, Instant};
use tally_schemas::SecretKey;

/// One fresh registry on one backend: opened (and reopened) at will,
/// and its stored bytes, to show that no secret is in them.
struct Backend {
    name: &'static str,
    open: Box<dyn Fn() -> Arc<Registry>>,
    stored: Box<dyn Fn() -> Vec<u8>>,
    _dir: Option<tempfile::TempDir>,
}

fn redb() -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.redb");
    let p2 = path.clone();
    Backend {
        name: "redb",
        open: Box::new(move || Registry::open(&path).unwrap()),
        stored: Box::new(move || std::fs::read(&p2).unwrap()),
        _dir: Some(dir),
    }
}

fn postgres() -> Option<Backend> {
    let url = tally_testkit::postgres::database()?;
    let db = url.rsplit('/').next().unwrap().to_owned();
    Some(Backend {
        name: "postgres",
        open: Box::new(move || Registry::open_postgres(&url).unwrap()),
        stored: Box::new(move || {
            tally_testkit::postgres::shared()
                .psql(
                    &db,
                    "SELECT string_agg(tbl || key || encode(value, 'escape'), ' ') FROM registry_rows",
                )
                .into_bytes()
        }),
        _dir: None,
    })
}

/// Every backend-independent test runs on a redb file and on a real
/// PostgreSQL database (skipped, saying so, only with TALLY_SKIP_POSTGRES=1).
fn backends() -> Vec<Backend> {
    let mut v = vec![redb()];
    v.extend(postgres());
    v
}

#[test]
fn keys_are_shown_once_stored_hashed_and_checked() {
    for b in backends() {
        let r = (b.open)();
        let first = r
            .first_start(UnixMillis::new(1), &mut OsRng)
            .unwrap()
            .unwrap();
        r.first_start_shown().unwrap();
        assert!(r
            .first_start(UnixMillis::new(2), &mut OsRng)
            .unwrap()
            .is_none());
        let p = r.authenticate(&first.api_key.token).unwrap();
        assert_eq!(p.project, DEFAULT_PROJECT);
        assert!(r.is_admin(&first.admin_token.token));
        assert!(!r.is_admin(&first.api_key.token));
        // One flipped character of the secret is refused.
        let mut wrong = first.api_key.token.clone();
        let last = wrong.pop().unwrap();
        wrong.push(if last == '0' { '1' } else { '0' });
        assert!(r.authenticate(&wrong).is_none());
        assert!(r.authenticate("").is_none());
        assert!(r.authenticate("tally_").is_none());
        // The plain key is nowhere in the store.
        drop(r);
        let bytes = (b.stored)();
        assert!(!bytes.is_empty(), "{}", b.name);
        let secret_part = first.api_key.token.rsplit('_').next().unwrap();
        assert!(
            !bytes
                .windows(secret_part.len())
                .any(|w| w == secret_part.as_bytes()),
            "{}",
            b.name
        );
        // And it survives a reopen.
        let r = (b.open)();
        assert!(r.authenticate(&first.api_key.token).is_some());
        let place = r.first_start_place().unwrap();
        assert!(place.shown);
        assert_eq!(place.api_key_id, first.api_key.id());
        r.revoke_api_key(first.api_key.id(), UnixMillis::new(3))
            .unwrap();
        assert!(r.authenticate(&first.api_key.token).is_none());
    }
}

#[test]
fn read_tokens_are_shown_once_stored_hashed_checked_and_revoked() {
    for b in backends() {
        let r = (b.open)();
        let first = r
            .first_start(UnixMillis::new(1), &mut OsRng)
            .unwrap()
            .unwrap();
        let t = r
            .create_read_token("monitor", UnixMillis::new(5), &mut OsRng)
            .unwrap();
        assert!(t.token.starts_with(READ_TOKEN_PREFIX));
        assert_eq!(r.authenticate_reader(&t.token).as_deref(), Some(t.id()));
        // Each kind of token is accepted only where it is expected.
        assert!(r.authenticate(&t.token).is_none());
        assert!(!r.is_admin(&t.token));
        assert!(r.authenticate_reader(&first.api_key.token).is_none());
        assert!(r.authenticate_reader(&first.admin_token.token).is_none());
        let mut wrong = t.token.clone();
        let last = wrong.pop().unwrap();
        wrong.push(if last == '0' { '1' } else { '0' });
        assert!(r.authenticate_reader(&wrong).is_none());
        assert!(matches!(
            r.create_read_token("a\u{7}b", UnixMillis::new(5), &mut OsRng),
            Err(WitnessError::BadRequest {
                code: "bad_label",
                ..
            })
        ));
        drop(r);
        let bytes = (b.stored)();
        let secret = t.token.rsplit('_').next().unwrap();
        assert!(!bytes.windows(secret.len()).any(|w| w == secret.as_bytes()));
        let r = (b.open)();
        assert!(r.authenticate_reader(&t.token).is_some());
        r.revoke_read_token(t.id(), UnixMillis::new(9)).unwrap();
        r.revoke_read_token(t.id(), UnixMillis::new(10)).unwrap();
        assert!(r.authenticate_reader(&t.token).is_none());
        let list = r.read_tokens();
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].1.label, "monitor");
        assert_eq!(list[0].1.revoked, Some(UnixMillis::new(9)));
        assert!(matches!(
            r.revoke_read_token("0000000000000000", UnixMillis::new(9)),
            Err(WitnessError::NotFound(_))
        ));
    }
}

#[test]
fn a_name_is_told_apart_only_for_its_own_project_and_weak_keys_are_refused() {
    for b in backends() {
        let r = (b.open)();
        r.first_start(UnixMillis::new(0), &mut OsRng).unwrap();
        let a = AgentName::new("bot").unwrap();
        let k = SecretKey::generate(&mut OsRng).public_key();
        r.add_agent("default", &a, k, UnixMillis::new(0)).unwrap();
        assert!(matches!(
            r.add_agent("default", &a, k, UnixMillis::new(0)),
            Err(WitnessError::Exists { what: "agent", .. })
        ));
        assert!(matches!(
            r.add_agent("other", &a, k, UnixMillis::new(0)),
            Err(WitnessError::NameUnavailable { .. })
        ));
    }
    let mut identity = [0u8; 32];
    identity[0] = 1;
    // A weak key cannot reach the registry: parsing refuses it.
    assert!(PublicKey::from_bytes(&identity).is_err());
}

#[test]
fn rotate_and_retire_set_validity_ranges() {
    for b in backends() {
        let r = (b.open)();
        r.first_start(UnixMillis::new(0), &mut OsRng).unwrap();
        let a = AgentName::new("bot").unwrap();
        let k1 = SecretKey::generate(&mut OsRng).public_key();
        let k2 = SecretKey::generate(&mut OsRng).public_key();
        r.add_agent("default", &a, k1, UnixMillis::new(100))
            .unwrap();
        assert!(matches!(
            r.add_agent("default", &a, k1, UnixMillis::new(100)),
            Err(WitnessError::Exists { .. })
        ));
        assert!(matches!(
            r.rotate_key("other", &a, k2, UnixMillis::new(200)),
            Err(WitnessError::AgentNotAllowed { .. })
        ));
        assert!(matches!(
            r.rotate_key("default", &a, k2, UnixMillis::new(50)),
            Err(WitnessError::BadRequest { .. })
        ));
        let row = r
            .rotate_key("default", &a, k2, UnixMillis::new(200))
            .unwrap();
        assert_eq!(row.keys[0].not_after, Some(UnixMillis::new(200)));
        assert_eq!(row.keys[1].not_before, UnixMillis::new(200));
        assert!(row.keys[1].not_after.is_none());
        let row = r.retire_agent("default", &a, UnixMillis::new(300)).unwrap();
        assert_eq!(row.keys[0].not_after, Some(UnixMillis::new(200)));
        assert_eq!(row.keys[1].not_after, Some(UnixMillis::new(300)));
        assert!(!row.keys[1].active_at(UnixMillis::new(300)));
        assert!(row.keys[1].active_at(UnixMillis::new(299)));
        // What was written is what a reopened registry reads.
        drop(r);
        assert_eq!((b.open)().agent(&a), Some(row), "{}", b.name);
    }
}

/// Waits (at most `bound`) for `cond`; how long it took.
fn within(bound: Duration, cond: impl Fn() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < bound {
        if cond() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Two fronts on one database: what one writes, the other sees within
/// the watch period (docs/operations.md "Running on PostgreSQL"),
/// revocations included; and the first start happens once.
#[test]
fn postgres_fronts_share_registrations_and_revocations() {
    let Some(b) = postgres() else { return };
    let (a, z) = ((b.open)(), (b.open)());
    let first = a
        .first_start_in(UnixMillis::new(1), &mut OsRng, Some(Path::new("/srv/a")))
        .unwrap()
        .unwrap();
    a.first_start_shown().unwrap();
    // The other front makes nothing and knows where the key was shown.
    assert!(z
        .first_start_in(UnixMillis::new(2), &mut OsRng, Some(Path::new("/srv/z")))
        .unwrap()
        .is_none());
    let place = z.first_start_place().unwrap();
    assert_eq!(place.data_dir, "/srv/a");
    assert!(place.shown);
    assert!(z.authenticate(&first.api_key.token).is_some());
    assert!(z.is_admin(&first.admin_token.token));
    // A registration, a key and a read token made through one front...
    let bot = AgentName::new("bot").unwrap();
    let k = SecretKey::generate(&mut OsRng).public_key();
    a.add_agent("default", &bot, k, UnixMillis::new(5)).unwrap();
    let key = a
        .new_api_key("default", UnixMillis::new(5), &mut OsRng)
        .unwrap();
    let read = z
        .create_read_token("monitor", UnixMillis::new(5), &mut OsRng)
        .unwrap();
    // ...are seen by the other within the bound.
    let bound = crate::kv::WATCH_PERIOD * 4;
    assert!(within(bound, || z.agent(&bot).is_some()).is_some());
    assert!(within(bound, || z.authenticate(&key.token).is_some()).is_some());
    assert!(within(bound, || a.authenticate_reader(&read.token).is_some()).is_some());
    // A revocation through one front is refused by the other.
    a.revoke_api_key(key.id(), UnixMillis::new(6)).unwrap();
    z.revoke_read_token(read.id(), UnixMillis::new(6)).unwrap();
    let seen = within(bound, || z.authenticate(&key.token).is_none());
    eprintln!("an API key revoked through one front was refused by the other after {seen:?} (watch period {:?})", crate::kv::WATCH_PERIOD);
    assert!(seen.is_some());
    // Revoking again changes nothing, and writes nothing other fronts
    // would reload for.
    let generation = a.kv().generation().unwrap();
    a.revoke_api_key(key.id(), UnixMillis::new(7)).unwrap();
    assert_eq!(a.kv().generation().unwrap(), generation);
    assert!(within(bound, || a.authenticate_reader(&read.token).is_none()).is_some());
    // A third front opened now reads everything at once.
    let c = (b.open)();
    assert!(c.agent(&bot).is_some());
    assert!(c.authenticate(&key.token).is_none());
    assert!(c.authenticate(&first.api_key.token).is_some());
}

/// Conflicting writes through two handles on one database (each with
/// its own connection and its own in-memory copy): exactly one wins.
#[test]
fn postgres_conflicting_writes_have_exactly_one_winner() {
    let Some(b) = postgres() else { return };
    let fronts = [(b.open)(), (b.open)()];
    fronts[0]
        .first_start(UnixMillis::new(0), &mut OsRng)
        .unwrap();
    fronts[0]
        .create_project("other", UnixMillis::new(0), &mut OsRng)
        .unwrap();
    for f in &fronts {
        f.refresh_if_changed().unwrap();
    }
    for round in 0..20 {
        // The same name through both fronts, for two projects.
        let name = AgentName::new(&format!("racer-{round}")).unwrap();
        let results: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = fronts
                .iter()
                .zip(["default", "other"])
                .map(|(f, project)| {
                    let name = name.clone();
                    s.spawn(move || {
                        let k = SecretKey::generate(&mut OsRng).public_key();
                        f.add_agent(project, &name, k, UnixMillis::new(0))
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let wins = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(wins, 1, "round {round}: {results:?}");
        assert!(
            results
                .iter()
                .any(|r| matches!(r, Err(WitnessError::NameUnavailable { .. }))),
            "{results:?}"
        );
        // Both fronts agree on the owner.
        let winner = results.iter().find_map(|r| r.as_ref().ok()).unwrap();
        for f in &fronts {
            f.refresh_if_changed().unwrap();
            assert_eq!(f.agent(&name).as_ref(), Some(winner));
        }
        // A rotation racing a retirement of that agent: one is made.
        let project = winner.project.clone();
        let results: Vec<_> = std::thread::scope(|s| {
            let (p0, p1) = (&project, &project);
            let (n0, n1) = (&name, &name);
            let f0 = &fronts[0];
            let f1 = &fronts[1];
            let h0 = s.spawn(move || {
                let k = SecretKey::generate(&mut OsRng).public_key();
                f0.rotate_key(p0, n0, k, UnixMillis::new(100))
            });
            let h1 = s.spawn(move || f1.retire_agent(p1, n1, UnixMillis::new(200)));
            vec![h0.join().unwrap(), h1.join().unwrap()]
        });
        let wins: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(wins.len(), 1, "round {round}: {results:?}");
        assert!(
            results
                .iter()
                .any(|r| matches!(r, Err(WitnessError::ConcurrentChange { .. }))),
            "{results:?}"
        );
        for f in &fronts {
            f.refresh_if_changed().unwrap();
            assert_eq!(f.agent(&name).as_ref(), Some(wins[0]));
        }
    }
}

#[test]
fn postgres_a_first_start_that_was_never_shown_is_made_anew() {
    let Some(b) = postgres() else { return };
    let a = (b.open)();
    let lost = a
        .first_start(UnixMillis::new(1), &mut OsRng)
        .unwrap()
        .unwrap();
    // The front dies before showing the key: its session (and the
    // first-start lock) ends with it.
    drop(a);
    let z = (b.open)();
    let again = z
        .first_start(UnixMillis::new(2), &mut OsRng)
        .unwrap()
        .expect("made anew");
    z.first_start_shown().unwrap();
    assert!(z.authenticate(&lost.api_key.token).is_none());
    assert!(!z.is_admin(&lost.admin_token.token));
    assert!(z.authenticate(&again.api_key.token).is_some());
    assert_eq!(z.projects().len(), 1);
    drop(z);
    // Once shown, never again.
    assert!((b.open)()
        .first_start(UnixMillis::new(3), &mut OsRng)
        .unwrap()
        .is_none());
}
