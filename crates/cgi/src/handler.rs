//! The request handler: one [`Request`] in, one [`Reply`] out. It parses
//! what the request asks for, calls `kn-journal`, and formats the answer;
//! every PubSub rule lives in the journal.
//!
//! The same handler runs as a CGI process (one request, then exit) and
//! inside `pubsub-cgi serve` (many requests, shared [`Store`]).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use kn_journal::access::{AsUser, Operation};
use kn_journal::{ErrorKind as JournalKind, Event, Resume, Selection, Store, Topic, Write, KN_PAYLOAD};
use kn_journal::internal::{parse_expires, Destination, HeldStatuses};
use kn_wire::{js, status_event, Format, Page, Params};

use crate::request::Request;
use methods::Method;
pub use crate::tunnel_reply::TunnelReply;

pub mod methods;
mod nowait_group;
mod receipts;
use crate::response::{Head, Response, Status};

thread_local! {
    /// The topics whose forwarding a request left for after its reply
    /// (see [`Handler::handle_deferring`]): `(populations, deferred)`.
    static AFTER_REPLY: std::cell::RefCell<(Vec<Topic>, Vec<Topic>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
    /// Status events held until those populations are carried.
    static HELD: std::cell::RefCell<Option<HeldStatuses>> = const { std::cell::RefCell::new(None) };
}

/// What is to happen once the client has the reply: the forwarding of a
/// notify to a topic with many routes (`KN_FORWARD_INLINE`), and the new
/// routes' initial populations (PROTOCOL.md 3.3), which old clients read
/// only after the route request returns.
pub struct AfterReply {
    store: Arc<Store>,
    /// Populations, to start once the reply has reached the client.
    topics: Vec<Topic>,
    /// Deferred forwarding, to start as soon as the reply is on its way.
    deferred: Vec<Topic>,
    /// Status events for `kn_status_to`, to post once the populations
    /// are carried (PROTOCOL.md 3.3: after the populated events).
    held: Option<HeldStatuses>,
}

impl AfterReply {
    /// True when there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.topics.is_empty() && self.deferred.is_empty() && self.held.is_none()
    }

    /// Splits off the deferred forwarding, which need not wait for the
    /// reply to reach the client (nothing the client reads depends on
    /// its order with the reply): `(deferred, populations)`.
    pub fn split(self) -> (AfterReply, AfterReply) {
        let AfterReply { store, topics, deferred, held } = self;
        (AfterReply { store: store.clone(), topics: Vec::new(), deferred, held: None }, AfterReply { store, topics, deferred: Vec::new(), held })
    }

    /// Carries the deferred forwarding, then the populations (errors stay
    /// in the outbox, for the topic's next writer), then posts the status
    /// events held for after them.
    pub fn run(self) {
        for topic in &self.deferred {
            self.store.complete_deferred(topic);
        }
        for topic in &self.topics {
            let _ = self.store.complete_forwarding(topic);
        }
        if let Some(held) = self.held {
            held.complete(&self.store);
        }
    }
}

/// What a handled request answers.
pub enum Reply {
    /// A complete response, to be written with one write.
    Done(Response),
    /// A tunnel: a streaming response that follows a topic.
    Tunnel(Box<TunnelReply>),
}

/// Settings of the handler.
#[derive(Clone, Debug)]
pub struct Options {
    /// How often an idle tunnel writes a keep-alive: often enough that a web
    /// server's output timeout never fires and a vanished client is noticed
    /// (by the failed write) within seconds.
    pub keep_alive: Duration,
}

impl Default for Options {
    fn default() -> Options {
        Options { keep_alive: Duration::from_secs(1) }
    }
}

/// The PubSub request handler.
pub struct Handler {
    store: Arc<Store>,
    options: Options,
}

/// Why a request failed: a status and a human-readable payload.
struct Failure {
    code: u16,
    reason: &'static str,
    message: String,
}

impl Failure {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Failure {
        Failure { code, reason, message: message.into() }
    }

    /// A journal error, with the reason phrase the original used for the
    /// step that failed where it had one.
    fn journal(err: kn_journal::Error, bad_name_reason: &'static str) -> Failure {
        let (code, reason) = match err.kind() {
            JournalKind::BadTopic => (400, bad_name_reason),
            JournalKind::BadRequest => (400, "Bad request"),
            kind => kind.status(),
        };
        Failure::new(code, reason, err.message())
    }
}

