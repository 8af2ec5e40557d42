// fedray dashboard: polls /api/version and, when the files changed, updates the table and plots in
// place (keyed table rows, Plotly.react). No framework, no build step; Plotly.js is served locally.
"use strict";

const TOP_N = 10;
const FIXED_COLUMNS_BEFORE = [
  { key: "_mark", label: "", cls: "mark", sortable: false },
  { key: "_select", label: "", cls: "select", sortable: false },
  { key: "trial_id", label: "trial", cls: "text" },
  { key: "status", label: "status", cls: "text" },
];
const FIXED_COLUMNS_AFTER = [
  { key: "metric_name", label: "quantity", cls: "text", onlyIfMixed: true },
  { key: "evaluation", label: "evaluation", cls: "text", onlyIfMixedEvaluation: true },
  { key: "round", label: "round" },
  { key: "latest_metric", label: "latest" },
  { key: "best_metric", label: "best" },
  { key: "best_round", label: "best round" },
  { key: "wall_time_s", label: "wall time" },
  { key: "error", label: "error", cls: "text error-cell", onlyIfErrors: true },
];
const FAILED = new Set(["ERROR", "INTERRUPTED", "STALLED"]);
const NOT_APPLICABLE = "n/a";  // a swept key that does not apply to a trial (another algorithm's hyperparameter)
// how trial labels name the keys (the same symbols as the server's labels)
const SYMBOLS = { "algorithm.tau": "τ", "algorithm.num_neighbors": "M", "algorithm.beta": "β", "algorithm.mu": "μ", "data.alpha": "α" };
const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

const state = {
  version: null,
  overview: null,
  autoSelect: true,          // until the user ticks a box, the curves show the top trials
  selected: new Set(),
  sort: null,                // {key, dir: 1 | -1}
  columnsSignature: null,
  curveMetric: null,
  runTrial: null,            // the trial whose run is shown
  clientRound: null,         // null: follow the latest round
  refreshMs: 2000,
  busy: false,
  lastCurvesKey: null,
  groupBy: null,             // swept keys the curves and the comparison table group by (null: not chosen yet)
};

const $ = (id) => document.getElementById(id);

// ---------------------------------------------------------------------------------------------
// Formatting

function fmt(value) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "number") {
    if (!Number.isFinite(value)) return "–";
    if (Number.isInteger(value)) return String(value);
    const abs = Math.abs(value);
    if (abs !== 0 && (abs < 1e-3 || abs >= 1e5)) return value.toExponential(3);
    return value.toPrecision(4).replace(/(\.\d*?)0+$/, "$1").replace(/\.$/, "");
  }
  return String(value);
}

function fmtSeconds(seconds) {
  if (typeof seconds !== "number" || !Number.isFinite(seconds)) return "–";
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  const h = Math.floor(seconds / 3600), m = Math.floor((seconds % 3600) / 60), s = Math.floor(seconds % 60);
  return h ? `${h}:${String(m).padStart(2, "0")}:${String(s).padStart(2, "0")}` : `${m}:${String(s).padStart(2, "0")}`;
}

function bestOf(trial, overview) {
  // the quantity this trial is the best of, or null (trials are ranked only against the same quantity)
  return overview.best_by_metric[trial.metric_name] === trial.trial_id ? trial.metric_name : null;
}

function cellText(trial, key, overview) {
  if (key === "_mark") return bestOf(trial, overview) ? "★" : "";
  if (key === "wall_time_s") return fmtSeconds(trial[key]);
  if (key === "error") return trial.error || "";  // cut to the column's width by CSS; whole on hover
  return fmt(trial[key]);
}

function fmtMeanStd(stats, metric) {
  // "81.23 ± 1.20" (accuracies in %), as in the tables of papers
  if (!stats || !isNum(stats.mean)) return "–";
  const percent = /accuracy/.test(metric);
  const digits = (v) => (percent ? (100 * v).toFixed(2) : fmt(v));
  return `${digits(stats.mean)} ± ${digits(stats.std)}`;
}

function keyName(key) { return SYMBOLS[key] ? `${key} (${SYMBOLS[key]})` : key; }

// ---------------------------------------------------------------------------------------------
// Data

async function getJSON(url) {
  const response = await fetch(url, { cache: "no-store" });
  const body = await response.json().catch(() => ({ error: `${response.status} ${response.statusText}` }));
  if (!response.ok) throw new Error(body.error || `${response.status} ${response.statusText}`);
  return body;
}

function sign(overview) { return overview.mode === "min" ? -1 : 1; }

function isNum(v) { return typeof v === "number" && Number.isFinite(v); }

function topTrials(overview, n) {
  const s = sign(overview);
  return overview.trials
    .filter((t) => isNum(t.best_metric))
    // the sweep's own quantity first: a linear probe's accuracy is not ranked against supervised ones
    .sort((a, b) => (a.metric_name !== overview.metric) - (b.metric_name !== overview.metric) || s * (b.best_metric - a.best_metric))
    .slice(0, n)
    .map((t) => t.trial_id);
}

