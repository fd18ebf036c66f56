//! `tunnel-latency`: notify-to-tunnel latency of a PubSub server.
//!
//! ```text
//! tunnel-latency URL [--count N] [--warmup W] [--via-route | --both]
//! ```
//!
//! `URL` is the server's `/kn` base (`http://127.0.0.1:8080/kn`, or a
//! CGI's or a proxy's `/kn` under Apache). The tool opens a tunnel in the
//! `simple` format on a fresh journal (`/bench/lat/<random>/kn_journal`,
//! an HTTP/1.0 GET, so that the body arrives raw), waits for its
//! `200 Watching topic` frame, then `W` unrecorded and `N` recorded times
//! posts a notify whose payload is a sequence number, over one keep-alive
//! HTTP/1.1 connection, and measures the time from just before the notify is
//! written to the moment the tunnel frame carrying that payload has been
//! read (a reader thread timestamps each frame as it is parsed).
//!
//! By default the notify goes straight to the journal (`direct`). With
//! `--via-route` it goes to a source topic routed into the journal (the route
//! is created first with `do_method=route`): the path of a browser's
//! subscription. `--both` measures both, direct first. Output, one line per
//! mode, times in milliseconds:
//!
//! ```text
//! direct n=300 p50=0.912 p90=1.204 p99=2.310 max=3.004 mean=0.97 ms
//! ```
//!
//! Only std: no client library, so that nothing but the server is measured.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::ExitCode;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long one notify may take to show up in the tunnel.
const FRAME_TIMEOUT: Duration = Duration::from_secs(10);

struct Url {
    /// `host:port`, for connecting and for `Host:`.
    authority: String,
    /// The path of the `/kn` base, without a trailing `/`.
    path: String,
}

fn parse_url(url: &str) -> Result<Url, String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| format!("'{url}': only http:// URLs"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let authority = if authority.contains(':') { authority.to_string() } else { format!("{authority}:80") };
    Ok(Url { authority, path: path.trim_end_matches('/').to_string() })
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Direct,
    Routed,
}

struct Args {
    url: String,
    count: usize,
    warmup: usize,
    modes: Vec<Mode>,
}

const USAGE: &str = "usage: tunnel-latency URL [--count N] [--warmup W] [--via-route | --both]";

