//! `pubsub-cgi serve` end to end: the real binary on a loopback port, spoken
//! to over raw HTTP/1.1 on `TcpStream`s, so every byte on the wire is seen.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kn_test_support::raw::{Conn, Reply, Tunnel};
use kn_test_support::{find, wait_exit, wait_for, Serve};

/// A running `pubsub-cgi serve` with its own store and static directory.
struct Server {
    serve: Serve,
    addr: String,
    dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Server {
        Server::start_with(&[])
    }

    fn start_with(env: &[(&str, &str)]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let www = dir.path().join("www");
        std::fs::create_dir_all(www.join("js")).unwrap();
        std::fs::write(www.join("index.html"), "<h1>knpubsub test index</h1>\n").unwrap();
        std::fs::write(www.join("js/app.js"), "var kn_test = 1;\n").unwrap();
        std::fs::write(www.join("notes.exe"), "MZ").unwrap();
        std::fs::write(dir.path().join("secret.txt"), "outside the static dir\n").unwrap();
        Server::launch(dir, Some(&www), env)
    }

    /// `serve` run in `dir` (its working directory and store), with
    /// `--static static_dir`, or without it to serve its built-in pages.
    fn launch(dir: tempfile::TempDir, static_dir: Option<&Path>, env: &[(&str, &str)]) -> Server {
        let mut command = Serve::command_of(Path::new(env!("CARGO_BIN_EXE_pubsub-cgi")), &dir.path().join("events"), static_dir);
        command.current_dir(dir.path()).envs(env.iter().copied());
        let serve = Serve::spawn(command);
        let addr = serve.addr().to_string();
        Server { serve, addr, dir }
    }

    fn pid(&self) -> u32 {
        self.serve.child.id()
    }

    fn connect(&self) -> Conn {
        Conn::connect(&self.addr, Duration::from_secs(10))
    }

    /// One request on a fresh connection.
    fn request(&self, method: &str, target: &str, body: &[u8]) -> Reply {
        let mut conn = self.connect();
        conn.send(method, target, body);
        conn.read_reply(method == "HEAD")
    }

    fn post(&self, body: &str) -> Reply {
        self.request("POST", "/kn", body.as_bytes())
    }

    /// Opens a tunnel and waits for its `200 Watching topic` status event.
    fn tunnel(&self, target: &str) -> Tunnel {
        let mut tunnel = self.open_tunnel(target);
        assert!(tunnel.wait_for(b"status: 200 Watching topic", Duration::from_secs(10)), "no status: {}", tunnel.text());
        tunnel
    }

    /// Opens an `sse` tunnel and waits for its status event.
    fn tunnel_sse(&self, target: &str) -> Tunnel {
        let mut tunnel = self.open_tunnel(target);
        assert!(tunnel.wait_for(b"\"status\":\"200 Watching topic\"", Duration::from_secs(10)), "no status: {}", tunnel.text());
        tunnel
    }

    fn open_tunnel(&self, target: &str) -> Tunnel {
        let mut conn = self.connect();
        conn.send("GET", target, b"");
        conn.into_tunnel()
    }

