//! Durable Streams as a CGI program: `pubsub.cgi` mounted a second time
//! at `.../v1/stream` (docs/DURABLE-STREAMS.md).

use std::time::{Duration, Instant};

use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use kn_streams::Streams;

use super::*;

/// The stream path of a CGI request mounted with a second `ScriptAlias`
/// at `.../v1/stream` (`SCRIPT_NAME` ends with `/v1/stream`), or `None`.
pub fn cgi_path() -> Option<String> {
    let script = std::env::var("SCRIPT_NAME").ok()?;
    if !script.trim_end_matches('/').ends_with("/v1/stream") {
        return None;
    }
    let info = std::env::var("PATH_INFO").unwrap_or_default();
    Some(percent_decode(info.trim_start_matches('/')))
}

/// Serves one stream request as a CGI program, writing to `out`.
pub fn serve_cgi(config: kn_journal::Config, settings: kn_streams::StreamsConfig, path: String, out: &mut std::fs::File) -> std::io::Result<()> {
    use std::io::{Read, Write};
    if !settings.enabled {
        let _ = std::io::copy(&mut std::io::stdin().lock().take(DRAIN_BYTES), &mut std::io::sink());
        return out.write_all(&StreamResponse::text(404, OFF).to_cgi_bytes(false));
    }
    let env = |n: &str| std::env::var(n).ok();
    let mut headers = HeaderMap::new();
    for (k, v) in std::env::vars() {
        let name = if k == "CONTENT_TYPE" { "content-type".to_owned() } else if let Some(n) = k.strip_prefix("HTTP_") { n.replace('_', "-").to_ascii_lowercase() } else { continue };
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(&v)) {
            headers.append(n, v);
        }
    }
    let method = env("REQUEST_METHOD").unwrap_or_default();
    let announced: Option<usize> = env("CONTENT_LENGTH").and_then(|v| v.trim().parse().ok());
    let length = announced.unwrap_or(0);
    let max = settings.max_append_bytes;
    let mut body = Vec::with_capacity(length.min(max));
    // CONTENT_LENGTH bytes; without it, a PUT or POST may carry a chunked
    // body that the web server passes on until end of input; other
    // methods carry none (reading would wait for the server to close).
    let wanted = match announced {
        Some(n) => (n as u64).min(max as u64 + 1),
        None if method == "PUT" || method == "POST" => max as u64 + 1,
        None => 0,
    };
    std::io::stdin().lock().take(wanted).read_to_end(&mut body)?;
    if body.len() > max || length > max {
        // Read the rest (up to DRAIN_BYTES) so the web server can send
        // the answer rather than a reset.
        let _ = std::io::copy(&mut std::io::stdin().lock().take(DRAIN_BYTES), &mut std::io::sink());
        let e = StreamError::new(StreamErrorKind::TooLarge, format!("the body is larger than the limit of {max} bytes"));
        return out.write_all(&failure(&e).to_cgi_bytes(false));
    }
    let host = env("HTTP_HOST").unwrap_or_else(|| format!("{}:{}", env("SERVER_NAME").unwrap_or_default(), env("SERVER_PORT").unwrap_or_default()));
    let scheme = if env("HTTPS").is_some_and(|v| v.eq_ignore_ascii_case("on")) { "https" } else { "http" };
    let url = format!("{scheme}://{host}{}{}", env("SCRIPT_NAME").unwrap_or_default(), env("PATH_INFO").unwrap_or_default());
    let user = env("REMOTE_USER").filter(|u| !u.is_empty());
    let req = StreamRequest { method: method.clone(), path, query: env("QUERY_STRING").unwrap_or_default(), headers, body, url, user };
    let store = kn_journal::Store::open_with(config).map_err(|e| std::io::Error::other(e.to_string()))?;
    let streams = Streams::new(std::sync::Arc::new(store)).with_config(settings);
    let head = method == "HEAD";
    match handle(&streams, &req) {
        Outcome::Done(r) => out.write_all(&r.to_cgi_bytes(head)),
        Outcome::Wait(poll) => {
            let watch = streams.watch(poll.path()).ok();
            loop {
                if let Some(r) = poll.poll(&streams) {
                    return out.write_all(&r.to_cgi_bytes(head));
                }
                let left = poll.deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return out.write_all(&poll.timeout(&streams).to_cgi_bytes(head));
                }
                match &watch {
                    Some(w) => w.wait(left),
                    None => std::thread::sleep(left.min(Duration::from_millis(100))),
                }
            }
        }
        Outcome::Sse(mut sse) => {
            out.write_all(&sse.head.cgi_head(None))?;
            let watch = streams.watch(sse.path()).ok();
            let mut written = Instant::now();
            loop {
                let (bytes, finished) = sse.step(&streams);
                if !bytes.is_empty() {
                    out.write_all(&bytes)?;
                    written = Instant::now();
                } else if written.elapsed() >= SSE_KEEPALIVE {
                    // A CGI learns that its client left only by writing:
                    // a comment (ignored by SSE clients) every second, so
                    // that an abandoned response ends within about a
                    // second instead of holding a process and a server
                    // worker until `StreamsConfig::sse_max_time`.
                    out.write_all(b":\n\n")?;
                    written = Instant::now();
                }
                if finished {
                    return Ok(());
                }
                if !bytes.is_empty() && sse.behind(&streams) {
                    continue;
                }
                let left = sse.deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(());
                }
                let nap = left.min(SSE_KEEPALIVE);
                match &watch {
                    Some(w) => w.wait(nap),
                    None => std::thread::sleep(nap.min(Duration::from_millis(100))),
                }
            }
        }
    }
}

