//! `pubsub-cgi serve`: the built-in HTTP/1.1 server.
//!
//! Durable Streams are served at `/v1/stream/` ([`crate::streams`]).
//!
//! It mounts the very same [`Handler`] a CGI process runs at `/kn`, in one
//! persistent process sharing one [`Store`] (the speed mod_perl gave the
//! original), and for every other path serves the pages of `www/` built
//! into the binary ([`pages`](crate::pages)), or the files of a directory
//! ([`ServeConfig::static_dir`]). Put it behind a web server's reverse
//! proxy (Apache `mod_proxy`, nginx `proxy_pass`) or use it directly.
//!
//! The async workers never wait for a lock: every request (notify, route,
//! batch, ...) runs as blocking work, where it may wait for a topic's lock
//! (held by a compaction for seconds), a remote URL or `fdatasync` without
//! holding up anyone else: up to four at once on the worker that received
//! them, made a blocking thread for the while (tokio's `block_in_place`: a
//! thread of the runtime's blocking pool, which keeps room for it, stands
//! in as a worker), so that they start without a hand-over; beyond that
//! queued for a bounded pool of their own. The one exception is a notify
//! that the store can make at once ([`Handler::handle_nowait`]: one append
//! to a topic whose files are open already, whose lock no one holds, no
//! sync, and with routes at most four copies to topics of this store, each
//! lock free too), answered on the async worker: the
//! hand-over to the pool and back would cost more than it; such notifies
//! to one topic arriving together are made as one group (group commit,
//! crate::serve_gather), each answered as alone. A tunnel is a
//! task awaiting a wakeup (a `Future`): no thread and no process per idle
//! tunnel, so thousands of browsers can each hold one open. Its reads of
//! the topic's files take no lock and read only what is new (a `statx`
//! and one `pread` from the page cache of the segment it keeps open; what
//! this process appended itself it is handed as written, and only a
//! `statx` says the file holds nothing more), so the task makes them
//! itself: a fan-out to a thousand tunnels then costs no hand-over to
//! another thread and back per delivery. Ending a tunnel (its journal made
//! stale, its watch dropped) runs on a small pool of its own.
//!
//! Connections and tunnels are capped ([`ServeConfig::max_connections`],
//! [`ServeConfig::max_tunnels`]): past a cap the request is answered
//! `503 Service Unavailable` with `Retry-After`, never accepted without
//! bound.
//!
//! At `/metrics` ([`ServeConfig::metrics`], on by default) it answers the
//! store's counters and size in the Prometheus text format (the same page
//! as `kn stat --prometheus`, its size figures from a walk made at most
//! once per `KN_METRICS_REFRESH_MS`), plus its own figures, under the
//! access rules ([`crate::metrics_http`]).
//!
//! ```no_run
//! use kn_cgi::serve::{serve, ServeConfig};
//!
//! let config = ServeConfig::new("127.0.0.1:8080".parse().unwrap(), "kn_events");
//! serve(config).unwrap(); // until Ctrl-C
//! ```

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue, CONNECTION, CONTENT_LENGTH};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::StatusCode;
use hyper_util::rt::{TokioIo, TokioTimer};
use kn_journal::{Config, Store};
use kn_wire::{status_event, Format, Page, Params};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::auth::Authentication;
pub use crate::body::Body;
use crate::body::{plain, plain_owned};
use crate::pool::Pool;
use crate::handler::{AfterReply, Handler, Options, Reply, TunnelReply};
use crate::serve_auth::{Gate, Refusal};
use crate::serve_body::{BodyBudget, Refused};
use crate::request::{HttpRequest, Limits, Request};
use crate::response::Response;
use crate::serve_held::{ConnIo, Ended, HandOff, Held};
use crate::shutdown::{Closing, Shutdown};
use crate::{Error, ErrorKind};

// A child of this module, so that a socket is opened with the server's
// own parts (its gate, handler, pools and caps), as a tunnel is.
#[path = "websocket/mod.rs"]
mod websocket;

/// Where the protocol is mounted: the path the JavaScript library expects
/// by default (PROTOCOL.md 3.8).
pub const MOUNT: &str = "/kn";

/// Where the Prometheus figures are served ([`ServeConfig::metrics`]).
pub const METRICS_PATH: &str = "/metrics";

/// How often `serve` gives the memory malloc holds free back to the
/// system ([`give_back_freed_memory`]).
const TRIM_EVERY: Duration = Duration::from_secs(5);

/// One-shot requests running at once: [`IN_PLACE`] on the async workers,
/// the rest on a pool of their own (a runtime of its own, [`Pool`]).
/// Bounded so that a burst of requests (a thousand browsers reconnecting
/// at once) cannot become a thousand threads; enough that a few slow
/// remote routes do not stall every other request. The main runtime's own
/// blocking pool (Durable Streams, the sweep) has as many, and
/// room for the async workers' stand-ins besides.
const BLOCKING_THREADS: usize = 32;