    fn status(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("no {field}"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    fn threads(&self) -> u64 {
        self.status("Threads:")
    }

    fn rss_kib(&self) -> u64 {
        self.status("VmRSS:")
    }

    /// Open sockets of the server process (the listener and connections).
    fn sockets(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .unwrap()
            .flatten()
            .filter(|e| std::fs::read_link(e.path()).map(|l| l.to_string_lossy().starts_with("socket:")).unwrap_or(false))
            .count()
    }

    /// Directories the server's inotify instance watches (one per topic
    /// followed by at least one tunnel).
    fn inotify_watches(&self) -> usize {
        let mut watches = 0;
        for entry in std::fs::read_dir(format!("/proc/{}/fd", self.pid())).unwrap().flatten() {
            let is_inotify = std::fs::read_link(entry.path()).map(|l| l.to_string_lossy().contains("inotify")).unwrap_or(false);
            if is_inotify {
                let info = std::fs::read_to_string(format!("/proc/{}/fdinfo/{}", self.pid(), entry.file_name().to_string_lossy()))
                    .unwrap_or_default();
                watches += info.lines().filter(|l| l.starts_with("inotify wd:")).count();
            }
        }
        watches
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    find(haystack, needle).is_some()
}

fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'/' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Lets this process (and the server it starts) hold `n` descriptors.
fn raise_open_files(n: u64) {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain system calls on a local struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        if limit.rlim_cur < n {
            limit.rlim_cur = n.max(limit.rlim_cur);
            limit.rlim_max = limit.rlim_max.max(n);
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0, "cannot raise RLIMIT_NOFILE to {n}");
        }
    }
}

// ----- one-shot requests -----------------------------------------------------

#[test]
fn notify_is_200_notified_with_content_length_on_a_kept_alive_connection() {
    let server = Server::start();
    let mut conn = server.connect();
    for i in 0..2 {
        conn.send("POST", "/kn", format!("kn_to=/what/chat&kn_payload=hello{i}&kn_response_format=simple").as_bytes());
        let reply = conn.reply();
        assert_eq!(reply.status_line, "HTTP/1.1 200 Notified", "request {i}");
        assert_eq!(reply.header("content-length").map(|n| n.parse::<usize>().unwrap()), Some(reply.body.len()));
        assert_eq!(reply.header("content-type"), Some("text/plain; charset=utf-8"));
        assert!(reply.text().contains("status: 200 Notified"), "{}", reply.text());
        assert!(reply.text().contains("Wrote to '/what/chat'"), "{}", reply.text());
        assert_ne!(reply.header("connection"), Some("close"));
    }
}

#[test]
fn path_info_names_the_topic_and_the_server_url_comes_from_host() {
    let server = Server::start();
    let reply = server.request("POST", "/kn/who/%CE%BA/chat", b"kn_payload=x&kn_response_format=simple");
    assert_eq!(reply.status_line, "HTTP/1.1 200 Notified");
    assert!(reply.text().contains("Wrote to '/who/\u{3ba}/chat'"), "{}", reply.text());
    let whoami = server.request("GET", "/kn?do_method=whoami", b"");
    assert!(whoami.text().contains("window.kn_server = '/kn'"), "{}", whoami.text());
}

#[test]
fn errors_keep_the_protocol_status_line() {
    let server = Server::start();
    let reply = server.request("GET", "/kn?do_method=nonesuch&kn_response_format=simple", b"");
    assert_eq!(reply.status_line, "HTTP/1.1 403 Unknown do_method");
    let reply = server.post("kn_payload=no+topic&kn_response_format=simple");
    assert!(reply.status_line.starts_with("HTTP/1.1 400 "), "{}", reply.status_line);
    let head = server.request("HEAD", "/kn", b"");
    assert_eq!(head.status_line, "HTTP/1.1 501 Not Implemented");
}

#[test]
fn batch_answers_the_batch_status_then_each_entry() {
    let server = Server::start();
    let one = urlencode("do_method=notify;kn_to=/what/a;kn_payload=1;kn_status_from=first");
    let two = urlencode("do_method=notify;kn_to=/what/b;kn_payload=2;kn_status_from=second");
    let bad = urlencode("do_method=whoami");
    let reply = server.post(&format!("do_method=batch&kn_response_format=simple&kn_batch={one}&kn_batch={two}&kn_batch={bad}"));
    assert_eq!(reply.status_line, "HTTP/1.1 200 Processing batch");
    let text = reply.text();
    let batch = text.find("status: 200 Processing batch").unwrap();
    let first = text.find("kn_route_location: first").unwrap();
    let second = text.find("kn_route_location: second").unwrap();
    assert!(batch < first && first < second, "{text}");
    assert_eq!(text.matches("status: 200 Notified").count(), 2, "{text}");
    assert!(text.contains("status: 400 can't batch that"), "{text}");
}

#[test]
fn kn_status_to_is_204_and_the_status_reaches_that_journal() {
    let server = Server::start();
    let mut journal = server.tunnel("/kn/who/s/s/1/kn_journal?kn_response_format=simple");
    let mut conn = server.connect();
    conn.send("POST", "/kn", b"kn_to=/what/chat&kn_payload=x&kn_status_to=/who/s/s/1/kn_journal&kn_status_from=mine");
    let reply = conn.reply();
    assert_eq!(reply.status_line, "HTTP/1.1 204 Content forwarded");
    assert!(reply.body.is_empty());
    assert!(journal.wait_for(b"kn_route_location: mine", Duration::from_secs(5)), "{}", journal.text());
    // The connection is still usable after a 204.
    conn.send("POST", "/kn", b"kn_to=/what/chat&kn_payload=y&kn_response_format=simple");
    assert_eq!(conn.reply().status_line, "HTTP/1.1 200 Notified");
}

#[test]
fn a_body_over_the_limit_is_refused_with_413_before_it_is_read() {
    // KN_MAX_EVENT_BYTES=1000 makes the body limit its floor, 1 MiB.
    let server = Server::start_with(&[("KN_MAX_EVENT_BYTES", "1000")]);
    let mut stream = TcpStream::connect(&server.addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let head = format!(
        "POST /kn?kn_response_format=simple HTTP/1.1\r\nHost: {}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 50000000\r\n\r\nkn_to=/a&kn_payload=",
        server.addr
    );
    stream.write_all(head.as_bytes()).unwrap();
    // Only the head and a few bytes were sent: the answer must not wait
    // for the other 50 MB.
    let mut conn = Conn::new(stream, &server.addr);
    let reply = conn.reply();
    assert_eq!(reply.status_line, "HTTP/1.1 413 Request too large");
    assert_eq!(reply.header("connection"), Some("close"));
    assert!(reply.text().contains("50000000"), "{}", reply.text());
    // A chunked body (no length announced) is cut off at the limit too.
    let mut conn = server.connect();
    let mut request = format!(
        "POST /kn?kn_response_format=simple HTTP/1.1\r\nHost: {}\r\nTransfer-Encoding: chunked\r\n\r\n",
        server.addr
    )
    .into_bytes();
    let chunk = vec![b'a'; 256 * 1024];
    for _ in 0..5 {
        request.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        request.extend_from_slice(&chunk);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"0\r\n\r\n");
    // The server may close before reading it all; a failed write is fine.
    let _ = conn.reader.get_mut().write_all(&request);
    assert_eq!(conn.reply().status_line, "HTTP/1.1 413 Request too large");
}

// ----- static files ----------------------------------------------------------

#[test]
fn static_files_are_served_with_their_type_and_slash_is_the_index() {
    let server = Server::start();
    let index = server.request("GET", "/", b"");
    assert_eq!(index.status_line, "HTTP/1.1 200 OK");
    assert_eq!(index.header("content-type"), Some("text/html; charset=utf-8"));
    assert_eq!(index.text(), "<h1>knpubsub test index</h1>\n");
    let js = server.request("GET", "/js/app.js", b"");
    assert_eq!(js.header("content-type"), Some("text/javascript; charset=utf-8"));
    assert_eq!(js.text(), "var kn_test = 1;\n");
    let head = server.request("HEAD", "/js/app.js", b"");
    assert_eq!(head.status_line, "HTTP/1.1 200 OK");
    assert_eq!(head.header("content-length"), Some("17"));
    assert_eq!(server.request("GET", "/notes.exe", b"").status_line, "HTTP/1.1 404 Not Found");
    assert_eq!(server.request("GET", "/missing.html", b"").status_line, "HTTP/1.1 404 Not Found");
    assert_eq!(server.request("GET", "/knx", b"").status_line, "HTTP/1.1 404 Not Found");
    assert_eq!(server.request("POST", "/index.html", b"a=b").status_line, "HTTP/1.1 405 Method Not Allowed");
}

/// The pages of `www/` are built into the binary: `serve` started in a
/// directory without `www/` (as after `cargo install`, or from a service
/// manager) serves them, byte for byte, with their types.
#[test]
fn built_in_pages_are_served_from_any_directory() {
    let server = Server::launch(tempfile::tempdir().unwrap(), None, &[]);
    assert!(!server.path().join("www").exists());
    let www = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../www");
    let html = "text/html; charset=utf-8";
    for (target, file, content_type) in [
        ("/", "index.html", html),
        ("/chat.html", "chat.html", html),
        ("/js/chat.js", "js/chat.js", "text/javascript; charset=utf-8"),
        ("/css/kn.css", "css/kn.css", "text/css; charset=utf-8"),
    ] {
        let reply = server.request("GET", target, b"");
        assert_eq!(reply.status_line, "HTTP/1.1 200 OK", "{target}");
        assert_eq!(reply.header("content-type"), Some(content_type), "{target}");
        assert_eq!(reply.body, std::fs::read(www.join(file)).unwrap(), "{target}");
    }
    let head = server.request("HEAD", "/js/chat.js", b"");
    assert_eq!(head.header("content-length"), Some(std::fs::metadata(www.join("js/chat.js")).unwrap().len().to_string().as_str()));
    for missing in ["/missing.html", "/js/missing.js", "/js", "/js/", "/../www/index.html"] {
        let reply = server.request("GET", missing, b"");
        assert!(reply.status_line == "HTTP/1.1 404 Not Found" || reply.status_line == "HTTP/1.1 400 Bad Request", "{missing}: {}", reply.status_line);
    }
    assert_eq!(server.request("GET", "/missing.html", b"").text(), "404 Not Found\n");
    // The pages load the JavaScript client from the protocol itself.
    let lib = server.request("GET", "/kn?do_method=lib", b"");
    assert_eq!(lib.status_line, "HTTP/1.1 200 OK");
    assert!(lib.text().contains("knpubsub JavaScript client"), "{}", lib.text());
}

/// `--static DIR` replaces the built-in pages entirely: a changed page is
/// served from DIR, and what DIR lacks is missing (not taken from the
/// built-in pages).
#[test]
fn static_dir_overrides_the_built_in_pages() {
    let dir = tempfile::tempdir().unwrap();
    let pages = dir.path().join("pages");
    std::fs::create_dir(&pages).unwrap();
    std::fs::write(pages.join("chat.html"), "<h1>a changed chat</h1>\n").unwrap();
    let server = Server::launch(dir, Some(&pages), &[]);
    let chat = server.request("GET", "/chat.html", b"");
    assert_eq!(chat.status_line, "HTTP/1.1 200 OK");
    assert_eq!(chat.text(), "<h1>a changed chat</h1>\n");
    assert_eq!(server.request("GET", "/", b"").status_line, "HTTP/1.1 404 Not Found");
    assert_eq!(server.request("GET", "/js/chat.js", b"").status_line, "HTTP/1.1 404 Not Found");
}

#[test]
fn static_paths_cannot_leave_the_static_directory() {
    let server = Server::start();
    assert!(server.path().join("secret.txt").exists());
    for target in ["/../secret.txt", "/js/../../secret.txt", "/%2e%2e/secret.txt", "/js/%2E%2E%2F%2E%2E%2Fsecret.txt", "/..%5csecret.txt"] {
        let reply = server.request("GET", target, b"");
        assert!(
            reply.status_line == "HTTP/1.1 400 Bad Request" || reply.status_line == "HTTP/1.1 404 Not Found",
            "{target}: {}",
            reply.status_line
        );
        assert!(!reply.text().contains("outside the static dir"), "{target}");
    }
    // A symbolic link out of the directory is not followed either.
    std::os::unix::fs::symlink(server.path().join("secret.txt"), server.path().join("www/link.txt")).unwrap();
    assert_eq!(server.request("GET", "/link.txt", b"").status_line, "HTTP/1.1 404 Not Found");
}

// ----- tunnels ---------------------------------------------------------------

#[test]
fn a_routed_event_reaches_a_tunnel_through_serve_within_100_ms() {
    let server = Server::start();
    let mut tunnel = server.tunnel("/kn/who/anna/s/42/kn_journal?kn_response_format=simple&kn_status_from=tunnel");
    let head = String::from_utf8_lossy(&tunnel.seen).into_owned();
    assert!(head.starts_with("HTTP/1.1 200 Watching topic\r\n"), "{head}");
    assert!(head.to_ascii_lowercase().contains("transfer-encoding: chunked"), "{head}");
    let route = server.post("do_method=route&kn_from=/what/chat&kn_to=/who/anna/s/42/kn_journal&kn_uri=/what/chat&kn_response_format=simple");
    assert_eq!(route.status_line, "HTTP/1.1 200 Routed", "{}", route.text());
    let mut worst = Duration::ZERO;
    for i in 0..5 {
        let payload = format!("routed-{i}-{}", std::process::id());
        let sent = Instant::now();
        let reply = server.post(&format!("kn_to=/what/chat&kn_payload={payload}&kn_response_format=simple"));
        assert_eq!(reply.status_line, "HTTP/1.1 200 Notified");
        assert!(tunnel.wait_for(payload.as_bytes(), Duration::from_secs(2)), "event {i} never arrived: {}", tunnel.text());
        let latency = sent.elapsed();
        println!("post → tunnel latency through serve: {latency:?}");
        worst = worst.max(latency);
    }
    assert!(worst < Duration::from_millis(100), "worst latency {worst:?}");
}

#[test]
fn a_tunnel_streams_keep_alives_while_idle() {
    let server = Server::start();
    let mut tunnel = server.tunnel("/kn/what/idle?kn_response_format=simple");
    let before = tunnel.seen.len();
    std::thread::sleep(Duration::from_millis(2500));
    // Read what arrived: at least two keep-alive spaces (each in a chunk).
    tunnel.wait_for(b"no such bytes", Duration::from_millis(200));
    assert!(tunnel.seen.len() >= before + 2, "no keep-alive in 2.5 s");
}

#[test]
fn kn_expires_closes_the_tunnel_and_the_response_ends() {
    let server = Server::start();
    let mut tunnel = server.tunnel("/kn/who/e/s/1/kn_journal?kn_response_format=simple&kn_expires=%2B1");
    // The chunked body's last chunk arrives once the deadline passes.
    assert!(tunnel.wait_for(b"0\r\n\r\n", Duration::from_secs(5)), "{}", tunnel.text());
    let reply = server.post("kn_to=/who/e/s/1/kn_journal&kn_payload=late&kn_response_format=simple");
    assert_eq!(reply.status_line, "HTTP/1.1 404 Expired", "{}", reply.text());
}

/// KN_TUNNEL_MAX_TIME ends every tunnel after that long (for a web
/// server's graceful reload), without expiring its journal: what is posted
/// before the client reconnects is waiting for it there. `kn_expires`
/// still ends a tunnel sooner, and expires its journal.
#[test]
fn tunnel_max_time_ends_a_tunnel_and_its_journal_stays_for_the_reconnection() {
    let server = Server::start_with(&[("KN_TUNNEL_MAX_TIME", "1")]);
    let started = std::time::Instant::now();
    let mut tunnel = server.tunnel("/kn/who/m/s/1/kn_journal?kn_response_format=simple");
    assert!(tunnel.wait_for(b"0\r\n\r\n", Duration::from_secs(5)), "{}", tunnel.text());
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(900), "ended after {took:?}");
    let reply = server.post("kn_to=/who/m/s/1/kn_journal&kn_payload=meanwhile&kn_response_format=simple");
    assert_eq!(reply.status_line, "HTTP/1.1 200 Notified", "the journal is not stale: {}", reply.text());
    let mut again = server.tunnel("/kn/who/m/s/1/kn_journal?kn_response_format=simple&do_max_age=60");
    assert!(again.wait_for(b"meanwhile", Duration::from_secs(2)), "{}", again.text());
    // kn_expires sooner than the limit still wins, and expires the journal.
    let mut short = server.tunnel("/kn/who/m/s/2/kn_journal?kn_response_format=simple&kn_expires=%2B0.3");
    assert!(short.wait_for(b"0\r\n\r\n", Duration::from_secs(5)), "{}", short.text());
    let reply = server.post("kn_to=/who/m/s/2/kn_journal&kn_payload=late&kn_response_format=simple");
    assert_eq!(reply.status_line, "HTTP/1.1 404 Expired", "{}", reply.text());
}

/// KN_FORWARD_INLINE: a notify to a topic with more routes is answered
/// once its event is stored (its status lists that one write), and every
/// tunnel then gets every event, in order; at the limit, the copies are
/// written before the answer and listed in it, as the original did.
#[test]
fn a_fan_out_past_forward_inline_is_answered_first_and_every_tunnel_gets_every_event_in_order() {
    let server = Server::start_with(&[("KN_FORWARD_INLINE", "2")]);
    let journal = |i: usize| format!("/who/fan{i}/s/1/kn_journal");
    let mut tunnels: Vec<Tunnel> = (0..3).map(|i| server.tunnel(&format!("/kn{}?kn_response_format=simple", journal(i)))).collect();
    for i in 0..2 {
        let reply = server.post(&format!("do_method=route&kn_from=/what/fan&kn_to={}&kn_response_format=simple", journal(i)));
        assert_eq!(reply.status_line, "HTTP/1.1 200 Routed", "{}", reply.text());
    }
    let wrote = |text: &str| text.matches("Wrote to '").count();
    // Two routes, two inline at most: the copies are in the answer.
    let reply = server.post("kn_to=/what/fan&kn_payload=inline&kn_response_format=simple");
    assert_eq!(reply.status_line, "HTTP/1.1 200 Notified");
    assert_eq!(wrote(&reply.text()), 3, "{}", reply.text());
    let reply = server.post(&format!("do_method=route&kn_from=/what/fan&kn_to={}&kn_response_format=simple", journal(2)));
    assert_eq!(reply.status_line, "HTTP/1.1 200 Routed", "{}", reply.text());
    // Three: answered once stored, forwarded right after.
    for n in 0..10 {
        let reply = server.post(&format!("kn_to=/what/fan&kn_payload=fanned-{n}-&kn_response_format=simple"));
        assert_eq!(reply.status_line, "HTTP/1.1 200 Notified");
        assert_eq!(wrote(&reply.text()), 1, "{}", reply.text());
        assert!(reply.text().contains("Wrote to '/what/fan'"), "{}", reply.text());
    }
    for (i, tunnel) in tunnels.iter_mut().enumerate() {
        assert!(tunnel.wait_for(b"fanned-9-", Duration::from_secs(5)), "tunnel {i}: {}", tunnel.text());
        let text = String::from_utf8_lossy(&tunnel.seen).into_owned();
        let at: Vec<usize> = (0..10).map(|n| text.find(&format!("fanned-{n}-")).unwrap_or_else(|| panic!("tunnel {i} lacks {n}: {text}"))).collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "tunnel {i}: out of order: {text}");
        assert_eq!(text.matches("fanned-").count(), 10, "tunnel {i}: each once: {text}");
    }
}

