// console.js - the Lynx web console (docs/console.md): reads the JSON API
// of the coordinator that serves it (same origin), keeps the view current
// with /v1/watch (a long poll on the registry version) and a refresh every
// REFRESH_MS for the counters, which move without a version change, and
// shows /v1/events as they come. Drain and undrain call the API with the
// token typed in the header (kept for the browser session only).
//
// Scale: 10,000 accelerators are drawn on one canvas (a square each), and
// node tiles are shown PAGE at a time, worst health first: the page never
// holds more than a few hundred elements whatever the cluster's size.
'use strict';

const REFRESH_MS = 5000;
const WATCH_MS = 25000;
const PAGE = 200;       // node tiles per page
const LIST_LIMIT = 1000; // items per API page
const EVENTS_KEPT = 300;
// A rate spans at least this much heartbeat time: the heartbeat times are
// known to within the age of the coordinator's copy of the list (up to a
// second) and a heartbeat period, so a shorter span would be less exact.
const RATE_SPAN_MS = 8000;
// health classes, worst first (a node tile takes its worst accelerator's)
const SEVERITY = ['h-down', 'h-failed', 'h-stalled', 'h-draining',
  'h-drained', 'h-ready'];

const st = {
  version: null, nodes: [], accels: [], byNode: new Map(), frontends: [],
  services: [], mqueues: [], prev: new Map(), rates: new Map(),
  eventsNext: 0, events: [], page: 0, filter: '', selected: null,
  busy: false, again: false,
};

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else if (k.startsWith('data-')) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children)
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function status(msg) { $('status').textContent = msg || ''; }

async function api(path, opts) {
  const r = await fetch(path, opts);
  let body = null;
  try { body = await r.json(); } catch (e) { body = null; }
  if (!r.ok) {
    const m = body && body.error ? body.error.message : r.statusText;
    throw new Error(`${opts && opts.method || 'GET'} ${path}: ${r.status} ${m}`);
  }
  return body;
}

// Every item of a paged list (docs/api.md, "Pages of the big lists").
async function all(path) {
  let items = [], after = null, version = 0;
  for (;;) {
    const q = `${path}?limit=${LIST_LIMIT}` +
      (after ? `&after=${encodeURIComponent(after)}` : '');
    const r = await api(q);
    items = items.concat(r.items || []);
    version = r.version;
    if (!r.next) return { items, version };
    after = r.next;
  }
}

function accelClass(a, node) {
  const ns = node ? node.state : a.state;
  const h = a.health || {};
  if (ns === 'down') return 'h-down';
  if (h.device_lost || h.failed) return 'h-failed';
  if (h.stalled_mqueues > 0) return 'h-stalled';
  if (ns === 'draining') return 'h-draining';
  if (ns === 'drained') return 'h-drained';
  return 'h-ready';
}

function healthText(a, node) {
  const h = a.health || {};
  const c = accelClass(a, node);
  if (c === 'h-failed')
    return h.device_lost ? 'lost' : `failed: ${h.last_error || ''}`;
  if (c === 'h-stalled')
    return `stalled (${h.stalled_mqueues} mqueue${h.stalled_mqueues > 1 ? 's' : ''}, ${h.stall_ms} ms)`;
  return (node ? node.state : a.state) || '';
}

function worst(classes) {
  let best = SEVERITY.length - 1;
  for (const c of classes) best = Math.min(best, SEVERITY.indexOf(c));
  return SEVERITY[best];
}

function nodeClass(n) {
  if (n.state === 'down') return 'h-down';
  const as = st.byNode.get(n.id) || [];
  const c = as.length ? worst(as.map((a) => accelClass(a, n))) : 'h-ready';
  if (c === 'h-ready' && n.state !== 'ready') return `h-${n.state}`;
  return c;
}

const fmtNs = (ns) => !ns ? '-' : ns < 1e3 ? `${ns} ns`
  : ns < 1e6 ? `${(ns / 1e3).toFixed(1)} µs`
  : ns < 1e9 ? `${(ns / 1e6).toFixed(1)} ms` : `${(ns / 1e9).toFixed(2)} s`;
const fmtRate = (r) => r === undefined ? '-' : r < 10 ? r.toFixed(1)
  : Math.round(r).toLocaleString('en');
const fmtTime = (ms) => new Date(ms).toLocaleTimeString();

