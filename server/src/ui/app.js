// symtrace web UI: plain DOM, no framework, no network beyond the query API.
"use strict";

const $ = (id) => document.getElementById(id);
const ROW = 18;
const state = { tree: null, focus: null, diffTree: null, query: null };

function setStatus(text, error) {
  const s = $("status");
  s.textContent = text || "";
  s.className = error ? "error" : "";
}

// A server with read tokens answers 401 without one: ask once per tab and
// keep it for this tab only (sessionStorage), never in the URL.
async function api(path, retried) {
  const headers = { Accept: "application/json" };
  const token = sessionStorage.getItem("symtrace-token");
  if (token) headers.Authorization = "Bearer " + token;
  const resp = await fetch(path, { headers });
  const body = await resp.json().catch(() => null);
  if ((resp.status === 401 || (resp.status === 403 && token)) && !retried) {
    const entered = window.prompt("This symtrace server needs a read token:");
    if (entered) {
      sessionStorage.setItem("symtrace-token", entered.trim());
      return api(path, true);
    }
  }
  if (!resp.ok) {
    const msg = body && body.error ? body.error.message : resp.status + " " + resp.statusText;
    throw new Error(msg);
  }
  return body;
}

// The profile types symtrace's agent sends, by name; others show as sent.
const TYPE_NAMES = {
  "samples:count:cpu:nanoseconds": "CPU",
  "off_cpu:nanoseconds::": "Off-CPU time",
  "alloc_space:bytes::": "Allocated bytes",
  "alloc_objects:count::": "Allocated objects",
  "inuse_space:bytes::": "In-use bytes",
  "inuse_objects:count::": "In-use objects",
};

function typeLabel(t) {
  return TYPE_NAMES[t] ? TYPE_NAMES[t] + " (" + t.split(":")[0] + ")" : t;
}

// In-use memory is a level at each snapshot, not an amount: the server
// answers the latest snapshot (or the average) per process.
function isGauge(t) {
  return (t || "").startsWith("inuse_");
}

function fmtBytes(v) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let x = v;
  while (Math.abs(x) >= 1024 && i < units.length - 1) { x /= 1024; i++; }
  return (i ? x.toFixed(1) : String(x)) + " " + units[i];
}

function fmtValue(v, unit, type) {
  if (unit === "nanoseconds") {
    if (v >= 1e9) return (v / 1e9).toFixed(2) + " s";
    if (v >= 1e6) return (v / 1e6).toFixed(1) + " ms";
    return v + " ns";
  }
  if (unit === "bytes") return fmtBytes(v);
  if (unit === "count") return v.toLocaleString("en-US") + ((type || "").includes("objects") ? " objects" : " samples");
  return v.toLocaleString("en-US") + (unit ? " " + unit : "");
}

function pct(part, whole) {
  return whole ? ((100 * part) / whole).toFixed(2) + "%" : "0%";
}

// ---- selection from the controls ----

function selectionParams() {
  const p = new URLSearchParams();
  if ($("service").value) p.set("service", $("service").value);
  if ($("type").value) p.set("type", $("type").value);
  p.set("from", $("range").value);
  p.set("to", "now");
  const sel = $("selector").value.trim();
  if (sel) p.set("selector", sel);
  if (isGauge($("type").value)) p.set("gauge", $("gauge").value);
  return p;
}

async function loadServices() {
  try {
    const body = await api("/api/v1/services?from=" + encodeURIComponent($("range").value) + "&to=now");
    const select = $("service");
    const previous = select.value;
    select.textContent = "";
    for (const s of body.services) {
      const o = document.createElement("option");
      o.value = s.name;
      o.textContent = s.name;
      o.dataset.types = JSON.stringify(s.profile_types);
      select.appendChild(o);
    }
    if (!body.services.length) {
      const o = document.createElement("option");
      o.value = "";
      o.textContent = "(no services in range)";
      select.appendChild(o);
    } else if (body.services.some((s) => s.name === previous)) {
      select.value = previous;
    }
    fillTypes();
    setStatus(body.services.length + " service(s)");
  } catch (e) {
    setStatus(e.message, true);
  }
}

function fillTypes() {
  const opt = $("service").selectedOptions[0];
  const types = opt && opt.dataset.types ? JSON.parse(opt.dataset.types) : [];
  const select = $("type");
  select.textContent = "";
  for (const t of types) {
    const o = document.createElement("option");
    o.value = t;
    o.textContent = typeLabel(t);
    select.appendChild(o);
  }
  if (types.includes("samples:count:cpu:nanoseconds")) select.value = "samples:count:cpu:nanoseconds";
  showGauge();
}

