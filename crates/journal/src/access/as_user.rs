//! [`AsUser`]: the store's request API, checked against the access rules
//! for one [`Principal`]; and who an anonymous request is
//! ([`Store::anonymous_with`], its session checked with the store's key).

use crate::error::Result;
use crate::event::Event;
use crate::store::{Destination, PostReport, Receipts, Route, RouteReport, Selected, Selection, Store, TunnelStart};
use crate::topic::Topic;

use super::{Operation, Principal, Reader, Rules, SessionKey};

/// The store as one user sees it: every call checks the access rules
/// before it does anything, then calls the [`Store`] method of the same
/// name. Servers answer requests through it; local tools use the
/// [`Store`] itself.
///
/// ```
/// use kn_journal::access::Principal;
/// use kn_journal::{Config, ErrorKind, Event, Store, Topic};
///
/// let dir = tempfile::tempdir().unwrap();
/// let rules = dir.path().join("access.rules");
/// std::fs::write(&rules, "allow all /who/{user}/** users\n").unwrap();
/// let mut config = Config::new(dir.path().join("kn_events"));
/// config.access_rules = Some(rules);
/// let store = Store::open_with(config).unwrap();
///
/// let anna = Principal::user("anna");
/// let own = Topic::parse("/who/anna/notes").unwrap();
/// store.as_user(&anna).notify(&own, Event::from_pairs([("kn_payload", "hi")])).unwrap();
/// let err = store.as_user(&Principal::user("bob")).notify(&own, Event::new()).unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::Forbidden);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct AsUser<'a> {
    store: &'a Store,
    who: &'a Principal,
}

impl Store {
    /// This store as `who` may use it (see [`AsUser`]).
    pub fn as_user<'a>(&'a self, who: &'a Principal) -> AsUser<'a> {
        AsUser { store: self, who }
    }
}

