// The worklog console's only script: the time slider and the live tail. Every page reads
// without it. It builds the DOM with textContent only: no string from the queue is ever
// parsed as HTML here.
"use strict";
(function () {
  // Time slider: moving it shows the seq; letting go goes there.
  var slider = document.getElementById("seq-slider");
  if (slider) {
    var out = document.getElementById("seq-out");
    slider.addEventListener("input", function () { if (out) out.textContent = "seq " + slider.value; });
    slider.addEventListener("change", function () { slider.form.submit(); });
  }
  // Keyboard steps: [ and ] follow the previous and next event links.
  document.addEventListener("keydown", function (e) {
    if (e.target && (e.target.tagName === "INPUT" || e.target.tagName === "SELECT")) return;
    var id = e.key === "[" ? "step-prev" : e.key === "]" ? "step-next" : null;
    var a = id && document.getElementById(id);
    if (a && a.getAttribute("href")) location.href = a.getAttribute("href");
  });
  // Bulk actions and policy changes ask first.
  Array.prototype.forEach.call(document.querySelectorAll("form[data-confirm]"), function (f) {
    f.addEventListener("submit", function (e) {
      if (!window.confirm(f.getAttribute("data-confirm"))) e.preventDefault();
    });
  });
  // Live tail: Server-Sent Events, one JSON row per event.
  var live = document.getElementById("live");
  var body = document.getElementById("log-rows");
  if (live && body && window.EventSource) {
    var src = new EventSource(live.getAttribute("data-stream"));
    src.onmessage = function (m) {
      var r = JSON.parse(m.data);
      var tr = document.createElement("tr");
      tr.className = "new";
      [String(r.seq), r.at, r.session, r.event, r.subject, r.details].forEach(function (v) {
        var td = document.createElement("td");
        td.textContent = v;
        tr.appendChild(td);
      });
      body.insertBefore(tr, body.firstChild); // newest first, as the page
      live.textContent = "Live: last event seq " + r.seq;
    };
    src.onerror = function () { live.textContent = "Live tail disconnected; reload to resume."; };
  }
})();
