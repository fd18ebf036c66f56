//! The real `pubsub-cgi` binary run as a CGI process, exactly as a web
//! server runs it: environment variables and the request body on stdin,
//! the response read from stdout. Every method and every error, compared
//! with the bytes of the original server recorded in `tests/golden/`
//! (see `tests/golden/README.md`).
//!
//! The harness: a [`Pool`] is a fresh event store in a temporary
//! directory; [`Cgi`] is one request (built by hand or replayed from a
//! golden `.request` file), [`Cgi::run`] runs it to completion and
//! [`Cgi::spawn`] starts a tunnel whose stdout is read as it streams.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kn_cgi::Event;
use kn_wire::simple;
use kn_test_support::{find, run_with_stdin, wait_exit};

const BIN: &str = env!("CARGO_BIN_EXE_pubsub-cgi");
const JOURNAL: &str = "/who/a/s/1/kn_journal";
const PADDING: usize = 4096;
/// strace, as Debian installs it (.ci/run does).
const STRACE: &str = "/usr/bin/strace";

// ----- harness ---------------------------------------------------------------

/// A fresh event pool in its own temporary directory, removed on drop.
struct Pool {
    root: PathBuf,
}

impl Pool {
    fn new(name: &str) -> Pool {
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
    fn events(&self) -> PathBuf {
        self.root.join("kn_events")
    }

    /// A request with the golden environment and nothing else.
    fn cgi(&self) -> Cgi {
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
    fn golden(&self, name: &str) -> Cgi {
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

    fn store(&self) -> kn_journal::Store {
        kn_journal::Store::open(self.events()).unwrap()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn golden_path(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(file)
}

/// The raw stdout of the original server for golden case `name`.
fn golden(name: &str) -> Reply {
    Reply::parse(std::fs::read(golden_path(&format!("{name}.response"))).unwrap())
}

/// One CGI request.
#[derive(Clone, Debug)]
struct Cgi {
    env: Vec<(String, String)>,
    body: Vec<u8>,
    args: Vec<String>,
}

impl Cgi {
    fn env(mut self, name: &str, value: &str) -> Cgi {
        self.env.retain(|(k, _)| k != name);
        self.env.push((name.into(), value.into()));
        self
    }

    fn get(self, query: &str) -> Cgi {
        self.env("REQUEST_METHOD", "GET").env("QUERY_STRING", query)
    }

    /// A form POST of `body` (CONTENT_LENGTH and CONTENT_TYPE set).
    fn post(mut self, body: &str) -> Cgi {
        self.body = body.as_bytes().to_vec();
        let len = body.len().to_string();
        self.env("REQUEST_METHOD", "POST").env("CONTENT_LENGTH", &len).env("CONTENT_TYPE", "application/x-www-form-urlencoded")
    }

    fn path_info(self, path: &str) -> Cgi {
        self.env("PATH_INFO", path)
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.env_clear().args(&self.args);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Runs the request to completion (at most 20 s).
    fn run(&self) -> Reply {
        let out = run_with_stdin(&mut self.command(), &self.body, Duration::from_secs(20));
        let (status, stderr) = (out.status, String::from_utf8_lossy(&out.stderr));
        assert!(status.success(), "exit status {status}; stderr: {stderr}");
        Reply::parse(out.stdout)
    }

    /// Starts the request as a long-running process (a tunnel), its stdout
    /// collected as it arrives.
    fn spawn(&self) -> Stream {
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
struct Collected {
    bytes: Vec<u8>,
    arrivals: Vec<(Instant, usize)>,
    eof: bool,
}

/// A running tunnel process; killed on drop.
struct Stream {
    child: Child,
    shared: Arc<(Mutex<Collected>, Condvar)>,
    reader: Option<JoinHandle<()>>,
}

impl Stream {
    /// Waits until `ready` holds for the bytes read so far (or panics
    /// after `timeout`, showing them); returns them.
    fn wait_for(&self, timeout: Duration, what: &str, ready: impl Fn(&[u8]) -> bool) -> Vec<u8> {
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
    fn frames(&self, n: usize) -> Vec<u8> {
        let bytes = self.wait_for(Duration::from_secs(10), &format!("{n} simple frames"), |b| {
            Reply::split(b).is_some_and(|(_, body)| split_frames(body).0.len() >= n)
        });
        Reply::parse(bytes).body
    }

    /// Waits until the tunnel body holds `n` complete js script blocks.
    fn blocks(&self, n: usize) -> Vec<u8> {
        let bytes = self.wait_for(Duration::from_secs(10), &format!("{n} js blocks"), |b| {
            Reply::split(b).is_some_and(|(_, body)| js_blocks(body).len() >= n)
        });
        Reply::parse(bytes).body
    }

    fn bytes(&self) -> Vec<u8> {
        self.shared.0.lock().unwrap_or_else(|e| e.into_inner()).bytes.clone()
    }

    /// When the byte at `offset` of the whole output arrived.
    fn arrival_of(&self, offset: usize) -> Option<Instant> {
        self.shared.0.lock().unwrap_or_else(|e| e.into_inner()).arrivals.iter().find(|(_, len)| *len > offset).map(|(t, _)| *t)
    }

    fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
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
struct Reply {
    raw: Vec<u8>,
    head: String,
    body: Vec<u8>,
}

impl Reply {
    /// Splits at the first blank line (CRLF CRLF, or the bare LF LF of the
    /// `kn_status_to` 204).
    fn split(raw: &[u8]) -> Option<(String, &[u8])> {
        let crlf = find(raw, b"\r\n\r\n").map(|i| (i, 4));
        let lf = find(raw, b"\n\n").map(|i| (i, 2));
        let (at, len) = match (crlf, lf) {
            (Some(a), Some(b)) => if a.0 <= b.0 { a } else { b },
            (a, b) => a.or(b)?,
        };
        Some((String::from_utf8_lossy(&raw[..at]).into_owned(), &raw[at + len..]))
    }

    fn parse(raw: Vec<u8>) -> Reply {
        let (head, body) = Reply::split(&raw).unwrap_or_else(|| panic!("no CGI header block in:\n{}", show(&raw)));
        let body = body.to_vec();
        Reply { head, body, raw }
    }

    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }

    fn status(&self) -> String {
        self.header("Status").unwrap_or_else(|| "200 (no Status header)".into())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The simple-format events of the body.
    fn events(&self) -> Vec<Event> {
        simple::decode_frames(&self.body).unwrap_or_else(|e| panic!("bad frames ({e}):\n{}", show(&self.body)))
    }

    /// The one status event of a one-shot simple response.
    fn event(&self) -> Event {
        let events = self.events();
        assert_eq!(events.len(), 1, "one event expected:\n{}", show(&self.raw));
        events.into_iter().next().unwrap()
    }

    /// Checks the framing every one-shot response shares: CRLF headers,
    /// `Content-Length` equal to the body length.
    fn assert_one_shot(&self) {
        let len: usize = self.header("Content-Length").expect("Content-Length").parse().unwrap();
        assert_eq!(len, self.body.len(), "Content-Length must equal the body length");
        assert!(self.raw.starts_with(self.head.lines().next().unwrap().as_bytes()));
        for line in self.head.split("\r\n") {
            assert!(!line.contains('\n'), "bare LF in header block: {:?}", self.head);
        }
    }
}

fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

/// Bytes for an assertion message: printable, long space runs shortened.
fn show(bytes: &[u8]) -> String {
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
fn split_frames(body: &[u8]) -> (Vec<&[u8]>, Vec<&[u8]>) {
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

fn frame_event(frame: &[u8]) -> Event {
    simple::decode_frames(frame).unwrap().remove(0)
}

/// The complete js script blocks of a page: each block's element lines
/// (without the leading comma of later ones).
fn js_blocks(body: &[u8]) -> Vec<Vec<String>> {
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
fn normalise_wrote(text: &str) -> String {
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
fn normalise_js_line(line: &str) -> String {
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

fn block_set(block: &[String]) -> BTreeSet<String> {
    block.iter().map(|l| normalise_js_line(l)).collect()
}

/// A js one-shot page cut into what comes before the first block, the
/// blocks, and what follows the last.
fn js_page_parts(body: &[u8]) -> (String, Vec<Vec<String>>, String) {
    let text = String::from_utf8_lossy(body).into_owned();
    let first = text.find("--><script").expect("a script block");
    let last = text.rfind("</script><!--\n").expect("a block end") + "</script><!--\n".len();
    (text[..first].to_string(), js_blocks(body), text[last..].to_string())
}

/// The CGI.pm `<meta>` line of the golden pages says iso-8859-1; ours
/// agrees with the HTTP header (README section 4: not client-visible).
fn golden_meta(text: &str) -> String {
    text.replace("content=\"text/html; charset=iso-8859-1\" />", "content=\"text/html; charset=utf-8\" />")
}

/// Asserts that a one-shot js page has exactly the golden page's framing:
/// prologue (after normalising the `Wrote to` payload and the meta
/// charset), the same set of element lines per block, and the trailer.
fn assert_js_page_like(ours: &Reply, golden: &Reply) {
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
fn assert_simple_like(ours: &Reply, golden: &Reply) {
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
fn stdout_writes(cgi: &Cgi) -> Option<usize> {
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

fn assert_one_write(cgi: &Cgi) {
    if let Some(n) = stdout_writes(cgi) {
        assert_eq!(n, 1, "the whole response goes out in one write(2)");
    }
}

/// Opens the golden 07 simple tunnel on the journal and waits for its
/// status frame.
fn open_journal_tunnel(pool: &Pool, case: &str) -> Stream {
    let tunnel = pool.golden(case).spawn();
    tunnel.frames(1);
    tunnel
}

/// Golden 06a: route r1 from /what/chat to the journal, kn_uri uri1.
fn route_r1(pool: &Pool) {
    let reply = pool.golden("06a-route-js").run();
    assert_eq!(reply.status(), "200 Routed", "{}", reply.text());
}

fn post(pool: &Pool, body: &str) -> Reply {
    pool.cgi().post(body).run()
}

fn simple_post(pool: &Pool, body: &str) -> Event {
    let reply = post(pool, &format!("{body}&kn_response_format=simple"));
    reply.event()
}

fn status_of(e: &Event) -> String {
    e.get_str("status").unwrap_or_default()
}

// ----- notify ----------------------------------------------------------------

#[test]
fn notify_js_is_200_notified_with_exact_content_length_in_one_write() {
    let pool = Pool::new("notify-js");
    let cgi = pool.golden("01-notify-js");
    let reply = cgi.run();
    assert_eq!(reply.status(), "200 Notified");
    assert_eq!(reply.header("Content-Type").as_deref(), Some("text/html; charset=utf-8"));
    reply.assert_one_shot();
    // A different topic so that this run also writes (no duplicate).
    assert_one_write(&pool.cgi().post("kn_to=/what/other&kn_payload=x&kn_id=w1"));
}

/// mod_cgid sleeps 10 ms after a request when it finds the CGI's process
/// still there once the output has ended (see `cgi.rs`). So the output of
/// a one-shot reply ends only after the process has exited: at the end of
/// its stdout, the process is already a zombie waiting to be reaped. 30
/// requests of each kind (notify, an error, help) so that a race would
/// show.
#[test]
fn one_shot_output_ends_only_after_the_process_exited() {
    let pool = Pool::new("exit-before-eof");
    let requests = [
        pool.cgi().post("kn_to=/what/exit&kn_payload=x&kn_response_format=simple"),
        pool.cgi().post("kn_to=/what/../bad&kn_payload=x"),
        pool.cgi().get("do_method=help"),
    ];
    for round in 0..30 {
        for cgi in &requests {
            let mut child = cgi.command().stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(&cgi.body).unwrap();
            drop(stdin);
            let mut out = Vec::new();
            child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
            let at_eof = child.try_wait().unwrap();
            let status = child.wait().unwrap();
            assert!(status.success(), "round {round}: exit status {status}");
            assert!(find(&out, b"Content-Type: ").is_some(), "round {round}: no reply: {}", show(&out));
            assert!(at_eof.is_some(), "round {round}: the output ended while the process still ran: {cgi:?}");
        }
    }
}

#[test]
fn notify_js_page_matches_golden_01() {
    let pool = Pool::new("notify-js-golden");
    let reply = pool.golden("01-notify-js").run();
    assert_js_page_like(&reply, &golden("01-notify-js"));
    let text = reply.text();
    assert!(text.contains("<!----><script"), "the first block closes the prologue's <!--");
    assert!(text.contains("Wrote to '/what/chat' (e1)\\n"), "{text}");
}

#[test]
fn notify_simple_frame_matches_golden_02() {
    let pool = Pool::new("notify-simple");
    post(&pool, "kn_to=/what/chat&kn_payload=seed&kn_id=e0"); // topic exists, as in the golden run
    let cgi = pool.golden("02-notify-simple");
    let reply = cgi.run();
    assert_eq!(reply.header("Content-Type").as_deref(), Some("text/plain; charset=utf-8"));
    reply.assert_one_shot();
    assert_simple_like(&reply, &golden("02-notify-simple"));
    assert_eq!(reply.event().payload(), b"Wrote to '/what/chat' (e2)\n");
    assert_one_write(&pool.cgi().post("kn_to=/what/chat&kn_payload=y&kn_id=e2b&kn_response_format=simple"));
}

#[test]
fn notify_duplicate_has_an_empty_payload() {
    let pool = Pool::new("notify-dup");
    pool.golden("01-notify-js").run();
    let again = pool.golden("01b-notify-js-duplicate-seed1").run();
    assert_js_page_like(&again, &golden("01b-notify-js-duplicate-seed1"));
    assert!(again.text().contains("<pre></pre>"), "{}", again.text());
}

#[test]
fn notify_payload_says_what_was_written() {
    let pool = Pool::new("notify-wrote");
    let e = simple_post(&pool, "kn_to=/what/chat&kn_payload=hello&kn_id=e1");
    assert_eq!(status_of(&e), "200 Notified");
    let payload = String::from_utf8(e.payload().to_vec()).unwrap();
    let lines: Vec<&str> = payload.lines().collect();
    assert_eq!(lines.len(), 3, "{payload}");
    assert!(lines[0].starts_with("Wrote to '/kn_subtopics' ("));
    assert!(lines[1].starts_with("Wrote to '/what/kn_subtopics' ("));
    assert_eq!(lines[2], "Wrote to '/what/chat' (e1)");
    assert!(payload.ends_with(")\n"));
}

#[test]
fn notify_without_kn_to_posts_to_the_path_info_topic() {
    let pool = Pool::new("notify-path-info");
    let reply = pool.cgi().path_info("/what/chat").post("kn_payload=via+path&kn_id=p1&kn_response_format=simple").run();
    assert_eq!(reply.status(), "200 Notified");
    assert!(String::from_utf8_lossy(reply.event().payload()).ends_with("Wrote to '/what/chat' (p1)\n"));
    let none = post(&pool, "kn_payload=nowhere&kn_response_format=simple");
    assert!(none.status().starts_with("400 "), "no topic at all: {}", none.status());
}

// ----- errors of the one-shot methods ------------------------------------------

#[test]
fn bad_topic_js_is_400_with_the_help_paragraph_like_golden_03a() {
    let pool = Pool::new("bad-topic-js");
    let reply = pool.golden("03a-bad-topic-js").run();
    reply.assert_one_shot();
    assert_eq!(reply.status(), "400 bad posting destination topic name");
    let text = reply.text();
    assert!(text.contains("<p>Some aspect of your request was not understood. Please see the <a href=\"http://127.0.0.1:8080/kn?do_method=help\">mod_pubsub documentation</a> for more information.</p><!----><script"), "{text}");
    // Same framing as golden 03a; the sentence itself is ours.
    let g = golden("03a-bad-topic-js");
    let (op, ob, ot) = js_page_parts(&reply.body);
    let (gp, _, gt) = js_page_parts(&g.body);
    let cut = |p: &str| p[..p.find("<pre>").unwrap()].to_string();
    assert_eq!(cut(&op), golden_meta(&cut(&gp)));
    assert_eq!(ot, gt);
    assert!(ob[0].iter().any(|l| l.contains("/what/../x")), "the payload names the topic: {:?}", ob[0]);
}

#[test]
fn bad_topic_simple_is_400_like_golden_03b() {
    let pool = Pool::new("bad-topic-simple");
    let reply = pool.golden("03b-bad-topic-simple").run();
    reply.assert_one_shot();
    assert_eq!(reply.status(), "400 bad posting destination topic name");
    let e = reply.event();
    assert_eq!(status_of(&e), "400 bad posting destination topic name");
    assert!(String::from_utf8_lossy(e.payload()).contains("/what/../x"));
    assert_eq!(e.get("kn_route_location"), Some(&b""[..]));
    assert!(!pool.events().join("x").exists());
}

#[test]
fn unknown_do_method_is_403_like_golden_04() {
    let pool = Pool::new("unknown-method");
    let reply = pool.golden("04-unknown-method-js").run();
    reply.assert_one_shot();
    assert_js_page_like(&reply, &golden("04-unknown-method-js"));
}

#[test]
fn unsupported_format_is_a_complete_403_js_page_and_nothing_is_notified() {
    let pool = Pool::new("bad-format");
    let reply = post(&pool, "kn_to=%2Fwhat%2Fchat&kn_payload=hello&kn_id=e4b&kn_response_format=bogus");
    reply.assert_one_shot();
    assert_eq!(reply.status(), "403 Unsupported kn_response_format value");
    assert_eq!(reply.header("Content-Type").as_deref(), Some("text/html; charset=utf-8"));
    let text = reply.text();
    assert!(text.contains("&quot;bogus&quot;"), "the payload names the value: {text}");
    assert!(text.contains("for more information.</p><!----><script"));
    assert!(text.ends_with("</script><!--\n-->\n</body>\n</html>\n"), "a complete page (golden 04b died here): {text}");
    assert!(pool.store().events(&kn_journal::Topic::parse("/what/chat").unwrap(), &kn_journal::Selection::all()).map(|s| s.events.is_empty()).unwrap_or(true));
    assert!(!pool.events().join("what").exists(), "the notify was not performed");
}

#[test]
fn flash_format_puts_a_nul_after_each_event() {
    let pool = Pool::new("flash");
    let reply = post(&pool, "kn_to=/what/chat&kn_payload=hello&kn_id=f1&kn_response_format=flash");
    reply.assert_one_shot();
    assert_eq!(reply.status(), "200 Notified");
    assert_eq!(reply.header("Content-Type").as_deref(), Some("text/plain; charset=utf-8"));
    assert_eq!(reply.body.last(), Some(&0u8), "NUL after the event");
    assert_eq!(count(&reply.body, b"\0"), 1);
    let (frames, _) = split_frames(&reply.body);
    assert_eq!(frames.len(), 1);
    assert_eq!(&reply.body[frames[0].len()..], b"\0");
    assert_eq!(status_of(&reply.event()), "200 Notified");
}

#[test]
fn put_is_501_with_golden_11f_page() {
    let pool = Pool::new("put");
    let reply = pool.golden("11f-put").run();
    let g = golden("11f-put");
    assert_eq!(reply.status(), "501 Not Implemented");
    assert_eq!(reply.header("Content-Type"), g.header("Content-Type"));
    reply.assert_one_shot();
    assert_eq!(reply.text(), g.text());
}

#[test]
fn head_gets_the_golden_11g_header_block_only() {
    let pool = Pool::new("head");
    let reply = pool.golden("11g-head").run();
    assert_eq!(reply.raw, golden("11g-head").raw, "{}", show(&reply.raw));
    assert_eq!(reply.raw.len(), 71);
}

#[test]
fn no_parameters_is_the_help_page_with_200() {
    let pool = Pool::new("help");
    for cgi in [pool.golden("11d-help-no-params"), pool.golden("11c-help")] {
        let reply = cgi.run();
        reply.assert_one_shot();
        assert_eq!(reply.header("Status"), None, "200, not a redirect");
        assert_eq!(reply.header("Location"), None);
        assert_eq!(reply.header("Content-Type").as_deref(), Some("text/html; charset=utf-8"));
        let text = reply.text();
        assert!(text.contains("<html") && text.contains("http://127.0.0.1:8080/kn"), "{text}");
        assert!(text.contains("notify") && text.contains("route"), "a usage page");
    }
}

#[test]
fn whoami_body_is_the_golden_11a_bytes() {
    let pool = Pool::new("whoami");
    let reply = pool.golden("11a-whoami").run();
    reply.assert_one_shot();
    assert_eq!(reply.body, b"window.kn_userid = 'anonymous';window.kn_displayname = 'Anonymous User';\r\n\r\nif (! window.kn_server) window.kn_server = '/kn';");
    assert_eq!(reply.body, golden("11a-whoami").body);
    assert_eq!(reply.header("Status"), None);
    assert!(reply.header("Content-Type").unwrap().starts_with("application/x-javascript"));
    assert!(reply.header("Expires").is_some() && reply.header("Date").is_some(), "cacheable: {}", reply.head);
    let expires = httpdate_secs(&reply.header("Expires").unwrap());
    let date = httpdate_secs(&reply.header("Date").unwrap());
    assert_eq!(expires - date, 86_400, "cacheable for a day");
}

/// Seconds of an IMF-fixdate, compared only relative to another.
fn httpdate_secs(text: &str) -> i64 {
    let parts: Vec<&str> = text.split([' ', ':']).collect();
    let day: i64 = parts[1].parse().unwrap();
    let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let month = months.iter().position(|m| *m == parts[2]).unwrap() as i64;
    let year: i64 = parts[3].parse().unwrap();
    let (h, m, s): (i64, i64, i64) = (parts[4].parse().unwrap(), parts[5].parse().unwrap(), parts[6].parse().unwrap());
    // Days from a civil date (Howard Hinnant's algorithm).
    let (y, mo) = if month < 2 { (year - 1, month + 13) } else { (year, month + 1) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (mo - 3) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe;
    days * 86_400 + h * 3600 + m * 60 + s
}

#[test]
fn whoami_names_the_remote_user() {
    let pool = Pool::new("whoami-user");
    let reply = pool.golden("11a-whoami").env("REMOTE_USER", "anna").run();
    let text = reply.text();
    assert!(text.starts_with("window.kn_userid = 'anna';window.kn_displayname = '"), "{text}");
    assert!(!text.contains("anonymous"), "{text}");
    assert!(text.ends_with("if (! window.kn_server) window.kn_server = '/kn';"));
}

#[test]
fn blank_page_has_the_title_with_newline_and_the_redraw_callback() {
    let pool = Pool::new("blank");
    let reply = pool.golden("11b-blank").run();
    reply.assert_one_shot();
    assert_eq!(reply.header("Status"), None);
    assert!(reply.header("Expires").is_some());
    let text = reply.text();
    assert!(text.contains("<title>This Space Intentionally Left Blank\n</title>"), "{text}");
    assert!(text.contains("<script type=\"text/javascript\" src=\"http://127.0.0.1:8080/kn?do_method=whoami\"></script>"));
    let g = golden("11b-blank").text();
    let script = &g[g.find("<!--\nif (parent.kn_redrawCallback)").unwrap()..g.find("// -->").unwrap()];
    assert!(text.contains(script), "the golden redraw script {script:?} in:\n{text}");
    assert!(text.contains("<body>"));
    // The whole page is golden 11b's, but for the meta charset and a final LF.
    assert_eq!(text, golden_meta(&golden("11b-blank").text()) + "\n");
}

#[test]
fn test_page_reports_no_failure() {
    let pool = Pool::new("selftest");
    let reply = pool.golden("11e-test").run();
    reply.assert_one_shot();
    let text = reply.text();
    assert!(!text.contains("FAIL"), "{text}");
    assert!(text.matches("</h1><p> Success.\n").count() >= 5, "{text}");
}

#[test]
fn lib_methods_start_with_whoami_and_contain_the_client() {
    let pool = Pool::new("lib");
    let whoami = pool.golden("11a-whoami").run().body;
    let mut bodies = Vec::new();
    for method in ["lib", "libform", "lib2form"] {
        let reply = pool.cgi().get(&format!("do_method={method}")).run();
        reply.assert_one_shot();
        assert!(reply.header("Content-Type").unwrap().starts_with("application/x-javascript"));
        assert!(reply.body.starts_with(&whoami), "{method} starts with whoami");
        assert!(reply.body.len() > whoami.len() + 1000, "{method} carries the client library");
        assert!(find(&reply.body, b"publish").is_some() && find(&reply.body, b"subscribe").is_some(), "{method}");
        bodies.push(reply.body);
    }
    assert!(bodies[1].len() > bodies[0].len(), "libform adds the form handler");
    assert_ne!(bodies[1], bodies[2], "lib2form is the two-way form handler");
}

#[test]
fn replay_without_the_replay_program_is_501_with_a_clear_message() {
    let pool = Pool::new("replay");
    // kn-replay may be built beside pubsub-cgi: name a missing one instead.
    let cgi = pool.cgi().env("KN_REPLAY", "/nonexistent/kn-replay");
    let reply = cgi.get(&format!("do_method=replay&kn_from={JOURNAL}&kn_response_format=simple")).run();
    reply.assert_one_shot();
    assert_eq!(reply.status(), "501 Not Implemented");
    let e = reply.event();
    assert!(String::from_utf8_lossy(e.payload()).contains("replay"), "{e:?}");
}

// ----- kn_status_to -------------------------------------------------------------

#[test]
fn status_to_answers_exactly_the_31_byte_204() {
    let pool = Pool::new("status-to");
    let reply = post(&pool, "kn_to=/what/chat&kn_payload=x&kn_status_to=/what/status");
    assert_eq!(reply.raw, b"Status: 204 Content forwarded\n\n");
    assert_eq!(reply.raw.len(), 31);
    let stored = pool.store().events(&kn_journal::Topic::parse("/what/status").unwrap(), &kn_journal::Selection::all()).unwrap();
    assert_eq!(stored.events.len(), 1);
    assert_eq!(status_of(&stored.events[0]), "200 Notified");
}

#[test]
fn status_to_a_stale_journal_drops_the_status_and_creates_nothing() {
    let pool = Pool::new("status-to-stale");
    let reply = pool.golden("05a-status-to-no-heartbeat").run();
    assert_eq!(reply.raw, golden("05a-status-to-no-heartbeat").raw);
    assert!(!pool.events().join("who").exists(), "the journal directory is not created");
    assert!(pool.events().join("what/chat").is_dir(), "the notify itself ran");
}

#[test]
fn status_to_an_open_journal_reaches_its_tunnel() {
    let pool = Pool::new("status-to-tunnel");
    post(&pool, "kn_to=/what/chat&kn_payload=hello&kn_id=e1"); // as in the golden run
    let tunnel = open_journal_tunnel(&pool, "05b-status-to-with-tunnel");
    let side = pool.golden("05b-status-to-with-tunnel.side1").run();
    assert_eq!(side.raw, b"Status: 204 Content forwarded\n\n");
    let body = tunnel.frames(2);
    let (frames, _) = split_frames(&body);
    let e = frame_event(frames[1]);
    assert_eq!(status_of(&e), "200 Notified");
    assert_eq!(e.get_str("kn_route_location").as_deref(), Some("abc"));
    assert_eq!(e.payload(), b"Wrote to '/what/chat' (e5b)\n");
    assert!(e.contains("kn_time_t") && e.contains("kn_route_checkpoint") && e.contains("kn_id"));
    let names: BTreeSet<&[u8]> = e.elements().map(|(n, _)| n).collect();
    let golden_names: BTreeSet<Vec<u8>> = split_frames(&golden("05b-status-to-with-tunnel").body).0[1..2]
        .iter()
        .flat_map(|f| frame_event(f).elements().map(|(n, _)| n.to_vec()).collect::<Vec<_>>())
        .collect();
    assert_eq!(names, golden_names.iter().map(Vec::as_slice).collect(), "same elements as golden 05b");
}

// ----- route ----------------------------------------------------------------------

#[test]
fn route_js_is_routed_like_golden_06a() {
    let pool = Pool::new("route-js");
    post(&pool, "kn_to=/what/chat&kn_payload=hello&kn_id=e1");
    let reply = pool.golden("06a-route-js").run();
    reply.assert_one_shot();
    assert_js_page_like(&reply, &golden("06a-route-js"));
}

#[test]
fn route_simple_is_routed_then_ignored_when_repeated() {
    let pool = Pool::new("route-simple");
    post(&pool, "kn_to=/what/chat&kn_payload=hello&kn_id=e1");
    pool.golden("06a-route-js").run();
    let new = pool.golden("06b-route-simple").run();
    new.assert_one_shot();
    assert_simple_like(&new, &golden("06b-route-simple"));
    let repeat = pool.golden("06c-route-simple-repeat").run();
    repeat.assert_one_shot();
    assert_simple_like(&repeat, &golden("06c-route-simple-repeat"));
    assert_eq!(repeat.event().payload(), b"was a duplicate\n");
}

#[test]
fn route_delete_stops_forwarding_like_golden_12() {
    let pool = Pool::new("route-delete");
    let _tunnel = open_journal_tunnel(&pool, "07-tunnel-simple");
    post(&pool, "kn_to=/what/chat&kn_payload=hello&kn_id=e1");
    route_r1(&pool);
    let before = simple_post(&pool, "kn_to=/what/chat&kn_payload=routed&kn_id=e11");
    assert!(String::from_utf8_lossy(before.payload()).contains(JOURNAL), "forwarded while the route lives");
    let reply = pool.golden("12-route-delete").run();
    reply.assert_one_shot();
    assert_js_page_like(&reply, &golden("12-route-delete"));
    let after = pool.golden("12b-notify-after-delete").run();
    assert_simple_like(&after, &golden("12b-notify-after-delete"));
    assert_eq!(after.event().payload(), b"Wrote to '/what/chat' (e12)\n");
    let routes = pool.store().all_routes(&kn_journal::Topic::parse("/what/chat").unwrap()).unwrap();
    let r1 = routes.iter().find(|r| r.id() == b"r1").unwrap();
    assert!(r1.destination().is_empty(), "replaced by an inactive route");
    assert!(r1.event.contains("kn_expires"), "the deletion can be reclaimed");
}

#[test]
fn route_from_a_journal_is_403() {
    let pool = Pool::new("route-from-journal");
    let reply = pool.cgi().post(&format!("do_method=route&kn_from={JOURNAL}&kn_to=/what/x&kn_response_format=simple")).run();
    reply.assert_one_shot();
    assert_eq!(reply.status().split(' ').next(), Some("403"), "{}", reply.status());
}

#[test]
fn route_bad_destination_is_400_naming_it() {
    let pool = Pool::new("route-bad-dest");
    let reply = post(&pool, "do_method=route&kn_from=/what/chat&kn_to=/what/a+b%3Cc&kn_response_format=simple");
    reply.assert_one_shot();
    assert!(reply.status().starts_with("400 "), "{}", reply.status());
    let payload = String::from_utf8_lossy(reply.event().payload()).into_owned();
    assert!(payload.contains("/what/a b<c"), "{payload}");
}

// ----- tunnels -------------------------------------------------------------------

/// Checks the start of a simple tunnel: the header block, the status frame
/// and 4096 spaces, nothing else.
fn assert_simple_tunnel_start(body: &[u8], status_from: &str) -> Event {
    let (frames, seps) = split_frames(body);
    assert!(seps[0].is_empty(), "the status frame comes first");
    let status = frame_event(frames[0]);
    assert_eq!(status_of(&status), "200 Watching topic");
    assert_eq!(status.get_str("kn_route_location").as_deref(), Some(status_from));
    assert!(status.payload().ends_with(format!("Watching for events in topic '{JOURNAL}'.").as_bytes()), "{status:?}");
    let after = &body[frames[0].len()..];
    assert!(after.len() >= PADDING && after[..PADDING].iter().all(|&b| b == b' '), "4096 spaces of padding");
    status
}

/// Separators between simple frames are spaces only (one C client aborts
/// on a newline between frames).
fn assert_spaces_only(seps: &[&[u8]]) {
    for s in seps {
        assert!(s.iter().all(|&b| b == b' '), "separator with other bytes than spaces: {:?}", String::from_utf8_lossy(s));
    }
}

#[test]
fn tunnel_simple_streams_each_event_like_golden_07() {
    let pool = Pool::new("tunnel-simple");
    let tunnel = pool.golden("07-tunnel-simple").spawn();
    let first = tunnel.frames(1);
    let head = Reply::parse(tunnel.bytes());
    assert_eq!(head.status(), "200 Watching topic");
    assert_eq!(head.header("Content-Type").as_deref(), Some("text/plain; charset=utf-8"));
    assert_eq!(head.header("Content-Length"), None, "a tunnel streams");
    assert_simple_tunnel_start(&first, "tun1");
    route_r1(&pool);
    for side in 1..=4 {
        let reply = pool.golden(&format!("07-tunnel-simple.side{side}")).run();
        assert_eq!(reply.status(), "200 Notified", "side {side}: {}", reply.text());
        let body = tunnel.frames(1 + side);
        let (frames, _) = split_frames(&body);
        let end = find(&body, frames[side]).unwrap() + frames[side].len();
        let padded = tunnel.wait_for(Duration::from_secs(5), "padding after the event", |b| {
            Reply::split(b).is_some_and(|(_, body)| body.len() >= end + PADDING)
        });
        let body = Reply::parse(padded).body;
        assert!(body[end..end + PADDING].iter().all(|&b| b == b' '), "4096 spaces after event {side}");
    }
    // Keep-alives land between frames: wait for one.
    let len = tunnel.bytes().len();
    tunnel.wait_for(Duration::from_secs(5), "a keep-alive", |b| b.len() > len);
    let body = Reply::parse(tunnel.bytes()).body;
    let (frames, seps) = split_frames(&body);
    assert_eq!(frames.len(), 5);
    assert_spaces_only(&seps);

    let golden_frames: Vec<Event> = split_frames(&golden("07-tunnel-simple").body).0.iter().map(|f| frame_event(f)).collect();
    for (i, ours) in frames.iter().map(|f| frame_event(f)).enumerate().skip(1) {
        let g = &golden_frames[i];
        assert_eq!(ours.payload(), g.payload(), "payload of event {i}");
        for (name, value) in g.elements() {
            match name {
                b"kn_time_t" | b"kn_route_checkpoint" => assert!(ours.contains(name)),
                _ => assert_eq!(ours.get(name), Some(value), "event {i}, element {}", String::from_utf8_lossy(name)),
            }
        }
        assert_eq!(ours.len(), g.len(), "event {i} has exactly the golden elements: {ours:?}");
    }
    // The routed event's simple bytes: the golden 07 escapes.
    let e7b = String::from_utf8_lossy(frames[2]).into_owned();
    assert!(find(frames[2], b"extra: =20\xce\xba\xe1\xbd\xb9\xcf=83\xce\xbc\xce\xb5=0Aline=3A a=3Db=00end\n").is_some(), "{e7b}");
    assert!(find(frames[3], b"tricky: <b>\"q\" \\ =09=0D=0C=7F\xc2=85 end=20\n").is_some());
    assert!(find(frames[3], b"name \xce\xba=3A=3D: v\n").is_some());
    assert!(find(frames[3], b"empty: \n").is_some());
    assert!(find(frames[1], b"kn_routed_from: http=3A//127.0.0.1=3A8080/kn/what/chat\n").is_some());
    assert!(find(frames[1], b"kn_route_location: http=3A//example/uri1\n").is_some());
}

#[test]
fn tunnel_js_escapes_events_like_golden_08() {
    let pool = Pool::new("tunnel-js");
    drop(open_journal_tunnel(&pool, "07-tunnel-simple")); // the journal exists, as in the golden run
    let tunnel = pool.golden("08-tunnel-js").spawn();
    let first = tunnel.blocks(1);
    let head = Reply::parse(tunnel.bytes());
    assert_eq!(head.status(), "200 Watching topic");
    assert_eq!(head.header("Content-Type").as_deref(), Some("text/html; charset=utf-8"));
    let text = String::from_utf8_lossy(&first).into_owned();
    assert!(text.contains("\n<body onload=\"if(parent.kn_tunnelLoadCallback) parent.kn_tunnelLoadCallback(window)\">\n<h1>200 Watching topic</h1>"), "{text}");
    let g = golden("08-tunnel-js");
    let (gp, _, _) = js_page_parts(&g.body);
    assert_eq!(&text[..text.find("--><script").unwrap()], golden_meta(&gp), "tunnel page prologue");
    route_r1(&pool);
    for side in 1..=4 {
        let reply = pool.golden(&format!("08-tunnel-js.side{side}")).run();
        assert_eq!(reply.status(), "200 Notified");
    }
    let body = tunnel.blocks(5);
    let ours = js_blocks(&body);
    let golden_blocks = js_blocks(&g.body);
    assert_eq!(block_set(&ours[0]), block_set(&golden_blocks[0]), "the status block");
    for i in 1..=4 {
        assert_eq!(block_set(&ours[i]), block_set(&golden_blocks[i]), "block of e8{}", ["", "a", "b", "c", "d"][i]);
    }
    // Blocks are followed by the padding inside the comment.
    let text = String::from_utf8_lossy(&body).into_owned();
    assert!(text.contains(&format!("</script><!--\n{}\n", " ".repeat(PADDING))), "padding after a block");
}

#[test]
fn tunnel_js_with_expires_ends_itself_and_makes_the_journal_stale() {
    let pool = Pool::new("tunnel-expires");
    let started = Instant::now();
    let mut tunnel = pool.golden("08b-tunnel-js-expires").spawn();
    tunnel.blocks(1);
    let status = tunnel.wait_exit(Duration::from_secs(6)).expect("the tunnel ends by itself");
    let took = started.elapsed();
    println!("tunnel with kn_expires=+2 ended after {took:?}");
    assert!(status.success());
    assert!(took >= Duration::from_millis(1900) && took < Duration::from_secs(4), "{took:?}");
    let body = Reply::parse(tunnel.bytes()).body;
    assert!(body.ends_with(b"-->\n</body>\n</html>\n"), "{}", show(&body));
    assert!(count(&body, b"</html>") >= 1);
    let reply = post(&pool, "kn_to=/who/a/s/9/kn_journal&kn_payload=late&kn_response_format=simple");
    assert_eq!(reply.status(), "404 Expired", "the journal is stale at once");
}

/// Under a web server too, KN_TUNNEL_MAX_TIME ends the tunnel's CGI
/// process (so that an old child of a gracefully reloaded Apache finishes),
/// and leaves its journal fresh for the reconnection.
#[test]
fn tunnel_max_time_ends_the_cgi_and_leaves_the_journal_fresh() {
    let pool = Pool::new("tunnel-max-time");
    let started = Instant::now();
    let mut tunnel = pool.cgi().env("KN_TUNNEL_MAX_TIME", "1").get("kn_response_format=simple").path_info("/who/t/s/1/kn_journal").spawn();
    tunnel.frames(1);
    let status = tunnel.wait_exit(Duration::from_secs(6)).expect("the tunnel ends by itself");
    let took = started.elapsed();
    assert!(status.success());
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(4), "{took:?}");
    let reply = post(&pool, "kn_to=/who/t/s/1/kn_journal&kn_payload=meanwhile&kn_response_format=simple");
    assert_eq!(reply.status(), "200 Notified", "the journal is not stale");
}

fn seeded_journal(pool: &Pool) -> Vec<Event> {
    let tunnel = open_journal_tunnel(pool, "07-tunnel-simple");
    route_r1(pool);
    for side in 1..=4 {
        pool.golden(&format!("07-tunnel-simple.side{side}")).run();
    }
    let body = tunnel.frames(5);
    split_frames(&body).0.iter().map(|f| frame_event(f)).collect()
}

fn ids(events: &[Event]) -> Vec<String> {
    events.iter().map(|e| e.get_str("kn_id").unwrap_or_default()).collect()
}

#[test]
fn tunnel_max_n_1_sends_only_the_newest_event_like_golden_09a() {
    let pool = Pool::new("tunnel-max-n");
    seeded_journal(&pool);
    let tunnel = pool.golden("09a-tunnel-max-n-1").spawn();
    let body = tunnel.frames(2);
    assert_simple_tunnel_start(&body, "tun9a");
    std::thread::sleep(Duration::from_millis(300));
    let body = Reply::parse(tunnel.bytes()).body;
    let (frames, seps) = split_frames(&body);
    assert_eq!(ids(&frames[1..].iter().map(|f| frame_event(f)).collect::<Vec<_>>()), ["e7d"]);
    assert_spaces_only(&seps);
    assert!(seps[1].len() >= PADDING, "padding between the status and the burst");
}

#[test]
fn tunnel_since_checkpoint_excludes_that_event_like_golden_09b() {
    let pool = Pool::new("tunnel-since");
    let seeded = seeded_journal(&pool);
    let e7a = seeded.iter().find(|e| e.get("kn_id") == Some(b"e7a")).unwrap();
    let checkpoint = e7a.get_str("kn_route_checkpoint").unwrap();
    let tunnel = pool
        .golden("09b-tunnel-since-checkpoint")
        .env("QUERY_STRING", &format!("do_method=route&kn_response_format=simple&kn_status_from=tun9b&do_since_checkpoint={checkpoint}"))
        .spawn();
    let body = tunnel.frames(4);
    assert_simple_tunnel_start(&body, "tun9b");
    std::thread::sleep(Duration::from_millis(300));
    let body = Reply::parse(tunnel.bytes()).body;
    let (frames, seps) = split_frames(&body);
    let events: Vec<Event> = frames[1..].iter().map(|f| frame_event(f)).collect();
    assert_eq!(ids(&events), ["e7b", "e7c", "e7d"]);
    assert!(seps[2].is_empty() && seps[3].is_empty(), "one burst: no padding inside it");
    assert_spaces_only(&seps);
}

#[test]
fn tunnel_since_unknown_checkpoint_replays_everything_like_golden_09c() {
    let pool = Pool::new("tunnel-since-unknown");
    seeded_journal(&pool);
    let tunnel = pool.golden("09c-tunnel-since-unknown-checkpoint").spawn();
    let body = tunnel.frames(5);
    assert_simple_tunnel_start(&body, "tun9c");
    std::thread::sleep(Duration::from_millis(300));
    let body = Reply::parse(tunnel.bytes()).body;
    let (frames, _) = split_frames(&body);
    let events: Vec<Event> = frames[1..].iter().map(|f| frame_event(f)).collect();
    assert_eq!(ids(&events), ["e7a", "e7b", "e7c", "e7d"]);
}

#[test]
fn get_without_do_method_with_semicolons_and_absolute_kn_from_is_a_tunnel() {
    let pool = Pool::new("tunnel-get");
    let tunnel = pool.golden("08-tunnel-js").spawn();
    let body = tunnel.blocks(1);
    let status = &js_blocks(&body)[0];
    assert!(status.contains(&"{name:\"status\",value:\"200 Watching topic\"}".to_string()), "{status:?}");
    assert!(status.contains(&"{name:\"kn_route_location\",value:\"http://127.0.0.1:8080/kn/who/a/s/1/kn_journal/kn_status/11111111_1\"}".to_string()));
    assert!(pool.events().join("who/a/s/1/kn_journal").is_dir());
}

#[test]
fn tunnel_delivers_an_event_within_100_ms_of_the_notify() {
    let pool = Pool::new("tunnel-latency");
    let tunnel = open_journal_tunnel(&pool, "07-tunnel-simple");
    // Wait for the padding, so that the next bytes are the event.
    tunnel.wait_for(Duration::from_secs(5), "padding", |b| {
        Reply::split(b).is_some_and(|(_, body)| split_frames(body).0.first().is_some_and(|f| body.len() >= f.len() + PADDING))
    });
    let offset = tunnel.bytes().len();
    let sent = Instant::now();
    let reply = pool.golden("07-tunnel-simple.side4").run();
    let posted = Instant::now();
    assert_eq!(reply.status(), "200 Notified");
    tunnel.frames(2);
    let arrived = tunnel.arrival_of(offset).unwrap();
    let latency = arrived.saturating_duration_since(posted);
    println!(
        "tunnel latency: {:?} after the notify process started, {latency:?} after it returned (0 = before)",
        arrived.saturating_duration_since(sent)
    );
    assert!(latency < Duration::from_millis(100), "{latency:?}");
}

#[test]
fn tunnel_process_exits_when_the_client_goes_away() {
    let pool = Pool::new("tunnel-gone");
    let mut child = pool
        .golden("07-tunnel-simple")
        .command()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut buf = vec![0u8; 256];
    let n = stdout.read(&mut buf).unwrap();
    assert!(n > 0);
    drop(stdout); // the browser vanished
    let gone = Instant::now();
    let status = wait_exit(&mut child, Duration::from_secs(5));
    if status.is_none() {
        let pid = child.id();
        let _ = Command::new("sh").arg("-c").arg(format!("cat /proc/{pid}/task/*/wchan; echo; ls -l /proc/{pid}/fd; cat /proc/{pid}/task/*/stat")).status();
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(status.is_some(), "the CGI must notice the closed pipe through its keep-alives");
    println!("tunnel exited {:?} after its stdout closed", gone.elapsed());
}

// ----- batch -------------------------------------------------------------------------

#[test]
fn batch_with_status_to_the_journal_delivers_five_frames_in_order() {
    let pool = Pool::new("batch-tunnel");
    let tunnel = open_journal_tunnel(&pool, "10-batch-tunnel");
    post(&pool, "kn_to=/what/chat&kn_payload=hello&kn_id=e1");
    route_r1(&pool);
    let reply = pool.golden("10-batch").run();
    assert_eq!(reply.raw, golden("10-batch").raw);
    let body = tunnel.frames(6);
    let (frames, seps) = split_frames(&body);
    let events: Vec<Event> = frames[1..6].iter().map(|f| frame_event(f)).collect();
    let summary: Vec<(String, String, String)> = events
        .iter()
        .map(|e| (status_of(e), e.get_str("kn_route_location").unwrap_or_default(), e.get_str("kn_id").unwrap_or_default()))
        .collect();
    assert_eq!(summary[0].0, "200 Processing batch");
    assert_eq!(summary[0].1, "b0");
    assert_eq!(events[0].payload(), b"");
    assert_eq!((summary[1].1.as_str(), summary[1].2.as_str()), ("http://example/uri1", "e10a"));
    assert_eq!(events[1].payload(), b"batch one");
    assert_eq!((summary[2].0.as_str(), summary[2].1.as_str()), ("200 Notified", "b1"));
    assert_eq!((summary[3].2.as_str(), events[3].payload()), ("e10b", &b"batch two"[..]));
    assert_eq!((summary[4].0.as_str(), summary[4].1.as_str()), ("200 Notified", "b2"));
    assert_spaces_only(&seps);
    let golden_events: Vec<Event> = split_frames(&golden("10-batch-tunnel").body).0[1..].iter().map(|f| frame_event(f)).collect();
    for (o, g) in events.iter().zip(&golden_events) {
        let names = |e: &Event| e.elements().map(|(n, _)| n.to_vec()).collect::<BTreeSet<_>>();
        assert_eq!(names(o), names(g), "same elements as golden 10");
    }
}

#[test]
fn batch_without_status_to_answers_the_statuses_in_order() {
    let pool = Pool::new("batch-reply");
    let reply = post(
        &pool,
        "do_method=batch&kn_status_from=b0&kn_response_format=simple\
         &kn_batch=do_method%3Dnotify%3Bkn_to%3D%252Fwhat%252Fchat%3Bkn_payload%3Dbatch%2520one%3Bkn_id%3De10a%3Bkn_status_from%3Db1\
         &kn_batch=do_method%3Droute%3Bkn_from%3D%252Fwhat%252Fchat%3Bkn_to%3D%252Fwhat%252Fcopy%3Bkn_id%3Dr9%3Bkn_status_from%3Db2",
    );
    reply.assert_one_shot();
    assert_eq!(reply.status(), "200 Processing batch");
    let events = reply.events();
    let summary: Vec<(String, String)> =
        events.iter().map(|e| (status_of(e), e.get_str("kn_route_location").unwrap_or_default())).collect();
    assert_eq!(
        summary,
        [("200 Processing batch".into(), "b0".into()), ("200 Notified".into(), "b1".into()), ("200 Routed".into(), "b2".into())]
    );
    assert!(String::from_utf8_lossy(events[1].payload()).contains("Wrote to '/what/chat' (e10a)\n"));
    let stored = pool.store().events(&kn_journal::Topic::parse("/what/chat").unwrap(), &kn_journal::Selection::all()).unwrap();
    assert_eq!(stored.events[0].payload(), b"batch one", "`;` separated the pairs inside the kn_batch value");
}

#[test]
fn batch_refuses_other_methods_and_still_runs_the_rest() {
    let pool = Pool::new("batch-refuse");
    let reply = post(
        &pool,
        "do_method=batch&kn_response_format=simple\
         &kn_batch=do_method%3Dwhoami%3Bkn_status_from%3Dx1\
         &kn_batch=do_method%3Dnotify%3Bkn_to%3D%252Fwhat%252Fchat%3Bkn_payload%3Dstill%3Bkn_status_from%3Dx2",
    );
    let events = reply.events();
    let statuses: Vec<String> = events.iter().map(status_of).collect();
    assert_eq!(statuses, ["200 Processing batch", "400 can't batch that", "200 Notified"]);
    assert_eq!(events[1].get_str("kn_route_location").as_deref(), Some("x1"));
    assert_eq!(events[2].get_str("kn_route_location").as_deref(), Some("x2"));
}

// ----- request errors and limits --------------------------------------------------------

#[test]
fn malformed_percent_encoding_is_400_naming_the_input() {
    let pool = Pool::new("bad-percent");
    let reply = post(&pool, "kn_to=/what/chat&kn_payload=abc%zz");
    reply.assert_one_shot();
    assert!(reply.status().starts_with("400 "), "{}", reply.status());
    let text = reply.text();
    assert!(text.contains("kn_payload=abc%zz"), "{text}");
    assert!(text.contains("href=\"http://127.0.0.1:8080/kn?do_method=help\""), "the help link uses the server URL: {text}");
    assert!(!pool.events().join("what").exists());
}

#[test]
fn content_length_over_the_limit_is_413_without_reading_the_body() {
    let pool = Pool::new("too-long");
    let cgi = pool.cgi().post("").env("CONTENT_LENGTH", "999999999999");
    let mut child = cgi.command().stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let stdin = child.stdin.take().unwrap(); // kept open: the body never ends
    let status = wait_exit(&mut child, Duration::from_secs(10));
    if status.is_none() {
        let _ = child.kill();
    }
    let mut out = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
    drop(stdin);
    assert!(status.is_some(), "the CGI must answer without waiting for the body");
    let reply = Reply::parse(out);
    reply.assert_one_shot();
    assert!(reply.status().starts_with("413 "), "{}", reply.status());
    assert!(reply.text().contains("999999999999"), "{}", reply.text());
}

#[test]
fn event_over_the_size_limit_is_413() {
    let pool = Pool::new("too-big");
    let payload = "x".repeat(500);
    let reply = pool.cgi().env("KN_MAX_EVENT_BYTES", "200").post(&format!("kn_to=/what/chat&kn_payload={payload}&kn_response_format=simple")).run();
    reply.assert_one_shot();
    assert!(reply.status().starts_with("413 "), "{}", reply.status());
    assert!(!pool.events().join("what/chat").exists() || pool.store().events(&kn_journal::Topic::parse("/what/chat").unwrap(), &kn_journal::Selection::all()).unwrap().events.is_empty());
}

#[test]
fn notify_to_kn_subtopics_or_kn_routes_is_400_cant_post_there() {
    let pool = Pool::new("reserved");
    for topic in ["/what/kn_subtopics", "/what/chat/kn_routes"] {
        let reply = post(&pool, &format!("kn_to={topic}&kn_payload=x&kn_response_format=simple"));
        assert_eq!(reply.status(), "400 Can't post there", "{topic}");
        assert_eq!(status_of(&reply.event()), "400 Can't post there");
    }
}

#[test]
fn foreign_absolute_kn_to_is_403_proxying_not_supported() {
    let pool = Pool::new("proxy");
    let reply = post(&pool, "kn_to=http%3A%2F%2Fexample.org%2Fkn%2Fwhat%2Fchat&kn_payload=x&kn_response_format=simple");
    assert_eq!(reply.status(), "403 Proxying not supported");
    assert!(String::from_utf8_lossy(reply.event().payload()).contains("http://example.org/kn/what/chat"));
}

#[test]
fn names_alias_is_local_once_an_administrator_adds_it_and_knfoo_is_not_local() {
    let pool = Pool::new("names");
    // This machine's URL is learned; the first name from elsewhere too,
    // once; a request by yet another Host adds nothing.
    assert!(post(&pool, "kn_to=/what/chat&kn_payload=x&kn_response_format=simple").status().starts_with("200 "));
    let reply = pool.cgi().env("HTTP_HOST", "public.example:8080").get("do_method=whoami").run();
    assert!(reply.text().contains("kn_userid"));
    let reply = pool.cgi().env("HTTP_HOST", "alias:8080").get("do_method=whoami").run();
    assert!(reply.text().contains("kn_userid"));
    let names = std::fs::read_to_string(pool.events().join(".names")).unwrap();
    assert_eq!(names.lines().count(), 2, "{names}");
    assert!(names.starts_with("http://127.0.0.1:8080/kn\t"), "{names}");
    assert!(names.contains("\nhttp://public.example:8080/kn\n"), "{names}");
    let alias = "kn_to=http%3A%2F%2Falias%3A8080%2Fkn%2Fwhat%2Fchat&kn_payload=x&kn_id=n1&kn_response_format=simple";
    assert_eq!(post(&pool, alias).status(), "403 Proxying not supported", "a Host a client sent is no name");
    pool.store().add_server_name("http://alias:8080/kn").unwrap();
    let local = post(&pool, alias);
    assert_eq!(local.status(), "200 Notified");
    assert!(String::from_utf8_lossy(local.event().payload()).contains("Wrote to '/what/chat' (n1)"));
    let foo = post(&pool, "kn_to=http%3A%2F%2F127.0.0.1%3A8080%2Fknfoo&kn_payload=x&kn_response_format=simple");
    assert_eq!(foo.status(), "403 Proxying not supported", "…/knfoo is not the local topic /foo");
}

/// Hostile input: every request used to append its `Host` to `.names`,
/// which every CGI start reads and every URL resolution scans.
#[test]
fn a_thousand_distinct_hosts_leave_names_unchanged() {
    let pool = Pool::new("many-hosts");
    assert!(post(&pool, "kn_to=/what/chat&kn_payload=x&kn_response_format=simple").status().starts_with("200 "));
    let before = std::fs::read_to_string(pool.events().join(".names")).unwrap();
    assert!(before.starts_with("http://127.0.0.1:8080/kn\tlearned\t"), "{before}");
    for i in 0..1000 {
        let reply = pool
            .cgi()
            .env("HTTP_HOST", &format!("h{i}.example:8080"))
            .post(&format!("kn_to=/what/chat&kn_payload={i}&kn_response_format=simple"))
            .run();
        assert!(reply.status().starts_with("200 "), "{}", reply.status());
    }
    // Names elsewhere are not this machine's: only the first is taken (a
    // fresh store's public name, once), none of the 999 others.
    let after = std::fs::read_to_string(pool.events().join(".names")).unwrap();
    assert_eq!(after, format!("{before}http://h0.example:8080/kn\n"), ".names grew");
    assert_eq!(pool.store().server_names(), ["http://h0.example:8080/kn", "http://127.0.0.1:8080/kn"]);
}

/// Hostile input: a `Host` equal to a peer's URL made the peer count as
/// this server, so a route to the peer delivered into the local topic.
#[test]
fn a_forged_host_does_not_make_a_route_to_a_peer_deliver_locally() {
    let pool = Pool::new("forged-host");
    // A peer nobody listens at: a delivery to it fails and, with no
    // retries allowed, poisons the route.
    let peer = "127.0.0.1:9";
    let route = format!("do_method=route&kn_from=/what/chat&kn_to=http%3A%2F%2F{peer}%2Fkn%2Fstolen&kn_id=r1&kn_response_format=simple");
    let reply = pool.cgi().env("KN_OUTBOUND", "allow").post(&route).run();
    assert_eq!(reply.status(), "200 Routed", "{}", reply.text());
    let forged = pool
        .cgi()
        .env("KN_OUTBOUND", "allow")
        .env("KN_FORWARD_RETRIES", "0")
        .env("HTTP_HOST", peer)
        .post("kn_to=/what/chat&kn_payload=secret&kn_response_format=simple")
        .run();
    assert_eq!(forged.status(), "200 Notified", "{}", forged.text());
    let stolen = kn_journal::Topic::parse("/stolen").unwrap();
    assert!(
        !pool.events().join("stolen").exists()
            || pool.store().events(&stolen, &kn_journal::Selection::all()).unwrap().events.is_empty(),
        "the route to the peer delivered locally"
    );
    assert!(pool.store().routes(&kn_journal::Topic::parse("/what/chat").unwrap()).unwrap().is_empty(), "the failed delivery poisons the route");
    // A store named by KN_SERVER_URL takes no name from Host, even from
    // its first request, here the forged one creating the route.
    let fresh = Pool::new("forged-first");
    let named = |cgi: Cgi| cgi.env("KN_OUTBOUND", "allow").env("KN_SERVER_URL", "http://127.0.0.1:8080/kn");
    let reply = named(fresh.cgi()).env("HTTP_HOST", peer).post(&route).run();
    assert_eq!(reply.status(), "200 Routed", "{}", reply.text());
    let notified = named(fresh.cgi()).post("kn_to=/what/chat&kn_payload=secret&kn_response_format=simple").run();
    assert_eq!(notified.status(), "200 Notified");
    assert!(!fresh.events().join("stolen").exists(), "the route to the peer delivered locally");
    assert!(!fresh.events().join(".names").exists());
}

#[test]
fn disk_below_the_reserve_is_507_and_nothing_is_stored() {
    let pool = Pool::new("disk-full");
    std::fs::create_dir_all(pool.events()).unwrap();
    let free = fs4::available_space(pool.events()).unwrap();
    let reserve = (free.saturating_mul(2)).max(1 << 40).to_string();
    let reply = pool.cgi().env("KN_RESERVE_BYTES", &reserve).post("kn_to=/what/chat&kn_payload=x&kn_response_format=simple").run();
    reply.assert_one_shot();
    assert_eq!(reply.status(), "507 Insufficient Storage");
    let stored = pool.store().events(&kn_journal::Topic::parse("/what/chat").unwrap(), &kn_journal::Selection::all());
    assert!(stored.map(|s| s.events.is_empty()).unwrap_or(true), "nothing stored");
}

#[test]
fn command_line_arguments_are_ignored_under_a_web_server() {
    let pool = Pool::new("argv");
    let mut cgi = pool.cgi().get("");
    cgi.args = ["serve", "--listen", "127.0.0.1:9"].map(String::from).to_vec();
    let help = cgi.run();
    help.assert_one_shot();
    assert!(help.text().contains("<html"), "answered as a CGI: {}", help.text());
    let mut cgi = pool.cgi().post("kn_to=/what/chat&kn_payload=argv&kn_response_format=simple");
    cgi.args = ["serve", "--listen", "127.0.0.1:9"].map(String::from).to_vec();
    let started = Instant::now();
    let reply = cgi.run();
    assert_eq!(reply.status(), "200 Notified");
    assert!(started.elapsed() < Duration::from_secs(5), "did not stay listening");
    assert!(std::net::TcpStream::connect_timeout(&"127.0.0.1:9".parse().unwrap(), Duration::from_millis(200)).is_err(), "nothing listens on :9");
}

// ----- journal bugs found from here ------------------------------------------------------

/// Found by `tunnel_js_with_expires_ends_itself_and_makes_the_journal_stale`:
/// a tunnel process hung after writing its trailer. `Subscription::drop`
/// (kn-journal `watch.rs`) held the topics lock while `unwatch` waited for
/// the notifier's thread, which waited for that same lock to deliver the
/// `.heartbeat` removal that `Store::expire` had just caused. Fixed in
/// `watch.rs` (the topics lock is never held across a call into the
/// watcher); `serve` drops tunnels, so this must hold.
#[test]
fn journal_tunnel_dropped_right_after_expire_never_deadlocks() {
    let pool = Pool::new("journal-deadlock");
    let root = pool.events();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let store = kn_journal::Store::open(&root).unwrap();
        let topic = kn_journal::Topic::parse("/who/x/s/1/kn_journal").unwrap();
        for round in 0..200 {
            let start = store.tunnel(&topic, &kn_journal::Selection::none()).unwrap();
            store.expire(&topic).unwrap();
            drop(start);
            let _ = done.send(round);
        }
    });
    let mut last = None;
    while let Ok(round) = finished.recv_timeout(Duration::from_secs(5)) {
        last = Some(round);
    }
    assert_eq!(last, Some(199), "a Tunnel drop deadlocked after round {last:?}");
}

/// Hostile input: a body of `a&a&a&…` made one parameter per two bytes
/// (a 24 MiB body: 12 million pairs, several hundred MiB of memory).
#[test]
fn form_elements_up_to_the_limit_are_accepted_and_one_more_is_413() {
    let pool = Pool::new("form-elements");
    // Three in the query, two in the body: five, the limit.
    let at_limit = pool
        .cgi()
        .env("KN_MAX_FORM_ELEMENTS", "5")
        .env("QUERY_STRING", "kn_to=/what/chat&kn_response_format=simple&kn_id=f1")
        .post("kn_payload=x&x=1")
        .run();
    assert_eq!(at_limit.status(), "200 Notified", "{}", at_limit.text());
    let over = pool
        .cgi()
        .env("KN_MAX_FORM_ELEMENTS", "5")
        .env("QUERY_STRING", "kn_to=/what/chat&kn_response_format=simple&kn_id=f2")
        .post("kn_payload=x&x=1&y=2")
        .run();
    over.assert_one_shot();
    assert_eq!(over.status(), "413 Too many form elements", "{}", over.text());
    assert!(over.text().contains("more than 5 form elements in the query string and body together (KN_MAX_FORM_ELEMENTS)"), "{}", over.text());
    let query_only = pool.cgi().env("KN_MAX_FORM_ELEMENTS", "2").get("kn_to=/what/chat&kn_payload=x&kn_id=f3").run();
    assert!(query_only.status().starts_with("413 "), "{}", query_only.status());
    let ids: Vec<_> = pool.store().events(&kn_journal::Topic::parse("/what/chat").unwrap(), &kn_journal::Selection::all()).unwrap().events;
    assert_eq!(ids.iter().map(|e| e.id().unwrap().to_vec()).collect::<Vec<_>>(), [b"f1".to_vec()], "nothing stored past the limit");
    // The default.
    let many = "a=1&".repeat(10_000);
    let reply = pool.cgi().post(&format!("kn_to=/what/chat&kn_payload=x&kn_response_format=simple&{many}")).run();
    assert_eq!(reply.status(), "413 Too many form elements");
}

// ----- old clients: behave as the original ---------------------------------------------

/// The original answers `200 Routed` to a route into a URL of this server
/// that names no valid topic (a `..` segment, or no `/` after the script),
/// and the route poisons at its first delivery (PROTOCOL.md 4.1 step 4, bad
/// name): 2003 clients that stop at a refused route depend on it. Under the
/// default outbound policy (`deny`): no request leaves the server for it.
/// The route's reply is golden 06b's (the same request with another
/// `kn_to`); the notify still succeeds and nothing is delivered.
#[test]
fn route_to_a_url_of_this_server_naming_no_topic_is_routed_then_poisoned_like_the_original() {
    let cases = [
        ("dotdot", "http%3A%2F%2F127.0.0.1%3A8080%2Fkn%2Fwhat%2Fa%2F..%2Fflurb", "segment '..' starts or ends with '.'"),
        ("no-slash", "http%3A%2F%2F127.0.0.1%3A8080%2Fknwhat%2Fa", "only with a '/' after the server URL"),
    ];
    for (case, destination, why) in cases {
        let pool = Pool::new(&format!("route-bad-name-{case}"));
        // As in golden's pool, `/what` exists already.
        post(&pool, "kn_to=/what/chat&kn_payload=hello&kn_id=e1");
        let route = format!(
            "do_method=route&kn_from=%2Fwhat%2Fother&kn_to={destination}&kn_id=r2&kn_uri=http%3A%2F%2Fexample%2Furi2&kn_response_format=simple"
        );
        let reply = post(&pool, &route);
        reply.assert_one_shot();
        assert_simple_like(&reply, &golden("06b-route-simple"));

        let notify = post(&pool, "kn_to=/what/other&kn_payload=hello&kn_id=e1&kn_response_format=simple");
        notify.assert_one_shot();
        assert_eq!(notify.status(), "200 Notified", "{case}: {}", notify.text());
        assert_eq!(status_of(&notify.event()), "200 Notified");
        assert_eq!(
            String::from_utf8_lossy(notify.event().payload()),
            "Wrote to '/what/other' (e1)\nWrote to '/what/other/kn_routes' (r2)\n",
            "{case}: the event, then the poisoning, nothing delivered"
        );

        let store = pool.store();
        let routes = store.all_routes(&kn_journal::Topic::parse("/what/other").unwrap()).unwrap();
        let r2 = routes.iter().find(|r| r.id() == b"r2").expect("route r2");
        assert!(r2.destination().is_empty(), "{case}: poisoned: {r2:?}");
        assert!(r2.event.contains("kn_expires"), "{case}: a poisoned route expires");
        let reason = r2.event.get_str("kn_poisoned").unwrap_or_default();
        assert!(reason.starts_with("bad topic name '") && reason.contains(why), "{case}: {reason}");
        let topics: Vec<String> = store.topics().unwrap().iter().map(|t| t.to_string()).collect();
        assert!(!topics.iter().any(|t| t.contains("flurb") || t.contains("knwhat") || t.starts_with("/what/a")), "{case}: delivered: {topics:?}");

        let again = simple_post(&pool, "kn_to=/what/other&kn_payload=again&kn_id=e2");
        assert_eq!(String::from_utf8_lossy(again.payload()), "Wrote to '/what/other' (e2)\n", "{case}: poisoned once");
    }
}

/// KN_FORWARD_INLINE under CGI: a notify to a topic with more routes is
/// answered once its event is stored (one `Wrote to` line), and the child
/// that outlives the CGI process forwards it right after: every
/// destination gets it.
#[test]
fn a_fan_out_past_forward_inline_is_answered_first_and_forwarded_by_the_child() {
    let pool = Pool::new("forward-inline");
    for i in 0..3 {
        let reply = post(&pool, &format!("do_method=route&kn_from=/what/fan&kn_to=/what/copy{i}&kn_response_format=simple"));
        assert_eq!(reply.status(), "200 Routed", "{}", reply.text());
    }
    let reply = pool.cgi().env("KN_FORWARD_INLINE", "2").post("kn_to=/what/fan&kn_id=fanned&kn_payload=x&kn_response_format=simple").run();
    assert_eq!(reply.status(), "200 Notified");
    let event = reply.event();
    let payload = String::from_utf8_lossy(event.payload()).into_owned();
    assert_eq!(payload.matches("Wrote to '").count(), 1, "{payload}");
    let store = pool.store();
    let arrived = |i: usize| {
        let topic = kn_journal::Topic::parse(&format!("/what/copy{i}")).unwrap();
        store.events(&topic, &kn_journal::Selection::all()).map(|s| s.events.iter().any(|e| e.id() == Some(&b"fanned"[..]))).unwrap_or(false)
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !(0..3).all(arrived) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!((0..3).all(arrived), "every route's destination has the event");
    // At the limit: the copies are written before the answer and listed.
    let reply = pool.cgi().env("KN_FORWARD_INLINE", "3").post("kn_to=/what/fan&kn_id=inline&kn_payload=y&kn_response_format=simple").run();
    let event = reply.event();
    let payload = String::from_utf8_lossy(event.payload()).into_owned();
    assert_eq!(payload.matches("Wrote to '").count(), 4, "{payload}");
}
