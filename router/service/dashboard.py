"""``GET /dashboard``: a live page of the workers, served by the router itself.

Why in the router and not only in Grafana (``deploy/grafana``): a router answering on a
port is all an operator needs to see what it is doing right now, also where no
Prometheus / Grafana runs and without internet. So the page is one self-contained HTML
document: inline CSS and vanilla JavaScript, no CDN, no fonts, no images, no build step.

What it shows. It polls ``GET /workers`` (the same per-worker objects the admin API
returns) and ``GET /dashboard/data`` (the few pool-wide counters ``/workers`` lacks:
policy, shadow, picker branch counts, retries, counters by model) about once a second with
``fetch()``, and updates in place:

- a table, one row per worker: the models it serves (its LoRA adapters on hover), health,
  in flight, pending prefill tokens, requests,
  requests/s, prompt tokens, estimated hit rate (the picker's booked estimate / prompt
  tokens), reported hit rate (the worker's own cached tokens, in router units, / prompt
  tokens; shown once the worker reported on at least one request, with that count beside
  it), shadow blocks (pinned / held / capacity);
- a table, one row per model requests named (a model some worker serves, ``none`` or
  ``other``: bounded): requests, prompt tokens, estimated and reported hit rates;
- three small canvas charts over a rolling window (30 s on a fresh page, growing to two
  minutes): in flight per worker, requests/s per worker, and the fleet's estimated vs
  reported hit rate over the last 10 s of traffic (a gap where no prompt tokens arrived).
  Where workers report, both lines are over the same requests (the picker's shadow's
  estimate and the report, counted when the report arrives), so the gap between them is
  the shadow's error; where none does, the estimate line is the booked estimates.

Safety. Every value from the server goes into the DOM as ``textContent`` (never
``innerHTML``), worker URLs included. The page is static, so a Content-Security-Policy
allows exactly its own inline script and style (by SHA-256 hash), ``fetch`` to its own
origin only, and nothing else.

Access (the rules live in :mod:`router.core.access`). The HTML carries no data, so
``GET /dashboard`` needs no key: the page always loads. Its data, ``GET /workers`` and
``GET /dashboard/data``, has the access of ``/metrics``: open, unless
``--metrics-require-key`` (then a client or the admin key). ``/dashboard/data`` holds only
counters ``/metrics`` already exports. When a data request answers 401/403 the page asks
for a key and sends it as ``Authorization: Bearer KEY`` (kept in ``sessionStorage``;
``/dashboard#key=KEY`` works too, and a fragment never reaches the server or its logs).

Paths are resolved relative to the page (``…/dashboard`` → ``…/workers``), so the page
also works behind a reverse proxy that serves the router under a path prefix.
"""

from __future__ import annotations

import base64
import hashlib
import time
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.responses import Response

from router.service.context import RouterContext