// ---------------------------------------------------------------------------------------------
// Header and messages

function renderHeader(ov) {
  $("title").textContent = ov.title || "dashboard";
  document.title = `${ov.title} · fedray dashboard`;
  $("kind").textContent = { sweep: "sweep", run: "run", runs: "folder of runs", empty: "waiting", missing: "not found" }[ov.kind] || ov.kind;
  const status = $("sweep-status");
  status.textContent = ov.status || "";
  status.className = `badge ${ov.status === "stalled" ? "failed" : ov.status || ""}`;
  const counts = {};
  ov.trials.forEach((t) => { counts[t.status] = (counts[t.status] || 0) + 1; });
  const parts = [`${ov.trials.length}${ov.num_trials ? ` / ${ov.num_trials}` : ""} trials`];
  Object.entries(counts).forEach(([k, v]) => parts.push(`${v} ${String(k).toLowerCase()}`));
  parts.push(`metric ${ov.metric} (${ov.mode})`);
  if (ov.started_at) parts.push(`started ${ov.started_at}`);
  $("summary").textContent = parts.join(" · ");
  const ray = $("ray-link");
  if (ov.ray_dashboard_url) ray.href = ov.ray_dashboard_url;
  ray.hidden = !ov.ray_dashboard_url;  // only while the sweep runs: its Ray stops with it
  $("ray-token").hidden = !ov.ray_dashboard_url;
}

function renderMessages(container, messages) {
  const signature = JSON.stringify(messages || []);
  if (container.dataset.signature === signature) return;
  container.dataset.signature = signature;
  container.replaceChildren(...(messages || []).map((m) => {
    const div = document.createElement("div");
    div.className = `message ${m.level}`;
    div.textContent = m.text;
    return div;
  }));
}

// ---------------------------------------------------------------------------------------------
// Trials table: rows keyed by trial id, cells written only when their text changes

function columns(ov) {
  const mixed = new Set(ov.trials.map((t) => t.metric_name)).size > 1;
  const mixedEvaluation = new Set(ov.trials.map((t) => t.evaluation || "global")).size > 1;  // personalised beside global
  const errors = ov.trials.some((t) => t.error);
  const after = FIXED_COLUMNS_AFTER.filter((c) => (!c.onlyIfMixed || mixed) && (!c.onlyIfMixedEvaluation || mixedEvaluation) && (!c.onlyIfErrors || errors));
  return [...FIXED_COLUMNS_BEFORE, ...ov.swept_keys.map((k) => ({ key: k, label: keyName(k), swept: true })), ...after];
}

function renderTable(ov) {
  const cols = columns(ov);
  const signature = JSON.stringify(cols.map((c) => c.key)) + ov.metric;
  if (!state.sort) state.sort = { key: "best_metric", dir: ov.mode === "min" ? 1 : -1 };
  if (signature !== state.columnsSignature) {
    state.columnsSignature = signature;
    const row = document.createElement("tr");
    cols.forEach((c) => {
      const th = document.createElement("th");
      th.textContent = c.key === "latest_metric" ? `latest ${ov.metric}` : c.key === "best_metric" ? `best ${ov.metric}` : c.label;
      th.dataset.key = c.key;
      if (c.cls) th.className = c.cls;
      if (c.sortable !== false) th.addEventListener("click", () => sortBy(c.key));
      th.title = c.swept ? "swept hyperparameter" : "";
      row.appendChild(th);
    });
    $("trials-table").tHead.replaceChildren(row);
    $("trials-table").tBodies[0].replaceChildren();
  }
  $("trials-table").tHead.querySelectorAll("th").forEach((th) => {
    th.classList.toggle("sorted-asc", th.dataset.key === state.sort.key && state.sort.dir === 1);
    th.classList.toggle("sorted-desc", th.dataset.key === state.sort.key && state.sort.dir === -1);
  });

  const body = $("trials-table").tBodies[0];
  const existing = new Map([...body.rows].map((tr) => [tr.dataset.trialId, tr]));
  const ordered = sortedTrials(ov);
  const wanted = new Set(ordered.map((t) => t.trial_id));
  existing.forEach((tr, id) => { if (!wanted.has(id)) tr.remove(); });
  ordered.forEach((trial, index) => {
    let tr = existing.get(trial.trial_id);
    if (!tr) tr = newRow(trial, cols);
    cols.forEach((c, i) => {
      if (c.key === "_select") return;
      const td = tr.cells[i];
      const text = cellText(trial, c.key, ov);
      if (td.textContent !== text) td.textContent = text;
      if (c.key === "status" || c.key === "error") {
        if (c.key === "status") td.className = `text status-${trial.status}`;
        td.title = trial.error || "";
      }
      if (c.key === "_mark") td.title = bestOf(trial, ov) ? `best ${bestOf(trial, ov)} of the trials that report it` : "";
    });
    tr.classList.toggle("best", trial.trial_id === ov.best_trial);
    tr.classList.toggle("best-other", Boolean(bestOf(trial, ov)) && trial.trial_id !== ov.best_trial);
    tr.classList.toggle("failed", FAILED.has(trial.status));
    tr.title = trial.label;
    tr.classList.toggle("open", trial.trial_id === state.runTrial);
    const box = tr.querySelector("input[type=checkbox]");
    box.checked = state.selected.has(trial.trial_id);
    if (body.rows[index] !== tr) body.insertBefore(tr, body.rows[index] || null);
  });
  $("trials-count").textContent = ov.trials.length ? `(${ov.trials.length})` : "";
  $("trials-empty").hidden = ov.trials.length > 0;
}

