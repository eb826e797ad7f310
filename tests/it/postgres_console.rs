//! The console's sessions on PostgreSQL, through the real binary
//! (docs/console.md "Access", docs/operations.md "Running on PostgreSQL"):
//! two `tally serve` fronts on one database, as behind a load balancer.
//! - logged in through one front, the same cookie opens pages and posts
//!   forms (with the session's CSRF token) through the other, and a form
//!   with another token is still refused;
//! - a logout through one front ends the session on the other at once;
//! - revoking the API key through one front ends its sessions on both at
//!   once, and no other key's;
//! - the database holds neither the session token nor the API key;
//! - with the database gone, the console answers a page that says so
//!   (503), never a 500 or a dropped connection.

use std::path::Path;
use std::time::{Duration, Instant};

use rand_core::OsRng;
use serde_json::json;
use tally_schemas::{AgentName, Hash, SecretKey, UnixMillis};

use crate::common::{self, tally, Server};

/// A browser that follows no redirect, so the test sees each 303 and the
/// cookies it sets.
fn browser() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

fn between<'a>(s: &'a str, start: &str, end: &str) -> &'a str {
    let i = s
        .find(start)
        .unwrap_or_else(|| panic!("no {start:?} in:\n{s}"))
        + start.len();
    let j = s[i..].find(end).unwrap() + i;
    &s[i..j]
}

/// The first `name=value` pair of the response's `Set-Cookie`.
fn set_cookie(r: &reqwest::Response) -> String {
    let set = r
        .headers()
        .get(reqwest::header::SET_COOKIE)
        .unwrap_or_else(|| panic!("no Set-Cookie ({})", r.status()))
        .to_str()
        .unwrap();
    set.split(';').next().unwrap().to_owned()
}

/// Logs in through the front at `url` as a browser does (the login form's
/// token and its cookie); returns the session cookie pair.
async fn login(http: &reqwest::Client, url: &str, api_key: &str) -> String {
    let form = http
        .get(format!("{url}/console/login"))
        .send()
        .await
        .unwrap();
    assert_eq!(form.status().as_u16(), 200);
    let login_cookie = set_cookie(&form);
    let page = form.text().await.unwrap();
    let token = between(&page, "name=\"login_token\" value=\"", "\"").to_owned();
    let r = http
        .post(format!("{url}/console/login"))
        .header(reqwest::header::COOKIE, login_cookie)
        .form(&[("login_token", token.as_str()), ("api_key", api_key)])
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let cookie = set_cookie(&r);
    assert_eq!(status, 303, "{}", r.text().await.unwrap());
    assert!(cookie.starts_with("tally_console="), "{cookie}");
    cookie
}

/// `GET url+path` with `cookie`: the status, where a redirect points, the body.
async fn get(http: &reqwest::Client, url: &str, path: &str, cookie: &str) -> (u16, String, String) {
    let r = http
        .get(format!("{url}{path}"))
        .header(reqwest::header::COOKIE, cookie)
        .send()
        .await
        .unwrap();
    answer(r).await
}

async fn post_form(
    http: &reqwest::Client,
    url: &str,
    path: &str,
    cookie: &str,
    form: &[(&str, &str)],
) -> (u16, String, String) {
    let r = http
        .post(format!("{url}{path}"))
        .header(reqwest::header::COOKIE, cookie)
        .form(form)
        .send()
        .await
        .unwrap();
    answer(r).await
}

async fn answer(r: reqwest::Response) -> (u16, String, String) {
    let status = r.status().as_u16();
    let location = r
        .headers()
        .get(reqwest::header::LOCATION)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, location, r.text().await.unwrap())
}

/// Whether `cookie` is refused by the front at `url`: sent to log in.
async fn refused(http: &reqwest::Client, url: &str, cookie: &str) -> bool {
    let (status, location, _) = get(http, url, "/console", cookie).await;
    status == 303 && location == "/console/login"
}

/// The front that ran the first start made `log.skey` and `keys.json`;
/// another front gets copies of those two files only.
fn second_front_folder(data_a: &Path, data_b: &Path) {
    std::fs::create_dir_all(data_b).unwrap();
    for file in ["log.skey", "keys.json"] {
        std::fs::copy(data_a.join(file), data_b.join(file)).unwrap();
    }
}

/// The auditor-link form for agent `bot`, with `csrf` as its token.
fn link_form(csrf: &str) -> [(&str, &str); 4] {
    [
        ("csrf", csrf),
        ("agent", "bot"),
        ("expires_hours", "1"),
        ("label", "cross-front"),
    ]
}