_STYLE = """
:root {
  color-scheme: light dark;
  --bg: #f7f8fa; --panel: #ffffff; --text: #1f2430; --muted: #677085; --line: #e2e5eb;
  --ok: #15803d; --bad: #b91c1c; --grid: #e8eaef; --accent: #2563eb;
}
@media (prefers-color-scheme: dark) {
  :root {
    --bg: #14171c; --panel: #1c2027; --text: #e6e8ec; --muted: #9aa3b2; --line: #2c323c;
    --ok: #4ade80; --bad: #f87171; --grid: #2a2f38; --accent: #60a5fa;
  }
}
* { box-sizing: border-box; }
body {
  margin: 0; padding: 16px 20px 24px; background: var(--bg); color: var(--text);
  font: 13px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
}
header { display: flex; align-items: baseline; gap: 16px; flex-wrap: wrap; }
h1 { font-size: 18px; margin: 0; }
h2 { font-size: 13px; margin: 0 0 6px; font-weight: 600; color: var(--muted); }
#meta { color: var(--muted); }
#status { margin-left: auto; color: var(--muted); }
#status[data-state="ok"]::before { content: "\\25CF  "; color: var(--ok); }
#status[data-state="error"], #status[data-state="auth"] { color: var(--bad); }
#status[data-state="error"]::before, #status[data-state="auth"]::before {
  content: "\\25CF  "; color: var(--bad);
}
#auth { margin: 10px 0 0; display: flex; gap: 8px; align-items: center; }
#auth[hidden] { display: none; }
#tiles { display: grid; grid-template-columns: repeat(6, minmax(0, 1fr)); gap: 10px;
  margin: 14px 0; }
.tile, .panel { background: var(--panel); border: 1px solid var(--line); border-radius: 6px; }
.tile { padding: 8px 12px; }
.tile .label { color: var(--muted); font-size: 12px; }
.tile .value { font-size: 20px; font-variant-numeric: tabular-nums; }
#charts { display: grid; grid-template-columns: repeat(3, minmax(0, 1fr)); gap: 10px; }
.panel { padding: 10px 12px; }
canvas { display: block; width: 100%; height: 160px; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 14px; margin-top: 6px; color: var(--muted);
  font-size: 12px; }
.swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px;
  margin-right: 5px; vertical-align: -1px; }
.swatch.dashed { height: 0; border-top: 2px dashed; border-radius: 0; vertical-align: 3px; }
#table-panel { margin-top: 10px; overflow-x: auto; }
table { width: 100%; border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { padding: 5px 8px; border-bottom: 1px solid var(--line); white-space: nowrap; }
th { text-align: right; color: var(--muted); font-weight: 600; font-size: 12px; }
td { text-align: right; }
th:first-child, td:first-child, th:nth-child(2), td:nth-child(2) { text-align: left; }
#workers th:nth-child(3), #workers td:nth-child(3),
#workers th:nth-child(4), #workers td:nth-child(4) { text-align: left; }
#models { margin-top: 14px; }
#models td:nth-child(2), #models th:nth-child(2) { text-align: right; }
td.ok { color: var(--ok); } td.bad { color: var(--bad); }
td.empty { text-align: center; color: var(--muted); padding: 16px; }
#decisions { margin-top: 10px; display: flex; gap: 6px 18px; flex-wrap: wrap; color: var(--muted); }
#decisions .n { color: var(--text); font-variant-numeric: tabular-nums; }
@media (max-width: 900px) {
  #tiles { grid-template-columns: repeat(3, minmax(0, 1fr)); }
  #charts { grid-template-columns: minmax(0, 1fr); }
}
"""

