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
const PLOT_CONFIG = { displaylogo: false, responsive: true };
// small plots keep only the modebar buttons they need, so that it stays clear of their titles
const SMALL_PLOT_CONFIG = { ...PLOT_CONFIG, modeBarButtonsToRemove: ["select2d", "lasso2d", "zoomIn2d", "zoomOut2d", "autoScale2d", "pan2d"] };
const MODEBAR_ROOM = 36;   // px above a plot area: Plotly's modebar is drawn there, above the legend and the titles
const LEGEND_CHARS = 48;   // longer trial names are cut in legends (the full name shows on hover)
const FINISHED = new Set(["TERMINATED", "STOPPED_EARLY"]);  // trials with a value that counts (early stopping by the scheduler included)
const STATUS_GROUPS = [    // the timeline's colours and legend
  { name: "finished", statuses: ["TERMINATED"], color: "#2e7d32" },
  { name: "early-stopped", statuses: ["STOPPED_EARLY"], color: "#8d6e63" },
  { name: "running", statuses: ["RUNNING", "PENDING"], color: "#1565c0" },
  { name: "stopped by its user", statuses: ["STOPPED"], color: "#78909c" },
  { name: "failed", statuses: ["ERROR", "INTERRUPTED", "STALLED"], color: "#c62828" },
];
const SIM_TIME = "sim_time";
const SYSTEMS_PLOTS = [      // the run view's plots of runs with systems.enabled (docs/guide/systems.md), by metric column
  { div: "run-clients-count-plot", names: ["selected", "aggregated", "dropped", "late"], title: "clients per round", y: "clients" },
  { div: "run-bytes-plot", names: ["bytes_down", "bytes_up"], title: "bytes per round", y: "bytes" },
  { div: "run-staleness-plot", names: ["staleness_mean", "staleness_max"], title: "staleness (FedBuff)", y: "versions" },
];
const LOG_REFRESH = new Set(["RUNNING", "PENDING"]);  // trials whose log the page re-reads at every check
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
  filter: { text: "", terms: [], problems: [] },  // the trials table's filter (parseFilter)
  brushed: null,             // trial ids inside the parallel coordinates' brushed ranges (null: no brush)
  importanceKey: null,       // what the importance plot shows, to refetch only when it changes
  brushRanges: {},           // parallel-coordinates axis label → its brushed range(s), kept across updates
  brushTrials: [],           // trial ids in the order of the parallel coordinates' values
  xAxis: "round",            // the curves' x-axis: "round", or "sim_time" (the simulated clock of runs with systems.enabled)
  compare: { selected: null, metric: null, key: null },  // a folder of sweeps: the sweeps ticked, the curves' metric
  runLogKey: null,           // the log shown (trial and size), to redraw it only when it grew
  pairedMetric: null,        // the metric of the paired comparison's table (null: the sweep's own)
  heatmap: { x: null, y: null, metric: null, key: null },  // the heatmap's keys and metric, and what it shows
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
  const percent = /accuracy|_f1/.test(metric);
  const digits = (v) => (percent ? (100 * v).toFixed(2) : fmt(v));
  return `${digits(stats.mean)} ± ${digits(stats.std)}`;
}

function keyName(key) { return SYMBOLS[key] ? `${key} (${SYMBOLS[key]})` : key; }

function setMenu(menu, options, value, label = (option) => option) {
  // a <select>'s options (rebuilt only when they changed, so an open menu stays open) and its value
  const signature = JSON.stringify(options);
  if (menu.dataset.signature !== signature) {
    menu.dataset.signature = signature;
    menu.replaceChildren(...options.map((option) => new Option(label(option), option)));
  }
  if (value !== null && value !== undefined) menu.value = value;
}

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
  return visibleTrials(overview)
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
  $("kind").textContent = { sweep: "sweep", sweeps: "folder of sweeps", run: "run", runs: "folder of runs", empty: "waiting", missing: "not found" }[ov.kind] || ov.kind;
  const status = $("sweep-status");
  status.textContent = ov.status || "";
  status.className = `badge ${ov.status === "stalled" ? "failed" : ov.status || ""}`;
  const counts = {};
  ov.trials.forEach((t) => { counts[t.status] = (counts[t.status] || 0) + 1; });
  const parts = [`${ov.trials.length}${ov.num_trials ? ` / ${ov.num_trials}` : ""} trials`];
  Object.entries(counts).forEach(([k, v]) => parts.push(`${v} ${String(k).toLowerCase()}`));
  parts.push(`metric ${ov.metric} (${ov.mode})`);
  if (ov.kind === "sweeps") parts.splice(0, parts.length, `${ov.sweeps.length} sweeps`);
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
  const shown = new Set(visibleTrials(ov).map((t) => t.trial_id));
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
    tr.hidden = !shown.has(trial.trial_id);
    const box = tr.querySelector("input[type=checkbox]");
    box.checked = state.selected.has(trial.trial_id);
    if (body.rows[index] !== tr) body.insertBefore(tr, body.rows[index] || null);
  });
  $("trials-count").textContent = ov.trials.length ? `(${ov.trials.length})` : "";
  $("trials-empty").hidden = ov.trials.length > 0;
  const filtered = state.filter.terms.length > 0 || state.brushed !== null;
  const status = [filtered ? `${shown.size} of ${ov.trials.length} shown` : ""];
  if (state.brushed !== null) status.push("brushed on the parallel coordinates (click an axis outside its range to clear it)");
  status.push(...state.filter.problems);
  $("filter-status").textContent = status.filter(Boolean).join(" · ");
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

// ---------------------------------------------------------------------------------------------
// Filtering (the table's filter box, the parallel coordinates' brushed ranges) and CSV export

const FILTER_TERM = /^(.+?)(>=|<=|!=|=|<|>)(.*)$/;

function filterNames(ov) {
  // the names a filter term may give a column (lower case): its key, its header, a swept key's symbol or last part
  const names = new Map();
  const add = (name, key) => { if (name && !names.has(name.toLowerCase())) names.set(name.toLowerCase(), key); };
  columns(ov).filter((c) => !c.key.startsWith("_")).forEach((c) => { add(c.key, c.key); add(c.label, c.key); });
  ov.swept_keys.forEach((k) => { add(SYMBOLS[k], k); add(k.split(".").pop(), k); });
  [["latest", "latest_metric"], ["best", "best_metric"], ["wall", "wall_time_s"], ["name", "label"], [ov.metric, "latest_metric"]].forEach(([n, k]) => add(n, k));
  return names;
}

function parseFilter(text, ov) {
  // terms that must all hold: KEY OP VALUE (OP: = != < <= > >=), or text found in a trial's id, status or name
  const names = filterNames(ov);
  const terms = [], problems = [];
  text.trim().split(/\s+/).filter(Boolean).forEach((term) => {
    const match = FILTER_TERM.exec(term);
    if (!match) { terms.push({ text: term.toLowerCase() }); return; }
    const key = names.get(match[1].toLowerCase());
    if (key === undefined) problems.push(`no column "${match[1]}" (ignored)`);
    else terms.push({ key, op: match[2], value: match[3] });
  });
  return { text, terms, problems };
}

