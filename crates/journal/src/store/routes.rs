//! Routes: creating and deleting them, listing them (with the kept list a
//! post reads), the per-topic limit, checking destinations and content
//! filters.

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};

use crate::error::{Error, ErrorKind, Result};
use crate::event::*;
use crate::ids::{fresh_id, now};
use crate::log;
use crate::topic::Topic;

use super::{Destination, Store};
use super::report::{Poisoned, PostReport, Write};
use super::read::Selection;

/// The element of a route that replaced a poisoned one under the same
/// `kn_id`: why that one was poisoned (its [`KN_POISONED`](super::KN_POISONED)),
/// carried on by every later replacement, so that replacing a route never
/// erases the record of its poisoning (`kn routes --all` shows it).
/// Written by the store only.
pub const KN_POISONED_BEFORE: &str = "kn_poisoned_before";

/// What a route request did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouteReport {
    /// The route repeated an identical existing one: `200 Ignored route`.
    pub ignored: bool,
    /// The route's id.
    pub id: Vec<u8>,
    /// Everything stored: the route event and initially populated events.
    pub writes: Vec<Write>,
    /// Routes poisoned on the way (this one, if its destination failed).
    pub poisoned: Vec<Poisoned>,
    /// The route's initial population is recorded in the outbox and not
    /// yet carried ([`Store::route_deferred`]): call
    /// [`Store::complete_forwarding`] on the source once the reply is out.
    pub population_pending: bool,
}

/// A static route: an event of `T/kn_routes`.
#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    /// The topic routed from.
    pub source: Topic,
    /// The route event as stored (`kn_id`, `kn_payload` = destination,
    /// `kn_uri`, `kn_content_filter`, ...).
    pub event: Event,
}

impl Route {
    /// The route's id.
    pub fn id(&self) -> &[u8] {
        self.event.id().unwrap_or(b"")
    }

    /// The absolute destination URL; empty for an inactive (deleted or
    /// poisoned) route.
    pub fn destination(&self) -> &[u8] {
        self.event.payload()
    }

    /// True when the route forwards events: a destination and not expired.
    pub fn is_active(&self, now: f64) -> bool {
        !self.destination().is_empty() && !self.event.is_expired(now)
    }
}

/// A route as a post reads it from a topic's route list: its destination
/// resolved and its `kn_content_filter` compiled at most once per list
/// (resolving depends only on this store's names:
/// [`Store::add_server_name`] drops every kept list when they change).
pub(super) struct ListedRoute {
    /// The route.
    pub(super) route: Route,
    destination: OnceLock<std::result::Result<Destination, String>>,
    /// The compiled filter; `None` for a filter that does not compile
    /// (then nothing travels the route).
    filter: OnceLock<Option<regex::bytes::Regex>>,
    /// The access rules' last answer for this route, with the rules it
    /// was given by (asked again when they change).
    access: std::sync::Mutex<Option<(Arc<crate::access::Rules>, Option<String>)>>,
}

impl ListedRoute {
    pub(super) fn new(route: Route) -> ListedRoute {
        ListedRoute { route, destination: OnceLock::new(), filter: OnceLock::new(), access: Default::default() }
    }

    /// Where the route delivers (an error text poisons it).
    pub(super) fn destination(&self, store: &Store) -> std::result::Result<Destination, String> {
        self.destination.get_or_init(|| store.route_target(self.route.destination()).map_err(|e| e.to_string())).clone()
    }

    /// Whether the access rules still let the route's creator read its
    /// source and route to its destination (docs/ACCESS.md): `Ok(None)`
    /// yes (or no rules), `Ok(Some(why))` no.
    pub(super) fn may_deliver(&self, store: &Store) -> Result<Option<String>> {
        let Some(rules) = store.access_rules()? else { return Ok(None) };
        let mut cached = self.access.lock().map_err(|_| Error::new(ErrorKind::Io, "route access cache poisoned"))?;
        if let Some((_, answer)) = cached.as_ref().filter(|(given_by, _)| Arc::ptr_eq(given_by, &rules)) {
            return Ok(answer.clone());
        }
        let to = match self.destination(store) {
            Ok(Destination::Local(topic)) => Some(topic),
            _ => None,
        };
        let answer = rules.check_route(&self.route.source, &self.route.event, to.as_ref()).err().map(|e| format!("access: {e}"));
        *cached = Some((rules, answer.clone()));
        Ok(answer)
    }

