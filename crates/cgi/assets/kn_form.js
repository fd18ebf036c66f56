// The kn: form handler: a form whose action is "kn:/some/topic" publishes
// its fields as an event on that topic instead of leaving the page.
function kn__formInit(twoWay) {
  "use strict";
  document.addEventListener("submit", function (ev) {
    var f = ev.target;
    var action = f.getAttribute && f.getAttribute("action");
    if (!action || action.indexOf("kn:") !== 0) return;
    ev.preventDefault();
    var event = {};
    for (var i = 0; i < f.elements.length; i++) {
      var el = f.elements[i];
      if (el.name && !((el.type === "checkbox" || el.type === "radio") && !el.checked)) event[el.name] = el.value;
    }
    window.kn.publish(action.slice(3), event, {
      onSuccess: function (s) { if (twoWay && f.onkn_success) f.onkn_success(s); },
      onError: function (s) { if (twoWay && f.onkn_error) f.onkn_error(s); }
    });
  }, true);
}
