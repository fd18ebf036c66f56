//! What the WebSocket tests share: the real `pubsub-cgi serve`, and the
//! independent client (Python's `websockets`, `ws_client.py` beside this
//! file), whose lines are JSON.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use kn_test_support::{skip, Serve};
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_pubsub-cgi");

/// The client script.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/websocket/ws_client.py")
}

/// Whether Python's `websockets` can be imported (`.ci/run` installs it);
/// skips the test (a failure under CI=true) when it cannot.
pub fn websockets_available() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import websockets"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        skip("python3 with the websockets module is not installed (.ci/run installs it with pip)");
    }
    ok
}

/// `serve` over `root` with `env` set.
pub fn serve(root: &Path, args: &[&str], env: &[(&str, &str)]) -> Serve {
    let mut command = Serve::command_of(Path::new(BIN), root, None);
    command.args(args).envs(env.iter().copied());
    Serve::spawn(command)
}

/// The socket URL of `journal` on `serve`, with `extra` query parameters.
pub fn socket_url(serve: &Serve, journal: &str, extra: &str) -> String {
    format!("ws://{}/kn{journal}?do_method=route&kn_response_format=websocket{extra}", serve.addr())
}

/// A running client: its lines as they come.
pub struct Client {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<Value>,
    pub seen: Vec<Value>,
}

impl Client {
    /// Starts the client on `url` with `args` (see ws_client.py).
    pub fn start(url: &str, args: &[&str]) -> Client {
        let mut child = Command::new("python3")
            .arg(script())
            .arg(url)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start python3");
        let stdout = child.stdout.take().expect("stdout");
        let stdin = child.stdin.take();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let value = serde_json::from_str(&line).unwrap_or(Value::String(line));
                if tx.send(value).is_err() {
                    break;
                }
            }
        });
        Client { child, stdin, lines, seen: Vec::new() }
    }

    /// Runs the client to its end; every line.
    pub fn run(url: &str, args: &[&str]) -> Vec<Value> {
        let mut client = Client::start(url, args);
        client.wait_for(Duration::from_secs(60), |_| false);
        std::mem::take(&mut client.seen)
    }

    /// Reads lines until one satisfies `done` (true), the client ends or
    /// `limit` passes (false).
    pub fn wait_for(&mut self, limit: Duration, mut done: impl FnMut(&Value) -> bool) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let hit = done(&line);
                    self.seen.push(line);
                    if hit {
                        return true;
                    }
                }
                Err(_) => return false,
            }
        }
    }

    /// Sends a line to the client's stdin (a silent client then reads).
    pub fn go_on(&mut self) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = stdin.write_all(b"go\n");
            let _ = stdin.flush();
        }
    }

    /// The server's frames seen so far.
    pub fn frames(&self) -> Vec<Value> {
        frames(&self.seen)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The server's frames among a client's lines.
pub fn frames(lines: &[Value]) -> Vec<Value> {
    lines.iter().filter_map(|l| l.get("frame").cloned()).collect()
}

/// The close code a client saw, if it saw one.
pub fn closed(lines: &[Value]) -> Option<i64> {
    lines.iter().find_map(|l| l.get("closed").and_then(Value::as_i64))
}

/// The HTTP status a handshake was refused with, if it was.
pub fn refused(lines: &[Value]) -> Option<i64> {
    lines.iter().find_map(|l| l.get("refused").and_then(Value::as_i64))
}

/// Whether the socket opened.
pub fn opened(line: &Value) -> bool {
    line.get("open").is_some()
}

/// The frames whose `kn_payload` is `payload`.
pub fn with_payload(frames: &[Value], payload: &str) -> Vec<Value> {
    frames.iter().filter(|f| f["kn_payload"] == payload).cloned().collect()
}

/// The answer to the request of `kn_id`.
pub fn answer_to<'a>(frames: &'a [Value], kn_id: &str) -> Vec<&'a Value> {
    frames.iter().filter(|f| f["kn_in_reply_to"] == kn_id).collect()
}

/// A JSON request frame.
pub fn request(pairs: &[(&str, &str)]) -> String {
    let map: serde_json::Map<String, Value> = pairs.iter().map(|(n, v)| (n.to_string(), Value::String(v.to_string()))).collect();
    Value::Object(map).to_string()
}
