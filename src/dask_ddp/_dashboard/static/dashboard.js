// The dask-ddp job pages: read the JSON twins every few seconds and draw them.
// Self-contained (no external scripts); the curve is inline SVG.
"use strict";
(function () {
  const body = document.body;
  const view = body.dataset.view;
  const refreshMs = parseInt(body.dataset.refreshMs, 10) || 2000;
  const path = location.pathname;
  const root = path.slice(0, path.indexOf("/dask-ddp/") + "/dask-ddp/".length);
  const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                  "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  let chosenMetric = null;

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v; else if (k === "text") e.textContent = v;
      else e.setAttribute(k, v);
    }
    for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c));
    return e;
  }
  function svg(tag, attrs) {
    const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    return e;
  }
  const badge = (text, cls) => el("span", {class: "badge " + cls, text: text});
  const fixed = (v, d) => (v === null || v === undefined) ? "–" : Number(v).toFixed(d);
  function num(v) {
    if (v === null || v === undefined) return "–";
    if (typeof v !== "number") return String(v);
    if (Number.isInteger(v)) return String(v);
    const a = Math.abs(v);
    return (a !== 0 && (a < 1e-3 || a >= 1e5)) ? v.toExponential(3) : v.toPrecision(4);
  }
  function bytes(n) {
    if (n === null || n === undefined) return "–";
    const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return n.toFixed(i ? 1 : 0) + " " + u[i];
  }
  function duration(s) {
    s = Math.max(0, Math.round(s));
    const h = Math.floor(s / 3600), m = Math.floor(s % 3600 / 60), x = s % 60;
    return h ? `${h}h ${m}m ${x}s` : m ? `${m}m ${x}s` : `${x}s`;
  }
  const clock = (t) => t ? new Date(t * 1000).toLocaleString() : "–";
  function stamp(ok) {
    document.getElementById("updated").textContent =
      (ok ? "updated " : "scheduler not answering; last update ") +
      new Date().toLocaleTimeString();
  }
  async function getJSON(url) {
    const r = await fetch(url, {cache: "no-store"});
    const data = await r.json();
    if (!r.ok) throw new Error(data.error || r.statusText);
    return data;
  }

  // ---------------------------------------------------------------- the jobs list
  function drawJobs(data) {
    const tbody = document.querySelector("#jobs tbody");
    tbody.replaceChildren();
    if (!data.jobs.length) {
      tbody.append(el("tr", {}, el("td", {colspan: 8, class: "muted",
        text: "No dask-ddp job has run on this cluster yet."})));
    }
    for (const j of data.jobs) {
      const link = el("a", {href: root + "job/" + encodeURIComponent(j.id), text: j.name});
      tbody.append(el("tr", {"data-job": j.id},
        el("td", {}, link), el("td", {class: "muted", text: j.id.slice(0, 12)}),
        el("td", {}, badge(j.state, "s-" + j.state)),
        el("td", {class: "num", text: j.world_size}),
        el("td", {class: "num", text: j.attempt + (j.max_restarts ? ` / ${j.max_restarts}` : "")}),
        el("td", {text: clock(j.start)}), el("td", {text: duration(j.duration_s)}),
        el("td", {text: j.hosts.join(", ")})));
    }
  }

  // ---------------------------------------------------------------- one job
  function fact(dl, name, value) {
    dl.append(el("div", {}, el("dt", {text: name}), el("dd", {text: value})));
  }
  function banner(kind, title, ...content) {
    return el("div", {class: "banner " + kind}, el("h3", {text: title}), ...content);
  }
  function drawBanners(job) {
    const box = document.getElementById("banners");
    box.replaceChildren();
    const ranks = job.ranks;
    const flagged = (f) => ranks.filter((r) => r.flags.includes(f)).map((r) => r.rank);
    if (job.state === "failed") {
      const c = job.root_cause;
      const head = c ? `Failed: rank ${c.rank} on ${c.worker} (${c.kind})` : "Failed";
      box.append(banner("bad", head, el("div", {text: c ? c.message : "no failure record"}),
        ...(c && c.traceback ? [el("pre", {text: c.traceback})] : [])));
    }
    if (job.state === "stalled" && job.stall) {
      const s = job.stall;
      const stacks = Object.entries(s.stacks || {}).map(([r, text]) =>
        el("details", {open: ""}, el("summary", {text: `rank ${r} stack`}), el("pre", {text: text})));
      const what = s.collective ? `blocked in ${s.collective}` : "blocked or frozen";
      const ended = s.final ? " (the stall ended the job)" : "";
      box.append(banner("bad", `Stalled: rank(s) ${s.ranks.join(", ")} ${what}${ended}`,
        ...(s.message ? [el("div", {text: s.message})] : []), ...stacks));
    }
    const diverged = ranks.filter((r) => r.diverged);
    if (diverged.length) {
      const first = diverged.reduce((a, b) => (b.diverged.step ?? Infinity) < (a.diverged.step ?? Infinity) ? b : a);
      const d = first.diverged;
      const since = d.step === null || d.step === undefined ? "" : ` since step ${d.step}`;
      box.append(banner("bad", `${d.metric} is ${d.value}${since}`,
        el("div", {text: `Rank(s) ${diverged.map((r) => r.rank).join(", ")} report a non-finite ` +
          `${d.metric}: the training diverged (a learning rate too high, a bad batch, an ` +
          "overflow). The curves leave those points out."})));
    }
    for (const u of job.unread || []) {
      const since = typeof u.seconds === "number" ? ` for ${duration(u.seconds)}` : "";
      box.append(banner("warn", `Results nobody reads: ${u.topic}`,
        el("div", {text: `This topic is full${since} (${bytes(u.used)} of ${bytes(u.budget)}) ` +
          "and no client reads it: the ranks writing to it wait in report() or " +
          "submit_result() until it is read. Read the job's results (job.result(), " +
          "job.metrics(), process_results) or raise dask-ddp.results.budget."})));
    }
    const input = flagged("input-bound"), slow = flagged("straggler");
    if (input.length) {
      box.append(banner("warn", `Input-bound: rank(s) ${input.join(", ")}`,
        el("div", {text: "These ranks wait for data more than a third of their step time: " +
          "more loader threads, a faster store or a lighter transform will speed the job up."})));
    }
    if (slow.length) {
      box.append(banner("warn", `Straggler: rank(s) ${slow.join(", ")}`,
        el("div", {text: `Under 0.8x the median step rate (${fixed(job.median_steps_per_s, 2)} steps/s): ` +
          "DDP waits for the slowest rank at every step."})));
    }
    if (job.state === "running" && !input.length && !slow.length && !(job.unread || []).length) {
      box.append(banner("ok", "Healthy", el("div", {text:
        "Every rank is stepping; no rank is input-bound or straggling."})));
    }
    if (job.state === "starting") {
      box.append(banner("info", "Starting", el("div", {text: "Waiting for the ranks' first samples."})));
    }
    if (job.state === "done") {
      box.append(banner("ok", "Done", el("div", {text: "Every rank finished."})));
    }
  }
  function drawRanks(job) {
    const tbody = document.querySelector("#ranks tbody");
    tbody.replaceChildren();
    for (const r of job.ranks) {
      const flags = el("td", {});
      for (const f of r.flags) flags.append(badge(f, "f-" + f));
      if (!r.flags.length && r.state === "running" && job.state === "running") {
        flags.append(badge("ok", "f-healthy"));
      }
      let wait = el("td", {class: "num", text: r.step_source === "report" ? "n/a (not a Loader)" : "–"});
      if (r.wait_fraction !== null) {
        const pct = 100 * r.wait_fraction;
        const bar = el("span", {class: "waitbar"}, el("span", {class: pct > 33.3 ? "hot" : "",
          style: `width:${Math.min(100, pct).toFixed(0)}%`}));
        wait = el("td", {class: "num"}, `${fixed(r.wait_ms_per_step, 1)} ms (${pct.toFixed(0)}%)`, bar);
      }
      const metrics = Object.entries(r.metrics).map(([k, v]) => `${k}=${num(v)}`).join("  ");
      const state = r.state === "exited" && r.exit ? `${r.state} (${r.exit})` : r.state;
      const cls = r.flags.includes("failed") ? "failed" : r.flags.length ? "flagged" : "";
      tbody.append(el("tr", {class: cls, "data-rank": r.rank},
        el("td", {class: "num", text: r.rank}), el("td", {}, badge(state, "s-" + r.state)), flags,
        el("td", {class: "num", text: fixed(r.steps_per_s, 2)}),
        el("td", {class: "num", text: r.step_ms === null ? "–" : `${fixed(r.step_ms, 1)} ms`}),
        wait,
        el("td", {class: "num", text: r.cpu_percent === null ? "–" : `${fixed(r.cpu_percent, 0)}%`}),
        el("td", {class: "num", text: bytes(r.rss_bytes)}),
        el("td", {class: "num", text: r.step === null ? "–" : r.step}),
        el("td", {class: "metrics", text: metrics || "–"}),
        el("td", {text: r.worker}), el("td", {text: r.host})));
    }
  }
  const tickText = (t) => String(+t.toPrecision(6));
  function ticks(lo, hi, n) {
    if (hi === lo) { hi = lo + 1; }
    const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
    const out = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi + 1e-12; t += step) out.push(t);
    return out;
  }
  function drawChart(job) {
    const select = document.getElementById("metric");
    const names = job.metric_names;
    if (!chosenMetric || !names.includes(chosenMetric)) chosenMetric = job.default_metric;
    if (select.options.length !== names.length ||
        [...select.options].some((o, i) => o.value !== names[i])) {
      select.replaceChildren(...names.map((n) => el("option", {value: n, text: n})));
    }
    if (chosenMetric) select.value = chosenMetric;
    const box = document.getElementById("chart");
    box.replaceChildren();
    if (!chosenMetric) { box.append(el("div", {class: "muted", text: "No metric reported yet (report())."})); return; }
    const series = Object.entries(job.curves).map(([rank, c]) => [rank, c[chosenMetric] || []])
      .filter(([, pts]) => pts.length);
    const all = series.flatMap(([, pts]) => pts);
    if (!all.length) { box.append(el("div", {class: "muted", text: "No points yet."})); return; }
    const W = 900, H = 280, L = 64, R = 110, T = 12, B = 34;
    let [x0, x1] = [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
    let [y0, y1] = [Math.min(...all.map((p) => p[1])), Math.max(...all.map((p) => p[1]))];
    if (x1 === x0) { x1 = x0 + 1; }
    if (y1 === y0) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
    const sx = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
    const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
    const s = svg("svg", {viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": `${chosenMetric} by step`});
    for (const t of ticks(y0, y1, 5)) {
      s.append(svg("line", {class: "gridline", x1: L, x2: W - R, y1: sy(t), y2: sy(t)}));
      const lab = svg("text", {x: L - 6, y: sy(t) + 4, "text-anchor": "end"}); lab.textContent = tickText(t); s.append(lab);
    }
    for (const t of ticks(x0, x1, 8)) {
      const lab = svg("text", {x: sx(t), y: H - B + 16, "text-anchor": "middle"}); lab.textContent = tickText(t); s.append(lab);
    }
    s.append(svg("line", {class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B}));
    s.append(svg("line", {class: "axis", x1: L, x2: L, y1: T, y2: H - B}));
    const xl = svg("text", {x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle"}); xl.textContent = "step"; s.append(xl);
    series.forEach(([rank, pts], i) => {
      const color = COLORS[Number(rank) % COLORS.length];
      const d = pts.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ");
      s.append(svg("polyline", {points: d, fill: "none", stroke: color, "stroke-width": 2,
        "stroke-opacity": 0.85, "data-rank": rank}));
      const last = pts[pts.length - 1];
      s.append(svg("circle", {cx: sx(last[0]), cy: sy(last[1]), r: 3, fill: color}));
      const y = T + 14 + 16 * i;
      s.append(svg("line", {x1: W - R + 10, x2: W - R + 30, y1: y - 4, y2: y - 4, stroke: color, "stroke-width": 3}));
      const lab = svg("text", {x: W - R + 36, y: y, style: `fill:${color}`});
      lab.textContent = `rank ${rank}`; s.append(lab);
    });
    box.append(s);
  }
  function drawAttempts(job) {
    const sec = document.getElementById("attempts-section");
    sec.hidden = job.attempts.length < 2 && !job.max_restarts;
    const tbody = document.querySelector("#attempts tbody");
    tbody.replaceChildren();
    for (const a of job.attempts) {
      const c = a.root_cause;
      tbody.append(el("tr", {},
        el("td", {class: "num", text: a.attempt}), el("td", {class: "muted", text: a.job_id.slice(0, 12)}),
        el("td", {}, badge(a.state, "s-" + a.state)), el("td", {class: "num", text: a.world_size}),
        el("td", {text: clock(a.start)}), el("td", {text: clock(a.end)}),
        el("td", {text: c ? `rank ${c.rank} (${c.kind}): ${c.message}` : "–"})));
    }
  }
  function drawGenerations(job) {
    const gens = job.generations || [];
    document.getElementById("generations-section").hidden = gens.length === 0;
    const tbody = document.querySelector("#generations tbody");
    tbody.replaceChildren();
    for (const g of gens) {
      tbody.append(el("tr", {},
        el("td", {class: "num", text: g.generation}), el("td", {text: clock(g.time)}),
        el("td", {text: g.lost.join(", ") || "–"}), el("td", {text: g.joined.join(", ") || "–"}),
        el("td", {class: "num", text: g.world_size}), el("td", {class: "num", text: g.step}),
        el("td", {class: "num", text: `${(1000 * g.recovery_s).toFixed(0)} ms`}),
        el("td", {text: g.cause})));
    }
  }
  function drawJob(data) {
    const job = data.job;
    document.title = `dask-ddp: ${job.name}`;
    document.getElementById("title").textContent = job.name;
    const st = document.getElementById("state");
    st.textContent = job.state; st.className = "badge s-" + job.state;
    const dl = document.getElementById("facts"); dl.replaceChildren();
    fact(dl, "id", job.id.slice(0, 12));
    fact(dl, "world size", job.world_size);
    fact(dl, "attempt", job.attempt + (job.max_restarts ? ` (restarts ${job.restarts} of ${job.max_restarts})` : ""));
    fact(dl, "started", clock(job.start));
    fact(dl, "duration", duration(job.duration_s));
    fact(dl, "hosts", job.hosts.join(", "));
    document.getElementById("json-link").href = root + "api/job/" + encodeURIComponent(job.id);
    drawBanners(job); drawRanks(job); drawChart(job); drawAttempts(job); drawGenerations(job);
  }

  async function tick(schedule = true) {
    let ended = false;
    try {
      if (view === "jobs") {
        drawJobs(await getJSON(root + "api/jobs"));
      } else {
        const id = decodeURIComponent(path.slice(root.length + "job/".length).replace(/\/$/, ""));
        const query = chosenMetric ? "?metric=" + encodeURIComponent(chosenMetric) : "";
        const data = await getJSON(root + "api/job/" + encodeURIComponent(id) + query);
        drawJob(data);
        ended = data.job.end !== null;
      }
      stamp(true);
    } catch (e) {
      stamp(false);
      if (view === "job" && String(e.message).startsWith("no dask-ddp job")) {
        document.getElementById("banners").replaceChildren(banner("bad", "Unknown job", el("div", {text: e.message})));
      }
    }
    // An ended job's page refreshes 5 times less often (an elastic job may start again).
    if (schedule) setTimeout(tick, ended ? refreshMs * 5 : refreshMs);
  }
  if (view === "job") {
    document.getElementById("metric").addEventListener("change", (e) => {
      chosenMetric = e.target.value;
      tick(false);
    });
  }
  tick();
})();