_SCRIPT = r"""
"use strict";
(() => {
  const POLL_MS = 1000;
  const WINDOW = 120;     // chart samples kept: about two minutes at one poll a second
  const HIT_WINDOW = 10;  // polls summed for the windowed hit rates
  const MIN_SPAN = 30;    // a fresh page's charts span 30 polls, growing to WINDOW
  const PALETTE = ["#2563eb", "#d97706", "#059669", "#dc2626", "#7c3aed", "#0891b2",
                   "#db2777", "#65a30d", "#9333ea", "#ea580c"];
  const KEY_STORE = "cache-router-dashboard-key";
  const base = location.pathname.replace(/\/dashboard\/?$/, "");
  const $ = (id) => document.getElementById(id);

  let apiKey = "";
  try { apiKey = sessionStorage.getItem(KEY_STORE) || ""; } catch (e) { /* no storage */ }
  const fragment = new URLSearchParams(location.hash.slice(1));
  if (fragment.get("key")) {
    apiKey = fragment.get("key");
    try { sessionStorage.setItem(KEY_STORE, apiKey); } catch (e) { /* no storage */ }
    history.replaceState(null, "", location.pathname + location.search);
  }

  const colors = new Map();  // worker url -> colour, stable for the page's life
  const colorOf = (url) => {
    if (!colors.has(url)) colors.set(url, PALETTE[colors.size % PALETTE.length]);
    return colors.get(url);
  };
  const samples = [];  // {inflight: Map, rps: Map, hitEst, hitRep}
  const deltas = [];   // per poll: fleet {prompt, est, estRep, rep}
  let shadow = "blocks";  // the shadow answering the picker (from /dashboard/data)
  let reportsSeen = false;
  let prev = null;     // {t, byUrl: Map(url -> counters)}
  let polls = 0;
  let timer = null;

  class HttpError extends Error {
    constructor(status, path) { super("HTTP " + status + " from " + path); this.status = status; }
  }

  async function getJSON(path) {
    const headers = { Accept: "application/json" };
    if (apiKey) headers.Authorization = "Bearer " + apiKey;
    const r = await fetch(base + path, { headers, cache: "no-store" });
    if (!r.ok) throw new HttpError(r.status, path);
    return r.json();
  }

  const num = (v) => (typeof v === "number" && isFinite(v) ? v : 0);
  const fmtInt = (v) => Math.round(num(v)).toLocaleString("en-US");
  const fmtPct = (v) => (v == null ? "\u2013" : (100 * v).toFixed(1) + "%");
  const fmtRate = (v) => (v == null ? "\u2013" : v < 10 ? v.toFixed(1) : Math.round(v) + "");
  const ratio = (a, b) => (b > 0 ? Math.min(1, Math.max(0, a / b)) : null);

  // est: booked estimates of every request; estRep / rep: the shadow's estimate and the
  // worker's report for the requests that reported, both counted when the report arrives.
  function counters(w) {
    const acc = w.accuracy || {};
    return {
      requests: num(w.requests_total), prompt: num(w.prompt_tokens),
      est: num(w.estimated_hit_tokens), estRep: num(acc[shadow + "_estimate_tokens"]),
      rep: num(acc.reported_tokens), reports: num(acc.requests),
    };
  }

  function cell(tr, text, col, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    td.dataset.col = col;
    if (cls) td.className = cls;
    tr.appendChild(td);
    return td;
  }

  function renderTable(workers, rps) {
    const body = $("workers-body");
    const rows = [];
    for (const w of workers) {
      const url = String(w.url);
      const c = counters(w);
      const tr = document.createElement("tr");
      tr.dataset.url = url;
      const name = cell(tr, "", "url");
      const sw = document.createElement("span");
      sw.className = "swatch";
      sw.style.backgroundColor = colorOf(url);
      name.appendChild(sw);
      name.appendChild(document.createTextNode(url));
      const models = Array.isArray(w.models) ? w.models : null;
      const mc = cell(tr, models ? models.join(", ") : "any (not read yet)", "models");
      if (Array.isArray(w.adapters) && w.adapters.length)
        mc.title = "LoRA adapters: " + w.adapters.join(", ");
      cell(tr, String(w.role || "both"), "role");  // disaggregated fleets: prefill / decode
      const fails = num(w.consecutive_failures);
      const health = w.healthy ? "up" : "down" + (fails ? " (" + fails + " failures)" : "");
      const hc = cell(tr, health, "health", w.healthy ? "ok" : "bad");
      if (w.last_error) hc.title = String(w.last_error);
      cell(tr, fmtInt(w.num_requests), "in_flight");
      cell(tr, fmtInt(w.pending_prefill_tokens), "pending_prefill");
      cell(tr, fmtInt(c.requests), "requests");
      cell(tr, fmtRate(rps.get(url)), "rps");
      cell(tr, fmtInt(c.prompt), "prompt_tokens");
      cell(tr, fmtPct(ratio(c.est, c.prompt)), "est_hit");
      cell(tr, c.reports > 0 ? fmtPct(ratio(c.rep, c.prompt)) : "\u2013", "reported_hit");
      cell(tr, fmtInt(c.reports), "reports");
      cell(tr, fmtInt(w.pinned_blocks) + " / " + fmtInt(w.shadow_blocks) + " / " +
        fmtInt(w.shadow_capacity_blocks), "shadow_blocks");
      const cpu = w.cpu_tier;  // the CPU KV tier's shadow: held / capacity, per-tier error
      const tc = cell(tr, cpu ? fmtInt(cpu.shadow_blocks) + " / " +
        fmtInt(cpu.shadow_capacity_blocks) : "\u2013", "cpu_tier");
      if (cpu && num(cpu.prompt_tokens) > 0)
        tc.title = "CPU tier error " + fmtPct(num(cpu.abs_error_tokens) / num(cpu.prompt_tokens)) +
          ", GPU " + fmtPct(num(cpu.gpu_abs_error_tokens) / num(cpu.prompt_tokens));
      rows.push(tr);
    }
    if (!rows.length) {
      const tr = document.createElement("tr");
      const td = cell(tr, "no workers: add one with POST /workers", "empty", "empty");
      td.colSpan = 14;
      rows.push(tr);
    }
    body.replaceChildren(...rows);
  }

  function renderModels(models) {
    const rows = [];
    for (const [model, m] of Object.entries(models || {}).sort()) {
      const tr = document.createElement("tr");
      tr.dataset.model = model;
      cell(tr, model, "model");
      cell(tr, fmtInt(m.requests), "requests");
      cell(tr, fmtInt(m.prompt_tokens), "prompt_tokens");
      cell(tr, fmtPct(ratio(num(m.estimated_hit_tokens), num(m.prompt_tokens))), "est_hit");
      cell(tr, m.reported_requests > 0 ?
        fmtPct(ratio(num(m.reported_cached_tokens), num(m.reported_prompt_tokens))) : "\u2013",
        "reported_hit");
      rows.push(tr);
    }
    $("models-body").replaceChildren(...rows);
  }

  function renderTiles(workers, rps, fleet) {
    const healthy = workers.filter((w) => w.healthy).length;
    $("tile-healthy").textContent = healthy + " / " + workers.length;
    $("tile-inflight").textContent = fmtInt(workers.reduce((s, w) => s + num(w.num_requests), 0));
    let total = 0;
    for (const v of rps.values()) total += v;
    $("tile-rps").textContent = prev ? fmtRate(total) : "\u2013";
    $("tile-requests").textContent = fmtInt(fleet.requests);
    $("tile-est").textContent = fmtPct(ratio(fleet.est, fleet.prompt));
    const rep = fleet.reports > 0 ? ratio(fleet.rep, fleet.prompt) : null;
    $("tile-rep").textContent = fmtPct(rep);
  }

  function renderSummary(summary) {
    if (!summary) return;
    const parts = ["policy " + summary.policy, "shadow " + summary.shadow,
                   "tokenizer " + summary.tokenizer];
    if (typeof summary.uptime_s === "number") {
      const m = Math.floor(summary.uptime_s / 60);
      parts.push("up " + (m >= 60 ? Math.floor(m / 60) + " h " + (m % 60) + " min" : m + " min"));
    }
    $("meta").textContent = parts.join(" \u00b7 ");
    const flow = summary.flow;
    $("tile-queued-box").hidden = !flow;
    if (flow) {
      const bands = Object.entries(flow.bands || {}).map(([b, v]) => b + ":" + v.queued);
      $("tile-queued").textContent = fmtInt(flow.queued) +
        (bands.length ? " (" + bands.join(" ") + ")" : "");
    }
    const items = [];
    const add = (label, n) => {
      const span = document.createElement("span");
      span.textContent = label + " ";
      const b = document.createElement("span");
      b.className = "n";
      b.textContent = fmtInt(n);
      span.appendChild(b);
      items.push(span);
    };
    const decisions = Object.entries(summary.decisions || {}).sort((a, b) => b[1] - a[1]);
    const head = document.createElement("span");
    head.textContent = decisions.length ? "picker branches:" : "picker branches: none yet";
    items.push(head);
    for (const [branch, n] of decisions) add(branch, n);
    for (const [reason, n] of Object.entries(summary.retries || {})) add("retry " + reason, n);
    for (const [status, n] of Object.entries(summary.unrouted || {})) add("unrouted " + status, n);
    $("decisions").replaceChildren(...items);
  }

  function niceCeil(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }

  function draw(canvas, series, opts) {
    const css = getComputedStyle(document.documentElement);
    const dpr = window.devicePixelRatio || 1;
    const w = canvas.clientWidth, h = canvas.clientHeight;
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
      canvas.width = Math.round(w * dpr);
      canvas.height = Math.round(h * dpr);
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    const pad = { l: 44, r: 8, t: 8, b: 18 };
    const pw = w - pad.l - pad.r, ph = h - pad.t - pad.b;
    let max = opts.max;
    if (max == null) {
      max = 0;
      for (const s of series) for (const v of s.values) if (v != null && v > max) max = v;
      max = opts.integer ? Math.max(4, 4 * Math.ceil(max / 4)) : niceCeil(max);
    }
    ctx.font = "11px system-ui, sans-serif";
    ctx.lineWidth = 1;
    ctx.setLineDash([]);
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (let i = 0; i <= 4; i++) {
      const y = pad.t + (ph * i) / 4;
      ctx.strokeStyle = css.getPropertyValue("--grid").trim() || "#ddd";
      ctx.beginPath(); ctx.moveTo(pad.l, y + 0.5); ctx.lineTo(pad.l + pw, y + 0.5); ctx.stroke();
      ctx.fillStyle = css.getPropertyValue("--muted").trim() || "#777";
      ctx.fillText(opts.fmt((max * (4 - i)) / 4), pad.l - 6, y);
    }
    const span = Math.max(MIN_SPAN, Math.min(WINDOW, samples.length));
    const secs = Math.round((span * POLL_MS) / 1000);
    ctx.textBaseline = "top";
    ctx.textAlign = "left";
    ctx.fillText("\u2212" + (secs >= 120 ? Math.round(secs / 60) + " min" : secs + " s"),
                 pad.l, pad.t + ph + 4);
    ctx.textAlign = "right";
    ctx.fillText("now", pad.l + pw, pad.t + ph + 4);
    const x = (i, n) => pad.l + (pw * (i + span - n)) / (span - 1);
    const y = (v) => pad.t + ph - (ph * Math.min(v, max)) / max;
    let points = 0;
    for (const s of series) {
      const n = s.values.length;
      ctx.strokeStyle = s.color;
      ctx.fillStyle = s.color;
      ctx.lineWidth = s.width || 1.75;
      const dot = (s.width || 1.75) + 1.5;
      ctx.setLineDash(s.dash || []);
      ctx.beginPath();
      let pen = false;
      s.values.forEach((v, i) => {
        if (v == null) { pen = false; return; }
        points++;
        if (pen) ctx.lineTo(x(i, n), y(v)); else ctx.moveTo(x(i, n), y(v));
        const lonely = (i === 0 || s.values[i - 1] == null) &&
          (i === n - 1 || s.values[i + 1] == null);
        if (lonely) ctx.fillRect(x(i, n) - dot / 2, y(v) - dot / 2, dot, dot);
        pen = true;
      });
      ctx.stroke();
    }
    canvas.dataset.points = String(points);
  }

  function legend(el, entries) {
    const items = entries.map((e) => {
      const span = document.createElement("span");
      const sw = document.createElement("span");
      sw.className = e.dashed ? "swatch dashed" : "swatch";
      if (e.dashed) sw.style.borderTopColor = e.color; else sw.style.backgroundColor = e.color;
      span.appendChild(sw);
      span.appendChild(document.createTextNode(e.label));
      return span;
    });
    el.replaceChildren(...items);
  }

  function renderCharts() {
    const urls = [...colors.keys()].filter((u) => samples.some((s) => s.inflight.has(u)));
    const perWorker = (key) => urls.map((u) => ({
      color: colorOf(u), values: samples.map((s) => (s[key].has(u) ? s[key].get(u) : null)),
    }));
    draw($("chart-inflight"), perWorker("inflight"), { integer: true, fmt: (v) => fmtInt(v) });
    draw($("chart-rps"), perWorker("rps"), { fmt: (v) => fmtRate(v) });
    const accent = getComputedStyle(document.documentElement).getPropertyValue("--accent").trim();
    draw($("chart-hit"), [
      // estimated wide and under, reported dashed on top: both show where they agree
      { color: accent || "#2563eb", width: 3.5, values: samples.map((s) => s.hitEst) },
      { color: "#d97706", width: 1.5, dash: [5, 3], values: samples.map((s) => s.hitRep) },
    ], { max: 1, fmt: (v) => Math.round(100 * v) + "%" });
    const workerLegend = urls.map((u) => ({ color: colorOf(u), label: u }));
    legend($("legend-inflight"), workerLegend);
    legend($("legend-rps"), workerLegend);
    legend($("legend-hit"), [
      { color: accent || "#2563eb",
        label: reportsSeen ? "estimated by the " + shadow + " shadow" : "estimated (booked)" },
      { color: "#d97706", label: "reported by workers", dashed: true },
    ]);
  }

  function update(workers, summary) {
    const now = performance.now() / 1000;
    if (summary && summary.shadow === "radix") shadow = "radix";
    const byUrl = new Map(workers.map((w) => [String(w.url), counters(w)]));
    const rps = new Map();
    const fleet = { requests: 0, prompt: 0, est: 0, estRep: 0, rep: 0, reports: 0 };
    const step = { prompt: 0, est: 0, estRep: 0, rep: 0 };
    for (const [url, c] of byUrl) {
      for (const k of Object.keys(fleet)) fleet[k] += c[k];
      const p = prev && prev.byUrl.get(url);
      if (p) {
        const dt = Math.max(1e-3, now - prev.t);
        rps.set(url, Math.max(0, c.requests - p.requests) / dt);
        step.prompt += Math.max(0, c.prompt - p.prompt);
        step.est += Math.max(0, c.est - p.est);
        step.estRep += Math.max(0, c.estRep - p.estRep);
        step.rep += Math.max(0, c.rep - p.rep);
      }
    }
    if (prev) {
      deltas.push(step);
      if (deltas.length > HIT_WINDOW) deltas.shift();
    }
    const sum = (k) => deltas.reduce((s, d) => s + d[k], 0);
    const windowPrompt = sum("prompt");
    // Workers that report: the estimate and the report of the same requests, so the gap
    // between the lines is the shadow's error alone. Workers that do not: booked estimates.
    reportsSeen = fleet.reports > 0;
    samples.push({
      inflight: new Map(workers.map((w) => [String(w.url), num(w.num_requests)])),
      rps,
      hitEst: prev ? ratio(sum(reportsSeen ? "estRep" : "est"), windowPrompt) : null,
      hitRep: prev && reportsSeen ? ratio(sum("rep"), windowPrompt) : null,
    });
    if (samples.length > WINDOW) samples.shift();
    prev = { t: now, byUrl };
    for (const w of workers) colorOf(String(w.url));
    renderTable(workers, rps);
    renderTiles(workers, rps, fleet);
    renderSummary(summary);
    renderModels(summary && summary.models);
    renderCharts();
  }

  function setStatus(state, text) {
    const el = $("status");
    el.dataset.state = state;
    el.textContent = text;
  }

  async function poll() {
    timer = null;
    try {
      const [workers, summary] = await Promise.all([getJSON("/workers"),
                                                    getJSON("/dashboard/data")]);
      if (!Array.isArray(workers)) throw new Error("unexpected /workers answer");
      update(workers, summary);
      polls++;
      document.body.dataset.polls = String(polls);
      $("auth").hidden = true;
      setStatus("ok", "updated " + new Date().toLocaleTimeString("en-GB"));
    } catch (e) {
      if (e instanceof HttpError && (e.status === 401 || e.status === 403)) {
        $("auth").hidden = false;
        setStatus("auth", (apiKey ? "key refused" : "a key is required") + " (" + e.message + ")");
      } else {
        setStatus("error", "update failed: " + (e && e.message ? e.message : String(e)));
      }
    } finally {
      if (!document.hidden) timer = setTimeout(poll, POLL_MS);
    }
  }

  $("auth").addEventListener("submit", (ev) => {
    ev.preventDefault();
    apiKey = $("auth-key").value.trim();
    try { sessionStorage.setItem(KEY_STORE, apiKey); } catch (e) { /* no storage */ }
    $("auth-key").value = "";
    if (timer) clearTimeout(timer);
    poll();
  });
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && timer == null) poll();
  });
  window.addEventListener("resize", () => renderCharts());
  poll();
})();
"""

