//! Durable Streams under `serve`'s own login and the access rules (issue
//! 28, item 4): a stream path is judged as the topic
//! `/v1/stream/<path>` (docs/ACCESS.md, "Durable Streams"); anonymous
//! requests the rules deny are refused `401`, other users' `403`; the
//! endpoint can be turned off (`KN_STREAMS=off`: `404`). Under `serve`
//! and as a CGI (`REMOTE_USER`).

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use base64::Engine as _;
use kn_test_support::raw::{Conn, Reply};
use kn_test_support::{run_with_stdin, Serve};

const RULES: &str = "\
allow all            /v1/stream/{user}/**   users
allow read           /v1/stream/public/**   *
allow post           /v1/stream/public/**   users
allow post,read      /what/**               *
";

fn sha_line(user: &str, password: &str) -> String {
    use sha1::Digest as _;
    format!("{user}:{{SHA}}{}\n", base64::engine::general_purpose::STANDARD.encode(sha1::Sha1::digest(password.as_bytes())))
}

struct Server {
    serve: Serve,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start(env: &[(&str, &str)]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let users = dir.path().join("users");
        std::fs::write(&users, format!("{}{}", sha_line("anna", "anna-pw"), sha_line("bob", "bob-pw"))).unwrap();
        let rules = dir.path().join("access.rules");
        std::fs::write(&rules, RULES).unwrap();
        let mut command = Serve::command_of(Path::new(env!("CARGO_BIN_EXE_pubsub-cgi")), &dir.path().join("events"), None);
        command.arg("--htpasswd").arg(&users).current_dir(dir.path()).env("KN_ACCESS_RULES", &rules).envs(env.iter().copied());
        Server { serve: Serve::spawn(command), _dir: dir }
    }

    /// `method path` with `body`, as `user:password` (`None`: anonymous),
    /// with `extra` header lines.
    fn request(&self, method: &str, path: &str, body: &[u8], login: Option<&str>, extra: &[&str]) -> Reply {
        let mut conn = Conn::connect(self.serve.addr(), Duration::from_secs(20));
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n", self.serve.addr(), body.len());
        if let Some(login) = login {
            head.push_str(&format!("Authorization: Basic {}\r\n", base64::engine::general_purpose::STANDARD.encode(login)));
        }
        for line in extra {
            head.push_str(&format!("{line}\r\n"));
        }
        head.push_str("\r\n");
        let stream = conn.reader.get_mut();
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(body).unwrap();
        conn.read_reply(method == "HEAD")
    }
}

fn status(reply: &Reply) -> u16 {
    reply.status_line.split(' ').nth(1).unwrap().parse().unwrap()
}

const ANNA: Option<&str> = Some("anna:anna-pw");
const BOB: Option<&str> = Some("bob:bob-pw");
const PLAIN: &str = "Content-Type: text/plain";

#[test]
fn anonymous_stream_requests_the_rules_deny_are_refused_401_and_the_allowed_user_works() {
    let s = Server::start(&[]);
    let stream = "/v1/stream/anna/notes";
    // Anonymous: every method refused, with a challenge; nothing created.
    for (method, body) in [("PUT", &b""[..]), ("POST", b"x"), ("GET", b""), ("HEAD", b""), ("DELETE", b"")] {
        let reply = s.request(method, stream, body, None, &[PLAIN]);
        assert_eq!(status(&reply), 401, "anonymous {method}: {}", reply.text());
        assert!(reply.header("www-authenticate").is_some_and(|v| v.starts_with("Basic")), "{method}");
    }
    // Anna in her own corner.
    assert_eq!(status(&s.request("PUT", stream, b"", ANNA, &[PLAIN])), 201);
    assert_eq!(status(&s.request("POST", stream, b"hello", ANNA, &[PLAIN])), 204);
    let read = s.request("GET", &format!("{stream}?offset=-1"), b"", ANNA, &[]);
    assert_eq!(status(&read), 200);
    assert_eq!(read.body, b"hello");
    // Anonymous still cannot read, append or delete the existing stream.
    for (method, body) in [("POST", &b"x"[..]), ("GET", b""), ("DELETE", b"")] {
        assert_eq!(status(&s.request(method, stream, body, None, &[PLAIN])), 401, "anonymous {method} of an existing stream");
    }
    // Bob is a user, but not anna: 403 naming why.
    let reply = s.request("GET", stream, b"", BOB, &[]);
    assert_eq!(status(&reply), 403, "{}", reply.text());
    assert!(reply.text().contains("user 'bob' may not read '/v1/stream/anna/notes'"), "{}", reply.text());
    assert_eq!(status(&s.request("DELETE", stream, b"", BOB, &[])), 403);
    // Nor can he fork it into his own corner to read it there.
    let fork = s.request("PUT", "/v1/stream/bob/copy", b"", BOB, &[PLAIN, "Stream-Forked-From: /v1/stream/anna/notes"]);
    assert_eq!(status(&fork), 403, "{}", fork.text());
    // Wrong password: 401, nothing checked further.
    assert_eq!(status(&s.request("GET", stream, b"", Some("anna:wrong"), &[])), 401);
    // A public stream: users post, anyone reads.
    assert_eq!(status(&s.request("PUT", "/v1/stream/public/news", b"", BOB, &[PLAIN])), 201);
    assert_eq!(status(&s.request("POST", "/v1/stream/public/news", b"hi", None, &[PLAIN])), 401);
    assert_eq!(status(&s.request("GET", "/v1/stream/public/news?offset=-1", b"", None, &[])), 200);
    // A path the rules cannot judge is refused, not let through.
    let odd = s.request("PUT", "/v1/stream/anna/a%20b", b"", ANNA, &[PLAIN]);
    assert_eq!(status(&odd), 400, "{}", odd.text());
    // Anna deletes her stream.
    assert_eq!(status(&s.request("DELETE", stream, b"", ANNA, &[])), 204);
}

#[test]
fn the_stream_endpoint_can_be_turned_off() {
    let s = Server::start(&[("KN_STREAMS", "off")]);
    for (method, login) in [("PUT", ANNA), ("GET", ANNA), ("GET", None)] {
        let reply = s.request(method, "/v1/stream/anna/notes", b"", login, &[PLAIN]);
        assert_eq!(status(&reply), 404, "{method}: {}", reply.text());
        assert!(reply.text().contains("KN_STREAMS=off"), "{}", reply.text());
    }
    // The protocol at /kn is unaffected.
    let notified = s.request("POST", "/kn?kn_to=/what/chat&kn_payload=hi&kn_response_format=simple", b"", None, &[]);
    assert_eq!(status(&notified), 200, "{}", notified.text());
}

/// pubsub.cgi mounted at `.../v1/stream`: the web server's `REMOTE_USER`
/// is judged by the same rules, and `KN_STREAMS=off` answers `404`.
#[test]
fn as_a_cgi_streams_obey_remote_user_and_the_rules() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("access.rules");
    std::fs::write(&rules, RULES).unwrap();
    let run = |method: &str, path: &str, user: Option<&str>, env: &[(&str, &str)]| -> String {
        let mut command = Command::new(env!("CARGO_BIN_EXE_pubsub-cgi"));
        command
            .env_clear()
            .env("GATEWAY_INTERFACE", "CGI/1.1")
            .env("SCRIPT_NAME", "/cgi-bin/pubsub.cgi/v1/stream")
            .env("PATH_INFO", path)
            .env("REQUEST_METHOD", method)
            .env("QUERY_STRING", "")
            .env("SERVER_NAME", "127.0.0.1")
            .env("SERVER_PORT", "80")
            .env("CONTENT_TYPE", "text/plain")
            .env("CONTENT_LENGTH", "0")
            .env("KN_EVENTS", dir.path().join("events"))
            .env("KN_ACCESS_RULES", &rules)
            .envs(env.iter().copied());
        if let Some(user) = user {
            command.env("REMOTE_USER", user);
        }
        let out = run_with_stdin(&mut command, b"", Duration::from_secs(20));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let out = run("PUT", "/anna/notes", None, &[]);
    assert!(out.starts_with("Status: 401 Unauthorized\r\n"), "{out}");
    assert!(out.contains("WWW-Authenticate: Basic"), "{out}");
    assert!(run("PUT", "/anna/notes", Some("bob"), &[]).starts_with("Status: 403 "));
    let out = run("PUT", "/anna/notes", Some("anna"), &[]);
    assert!(out.starts_with("Status: 201 Created\r\n"), "{out}");
    let out = run("GET", "/anna/notes", Some("anna"), &[("KN_STREAMS", "off")]);
    assert!(out.starts_with("Status: 404 Not Found\r\n"), "{out}");
    // A stream setting that does not parse: 500 naming it, nothing done.
    for bad in [("KN_STREAMS", "maybe"), ("KN_STREAM_MAX_APPEND_BYTES", "lots")] {
        let out = run("PUT", "/anna/other", Some("anna"), &[bad]);
        assert!(out.starts_with("Status: 500 "), "{out}");
        assert!(out.contains(bad.0), "{out}");
    }
    assert!(run("GET", "/anna/other", Some("anna"), &[]).starts_with("Status: 404 "), "a refused PUT created nothing");
}