    /// True when the route's creator may see `event` of its source: always,
    /// except from an introspection topic (`kn_subtopics`, `kn_routes`),
    /// which a route carries only what a tunnel of its creator's would
    /// ([`Rules::may_see`](crate::access::Rules::may_see)). Unreadable
    /// rules show nothing.
    pub(super) fn shows(&self, store: &Store, event: &Event) -> bool {
        if !self.route.source.is_reserved() {
            return true;
        }
        match store.access_rules() {
            Ok(Some(rules)) => rules.may_see(&crate::access::Principal::creator_of(&self.route.event), &self.route.source, event),
            Ok(None) => true,
            Err(_) => false,
        }
    }

    /// True when an event with `payload` passes the route's content
    /// filter (always, without one).
    pub(super) fn passes(&self, store: &Store, payload: &[u8]) -> bool {
        let Some(pattern) = self.route.event.get("kn_content_filter") else { return true };
        self.filter.get_or_init(|| store.compile_filter(pattern).ok()).as_ref().is_some_and(|r| r.is_match(payload))
    }
}

/// A topic's routes as a post reads them (kept between posts while the
/// topic's route generation stays the same).
pub(super) type RouteList = Arc<Vec<ListedRoute>>;

impl Store {
    /// Reads the routes of `topic` (active or not). With the route
    /// generation of a post to it (read under its lock before this), keeps
    /// them for the next posts while the generation stays the same: a
    /// route change since shows as another generation, never as routes
    /// older than this one.
    pub(super) fn read_routes(&self, topic: &Topic, generation: Option<u64>) -> Result<RouteList> {
        let routes: RouteList = Arc::new(self.all_routes(topic)?.into_iter().map(ListedRoute::new).collect());
        if let (Some(generation), Ok(mut kept)) = (generation, self.kept.lock()) {
            for k in kept.topics.get_mut(topic).into_iter().flatten() {
                k.routes = Some((generation, Arc::clone(&routes)));
            }
        }
        Ok(routes)
    }

    /// The routes of `topic` (active and inactive), oldest first.
    pub fn all_routes(&self, topic: &Topic) -> Result<Vec<Route>> {
        let routes = topic.routes();
        if !self.dir(&routes).is_dir() {
            return Ok(Vec::new());
        }
        Ok(self
            .select(&routes, &Selection::all(), true)?
            .events
            .into_iter()
            .map(|event| Route { source: topic.clone(), event })
            .collect())
    }

    /// The route of `topic` with id `id`, active or not (as
    /// [`Store::all_routes`] lists it), if there is one: read from the
    /// newest record back, stopping at the first of that id.
    pub fn route_of(&self, topic: &Topic, id: &[u8]) -> Result<Option<Route>> {
        let found = self.newest_of_id(&topic.routes(), id)?;
        Ok(found.map(|r| Route { source: topic.clone(), event: r.event }))
    }

    /// The newest record of `topic` whose `kn_id` is `id` (expired or
    /// not), read from the end back; `None` when there is none or no such
    /// topic.
    pub(super) fn newest_of_id(&self, topic: &Topic, id: &[u8]) -> Result<Option<crate::record::Record>> {
        let dir = self.checked_dir(topic)?;
        if !dir.is_dir() {
            return Ok(None);
        }
        let mut found = None;
        log::read_backwards_after(&dir, 0, |r| {
            if r.event.id() != Some(id) {
                return true;
            }
            found = Some(r);
            false
        })?;
        Ok(found)
    }

    /// The active routes of `topic`: a destination and not expired.
    pub fn routes(&self, topic: &Topic) -> Result<Vec<Route>> {
        let t = now();
        Ok(self.all_routes(topic)?.into_iter().filter(|r| r.is_active(t)).collect())
    }

