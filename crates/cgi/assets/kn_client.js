// knpubsub JavaScript client (served by do_method=lib after whoami).
// No dependencies; any current browser (fetch, EventSource, Promise).
//
// One page = one journal (/who/<user>/s/<session>/kn_journal; for an
// anonymous visitor /who/anonymous/s/<visitor>/<session>/kn_journal, where
// <visitor> is the session do_method=session gives, proven by its
// kn_session cookie: docs/ACCESS.md) = one EventSource
// (kn_response_format=sse). Subscribing routes a topic into that
// journal; its events come back over the one connection and are dispatched
// on kn_route_location, which is the route's kn_uri. Publishing and every
// other request is a fetch POST answered in the simple format.
//
// API (everything hangs off window.kn):
//
//   kn.publish(topic, event, callbacks) -> Promise<status>
//       event: {kn_payload: "hi", any_element: "..."}; a kn_id is added if
//       absent, so a retried publish is the same event (duplicate
//       suppression on ordinary topics makes retries safe).
//   kn.publishMany(topic, events, callbacks) -> Promise<status>
//       several events in one do_method=batch request.
//   kn.subscribe(topic, onEvent, options, callbacks) -> id
//       onEvent(event): event is a plain object of elements (strings).
//       options: do_max_n, do_max_age (seconds or "infinity"),
//       kn_content_filter, kn_expires, and id (a route id to reuse).
//       The route is requested once the connection is open.
//   kn.unsubscribe(id, callbacks) -> Promise<status>
//   kn.pushSubscribe(topic, options, callbacks) -> Promise<{id, status, subscription}>
//       Web Push to this browser even when the page is closed
//       (docs/BROWSER.md, "Push to a closed page"): registers the service
//       worker options.worker (default "/kn-sw.js", www/kn-sw.js), gets a
//       PushSubscription with the server's VAPID key (window.kn_vapid_key,
//       else do_method=vapid) and routes topic to it (kn_to=webpush:...).
//       options: id, kn_push_ttl, kn_push_urgency, kn_push_topic,
//       kn_content_filter, kn_expires.
//   kn.pushUnsubscribe(topic, id, callbacks) -> Promise<status>
//       deletes that route.
//   kn.request(params, callbacks) -> Promise<status>
//       any PubSub request (params as for the protocol).
//   callbacks: {onSuccess(status), onError(status)}; status is the status
//       event ({status: "200 Notified", kn_payload: ...}); errors that are
//       not the server's (network down past kn.retryFor ms) are
//       {status: "503 Unreachable", kn_payload: why}.
//   kn.onConnection = function (state, detail) {}
//       state: "connecting", "open", "reconnecting", or "gap" (the server
//       no longer retains the resume point: events may have been missed;
//       detail is its explanation).
//   kn.server, kn.journal, kn.userid, kn.displayname, kn.connected
//   kn.ready: a Promise settled once kn.journal is known (at once for a
//       user; for an anonymous visitor after do_method=session).
//   kn.retryFor: how long (ms) a request is retried; default 60000.
//   kn.transport: "sse" (default) or "websocket": how events come back
//       (a WebSocket under `serve`, falling back to the EventSource where
//       no socket opens); the same onConnection states either way.
//   kn.via: what the connection uses now, "sse" or "websocket".
//
// Bearer tokens (docs/ACCESS.md 1b, docs/BROWSER.md): set before loading
// the client, or later with kn.setToken(token):
//   window.kn_token = "<a JWT>";
//   window.kn_refreshToken = function () { return fetch("/my/token").then(r => r.text()); };
//   window.kn_tokenCookie = "kn_token";   // the server's KN_TOKEN_COOKIE
// Each transport carries it the way it can: a POST to the same origin in
// `Authorization: Bearer`, to another origin in its kn_token form field
// (a simple request: no preflight); the EventSource (which sends no
// header) of the same origin in the cookie, which the client writes
// (kn.tokenCookie = "" to use the query instead), of another origin in
// the kn_token query parameter. The page's journal is named after the
// token's sub. When the tunnel ends with a 401 status event (its token
// expired), a request is answered 401, or the token's exp has passed,
// the client calls kn_refreshToken (it returns the new token, a Promise
// of it, or nothing when it renewed an HttpOnly cookie itself) and
// reconnects from its last checkpoint: nothing is lost. A request
// answered 401 is sent again, identical, once, with the new token.
//
// Reconnecting: when the connection drops (server restart, network), the
// client reconnects by itself, resuming exactly after the last event it
// received (last_event_id = that event's kn_route_checkpoint); events are
// also de-duplicated by checkpoint, so none is lost or seen twice.
// Requests that fail on the network (or get 502/503/504) are re-sent,
// identical, until they get an answer or kn.retryFor passes.
(function () {
  "use strict";
  if (window.kn && window.kn.publish) return;

  var server = window.kn_server || "/kn";
  var userid = window.kn_userid || "anonymous";
  // A bearer token the page hands us: its sub is the user the server
  // judges (a token wins over the web server's login).
  var tokenSub = claimsOf(window.kn_token).sub;
  if (tokenSub) userid = String(tokenSub);
  var session = randomId(12);
  // The user's own name when it is a valid topic segment, so that access
  // rules granting /who/{user}/** match (docs/ACCESS.md); else the bytes a
  // topic cannot hold become "_".
  var owner = userid.replace(/[^A-Za-z0-9_.\u0080-\uffff-]/g, "_").replace(/^\.|\.$/g, "_") || "anonymous";
  var journal = null, statusFrom = null;
  var subscriptions = {};   // id -> {topic, params, onEvent, uri, sent}
  var byUri = {};           // kn_uri -> subscription
  var source = null, open = false, everOpen = false, lostAt = 0, retryTimer = null, backoff = 250;
  var lastCheckpoint = -1, seen = [], seenSet = {}, counter = 0;
  var needRefresh = false, refreshing = null, failedBeforeOpen = 0;
  var kn;

  function setJournal(path) {
    journal = path;
    statusFrom = server + journal + "/kn_status/tunnel";
    if (kn) kn.journal = journal;
  }

  // An anonymous visitor's journal lies under the session the server
  // hands out (its token in an HttpOnly cookie that every request then
  // brings): only this visitor may read it, whoever learns its name. A
  // server without sessions (an unknown do_method) gets the old name.
  function startSession() {
    if (owner !== "anonymous") {
      setJournal("/who/" + owner + "/s/" + session + "/kn_journal");
      return Promise.resolve(journal);
    }
    return request({do_method: "session"}, {onError: function () {}}).then(function (status) {
      var id = /^200/.test(status.status || "") ? (status.kn_payload || "") : "";
      setJournal(id ? "/who/anonymous/s/" + id + "/" + session + "/kn_journal" : "/who/anonymous/s/" + session + "/kn_journal");
      return journal;
    });
  }

  // ----- bearer tokens ------------------------------------------------------

  // The claims of a JWT (unverified: only to read sub and exp), or {}.
  function claimsOf(token) {
    try {
      var part = String(token || "").split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
      while (part.length % 4) part += "=";
      var claims = JSON.parse(decodeURIComponent(escape(atob(part))));
      return claims && typeof claims === "object" ? claims : {};
    } catch (x) {
      return {};
    }
  }

  function token() {
    return kn && kn.token ? String(kn.token) : "";
  }

  // True when the server is of this page's origin (the Authorization
  // header and cookies need no CORS preflight there).
  function sameOrigin() {
    try {
      return new URL(server, location.href).origin === location.origin;
    } catch (x) {
      return true;
    }
  }

  // The cookie an EventSource of the same origin brings the token in.
  function writeCookie() {
    var name = kn.tokenCookie, t = token();
    if (!name || !t || !sameOrigin() || t.length > 3800) return false;
    var path = new URL(server, location.href).pathname || "/";
    var secure = location.protocol === "https:" ? "; Secure" : "";
    // Gone when the token expires: an expired token in a cookie would
    // have every request of this browser to the server refused 401.
    var exp = claimsOf(t).exp;
    var age = typeof exp === "number" ? "; Max-Age=" + Math.max(0, Math.floor(exp - Date.now() / 1000)) : "";
    document.cookie = name + "=" + t + "; Path=" + path + "; SameSite=Strict" + age + secure;
    return true;
  }

  // True when the token's exp (if it says) has passed.
  function tokenExpired() {
    var exp = claimsOf(token()).exp;
    return typeof exp === "number" && exp * 1000 <= Date.now();
  }

  function setToken(t) {
    kn.token = t || "";
    writeCookie();
    scheduleRefresh();
  }

  // A token with an exp is renewed before it runs out (a quarter of its
  // life, at most 30 s, before), and the routes made with the old one are
  // asked for again: a route whose right came from the token expires with
  // it (docs/ACCESS.md), the new request carries the new expiry.
  var refreshTimer = null;
  function scheduleRefresh() {
    clearTimeout(refreshTimer);
    var exp = claimsOf(token()).exp;
    if (typeof exp !== "number" || typeof kn.refreshToken !== "function") return;
    var left = exp * 1000 - Date.now();
    refreshTimer = setTimeout(function () {
      refresh().then(function (ok) {
        if (!ok) return;
        Object.keys(subscriptions).forEach(function (id) {
          if (subscriptions[id].sent) sendRoute(subscriptions[id]);
        });
      });
    }, Math.max(500, left - Math.min(30000, left / 4)));
  }

  // Asks the page for a new token, once at a time. Resolves when done
  // (whether or not it gave one: an HttpOnly cookie may have been renewed).
  function refresh() {
    var f = kn.refreshToken;
    if (typeof f !== "function") return Promise.resolve(false);
    if (refreshing) return refreshing;
    refreshing = Promise.resolve().then(function () { return f(); }).then(function (t) {
      if (typeof t === "string" && t) setToken(t);
      needRefresh = false;
      return true;
    }, function (err) {
      var why = "refreshing the bearer token failed: " + (err && err.message || err);
      if (open) { if (window.console) console.warn("kn: " + why); } else setState("reconnecting", why);
      return false;
    }).then(function (ok) {
      refreshing = null;
      return ok;
    });
    return refreshing;
  }

  function randomId(n) {
    var bytes = new Uint8Array(n), s = "", abc = "abcdefghijklmnopqrstuvwxyz0123456789";
    (window.crypto || window.msCrypto).getRandomValues(bytes);
    for (var i = 0; i < n; i++) s += abc[bytes[i] % abc.length];
    return s;
  }

  function freshId() {
    return session + "_" + (++counter) + "_" + randomId(4);
  }

  function form(params) {
    var parts = [];
    Object.keys(params).forEach(function (k) {
      var v = params[k];
      if (v === undefined || v === null) return;
      (Array.isArray(v) ? v : [v]).forEach(function (one) {
        parts.push(encodeURIComponent(k) + "=" + encodeURIComponent(String(one)));
      });
    });
    return parts.join("&");
  }

  // ----- the simple format ---------------------------------------------------

  function unescapeSimple(s) {
    return s.replace(/=([0-9A-F]{2})/g, function (_, h) { return String.fromCharCode(parseInt(h, 16)); });
  }

  // Events of a simple-format body (an ArrayBuffer or Uint8Array).
  function parseSimple(buffer) {
    var bytes = buffer instanceof Uint8Array ? buffer : new Uint8Array(buffer);
    var dec = new TextDecoder(), events = [], i = 0;
    while (i < bytes.length) {
      while (i < bytes.length && (bytes[i] === 32 || bytes[i] === 10 || bytes[i] === 13 || bytes[i] === 9 || bytes[i] === 0)) i++;
      var nl = bytes.indexOf(10, i);
      if (nl < 0) break;
      var count = parseInt(dec.decode(bytes.subarray(i, nl)), 10);
      if (!(count >= 0)) break;
      var frame = bytes.subarray(nl + 1, nl + 1 + count);
      i = nl + 1 + count + 1;
      var split = -1;
      for (var j = 0; j + 1 < frame.length; j++) {
        if (frame[j] === 10 && frame[j + 1] === 10) { split = j; break; }
        if (j === 0 && frame[0] === 10) { split = -2; break; }
      }
      var e = {}, head, body;
      if (split === -2) { head = ""; body = frame.subarray(1); }
      else if (split < 0) { head = dec.decode(frame); body = new Uint8Array(0); }
      else { head = dec.decode(frame.subarray(0, split)); body = frame.subarray(split + 2); }
      head.split("\n").forEach(function (line) {
        var c = line.indexOf(":");
        if (c > 0) e[unescapeSimple(line.slice(0, c))] = unescapeSimple(line.slice(c + 1).replace(/^ /, ""));
      });
      e.kn_payload = dec.decode(body);
      events.push(e);
    }
    return events;
  }

  // ----- requests ------------------------------------------------------------

  function report(callbacks, status) {
    var ok = /^2/.test(status.status || "");
    var f = ok ? callbacks.onSuccess : callbacks.onError;
    if (f) {
      try { f(status); } catch (x) { setTimeout(function () { throw x; }); }
    } else if (!ok && window.console) {
      console.warn("kn: " + status.status + " " + (status.kn_payload || ""));
    }
    return status;
  }

  // One POST, re-sent identically on network errors and gateway errors.
  function request(params, callbacks, all) {
    callbacks = callbacks || {};
    params.kn_response_format = "simple";
    var deadline = Date.now() + (kn.retryFor || 60000), delay = 100, refreshed = false;
    function attempt() {
      var ctl = typeof AbortController !== "undefined" ? new AbortController() : null;
      var timer = ctl && setTimeout(function () { ctl.abort(); }, 15000);
      var headers = {"Content-Type": "application/x-www-form-urlencoded"}, body = form(params), t = token();
      if (t && sameOrigin()) headers.Authorization = "Bearer " + t;
      else if (t) body += "&kn_token=" + encodeURIComponent(t);
      return fetch(server, {
        method: "POST",
        headers: headers,
        body: body,
        cache: "no-store",
        signal: ctl ? ctl.signal : undefined
      }).then(function (r) {
        if (r.status === 401 && !refreshed && (t || tokenExpired()) && typeof kn.refreshToken === "function") {
          // The token expired (or was refused): once, a new one, and the
          // same request again (its kn_id makes a re-send harmless).
          refreshed = true;
          if (timer) clearTimeout(timer);
          return refresh().then(attempt);
        }
        return r.arrayBuffer().then(function (buf) {
          if (timer) clearTimeout(timer);
          var statuses = parseSimple(buf);
          if (!statuses.length || r.status === 502 || r.status === 503 || r.status === 504) {
            throw new Error("HTTP " + r.status);
          }
          return all ? statuses : statuses[0];
        });
      }).catch(function (err) {
        if (timer) clearTimeout(timer);
        if (Date.now() + delay > deadline) {
          var failed = {status: "503 Unreachable", kn_payload: String(err && err.message || err)};
          return all ? [failed] : failed;
        }
        return new Promise(function (resolve) { setTimeout(resolve, delay); }).then(function () {
          delay = Math.min(delay * 2, 1000);
          return attempt();
        });
      });
    }
    return attempt().then(function (result) {
      if (!all) return report(callbacks, result);
      // A batch: its own status, then one per entry; the first failure
      // (or the batch status) decides the callback.
      var bad = result.filter(function (s) { return !/^2/.test(s.status || ""); })[0];
      report(callbacks, bad || result[0]);
      return result;
    });
  }

  function withId(event) {
    var params = {};
    Object.keys(event || {}).forEach(function (k) { params[k] = event[k]; });
    if (params.kn_id === undefined || params.kn_id === null || params.kn_id === "") params.kn_id = freshId();
    return params;
  }

  function publish(topic, event, callbacks) {
    var params = withId(event);
    params.do_method = "notify";
    params.kn_to = topic;
    return request(params, callbacks);
  }

  function publishMany(topic, events, callbacks) {
    var batch = events.map(function (event) {
      var params = withId(event);
      params.do_method = "notify";
      params.kn_to = topic;
      return form(params);
    });
    return request({do_method: "batch", kn_batch: batch}, callbacks, true);
  }

  // ----- subscriptions -------------------------------------------------------

  function sendRoute(sub, callbacks) {
    sub.sent = true;
    var params = {};
    Object.keys(sub.params).forEach(function (k) { params[k] = sub.params[k]; });
    return request(params, callbacks || sub.callbacks);
  }

  // The route's destination and kn_uri, once the journal is known.
  function bind(sub) {
    if (sub.uri || !journal || subscriptions[sub.id] !== sub) return;
    sub.uri = server + journal + "/kn_routes/" + sub.id;
    sub.params.kn_to = journal;
    sub.params.kn_uri = sub.uri;
    byUri[sub.uri] = sub;
  }

  function subscribe(topic, onEvent, options, callbacks) {
    options = options || {};
    var id = options.id || ("r" + freshId());
    var params = {do_method: "route", kn_from: topic, kn_id: id};
    ["do_max_n", "do_max_age", "kn_content_filter", "kn_expires"].forEach(function (k) {
      if (options[k] !== undefined && options[k] !== null && options[k] !== "") params[k] = options[k];
    });
    var sub = {id: id, topic: topic, params: params, onEvent: onEvent, uri: null, callbacks: callbacks || {}, sent: false};
    subscriptions[id] = sub;
    if (journal) bind(sub);
    else ready.then(function () { bind(sub); });
    connect();
    // A route into a journal needs the journal's heartbeat: wait for the
    // tunnel's status event.
    if (open) sendRoute(sub);
    return id;
  }

  function unsubscribe(id, callbacks) {
    var sub = subscriptions[id];
    if (!sub) return Promise.resolve(report(callbacks || {}, {status: "404 Not subscribed", kn_payload: id}));
    delete subscriptions[id];
    if (sub.uri) delete byUri[sub.uri];
    if (!sub.sent) return Promise.resolve(report(callbacks || {}, {status: "200 Unsubscribed", kn_payload: ""}));
    return request({do_method: "route", kn_from: sub.topic, kn_to: "", kn_id: id}, callbacks);
  }

  // ----- Web Push ------------------------------------------------------------

  function base64url(bytes) {
    var s = "";
    for (var i = 0; i < bytes.length; i++) s += String.fromCharCode(bytes[i]);
    return btoa(s).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  function fromBase64url(text) {
    var s = atob(text.replace(/-/g, "+").replace(/_/g, "/"));
    var out = new Uint8Array(s.length);
    for (var i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
    return out;
  }

  function sameBytes(a, b) {
    if (a.length !== b.length) return false;
    for (var i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
    return true;
  }

  function vapidKey() {
    if (window.kn_vapid_key) return Promise.resolve(window.kn_vapid_key);
    return fetch(server + "?do_method=vapid", {credentials: "same-origin"}).then(function (r) {
      if (!r.ok) throw new Error("this server sends no Web Push");
      return r.text();
    }).then(function (t) { return t.trim(); });
  }

  function pushSubscribe(topic, options, callbacks) {
    options = options || {};
    if (!("serviceWorker" in navigator) || !window.PushManager) {
      return Promise.reject(new Error("this browser has no Web Push"));
    }
    var id = options.id || ("p" + freshId());
    return navigator.serviceWorker.register(options.worker || "/kn-sw.js").then(function () {
      return navigator.serviceWorker.ready;
    }).then(function (reg) {
      return Promise.all([reg.pushManager.getSubscription(), vapidKey()]).then(function (got) {
        var s = got[0], key = fromBase64url(got[1]);
        // A subscription is bound to the key it was made with: after the
        // operator rotates the server's, the push services refuse the old
        // one (and its route is poisoned), so it is replaced.
        var made = s && s.options && s.options.applicationServerKey;
        if (s && (!made || sameBytes(new Uint8Array(made), key))) return s;
        var dropped = s ? s.unsubscribe().catch(function () {}) : Promise.resolve();
        return dropped.then(function () {
          return reg.pushManager.subscribe({userVisibleOnly: true, applicationServerKey: key});
        });
      });
    }).then(function (subscription) {
      var json = JSON.stringify(subscription.toJSON ? subscription.toJSON() : subscription);
      var params = {do_method: "route", kn_from: topic, kn_id: id, kn_to: "webpush:" + base64url(new TextEncoder().encode(json))};
      ["kn_push_ttl", "kn_push_urgency", "kn_push_topic", "kn_content_filter", "kn_expires"].forEach(function (k) {
        if (options[k] !== undefined && options[k] !== null && options[k] !== "") params[k] = options[k];
      });
      return request(params, callbacks).then(function (status) {
        return {id: id, status: status, subscription: subscription};
      });
    });
  }

  function pushUnsubscribe(topic, id, callbacks) {
    return request({do_method: "route", kn_from: topic, kn_to: "", kn_id: id}, callbacks);
  }

  // ----- the connection ------------------------------------------------------

  function setState(state, detail) {
    kn.connected = state === "open";
    if (kn.onConnection) {
      try { kn.onConnection(state, detail); } catch (x) { setTimeout(function () { throw x; }); }
    }
  }

  function isNew(checkpoint) {
    var n = /^[0-9]+$/.test(checkpoint) ? parseInt(checkpoint, 10) : NaN;
    if (seenSet[checkpoint]) return false;
    if (!isNaN(n) && n <= lastCheckpoint) return false;
    seenSet[checkpoint] = true;
    seen.push(checkpoint);
    if (seen.length > 2000) delete seenSet[seen.shift()];
    if (!isNaN(n)) lastCheckpoint = n;
    return true;
  }

  function tunnelUrl() {
    var q = "do_method=route;kn_response_format=sse;kn_status_from=" + encodeURIComponent(statusFrom);
    // Resume exactly after the last event seen; EventSource also sends it
    // as Last-Event-ID on its own reconnects, which the server prefers.
    if (seen.length) q += ";last_event_id=" + encodeURIComponent(seen[seen.length - 1]);
    else if (everOpen) q += ";do_max_age=infinity";
    // An EventSource sends no header: the cookie (same origin), else the
    // query parameter.
    if (token() && !writeCookie()) q += ";kn_token=" + encodeURIComponent(token());
    return server + journal + "?" + q;
  }

  function onMessage(m) {
    var e;
    try { e = JSON.parse(m.data); } catch (x) { return; }
    if (e.kn_route_checkpoint !== undefined && !isNew(e.kn_route_checkpoint)) return;
    if (e.status && e.kn_route_location === statusFrom && e.kn_route_checkpoint === undefined) {
      tunnelStatus(e);
      return;
    }
    var sub = byUri[e.kn_route_location];
    if (sub && sub.onEvent) {
      try { sub.onEvent(e); } catch (x) { setTimeout(function () { throw x; }); }
    } else if (kn.onEvent) {
      kn.onEvent(e);
    }
  }

  function tunnelStatus(e) {
    var code = parseInt(e.status, 10);
    if (code === 200) {
      var wasLost = lostAt;
      open = true;
      everOpen = true;
      failedBeforeOpen = 0;
      backoff = 250;
      lostAt = 0;
      setState("open");
      // Routes wait for the journal's heartbeat. After a long outage the
      // journal may have gone stale (routes into it poisoned): ask again;
      // an intact route answers "Ignored route".
      Object.keys(subscriptions).forEach(function (id) {
        var sub = subscriptions[id];
        bind(sub);
        if (!sub.sent || (wasLost && Date.now() - wasLost > 90000)) sendRoute(sub);
      });
    } else if (code === 401) {
      // Its bearer token expired (or the user lost the right): a new
      // token before the reconnect, which resumes from the checkpoint.
      needRefresh = true;
      setState("reconnecting", e.status + " " + (e.kn_payload || ""));
    } else if (code === 205) {
      // The resume point is gone: say so; what is retained follows.
      setState("gap", e.kn_payload);
    } else {
      setState("reconnecting", e.status + " " + (e.kn_payload || ""));
    }
  }

  // refreshed: a new token was just asked for (do not ask again first).
  function connect(refreshed) {
    if (source) return;
    if (!journal) {
      ready.then(function () { connect(); });
      return;
    }
    if (typeof EventSource === "undefined") {
      setState("reconnecting", "this browser has no EventSource");
      return;
    }
    // An EventSource cannot tell a 401 answer from a network error: a
    // token known to have expired, a 401 status event, or two failures
    // before the tunnel opened ask for a new token first.
    var wanted = refreshing || (typeof kn.refreshToken === "function" && (needRefresh || tokenExpired() || failedBeforeOpen >= 2));
    if (wanted && !refreshed) {
      failedBeforeOpen = 0;
      refresh().then(function (ok) {
        if (source) return;
        if (ok) {
          connect(true);
        } else {
          clearTimeout(retryTimer);
          retryTimer = setTimeout(function () { connect(); }, backoff);
          backoff = Math.min(backoff * 2, 2000);
        }
      });
      return;
    }
    setState(everOpen ? "reconnecting" : "connecting");
    if (kn.transport === "websocket" && typeof WebSocket !== "undefined" && socketFailures < 2) {
      source = openSocket();
      if (source) {
        kn.via = "websocket";
        return;
      }
    }
    kn.via = "sse";
    source = new EventSource(tunnelUrl());
    source.onmessage = onMessage;
    source.onerror = lost;
  }

  // The connection is gone: take over from EventSource's own retry (and
  // do what it would for a socket): reconnect with our resume point on a
  // short backoff, also after errors it would give up on.
  function lost() {
    if (source) source.close();
    source = null;
    if (open || !lostAt) lostAt = lostAt || Date.now();
    if (!open) failedBeforeOpen++;
    open = false;
    setState("reconnecting");
    clearTimeout(retryTimer);
    retryTimer = setTimeout(function () { connect(); }, backoff);
    backoff = Math.min(backoff * 2, 2000);
  }

  // kn.transport = "websocket": the same tunnel over a WebSocket
  // (docs/PROTOCOL.md, "WebSocket (extension)"): the same URL with
  // kn_response_format=websocket, the same JSON objects, the token in a
  // subprotocol (a socket sends no header). A socket that fails twice
  // before it ever opened (no WebSocket through a proxy, the CGI) gives
  // way to the EventSource for the rest of the page's life.
  var socketFailures = 0;
  function openSocket() {
    var a = document.createElement("a");
    // The token goes in the subprotocol alone: a URL is what proxies and
    // web servers log.
    a.href = tunnelUrl().replace("kn_response_format=sse", "kn_response_format=websocket").replace(/;kn_token=[^;&]*/, "");
    var url = (a.protocol === "https:" ? "wss://" : "ws://") + a.host + a.pathname + a.search;
    var protocols = ["kn"];
    if (token()) protocols.push("kn.bearer." + token());
    var ws, opened = false;
    try { ws = new WebSocket(url, protocols); } catch (x) { socketFailures = 2; return null; }
    ws.onopen = function () { opened = true; socketFailures = 0; };
    ws.onmessage = function (m) { onMessage({data: m.data}); };
    ws.onclose = function (c) {
      if (source !== ws) return;
      if (!opened && !everOpen) socketFailures++;
      // 4401: the token expired; ask for a new one before reconnecting.
      if (c.code === 4401) needRefresh = true;
      lost();
    };
    return ws;
  }

  var ready;

  kn = window.kn = {
    server: server,
    journal: journal,
    userid: userid,
    displayname: window.kn_displayname || "Anonymous User",
    connected: false,
    retryFor: 60000,
    token: window.kn_token || "",
    refreshToken: window.kn_refreshToken || null,
    tokenCookie: window.kn_tokenCookie === undefined ? "kn_token" : window.kn_tokenCookie,
    setToken: function (t) { setToken(t); },
    onConnection: null,
    // "sse" (EventSource) or "websocket" (a WebSocket, falling back to
    // the EventSource where none opens): set before subscribing.
    transport: window.kn_transport || "sse",
    // What the last connection used: "sse" or "websocket".
    via: "",
    onEvent: null,
    publish: publish,
    publishMany: publishMany,
    subscribe: subscribe,
    unsubscribe: unsubscribe,
    pushSubscribe: pushSubscribe,
    pushUnsubscribe: pushUnsubscribe,
    request: function (params, callbacks) { return request(withId(params), callbacks); },
    connect: function () { connect(); },
    freshId: freshId,
    parseSimple: parseSimple
  };
  kn.ready = ready = startSession();
  scheduleRefresh();
})();
