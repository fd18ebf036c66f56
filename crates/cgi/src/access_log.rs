//! `serve`'s access log, off unless asked for (`--access-log FILE|-`,
//! `KN_ACCESS_LOG`): one line per request in the Common Log Format of
//! Apache and nginx, so that the usual tools read it:
//!
//! ```text
//! 127.0.0.1 - - [07/Dec/2026:18:40:02 +0000] "GET /kn?do_method=help HTTP/1.1" 200 5123
//! ```
//!
//! What it never writes: the value of a query parameter that carries a
//! credential (`kn_token`, and any parameter whose name speaks of a token,
//! session, password, secret or key: written `name=[redacted]`), and no
//! header at all (so neither `Authorization` nor a cookie). Every byte
//! outside printable ASCII, and `"` and `\`, is written `\xHH`, so that
//! no request can end a line or a quoted field early: one request, one
//! line. (A request line with a raw control character never gets this
//! far: the HTTP parser refuses it, `400`.)
//!
//! A line is written when the answer's head is ready (a tunnel's, when it
//! opens); its size is the body's length when known (a tunnel's is not:
//! `-`). Writing happens on
//! a thread of its own, behind a queue of `KN_ACCESS_LOG_QUEUE` lines
//! (default [`DEFAULT_QUEUE`]): a slow disk never holds up the event loop,
//! and past a full queue lines are dropped and counted (the writer says
//! how many on stderr).

use std::fs::OpenOptions;
use std::io::{BufWriter, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Lines waiting for the writer at most, by default.
pub const DEFAULT_QUEUE: usize = 4096;

/// Where the log goes and how many lines may wait.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessLogConfig {
    /// A file to append to (created `0640`), or `-` for standard output.
    pub target: String,
    /// Lines waiting for the writer at most (`KN_ACCESS_LOG_QUEUE`).
    pub queue: usize,
}

/// An open access log: [`AccessLog::record`] queues a line, a thread
/// writes them.
pub struct AccessLog {
    lines: SyncSender<String>,
    dropped: Arc<AtomicU64>,
}

impl AccessLog {
    /// Opens the log (the file, at once, so that a bad path fails at
    /// start) and starts its writer.
    pub fn open(config: &AccessLogConfig) -> Result<AccessLog, String> {
        let out: Box<dyn Write + Send> = if config.target == "-" {
            Box::new(std::io::stdout())
        } else {
            use std::os::unix::fs::OpenOptionsExt;
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o640)
                .open(&config.target)
                .map_err(|e| format!("cannot open the access log '{}': {e}", config.target))?;
            Box::new(file)
        };
        let (log, lines) = AccessLog::queue(config.queue);
        let dropped = log.dropped.clone();
        std::thread::Builder::new()
            .name("kn-access-log".into())
            .spawn(move || write_lines(lines, out, &dropped))
            .map_err(|e| format!("cannot start the access log's writer: {e}"))?;
        Ok(log)
    }

    /// The log's queue of `capacity` lines (at least 1), and its receiving end.
    fn queue(capacity: usize) -> (AccessLog, Receiver<String>) {
        let (lines, rx) = sync_channel(capacity.max(1));
        (AccessLog { lines, dropped: Arc::new(AtomicU64::new(0)) }, rx)
    }

    /// Queues `line` (a complete line, newline included) without waiting;
    /// when the queue is full the line is dropped and counted.
    pub fn record(&self, line: String) {
        if let Err(TrySendError::Full(_)) = self.lines.try_send(line) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Lines dropped so far because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

impl std::fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessLog").field("dropped", &self.dropped()).finish_non_exhaustive()
    }
}

impl AccessLog {
    /// What the line of `request` from `peer` needs, taken before the
    /// request is answered (and consumed).
    pub fn entry<B>(&self, request: &hyper::Request<B>, peer: SocketAddr) -> Entry<'_> {
        let target = request.uri().path_and_query().map_or_else(|| request.uri().path().to_owned(), |pq| pq.as_str().to_owned());
        let time = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
        Entry { log: self, peer: peer.ip(), time, method: request.method().to_string(), target, version: format!("{:?}", request.version()) }
    }
}