type Outcome = Result<(u16, &'static str, Vec<u8>), Failure>;

/// `reply`, readable by a page of any origin when the request brings its
/// bearer token in the `kn_token` parameter (an `EventSource` or a form
/// POST of another origin, docs/ACCESS.md 1b): `Access-Control-Allow-Origin:
/// *`. With `*` a browser sends no cookie and no login along with a
/// request of another origin, so such a page reads only what its token
/// may; every other answer is unchanged (old clients' bytes included).
fn cross_origin(request: &Request, mut reply: Reply) -> Reply {
    if request.param(crate::bearer::TOKEN_PARAM).is_some() {
        let head = match &mut reply {
            Reply::Done(response) => &mut response.head,
            Reply::Tunnel(tunnel) => &mut tunnel.head,
        };
        head.headers.push(("Access-Control-Allow-Origin".to_string(), "*".to_string()));
    }
    reply
}

/// What `Retry-After` says when every replay slot is taken, in seconds.
pub const REPLAY_RETRY_AFTER_SECS: u32 = 60;

/// Most `kn_batch` entries one batch may carry; more are refused with
/// `413 Too many kn_batch entries` before any is run, so that one request
/// cannot post without bound (its body is bounded too, but small entries
/// would still make hundreds of thousands of posts).
pub const MAX_BATCH_ENTRIES: usize = 1000;

/// The realm of the `WWW-Authenticate: Basic` challenge that comes with a
/// `401` (an anonymous request the access rules refuse).
pub const AUTH_REALM: &str = "knpubsub";

impl Handler {
    /// A handler over `store`.
    pub fn new(store: Arc<Store>, options: Options) -> Handler {
        Handler { store, options }
    }

    /// The store.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Answers one request.
    pub fn handle(&self, request: &Request) -> Reply {
        let (reply, after) = self.handle_deferring(request);
        after.run();
        reply
    }

    /// [`Handler::handle`], leaving what is to happen only once the client
    /// has the reply (a new route's initial population, issue 12) to the
    /// [`AfterReply`] returned: the caller writes the reply, then runs it.
    /// Should it never run, the store's outbox keeps the work for the
    /// topic's next writer.
    pub fn handle_deferring(&self, request: &Request) -> (Reply, AfterReply) {
        AFTER_REPLY.take();
        HELD.take();
        let reply = cross_origin(request, self.handle_now(request));
        let (topics, deferred) = AFTER_REPLY.take();
        (reply, AfterReply { store: self.store.clone(), topics, deferred, held: HELD.take() })
    }

    /// The answer to a request that can be made at once, without waiting
    /// for a lock, a sync or another server, for a server's event loop: a
    /// single notify (no `kn_status_to`, a store whose name is configured)
    /// that the store makes at once ([`AsUser::notify_nowait`]), answered
    /// byte for byte as [`Handler::handle`] answers it. `None`, having done
    /// nothing, for any other request: call [`Handler::handle_deferring`]
    /// where waiting is allowed.
    pub fn handle_nowait(&self, request: &Request) -> Option<Reply> {
        let params = self.nowait_notify_params(request)?;
        let format = Format::from_param(params.get("kn_response_format")).ok()?;
        let who = crate::session::principal_nowait(&self.store, request)?;
        let outcome = self.notify_nowait(params, request.path_info(), &self.store.as_user(&who))?;
        let page = Page::new(request.server_url());
        Some(cross_origin(request, self.done(format, &page, vec![outcome_event(outcome, params.get("kn_status_from"))])))
    }

    /// The parameters of a request that [`Handler::handle_nowait`] (and
    /// [`Handler::nowait_topic`]) may take: a single notify, without
    /// `kn_status_to`, to a store whose name is configured; `None` for any
    /// other request.
    pub(super) fn nowait_notify_params<'r>(&self, request: &'r Request) -> Option<&'r Params> {
        #[cfg(feature = "failpoints")]
        if request.param("kn_failpoint_panic").is_some() {
            return None;
        }
        let params = request.params();
        let notify = match params.get("do_method") {
            Some(method) => method == b"notify",
            None => request.has_params() && request.method().as_str() == "POST",
        };
        if !notify || !request.method().is_supported() || params.get("kn_status_to").is_some() || !self.store.knows_names(&request.names()) {
            return None;
        }
        Some(params)
    }

    fn handle_now(&self, request: &Request) -> Reply {
        #[cfg(feature = "failpoints")]
        panic_failpoint(request);
        if !request.method().is_supported() {
            let head_only = request.method().as_str() == "HEAD";
            return Reply::Done(Response::not_implemented(head_only));
        }
        // Every URL a request reaches the server by is one of its names
        // (a bounded, least-recently-seen set: see `Store::learn_names`).
        let _ = self.store.learn_names(&request.names());
        let params = request.params();
        let page = Page::new(request.server_url());
        let format = match Format::from_param(params.get("kn_response_format")) {
            Ok(f) => f,
            Err(err) => {
                let status = status_event(403, "Unsupported kn_response_format value", err.message(), params.get("kn_status_from"));
                return self.done(Format::Js, &page, vec![status]);
            }
        };
        let method = match params.get("do_method") {
            Some(m) => String::from_utf8_lossy(m).into_owned(),
            None if !request.has_params() => "help".to_string(),
            None if request.method().as_str() == "POST" => "notify".to_string(),
            None => "route".to_string(),
        };
        let status_from = params.get("kn_status_from");
        let who = match crate::session::checked_principal(&self.store, request) {
            Ok(who) => who,
            Err(refused) => return Reply::Done(crate::bearer::refused_response(format, &page, status_from, &refused)),
        };
        let user = self.store.as_user(&who);
        // One table (handler/methods.rs) for what is answered and what
        // do_method=help lists.
        let Some(entry) = methods::find(&method) else {
            let status = status_event(403, "Unknown do_method", format!("Unknown do_method '{method}'"), status_from);
            return self.reply_statuses(request, format, &page, vec![status]);
        };
        match entry.method {
            Method::Notify | Method::Route | Method::Batch | Method::Replay => {}
            Method::Whoami => return Reply::Done(self.whoami(request)),
            Method::Session => return Reply::Done(crate::session::reply(&self.store, request, format, &page)),
            Method::Lib => return Reply::Done(self.lib(request, &method)),
            Method::Blank => return Reply::Done(self.blank(request)),
            Method::Help => return Reply::Done(self.help(request)),
            Method::Test => return Reply::Done(self.test(&request.names())),
            Method::Receipts => return self.receipts(request, format, &page, &user),
            Method::Ack => return self.ack(request, format, &page, &user),
            Method::Vapid => {
                let Some(push) = self.store.push_sender() else {
                    let status = status_event(404, "No Web Push", "this server sends no Web Push (KN_PUSH_CONTACT is not set)", status_from);
                    return self.reply_statuses(request, format, &page, vec![status]);
                };
                let key = push.public_key().into_bytes();
                return Reply::Done(Response::new(Head::new(None, "text/plain; charset=utf-8"), key));
            }
        }
        if method == "route" && is_tunnel_request(params) {
            return match self.tunnel(request, params, request.path_info(), format, &user) {
                Ok(t) => Reply::Tunnel(Box::new(t)),
                Err(f) => self.reply_statuses(request, format, &page, vec![failure_event(f, status_from)]),
            };
        }
        let statuses_to = match self.status_topic(params, &user) {
            Ok(to) => to,
            Err(f) => return self.done(format, &page, vec![failure_event(f, status_from)]),
        };
        let mut statuses = Vec::new();
        // Statuses produced once a route's population is pending wait for it.
        let mut held = Vec::new();
        if method == "batch" && params.get_all("kn_batch").count() > MAX_BATCH_ENTRIES {
            let count = params.get_all("kn_batch").count();
            let message = format!("{count} kn_batch entries: the maximum is {MAX_BATCH_ENTRIES}; nothing was done");
            let status = status_event(413, "Too many kn_batch entries", message, status_from);
            self.emit_after(&statuses_to, &mut statuses, &mut held, status);
        } else if method == "batch" {
            let batch = status_event(200, "Processing batch", "", status_from);
            self.emit_after(&statuses_to, &mut statuses, &mut held, batch);
            for (i, entry) in params.get_all("kn_batch").enumerate() {
                let event = match Params::parse(entry) {
                    Ok(sub) => {
                        let sub_from = sub.get("kn_status_from").map(<[u8]>::to_vec);
                        let outcome = self.batch_entry(&sub, &user);
                        outcome_event(outcome, sub_from.as_deref())
                    }
                    Err(err) => status_event(400, "Bad batch entry", format!("kn_batch entry {}: {}", i + 1, err.message()), None),
                };
                self.emit_after(&statuses_to, &mut statuses, &mut held, event);
            }
        } else {
            let outcome = self.single(&method, params, request.path_info(), &user);
            self.emit_after(&statuses_to, &mut statuses, &mut held, outcome_event(outcome, status_from));
        }
        if let (Some(Some(to)), false) = (&statuses_to, held.is_empty()) {
            let populations = AFTER_REPLY.with_borrow(|(populations, _)| populations.clone());
            match self.store.hold_statuses(to, populations, held.clone()) {
                Ok(h) => HELD.set(Some(h)),
                // Not lost, if out of order: posted now.
                Err(_) => held.into_iter().for_each(|e| {
                    let _ = self.store.notify(to, e);
                }),
            }
        }
        match statuses_to {
            Some(_) => Reply::Done(Response::forwarded()),
            None => self.done(format, &page, statuses),
        }
    }

    /// One notify, static route, route deletion or replay.
    fn single(&self, method: &str, params: &Params, path_info: &[u8], user: &AsUser) -> Outcome {
        match method {
            "notify" => self.notify(params, path_info, user),
            "route" => self.route(params, path_info, user),
            "replay" => self.replay(params, path_info, user),
            _ => Err(Failure::new(400, "can't batch that", format!("can't batch do_method '{method}'"))),
        }
    }

    /// PROTOCOL.md 3.7: starts `kn-replay` on the journal, detached (its
    /// own session, no standard streams), and answers at once. The program
    /// is `$KN_REPLAY`, else `kn-replay` beside this executable.
    fn replay(&self, params: &Params, path_info: &[u8], user: &AsUser) -> Outcome {
        use std::os::unix::process::CommandExt;
        use std::process::{Command, Stdio};

        let journal = self.topic_param(params, "kn_from", path_info, "bad replay topic name")?;
        user.check(Operation::Replay, &journal).map_err(|e| Failure::journal(e, "bad replay topic name"))?;
        let program = std::env::var_os("KN_REPLAY").map(std::path::PathBuf::from).or_else(|| {
            let beside = std::env::current_exe().ok()?.parent()?.join("kn-replay");
            beside.is_file().then_some(beside)
        });
        let Some(program) = program else {
            return Err(Failure::new(
                501,
                "Not Implemented",
                "do_method=replay needs the kn-replay program (kn-sensors) beside pubsub-cgi or named by KN_REPLAY; it is not installed on this server",
            ));
        };
        let root = std::fs::canonicalize(self.store.root()).unwrap_or_else(|_| self.store.root().to_path_buf());
        let mut command = Command::new(&program);
        command.arg("--root").arg(root).arg("--quiet");
        // Its posts are judged as the requester's own, with everything
        // that narrows the requester (a token's claim, groups and expiry):
        // the verified principal, handed over in the environment, never
        // taken from the request again (docs/ACCESS.md, "What is checked").
        command.env(kn_journal::access::HANDOVER_VARIABLE, user.principal().to_handover());
        // `--name=value`: a value starting with `-` is never an option.
        if let Some(warp) = params.get_str("warp") {
            command.arg(format!("--warp={}", warp.trim()));
        }
        if let Some(user) = params.get_str("user") {
            command.arg(format!("--user={user}"));
        }
        if let Some(password) = params.get_str("password") {
            // In the environment, not the argument list other users can read.
            command.env("KN_REPLAY_PASSWORD", password);
        }
        command.arg("--ready").arg("--").arg(journal.as_str());
        // Its first line says whether it got one of the store's replay
        // slots (KN_MAX_REPLAYS); nothing else is written there.
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null());
        // SAFETY: setsid is async-signal-safe; nothing else runs in the child
        // before exec. A session of its own outlives the CGI request and
        // the web server's signals to our process group.
        unsafe {
            command.pre_exec(|| if libc::setsid() < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) });
        }
        let child = command.spawn().map_err(|e| {
            Failure::new(501, "Not Implemented", format!("cannot start the replay program '{}': {e}", program.display()))
        })?;
        let mut child = child;
        let mut line = String::new();
        if let Some(stdout) = child.stdout.take() {
            use std::io::BufRead;
            let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        }
        // `serve` lives on: reap the child when it ends (a CGI process exits
        // first, and init reaps it).
        std::thread::spawn(move || child.wait());
        if line.trim_end() == "busy" {
            return Err(Failure::new(
                503,
                "Service Unavailable",
                format!("too many replays running on this server (KN_MAX_REPLAYS); '{journal}' was not replayed: try again later"),
            ));
        }
        Ok((200, "Replaying", format!("Replaying '{journal}'\n").into_bytes()))
    }

    fn batch_entry(&self, sub: &Params, user: &AsUser) -> Outcome {
        let method = sub.get("do_method").map(|m| String::from_utf8_lossy(m).into_owned()).unwrap_or_default();
        match method.as_str() {
            "notify" | "replay" => self.single(&method, sub, b"", user),
            "route" if !is_tunnel_request(sub) => self.single(&method, sub, b"", user),
            _ => Err(Failure::new(400, "can't batch that", format!("can't batch do_method '{method}'"))),
        }
    }

    /// The topic named by `param` (a name or absolute URL), else path info.
    fn topic_param(&self, params: &Params, param: &str, path_info: &[u8], what: &'static str) -> Result<Topic, Failure> {
        let name = match params.get(param) {
            Some(n) => n,
            None if !path_info.is_empty() => path_info,
            None => return Err(Failure::new(400, what, format!("no topic: give {param} or a path after the script"))),
        };
        match self.store.resolve(name) {
            Ok(Destination::Local(topic)) => Ok(topic),
            Ok(Destination::Remote(url) | Destination::Push(url)) => {
                Err(Failure::new(403, "Proxying not supported", format!("'{url}' is not a topic of this server; proxying is not supported")))
            }
            Err(err) => Err(Failure::journal(err, what)),
        }
    }

    fn notify(&self, params: &Params, path_info: &[u8], user: &AsUser) -> Outcome {
        let topic = self.topic_param(params, "kn_to", path_info, "bad posting destination topic name")?;
        let report = user.notify_deferring(&topic, params.elements());
        if report.as_ref().is_ok_and(|r| r.forwarding_deferred) {
            AFTER_REPLY.with_borrow_mut(|(_, deferred)| {
                if !deferred.contains(&topic) {
                    deferred.push(topic);
                }
            });
        }
        notified(report)
    }

    /// [`Handler::notify`] when the store can make it at once; `None`
    /// (nothing done) otherwise.
    fn notify_nowait(&self, params: &Params, path_info: &[u8], user: &AsUser) -> Option<Outcome> {
        let topic = match self.topic_param(params, "kn_to", path_info, "bad posting destination topic name") {
            Ok(topic) => topic,
            Err(failure) => return Some(Err(failure)),
        };
        Some(notified(user.notify_nowait(&topic, params.elements())?))
    }

    fn route(&self, params: &Params, path_info: &[u8], user: &AsUser) -> Outcome {
        let from = self.topic_param(params, "kn_from", path_info, "bad route source topic name")?;
        let to = params.get("kn_to").unwrap_or_default();
        let mut elements = params.elements();
        elements.remove(KN_PAYLOAD);
        let report = if to.is_empty() {
            let Some(id) = params.get("kn_id").filter(|id| !id.is_empty()) else {
                return Err(Failure::new(400, "Bad request", "deleting a route (empty kn_to) needs the route's kn_id"));
            };
            user.delete_route(&from, id, params.get("kn_expires"))
        } else {
            user.route_deferred(&from, to, elements)
        };
        let report = report.map_err(|e| Failure::journal(e, "bad route destination"))?;
        if report.population_pending {
            AFTER_REPLY.with_borrow_mut(|(populations, _)| populations.push(from));
        }
        if report.ignored {
            return Ok((200, "Ignored route", b"was a duplicate\n".to_vec()));
        }
        Ok((200, "Routed", wrote_lines(&report.writes)))
    }

    /// Where status events go instead of the response (`kn_status_to`):
    /// refused (nothing done) when the user may not post there.
    fn status_topic(&self, params: &Params, user: &AsUser) -> Result<Option<Option<Topic>>, Failure> {
        let Some(name) = params.get("kn_status_to") else { return Ok(None) };
        Ok(Some(match self.store.resolve(name) {
            Ok(Destination::Local(t)) => {
                user.check(Operation::Post, &t).map_err(|e| Failure::journal(e, "bad kn_status_to topic name"))?;
                Some(t)
            }
            _ => None,
        }))
    }

    /// Records a status event: posted to the `kn_status_to` topic when there
    /// is one (a stale journal silently drops it, as the original did),
    /// else kept for the response.
    fn emit(&self, to: &Option<Option<Topic>>, statuses: &mut Vec<Event>, event: Event) {
        match to {
            Some(Some(topic)) => {
                let _ = self.store.notify(topic, event);
            }
            Some(None) => {}
            None => statuses.push(event),
        }
    }

    /// [`Handler::emit`], except that once a route of this request has a
    /// population pending, statuses for a topic are kept in `held`, to be
    /// posted after it (see `HELD`).
    fn emit_after(&self, to: &Option<Option<Topic>>, statuses: &mut Vec<Event>, held: &mut Vec<Event>, event: Event) {
        let pending = AFTER_REPLY.with_borrow(|(populations, _)| !populations.is_empty());
        match to {
            Some(Some(_)) if pending || !held.is_empty() => held.push(event),
            _ => self.emit(to, statuses, event),
        }
    }

    fn reply_statuses(&self, request: &Request, format: Format, page: &Page, statuses: Vec<Event>) -> Reply {
        let who = crate::session::principal(&self.store, request);
        // Where the user may not post, the statuses come in the response.
        let to = self.status_topic(request.params(), &self.store.as_user(&who)).unwrap_or(None);
        if to.is_some() {
            let mut none = Vec::new();
            for s in statuses {
                self.emit(&to, &mut none, s);
            }
            return Reply::Done(Response::forwarded());
        }
        self.done(format, page, statuses)
    }

    fn done(&self, format: Format, page: &Page, statuses: Vec<Event>) -> Reply {
        match Response::events(format, page, &statuses) {
            Ok(mut r) => {
                // Only a replay past KN_MAX_REPLAYS answers 503: slots free
                // up as replays end.
                if r.code() == 503 {
                    r.head.headers.push(("Retry-After".to_string(), REPLAY_RETRY_AFTER_SECS.to_string()));
                }
                // Refused to anonymous by the access rules: logging in
                // may help, so ask for credentials.
                if r.code() == 401 {
                    r.head.headers.push(("WWW-Authenticate".to_string(), format!("Basic realm=\"{AUTH_REALM}\"")));
                }
                Reply::Done(r)
            }
            Err(_) => Reply::Done(Response::new(Head::new(Some(Status::new(500, "Internal Server Error")), "text/plain"), Vec::new())),
        }
    }

    // ----- tunnels ----------------------------------------------------------

    fn tunnel(&self, request: &Request, params: &Params, path_info: &[u8], format: Format, user: &AsUser) -> Result<TunnelReply, Failure> {
        let topic = self.topic_param(params, "kn_from", path_info, "bad route source topic name")?;
        let mut selection = Selection::from_params(&params.elements()).map_err(|e| Failure::journal(e, "Bad request"))?;
        if format == Format::Sse {
            // EventSource resumes with a Last-Event-ID header; its first
            // connection can only carry a query parameter.
            if let Some(id) = request.last_event_id().or(params.get("last_event_id")) {
                selection.since_checkpoint = Some(id.to_vec());
            }
        }
        let deadline = match params.get("kn_expires") {
            Some(v) => {
                let t = kn_journal::internal::now();
                let at = parse_expires(v, t).map_err(|e| Failure::journal(e, "Bad request"))?;
                at.and_then(|at| tunnel_deadline(at - t))
            }
            None => None,
        };
        // The store's longest tunnel (KN_TUNNEL_MAX_TIME): it then ends
        // without expiring its journal, and the client reconnects.
        let max_time = self.store.config().tunnel_max_time;
        let closes = if max_time.is_zero() { None } else { Instant::now().checked_add(max_time) };
        let start = user.tunnel(&topic, &selection).map_err(|e| Failure::journal(e, "bad route source topic name"))?;
        if format == Format::Sse && topic.is_journal() {
            // Its client has every event up to the one it resumes after
            // (receipts, docs/PRESENCE.md); a checkpoint this journal
            // never gave confirms nothing.
            if let Some(seen) = &selection.since_checkpoint {
                // As do_method=ack: not for a cookie from another site.
                let _ = user.confirm(&topic, seen);
            }
        }
        let mut payload = wrote_lines(&start.created.writes);
        payload.extend_from_slice(format!("Watching for events in topic '{topic}'.").as_bytes());
        let status = status_event(200, "Watching topic", payload, params.get("kn_status_from"));
        let page = Page::new(request.server_url()).for_tunnel();
        let mut head = Head::new(Some(Status::new(200, "Watching topic")), format.content_type());
        if format == Format::Sse {
            head = head.with("Cache-Control", "no-cache").with("X-Accel-Buffering", "no");
        }
        let mut first = format.prologue(&page, &status);
        if format == Format::Sse {
            kn_wire::sse::write_retry(&mut first, self.store.config().sse_retry.as_millis() as u64);
        }
        format.write_event(&mut first, &status);
        let padding = format.tunnel_padding(request.user_agent());
        first.extend_from_slice(padding);
        let mut initial = Vec::new();
        if format == Format::Sse && matches!(start.initial.resume, Resume::Gap | Resume::Unknown) && selection.since_checkpoint.is_some() {
            let gap = status_event(
                205,
                "Reset Content",
                "the requested resume point is no longer retained: events may have been missed; showing everything retained",
                params.get("kn_status_from"),
            );
            format.write_event(&mut initial, &gap);
        }
        for e in &start.initial.events {
            format.write_event(&mut initial, e);
        }
        if !initial.is_empty() {
            initial.extend_from_slice(padding);
        }
        Ok(TunnelReply {
            head,
            first,
            initial,
            tunnel: start.tunnel,
            format,
            padding,
            status_from: params.get("kn_status_from").map(<[u8]>::to_vec),
            expires: deadline,
            closes,
            keep_alive: self.options.keep_alive,
            ended: false,
            token_expires: user.principal().token_expires().map(crate::tunnel_end::instant_of),
        })
    }

    // ----- the other methods ------------------------------------------------

    fn whoami(&self, request: &Request) -> Response {
        let user = request.remote_user().unwrap_or("anonymous");
        let display = request.remote_user().unwrap_or("Anonymous User");
        let mut body = Vec::new();
        body.extend_from_slice(b"window.kn_userid = '");
        js_single_quoted(user.as_bytes(), &mut body);
        body.extend_from_slice(b"';window.kn_displayname = '");
        js_single_quoted(display.as_bytes(), &mut body);
        body.extend_from_slice(b"';\r\n");
        body.extend_from_slice(&self.prologue_script());
        body.extend_from_slice(b"\r\nif (! window.kn_server) window.kn_server = '");
        js_single_quoted(request.script_name().as_bytes(), &mut body);
        body.extend_from_slice(b"';");
        if let Some(push) = self.store.push_sender() {
            // kn.pushSubscribe's applicationServerKey (www/js/kn_client.js).
            body.extend_from_slice(b"\r\nwindow.kn_vapid_key = '");
            js_single_quoted(push.public_key().as_bytes(), &mut body);
            body.extend_from_slice(b"';");
        }
        Response::new(cacheable(Head::new(None, "application/x-javascript; charset=utf-8")), body)
    }

    /// The optional site prologue: `kn_apps/kn_lib/prologue.js` beside the
    /// event store, as the original laid it out.
    fn prologue_script(&self) -> Vec<u8> {
        let path = self.store.root().join("../kn_apps/kn_lib/prologue.js");
        std::fs::read(path).unwrap_or_default()
    }

    fn lib(&self, request: &Request, method: &str) -> Response {
        let mut response = self.whoami(request);
        response.body.extend_from_slice(b"\n");
        response.body.extend_from_slice(crate::assets::CLIENT_JS.as_bytes());
        if method != "lib" {
            response.body.extend_from_slice(crate::assets::FORM_JS.as_bytes());
            let two_way = if method == "lib2form" { "true" } else { "false" };
            response.body.extend_from_slice(format!("\nkn__formInit({two_way});\n").as_bytes());
        }
        response
    }

    fn blank(&self, request: &Request) -> Response {
        // The original's page, script and all: without a parent frame it
        // paints a white body instead.
        let mut body = js::start_html(
            b"This Space Intentionally Left Blank\n",
            &format!(
                "{}<script type=\"text/javascript\">\n<!--\nif (parent.kn_redrawCallback) {{ parent.kn_redrawCallback(window); }}\n\
                 else {{ document.write('<body bgcolor=\"white\"></body>'); }}\n// -->\n</script>\n\n",
                js::whoami_script(request.server_url()).trim_end()
            ),
            "<body>\n",
        );
        body.extend_from_slice(b"\n</body>\n</html>\n");
        Response::new(cacheable(Head::new(None, "text/html; charset=utf-8")), body)
    }

    /// `do_method=help`: every method of [`methods::METHODS`], as a page
    /// for a browser and as plain text for any other client.
    fn help(&self, request: &Request) -> Response {
        let url = request.server_url();
        if !request.accepts_html() {
            return Response::new(Head::new(None, "text/plain; charset=utf-8"), methods::help_text(url).into_bytes());
        }
        let mut esc = Vec::new();
        js::html_escape(url.as_bytes(), &mut esc);
        let url = String::from_utf8_lossy(&esc);
        let body = crate::assets::HELP_HTML.replace("{METHODS}", &methods::help_html()).replace("{SERVER}", &url);
        Response::new(Head::new(None, "text/html; charset=utf-8"), body.into_bytes())
    }

    /// `do_method=test`: the installation's self-checks; `FAIL` appears
    /// only if one failed.
    fn test(&self, reached_by: &[&str]) -> Response {
        let mut body = js::start_html(b"PubSub server self-test", "", "<body>\n");
        for (name, result) in crate::selftest::run(&self.store, reached_by) {
            let mut line = Vec::new();
            js::html_escape(name.as_bytes(), &mut line);
            body.extend_from_slice(b"<h1>");
            body.extend_from_slice(&line);
            body.extend_from_slice(b"</h1><p> ");
            match result {
                Ok(()) => body.extend_from_slice(b"Success.\n"),
                Err(why) => {
                    body.extend_from_slice(b"FAIL: ");
                    js::html_escape(why.as_bytes(), &mut body);
                    body.extend_from_slice(b"\n");
                }
            }
        }
        body.extend_from_slice(b"</body>\n</html>\n");
        Response::new(Head::new(None, "text/html; charset=utf-8"), body)
    }
}