/// One-shot requests that may run at once on the async worker that
/// received them, made a blocking thread for the while
/// (`block_in_place`). Each needs a thread of the main runtime's blocking
/// pool to stand in as a worker meanwhile: that pool has room for this
/// many beyond its [`BLOCKING_THREADS`], and requests waiting for a thread
/// queue in a pool of their own, so that they can never take the stand-ins'
/// threads (a worker without a stand-in would stall every tunnel of its
/// tasks until its request is done).
const IN_PLACE: usize = 4;

/// Threads that end tunnels (expire a journal, drop a watch) and make
/// their reads that may be large (crate::serve_tunnel): a pool of their
/// own, see the module documentation.
const TUNNEL_READ_THREADS: usize = 4;

/// The largest request body parsed on an async worker, for a notify that
/// may be answered there ([`Handler::handle_nowait`]); a larger one is
/// parsed on the blocking pool.
const NOWAIT_BODY: usize = 16 * 1024;

pub use crate::body::RETRY_AFTER_SECS;

/// Connections past [`ServeConfig::max_connections`] that may wait at once
/// for their `503` (each for at most [`REFUSAL_TIMEOUT`]); more are closed
/// at once.
const REFUSALS: usize = 64;

/// How long a refused connection may take to send its request.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(2);

/// How `serve` runs.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The address to listen on (port 0 picks a free port).
    pub listen: SocketAddr,
    /// The event store's root directory.
    pub root: PathBuf,
    /// The directory of static files served for paths outside `/kn`;
    /// `None` serves the pages built into the binary
    /// ([`pages`](crate::pages)) instead.
    pub static_dir: Option<PathBuf>,
    /// This server's URL (routes and `kn_routed_from` use it); `None` means
    /// `http://<listen address>/kn`.
    pub public_url: Option<String>,
    /// The handler's settings.
    pub options: Options,
    /// Most connections open at once; past it a new connection is answered
    /// `503` and closed. `None`: half the open-file limit (after raising the
    /// soft limit to the hard one), at least 16 (`--max-connections`,
    /// `KN_MAX_CONNECTIONS`).
    pub max_connections: Option<usize>,
    /// Most tunnels open at once; past it a tunnel request is answered with
    /// a `503` status event. `None`: seven eighths of the connections, so
    /// that one-shot requests still get through when tunnels fill up
    /// (`--max-tunnels`, `KN_MAX_TUNNELS`).
    pub max_tunnels: Option<usize>,
    /// Whether `GET /metrics` answers the Prometheus figures (default:
    /// yes; `--no-metrics` turns it off, and `/metrics` is then an
    /// ordinary static path).
    pub metrics: bool,
    /// Where each request is logged, if anywhere (`--access-log`).
    pub access_log: Option<Arc<crate::access_log::AccessLog>>,
    /// Who makes each request (docs/ACCESS.md): by default no one is
    /// trusted and every request is anonymous.
    pub auth: Arc<Authentication>,
}

impl ServeConfig {
    /// Serves the store at `root` on `listen`, and the built-in pages.
    pub fn new(listen: SocketAddr, root: impl Into<PathBuf>) -> ServeConfig {
        ServeConfig {
            listen,
            root: root.into(),
            static_dir: None,
            public_url: None,
            options: Options::default(),
            max_connections: None,
            max_tunnels: None,
            metrics: true,
            access_log: None,
            auth: Arc::new(Authentication::default()),
        }
    }

    /// The connection and tunnel caps in force, given the open-file limit.
    pub fn caps(&self, open_files: u64) -> (usize, usize) {
        let connections =
            self.max_connections.unwrap_or_else(|| usize::try_from(open_files / 2).unwrap_or(usize::MAX).max(16));
        let tunnels = self.max_tunnels.unwrap_or(connections - connections / 8);
        (connections, tunnels)
    }
}

/// Runs the server until Ctrl-C (SIGINT) or SIGTERM, then stops within
/// `Config::shutdown_grace` (see `shutdown.rs`). Prints when ready
/// `knpubsub serving http://ADDR/kn (store DIR)`, then where the pages are:
/// `knpubsub pages at http://ADDR/ (...)`.
///
/// Errors: the store cannot be opened, the address cannot be bound.
pub fn serve(config: ServeConfig) -> Result<(), Error> {
    kn_journal::internal::raise_open_file_limit(u64::MAX);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(BLOCKING_THREADS + IN_PLACE)
        .thread_name("kn-serve")
        .build()
        .map_err(|e| Error::io("cannot start the async runtime", e))?;
    let requests = Pool::start(BLOCKING_THREADS - IN_PLACE, "kn-request")?;
    let result = runtime.block_on(run(config, requests.handle()));
    // Give what still runs (a sweep slice, a request past the grace) what
    // is left of the grace, a second at most, then drop the rest.
    let left = result.as_ref().map_or(Duration::ZERO, |deadline| deadline.saturating_duration_since(std::time::Instant::now()));
    runtime.shutdown_timeout(left.min(Duration::from_secs(1)) / 2);
    requests.shut_down(left.min(Duration::from_secs(1)) / 2);
    result.map(|_| ())
}

