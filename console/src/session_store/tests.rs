//! Tests of the session stores, on both backends, with the rules of `auth`.

use super::*;
use crate::auth::{victim, SessionLimits};

fn session(id: &str, project: &str, key: &str, expires: i64) -> StoredSession {
    StoredSession {
        id: id.to_owned(),
        project: project.to_owned(),
        key_id: key.to_owned(),
        key_sha256: format!("{key:0>64}"),
        created: UnixMillis::new(0),
        expires: UnixMillis::new(expires),
    }
}

/// Stores `s` at `now` by the rules of `auth` with `limits`.
fn login(store: &dyn SessionStore, s: &StoredSession, now: i64, limits: SessionLimits) {
    store
        .login(s, UnixMillis::new(now), &|census: &[KeySessions]| {
            victim(census, &s.project, limits)
        })
        .unwrap();
}

const NO_LIMITS: SessionLimits = SessionLimits {
    per_project: 1_000,
    total: 1_000,
};

/// A fresh store on each backend: memory, and a real PostgreSQL
/// database (skipped, saying so, only with TALLY_SKIP_POSTGRES=1).
fn backends() -> Vec<Box<dyn SessionStore>> {
    let mut v: Vec<Box<dyn SessionStore>> = vec![Box::new(MemorySessions::default())];
    if let Some(url) = tally_testkit::postgres::database() {
        v.push(Box::new(PostgresSessions::open(&url).unwrap()));
    }
    v
}

#[test]
fn console_sessions_store_get_remove_and_delete_expired() {
    for store in backends() {
        let a = session("a", "p", "k1", 1_000);
        login(&*store, &a, 0, NO_LIMITS);
        assert_eq!(store.get("a").unwrap(), Some(a.clone()));
        assert_eq!(store.get("b").unwrap(), None);
        store.remove("a").unwrap();
        assert_eq!(store.get("a").unwrap(), None);
        store.remove("a").unwrap();
        // A login deletes the sessions expired at its time.
        login(&*store, &session("b", "p", "k1", 100), 0, NO_LIMITS);
        login(&*store, &session("c", "p", "k1", 200), 0, NO_LIMITS);
        assert_eq!(store.count("p").unwrap(), 2);
        login(&*store, &session("d", "q", "k2", 1_000), 100, NO_LIMITS);
        assert_eq!(store.get("b").unwrap(), None, "expired at 100");
        assert!(store.get("c").unwrap().is_some());
        assert_eq!(store.count("p").unwrap(), 1);
        assert_eq!(store.count("q").unwrap(), 1);
    }
}

/// The rules of docs/console.md "Access", on each backend: a full
/// project gives up the oldest session of its key holding the most; a
/// full table, of the project holding the most.
#[test]
fn console_sessions_store_limits_end_the_biggest_holders_oldest_session() {
    let limits = SessionLimits {
        per_project: 3,
        total: 5,
    };
    for store in backends() {
        let live = |ids: &[&str]| {
            ids.iter()
                .filter(|id| store.get(id).unwrap().is_some())
                .map(|id| (*id).to_owned())
                .collect::<Vec<_>>()
        };
        login(
            &*store,
            &session("first", "default", "k1", 10_000),
            0,
            limits,
        );
        // A second key of the project logs in again and again: it
        // ends only its own sessions, oldest first.
        for i in 0..6 {
            let s = session(&format!("second-{i}"), "default", "k2", 10_000);
            login(&*store, &s, 0, limits);
        }
        assert_eq!(store.count("default").unwrap(), 3);
        assert_eq!(
            live(&["first", "second-3", "second-4", "second-5"]),
            ["first", "second-4", "second-5"]
        );
        // Two sessions of another project fill the table (3 + 2) ...
        login(
            &*store,
            &session("other-0", "other", "k3", 10_000),
            0,
            limits,
        );
        login(
            &*store,
            &session("other-1", "other", "k3", 10_000),
            0,
            limits,
        );
        // ... so a third project's login ends the oldest session of the
        // biggest project's key holding the most.
        login(&*store, &session("third", "third", "k4", 10_000), 0, limits);
        assert_eq!(store.count("default").unwrap(), 2);
        assert_eq!(
            live(&["first", "second-4", "second-5"]),
            ["first", "second-5"]
        );
        assert_eq!(store.count("other").unwrap(), 2);
        assert_eq!(store.count("third").unwrap(), 1);
    }
}

/// Two fronts on one database: a session stored through one is found
/// through the other, and ended through either it is gone from both.
#[test]
fn postgres_sessions_are_shared_between_fronts() {
    let Some(url) = tally_testkit::postgres::database() else {
        return;
    };
    let a = PostgresSessions::open(&url).unwrap();
    let b = PostgresSessions::open(&url).unwrap();
    let s = session("s", "p", "k", 10_000);
    login(&a, &s, 0, NO_LIMITS);
    assert_eq!(b.get("s").unwrap(), Some(s));
    b.remove("s").unwrap();
    assert_eq!(a.get("s").unwrap(), None);
}

/// Logins at once through two fronts never pass the total limit: each
/// decides and writes in a transaction no other login interleaves with.
#[test]
fn postgres_concurrent_logins_through_two_fronts_keep_the_total() {
    let Some(url) = tally_testkit::postgres::database() else {
        return;
    };
    let limits = SessionLimits {
        per_project: 100,
        total: 4,
    };
    let fronts = [
        PostgresSessions::open(&url).unwrap(),
        PostgresSessions::open(&url).unwrap(),
    ];
    let (threads, each) = (8, 6);
    std::thread::scope(|scope| {
        for t in 0..threads {
            let front = &fronts[t % 2];
            scope.spawn(move || {
                for i in 0..each {
                    let s = session(&format!("{t}-{i}"), &format!("p{t}-{i}"), "k", 10_000);
                    login(front, &s, 0, limits);
                }
            });
        }
    });
    let stored: usize = (0..threads)
        .flat_map(|t| (0..each).map(move |i| (t, i)))
        .map(|(t, i)| fronts[0].count(&format!("p{t}-{i}")).unwrap())
        .sum();
    assert_eq!(stored, limits.total);
}