    /// Creates a static route from `from` to `to` (a topic name or absolute
    /// URL) with the route's elements in `params` (`kn_id`, `kn_uri`,
    /// `kn_expires`, `kn_content_filter`, `kn_content_transform`,
    /// `do_max_age`, `do_max_n`). PROTOCOL.md 3.2 and 3.3: refused from a
    /// journal (403); an identical repeat is ignored; a new route first
    /// carries the selected existing events (at most `max_selected`, the
    /// newest), counted against `max_forwards` with the deliveries they
    /// cause: past it, [`ErrorKind::TooManyDeliveries`] (508), the route
    /// itself created. A local destination beyond `max_topic_depth` or
    /// `max_topic_bytes` is refused (400).
    pub fn route(&self, from: &Topic, to: &[u8], params: Event) -> Result<RouteReport> {
        let mut report = self.route_deferred(from, to, params)?;
        if !report.population_pending {
            return Ok(report);
        }
        report.population_pending = false;
        match self.complete_forwarding(from) {
            Ok(post) => {
                report.writes.extend(post.writes);
                report.poisoned.extend(post.poisoned);
                Ok(report)
            }
            Err(err) if err.kind() == ErrorKind::TooManyDeliveries => Err(Error::new(
                ErrorKind::TooManyDeliveries,
                format!(
                    "route '{}' from '{from}' was created, but carrying the existing events it selected took more than {} deliveries (KN_MAX_FORWARDS); stopped there",
                    String::from_utf8_lossy(&report.id),
                    self.config.max_forwards
                ),
            )),
            Err(err) => Err(err),
        }
    }

    /// [`Store::route`], except that the route's initial population is
    /// only recorded in the source's outbox (`report.population_pending`),
    /// to be carried by [`Store::complete_forwarding`]: a server answers
    /// the route request first, so that a client that reads its tunnel
    /// only once it has the reply still gets the population (the
    /// original's order, issue 12), and a process that dies in between
    /// leaves it to the next writer, the sweep or `serve`.
    pub fn route_deferred(&self, from: &Topic, to: &[u8], params: Event) -> Result<RouteReport> {
        if from.is_journal() {
            return Err(Error::new(
                ErrorKind::Forbidden,
                format!("static routes from journal '{from}' are refused: without duplicate suppression they could loop forever"),
            ));
        }
        if to.is_empty() {
            return Err(Error::new(
                ErrorKind::BadRequest,
                format!("empty route destination from '{from}': use delete_route to delete a route"),
            ));
        }
        if from.is_presence() {
            // Populated as it is now, and kept up to date by the sweep's
            // slices (presence.rs).
            let _ = self.presence_pass(from);
            self.note_routed_presence(from)?;
        }
        let destination = self.route_destination(to)?;
        let selection = Selection::from_params(&params)?;
        if let Some(filter) = params.get("kn_content_filter") {
            self.compile_filter(filter)?;
        }
        self.check_route_limit(from, params.id())?;
        // Held until the route is stored: a request racing at the bound
        // counts this route's note only once its route exists.
        let _push_lock = if crate::push::is_push_destination(&destination) { Some(self.count_push_route(from, &params)?) } else { None };
        let journal = match self.resolve(&destination) {
            Ok(Destination::Local(to)) if to.is_journal() => Some(to),
            _ => None,
        };
        let unread = self.unread_of_params(from, &params, journal.as_ref())?;
        let settled = self.settle_forwarding(from)?;
        let mut event = params;
        if let (Some(_), Some(journal)) = (&unread, &journal) {
            // Registered before the route exists: no delivery escapes it.
            if event.id().is_none_or(|id| id.is_empty()) {
                event.set(KN_ID, fresh_id());
            }
            self.register_unread(from, event.id().unwrap_or(b""), journal)?;
        }
        event.set(KN_PAYLOAD, destination);
        self.keep_poison_record(from, &mut event)?;
        let mut report = self.post_route_event(from, event)?;
        if !settled {
            // The route created the topic: its outbox starts now, empty.
            self.settle_forwarding(from)?;
        }
        if let Some(journal) = journal {
            // Noted in the journal's `.sources` once stored, so that its
            // removal finds the route (see index_route_source).
            self.index_route_source(&journal, from)?;
        }
        if report.ignored || selection.is_empty() {
            return Ok(report);
        }
        let selected = self.select_at_most(from, &selection, false, self.config.max_selected, None)?;
        let first = selected.events.first().and_then(|e| e.checkpoint()).and_then(|c| std::str::from_utf8(c).ok()?.parse::<u64>().ok());
        if let Some(first) = first {
            self.record_population(from, &report.id, first)?;
            report.population_pending = true;
        }
        Ok(report)
    }