/// Serves until a signal, with one-shot requests not run in place on
/// `requests` (a [`Pool`]'s); returns when the server must be gone.
async fn run(config: ServeConfig, requests: tokio::runtime::Handle) -> Result<std::time::Instant, Error> {
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| Error::io(&format!("cannot listen on {}", config.listen), e))?;
    let local = listener.local_addr().map_err(|e| Error::io("cannot read the listening address", e))?;
    let names = own_names(local, config.public_url.as_deref());
    let shutdown = Shutdown::new();
    let server = Arc::new(Server::new(config, local, requests, shutdown.closing())?);
    // The tools on this store (kn-post, kn-mail, kn) must take the URLs
    // clients reach this server by for local ones, as it does.
    server
        .store
        .record_server_names(kn_journal::internal::own_host_name(), &names)
        .map_err(|e| Error::io("cannot record the server's names in the store", std::io::Error::other(e.to_string())))?;
    tokio::spawn(sweeper(server.store.clone()));
    tokio::spawn(give_back_freed_memory());
    println!("knpubsub serving http://{local}{MOUNT} (store {})", server.store.root().display());
    let pages = server.static_dir.as_ref().map_or("the chat, topic browser and ping pages".into(), |d| format!("files of {}", d.display()));
    println!("knpubsub pages at http://{local}/ ({pages})");
    let mut signal = std::pin::pin!(crate::shutdown::signal());
    let refusals = Arc::new(Semaphore::new(REFUSALS));
    tokio::spawn(retry_lagging_forwarding(server.store.clone()));
    tokio::spawn(refresh_names(server.store.clone(), names));
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    // Tunnel pieces are small and must leave at once.
                    let _ = stream.set_nodelay(true);
                    match server.connections.clone().try_acquire_owned() {
                        Ok(permit) => {
                            // Its own wakes (a request body read) poll it again
                            // at once instead of moving it to another worker.
                            let watcher = shutdown.watcher();
                            tokio::spawn(crate::wake::coalesced(connection(server.clone(), stream, peer, permit, watcher)));
                        }
                        // Full: answer 503 if few are waiting for that,
                        // else close at once (dropping the stream).
                        Err(_) => if let Ok(refusal) = refusals.clone().try_acquire_owned() {
                            tokio::spawn(refuse(server.clone(), stream, refusal));
                        },
                    }
                }
                Err(err) => {
                    // Out of file descriptors, most likely: let some close.
                    eprintln!("pubsub-cgi serve: accept failed: {err}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = &mut signal => break,
        }
    }
    drop(listener);
    let deadline = std::time::Instant::now() + server.store.config().shutdown_grace;
    let open = shutdown.stop(deadline).await;
    if open > 0 {
        eprintln!("pubsub-cgi serve: stopping with {open} connection(s) still open after the shutdown grace");
    }
    Ok(deadline)
}

/// The sweep in the background (kn-journal's `Store::sweep`): a slice
/// every `sweep_interval`, on the blocking pool, for as long as the server
/// runs, and slices back to back while the sweep is behind. Slices of
/// other processes (pubsub.cgi, `kn gc`) share its queue.
async fn sweeper(store: Arc<Store>) {
    let interval = store.config().sweep_interval.max(Duration::from_millis(100));
    loop {
        tokio::time::sleep(interval).await;
        while store.sweep_due() {
            let store = store.clone();
            let slice = tokio::task::spawn_blocking(move || store.sweep(store.config().sweep_budget)).await;
            if !matches!(slice, Ok(Ok(ref report)) if report.behind) {
                break;
            }
        }
    }
}

/// In the background, every [`TRIM_EVERY`]: the pages malloc holds
/// free are given back to the system (`malloc_trim`). A held tunnel
/// frees its connection's hyper buffers once its head is out
/// (crate::serve_held), but glibc keeps freed chunks between live ones
/// resident: at 10,000 held, 20 % of the RSS (issue 31, memory per idle
/// subscriber; docs/benchmarks/fanout.md). Only `serve` does this, never
/// the CGI.
async fn give_back_freed_memory() {
    let mut every = tokio::time::interval(TRIM_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim only returns free pages; it takes the arenas' locks.
        let _ = tokio::task::spawn_blocking(|| unsafe { libc::malloc_trim(0) }).await;
    }
}

/// In the background, once a second: the deliveries waiting in the
/// store's outbox for a retry (a route that failed transiently) or a
/// population, whose topic may see no other post for a long time.
async fn retry_lagging_forwarding(store: Arc<Store>) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let store = store.clone();
        let _ = tokio::task::spawn_blocking(move || store.complete_lagging_forwarding()).await;
    }
}

