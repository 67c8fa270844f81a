// TensorFusion web console. Reads the controller's /v1/ API with the token the user enters and
// renders it. Rules kept throughout:
//  - everything from the API is put into the page as text (textContent, SVG attributes), never as
//    markup: names come from tenants and node agents;
//  - the token lives in sessionStorage only (this tab); it is never written into the page or the
//    URL, and logging out removes it;
//  - the console only reads: every call is a GET.
'use strict';

(function () {
  const TOKEN_KEY = 'tfusion.console.token';
  const REFRESH_MS = 5000;
  const SVG_NS = 'http://www.w3.org/2000/svg';

  let timer = null;
  let currentView = 'pools';

  const $ = (id) => document.getElementById(id);

  // ---- the API

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function api(path, token) {
    let res;
    try {
      res = await fetch(path, {
        method: 'GET',
        headers: { Authorization: 'Bearer ' + token },
        cache: 'no-store',
        credentials: 'omit',
        redirect: 'error',
      });
    } catch (e) {
      throw new ApiError(0, 'unavailable', 'the controller cannot be reached (' + e.message + ')');
    }
    let body = null;
    try {
      body = await res.json();
    } catch (e) {
      body = null;
    }
    if (!res.ok) {
      const err = body && body.error ? body.error : {};
      throw new ApiError(res.status, err.code || 'http_' + res.status, err.message || res.statusText);
    }
    return body;
  }

  // A list the role of the token may not read comes back as null instead of failing the page.
  async function optional(path, token) {
    try {
      return await api(path, token);
    } catch (e) {
      if (e.status === 403) return null;
      throw e;
    }
  }

  async function health() {
    try {
      const res = await fetch('/healthz', { cache: 'no-store', credentials: 'omit' });
      return await res.json();
    } catch (e) {
      return null;
    }
  }

  // ---- small DOM helpers (text only)

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === 'class') e.className = v;
      else if (k.startsWith('data-')) e.setAttribute(k, String(v));
      else if (k === 'title') e.title = String(v);
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      e.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    if (text !== undefined) e.textContent = String(text);
    return e;
  }

  // columns: [{key, label, num}]; rows: [{key, cells: {colKey: string|Node}}]
  function table(columns, rows, emptyText) {
    if (rows.length === 0) return el('p', { class: 'empty' }, emptyText);
    const head = el('tr', {}, ...columns.map((c) => el('th', { class: c.num ? 'num' : '' }, c.label)));
    const body = rows.map((r) =>
      el('tr', { 'data-key': r.key },
        ...columns.map((c) => el('td', { 'data-col': c.key, class: c.num ? 'num' : '' }, r.cells[c.key] ?? ''))));
    return el('table', {}, el('thead', {}, head), el('tbody', {}, ...body));
  }

  function replace(id, ...nodes) {
    $(id).replaceChildren(...nodes);
  }

  const num = (x, digits = 1) => (Number.isFinite(x) ? x.toFixed(digits) : '-');
  const mib = (x) => (Number.isFinite(x) ? String(Math.round(x)) : '-');
  const pct = (part, whole) => (whole > 0 ? num((100 * part) / whole) + '%' : '-');
  const time = (ms) => (ms > 0 ? new Date(ms).toLocaleTimeString() : '-');
  function ago(ms) {
    if (!(ms > 0)) return 'never';
    const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
    return s < 120 ? s + ' s ago' : Math.round(s / 60) + ' min ago';
  }

  // A horizontal bar: allocated vs free against the virtual capacity, a tick at the physical one.
  function bar(allocated, physical, virtual, label) {
    const W = 240;
    const H = 14;
    const s = svg('svg', { class: 'bar', width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: 'img' });
    s.appendChild(svg('title', {}, label));
    const scale = virtual > 0 ? W / virtual : 0;
    s.appendChild(svg('rect', { class: 'free', x: 0, y: 0, width: W, height: H }));
    s.appendChild(svg('rect', { class: 'allocated', x: 0, y: 0, width: Math.min(W, allocated * scale), height: H }));
    if (virtual > physical && physical > 0) {
      const x = physical * scale;
      s.appendChild(svg('line', { class: 'physical', x1: x, x2: x, y1: 0, y2: H }));
    }
    return s;
  }

  // ---- views

  function renderPools(usage, pools, allocations, quotas) {
    const spec = new Map(pools.map((p) => [p.name, p]));
    const rows = usage.pools.map((p) => {
      const s = spec.get(p.name) || {};
      const expand = (s.vram_expand_to_host_percent || 0) + (s.vram_expand_to_disk_percent || 0);
      return {
        key: p.name,
        cells: {
          name: p.name,
          mode: s.placement_mode || '',
          oversell: num(s.tflops_oversell_ratio ?? 1, 2) + 'x',
          expand: expand > 0 ? `+${s.vram_expand_to_host_percent || 0}% host, +${s.vram_expand_to_disk_percent || 0}% disk` : 'none',
          gpus: String(p.gpus),
          tflops_allocated: num(p.used_tflops),
          tflops_physical: `${num(p.tflops)} (${pct(p.used_tflops, p.tflops)})`,
          tflops_virtual: `${num(p.schedulable_tflops)} (${pct(p.used_tflops, p.schedulable_tflops)})`,
          vram_allocated: mib(p.used_vram_mib),
          vram_physical: `${mib(p.vram_mib)} (${pct(p.used_vram_mib, p.vram_mib)})`,
          vram_virtual: `${mib(p.schedulable_vram_mib)} (${pct(p.used_vram_mib, p.schedulable_vram_mib)})`,
          utilization: num(p.utilization_percent) + '%',
          memory_used: mib(p.memory_used_mib),
          bars: el('div', { class: 'bars' },
            bar(p.used_tflops, p.tflops, p.schedulable_tflops, `TFLOPS allocated ${num(p.used_tflops)} of ${num(p.schedulable_tflops)}`),
            bar(p.used_vram_mib, p.vram_mib, p.schedulable_vram_mib, `VRAM allocated ${mib(p.used_vram_mib)} of ${mib(p.schedulable_vram_mib)} MiB`)),
        },
      };
    });
    replace('pools', table([
      { key: 'name', label: 'Pool' },
      { key: 'mode', label: 'Placement' },
      { key: 'oversell', label: 'TFLOPS oversell', num: true },
      { key: 'expand', label: 'VRAM expansion' },
      { key: 'gpus', label: 'GPUs', num: true },
      { key: 'tflops_allocated', label: 'TFLOPS allocated', num: true },
      { key: 'tflops_physical', label: 'of physical', num: true },
      { key: 'tflops_virtual', label: 'of virtual', num: true },
      { key: 'vram_allocated', label: 'VRAM allocated (MiB)', num: true },
      { key: 'vram_physical', label: 'of physical', num: true },
      { key: 'vram_virtual', label: 'of virtual', num: true },
      { key: 'utilization', label: 'GPU use', num: true },
      { key: 'memory_used', label: 'VRAM used (MiB)', num: true },
      { key: 'bars', label: 'Allocated: TFLOPS, VRAM' },
    ], rows, 'No pools.'));

    if (quotas === null) {
      replace('quotas', el('p', { class: 'empty' }, 'This token may not read tenant quotas.'));
      return;
    }
    const held = new Map();
    for (const a of allocations) {
      if (!a.tenant) continue;
      const h = held.get(a.tenant) || { tflops: 0, vram: 0, gpus: 0 };
      for (const v of a.vgpus || []) {
        h.tflops += v.tflops || 0;
        h.vram += v.vram_mib || 0;
        h.gpus += 1;
      }
      held.set(a.tenant, h);
    }
    const limit = (x, f) => (x > 0 ? f(x) : 'unlimited');
    replace('quotas', table([
      { key: 'tenant', label: 'Tenant' },
      { key: 'tflops', label: 'TFLOPS held / max', num: true },
      { key: 'vram', label: 'VRAM held / max (MiB)', num: true },
      { key: 'gpus', label: 'vGPUs held / max', num: true },
    ], quotas.map((q) => {
      const h = held.get(q.tenant) || { tflops: 0, vram: 0, gpus: 0 };
      return {
        key: q.tenant,
        cells: {
          tenant: q.tenant,
          tflops: `${num(h.tflops)} / ${limit(q.max_tflops, num)}`,
          vram: `${mib(h.vram)} / ${limit(q.max_vram_mib, mib)}`,
          gpus: `${h.gpus} / ${limit(q.max_gpus, String)}`,
        },
      };
    }), 'No tenant quotas are set.'));
  }

  function renderNodes(nodes, usage) {
    const count = new Map();
    for (const g of usage.gpus) count.set(g.node, (count.get(g.node) || 0) + 1);
    replace('nodes', table([
      { key: 'name', label: 'Node' },
      { key: 'pool', label: 'Pool' },
      { key: 'state', label: 'State' },
      { key: 'gpus', label: 'GPUs', num: true },
      { key: 'address', label: 'Agent address' },
      { key: 'worker', label: 'Worker' },
      { key: 'heartbeat', label: 'Last heartbeat' },
    ], nodes.map((n) => ({
      key: n.name,
      cells: {
        name: n.name,
        pool: n.pool,
        state: n.cordoned ? n.state + ', cordoned' : n.state,
        gpus: String(count.get(n.name) || 0),
        address: n.address || '',
        worker: n.worker_address || '',
        heartbeat: ago(n.last_heartbeat_ms),
      },
    })), 'No node has registered.'));

    const cordoned = new Set(nodes.filter((n) => n.cordoned).map((n) => n.name));
    replace('gpus', table([
      { key: 'node', label: 'Node' },
      { key: 'index', label: 'GPU', num: true },
      { key: 'uuid', label: 'UUID' },
      { key: 'model', label: 'Model' },
      { key: 'pool', label: 'Pool' },
      { key: 'tflops', label: 'TFLOPS allocated / physical / virtual', num: true },
      { key: 'vram', label: 'VRAM allocated / physical / virtual (MiB)', num: true },
      { key: 'utilization', label: 'GPU use', num: true },
      { key: 'memory_used', label: 'VRAM used (MiB)', num: true },
      { key: 'schedulable', label: 'Takes work' },
    ], usage.gpus.map((g) => ({
      key: g.uuid,
      cells: {
        node: g.node,
        index: String(g.index),
        uuid: g.uuid,
        model: g.model,
        pool: g.pool,
        tflops: `${num(g.used_tflops)} / ${num(g.tflops)} / ${num(g.schedulable_tflops)}`,
        vram: `${mib(g.used_vram_mib)} / ${mib(g.vram_mib)} / ${mib(g.schedulable_vram_mib)}`,
        utilization: g.sampled_ms > 0 ? num(g.utilization_percent) + '%' : 'not reported',
        memory_used: g.sampled_ms > 0 ? mib(g.memory_used_mib) : '-',
        schedulable: !g.schedulable ? 'no (node lost)' : cordoned.has(g.node) ? 'no (node cordoned)' : 'yes',
      },
    })), 'No GPUs.'));
  }

  function renderFragmentation(usage, nodes) {
    const cordoned = new Set(nodes.filter((n) => n.cordoned).map((n) => n.name));
    const byNode = new Map();
    for (const g of usage.gpus) {
      if (!byNode.has(g.node)) byNode.set(g.node, []);
      byNode.get(g.node).push(g);
    }
    const blocks = [];
    for (const [node, gpus] of byNode) {
      let best = null;
      if (!cordoned.has(node)) for (const g of gpus) if (g.schedulable && (!best || g.free_tflops > best.free_tflops)) best = g;
      const summary = best
        ? `Largest single-GPU slice on this node: ${num(best.free_tflops)} TFLOPS with ${mib(best.free_vram_mib)} MiB (GPU ${best.index})`
        : cordoned.has(node) ? 'Cordoned: this node takes no new work.' : 'No GPU of this node takes work.';
      const cards = gpus.map((g) => el('div', { class: 'frag-gpu', 'data-uuid': g.uuid },
        el('div', { class: 'frag-title' }, `GPU ${g.index} `, el('span', { class: 'model' }, g.model)),
        el('div', { class: 'frag-line' }, bar(g.used_tflops, g.tflops, g.schedulable_tflops,
          `TFLOPS: ${num(g.used_tflops)} allocated, ${num(g.free_tflops)} free of ${num(g.schedulable_tflops)}`),
          el('span', { class: 'frag-text', 'data-field': 'tflops' },
            `TFLOPS ${num(g.used_tflops)} allocated, ${num(g.free_tflops)} free (physical ${num(g.tflops)}, virtual ${num(g.schedulable_tflops)})`)),
        el('div', { class: 'frag-line' }, bar(g.used_vram_mib, g.vram_mib, g.schedulable_vram_mib,
          `VRAM: ${mib(g.used_vram_mib)} MiB allocated, ${mib(g.free_vram_mib)} MiB free of ${mib(g.schedulable_vram_mib)}`),
          el('span', { class: 'frag-text', 'data-field': 'vram' },
            `VRAM ${mib(g.used_vram_mib)} MiB allocated, ${mib(g.free_vram_mib)} MiB free (physical ${mib(g.vram_mib)}, virtual ${mib(g.schedulable_vram_mib)})`)),
        el('div', { class: 'frag-slice', 'data-field': 'slice' },
          !g.schedulable ? 'Takes no work (node lost)' : cordoned.has(node) ? 'Takes no work (node cordoned)'
            : `Largest slice: ${num(g.free_tflops)} TFLOPS, ${mib(g.free_vram_mib)} MiB`)));
      blocks.push(el('div', { class: 'frag-node', 'data-node': node },
        el('h3', {}, node), el('p', { class: 'frag-summary' }, summary), el('div', { class: 'frag-gpus' }, ...cards)));
    }
    replace('fragmentation', ...(blocks.length ? blocks : [el('p', { class: 'empty' }, 'No GPUs.')]));
  }

  function renderAllocations(allocations) {
    const rows = [];
    for (const a of allocations) {
      for (const v of a.vgpus || []) {
        rows.push({
          key: a.id + '/' + v.gpu,
          cells: {
            id: a.id,
            tenant: a.tenant || '',
            pool: a.pool,
            node: a.node,
            gpu: `${v.gpu_index} (${v.gpu})`,
            qos: a.qos,
            tflops: num(v.tflops),
            limit: num(v.tflops_limit ?? v.tflops),
            vram: mib(v.vram_mib),
            use: v.use_percent !== undefined ? num(v.use_percent) + '%' : 'not reported',
            throttled: v.throttled_seconds !== undefined ? num(v.throttled_seconds) + ' s' : '-',
            processes: v.processes ? (v.processes.length ? v.processes.map((p) => `${p.pid} (${p.vram_mib} MiB)`).join(', ') : 'none') : 'not reported',
            tier: v.tier_state ? `${v.tier_state}${v.swapped_mib ? ', ' + v.swapped_mib + ' MiB out' : ''}` : (a.tiering ? 'tiering on' : ''),
            created: time(a.created_ms),
            lease: a.lease_ms > 0 ? 'until ' + time(a.lease_expires_ms) : '',
          },
        });
      }
    }
    replace('allocations', table([
      { key: 'id', label: 'Allocation' },
      { key: 'tenant', label: 'Tenant' },
      { key: 'pool', label: 'Pool' },
      { key: 'node', label: 'Node' },
      { key: 'gpu', label: 'GPU' },
      { key: 'qos', label: 'QoS' },
      { key: 'tflops', label: 'TFLOPS request', num: true },
      { key: 'limit', label: 'TFLOPS limit', num: true },
      { key: 'vram', label: 'VRAM (MiB)', num: true },
      { key: 'use', label: 'Use', num: true },
      { key: 'throttled', label: 'Throttled', num: true },
      { key: 'processes', label: 'Processes (pid, VRAM)' },
      { key: 'tier', label: 'VRAM tier' },
      { key: 'created', label: 'Placed' },
      { key: 'lease', label: 'Lease' },
    ], rows, 'No allocations.'));
  }

  function renderEvictions(evictions) {
    replace('evictions', table([
      { key: 'id', label: 'Allocation' },
      { key: 'tenant', label: 'Tenant' },
      { key: 'node', label: 'Node' },
      { key: 'qos', label: 'QoS' },
      { key: 'reason', label: 'Reason' },
      { key: 'by', label: 'Taken by' },
      { key: 'evicted', label: 'Evicted' },
      { key: 'state', label: 'State' },
      { key: 'processes', label: 'Processes signalled', num: true },
    ], evictions.map((e) => ({
      key: e.allocation.id,
      cells: {
        id: e.allocation.id,
        tenant: e.allocation.tenant || '',
        node: e.allocation.node,
        qos: e.allocation.qos,
        reason: e.reason,
        by: e.preempted_by || '',
        evicted: time(e.evicted_ms),
        state: e.state === 'stopped' ? 'stopped at ' + time(e.stopped_ms) : e.state,
        processes: e.state === 'stopped' ? String(e.processes_stopped) : '-',
      },
    })), 'No evictions in the last hour.'));
  }

  // One chart: lines for `series` ([{label, cls, values}]), dashed levels for `levels`.
  function chart(title, unit, times, series, levels) {
    const W = 640;
    const H = 200;
    const L = 56;
    const R = 10;
    const T = 10;
    const B = 24;
    let top = 0;
    for (const s of series) for (const v of s.values) top = Math.max(top, v);
    for (const l of levels) top = Math.max(top, l.value);
    top = top > 0 ? top * 1.05 : 1;
    const t0 = times[0];
    const t1 = times[times.length - 1];
    const x = (t) => L + (t1 > t0 ? ((t - t0) / (t1 - t0)) * (W - L - R) : (W - L - R) / 2);
    const y = (v) => T + (1 - v / top) * (H - T - B);
    const s = svg('svg', { class: 'chart', width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: 'img' });
    s.appendChild(svg('title', {}, title));
    s.appendChild(svg('line', { class: 'axis', x1: L, x2: L, y1: T, y2: H - B }));
    s.appendChild(svg('line', { class: 'axis', x1: L, x2: W - R, y1: H - B, y2: H - B }));
    s.appendChild(svg('text', { class: 'tick', x: L - 4, y: T + 8, 'text-anchor': 'end' }, num(top, 0)));
    s.appendChild(svg('text', { class: 'tick', x: L - 4, y: H - B, 'text-anchor': 'end' }, '0'));
    s.appendChild(svg('text', { class: 'tick', x: L, y: H - 6 }, time(t0)));
    s.appendChild(svg('text', { class: 'tick', x: W - R, y: H - 6, 'text-anchor': 'end' }, time(t1)));
    for (const l of levels) {
      s.appendChild(svg('line', { class: 'level ' + l.cls, x1: L, x2: W - R, y1: y(l.value), y2: y(l.value) }));
    }
    for (const ser of series) {
      const pts = ser.values.map((v, i) => `${x(times[i]).toFixed(1)},${y(v).toFixed(1)}`).join(' ');
      s.appendChild(svg('polyline', { class: 'series ' + ser.cls, points: pts, 'data-series': ser.label }));
      ser.values.forEach((v, i) => {
        const c = svg('circle', { class: 'point ' + ser.cls, cx: x(times[i]).toFixed(1), cy: y(v).toFixed(1), r: 2.5,
          'data-series': ser.label, 'data-value': v });
        c.appendChild(svg('title', {}, `${time(times[i])}: ${ser.label} ${num(v)} ${unit}`));
        s.appendChild(c);
      });
    }
    const legend = el('div', { class: 'legend' },
      ...series.map((ser) => el('span', { class: 'key ' + ser.cls }, ser.label)),
      ...levels.map((l) => el('span', { class: 'key level ' + l.cls }, `${l.label} ${num(l.value, unit === 'MiB' ? 0 : 1)} ${unit}`)));
    return el('figure', { class: 'chart-box' }, el('figcaption', {}, title), s, legend);
  }

  function renderCharts(history) {
    const samples = history.samples || [];
    $('history-hint').textContent =
      `One sample every ${num(history.interval_ms / 1000, 0)} s, kept ${num(history.retention_ms / 60000, 0)} min; ` +
      `${samples.length} sample${samples.length === 1 ? '' : 's'} so far.`;
    if (samples.length === 0) {
      replace('charts', el('p', { class: 'empty' }, 'No samples yet.'));
      return;
    }
    const names = [];
    for (const s of samples) for (const p of s.pools) if (!names.includes(p.name)) names.push(p.name);
    const figures = [];
    for (const name of names) {
      const times = [];
      const alloc = [], used = [], valloc = [], vused = [];
      let last = null;
      for (const s of samples) {
        const p = s.pools.find((q) => q.name === name);
        if (!p) continue;
        last = p;
        times.push(s.t_ms);
        alloc.push(p.used_tflops);
        used.push((p.utilization_percent * p.tflops) / 100);
        valloc.push(p.used_vram_mib);
        vused.push(p.memory_used_mib);
      }
      const box = el('div', { class: 'pool-charts', 'data-pool': name }, el('h3', {}, name));
      box.appendChild(chart(`${name}: TFLOPS`, 'TFLOPS', times,
        [{ label: 'allocated', cls: 'alloc', values: alloc }, { label: 'in use', cls: 'use', values: used }],
        [{ label: 'physical', cls: 'phys', value: last.tflops }].concat(
          last.schedulable_tflops > last.tflops ? [{ label: 'virtual', cls: 'virt', value: last.schedulable_tflops }] : [])));
      box.appendChild(chart(`${name}: VRAM`, 'MiB', times,
        [{ label: 'allocated', cls: 'alloc', values: valloc }, { label: 'in use', cls: 'use', values: vused }],
        [{ label: 'physical', cls: 'phys', value: last.vram_mib }].concat(
          last.schedulable_vram_mib > last.vram_mib ? [{ label: 'virtual', cls: 'virt', value: last.schedulable_vram_mib }] : [])));
      figures.push(box);
    }
    replace('charts', ...figures);
  }

  // ---- session

  async function refresh() {
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (!token) return showLogin('');
    try {
      const [usage, pools, nodes, allocations, evictions, quotas, history, hz] = await Promise.all([
        api('/v1/usage', token),
        api('/v1/pools', token),
        api('/v1/nodes', token),
        api('/v1/allocations', token),
        api('/v1/evictions', token),
        optional('/v1/quotas', token),
        api('/v1/history', token),
        health(),
      ]);
      if (sessionStorage.getItem(TOKEN_KEY) !== token) return;  // logged out meanwhile
      renderPools(usage, pools.pools, allocations.allocations, quotas ? quotas.quotas : null);
      renderNodes(nodes.nodes, usage);
      renderFragmentation(usage, nodes.nodes);
      renderAllocations(allocations.allocations);
      renderEvictions(evictions.evictions);
      renderCharts(history);
      $('refresh-error').hidden = true;
      $('status').textContent = (hz && hz.serving ? 'leader' : 'standby') + ' · updated ' + time(Date.now());
      document.body.dataset.loaded = String(Date.now());
    } catch (e) {
      if (sessionStorage.getItem(TOKEN_KEY) !== token) return;
      if (e.status === 401) {
        logout('The controller no longer accepts this token (' + e.message + '). Log in again.');
        return;
      }
      $('refresh-error').textContent = 'Refreshing failed: ' + e.message + (e.status ? ` (HTTP ${e.status})` : '');
      $('refresh-error').hidden = false;
    }
  }

  function showLogin(message) {
    $('app-view').hidden = true;
    $('logout').hidden = true;
    $('login-view').hidden = false;
    $('status').textContent = '';
    const err = $('login-error');
    err.textContent = message;
    err.hidden = !message;
  }

  function clearData() {
    for (const id of ['pools', 'quotas', 'nodes', 'gpus', 'fragmentation', 'allocations', 'evictions', 'charts']) replace(id);
    $('history-hint').textContent = '';
    delete document.body.dataset.loaded;
  }

  function showApp() {
    $('login-view').hidden = true;
    $('login-error').hidden = true;
    $('app-view').hidden = false;
    $('logout').hidden = false;
    selectView(currentView);
    if (timer === null) timer = setInterval(refresh, REFRESH_MS);
  }

  function logout(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    if (timer !== null) clearInterval(timer);
    timer = null;
    clearData();
    showLogin(message || '');
  }

  function selectView(name) {
    currentView = name;
    for (const b of document.querySelectorAll('#tabs button')) b.classList.toggle('active', b.dataset.view === name);
    for (const v of document.querySelectorAll('.view')) v.hidden = v.id !== 'view-' + name;
  }

  async function login(ev) {
    ev.preventDefault();
    const input = $('token');
    const token = input.value.trim();
    input.value = '';
    if (!token) return showLogin('Enter a token.');
    $('login').disabled = true;
    try {
      await api('/v1/usage', token);
      sessionStorage.setItem(TOKEN_KEY, token);
      showApp();
      await refresh();
    } catch (e) {
      const why = e.status === 401
        ? 'The controller refused this token (' + e.message + ').'
        : e.status === 403
          ? 'This token may not read the console\'s data (' + e.message + ').'
          : 'Logging in failed: ' + e.message + (e.status ? ` (HTTP ${e.status})` : '');
      showLogin(why);
    } finally {
      $('login').disabled = false;
    }
  }

  document.addEventListener('DOMContentLoaded', () => {
    $('login-form').addEventListener('submit', login);
    $('logout').addEventListener('click', () => logout('Logged out.'));
    for (const b of document.querySelectorAll('#tabs button')) b.addEventListener('click', () => selectView(b.dataset.view));
    if (sessionStorage.getItem(TOKEN_KEY)) {
      showApp();
      refresh();
    } else {
      showLogin('');
    }
  });
})();