/// Without the setting a tunnel stays open (the keep-alives go on).
#[test]
fn without_tunnel_max_time_a_tunnel_stays_open() {
    let server = Server::start();
    let mut tunnel = server.tunnel("/kn/who/n/s/1/kn_journal?kn_response_format=simple");
    assert!(!tunnel.wait_for(b"0\r\n\r\n", Duration::from_millis(2500)), "{}", tunnel.text());
}

#[test]
fn a_client_that_goes_away_frees_its_tunnel_and_the_server_stays_healthy() {
    let server = Server::start();
    // The first tunnel starts the process's one change notifier: count
    // watches from there.
    let _warm = server.tunnel("/kn/what/warm?kn_response_format=simple");
    let base_sockets = server.sockets();
    let base_watches = server.inotify_watches();
    let tunnels: Vec<Tunnel> =
        (0..30).map(|i| server.tunnel(&format!("/kn/who/gone{i}/s/1/kn_journal?kn_response_format=simple"))).collect();
    assert!(server.inotify_watches() >= base_watches + 30, "watches: {}", server.inotify_watches());
    assert_eq!(server.sockets(), base_sockets + 30);
    drop(tunnels);
    // The next keep-alive write fails (within about two keep-alive
    // periods): the connection closes, the tunnel task ends, its watch goes.
    let freed = wait_for(Duration::from_secs(10), || server.inotify_watches() <= base_watches && server.sockets() <= base_sockets);
    assert!(
        freed,
        "watches {} (base {base_watches}), sockets {} (base {base_sockets})",
        server.inotify_watches(),
        server.sockets()
    );
    let reply = server.post("kn_to=/what/chat&kn_payload=still+here&kn_response_format=simple");
    assert_eq!(reply.status_line, "HTTP/1.1 200 Notified");
    let mut tunnel = server.tunnel("/kn/who/gone0/s/1/kn_journal?kn_response_format=simple");
    server.post("kn_to=/who/gone0/s/1/kn_journal&kn_payload=again&kn_response_format=simple");
    assert!(tunnel.wait_for(b"again", Duration::from_secs(2)), "{}", tunnel.text());
}

