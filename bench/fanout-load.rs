//! `fanout-load`: the Server-Sent Events load client of `bench/vs-nchan`.
//!
//! ```text
//! fanout-load kn|nchan HOST:PORT fanout N E     # N SSE subscribers, 1 publisher posting 1 + E + 1 events
//! fanout-load kn HOST:PORT restart N E          # the same across a restart of the server (see below)
//! fanout-load kn|nchan HOST:PORT latency S      # 1 subscriber, S timed round trips (after 20 unrecorded)
//! fanout-load kn|nchan HOST:PORT busy N E C     # N SSE subscribers, C publishers at once posting E events in all
//! fanout-load kn|nchan HOST:PORT hold N         # open N subscribers, print "ready", hold until stdin closes
//! fanout-load kn|nchan HOST:PORT lone N K       # N SSE subscribers (settled), K events each published alone
//! fanout-load apache CGI STORE                  # pubsub.cgi under Apache: print "apache port=P pid=PID threads=T", stop when stdin closes
//! ```
//!
//! `apache` starts kn-test-support's private Apache 2.4 (`mpm_event`,
//! `mod_cgid`) with the binary `CGI` as `/kn` on the store `STORE`, one
//! child process sized for [`APACHE_TUNNELS`] tunnels (each an Apache
//! worker thread and a CGI process); the other modes then drive it as
//! `kn` on its port.
//!
//! Both servers are driven the way their own clients use them:
//!
//! * `kn` (`pubsub-cgi serve` at `/kn`): each subscriber is a browser's
//!   subscription in the PubSub protocol, a tunnel in the `sse` format on a
//!   journal of its own (`/bench/fan/<run>/<i>/kn_journal`) and a route from
//!   the source topic `/bench/fan/<run>/src` into that journal; the
//!   publisher notifies the source topic. Every delivery is an append to a
//!   subscriber's journal, on disk.
//! * `nchan` (Nchan at `/sub/<channel>` and `/pub/<channel>`): each
//!   subscriber is an `EventSource` on the channel, and the publisher POSTs
//!   the message body to it.
//!
//! The publisher posts one event at a time on one keep-alive connection,
//! waiting for each answer (in `busy`, each of the C publishers does, on a
//! connection of its own, all at once). Subscribers read with HTTP/1.0 (the body then
//! comes raw, not chunked) and count the `data:` lines carrying the marker
//! `fanev<seq>` of a published event.
//!
//! Cold and warm: in `fanout` the first event (not counted in E) is timed
//! alone, until every subscriber has it: for `kn` it is the first append
//! to each of the N journals since `serve` created it and its route (no
//! probe goes before it), the cold cost; the E events after it are the
//! warm rate, and one more event after them, alone, is timed as the first
//! was. `restart` opens and attaches the N subscribers, sends one event
//! through all of them, prints `attached N` and waits for a line on stdin
//! (the caller restarts the server on the same port and store meanwhile,
//! then writes the line); then it reconnects every subscriber to its
//! journal (the routes are on disk) and goes on as `fanout`: the first
//! event after a restart with N clients reconnected, then the warm ones.
//!
//! Output, one line: `fanout subscribers=N events=E deliveries=D secs=S
//! per_sec=R first_secs=F warm_event_secs=W first_over_warm=X
//! warm_single_secs=S1 first_over_single=X1` (`restart` instead of
//! `fanout` after a restart; W is the rate's time per event, where the
//! drains of consecutive events overlap and share appends; S1 the last
//! event, alone, timed as the first), `busy subscribers=N publishers=C events=E secs=S
//! req_per_sec=R deliveries=D` (every subscriber got every event), `latency n=S p50=.. p90=.. p99=.. ms` or, for `hold`,
//! `ready N` when every subscriber is open, `lone subscribers=N events=K
//! p50_secs=.. min_secs=.. max_secs=..` for `lone` (the time from a
//! publish until every subscriber has its event, each event published
//! once the one before reached all: a chat message to a room of N).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