/// Fault injection for tests (the `failpoints` build only): when the file
/// named by `KN_FAILPOINT` lists `handler-panic`, a request carrying the
/// parameter `kn_failpoint_panic` panics, so that tests can prove that
/// `serve` answers it 500 and keeps serving everyone else.
#[cfg(feature = "failpoints")]
fn panic_failpoint(request: &Request) {
    let armed = std::env::var_os("KN_FAILPOINT")
        .and_then(|path| std::fs::read_to_string(path).ok())
        .is_some_and(|list| list.split_whitespace().any(|w| w == "handler-panic"));
    if armed && request.param("kn_failpoint_panic").is_some() {
        panic!("failpoint handler-panic");
    }
}

/// When a tunnel whose `kn_expires` lies `seconds` ahead closes: at once
/// for a time already past, never for one beyond what an `Instant` can
/// hold (`kn_expires=99999999999999999999` is a date in the year 3e12, as
/// good as `infinity`; it must not overflow into a panic).
fn tunnel_deadline(seconds: f64) -> Option<Instant> {
    let now = Instant::now();
    if seconds.is_nan() || seconds <= 0.0 {
        return Some(now);
    }
    Duration::try_from_secs_f64(seconds).ok().and_then(|ahead| now.checked_add(ahead))
}

fn is_tunnel_request(params: &Params) -> bool {
    match params.get("kn_to") {
        None => true,
        Some(to) => to.len() >= 11 && to[..11].eq_ignore_ascii_case(b"javascript:"),
    }
}