    /// Before a route of `from` changes: completes what is pending along
    /// the routes it has, and starts its outbox if it has none, so that a
    /// new route never carries events stored before it (beyond its
    /// population). False when `from` does not exist yet.
    fn settle_forwarding(&self, from: &Topic) -> Result<bool> {
        let dir = self.checked_dir(from)?;
        if !dir.is_dir() {
            return Ok(false); // no topic yet
        }
        if !self.forwarding_pending(&dir)? {
            return Ok(true);
        }
        let routes = self.read_routes(from, None)?;
        let mut report = PostReport::default();
        let mut queue = VecDeque::new();
        let drained = self.drain(from, None, &routes, &mut report, &mut queue);
        let _ = self.run_forwarding(queue, &mut report);
        match drained {
            Err(err) if err.kind() != ErrorKind::TooManyDeliveries => Err(err),
            _ => Ok(true),
        }
    }

    /// When `route` replaces a route of the same `kn_id` that was
    /// poisoned (or itself carries such a record), carries the reason on
    /// as [`KN_POISONED_BEFORE`]; whatever `route` said there is dropped.
    fn keep_poison_record(&self, from: &Topic, route: &mut Event) -> Result<()> {
        route.remove(KN_POISONED_BEFORE);
        route.remove(super::KN_POISONED);
        let Some(id) = route.id().filter(|id| !id.is_empty()) else { return Ok(()) };
        let Some(existing) = self.route_of(from, id)? else { return Ok(()) };
        let record = existing.event.get(super::KN_POISONED).or_else(|| existing.event.get(KN_POISONED_BEFORE));
        if let Some(reason) = record {
            route.set(KN_POISONED_BEFORE, reason.to_vec());
        }
        Ok(())
    }

