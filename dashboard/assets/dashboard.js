/* benchsuite dashboard: draw the figures embedded in this page (built in Python) and make the
   runs table sortable and filterable. No network, no figure logic here. */
(function () {
  "use strict";

  function drawFigures() {
    var holder = document.getElementById("bs-figures");
    if (!holder || typeof Plotly === "undefined") return;
    var specs = JSON.parse(holder.textContent || "{}");
    var template = window.BENCHSUITE_TEMPLATE;
    var config = {displaylogo: false, responsive: true};
    var els = document.querySelectorAll("[data-figure]");
    for (var i = 0; i < els.length; i++) {
      var spec = specs[els[i].id];
      if (!spec) continue;
      var layout = spec.layout || {};
      if (template && !layout.template) layout.template = template;
      Plotly.newPlot(els[i], spec.data, layout, config);
    }
  }

  function sortKey(cell, numeric) {
    if (!numeric) return cell.textContent.trim().toLowerCase();
    var v = cell.getAttribute("data-v");
    return v === null || v === "" ? null : parseFloat(v);
  }

  function makeSortable(table) {
    var heads = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(heads, function (th, col) {
      function sort() {
        var asc = th.getAttribute("aria-sort") !== "ascending";
        Array.prototype.forEach.call(heads, function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", asc ? "ascending" : "descending");
        var numeric = th.getAttribute("data-type") === "num";
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = sortKey(a.cells[col], numeric), y = sortKey(b.cells[col], numeric);
          if (x === null || y === null) return (x === null) - (y === null);  // missing last
          return (x < y ? -1 : x > y ? 1 : 0) * (asc ? 1 : -1);
        });
        rows.forEach(function (r) { body.appendChild(r); });
      }
      th.addEventListener("click", sort);
      th.addEventListener("keydown", function (e) { if (e.key === "Enter") sort(); });
    });
  }

  function makeFilterable(bar) {
    var table = document.getElementById(bar.getAttribute("data-for"));
    if (!table) return;
    var text = bar.querySelector("[data-filter-text]");
    var selects = bar.querySelectorAll("select[data-filter]");
    var count = bar.querySelector("[data-count]");
    function apply() {
      var q = (text.value || "").trim().toLowerCase();
      var rows = table.tBodies[0].rows, shown = 0;
      for (var i = 0; i < rows.length; i++) {
        var ok = !q || rows[i].textContent.toLowerCase().indexOf(q) !== -1;
        for (var j = 0; ok && j < selects.length; j++) {
          var want = selects[j].value;
          ok = !want || rows[i].getAttribute("data-" + selects[j].getAttribute("data-filter")) === want;
        }
        rows[i].hidden = !ok;
        shown += ok ? 1 : 0;
      }
      if (count) count.textContent = shown + " of " + rows.length + " runs";
    }
    text.addEventListener("input", apply);
    Array.prototype.forEach.call(selects, function (s) { s.addEventListener("change", apply); });
  }

  document.querySelectorAll("table.sortable").forEach(makeSortable);
  document.querySelectorAll(".filters[data-for]").forEach(makeFilterable);
  drawFigures();
})();
