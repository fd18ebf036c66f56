//! `hello-cgi`: the smallest CGI program that does what `notify` must do.
//!
//! It reads the request body exactly as `pubsub.cgi` must (`CONTENT_LENGTH`
//! bytes from standard input, no more, no less) and answers with one small
//! response, headers and body in a single `write`. Benchmarks (see
//! `bench/cgi-bench.sh`) use it as the floor: the cost of a CGI request
//! through the web server with nothing else done, against which
//! `pubsub.cgi` is measured.
//!
//! The response body is `hello <n>\n`, where `<n>` is the number of body
//! bytes read, so that tests can prove the body really arrived.

use std::io::{self, Read, Write};
use std::process::ExitCode;

fn main() -> ExitCode {
    let want = content_length();
    let got = match read_body(want) {
        Ok(n) => n,
        Err(err) => return reply("500 Internal Server Error", &format!("body: {err}\n")),
    };
    if got != want {
        // A short body means the client or server gave up mid-request; a CGI
        // must not treat half a form as a whole one.
        return reply(
            "400 Bad Request",
            &format!("short body: {got} of {want} bytes\n"),
        );
    }
    reply("200 OK", &format!("hello {got}\n"))
}

/// The announced body length; absent or malformed means no body (RFC 3875
/// 4.1.2: the server sets it whenever there is a body).
fn content_length() -> u64 {
    std::env::var("CONTENT_LENGTH")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Reads exactly `want` bytes (fewer only at end of input) and returns how
/// many arrived. Reading past `CONTENT_LENGTH` would block on servers that
/// keep the pipe open, so the read is bounded.
fn read_body(want: u64) -> io::Result<u64> {
    let mut buf = [0u8; 16 * 1024];
    let mut stdin = io::stdin().lock().take(want);
    let mut got = 0u64;
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => return Ok(got),
            Ok(n) => got += n as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Writes the whole response with one `write` so that the web server sees
/// headers and body together, as a well-behaved fast CGI would.
fn reply(status: &str, body: &str) -> ExitCode {
    let response = format!(
        "Status: {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut out = io::stdout().lock();
    match out.write_all(response.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::FAILURE,
    }
}
