//! Durable Streams, judged by the protocol's own conformance suite
//! (`@durable-streams/server-conformance-tests`, pinned in
//! tests/durable-streams/package-lock.json, installed with `npm ci`),
//! through `pubsub-cgi serve` and through `pubsub.cgi` under Apache; and
//! the bridge between streams and PubSub topics, end to end.
//!
//! The suite needs Node.js 20 and npm: missing, the tests skip (and fail
//! under `CI=true`). Each run prints its passed/failed counts and the
//! names of failing tests, and fails on any failure.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use kn_journal::{Event, Selection, Store, Topic};

use support::{Apache, Dir, Serve};

/// The long-poll timeout the servers get: the suite's tests time out
/// after vitest's 5 s.
const LONG_POLL_MS: &str = "500";

/// The whole suite takes about 25 s; beyond this something hangs.
const SUITE_LIMIT: Duration = Duration::from_secs(240);

fn suite_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/durable-streams")
}

/// Installs the pinned suite once per test binary (`npm ci`); `None`
/// (the test skipped) without node and npm.
fn installed() -> Option<PathBuf> {
    static INSTALLED: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let found = |p: &str| Command::new(p).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
    if !found("node") || !found("npm") {
        support::skip("node and npm are needed to run the Durable Streams conformance suite");
        return None;
    }
    let result = INSTALLED.get_or_init(|| {
        let dir = suite_dir();
        let out = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(&dir)
            .output()
            .map_err(|e| format!("cannot run npm ci: {e}"))?;
        if !out.status.success() {
            return Err(format!("npm ci failed in {}:\n{}", dir.display(), String::from_utf8_lossy(&out.stderr)));
        }
        Ok(dir)
    });
    match result {
        Ok(dir) => Some(dir.clone()),
        Err(e) => panic!("{e}"),
    }
}

/// What one run of the suite found.
#[derive(Debug)]
struct Verdict {
    passed: u64,
    failed: u64,
    skipped: u64,
    failures: Vec<String>,
}