async function refresh() {
  if (st.busy) { st.again = true; return; }
  st.busy = true;
  try {
    do {
      st.again = false;
      // each node carries its accelerators as /v1/accelerators shows them:
      // one list, not two, at 10,000 accelerators
      const [nodes, fes, svcs, mqs] = await Promise.all([
        all('/v1/nodes'), api('/v1/frontends'), api('/v1/services'),
        api('/v1/mqueues')]);
      const now = performance.now();
      st.nodes = nodes.items;
      st.accels = st.nodes.flatMap((n) => n.accelerators || []);
      const hbAge = new Map(st.nodes.map((n) => [n.id, n.last_heartbeat_ms]));
      st.frontends = fes.items || [];
      st.services = svcs.items || [];
      st.mqueues = mqs.items || [];
      st.byNode = new Map();
      for (const a of st.accels) {
        if (!st.byNode.has(a.node)) st.byNode.set(a.node, []);
        st.byNode.get(a.node).push(a);
        // Counters move once per heartbeat: a rate is the growth between
        // two heartbeats over the time between them (when the node's last
        // heartbeat came: now less its age), not over the time between
        // two refreshes, which would read 0 or double. Over RATE_SPAN_MS
        // at least (see there).
        const hb = now - (hbAge.get(a.node) || 0);
        const p = st.prev.get(a.id);
        if (p && a.requests < p.requests) {
          st.rates.delete(a.id); // a new incarnation: counting anew
          st.prev.set(a.id, { requests: a.requests, hb });
        } else if (!p) {
          st.prev.set(a.id, { requests: a.requests, hb });
        } else if (hb - p.hb >= RATE_SPAN_MS) {
          st.rates.set(a.id, (a.requests - p.requests) * 1000 / (hb - p.hb));
          st.prev.set(a.id, { requests: a.requests, hb });
        }
      }
      await events();
      render();
      status('');
    } while (st.again);
  } catch (e) {
    status(`${e.message} — retrying`);
  } finally {
    st.busy = false;
  }
}

async function events() {
  for (;;) {
    const r = await api(`/v1/events?since=${st.eventsNext}&limit=1000`);
    for (const e of r.items) st.events.unshift(e);
    st.events.length = Math.min(st.events.length, EVENTS_KEPT);
    const more = r.items.length === 1000;
    st.eventsNext = r.next;
    if (!more) return;
  }
}

function render() {
  renderSummary();
  renderHeatmap();
  renderNodes();
  renderDetail();
  renderFrontends();
  renderServices();
  renderEvents();
}

function renderSummary() {
  const byState = { ready: 0, draining: 0, drained: 0, down: 0 };
  for (const n of st.nodes) byState[n.state] = (byState[n.state] || 0) + 1;
  let ok = 0, stalled = 0, failed = 0;
  const nodeOf = new Map(st.nodes.map((n) => [n.id, n]));
  for (const a of st.accels) {
    const c = accelClass(a, nodeOf.get(a.node));
    if (c === 'h-ready') ok++;
    if (c === 'h-stalled') stalled++;
    if (c === 'h-failed') failed++;
  }
  // unknown ('-') until an accelerator has a rate (RATE_SPAN_MS after the
  // page opened), not 0: the cluster may well be busy
  let rate;
  for (const r of st.rates.values()) rate = (rate || 0) + r;
  const active = st.frontends.filter((f) => f.connected && f.active).length;
  $('summary').replaceChildren(
    el('span', { id: 'sum-nodes' }, `${st.nodes.length} nodes: ${byState.ready} ready, ` +
      `${byState.draining} draining, ${byState.drained} drained, ${byState.down} down`),
    el('span', { id: 'sum-accels' }, `${st.accels.length} accelerators: ${ok} serving, ` +
      `${stalled} stalled, ${failed} failed or lost`),
    el('span', { id: 'sum-frontends' }, `${st.frontends.length} frontends (${active} active)`),
    el('span', { id: 'sum-rate' }, `${fmtRate(rate)} requests/s`),
    el('span', { class: 'muted' }, `version ${st.version}`));
  $('accel-count').textContent = `(${st.accels.length})`;
}