function showGauge() {
  $("gauge-label").classList.toggle("hidden", !isGauge($("type").value));
}

// ---- flamegraph rendering ----

function color(node) {
  if (node.kind === "root") return "#d1d5db";
  if (node.kind === "kernel") return "#fdba74";
  if (node.kind === "unsymbolized") return "#cbd5e1";
  if (node.kind === "truncated") return "#9ca3af";
  if (node.kind === "inlined") return "#86efac";
  let h = 0;
  for (let i = 0; i < node.name.length; i++) h = (h * 31 + node.name.charCodeAt(i)) >>> 0;
  // A hue range per frame type (profile.frame.type): native code warm, each
  // runtime's generated code its own.
  const base = KIND_HUES[node.kind] ?? 10;
  return "hsl(" + (base + (h % 30)) + ", 85%, " + (60 + (h % 15)) + "%)";
}

const KIND_HUES = { native: 10, v8js: 50, jvm: 180, dotnet: 260, jit: 290, cpython: 210, go: 190 };

function diffColor(node) {
  const b = node.baseline, c = node.comparison;
  const tb = state.diffTree.baseline || 1, tc = state.diffTree.comparison || 1;
  const delta = c / tc - b / tb;
  const mag = Math.min(1, Math.abs(delta) * 8);
  if (Math.abs(delta) < 0.0005) return "#e5e7eb";
  const light = 92 - 30 * mag;
  return delta > 0 ? "hsl(0, 85%, " + light + "%)" : "hsl(215, 85%, " + light + "%)";
}

// Annotates parents so zoom can show the path to the focused node
// (iterative: a tree may be thousands of levels deep).
function link(node, parent) {
  node.parent = parent;
  const pending = [node];
  while (pending.length) {
    const n = pending.pop();
    for (const c of n.children) {
      c.parent = n;
      pending.push(c);
    }
  }
}

function render(container, root, focus, opts) {
  container.textContent = "";
  const value = opts.value;
  const width = container.clientWidth || 1000;
  const scale = value(focus) || 1;
  const frames = [];
  // The focused node's ancestors, full width.
  const path = [];
  for (let n = focus; n; n = n.parent) path.unshift(n);
  path.forEach((n, depth) => frames.push({ n, depth, x: 0, w: 1, ancestor: n !== focus }));
  // Depth-first with an explicit stack (no recursion over the tree).
  const pending = [[focus, path.length, 0]];
  while (pending.length) {
    const [n, depth, x] = pending.pop();
    let cx = x;
    for (const c of n.children) {
      const w = value(c) / scale;
      if (w * width >= 0.5) {
        frames.push({ n: c, depth, x: cx, w });
        pending.push([c, depth + 1, cx]);
      }
      cx += w;
    }
  }
  let maxDepth = 0;
  const frag = document.createDocumentFragment();
  for (const f of frames) {
    const d = document.createElement("div");
    d.className = "frame" + (f.ancestor ? " ancestor" : "");
    d.style.left = (f.x * 100).toFixed(4) + "%";
    d.style.width = (f.w * 100).toFixed(4) + "%";
    d.style.top = f.depth * ROW + "px";
    d.style.background = opts.color(f.n);
    d.textContent = f.w * width > 30 ? f.n.name : "";
    d.dataset.name = f.n.name;
    d.dataset.kind = f.n.kind || "";
    d._node = f.n;
    frag.appendChild(d);
    maxDepth = Math.max(maxDepth, f.depth);
  }
  container.appendChild(frag);
  container.style.height = (maxDepth + 1) * ROW + 2 + "px";
}

function tooltipText(n, diff) {
  let t = n.name;
  if (n.kind && n.kind !== "native" && n.kind !== "root") t += "  [" + n.kind + "]";
  if (n.file) t += "\n" + n.file + (n.line ? ":" + n.line : "");
  if (n.build_id) t += "\nbuild-id " + n.build_id;
  if (diff) {
    t += "\nbaseline " + n.baseline + " (" + pct(n.baseline, state.diffTree.baseline) + ")";
    t += "\ncomparison " + n.comparison + " (" + pct(n.comparison, state.diffTree.comparison) + ")";
  } else {
    const total = state.tree.total;
    t += "\ntotal " + fmtValue(n.total, state.unit, state.type) + " (" + pct(n.total, total) + ")";
    t += "\nself " + fmtValue(n.self, state.unit, state.type) + " (" + pct(n.self, total) + ")";
  }
  return t;
}