const USAGE: &str = "usage: fanout-load kn|nchan HOST:PORT (fanout N E | latency S | busy N E C | hold N | lone N K), or fanout-load apache CGI STORE";

/// How long the whole fan-out, or one round trip, may take.
const TIMEOUT: Duration = Duration::from_secs(120);

/// Subscribers connecting (each then creating its route) at once.
const CONNECTING: usize = 64;

#[derive(Clone, Copy, PartialEq)]
enum Server {
    Kn,
    Nchan,
}

/// The names of one run: fresh, so that runs never share a topic or channel.
#[derive(Clone)]
struct Run {
    server: Server,
    addr: String,
    nonce: String,
}

impl Run {
    fn subscribe_path(&self, i: usize) -> String {
        match self.server {
            Server::Kn => format!("/kn/bench/fan/{}/{i}/kn_journal?kn_response_format=sse", self.nonce),
            Server::Nchan => format!("/sub/fan{}", self.nonce),
        }
    }

    fn publish(&self, seq: usize) -> (String, String) {
        match self.server {
            Server::Kn => (
                format!("/kn/bench/fan/{}/src", self.nonce),
                format!("do_method=notify&kn_payload=fanev{seq}&kn_response_format=simple"),
            ),
            Server::Nchan => (format!("/pub/fan{}", self.nonce), format!("fanev{seq}")),
        }
    }

    /// Makes subscriber `i` receive what is published (a route into its
    /// journal; nothing for Nchan, whose subscribers are on the channel).
    async fn attach(&self, client: &mut Client, i: usize) -> Result<(), String> {
        if self.server == Server::Nchan {
            return Ok(());
        }
        let n = &self.nonce;
        let body = format!("do_method=route&kn_from=/bench/fan/{n}/src&kn_to=/bench/fan/{n}/{i}/kn_journal&kn_response_format=simple");
        let (status, answer) = client.post(&format!("/kn/bench/fan/{n}/src"), &body).await?;
        if status != 200 {
            return Err(format!("creating route {i} answered {status}: {}", String::from_utf8_lossy(&answer).trim()));
        }
        Ok(())
    }

    /// Publishes probes until every one of the `n` subscribers has seen
    /// one: they are all receiving then (an `EventSource` may be open
    /// before its channel counts it). Probes are not counted as events.
    async fn settle(&self, n: usize, events: &mut mpsc::UnboundedReceiver<Seen>) -> Result<(), String> {
        let mut client = Client::connect(&self.addr).await?;
        let mut probed = vec![false; n];
        let mut left = n;
        let end = Instant::now() + TIMEOUT;
        while left > 0 {
            let (path, body) = self.publish(PROBE);
            client.post(&path, &body).await?;
            let pause = tokio::time::sleep(Duration::from_millis(100));
            tokio::pin!(pause);
            loop {
                tokio::select! {
                    seen = events.recv() => match seen {
                        Some(Seen { subscriber, seq: PROBE, .. }) if !probed[subscriber] => {
                            probed[subscriber] = true;
                            left -= 1;
                        }
                        Some(_) => {}
                        None => return Err("every subscriber closed".to_string()),
                    },
                    _ = &mut pause => break,
                }
                if left == 0 {
                    break;
                }
            }
            if Instant::now() > end {
                return Err(format!("{left} of {n} subscribers saw no probe within {TIMEOUT:?}"));
            }
        }
        Ok(())
    }
}

/// An event a subscriber received.
struct Seen {
    subscriber: usize,
    seq: usize,
    at: Instant,
}

/// The sequence number of the probes of [`Run::settle`].
const PROBE: usize = 999_999_999;

/// The sequence number of the first (cold) event of a fan-out.
const FIRST: usize = 999_999_998;

/// The sequence number of the last event of a fan-out, published alone.
const LAST: usize = 999_999_997;