/// Serves one connection; `_permit` counts it against the cap until it
/// closes; `_watcher` until it closes too, the server's stop closing it
/// after its response (through `closing`, as hyper-util's `Watcher::watch`
/// would). A tunnel's socket is taken back from hyper once its head is
/// written and served by crate::serve_held, then handed to a new hyper
/// connection if the client keeps it after the tunnel.
async fn connection(
    server: Arc<Server>,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    _permit: OwnedSemaphorePermit,
    _watcher: hyper_util::server::graceful::Watcher,
) {
    let mut closing = server.closing.clone();
    let mut io = ConnIo::new(stream);
    let socket = websocket::Slot::default();
    loop {
        let handoff = io.next_handoff();
        let for_requests = server.clone();
        let for_socket = socket.clone();
        let service = service_fn(move |mut request: hyper::Request<Incoming>| {
            request.extensions_mut().insert(handoff.clone());
            request.extensions_mut().insert(for_socket.clone());
            let answering = handoff.answering();
            let server = for_requests.clone();
            // Boxed: hyper keeps the allocation of a request's future for
            // as long as its connection lives (reused for the next
            // request), and `respond`'s is about 3.5 KiB; boxed, only the
            // pointer stays (issue 31, memory per idle subscriber).
            let answer: Pin<Box<dyn Future<Output = Result<hyper::Response<Body>, Infallible>> + Send>> =
                Box::pin(async move {
                    let reply = server.respond(request, peer).await;
                    drop(answering);
                    Ok::<_, Infallible>(reply)
                });
            answer
        });
        // Boxed, so that the task holding a tunnel does not keep room
        // for hyper's connection once it is gone.
        let mut serving = Box::new(http1::Builder::new().timer(TokioTimer::new()).serve_connection(TokioIo::new(io), service));
        let mut told = false;
        let served = loop {
            if !told && closing.is_closing() {
                Pin::new(&mut *serving).graceful_shutdown();
                told = true;
            }
            tokio::select! {
                served = std::future::poll_fn(|cx| serving.poll_without_shutdown(cx)) => break served,
                _ = closing.wait(), if !told => {}
            }
        };
        let parts = serving.into_parts();
        io = parts.io.into_inner();
        // A tunnel whose head hyper wrote whole is held even if hyper then
        // failed (the end of the stream in the middle of a request sent
        // behind it: its bytes come back in `read_buf`, for after the
        // tunnel). Any other failed connection (the client went away)
        // concerns no one else.
        let held = io.back(parts.read_buf);
        let Some(held) = held else {
            // A WebSocket its last request opened (crate::serve::websocket).
            let Err(io) = websocket::follow(server.clone(), &socket, io).await else { return };
            if served.is_ok() {
                io.shut_down().await;
            }
            return;
        };
        let reader = server.readers.handle();
        match crate::serve_held::follow(server.store.clone(), reader, held, &mut io, server.closing.clone()).await {
            // After a failure, no more requests on this connection.
            Ended::Keep if served.is_ok() && !closing.is_closing() => continue,
            _ => return io.shut_down().await,
        }
    }
}

/// Answers the first request of a connection past the cap with `503` and
/// closes it (reading the request first, so that the client sees the
/// answer rather than a reset).
async fn refuse(server: Arc<Server>, stream: tokio::net::TcpStream, _refusal: OwnedSemaphorePermit) {
    let limit = server.caps.0;
    let service = service_fn(move |request: hyper::Request<Incoming>| {
        let server = server.clone();
        async move {
            let query = request.uri().query().unwrap_or("").as_bytes().to_vec();
            let message = format!("too many connections: this server holds at most {limit} at once");
            let mut reply = server.busy(&query, &message);
            reply.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
            server.figures.record(crate::metrics_http::method_index(request.method()), reply.status());
            Ok::<_, Infallible>(reply)
        }
    });
    let serving = http1::Builder::new().keep_alive(false).serve_connection(TokioIo::new(stream), service);
    let _ = tokio::time::timeout(REFUSAL_TIMEOUT, serving).await;
}

/// The soft open-file limit (a server holding thousands of tunnels needs
/// as many descriptors: [`serve`] raises it to the hard one first).
fn open_files_limit() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: a plain system call on a local struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return 1024;
    }
    limit.rlim_cur
}

