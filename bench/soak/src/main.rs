//! kn-soak: a year of traffic in an hour (issue 11, BENCHMARKS.md "Soak").
//!
//! Drives a real `pubsub-cgi serve` (or, with `--apache`, pubsub.cgi under
//! Apache) with N browser page loads, many at once. Each page load opens a
//! journal tunnel on `/who/<user>/s/<session>/kn_journal`, routes three
//! chat rooms into it, posts a few events to its rooms, waits until its
//! tunnel has delivered every event posted to its rooms while it was
//! subscribed (by itself or by any other page), and leaves: one in ten
//! deletes its routes first, the rest just vanish. Spread over the run,
//! 1,000 subscribe/unsubscribe cycles hit one hot topic.
//!
//! After the first checkpoint (1,000 page loads) and after N, with no page
//! load running, it prints the files, directories and bytes of the store,
//! the records of the hot topic's `kn_routes`, and the p50/p99 latency of
//! a probe notify on the hot topic (which has one live subscriber: the
//! driver's own probe tunnel). Every missed delivery is counted and
//! printed; the exit status is 1 if any event was missed or any request
//! failed. Time is compressed by the server's settings: pass them with
//! `--env KN_...=VALUE` (given to serve, or `SetEnv` under Apache).

mod client;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use client::{Client, Tunnel};
use kn_journal::{Store, Topic};
use kn_journal::internal::Usage;

/// The soak benchmark: N page loads against a real server, with the
/// store's growth and the notify latency before and after.
#[derive(Parser, Debug)]
#[command(name = "kn-soak", after_help = AFTER_HELP)]
struct Args {
    /// Page loads in all [default: 100000; with --quick, 300].
    #[arg(long, value_name = "N")]
    page_loads: Option<u64>,
    /// A smoke-test size: 300 page loads (unless --page-loads says
    /// otherwise), checkpoint at 100, 50 hot cycles, 100 probes, at most 50
    /// rooms (under 30 s against serve).
    #[arg(long)]
    quick: bool,
    /// Page loads running at once.
    #[arg(long, value_name = "N", default_value_t = 32)]
    concurrency: usize,
    /// Chat rooms (/soak/room/<k>) the pages subscribe to, three each.
    #[arg(long, value_name = "N", default_value_t = 500)]
    rooms: u64,
    /// Events each page load posts (to its own rooms, in turn).
    #[arg(long, value_name = "N", default_value_t = 2)]
    posts: u64,
    /// Subscribe/unsubscribe cycles on the hot topic, spread over the run.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    hot_cycles: u64,
    /// Page loads before the first figures.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    checkpoint: u64,
    /// Probe notifies timed at each checkpoint.
    #[arg(long, value_name = "N", default_value_t = 200)]
    probes: u64,
    /// Percent of page loads that delete their routes before leaving.
    #[arg(long, value_name = "PERCENT", default_value_t = 10)]
    unsubscribe_percent: u64,
    /// How long a page waits for an event it must receive.
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    receive_timeout_ms: u64,
    /// Run pubsub.cgi as a CGI under Apache instead of pubsub-cgi serve.
    #[arg(long)]
    apache: bool,
    /// The pubsub-cgi binary [default: beside this program].
    #[arg(long, value_name = "PATH")]
    serve_bin: Option<PathBuf>,
    /// A setting for the server, NAME=VALUE (repeatable): set in serve's
    /// environment, or SetEnv under Apache.
    #[arg(long = "env", value_name = "NAME=VALUE")]
    envs: Vec<String>,
    /// An extra argument for pubsub-cgi serve (repeatable).
    #[arg(long = "serve-arg", value_name = "ARG", allow_hyphen_values = true)]
    serve_args: Vec<String>,
    /// The event store [default: a temporary directory, removed at the end].
    #[arg(long, value_name = "DIR")]
    store: Option<PathBuf>,
}

const AFTER_HELP: &str = "\
Build first (the driver runs the pubsub-cgi beside it):
  cargo build --release -p kn-cgi -p kn-soak
  target/release/kn-soak --page-loads 20000
  target/release/kn-soak --quick --apache
Last line: soak: <N> page loads; files <a>-><b>; dirs <a>-><b>; bytes <a>-><b>; notify p50 <a>-><b> us";

const HOT: &str = "/soak/hot";
const PROBE_JOURNAL: &str = "/who/soak/s/probe/kn_journal";

fn main() -> ExitCode {
    let mut args = Args::parse();
    if args.quick {
        args.page_loads = args.page_loads.or(Some(300));
        args.checkpoint = 100;
        args.hot_cycles = 50;
        args.probes = 100;
        args.rooms = args.rooms.min(50);
    }
    let page_loads = *args.page_loads.get_or_insert(100_000);
    args.checkpoint = args.checkpoint.min(page_loads);
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(message) => {
            eprintln!("kn-soak: {message}");
            ExitCode::from(2)
        }
    }
}