/// One keep-alive HTTP/1.1 connection for requests with short answers.
struct Client {
    reader: BufReader<TcpStream>,
    addr: String,
}

impl Client {
    async fn connect(addr: &str) -> Result<Client, String> {
        let stream = TcpStream::connect(addr).await.map_err(|e| format!("connecting to {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        Ok(Client { reader: BufReader::new(stream), addr: addr.to_string() })
    }

    async fn post(&mut self, path: &str, body: &str) -> Result<(u16, Vec<u8>), String> {
        self.request("POST", path, body, "Content-Type: application/x-www-form-urlencoded\r\n").await
    }

    /// One request; on a connection the server closed while it was idle
    /// (Apache's event MPM does so when its workers are busy with
    /// tunnels), once more on a new one: the request never reached it.
    async fn request(&mut self, method: &str, path: &str, body: &str, extra: &str) -> Result<(u16, Vec<u8>), String> {
        match self.request_once(method, path, body, extra).await {
            Err(Closed::Idle) => {
                *self = Client::connect(&self.addr).await?;
                self.request_once(method, path, body, extra).await.map_err(Closed::into_message)
            }
            other => other.map_err(Closed::into_message),
        }
    }

    async fn request_once(&mut self, method: &str, path: &str, body: &str, extra: &str) -> Result<(u16, Vec<u8>), Closed> {
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\n{extra}Content-Length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        let idle = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset => Closed::Idle,
            _ => Closed::Failed(format!("{method} {path}: {e}")),
        };
        self.reader.get_mut().write_all(request.as_bytes()).await.map_err(idle)?;
        let (status, headers) = read_head(&mut self.reader).await.map_err(idle)?;
        let io = |e: std::io::Error| Closed::Failed(format!("{method} {path}: {e}"));
        let mut answer = Vec::new();
        if let Some(length) = header(&headers, "content-length").and_then(|v| v.parse::<usize>().ok()) {
            answer.resize(length, 0);
            self.reader.read_exact(&mut answer).await.map_err(io)?;
        } else if header(&headers, "transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
            loop {
                let mut line = String::new();
                self.reader.read_line(&mut line).await.map_err(io)?;
                let size = usize::from_str_radix(line.trim(), 16).map_err(|_| Closed::Failed(format!("bad chunk size '{}'", line.trim())))?;
                let mut chunk = vec![0; size + 2];
                self.reader.read_exact(&mut chunk).await.map_err(io)?;
                if size == 0 {
                    break;
                }
                answer.extend_from_slice(&chunk[..size]);
            }
        }
        Ok((status, answer))
    }
}

/// Why a request got no answer.
enum Closed {
    /// The connection was closed before any of the answer came.
    Idle,
    /// Anything else.
    Failed(String),
}

impl Closed {
    fn into_message(self) -> String {
        match self {
            Closed::Idle => "connection closed".to_string(),
            Closed::Failed(message) => message,
        }
    }
}

async fn read_head(reader: &mut BufReader<TcpStream>) -> std::io::Result<(u16, Vec<(String, String)>)> {
    let mut line = String::new();
    if reader.read_line(&mut line).await? == 0 {
        return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "connection closed"));
    }
    let status = line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line).await?;
        let l = line.trim_end();
        if l.is_empty() {
            return Ok((status, headers));
        }
        if let Some((name, value)) = l.split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        }
    }
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