/// One request on its way: [`Entry::answered`] writes its line.
pub struct Entry<'a> {
    log: &'a AccessLog,
    peer: IpAddr,
    time: i64,
    method: String,
    target: String,
    version: String,
}

impl Entry<'_> {
    /// Queues the line, with the answer's status and size (its
    /// `Content-Length`, else its body's exact size when known).
    pub fn answered<B: hyper::body::Body>(self, reply: &hyper::Response<B>) {
        let size = reply
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .or_else(|| reply.body().size_hint().exact());
        self.log.record(line(self.peer, self.time, &self.method, &self.target, &self.version, reply.status().as_u16(), size));
    }
}

/// The writer: each line as it comes, flushed whenever the queue is empty.
fn write_lines(lines: Receiver<String>, out: Box<dyn Write + Send>, dropped: &AtomicU64) {
    let mut out = BufWriter::new(out);
    let mut told = 0;
    while let Ok(line) = lines.recv() {
        let mut next = Some(line);
        while let Some(line) = next {
            if out.write_all(line.as_bytes()).is_err() {
                return;
            }
            next = lines.try_recv().ok();
        }
        let _ = out.flush();
        let now = dropped.load(Ordering::Relaxed);
        if now > told {
            eprintln!("pubsub-cgi serve: access log: {} line(s) dropped (queue full: KN_ACCESS_LOG_QUEUE)", now - told);
            told = now;
        }
    }
}

/// One request's line, in the Common Log Format: `peer - - [time]
/// "METHOD TARGET VERSION" status size`, where `time` is seconds since the
/// epoch (shown in UTC) and `target` the request target as received,
/// credentials redacted.
pub fn line(peer: IpAddr, time: i64, method: &str, target: &str, version: &str, status: u16, size: Option<u64>) -> String {
    let mut request = String::with_capacity(method.len() + target.len() + version.len() + 2);
    escape(method, &mut request);
    request.push(' ');
    escape(&redacted(target), &mut request);
    request.push(' ');
    escape(version, &mut request);
    let size = size.map_or_else(|| "-".to_owned(), |n| n.to_string());
    format!("{peer} - - [{}] \"{request}\" {status} {size}\n", clf_time(time))
}

/// True for a parameter name (decoded) that may carry a credential.
fn is_credential(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["token", "session", "passw", "secret", "key", "auth", "credential", "signature"].iter().any(|word| name.contains(word))
}

/// `target` with the value of every credential parameter of its query
/// replaced by `[redacted]` (names are compared decoded, so that
/// `kn%5Ftoken` is caught too; `&` and `;` both separate parameters, as for
/// the protocol).
fn redacted(target: &str) -> String {
    let Some((path, query)) = target.split_once('?') else { return target.to_owned() };
    let mut out = String::with_capacity(target.len());
    out.push_str(path);
    out.push('?');
    let mut rest = query;
    loop {
        let end = rest.find(['&', ';']).unwrap_or(rest.len());
        let pair = &rest[..end];
        let name = pair.split_once('=').map_or(pair, |(name, _)| name);
        let decoded = percent_encoding::percent_decode_str(&name.replace('+', " ")).decode_utf8_lossy().into_owned();
        if is_credential(&decoded) {
            out.push_str(name);
            out.push_str("=[redacted]");
        } else {
            out.push_str(pair);
        }
        match rest[end..].chars().next() {
            Some(separator) => {
                out.push(separator);
                rest = &rest[end + 1..];
            }
            None => return out,
        }
    }
}