/// The page loads asked for (set by `main`).
fn page_loads(args: &Args) -> u64 {
    args.page_loads.unwrap_or(100_000)
}

/// A running server, stopped when dropped.
enum Server {
    Serve(kn_test_support::Serve),
    Apache(kn_test_support::Apache),
}

impl Server {
    fn url(&self) -> String {
        match self {
            Server::Serve(s) => s.url(),
            Server::Apache(a) => a.url(),
        }
    }
}

fn start(args: &Args, root: &Path) -> Result<Server, String> {
    let bin = match &args.serve_bin {
        Some(b) => b.clone(),
        None => std::env::current_exe().map_err(|e| e.to_string())?.with_file_name("pubsub-cgi"),
    };
    if !bin.is_file() {
        return Err(format!("no pubsub-cgi at {} (build it: cargo build --release -p kn-cgi, or give --serve-bin)", bin.display()));
    }
    let mut envs = Vec::new();
    for pair in &args.envs {
        let (name, value) = pair.split_once('=').ok_or_else(|| format!("bad --env '{pair}': expected NAME=VALUE"))?;
        envs.push((name.to_string(), value.to_string()));
    }
    if args.apache {
        let conf: String = envs.iter().map(|(n, v)| format!("SetEnv {n} {v}\n")).collect();
        return Ok(Server::Apache(kn_test_support::Apache::start(&bin, root, &conf)));
    }
    let mut command = kn_test_support::Serve::command_of(&bin, root, None);
    command.args(&args.serve_args).envs(envs);
    Ok(Server::Serve(kn_test_support::Serve::spawn(command)))
}

/// An event a page posted: its payload (unique) and when its notify began.
struct Posted {
    token: String,
    start: Instant,
}

/// Everything shared by the page loads.
struct Run {
    client: Client,
    rooms: u64,
    posts: u64,
    unsubscribe_percent: u64,
    receive_timeout: Duration,
    /// Page loads per hot cycle (0: none).
    hot_every: u64,
    /// The events posted to each room, in the order their notifies
    /// returned.
    ledger: Mutex<HashMap<u64, Vec<Arc<Posted>>>>,
    delivered: AtomicU64,
    misses: Mutex<Vec<String>>,
    errors: Mutex<Vec<String>>,
    error_count: AtomicU64,
}

fn room(k: u64) -> String {
    format!("/soak/room/{k}")
}

/// Three distinct rooms for page `i`.
fn rooms_of(i: u64, rooms: u64) -> [u64; 3] {
    let rooms = rooms.max(3);
    let a = i.wrapping_mul(2_654_435_761) % rooms;
    let b = (a + 1 + i.wrapping_mul(40_503) % (rooms - 1)) % rooms;
    let mut c = (a + 1 + i.wrapping_mul(97) % (rooms - 1)) % rooms;
    while c == a || c == b {
        c = (c + 1) % rooms;
    }
    [a, b, c]
}

impl Run {
    fn error(&self, message: String) {
        self.error_count.fetch_add(1, Ordering::Relaxed);
        let mut errors = self.errors.lock().unwrap();
        if errors.len() < 20 {
            errors.push(message);
        }
    }

    fn ledger_len(&self, room: u64) -> usize {
        self.ledger.lock().unwrap().get(&room).map_or(0, Vec::len)
    }

    /// One browser page load.
    fn page_load(&self, i: u64) {
        if let Err(e) = self.try_page_load(i) {
            self.error(format!("page {i}: {e}"));
        }
    }

