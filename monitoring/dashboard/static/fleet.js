// The fleet page: sorting, filtering and a refresh from /api/fleet.json that keeps both.
// Rows are built with DOM calls (textContent): nothing from the server becomes markup.
"use strict";
(function () {
  const table = document.getElementById("fleet");
  const body = table.tBodies[0];
  const RANK = { critical: 0, paused: 1, warn: 2, ok: 3, unknown: 4 };
  let rows = null;  // the last data from the API (null: the server-rendered rows)
  let sortKey = null, sortType = null, sortDesc = false;
  // The server renders the worst rows first, a screenful; the rest are built from the data.
  const total = Number(table.dataset.total) || 0;

  function num(v) { return v === null || v === undefined ? "—" : v.toLocaleString("en-US"); }
  function secs(v) { return v === null || v === undefined ? "—" : v.toFixed(1) + " s"; }
  function age(v) { return v === null || v === undefined ? "—" : Math.round(v) + " s"; }
  function cell(tr, text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    tr.appendChild(td);
    return td;
  }

  function render(list) {
    const fragment = document.createDocumentFragment();
    for (const row of list) {
      const tr = document.createElement("tr");
      tr.dataset.table = row.table; tr.dataset.namespace = row.namespace; tr.dataset.verdict = row.verdict; tr.dataset.policy = row.policy;
      cell(tr, row.verdict, "v-" + row.verdict);
      const name = document.createElement("td");
      const link = document.createElement("a");
      link.href = "table/" + encodeURIComponent(row.table).replace(/%2E/g, ".");
      link.textContent = row.table;
      name.appendChild(link); tr.appendChild(name);
      cell(tr, num(row.lag_records), "n").dataset.value = row.lag_records ?? "";
      cell(tr, secs(row.lag_seconds), "n");
      cell(tr, secs(row.lag_seconds_p95), "n");
      cell(tr, age(row.last_commit_age_seconds), "n");
      cell(tr, row.commit_seconds_p95 === null ? "—" : row.commit_seconds_p95.toFixed(2) + " s", "n");
      cell(tr, num(row.data_files), "n").dataset.value = row.data_files ?? "";
      cell(tr, num(row.small_files), "n").dataset.value = row.small_files ?? "";
      cell(tr, num(row.pending_bytes), "n").dataset.value = row.pending_bytes ?? "";
      cell(tr, age(row.last_compaction_age_seconds), "n");
      cell(tr, age(row.last_maintenance_age_seconds), "n");
      const next = row.next_action;
      cell(tr, next ? next.action + ": " + (next.why || "") : "—");
      const reasons = cell(tr, "", "reasons");
      for (const r of row.reasons) {
        const line = document.createElement("div");
        line.textContent = r.reason;
        if (r.runbook) {
          const a = document.createElement("a");
          a.className = "runbook"; a.href = "runbooks/" + r.runbook; a.textContent = "runbook";
          line.append(" ", a);
        }
        reasons.appendChild(line);
      }
      fragment.appendChild(tr);
    }
    body.replaceChildren(fragment);
  }

  function value(row, key) {
    if (key === "next_action") return row.next_action ? row.next_action.action : "";
    return row[key];
  }

  function rowsNow() {
    if (rows !== null) return rows.slice();
    return null;
  }

  function apply() {
    const text = document.getElementById("filter-text").value.trim().toLowerCase();
    const ns = document.getElementById("filter-namespace").value;
    const verdict = document.getElementById("filter-verdict").value;
    const policy = document.getElementById("filter-policy").value;
    let list = rowsNow();
    if (list !== null) {
      if (sortKey !== null) {
        list.sort(function (a, b) {
          let x = value(a, sortKey), y = value(b, sortKey);
          if (sortType === "verdict") { x = RANK[x]; y = RANK[y]; }
          if (x === null || x === undefined) return 1;
          if (y === null || y === undefined) return -1;
          const order = typeof x === "number" ? x - y : String(x).localeCompare(String(y));
          return sortDesc ? -order : order;
        });
      }
      render(list);
    }
    let shown = 0;
    for (const tr of body.rows) {
      const visible = (!text || tr.dataset.table.toLowerCase().includes(text)) &&
        (!ns || tr.dataset.namespace === ns) && (!verdict || tr.dataset.verdict === verdict) &&
        (!policy || tr.dataset.policy === policy);
      tr.hidden = !visible;
      if (visible) shown += 1;
    }
    const loading = rows === null && body.rows.length < total;
    document.getElementById("shown").textContent = shown + " of " + (loading ? total : body.rows.length) + " shown" +
      (loading ? " (the rest loading)" : "");
  }

  function summary(page) {
    const s = page.summary;
    document.getElementById("sum-tables").textContent = s.tables;
    for (const v of ["critical", "paused", "warn", "ok"]) {
      document.getElementById("sum-" + v).textContent = s.by_verdict[v] || 0;
    }
    document.getElementById("sum-actions").textContent = s.actions_last_minute || 0;
    document.getElementById("sum-running").textContent = s.running || 0;
    document.getElementById("sum-failures").textContent = s.failures_last_hour || 0;
    const collecting = document.getElementById("collecting");
    if (collecting && !page.collecting) collecting.remove();
    const select = document.getElementById("filter-namespace");
    const known = new Set(Array.from(select.options).map(function (o) { return o.value; }));
    for (const ns of new Set(page.rows.map(function (r) { return r.namespace; }))) {
      if (!known.has(ns)) { const o = document.createElement("option"); o.textContent = ns; select.appendChild(o); }
    }
    if (page.refreshed_at) {
      document.getElementById("refreshed").textContent =
        "facts collected " + new Date(page.refreshed_at * 1000).toLocaleTimeString();
    }
  }

  async function refresh() {
    const started = performance.now();
    try {
      const response = await fetch("api/fleet.json", { credentials: "same-origin", cache: "no-store" });
      if (!response.ok) return;
      const page = await response.json();
      rows = page.rows;
      summary(page);
      apply();
      document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
      // When every row was first on the page, from navigation start: read by bench/dashboard.py.
      if (!document.body.dataset.completeMs) document.body.dataset.completeMs = performance.now().toFixed(1);
      // What one refresh took (fetch, parse, rows built): read by bench/dashboard.py.
      document.body.dataset.lastRefreshMs = (performance.now() - started).toFixed(1);
    } catch (e) {
      document.getElementById("refreshed").textContent = "not refreshed: the service did not answer";
    }
  }

  for (const th of table.tHead.rows[0].cells) {
    if (!th.dataset.key) continue;
    th.classList.add("sortable");
    th.addEventListener("click", function () {
      if (sortKey === th.dataset.key) { sortDesc = !sortDesc; } else { sortKey = th.dataset.key; sortDesc = false; }
      sortType = th.dataset.type || "text";
      for (const other of table.tHead.rows[0].cells) other.removeAttribute("aria-sort");
      th.setAttribute("aria-sort", sortDesc ? "descending" : "ascending");
      if (rows === null) { refresh(); } else { apply(); }
    });
  }
  for (const id of ["filter-text", "filter-namespace", "filter-verdict", "filter-policy"]) {
    document.getElementById(id).addEventListener("input", apply);
    document.getElementById(id).addEventListener("change", apply);
  }
  apply();
  if (body.rows.length < total) {
    refresh();  // the rows past the first screenful, at once
  } else {
    // every row was rendered by the server (the model's latest): the first refresh waits its turn
    document.body.dataset.completeMs = performance.now().toFixed(1);
  }
  setInterval(refresh, Number(table.dataset.refreshMs) || 5000);
})();