/// Appends `text` with `"`, `\` and every byte outside printable ASCII
/// written `\xHH`.
fn escape(text: &str, out: &mut String) {
    for &b in text.as_bytes() {
        if (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\' {
            out.push(b as char);
        } else {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
}

/// `07/Dec/2026:18:40:02 +0000` for seconds since the epoch (UTC, from
/// the C library's `gmtime_r`).
fn clf_time(secs: i64) -> String {
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    // SAFETY: gmtime_r writes only into the `tm` given; a zeroed `tm` is a
    // valid value of the plain C struct.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let t: libc::time_t = secs as libc::time_t;
    if unsafe { libc::gmtime_r(&t, &mut tm) }.is_null() {
        return "01/Jan/1970:00:00:00 +0000".to_owned();
    }
    let month = MONTHS.get(tm.tm_mon as usize).copied().unwrap_or("Jan");
    format!("{:02}/{month}/{:04}:{:02}:{:02}:{:02} +0000", tm.tm_mday, tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local() -> IpAddr {
        IpAddr::from([127, 0, 0, 1])
    }

    #[test]
    fn a_line_is_the_common_log_format() {
        let line = line(local(), 1_796_668_802, "GET", "/kn?do_method=help", "HTTP/1.1", 200, Some(5123));
        assert_eq!(line, "127.0.0.1 - - [07/Dec/2026:18:40:02 +0000] \"GET /kn?do_method=help HTTP/1.1\" 200 5123\n");
        let line = super::line(local(), 0, "GET", "/kn/who/me/kn_journal", "HTTP/1.0", 200, None);
        assert_eq!(line, "127.0.0.1 - - [01/Jan/1970:00:00:00 +0000] \"GET /kn/who/me/kn_journal HTTP/1.0\" 200 -\n");
    }

    #[test]
    fn credentials_in_the_query_are_redacted() {
        let target = "/kn?kn_token=SECRET&kn_to=/what/chat;kn%5Ftoken=SECRET2&my_session=S3&x=1&api_key=K&kn_payload=token";
        let got = redacted(target);
        for secret in ["SECRET", "SECRET2", "S3", "=K"] {
            assert!(!got.contains(secret), "{secret} in {got}");
        }
        assert_eq!(
            got,
            "/kn?kn_token=[redacted]&kn_to=/what/chat;kn%5Ftoken=[redacted]&my_session=[redacted]&x=1&api_key=[redacted]&kn_payload=token"
        );
        assert_eq!(redacted("/kn?kn_token"), "/kn?kn_token=[redacted]");
        assert_eq!(redacted("/kn?a=1&"), "/kn?a=1&");
        assert_eq!(redacted("/kn"), "/kn");
    }

    #[test]
    fn no_byte_can_end_the_line_or_the_quoted_request() {
        let line = line(local(), 0, "GET", "/kn?x=\r\n127.0.0.1 - - [forged] \"GET / HTTP/1.1\" 200 1\u{85}\\", "HTTP/1.1", 200, None);
        assert_eq!(line.matches('\n').count(), 1, "{line}");
        assert!(line.ends_with('\n') && line.bytes().all(|b| b == b'\n' || (0x20..0x7f).contains(&b)), "{line}");
        // Only the request's own two quotes remain.
        assert_eq!(line.matches('"').count(), 2, "{line}");
        assert!(line.contains("\\x0d\\x0a127.0.0.1 - - [forged] \\x22GET / HTTP/1.1\\x22 200 1\\xc2\\x85\\x5c"), "{line}");
    }

    #[test]
    fn a_full_queue_drops_and_counts_at_its_boundary() {
        // No writer: the queue alone.
        let (log, lines) = AccessLog::queue(3);
        for n in 0..3 {
            log.record(format!("{n}\n"));
        }
        assert_eq!(log.dropped(), 0, "three lines fit a queue of three");
        log.record("3\n".into());
        assert_eq!(log.dropped(), 1, "the fourth is dropped");
        assert_eq!(lines.try_iter().collect::<Vec<_>>(), ["0\n", "1\n", "2\n"]);
        log.record("4\n".into());
        assert_eq!(log.dropped(), 1, "room again once the writer took them");
    }
}
