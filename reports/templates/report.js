/* normconf report filters: a progressive enhancement kept in the address (?backend=..&op=..).
   Reads only the DOM; the page is complete without this script. */
(function () {
  "use strict";
  var form = document.getElementById("filters");
  if (!form || !window.URLSearchParams) { return; }
  var keys = ["backend", "op", "dtype", "outcome"];
  var status = document.getElementById("filter-status");
  var targets = document.querySelectorAll("[data-filter]");

  function selected() {
    var s = {};
    keys.forEach(function (k) { s[k] = form.elements[k] ? form.elements[k].value : ""; });
    var option = form.elements.backend && form.elements.backend.selectedOptions[0];
    s.col = s.backend && option ? option.getAttribute("data-col") || "" : "";
    return s;
  }

  function matches(el, s) {
    var d = el.dataset;
    if (s.op && d.op && d.op !== s.op) { return false; }
    if (s.dtype && d.dtype && d.dtype !== s.dtype) { return false; }
    if (s.col && d.col && d.col !== s.col) { return false; }
    if (d.bo !== undefined && (s.col || s.outcome)) {
      return d.bo.split(" ").some(function (token) {
        var pair = token.split("/");
        return (!s.col || pair[0] === s.col) && (!s.outcome || pair[1] === s.outcome);
      });
    }
    return true;
  }

  function apply() {
    var s = selected();
    var shown = 0, rows = 0;
    targets.forEach(function (el) {
      var show = matches(el, s);
      el.hidden = !show;
      if (el.tagName === "TR" && el.closest("table.cases")) { rows += 1; shown += show ? 1 : 0; }
    });
    var params = new URLSearchParams();
    keys.forEach(function (k) { if (s[k]) { params.set(k, s[k]); } });
    var query = params.toString();
    history.replaceState(null, "", (query ? "?" + query : location.pathname) + location.hash);
    if (status) { status.textContent = query ? shown + " of " + rows + " case rows shown" : ""; }
  }

  var initial = new URLSearchParams(location.search);
  keys.forEach(function (k) {
    var value = initial.get(k);
    if (value !== null && form.elements[k]) { form.elements[k].value = value; }
  });
  form.hidden = false;
  form.addEventListener("change", apply);
  form.addEventListener("submit", function (event) { event.preventDefault(); apply(); });
  document.getElementById("reset").addEventListener("click", function (event) {
    event.preventDefault();
    keys.forEach(function (k) { if (form.elements[k]) { form.elements[k].value = ""; } });
    apply();
  });
  apply();
})();
