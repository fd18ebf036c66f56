// Topic browser: the tree is read from each topic's kn_subtopics (one
// subscription per expanded node, so new topics appear live); the chosen
// topic's events (last 20, then live) and its routes (T/kn_routes: payload
// = destination, an empty payload = a deleted route), and who is connected
// (a tunnel on T/kn_presence: a join, then a leave, per subscriber journal;
// docs/PRESENCE.md).
(function () {
  "use strict";
  var nodes = {};            // path -> {li, ul, expanded, sub}
  var current = {path: null, events: null, routes: null, presence: null};
  var eventsBox = document.getElementById("events");
  var routesBox = document.getElementById("routes");
  var noRoutes = document.getElementById("noroutes");
  var presenceBox = document.getElementById("presence");
  var noPresence = document.getElementById("nopresence");
  var el = knPage.el;

  knPage.showConnection();

  function child(path, name) { return (path === "/" ? "" : path) + "/" + name; }
  function hidden(name) { return name === "kn_routes" || name === "kn_subtopics" || name === "kn_presence" || name === ""; }

  function makeNode(path, name, parentUl) {
    var li = el("li", {"data-topic": path});
    var toggle = el("span", {"class": "toggle"}, "\u25B8");
    var label = el("span", {"class": "node"}, name);
    var ul = el("ul");
    li.appendChild(toggle);
    li.appendChild(label);
    li.appendChild(ul);
    var node = nodes[path] = {li: li, ul: ul, toggle: toggle, expanded: false, sub: null};
    toggle.addEventListener("click", function () { setExpanded(path, !node.expanded); });
    label.addEventListener("click", function () { select(path); });
    insertSorted(parentUl, li, name);
    return node;
  }

  function insertSorted(ul, li, name) {
    var after = null;
    for (var i = 0; i < ul.children.length; i++) {
      var other = ul.children[i].querySelector(".node").textContent;
      if (other > name) { after = ul.children[i]; break; }
    }
    ul.insertBefore(li, after);
  }

  function setExpanded(path, expanded) {
    var node = nodes[path];
    if (node.expanded === expanded) return;
    node.expanded = expanded;
    node.toggle.textContent = expanded ? "\u25BE" : "\u25B8";
    node.ul.style.display = expanded ? "" : "none";
    if (expanded && !node.sub) {
      node.sub = kn.subscribe(child(path, "kn_subtopics"), function (e) {
        var name = e.kn_payload;
        if (hidden(name) || nodes[child(path, name)]) return;
        makeNode(child(path, name), name, node.ul);
      }, {do_max_age: "infinity"});
    }
  }

  function showEvent(e) {
    var first = eventsBox.querySelector("p.muted");
    if (first) first.remove();
    var div = el("div", {"class": "event", "data-id": e.kn_id || ""});
    div.appendChild(el("div", {"class": "payload"}, e.kn_payload));
    var names = Object.keys(e).filter(function (k) { return k !== "kn_payload" && k.indexOf("kn_route") !== 0; }).sort();
    div.appendChild(el("div", {"class": "elements mono"}, names.map(function (k) { return k + ": " + e[k]; }).join("  \u00B7  ")));
    eventsBox.insertBefore(div, eventsBox.firstChild);
    while (eventsBox.children.length > 200) eventsBox.lastChild.remove();
  }

  // A push route (docs/PROTOCOL.md, "Web Push (extension)") shows its
  // push service rather than the subscription's keys.
  function destination(d) {
    if (d.indexOf("webpush:") !== 0) return d;
    try {
      var json = JSON.parse(atob(d.slice(8).replace(/-/g, "+").replace(/_/g, "/")));
      return "web push via " + new URL(json.endpoint).host;
    } catch (x) { return "web push"; }
  }

  function showRoute(e) {
    var id = e.kn_id || "";
    var li = routesBox.querySelector('li[data-id="' + CSS.escape(id) + '"]');
    if (!e.kn_payload) { if (li) li.remove(); }
    else {
      if (!li) { li = el("li", {"data-id": id}); routesBox.appendChild(li); }
      var extra = ["kn_content_filter", "do_max_n", "do_max_age", "kn_expires"].filter(function (k) { return e[k]; })
        .map(function (k) { return k + "=" + e[k]; }).join(" ");
      li.textContent = "\u2192 " + destination(e.kn_payload) + (extra ? "  (" + extra + ")" : "");
      li.title = "route id " + id;
    }
    noRoutes.style.display = routesBox.children.length ? "none" : "";
  }

  // One presence event: a join adds (or updates) the journal's line, a
  // leave removes it. Other events (the tunnel's status) are not presence.
  function showPresence(e) {
    if (!e.kn_presence || !e.kn_presence_journal) return;
    var journal = e.kn_presence_journal;
    var li = presenceBox.querySelector('li[data-journal="' + CSS.escape(journal) + '"]');
    if (e.kn_presence === "leave") { if (li) li.remove(); }
    else {
      if (!li) { li = el("li", {"data-journal": journal}); presenceBox.appendChild(li); }
      var who = e.kn_route_creator || (e.kn_route_session ? "anonymous" : "");
      var since = e.kn_presence_since ? new Date(Number(e.kn_presence_since) * 1000).toLocaleTimeString() : "";
      li.textContent = journal + (who ? "  ·  " + who : "") + (since ? "  ·  since " + since : "");
      li.title = "route id " + (e.kn_presence_route || "");
    }
    noPresence.style.display = presenceBox.children.length ? "none" : "";
  }

  // A tunnel on the topic's kn_presence of its own (not a route into the
  // page's journal): a tunnel is what keeps the joins and leaves coming.
  function watchPresence(path) {
    if (current.presence) current.presence.close();
    presenceBox.innerHTML = "";
    noPresence.style.display = "";
    if (typeof EventSource === "undefined") return;
    var server = window.kn_server || "/kn";
    var source = new EventSource(server + child(path, "kn_presence") +
      "?do_method=route&kn_response_format=sse&do_max_age=infinity");
    source.onmessage = function (m) {
      var e;
      try { e = JSON.parse(m.data); } catch (x) { return; }
      showPresence(e);
    };
    // EventSource reconnects by itself with Last-Event-ID: the server
    // resumes after it, with every join and leave since (docs/PRESENCE.md).
    current.presence = source;
  }

  function select(path) {
    if (current.path === path) return;
    if (current.events) kn.unsubscribe(current.events);
    if (current.routes) kn.unsubscribe(current.routes);
    if (current.path && nodes[current.path]) nodes[current.path].li.classList.remove("selected");
    current.path = path;
    if (nodes[path]) nodes[path].li.classList.add("selected");
    document.getElementById("selected").textContent = path;
    eventsBox.innerHTML = '<p class="muted">No events yet.</p>';
    routesBox.innerHTML = "";
    noRoutes.style.display = "";
    history.replaceState(null, "", "?topic=" + encodeURIComponent(path));
    current.events = kn.subscribe(path, showEvent, {do_max_n: 20}, {
      onError: function (s) { eventsBox.innerHTML = ""; eventsBox.appendChild(el("p", {"class": "error"}, s.status + ": " + s.kn_payload)); }
    });
    current.routes = kn.subscribe(child(path, "kn_routes"), showRoute, {do_max_age: "infinity"});
    watchPresence(path);
  }

  document.getElementById("post").addEventListener("submit", function (ev) {
    ev.preventDefault();
    var input = document.getElementById("payload");
    kn.publish(current.path || "/", {kn_payload: input.value});
    input.value = "";
  });

  var rootUl = el("ul");
  document.getElementById("tree").appendChild(rootUl);
  makeNode("/", "/", rootUl);
  setExpanded("/", true);
  var start = knPage.param("topic", "/");
  select(start);
})();
