// knpubsub's service worker for Web Push (docs/BROWSER.md, "Push to a
// closed page"): kn.pushSubscribe registers it. Each push message is one
// event of the routed topic as a JSON object of its elements (or, for an
// event over the 4 KiB a push may carry, its kn_id, kn_routed_from and
// kn_push_truncated: "1", for the page to fetch the rest). It shows a
// notification and hands the event to the open pages of the site, which
// get it as a "message" on navigator.serviceWorker ({kn_push: event}).
// Copy it beside your pages and change what it shows as you like.

self.addEventListener("push", function (e) {
  var event = {};
  if (e.data) {
    try { event = e.data.json(); } catch (x) { event = {kn_payload: e.data.text()}; }
  }
  var title = event.kn_routed_from || "knpubsub";
  var body = event.kn_push_truncated ? "New event " + (event.kn_id || "") : (event.kn_payload || "");
  e.waitUntil(self.clients.matchAll({type: "window", includeUncontrolled: true}).then(function (pages) {
    pages.forEach(function (page) { page.postMessage({kn_push: event}); });
    return self.registration.showNotification(title, {body: body, tag: event.kn_id || "", data: event});
  }));
});

self.addEventListener("notificationclick", function (e) {
  e.notification.close();
  e.waitUntil(self.clients.matchAll({type: "window"}).then(function (pages) {
    return pages.length ? pages[0].focus() : self.clients.openWindow(self.registration.scope);
  }));
});
