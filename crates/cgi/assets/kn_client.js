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
    var body = form(params);
    var deadline = Date.now() + (kn.retryFor || 60000), delay = 100;
    function attempt() {
      var ctl = typeof AbortController !== "undefined" ? new AbortController() : null;
      var timer = ctl && setTimeout(function () { ctl.abort(); }, 15000);
      return fetch(server, {
        method: "POST",
        headers: {"Content-Type": "application/x-www-form-urlencoded"},
        body: body,
        cache: "no-store",
        signal: ctl ? ctl.signal : undefined
      }).then(function (r) {
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
    } else if (code === 205) {
      // The resume point is gone: say so; what is retained follows.
      setState("gap", e.kn_payload);
    } else {
      setState("reconnecting", e.status + " " + (e.kn_payload || ""));
    }
  }

  function connect() {
    if (source) return;
    if (!journal) {
      ready.then(connect);
      return;
    }
    if (typeof EventSource === "undefined") {
      setState("reconnecting", "this browser has no EventSource");
      return;
    }
    setState(everOpen ? "reconnecting" : "connecting");
    source = new EventSource(tunnelUrl());
    source.onmessage = onMessage;
    source.onerror = function () {
      // Take over from EventSource's own retry: reconnect with our resume
      // point on a short backoff, also after errors it would give up on.
      if (source) source.close();
      source = null;
      if (open || !lostAt) lostAt = lostAt || Date.now();
      open = false;
      setState("reconnecting");
      clearTimeout(retryTimer);
      retryTimer = setTimeout(connect, backoff);
      backoff = Math.min(backoff * 2, 2000);
    };
  }

  var ready;

  kn = window.kn = {
    server: server,
    journal: journal,
    userid: userid,
    displayname: window.kn_displayname || "Anonymous User",
    connected: false,
    retryFor: 60000,
    onConnection: null,
    onEvent: null,
    publish: publish,
    publishMany: publishMany,
    subscribe: subscribe,
    unsubscribe: unsubscribe,
    request: function (params, callbacks) { return request(withId(params), callbacks); },
    connect: connect,
    freshId: freshId,
    parseSimple: parseSimple
  };
  kn.ready = ready = startSession();
})();