// One square per accelerator, in id order (grouped by node).
let heatCells = [];
function renderHeatmap() {
  const cv = $('heatmap');
  const n = st.accels.length;
  const width = cv.clientWidth || 960;
  const cell = Math.max(3, Math.min(14, Math.floor(Math.sqrt(width * 160 / Math.max(n, 1)))));
  const cols = Math.max(1, Math.floor(width / cell));
  cv.width = cols * cell;
  cv.height = Math.max(cell, Math.ceil(n / cols) * cell);
  const ctx = cv.getContext('2d');
  const css = getComputedStyle(document.documentElement);
  const color = {};
  for (const c of SEVERITY)
    color[c] = css.getPropertyValue(`--${c.slice(2)}`).trim() || '#999';
  const nodeOf = new Map(st.nodes.map((x) => [x.id, x]));
  ctx.clearRect(0, 0, cv.width, cv.height);
  heatCells = st.accels;
  st.accels.forEach((a, i) => {
    ctx.fillStyle = color[accelClass(a, nodeOf.get(a.node))];
    ctx.fillRect((i % cols) * cell, Math.floor(i / cols) * cell,
      cell - (cell > 4 ? 1 : 0), cell - (cell > 4 ? 1 : 0));
  });
  cv.dataset.cols = cols;
  cv.dataset.cell = cell;
}

function heatAt(ev) {
  const cv = $('heatmap');
  const r = cv.getBoundingClientRect();
  const scale = cv.width / r.width;
  const cell = Number(cv.dataset.cell), cols = Number(cv.dataset.cols);
  const x = Math.floor((ev.clientX - r.left) * scale / cell);
  const y = Math.floor((ev.clientY - r.top) * scale / cell);
  return x < cols ? heatCells[y * cols + x] : undefined;
}