_BODY = """
<header>
  <h1>cache-router</h1>
  <span id="meta">loading…</span>
  <span id="status" data-state="loading">connecting…</span>
</header>
<form id="auth" hidden>
  <label for="auth-key">This router wants a key for its admin data:</label>
  <input id="auth-key" type="password" autocomplete="off" placeholder="API key">
  <button type="submit">Use key</button>
</form>
<section id="tiles">
  <div class="tile"><div class="label">healthy workers</div>
    <div class="value" id="tile-healthy">–</div></div>
  <div class="tile"><div class="label">in flight</div>
    <div class="value" id="tile-inflight">–</div></div>
  <div class="tile" id="tile-queued-box" hidden><div class="label">queued (flow control)</div>
    <div class="value" id="tile-queued">–</div></div>
  <div class="tile"><div class="label">requests / s</div>
    <div class="value" id="tile-rps">–</div></div>
  <div class="tile"><div class="label">requests</div>
    <div class="value" id="tile-requests">–</div></div>
  <div class="tile"><div class="label">hit rate, estimated</div>
    <div class="value" id="tile-est">–</div></div>
  <div class="tile"><div class="label">hit rate, reported</div>
    <div class="value" id="tile-rep">–</div></div>
</section>
<section id="charts">
  <div class="panel"><h2>In flight per worker</h2><canvas id="chart-inflight"></canvas>
    <div class="legend" id="legend-inflight"></div></div>
  <div class="panel"><h2>Requests / s per worker</h2><canvas id="chart-rps"></canvas>
    <div class="legend" id="legend-rps"></div></div>
  <div class="panel"><h2>Hit rate, last 10 s (all workers)</h2><canvas id="chart-hit"></canvas>
    <div class="legend" id="legend-hit"></div></div>
</section>
<div class="panel" id="table-panel">
  <table id="workers">
    <thead><tr>
      <th>worker</th><th>models</th>
      <th title="both (aggregated), prefill or decode">role</th><th>health</th>
      <th>in flight</th><th>pending prefill</th>
      <th>requests</th><th>req/s</th><th>prompt tokens</th>
      <th title="the picker's estimated hit tokens / prompt tokens">est. hit</th>
      <th title="cached tokens the worker reported (router units) / prompt tokens">
        reported hit</th>
      <th title="requests the worker reported cached tokens for">reports</th>
      <th title="pinned / held / capacity">shadow blocks</th>
      <th title="the CPU KV tier's shadow: held / capacity blocks (hover: per-tier error)">
        CPU tier</th>
    </tr></thead>
    <tbody id="workers-body"></tbody>
  </table>
  <table id="models">
    <thead><tr>
      <th>model</th><th>requests</th><th>prompt tokens</th>
      <th title="the picker's estimated hit tokens / prompt tokens">est. hit</th>
      <th title="cached tokens the workers reported / prompt tokens of those requests">
        reported hit</th>
    </tr></thead>
    <tbody id="models-body"></tbody>
  </table>
  <div id="decisions"></div>
</div>
"""


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


