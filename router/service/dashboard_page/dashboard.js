
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
