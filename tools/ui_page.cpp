#include "tools/ui_page.h"

namespace shoal::tools {
namespace {

// Plain JavaScript and <canvas>, no library: the page works offline and its whole behaviour is
// in this file. Names from the disk are only ever put in the page with textContent, never as
// HTML.
constexpr std::string_view kPage = R"SHOALPAGE(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Shoal dashboard</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 16px; color: #222; background: #fafafa; }
h1 { font-size: 20px; margin: 0 0 8px 0; }
h2 { font-size: 16px; margin: 16px 0 6px 0; }
h3 { font-size: 14px; margin: 0 0 6px 0; }
table { border-collapse: collapse; background: #fff; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; white-space: nowrap; }
th { background: #eee; }
.status-running { color: #0a6; font-weight: bold; }
.status-failed, .status-unreadable { color: #c22; font-weight: bold; }
.status-succeeded { color: #246; }
#compare { display: flex; flex-wrap: wrap; gap: 12px; }
.panel { background: #fff; border: 1px solid #ccc; padding: 8px; }
.legend span { display: inline-block; margin-right: 10px; font-size: 12px; }
.legend i { display: inline-block; width: 12px; height: 3px; vertical-align: middle; margin-right: 3px; }
.brow { display: flex; align-items: center; font-size: 12px; margin: 2px 0; }
.brow .label { width: 60px; }
.brow .bar { display: flex; width: 280px; height: 12px; background: #f0f0f0; }
.brow .compute { background: #3b7dd8; }
.brow .comm { background: #f0a030; }
.brow .wait { background: #c03030; }
.configuration { font-size: 12px; margin: 6px 0; }
.configuration td { font-family: monospace; white-space: normal; word-break: break-all; }
.brow .nums { margin-left: 8px; color: #555; }
.brow .straggler-tag { margin-left: 8px; color: #fff; background: #c22; border-radius: 3px;
  padding: 0 5px; font-weight: bold; }
.brow.straggler .label { color: #c22; font-weight: bold; }
#status { color: #666; font-size: 12px; margin-left: 12px; }
#window-error { color: #c22; font-size: 12px; margin-left: 8px; }
canvas.timeline { cursor: crosshair; }
</style>
</head>
<body>
<h1>Shoal dashboard <span id="status">loading</span></h1>
<table id="runs">
<thead><tr><th>compare</th><th>run</th><th>status</th><th>ranks</th><th>started</th>
<th>duration</th><th>git revision</th></tr></thead>
<tbody></tbody>
</table>
<h2>Curves</h2>
<label>metric <select id="metric"></select></label>
<span id="window-controls" style="margin-left: 16px">timeline:
<label>from step <input id="from-step" type="text" inputmode="numeric" placeholder="latest"
 style="width: 80px"></label>
<label>steps <input id="window" type="text" inputmode="numeric" value="20"
 style="width: 60px"></label>
<button id="window-reset" type="button">reset</button>
<span id="window-error"></span></span>
<div><canvas id="overlay" width="960" height="200" data-points="0"></canvas>
<div id="overlay-legend" class="legend"></div></div>
<div id="compare"></div>
<script>
'use strict';
const token = new URLSearchParams(location.search).get('token') || '';
const palette = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2',
                 '#7f7f7f', '#bcbd22', '#17becf'];
const state = {
  runs: [],               // /api/runs, in its order
  selected: new Set(),    // run names compared
  chosen: false,          // the user changed the selection
  metric: '',
  series: new Map(),      // "run\u0000metric" -> {lastId, count, byRank: Map(rank -> [[step, value, wallNs]])}
  ticks: 0,
};

async function api(path) {
  const headers = token ? {'Authorization': 'Bearer ' + token} : {};
  const r = await fetch(path, {headers: headers, cache: 'no-store'});
  let body = null;
  try { body = await r.json(); } catch (e) { body = null; }
  if (!r.ok) throw new Error(path + ': ' + r.status + ' ' + (body && body.error ? body.error : ''));
  return body;
}

function seriesOf(run, metric) {
  const key = run + '\u0000' + metric;
  let s = state.series.get(key);
  if (!s) {
    s = {lastId: 0, count: 0, byRank: new Map()};
    state.series.set(key, s);
  }
  return s;
}

// Appends the points logged since the last poll (a few pages at most per tick).
async function poll(run, metric) {
  const s = seriesOf(run, metric);
  for (let page = 0; page < 10; ++page) {
    const d = await api('/api/runs/' + encodeURIComponent(run) + '/series?metric=' +
                        encodeURIComponent(metric) + '&after=' + s.lastId);
    for (const p of d.points) {
      if (!s.byRank.has(p.rank)) s.byRank.set(p.rank, []);
      s.byRank.get(p.rank).push([p.step, p.value, p.wall_ns]);
      ++s.count;
    }
    s.lastId = d.last_id;
    if (!d.more) break;
  }
  return s;
}

function fmtDuration(sec) {
  sec = Math.round(sec);
  const h = Math.floor(sec / 3600), m = Math.floor(sec / 60) % 60, s = sec % 60;
  return (h ? h + 'h ' : '') + (h || m ? m + 'm ' : '') + s + 's';
}

function fmtValue(v) {
  if (v === null || v === undefined || !isFinite(v)) return 'NaN';
  const a = Math.abs(v);
  return a !== 0 && (a < 1e-3 || a >= 1e5) ? v.toExponential(3) : String(+v.toPrecision(4));
}

function cell(tr, text, cls) {
  const td = document.createElement('td');
  td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

function renderRuns() {
  const tbody = document.querySelector('#runs tbody');
  tbody.replaceChildren();
  for (const r of state.runs) {
    const tr = document.createElement('tr');
    tr.dataset.run = r.name;
    tr.dataset.status = r.status;
    const box = document.createElement('input');
    box.type = 'checkbox';
    box.className = 'run-select';
    box.checked = state.selected.has(r.name);
    box.addEventListener('change', () => {
      state.chosen = true;
      if (box.checked) state.selected.add(r.name); else state.selected.delete(r.name);
      renderControls();
      tick(true);
    });
    cell(tr, '').appendChild(box);
    cell(tr, r.name, 'run-name');
    cell(tr, r.status, 'status-' + r.status);
    cell(tr, r.ranks === undefined ? '' : String(r.ranks));
    cell(tr, r.started_ns ? new Date(r.started_ns / 1e6).toLocaleString() : '');
    cell(tr, r.duration_s === undefined ? '' : fmtDuration(r.duration_s));
    cell(tr, r.git_revision ? r.git_revision.slice(0, 12) : (r.error || ''));
    tbody.appendChild(tr);
  }
}

// The metric menu: every metric of the compared runs; loss first when there is one.
function renderControls() {
  const names = new Set();
  for (const r of state.runs) {
    if (state.selected.has(r.name)) for (const m of r.metrics || []) names.add(m);
  }
  const sorted = [...names].sort();
  if (!state.metric || !names.has(state.metric)) {
    state.metric = names.has('loss') ? 'loss' : (sorted[0] || '');
  }
  const sel = document.getElementById('metric');
  const have = [...sel.options].map(o => o.value).join('\u0000');
  if (have !== sorted.join('\u0000')) {
    sel.replaceChildren();
    for (const m of sorted) {
      const o = document.createElement('option');
      o.value = m;
      o.textContent = m;
      sel.appendChild(o);
    }
  }
  sel.value = state.metric;
}

// The mean over ranks at each step that any rank logged.
function meanOverRanks(byRank) {
  const acc = new Map();
  for (const pts of byRank.values()) {
    for (const [step, v] of pts) {
      if (v === null) continue;
      const a = acc.get(step) || [0, 0];
      a[0] += v;
      a[1] += 1;
      acc.set(step, a);
    }
  }
  return [...acc.entries()].sort((x, y) => x[0] - y[0]).map(([s, a]) => [s, a[0] / a[1]]);
}

// Draws lines [{pts: [[x, y]], color, width}] on a canvas with its axes' ranges.
function drawChart(canvas, lines) {
  const ctx = canvas.getContext('2d');
  const W = canvas.width, H = canvas.height, L = 60, R = 10, T = 10, B = 24;
  ctx.clearRect(0, 0, W, H);
  ctx.fillStyle = '#fff';
  ctx.fillRect(0, 0, W, H);
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
  for (const l of lines) {
    for (const [x, y] of l.pts) {
      if (y === null || !isFinite(y)) continue;
      x0 = Math.min(x0, x); x1 = Math.max(x1, x);
      y0 = Math.min(y0, y); y1 = Math.max(y1, y);
    }
  }
  ctx.strokeStyle = '#999';
  ctx.strokeRect(L, T, W - L - R, H - T - B);
  ctx.fillStyle = '#555';
  ctx.font = '11px sans-serif';
  if (x0 > x1) {
    ctx.fillText('no points yet', L + 10, T + 20);
    return;
  }
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { y0 -= Math.abs(y0) * 0.1 + 1e-9; y1 += Math.abs(y1) * 0.1 + 1e-9; }
  const px = x => L + (x - x0) / (x1 - x0) * (W - L - R);
  const py = y => H - B - (y - y0) / (y1 - y0) * (H - T - B);
  ctx.fillText(fmtValue(y1), 2, T + 8);
  ctx.fillText(fmtValue(y0), 2, H - B);
  ctx.fillText('step ' + x0, L, H - 8);
  const right = 'step ' + x1;
  ctx.fillText(right, W - R - ctx.measureText(right).width, H - 8);
  for (const l of lines) {
    ctx.strokeStyle = l.color;
    ctx.fillStyle = l.color;
    ctx.lineWidth = l.width || 1;
    // At most about two points per pixel: long runs stay cheap to draw.
    const stride = Math.max(1, Math.floor(l.pts.length / (2 * (W - L - R))));
    ctx.beginPath();
    let pen = false;
    for (let i = 0; i < l.pts.length; i += stride) {
      const [x, y] = l.pts[i];
      if (y === null || !isFinite(y)) { pen = false; continue; }
      if (pen) ctx.lineTo(px(x), py(y)); else ctx.moveTo(px(x), py(y));
      pen = true;
    }
    ctx.stroke();
    if (l.pts.length === 1 && l.pts[0][1] !== null) {
      ctx.fillRect(px(l.pts[0][0]) - 2, py(l.pts[0][1]) - 2, 4, 4);
    }
  }
}

function legend(div, items) {
  div.replaceChildren();
  for (const [label, color] of items) {
    const s = document.createElement('span');
    const i = document.createElement('i');
    i.style.background = color;
    s.appendChild(i);
    s.appendChild(document.createTextNode(label));
    div.appendChild(s);
  }
}

function panelFor(run) {
  const compare = document.getElementById('compare');
  for (const p of compare.children) if (p.dataset.run === run) return p;
  const p = document.createElement('div');
  p.className = 'panel';
  p.dataset.run = run;
  const h = document.createElement('h3');
  p.appendChild(h);
  const c = document.createElement('canvas');
  c.className = 'curve';
  c.width = 460;
  c.height = 240;
  c.dataset.run = run;
  p.appendChild(c);
  const lg = document.createElement('div');
  lg.className = 'legend';
  p.appendChild(lg);
  const bt = document.createElement('h3');
  bt.textContent = 'step time: compute | communication | waiting (last 50 steps)';
  p.appendChild(bt);
  const bk = document.createElement('div');
  bk.className = 'legend';
  legend(bk, [['compute', '#3b7dd8'], ['communication: moving data', '#f0a030'],
              ['waiting for peers', '#c03030']]);
  p.appendChild(bk);
  const b = document.createElement('div');
  b.className = 'breakdown';
  b.dataset.run = run;
  p.appendChild(b);
  const cf = document.createElement('details');
  cf.className = 'configuration';
  cf.dataset.run = run;
  const cs = document.createElement('summary');
  cs.textContent = 'configuration';
  cf.append(cs, document.createElement('table'));
  p.appendChild(cf);
  const tt = document.createElement('h3');
  tt.className = 'timeline-title';
  p.appendChild(tt);
  const t = document.createElement('canvas');
  t.className = 'timeline';
  t.width = 460;
  t.height = 120;
  t.dataset.run = run;
  watchTimeline(t);
  p.appendChild(t);
  compare.appendChild(p);
  return p;
}

// Note [Stragglers] in tools/run_summary.h: when the run logs the job's own verdict
// (`straggler`, at the job's threshold), a rank whose newest is 1 is marked; else a rank whose
// compute is above kStragglerRatio times the median rank's (the lower middle one of an even
// count), as `shoal report` does when the run logged no compute_ratio.
const kStragglerRatio = 1.3;

// Note [Step-time breakdown] in train/trainer.h: each step's communication_s and waiting_s,
// compute the rest of step_time_s; a step that logged neither (a run from before them) takes
// comm_wait_s as its communication, as `shoal report` does (tools/run_summary.h).
function renderBreakdown(div, run) {
  const steps = seriesOf(run, 'step_time_s').byRank;
  const byStep = (metric, r) => new Map((seriesOf(run, metric).byRank.get(r) || [])
      .filter(p => p[1] !== null).map(p => [p[0], p[1]]));
  const ratios = seriesOf(run, 'compute_ratio').byRank;
  const verdicts = seriesOf(run, 'straggler').byRank;
  const newest = (byRank, r) => (byRank.get(r) || []).filter(p => p[1] !== null).slice(-1)[0];
  const ranks = [...steps.keys()].sort((a, b) => a - b);
  const rows = ranks.map(r => {
    const comms = byStep('communication_s', r), waits = byStep('waiting_s', r);
    const old = byStep('comm_wait_s', r);
    const last = steps.get(r).filter(p => p[1] !== null && p[1] >= 0).slice(-50);
    let step = 0, comm = 0, wait = 0;
    for (const [s, v] of last) {
      const c = comms.has(s) || waits.has(s) ? (comms.get(s) || 0) : (old.get(s) || 0);
      const cc = Math.min(v, Math.max(0, c));
      step += v;
      comm += cc;
      wait += Math.min(v - cc, Math.max(0, waits.get(s) || 0));
    }
    const n = Math.max(1, last.length);
    return {rank: r, step: step / n, comm: comm / n, wait: wait / n,
            compute: Math.max(0, (step - comm - wait) / n)};
  });
  const top = Math.max(1e-12, ...rows.map(x => x.step));
  const sorted = rows.map(x => x.compute).sort((a, b) => a - b);
  const median = sorted.length ? sorted[Math.floor((sorted.length - 1) / 2)] : 0;
  div.replaceChildren();
  div.dataset.ranks = String(rows.length);
  if (!rows.length) div.textContent = 'no step_time_s logged';
  for (const x of rows) {
    const row = document.createElement('div');
    row.className = 'brow';
    row.dataset.rank = String(x.rank);
    row.dataset.computeS = String(x.compute);
    row.dataset.commS = String(x.comm);
    row.dataset.waitS = String(x.wait);
    const verdict = newest(verdicts, x.rank);
    const straggler = verdicts.size > 0
        ? verdict !== undefined && verdict[1] === 1
        : rows.length > 1 && median > 0 && x.compute > kStragglerRatio * median;
    if (straggler) {
      row.classList.add('straggler');
      row.dataset.straggler = '1';
    }
    const label = document.createElement('span');
    label.className = 'label';
    label.textContent = 'rank ' + x.rank;
    const bar = document.createElement('span');
    bar.className = 'bar';
    for (const [cls, seconds] of [['compute', x.compute], ['comm', x.comm], ['wait', x.wait]]) {
      const part = document.createElement('span');
      part.className = cls;
      part.style.width = (100 * seconds / top) + '%';
      bar.appendChild(part);
    }
    const nums = document.createElement('span');
    nums.className = 'nums';
    nums.textContent = (x.compute * 1e3).toFixed(1) + ' ms | ' + (x.comm * 1e3).toFixed(1) +
        ' ms | ' + (x.wait * 1e3).toFixed(1) + ' ms';
    // The job's own measure, when it logs one: its newest window.
    const ratio = newest(ratios, x.rank);
    if (ratio) nums.textContent += ' | compute_ratio ' + fmtValue(ratio[1]);
    row.append(label, bar, nums);
    if (straggler) {
      const tag = document.createElement('span');
      tag.className = 'straggler-tag';
      tag.textContent = 'straggler';
      row.appendChild(tag);
    }
    div.appendChild(row);
  }
}

// run.json's configuration (run/run_configuration.h): one row per entry, an object's entries
// (the environment) as key.NAME, absent (null) ones left out.
function renderConfiguration(details, run) {
  const table = details.querySelector('table');
  table.replaceChildren();
  const c = run.configuration;
  details.dataset.entries = '0';
  if (!c || typeof c !== 'object') {
    const tr = document.createElement('tr');
    cell(tr, 'not recorded');
    table.appendChild(tr);
    return;
  }
  const text = v => typeof v === 'string' ? v
      : Array.isArray(v) && v.every(a => typeof a === 'string') ? v.join(' ') : JSON.stringify(v);
  let entries = 0;
  const add = (key, value) => {
    const tr = document.createElement('tr');
    tr.dataset.key = key;
    cell(tr, key);
    cell(tr, text(value));
    table.appendChild(tr);
    ++entries;
  };
  for (const key of Object.keys(c).sort()) {
    const v = c[key];
    if (v === null) continue;
    if (typeof v === 'object' && !Array.isArray(v)) {
      for (const name of Object.keys(v).sort()) add(key + '.' + name, v[name]);
    } else {
      add(key, v);
    }
  }
  details.dataset.entries = String(entries);
}

// The timeline's window: the last `steps` steps of each rank (from === null), or the steps
// from..from+steps-1. Set by the two inputs, by dragging across a timeline, or by the page's
// address (?from_step=S&steps=N, kept there so a view can be shared); reset goes back to the
// last 20 steps.
const kDefaultWindow = 20, kMaxWindow = 2000;

// Whole numbers only, in [min, max]; null for an empty text; an Error naming the field otherwise.
function parseWhole(text, name, min, max) {
  text = String(text === null || text === undefined ? '' : text).trim();
  if (text === '') return null;
  if (!/^[0-9]+$/.test(text) || +text < min || +text > max) {
    throw new Error(name + ': expected a whole number from ' + min + ' to ' + max + ', got "' +
                    text.slice(0, 20) + '"');
  }
  return +text;
}

// The window the inputs ask for; a bad input is reported in one line and left out.
function timelineWindow() {
  const err = [];
  let from = null, steps = kDefaultWindow;
  try {
    from = parseWhole(document.getElementById('from-step').value, 'from step', 0,
                      Number.MAX_SAFE_INTEGER);
  } catch (e) { err.push(e.message); }
  try {
    const n = parseWhole(document.getElementById('window').value, 'steps', 1, kMaxWindow);
    if (n !== null) steps = n;
  } catch (e) { err.push(e.message); }
  const box = document.getElementById('window-error');
  box.textContent = err.join('; ');
  box.dataset.error = err.length ? '1' : '';
  return {from: from, steps: steps};
}

// The window into the page's address (the token, if any, stays).
function rememberWindow() {
  const q = new URLSearchParams(location.search);
  const w = timelineWindow();
  if (w.from === null) q.delete('from_step'); else q.set('from_step', String(w.from));
  if (w.steps === kDefaultWindow && w.from === null) q.delete('steps');
  else q.set('steps', String(w.steps));
  const s = q.toString();
  history.replaceState(null, '', location.pathname + (s ? '?' + s : ''));
}

function setWindow(from, steps) {
  document.getElementById('from-step').value = from === null ? '' : String(from);
  document.getElementById('window').value = String(steps);
  rememberWindow();
  renderPanels();
}

// A drag across a timeline under way: {canvas, x0, x1} in canvas pixels.
let drag = null;

function canvasX(canvas, event) {
  const box = canvas.getBoundingClientRect();
  return (event.clientX - box.left) * canvas.width / Math.max(1, box.width);
}

// Each rank's steps of the window on one wall-clock axis: each step ends when step_time_s was
// logged and lasted that long; its communication wait is its last part.
function renderTimeline(canvas, title, run) {
  const w = timelineWindow();
  const steps = seriesOf(run, 'step_time_s').byRank;
  const comms = seriesOf(run, 'comm_wait_s').byRank;
  const ranks = [...steps.keys()].sort((a, b) => a - b);
  const ctx = canvas.getContext('2d');
  const W = canvas.width, L = 60;
  canvas.height = Math.max(40, 18 * ranks.length + 24);
  const H = canvas.height;
  ctx.fillStyle = '#fff';
  ctx.fillRect(0, 0, W, H);
  let t0 = Infinity, t1 = -Infinity, shown = 0, first = Infinity, last = -Infinity;
  const bars = [];
  for (const r of ranks) {
    const commAt = new Map((comms.get(r) || []).map(p => [p[0], p[1]]));
    const pts = w.from === null ? steps.get(r).slice(-w.steps)
        : steps.get(r).filter(p => p[0] >= w.from && p[0] < w.from + w.steps);
    for (const [step, dur, wall] of pts) {
      if (dur === null) continue;
      const end = wall / 1e9, start = end - dur;
      const comm = Math.min(dur, commAt.get(step) || 0);
      bars.push({r: ranks.indexOf(r), step: step, start: start, end: end, comm: comm});
      t0 = Math.min(t0, start);
      t1 = Math.max(t1, end);
      first = Math.min(first, step);
      last = Math.max(last, step);
      ++shown;
    }
  }
  canvas.dataset.steps = String(shown);
  canvas.dataset.firstStep = shown ? String(first) : '';
  canvas.dataset.lastStep = shown ? String(last) : '';
  canvas.dataset.fromStep = w.from === null ? '' : String(w.from);
  canvas.dataset.window = String(w.steps);
  const span = t1 > t0 ? ' (' + ((t1 - t0) * 1e3).toFixed(0) + ' ms)' : '';
  title.textContent = (w.from === null ? 'timeline of the last ' + w.steps + ' steps'
      : 'timeline of steps ' + w.from + ' to ' + (w.from + w.steps - 1)) +
      (shown ? ', drawn ' + first + ' to ' + last : ', none logged there') + span;
  const px = t => L + (t - t0) / Math.max(1e-9, t1 - t0) * (W - L - 10);
  // For a drag: pixels back to time, and the steps drawn.
  canvas._view = {bars: bars, t0: t0, t1: t1, L: L, W: W};
  ctx.font = '11px sans-serif';
  ranks.forEach((r, i) => { ctx.fillStyle = '#555'; ctx.fillText('rank ' + r, 2, 14 + 18 * i); });
  for (const b of bars) {
    const y = 4 + 18 * b.r;
    ctx.fillStyle = '#3b7dd8';
    ctx.fillRect(px(b.start), y, Math.max(1, px(b.end - b.comm) - px(b.start)), 14);
    ctx.fillStyle = '#f0a030';
    ctx.fillRect(px(b.end - b.comm), y, Math.max(0, px(b.end) - px(b.end - b.comm)), 14);
  }
  if (drag && drag.canvas === canvas) {
    ctx.fillStyle = 'rgba(40, 40, 40, 0.2)';
    ctx.fillRect(Math.min(drag.x0, drag.x1), 0, Math.abs(drag.x1 - drag.x0), H);
  }
}

// Dragging across a timeline zooms to the steps under the dragged span (of any rank).
function zoomTo(canvas, xa, xb) {
  const v = canvas._view;
  if (!v || !v.bars.length || v.t1 <= v.t0) return;
  const time = x => v.t0 + (x - v.L) / (v.W - v.L - 10) * (v.t1 - v.t0);
  const ta = time(Math.min(xa, xb)), tb = time(Math.max(xa, xb));
  const hit = v.bars.filter(b => b.end >= ta && b.start <= tb).map(b => b.step);
  if (!hit.length) return;
  const lo = Math.min(...hit), hi = Math.max(...hit);
  setWindow(lo, Math.min(kMaxWindow, hi - lo + 1));
}

function watchTimeline(canvas) {
  canvas.addEventListener('mousedown', e => {
    drag = {canvas: canvas, x0: canvasX(canvas, e), x1: canvasX(canvas, e)};
    e.preventDefault();
  });
  canvas.addEventListener('mousemove', e => {
    if (!drag || drag.canvas !== canvas) return;
    drag.x1 = canvasX(canvas, e);
    renderTimeline(canvas, canvas.parentNode.querySelector('.timeline-title'), canvas.dataset.run);
  });
}
window.addEventListener('mouseup', () => {
  if (!drag) return;
  const d = drag;
  drag = null;
  if (Math.abs(d.x1 - d.x0) >= 3) zoomTo(d.canvas, d.x0, d.x1); else renderPanels();
});

function renderPanels() {
  const compare = document.getElementById('compare');
  for (const p of [...compare.children]) if (!state.selected.has(p.dataset.run)) p.remove();
  const overlay = [];
  let overlayPoints = 0;
  let i = 0;
  for (const r of state.runs) {
    if (!state.selected.has(r.name)) continue;
    const p = panelFor(r.name);
    const s = seriesOf(r.name, state.metric);
    const mean = meanOverRanks(s.byRank);
    const lines = [];
    const items = [];
    for (const rank of [...s.byRank.keys()].sort((a, b) => a - b)) {
      const color = palette[rank % palette.length];
      lines.push({pts: s.byRank.get(rank), color: color, width: 1});
      items.push(['rank ' + rank, color]);
    }
    if (s.byRank.size > 1) {
      lines.push({pts: mean, color: '#000', width: 2.5});
      items.push(['mean over ranks', '#000']);
    }
    const c = p.querySelector('canvas.curve');
    c.dataset.metric = state.metric;
    c.dataset.points = String(s.count);
    c.dataset.ranks = String(s.byRank.size);
    drawChart(c, lines);
    legend(p.querySelector('.legend'), items);
    const last = mean.length ? mean[mean.length - 1][1] : null;
    p.querySelector('h3').textContent = r.name + ' (' + r.status + '): ' + state.metric +
        (last === null ? '' : ' = ' + fmtValue(last));
    renderBreakdown(p.querySelector('.breakdown'), r.name);
    renderConfiguration(p.querySelector('details.configuration'), r);
    renderTimeline(p.querySelector('canvas.timeline'), p.querySelector('.timeline-title'), r.name);
    const color = palette[i++ % palette.length];
    overlay.push({pts: mean, color: color, width: 2});
    overlayPoints += s.count;
    overlay.items = (overlay.items || []).concat([[r.name, color]]);
  }
  const oc = document.getElementById('overlay');
  oc.dataset.points = String(overlayPoints);
  drawChart(oc, overlay);
  legend(document.getElementById('overlay-legend'), overlay.items || []);
}

async function refreshRuns() {
  const d = await api('/api/runs');
  state.runs = d.runs.slice().sort((a, b) => (b.started_ns || 0) - (a.started_ns || 0));
  const names = new Set(state.runs.map(r => r.name));
  for (const n of [...state.selected]) if (!names.has(n)) state.selected.delete(n);
  if (!state.chosen) {
    state.selected = new Set(state.runs.slice(0, 4).map(r => r.name));
  }
  renderRuns();
  renderControls();
}

let busy = false, timer = null;
async function tick(now) {
  if (busy) return;
  busy = true;
  clearTimeout(timer);
  try {
    if (state.ticks++ % 3 === 0 || now) await refreshRuns();
    for (const r of state.runs) {
      if (!state.selected.has(r.name)) continue;
      if (state.metric) await poll(r.name, state.metric);
      await poll(r.name, 'step_time_s');
      await poll(r.name, 'comm_wait_s');
      await poll(r.name, 'communication_s');
      await poll(r.name, 'waiting_s');
      await poll(r.name, 'compute_ratio');
      await poll(r.name, 'straggler');
    }
    renderPanels();
    const st = document.getElementById('status');
    st.textContent = 'updated ' + new Date().toLocaleTimeString();
    st.dataset.ok = '1';
  } catch (e) {
    document.getElementById('status').textContent = 'error: ' + e.message;
  }
  busy = false;
  timer = setTimeout(tick, 1000);
}

document.getElementById('metric').addEventListener('change', e => {
  state.metric = e.target.value;
  tick(false);
});
for (const id of ['from-step', 'window']) {
  document.getElementById(id).addEventListener('change', () => {
    rememberWindow();
    renderPanels();
  });
}
document.getElementById('window-reset').addEventListener('click',
                                                         () => setWindow(null, kDefaultWindow));
{
  // The window the address names (a shared view); checked like typed input.
  const q = new URLSearchParams(location.search);
  if (q.has('from_step')) document.getElementById('from-step').value = q.get('from_step');
  if (q.has('steps')) document.getElementById('window').value = q.get('steps');
  timelineWindow();
}
tick(true);
</script>
</body>
</html>
)SHOALPAGE";

}  // namespace

std::string_view uiPage() {
  return kPage;
}

}  // namespace shoal::tools