/// What every request shares.
struct Server {
    handler: Handler,
    store: Arc<Store>,
    limits: Limits,
    /// Canonical, so that a resolved file can be checked to lie inside;
    /// `None` for the built-in pages.
    static_dir: Option<PathBuf>,
    local: SocketAddr,
    /// The connection and tunnel caps in force.
    caps: (usize, usize),
    /// One permit per open connection.
    connections: Arc<Semaphore>,
    /// One permit per open tunnel.
    tunnels: Arc<Semaphore>,
    /// The pool that ends tunnels.
    readers: Pool,
    /// The pool that runs one-shot requests not run in place (shut down
    /// by [`serve`], after the runtime, giving them a moment to finish).
    pool: tokio::runtime::Handle,
    /// Whether `/metrics` is served.
    metrics: bool,
    access_log: Option<Arc<crate::access_log::AccessLog>>,
    /// Requests answered so far (every path, `/metrics` included).
    requests: AtomicU64,
    /// What `/metrics` answers besides (crate::metrics_http).
    figures: crate::metrics_http::Figures,
    /// Who makes a request: checks off the event loop (crate::serve_auth).
    gate: Gate,
    /// The bytes of request bodies held at once (crate::serve_body).
    budget: BodyBudget,
    /// Durable Streams at `/v1/stream/` (crate::streams); `None` when
    /// turned off (`KN_STREAMS=off`: `404`).
    streams: Option<Arc<kn_streams::Streams>>,
    /// Requests running on an async worker made a blocking thread (at
    /// most [`IN_PLACE`]).
    in_place: AtomicUsize,
    /// Whether the server is stopping: tunnels then end.
    closing: Closing,
    /// Small notifies gathered by topic, made together
    /// (crate::serve_gather).
    gathering: crate::serve_gather::Gathering,
}

/// A request's turn to run on its async worker ([`IN_PLACE`]); given back
/// when dropped.
struct InPlace<'a>(&'a AtomicUsize);

impl InPlace<'_> {
    fn enter(running: &AtomicUsize) -> Option<InPlace<'_>> {
        running.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < IN_PLACE).then_some(n + 1)).ok()?;
        Some(InPlace(running))
    }
}

impl Drop for InPlace<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Server {
    fn new(config: ServeConfig, local: SocketAddr, pool: tokio::runtime::Handle, closing: Closing) -> Result<Server, Error> {
        let mut store_config = Config::new(&config.root).with_env()?;
        let listened = format!("http://{local}{MOUNT}");
        store_config.server_url = Some(config.public_url.clone().or(store_config.server_url.take()).unwrap_or_else(|| listened.clone()));
        let limits = Limits::for_store(&store_config);
        let gate = Gate::new(config.auth.clone(), &store_config)?;
        let budget = BodyBudget::new(store_config.body_budget_bytes);
        let streams_config = kn_streams::StreamsConfig::from_env()?;
        let caps = config.caps(open_files_limit());
        let readers = Pool::start(TUNNEL_READ_THREADS, "kn-tunnel-read")?;
        let store = Store::open_with(store_config)?;
        let store = Arc::new(kn_push::wire(store).map_err(|e| kn_journal::Error::new(kn_journal::ErrorKind::BadRequest, e.to_string()))?);
        let static_dir = match config.static_dir {
            Some(dir) => Some(
                dir.canonicalize().map_err(|e| Error::io(&format!("cannot open static directory '{}'", dir.display()), e))?,
            ),
            None => None,
        };
        Ok(Server {
            handler: Handler::new(store.clone(), config.options),
            gate,
            budget,
            limits,
            static_dir,
            local,
            caps,
            connections: Arc::new(Semaphore::new(caps.0)),
            tunnels: Arc::new(Semaphore::new(caps.1)),
            readers,
            pool,
            metrics: config.metrics,
            access_log: config.access_log,
            requests: AtomicU64::new(0),
            in_place: AtomicUsize::new(0),
            closing,
            gathering: Default::default(),
            streams: streams_config.enabled.then(|| Arc::new(kn_streams::Streams::watched(store.clone()).with_config(streams_config))),
            figures: crate::metrics_http::Figures::new(store.clone()),
            store,
        })
    }

    async fn respond(self: Arc<Self>, request: hyper::Request<Incoming>, peer: SocketAddr) -> hyper::Response<Body> {
        let method = crate::metrics_http::method_index(request.method());
        let logged = self.access_log.as_ref().map(|log| log.entry(&request, peer));
        let reply = self.clone().dispatch(request, peer).await;
        self.figures.record(method, reply.status());
        if let Some(entry) = logged {
            entry.answered(&reply);
        }
        reply
    }