function attachHover(container, diff) {
  const tip = $("tooltip");
  container.addEventListener("mousemove", (e) => {
    const n = e.target._node;
    if (!n) return tip.classList.add("hidden");
    tip.textContent = tooltipText(n, diff);
    tip.style.left = Math.min(e.clientX + 12, window.innerWidth - 420) + "px";
    tip.style.top = e.clientY + 14 + "px";
    tip.classList.remove("hidden");
  });
  container.addEventListener("mouseleave", () => tip.classList.add("hidden"));
}

function drawFlame() {
  if (!state.tree) return;
  render($("flame"), state.tree, state.focus, { value: (n) => n.total, color });
  $("zoom-label").textContent = state.focus === state.tree ? "" : "zoomed: " + state.focus.name;
  applySearch();
}

function applySearch() {
  const text = $("search").value.trim();
  let re = null;
  try {
    re = text ? new RegExp(text) : null;
  } catch (e) {
    $("search-stats").textContent = "bad regex";
    return;
  }
  let matched = 0;
  const frames = $("flame").querySelectorAll(".frame");
  for (const d of frames) d.classList.toggle("match", !!re && re.test(d.dataset.name));
  if (re && state.tree) {
    // Total of matching nodes not under another match.
    const pending = [state.tree];
    while (pending.length) {
      const n = pending.pop();
      if (re.test(n.name)) matched += n.total;
      else for (const c of n.children) pending.push(c);
    }
    $("search-stats").textContent =
      $("flame").querySelectorAll(".frame.match").length + " frames, " + pct(matched, state.tree.total) + " of samples";
  } else {
    $("search-stats").textContent = "";
  }
}

function fillTop(functions) {
  const body = $("top").tBodies[0];
  body.textContent = "";
  for (const f of functions.slice(0, 50)) {
    const tr = body.insertRow();
    tr.insertCell().textContent = f.name;
    const s = tr.insertCell(); s.className = "num"; s.textContent = pct(f.self, state.tree.total);
    const t = tr.insertCell(); t.className = "num"; t.textContent = pct(f.total, state.tree.total);
    tr.insertCell().textContent = f.file ? f.file + (f.line ? ":" + f.line : "") : f.build_id ? "build-id " + f.build_id : "";
  }
}

// The modules whose frames stayed (partly) unnamed, and why: the
// answer's per-build-ID status, with what would name them.
function fillModules(modules) {
  const list = $("modules");
  list.replaceChildren();
  const unnamed = modules.filter((m) => m.unnamed > 0);
  list.classList.toggle("hidden", unnamed.length === 0);
  for (const m of unnamed) {
    const li = document.createElement("li");
    li.dataset.status = m.status;
    const name = (m.module || "").split("/").pop() || m.build_id;
    const b = document.createElement("b");
    b.textContent = name;
    li.append(b, " — " + m.unnamed + " of " + m.addresses + " addresses unnamed: " + m.status.replace(/_/g, " ") + ". " + m.reason);
    li.title = (m.id_kind || "gnu") + " " + m.build_id;
    list.appendChild(li);
  }
}

async function loadFlame(params) {
  state.query = params;
  showTab("flame");
  setStatus("loading…");
  try {
    const body = await api("/api/v1/flamegraph?" + params.toString());
    link(body.tree, null);
    state.tree = body.tree;
    state.focus = body.tree;
    state.unit = body.unit;
    state.type = body.profile_type;
    const objects = (body.profile_type || "").includes("objects");
    const what = params.get("span_id") ? "span " + params.get("span_id") : params.get("trace_id") ? "trace " + params.get("trace_id") : body.service || "all services";
    $("summary").textContent =
      what + " · " + (body.profile_type || "no data") + " · " + body.samples.toLocaleString("en-US") + " samples · " +
      (body.unit === "count" && !objects ? "" : fmtValue(body.total, body.unit, body.profile_type) + " · ") +
      (isGauge(body.profile_type) ? (params.get("gauge") === "average" ? "average of snapshots · " : "latest snapshot · ") : "") + body.nodes + " nodes" + (body.folded_subtrees ? " (" + body.folded_subtrees + " subtrees folded)" : "") +
      " · " + body.segments_read + " segment(s)";
    for (const [id, fmt] of [["download-svg", "svg"], ["download-pprof", "pprof"], ["download-folded", "folded"]]) {
      const p = new URLSearchParams(params);
      p.set("format", fmt);
      const url = "/api/v1/flamegraph?" + p.toString();
      $(id).href = url;
      // Behind read tokens a plain link carries none: fetch with it and
      // hand the browser the bytes.
      $(id).onclick = async (ev) => {
        const token = sessionStorage.getItem("symtrace-token");
        if (!token) return;
        ev.preventDefault();
        const resp = await fetch(url, { headers: { Authorization: "Bearer " + token } });
        if (!resp.ok) {
          setStatus("download failed: " + resp.status + " " + resp.statusText, true);
          return;
        }
        const a = document.createElement("a");
        a.href = URL.createObjectURL(await resp.blob());
        a.download = "flamegraph." + (fmt === "folded" ? "txt" : fmt);
        document.body.appendChild(a);
        a.click();
        a.remove();
        setTimeout(() => URL.revokeObjectURL(a.href), 60000);
      };
    }
    drawFlame();
    fillModules(body.build_ids || []);
    fillTop(body.functions || []);
    setStatus("");
  } catch (e) {
    setStatus(e.message, true);
  }
}