/// No thread and no process per idle tunnel: a thousand tunnels on a
/// thousand distinct journals are tasks of a handful of threads, all
/// watched by the one inotify instance, and an event routed to fifty of
/// them reaches each.
#[test]
fn a_thousand_idle_tunnels_are_tasks_not_threads() {
    many_tunnels(1000, &[]);
}

/// The same when requests run on the blocking pool (remote URLs allowed,
/// so a request may wait on the network): the pool is bounded, so a burst
/// of requests many times its size is still a handful of threads.
#[test]
fn tunnels_opened_on_the_blocking_pool_are_tasks_not_threads() {
    many_tunnels(300, &[("KN_OUTBOUND", "allow")]);
}

fn many_tunnels(tunnels: usize, env: &[(&str, &str)]) {
    const ROUTED: usize = 50;
    raise_open_files(8192);
    let started = Instant::now();
    let server = Server::start_with(env);
    let base_threads = server.threads();
    let base_rss = server.rss_kib();
    // Send all the requests first: the server sees them at once.
    // Journals one level down: each tunnel creates two topics, not four.
    let journal = |i: usize| format!("/load/{i}/kn_journal");
    let mut open: Vec<Tunnel> =
        (0..tunnels).map(|i| server.open_tunnel(&format!("/kn{}?kn_response_format=simple", journal(i)))).collect();
    for (i, t) in open.iter_mut().enumerate() {
        assert!(t.wait_for(b"status: 200 Watching topic", Duration::from_secs(20)), "tunnel {i}: {}", t.text());
    }
    let opened = started.elapsed();
    let threads = server.threads();
    let rss = server.rss_kib();
    let watches = server.inotify_watches();
    println!(
        "{env:?}: {tunnels} tunnels open after {opened:?}: {threads} threads (idle server {base_threads}), \
         RSS {} MiB (idle server {} MiB), {watches} inotify watches",
        rss / 1024,
        base_rss / 1024
    );
    // The most threads serve's pools may hold, whatever the load (a
    // burst of tunnel requests fills the request pools for a while): the
    // main thread and an async worker per core, the runtime's blocking
    // pool (32, plus 4 stand-ins for requests run in place), the request
    // pool (28), the tunnel enders (4), and a few of the store's own (the
    // inotify reader, a deferred forwarding or sweep slice, a signal).
    // A thread per tunnel would be four to thirteen times as many.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let most = 1 + cores + (32 + 4) + 28 + 4 + 4;
    assert!(threads <= most as u64 && most < tunnels, "{threads} threads for {tunnels} tunnels (at most {most})");
    assert!(watches >= tunnels, "{watches} inotify watches for {tunnels} distinct topics");
    assert!(rss < 512 * 1024, "RSS {rss} KiB");

    // Route /load/topic to ROUTED of the journals, post once, and see the event
    // arrive on each of them.
    for i in (0..tunnels).step_by(tunnels / ROUTED) {
        let reply = server.post(&format!("do_method=route&kn_from=/load/topic&kn_to={}&kn_response_format=simple", journal(i)));
        assert_eq!(reply.status_line, "HTTP/1.1 200 Routed", "{}", reply.text());
    }
    let sent = Instant::now();
    let reply = server.post("kn_to=/load/topic&kn_payload=to-the-fifty&kn_response_format=simple");
    assert_eq!(reply.status_line, "HTTP/1.1 200 Notified");
    for i in (0..tunnels).step_by(tunnels / ROUTED) {
        assert!(open[i].wait_for(b"to-the-fifty", Duration::from_secs(5)), "tunnel {i}: {}", open[i].text());
    }
    println!("one post routed to {ROUTED} of the tunnels reached all of them in {:?}", sent.elapsed());
    // The others got nothing but keep-alives.
    assert!(!contains(&open[1].seen, b"to-the-fifty"));
    // Idle tunnels cost little: sample the server's CPU time over a second.
    let cpu = || -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", server.pid())).unwrap();
        let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
        fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
    };
    let before = cpu();
    std::thread::sleep(Duration::from_secs(1));
    println!("{tunnels} idle tunnels used {} ticks of CPU in 1 s (100 ticks = one core)", cpu() - before);
    // Idle pool threads linger a while (the runtime keeps a blocking
    // thread 10 s): the bound is still what the pools may hold.
    let threads = server.threads();
    assert!(threads <= most as u64, "{threads} threads for {tunnels} idle tunnels (at most {most})");
    assert!(started.elapsed() < Duration::from_secs(30), "took {:?}", started.elapsed());
}

