
// The kn: form handler (do_method=libform: one-way; lib2form: two-way).
//
// A form whose action is "kn:/some/topic" publishes its named fields as one
// event on that topic (through kn.publish, so retries keep the kn_id)
// instead of leaving the page:
//
//   <form action="kn:/what/chat"><input name="kn_payload"><button>Say</button></form>
//
// One-way (libform): the form is published and reset.
// Two-way (lib2form): the form is also told how it went: it receives a
// "kn-success" or "kn-error" DOM event (detail = the status event), its
// onkn_success / onkn_error properties or attributes are called with the
// status, and an element inside it with a data-kn-status attribute shows
// the status line. The form is reset on success only.
function kn__formInit(twoWay) {
  "use strict";
  if (window.kn__formInstalled) return;
  window.kn__formInstalled = true;

  function fields(f) {
    var event = {};
    for (var i = 0; i < f.elements.length; i++) {
      var el = f.elements[i];
      if (!el.name || el.disabled) continue;
      if ((el.type === "checkbox" || el.type === "radio") && !el.checked) continue;
      if (el.type === "submit" || el.type === "button" || el.type === "reset" || el.type === "file") continue;
      event[el.name] = el.value;
    }
    return event;
  }

  function tell(f, kind, status) {
    if (!twoWay) return;
    var shown = f.querySelector("[data-kn-status]");
    if (shown) shown.textContent = status.status + (kind === "error" && status.kn_payload ? ": " + status.kn_payload : "");
    var handler = f["onkn_" + kind] || (f.getAttribute("onkn_" + kind) && new Function("status", f.getAttribute("onkn_" + kind)));
    if (typeof handler === "function") handler.call(f, status);
    if (typeof CustomEvent === "function") f.dispatchEvent(new CustomEvent("kn-" + kind, {detail: status, bubbles: true}));
  }

  document.addEventListener("submit", function (ev) {
    var f = ev.target;
    var action = f && f.getAttribute && f.getAttribute("action");
    if (!action || action.indexOf("kn:") !== 0) return;
    ev.preventDefault();
    var event = fields(f);
    if (!twoWay) f.reset();
    window.kn.publish(action.slice(3), event, {
      onSuccess: function (s) { if (twoWay) f.reset(); tell(f, "success", s); },
      onError: function (s) { tell(f, "error", s); }
    });
  }, true);
}
