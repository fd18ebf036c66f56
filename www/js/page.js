// Shared by the pages: the connection indicator and small DOM helpers.
(function () {
  "use strict";
  window.knPage = {
    // Shows kn's connection state in the header's .conn element.
    showConnection: function (onGap) {
      var el = document.querySelector("header .conn");
      kn.onConnection = function (state, detail) {
        if (el) {
          el.className = "conn " + state;
          el.textContent = state === "gap" ? "events may have been missed" : state;
          el.title = detail || "";
          el.dataset.state = state;
        }
        if (state === "gap" && onGap) onGap(detail);
      };
    },
    el: function (tag, attrs, text) {
      var e = document.createElement(tag);
      Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
      if (text !== undefined) e.textContent = text;
      return e;
    },
    param: function (name, fallback) {
      var v = new URLSearchParams(location.search).get(name);
      return v === null || v === "" ? fallback : v;
    }
  };
})();