#[test]
fn the_store_is_the_given_root() {
    let server = Server::start();
    server.post("kn_to=/what/here&kn_payload=x");
    assert!(server.path().join("events").is_dir());
    let topic_dir: PathBuf = server.path().join("events");
    assert!(std::fs::read_dir(topic_dir).unwrap().count() > 0);
}

#[test]
fn ctrl_c_stops_the_server_even_with_tunnels_open() {
    let mut server = Server::start();
    let _tunnel = server.tunnel("/kn/who/c/s/1/kn_journal?kn_response_format=simple");
    // SAFETY: a signal to our own child.
    assert_eq!(unsafe { libc::kill(server.pid() as libc::pid_t, libc::SIGINT) }, 0);
    let status = wait_exit(&mut server.serve.child, Duration::from_secs(5)).expect("still running 5 s after SIGINT");
    assert!(status.success(), "{status}");
}

#[test]
fn an_http_1_0_request_without_host_is_served() {
    let server = Server::start();
    let mut stream = TcpStream::connect(&server.addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    stream.write_all(b"GET /kn?do_method=notify;kn_to=/what/old;kn_payload=1.0;kn_response_format=simple HTTP/1.0\r\n\r\n").unwrap();
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).unwrap();
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.0 200 Notified\r\n"), "{reply}");
    assert!(reply.contains("Wrote to '/what/old'"), "{reply}");
}

