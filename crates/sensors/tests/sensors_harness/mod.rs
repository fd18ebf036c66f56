//! The harness of the sensor tests: a temporary directory, the sensor
//! binaries run as real processes, fixtures, the events a store holds, and
//! small HTTP servers on 127.0.0.1 (a static feed server, `pubsub-cgi
//! serve` in process).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use kn_journal::{Event, Selection, Store, Topic};

/// A temporary directory that holds a store and whatever a test writes.
pub struct Sandbox {
    dir: tempfile::TempDir,
}

impl Sandbox {
    pub fn new() -> Sandbox {
        Sandbox { dir: tempfile::Builder::new().prefix("kn-sensors-").tempdir().expect("tempdir") }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The store the sensors write to (`<sandbox>/kn_events`).
    pub fn store_dir(&self) -> PathBuf {
        self.join("kn_events")
    }

    pub fn write(&self, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let path = self.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("create parent");
        }
        std::fs::write(&path, contents).expect("write file");
        path
    }

    /// The current events of `topic` in the sandbox's store, oldest first.
    pub fn events(&self, topic: &str) -> Vec<Event> {
        let store = Store::open(self.store_dir()).expect("open store");
        let topic = Topic::parse(topic).expect("topic");
        store.events(&topic, &Selection::all()).expect("read events").events
    }

    /// The one current event of `topic` with `kn_id` = `id`.
    pub fn event(&self, topic: &str, id: &str) -> Event {
        let events = self.events(topic);
        let found: Vec<&Event> = events.iter().filter(|e| e.id() == Some(id.as_bytes())).collect();
        assert_eq!(found.len(), 1, "one event '{id}' on {topic}, got {events:#?}");
        found[0].clone()
    }

    /// Runs `cmd` in the sandbox with `stdin`.
    pub fn run(&self, mut cmd: Command, stdin: &[u8]) -> Output {
        cmd.current_dir(self.path()).env_remove("KN_EVENTS");
        kn_test_support::run_with_stdin(&mut cmd, stdin, Duration::from_secs(120))
    }
}

/// A sensor binary of this package.
pub fn sensor(name: &str) -> Command {
    let path = match name {
        "kn-mail" => env!("CARGO_BIN_EXE_kn-mail"),
        "kn-post" => env!("CARGO_BIN_EXE_kn-post"),
        "kn-feed" => env!("CARGO_BIN_EXE_kn-feed"),
        other => panic!("no sensor {other}"),
    };
    Command::new(path)
}

/// The path of a sensor binary.
pub fn sensor_path(name: &str) -> PathBuf {
    PathBuf::from(sensor(name).get_program())
}

/// The bytes of `tests/fixtures/<name>`.
pub fn fixture(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

/// The path of `tests/fixtures/<name>`.
pub fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// The workspace README.
pub fn readme() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The text of the first fenced block in the README that follows a line
/// containing `marker` (the examples the README shows are the ones tests
/// run).
pub fn readme_block(marker: &str) -> String {
    let readme = readme();
    let at = readme.find(marker).unwrap_or_else(|| panic!("README has no '{marker}'"));
    let rest = &readme[at..];
    let start = rest.find("```").expect("a fenced block after the marker");
    let body = &rest[start..];
    let body = &body[body.find('\n').expect("fence line") + 1..];
    let end = body.find("```").expect("closing fence");
    body[..end].to_string()
}

pub fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

/// Asserts a process exit code, showing its output when it differs.
pub fn assert_code(out: &Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "exit status {:?}, expected {code}\n--- stdout:\n{}\n--- stderr:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// A port on 127.0.0.1 that nothing listens on (bound, then closed).
pub fn closed_port() -> u16 {
    kn_test_support::free_port()
}

/// A tiny HTTP/1.0 server on 127.0.0.1 answering every GET with the
/// current `body` (changeable between requests) and counting requests.
/// Stops when dropped.
pub struct StaticServer {
    pub port: u16,
    pub body: Arc<Mutex<Vec<u8>>>,
    pub requests: Arc<Mutex<usize>>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl StaticServer {
    pub fn start(body: Vec<u8>, content_type: &'static str) -> StaticServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let body = Arc::new(Mutex::new(body));
        let requests = Arc::new(Mutex::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (b, r, s) = (body.clone(), requests.clone(), stop.clone());
        let thread = thread::spawn(move || {
            for stream in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(mut stream) = stream else { continue };
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 16384 {
                    match stream.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => break,
                    }
                }
                *r.lock().unwrap() += 1;
                let body = b.lock().unwrap().clone();
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(reply.as_bytes());
                let _ = stream.write_all(&body);
            }
        });
        StaticServer { port, body, requests, stop, thread: Some(thread) }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn set_body(&self, body: Vec<u8>) {
        *self.body.lock().unwrap() = body;
    }
}

impl Drop for StaticServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `pubsub-cgi serve` (the workspace's binary, in its own process) on a
/// free port of 127.0.0.1 over `root`, answering once this returns; its
/// `/kn` URL is [`kn_test_support::Serve::url`]. Killed when dropped.
pub fn pubsub_server(root: &Path) -> kn_test_support::Serve {
    kn_test_support::Serve::spawn(kn_test_support::Serve::command(root, None))
}
