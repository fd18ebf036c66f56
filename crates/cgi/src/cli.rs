//! The command line of `pubsub-cgi` when it is not run as a CGI (a web
//! server sets `GATEWAY_INTERFACE`, and then `main` never comes here).

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::access_log::{AccessLog, AccessLogConfig};
use crate::auth::{Authentication, Htpasswd, TrustedProxy};
use crate::serve::{serve, ServeConfig, MOUNT};

const CGI_MODE: &str = "\
CGI mode:
    Install the binary as `pubsub.cgi` under a web server and mount it at /kn
    (the JavaScript library's default). When the web server sets
    GATEWAY_INTERFACE the program is a CGI/1.1 program: it serves the one
    request in its environment and ignores every argument. The store is
    $KN_EVENTS (e.g. Apache's `SetEnv KN_EVENTS /srv/kn_events`), else
    ../kn_events beside the script's directory.

Environment:
    KN_EVENTS           the event store (both modes)
    KN_MAX_EVENT_BYTES, KN_SYNC, KN_SEGMENT_BYTES, ...
                        store settings (docs/SETTINGS.md, knpubsub-settings(7))
    KN_LISTEN           serve's address (--listen; default 127.0.0.1:8080)
    KN_ACCESS_LOG       serve's access log (--access-log): a file, or - for
                        standard output; default none. Common Log Format,
                        credentials in the query redacted, no headers
    KN_ACCESS_LOG_QUEUE
                        access log lines that may wait for the disk
                        (default 4096; past it lines are dropped, counted)
    KN_MAX_CONNECTIONS, KN_MAX_TUNNELS
                        serve's caps (--max-connections, --max-tunnels)
    KN_SHUTDOWN_GRACE   seconds serve may take to stop on SIGTERM or Ctrl-C
                        (default 5): tunnels end at once with a 503 status
                        event, clients reconnect; see docs/DEPLOY.md
    KN_SSE_RETRY_MS     the retry: of sse tunnels (default 1000)
    KN_MAX_REPLAYS      most do_method=replay runs at once per store
                        (default 8; more: 503 with Retry-After)
    KN_REPLAY_MAX_TIME  seconds one replay may run (default 3600)
    KN_TUNNEL_MAX_TIME  seconds a tunnel stays open at most (default 0: no
                        limit); its journal stays, the client reconnects
    KN_PRESENCE_DEBOUNCE_MS, KN_PRESENCE_PASS_MS
                        <topic>/kn_presence: how long a journal's tunnel must
                        be gone to leave (default 5000: a reconnect within
                        it is no leave), and how often a presence reader
                        looks (default 1000); see docs/PRESENCE.md
    KN_FORWARD_INLINE   most routes a notify forwards along before its
                        answer (default 32); a topic with more is answered
                        once stored and forwarded right after, many events
                        to a journal at a time (0: always before)
    KN_GROUP_COMMIT     most posts of one process waiting for one topic
                        that are stored together: one lock, one write, one
                        forwarding pass, each answered for its own event
                        (default 64; 0 or 1: each post alone)
    KN_ACCESS_RULES     the access rules file: who may post, read, route and
                        replay where (default: none, everything allowed).
                        Under CGI the user is REMOTE_USER, set by the web
                        server's authentication; see docs/ACCESS.md
    KN_STREAMS          on (default) or off: Durable Streams at /v1/stream/
                        (off: 404); under rules, judged as /v1/stream/<path>
    KN_BODY_BUDGET_BYTES
                        request bodies serve holds at once, all requests
                        together (default 256 MiB; past it 503)
    KN_AUTH_THREADS, KN_AUTH_QUEUE, KN_AUTH_MAX_CREDENTIALS_BYTES,
    KN_AUTH_CACHE, KN_AUTH_BACKOFF_AFTER, KN_AUTH_BACKOFF_MAX_MS
                        serve --htpasswd's password checks: off the event
                        loop, bounded (503), capped (400), per-address
                        back-off (429); see docs/ACCESS.md
    KN_TOKEN_KEYS       bearer-token keys, KID=ALG:PATH,... (HS256 secret
                        file; RS256, ES256, EdDSA PEM public key), besides
                        the store's own (kn token); tokens come in
                        Authorization: Bearer, kn_token or a cookie
    KN_TOKEN_ISSUER, KN_TOKEN_AUDIENCE, KN_TOKEN_COOKIE, KN_TOKEN_LEEWAY,
    KN_TOKEN_MAX_BYTES, KN_TOKEN_CACHE
                        what a token's iss and aud must be, the cookie
                        (kn_token), clock skew (30 s), size cap (8192),
                        tokens remembered (1024); see docs/ACCESS.md

Deployment guide: docs/DEPLOY.md.";

/// `pubsub-cgi`: the knpubsub PubSub server.
#[derive(Debug, Parser)]
#[command(
    name = "pubsub-cgi",
    version,
    about = "knpubsub: the PubSub server, as a CGI program or as its own HTTP server",
    after_help = CGI_MODE,
    arg_required_else_help = true
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the PubSub protocol at /kn over HTTP/1.1, Durable Streams at
    /// /v1/stream/ (docs/DURABLE-STREAMS.md), and the pages built into the
    /// program (or --static DIR) for every other path, until Ctrl-C or
    /// SIGTERM (then it stops within $KN_SHUTDOWN_GRACE seconds, 5 by
    /// default: see docs/DEPLOY.md, "Rolling restarts").
    ///
    /// One persistent process with thousands of open tunnels; put it
    /// behind Apache's mod_proxy or nginx, or use it directly.
    Serve(ServeArgs),
}

/// The options of `serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The address to listen on (port 0 picks a free port) [default:
    /// $KN_LISTEN, else 127.0.0.1:8080].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// The event store [default: $KN_EVENTS, else ./kn_events].
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Serve static files from DIR for paths outside /kn (`/` is
    /// DIR/index.html) instead of the pages built into the program (the
    /// chat, topic browser and ping pages of the source tree's www/)
    /// [default: the built-in pages].
    #[arg(long = "static", value_name = "DIR")]
    pub static_dir: Option<PathBuf>,
    /// This server's URL as clients reach it, used for routes and
    /// kn_routed_from [default: http://ADDR/kn].
    #[arg(long, value_name = "URL")]
    pub public_url: Option<String>,
    /// Most connections open at once; past it a new connection is answered
    /// 503 Service Unavailable with Retry-After [default:
    /// $KN_MAX_CONNECTIONS, else half the open-file limit, at least 16].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: Option<u32>,
    /// Most tunnels open at once; past it a tunnel request gets a 503
    /// status event with Retry-After [default: $KN_MAX_TUNNELS, else
    /// seven eighths of the connections].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tunnels: Option<u32>,
    /// Do not answer GET /metrics (the store's counters and size, open
    /// tunnels and connections, requests served, in the Prometheus text
    /// format; with KN_ACCESS_RULES, only for users with read on
    /// /kn_metrics); /metrics is then an ordinary static path.
    #[arg(long)]
    pub no_metrics: bool,
    /// Take the request's user from --user-header, but only on connections
    /// from ADDR (a front proxy that authenticates, e.g. Apache with
    /// mod_proxy; repeat for several). From any other address the header
    /// is ignored. See docs/ACCESS.md.
    #[arg(long = "trusted-proxy", value_name = "ADDR")]
    pub trusted_proxy: Vec<std::net::IpAddr>,
    /// The header in which a --trusted-proxy names the user.
    #[arg(long, value_name = "NAME", default_value = "X-Remote-User")]
    pub user_header: String,
    /// Check Basic credentials against FILE, an htpasswd file as
    /// Apache's `htpasswd` writes it: MD5 (`$apr1$`, its default), bcrypt
    /// (`-B`), SHA-256/512 (`-2`, `-5`), crypt (`-d`) or SHA-1 (`-s`)
    /// hashes; plain text (`-p`) is refused at start. Wrong credentials
    /// are answered 401, too long ones 400; a client address failing
    /// again and again 429 for a while. Checks run on threads of their
    /// own ($KN_AUTH_THREADS). The access rules are $KN_ACCESS_RULES
    /// (docs/ACCESS.md), for /kn and /v1/stream/ alike.
    #[arg(long, value_name = "FILE")]
    pub htpasswd: Option<PathBuf>,
    /// Log every request to FILE (appended to; `-`: standard output), one
    /// line each in the Common Log Format of Apache and nginx. The value
    /// of a query parameter that carries a credential (kn_token, any
    /// *token*, *session*, *password*, *secret*, *key* or *auth* name) is
    /// written `[redacted]`, no header is written (neither Authorization
    /// nor a cookie), and any byte outside printable ASCII as \xHH
    /// [default: $KN_ACCESS_LOG, else no log].
    #[arg(long, value_name = "FILE|-")]
    pub access_log: Option<String>,
}

impl ServeArgs {
    fn config(self) -> Result<ServeConfig, String> {
        let listen = match self.listen {
            Some(listen) => listen,
            None => std::env::var("KN_LISTEN").unwrap_or_else(|_| "127.0.0.1:8080".to_owned()),
        };
        let listen = resolve(&listen)?;
        let root = self
            .root
            .or_else(|| std::env::var_os("KN_EVENTS").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("kn_events"));
        if let Some(url) = &self.public_url {
            if !(url.starts_with("http://") || url.starts_with("https://")) || url.ends_with('/') {
                return Err(format!("bad --public-url '{url}': give the absolute URL of {MOUNT}, e.g. http://example.org{MOUNT}"));
            }
        }
        let mut config = ServeConfig::new(listen, root);
        config.static_dir = self.static_dir;
        config.public_url = self.public_url;
        config.max_connections = cap(self.max_connections, "KN_MAX_CONNECTIONS")?;
        config.max_tunnels = cap(self.max_tunnels, "KN_MAX_TUNNELS")?;
        config.metrics = !self.no_metrics;
        config.access_log = access_log(self.access_log)?;
        let htpasswd = match &self.htpasswd {
            Some(path) => Some(Htpasswd::load(path)?),
            None => None,
        };
        let proxy = (!self.trusted_proxy.is_empty())
            .then(|| TrustedProxy { addresses: self.trusted_proxy.clone(), header: self.user_header.clone() });
        config.auth = std::sync::Arc::new(Authentication { proxy, htpasswd });
        Ok(config)
    }
}

/// A cap from its option, else from its environment variable (a positive
/// number), else `None` (the default).
fn cap(option: Option<u32>, variable: &str) -> Result<Option<usize>, String> {
    if let Some(n) = option {
        return Ok(Some(n as usize));
    }
    let Some(value) = std::env::var_os(variable) else { return Ok(None) };
    let value = value.to_string_lossy();
    match value.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(Some(n)),
        _ => Err(format!("bad value '{value}' for environment variable {variable}: expected a positive number")),
    }
}