function newRow(trial, cols) {
  const tr = document.createElement("tr");
  tr.dataset.trialId = trial.trial_id;
  cols.forEach((c) => {
    const td = document.createElement("td");
    if (c.cls) td.className = c.cls;
    if (c.key === "_select") {
      const box = document.createElement("input");
      box.type = "checkbox";
      box.title = "show in the learning curves";
      box.addEventListener("click", (event) => {
        event.stopPropagation();
        state.autoSelect = false;
        if (box.checked) state.selected.add(trial.trial_id); else state.selected.delete(trial.trial_id);
        renderCurves(true);
      });
      td.appendChild(box);
    }
    tr.appendChild(td);
  });
  tr.addEventListener("click", () => openRun(trial.trial_id));
  return tr;
}

function sortedTrials(ov) {
  const { key, dir } = state.sort;
  const value = (t) => t[key];
  return [...ov.trials].sort((a, b) => {
    const x = value(a), y = value(b);
    const xMissing = x === null || x === undefined, yMissing = y === null || y === undefined;
    if (xMissing || yMissing) return xMissing - yMissing;  // missing values last in both directions
    if (typeof x === "number" && typeof y === "number") return dir * (x - y);
    return dir * String(x).localeCompare(String(y), undefined, { numeric: true });
  });
}

function sortBy(key) {
  if (state.sort.key === key) state.sort.dir = -state.sort.dir;
  else state.sort = { key, dir: key === "trial_id" || key === "status" ? 1 : -1 };
  renderTable(state.overview);
}

function updateSelection(ov) {
  const ids = new Set(ov.trials.map((t) => t.trial_id));
  if (state.autoSelect) state.selected = new Set(topTrials(ov, TOP_N));
  else state.selected.forEach((id) => { if (!ids.has(id)) state.selected.delete(id); });
}

// ---------------------------------------------------------------------------------------------
// Learning curves of the selected trials, overlaid

function renderMetricMenu(ov) {
  const menu = $("curve-metric");
  const options = ov.round_metrics.length ? ov.round_metrics : [ov.metric];
  if (!state.curveMetric || !options.includes(state.curveMetric)) state.curveMetric = options.includes(ov.metric) ? ov.metric : options[0];
  const signature = options.join("|");
  if (menu.dataset.signature !== signature) {
    menu.dataset.signature = signature;
    menu.replaceChildren(...options.map((m) => new Option(m, m)));
  }
  menu.value = state.curveMetric;
}

function roundAxis(traces) {
  // integer ticks while there are few rounds (Plotly would otherwise label 1.5, 2.5, ...)
  const last = Math.max(0, ...traces.map((t) => t.x[t.x.length - 1] || 0));
  return last <= 12 ? { title: { text: "round" }, dtick: 1 } : { title: { text: "round" } };
}

function traceName(trial, ov, metric) {
  // the trial by its swept values; the quantity when its metric is not the sweep's (a linear probe's accuracy)
  const other = metric === ov.metric && trial.metric_name !== ov.metric ? ` [${trial.metric_name}]` : "";
  return `${bestOf(trial, ov) ? "★ " : ""}${trial.label}${other}`;
}

function defaultGroupBy(ov) {
  // averaging over seeds is what a comparison table does: group by the other listed-value keys
  if (!ov.swept_keys.includes("seed")) return [];
  return ov.swept_keys.filter((k) => k !== "seed" && ov.categorical_keys.includes(k));
}