fn parse_args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let (mut url, mut count, mut warmup, mut modes) = (None, 300, 20, vec![Mode::Direct]);
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> Result<usize, String> {
            let v = args.next().ok_or(format!("{name} needs a value"))?;
            v.parse().map_err(|_| format!("{name}: '{v}' is not a number"))
        };
        match arg.as_str() {
            "--count" | "-n" => count = number("--count")?,
            "--warmup" | "-w" => warmup = number("--warmup")?,
            "--via-route" => modes = vec![Mode::Routed],
            "--both" => modes = vec![Mode::Direct, Mode::Routed],
            "-h" | "--help" => return Err(USAGE.into()),
            _ if arg.starts_with('-') => return Err(format!("unknown option {arg}\n{USAGE}")),
            _ if url.is_none() => url = Some(arg),
            _ => return Err(format!("unexpected argument {arg}\n{USAGE}")),
        }
    }
    let url = url.ok_or(USAGE)?;
    if count == 0 {
        return Err("--count must be at least 1".into());
    }
    Ok(Args { url, count, warmup, modes })
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(msg) => {
            eprintln!("{msg}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("tunnel-latency: {err}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    let url = parse_url(&args.url)?;
    let nonce = {
        let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        format!("{:x}{:x}", t.as_nanos() & 0xffff_ffff_ffff, std::process::id())
    };
    let base = format!("/bench/lat/{nonce}");
    let journal = format!("{base}/kn_journal");
    let source = format!("{base}/src");

    let frames = open_tunnel(&url, &journal)?;
    let mut client = Client::new(&url.authority, &url.path);
    if args.modes.contains(&Mode::Routed) {
        let (status, body) = client.post(&format!("do_method=route&kn_from={source}&kn_to={journal}&kn_response_format=simple"))?;
        if status != 200 {
            return Err(format!("creating the route answered {status}: {}", String::from_utf8_lossy(&body).trim()));
        }
    }

    let mut seq = 0u64;
    for &mode in &args.modes {
        let to = if mode == Mode::Direct { &journal } else { &source };
        let mut samples = Vec::with_capacity(args.count);
        for i in 0..args.warmup + args.count {
            seq += 1;
            let start = Instant::now();
            let (status, body) = client.post(&format!("kn_to={to}&kn_payload={seq}&kn_response_format=simple"))?;
            if status != 200 {
                return Err(format!("notify answered {status}: {}", String::from_utf8_lossy(&body).trim()));
            }
            let arrived = wait_for(&frames, seq)?;
            if i >= args.warmup {
                samples.push(arrived.saturating_duration_since(start));
            }
        }
        let name = if mode == Mode::Direct { "direct" } else { "routed" };
        println!("{}", summary(name, &mut samples));
    }
    Ok(())
}

fn summary(name: &str, samples: &mut [Duration]) -> String {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    // Nearest rank.
    let pct = |p: f64| ms(samples[((p / 100.0 * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1]);
    let mean = samples.iter().map(|&d| ms(d)).sum::<f64>() / samples.len() as f64;
    format!(
        "{name} n={} p50={:.3} p90={:.3} p99={:.3} max={:.3} mean={mean:.3} ms",
        samples.len(),
        pct(50.0),
        pct(90.0),
        pct(99.0),
        ms(*samples.last().unwrap()),
    )
}

/// Waits until the frame whose payload is `seq` arrives; returns when it was read.
fn wait_for(frames: &mpsc::Receiver<Result<(u64, Instant), String>>, seq: u64) -> Result<Instant, String> {
    let deadline = Instant::now() + FRAME_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match frames.recv_timeout(left) {
            Ok(Ok((n, at))) if n == seq => return Ok(at),
            Ok(Ok((n, _))) if n > seq => return Err(format!("the tunnel skipped event {seq} (got {n})")),
            Ok(Ok(_)) => continue, // an older one, e.g. a duplicate
            Ok(Err(err)) => return Err(err),
            Err(mpsc::RecvTimeoutError::Timeout) => return Err(format!("event {seq} did not reach the tunnel within {FRAME_TIMEOUT:?}")),
            Err(mpsc::RecvTimeoutError::Disconnected) => return Err("the tunnel reader stopped".into()),
        }
    }
}

// ----- the tunnel ------------------------------------------------------------

/// A tunnel's frames as a reader thread reads them: each numeric payload
/// with the instant it was read, or why reading stopped.
type Frames = mpsc::Receiver<Result<(u64, Instant), String>>;

/// Opens the tunnel, waits for `200 Watching topic`, then hands its frames'
/// numeric payloads, with the instant each was read, to a reader thread's
/// channel.
fn open_tunnel(url: &Url, journal: &str) -> Result<Frames, String> {
    let stream = TcpStream::connect(&url.authority).map_err(|e| format!("connecting to {}: {e}", url.authority))?;
    stream.set_nodelay(true).ok();
    let request = format!(
        "GET {}{journal}?do_method=route&kn_response_format=simple HTTP/1.0\r\nHost: {}\r\nUser-Agent: tunnel-latency\r\n\r\n",
        url.path, url.authority
    );
    (&stream).write_all(request.as_bytes()).map_err(|e| format!("tunnel request: {e}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(30))).ok();
    let mut reader = BufReader::with_capacity(64 * 1024, stream);
    let (status, headers) = read_head(&mut reader).map_err(|e| format!("tunnel response: {e}"))?;
    if status != 200 {
        let mut body = Vec::new();
        let _ = reader.take(2000).read_to_end(&mut body);
        return Err(format!("the tunnel answered {status}: {}", String::from_utf8_lossy(&body).trim()));
    }
    if header(&headers, "transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
        return Err("the tunnel came back chunked to an HTTP/1.0 request".into());
    }
    // The first frame is the tunnel's status.
    loop {
        let (head, _) = read_frame(&mut reader).map_err(|e| format!("tunnel: {e}"))?;
        let head = String::from_utf8_lossy(&head);
        if let Some(line) = head.lines().find(|l| l.starts_with("status: ")) {
            if line == "status: 200 Watching topic" {
                break;
            }
            return Err(format!("the tunnel said '{line}'"));
        }
    }
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || loop {
        let frame = read_frame(&mut reader);
        let at = Instant::now();
        let sent = match frame {
            Ok((_, payload)) => match std::str::from_utf8(&payload).ok().and_then(|p| p.parse::<u64>().ok()) {
                Some(n) => tx.send(Ok((n, at))),
                None => Ok(()), // not ours (a status event)
            },
            Err(err) => {
                let _ = tx.send(Err(format!("tunnel: {err}")));
                return;
            }
        };
        if sent.is_err() {
            return;
        }
    });
    Ok(rx)
}

/// Reads one `simple` frame: whitespace (the keep-alive spaces), `<count>\n`,
/// count bytes, `\n`. Returns the element lines and the payload.
fn read_frame(r: &mut impl BufRead) -> io::Result<(Vec<u8>, Vec<u8>)> {
    let mut count = 0usize;
    let mut digits = 0;
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the tunnel closed"));
        }
        let mut used = 0;
        let mut done = false;
        for &b in buf {
            used += 1;
            match b {
                b' ' | b'\t' | b'\r' | b'\n' if digits == 0 => {}
                b'0'..=b'9' if digits < 12 => {
                    count = count * 10 + usize::from(b - b'0');
                    digits += 1;
                }
                b'\n' => {
                    done = true;
                    break;
                }
                _ => return Err(io::Error::new(io::ErrorKind::InvalidData, format!("bad byte {b:#04x} in a frame count"))),
            }
        }
        r.consume(used);
        if done {
            break;
        }
    }
    let mut encoded = vec![0; count + 1];
    r.read_exact(&mut encoded)?;
    if encoded.pop() != Some(b'\n') {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "a frame does not end in a newline"));
    }
    // Element lines, a blank line, the payload.
    let split = if encoded.first() == Some(&b'\n') {
        0
    } else {
        encoded.windows(2).position(|w| w == b"\n\n").map(|i| i + 1).unwrap_or(encoded.len())
    };
    let payload = encoded.get(split + 1..).unwrap_or_default().to_vec();
    encoded.truncate(split);
    Ok((encoded, payload))
}