    fn try_page_load(&self, i: u64) -> Result<(), String> {
        let journal = format!("/who/u{}/s/{i}/kn_journal", i % 1000);
        let mut tunnel = self.client.tunnel(&journal)?;
        let rooms = rooms_of(i, self.rooms);
        for (k, r) in rooms.iter().enumerate() {
            self.client.route(&room(*r), &journal, &format!("p{i}r{k}"))?;
        }
        let subscribed = Instant::now();
        let marks: Vec<usize> = rooms.iter().map(|r| self.ledger_len(*r)).collect();
        if self.hot_every > 0 && i.is_multiple_of(self.hot_every) {
            let id = format!("hot{i}");
            self.client.route(HOT, &journal, &id)?;
            self.client.unroute(HOT, &id)?;
        }
        for p in 0..self.posts {
            let r = rooms[(p % 3) as usize];
            let posted = Arc::new(Posted { token: format!("ev_{i}_{p}_"), start: Instant::now() });
            self.client.notify(&room(r), &posted.token)?;
            self.ledger.lock().unwrap().entry(r).or_default().push(posted);
        }
        // Every event that began after this page subscribed and has been
        // stored by now must be in its journal: by this page or another.
        let expected: Vec<(u64, Arc<Posted>)> = {
            let ledger = self.ledger.lock().unwrap();
            rooms
                .iter()
                .zip(&marks)
                .flat_map(|(r, &m)| ledger.get(r).map_or(&[][..], |v| &v[m..]).iter().filter(|e| e.start > subscribed).map(move |e| (*r, e.clone())))
                .collect()
        };
        let needles: Vec<&[u8]> = expected.iter().map(|(_, e)| e.token.as_bytes()).collect();
        tunnel.wait_for(&needles, self.receive_timeout);
        let mut got = 0;
        for (r, e) in &expected {
            if tunnel.has(e.token.as_bytes()) {
                got += 1;
            } else {
                self.misses.lock().unwrap().push(format!("{} posted to {} missing from {journal}", e.token, room(*r)));
            }
        }
        self.delivered.fetch_add(got, Ordering::Relaxed);
        if i % 100 < self.unsubscribe_percent {
            for (k, r) in rooms.iter().enumerate() {
                self.client.unroute(&room(*r), &format!("p{i}r{k}"))?;
            }
        }
        drop(tunnel); // the page goes away
        Ok(())
    }
}

/// Runs page loads `range` with `concurrency` workers.
fn phase(run: &Arc<Run>, range: std::ops::Range<u64>, concurrency: usize, done: &AtomicU64, total: u64) {
    let next = AtomicU64::new(range.start);
    std::thread::scope(|s| {
        for _ in 0..concurrency.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= range.end {
                    return;
                }
                run.page_load(i);
                let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                if n.is_multiple_of(1000) {
                    eprintln!("kn-soak: {n}/{total} page loads");
                }
            });
        }
    });
}

/// The figures taken at a checkpoint.
struct Figures {
    usage: Usage,
    hot_records: usize,
    hot_active: usize,
    p50: u128,
    p99: u128,
    probe_misses: u64,
    /// Journals the sweep removed so far: at the first checkpoint, 0
    /// means the notifies were timed before the sweep had any work.
    removed: u64,
}

/// Times `probes` notifies on the hot topic (one at a time, no page load
/// running) and checks that the probe tunnel got each.
fn measure(run: &Run, store: &Store, probe: &mut Tunnel, label: &str, probes: u64, timeout: Duration) -> Result<Figures, String> {
    let mut times = Vec::new();
    let mut tokens = Vec::new();
    for j in 0..probes {
        let token = format!("probe_{label}_{j}_");
        let start = Instant::now();
        run.client.notify(HOT, &token)?;
        times.push(start.elapsed().as_micros());
        tokens.push(token);
    }
    let needles: Vec<&[u8]> = tokens.iter().map(|t| t.as_bytes()).collect();
    probe.wait_for(&needles, timeout);
    let probe_misses = tokens.iter().filter(|t| !probe.has(t.as_bytes())).count() as u64;
    for t in tokens.iter().filter(|t| !probe.has(t.as_bytes())) {
        run.misses.lock().unwrap().push(format!("{t} posted to {HOT} missing from {PROBE_JOURNAL}"));
    }
    probe.forget();
    times.sort_unstable();
    let pick = |q: f64| times.get(((times.len() as f64 * q) as usize).min(times.len().saturating_sub(1))).copied().unwrap_or(0);
    let hot = Topic::parse(HOT).map_err(|e| e.to_string())?;
    let routes_topic = Topic::parse(&format!("{HOT}/kn_routes")).map_err(|e| e.to_string())?;
    Ok(Figures {
        usage: store.usage().map_err(|e| e.to_string())?,
        hot_records: store.stat(&routes_topic).map_err(|e| e.to_string())?.records,
        hot_active: store.routes(&hot).map_err(|e| e.to_string())?.len(),
        p50: pick(0.50),
        p99: pick(0.99),
        probe_misses,
        removed: store.counters().map_err(|e| e.to_string())?.get(kn_journal::internal::Counter::JournalsRemoved),
    })
}

fn print_figures(n: u64, elapsed: Duration, f: &Figures) {
    println!(
        "after {n} page loads ({:.1} s, load average {}): files {}, dirs {}, bytes {}, journals {} ({} removed so far); hot kn_routes {} records ({} active); notify p50 {} us, p99 {} us; probe misses {}",
        elapsed.as_secs_f64(),
        load_average(),
        f.usage.files,
        f.usage.directories,
        f.usage.bytes,
        f.usage.journals,
        f.removed,
        f.hot_records,
        f.hot_active,
        f.p50,
        f.p99,
        f.probe_misses
    );
}