/// The outcome of a notify.
fn notified(report: kn_journal::Result<kn_journal::PostReport>) -> Outcome {
    let report = report.map_err(|e| Failure::journal(e, "bad posting destination topic name"))?;
    Ok((200, "Notified", wrote_lines(&report.writes)))
}

fn outcome_event(outcome: Outcome, status_from: Option<&[u8]>) -> Event {
    match outcome {
        Ok((code, reason, payload)) => status_event(code, reason, payload, status_from),
        Err(f) => failure_event(f, status_from),
    }
}

fn failure_event(f: Failure, status_from: Option<&[u8]>) -> Event {
    status_event(f.code, f.reason, f.message, status_from)
}

/// `Wrote to '<topic>' (<id>)` lines, as the original's status payloads.
fn wrote_lines(writes: &[Write]) -> Vec<u8> {
    let mut out = Vec::new();
    for w in writes {
        out.extend_from_slice(format!("Wrote to '{}' (", w.topic).as_bytes());
        out.extend_from_slice(&w.id);
        out.extend_from_slice(b")\n");
    }
    out
}

/// A JavaScript single-quoted string body: the js escapes plus `'`.
fn js_single_quoted(text: &[u8], out: &mut Vec<u8>) {
    for &b in text {
        if b == b'\'' {
            out.extend_from_slice(b"\\x27");
        } else {
            js::escape_string(&[b], out);
        }
    }
}

/// Cacheable for a day, as the original's whoami and blank.
fn cacheable(head: Head) -> Head {
    let now = SystemTime::now();
    let tomorrow = now + Duration::from_secs(86_400);
    let mut head = head;
    head.headers.insert(0, ("Expires".to_string(), httpdate::fmt_http_date(tomorrow)));
    head.headers.insert(1, ("Date".to_string(), httpdate::fmt_http_date(now)));
    head
}