function renderGroupControl(ov) {
  if (state.groupBy === null && ov.trials.length) state.groupBy = defaultGroupBy(ov);
  const groupBy = (state.groupBy || []).filter((k) => ov.swept_keys.includes(k));
  state.groupBy = state.groupBy === null ? null : groupBy;
  const box = $("group-by");
  const signature = JSON.stringify(ov.swept_keys);
  if (box.dataset.signature !== signature) {
    box.dataset.signature = signature;
    box.replaceChildren(...ov.swept_keys.map((key) => {
      const label = document.createElement("label");
      const input = document.createElement("input");
      input.type = "checkbox";
      input.value = key;
      input.addEventListener("change", () => {
        const keys = new Set(state.groupBy || []);
        if (input.checked) keys.add(key); else keys.delete(key);
        state.groupBy = ov.swept_keys.filter((k) => keys.has(k));
        renderCurves(true).catch(showError);
      });
      label.append(input, ` ${keyName(key)}`);
      return label;
    }));
  }
  box.querySelectorAll("input").forEach((input) => { input.checked = groupBy.includes(input.value); });
  $("group-bar").hidden = ov.swept_keys.length === 0;
}

async function renderCurves(force = false) {
  const ov = state.overview;
  const groupBy = state.groupBy || [];
  const ids = ov.trials.map((t) => t.trial_id).filter((id) => state.selected.has(id));
  const key = JSON.stringify([ov.version, state.curveMetric, ids, groupBy]);
  if (!force && key === state.lastCurvesKey) return;
  state.lastCurvesKey = key;
  document.querySelectorAll("#trials-section .toolbar [data-select]").forEach((b) => { b.disabled = groupBy.length > 0; });
  if (groupBy.length) { await renderGroups(ov, groupBy); return; }
  $("groups-section").hidden = true;
  const empty = $("curves-empty");
  if (!ids.length) {
    Plotly.purge("curves-plot");
    empty.textContent = ov.trials.length ? "No trial selected (tick a box in the table)." : "No trials yet.";
    empty.hidden = false;
    return;
  }
  const params = new URLSearchParams({ metric: state.curveMetric });
  ids.forEach((id) => params.append("trial", id));
  const data = await getJSON(`/api/curves?${params}`);
  const byId = new Map(ov.trials.map((t) => [t.trial_id, t]));
  const traces = ids.filter((id) => data.curves[id]).map((id) => {
    const name = traceName(byId.get(id), ov, data.metric);
    return {
      type: "scatter",
      mode: data.curves[id].round.length <= 60 ? "lines+markers" : "lines",
      name,
      x: data.curves[id].round,
      y: data.curves[id].value,
      line: { width: id === ov.best_trial ? 3 : 1.5 },
      marker: { size: 4 },
      hovertemplate: `${name}<br>round %{x}<br>${data.metric} %{y:.4g}<extra>${id}</extra>`,
    };
  });
  empty.hidden = traces.length > 0;
  empty.textContent = `The selected trials have not reported ${data.metric} yet.`;
  drawCurves(traces, data.metric, "trials");
}

function drawCurves(traces, metric, mode) {
  Plotly.react("curves-plot", traces, {
    margin: { l: 55, r: 10, t: 10, b: 40 },
    xaxis: roundAxis(traces),
    yaxis: { title: { text: metric }, tickformat: ".3~g" },
    legend: { font: { size: 11 } },
    showlegend: true,
    uirevision: `${metric}/${mode}`,  // keep the user's zoom across live updates
  }, { displaylogo: false, responsive: true });
}

function rgba(hex, alpha) {
  const n = parseInt(hex.slice(1), 16);
  return `rgba(${n >> 16}, ${(n >> 8) & 255}, ${n & 255}, ${alpha})`;
}

async function renderGroups(ov, groupBy) {
  // mean ± std bands of the groups, and the comparison table of their final and best values
  const params = new URLSearchParams({ metric: state.curveMetric });
  groupBy.forEach((k) => params.append("by", k));
  const data = await getJSON(`/api/groups?${params}`);
  const traces = [];
  data.groups.forEach((group, index) => {
    const curve = group.curve;
    if (!curve.round.length) return;
    const color = PALETTE[index % PALETTE.length];
    const upper = curve.mean.map((m, i) => m + curve.std[i]);
    const lower = curve.mean.map((m, i) => m - curve.std[i]);
    const legendgroup = group.label;
    traces.push({ type: "scatter", mode: "lines", x: curve.round, y: lower, line: { width: 0, color }, hoverinfo: "skip", showlegend: false, legendgroup });
    traces.push({ type: "scatter", mode: "lines", x: curve.round, y: upper, line: { width: 0, color }, fill: "tonexty", fillcolor: rgba(color, 0.18), hoverinfo: "skip", showlegend: false, legendgroup });
    traces.push({
      type: "scatter", mode: curve.round.length <= 60 ? "lines+markers" : "lines", x: curve.round, y: curve.mean, name: `${group.best_group ? "★ " : ""}${group.label} (n=${group.trial_ids.length})`,
      line: { color, width: group.best_group ? 3 : 2 }, marker: { size: 4 }, legendgroup, customdata: curve.std.map((sd, i) => [sd, curve.n[i]]),
      hovertemplate: `${group.label}<br>round %{x}<br>${data.curve_metric} %{y:.4g} ± %{customdata[0]:.2g} (n=%{customdata[1]})<extra></extra>`,
    });
  });
  const empty = $("curves-empty");
  empty.hidden = traces.length > 0;
  empty.textContent = `No group has reported ${data.curve_metric} yet.`;
  drawCurves(traces, data.curve_metric, `groups:${groupBy.join(",")}`);
  renderGroupTable(ov, data);
}

