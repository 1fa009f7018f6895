/* benchsuite dashboard: draw the figures embedded in this page (built in Python) and show the runs
   table (rows from assets/runs.js) sorted, filtered and paged. No network, no figure logic here;
   record strings reach the page as text (textContent, setAttribute), never as markup. */
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

  /* The runs table: rows come from a data file (window[table.dataset.rows]), each
     [page, status, model, note, cells] with cells [text] or [text, sort number], all formatted
     in Python. Sorting and filtering run over every row; one page of them is in the DOM. */
  function RunsTable(table, rows) {
    var heads = Array.prototype.slice.call(table.tHead.rows[0].cells);
    var pageSize = parseInt(table.getAttribute("data-page-size"), 10) || 100;
    var shown = rows.slice(), page = 0;
    var bar = document.querySelector('.filters[data-for="' + table.id + '"]');
    var pager = document.querySelector('.pager[data-pager-for="' + table.id + '"]');
    var search = rows.map(function (r) {
      return (r[4].map(function (c) { return c[0]; }).join(" ") + " " + r[3]).toLowerCase();
    });
    rows.forEach(function (r, i) { r.search = search[i]; });

    function span(cls, text, title) {
      var s = document.createElement("span");
      s.className = cls;
      s.textContent = text;
      if (title) s.setAttribute("title", title);
      return s;
    }

    function cell(row, col) {
      var td = document.createElement("td"), c = row[4][col], how = heads[col].getAttribute("data-render");
      if (c.length > 1) td.setAttribute("data-v", String(c[1]));
      if (how === "link") {
        var a = document.createElement("a");
        a.setAttribute("href", row[0]);
        a.textContent = c[0];
        td.appendChild(a);
      } else if (how === "status" && row[1] === "ok") {
        td.appendChild(span("ok", "ok"));
        if (row[3]) {
          td.className = "status-flagged";
          td.appendChild(document.createTextNode(" "));
          td.appendChild(span("warn", "⚠ flagged", row[3]));
          td.appendChild(span("flag-note", row[3], row[3]));  // why, in the cell as a failed run's error is
        }
      } else if (how === "status") {
        td.className = "status-failed";
        td.appendChild(span("bad", "failed"));
        td.appendChild(document.createTextNode(" "));
        td.appendChild(span("err", row[3], row[3]));
      } else {
        td.textContent = c[0];
      }
      if (heads[col].classList.contains("wide")) td.classList.add("wide");  // left out in a narrow window
      if (how !== "status" && heads[col].getAttribute("data-type") === "text") td.classList.add("text");
      return td;
    }

    function draw() {
      var pages = Math.max(1, Math.ceil(shown.length / pageSize));
      page = Math.min(page, pages - 1);
      var body = document.createElement("tbody");
      shown.slice(page * pageSize, (page + 1) * pageSize).forEach(function (row) {
        var tr = document.createElement("tr");
        if (row[1] !== "ok") tr.className = "failed";
        tr.setAttribute("data-status", row[1]);
        tr.setAttribute("data-kind", row[2]);
        for (var col = 0; col < heads.length; col++) tr.appendChild(cell(row, col));
        body.appendChild(tr);
      });
      table.replaceChild(body, table.tBodies[0]);
      if (bar) bar.querySelector("[data-count]").textContent = shown.length + " of " + rows.length + " records";
      if (pager) {
        pager.querySelector("[data-page-info]").textContent = "page " + (page + 1) + " of " + pages;
        pager.querySelector('[data-page="prev"]').disabled = page === 0;
        pager.querySelector('[data-page="next"]').disabled = page >= pages - 1;
        pager.hidden = pages < 2;
      }
    }

    function sortKey(row, col, numeric) {
      var c = row[4][col];
      if (!numeric) return c[0].toLowerCase();
      return c.length > 1 ? c[1] : null;
    }

    heads.forEach(function (th, col) {
      function sort() {
        var asc = th.getAttribute("aria-sort") !== "ascending";
        heads.forEach(function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", asc ? "ascending" : "descending");
        var numeric = th.getAttribute("data-type") === "num";
        var cmp = function (a, b) {
          var x = sortKey(a, col, numeric), y = sortKey(b, col, numeric);
          if (x === null || y === null) return (x === null) - (y === null);  // missing last
          return (x < y ? -1 : x > y ? 1 : 0) * (asc ? 1 : -1);
        };
        rows.sort(cmp);
        shown.sort(cmp);
        page = 0;
        draw();
      }
      th.addEventListener("click", sort);
      th.addEventListener("keydown", function (e) { if (e.key === "Enter") sort(); });
    });

    if (bar) {
      var text = bar.querySelector("[data-filter-text]");
      var selects = Array.prototype.slice.call(bar.querySelectorAll("select[data-filter]"));
      var apply = function () {
        var q = (text.value || "").trim().toLowerCase();
        var want = selects.map(function (s) { return [s.getAttribute("data-filter"), s.value]; });
        shown = rows.filter(function (r) {
          if (q && r.search.indexOf(q) === -1) return false;
          return want.every(function (w) { return !w[1] || (w[0] === "status" ? r[1] : r[2]) === w[1]; });
        });
        page = 0;
        draw();
      };
      text.addEventListener("input", apply);
      selects.forEach(function (s) { s.addEventListener("change", apply); });
    }
    if (pager) {
      pager.querySelector('[data-page="prev"]').addEventListener("click", function () { page -= 1; draw(); });
      pager.querySelector('[data-page="next"]').addEventListener("click", function () { page += 1; draw(); });
    }
    draw();
  }

  document.querySelectorAll("table[data-rows]").forEach(function (t) {
    RunsTable(t, window[t.getAttribute("data-rows")] || []);
  });
  drawFigures();
})();