// ---- diff ----

function rangeSeconds(v) {
  const m = /^now-(\d+)([smhd])$/.exec(v);
  return m ? Number(m[1]) * { s: 1, m: 60, h: 3600, d: 86400 }[m[2]] : 3600;
}

async function loadDiff() {
  const p = selectionParams();
  const seconds = rangeSeconds($("range").value);
  p.delete("from");
  p.delete("to");
  p.set("comparison_from", "now-" + seconds + "s");
  p.set("comparison_to", "now");
  const base = $("baseline-range").value;
  if (base === "prev") {
    p.set("baseline_from", "now-" + 2 * seconds + "s");
    p.set("baseline_to", "now-" + seconds + "s");
  } else {
    p.set("baseline_from", base);
    p.set("baseline_to", "now");
  }
  if ($("baseline-selector").value.trim()) p.set("baseline_selector", $("baseline-selector").value.trim());
  if ($("comparison-selector").value.trim()) p.set("comparison_selector", $("comparison-selector").value.trim());
  setStatus("loading diff…");
  try {
    const body = await api("/api/v1/diff?" + p.toString());
    link(body.tree, null);
    state.diffTree = { root: body.tree, baseline: body.baseline.total, comparison: body.comparison.total };
    $("diff-summary").textContent =
      "baseline " + body.baseline.samples + " samples · comparison " + body.comparison.samples + " samples";
    const value = (n) => Math.max(n.baseline / (state.diffTree.baseline || 1), n.comparison / (state.diffTree.comparison || 1));
    render($("diff"), body.tree, body.tree, { value, color: diffColor });
    setStatus("");
  } catch (e) {
    setStatus(e.message, true);
  }
}

// ---- traces ----

async function openTrace(id) {
  id = id.trim().toLowerCase();
  $("trace-id").value = id;
  showTab("trace");
  setStatus("loading trace…");
  try {
    const body = await api("/api/v1/traces/" + encodeURIComponent(id));
    $("trace-summary").textContent =
      "trace " + body.trace_id + " · " + (body.by_span || body.spans).length + " span(s) with samples · CPU " + fmtValue(body.cpu_ns, "nanoseconds") +
      (body.off_cpu_ns ? " · off-CPU " + fmtValue(body.off_cpu_ns, "nanoseconds") : "") +
      (body.alloc_bytes ? " · allocated " + fmtBytes(body.alloc_bytes) : "");
    renderSpanTime(body);
    const tbody = $("spans").tBodies[0];
    tbody.textContent = "";
    for (const s of body.spans) {
      const tr = tbody.insertRow();
      tr.insertCell().textContent = s.span_id;
      tr.insertCell().textContent = s.service;
      tr.insertCell().textContent = s.profile_type;
      const n = tr.insertCell(); n.className = "num"; n.textContent = s.samples;
      const c = tr.insertCell(); c.className = "num"; c.textContent = s.cpu_ns == null ? "" : fmtValue(s.cpu_ns, "nanoseconds");
      const sh = tr.insertCell(); sh.className = "num"; sh.textContent = s.cpu_share == null ? "" : (100 * s.cpu_share).toFixed(1) + "%";
      const a = document.createElement("a");
      a.href = "#";
      a.className = "span-flame";
      a.textContent = "flamegraph";
      a.addEventListener("click", (e) => {
        e.preventDefault();
        const p = new URLSearchParams({ trace_id: body.trace_id, span_id: s.span_id, type: s.profile_type });
        loadFlame(p);
      });
      tr.insertCell().appendChild(a);
    }
    setStatus(body.spans.length ? "" : "no samples linked to this trace");
  } catch (e) {
    setStatus(e.message, true);
  }
}