impl AsUser<'_> {
    /// Who this is.
    pub fn principal(&self) -> &Principal {
        self.who
    }

    /// Whether this user may do `op` on `topic` (always, without a rules
    /// file); see [`Rules::check`].
    pub fn check(&self, op: Operation, topic: &Topic) -> Result<()> {
        self.allows(self.store.access_rules()?.as_deref(), op, topic)
    }

    /// [`AsUser::check`] under `rules`: without them everything is
    /// allowed, but what narrows the principal (a token's claim, a
    /// cookie's channel: [`Principal::check_claim`]) still narrows.
    fn allows(&self, rules: Option<&Rules>, op: Operation, topic: &Topic) -> Result<()> {
        match rules {
            Some(rules) => rules.check(self.who, op, topic),
            None => self.who.check_claim(op, topic),
        }
    }

    /// [`Store::notify`], if this user may post to `topic`.
    pub fn notify(&self, topic: &Topic, event: Event) -> Result<PostReport> {
        self.check(Operation::Post, topic)?;
        self.store.notify(topic, event)
    }

    /// [`Store::notify_deferring`], if this user may post to `topic`.
    pub fn notify_deferring(&self, topic: &Topic, event: Event) -> Result<PostReport> {
        self.check(Operation::Post, topic)?;
        self.store.notify_deferring(topic, event)
    }

    /// [`Store::notify_nowait`], if this user may post to `topic`: `None`
    /// (nothing done) when the post cannot be made at once.
    pub fn notify_nowait(&self, topic: &Topic, event: Event) -> Option<Result<PostReport>> {
        if let Err(err) = self.check(Operation::Post, topic) {
            return Some(Err(err));
        }
        self.store.notify_nowait(topic, event)
    }

    /// [`Store::events`], if this user may read `topic`; of an
    /// introspection topic, only the events this user may see
    /// ([`Rules::may_see`]).
    pub fn events(&self, topic: &Topic, selection: &Selection) -> Result<Selected> {
        self.check(Operation::Read, topic)?;
        let mut selected = self.store.events(topic, selection)?;
        if let Some(rules) = self.store.access_rules()? {
            rules.retain_visible(self.who, topic, &mut selected.events);
        }
        Ok(selected)
    }

    /// [`Store::tunnel`], if this user may read `topic`. Every delivery
    /// checks again that the user still may (the tunnel ends with the
    /// refusal when not), and an introspection topic's tunnel delivers
    /// only what the user may see ([`Rules::may_see`]).
    pub fn tunnel(&self, topic: &Topic, selection: &Selection) -> Result<TunnelStart> {
        self.check(Operation::Read, topic)?;
        let mut start = self.store.tunnel(topic, selection)?;
        if let Some(rules) = self.store.access_rules()? {
            rules.retain_visible(self.who, topic, &mut start.initial.events);
        }
        start.tunnel.reader = Some(Reader::new(self.who.clone()));
        Ok(start)
    }

    /// [`Store::receipts`], if this user may read `topic`; a receipt
    /// whose route this user may not see (as in `kn_routes`:
    /// [`Rules::may_see`]) is marked not [`visible`](crate::Receipt::visible):
    /// its journal, route and creator are not to be shown.
    pub fn receipts(&self, topic: &Topic, id: &[u8]) -> Result<Option<Receipts>> {
        self.check(Operation::Read, topic)?;
        let Some(mut receipts) = self.store.receipts(topic, id)? else { return Ok(None) };
        if let Some(rules) = self.store.access_rules()? {
            let routes = topic.routes();
            for receipt in &mut receipts.journals {
                receipt.visible = rules.may_see(self.who, &routes, &receipt.route.event);
            }
        }
        Ok(Some(receipts))
    }

    /// [`Store::confirm`], if this user may read `journal` and change
    /// what its receipts say ([`Principal::check_change`]: not with a
    /// cookie from another site, which would silence an escalation).
    pub fn confirm(&self, journal: &Topic, checkpoint: &[u8]) -> Result<Option<u64>> {
        self.check(Operation::Read, journal)?;
        self.who.check_change(&format!("acknowledge events of '{journal}'"))?;
        self.store.confirm(journal, checkpoint)
    }

    /// [`Store::route`], if this user may read `from` and route to `to`
    /// (when it is a topic of this store), and, when the route replaces
    /// someone else's of the same `kn_id`, may delete that one. The route
    /// records its creator ([`KN_ROUTE_CREATOR`](super::KN_ROUTE_CREATOR), or [`KN_ROUTE_SESSION`](super::KN_ROUTE_SESSION); whatever the request
    /// said there is dropped), so that each delivery checks the creator's
    /// rights again.
    pub fn route(&self, from: &Topic, to: &[u8], params: Event) -> Result<RouteReport> {
        let params = self.may_route(from, to, params)?;
        self.store.route(from, to, params)
    }

    /// [`Store::route_deferred`] (the population carried after the
    /// server's reply), with the checks of [`AsUser::route`].
    pub fn route_deferred(&self, from: &Topic, to: &[u8], params: Event) -> Result<RouteReport> {
        let params = self.may_route(from, to, params)?;
        self.store.route_deferred(from, to, params)
    }

    /// The checks of [`AsUser::route`]: the route's elements, with its
    /// creator recorded, when this user may make it. A route replacing
    /// one of the same `kn_id`, active, poisoned or deleted alike, needs
    /// what deleting that one needs ([`AsUser::delete_route`]).
    fn may_route(&self, from: &Topic, to: &[u8], mut params: Event) -> Result<Event> {
        // Only the store writes these.
        params.remove(crate::store::KN_POISONED);
        params.remove(crate::store::KN_POISONED_BEFORE);
        // A route is a change whatever its destination: one to a remote
        // URL needs only `read` on its source below, which a cookie from
        // another site has, yet it forwards every later event there.
        self.who.check_change(&format!("route '{from}'"))?;
        self.who.record_as_creator(&mut params);
        let local = match self.store.resolve(to) {
            Ok(Destination::Local(topic)) => Some(topic),
            _ => None,
        };
        let rules = self.store.access_rules()?;
        let rules = rules.as_deref();
        self.allows(rules, Operation::Read, from)?;
        if let Some(topic) = &local {
            self.allows(rules, Operation::Route, topic)?;
        }
        // Escalations are posted as the route's creator's.
        if let Some(Ok(Destination::Local(to))) = params.get(crate::store::KN_UNREAD_TO).map(|to| self.store.resolve(to)) {
            self.allows(rules, Operation::Post, &to)?;
        }
        self.bind_to_token(rules, from, local.as_ref(), &mut params);
        // Replacing a route deletes it. Without rules, and nothing to
        // narrow the principal, anyone may (as in 2003).
        if rules.is_some() || self.who.is_narrowed() {
            if let Some(id) = params.id().filter(|id| !id.is_empty()) {
                if let Some(existing) = self.store.route_of(from, id)? {
                    self.may_remove(rules, &existing)?;
                }
            }
        }
        Ok(params)
    }

    /// [`Store::delete_route`], if this user created the route, may
    /// delete routes of `from`, or may route to the route's destination
    /// (a topic of this store): a user can always stop what arrives in
    /// topics of their own. A token's claim narrows each of the three
    /// (a creator included: see the rules in docs/ACCESS.md, section 3).
    pub fn delete_route(&self, from: &Topic, id: &[u8], expires: Option<&[u8]>) -> Result<RouteReport> {
        let rules = self.store.access_rules()?;
        let rules = rules.as_deref();
        if rules.is_none() && !self.who.is_narrowed() {
            return self.store.delete_route(from, id, expires);
        }
        let existing = self.store.route_of(from, id)?;
        match &existing {
            Some(existing) => self.may_remove(rules, existing)?,
            None => self.allows(rules, Operation::Delete, from)?,
        }
        // The tombstone keeps the route's creator: reusing its id later
        // needs what deleting it needed.
        let creator = existing.map(|r| Principal::creator_of(&r.event)).unwrap_or_default();
        self.store.delete_route_of(from, id, expires, &creator)
    }

    /// A route made with a bearer token carries the token's rights and
    /// expires with it (its `kn_expires` no later than the token's `exp`,
    /// what the token grants in [`KN_ROUTE_GRANT`](super::KN_ROUTE_GRANT)),
    /// unless the rules alone let the token's user make it: then it is
    /// the user's, as if made without the token.
    fn bind_to_token(&self, rules: Option<&Rules>, from: &Topic, to: Option<&Topic>, params: &mut Event) {
        let Some(exp) = self.who.token_expires() else { return };
        if let (Some(name), false) = (self.who.name(), self.who.is_capability()) {
            let plain = Principal::user(name);
            let may = rules.is_none_or(|rules| {
                rules.check(&plain, Operation::Read, from).is_ok() && to.is_none_or(|to| rules.check(&plain, Operation::Route, to).is_ok())
            });
            if may {
                return;
            }
        }
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        match params.expires_at(now) {
            Ok(Some(at)) if at <= exp as f64 => {}
            _ => {
                params.set(crate::event::KN_EXPIRES, exp.to_string().as_str());
            }
        }
        if let Some(record) = self.who.grant_record() {
            params.set(super::KN_ROUTE_GRANT, record.as_str());
        }
    }

    /// Whether this user may delete or replace `route`: as its creator,
    /// or with `delete` on its source, or with `route` on its destination
    /// (a topic of this store). Being the creator waives the rules, never
    /// what narrows the principal: a token's claim must still allow
    /// `delete` on the source or `route` on the destination, and a cookie
    /// from another site changes nothing (issue 37: a token narrowed to
    /// `read /what/chat` deleted its user's route).
    fn may_remove(&self, rules: Option<&Rules>, route: &Route) -> Result<()> {
        let to = match self.store.resolve(route.destination()) {
            Ok(Destination::Local(to)) => Some(to),
            _ => None,
        };
        if self.who.is_identified() && Principal::creator_of(&route.event) == *self.who {
            let claim_allows = |op, topic: &Topic| self.who.check_claim(op, topic).is_ok();
            if claim_allows(Operation::Delete, &route.source) || to.as_ref().is_some_and(|to| claim_allows(Operation::Route, to)) {
                return Ok(());
            }
        }
        let refused = match self.allows(rules, Operation::Delete, &route.source) {
            Ok(()) => return Ok(()),
            Err(err) => err,
        };
        if to.is_some_and(|to| self.allows(rules, Operation::Route, &to).is_ok()) {
            return Ok(());
        }
        Err(refused)
    }
}

impl Store {
    /// The store's session key (see [`SessionKey::of_store`]), read once
    /// per process.
    pub fn session_key(&self) -> Result<SessionKey> {
        self.access_source().session_key(self.root())
    }

    /// Who an anonymous request bringing session `token` is: the
    /// visitor's session when the token checks out, else plain anonymous.
    pub fn anonymous_with(&self, token: Option<&[u8]>) -> Principal {
        let id = token.and_then(|t| self.session_key().ok()?.verify(t));
        match id {
            Some(id) => Principal::anonymous_session(&id),
            None => Principal::anonymous(),
        }
    }
}