    async fn dispatch(self: Arc<Self>, request: hyper::Request<Incoming>, peer: SocketAddr) -> hyper::Response<Body> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let path = request.uri().path();
        if self.metrics && path == METRICS_PATH {
            return self.metrics(&request, peer).await;
        }
        if path.starts_with(crate::streams::PREFIX) {
            return self.stream_request(request, peer).await;
        }
        if (path == MOUNT || path.starts_with("/kn/")) && websocket::asked(&request) {
            return self.websocket(request, peer).await;
        }
        if path == MOUNT || path.starts_with("/kn/") {
            let path_info = path.as_bytes()[MOUNT.len()..].to_vec();
            return self.pubsub(request, path_info, peer).await;
        }
        crate::static_files::answer(self.static_dir.as_deref(), request).await
    }

    // ----- the protocol at /kn ---------------------------------------------

    async fn pubsub(self: Arc<Self>, request: hyper::Request<Incoming>, path_info: Vec<u8>, peer: SocketAddr) -> hyper::Response<Body> {
        let (parts, incoming) = request.into_parts();
        let handoff = parts.extensions.get::<Arc<HandOff>>().cloned();
        let query = parts.uri.query().unwrap_or("").as_bytes().to_vec();
        let head_request = parts.method == hyper::Method::HEAD;
        let max = self.limits.max_body();
        // Refuse an announced oversized body before reading any of it; the
        // connection is closed rather than drained.
        let announced = content_length(&parts.headers);
        if let Some(length) = announced {
            if length > max {
                return self.failure(&query, &Error::new(ErrorKind::TooLarge, too_large(length, max)));
            }
        }
        let headers: Vec<(String, Vec<u8>)> = parts.headers.iter().map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec())).collect();
        // Who it is, before its body is read: a password check runs on a
        // pool of its own, never here (crate::serve_auth).
        let remote_user = match self.gate.identify(&headers, peer.ip()).await {
            Ok(user) => user,
            Err(refusal) => return self.refused(&query, &refusal),
        };
        // The body, within its share of the budget across requests; held
        // until the answer is made.
        let (body, _held) = match self.budget.collect(incoming, max, announced).await {
            Ok(taken) => taken,
            Err(Refused::TooLarge(message)) => return self.failure(&query, &Error::new(ErrorKind::TooLarge, message)),
            Err(Refused::Busy(message)) => {
                let mut reply = self.busy(&query, &message);
                reply.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
                return reply;
            }
            Err(Refused::Unreadable(message)) => return self.failure(&query, &Error::new(ErrorKind::BadRequest, message)),
        };
        let http = HttpRequest {
            method: parts.method.as_str().to_owned(),
            path_info,
            query: query.clone(),
            headers,
            remote_user,
            body: body.into(),
            script_name: MOUNT.to_owned(),
            server_name: self.local.ip().to_string(),
            server_port: self.local.port(),
            ..HttpRequest::default()
        };
        // A small notify the store can make at once (a few writes to files
        // open already, under a lock no one holds) is answered here: the
        // hand-over to the blocking pool and back would cost more than the
        // post.
        let request = if http.body.len() <= NOWAIT_BODY {
            let request = match Request::from_http(http, &self.limits) {
                Ok(request) => request,
                Err(err) => return self.failure(&query, &err),
            };
            // Those to one topic in hand at once are made together
            // (crate::serve_gather).
            match self.handler.nowait_topic(&request) {
                Some(topic) => {
                    let server = self.clone();
                    let make = move |topic: Vec<u8>| drop(tokio::spawn(async move { server.gathering.make(&server.handler, &topic).await }));
                    match self.gathering.notify(topic, request, make).await {
                        Ok(response) => return one_shot(response, head_request),
                        Err(Some(request)) => Ok(request),
                        Err(None) => return self.failure(&query, &Error::new(ErrorKind::Io, "a notify made with others got no answer (a bug: please report it)")),
                    }
                }
                None => Ok(request),
            }
        } else {
            Err(http)
        };
        let server = self.clone();
        let work = move || {
            let request = match request {
                Ok(request) => request,
                Err(http) => Request::from_http(http, &server.limits)?,
            };
            Ok::<_, Error>(server.handler.handle_deferring(&request))
        };
        // Off the async workers: a request may wait for a topic's lock.
        // Up to IN_PLACE at once run on this thread, which stops being an
        // async worker until the request is done (a thread of the blocking
        // pool takes its tasks over meanwhile), so that the request starts
        // at once rather than after a hand-over to a pool thread; the rest
        // queue for the request pool. No request may panic; should one, it
        // alone is answered 500.
        let panicked = || Error::new(ErrorKind::Io, "the request handler panicked (a bug: please report it)");
        let handled = match InPlace::enter(&self.in_place) {
            Some(_slot) => tokio::task::block_in_place(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))).map_err(|_| panicked()),
            None => self.pool.spawn_blocking(work).await.map_err(|join| {
                if join.is_panic() {
                    panicked()
                } else {
                    Error::new(ErrorKind::Io, format!("the request handler failed: {join}"))
                }
            }),
        };
        match handled {
            Ok(Ok((Reply::Done(response), after))) => {
                let (deferred, populations) = after.split();
                if !deferred.is_empty() {
                    // A fan-out: carried while the reply goes out.
                    tokio::task::spawn_blocking(move || deferred.run());
                }
                then(one_shot(response, head_request), populations)
            }
            Ok(Ok((Reply::Tunnel(tunnel), after))) => {
                if !after.is_empty() {
                    tokio::task::spawn_blocking(move || after.run());
                }
                if handoff.as_ref().is_some_and(|h| h.is_armed()) {
                    // Sent in the same read as a tunnel's request (pipelined):
                    // one tunnel per connection at once.
                    self.readers.handle().spawn_blocking(move || drop(tunnel));
                    return self.busy(&query, "a tunnel is open on this connection already: open another on a connection of its own");
                }
                match self.tunnels.clone().try_acquire_owned() {
                    Ok(permit) => self.stream(tunnel, permit, handoff, head_request),
                    Err(_) => {
                        // Ends the tunnel's watch; nothing was sent yet.
                        self.readers.handle().spawn_blocking(move || drop(tunnel));
                        let limit = self.caps.1;
                        self.busy(&query, &format!("too many tunnels: this server holds at most {limit} at once"))
                    }
                }
            }
            Ok(Err(err)) | Err(err) => self.failure(&query, &err),
        }
    }

    /// A request refused by [`Gate::identify`]: a status event, with a
    /// challenge for `401` and `Retry-After` for `429` and `503`.
    fn refused(&self, query: &[u8], refusal: &Refusal) -> hyper::Response<Body> {
        let (code, reason, message) = refusal.status();
        let mut reply = self.status_reply(query, code, reason, &message);
        refusal.add_headers(&mut reply, RETRY_AFTER_SECS);
        reply
    }

    // ----- Durable Streams at /v1/stream/ --------------------------------

    /// A stream request: `404` when streams are off; else identified as
    /// `/kn` requests are, then judged by the access rules
    /// (crate::stream_access) and answered by crate::streams.
    async fn stream_request(self: Arc<Self>, request: hyper::Request<Incoming>, peer: SocketAddr) -> hyper::Response<Body> {
        let Some(streams) = self.streams.clone() else {
            return plain_owned(StatusCode::NOT_FOUND, format!("404 Not Found: {}\n", crate::streams::OFF));
        };
        if !self.gate.is_configured() {
            return crate::streams::respond(streams, request, self.local, None, &self.budget).await;
        }
        let headers: Vec<(String, Vec<u8>)> =
            request.headers().iter().map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec())).collect();
        let user = match self.gate.identify(&headers, peer.ip()).await {
            Ok(user) => user,
            Err(refusal) => {
                let (code, _, message) = refusal.status();
                let mut reply = plain_owned(StatusCode::from_u16(code).unwrap_or(StatusCode::UNAUTHORIZED), format!("{message}\n"));
                refusal.add_headers(&mut reply, RETRY_AFTER_SECS);
                return reply;
            }
        };
        crate::streams::respond(streams, request, self.local, user, &self.budget).await
    }

    /// A request that never reached the handler, answered like the CGI
    /// does: a status event in the requested format (else `js`).
    fn failure(&self, query: &[u8], err: &Error) -> hyper::Response<Body> {
        let (code, reason) = err.status();
        let mut reply = self.status_reply(query, code, reason, err.message());
        if err.kind() == ErrorKind::TooLarge {
            reply.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
        }
        reply
    }

    /// A cap is reached: `503 Service Unavailable` with `Retry-After`, as
    /// a status event in the requested format.
    fn busy(&self, query: &[u8], message: &str) -> hyper::Response<Body> {
        let mut reply = self.status_reply(query, 503, "Service Unavailable", message);
        reply.headers_mut().insert(hyper::header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
        reply
    }

    /// A one-shot response carrying one status event in the format the
    /// query asks for (else `js`).
    fn status_reply(&self, query: &[u8], code: u16, reason: &str, message: &str) -> hyper::Response<Body> {
        let params = Params::parse(query).unwrap_or_default();
        let format = Format::from_param(params.get("kn_response_format")).unwrap_or(Format::Js);
        let status = status_event(code, reason, message, params.get("kn_status_from"));
        let page = Page::new(format!("http://{}{MOUNT}", self.local));
        match Response::events(format, &page, &[status]) {
            Ok(r) => one_shot(r, false),
            Err(_) => plain(StatusCode::INTERNAL_SERVER_ERROR, "500 Internal Server Error\n"),
        }
    }

    /// Starts a tunnel: its head goes out through hyper, then the
    /// connection's task takes the socket and follows the topic
    /// (crate::serve_held). A `HEAD` gets the head alone and no tunnel.
    fn stream(self: &Arc<Self>, tunnel: Box<TunnelReply>, permit: OwnedSemaphorePermit, handoff: Option<Arc<HandOff>>, head_request: bool) -> hyper::Response<Body> {
        let mut reply = with_head(&tunnel.head, Body::HandOff(None));
        // Proxies must pass each piece on at once.
        reply.headers_mut().insert(HeaderName::from_static("x-accel-buffering"), HeaderValue::from_static("no"));
        match handoff {
            Some(handoff) if !head_request => {
                handoff.arm(Held { tunnel, permit });
                *reply.body_mut() = Body::HandOff(Some(handoff));
            }
            // Ends the tunnel's watch; nothing is sent.
            _ => drop(self.readers.handle().spawn_blocking(move || drop((tunnel, permit)))),
        }
        reply
    }

    // ----- /metrics ---------------------------------------------------------

    /// The Prometheus page (crate::metrics_http): O(1) store I/O, under
    /// the access rules, for the user the gate found (its back-off, queue
    /// and thread cap, as for `/kn`).
    async fn metrics(&self, request: &hyper::Request<Incoming>, peer: SocketAddr) -> hyper::Response<Body> {
        if let Some(refused) = crate::metrics_http::not_allowed(request) {
            return refused;
        }
        let headers: Vec<(String, Vec<u8>)> =
            request.headers().iter().map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec())).collect();
        let user = match self.gate.identify(&headers, peer.ip()).await {
            Ok(user) => user,
            Err(refusal) => return refusal.plain_reply(RETRY_AFTER_SECS),
        };
        let (connections, tunnels) = self.caps;
        let scrape = crate::metrics_http::Scrape {
            store: self.store.clone(),
            streams: self.streams.clone(),
            pool: self.pool.clone(),
            serve: crate::metrics_http::ServeGauges {
                open_tunnels: (tunnels - self.tunnels.available_permits()) as u64,
                open_connections: (connections - self.connections.available_permits()) as u64,
                requests: self.requests.load(Ordering::Relaxed),
            },
        };
        crate::metrics_http::answer(&self.figures, scrape, request, user).await
    }
}

