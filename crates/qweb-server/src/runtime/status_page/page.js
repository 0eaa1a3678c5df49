"use strict";
// Every value from /status.json reaches the page through textContent (never as markup), so
// names from the configuration (routes, upstreams, engines, key servers) cannot inject HTML.
(function () {
  const $ = (id) => document.getElementById(id);
  const history = [];
  let prev = null;

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = String(text);
    return e;
  }
  function num(n) {
    if (n === null || n === undefined || Number.isNaN(n)) return "–";
    if (Math.abs(n) >= 1e9) return (n / 1e9).toFixed(1) + " G";
    if (Math.abs(n) >= 1e6) return (n / 1e6).toFixed(1) + " M";
    if (Math.abs(n) >= 1e4) return (n / 1e3).toFixed(1) + " k";
    return Number.isInteger(n) ? String(n) : n.toFixed(1);
  }
  function bytes(n) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : String(n)) + " " + units[i];
  }
  function secs(s) {
    if (s === null || s === undefined) return "–";
    if (s < 1e-3) return (s * 1e6).toFixed(0) + " µs";
    if (s < 1) return (s * 1e3).toFixed(s < 0.01 ? 2 : 1) + " ms";
    return s.toFixed(2) + " s";
  }
  function uptime(s) {
    const d = Math.floor(s / 86400), h = Math.floor(s / 3600) % 24, m = Math.floor(s / 60) % 60;
    return (d ? d + "d " : "") + (d || h ? h + "h " : "") + m + "m " + Math.floor(s % 60) + "s";
  }
  // Sets a field: the shown text, and the raw value in data-value for scripts and tests.
  function set(id, text, value) {
    const e = $(id);
    e.textContent = text;
    if (value !== undefined && value !== null) e.dataset.value = String(value);
  }
  function rate(cur, old, dt) {
    if (old === undefined || old === null || dt <= 0) return null;
    return Math.max(0, (cur - old) / dt);
  }
  // Cumulative buckets [[upper bound or null (+Inf), count], ...]: the q quantile, as
  // Prometheus' histogram_quantile interpolates it.
  function quantile(buckets, q) {
    if (!buckets.length) return null;
    const total = buckets[buckets.length - 1][1];
    if (total <= 0) return null;
    const rank = q * total;
    let lower = 0, below = 0;
    for (const [le, count] of buckets) {
      if (count >= rank) {
        if (le === null) return lower;
        const inside = count - below;
        return lower + (le - lower) * (inside > 0 ? (rank - below) / inside : 1);
      }
      lower = le === null ? lower : le;
      below = count;
    }
    return lower;
  }
  // The histogram of what happened since `old` (same bounds).
  function since(cur, old) {
    if (!old || old.buckets.length !== cur.buckets.length) return cur;
    return {
      count: cur.count - old.count,
      sum_seconds: cur.sum_seconds - old.sum_seconds,
      buckets: cur.buckets.map((b, i) => [b[0], b[1] - old.buckets[i][1]]),
    };
  }
  function recent(cur, old) {
    const h = since(cur, old);
    if (h.count > 0) return { p99: quantile(h.buckets, 0.99), mean: h.sum_seconds / h.count };
    return { p99: cur.p99_seconds, mean: cur.mean_seconds };
  }
  function bar(value, max, cls) {
    const b = el("div", "bar" + (cls ? " " + cls : ""));
    const fill = el("span");
    const share = max > 0 ? Math.min(1, value / max) : 0;
    fill.style.width = (share * 100).toFixed(1) + "%";
    b.appendChild(fill);
    return b;
  }
  function cell(row, content, cls) {
    const td = el("td", cls);
    if (content instanceof Node) td.appendChild(content); else td.textContent = content;
    row.appendChild(td);
  }
  function byKey(list, key) {
    const m = new Map();
    for (const x of list || []) m.set(x[key], x);
    return m;
  }
  function spark(values) {
    const c = $("spark"), g = c.getContext && c.getContext("2d");
    if (!g) return;
    g.clearRect(0, 0, c.width, c.height);
    const max = Math.max(1, ...values);
    g.strokeStyle = getComputedStyle(document.documentElement).getPropertyValue("--bar").trim() || "#3b82f6";
    g.lineWidth = 2;
    g.beginPath();
    values.forEach((v, i) => {
      const x = values.length > 1 ? (i / (values.length - 1)) * (c.width - 2) + 1 : 1;
      const y = c.height - 2 - (v / max) * (c.height - 4);
      if (i) g.lineTo(x, y); else g.moveTo(x, y);
    });
    g.stroke();
  }

  function header(d) {
    set("version", d.version);
    set("uptime", uptime(d.uptime_seconds), d.uptime_seconds);
    set("generation", String(d.generation), d.generation);
    set("reloads-failed", String(d.reloads.failed), d.reloads.failed);
    $("reloads-failed").className = d.reloads.failed > 0 ? "hot" : "";
    set("config", d.config_hash);
  }
  function cards(d, o, dt) {
    const rr = rate(d.requests, o && o.requests, dt);
    if (rr !== null) { history.push(rr); if (history.length > 60) history.shift(); }
    set("req-rate", num(rr), rr);
    spark(history);
    set("requests", num(d.requests), d.requests);
    const hs = d.handshakes, ohs = o && o.handshakes;
    const hr = rate(hs.total, ohs && ohs.total, dt);
    set("hs-rate", num(hr), hr);
    set("hs-full", num(hs.full), hs.full);
    set("hs-resumed", num(hs.resumed), hs.resumed);
    const all = hs.full + hs.resumed;
    set("hs-resumed-share", all ? (100 * hs.resumed / all).toFixed(0) + "%" : "–");
    set("hs-failed", num(hs.failed), hs.failed);
    set("jobs-paused", num(hs.jobs_paused), hs.jobs_paused);
    set("connections", num(d.connections), d.connections);
    let h1 = 0, h2 = 0;
    for (const w of d.workers.rows) { h1 += w.http1; h2 += w.h2; }
    set("conn-h1", num(h1), h1);
    set("conn-h2", num(h2), h2);
    set("conn-hs", num(Math.max(0, d.connections - h1 - h2)));
    const lat = recent(d.request_latency, o && o.request_latency);
    set("req-p99", secs(lat.p99), lat.p99);
    set("req-mean", secs(lat.mean), lat.mean);
    const e5 = rate(d.responses["5xx"], o && o.responses["5xx"], dt);
    set("err-rate", num(e5), e5);
    $("err-rate").className = e5 > 0 ? "hot" : "";
    const e4 = rate(d.responses["4xx"], o && o.responses["4xx"], dt);
    set("client-err-rate", num(e4), e4);
  }
  function engines(d, o, dt) {
    const box = $("engines");
    const olds = byKey(o && o.engines.rows, "engine");
    const cards = d.engines.rows.map((e) => {
      const old = olds.get(e.engine);
      const c = el("div", "card engine");
      c.dataset.engine = e.engine;
      c.appendChild(el("h3", "", e.engine));
      const dl = el("dl");
      const item = (label, content, cls) => {
        dl.appendChild(el("dt", "", label));
        const dd = el("dd", cls);
        if (content instanceof Node) dd.appendChild(content); else dd.textContent = content;
        dl.appendChild(dd);
        return dd;
      };
      const peak = Math.max(1, e.in_flight_peak);
      const inFlight = item("in flight", num(e.in_flight) + " (peak " + num(e.in_flight_peak) + ")");
      inFlight.classList.add("in-flight");
      inFlight.appendChild(bar(e.in_flight, peak));
      const queue = item("queue depth", num(e.queue_depth));
      queue.appendChild(bar(e.queue_depth, Math.max(peak, e.queue_depth), "q"));
      const ops = rate(e.completed, old && old.completed, dt);
      item("ops/s", num(ops)).classList.add("ops-rate");
      const lat = recent(e.latency, old && old.latency);
      item("latency", "mean " + secs(lat.mean) + " · p99 " + secs(lat.p99));
      const fb = rate(e.fallback, old && old.fallback, dt);
      item("fallbacks", num(e.fallback) + (fb ? " (" + num(fb) + "/s)" : ""), e.fallback > 0 ? "hot fallbacks" : "fallbacks");
      const trouble = e.failed + e.timed_out + e.saturated;
      item("failed · timed out · full", num(e.failed) + " · " + num(e.timed_out) + " · " + num(e.saturated), trouble > 0 ? "hot" : "");
      item("submitted", num(e.submitted) + " in " + num(e.batches) + " batches");
      if (e.servers.rows.length) {
        const list = el("dd");
        for (const s of e.servers.rows) {
          list.appendChild(el("span", "pill " + (s.up ? "ok" : "bad"), s.server));
          list.appendChild(document.createTextNode(" "));
        }
        dl.appendChild(el("dt", "", "key servers"));
        dl.appendChild(list);
      }
      c.appendChild(dl);
      return c;
    });
    if (!cards.length) cards.push(el("p", "empty", "No engines."));
    if (d.engines.omitted) cards.push(el("p", "note", d.engines.omitted + " more engines not shown."));
    box.replaceChildren(...cards);
  }
  function workers(d, o, dt) {
    const olds = byKey(o && o.workers.rows, "worker");
    const max = Math.max(1, ...d.workers.rows.map((w) => w.connections));
    $("workers").replaceChildren(...d.workers.rows.map((w) => {
      const old = olds.get(w.worker);
      const tr = el("tr");
      cell(tr, w.worker);
      const conns = el("div");
      conns.appendChild(el("span", "", num(w.connections)));
      conns.appendChild(bar(w.connections, max));
      cell(tr, conns);
      cell(tr, num(w.http1), "n");
      cell(tr, num(w.h2), "n");
      cell(tr, num(rate(w.requests, old && old.requests, dt)), "n");
      cell(tr, num(w.requests), "n");
      cell(tr, num(w.handshakes), "n");
      cell(tr, num(w.handshakes_failed), "n");
      return tr;
    }));
    $("workers-omitted").textContent = d.workers.omitted ? d.workers.omitted + " more workers not shown." : "";
  }
  function compression(d) {
    const c = d.compression;
    set("chunks-in-flight", num(c.chunks_in_flight), c.chunks_in_flight);
    set("compression-fallbacks", num(c.fallbacks), c.fallbacks);
    set("compression-hits", num(c.cache_hits), c.cache_hits);
    set("sidecar-hits", num(c.sidecar_hits), c.sidecar_hits);
    $("codecs").replaceChildren(...c.codecs.map((k) => {
      const tr = el("tr");
      tr.dataset.codec = k.codec;
      cell(tr, k.codec);
      cell(tr, num(k.responses), "n");
      cell(tr, bytes(k.bytes_in), "n");
      cell(tr, bytes(k.bytes_out), "n");
      cell(tr, k.ratio === null ? "–" : k.ratio.toFixed(2) + "×", "n ratio");
      // the share of the bytes saved
      cell(tr, bar(k.ratio ? 1 - 1 / k.ratio : 0, 1));
      return tr;
    }));
  }
  function cache(d) {
    const c = d.cache;
    set("cache-hits", num(c.hits), c.hits);
    set("cache-misses", num(c.misses), c.misses);
    set("cache-stale", num(c.stale), c.stale);
    set("cache-ratio", c.hit_ratio === null ? "–" : (100 * c.hit_ratio).toFixed(1) + " %", c.hit_ratio);
    set("cache-collapsed", num(c.collapsed), c.collapsed);
    set("cache-objects", num(c.objects), c.objects);
    set("cache-bytes", bytes(c.bytes), c.bytes);
    set("cache-evictions", num(c.evictions), c.evictions);
  }
  function upstreams(d) {
    const u = d.upstreams;
    $("upstreams-summary").textContent = u.total
      ? u.total + " upstreams, " + u.down + " down, " + num(u.in_flight) + " requests in flight" +
        (u.omitted ? " (" + u.omitted + " not shown)" : "")
      : "No proxy routes.";
    $("upstreams").replaceChildren(...u.rows.map((x) => {
      const tr = el("tr");
      cell(tr, x.route);
      cell(tr, x.upstream);
      cell(tr, el("span", "pill " + (x.up ? "ok" : "bad"), x.up ? "up" : "down"));
      cell(tr, num(x.in_flight), "n");
      cell(tr, num(x.failures), "n");
      cell(tr, num(x.down_workers), "n");
      return tr;
    }));
  }
  function fleet(d) {
    const f = d.fleet;
    $("fleet-section").hidden = !f;
    if (!f) return;
    $("fleet-node").textContent = f.node;
    $("fleet-store").textContent = f.store;
    const st = $("fleet-state");
    st.textContent = f.connected ? "connected" : "down since " + new Date(f.down_since * 1000).toISOString();
    st.className = "pill " + (f.connected ? "ok" : "bad");
    $("fleet-nodes").replaceChildren(...(f.nodes || []).map((x) => {
      const tr = el("tr");
      cell(tr, String(x.name));
      cell(tr, String(x.version ?? "–"));
      cell(tr, String(x.pid ?? "–"), "n");
      cell(tr, x.started ? new Date(x.started * 1000).toISOString() : "–");
      return tr;
    }));
  }
  function state(text, cls) {
    const s = $("state");
    s.textContent = text;
    s.className = "pill " + cls;
  }

  async function tick() {
    try {
      const r = await fetch("/status.json", { cache: "no-store" });
      if (!r.ok) throw new Error("HTTP " + r.status);
      const d = await r.json();
      const now = performance.now() / 1000;
      const o = prev && prev.doc, dt = prev ? now - prev.at : 0;
      header(d);
      cards(d, o, dt);
      engines(d, o, dt);
      workers(d, o, dt);
      compression(d);
      cache(d);
      upstreams(d);
      fleet(d);
      prev = { at: now, doc: d };
      state("live", "ok");
    } catch (e) {
      state("stale: " + e.message, "bad");
    }
    setTimeout(tick, 1000);
  }
  tick();
})();