// ----- padding and retry ---------------------------------------------------

/// A tunnel request sent with `User-Agent: agent` (none when `None`),
/// read until its `200 Watching topic` status event.
fn tunnel_as(server: &Server, target: &str, agent: Option<&str>) -> Tunnel {
    let mut stream = TcpStream::connect(&server.addr).unwrap();
    let agent = agent.map(|a| format!("User-Agent: {a}\r\n")).unwrap_or_default();
    write!(stream, "GET {target} HTTP/1.1\r\nHost: {}\r\n{agent}\r\n", server.addr).unwrap();
    let mut tunnel = Tunnel { stream, seen: Vec::new() };
    assert!(tunnel.wait_for(b"200 Watching topic", Duration::from_secs(10)), "{}", tunnel.text());
    tunnel
}

/// Browsers of mod_pubsub's day buffered the first kilobytes of a
/// response, hence 4096 spaces after each burst (PROTOCOL.md 3.8): kept for
/// clients that send no User-Agent (old C and Perl clients, the golden
/// transcripts) or a browser's; a simple tunnel to any other client (curl in
/// a terminal) gets its frames alone.
#[test]
fn simple_tunnels_are_padded_for_browsers_and_old_clients_only() {
    let server = Server::start();
    let pad = " ".repeat(4096);
    let cases = [(None, true), (Some("Mozilla/5.0 (X11; Linux x86_64) Gecko/20100101 Firefox/128.0"), true), (Some("curl/8.5.0"), false)];
    for (i, (agent, padded)) in cases.into_iter().enumerate() {
        let journal = format!("/who/p{i}/kn_journal");
        let mut tunnel = tunnel_as(&server, &format!("/kn{journal}?do_method=route&kn_response_format=simple"), agent);
        server.post(&format!("kn_to={journal}&kn_payload=hello-{i}&kn_response_format=simple"));
        assert!(tunnel.wait_for(format!("hello-{i}").as_bytes(), Duration::from_secs(5)), "{}", tunnel.text());
        // A padded burst's padding comes in the same chunk as its frames.
        tunnel.wait_for(pad.as_bytes(), Duration::from_millis(300));
        assert_eq!(contains(&tunnel.seen, pad.as_bytes()), padded, "User-Agent {agent:?}: {}", tunnel.text());
    }
    // js pages are for browsers whatever the client says.
    let mut js = tunnel_as(&server, "/kn/who/pj/kn_journal?do_method=route", Some("curl/8.5.0"));
    assert!(js.wait_for(pad.as_bytes(), Duration::from_secs(5)), "js tunnel without padding: {}", js.text());
}

/// `retry:` tells EventSource how soon to reconnect (its default is 3 s):
/// KN_SSE_RETRY_MS, 1000 by default, in the tunnel's first event block.
#[test]
fn sse_tunnels_send_retry_from_kn_sse_retry_ms() {
    for (env, retry) in [(None, "1000"), (Some("250"), "250")] {
        let server = Server::start_with(&env.map(|v| ("KN_SSE_RETRY_MS", v)).into_iter().collect::<Vec<_>>());
        let mut tunnel = server.tunnel_sse("/kn/who/r/kn_journal?do_method=route&kn_response_format=sse");
        let expected = format!("retry: {retry}\ndata: {{");
        assert!(tunnel.wait_for(expected.as_bytes(), Duration::from_secs(5)), "{}", tunnel.text());
        let text = String::from_utf8_lossy(&tunnel.seen).into_owned();
        assert!(text.find("retry:") < text.find("\"status\":\"200 Watching topic\""), "retry comes with the first event: {text}");
    }
}