/// An open subscriber: its reader task reports each event's sequence
/// number (and when it arrived) on `events`.
async fn subscribe(run: &Run, i: usize, events: mpsc::UnboundedSender<Seen>) -> Result<(), String> {
    let stream = TcpStream::connect(&run.addr).await.map_err(|e| format!("subscriber {i}: connecting: {e}"))?;
    let _ = stream.set_nodelay(true);
    let mut reader = BufReader::with_capacity(64 * 1024, stream);
    let request = format!("GET {} HTTP/1.0\r\nHost: {}\r\nAccept: text/event-stream\r\n\r\n", run.subscribe_path(i), run.addr);
    let io = |e: std::io::Error| format!("subscriber {i}: {e}");
    reader.get_mut().write_all(request.as_bytes()).await.map_err(io)?;
    let (status, _) = read_head(&mut reader).await.map_err(io)?;
    if status != 200 {
        return Err(format!("subscriber {i}: answered {status}"));
    }
    if run.server == Server::Kn {
        // Open once the tunnel's own `200 Watching topic` event is in.
        let mut line = Vec::new();
        loop {
            line.clear();
            if reader.read_until(b'\n', &mut line).await.map_err(io)? == 0 {
                return Err(format!("subscriber {i}: closed before its status event"));
            }
            if line.starts_with(b"data:") {
                break;
            }
        }
    }
    tokio::spawn(async move {
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if !line.starts_with(b"data:") {
                continue;
            }
            if let Some(seq) = marker(&line) {
                if events.send(Seen { subscriber: i, seq, at: Instant::now() }).is_err() {
                    return;
                }
            }
        }
    });
    Ok(())
}

/// The sequence number after `fanev` in a `data:` line.
fn marker(line: &[u8]) -> Option<usize> {
    let at = line.windows(5).position(|w| w == b"fanev")? + 5;
    let digits = line[at..].iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&line[at..at + digits]).ok()?.parse().ok()
}

/// Opens `n` subscribers (`CONNECTING` at a time) and attaches each,
/// then waits until each has seen a probe.
async fn open_subscribers(run: &Run, n: usize) -> Result<mpsc::UnboundedReceiver<Seen>, String> {
    let mut rx = connect_subscribers(run, n, true).await?;
    run.settle(n, &mut rx).await?;
    Ok(rx)
}

/// Opens `n` subscribers (`CONNECTING` at a time), attaching each when
/// `attach` (a reconnection finds its route on disk). For `kn` each is
/// receiving once this returns: its tunnel has answered and its route
/// was created before the answer.
async fn connect_subscribers(run: &Run, n: usize, attach: bool) -> Result<mpsc::UnboundedReceiver<Seen>, String> {
    let (tx, rx) = mpsc::unbounded_channel();
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..CONNECTING.min(n) {
        let (run, tx, next) = (run.clone(), tx.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let mut client = Client::connect(&run.addr).await?;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return Ok::<(), String>(());
                }
                subscribe(&run, i, tx.clone()).await?;
                if attach {
                    run.attach(&mut client, i).await?;
                }
            }
        }));
    }
    for w in workers {
        w.await.map_err(|e| e.to_string())??;
    }
    Ok(rx)
}

/// The subscribers of a fan-out: for `kn` without probes (the first event
/// is then the first append to each journal), for Nchan settled first
/// (an `EventSource` may be open before its channel counts it).
async fn fanout_subscribers(run: &Run, n: usize) -> Result<mpsc::UnboundedReceiver<Seen>, String> {
    match run.server {
        Server::Kn => connect_subscribers(run, n, true).await,
        Server::Nchan => open_subscribers(run, n).await,
    }
}

/// Publishes event `seq` and waits until each of the `n` subscribers has
/// it; returns the seconds that took.
async fn publish_to_all(run: &Run, n: usize, seq: usize, events: &mut mpsc::UnboundedReceiver<Seen>) -> Result<f64, String> {
    let mut publisher = Client::connect(&run.addr).await?;
    let start = Instant::now();
    publish(run, &mut publisher, seq).await?;
    let mut seen = vec![false; n];
    let mut left = n;
    let end = start + TIMEOUT;
    while left > 0 {
        match tokio::time::timeout_at(end.into(), events.recv()).await {
            Ok(Some(Seen { subscriber, seq: got, .. })) if got == seq && !seen[subscriber] => {
                seen[subscriber] = true;
                left -= 1;
            }
            Ok(Some(_)) => {}
            Ok(None) => return Err("every subscriber closed".to_string()),
            Err(_) => return Err(format!("{left} of {n} subscribers did not get event {seq} within {TIMEOUT:?}")),
        }
    }
    Ok(start.elapsed().as_secs_f64())
}