function visibleNodes() {
  const f = st.filter.toLowerCase();
  const list = st.nodes.filter((n) => !f || n.id.toLowerCase().includes(f) ||
    n.state === f || nodeClass(n) === `h-${f}`);
  list.sort((a, b) => SEVERITY.indexOf(nodeClass(a)) - SEVERITY.indexOf(nodeClass(b)) ||
    (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  return list;
}

function renderNodes() {
  const list = visibleNodes();
  const pages = Math.max(1, Math.ceil(list.length / PAGE));
  st.page = Math.min(st.page, pages - 1);
  const shown = list.slice(st.page * PAGE, (st.page + 1) * PAGE);
  $('page').textContent = `${list.length} nodes, page ${st.page + 1} of ${pages}`;
  $('nodes').replaceChildren(...shown.map((n) => {
    const as = st.byNode.get(n.id) || [];
    const cells = as.slice(0, 16).map((a) => el('span', {
      class: `cell ${accelClass(a, n)}`, title: `${a.id}: ${healthText(a, n)}`,
      'data-accel': a.id }));
    if (as.length > 16) cells.push(el('span', { class: 'muted' }, ` +${as.length - 16}`));
    const t = el('div', { class: `node ${nodeClass(n)}`, 'data-node': n.id,
      title: `${n.id}: ${stateText(n)}` },
    el('div', { class: 'id' }, n.id), el('div', { class: 'state' }, stateText(n)),
    el('div', {}, ...cells));
    t.addEventListener('click', () => select(n.id));
    return t;
  }));
}

// A node's state as shown: "draining (leaving)" while its agent stops.
function stateText(n) {
  return n.leaving ? `${n.state} (leaving)` : n.state;
}

function select(id) {
  st.selected = id;
  renderDetail();
  $('detail').scrollIntoView({ block: 'nearest' });
}

function renderDetail() {
  const n = st.nodes.find((x) => x.id === st.selected);
  $('detail').hidden = !n;
  if (!n) return;
  $('detail-id').textContent = n.id;
  $('detail-state').textContent = `(${stateText(n)})`;
  $('detail-state').className = `muted h-${n.state}`;
  const drain = $('detail-drain');
  // (a node draining to leave is not undrained: its agent is stopping)
  drain.hidden = n.state === 'down' || !!n.leaving;
  drain.textContent = n.state === 'ready' ? 'drain' : 'undrain';
  drain.dataset.node = n.id;
  drain.dataset.op = n.state === 'ready' ? 'drain' : 'undrain';
  const out = new Map();
  for (const q of st.mqueues)
    if (q.node === n.id)
      out.set(q.accel, (out.get(q.accel) || 0) + (q.outstanding || 0));
  $('detail-accels').replaceChildren(...(st.byNode.get(n.id) || []).map((a) => {
    const l = a.latency || {};
    const measured = l.window_requests > 0;
    return el('tr', { 'data-accel': a.id },
      el('td', {}, a.id), el('td', {}, a.kind), el('td', {}, a.model),
      el('td', { class: accelClass(a, n) }, healthText(a, n)),
      el('td', {}, fmtRate(st.rates.get(a.id))),
      el('td', {}, measured ? `${fmtNs(l.queue_p50_ns)} / ${fmtNs(l.queue_p99_ns)}` : '-'),
      el('td', {}, measured ? `${fmtNs(l.service_p50_ns)} / ${fmtNs(l.service_p99_ns)}` : '-'),
      el('td', {}, out.get(a.accel !== undefined ? a.accel : Number(a.id.split('/').pop())) || 0));
  }));
}

function renderFrontends() {
  const by = new Map();
  for (const q of st.mqueues) {
    if (!q.frontend) continue;
    if (!by.has(q.frontend)) by.set(q.frontend, new Map());
    const m = by.get(q.frontend);
    if (!m.has(q.service)) m.set(q.service, { n: 0, nodes: new Set() });
    m.get(q.service).n++;
    m.get(q.service).nodes.add(q.node);
  }
  $('frontends').replaceChildren(...st.frontends.map((f) => {
    const role = !f.connected ? 'disconnected' : f.draining ? 'draining'
      : f.active ? 'active' : 'standby';
    const m = by.get(f.id) || new Map();
    const into = [...m.entries()].map(([s, v]) =>
      `${s}: ${v.n} mqueues on ${[...v.nodes].slice(0, 4).join(', ')}${v.nodes.size > 4 ? ', …' : ''}`);
    return el('tr', { 'data-frontend': f.id },
      el('td', {}, f.id), el('td', {}, f.address), el('td', { class: `role-${role}` }, role),
      el('td', {}, f.epoch), el('td', {}, f.table_version),
      el('td', {}, into.join('; ') || '-'));
  }));
}

function renderServices() {
  const mq = new Map();
  for (const q of st.mqueues) mq.set(q.service, (mq.get(q.service) || 0) + 1);
  $('services').replaceChildren(...st.services.map((s) => {
    const p = typeof s.placement === 'string' ? s.placement
      : Object.entries(s.placement || {}).map(([k, v]) =>
        `${k}=${typeof v === 'object' ? JSON.stringify(v) : v}`).join(' ');
    const i = s.instances || {};
    return el('tr', { 'data-service': s.name },
      el('td', {}, s.name), el('td', {}, `${s.proto} ${s.port}`), el('td', {}, s.app),
      el('td', {}, p), el('td', {}, `${i.ready || 0} of ${i.wanted || 0} ready (${s.state || ''})`),
      el('td', {}, mq.get(s.name) || 0));
  }));
}

function renderEvents() {
  $('events').replaceChildren(...st.events.map((e) => el('li',
    { class: `k-${e.kind}`, 'data-seq': e.seq },
    el('span', { class: 'time' }, fmtTime(e.time_ms)),
    el('span', { class: 'kind' }, e.kind), e.message)));
}

async function drainOp(ev) {
  const b = ev.currentTarget;
  const token = $('token').value.trim();
  sessionStorage.setItem('lynx-token', token);
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  b.disabled = true;
  try {
    $('action').textContent = '';
    await api(`/v1/nodes/${encodeURIComponent(b.dataset.node)}/${b.dataset.op}`,
      { method: 'POST', headers });
    await refresh();
  } catch (e) {
    // kept until the next action: the periodic refresh clears only #status
    $('action').textContent = e.message;
  } finally {
    b.disabled = false;
  }
}

async function watch() {
  for (;;) {
    try {
      const q = st.version === null ? '/v1/watch'
        : `/v1/watch?since=${st.version}&timeout_ms=${WATCH_MS}`;
      const r = await api(q);
      if (r.version !== st.version) {
        st.version = r.version;
        await refresh();
      }
    } catch (e) {
      status(`${e.message} — retrying`);
      await new Promise((res) => setTimeout(res, 2000));
    }
  }
}

function init() {
  $('token').value = sessionStorage.getItem('lynx-token') || '';
  $('detail-drain').addEventListener('click', drainOp);
  $('detail-close').addEventListener('click', () => { st.selected = null; renderDetail(); });
  $('filter').addEventListener('input', (e) => { st.filter = e.target.value.trim(); st.page = 0; renderNodes(); });
  $('prev').addEventListener('click', () => { st.page = Math.max(0, st.page - 1); renderNodes(); });
  $('next').addEventListener('click', () => { st.page++; renderNodes(); });
  const cv = $('heatmap');
  cv.addEventListener('mousemove', (ev) => {
    const a = heatAt(ev);
    $('heat-tip').textContent = a ? `${a.id}: ${healthText(a, st.nodes.find((n) => n.id === a.node))}` : '';
  });
  cv.addEventListener('click', (ev) => { const a = heatAt(ev); if (a) select(a.node); });
  watch();
  setInterval(refresh, REFRESH_MS);
}

document.addEventListener('DOMContentLoaded', init);
