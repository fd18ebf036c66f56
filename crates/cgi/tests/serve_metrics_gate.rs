//! `/metrics` checks passwords through `serve`'s one gate (issue 37, item
//! 2): wrong guesses sent to `/metrics` back off (`429`) exactly like those
//! sent to `/kn`, and the back-off of one address is the same whichever
//! entry point it guessed at. Before the fix `/metrics` checked passwords
//! on the request pool, outside the gate: with `KN_AUTH_BACKOFF_AFTER=3`
//! it took any number of wrong guesses and then the right password while
//! `/kn` answered `429`. The real binary on a loopback port, raw HTTP/1.1.

use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use kn_test_support::raw::{Conn, Reply};
use kn_test_support::Serve;

struct Server {
    serve: Serve,
    _dir: tempfile::TempDir,
}

/// `{SHA}` htpasswd line of `user:password` (fast to check).
fn sha_line(user: &str, password: &str) -> String {
    use sha1::Digest as _;
    format!("{user}:{{SHA}}{}\n", base64::engine::general_purpose::STANDARD.encode(sha1::Sha1::digest(password.as_bytes())))
}

impl Server {
    /// `serve --htpasswd` (anna, ops) under rules that give `/metrics` to
    /// ops alone, backing off after three wrong passwords for a minute.
    fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let users = dir.path().join("users");
        std::fs::write(&users, format!("{}{}", sha_line("anna", "anna-secret"), sha_line("ops", "ops-secret"))).unwrap();
        let rules = dir.path().join("access.rules");
        std::fs::write(&rules, "allow read /kn_metrics ops\ndeny all /kn_metrics *\nallow all /** *\n").unwrap();
        let mut command = Serve::command_of(Path::new(env!("CARGO_BIN_EXE_pubsub-cgi")), &dir.path().join("events"), None);
        command.arg("--htpasswd").arg(&users).current_dir(dir.path()).env_remove("KN_ACCESS_RULES");
        command.envs([
            ("KN_ACCESS_RULES", rules.to_str().unwrap()),
            ("KN_AUTH_BACKOFF_AFTER", "3"),
            ("KN_AUTH_BACKOFF_MAX_MS", "60000"),
        ]);
        Server { serve: Serve::spawn(command), _dir: dir }
    }

    /// `GET target` with these Basic credentials.
    fn get(&self, target: &str, credentials: &str) -> Reply {
        let addr = self.serve.addr();
        let mut conn = Conn::connect(addr, Duration::from_secs(30));
        let basic = base64::engine::general_purpose::STANDARD.encode(credentials);
        let request = format!("GET {target} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Basic {basic}\r\n\r\n");
        conn.reader.get_mut().write_all(request.as_bytes()).unwrap();
        conn.reply()
    }
}

fn status(reply: &Reply) -> u16 {
    reply.status_line.split(' ').nth(1).unwrap().parse().unwrap()
}

const WHOAMI: &str = "/kn?do_method=whoami";

#[test]
fn wrong_passwords_at_metrics_back_off_with_429_and_the_right_one_is_not_checked() {
    let server = Server::start();
    for guess in ["ops:guess1", "ops:guess2", "ops:guess3"] {
        let reply = server.get("/metrics", guess);
        assert_eq!(status(&reply), 401, "{guess}: {}", reply.text());
        assert_eq!(reply.header("www-authenticate"), Some("Basic realm=\"knpubsub\""));
    }
    let backing_off = server.get("/metrics", "ops:guess4");
    assert_eq!(status(&backing_off), 429, "{}", backing_off.text());
    assert_eq!(backing_off.header("retry-after"), Some("1"));
    // The right password, never checked before, is not checked now either:
    // no figure leaks to an address that is backing off.
    let right = server.get("/metrics", "ops:ops-secret");
    assert_eq!(status(&right), 429, "{}", right.text());
    assert!(!right.text().contains("kn_serve_requests_total"), "{}", right.text());
}

#[test]
fn the_backoff_is_shared_between_kn_and_metrics() {
    let server = Server::start();
    // Two wrong guesses at /kn and one at /metrics: three in a row.
    assert_eq!(status(&server.get(WHOAMI, "anna:guess1")), 401);
    assert_eq!(status(&server.get(WHOAMI, "anna:guess2")), 401);
    assert_eq!(status(&server.get("/metrics", "ops:guess3")), 401);
    // Now both entry points answer 429 without a check.
    let kn = server.get(WHOAMI, "anna:anna-secret");
    assert_eq!(status(&kn), 429, "{}", kn.text());
    let metrics = server.get("/metrics", "ops:ops-secret");
    assert_eq!(status(&metrics), 429, "{}", metrics.text());
}

#[test]
fn a_right_password_at_metrics_scrapes_and_bad_credentials_are_401_there() {
    let server = Server::start();
    let ops = server.get("/metrics", "ops:ops-secret");
    assert_eq!(status(&ops), 200, "{}", ops.text());
    assert!(ops.text().contains("kn_serve_requests_total"), "{}", ops.text());
    let anna = server.get("/metrics", "anna:anna-secret");
    assert_eq!(status(&anna), 403, "{}", anna.text());
    // A success clears the count: two more wrong guesses are still 401.
    assert_eq!(status(&server.get("/metrics", "ops:nope1")), 401);
    assert_eq!(status(&server.get("/metrics", "ops:nope2")), 401);
}