/// `restart`: N attached subscribers, one event through them all, then
/// (once stdin has a line: the server was restarted) every subscriber
/// reconnected and the fan-out measured as `fanout` does.
async fn restart(run: Run, n: usize, e: usize) -> Result<(), String> {
    let mut events = connect_subscribers(&run, n, true).await?;
    publish_to_all(&run, n, PROBE, &mut events).await?;
    println!("attached {n}");
    let line = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    });
    line.await.map_err(|e| e.to_string())?.map_err(|e| format!("stdin: {e}"))?;
    drop(events); // the old readers end with their connections
    let events = connect_subscribers(&run, n, false).await?;
    measure_fanout(run, n, e, events, "restart").await
}

/// Publishes event `seq` on `client` and waits for its answer, which
/// must be a success.
async fn publish(run: &Run, client: &mut Client, seq: usize) -> Result<(), String> {
    let (path, body) = run.publish(seq);
    let (status, answer) = client.post(&path, &body).await?;
    if !(200..300).contains(&status) {
        return Err(format!("publish {seq} answered {status}: {}", String::from_utf8_lossy(&answer).trim()));
    }
    Ok(())
}

async fn fanout(run: Run, n: usize, e: usize) -> Result<(), String> {
    let events = fanout_subscribers(&run, n).await?;
    measure_fanout(run, n, e, events, "fanout").await
}

/// The first event to the `n` subscribers alone (cold), then `e` more
/// (warm, the rate), then one more alone (warm, timed as the first).
async fn measure_fanout(run: Run, n: usize, e: usize, mut events: mpsc::UnboundedReceiver<Seen>, what: &str) -> Result<(), String> {
    let first = publish_to_all(&run, n, FIRST, &mut events).await?;
    let mut publisher = Client::connect(&run.addr).await?;
    say_ready().await;
    let start = Instant::now();
    let publishing_run = run.clone();
    let publishing = tokio::spawn(async move {
        for seq in 0..e {
            publish(&publishing_run, &mut publisher, seq).await?;
        }
        Ok::<(), String>(())
    });
    let want = n * e;
    let mut got = 0;
    let end = start + TIMEOUT;
    while got < want {
        match tokio::time::timeout_at(end.into(), events.recv()).await {
            Ok(Some(Seen { seq, .. })) if seq < e => got += 1,
            Ok(Some(_)) => {}
            Ok(None) => return Err(format!("every subscriber closed after {got} of {want} deliveries")),
            Err(_) => return Err(format!("only {got} of {want} deliveries within {TIMEOUT:?}")),
        }
    }
    let secs = start.elapsed().as_secs_f64();
    publishing.await.map_err(|e| e.to_string())??;
    let warm = secs / e.max(1) as f64;
    // One more event alone, warm, timed as the first was: the rate above
    // lets the drains of consecutive events overlap and share appends.
    let single = publish_to_all(&run, n, LAST, &mut events).await?;
    println!(
        "{what} subscribers={n} events={e} deliveries={got} secs={secs:.3} per_sec={:.0} first_secs={first:.4} warm_event_secs={warm:.5} first_over_warm={:.1} warm_single_secs={single:.4} first_over_single={:.1}",
        got as f64 / secs,
        first / warm,
        first / single
    );
    Ok(())
}

/// The `q` quantile of `sorted` (0.0 is the least, 1.0 the greatest; 0
/// when there is none).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        len => sorted[((len as f64 * q) as usize).min(len - 1)],
    }
}