PAGE = (
    "<!doctype html>\n"
    '<html lang="en"><head><meta charset="utf-8">\n'
    '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
    '<link rel="icon" href="data:,">\n'
    "<title>cache-router dashboard</title>\n"
    f"<style>{_STYLE}</style>\n"
    f"</head><body>{_BODY}<script>{_SCRIPT}</script>\n"
    "</body></html>\n"
).encode()
"""The whole page, built once at import (it holds no data)."""

HEADERS = {
    # Exactly the page's own inline script and style; data from this origin only.
    "Content-Security-Policy": (
        f"default-src 'none'; script-src {_csp_hash(_SCRIPT)}; style-src {_csp_hash(_STYLE)}; "
        "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Revalidate on every load, so an upgraded router serves its own page at once.
    "Cache-Control": "no-cache",
}


def summary(app: RouterContext, started: float) -> dict[str, Any]:
    """``GET /dashboard/data``: what the page needs that ``/workers`` does not carry."""
    settings, pool = app.settings, app.pool
    stats = pool.stats
    return {
        "policy": settings.policy,
        "shadow": settings.shadow,
        "tokenizer": settings.tokenizer,
        "workers": len(pool.workers),
        "healthy_workers": sum(1 for w in pool.workers if w.healthy),
        "decisions": {str(k): v for k, v in stats.decisions.items()},
        "retries": {str(k): v for k, v in stats.retries.items()},
        "unrouted": {str(k): v for k, v in stats.unrouted.items()},
        "models": {
            label: {
                "requests": sum(m.requests.values()),
                "prompt_tokens": m.prompt_tokens,
                "estimated_hit_tokens": m.estimated_hit_tokens,
                "reported_requests": m.reported_requests,
                "reported_prompt_tokens": m.reported_prompt_tokens,
                "reported_cached_tokens": m.reported_cached_tokens,
            }
            for label, m in stats.models.items()
        },
        "uptime_s": round(time.monotonic() - started, 1),
        "flow": app.core.flow.describe() if app.core.flow is not None else None,
    }


def mount_dashboard(api: FastAPI, app: RouterContext) -> None:
    """Add ``GET /dashboard`` and ``GET /dashboard/data`` to the admin app of ``app``.

    On the admin app (not the raw ASGI dispatch), behind the access rules every admin
    request passes, so the page's data is guarded exactly as ``/workers`` is.
    """
    started = time.monotonic()

    @api.get("/dashboard", include_in_schema=False)
    async def dashboard() -> Response:
        return Response(PAGE, media_type="text/html; charset=utf-8", headers=HEADERS)

    @api.get("/dashboard/data", include_in_schema=False)
    async def dashboard_data() -> Response:
        return Response(
            orjson.dumps(summary(app, started)),
            media_type="application/json",
            headers={"Cache-Control": "no-store"},
        )