fn content_length(headers: &hyper::HeaderMap) -> Option<u64> {
    headers.get(CONTENT_LENGTH)?.to_str().ok()?.trim().parse().ok()
}

fn too_large(length: u64, max: u64) -> String {
    format!("the request body of {length} bytes is larger than the limit of {max} bytes")
}

/// A one-shot response: status code and the protocol's reason phrase,
/// headers, `Content-Length`, body (none for `HEAD`).
fn one_shot(response: Response, head_request: bool) -> hyper::Response<Body> {
    let length = response.body.len();
    let send_body = !response.head_only && !head_request;
    let code = response.code();
    let body = if send_body { Body::full(response.body) } else { Body::empty() };
    let mut reply = with_head(&response.head, body);
    if code != 204 && (send_body || head_request) {
        reply.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from(length));
    }
    reply
}

/// The URLs this server is reached by: its listening address (for an
/// unspecified one, `127.0.0.1`, `localhost` and the host name with its
/// port) and `--public-url`.
fn own_names(local: SocketAddr, public_url: Option<&str>) -> Vec<String> {
    let port = local.port();
    let mut names = Vec::new();
    if local.ip().is_unspecified() {
        names.push(format!("http://127.0.0.1:{port}{MOUNT}"));
        names.push(format!("http://localhost:{port}{MOUNT}"));
        let host = kn_journal::internal::own_host_name();
        if !host.is_empty() {
            names.push(format!("http://{host}:{port}{MOUNT}"));
        }
    } else {
        names.push(format!("http://{local}{MOUNT}"));
    }
    names.extend(public_url.map(str::to_string));
    names
}