function termHolds(trial, term) {
  if (term.text !== undefined) return `${trial.trial_id} ${trial.status} ${trial.label}`.toLowerCase().includes(term.text);
  const value = trial[term.key];
  if (value === null || value === undefined) {  // a key that does not apply to the trial: only "=n/a" (or "=") matches it
    const none = ["", "n/a", "–"].includes(term.value.toLowerCase());
    return term.op === "=" ? none : term.op === "!=" ? !none : false;
  }
  const number = term.value.trim() === "" ? NaN : Number(term.value);
  let order;
  if (isNum(value) && Number.isFinite(number)) order = value === number || fmt(value) === term.value ? 0 : value - number;
  else order = String(fmt(value)).localeCompare(term.value, undefined, { numeric: true, sensitivity: "base" });
  return { "=": order === 0, "!=": order !== 0, "<": order < 0, "<=": order <= 0, ">": order > 0, ">=": order >= 0 }[term.op];
}

function visibleTrials(ov) {
  return ov.trials.filter((t) => state.filter.terms.every((term) => termHolds(t, term)) && (state.brushed === null || state.brushed.has(t.trial_id)));
}

function applyFilter() {
  const ov = state.overview;
  if (!ov) return;
  renderTable(ov);
  if (state.autoSelect) updateSelection(ov);
  renderCurves(true).catch(showError);
}

