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
  { key: "round", label: "round" },
  { key: "latest_metric", label: "latest" },
  { key: "best_metric", label: "best" },
  { key: "best_round", label: "best round" },
  { key: "wall_time_s", label: "wall time" },
];

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

function cellText(trial, key, overview) {
  if (key === "_mark") return trial.trial_id === overview.best_trial ? "★" : "";
  if (key === "wall_time_s") return fmtSeconds(trial[key]);
  return fmt(trial[key]);
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
  return overview.trials
    .filter((t) => isNum(t.best_metric))
    .sort((a, b) => s * (b.best_metric - a.best_metric))
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
  status.className = `badge ${ov.status || ""}`;
  const counts = {};
  ov.trials.forEach((t) => { counts[t.status] = (counts[t.status] || 0) + 1; });
  const parts = [`${ov.trials.length}${ov.num_trials ? ` / ${ov.num_trials}` : ""} trials`];
  Object.entries(counts).forEach(([k, v]) => parts.push(`${v} ${String(k).toLowerCase()}`));
  parts.push(`metric ${ov.metric} (${ov.mode})`);
  if (ov.started_at) parts.push(`started ${ov.started_at}`);
  $("summary").textContent = parts.join(" · ");
  const ray = $("ray-link");
  if (ov.ray_dashboard_url) { ray.href = ov.ray_dashboard_url; ray.hidden = false; } else { ray.hidden = true; }
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
  return [...FIXED_COLUMNS_BEFORE, ...ov.swept_keys.map((k) => ({ key: k, label: k, swept: true })), ...FIXED_COLUMNS_AFTER];
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
      if (c.cls) th.classList.add(c.cls);
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
      if (c.key === "status") {
        td.className = `text status-${trial.status}`;
        td.title = trial.error || "";
      }
    });
    tr.classList.toggle("best", trial.trial_id === ov.best_trial);
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

async function renderCurves(force = false) {
  const ov = state.overview;
  const ids = ov.trials.map((t) => t.trial_id).filter((id) => state.selected.has(id));
  const key = JSON.stringify([state.version, state.curveMetric, ids]);
  if (!force && key === state.lastCurvesKey) return;
  state.lastCurvesKey = key;
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
  const traces = ids.filter((id) => data.curves[id]).map((id) => ({
    type: "scatter",
    mode: data.curves[id].round.length <= 60 ? "lines+markers" : "lines",
    name: id === ov.best_trial ? `★ ${id}` : id,
    x: data.curves[id].round,
    y: data.curves[id].value,
    line: { width: id === ov.best_trial ? 3 : 1.5 },
    marker: { size: 4 },
    hovertemplate: `${id}<br>round %{x}<br>${data.metric} %{y:.4g}<extra></extra>`,
  }));
  empty.hidden = traces.length > 0;
  empty.textContent = `The selected trials have not reported ${data.metric} yet.`;
  Plotly.react("curves-plot", traces, {
    margin: { l: 55, r: 10, t: 10, b: 40 },
    xaxis: roundAxis(traces),
    yaxis: { title: { text: data.metric } },
    legend: { font: { size: 11 } },
    showlegend: true,
    uirevision: data.metric,  // keep the user's zoom across live updates
  }, { displaylogo: false, responsive: true });
}

// ---------------------------------------------------------------------------------------------
// Parallel coordinates and one scatter per swept key