/// The machine's load average over the last minute (`/proc/loadavg`):
/// the notify latency follows it more than anything in the store, so it
/// is printed beside each checkpoint's figures.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").ok().and_then(|l| l.split_whitespace().next().map(str::to_string)).unwrap_or_else(|| "?".into())
}

fn run(args: &Args) -> Result<bool, String> {
    let temp = tempfile::Builder::new().prefix("kn-soak").tempdir().map_err(|e| e.to_string())?;
    let root = args.store.clone().unwrap_or_else(|| temp.path().join("kn_events"));
    std::fs::create_dir_all(&root).map_err(|e| format!("cannot create {}: {e}", root.display()))?;
    let server = start(args, &root)?;
    let client = Client::new(&server.url(), args.concurrency * 2 + 4);
    println!(
        "kn-soak: {} at {}, store {}; {} page loads, {} at once, {} rooms, {} posts each, {} hot cycles, {}% unsubscribe; settings {:?}",
        if args.apache { "pubsub.cgi under Apache" } else { "pubsub-cgi serve" },
        server.url(),
        root.display(),
        page_loads(args),
        args.concurrency,
        args.rooms,
        args.posts,
        args.hot_cycles,
        args.unsubscribe_percent,
        args.envs
    );
    let store = Store::open(&root).map_err(|e| e.to_string())?;
    let mut probe = client.tunnel(PROBE_JOURNAL)?;
    client.route(HOT, PROBE_JOURNAL, "probe")?;
    let hot_every = page_loads(args).checked_div(args.hot_cycles).map_or(0, |n| n.max(1));
    let run = Arc::new(Run {
        client: client.clone(),
        rooms: args.rooms,
        posts: args.posts,
        unsubscribe_percent: args.unsubscribe_percent,
        receive_timeout: Duration::from_millis(args.receive_timeout_ms),
        hot_every,
        ledger: Mutex::new(HashMap::new()),
        delivered: AtomicU64::new(0),
        misses: Mutex::new(Vec::new()),
        errors: Mutex::new(Vec::new()),
        error_count: AtomicU64::new(0),
    });
    let timeout = Duration::from_millis(args.receive_timeout_ms);
    let started = Instant::now();
    let done = AtomicU64::new(0);
    phase(&run, 0..args.checkpoint, args.concurrency, &done, page_loads(args));
    let first = measure(&run, &store, &mut probe, "first", args.probes, timeout)?;
    print_figures(args.checkpoint, started.elapsed(), &first);
    phase(&run, args.checkpoint..page_loads(args), args.concurrency, &done, page_loads(args));
    let last = measure(&run, &store, &mut probe, "last", args.probes, timeout)?;
    print_figures(page_loads(args), started.elapsed(), &last);

    let misses = run.misses.lock().unwrap();
    let errors = run.errors.lock().unwrap();
    let error_count = run.error_count.load(Ordering::Relaxed);
    println!(
        "deliveries checked {}, missed {}; failed page loads {}; requests retried after a closed connection {}",
        run.delivered.load(Ordering::Relaxed) + 2 * args.probes - first.probe_misses - last.probe_misses,
        misses.len(),
        error_count,
        client.retries()
    );
    for m in misses.iter().take(50) {
        println!("MISSED {m}");
    }
    for e in errors.iter() {
        println!("ERROR {e}");
    }
    if let Ok(text) = metrics(&server) {
        let nonzero: Vec<&str> = text.lines().filter(|l| l.starts_with("kn_") && (l.contains("_total ") || l.contains("_total{")) && !l.ends_with(" 0")).collect();
        println!("server counters: {}", if nonzero.is_empty() { "all 0".to_string() } else { nonzero.join(", ") });
    }
    println!(
        "soak: {} page loads; files {}->{}; dirs {}->{}; bytes {}->{}; notify p50 {}->{} us",
        page_loads(args),
        first.usage.files,
        last.usage.files,
        first.usage.directories,
        last.usage.directories,
        first.usage.bytes,
        last.usage.bytes,
        first.p50,
        last.p50
    );
    drop(server);
    if args.store.is_none() {
        eprintln!("kn-soak: removing the temporary store {} (--store DIR keeps it)", root.display());
    }
    Ok(misses.is_empty() && error_count == 0)
}

/// serve's `/metrics` page (none under Apache).
fn metrics(server: &Server) -> Result<String, String> {
    let Server::Serve(serve) = server else { return Err("no /metrics under Apache".into()) };
    let agent: ureq::Agent = ureq::Agent::config_builder().timeout_global(Some(Duration::from_secs(30))).build().into();
    let mut reply = agent.get(format!("{}/metrics", serve.base)).call().map_err(|e| e.to_string())?;
    reply.body_mut().read_to_string().map_err(|e| e.to_string())
}
