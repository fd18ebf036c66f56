//! Removal racing with use, across processes (issue 11, "Lifecycle"):
//! while journals go stale and are removed (by `kn gc --grace 0` in a
//! loop, by `pubsub-cgi serve`'s background sweep and by the slices of
//! pubsub.cgi requests), other processes open tunnels on them, post to
//! them and route into them, through the real CGI binary, through
//! `serve` and through a sensor (`kn-post` into the store). Every answer is a success or the stale answer (`404 Expired`),
//! never another error; afterwards `kn verify` finds nothing wrong, no
//! half-removed directory is left, and every journal still there reads.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use support::Serve;

const JOURNALS: usize = 4;
const RUN_FOR: Duration = Duration::from_secs(6);

fn journal(i: usize) -> String {
    format!("/who/u/s/{i}/kn_journal")
}

/// The sweep settings of every process: no grace, a slice per request.
fn sweep_env(command: &mut Command) -> &mut Command {
    command.env("KN_JOURNAL_GRACE", "0").env("KN_TOPIC_GRACE", "0").env("KN_SWEEP_INTERVAL_MS", "0").env("KN_SWEEP_BUDGET", "8").env("KN_RESERVE_BYTES", "0")
}

/// Runs one pubsub.cgi request (a GET with `query`); returns its status
/// line (`200 Notified`, `404 Expired`, ...) and its output.
fn cgi(root: &Path, query: &str) -> (String, String) {
    let mut command = Command::new(support::pubsub_cgi());
    sweep_env(&mut command);
    cgi_with(command, root, query)
}

/// [`cgi`] with `command` (pubsub-cgi and its settings).
fn cgi_with(mut command: Command, root: &Path, query: &str) -> (String, String) {
    command
        .env_remove("KN_SERVER_URL")
        .env("GATEWAY_INTERFACE", "CGI/1.1")
        .env("SCRIPT_NAME", "/kn")
        .env("SERVER_NAME", "127.0.0.1")
        .env("SERVER_PORT", "8080")
        .env("SERVER_PROTOCOL", "HTTP/1.0")
        .env("REMOTE_ADDR", "127.0.0.1")
        .env("REQUEST_METHOD", "GET")
        .env("QUERY_STRING", query)
        .env("KN_EVENTS", root)
        .stdin(Stdio::null());
    let out = command.output().expect("run pubsub-cgi");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let status = text.lines().find_map(|l| l.strip_prefix("Status: ")).unwrap_or("200 OK").to_string();
    (status, text)
}

/// Collects every answer that is neither a success nor the stale answer.
#[derive(Default)]
struct Wrong(Mutex<Vec<String>>);

impl Wrong {
    fn check(&self, who: &str, status: &str, text: &str) {
        let ok = status.starts_with("200") || status.starts_with("404 Expired") || status.starts_with("404") && text.contains("Expired");
        if !ok {
            self.0.lock().unwrap().push(format!("{who}: {status}: {}", text.chars().take(400).collect::<String>()));
        }
    }
}