// ----- the notify client -------------------------------------------------------

/// One keep-alive HTTP/1.1 connection for POSTs, reopened when the server
/// closes it.
struct Client {
    authority: String,
    path: String,
    conn: Option<BufReader<TcpStream>>,
}

impl Client {
    fn new(authority: &str, path: &str) -> Client {
        Client { authority: authority.into(), path: if path.is_empty() { "/".into() } else { path.into() }, conn: None }
    }

    fn post(&mut self, body: &str) -> Result<(u16, Vec<u8>), String> {
        // A kept-alive connection may have been closed meanwhile: retry once
        // on a fresh one if the reused one fails.
        let reused = self.conn.is_some();
        match self.try_post(body) {
            Ok(r) => Ok(r),
            Err(_) if reused => {
                self.conn = None;
                self.try_post(body).map_err(|e| format!("POST to {}: {e}", self.authority))
            }
            Err(e) => Err(format!("POST to {}: {e}", self.authority)),
        }
    }

    fn try_post(&mut self, body: &str) -> io::Result<(u16, Vec<u8>)> {
        if self.conn.is_none() {
            let stream = TcpStream::connect(&self.authority)?;
            stream.set_nodelay(true)?;
            stream.set_read_timeout(Some(Duration::from_secs(30)))?;
            self.conn = Some(BufReader::with_capacity(16 * 1024, stream));
        }
        let conn = self.conn.as_mut().unwrap();
        let request = format!(
            "POST {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: tunnel-latency\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
            self.path,
            self.authority,
            body.len()
        );
        conn.get_mut().write_all(request.as_bytes())?;
        let result = read_response(conn);
        match &result {
            Ok((_, _, keep)) if *keep => {}
            _ => self.conn = None,
        }
        result.map(|(status, body, _)| (status, body))
    }
}

/// Status, body, and whether the connection stays open.
fn read_response(r: &mut BufReader<TcpStream>) -> io::Result<(u16, Vec<u8>, bool)> {
    let (status, headers) = read_head(r)?;
    let mut keep = !header(&headers, "connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
    let mut body = Vec::new();
    if header(&headers, "transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
        loop {
            let mut line = String::new();
            r.read_line(&mut line)?;
            let size = line.trim().split(';').next().unwrap_or("");
            let size = usize::from_str_radix(size, 16).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("bad chunk size '{}'", line.trim())))?;
            if size == 0 {
                // Trailers, up to the blank line.
                loop {
                    line.clear();
                    if r.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
                        break;
                    }
                }
                break;
            }
            let start = body.len();
            body.resize(start + size, 0);
            r.read_exact(&mut body[start..])?;
            line.clear();
            r.read_line(&mut line)?;
        }
    } else if let Some(len) = header(&headers, "content-length").and_then(|v| v.trim().parse::<usize>().ok()) {
        body.resize(len, 0);
        r.read_exact(&mut body)?;
    } else {
        r.read_to_end(&mut body)?;
        keep = false;
    }
    Ok((status, body, keep))
}

/// Reads a status line and headers; returns the status and `(name, value)` pairs.
fn read_head(r: &mut impl BufRead) -> io::Result<(u16, Vec<(String, String)>)> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the connection closed before a response"));
    }
    let keep_alive_10 = line.starts_with("HTTP/1.0");
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("bad status line '{}'", line.trim())))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the connection closed in the headers"));
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((name, value)) = l.split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        }
    }
    if keep_alive_10 && header(&headers, "connection").is_none() {
        // HTTP/1.0 without "Connection: keep-alive" closes after the response.
        headers.push(("connection".into(), "close".into()));
    }
    Ok((status, headers))
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}