    /// Refuses a new route from `from` when it has `max_routes` active
    /// ones already (replacing one of them, same `kn_id`, is allowed). The
    /// routes are counted only when the index says there may be that many.
    fn check_route_limit(&self, from: &Topic, id: Option<&[u8]>) -> Result<()> {
        let max = self.config.max_routes;
        if log::indexed_ids(&self.dir(&from.routes())) < max as u64 {
            return Ok(());
        }
        let active = self.routes(from)?;
        let replaces = id.is_some_and(|id| !id.is_empty() && active.iter().any(|r| r.id() == id));
        if active.len() < max || replaces {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::Forbidden,
            format!("'{from}' has {} active routes, the maximum (KN_MAX_ROUTES is {max}): delete one first", active.len()),
        ))
    }

    /// Deletes route `id` of `from`: it is replaced by an inactive route
    /// (empty destination), which watchers of `kn_routes` see; it expires
    /// at `expires`, else after `tombstone_ttl`, and compaction reclaims
    /// it once expired longer than `expired_grace`.
    pub fn delete_route(&self, from: &Topic, id: &[u8], expires: Option<&[u8]>) -> Result<RouteReport> {
        self.delete_route_of(from, id, expires, &crate::access::Principal::anonymous())
    }

    /// [`Store::delete_route`], the tombstone naming the deleted route's
    /// `creator` (docs/ACCESS.md: reusing its id needs what deleting it
    /// needed).
    pub(crate) fn delete_route_of(&self, from: &Topic, id: &[u8], expires: Option<&[u8]>, creator: &crate::access::Principal) -> Result<RouteReport> {
        let mut event = Event::new();
        event.set(KN_ID, id).set(KN_PAYLOAD, "");
        creator.record_as_creator(&mut event);
        match expires {
            Some(e) => event.set(KN_EXPIRES, e),
            None => event.set(KN_EXPIRES, format!("+{}", self.config.tombstone_ttl.as_secs())),
        };
        self.post_route_event(from, event)
    }

    fn post_route_event(&self, from: &Topic, mut event: Event) -> Result<RouteReport> {
        if event.id().map(|i| i.is_empty()).unwrap_or(true) {
            event.set(KN_ID, fresh_id());
        }
        let post = self.post(&from.routes(), event)?;
        Ok(RouteReport { ignored: post.duplicate, id: post.id, writes: post.writes, poisoned: post.poisoned, population_pending: false })
    }

    /// Checks a route destination (PROTOCOL.md 3.2) and makes it absolute.
    fn route_destination(&self, to: &[u8]) -> Result<Vec<u8>> {
        if let Some(&b) = to.iter().find(|&&b| b <= b' ' || b == 0x7f || matches!(b, b'"' | b'#' | b'<' | b'>')) {
            return Err(Error::new(
                ErrorKind::BadRequest,
                format!("bad route destination '{}': byte 0x{b:02X} is not allowed", String::from_utf8_lossy(to)),
            ));
        }
        if self.names_no_topic(to).is_some() {
            // As the original: accepted, and poisoned by its first
            // delivery (PROTOCOL.md 4.1 step 4, bad name). No request
            // leaves the server for it, so the outbound policy has no say.
            return Ok(to.to_vec());
        }
        match self.resolve(to)? {
            Destination::Local(topic) => {
                self.check_topic_size(&topic)?;
                if topic.is_reserved() {
                    return Err(Error::new(ErrorKind::BadRequest, format!("bad route destination '{topic}': can't route into a reserved topic")));
                }
                Ok(self.topic_url(&topic).into_bytes())
            }
            Destination::Remote(url) => {
                self.config.outbound.check(&url)?;
                Ok(url.into_bytes())
            }
            Destination::Push(subscription) => self.push_destination(subscription),
        }
    }

    /// How many `kn_content_filter` expressions this store has compiled:
    /// once per route when it is created, then once per route and list of
    /// a topic's routes (not once per post). A figure for tests and
    /// benchmarks.
    pub fn filters_compiled(&self) -> u64 {
        self.filters_compiled.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Where a route's destination delivers (PROTOCOL.md 4.1 step 4): as
    /// [`Store::resolve`], except that a URL of this server that names no
    /// topic fails as a bad name instead of being taken for a remote URL.
    pub(super) fn route_target(&self, destination: &[u8]) -> Result<Destination> {
        match self.names_no_topic(destination) {
            Some(err) => Err(err),
            None => self.resolve(destination),
        }
    }

    /// The bad-name error of an absolute URL of this server (one of
    /// [`Store::server_names`]) that names no valid topic: a bad name
    /// after the server URL and `/` (`<server-url>/a/../b`), or no `/`
    /// after the server URL at all (`<server-url>a`, `<server-url>?x`, the
    /// bare server URL). `None` for anything else: a topic name, a URL
    /// naming a topic, a URL of another server.
    fn names_no_topic(&self, to: &[u8]) -> Option<Error> {
        let text = std::str::from_utf8(to).ok()?;
        let scheme = |s: &str| text.get(..s.len()).is_some_and(|p| p.eq_ignore_ascii_case(s));
        if !(scheme("http://") || scheme("https://")) {
            return None;
        }
        match self.resolve(to) {
            Ok(Destination::Local(_) | Destination::Push(_)) => None,
            Err(err) => Some(err),
            Ok(Destination::Remote(_)) => {
                let own = self.server_names().into_iter().find(|own| {
                    let Some(rest) = text.strip_prefix(own.as_str()) else { return false };
                    // Without a path, the server URL ends at its authority:
                    // `http://h:80` + `80/x` is another port, `+ .evil/` another host.
                    let has_path = own.split_once("://").is_some_and(|(_, after)| after.contains('/'));
                    has_path || rest.is_empty() || rest.starts_with('?')
                })?;
                Some(Error::new(
                    ErrorKind::BadTopic,
                    format!("bad topic name '{text}': a URL of this server ('{own}') names a topic only with a '/' after the server URL"),
                ))
            }
        }
    }

    pub(super) fn compile_filter(&self, pattern: &[u8]) -> Result<regex::bytes::Regex> {
        self.filters_compiled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let text = String::from_utf8_lossy(pattern);
        if pattern.len() > self.config.max_filter_bytes {
            return Err(Error::new(
                ErrorKind::BadRequest,
                format!("kn_content_filter of {} bytes is longer than the maximum of {}", pattern.len(), self.config.max_filter_bytes),
            ));
        }
        regex::bytes::RegexBuilder::new(&text)
            .size_limit(1 << 20)
            .build()
            .map_err(|e| Error::new(ErrorKind::BadRequest, format!("bad kn_content_filter '{text}': {e}")))
    }
}
