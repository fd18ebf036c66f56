//! `pubsub-cgi serve --access-log FILE` (src/access_log.rs): one Common
//! Log Format line per request, with no credential in it, and no request
//! able to forge a line; and what `serve` says when it starts.

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use kn_test_support::raw::Conn;
use kn_test_support::{wait_for, Serve};

fn start(args: &[&str], env: &[(&str, &str)]) -> (Serve, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut command: Command = Serve::command_of(Path::new(env!("CARGO_BIN_EXE_pubsub-cgi")), &dir.path().join("events"), None);
    command.args(args).current_dir(dir.path()).env_remove("KN_ACCESS_LOG").env_remove("KN_ACCESS_LOG_QUEUE").envs(env.iter().copied());
    (Serve::spawn(command), dir)
}

fn log_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_string).collect()
}

/// Sends `raw` bytes as one request and reads until the server closes.
fn send_raw(addr: &str, raw: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.write_all(raw).unwrap();
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    out
}

/// `peer - - [date] "request" status size`, every byte printable ASCII.
fn assert_clf(line: &str) {
    assert!(line.bytes().all(|b| (0x20..0x7f).contains(&b)), "not printable: {line:?}");
    assert!(is_clf(line), "not the Common Log Format: {line:?}");
}

/// The shape of a CLF line: three fields,
/// a bracketed date, a quoted request with exactly two quotes, a status
/// and a size.
fn is_clf(line: &str) -> bool {
    let Some((head, rest)) = line.split_once(" [") else { return false };
    let Some((date, rest)) = rest.split_once("] \"") else { return false };
    let Some((request, tail)) = rest.rsplit_once("\" ") else { return false };
    let fields: Vec<&str> = head.split(' ').collect();
    let tail: Vec<&str> = tail.split(' ').collect();
    fields.len() == 3
        && fields[1] == "-"
        && date.len() == 26
        && date.ends_with(" +0000")
        && !request.contains('"')
        && tail.len() == 2
        && tail[0].len() == 3
        && tail[0].bytes().all(|b| b.is_ascii_digit())
        && (tail[1] == "-" || tail[1].bytes().all(|b| b.is_ascii_digit()))
}

#[test]
fn the_access_log_never_holds_a_token_session_or_authorization() {
    let (serve, dir) = start(&["--access-log", "access.log"], &[]);
    let log: PathBuf = dir.path().join("access.log");
    let mut stream = TcpStream::connect(serve.addr()).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let request = format!(
        "GET /kn?do_method=whoami&kn_token=SECRET1&kn%5Ftoken=SECRET2;kn_session=SECRET3&kn_response_format=simple HTTP/1.1\r\n\
         Host: {}\r\nCookie: kn_session=SECRET4; kn_token=SECRET5\r\nAuthorization: Bearer SECRET6\r\nUser-Agent: SECRET7\r\n\r\n",
        serve.addr()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut conn = Conn::new(stream, serve.addr());
    let _ = conn.reply();
    let mut conn = Conn::connect(serve.addr(), Duration::from_secs(10));
    conn.send("GET", "/kn?do_method=help", b"");
    let help = conn.reply();
    assert!(wait_for(Duration::from_secs(10), || log_lines(&log).len() >= 2), "log: {:?}", log_lines(&log));
    let text = std::fs::read_to_string(&log).unwrap();
    for secret in ["SECRET1", "SECRET2", "SECRET3", "SECRET4", "SECRET5", "SECRET6", "SECRET7"] {
        assert!(!text.contains(secret), "{secret} in the access log:\n{text}");
    }
    let lines = log_lines(&log);
    assert_eq!(lines.len(), 2, "{text}");
    lines.iter().for_each(|l| assert_clf(l));
    assert!(lines[0].starts_with("127.0.0.1 - - ["), "{}", lines[0]);
    assert!(lines[0].contains("\"GET /kn?do_method=whoami&kn_token=[redacted]&kn%5Ftoken=[redacted];kn_session=[redacted]&kn_response_format=simple HTTP/1.1\""), "{}", lines[0]);
    let size = help.body.len();
    assert!(size > 0 && help.header("content-length") == Some(size.to_string().as_str()), "help has a length");
    assert!(lines[1].ends_with(&format!("\"GET /kn?do_method=help HTTP/1.1\" 200 {size}")), "{}", lines[1]);
}

#[test]
fn no_request_can_forge_an_access_log_line() {
    let (serve, dir) = start(&[], &[("KN_ACCESS_LOG", "access.log")]);
    let log = dir.path().join("access.log");
    let addr = serve.addr().to_string();
    // Raw control characters on the request line: the HTTP parser refuses
    // them (400) before anything is logged.
    for target in ["/kn?x=1\r127.0.0.1 - - [forged]", "/kn?x=\x1b[2J", "/kn?x=\x00", "/kn?x=\x7f", "/kn?q=\"forged\""] {
        let reply = send_raw(&addr, format!("GET {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes());
        assert!(reply.starts_with(b"HTTP/1.1 400"), "{target:?}: {}", String::from_utf8_lossy(&reply));
    }
    // Encoded ones, a backslash and bytes beyond ASCII reach the log,
    // escaped.
    let target = "/kn?x=%0D%0A127.0.0.1%20-%20-%20[forged]&q=\\&u=\u{3ba}";
    let reply = send_raw(&addr, format!("GET {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes());
    assert!(!reply.is_empty());
    assert!(wait_for(Duration::from_secs(10), || !log_lines(&log).is_empty()), "nothing logged");
    let lines = log_lines(&log);
    let text = lines.join("\n");
    assert_eq!(lines.len(), 1, "one request, one line:\n{text}");
    assert_clf(&lines[0]);
    assert!(lines[0].starts_with("127.0.0.1 - - ["), "{}", lines[0]);
    assert!(lines[0].contains("\"GET /kn?x=%0D%0A127.0.0.1%20-%20-%20[forged]&q=\\x5c&u=\\xce\\xba HTTP/1.1\" 400 "), "{}", lines[0]);
}

#[test]
fn no_access_log_unless_asked_and_a_bad_file_fails_at_start() {
    let (serve, dir) = start(&[], &[]);
    let mut conn = Conn::connect(serve.addr(), Duration::from_secs(10));
    conn.send("GET", "/kn?do_method=help", b"");
    let _ = conn.reply();
    let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(files, ["events"], "no file besides the store");
    let out = Command::new(env!("CARGO_BIN_EXE_pubsub-cgi"))
        .args(["serve", "--listen", "127.0.0.1:0", "--access-log", "/nonexistent/dir/access.log"])
        .env_remove("GATEWAY_INTERFACE")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot open the access log '/nonexistent/dir/access.log'"), "{stderr}");
}

#[test]
fn serve_announces_its_pages_as_well_as_kn() {
    let (mut serve, _dir) = start(&[], &[]);
    // The first line (read by Serve::spawn) names /kn; the next, the pages.
    let mut line = String::new();
    serve.stdout.read_line(&mut line).unwrap();
    assert_eq!(line, format!("knpubsub pages at {}/ (the chat, topic browser and ping pages)\n", serve.base));
}
