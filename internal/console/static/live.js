// Live updates: every few seconds, re-fetch this page and replace its
// #live part. Without JavaScript the page is the same, reloaded by hand.
(function () {
  "use strict";
  var main = document.querySelector("main[data-live]");
  var live = document.getElementById("live");
  if (!main || !live || !window.fetch || !window.DOMParser) { return; }
  var every = (parseInt(main.getAttribute("data-live"), 10) || 5) * 1000;
  function refresh() {
    fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html === null) { return; }
        var next = new DOMParser().parseFromString(html, "text/html").getElementById("live");
        var cur = document.getElementById("live");
        if (next && cur) { cur.replaceWith(document.importNode(next, true)); }
      })
      .catch(function () {})
      .then(function () { window.setTimeout(refresh, every); });
  }
  window.setTimeout(refresh, every);
})();