function csvCell(value) {
  if (value === null || value === undefined) return "";
  const text = typeof value === "object" ? Object.entries(value).map(([k, v]) => `${k}=${v}`).join(" ") : String(value);
  return /[",\n\r]/.test(text) ? `"${text.replace(/"/g, '""')}"` : text;
}

function trialsCsv(ov) {
  // the trials shown (filtered, in the table's order), with every column and the unrounded values
  const keys = ["trial_id", "label", "status", ...ov.swept_keys, "metric_name", "evaluation", "round", "latest_metric", "best_metric",
    "best_round", "wall_time_s", "started_at", "ended_at", "resources", "run_dir", "error"];
  const shown = new Set(visibleTrials(ov).map((t) => t.trial_id));
  const iso = (seconds) => (isNum(seconds) ? new Date(seconds * 1000).toISOString() : null);
  const rows = sortedTrials(ov).filter((t) => shown.has(t.trial_id))
    .map((t) => keys.map((k) => csvCell(k === "started_at" || k === "ended_at" ? iso(t[k]) : t[k])).join(","));
  return `${[keys.map(csvCell).join(","), ...rows].join("\n")}\n`;
}

function exportCsv() {
  const ov = state.overview;
  if (!ov) return;
  const link = document.createElement("a");
  link.href = URL.createObjectURL(new Blob([trialsCsv(ov)], { type: "text/csv" }));
  link.download = `${ov.title || "trials"}-trials.csv`;
  document.body.appendChild(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 10_000);
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
  setMenu(menu, options, state.curveMetric);
}

function roundAxis(traces) {
  // integer ticks while there are few rounds (Plotly would otherwise label 1.5, 2.5, ...)
  const last = Math.max(0, ...traces.map((t) => t.x[t.x.length - 1] || 0));
  return last <= 12 ? { title: { text: "round" }, dtick: 1 } : { title: { text: "round" } };
}

function useSimTime(curves) {
  // the simulated clock as x when it is chosen and every curve has it
  return state.xAxis === SIM_TIME && curves.length > 0 && curves.every((c) => Array.isArray(c.sim_time));
}

function xAxisOf(traces, simTime) {
  return simTime ? { title: { text: "simulated time (s)" }, tickformat: ".3~s" } : roundAxis(traces);
}

function showXAxisChoice(available) {
  // the x-axis menus, shown where some curve carries the simulated clock; all of them show the one choice
  document.querySelectorAll(".x-axis-bar").forEach((bar) => {
    const inRun = bar.closest("#run-body") !== null, inCompare = bar.closest("#sweeps-section") !== null;
    bar.hidden = !(inRun ? available.run : inCompare ? available.compare : available.curves);
  });
  document.querySelectorAll("select.x-axis").forEach((select) => { select.value = state.xAxis; });
}
const xAxisAvailable = { curves: false, run: false, compare: false };

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
    purgePlot($("curves-plot"));
    empty.textContent = ov.trials.length ? "No trial selected (tick a box in the table)." : "No trials yet.";
    empty.hidden = false;
    return;
  }
  const params = new URLSearchParams({ metric: state.curveMetric });
  ids.forEach((id) => params.append("trial", id));
  const data = await getJSON(`/api/curves?${params}`);
  const byId = new Map(ov.trials.map((t) => [t.trial_id, t]));
  const reported = ids.filter((id) => data.curves[id]);
  // against the simulated clock, only the trials that have one (runs without systems.enabled have no sim_time)
  const simTime = state.xAxis === SIM_TIME && reported.some((id) => data.curves[id].sim_time);
  const drawn = simTime ? reported.filter((id) => data.curves[id].sim_time) : reported;
  const fullNames = drawn.map((id) => traceName(byId.get(id), ov, data.metric));
  const legendNames = shortNames(fullNames);
  const traces = drawn.map((id, index) => {
    const name = fullNames[index];
    const curve = data.curves[id];
    return {
      type: "scatter",
      mode: curve.round.length <= 60 ? "lines+markers" : "lines",
      name: legendNames[index],
      meta: name,
      x: simTime ? curve.sim_time : curve.round,
      y: curve.value,
      customdata: curve.round,
      line: { width: id === ov.best_trial ? 3 : 1.5 },
      marker: { size: 4 },
      hovertemplate: `${name}<br>round %{customdata}${simTime ? " · sim_time %{x:.4g} s" : ""}<br>${data.metric} %{y:.4g}<extra>${id}</extra>`,
    };
  });
  empty.hidden = traces.length > 0 && drawn.length === reported.length;
  empty.textContent = traces.length ? `${reported.length - drawn.length} selected trial(s) have no simulated clock (sim_time) and are not drawn.`
    : `The selected trials have not reported ${data.metric} yet.`;
  drawCurves(traces, data.metric, "trials", simTime);
}

function shortNames(names) {
  // legend names: a name longer than LEGEND_CHARS is cut, keeping its end too where the cut would make two equal
  const cut = names.map((n) => (n.length <= LEGEND_CHARS ? n : `${n.slice(0, LEGEND_CHARS - 1)}…`));
  const tail = LEGEND_CHARS - 20;
  return cut.map((n, i) => (cut.indexOf(n) === cut.lastIndexOf(n) ? n : `${names[i].slice(0, 19)}…${names[i].slice(-tail)}`));
}

function legendTooltips(div) {
  // each legend entry's full name (the trace's meta) as an SVG <title>: the browser shows it on hover
  div.querySelectorAll(".legend .traces").forEach((item) => {
    const datum = item.__data__ && item.__data__[0];
    const full = datum && datum.trace && datum.trace.meta;
    let title = item.querySelector(":scope > title");
    if (typeof full !== "string") { if (title) title.remove(); return; }
    if (!title) {
      title = document.createElementNS("http://www.w3.org/2000/svg", "title");
      item.prepend(title);
    }
    title.textContent = full;
  });
}

async function drawPlot(div, traces, layout, config = PLOT_CONFIG) {
  // Plotly.react, then the legend's tooltips (again after every redraw, e.g. on a resize)
  const element = typeof div === "string" ? $(div) : div;
  await Plotly.react(element, traces, layout, config);
  if (!element.dataset.tooltips) {
    element.dataset.tooltips = "1";
    element.on("plotly_afterplot", () => legendTooltips(element));
  }
  legendTooltips(element);
}

function drawCurves(traces, metric, mode, simTime = false) {
  drawPlot("curves-plot", traces, {
    margin: { l: 55, r: 10, t: MODEBAR_ROOM, b: 40 },
    xaxis: xAxisOf(traces, simTime),
    yaxis: { title: { text: metric }, tickformat: ".3~g" },
    legend: { font: { size: 11 } },
    showlegend: true,
    uirevision: `${metric}/${mode}/${simTime}`,  // keep the user's zoom across live updates
  }).catch(showError);
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
  const drawn = data.groups.filter((group) => group.curve.round.length);
  const fullNames = drawn.map((group) => `${group.best_group ? "★ " : ""}${group.label} (n=${group.trial_ids.length})`);
  const legendNames = shortNames(fullNames);
  data.groups.forEach((group, index) => {
    const curve = group.curve;
    if (!curve.round.length) return;
    const drawnIndex = drawn.indexOf(group);
    const color = PALETTE[index % PALETTE.length];
    const upper = curve.mean.map((m, i) => m + curve.std[i]);
    const lower = curve.mean.map((m, i) => m - curve.std[i]);
    const legendgroup = group.label;
    traces.push({ type: "scatter", mode: "lines", x: curve.round, y: lower, line: { width: 0, color }, hoverinfo: "skip", showlegend: false, legendgroup });
    traces.push({ type: "scatter", mode: "lines", x: curve.round, y: upper, line: { width: 0, color }, fill: "tonexty", fillcolor: rgba(color, 0.18), hoverinfo: "skip", showlegend: false, legendgroup });
    traces.push({
      type: "scatter", mode: curve.round.length <= 60 ? "lines+markers" : "lines", x: curve.round, y: curve.mean, name: legendNames[drawnIndex], meta: fullNames[drawnIndex],
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
// Paired comparison (a sweep over algorithm.name): each algorithm minus the reference algorithm, seed by seed,
// with Student's t intervals; the rows of comparison.md's paired tables (fedray.tune.summary.paired_rows)

function pairedSection() {
  // created here, after the comparison table, the first time a sweep over algorithms is shown
  let section = $("paired-section");
  if (section) return section;
  section = document.createElement("section");
  section.id = "paired-section";
  section.className = "wide";
  section.hidden = true;
  const title = document.createElement("h2");
  title.textContent = "Paired comparison of the algorithms";
  const note = document.createElement("p");
  note.className = "hint";
  note.id = "paired-note";
  const bar = document.createElement("div");
  bar.className = "toolbar";
  const select = document.createElement("select");
  select.id = "paired-metric";
  select.addEventListener("change", (e) => { state.pairedMetric = e.target.value; renderPaired(state.overview); });
  bar.append("metric ", select);
  const wrap = document.createElement("div");
  wrap.className = "table-wrap";
  const table = document.createElement("table");
  table.id = "paired-table";
  table.append(document.createElement("thead"), document.createElement("tbody"));
  wrap.appendChild(table);
  section.append(title, note, bar, wrap);
  $("groups-section").after(section);
  return section;
}

function fmtDifference(value, metric) {
  // "+1.20 pp" for accuracies and F1 scores (percentage points), "-0.0312" for other metrics
  if (!isNum(value)) return "–";
  const sign = value > 0 ? "+" : value < 0 ? "-" : "";
  return /accuracy|_f1/.test(metric) ? `${sign}${(100 * Math.abs(value)).toFixed(2)} pp` : `${sign}${fmt(Math.abs(value))}`;
}

function pairedVerdict(row) {
  if (row.n === 0) return "no paired seeds";
  if (row.ci_low === null) return "n < 2: no interval";
  return row.significant ? `${row.verdict} *` : row.verdict;
}

function renderPaired(ov) {
  const paired = ov && ov.kind === "sweep" ? ov.paired_comparison : null;
  const existing = $("paired-section");
  if (!paired || !paired.metrics.length || !paired.reference) {
    if (existing) existing.hidden = true;
    return;
  }
  const section = pairedSection();
  const metrics = paired.metrics.map((m) => m.metric);
  if (!metrics.includes(state.pairedMetric)) state.pairedMetric = metrics[0];
  setMenu($("paired-metric"), metrics, state.pairedMetric);
  const chosen = paired.metrics.find((m) => m.metric === state.pairedMetric);
  const level = `${Math.round(100 * paired.confidence)}%`;
  $("paired-note").textContent = `Reference: ${paired.reference} (${paired.reference_rule}). Each row: the mean over n seeds of ` +
    `(the algorithm's final ${chosen.metric} − ${paired.reference}'s), pairing trials with the same seed and the same other swept values; ` +
    `${level} confidence interval by Student's t (t, n−1 dof); * the interval excludes 0 ` +
    `(${chosen.mode === "min" ? "lower" : "higher"} is better). As in comparison.md.`;
  const head = ["algorithm", ...paired.columns.map(keyName), "n", `mean difference`, `${level} CI`, "verdict"];
  const headRow = document.createElement("tr");
  head.forEach((text, i) => {
    const th = document.createElement("th");
    th.textContent = text;
    if (i <= paired.columns.length) th.className = "text";
    headRow.appendChild(th);
  });
  const rows = chosen.rows.map((row) => {
    const tr = document.createElement("tr");
    tr.dataset.algorithm = row.algorithm;
    tr.dataset.column = row.column;
    tr.dataset.verdict = row.verdict || "";
    const ci = row.ci_low === null ? "–" : `[${fmtDifference(row.ci_low, chosen.metric)}, ${fmtDifference(row.ci_high, chosen.metric)}]`;
    const cells = [
      { text: row.algorithm, cls: "text" },
      ...paired.columns.map((k) => ({ text: fmt(row.values[k]), cls: "text" })),
      { text: `${row.n}${row.unpaired ? ` (${row.unpaired} unpaired)` : ""}` },
      { text: fmtDifference(row.mean_difference, chosen.metric), cls: "num" },
      { text: ci, cls: "num" },
      { text: pairedVerdict(row), cls: row.significant ? (row.verdict === "better" ? "paired-better" : "paired-worse") : "" },
    ];
    cells.forEach((cell) => {
      const td = document.createElement("td");
      td.textContent = cell.text;
      if (cell.cls) td.className = cell.cls;
      tr.appendChild(td);
    });
    return tr;
  });
  $("paired-table").tHead.replaceChildren(headRow);
  $("paired-table").tBodies[0].replaceChildren(...rows);
  section.hidden = false;
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

function brushedIds(dims) {
  // the trials (state.brushTrials, in the order of the axes' values) inside every brushed range, or null when nothing is brushed
  const ranged = dims.filter((d) => d.constraintrange && d.constraintrange.length);
  if (!ranged.length) return null;
  const inside = (v, range) => (Array.isArray(range[0]) ? range : [range]).some(([low, high]) => v >= low && v <= high);
  return new Set(state.brushTrials.filter((_, i) => ranged.every((d) => inside(d.values[i], d.constraintrange))));
}

function renderParams(ov) {
  const valueKey = $("value-kind").value;
  const label = `${valueKey === "best_metric" ? "best" : "final"} ${ov.metric}`;
  const trials = ov.trials.filter((t) => isNum(t[valueKey]));
  const empty = $("params-empty");
  const scatters = $("scatter-plots");
  if (!ov.swept_keys.length || !trials.length) {
    purgePlot($("parcoords-plot"));
    state.brushRanges = {};
    if (state.brushed !== null) { state.brushed = null; applyFilter(); }
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
  dims.forEach((dim) => { if (state.brushRanges[dim.label]) dim.constraintrange = state.brushRanges[dim.label]; });  // kept across updates
  state.brushTrials = trials.map((t) => t.trial_id);
  const brushed = brushedIds(dims);
  if (JSON.stringify(brushed && [...brushed]) !== JSON.stringify(state.brushed && [...state.brushed])) { state.brushed = brushed; applyFilter(); }
  Plotly.react("parcoords-plot", [{
    type: "parcoords",
    dimensions: dims,
    line: { color: metricValues, colorscale: "Viridis", reversescale: ov.mode === "min" },  // bright = good
  }], { margin: { l: 60, r: 60, t: MODEBAR_ROOM + 44, b: 20 } }, PLOT_CONFIG);  // the axis titles sit below the modebar
  const parcoords = $("parcoords-plot");
  if (!parcoords.dataset.brushing) {  // dragging along an axis selects a range: the table and curves keep the trials inside every range
    parcoords.dataset.brushing = "1";
    parcoords.on("plotly_restyle", () => {
      state.brushRanges = {};
      parcoords.data[0].dimensions.forEach((d) => { if (d.constraintrange && d.constraintrange.length) state.brushRanges[d.label] = d.constraintrange; });
      state.brushed = brushedIds(parcoords.data[0].dimensions);
      applyFilter();
    });
  }

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
    }, SMALL_PLOT_CONFIG);
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
// Hyperparameter importance, optimisation history and the timeline of trials

function valueLabel(ov) { return `${$("value-kind").value === "best_metric" ? "best" : "final"} ${ov.metric}`; }

function purgePlot(div) {
  // Plotly.purge drops the plot's event handlers: forget that they were added, so the next draw adds them again
  Plotly.purge(div);
  ["tooltips", "clicks", "brushing"].forEach((flag) => { delete div.dataset[flag]; });
}

function showPlot(id, shown, emptyText) {
  // the plot, or (when there is nothing to draw) its placeholder saying why
  $(`${id}-plot`).hidden = !shown;
  if (!shown) purgePlot($(`${id}-plot`));
  $(`${id}-empty`).hidden = shown;
  if (!shown) $(`${id}-empty`).textContent = emptyText;
}

async function renderImportance(ov) {
  const valueKey = $("value-kind").value;
  const key = JSON.stringify([ov.version, valueKey]);
  if (key === state.importanceKey) return;
  state.importanceKey = key;
  const note = $("importance-note");
  if (!ov.swept_keys.length) { note.textContent = ""; showPlot("importance", false, "No swept hyperparameters here."); return; }
  note.textContent = "computing…";
  let data;
  try {
    data = await getJSON(`/api/importance?${new URLSearchParams({ value: valueKey })}`);
  } catch (error) {
    if (key === state.importanceKey) state.importanceKey = null;  // asked again at the next refresh
    throw error;
  }
  if (key !== state.importanceKey) return;  // the folder or the value menu changed meanwhile
  if (!data.available) { note.textContent = ""; showPlot("importance", false, data.message); return; }
  note.textContent = `fANOVA (Optuna's FanovaImportanceEvaluator): the share of the ${valueLabel(ov)}'s variance that each key explains ` +
    `on its own, over ${data.num_trials} finished trials` +
    `${data.left_out ? `; ${data.left_out} left out (running, failed, early-stopped or measuring another quantity)` : ""}.` +
    `${data.num_trials < 10 ? " With fewer than 10 trials it is a rough guide." : ""}`;
  showPlot("importance", true);
  const rows = [...data.importances].reverse();  // Plotly draws the first bar at the bottom
  const div = $("importance-plot");
  div.style.height = `${Math.max(180, 90 + 34 * rows.length)}px`;
  await drawPlot(div, [{
    type: "bar", orientation: "h", x: rows.map((r) => r.importance), y: rows.map((r) => keyName(r.key)),
    text: rows.map((r) => `${(100 * r.importance).toFixed(1)}%`), textposition: "outside", cliponaxis: false,
    marker: { color: "#2f6fdb" }, hovertemplate: "%{y}: %{x:.1%} of the variance<extra></extra>",
  }], {
    margin: { l: 10, r: 50, t: MODEBAR_ROOM, b: 45 }, xaxis: { title: { text: "importance (fANOVA)" }, tickformat: ".0%", range: [0, 1.05] },
    yaxis: { automargin: true }, showlegend: false,
  }, SMALL_PLOT_CONFIG);
}

async function renderHeatmap(ov) {
  // the mean final value of a metric over two swept keys (/api/heatmap): one cell per pair of their values
  const keys = ov.kind === "sweeps" ? [] : ov.swept_keys;
  const h = state.heatmap;
  $("heatmap-section").hidden = keys.length < 2;
  if (keys.length < 2) { h.key = null; purgePlot($("heatmap-plot")); return; }
  const metrics = ov.round_metrics.length ? ov.round_metrics : [ov.metric];
  if (!keys.includes(h.x)) h.x = keys[0];
  if (!keys.includes(h.y) || h.y === h.x) h.y = keys.find((k) => k !== h.x);
  if (!metrics.includes(h.metric)) h.metric = metrics.includes(ov.metric) ? ov.metric : metrics[0];
  setMenu($("heatmap-x"), keys, h.x, keyName);
  setMenu($("heatmap-y"), keys, h.y, keyName);
  setMenu($("heatmap-metric"), metrics, h.metric);
  const key = JSON.stringify([ov.version, h.x, h.y, h.metric]);
  if (key === h.key) return;
  h.key = key;
  let data;
  try {
    data = await getJSON(`/api/heatmap?${new URLSearchParams({ x: h.x, y: h.y, metric: h.metric })}`);
  } catch (error) {
    if (key === h.key) h.key = null;  // asked again at the next refresh
    throw error;
  }
  if (key !== h.key) return;  // the folder or a menu changed meanwhile
  const trials = data.count.flat().reduce((a, b) => a + b, 0);
  $("heatmap-note").textContent = `Each cell: the mean final ${data.metric} (at each trial's last round that reported it) of the ` +
    `trials with those values of ${data.x} and ${data.y}, over every other swept key (e.g. seed); hover for how many. ` +
    `${trials} trials` + (data.left_out ? `; ${data.left_out} left out (failed, stopped, measuring another quantity or not reporting ${data.metric}).` : ".");
  showPlot("heatmap", trials > 0, `No finished or running trial reports ${data.metric} yet.`);
  if (!trials) return;
  const div = $("heatmap-plot");
  div.style.height = `${Math.max(260, 130 + 40 * data.y_labels.length)}px`;
  await drawPlot(div, [{
    type: "heatmap", x: data.x_labels, y: data.y_labels, z: data.mean, customdata: data.count,
    colorscale: "Viridis", hoverongaps: false, texttemplate: "%{z:.3g}", colorbar: { title: { text: data.metric, side: "right" } },
    hovertemplate: `${keyName(data.x)}: %{x}<br>${keyName(data.y)}: %{y}<br>mean final ${data.metric}: %{z:.4g}` +
      "<br>over %{customdata} trial(s)<extra></extra>",
  }], {
    margin: { l: 10, r: 10, t: MODEBAR_ROOM, b: 45 },
    xaxis: { title: { text: keyName(data.x) }, type: "category", automargin: true },
    yaxis: { title: { text: keyName(data.y) }, type: "category", automargin: true },
  }, SMALL_PLOT_CONFIG);
}

function renderHistory(ov) {
  // each finished trial's value in the order the trials ended, and the best so far (Optuna's optimisation history)
  const valueKey = $("value-kind").value;
  const done = ov.trials.filter((t) => FINISHED.has(t.status) && t.metric_name === ov.metric && isNum(t[valueKey]));
  const dated = done.length > 0 && done.every((t) => isNum(t.ended_at));
  const ordered = dated ? [...done].sort((a, b) => a.ended_at - b.ended_at) : done;  // else trials.parquet's order: as trials were created
  if (!ordered.length) { $("history-note").textContent = ""; showPlot("history", false, `No trial has finished with ${ov.metric} yet.`); return; }
  $("history-note").textContent = `${valueLabel(ov)} of each finished trial ${dated ? "in the order the trials ended" : "in the order trials.parquet lists them (no run directories here to date them)"}` +
    ` and the best so far (${ov.mode === "min" ? "lowest" : "highest"}); click a point for its run.`;
  showPlot("history", true);
  const s = sign(ov);
  let best = null;
  const bestSoFar = ordered.map((t) => (best = best === null || s * t[valueKey] > s * best ? t[valueKey] : best));
  const x = ordered.map((_, i) => i + 1);
  const point = (statuses, name, color, symbol) => {
    const members = ordered.map((t, i) => [t, i]).filter(([t]) => statuses.includes(t.status));
    return {
      type: "scatter", mode: "markers", name, x: members.map(([, i]) => x[i]), y: members.map(([t]) => t[valueKey]),
      customdata: members.map(([t]) => t.trial_id), text: members.map(([t]) => t.label), marker: { color, size: 8, symbol },
      hovertemplate: `%{text} (%{customdata})<br>trial %{x} to finish<br>${valueLabel(ov)} %{y:.4g}<extra></extra>`,
    };
  };
  const traces = [  // the line first, so the points are drawn over it
    { type: "scatter", mode: "lines", name: "best so far", x, y: bestSoFar, line: { shape: "hv", color: "#e0a100", width: 2.5 }, hoverinfo: "skip" },
    point(["TERMINATED"], "finished trial", "#2f6fdb", "circle"),
    point(["STOPPED_EARLY"], "early-stopped trial", "#8d6e63", "diamond"),
  ].filter((t) => t.x.length);
  const div = $("history-plot");
  drawPlot(div, traces, {
    margin: { l: 55, r: 10, t: MODEBAR_ROOM, b: 45 },
    xaxis: { title: { text: dated ? "trials, in the order they ended" : "trials, in table order" }, ...(x.length <= 12 ? { dtick: 1 } : {}) },
    yaxis: { title: { text: valueLabel(ov) }, tickformat: ".3~g" },
    legend: { orientation: "h", x: 0, xanchor: "left", y: 1, yanchor: "bottom" },  // above the plot, left: clear of the modebar
    uirevision: "history",
  }, SMALL_PLOT_CONFIG).then(() => {
    if (div.dataset.clicks) return;
    div.dataset.clicks = "1";
    div.on("plotly_click", (event) => { const id = event.points[0] && event.points[0].customdata; if (id) openRun(id); });
  }).catch(showError);
}

function localTime(seconds) {
  // a time as Plotly's date axes read it (they know no time zones): the browser's local time, to the millisecond
  const d = new Date(seconds * 1000);
  const two = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${two(d.getMonth() + 1)}-${two(d.getDate())} ${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}.${String(d.getMilliseconds()).padStart(3, "0")}`;
}

function resourcesText(resources) {
  return resources ? Object.entries(resources).map(([name, amount]) => `${fmt(amount)} ${name}`).join(", ") : "resources not recorded";
}

function heldOverTime(trials, name, now) {
  // a step curve of how much of resource `name` the trials held: +amount at each start, -amount at each end;
  // trials still running hold theirs up to now
  const holders = trials.filter((t) => t.resources && t.resources[name]);
  const events = holders.flatMap((t) => [[t.started_at, t.resources[name]], ...(isNum(t.ended_at) ? [[t.ended_at, -t.resources[name]]] : [])])
    .sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  let held = 0;
  const x = [], y = [];
  events.forEach(([time, change]) => { held += change; x.push(localTime(time)); y.push(Math.max(0, held)); });
  if (holders.some((t) => !isNum(t.ended_at))) { x.push(localTime(now)); y.push(Math.max(0, held)); }
  return { x, y };
}

function renderTimeline(ov) {
  const dated = ov.trials.filter((t) => isNum(t.started_at)).sort((a, b) => a.started_at - b.started_at || a.trial_id.localeCompare(b.trial_id));
  if (!dated.length) {
    $("timeline-note").textContent = "";
    showPlot("timeline", false, ov.trials.length ? "No run directory here records when its trial started (e.g. a sweep copied without trials/)." : "No trials yet.");
    return;
  }
  showPlot("timeline", true);
  const now = Date.now() / 1000;
  const end = (t) => (isNum(t.ended_at) ? t.ended_at : Math.max(now, t.started_at));
  const traces = STATUS_GROUPS.map((group) => {
    const members = dated.filter((t) => group.statuses.includes(t.status));
    return {
      type: "bar", orientation: "h", name: group.name, y: members.map((t) => t.trial_id), base: members.map((t) => localTime(t.started_at)),
      x: members.map((t) => 1000 * (end(t) - t.started_at)), marker: { color: group.color }, yaxis: "y",
      customdata: members.map((t) => [t.label, t.status, fmtSeconds(end(t) - t.started_at), resourcesText(t.resources), localTime(t.started_at).slice(11, 19)]),
      hovertemplate: "%{y}: %{customdata[0]}<br>%{customdata[1]} · started %{customdata[4]} · %{customdata[2]}<br>%{customdata[3]}<extra></extra>",
    };
  }).filter((t) => t.y.length);
  const resourceNames = ["CPU", "GPU"].filter((name) => dated.some((t) => t.resources && t.resources[name]));
  resourceNames.forEach((name, index) => {
    const curve = heldOverTime(dated, name, now);
    traces.push({ type: "scatter", mode: "lines", name: `${name}s held`, x: curve.x, y: curve.y, yaxis: "y2", line: { shape: "hv", color: ["#455a64", "#6a1b9a"][index] } });
  });
  const barsHeight = 40 + 24 * dated.length;
  const resourcesHeight = resourceNames.length ? 150 : 0;
  const div = $("timeline-plot");
  div.style.height = `${Math.min(1200, barsHeight + resourcesHeight + MODEBAR_ROOM + 60)}px`;
  const split = resourcesHeight / (barsHeight + resourcesHeight);
  $("timeline-note").textContent = "Each bar runs from a trial's start (its run directory's config.yaml) to its end (summary.json, or its last file for one that failed or was stopped); " +
    `running trials reach now.${resourceNames.length ? " Below: the resources the trials held (their placement groups, placement.json)." : ""}`;
  drawPlot(div, traces, {
    margin: { l: 10, r: 10, t: MODEBAR_ROOM, b: 40 }, barmode: "overlay", bargap: 0.3,
    xaxis: { type: "date", anchor: resourceNames.length ? "y2" : "y", title: { text: "wall time" } },
    yaxis: { type: "category", categoryorder: "array", categoryarray: dated.map((t) => t.trial_id), autorange: "reversed", automargin: true,
      domain: [resourceNames.length ? split + 0.06 : 0, 1] },
    ...(resourceNames.length ? { yaxis2: { domain: [0, split], title: { text: "held" }, rangemode: "tozero", anchor: "x" } } : {}),
    legend: { orientation: "h", x: 0, xanchor: "left", y: 1, yanchor: "bottom" },
    uirevision: "timeline",
  }, PLOT_CONFIG).catch(showError);
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

function curvePlot(divId, curves, names, title, yTitle = null) {
  // the run's curves of `names`, against the round or (state.xAxis) the simulated clock
  const shown = names.filter((n) => curves[n]);
  const simTime = useSimTime(shown.map((n) => curves[n]));
  const traces = shown.map((n) => ({
    type: "scatter", mode: curves[n].round.length <= 60 ? "lines+markers" : "lines", name: n,
    x: simTime ? curves[n].sim_time : curves[n].round, y: curves[n].value, marker: { size: 4 }, customdata: curves[n].round,
    hovertemplate: `${n} %{y:.4g}<br>round %{customdata}${simTime ? " · sim_time %{x:.4g} s" : ""}<extra></extra>`,
  }));
  // the title on the left of the modebar's row, the legend under the plot: neither lies under the modebar
  Plotly.react(divId, traces, {
    margin: { l: 55, r: 10, t: MODEBAR_ROOM, b: 80 }, title: { text: title, font: { size: 13 }, x: 0.01, xanchor: "left", y: 1, yanchor: "top", pad: { t: 8 } },
    xaxis: xAxisOf(traces, simTime), yaxis: { ...(yTitle ? { title: { text: yTitle } } : {}), tickformat: yTitle === "bytes" ? ".3~s" : "" },
    showlegend: true, legend: { orientation: "h", x: 0, xanchor: "left", y: -0.3, yanchor: "top" },
    uirevision: `${title}/${simTime}`,
  }, SMALL_PLOT_CONFIG);
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
  xAxisAvailable.run = Boolean(view.curves[SIM_TIME]);
  showXAxisChoice(xAxisAvailable);
  // the run's task's headline (summary.json's, else the overview's metric: test_accuracy, test_rmse...), global and personal
  const headline = ((view.summary && view.summary.headline) || state.overview.metric || "test_accuracy").replace(/^test_/, "");
  const headlines = names.filter((n) => n.includes(headline) && !/_std$/.test(n));
  const loss = names.filter((n) => /loss/.test(n));
  curvePlot("run-accuracy-plot", view.curves, headlines.length ? headlines : names.slice(0, 1), headline);
  curvePlot("run-loss-plot", view.curves, loss, "loss");
  // privacy.mechanism: the ε spent so far (docs/guide/privacy.md); shown before drawing, so the plot gets its width
  const privacy = $("run-privacy-plot");
  privacy.hidden = !view.curves.dp_epsilon;
  if (view.curves.dp_epsilon) curvePlot("run-privacy-plot", view.curves, ["dp_epsilon"], "privacy spent: ε at the run's δ");
  else Plotly.purge(privacy);

  renderSystems(view.curves);
  renderClients(view.clients);
  renderClientSummary(view.client_summary, view.participation);
  renderLog(trialId, trial).catch(showError);

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
      margin: { l: 20, r: 10, t: MODEBAR_ROOM, b: 40 },
      title: { text: `${name}, round ${clients.round}`, font: { size: 13 }, x: 0.01, xanchor: "left", y: 1, yanchor: "top", pad: { t: 8 } },
      xaxis: { title: { text: `${name} per client` } }, yaxis: { showticklabels: false }, showlegend: false,
    }, SMALL_PLOT_CONFIG);
  });
}

function renderSystems(curves) {
  // per round: clients selected / aggregated / dropped / late, bytes down and up, FedBuff's staleness
  const present = SYSTEMS_PLOTS.filter((plot) => plot.names.some((n) => curves[n]));
  $("run-systems").hidden = present.length === 0;
  SYSTEMS_PLOTS.forEach((plot) => {
    const div = $(plot.div);
    div.hidden = !present.includes(plot);
    if (!div.hidden) curvePlot(plot.div, curves, plot.names, plot.title, plot.y);
    else Plotly.purge(div);
  });
}

function summaryPlot(div, name, summary) {
  // one client metric across the clients of each round: its median, the interquartile range and the range,
  // against the round or (state.xAxis) the simulated clock
  const simTime = useSimTime([summary]);
  const x = simTime ? summary.sim_time : summary.round;
  const band = (low, high, color, label) => [
    { type: "scatter", mode: "lines", x, y: low, line: { width: 0, color }, hoverinfo: "skip", showlegend: false, legendgroup: label },
    { type: "scatter", mode: "lines", x, y: high, line: { width: 0, color }, fill: "tonexty", fillcolor: color, name: label, legendgroup: label, hoverinfo: "skip" },
  ];
  const traces = [
    ...band(summary.min, summary.max, "rgba(47,111,219,0.12)", "min–max"),
    ...band(summary.q25, summary.q75, "rgba(47,111,219,0.3)", "quartiles"),
    { type: "scatter", mode: x.length <= 60 ? "lines+markers" : "lines", x, y: summary.median, name: "median", line: { color: "#2f6fdb", width: 2 },
      marker: { size: 4 }, customdata: summary.round.map((round, i) => [round, summary.count[i]]),
      hovertemplate: `round %{customdata[0]}${simTime ? " · sim_time %{x:.4g} s" : ""}: median ${name} %{y:.4g} over %{customdata[1]} clients<extra></extra>` },
  ];
  Plotly.react(div, traces, {
    margin: { l: 55, r: 10, t: MODEBAR_ROOM, b: 80 },
    title: { text: `${name} across clients`, font: { size: 13 }, x: 0.01, xanchor: "left", y: 1, yanchor: "top", pad: { t: 8 } },
    xaxis: xAxisOf([{ x }], simTime), yaxis: { tickformat: ".3~g" }, showlegend: true,
    legend: { orientation: "h", x: 0, xanchor: "left", y: -0.3, yanchor: "top" }, uirevision: `${name}/${simTime}`,
  }, SMALL_PLOT_CONFIG);
}

function renderClientSummary(summary, participation) {
  // the run's client_summary: each client metric over the rounds, and how many rounds each client took part in
  const container = $("run-client-summary");
  const names = Object.keys(summary || {});
  const hasParticipation = Boolean(participation && participation.clients_seen);
  const wanted = [...names.map((n) => `summary:${n}`), ...(hasParticipation ? ["participation"] : [])];
  $("client-summary-title").hidden = wanted.length === 0;
  [...container.children].forEach((div) => { if (!wanted.includes(div.dataset.plot)) { Plotly.purge(div); div.remove(); } });
  wanted.forEach((key) => {  // every div before the first plot, so each gets its final width
    if (container.querySelector(`[data-plot="${CSS.escape(key)}"]`)) return;
    const div = document.createElement("div");
    div.className = "plot small summary-plot";
    div.dataset.plot = key;
    div.id = `run-${key.replace(/[^A-Za-z0-9_-]/g, "-")}-plot`;
    container.appendChild(div);
  });
  names.forEach((name) => summaryPlot(container.querySelector(`[data-plot="${CSS.escape(`summary:${name}`)}"]`), name, summary[name]));
  if (hasParticipation) {
    const total = participation.num_clients;
    $("client-summary-note").textContent = `(${participation.clients_seen} of ${total ?? "?"} clients took part in some round)`;
    Plotly.react(container.querySelector('[data-plot="participation"]'), [{
      type: "bar", x: participation.rounds, y: participation.clients, marker: { color: "#8d6e63" },
      hovertemplate: "%{y} clients took part in %{x} rounds<extra></extra>",
    }], {
      margin: { l: 55, r: 10, t: MODEBAR_ROOM, b: 45 },
      title: { text: "participation", font: { size: 13 }, x: 0.01, xanchor: "left", y: 1, yanchor: "top", pad: { t: 8 } },
      xaxis: { title: { text: "rounds a client took part in" }, ...(participation.rounds.length <= 20 ? { dtick: 1 } : {}) },
      yaxis: { title: { text: "clients" } }, showlegend: false, bargap: 0.1,
    }, SMALL_PLOT_CONFIG);
  } else {
    $("client-summary-note").textContent = "";
  }
}

function fmtBytes(bytes) {
  return bytes < 1024 ? `${bytes} B` : bytes < 1024 ** 2 ? `${(bytes / 1024).toFixed(1)} KiB` : `${(bytes / 1024 ** 2).toFixed(1)} MiB`;
}

async function renderLog(trialId, trial) {
  // the end of the trial's log.txt, kept scrolled to its end while it grows (unless the reader scrolled up)
  const log = await getJSON(`/api/log?${new URLSearchParams({ trial: trialId })}`);
  if (trialId !== state.runTrial) return;
  const pre = $("run-log");
  $("run-log-bar").hidden = !log.exists;
  pre.hidden = !log.exists;
  $("run-log-empty").hidden = log.exists;
  if (!log.exists) {
    $("run-log-note").textContent = "";
    $("run-log-empty").textContent = "No log.txt in this run directory: fedray tune writes one for each trial (fedray run prints its progress in its terminal).";
    state.runLogKey = null;
    return;
  }
  const failed = FAILED.has(trial.status);
  pre.classList.toggle("failed", failed);
  $("run-log-note").textContent = `(${log.truncated ? `its last ${fmtBytes(log.text.length)} of ` : ""}${fmtBytes(log.size)}` +
    `${LOG_REFRESH.has(trial.status) ? "; follows the trial while it runs" : ""}${failed ? "; the trial failed: its traceback is at the end" : ""})`;
  $("run-log-file").href = `/api/file?${new URLSearchParams({ trial: trialId, name: "log.txt", v: log.size })}`;
  const key = `${trialId}/${log.size}/${log.text.length}`;
  if (key === state.runLogKey) return;
  const following = state.runLogKey === null || !state.runLogKey.startsWith(`${trialId}/`) || pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8;
  state.runLogKey = key;
  pre.textContent = log.text;
  if (following) pre.scrollTop = pre.scrollHeight;
}

// ---------------------------------------------------------------------------------------------
// A folder of sweeps: the sweeps ticked, side by side

function sweepColor(ov, name) { return PALETTE[ov.sweeps.findIndex((s) => s.name === name) % PALETTE.length]; }

function renderSweeps(ov) {
  document.body.dataset.kind = ov.kind;
  $("sweeps-section").hidden = ov.kind !== "sweeps";
  if (ov.kind !== "sweeps") return;
  const names = ov.sweeps.map((s) => s.name);
  if (state.compare.selected === null) state.compare.selected = new Set(names.slice(0, PALETTE.length));
  state.compare.selected.forEach((name) => { if (!names.includes(name)) state.compare.selected.delete(name); });
  $("sweeps-count").textContent = `(${names.length})`;
  const head = ["", "", "sweep", "status", "trials", "metric", "best", "best trial"];
  const headRow = document.createElement("tr");
  head.forEach((text, i) => { const th = document.createElement("th"); th.textContent = text; if (i >= 2) th.className = "text"; headRow.appendChild(th); });
  $("sweeps-table").tHead.replaceChildren(headRow);
  $("sweeps-table").tBodies[0].replaceChildren(...ov.sweeps.map((sweep) => {
    const tr = document.createElement("tr");
    tr.dataset.sweep = sweep.name;
    const box = document.createElement("input");
    box.type = "checkbox";
    box.checked = state.compare.selected.has(sweep.name);
    box.title = "compare this sweep";
    box.addEventListener("change", () => {
      if (box.checked) state.compare.selected.add(sweep.name); else state.compare.selected.delete(sweep.name);
      renderComparison(state.overview).catch(showError);
    });
    const swatch = document.createElement("span");
    swatch.style.background = sweepColor(ov, sweep.name);
    const counts = Object.entries(sweep.counts).sort().map(([k, v]) => `${v} ${k.toLowerCase()}`).join(", ");
    const cells = [box, swatch, sweep.name, sweep.status || "–", `${sweep.num_trials}${counts ? ` (${counts})` : ""}`, `${sweep.metric} (${sweep.mode})`,
      fmt(sweep.best_metric), sweep.best_label ? `${sweep.best_label} (${sweep.best_trial})` : "–"];
    cells.forEach((cell, i) => {
      const td = document.createElement("td");
      td.className = i === 1 ? "swatch" : i >= 2 ? "text" : "";
      if (cell instanceof Node) td.appendChild(cell); else td.textContent = cell;
      tr.appendChild(td);
    });
    tr.addEventListener("click", (event) => { if (event.target !== box) box.click(); });
    return tr;
  }));
  renderComparison(ov).catch(showError);
}

async function renderComparison(ov) {
  const chosen = ov.sweeps.filter((s) => state.compare.selected.has(s.name));
  const metrics = [...new Set(chosen.flatMap((s) => s.round_metrics))];
  if (!state.compare.metric || !metrics.includes(state.compare.metric)) state.compare.metric = chosen.length ? chosen[0].metric : null;
  setMenu($("compare-metric"), metrics, state.compare.metric);
  const key = JSON.stringify([ov.version, chosen.map((s) => s.name), state.compare.metric, state.xAxis]);
  if (key === state.compare.key) return;
  state.compare.key = key;
  const empty = $("compare-empty");
  if (chosen.length < 2) {
    ["compare-best-plot", "compare-curves-plot"].forEach((id) => { purgePlot($(id)); $(id).hidden = true; });
    empty.textContent = ov.sweeps.length < 2 ? "Only one sweep here: open it with fedray dashboard to see its trials." : "Tick two or more sweeps to compare them.";
    empty.hidden = false;
    return;
  }
  const params = new URLSearchParams({ metric: state.compare.metric });
  chosen.forEach((s) => params.append("sweep", s.name));
  const data = await getJSON(`/api/compare?${params}`);
  if (key !== state.compare.key) return;  // the ticks changed meanwhile
  empty.hidden = true;
  ["compare-best-plot", "compare-curves-plot"].forEach((id) => { $(id).hidden = false; });

  // best value of each trial (of its sweep's own quantity, failed trials left out), one column of points per sweep
  const best = data.sweeps.flatMap((sweep) => {
    const color = sweepColor(ov, sweep.name);
    const counted = sweep.trials.filter((t) => t.metric_name === sweep.metric && !FAILED.has(t.status) && isNum(t.best_metric));
    const top = counted.find((t) => t.trial_id === sweep.best_trial);
    const name = `${sweep.name} (${sweep.metric})`;
    return [
      { type: "box", name, x: counted.map(() => name), y: counted.map((t) => t.best_metric), boxpoints: "all", jitter: 0.5, pointpos: 0,
        text: counted.map((t) => `${t.label} (${t.trial_id})`), marker: { color, size: 7, opacity: 0.8 }, line: { color }, fillcolor: rgba(color, 0.1),
        hovertemplate: `${sweep.name}<br>%{text}<br>best ${sweep.metric} %{y:.4g}<extra></extra>` },
      ...(top ? [{ type: "scatter", mode: "markers", name: `★ ${sweep.name}`, x: [name], y: [top.best_metric], showlegend: false,
        marker: { symbol: "star", size: 15, color: "#e0a100", line: { color, width: 1.5 } }, hovertemplate: `best of ${sweep.name}: ${top.label} %{y:.4g}<extra></extra>` }] : []),
    ];
  });
  await drawPlot("compare-best-plot", best, {
    margin: { l: 55, r: 10, t: MODEBAR_ROOM + 10, b: 60 }, showlegend: false,
    title: { text: "best value of each trial", font: { size: 13 }, x: 0.01, xanchor: "left", y: 1, yanchor: "top", pad: { t: 8 } },
    yaxis: { title: { text: `best ${[...new Set(data.sweeps.map((s) => s.metric))].join(" / ")}` }, tickformat: ".3~g" }, xaxis: { type: "category" },
  }, SMALL_PLOT_CONFIG);

  // the curves of each sweep's best trials, in its colour; one legend entry per sweep toggles all of its curves
  const allCurves = data.sweeps.flatMap((sweep) => sweep.compared_trials.map((id) => sweep.curves[id]).filter(Boolean));
  const simTime = useSimTime(allCurves);
  xAxisAvailable.compare = allCurves.some((c) => Array.isArray(c.sim_time));
  showXAxisChoice(xAxisAvailable);
  const traces = data.sweeps.flatMap((sweep) => {
    const color = sweepColor(ov, sweep.name);
    const labels = new Map(sweep.trials.map((t) => [t.trial_id, t.label]));
    return sweep.compared_trials.filter((id) => sweep.curves[id]).map((id, index) => {
      const curve = sweep.curves[id];
      return {
        type: "scatter", mode: curve.round.length <= 60 ? "lines+markers" : "lines", name: sweep.name, legendgroup: sweep.name, showlegend: index === 0,
        meta: `${sweep.name}: ${labels.get(id)}`, x: simTime ? curve.sim_time : curve.round, y: curve.value, customdata: curve.round,
        line: { color, width: id === sweep.best_trial ? 3 : 1.2 }, marker: { size: 3, color }, opacity: id === sweep.best_trial ? 1 : 0.6,
        hovertemplate: `${sweep.name}<br>${labels.get(id)} (${id})<br>round %{customdata}${simTime ? " · sim_time %{x:.4g} s" : ""}<br>${sweep.curve_metric} %{y:.4g}<extra></extra>`,
      };
    });
  });
  const metricsDiffer = new Set(data.sweeps.map((s) => s.metric)).size > 1;
  $("compare-note").textContent = metricsDiffer ? "the sweeps optimise different metrics: their best values do not compare" : "";
  await drawPlot("compare-curves-plot", traces, {
    margin: { l: 55, r: 10, t: MODEBAR_ROOM + 10, b: 90 }, xaxis: xAxisOf(traces, simTime),
    title: { text: `${state.compare.metric} of each sweep's best trials`, font: { size: 13 }, x: 0.01, xanchor: "left", y: 1, yanchor: "top", pad: { t: 8 } },
    yaxis: { title: { text: state.compare.metric }, tickformat: ".3~g" }, legend: { orientation: "h", x: 0, xanchor: "left", y: -0.22, yanchor: "top" },
    uirevision: `compare/${state.compare.metric}/${simTime}`,
  }, SMALL_PLOT_CONFIG);
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
  renderSweeps(ov);
  xAxisAvailable.curves = ov.round_metrics.includes(SIM_TIME);
  showXAxisChoice(xAxisAvailable);
  state.filter = parseFilter(state.filter.text, ov);  // the columns a filter names may have changed
  updateSelection(ov);
  renderTable(ov);
  renderMetricMenu(ov);
  renderGroupControl(ov);
  renderPaired(ov);
  renderParams(ov);
  renderBest(ov);
  renderHistory(ov);
  renderTimeline(ov);
  renderHeatmap(ov).catch(showError);
  renderImportance(ov).catch(showError);  // not awaited: the first fit (importing Optuna) takes seconds
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
      else if (state.runTrial !== null && state.overview) {  // a running trial's log grows between its reports
        const trial = state.overview.trials.find((t) => t.trial_id === state.runTrial);
        if (trial && LOG_REFRESH.has(trial.status)) await renderLog(state.runTrial, trial);
      }
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
    state.selected = new Set(how === "all" ? visibleTrials(ov).map((t) => t.trial_id) : how === "top" ? topTrials(ov, TOP_N) : []);
    renderTable(ov);
    renderCurves(true).catch(showError);
  }));
  $("curve-metric").addEventListener("change", (e) => { state.curveMetric = e.target.value; renderCurves(true).catch(showError); });
  $("compare-metric").addEventListener("change", (e) => { state.compare.metric = e.target.value; renderComparison(state.overview).catch(showError); });
  document.querySelectorAll("select.x-axis").forEach((select) => select.addEventListener("change", (e) => {
    state.xAxis = e.target.value;
    showXAxisChoice(xAxisAvailable);
    if (!state.overview) return;
    if (state.overview.kind === "sweeps") renderComparison(state.overview).catch(showError);
    else { renderCurves(true).catch(showError); renderRun().catch(showError); }
  }));
  $("value-kind").addEventListener("change", () => {
    if (!state.overview) return;
    renderParams(state.overview);
    renderHistory(state.overview);
    renderImportance(state.overview).catch(showError);
  });
  ["x", "y", "metric"].forEach((part) => $(`heatmap-${part}`).addEventListener("change", (e) => {
    const h = state.heatmap, other = { x: "y", y: "x" }[part];
    if (other && e.target.value === h[other]) h[other] = h[part];  // picking the other axis's key swaps the two
    h[part] = e.target.value;
    if (state.overview) renderHeatmap(state.overview).catch(showError);
  }));
  $("trials-filter").addEventListener("input", (e) => {
    if (!state.overview) return;
    state.filter = parseFilter(e.target.value, state.overview);
    applyFilter();
  });
  $("export-csv").addEventListener("click", exportCsv);
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