function renderGroupTable(ov, data) {
  $("groups-section").hidden = false;
  const others = ov.swept_keys.filter((k) => !data.by.includes(k));
  $("groups-note").textContent = `mean ± std (population) over ${others.length ? others.map((k) => SYMBOLS[k] || k).join(", ") : "the trials"} of each group;` +
    ` ${/accuracy/.test(data.metric) ? "accuracies in %; " : ""}failed trials are listed, not averaged; ★ best mean final value within each quantity.`;
  const mixed = new Set(data.groups.map((g) => g.metric_name)).size > 1;
  const head = [...data.by.map(keyName), ...(mixed ? ["quantity"] : []), "n", `final ${data.metric}`, `best ${data.metric}`, "failed"];
  const headRow = document.createElement("tr");
  ["", ...head].forEach((text, i) => {
    const th = document.createElement("th");
    th.textContent = text;
    if (i > 0 && i <= data.by.length + (mixed ? 1 : 0)) th.className = "text";
    headRow.appendChild(th);
  });
  const rows = data.groups.map((group) => {
    const tr = document.createElement("tr");
    tr.className = group.best_group ? "best" : "";
    tr.dataset.group = group.label;
    const cells = [
      { text: group.best_group ? "★" : "", cls: "mark" },
      ...data.by.map((k) => ({ text: fmt(group.values[k]), cls: "text" })),
      ...(mixed ? [{ text: group.metric_name, cls: "text" }] : []),
      { text: String(group.final.n) },
      { text: fmtMeanStd(group.final, data.metric), cls: "num final" },
      { text: fmtMeanStd(group.best, data.metric), cls: "num best" },
      { text: group.failed.length ? String(group.failed.length) : "", cls: group.failed.length ? "status-ERROR" : "" },
    ];
    cells.forEach((cell) => {
      const td = document.createElement("td");
      td.textContent = cell.text;
      if (cell.cls) td.className = cell.cls;
      tr.appendChild(td);
    });
    if (group.failed.length) tr.lastChild.title = `failed: ${group.failed.join(", ")}`;
    return tr;
  });
  $("groups-table").tHead.replaceChildren(headRow);
  $("groups-table").tBodies[0].replaceChildren(...rows);
  $("groups-markdown").textContent = markdownTable(head, data);
}

function markdownTable(head, data) {
  // the comparison table as Markdown, for a paper draft or a report
  const mixed = head.includes("quantity");
  const lines = [`| ${head.join(" | ")} |`, `|${head.map(() => "---").join("|")}|`];
  data.groups.forEach((g) => {
    const cells = [...data.by.map((k) => fmt(g.values[k])), ...(mixed ? [g.metric_name] : []), String(g.final.n),
      `${g.best_group ? "**" : ""}${fmtMeanStd(g.final, data.metric)}${g.best_group ? "**" : ""}`, fmtMeanStd(g.best, data.metric), String(g.failed.length)];
    lines.push(`| ${cells.join(" | ")} |`);
  });
  return lines.join("\n");
}

// ---------------------------------------------------------------------------------------------
// Parallel coordinates and one scatter per swept key

function axisFor(key, values, categorical) {
  // Keys searched over listed values (grid/choice), text and single values on categorical axes whose
  // ticks are the values themselves (no "M = 1.5"); sampled numbers on a linear axis, or log10 when
  // they span two decades or more.
  const present = values.filter((v) => v !== null && v !== undefined);
  const label = keyName(key);
  if (!categorical && present.length && present.every(isNum) && new Set(present).size > 1) {
    const positive = present.every((v) => v > 0);
    const log = positive && Math.max(...present) / Math.min(...present) >= 100;
    return { log, numeric: true, label: log ? `log10 ${label}` : label, map: (v) => (isNum(v) ? (log ? Math.log10(v) : v) : null) };
  }
  const distinct = [...new Set(present)];
  distinct.sort((a, b) => (isNum(a) && isNum(b) ? a - b : String(a).localeCompare(String(b), undefined, { numeric: true })));
  const categories = distinct.map(fmt);
  if (present.length < values.length) categories.push(NOT_APPLICABLE);  // e.g. τ of a FedAvg run
  const index = new Map(distinct.map((v, i) => [v, i]));
  const text = (v) => (v === null || v === undefined ? NOT_APPLICABLE : fmt(v));
  return { numeric: false, label, categories, map: (v) => (index.has(v) ? index.get(v) : categories.length - 1), text };
}

