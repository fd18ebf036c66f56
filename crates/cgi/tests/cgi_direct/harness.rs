//! The harness of the CGI tests (`cgi_direct.rs`, `cgi_tunnels.rs`):
//! a [`Pool`] is a fresh event store in a temporary directory; [`Cgi`]
//! is one request (built by hand or replayed from a golden `.request`
//! file), [`Cgi::run`] runs it to completion and [`Cgi::spawn`] starts a
//! tunnel whose stdout is read as it streams. Each test binary uses part
//! of it.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kn_cgi::Event;
use kn_wire::simple;
use kn_test_support::{find, run_with_stdin, wait_exit};

pub const BIN: &str = env!("CARGO_BIN_EXE_pubsub-cgi");
pub const JOURNAL: &str = "/who/a/s/1/kn_journal";
pub const PADDING: usize = 4096;
/// strace, as Debian installs it (.ci/run does).
pub const STRACE: &str = "/usr/bin/strace";

// ----- harness ---------------------------------------------------------------

/// A fresh event pool in its own temporary directory, removed on drop.
pub struct Pool {
    pub root: PathBuf,
}

impl Pool {
    pub fn new(name: &str) -> Pool {
        static N: AtomicUsize = AtomicUsize::new(0);
        let root = std::env::temp_dir().join(format!(
            "kn-cgi-direct-{}-{}-{name}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        Pool { root }
    }

    /// `KN_EVENTS`: the store directory (created by the server).
    pub fn events(&self) -> PathBuf {
        self.root.join("kn_events")
    }

    /// A request with the golden environment and nothing else.
    pub fn cgi(&self) -> Cgi {
        Cgi {
            env: vec![
                ("GATEWAY_INTERFACE".into(), "CGI/1.1".into()),
                ("SCRIPT_NAME".into(), "/kn".into()),
                ("SERVER_NAME".into(), "127.0.0.1".into()),
                ("SERVER_PORT".into(), "8080".into()),
                ("SERVER_PROTOCOL".into(), "HTTP/1.0".into()),
                ("REMOTE_ADDR".into(), "127.0.0.1".into()),
                ("REQUEST_METHOD".into(), "GET".into()),
                ("QUERY_STRING".into(), String::new()),
                ("KN_EVENTS".into(), self.events().to_string_lossy().into_owned()),
            ],
            body: Vec::new(),
            args: Vec::new(),
        }
    }

    /// The request of golden case `name`, environment and body exactly as
    /// recorded, run against this pool.
    pub fn golden(&self, name: &str) -> Cgi {
        let text = std::fs::read(golden_path(&format!("{name}.request"))).unwrap();
        let mut cgi = self.cgi();
        let begin = b"-----BEGIN BODY-----\n";
        let end = b"\n-----END BODY-----";
        if let Some(at) = find(&text, begin) {
            let rest = &text[at + begin.len()..];
            cgi.body = rest[..find(rest, end).expect("END BODY marker")].to_vec();
        }
        let head_end = find(&text, begin).unwrap_or(text.len());
        for line in String::from_utf8_lossy(&text[..head_end]).lines() {
            if line.starts_with('#') || line.starts_with("PERL") || line.starts_with("PATH=") {
                continue;
            }
            if let Some((k, v)) = line.split_once('=') {
                cgi = cgi.env(k, v);
            }
        }
        cgi
    }

    pub fn store(&self) -> kn_journal::Store {
        kn_journal::Store::open(self.events()).unwrap()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

pub fn golden_path(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(file)
}

/// The raw stdout of the original server for golden case `name`.
pub fn golden(name: &str) -> Reply {
    Reply::parse(std::fs::read(golden_path(&format!("{name}.response"))).unwrap())
}

/// One CGI request.
#[derive(Clone, Debug)]
pub struct Cgi {
    pub env: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub args: Vec<String>,
}

impl Cgi {
    pub fn env(mut self, name: &str, value: &str) -> Cgi {
        self.env.retain(|(k, _)| k != name);
        self.env.push((name.into(), value.into()));
        self
    }

    pub fn get(self, query: &str) -> Cgi {
        self.env("REQUEST_METHOD", "GET").env("QUERY_STRING", query)
    }

    /// A form POST of `body` (CONTENT_LENGTH and CONTENT_TYPE set).
    pub fn post(mut self, body: &str) -> Cgi {
        self.body = body.as_bytes().to_vec();
        let len = body.len().to_string();
        self.env("REQUEST_METHOD", "POST").env("CONTENT_LENGTH", &len).env("CONTENT_TYPE", "application/x-www-form-urlencoded")
    }

    pub fn path_info(self, path: &str) -> Cgi {
        self.env("PATH_INFO", path)
    }

    pub fn command(&self) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.env_clear().args(&self.args);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Runs the request to completion (at most 20 s).
    pub fn run(&self) -> Reply {
        let out = run_with_stdin(&mut self.command(), &self.body, Duration::from_secs(20));
        let (status, stderr) = (out.status, String::from_utf8_lossy(&out.stderr));
        assert!(status.success(), "exit status {status}; stderr: {stderr}");
        Reply::parse(out.stdout)
    }

    /// Starts the request as a long-running process (a tunnel), its stdout
    /// collected as it arrives.
    pub fn spawn(&self) -> Stream {
        let mut child = self.command().stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let shared: Arc<(Mutex<Collected>, Condvar)> = Arc::default();
        let sink = shared.clone();
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 65536];
            loop {
                let n = stdout.read(&mut buf).unwrap_or(0);
                let (lock, cv) = &*sink;
                let mut c = lock.lock().unwrap_or_else(|e| e.into_inner());
                if n == 0 {
                    c.eof = true;
                    cv.notify_all();
                    return;
                }
                c.bytes.extend_from_slice(&buf[..n]);
                let len = c.bytes.len();
                c.arrivals.push((Instant::now(), len));
                cv.notify_all();
            }
        });
        Stream { child, shared, reader: Some(reader) }
    }
}

#[derive(Default)]
pub struct Collected {
    pub bytes: Vec<u8>,
    pub arrivals: Vec<(Instant, usize)>,
    pub eof: bool,
}

/// A running tunnel process; killed on drop.
pub struct Stream {
    pub child: Child,
    pub shared: Arc<(Mutex<Collected>, Condvar)>,
    pub reader: Option<JoinHandle<()>>,
}

impl Stream {
    /// Waits until `ready` holds for the bytes read so far (or panics
    /// after `timeout`, showing them); returns them.
    pub fn wait_for(&self, timeout: Duration, what: &str, ready: impl Fn(&[u8]) -> bool) -> Vec<u8> {
        let deadline = Instant::now() + timeout;
        let (lock, cv) = &*self.shared;
        let mut c = lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if ready(&c.bytes) {
                return c.bytes.clone();
            }
            let now = Instant::now();
            if now >= deadline || c.eof {
                panic!("tunnel: {what} did not happen (eof: {}); read so far:\n{}", c.eof, show(&c.bytes));
            }
            c = cv.wait_timeout(c, deadline - now).unwrap().0;
        }
    }

