// knpubsub JavaScript client: publish and subscribe over the PubSub
// protocol from any current browser, with no dependencies.
//
//   kn.publish("/what/chat", {kn_payload: "hi"}, {onSuccess: f, onError: g});
//   var id = kn.subscribe("/what/chat", function (e) { ... }, {do_max_n: 10});
//   kn.unsubscribe(id);
//
// Events arrive over one Server-Sent Events connection per page, on the
// page's own journal; routes bring subscribed topics into it.
(function () {
  "use strict";
  if (window.kn && window.kn.publish) return;
  var server = window.kn_server || "/kn";
  var session = Math.random().toString(36).slice(2) + Date.now().toString(36);
  var journal = "/who/" + encodeURIComponent(window.kn_userid || "anonymous") + "/s/" + session + "/kn_journal";
  var handlers = {}, source = null, seq = 0, pending = {};

  function form(params) {
    var parts = [];
    for (var k in params) if (Object.prototype.hasOwnProperty.call(params, k) && params[k] != null) {
      parts.push(encodeURIComponent(k) + "=" + encodeURIComponent(String(params[k])));
    }
    return parts.join("&");
  }

  function request(params, callbacks) {
    callbacks = callbacks || {};
    var statusFrom = journal + "/kn_status/" + (++seq);
    params.kn_status_from = statusFrom;
    params.kn_response_format = "simple";
    return fetch(server, {method: "POST", headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: form(params)})
      .then(function (r) {
        return r.text().then(function (text) {
          var status = parseSimple(text)[0] || {};
          var ok = /^2/.test(status.status || String(r.status));
          (ok ? callbacks.onSuccess : callbacks.onError || function (s) { if (window.console) console.warn("kn:", s.status, s.kn_payload); })(status);
          return status;
        });
      }, function (err) {
        var status = {status: "503 Unreachable", kn_payload: String(err)};
        if (callbacks.onError) callbacks.onError(status);
        return status;
      });
  }

  function unescape(s) {
    return s.replace(/=([0-9A-F]{2})/g, function (_, h) { return String.fromCharCode(parseInt(h, 16)); });
  }

  function parseSimple(text) {
    var events = [], i = 0;
    while (i < text.length) {
      while (i < text.length && /\s/.test(text[i])) i++;
      var nl = text.indexOf("\n", i);
      if (nl < 0) break;
      var count = parseInt(text.slice(i, nl), 10);
      var body = new TextEncoder().encode(text.slice(nl + 1));
      var frame = new TextDecoder().decode(body.slice(0, count));
      i = nl + 1 + frame.length + 1;
      var split = frame.indexOf("\n\n"), e = {};
      var head = split < 0 ? frame : frame.slice(0, split);
      head.split("\n").forEach(function (line) {
        var c = line.indexOf(":");
        if (c > 0) e[unescape(line.slice(0, c))] = unescape(line.slice(c + 1).replace(/^ /, ""));
      });
      e.kn_payload = split < 0 ? "" : frame.slice(split + 2);
      events.push(e);
    }
    return events;
  }

  function connect() {
    if (source || typeof EventSource === "undefined") return;
    source = new EventSource(server + journal + "?do_method=route&kn_response_format=sse&do_max_age=60");
    source.onmessage = function (m) {
      var e;
      try { e = JSON.parse(m.data); } catch (x) { return; }
      var h = handlers[e.kn_route_location];
      if (h) h(e);
    };
  }

  window.kn = {
    server: server,
    journal: journal,
    publish: function (topic, event, callbacks) {
      var params = {};
      for (var k in event) params[k] = event[k];
      params.do_method = "notify";
      params.kn_to = topic;
      return request(params, callbacks);
    },
    subscribe: function (topic, onEvent, options, callbacks) {
      connect();
      var id = "kn" + session + "_" + (++seq);
      var uri = server + journal + "/kn_routes/" + id;
      handlers[uri] = onEvent;
      var params = {do_method: "route", kn_from: topic, kn_to: journal, kn_id: id, kn_uri: uri};
      options = options || {};
      ["do_max_n", "do_max_age", "kn_content_filter", "kn_expires"].forEach(function (k) { if (options[k] != null) params[k] = options[k]; });
      request(params, callbacks);
      return id;
    },
    unsubscribe: function (id, topic, callbacks) {
      var uri = server + journal + "/kn_routes/" + id;
      delete handlers[uri];
      return request({do_method: "route", kn_from: topic, kn_to: "", kn_id: id}, callbacks);
    },
    parseSimple: parseSimple
  };
})();