/// For a profiler or the bench's CPU count (`FANOUT_READY` names a file):
/// says that the subscribers are open, then gives it time.
async fn say_ready() {
    if let Some(path) = std::env::var_os("FANOUT_READY") {
        let _ = std::fs::write(path, b"ready\n");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `lone`: `k` events, each published once the one before reached every
/// one of the `n` subscribers (settled first, so no event is cold).
async fn lone(run: Run, n: usize, k: usize) -> Result<(), String> {
    let mut events = open_subscribers(&run, n).await?;
    say_ready().await;
    let mut secs = Vec::with_capacity(k);
    for seq in 0..k {
        secs.push(publish_to_all(&run, n, seq, &mut events).await?);
        // The subscribers' readers are idle again before the next.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    secs.sort_by(f64::total_cmp);
    let at = |q| quantile(&secs, q);
    println!("lone subscribers={n} events={k} p50_secs={:.4} min_secs={:.4} max_secs={:.4}", at(0.5), at(0.0), at(1.0));
    Ok(())
}

/// `publishers` keep-alive connections posting `e` events in all, at once,
/// to `n` subscribers: the publish rate while every event is delivered.
async fn busy(run: Run, n: usize, e: usize, publishers: usize) -> Result<(), String> {
    let mut events = open_subscribers(&run, n).await?;
    let publishers = publishers.clamp(1, e.max(1));
    let next = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..publishers {
        clients.push(Client::connect(&run.addr).await?);
    }
    say_ready().await;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for mut client in clients {
        let (run, next) = (run.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let seq = next.fetch_add(1, Ordering::Relaxed);
                if seq >= e {
                    return Ok::<(), String>(());
                }
                publish(&run, &mut client, seq).await?;
            }
        }));
    }
    for task in tasks {
        task.await.map_err(|e| e.to_string())??;
    }
    let secs = start.elapsed().as_secs_f64();
    let mut seen = vec![vec![false; e]; n];
    let (want, mut got) = (n * e, 0);
    let end = Instant::now() + TIMEOUT;
    while got < want {
        match tokio::time::timeout_at(end.into(), events.recv()).await {
            Ok(Some(Seen { subscriber, seq, .. })) if seq < e && !seen[subscriber][seq] => {
                seen[subscriber][seq] = true;
                got += 1;
            }
            Ok(Some(_)) => {}
            Ok(None) => return Err(format!("every subscriber closed after {got} of {want} deliveries")),
            Err(_) => return Err(format!("only {got} of {want} deliveries within {TIMEOUT:?}")),
        }
    }
    println!("busy subscribers={n} publishers={publishers} events={e} secs={secs:.3} req_per_sec={:.0} deliveries={got}", e as f64 / secs);
    Ok(())
}

async fn latency(run: Run, samples: usize) -> Result<(), String> {
    const WARMUP: usize = 20;
    let mut events = open_subscribers(&run, 1).await?;
    let mut publisher = Client::connect(&run.addr).await?;
    let mut times = Vec::with_capacity(samples);
    for seq in 0..WARMUP + samples {
        let (path, body) = run.publish(seq);
        let sent = Instant::now();
        let (status, _) = publisher.post(&path, &body).await?;
        if !(200..300).contains(&status) {
            return Err(format!("publish {seq} answered {status}"));
        }
        loop {
            match tokio::time::timeout(TIMEOUT, events.recv()).await {
                Ok(Some(Seen { seq: got, at, .. })) if got == seq => {
                    if seq >= WARMUP {
                        times.push(at.duration_since(sent).as_secs_f64() * 1000.0);
                    }
                    break;
                }
                Ok(Some(_)) => continue,
                _ => return Err(format!("event {seq} did not arrive")),
            }
        }
    }
    times.sort_by(f64::total_cmp);
    let at = |q| quantile(&times, q);
    println!("latency n={samples} p50={:.3} p90={:.3} p99={:.3} ms", at(0.5), at(0.9), at(0.99));
    Ok(())
}

