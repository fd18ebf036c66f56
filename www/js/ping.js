// Ping, after the original's ping application: round-trip latency (one
// event at a time, publish → back over the page's SSE connection) and
// event throughput (batches of events, several requests in flight). The
// figures land in #p50, #p99, #avg, #rate and in window.kn_ping_results;
// #state gets data-done="true" when a run ends. ?auto=1 runs on load;
// ?n= and ?m= set the counts.
(function () {
  "use strict";
  var topic = "/what/ping/" + kn.freshId();
  var expires = String(Math.floor(Date.now() / 1000) + 3600);
  var waiting = {};          // seq -> resolve
  var received = 0, onReceived = null;
  var answered = [];         // ms until each publish's own reply (the POST alone)
  var state = document.getElementById("state");
  var runButton = document.getElementById("run");
  document.getElementById("n").value = knPage.param("n", "200");
  document.getElementById("m").value = knPage.param("m", "1000");

  knPage.showConnection();

  function say(text, done) {
    state.textContent = text;
    state.dataset.done = done ? "true" : "false";
  }

  function arrived(e) {
    received++;
    var resolve = waiting[e.seq];
    if (resolve) { delete waiting[e.seq]; resolve(performance.now()); }
    if (onReceived) onReceived();
  }

  function once(seq) {
    return new Promise(function (resolve) {
      var t0 = performance.now();
      var timer = setTimeout(function () { delete waiting[seq]; resolve(null); }, 10000);
      waiting[seq] = function (t1) { clearTimeout(timer); resolve(t1 - t0); };
      kn.publish(topic, {kn_payload: "ping " + seq, seq: seq, kn_expires: expires}).then(function () {
        answered.push(performance.now() - t0);
      });
    });
  }

  function percentile(sorted, p) {
    if (!sorted.length) return NaN;
    var i = Math.min(sorted.length - 1, Math.max(0, Math.ceil(p / 100 * sorted.length) - 1));
    return sorted[i];
  }

  function fmt(x) { return isNaN(x) ? "–" : x < 10 ? x.toFixed(2) : x < 100 ? x.toFixed(1) : x.toFixed(0); }

  function latency(n) {
    var times = [], lost = 0, seq = 0;
    function next(i) {
      if (i >= n) return Promise.resolve();
      return once("rt" + (++seq)).then(function (ms) {
        if (ms === null) lost++; else if (i >= 0) times.push(ms);
        if (i >= 0 && i % 10 === 0) say("round trip " + (i + 1) + " of " + n + "…");
        return next(i + 1);
      });
    }
    // Five warm-up pings (negative i) are not counted.
    return next(-5).then(function () { return {times: times, lost: lost}; });
  }

  function throughput(m) {
    if (m <= 0) return Promise.resolve({rate: NaN, seconds: 0});
    var batch = 25, inFlight = 4, sent = 0, start = performance.now(), target = received + m;
    return new Promise(function (resolve) {
      var timer = setTimeout(finish, 60000);
      function finish() {
        clearTimeout(timer);
        onReceived = null;
        var got = m - (target - received), secs = (performance.now() - start) / 1000;
        resolve({rate: got / secs, seconds: secs, received: got});
      }
      onReceived = function () {
        if (received >= target) finish();
        else if (received % 100 === 0) say("throughput: " + (m - (target - received)) + " of " + m + " events back…");
      };
      function send() {
        if (sent >= m) return;
        var events = [];
        for (var i = 0; i < batch && sent < m; i++, sent++) {
          events.push({kn_payload: "burst " + sent, seq: "tp" + sent, kn_expires: expires});
        }
        kn.publishMany(topic, events).then(send);
      }
      for (var k = 0; k < inFlight; k++) send();
    });
  }

  function draw(times) {
    var canvas = document.getElementById("histogram"), g = canvas.getContext("2d");
    g.clearRect(0, 0, canvas.width, canvas.height);
    if (!times.length) return;
    var sorted = times.slice().sort(function (a, b) { return a - b; });
    var top = percentile(sorted, 99) * 1.2 || 1, bins = 50, counts = new Array(bins).fill(0);
    times.forEach(function (t) { counts[Math.min(bins - 1, Math.floor(t / top * bins))]++; });
    var max = Math.max.apply(null, counts), w = canvas.width / bins;
    g.fillStyle = "#1f6feb";
    counts.forEach(function (c, i) {
      var h = (canvas.height - 20) * c / max;
      g.fillRect(i * w + 1, canvas.height - 16 - h, w - 2, h);
    });
    g.fillStyle = "#667085";
    g.font = "12px sans-serif";
    g.fillText("0 ms", 2, canvas.height - 2);
    g.fillText(fmt(top) + " ms", canvas.width - 60, canvas.height - 2);
  }

  function run(ev) {
    if (ev) ev.preventDefault();
    var n = parseInt(document.getElementById("n").value, 10) || 200;
    var m = parseInt(document.getElementById("m").value, 10) || 0;
    runButton.disabled = true;
    say("running…");
    var result = {};
    latency(n).then(function (lat) {
      var sorted = lat.times.slice().sort(function (a, b) { return a - b; });
      result.n = sorted.length;
      result.lost = lat.lost;
      result.p50 = percentile(sorted, 50);
      result.p99 = percentile(sorted, 99);
      result.min = sorted[0];
      result.max = sorted[sorted.length - 1];
      result.avg = sorted.reduce(function (a, b) { return a + b; }, 0) / (sorted.length || 1);
      var posts = answered.slice(5).sort(function (a, b) { return a - b; });
      result.post_p50 = percentile(posts, 50);
      document.getElementById("p50").textContent = fmt(result.p50);
      document.getElementById("p99").textContent = fmt(result.p99);
      document.getElementById("avg").textContent = fmt(result.avg);
      draw(lat.times);
      return throughput(m);
    }).then(function (tp) {
      result.rate = tp.rate;
      result.events = m;
      result.seconds = tp.seconds;
      document.getElementById("rate").textContent = isNaN(tp.rate) ? "–" : Math.round(tp.rate);
      document.getElementById("detail").textContent =
        result.n + " round trips (" + result.lost + " lost): min " + fmt(result.min) + ", p50 " + fmt(result.p50) +
        ", p99 " + fmt(result.p99) + ", max " + fmt(result.max) + " ms (the POST alone: p50 " +
        fmt(result.post_p50) + " ms); " + m + " events in " +
        (tp.seconds || 0).toFixed(2) + " s; " + navigator.userAgent;
      window.kn_ping_results = result;
      runButton.disabled = false;
      say("done", true);
    });
  }

  document.getElementById("controls").addEventListener("submit", run);
  kn.subscribe(topic, arrived, {}, {
    onSuccess: function () {
      runButton.disabled = false;
      say("ready");
      if (knPage.param("auto", "") === "1") run();
    },
    onError: function (s) { say("could not subscribe: " + s.status + " " + s.kn_payload); }
  });
})();
