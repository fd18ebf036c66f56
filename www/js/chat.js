// Chat: every message is an event on the topic (kn_payload = the text,
// nick = who said it). The last 50 are shown on arrival; a message whose
// kn_id comes again replaces the one shown (ordinary-topic semantics).
(function () {
  "use strict";
  var topic = knPage.param("topic", "/what/chat");
  var log = document.getElementById("log");
  var nick = document.getElementById("nick");
  var text = document.getElementById("text");
  var shown = {};
  document.getElementById("topic").textContent = topic;
  nick.value = localStorage.getItem("kn_chat_nick") ||
    (kn.displayname !== "Anonymous User" ? kn.displayname : "guest-" + Math.floor(Math.random() * 9000 + 1000));

  function note(message) {
    log.appendChild(knPage.el("li", {"class": "note"}, message));
    log.scrollTop = log.scrollHeight;
  }

  knPage.showConnection(function (detail) { note("Events may have been missed: " + detail); });

  // Every delivery, in order, for tests that prove none is lost or
  // repeated (the page itself would hide a repeat by kn_id).
  window.kn_chat_deliveries = [];

  function show(e) {
    window.kn_chat_deliveries.push(e.kn_id);
    var li = shown[e.kn_id];
    if (!li) {
      li = knPage.el("li", {"class": "msg", "data-id": e.kn_id});
      shown[e.kn_id] = li;
      log.appendChild(li);
    }
    li.textContent = "";
    var t = new Date(1000 * parseFloat(e.kn_time_t || Date.now() / 1000));
    li.appendChild(knPage.el("span", {"class": "time"}, t.toLocaleTimeString()));
    li.appendChild(knPage.el("span", {"class": "nick"}, e.nick || "anonymous"));
    li.appendChild(knPage.el("span", {"class": "text"}, e.kn_payload));
    log.scrollTop = log.scrollHeight;
  }

  kn.subscribe(topic, show, {do_max_n: 50}, {
    onError: function (s) { note("Could not subscribe: " + s.status + " " + s.kn_payload); }
  });

  document.getElementById("say").addEventListener("submit", function (ev) {
    ev.preventDefault();
    var words = text.value;
    if (!words.trim()) return;
    localStorage.setItem("kn_chat_nick", nick.value);
    text.value = "";
    kn.publish(topic, {kn_payload: words, nick: nick.value || "anonymous"}, {
      onError: function (s) { note("Not sent (" + s.status + "): " + words); }
    });
  });
})();