function renderParams(ov) {
  const valueKey = $("value-kind").value;
  const label = `${valueKey === "best_metric" ? "best" : "final"} ${ov.metric}`;
  const trials = ov.trials.filter((t) => isNum(t[valueKey]));
  const empty = $("params-empty");
  const scatters = $("scatter-plots");
  if (!ov.swept_keys.length || !trials.length) {
    Plotly.purge("parcoords-plot");
    $("parcoords-plot").hidden = true;
    scatters.replaceChildren();
    empty.textContent = !ov.swept_keys.length ? "No swept hyperparameters here (a single run, or runs with identical configs)." : `No trial has reported ${ov.metric} yet.`;
    empty.hidden = false;
    return;
  }
  empty.hidden = true;
  $("parcoords-plot").hidden = false;
  const categorical = (key) => ov.categorical_keys.includes(key);
  const dims = ov.swept_keys.map((key) => {
    const axis = axisFor(key, trials.map((t) => t[key]), categorical(key));
    const dim = { label: axis.label, values: trials.map((t) => axis.map(t[key])), tickformat: ".3~g" };
    if (!axis.numeric) Object.assign(dim, { tickvals: axis.categories.map((_, i) => i), ticktext: axis.categories, range: [-0.5, axis.categories.length - 0.5] });
    return dim;
  });
  const metricValues = trials.map((t) => t[valueKey]);
  dims.push({ label, values: metricValues, tickformat: ".3~g" });
  Plotly.react("parcoords-plot", [{
    type: "parcoords",
    dimensions: dims,
    line: { color: metricValues, colorscale: "Viridis", reversescale: ov.mode === "min" },  // bright = good
  }], { margin: { l: 60, r: 60, t: 40, b: 20 } }, { displaylogo: false, responsive: true });

  // one small scatter per swept key: value vs metric, the best trial highlighted. All divs exist
  // before the first is drawn, so each plot is sized for its final grid cell.
  const wantedIds = ov.swept_keys.map((k) => `scatter-${k}`);
  [...scatters.children].forEach((div) => { if (!wantedIds.includes(div.id)) { Plotly.purge(div); div.remove(); } });
  ov.swept_keys.forEach((key) => {
    if (document.getElementById(`scatter-${key}`)) return;
    const div = document.createElement("div");
    div.id = `scatter-${key}`;
    div.className = "plot scatter";
    scatters.appendChild(div);
  });
  ov.swept_keys.forEach((key) => {
    const div = document.getElementById(`scatter-${key}`);
    const axis = axisFor(key, trials.map((t) => t[key]), categorical(key));
    const x = trials.map((t) => (axis.numeric ? t[key] : axis.text(t[key])));
    const best = trials.findIndex((t) => t.trial_id === ov.best_trial);
    const traces = [{
      type: "scatter", mode: "markers", name: "trials", x, y: metricValues, text: trials.map((t) => t.label),
      marker: { size: 7, opacity: 0.75, color: trials.map((t) => (t.metric_name === ov.metric ? "#2f6fdb" : "#9467bd")) },
      hovertemplate: `%{text}<br>${label} %{y:.4g}<extra></extra>`,
    }];
    if (best >= 0) traces.push({ type: "scatter", mode: "markers", name: "best", x: [x[best]], y: [metricValues[best]], marker: { size: 14, symbol: "star", color: "#e0a100" }, hoverinfo: "skip" });
    Plotly.react(div, traces, {
      margin: { l: 50, r: 25, t: 10, b: 40 }, showlegend: false,
      xaxis: axis.numeric
        ? { title: { text: axis.label }, type: axis.log ? "log" : "linear", tickformat: ".3~g" }
        : { title: { text: axis.label }, type: "category", categoryorder: "array", categoryarray: axis.categories },
      yaxis: { title: { text: label }, tickformat: ".3~g" },
      uirevision: key,
    }, { displaylogo: false, responsive: true });
  });
}

// ---------------------------------------------------------------------------------------------
// Best configuration

function renderBest(ov) {
  const trial = ov.trials.find((t) => t.trial_id === ov.best_trial);
  const summary = $("best-summary");
  if (!trial) {
    summary.textContent = ov.trials.length ? `No trial has reported ${ov.metric} yet.` : "No trials yet.";
    summary.className = "placeholder";
    ["best-actions", "best-hint", "best-config"].forEach((id) => { $(id).hidden = true; });
    return;
  }
  summary.className = "";
  const others = Object.entries(ov.best_by_metric).filter(([name]) => name !== trial.metric_name)
    .map(([name, id]) => { const t = ov.trials.find((x) => x.trial_id === id); return `best by ${name}: ${t.label} (${fmt(t.best_metric)})`; });
  summary.textContent = `★ ${trial.label} (${trial.trial_id}): best ${trial.metric_name} ${fmt(trial.best_metric)} at round ${fmt(trial.best_round)}` +
    ` (latest ${fmt(trial.latest_metric)}).${others.length ? ` Ranked apart, as a different quantity: ${others.join("; ")}.` : ""}`;
  const pre = $("best-config");
  const hasConfig = typeof ov.best_config === "string";
  if (hasConfig && pre.textContent !== ov.best_config) pre.textContent = ov.best_config;
  pre.hidden = !hasConfig;
  $("best-actions").hidden = !hasConfig;
  $("best-hint").hidden = !hasConfig;
  $("download-config").href = `/api/file?${new URLSearchParams({ trial: trial.trial_id, name: "config.yaml" })}`;
}