    /// Waits until the tunnel body holds `n` complete simple frames.
    pub fn frames(&self, n: usize) -> Vec<u8> {
        let bytes = self.wait_for(Duration::from_secs(10), &format!("{n} simple frames"), |b| {
            Reply::split(b).is_some_and(|(_, body)| split_frames(body).0.len() >= n)
        });
        Reply::parse(bytes).body
    }

    /// Waits until the tunnel body holds `n` complete js script blocks.
    pub fn blocks(&self, n: usize) -> Vec<u8> {
        let bytes = self.wait_for(Duration::from_secs(10), &format!("{n} js blocks"), |b| {
            Reply::split(b).is_some_and(|(_, body)| js_blocks(body).len() >= n)
        });
        Reply::parse(bytes).body
    }

    pub fn bytes(&self) -> Vec<u8> {
        self.shared.0.lock().unwrap_or_else(|e| e.into_inner()).bytes.clone()
    }

    /// When the byte at `offset` of the whole output arrived.
    pub fn arrival_of(&self, offset: usize) -> Option<Instant> {
        self.shared.0.lock().unwrap_or_else(|e| e.into_inner()).arrivals.iter().find(|(_, len)| *len > offset).map(|(t, _)| *t)
    }

    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let status = wait_exit(&mut self.child, timeout)?;
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        Some(status)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A CGI response: its header block and body.
#[derive(Clone, Debug)]
pub struct Reply {
    pub raw: Vec<u8>,
    pub head: String,
    pub body: Vec<u8>,
}

impl Reply {
    /// Splits at the first blank line (CRLF CRLF, or the bare LF LF of the
    /// `kn_status_to` 204).
    pub fn split(raw: &[u8]) -> Option<(String, &[u8])> {
        let crlf = find(raw, b"\r\n\r\n").map(|i| (i, 4));
        let lf = find(raw, b"\n\n").map(|i| (i, 2));
        let (at, len) = match (crlf, lf) {
            (Some(a), Some(b)) => if a.0 <= b.0 { a } else { b },
            (a, b) => a.or(b)?,
        };
        Some((String::from_utf8_lossy(&raw[..at]).into_owned(), &raw[at + len..]))
    }

