//! Running as a CGI program: one request from the environment and stdin,
//! one response on stdout.

use std::io::Write;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use kn_journal::{Config, Store};

use crate::format::{status_event, Format, Page};
use crate::handler::{Handler, Options, Reply};
use crate::request::{Limits, Request};
use crate::response::Response;

/// Where the event store of a CGI process is: `KN_EVENTS` (set with
/// Apache's `SetEnv`), else `../kn_events` beside the script's directory,
/// as the original laid it out.
pub fn store_root() -> PathBuf {
    if let Some(root) = std::env::var_os("KN_EVENTS") {
        return PathBuf::from(root);
    }
    let script = std::env::var_os("SCRIPT_FILENAME").map(PathBuf::from).or_else(|| std::env::current_exe().ok());
    match script.as_ref().and_then(|s| s.parent()).and_then(|d| d.parent()) {
        Some(dir) => dir.join("kn_events"),
        None => PathBuf::from("kn_events"),
    }
}

/// The largest request body read: enough for the largest event plus its
/// encoding overhead.
fn limits(config: &Config) -> Limits {
    Limits::new().with_max_body((config.max_event_bytes as u64).saturating_mul(3).max(1 << 20))
}

/// Serves the one request of this CGI process. Never reads the command
/// line: a web server passes a query string without `=` as arguments
/// (RFC 3875's search-string rule), and those are not orders.
pub fn main() -> ExitCode {
    // stdout as a plain file: one write per one-shot response, no line
    // buffering splitting it.
    let mut out = match std::io::stdout().as_fd().try_clone_to_owned() {
        Ok(fd) => std::fs::File::from(fd),
        Err(_) => return ExitCode::FAILURE,
    };
    let config = match Config::new(store_root()).with_env() {
        Ok(c) => c,
        Err(err) => return fail(&mut out, 500, "Server misconfigured", &err.to_string()),
    };
    let request = match Request::from_process(&limits(&config)) {
        Ok(r) => r,
        Err(err) => {
            let (code, reason) = err.status();
            let exit = fail(&mut out, code, reason, err.message());
            drain_unread_body();
            return exit;
        }
    };
    let mut config = config;
    if config.server_url.is_none() {
        // KN_SERVER_URL, when set, names the server; else the URL this
        // request reached us by.
        config.server_url = Some(request.server_url().to_string());
    }
    let store = match Store::open_with(config) {
        Ok(s) => Arc::new(s),
        Err(err) => return fail(&mut out, 500, "Event store unavailable", err.message()),
    };
    let handler = Handler::new(store.clone(), Options::default());
    let result = match handler.handle(&request) {
        Reply::Done(response) => {
            let written = response.write_to(&mut out);
            if !request.method().is_supported() {
                drain_unread_body();
            }
            written
        }
        Reply::Tunnel(mut tunnel) => {
            let _ = tunnel.run(&store, &mut out);
            // The response of a tunnel ends only when this process exits
            // (no Content-Length): leave at once, without waiting on
            // destructors such as the change notifier's thread (stdout is
            // unbuffered; every event was stored before it was sent).
            std::process::exit(0);
        }
    };
    // A failed write means the client went away: nothing left to do.
    let _ = result;
    ExitCode::SUCCESS
}

/// Reads and discards the request body a reply left unread (a body over
/// the limit, or the body of a PUT), for at most two seconds and at most
/// `CONTENT_LENGTH` bytes. Under Apache's mod_cgid the CGI's stdin and
/// stdout are one socket: exiting with request bytes unread resets it and
/// the reply already written is lost. Nothing read is kept in memory.
fn drain_unread_body() {
    use std::io::Read;
    let length: u64 = std::env::var("CONTENT_LENGTH").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(0);
    if length == 0 {
        return;
    }
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock().take(length), &mut std::io::sink());
        let _ = done.send(());
    });
    let _ = finished.recv_timeout(std::time::Duration::from_secs(2));
}

/// Answers a request that could not even be parsed, in the `js` format.
fn fail(out: &mut impl Write, code: u16, reason: &str, message: &str) -> ExitCode {
    // The same server URL as every other page (port included), so the
    // help link of a 4xx works.
    let url = crate::request::process_server_url();
    let status = status_event(code, reason, message, None);
    if let Ok(response) = Response::events(Format::Js, &Page::new(url), &[status]) {
        let _ = response.write_to(out);
    }
    ExitCode::SUCCESS
}