function axisFor(key, values) {
  // Numbers on a linear (or, spanning two decades or more, log10) axis; anything else as categories.
  const present = values.filter((v) => v !== null && v !== undefined);
  if (present.length && present.every(isNum) && new Set(present).size > 1) {  // one value: a category, not a range
    const positive = present.every((v) => v > 0);
    const log = positive && Math.max(...present) / Math.min(...present) >= 100;
    return { log, numeric: true, label: log ? `log10(${key})` : key, map: (v) => (isNum(v) ? (log ? Math.log10(v) : v) : null) };
  }
  const categories = [...new Set(present.map(String))].sort((a, b) => a.localeCompare(b, undefined, { numeric: true }));
  return { numeric: false, label: key, categories, map: (v) => (v === null || v === undefined ? null : categories.indexOf(String(v))) };
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
  const dims = ov.swept_keys.map((key) => {
    const axis = axisFor(key, trials.map((t) => t[key]));
    const dim = { label: axis.label, values: trials.map((t) => axis.map(t[key])) };
    if (!axis.numeric) Object.assign(dim, { tickvals: axis.categories.map((_, i) => i), ticktext: axis.categories, range: [-0.5, axis.categories.length - 0.5] });
    return dim;
  });
  const metricValues = trials.map((t) => t[valueKey]);
  dims.push({ label, values: metricValues });
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
    const axis = axisFor(key, trials.map((t) => t[key]));
    const x = trials.map((t) => (axis.numeric ? t[key] : String(t[key])));
    const best = trials.findIndex((t) => t.trial_id === ov.best_trial);
    const traces = [{
      type: "scatter", mode: "markers", name: "trials", x, y: metricValues, text: trials.map((t) => t.trial_id),
      marker: { size: 7, opacity: 0.75 }, hovertemplate: `%{text}<br>${key} %{x}<br>${label} %{y:.4g}<extra></extra>`,
    }];
    if (best >= 0) traces.push({ type: "scatter", mode: "markers", name: "best", x: [x[best]], y: [metricValues[best]], marker: { size: 14, symbol: "star", color: "#e0a100" }, hoverinfo: "skip" });
    Plotly.react(div, traces, {
      margin: { l: 50, r: 10, t: 10, b: 40 }, showlegend: false,
      xaxis: { title: { text: key }, type: axis.numeric ? (axis.log ? "log" : "linear") : "category" },
      yaxis: { title: { text: label } },
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
  const swept = ov.swept_keys.map((k) => `${k} = ${fmt(trial[k])}`).join(", ");
  summary.className = "";
  summary.textContent = `★ ${trial.trial_id}: best ${ov.metric} ${fmt(trial.best_metric)} at round ${fmt(trial.best_round)}` +
    ` (latest ${fmt(trial.latest_metric)})${swept ? ` with ${swept}` : ""}.`;
  const pre = $("best-config");
  const hasConfig = typeof ov.best_config === "string";
  if (hasConfig && pre.textContent !== ov.best_config) pre.textContent = ov.best_config;
  pre.hidden = !hasConfig;
  $("best-actions").hidden = !hasConfig;
  $("best-hint").hidden = !hasConfig;
  $("download-config").href = `/api/file?${new URLSearchParams({ trial: trial.trial_id, name: "config.yaml" })}`;
}

async function copyBestConfig() {
  const text = $("best-config").textContent;
  try {
    await navigator.clipboard.writeText(text);
  } catch (error) {  // no clipboard API (e.g. plain http on another host): select the text instead
    const range = document.createRange();
    range.selectNodeContents($("best-config"));
    window.getSelection().removeAllRanges();
    window.getSelection().addRange(range);
    document.execCommand("copy");
  }
  $("copy-status").textContent = "copied";
  setTimeout(() => { $("copy-status").textContent = ""; }, 2000);
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
  $("run-title").textContent = view.trial_id;
  renderMessages($("run-messages"), view.messages);
  $("run-placeholder").hidden = true;
  $("run-body").hidden = !view.found;
  if (!view.found) return;
  const trial = state.overview.trials.find((t) => t.trial_id === trialId) || {};
  const info = [`status ${trial.status || "?"}`, `round ${fmt(trial.round)}`, `directory ${view.run_dir || "(not here)"}`];
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
  state.version = ov.version;
  state.refreshMs = Math.max(500, 1000 * (ov.refresh_seconds || 2));
  if (ov.kind === "run" && ov.trials.length === 1 && state.runTrial === null) state.runTrial = ov.trials[0].trial_id;
  if (state.runTrial !== null && !ov.trials.some((t) => t.trial_id === state.runTrial)) state.runTrial = null;
  renderHeader(ov);
  renderMessages($("messages"), ov.messages);
  updateSelection(ov);
  renderTable(ov);
  renderMetricMenu(ov);
  renderParams(ov);
  renderBest(ov);
  await renderCurves();
  await renderRun();
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
  $("copy-config").addEventListener("click", copyBestConfig);
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