/// Records this server's names again every hour (a name unseen for
/// `NAME_TTL_SECS` is dropped from `.names`).
async fn refresh_names(store: Arc<Store>, names: Vec<String>) {
    loop {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        let store = store.clone();
        let names = names.clone();
        let _ = tokio::task::spawn_blocking(move || store.record_server_names(kn_journal::internal::own_host_name(), &names)).await;
    }
}

/// Attaches `after` (a new route's population, issue 12) to a one-shot
/// reply: it runs once hyper has taken the whole body to send.
fn then(mut reply: hyper::Response<Body>, after: AfterReply) -> hyper::Response<Body> {
    if after.is_empty() {
        return reply;
    }
    let bytes = match reply.body_mut() {
        Body::Full(bytes) => bytes.take(),
        _ => None,
    };
    *reply.body_mut() = Body::Then(bytes, Some(after));
    reply
}

fn with_head(head: &crate::response::Head, body: Body) -> hyper::Response<Body> {
    let mut reply = hyper::Response::new(body);
    let code = head.code();
    *reply.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Some(status) = &head.status {
        // The status line says what the status event says, as under a web
        // server (`200 Notified`, not `200 OK`).
        let canonical = reply.status().canonical_reason().unwrap_or("");
        if status.reason != canonical {
            if let Ok(phrase) = hyper::ext::ReasonPhrase::try_from(crate::response::field_value(&status.reason).as_bytes()) {
                reply.extensions_mut().insert(phrase);
            }
        }
    }
    for (name, value) in &head.headers {
        // Through the one rule of every header (crate::response).
        if let Some((name, value)) = crate::response::hyper_field(name, value.clone()) {
            reply.headers_mut().append(name, value);
        }
    }
    reply
}


#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_default_to_the_open_file_limit() {
        let mut config = ServeConfig::new("127.0.0.1:0".parse().unwrap(), "kn_events");
        assert_eq!(config.caps(65536), (32768, 28672));
        assert_eq!(config.caps(20), (16, 14));
        config.max_connections = Some(100);
        assert_eq!(config.caps(65536), (100, 88));
        config.max_tunnels = Some(500);
        assert_eq!(config.caps(65536), (100, 500));
    }
}