async fn register_agent(http: &reqwest::Client, url: &str, api_key: &str, agent: &str) {
    let key = SecretKey::generate(&mut OsRng);
    let r = http
        .post(format!("{url}/v1/agents"))
        .bearer_auth(api_key)
        .json(&json!({
            "agent": AgentName::new(agent).unwrap(),
            "public_key": key.public_key(),
            "not_before": UnixMillis::new(UnixMillis::now().as_millis() - 60_000),
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201, "{}", r.text().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_sessions_work_through_every_front_and_end_on_all_at_once() {
    let _alone = common::not_beside_heavy_async().await;
    let Some(db_url) = tally_testkit::postgres::database() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (data_a, data_b) = (tmp.path().join("a"), tmp.path().join("b"));
    let args = ["--store", db_url.as_str(), "--rate-limit", "0"];
    let a = Server::start(&data_a, &args);
    let api_key = a.banner_value("API key");
    second_front_folder(&data_a, &data_b);
    let b = Server::start(&data_b, &args);
    let http = browser();
    register_agent(&http, &a.url, &api_key, "bot").await;

    // 1. Logged in through a, the cookie works through b: a page, and a
    // form posted with the session's CSRF token.
    let cookie = login(&http, &a.url, &api_key).await;
    let (status, _, body) = get(&http, &b.url, "/console", &cookie).await;
    assert_eq!(
        status, 200,
        "a session made through front a is unknown to b"
    );
    assert!(body.contains("bot"), "{body}");
    let (status, _, links_b) = get(&http, &b.url, "/console/links", &cookie).await;
    assert_eq!(status, 200);
    let csrf = between(&links_b, "name=\"csrf\" value=\"", "\"").to_owned();
    let (status, _, links_a) = get(&http, &a.url, "/console/links", &cookie).await;
    assert_eq!(status, 200);
    assert_eq!(
        between(&links_a, "name=\"csrf\" value=\"", "\""),
        csrf,
        "one session, one CSRF token, whichever front shows the form"
    );
    let wrong = "0".repeat(64);
    let (status, _, body) =
        post_form(&http, &b.url, "/console/links", &cookie, &link_form(&wrong)).await;
    assert_eq!(status, 403, "a form with another CSRF token: {body}");
    let (status, _, body) =
        post_form(&http, &b.url, "/console/links", &cookie, &link_form(&csrf)).await;
    assert_eq!(status, 200, "{body}");
    let link = between(&body, "id=\"new-link-url\" href=\"", "\"").to_owned();
    // The link made through b opens on a (auditor links are shared within
    // the watch period).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, _, _) = get(&http, &a.url, &link, "").await;
        if status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the link made through b never opened on a"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // 2. Nothing secret is stored: the session's id is its token's SHA-256,
    // and neither the token nor the API key is in the table.
    let token = cookie.strip_prefix("tally_console=").unwrap();
    let pg = tally_testkit::postgres::shared();
    let db = db_url.rsplit('/').next().unwrap();
    let rows = pg.psql(db, "SELECT * FROM console_sessions");
    assert!(
        rows.contains(&Hash::sha256(token.as_bytes()).to_hex()),
        "{rows}"
    );
    let secret_of_key = api_key.rsplit('_').next().unwrap();
    assert!(
        !rows.contains(token) && !rows.contains(secret_of_key),
        "{rows}"
    );

    // 3. Logged out through b: refused through a at once.
    let (status, location, _) = post_form(
        &http,
        &b.url,
        "/console/logout",
        &cookie,
        &[("csrf", &csrf)],
    )
    .await;
    assert_eq!((status, location.as_str()), (303, "/console/login"));
    assert!(
        refused(&http, &a.url, &cookie).await,
        "logged out through b, still in through a"
    );
    assert!(refused(&http, &b.url, &cookie).await);

    // 4. A second API key, logged in through b; revoked through b: its
    // session is refused through both at once; the first key's is not.
    // (The admin token is in a's data folder; b accepts it too.)
    let env_b = [
        ("TALLY_WITNESS_URL", b.url.as_str()),
        ("TALLY_DATA_DIR", data_a.to_str().unwrap()),
    ];
    let (ok, out, err) = tally(&["project", "new-key", "default"], &env_b);
    assert!(ok, "new-key: {out}{err}");
    let extra = out
        .lines()
        .find_map(|l| l.strip_prefix("API key: "))
        .unwrap()
        .trim()
        .to_owned();
    let extra_cookie = login(&http, &b.url, &extra).await;
    let first_cookie = login(&http, &a.url, &api_key).await;
    assert_eq!(get(&http, &a.url, "/console", &extra_cookie).await.0, 200);
    let extra_id = extra.split('_').nth(1).unwrap().to_owned();
    let (ok, out, err) = tally(&["project", "revoke-key", &extra_id], &env_b);
    assert!(ok, "revoke-key: {out}{err}");
    assert!(
        refused(&http, &a.url, &extra_cookie).await,
        "a session of a key revoked through b still opens pages on a"
    );
    assert!(refused(&http, &b.url, &extra_cookie).await);
    assert_eq!(get(&http, &a.url, "/console", &first_cookie).await.0, 200);
    assert_eq!(get(&http, &b.url, "/console", &first_cookie).await.0, 200);

    assert!(b.sigterm().success());
    assert!(a.sigterm().success());
}

/// A front whose database is gone answers the console with a page that
/// says so (503), not a 500, a panic or a dropped connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_without_its_database_says_so() {
    let _alone = common::not_beside_heavy_async().await;
    if tally_testkit::postgres::skipped() {
        eprintln!("SKIPPED: PostgreSQL tests");
        return;
    }
    let pg = tally_testkit::postgres::PgServer::start();
    let db_url = pg.fresh_database();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("a");
    let a = Server::start(&data, &["--store", db_url.as_str()]);
    let api_key = a.banner_value("API key");
    let http = browser();
    let cookie = login(&http, &a.url, &api_key).await;
    assert_eq!(get(&http, &a.url, "/console", &cookie).await.0, 200);
    pg.stop();
    let (status, _, body) = get(&http, &a.url, "/console", &cookie).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("cannot reach its database"), "{body}");
    // A login says the same (after the throttle and form checks).
    let form = http
        .get(format!("{}/console/login", a.url))
        .send()
        .await
        .unwrap();
    let login_cookie = set_cookie(&form);
    let page = form.text().await.unwrap();
    let token = between(&page, "name=\"login_token\" value=\"", "\"").to_owned();
    let r = http
        .post(format!("{}/console/login", a.url))
        .header(reqwest::header::COOKIE, login_cookie)
        .form(&[
            ("login_token", token.as_str()),
            ("api_key", api_key.as_str()),
        ])
        .send()
        .await
        .unwrap();
    let (status, _, body) = answer(r).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("cannot reach its database"), "{body}");
    a.kill9();
}