async function copyText(element, status) {
  try {
    await navigator.clipboard.writeText(element.textContent);
  } catch (error) {  // no clipboard API (e.g. plain http on another host): select the text instead
    const range = document.createRange();
    range.selectNodeContents(element);
    window.getSelection().removeAllRanges();
    window.getSelection().addRange(range);
    document.execCommand("copy");
  }
  status.textContent = "copied";
  setTimeout(() => { status.textContent = ""; }, 2000);
}

// ---------------------------------------------------------------------------------------------
// One run: curves, per-client distribution, partition heat-map, config

function openRun(trialId) {
  state.runTrial = trialId;
  state.clientRound = null;
  $("client-follow").checked = true;
  document.querySelectorAll("#trials-table tbody tr").forEach((tr) => tr.classList.toggle("open", tr.dataset.trialId === trialId));
  renderRun().catch(showError);
  $("run-section").scrollIntoView({ behavior: "smooth", block: "start" });
}

function curvePlot(divId, curves, names, title) {
  const traces = names.filter((n) => curves[n]).map((n) => ({
    type: "scatter", mode: curves[n].round.length <= 60 ? "lines+markers" : "lines", name: n,
    x: curves[n].round, y: curves[n].value, marker: { size: 4 },
  }));
  Plotly.react(divId, traces, {
    margin: { l: 55, r: 10, t: 30, b: 40 }, title: { text: title, font: { size: 13 }, x: 0.01, xanchor: "left" },
    xaxis: roundAxis(traces), showlegend: true, legend: { orientation: "h", x: 1, xanchor: "right", y: 1.02, yanchor: "bottom" },
    uirevision: title,
  }, { displaylogo: false, responsive: true });
}

async function renderRun() {
  const trialId = state.runTrial;
  if (trialId === null) { $("run-placeholder").hidden = false; $("run-body").hidden = true; return; }
  const params = new URLSearchParams({ trial: trialId });
  if (state.clientRound !== null) params.set("round", state.clientRound);
  const view = await getJSON(`/api/run?${params}`);
  if (trialId !== state.runTrial) return;  // another row was clicked meanwhile
  const known = state.overview.trials.find((t) => t.trial_id === view.trial_id);
  $("run-title").textContent = view.trial_id;
  $("run-label").textContent = known && known.label !== view.trial_id ? known.label : "";
  renderMessages($("run-messages"), view.messages);
  $("run-placeholder").hidden = true;
  $("run-body").hidden = !view.found;
  if (!view.found) return;
  const trial = state.overview.trials.find((t) => t.trial_id === trialId) || {};
  const info = [`status ${trial.status || "?"}`, `round ${fmt(trial.round)}`, `directory ${view.run_dir || "(not here)"}`];
  if (trial.error) info.push(`error: ${trial.error}`);
  if (view.summary && isNum(view.summary.seconds)) info.push(`wall time ${fmtSeconds(view.summary.seconds)}`);
  $("run-info").textContent = info.join(" · ");

  const names = Object.keys(view.curves);
  const accuracy = names.filter((n) => /accuracy/.test(n) && !/_std$/.test(n));
  const loss = names.filter((n) => /loss/.test(n));
  curvePlot("run-accuracy-plot", view.curves, accuracy.length ? accuracy : names.slice(0, 1), "accuracy");
  curvePlot("run-loss-plot", view.curves, loss, "loss");

  renderClients(view.clients);

  const img = $("partition-img");
  const stamp = view.files["partition.png"];
  if (stamp) {
    const src = `/api/file?${new URLSearchParams({ trial: trialId, name: "partition.png", v: stamp })}`;
    if (img.getAttribute("src") !== src) img.src = src;
  }
  img.hidden = !stamp;
  $("partition-empty").hidden = Boolean(stamp);
  if ($("run-config").textContent !== (view.config || "")) $("run-config").textContent = view.config || "(no config.yaml)";
}