// Each span's wall-clock time: running (CPU) against waiting (off-CPU),
// what it waited on, and the flamegraph of each.
function renderSpanTime(body) {
  const tbody = $("span-time").tBodies[0];
  tbody.textContent = "";
  const flameLink = (text, url) => {
    const a = document.createElement("a");
    a.href = "#";
    a.textContent = text;
    a.addEventListener("click", (e) => {
      e.preventDefault();
      loadFlame(new URL(url, location.origin).searchParams);
    });
    return a;
  };
  for (const s of body.by_span || []) {
    const tr = tbody.insertRow();
    tr.insertCell().textContent = s.span_id;
    tr.insertCell().textContent = s.service;
    const run = tr.insertCell(); run.className = "num"; run.textContent = s.cpu_ns == null ? "" : fmtValue(s.cpu_ns, "nanoseconds");
    const wait = tr.insertCell(); wait.className = "num"; wait.textContent = s.off_cpu_ns == null ? "" : fmtValue(s.off_cpu_ns, "nanoseconds");
    const bar = document.createElement("div");
    bar.className = "split";
    bar.title = s.waiting_share == null ? "no off-CPU profile" :
      (100 * s.running_share).toFixed(0) + "% running, " + (100 * s.waiting_share).toFixed(0) + "% waiting";
    if (s.waiting_share != null) {
      const r = document.createElement("span"); r.className = "run"; r.style.width = (100 * s.running_share) + "%";
      const w = document.createElement("span"); w.className = "wait"; w.style.width = (100 * s.waiting_share) + "%";
      bar.append(r, w);
    }
    tr.insertCell().appendChild(bar);
    const total = s.off_cpu_ns || 0;
    tr.insertCell().textContent = (s.waiting || []).slice(0, 4)
      .map((w) => w.on + " " + (total ? (100 * w.ns / total).toFixed(0) + "%" : ""))
      .join(", ");
    const alloc = tr.insertCell(); alloc.className = "num alloc"; alloc.textContent = s.alloc_bytes == null ? "" : fmtBytes(s.alloc_bytes);
    const links = tr.insertCell();
    const add = (a) => {
      if (links.childNodes.length) links.append(" · ");
      links.appendChild(a);
    };
    if (s.flamegraph) add(flameLink("CPU", s.flamegraph));
    if (s.off_cpu_flamegraph) {
      const a = flameLink("off-CPU", s.off_cpu_flamegraph);
      a.className = "off-cpu-flame";
      add(a);
    }
    if (s.alloc_flamegraph) {
      const a = flameLink("allocations", s.alloc_flamegraph);
      a.className = "alloc-flame";
      add(a);
    }
  }
}

// ---- wiring ----

function showTab(name) {
  for (const t of document.querySelectorAll(".tab")) t.classList.toggle("active", t.dataset.tab === name);
  for (const p of document.querySelectorAll(".pane")) p.classList.toggle("hidden", p.id !== "tab-" + name);
}

document.addEventListener("DOMContentLoaded", () => {
  for (const t of document.querySelectorAll(".tab")) t.addEventListener("click", () => showTab(t.dataset.tab));
  $("service").addEventListener("change", fillTypes);
  $("type").addEventListener("change", showGauge);
  $("range").addEventListener("change", loadServices);
  $("load").addEventListener("click", () => loadFlame(selectionParams()));
  $("selector").addEventListener("keydown", (e) => e.key === "Enter" && loadFlame(selectionParams()));
  $("search").addEventListener("input", applySearch);
  $("reset-zoom").addEventListener("click", () => { state.focus = state.tree; drawFlame(); });
  $("flame").addEventListener("click", (e) => {
    const n = e.target._node;
    if (n) { state.focus = n; drawFlame(); }
  });
  $("load-diff").addEventListener("click", loadDiff);
  $("open-trace").addEventListener("click", () => openTrace($("trace-id").value));
  $("trace-id").addEventListener("keydown", (e) => e.key === "Enter" && openTrace($("trace-id").value));
  attachHover($("flame"), false);
  attachHover($("diff"), true);
  window.addEventListener("resize", drawFlame);
  const q = new URLSearchParams(location.search);
  loadServices().then(() => {
    if (q.get("trace_id")) openTrace(q.get("trace_id"));
    else if (q.get("service")) {
      $("service").value = q.get("service");
      fillTypes();
      loadFlame(selectionParams());
    }
  });
});