/// Runs the suite against `base` (the origin, without `/v1/stream`).
/// One run at a time: its tests have timeouts of a few seconds (vitest's
/// 5 s, 2 s for SSE reads) that two runs sharing a small machine miss.
fn run_suite(dir: &Path, base: &str, label: &str) -> Verdict {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let scratch = support::scratch("ds-report");
    let report = scratch.path().join("report.json");
    let mut vitest = Command::new(dir.join("node_modules/.bin/vitest"));
    // The suite's tests run under vitest's 5 s timeout; on a loaded
    // machine (a CI run compiling and testing everything at once) a CGI
    // request can take seconds. Timing must not decide a test: allow 30 s.
    // (The long-poll tests that rely on the 5 s only need the server's
    // long-poll timeout, 500 ms here, to be below it.)
    vitest.args(["run", "ds.test.mjs", "--reporter=json", "--testTimeout=30000"]);
    // Only the tests whose names match (`vitest -t`), when debugging.
    if let Ok(filter) = std::env::var("KN_DS_FILTER") {
        vitest.arg("-t").arg(filter);
    }
    let mut child = vitest
        .arg(format!("--outputFile={}", report.display()))
        .env("CONFORMANCE_TEST_URL", base)
        .env_remove("CI")
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start vitest");
    let started = Instant::now();
    loop {
        if child.try_wait().expect("wait for vitest").is_some() {
            break;
        }
        if started.elapsed() > SUITE_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{label}: the conformance suite did not finish within {SUITE_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = std::fs::read_to_string(&report).unwrap_or_else(|e| panic!("{label}: no report {}: {e}", report.display()));
    let json: serde_json::Value = serde_json::from_str(&text).expect("vitest's JSON report");
    let count = |k: &str| json[k].as_u64().unwrap_or(0);
    let mut failures = Vec::new();
    for file in json["testResults"].as_array().into_iter().flatten() {
        for t in file["assertionResults"].as_array().into_iter().flatten() {
            if t["status"] == "failed" {
                let message = t["failureMessages"][0].as_str().unwrap_or("");
                // fast-check puts the assertion that failed after its counterexample.
                let at = message.find("\nGot ").or_else(|| message.find("Shrunk")).unwrap_or(0);
                let mut why: String = message[..message.len().min(300)].chars().chain(" ... ".chars()).chain(message[at..].chars().take(400)).collect();
                if let Some(cause) = t["failureDetails"][0].get("cause") {
                    why.push_str(&format!(" cause: {cause}"));
                }
                failures.push(format!("{} ({why})", t["fullName"].as_str().unwrap_or("?")));
            }
        }
    }
    let verdict = Verdict { passed: count("numPassedTests"), failed: count("numFailedTests"), skipped: count("numPendingTests") + count("numTodoTests"), failures };
    println!(
        "Durable Streams conformance through {label}: {} passed, {} failed, {} skipped",
        verdict.passed, verdict.failed, verdict.skipped
    );
    for f in &verdict.failures {
        println!("  failed: {f}");
    }
    verdict
}

fn assert_all_pass(v: &Verdict, label: &str, log: impl Fn() -> String) {
    if std::env::var_os("KN_DS_FILTER").is_none() {
        assert!(v.passed > 300, "{label}: only {} tests passed (did the suite run?)", v.passed);
    }
    assert_eq!(v.failed, 0, "{label}: {} failed:\n{}\n{}", v.failed, v.failures.join("\n"), log());
}

#[test]
fn conformance_suite_passes_through_serve() {
    let Some(suite) = installed() else { return };
    let dir = Dir::new("ds_conformance_serve");
    let store = dir.store("kn_events");
    let mut command = Serve::command(&store, None);
    command.env("KN_STREAM_LONG_POLL_MS", LONG_POLL_MS);
    let serve = Serve::spawn(command);
    let verdict = run_suite(&suite, &serve.base, "serve");
    assert_all_pass(&verdict, "serve", String::new);
}

#[test]
fn conformance_suite_passes_through_pubsub_cgi_under_apache() {
    let Some(suite) = installed() else { return };
    if !support::available(support::APACHE) {
        return;
    }
    let dir = Dir::new("ds_conformance_apache");
    let store = dir.store("kn_events");
    support::make_writable_by_server(&store);
    let cgi = support::pubsub_cgi();
    let apache = Apache::start_with(|site| {
        // The CGI copied where the server's user can run it, mounted twice
        // as docs/DEPLOY.md shows: /kn and /v1/stream.
        let bin = site.create_dir("cgi-bin");
        let dest = bin.join("pubsub.cgi");
        std::fs::copy(&cgi, &dest).expect("copy pubsub-cgi");
        std::fs::set_permissions(&dest, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
        format!(
            "ScriptAlias /kn {cgi}\nScriptAlias /v1/stream {cgi}\nSetEnv KN_EVENTS {store}\nSetEnv KN_STREAM_LONG_POLL_MS {LONG_POLL_MS}\n\
             # No keep-alive: the client (undici) keeps an idle connection\n\
             # until one second before the server's advertised timeout, and on\n\
             # a loaded machine reuses it as Apache closes it (fetch failed).\n\
             KeepAlive Off\n",
            cgi = dest.display(),
            store = store.display()
        )
    });
    let verdict = run_suite(&suite, &apache.base_url(), "pubsub.cgi under Apache");
    assert_all_pass(&verdict, "pubsub.cgi under Apache", || {
        // Requests Apache itself failed, if any, then the error log.
        let access = apache.dir().read("logs/access.log");
        let failed: Vec<&str> = access.lines().filter(|l| l.split('"').nth(2).is_some_and(|rest| rest.trim_start().starts_with('5'))).collect();
        format!("5xx in access.log:\n{}\nerror.log:\n{}", failed.join("\n"), apache.error_log())
    });
}

// ----- the bridge, end to end ------------------------------------------------

fn http(method: &str, url: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, Vec<(String, String)>, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let mut req = ureq::http::Request::builder().method(method).uri(url);
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let resp = agent.run(req.body(body.to_vec()).expect("request")).unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let status = resp.status().as_u16();
    let headers = resp.headers().iter().map(|(n, v)| (n.as_str().to_owned(), v.to_str().unwrap_or("").to_owned())).collect();
    let text = resp.into_body().read_to_string().unwrap_or_default();
    (status, headers, text)
}

#[test]
fn bridge_carries_events_both_ways_through_serve() {
    let dir = Dir::new("ds_bridge_serve");
    let root = dir.store("kn_events");
    let serve = Serve::spawn(Serve::command(&root, None));
    let stream = format!("{}/v1/stream/rooms/chat", serve.base);
    let (status, _, text) = http("PUT", &stream, &[("Content-Type", "application/json"), ("Kn-Topic", "/what/chat")], b"");
    assert_eq!(status, 201, "{text}");

    // A route from the topic, made by an old client: it must fire for
    // messages from the stream.
    let form = [("do_method", "route"), ("kn_from", "/what/chat"), ("kn_to", "/who/anna/inbox"), ("kn_id", "r1")];
    let resp = support::post_form(&serve.url(), &form);
    assert_eq!(resp.status, 200, "{}", String::from_utf8_lossy(&resp.body));
    let store = Store::open(&root).expect("open the store");
    let chat = Topic::parse("/what/chat").unwrap();

    // An old client notifies the topic: the event is a message on the stream.
    let form = [("do_method", "notify"), ("kn_to", "/what/chat"), ("kn_payload", "hello from 2003"), ("kn_id", "e1")];
    let resp = support::post_form(&serve.url(), &form);
    assert_eq!(resp.status, 200, "{}", String::from_utf8_lossy(&resp.body));
    let (status, _, text) = http("GET", &format!("{stream}?offset=-1"), &[], b"");
    assert_eq!(status, 200);
    let messages: Vec<serde_json::Value> = serde_json::from_str(&text).expect("a JSON array");
    assert_eq!(messages.len(), 1, "{text}");
    assert_eq!(messages[0]["kn_payload"], "hello from 2003");
    assert_eq!(messages[0]["kn_id"], "e1");

    // A message appended to the stream is posted to the topic, and the
    // route copies it on; the stream does not import it a second time.
    let (status, headers, text) = http("POST", &stream, &[("Content-Type", "application/json")], br#"{"kn_payload":"hello from 2026","mood":3}"#);
    assert_eq!(status, 204, "{text}");
    assert!(!headers.iter().any(|(n, _)| n == "kn-bridge-error"), "{headers:?}");
    let inbox = store.events(&Topic::parse("/who/anna/inbox").unwrap(), &Selection::all()).expect("inbox").events;
    let copied: Vec<&Event> = inbox.iter().filter(|e| e.payload() == b"hello from 2026").collect();
    let topic = store.events(&chat, &Selection::all()).expect("topic").events;
    assert_eq!(copied.len(), 1, "inbox {inbox:?}\ntopic {topic:?}");
    assert_eq!(copied[0].get("mood"), Some(&b"3"[..]));
    assert_eq!(copied[0].get("kn_stream"), Some(&b"rooms/chat"[..]));
    let (_, _, text) = http("GET", &format!("{stream}?offset=-1"), &[], b"");
    let messages: Vec<serde_json::Value> = serde_json::from_str(&text).expect("a JSON array");
    assert_eq!(messages.len(), 2, "{text}");
    assert_eq!(messages[1]["kn_payload"], "hello from 2026");
}

/// Appends `body` to the stream `path` of the store `root` as another
/// process would: `pubsub.cgi` run as a web server runs it.
fn cgi_append(root: &Path, path: &str, body: &[u8]) -> String {
    use std::io::Write;
    let mut child = Command::new(support::pubsub_cgi())
        .env("GATEWAY_INTERFACE", "CGI/1.1")
        .env("KN_EVENTS", root)
        .env("REQUEST_METHOD", "POST")
        .env("SCRIPT_NAME", "/cgi-bin/pubsub.cgi/v1/stream")
        .env("PATH_INFO", format!("/{path}"))
        .env("CONTENT_TYPE", "text/plain")
        .env("CONTENT_LENGTH", body.len().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run pubsub-cgi as a CGI");
    child.stdin.take().expect("stdin").write_all(body).expect("write the body");
    let out = child.wait_with_output().expect("pubsub-cgi output");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `serve` answers reads of a stream it knows from memory, without
/// looking at the log; yet what another process appends (pubsub.cgi, as
/// under Apache) is in serve's very next read, every time.
#[test]
fn serve_sees_another_processes_appends_at_once() {
    let dir = Dir::new("ds_two_processes");
    let root = dir.store("kn_events");
    let serve = Serve::spawn(Serve::command(&root, None));
    let stream = format!("{}/v1/stream/shared/log", serve.base);
    let (status, _, text) = http("PUT", &stream, &[("Content-Type", "text/plain")], b"");
    assert_eq!(status, 201, "{text}");
    let mut expected = String::new();
    for i in 0..20 {
        // serve appends and reads (so it keeps the stream in memory)...
        let mine = format!("serve {i}.");
        let (status, _, text) = http("POST", &stream, &[("Content-Type", "text/plain")], mine.as_bytes());
        assert_eq!(status, 204, "{text}");
        expected.push_str(&mine);
        let (_, _, text) = http("GET", &format!("{stream}?offset=-1"), &[], b"");
        assert_eq!(text, expected);
        // ... then another process appends, and serve's next read has it.
        let theirs = format!("cgi {i}.");
        let answer = cgi_append(&root, "shared/log", theirs.as_bytes());
        assert!(answer.starts_with("Status: 204"), "{answer}");
        expected.push_str(&theirs);
        let (status, headers, text) = http("GET", &format!("{stream}?offset=-1"), &[], b"");
        assert_eq!((status, text.as_str()), (200, expected.as_str()), "round {i}");
        let tail = headers.iter().find(|(n, _)| n.eq_ignore_ascii_case("stream-next-offset")).map(|(_, v)| v.clone());
        let (_, head, _) = http("HEAD", &stream, &[], b"");
        let head_tail = head.iter().find(|(n, _)| n.eq_ignore_ascii_case("stream-next-offset")).map(|(_, v)| v.clone());
        assert_eq!(tail, head_tail);
    }
}