function renderClients(clients) {
  const container = $("run-clients");
  const bar = $("client-round-bar");
  if (!clients || !Object.keys(clients.metrics).length) {
    [...container.children].forEach((div) => Plotly.purge(div));
    container.replaceChildren();
    bar.hidden = true;
    $("clients-empty").hidden = false;
    $("client-round-label").textContent = "";
    return;
  }
  $("clients-empty").hidden = true;
  bar.hidden = clients.rounds.length < 2;
  const slider = $("client-round");
  slider.min = 0;
  slider.max = clients.rounds.length - 1;
  slider.value = clients.rounds.indexOf(clients.round);
  slider.dataset.rounds = JSON.stringify(clients.rounds);
  $("client-round-label").textContent = `(${clients.num_clients} clients at round ${clients.round})`;
  const names = Object.keys(clients.metrics);
  [...container.children].forEach((div) => { if (!names.includes(div.dataset.metric)) { Plotly.purge(div); div.remove(); } });
  names.forEach((name) => {  // create every div before drawing, so each plot gets its final width
    if (container.querySelector(`[data-metric="${CSS.escape(name)}"]`)) return;
    const div = document.createElement("div");
    div.className = "plot small client-plot";
    div.dataset.metric = name;
    container.appendChild(div);
  });
  names.forEach((name) => {
    const div = container.querySelector(`[data-metric="${CSS.escape(name)}"]`);
    // a box (quartiles) with every client as a point: readable for 3 clients and for 3000
    Plotly.react(div, [{
      type: "box", x: clients.metrics[name], name: "", orientation: "h", boxpoints: "all", jitter: 0.4, pointpos: 0,
      text: clients.client_ids.map((id) => `client ${id}`), hovertemplate: `%{text}<br>${name} %{x:.4g}<extra></extra>`,
      marker: { color: "#2f6fdb", size: 5, opacity: 0.7 }, line: { color: "#1f2933" }, fillcolor: "rgba(47,111,219,0.12)",
    }], {
      margin: { l: 20, r: 10, t: 30, b: 40 }, title: { text: `${name} per client, round ${clients.round}`, font: { size: 13 } },
      xaxis: { title: { text: name } }, yaxis: { showticklabels: false }, showlegend: false,
    }, { displaylogo: false, responsive: true });
  });
}

// ---------------------------------------------------------------------------------------------
// The refresh loop

function showError(error) {
  const box = $("connection");
  box.textContent = `Cannot reach the dashboard server (${error.message}). Retrying…`;
  box.hidden = false;
}

async function refresh() {
  const ov = await getJSON("/api/overview");
  state.overview = ov;
  state.refreshMs = Math.max(500, 1000 * (ov.refresh_seconds || 2));
  if (ov.kind === "run" && ov.trials.length === 1 && state.runTrial === null) state.runTrial = ov.trials[0].trial_id;
  if (state.runTrial !== null && !ov.trials.some((t) => t.trial_id === state.runTrial)) state.runTrial = null;
  renderHeader(ov);
  renderMessages($("messages"), ov.messages);
  updateSelection(ov);
  renderTable(ov);
  renderMetricMenu(ov);
  renderGroupControl(ov);
  renderParams(ov);
  renderBest(ov);
  await renderCurves();
  await renderRun();
  state.version = ov.version;  // only once drawn: a failed update is retried at the next poll
}

async function poll() {
  if (!state.busy) {
    state.busy = true;
    try {
      const { version } = await getJSON("/api/version");
      $("connection").hidden = true;
      if (version !== state.version) await refresh();
      $("updated").textContent = `checked ${new Date().toLocaleTimeString()}`;
      document.body.dataset.version = state.version;  // lets tests wait for an update
    } catch (error) {
      showError(error);
    } finally {
      state.busy = false;
    }
  }
  setTimeout(poll, state.refreshMs);
}

function init() {
  document.querySelectorAll("[data-select]").forEach((button) => button.addEventListener("click", () => {
    const ov = state.overview;
    if (!ov) return;
    const how = button.dataset.select;
    state.autoSelect = how === "top";
    state.selected = new Set(how === "all" ? ov.trials.map((t) => t.trial_id) : how === "top" ? topTrials(ov, TOP_N) : []);
    renderTable(ov);
    renderCurves(true).catch(showError);
  }));
  $("curve-metric").addEventListener("change", (e) => { state.curveMetric = e.target.value; renderCurves(true).catch(showError); });
  $("value-kind").addEventListener("change", () => state.overview && renderParams(state.overview));
  $("copy-config").addEventListener("click", () => copyText($("best-config"), $("copy-status")));
  $("copy-markdown").addEventListener("click", () => copyText($("groups-markdown"), $("markdown-status")));
  $("client-round").addEventListener("input", (e) => {
    const rounds = JSON.parse(e.target.dataset.rounds || "[]");
    state.clientRound = rounds[Number(e.target.value)] ?? null;
    $("client-follow").checked = false;
    renderRun().catch(showError);
  });
  $("client-follow").addEventListener("change", (e) => { if (e.target.checked) { state.clientRound = null; renderRun().catch(showError); } });
  if (typeof Plotly === "undefined") {
    showError(new Error("plotly.min.js did not load"));
    return;
  }
  poll();
}

document.addEventListener("DOMContentLoaded", init);