    pub fn parse(raw: Vec<u8>) -> Reply {
        let (head, body) = Reply::split(&raw).unwrap_or_else(|| panic!("no CGI header block in:\n{}", show(&raw)));
        let body = body.to_vec();
        Reply { head, body, raw }
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }

    pub fn status(&self) -> String {
        self.header("Status").unwrap_or_else(|| "200 (no Status header)".into())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The simple-format events of the body.
    pub fn events(&self) -> Vec<Event> {
        simple::decode_frames(&self.body).unwrap_or_else(|e| panic!("bad frames ({e}):\n{}", show(&self.body)))
    }

    /// The one status event of a one-shot simple response.
    pub fn event(&self) -> Event {
        let events = self.events();
        assert_eq!(events.len(), 1, "one event expected:\n{}", show(&self.raw));
        events.into_iter().next().unwrap()
    }

    /// Checks the framing every one-shot response shares: CRLF headers,
    /// `Content-Length` equal to the body length.
    pub fn assert_one_shot(&self) {
        let len: usize = self.header("Content-Length").expect("Content-Length").parse().unwrap();
        assert_eq!(len, self.body.len(), "Content-Length must equal the body length");
        assert!(self.raw.starts_with(self.head.lines().next().unwrap().as_bytes()));
        for line in self.head.split("\r\n") {
            assert!(!line.contains('\n'), "bare LF in header block: {:?}", self.head);
        }
    }
}

pub fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

/// Bytes for an assertion message: printable, long space runs shortened.
pub fn show(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::new();
    let mut spaces = 0;
    for c in text.chars().chain(std::iter::once('\u{0}')) {
        if c == ' ' {
            spaces += 1;
            continue;
        }
        if spaces > 8 {
            out.push_str(&format!("⟦SP×{spaces}⟧"));
        } else {
            out.extend(std::iter::repeat_n(' ', spaces));
        }
        spaces = 0;
        match c {
            '\u{0}' => {}
            '\r' => out.push_str("⟦CR⟧"),
            c => out.push(c),
        }
    }
    out
}

/// The complete simple frames of a stream body, raw (count line, encoded
/// event, closing LF), and the separator bytes before each frame and after
/// the last one.
pub fn split_frames(body: &[u8]) -> (Vec<&[u8]>, Vec<&[u8]>) {
    let mut frames = Vec::new();
    let mut seps = Vec::new();
    let mut i = 0;
    loop {
        let start = i;
        while i < body.len() && (body[i].is_ascii_whitespace() || body[i] == 0) {
            i += 1;
        }
        let sep = &body[start..i];
        let Some(nl) = body[i..].iter().position(|&b| b == b'\n') else {
            seps.push(sep);
            break;
        };
        let Ok(n) = std::str::from_utf8(&body[i..i + nl]).unwrap_or("x").parse::<usize>() else {
            seps.push(sep);
            break;
        };
        let end = i + nl + 1 + n + 1;
        if end > body.len() {
            seps.push(sep);
            break;
        }
        assert_eq!(body[end - 1], b'\n', "a frame ends with LF");
        seps.push(sep);
        frames.push(&body[i..end]);
        i = end;
    }
    (frames, seps)
}

pub fn frame_event(frame: &[u8]) -> Event {
    simple::decode_frames(frame).unwrap().remove(0)
}

/// The complete js script blocks of a page: each block's element lines
/// (without the leading comma of later ones).
pub fn js_blocks(body: &[u8]) -> Vec<Vec<String>> {
    const START: &[u8] = b"--><script type=\"text/javascript\"><!--\nif (parent.kn_sendCallback) parent.kn_sendCallback({elements:[\n";
    const END: &[u8] = b"]}, window);\n// -->\n</script><!--\n";
    let mut out = Vec::new();
    let mut rest = body;
    while let Some(s) = find(rest, START) {
        let after = &rest[s + START.len()..];
        let Some(e) = find(after, END) else { break };
        let lines = String::from_utf8_lossy(&after[..e])
            .lines()
            .map(|l| l.strip_prefix(',').unwrap_or(l).to_string())
            .collect();
        out.push(lines);
        rest = &after[e + END.len()..];
    }
    out
}

/// Normalises what differs on every run: the `(id)` of `Wrote to` lines
/// and the topic's leading slash there (the original wrote
/// `'what/kn_subtopics'`), and server-generated ids.
pub fn normalise_wrote(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("Wrote to '") {
        out.push_str(&rest[..at + 10]);
        rest = &rest[at + 10..];
        rest = rest.strip_prefix('/').unwrap_or(rest);
        let Some(q) = rest.find("' (") else { break };
        out.push_str(&rest[..q + 3]);
        rest = &rest[q + 3..];
        let close = rest.find(')').unwrap_or(0);
        let id = &rest[..close];
        // Client-chosen ids (e1, r1) stay; server ids are normalised.
        if id.len() <= 4 {
            out.push_str(id);
        } else {
            out.push_str("ID");
        }
        rest = &rest[close..];
    }
    out.push_str(rest);
    out
}

/// A js element line with its value replaced, for elements whose values
/// differ on every run.
pub fn normalise_js_line(line: &str) -> String {
    for name in ["kn_id", "kn_time_t", "kn_route_checkpoint"] {
        let prefix = format!("{{name:\"{name}\",value:\"");
        if let Some(rest) = line.strip_prefix(&prefix) {
            let value = rest.trim_end_matches("\"}");
            if name != "kn_id" || value.len() > 4 {
                return format!("{prefix}*\"}}");
            }
        }
    }
    normalise_wrote(line)
}

pub fn block_set(block: &[String]) -> BTreeSet<String> {
    block.iter().map(|l| normalise_js_line(l)).collect()
}

/// A js one-shot page cut into what comes before the first block, the
/// blocks, and what follows the last.
pub fn js_page_parts(body: &[u8]) -> (String, Vec<Vec<String>>, String) {
    let text = String::from_utf8_lossy(body).into_owned();
    let first = text.find("--><script").expect("a script block");
    let last = text.rfind("</script><!--\n").expect("a block end") + "</script><!--\n".len();
    (text[..first].to_string(), js_blocks(body), text[last..].to_string())
}

/// The CGI.pm `<meta>` line of the golden pages says iso-8859-1; ours
/// agrees with the HTTP header (README section 4: not client-visible).
pub fn golden_meta(text: &str) -> String {
    text.replace("content=\"text/html; charset=iso-8859-1\" />", "content=\"text/html; charset=utf-8\" />")
}

/// Asserts that a one-shot js page has exactly the golden page's framing:
/// prologue (after normalising the `Wrote to` payload and the meta
/// charset), the same set of element lines per block, and the trailer.
pub fn assert_js_page_like(ours: &Reply, golden: &Reply) {
    assert_eq!(ours.status(), golden.status());
    assert_eq!(ours.header("Content-Type"), golden.header("Content-Type"));
    let (op, ob, ot) = js_page_parts(&ours.body);
    let (gp, gb, gt) = js_page_parts(&golden.body);
    assert_eq!(normalise_wrote(&op), normalise_wrote(&golden_meta(&gp)), "page prologue");
    assert!(op.ends_with("<!--"), "the prologue ends with the <!-- that the first block's --> closes");
    assert_eq!(ob.len(), gb.len(), "number of script blocks");
    for (o, g) in ob.iter().zip(&gb) {
        assert_eq!(block_set(o), block_set(g), "element lines of a script block");
    }
    assert_eq!(ot, gt, "trailer");
}

/// Asserts that a one-shot simple response is one frame with the same
/// element lines and payload as golden (ids normalised), and that both
/// counts are the encoded lengths.
pub fn assert_simple_like(ours: &Reply, golden: &Reply) {
    assert_eq!(ours.status(), golden.status());
    assert_eq!(ours.header("Content-Type"), golden.header("Content-Type"));
    let (of, os) = split_frames(&ours.body);
    let (gf, _) = split_frames(&golden.body);
    assert_eq!(of.len(), 1, "one frame");
    assert!(os.iter().all(|s| s.is_empty()), "a one-shot simple response has nothing but its frame: {:?}", os);
    let parts = |frame: &[u8]| {
        let nl = frame.iter().position(|&b| b == b'\n').unwrap();
        let n: usize = std::str::from_utf8(&frame[..nl]).unwrap().parse().unwrap();
        let encoded = &frame[nl + 1..frame.len() - 1];
        assert_eq!(n, encoded.len(), "frame count = encoded length");
        let blank = find(encoded, b"\n\n").unwrap();
        let lines: BTreeSet<String> = String::from_utf8_lossy(&encoded[..blank])
            .lines()
            .map(|l| if l.starts_with("kn_id: ") && l.len() > 11 { "kn_id: *".to_string() } else { l.to_string() })
            .collect();
        (lines, normalise_wrote(&String::from_utf8_lossy(&encoded[blank + 2..])))
    };
    assert_eq!(parts(of[0]), parts(gf[0]));
}

/// Runs `cgi` under `strace -f -e trace=write` and returns the number of
/// write calls to stdout, or `None` (a recorded skip; a failure under
/// `CI=true`, where .ci/run installs strace) when strace cannot run here.
pub fn stdout_writes(cgi: &Cgi) -> Option<usize> {
    let log = std::env::temp_dir().join(format!("kn-cgi-strace-{}-{:?}", std::process::id(), std::thread::current().id()));
    if !kn_test_support::available(STRACE) {
        return None;
    }
    let mut cmd = Command::new(STRACE);
    cmd.env_clear().args(["-f", "-qq", "-e", "trace=write", "-o"]).arg(&log).arg(BIN);
    for (k, v) in &cgi.env {
        cmd.env(k, v);
    }
    let out = run_with_stdin(&mut cmd, &cgi.body, Duration::from_secs(20));
    let trace = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    if !out.status.success() || trace.is_empty() {
        kn_test_support::skip(&format!("the one-write syscall check: strace failed: {}", String::from_utf8_lossy(&out.stderr)));
        return None;
    }
    // stdout is written through a duplicate of fd 1: find the fd that
    // carried the header block, then count every write to it.
    let fd_of = |line: &str| line.split("write(").nth(1).and_then(|r| r.split(',').next()).map(str::to_string);
    let Some(fd) = trace.lines().find(|l| l.contains("\"Status: ") || l.contains("\"Content-Type: ")).and_then(fd_of) else {
        panic!("no write of a CGI header block in the strace log:\n{trace}");
    };
    println!("the response went out through fd {fd}");
    Some(trace.lines().filter(|l| fd_of(l).as_deref() == Some(fd.as_str())).count())
}

pub fn assert_one_write(cgi: &Cgi) {
    if let Some(n) = stdout_writes(cgi) {
        assert_eq!(n, 1, "the whole response goes out in one write(2)");
    }
}

/// Opens the golden 07 simple tunnel on the journal and waits for its
/// status frame.
pub fn open_journal_tunnel(pool: &Pool, case: &str) -> Stream {
    let tunnel = pool.golden(case).spawn();
    tunnel.frames(1);
    tunnel
}

/// Golden 06a: route r1 from /what/chat to the journal, kn_uri uri1.
pub fn route_r1(pool: &Pool) {
    let reply = pool.golden("06a-route-js").run();
    assert_eq!(reply.status(), "200 Routed", "{}", reply.text());
}

pub fn post(pool: &Pool, body: &str) -> Reply {
    pool.cgi().post(body).run()
}

pub fn simple_post(pool: &Pool, body: &str) -> Event {
    let reply = post(pool, &format!("{body}&kn_response_format=simple"));
    reply.event()
}

pub fn status_of(e: &Event) -> String {
    e.get_str("status").unwrap_or_default()
}