/// The access log of `--access-log`, else `KN_ACCESS_LOG` (empty: none),
/// opened, with `KN_ACCESS_LOG_QUEUE` lines of queue.
fn access_log(option: Option<String>) -> Result<Option<std::sync::Arc<AccessLog>>, String> {
    let Some(target) = option.or_else(|| std::env::var("KN_ACCESS_LOG").ok()).filter(|t| !t.is_empty()) else { return Ok(None) };
    let queue = cap(None, "KN_ACCESS_LOG_QUEUE")?.unwrap_or(crate::access_log::DEFAULT_QUEUE);
    Ok(Some(std::sync::Arc::new(AccessLog::open(&AccessLogConfig { target, queue })?)))
}

fn resolve(listen: &str) -> Result<SocketAddr, String> {
    let mut addrs = listen.to_socket_addrs().map_err(|e| format!("bad --listen address '{listen}': {e}"))?;
    addrs.next().ok_or_else(|| format!("bad --listen address '{listen}': it resolves to nothing"))
}

/// Runs the command line; returns the exit status.
pub fn main() -> u8 {
    main_with(std::env::args_os())
}

/// [`main`] with the command line given (the program's name first):
/// `pubsub-cgi`'s C `main` passes its `argv`, which reaches
/// `std::env::args` under glibc but not under musl.
pub fn main_with(args: impl IntoIterator<Item = std::ffi::OsString>) -> u8 {
    let cli = Cli::parse_from(args);
    match cli.command {
        Command::Serve(args) => {
            let config = match args.config() {
                Ok(c) => c,
                Err(message) => {
                    eprintln!("pubsub-cgi serve: {message}");
                    return 2;
                }
            };
            match serve(config) {
                Ok(()) => 0,
                Err(err) => {
                    eprintln!("pubsub-cgi serve: {err}");
                    1
                }
            }
        }
    }
}