async fn hold(run: Run, n: usize) -> Result<(), String> {
    let _events = open_subscribers(&run, n).await?;
    println!("ready {n}");
    let _ = tokio::task::spawn_blocking(|| std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new())).await;
    Ok(())
}

/// Tunnels (and so CGI processes) the Apache of `apache` is sized for.
const APACHE_TUNNELS: usize = 2_000;

/// Runs pubsub.cgi under a private Apache until stdin closes.
fn apache(cgi: &str, store: &str) -> Result<(), String> {
    let store = std::path::Path::new(store);
    std::fs::create_dir_all(store).map_err(|e| format!("{}: {e}", store.display()))?;
    // Every tunnel holds a worker thread for its whole life. One child
    // process holds them all (MaxRequestWorkers = ThreadsPerChild):
    // mpm_event ties each connection to the child that accepted it, and a
    // keep-alive connection whose child has every thread taken by tunnels
    // waits for a thread that never comes (the stall at about 990 tunnels
    // of 16 children of 64 threads). ServerLimit leaves two more slots for
    // children finishing their tunnels after a graceful restart (with
    // none, no new child could start). Room for every tunnel, and for the
    // publisher and the route requests beside them. The client's
    // keep-alive connections (the publisher's, each route maker's) last
    // the whole run: no cap on their requests, no closing while the CGI
    // tunnels start. docs/DEPLOY.md, "Many open tunnels".
    let threads = APACHE_TUNNELS + 128;
    let conf = format!(
        "ServerLimit 3\nStartServers 1\nThreadLimit {threads}\nThreadsPerChild {threads}\n\
         MaxRequestWorkers {threads}\nMinSpareThreads 1\nMaxSpareThreads {threads}\nListenBacklog 4096\n\
         MaxKeepAliveRequests 0\nKeepAliveTimeout 120\nLogLevel warn\n"
    );
    let server = kn_test_support::Apache::start(std::path::Path::new(cgi), store, &conf);
    println!("apache port={} pid={} threads={threads}", server.port(), server.pid());
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
    drop(server);
    Ok(())
}

/// Room for 10,000 subscribers and more: the soft limit up to the hard one.
fn raise_open_file_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain system calls on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize| args.get(i).and_then(|v| v.parse::<usize>().ok());
    raise_open_file_limit();
    let server = match args.first().map(String::as_str) {
        Some("apache") => {
            let (Some(cgi), Some(store)) = (args.get(1), args.get(2)) else {
                eprintln!("{USAGE}");
                return std::process::ExitCode::from(2);
            };
            return match apache(cgi, store) {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("fanout-load: {e}");
                    std::process::ExitCode::FAILURE
                }
            };
        }
        Some("kn") => Server::Kn,
        Some("nchan") => Server::Nchan,
        _ => {
            eprintln!("{USAGE}");
            return std::process::ExitCode::from(2);
        }
    };
    let Some(addr) = args.get(1).cloned() else {
        eprintln!("{USAGE}");
        return std::process::ExitCode::from(2);
    };
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let run = Run { server, addr, nonce: format!("{:x}{:x}", nanos & 0xffff_ffff_ffff, std::process::id()) };
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("fanout-load: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let (mode, a, b, c) = (args.get(2).cloned().unwrap_or_default(), number(3), number(4), number(5));
    let result = runtime.block_on(async move {
        match (mode.as_str(), a, b) {
            ("fanout", Some(n), Some(e)) => fanout(run, n, e).await,
            ("restart", Some(n), Some(e)) if run.server == Server::Kn => restart(run, n, e).await,
            ("latency", Some(s), _) => latency(run, s).await,
            ("busy", Some(n), Some(e)) => busy(run, n, e, c.unwrap_or(8)).await,
            ("hold", Some(n), _) => hold(run, n).await,
            ("lone", Some(n), Some(k)) => lone(run, n, k).await,
            _ => Err(USAGE.to_string()),
        }
    });
    runtime.shutdown_background();
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fanout-load: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