#[test]
fn removal_racing_with_tunnels_posts_and_routes_in_other_processes_leaves_nothing_torn() {
    let dir = support::scratch("kn-lifecycle-");
    let root: PathBuf = dir.path().join("kn_events");
    let kn = support::cargo_bin("kn");
    let mut serve_command = Serve::command(&root, None);
    sweep_env(&mut serve_command);
    let serve = Serve::spawn(serve_command);
    let url = serve.url();

    let stop = Arc::new(AtomicBool::new(false));
    let wrong = Arc::new(Wrong::default());
    let answers = Arc::new(AtomicUsize::new(0));
    let expired = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();

    // kn gc --grace 0 in a loop, and now and then kn compact and kn verify
    // (which list topics the sweep removes before they get to them): cron
    // gone wild.
    {
        let (stop, wrong, root, kn) = (stop.clone(), wrong.clone(), root.clone(), kn.clone());
        workers.push(thread::spawn(move || {
            let mut runs = 0;
            while !stop.load(Ordering::Relaxed) {
                let args: &[&str] = match runs % 4 {
                    1 => &["verify"],
                    3 => &["compact"],
                    _ => &["gc", "--grace", "0"],
                };
                let out = Command::new(&kn).arg("--root").arg(&root).args(args).output().unwrap();
                if !out.status.success() {
                    wrong.check(&format!("kn {args:?}"), &format!("exit {:?}", out.status.code()), &String::from_utf8_lossy(&out.stderr));
                }
                runs += 1;
            }
            runs
        }));
    }
    // Tunnels through pubsub.cgi that end after a second and make their
    // journal stale at once (kn_expires), and posts to the journals.
    for w in 0..2 {
        let (stop, wrong, root, answers, expired) = (stop.clone(), wrong.clone(), root.clone(), answers.clone(), expired.clone());
        workers.push(thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let j = journal((n + w) % JOURNALS);
                let (status, text) = match n % 6 {
                    0 => cgi(&root, &format!("do_method=route&kn_from={j}&kn_expires=%2B1&kn_response_format=simple")),
                    1 | 3 => cgi(&root, &format!("do_method=notify&kn_to={j}&kn_payload=cgi-{w}-{n}&kn_response_format=simple")),
                    // An event expired at once: its topic stays empty, so
                    // it is pruned again and again while posts arrive.
                    _ => cgi(&root, &format!("do_method=notify&kn_to=/tmp/{}&kn_payload=gone&kn_expires=%2B0&kn_response_format=simple", n % 3)),
                };
                if status.starts_with("404") {
                    expired.fetch_add(1, Ordering::Relaxed);
                }
                wrong.check("cgi", &status, &text);
                answers.fetch_add(1, Ordering::Relaxed);
                n += 1;
            }
            n
        }));
    }
    // Routes into the journals and posts along them, through serve.
    {
        let (stop, wrong, url, answers, expired) = (stop.clone(), wrong.clone(), url.clone(), answers.clone(), expired.clone());
        workers.push(thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let j = journal(n % JOURNALS);
                let id = format!("r{}", n % (2 * JOURNALS));
                let empty = format!("/tmp/{}", n % 3);
                let pairs: Vec<(&str, &str)> = match n % 6 {
                    4 | 5 => vec![("do_method", "notify"), ("kn_to", &empty), ("kn_payload", "gone"), ("kn_expires", "+0"), ("kn_response_format", "simple")],
                    0 => vec![("do_method", "route"), ("kn_from", "/what/chat"), ("kn_to", &j), ("kn_id", &id), ("kn_response_format", "simple")],
                    1 => vec![("do_method", "notify"), ("kn_to", "/what/chat"), ("kn_payload", "serve"), ("kn_response_format", "simple")],
                    2 => vec![("do_method", "notify"), ("kn_to", &j), ("kn_payload", "direct"), ("kn_response_format", "simple")],
                    _ => vec![("do_method", "route"), ("kn_from", "/what/chat"), ("kn_to", ""), ("kn_id", &id), ("kn_response_format", "simple")],
                };
                let resp = support::post_form(&url, &pairs);
                if resp.status == 404 {
                    expired.fetch_add(1, Ordering::Relaxed);
                }
                wrong.check("serve", &resp.status.to_string(), &resp.text());
                answers.fetch_add(1, Ordering::Relaxed);
                n += 1;
            }
            n
        }));
    }
    // A sensor: kn-post straight into the store (its own process, as cron
    // and procmail run it), to the journals and to a topic emptied at
    // once. Exit 0 is stored; 69 is a journal found stale (its message
    // says so): the sensor's form of `404 Expired`.
    {
        let (stop, wrong, root, answers, expired) = (stop.clone(), wrong.clone(), root.clone(), answers.clone(), expired.clone());
        let kn_post = support::cargo_bin("kn-post");
        workers.push(thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let target = if n % 2 == 0 { journal(n / 2 % JOURNALS) } else { format!("/tmp/{}", n % 3) };
                let mut command = Command::new(&kn_post);
                sweep_env(&mut command).arg("--root").arg(&root).args(["-q", "-m", "sensor", &target]);
                if n % 2 == 1 {
                    command.arg("kn_expires=+0");
                }
                let out = command.stdin(Stdio::null()).output().unwrap();
                let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
                let status = match out.status.code() {
                    Some(0) => "200".to_string(),
                    Some(69) if stderr.contains("expired") => {
                        expired.fetch_add(1, Ordering::Relaxed);
                        "404 Expired".to_string()
                    }
                    code => format!("exit {code:?}"),
                };
                wrong.check(&format!("kn-post {target}"), &status, &stderr);
                answers.fetch_add(1, Ordering::Relaxed);
                n += 1;
            }
            n
        }));
    }
    // Journals made stale at once, again and again (a tunnel's
    // kn_expires does this), so that they are removed while in use.
    {
        let (stop, root) = (stop.clone(), root.clone());
        workers.push(thread::spawn(move || {
            let store = kn_journal::Store::open(&root).unwrap();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let _ = store.expire(&kn_journal::Topic::parse(&journal(n % JOURNALS)).unwrap());
                thread::sleep(Duration::from_millis(5));
                n += 1;
            }
            n
        }));
    }
    // Tunnels through serve, read for a moment and dropped.
    {
        let (stop, wrong, url, answers) = (stop.clone(), wrong.clone(), url.clone(), answers.clone());
        workers.push(thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let j = journal(n % JOURNALS);
                let mut stream = support::Stream::get(&format!("{url}?do_method=route&kn_from={j}&kn_response_format=simple"));
                // The status line, then a moment of the tunnel.
                stream.read_until(b"\r\n", Duration::from_secs(10));
                stream.read_for(Duration::from_millis(20));
                let status = stream.status().map_or("no answer".to_string(), |s| s.to_string());
                wrong.check("serve tunnel", &status, &stream.text());
                answers.fetch_add(1, Ordering::Relaxed);
                n += 1;
            }
            n
        }));
    }

    let started = Instant::now();
    while started.elapsed() < RUN_FOR {
        thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    let counts: Vec<usize> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    drop(serve);

    let wrong = wrong.0.lock().unwrap();
    assert!(wrong.is_empty(), "{} answers other than success or 404 Expired, e.g. {:?}", wrong.len(), &wrong[..wrong.len().min(5)]);
    // The race was real: journals were removed while in use.
    let store = kn_journal::Store::open(&root).unwrap();
    let removed = store.counters().unwrap().get(kn_journal::internal::Counter::JournalsRemoved);
    println!("{counts:?} runs; {} answers, {} of them 404 Expired; {removed} journals removed", answers.load(Ordering::Relaxed), expired.load(Ordering::Relaxed));
    assert!(removed > 0, "no journal was removed: {counts:?}");
    assert!(counts.iter().all(|&c| c > 0), "{counts:?}");

    // Nothing torn: kn verify is clean, and every journal left is whole.
    let verify = Command::new(&kn).arg("--root").arg(&root).arg("verify").output().unwrap();
    assert!(verify.status.success(), "{}", String::from_utf8_lossy(&verify.stdout));
    for i in 0..JOURNALS {
        let topic = kn_journal::Topic::parse(&journal(i)).unwrap();
        store.events(&topic, &kn_journal::Selection::all()).unwrap_or_else(|e| panic!("{topic}: {e}"));
    }
    // A last sweep leaves no directory set aside.
    let out = Command::new(&kn).arg("--root").arg(&root).args(["gc", "--grace", "0"]).output().unwrap();
    assert!(out.status.success());
    let leftovers: Vec<_> = walk(&root).into_iter().filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(".removing-"))).collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

fn walk(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                out.push(entry.path());
                stack.push(entry.path());
            }
        }
    }
    out
}

/// A stale journal with a route into it, in a new store at `root`.
fn stale_journal(root: &Path) -> PathBuf {
    let store = kn_journal::Store::open(root).unwrap();
    // The URL the CGI requests of these tests reach the server by.
    store.add_server_name("http://127.0.0.1:8080/kn").unwrap();
    let journal = kn_journal::Topic::parse(&journal(0)).unwrap();
    store.tunnel(&journal, &kn_journal::Selection::none()).unwrap();
    store.route(&kn_journal::Topic::parse("/what/chat").unwrap(), journal.as_str().as_bytes(), kn_journal::Event::new()).unwrap();
    store.expire(&journal).unwrap();
    root.join(journal.as_str().trim_start_matches('/'))
}

#[test]
fn a_cgi_request_sweeps_a_slice_when_due_and_serve_sweeps_in_the_background() {
    let dir = support::scratch("kn-lifecycle-");
    // KN_SWEEP_BUDGET=0: no slice; the stale journal stays.
    let root = dir.path().join("off");
    let gone = stale_journal(&root);
    let mut command = Command::new(support::pubsub_cgi());
    sweep_env(&mut command).env("KN_SWEEP_BUDGET", "0");
    let (status, _) = cgi_with(command, &root, "do_method=notify&kn_to=/x&kn_payload=1&kn_response_format=simple");
    assert!(status.starts_with("200"), "{status}");
    assert!(gone.is_dir());
    // A slice (budget 8, due at once): the journal, the route into it,
    // then the empty topics above it, request after request.
    let root = dir.path().join("cgi");
    let gone = stale_journal(&root);
    for i in 0..4 {
        let (status, _) = cgi(&root, &format!("do_method=notify&kn_to=/x&kn_payload={i}&kn_response_format=simple"));
        assert!(status.starts_with("200"), "{status}");
    }
    assert!(!gone.exists());
    assert!(!root.join("who").exists());
    let store = kn_journal::Store::open(&root).unwrap();
    assert!(store.routes(&kn_journal::Topic::parse("/what/chat").unwrap()).unwrap().is_empty());
    assert_eq!(store.counters().unwrap().get(kn_journal::internal::Counter::JournalsRemoved), 1);
    assert!(store.counters().unwrap().get(kn_journal::internal::Counter::Sweeps) >= 4);
    // serve, with no request at all.
    let root = dir.path().join("serve");
    let gone = stale_journal(&root);
    let mut command = Serve::command(&root, None);
    sweep_env(&mut command);
    let serve = Serve::spawn(command);
    assert!(support::wait_for(Duration::from_secs(20), || !root.join("who").exists()), "serve did not sweep {}", gone.display());
    drop(serve);
}
