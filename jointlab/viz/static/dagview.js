// jointlab DAG renderer: readable source, no dependencies, no build step.
// Reads the JSON payload written by jointlab/viz/dagview.py (no positions) and
// draws it on a <canvas>: forward band on top, backward band mirrored below.
// Only what is visible is laid out (layeredLayout), again on every open or
// close, as a compound layout: each open group's content is one block of its
// parent's layout, so open-group outlines nest and never overlap. Module groups are boxes that open in place on click (the view stays
// anchored on the group); labels follow level of detail; the
// wheel zooms, dragging pans; search highlights, opens the holding groups and
// zooms; a click on a node opens the detail panel. `el.jlView` exposes the
// state for tests.
(function () {
  "use strict";
  if (window.jointlabDag) return;
  const XS = 3.0;          // a column is this many rows wide (room for labels)
  const LABEL_MIN_PX = 44; // a column must be this wide on screen before node labels show
  const MAX_LABELS = 2500; // labels drawn per frame at most
  // item sizes in world units (a column is XS wide, a row 1 high): half widths and heights,
  // and the slot each takes in its column (the rest is the gap to its neighbour)
  const NODE_HW = 0.3 * XS, NODE_HH = 0.4, NODE_SLOT = 1.0;
  const BOX_COLS = 2, BOX_HW = 0.92 * XS, BOX_HH = 1.1, BOX_SLOT = 2.4;
  const CSS = `
.jl-dag{position:relative;font:12px system-ui,sans-serif;border:1px solid #ddd;display:flex;flex-direction:column}
.jl-dag .jl-bar{display:flex;gap:8px;align-items:center;padding:4px 6px;border-bottom:1px solid #eee;flex-wrap:wrap}
.jl-dag .jl-title{font-weight:600;margin-right:auto}
.jl-dag .jl-main{position:relative;flex:1;min-height:0}
.jl-dag canvas.jl-canvas{position:absolute;left:0;top:0;width:100%;height:100%;cursor:grab}
.jl-dag canvas.jl-mini{position:absolute;right:6px;bottom:6px;border:1px solid #bbb;background:rgba(255,255,255,.9);cursor:pointer}
.jl-dag .jl-detail{position:absolute;right:6px;top:6px;width:330px;max-height:70%;overflow:auto;background:#fff;border:1px solid #bbb;border-radius:4px;padding:6px;display:none;box-shadow:0 2px 6px rgba(0,0,0,.15)}
.jl-dag .jl-detail table{border-collapse:collapse;width:100%}
.jl-dag .jl-detail td{padding:1px 4px;vertical-align:top;border-bottom:1px solid #f0f0f0;word-break:break-all}
.jl-dag .jl-detail td:first-child{color:#666;white-space:nowrap;word-break:normal}
.jl-dag .jl-link{color:#0645ad;cursor:pointer;text-decoration:underline;margin-right:6px}
.jl-dag .jl-legend{padding:2px 6px;border-top:1px solid #eee;min-height:18px;flex:none;max-height:25%;overflow-y:auto}
.jl-dag .jl-legend span{display:inline-block;margin-right:10px;white-space:nowrap}
.jl-dag .jl-legend i{display:inline-block;width:10px;height:10px;margin-right:3px;vertical-align:-1px}
.jl-dag .jl-status{color:#555}`;

  function human(x, unit) {
    const a = Math.abs(x), s = ["", "k", "M", "G", "T", "P"];
    let k = 0, v = x;
    while (Math.abs(v) >= 1000 && k < s.length - 1) { v /= 1000; k++; }
    return (k ? v.toFixed(v < 10 ? 2 : v < 100 ? 1 : 0) : String(Math.round(a ? v : 0))) + " " + s[k] + unit;
  }
  function humanBytes(n) {
    const s = ["B", "KiB", "MiB", "GiB", "TiB"]; let k = 0;
    while (n >= 1024 && k < s.length - 1) { n /= 1024; k++; }
    return (k ? n.toFixed(1) : String(n)) + " " + s[k];
  }
  // Every canvas text uses FONT; widths are cached per string (one font, so one cache).
  const FONT = "11px system-ui,sans-serif", widths = new Map();
  function textWidth(ctx, s) {
    let w = widths.get(s);
    if (w === undefined) { if (widths.size > 50000) widths.clear(); w = ctx.measureText(s).width; widths.set(s, w); }
    return w;
  }
  // `s` cut with an ellipsis to fit `maxw` pixels (never squeezed), or "" when under 3 characters
  // fit; `tail` keeps the end (module paths: "…attn.qkv")
  function fitText(ctx, s, maxw, tail) {
    const w = textWidth(ctx, s);
    if (w <= maxw) return s;
    const cut = n => tail ? "…" + s.slice(s.length - n) : s.slice(0, n) + "…";
    let n = Math.floor(s.length * maxw / w);
    while (n >= 3 && textWidth(ctx, cut(n)) > maxw) n--;
    return n >= 3 ? cut(n) : "";
  }
  // Screen rectangles already holding text: a label that would overlap one is skipped.
  class Occupancy {
    constructor() { this.cells = new Map(); }
    _each(x0, y0, x1, y1, f) {
      for (let gx = Math.floor(x0 / 64); gx <= Math.floor(x1 / 64); gx++)
        for (let gy = Math.floor(y0 / 64); gy <= Math.floor(y1 / 64); gy++) if (f(gx * 65536 + gy) === false) return false;
      return true;
    }
    free(x0, y0, x1, y1) {
      return this._each(x0, y0, x1, y1, key => {
        const l = this.cells.get(key);
        if (l) for (let k = 0; k < l.length; k += 4) if (x0 < l[k + 2] && x1 > l[k] && y0 < l[k + 3] && y1 > l[k + 1]) return false;
      });
    }
    take(x0, y0, x1, y1) {
      this._each(x0, y0, x1, y1, key => { let l = this.cells.get(key); if (!l) this.cells.set(key, l = []); l.push(x0, y0, x1, y1); });
    }
    place(x0, y0, x1, y1) { if (!this.free(x0, y0, x1, y1)) return false; this.take(x0, y0, x1, y1); return true; }
  }
  // Counts per (a, b) pair of non-negative integers below 2^24, in open addressing (far faster
  // than a Map or Set of large numbers): the graph edges between two drawn items, or a frame's
  // edge pixels. A count back at 0 keeps its slot; growing drops those.
  class PairCounts {
    constructor(n) { this._alloc(Math.max(16, n)); }
    _alloc(n) {
      let size = 16;
      while (size < 2 * n) size *= 2;
      this.mask = size - 1; this.used = 0;
      this.keys = new Float64Array(size).fill(-1); this.counts = new Int32Array(size);
    }
    add(a, b, s) {  // the pair's new count
      const key = a * 16777216 + b, keys = this.keys;
      let h = (Math.imul(a, 0x9e3779b1) ^ Math.imul(b, 0x85ebca6b)) & this.mask;
      while (keys[h] !== -1 && keys[h] !== key) h = (h + 1) & this.mask;
      if (keys[h] === -1) {
        if (2 * (this.used + 1) > keys.length) { this._grow(); return this.add(a, b, s); }
        keys[h] = key; this.used++;
      }
      return (this.counts[h] += s);
    }
    _grow() {
      const keys = this.keys, counts = this.counts;
      let live = 0;
      for (let h = 0; h < keys.length; h++) if (counts[h] > 0) live++;
      this._alloc(2 * live + 16);
      for (let h = 0; h < keys.length; h++) if (counts[h] > 0) { const b = keys[h] % 16777216; this.add((keys[h] - b) / 16777216, b, counts[h]); }
    }
    pairs() {  // flat [a, b, ...] of the pairs counted above 0
      const out = [], keys = this.keys, counts = this.counts;
      for (let h = 0; h < keys.length; h++) if (counts[h] > 0) { const b = keys[h] % 16777216; out.push((keys[h] - b) / 16777216, b); }
      return out;
    }
  }
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // -- layout of the visible graph -------------------------------------------------------
  // Only what is drawn is laid out: the open nodes and one box per closed group and band.
  // Items come in a topological order of the visible graph (topoOrder), so an edge with
  // src < dst goes forward in that order; the few that cannot (a cycle through a closed box:
  // a module called twice) are drawn but do not shape the layers.
  // The forward band flows left to right, one column per longest-path layer; each backward
  // item sits under its forward twin's layer (the bucket), flowing right to left inside it,
  // and a layer is widened to as many columns as its bucket is deep, so the bands stay
  // aligned. Vertical order inside a column comes from a few barycentre sweeps; items are
  // stacked by their heights, so no two ever overlap. Cost: O((V + E) log V) in the items.
  const SWEEPS = 4, BAND_GAP = 1.5;
  // an open group's block around its content (columns, rows): side margin, title line on
  // top, bottom margin; its outline is drawn this much inside the block
  const PAD_X = 0.25, PAD_T = 1.1, PAD_B = 0.3, INSET_X = 0.1, INSET_Y = 0.1;
  class MinHeap {  // of item ids, by key
    constructor(key) { this.key = key; this.a = []; }
    get size() { return this.a.length; }
    push(v) {
      const a = this.a, key = this.key; let i = a.push(v) - 1;
      while (i > 0) { const p = (i - 1) >> 1; if (key[a[p]] <= key[v]) break; a[i] = a[p]; i = p; }
      a[i] = v;
    }
    pop() {
      const a = this.a, key = this.key, top = a[0], last = a.pop();
      if (!a.length) return top;
      let i = 0;
      for (;;) {
        let c = 2 * i + 1;
        if (c >= a.length) break;
        if (c + 1 < a.length && key[a[c + 1]] < key[a[c]]) c++;
        if (key[a[c]] >= key[last]) break;
        a[i] = a[c]; i = c;
      }
      a[i] = last;
      return top;
    }
  }
  // A topological order of n items (Kahn's algorithm), earliest rank first among the ready
  // ones; on a cycle the earliest-ranked item left goes next. rank: distinct numbers.
  function topoOrder(n, rank, src, dst) {
    const indeg = new Int32Array(n), out = csr(n, src, dst, k => src[k] !== dst[k]);
    for (let v = 0; v < n; v++) for (let k = out.start[v]; k < out.start[v + 1]; k++) indeg[out.list[k]]++;
    const ready = new MinHeap(rank), done = new Uint8Array(n), order = [];
    const byRank = Array.from({length: n}, (_, v) => v).sort((a, b) => rank[a] - rank[b]);
    let next = 0;
    for (let v = 0; v < n; v++) if (!indeg[v]) ready.push(v);
    while (order.length < n) {
      let v;
      if (ready.size) v = ready.pop();
      else { while (done[byRank[next]]) next++; v = byRank[next]; }  // a cycle: break it
      if (done[v]) continue;
      done[v] = 1; order.push(v);
      for (let k = out.start[v]; k < out.start[v + 1]; k++) { const w = out.list[k]; if (!done[w] && --indeg[w] === 0) ready.push(w); }
    }
    return order;
  }
  function csr(n, a, b, keep) {  // for each a[k] (where keep(k)), the list of its b[k]
    const start = new Int32Array(n + 1);
    for (let k = 0; k < a.length; k++) if (keep(k)) start[a[k] + 1]++;
    for (let v = 0; v < n; v++) start[v + 1] += start[v];
    const fill = start.slice(0, n), list = new Int32Array(start[n]);
    for (let k = 0; k < a.length; k++) if (keep(k)) list[fill[a[k]]++] = b[k];
    return {start, list};
  }
  function forwardLayers(n, band, preds, succs) {  // longest path; sources pulled to users
    const layer = new Int32Array(n), feeder = new Uint8Array(n);
    for (let v = 0; v < n; v++) {
      if (band[v]) continue;
      let best = -1, fedOnlyByFeeders = true;
      for (let k = preds.start[v]; k < preds.start[v + 1]; k++) {
        const u = preds.list[k];
        if (band[u]) continue;
        best = Math.max(best, layer[u]);
        if (!feeder[u]) fedOnlyByFeeders = false;
      }
      layer[v] = best + 1;
      feeder[v] = fedOnlyByFeeders ? 1 : 0;  // a source (weight, input) or fed by sources only
    }
    for (let v = n - 1; v >= 0; v--) {  // feeders move next to their first user
      if (band[v] || !feeder[v]) continue;
      let first = Infinity;
      for (let k = succs.start[v]; k < succs.start[v + 1]; k++) if (!band[succs.list[k]]) first = Math.min(first, layer[succs.list[k]]);
      if (first < Infinity) layer[v] = Math.max(layer[v], first - 1);
    }
    return layer;
  }
  function backwardBuckets(n, band, preds, twin, layer) {  // mirrored layer, depth inside it
    let top = 0;
    for (let v = 0; v < n; v++) if (!band[v]) top = Math.max(top, layer[v]);
    const bucket = new Int32Array(n), depth = new Int32Array(n);
    for (let v = 0; v < n; v++) {
      if (!band[v]) continue;
      const t = twin[v];
      let k = t >= 0 && !band[t] ? layer[t] : top;
      for (let j = preds.start[v]; j < preds.start[v + 1]; j++) { const u = preds.list[j]; if (band[u]) k = Math.min(k, bucket[u]); }
      let d = 0;  // buckets never increase along a backward edge
      for (let j = preds.start[v]; j < preds.start[v + 1]; j++) { const u = preds.list[j]; if (band[u] && bucket[u] === k) d = Math.max(d, depth[u] + 1); }
      bucket[v] = k; depth[v] = d;
    }
    return {top, bucket, depth};
  }
  // Order each column by key (ties: previous position, then item), then stack the items by
  // height, centred on 0. A block stands for an open group's whole content, so nothing of a
  // group needs keeping together here.
  function stackColumns(cols, key, h, pos) {
    for (const col of cols) {
      col.sort((a, b) => key[a] - key[b] || pos[a] - pos[b] || a - b);
      let total = 0;
      for (const v of col) total += h[v];
      let c = -total / 2;
      for (const v of col) { pos[v] = c + h[v] / 2; c += h[v]; }
    }
  }
  function barycentres(n, band, preds, succs, twin, pos, down, anchorsOnly) {
    const key = new Float64Array(n);
    for (let v = 0; v < n; v++) {
      let s = 0, c = 0;
      const add = u => { s += pos[u]; c++; };
      if (!anchorsOnly) {  // neighbours in the same band, on the side the sweep comes from
        const A = down ? preds : succs;
        for (let k = A.start[v]; k < A.start[v + 1]; k++) if (band[A.list[k]] === band[v]) add(A.list[k]);
      }
      if (band[v]) {  // a backward item is anchored to its twin and to what it reads forward
        if (twin[v] >= 0 && !band[twin[v]]) add(twin[v]);
        for (let k = preds.start[v]; k < preds.start[v + 1]; k++) if (!band[preds.list[k]]) add(preds.list[k]);
      }
      key[v] = c ? s / c : pos[v];
    }
    return key;
  }
  // Column of every item: a forward layer is as wide as its widest item, or as the backward
  // columns of its bucket side by side (depth 0 on the right: the backward flows leftwards).
  // Returns x (centre, in column units) and a column key per item (the bands never share one).
  function columnsOf(n, band, w, layer, top, bucket, depth) {
    const deep = new Int32Array(top + 1);  // backward columns per bucket
    for (let v = 0; v < n; v++) if (band[v]) deep[bucket[v]] = Math.max(deep[bucket[v]], depth[v] + 1);
    const first = new Int32Array(top + 2);  // flat index of a bucket's first backward column
    for (let l = 0; l <= top; l++) first[l + 1] = first[l] + deep[l];
    const sub = new Float64Array(first[top + 1]), span = new Float64Array(top + 1);
    for (let v = 0; v < n; v++) {
      if (band[v]) sub[first[bucket[v]] + depth[v]] = Math.max(sub[first[bucket[v]] + depth[v]], w[v]);
      else span[layer[v]] = Math.max(span[layer[v]], w[v]);
    }
    const left = new Float64Array(top + 2), right = new Float64Array(sub.length);  // a backward column's right edge
    for (let l = 0; l <= top; l++) {
      let s = 0;
      for (let d = first[l]; d < first[l + 1]; d++) s += sub[d];
      span[l] = Math.max(span[l], s, 1);
      left[l + 1] = left[l] + span[l];
      let r = left[l + 1];
      for (let d = first[l]; d < first[l + 1]; d++) { right[d] = r; r -= sub[d]; }
    }
    const x = new Float64Array(n), colOf = new Int32Array(n);
    for (let v = 0; v < n; v++) {
      const d = first[bucket[v]] + depth[v];
      x[v] = band[v] ? right[d] - sub[d] / 2 : left[layer[v]] + span[layer[v]] / 2;
      colOf[v] = band[v] ? top + 1 + d : layer[v];
    }
    return {x, colOf};
  }
  // L: n items in topological order, band (0 forward, 1 backward), w (width in columns), h (slot height),
  // twin (item or -1), src/dst (edges between items). Returns x (in columns) and y (in rows, forward above 0).
  function layeredLayout(L) {
    const {n, band, w, h, twin, src, dst} = L, fwd = k => src[k] < dst[k];
    const succs = csr(n, src, dst, fwd), preds = csr(n, dst, src, fwd);
    const layer = forwardLayers(n, band, preds, succs);
    const {top, bucket, depth} = backwardBuckets(n, band, preds, twin, layer);
    const {x, colOf} = columnsOf(n, band, w, layer, top, bucket, depth), cols = [];
    for (let v = 0; v < n; v++) (cols[colOf[v]] = cols[colOf[v]] || []).push(v);
    const columns = cols.filter(c => c), pos = new Float64Array(n);
    stackColumns(columns, Float64Array.from({length: n}, (_, v) => v), h, pos);
    stackColumns(columns, barycentres(n, band, preds, succs, twin, pos, true, true), h, pos);  // mirror
    for (let s = 0; s < SWEEPS; s++) stackColumns(columns, barycentres(n, band, preds, succs, twin, pos, s % 2 === 0, false), h, pos);
    let half = 0;
    for (let v = 0; v < n; v++) half = Math.max(half, Math.abs(pos[v]) + h[v] / 2);
    half += BAND_GAP / 2;
    const y = new Float64Array(n);
    for (let v = 0; v < n; v++) y[v] = band[v] ? -(half + pos[v]) : half + pos[v];
    return {x, y, layer, bucket};
  }

  class DagView {
    constructor(root, P) {
      this.root = root; this.P = P;
      const N = this.N = P.nodes.name.length, G = this.G = P.groups.name.length;
      this.x = new Float64Array(N); this.y = new Float64Array(N);  // per open node: its position
      this.g = Int32Array.from(P.nodes.g);
      this.parent = Int32Array.from(P.groups.parent);
      this.level = Int32Array.from(P.groups.level);
      this.band = new Uint8Array(N);
      const bwd = new Set(["backward", "output"]);
      for (let i = 0; i < N; i++) this.band[i] = bwd.has(P.tables.phase[P.nodes.ph[i]]) ? 1 : 0;
      this.expanded = new Uint8Array(G);
      for (const gid of P.expanded) this.expanded[gid] = 1;
      this.expanded[0] = 1;
      this.colorBy = P.color_by;
      this.hits = new Set(); this.selected = -1; this.selectedBox = -1;
      this.drawnLabels = [];
      const M = N + 2 * G;  // item ids: node i, or N + gid * 2 + band for a closed group's box
      this.ix = new Float64Array(M); this.iy = new Float64Array(M); this.slot = new Int32Array(M).fill(-1);
      this.vis = [];
      this.M = M; const K = M + 2 * G;  // ... and M + gid * 2 + band for an open group's block
      // per item or block: layer, offset in its group's block, position, block size (compound layout)
      this._loc = new Int32Array(K).fill(-1); this._lay = new Int32Array(K);
      for (const a of ["_px", "_py", "_ax", "_ay", "_sw", "_sh"]) this[a] = new Float64Array(K);
      this._firstMembers(); this._subtrees(); this._adjacency(); this._dom();
      this.update(); this.fit(true);
    }
    // -- geometry ------------------------------------------------------------
    _firstMembers() {  // per (group, band): its first node in graph order, the box's rank
      const f = this.first = new Int32Array(this.G * 2).fill(-1);
      for (let i = this.N - 1; i >= 0; i--) for (let gid = this.g[i]; gid >= 0; gid = this.parent[gid]) f[gid * 2 + this.band[i]] = i;
    }
    _subtrees() {  // groups and nodes in depth-first order: every group's subtree is one range
      const G = this.G, N = this.N, kids = Array.from({length: G}, () => []), own = Array.from({length: G}, () => []);
      for (let g = 1; g < G; g++) kids[this.parent[g]].push(g);
      for (let i = 0; i < N; i++) own[this.g[i]].push(i);
      this.nodeOrder = new Int32Array(N); this.nodeAt = new Int32Array(N); this.groupOrder = new Int32Array(G);
      this.lo = new Int32Array(G); this.hi = new Int32Array(G); this.glo = new Int32Array(G); this.ghi = new Int32Array(G);
      let k = 0, gk = 0;
      const visit = g => {
        this.lo[g] = k; this.glo[g] = gk; this.groupOrder[gk++] = g;
        for (const i of own[g]) { this.nodeAt[i] = k; this.nodeOrder[k++] = i; }
        for (const c of kids[g]) visit(c);
        this.hi[g] = k; this.ghi[g] = gk;
      };
      visit(0);
    }
    _adjacency() {
      const E = this.P.edges, N = this.N;
      this.preds = Array.from({length: N}, () => []);
      this.succs = Array.from({length: N}, () => []);
      for (let k = 0; k < E.length; k += 2) { this.succs[E[k]].push(E[k + 1]); this.preds[E[k + 1]].push(E[k]); }
    }
    // -- visibility ----------------------------------------------------------
    update() {  // recompute everything that is drawn (several groups changed), and lay it out
      const G = this.G, N = this.N, rep = this.repOfGroup = new Int32Array(G);
      for (let gid = 0; gid < G; gid++) {  // parents come before children
        const p = this.parent[gid], pr = p >= 0 ? rep[p] : -1;
        rep[gid] = pr >= 0 ? pr : (this.expanded[gid] ? -1 : gid);
      }
      const item = this.itemOf = new Int32Array(N);  // node -> drawn item id (-1: hidden phase)
      this.members = new Int32Array(N + 2 * G); this.visItems = new Set();  // drawn nodes per item
      this.edgeCount = new PairCounts(this.P.edges.length / 2);  // graph edges per pair of items
      for (let i = 0; i < N; i++) { item[i] = this._itemOfNode(i); this._count(item[i], 1); }
      const E = this.P.edges;
      for (let k = 0; k < E.length; k += 2) this._edge(item[E[k]], item[E[k + 1]], 1);
      this._relayout();
    }
    _itemOfNode(i) {  // itself when every group on its path is open, else its closed group's box
      const r = this.repOfGroup[this.g[i]];
      if (this.isHidden && this.isHidden(i)) return -1;  // isHidden: set by widgets/_dagcursor
      return r < 0 ? i : this.N + r * 2 + this.band[i];
    }
    _count(it, s) {  // s = +1 or -1
      if (it < 0) return;
      const c = (this.members[it] += s);
      if (c === 0) this.visItems.delete(it); else if (c === 1 && s > 0) this.visItems.add(it);
    }
    _edge(a, b, s) { if (a !== b && a >= 0 && b >= 0) this.edgeCount.add(a, b, s); }
    // After one group opened or closed: only the nodes under it change item, so only they and
    // their edges are counted again (cost: the group's size plus the visible items), then the
    // visible graph is laid out again.
    regroup(gid) {
      const item = this.itemOf, rep = this.repOfGroup, lo = this.lo[gid], hi = this.hi[gid];
      const order = this.nodeOrder, at = this.nodeAt, inside = j => at[j] >= lo && at[j] < hi;
      const recount = s => {
        for (let k = lo; k < hi; k++) {
          const i = order[k];
          this._count(item[i], s);
          for (const j of this.succs[i]) this._edge(item[i], item[j], s);
          for (const p of this.preds[i]) if (!inside(p)) this._edge(item[p], item[i], s);
        }
      };
      recount(-1);
      for (let k = this.glo[gid]; k < this.ghi[gid]; k++) {  // the groups under gid, parents first
        const g = this.groupOrder[k], p = this.parent[g], pr = p >= 0 ? rep[p] : -1;
        rep[g] = pr >= 0 ? pr : (this.expanded[g] ? -1 : g);
      }
      for (let k = lo; k < hi; k++) item[order[k]] = this._itemOfNode(order[k]);
      recount(1);
      this._relayout();
    }
    _relayout() {  // the visible items and edges from the counts, then layout and drawing
      const N = this.N, nodes = [], boxes = [];
      for (const it of this.visItems) if (it < N) nodes.push(it); else boxes.push(it - N);
      this.visNodes = nodes; this.visBoxes = boxes; this.visEdges = this.edgeCount.pairs();
      this._version = (this._version || 0) + 1;  // node colours are computed again
      this.layout();
      this._moduleColors(); this._legend(); this.draw();
    }
    // -- compound layout: every open group's visible content is one block ------------------
    // Bottom-up, each open group (per band) lays out its direct children (its own nodes, the
    // boxes of its closed subgroups, the blocks of its open subgroups) with layeredLayout, the
    // edges between their contents aggregated to them; the block then takes the size of its
    // content plus a margin (and a title line) as one item of its parent's layout. Top-down,
    // each child is placed at its block's position plus its offset there. Blocks are items of
    // their parent's layout, so sibling outlines never overlap and a child's lies inside its
    // parent's. Item ids: node i, N + key for a closed box, M + key for an open group's block
    // (key = gid * 2 + band, M = N + 2G).
    layout() {
      const t0 = performance.now(), N = this.N, slot = this.slot;
      for (const it of this.vis) slot[it] = -1;
      const vis = this.vis = this._topoItems();
      vis.forEach((it, v) => { slot[it] = v; });
      const {kids, edges} = this._blockTree(vis), groups = [...kids.keys()];
      groups.sort((p, q) => this.level[q] - this.level[p]);  // innermost first
      for (const gid of groups) this._layoutGroup(gid, kids.get(gid), edges.get(gid) || []);
      const ax = this._ax, ay = this._ay, M = this.M;
      for (const gid of groups.reverse()) {  // outermost first: absolute = block + offset
        for (const c of kids.get(gid)) {
          if (gid === 0) { ax[c] = this._px[c]; ay[c] = this._py[c]; continue; }
          const B = M + gid * 2 + this._bandOf(c);
          ax[c] = ax[B] + this._px[c]; ay[c] = ay[B] + this._py[c];
        }
      }
      let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity;
      for (const it of vis) {
        const x = this.ix[it] = ax[it] * XS, y = this.iy[it] = ay[it];
        x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y);
      }
      for (const i of this.visNodes) { this.x[i] = this.ix[i]; this.y[i] = this.iy[i]; }  // open nodes only
      this._outlines(groups);
      for (const key of this.outlineKeys) {  // the outermost outlines (titles) are in view too
        const r = this.outlineRect(key);
        x0 = Math.min(x0, r[0]); y0 = Math.min(y0, r[1]); x1 = Math.max(x1, r[2]); y1 = Math.max(y1, r[3]);
      }
      this.world = vis.length ? [x0, y0, x1, y1] : [0, 0, 1, 1];
      this.lastLayoutMs = performance.now() - t0;
      if (this.mini) this._renderMini();
    }
    _topoItems() {  // the visible items in a topological order of the visible edges
      const N = this.N, slot = this.slot, items = [...this.visNodes, ...this.visBoxes.map(b => N + b)];
      const rank = Float64Array.from(items, it => it < N ? it : this.first[it - N]);  // graph order
      items.forEach((it, v) => { slot[it] = v; });
      const es = this.visEdges, src = new Int32Array(es.length / 2), dst = new Int32Array(es.length / 2);
      for (let k = 0; k < src.length; k++) { src[k] = slot[es[2 * k]]; dst[k] = slot[es[2 * k + 1]]; }
      const order = topoOrder(items.length, rank, src, dst).map(v => items[v]);
      for (const it of items) slot[it] = -1;
      return order;
    }
    _container(c) {  // the open group whose layout places a node, box or block
      const N = this.N, M = this.M;
      return c < N ? this.g[c] : this.parent[(c - (c < M ? N : M)) >> 1];
    }
    _bandOf(c) { return c < this.N ? this.band[c] : (c - (c < this.M ? this.N : this.M)) & 1; }
    _childIn(gid, c) {  // the child of open group gid that holds item c, or -1
      for (let g = this._container(c); g !== gid; g = this._container(c)) {
        if (g <= 0) return -1;
        c = this.M + g * 2 + this._bandOf(c);
      }
      return c;
    }
    _blockTree(vis) {  // per open group its children, and the visible edges aggregated to them
      const kids = new Map(), edges = new Map(), seen = new Set(), M = this.M, push = (m, k, v) => { const l = m.get(k); if (l) l.push(v); else m.set(k, [v]); };
      for (const it of vis) {
        for (let c = it; ;) {
          const g = this._container(c);
          push(kids, g, c);
          if (g === 0) break;
          c = M + g * 2 + this._bandOf(c);
          if (seen.has(c)) break;
          seen.add(c);
        }
      }
      const es = this.visEdges, pairs = new Set(), up = new Map();
      for (let k = 0; k < es.length; k += 2) {
        up.clear();
        for (let c = es[k]; ;) { const g = this._container(c); up.set(g, c); if (g === 0) break; c = M + g * 2 + this._bandOf(c); }
        for (let c = es[k + 1]; ;) {
          const g = this._container(c);
          if (up.has(g)) {
            const a = up.get(g), key = a * 4 * M + c;
            if (a !== c && !pairs.has(key)) { pairs.add(key); push(edges, g, a); edges.get(g).push(c); }
            break;
          }
          c = M + g * 2 + this._bandOf(c);
        }
      }
      this._blocks = seen;
      return {kids, edges};
    }
    _layoutGroup(gid, ch, es) {  // layeredLayout of one open group's children; sizes its blocks
      const N = this.N, M = this.M, loc = this._loc, first = this.first, tw = this.P.nodes.twin;
      const rank = Float64Array.from(ch, c => c < N ? c : first[c - (c < M ? N : M)]);
      ch.forEach((c, v) => { loc[c] = v; });
      const src0 = Int32Array.from({length: es.length / 2}, (_, k) => loc[es[2 * k]]), dst0 = Int32Array.from({length: es.length / 2}, (_, k) => loc[es[2 * k + 1]]);
      const order = topoOrder(ch.length, rank, src0, dst0).map(v => ch[v]), n = order.length;
      order.forEach((c, v) => { loc[c] = v; });
      const band = new Uint8Array(n), w = new Float64Array(n), h = new Float64Array(n), twin = new Int32Array(n).fill(-1);
      for (let v = 0; v < n; v++) {
        const c = order[v];
        band[v] = this._bandOf(c);
        w[v] = c < N ? 1 : c < M ? BOX_COLS : this._sw[c]; h[v] = c < N ? NODE_SLOT : c < M ? BOX_SLOT : this._sh[c];
        if (!band[v]) continue;
        const t = c < N ? (tw[c] >= 0 && this.itemOf[tw[c]] >= 0 ? this._childIn(gid, this.itemOf[tw[c]]) : -1) : c - 1;  // boxes, blocks: the forward one
        if (t >= 0 && loc[t] >= 0 && loc[t] < n && order[loc[t]] === t) twin[v] = loc[t];
      }
      const src = Int32Array.from(src0, k => loc[ch[k]]), dst = Int32Array.from(dst0, k => loc[ch[k]]);
      const lay = layeredLayout({n, band, w, h, twin, src, dst});
      for (let v = 0; v < n; v++) { this._px[order[v]] = lay.x[v]; this._py[order[v]] = lay.y[v]; this._lay[order[v]] = band[v] ? lay.bucket[v] : lay.layer[v]; }
      for (const c of order) loc[c] = -1;
      if (gid > 0) for (const b of [0, 1]) this._sizeBlock(M + gid * 2 + b, order, w, h, band, b);
    }
    _sizeBlock(B, order, w, h, band, b) {  // block B: its content's extent plus margins; offsets centred
      let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity;
      const px = this._px, py = this._py;
      order.forEach((c, v) => {
        if (band[v] !== b) return;
        x0 = Math.min(x0, px[c] - w[v] / 2); x1 = Math.max(x1, px[c] + w[v] / 2);
        y0 = Math.min(y0, py[c] - h[v] / 2); y1 = Math.max(y1, py[c] + h[v] / 2);
      });
      if (x0 > x1) return;
      this._sw[B] = x1 - x0 + 2 * PAD_X; this._sh[B] = y1 - y0 + PAD_T + PAD_B;
      const cx = (x0 + x1) / 2, cy = (y0 + y1) / 2 - (PAD_B - PAD_T) / 2;  // the title line on top
      order.forEach((c, v) => { if (band[v] === b) { px[c] -= cx; py[c] -= cy; } });
    }
    _outlines(groups) {  // per open (group, band) with visible content: its block, inset a little
      const ob = this.ob = new Float64Array(this.G * 8).fill(NaN), keys = [], M = this.M;
      for (const gid of groups) for (const b of [0, 1]) {
        const key = gid * 2 + b, B = M + key;
        if (gid === 0 || !this._blocks.has(B)) continue;
        const o = key * 4, hw = this._sw[B] / 2 - INSET_X, hh = this._sh[B] / 2 - INSET_Y;
        ob[o] = (this._ax[B] - hw) * XS; ob[o + 1] = this._ay[B] - hh; ob[o + 2] = (this._ax[B] + hw) * XS; ob[o + 3] = this._ay[B] + hh;
        keys.push(key);
      }
      this.outlineKeys = keys;  // outer groups first
    }
    outlineRect(key) {  // world rect around an open group's visible items in one band, or null
      const o = key * 4, ob = this.ob;
      return ob[o] <= ob[o + 2] ? [ob[o], ob[o + 1], ob[o + 2], ob[o + 3]] : null;
    }
    outputItem() {  // the drawn item holding the graph's output node
      const o = this.P.tables.phase.indexOf("output");
      for (let i = this.N - 1; i >= 0; i--) if (this.P.nodes.ph[i] === o) return this.itemOf[i];
      return -1;
    }
    itemXY(it) { return [this.ix[it], this.iy[it]]; }
    itemRect(it) {  // world rect [x0, y0, x1, y1] of a drawn node or box
      const [hw, hh] = it < this.N ? [NODE_HW, NODE_HH] : [BOX_HW, BOX_HH], x = this.ix[it], y = this.iy[it];
      return [x - hw, y - hh, x + hw, y + hh];
    }
    boxRect(b) { return this.itemRect(this.N + b); }
    /** What tests read: every visible item's id, kind, band, layer and world rect, and the edges. */
    layoutState() {
      const N = this.N;
      return {items: this.vis.map((it, v) => ({id: it < N ? this.P.nodes.name[it] : this.P.groups.name[(it - N) >> 1] + ((it - N) & 1 ? "#b" : "#f"),
                                               box: it >= N, band: it < N ? this.band[it] : (it - N) & 1,
                                               group: this.P.groups.name[it < N ? this.g[it] : (it - N) >> 1],
                                               layer: this._layerPath(it), rect: this.itemRect(it)})),
              outlines: this.outlineKeys.map(key => ({group: this.P.groups.name[key >> 1], band: key & 1, rect: this.outlineRect(key)})),
              edges: this.visEdges.map(it => this.slot[it]), layoutMs: this.lastLayoutMs};
    }
    _layerPath(it) {  // an item's layer in each nested layout, outermost first (compare as a list)
      const path = [];
      for (let c = it; ; c = this.M + this._container(c) * 2 + this._bandOf(c)) {
        path.unshift(this._lay[c]);
        if (this._container(c) === 0) return path;
      }
    }
    // -- colour --------------------------------------------------------------
    ancestorAt(gid, lvl) { while (this.level[gid] > lvl) gid = this.parent[gid]; return gid; }
    _moduleColors() {
      // the deepest module level whose visible groups fit the palette: no colour reused
      const groups = [...this.visNodes.map(i => this.g[i]), ...this.visBoxes.map(b => b >> 1)];
      const maxL = groups.reduce((m, gid) => Math.max(m, this.level[gid]), 0);
      const pal = this.P.palette;
      let keys = null;
      for (let L = maxL; L >= 1; L--) {
        const ks = new Map();
        for (const gid of groups) { const a = this.ancestorAt(gid, L); if (!ks.has(a)) ks.set(a, ks.size); }
        keys = ks; this.colorLevel = L;
        if (ks.size <= pal.length) break;
      }
      keys = keys || new Map([[0, 0]]);
      this.moduleKey = keys;
      this.keyColor = new Map();
      for (const [gid, k] of keys) this.keyColor.set(gid, k < pal.length ? pal[k] : `hsl(${(k * 137.508) % 360},65%,45%)`);
    }
    groupColor(gid) { return this.keyColor.get(this.ancestorAt(gid, this.colorLevel)) || "#888"; }
    scaleColor(v, max) {  // log scale, light to dark blue
      const t = max > 0 ? Math.log1p(v) / Math.log1p(max) : 0;
      return `hsl(${220 - 180 * t},70%,${80 - 45 * t}%)`;
    }
    layer() { return (this.P.layers || {})[this.colorBy]; }
    layerColor(L, v) {  // a user layer: log (or linear) scale for numbers, palette for labels
      if (L.kind === "cat") return v >= 0 ? L.colors[v] : (v === -2 ? "#999" : "#ddd");
      if (v === null || v === undefined) return "#ddd";
      const lo = L.lo, hi = L.hi, lg = lo > 0;
      const t = hi <= lo ? 1 : lg ? Math.log(v / lo) / Math.log(hi / lo) : (v - lo) / (hi - lo);
      return `hsl(${220 - 180 * Math.max(0, Math.min(1, t))},70%,${80 - 45 * Math.max(0, Math.min(1, t))}%)`;
    }
    layerText(L, v) {
      if (L.kind === "cat") return v >= 0 ? L.levels[v] : (v === -2 ? "(mixed)" : "-");
      return v === null || v === undefined ? "-" : Number(v).toPrecision(4);
    }
    nodeColor(i) {
      const P = this.P, n = P.nodes, L = this.layer();
      if (L) return this.layerColor(L, L.v[i]);
      switch (this.colorBy) {
        case "phase": return P.phase_colors[P.tables.phase[n.ph[i]]] || "#444";
        case "category": return P.palette[n.cat[i] % P.palette.length];
        case "bytes": return this.scaleColor(n.bytes[i], this._max("bytes"));
        case "flops": return this.scaleColor(n.flops[i], this._max("flops"));
        default: return this.groupColor(this.g[i]);
      }
    }
    boxColor(b) {
      const gid = b >> 1, band = b & 1, G = this.P.groups, L = this.layer();
      if (L) return this.layerColor(L, L[band ? "gb" : "gf"][gid]);
      if (this.colorBy === "phase") return band ? this.P.phase_colors.backward : this.P.phase_colors.forward;
      if (this.colorBy === "bytes") return this.scaleColor(G[band ? "bytes_b" : "bytes_f"][gid], this._max("bytes") * 50);
      if (this.colorBy === "flops") return this.scaleColor(G[band ? "flops_b" : "flops_f"][gid], this._max("flops") * 50);
      if (this.colorBy === "category") return "#9aa";
      return this.groupColor(gid);
    }
    _max(k) { this._mx = this._mx || {}; if (!(k in this._mx)) this._mx[k] = this.P.nodes[k].reduce((a, b) => Math.max(a, b), 0); return this._mx[k]; }
    // -- DOM -----------------------------------------------------------------
    _dom() {
      const r = this.root;
      if (!document.getElementById("jl-dag-style")) { const s = el("style"); s.id = "jl-dag-style"; s.textContent = CSS; document.head.appendChild(s); }
      const bar = el("div", "jl-bar"); r.appendChild(bar);
      bar.appendChild(el("span", "jl-title", this.P.title));
      this.search = el("input"); this.search.placeholder = "search name / op / module / /regex/";
      this.search.className = "jl-search"; this.search.style.width = "230px";
      this.search.addEventListener("keydown", e => { if (e.key === "Enter") this.find(this.search.value); });
      bar.appendChild(this.search);
      this.colorSel = el("select", "jl-color");
      for (const c of ["module", "phase", "category", "bytes", "flops", ...Object.keys(this.P.layers || {})]) { const o = el("option", null, "colour: " + c); o.value = c; this.colorSel.appendChild(o); }
      this.colorSel.value = this.colorBy;
      this.colorSel.onchange = () => { this.colorBy = this.colorSel.value; this._legend(); this.draw(); };
      bar.appendChild(this.colorSel);
      for (const [t, f] of [["fit", () => this.fit()], ["collapse all", () => this.collapseAll()]]) {
        const b = el("button", "jl-btn", t); b.onclick = f; bar.appendChild(b);
      }
      this.status = el("span", "jl-status"); bar.appendChild(this.status);
      const main = el("div", "jl-main"); r.appendChild(main);
      this.canvas = el("canvas", "jl-canvas"); main.appendChild(this.canvas);
      this.mini = el("canvas", "jl-mini"); this.mini.width = 240; this.mini.height = 56; main.appendChild(this.mini);
      this.detail = el("div", "jl-detail"); main.appendChild(this.detail);
      this.legendEl = el("div", "jl-legend"); r.appendChild(this.legendEl);
      this._events();
      new ResizeObserver(() => this.draw()).observe(main);
    }
    _legend() {
      const L = this.legendEl; if (!L) return; L.textContent = "";
      let entries = [];
      if (this.colorBy === "phase") entries = Object.entries(this.P.phase_colors);
      else if (this.colorBy === "module") entries = [...this.keyColor].slice(0, 24).map(([gid, c]) => [this.P.groups.name[gid] || "(root)", c]);
      else if (this.layer()) {
        const Ly = this.layer();
        entries = Ly.kind === "cat" ? this._catLegend(Ly)
          : [[this.colorBy + " " + Number(Ly.lo).toPrecision(3), this.layerColor(Ly, Ly.lo)], [Number(Ly.hi).toPrecision(3), this.layerColor(Ly, Ly.hi)], ["unknown", "#ddd"]];
      }
      else if (this.colorBy === "category") entries = this.P.tables.cat.map((c, k) => [c || "(none)", this.P.palette[k % this.P.palette.length]]);
      else entries = [["low " + this.colorBy, this.scaleColor(0, 1)], ["high " + this.colorBy, this.scaleColor(1, 1)]];
      for (const [name, c, full] of entries) { const s = el("span"); const i = el("i"); i.style.background = c; s.appendChild(i); s.appendChild(document.createTextNode(name)); if (full) s.title = full; L.appendChild(s); }
      L.appendChild(el("span", "jl-status", "↑ forward · ↓ backward · click a box to open it, a group title to close it · wheel zooms, drag pans"));
    }
    _catLegend(Ly) {  // the ranked levels with a colour of their own (short names, full ones as tooltips), then "+N more"
      const out = Ly.short.map((s, k) => [s, Ly.colors[k], Ly.levels[k]]), more = Ly.levels.length - out.length;
      const swatch = `linear-gradient(90deg,${Ly.colors.slice(out.length, out.length + 4).join(",")},${Ly.colors[Ly.levels.length - 1]})`;
      if (more > 0) out.push([`+${more} more ${this.colorBy}${more === 1 ? "" : "s"}`, swatch, `${more} with fewer nodes, in paler colours: click a node for its ${this.colorBy}`]);
      return out.concat([["(mixed)", "#999"], ["(none)", "#ddd"]]);
    }
    // -- view transform --------------------------------------------------------
    fit(initial) {  // fit everything, or (first paint of a very long graph) its left part at readable size
      const W = this.canvas.clientWidth || 800, H = this.canvas.clientHeight || 500;
      const [x0, y0, x1, y1] = this.world;  // the visible items' extent (layout())
      let k = Math.min(W / (x1 - x0 + 4), H / (y1 - y0 + 3));
      if (initial && k * XS < LABEL_MIN_PX) k = Math.min(H / (y1 - y0 + 3), LABEL_MIN_PX / XS * 1.05);
      this.k = k;
      // a long, flat graph is stretched vertically so closed boxes stay tall enough to read
      this.ay = Math.max(1, H * 0.85 / ((y1 - y0 + 3) * k));
      this.vx = initial && k * (x1 - x0 + 4) > W ? x0 - 2 : (x0 + x1) / 2 - W / 2 / k;
      this.vy = (y0 + y1) / 2 + H / 2 / (k * this.ay);
      this._renderMini(); this.draw();
    }
    toScreen(x, y) { return [(x - this.vx) * this.k, (this.vy - y) * this.k * this.ay]; }
    toWorld(px, py) { return [px / this.k + this.vx, this.vy - py / (this.k * this.ay)]; }
    zoomAt(px, py, f) {
      const [wx, wy] = this.toWorld(px, py);
      this.k = Math.max(1e-3, Math.min(400, this.k * f));
      if (f > 1) this.ay = Math.max(1, this.ay / f);  // zooming in first widens, then scales
      this.vx = wx - px / this.k; this.vy = wy + py / (this.k * this.ay);
      this.draw();
    }
    zoomTo(x0, y0, x1, y1) {
      const W = this.canvas.clientWidth, H = this.canvas.clientHeight;
      this.k = Math.min(60, W / (x1 - x0 + 6), H / (y1 - y0 + 3));
      this.ay = Math.max(1, H * 0.85 / ((y1 - y0 + 3) * this.k));  // a flat region fills the height
      this.vx = (x0 + x1) / 2 - W / 2 / this.k; this.vy = (y0 + y1) / 2 + H / 2 / (this.k * this.ay);
      this.draw();
    }
    // -- events --------------------------------------------------------------
    _events() {
      const c = this.canvas;
      c.addEventListener("wheel", e => { e.preventDefault(); const r = c.getBoundingClientRect(); this.zoomAt(e.clientX - r.left, e.clientY - r.top, Math.exp(-e.deltaY * 0.0015)); }, {passive: false});
      let drag = null;
      c.addEventListener("mousedown", e => { drag = {x: e.clientX, y: e.clientY, vx: this.vx, vy: this.vy, moved: false}; c.style.cursor = "grabbing"; });
      window.addEventListener("mousemove", e => {
        if (!drag) return;
        const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
        if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
        this.vx = drag.vx - dx / this.k; this.vy = drag.vy + dy / (this.k * this.ay); this.draw();
      });
      window.addEventListener("mouseup", e => {
        if (!drag) return;
        const moved = drag.moved; drag = null; c.style.cursor = "grab";
        if (!moved) { const r = c.getBoundingClientRect(); this.click(e.clientX - r.left, e.clientY - r.top); }
      });
      this.mini.addEventListener("click", e => {
        const r = this.mini.getBoundingClientRect(), [x0, y0, x1, y1] = this.world;
        const wx = x0 + (e.clientX - r.left) / this.mini.width * (x1 - x0);
        const wy = y1 - (e.clientY - r.top) / this.mini.height * (y1 - y0);
        this.vx = wx - this.canvas.clientWidth / 2 / this.k; this.vy = wy + this.canvas.clientHeight / 2 / (this.k * this.ay); this.draw();
      });
    }
    hit(px, py) {  // the drawn node, the closed box, or the open group's title under a point
      const r = Math.max(4, this._radius()) + 3;
      let best = -1, bd = r * r;
      for (const i of this.visNodes) {
        const [sx, sy] = this.toScreen(this.x[i], this.y[i]);
        const d = (sx - px) ** 2 + (sy - py) ** 2;
        if (d < bd) { bd = d; best = i; }
      }
      if (best >= 0) return {node: best};
      let box = -1, area = Infinity;  // boxes may overlap: the smallest one under the point
      for (const b of this.visBoxes) {
        const [x0, y0, x1, y1] = this.boxRect(b), [a, t] = this.toScreen(x0, y1), [z, u] = this.toScreen(x1, y0);
        if (px >= a && px <= z && py >= t && py <= u && (z - a) * (u - t) < area) { box = b; area = (z - a) * (u - t); }
      }
      if (box >= 0) return {box};
      for (const t of this.titles || []) if (px >= t[1] && px <= t[3] && py >= t[2] && py <= t[4]) return {title: t[0], band: t[5]};
      return null;
    }
    click(px, py) {
      const h = this.hit(px, py);
      if (!h) return;
      if (h.node !== undefined) this.select(h.node);
      else if (h.box !== undefined) this.toggle(h.box >> 1, true, h.box & 1);
      else this.toggle(h.title, false, h.band);
    }
    // the world rect of a group in one band: its box when closed, its outline when open
    groupRect(gid, band) { return this.slot[this.N + gid * 2 + band] >= 0 ? this.boxRect(gid * 2 + band) : this.outlineRect(gid * 2 + band); }
    toggle(gid, open, band) {  // open or close in place: the group's left edge stays where it was on screen
      const t0 = performance.now();
      band = band || 0;
      if (!this.groupRect(gid, band)) band = 1 - band;
      const before = this.groupRect(gid, band), anchor = before && this.toScreen(before[0], (before[1] + before[3]) / 2);
      if (open) this.expanded[gid] = 1;
      else { for (let k = this.glo[gid]; k < this.ghi[gid]; k++) this.expanded[this.groupOrder[k]] = 0; }
      this.regroup(gid);
      const after = this.groupRect(gid, band);
      if (anchor && after) { this.vx = after[0] - anchor[0] / this.k; this.vy = (after[1] + after[3]) / 2 + anchor[1] / (this.k * this.ay); }
      this.lastToggleMs = performance.now() - t0;
      this.showGroup(gid);
    }
    collapseAll() { this.expanded.fill(0); this.expanded[0] = 1; this.update(); this.fit(); }
    reveal(i) { for (let gid = this.g[i]; gid >= 0; gid = this.parent[gid]) this.expanded[gid] = 1; }
    // -- search ----------------------------------------------------------------
    find(q) {
      const t0 = performance.now(); q = (q || "").trim(); this.hits = new Set();
      if (!q) { this.status.textContent = ""; this.draw(); return []; }
      let test;
      const m = /^\/(.*)\/([a-z]*)$/.exec(q);
      if (m) { let re; try { re = new RegExp(m[1], m[2] || "i"); } catch (err) { this.status.textContent = "bad regex: " + err.message; return []; } test = s => re.test(s); }
      else { const ql = q.toLowerCase(); test = s => s.toLowerCase().includes(ql); }
      const n = this.P.nodes, T = this.P.tables, gn = this.P.groups.name, out = [];
      for (let i = 0; i < this.N; i++) {
        if (test(n.name[i]) || test(T.label[n.label[i]]) || test(T.target[n.target[i]]) || test(gn[this.g[i]])) out.push(i);
      }
      const REVEAL = 400;
      for (const i of out.slice(0, REVEAL)) this.reveal(i);
      this.update();
      for (const i of out) this.hits.add(i);
      if (out.length) {
        let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity;
        for (const i of out.slice(0, REVEAL)) { const [x, y] = this.itemXY(this.itemOf[i]); x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y); }
        this.zoomTo(x0, y0, x1, y1);
      }
      this.lastSearchMs = performance.now() - t0;
      this.status.textContent = `${out.length} match${out.length === 1 ? "" : "es"}` + (out.length > REVEAL ? ` (first ${REVEAL} opened)` : "");
      this.draw();
      return out;
    }
    // -- detail panel --------------------------------------------------------------
    select(i, centre) {
      this.selected = i; this.selectedBox = -1;
      if (centre) { this.reveal(i); this.update(); const [x, y] = [this.x[i], this.y[i]]; this.zoomTo(x - 6, y - 2, x + 6, y + 2); }
      const P = this.P, n = P.nodes, T = P.tables, D = this.detail;
      D.textContent = ""; D.style.display = "block";
      const close = el("span", "jl-link", "✕"); close.style.float = "right"; close.onclick = () => { D.style.display = "none"; this.selected = -1; this.draw(); };
      D.appendChild(close);
      D.appendChild(el("b", "jl-detail-name", n.name[i]));
      const tb = el("table"); D.appendChild(tb);
      const row = (k, v) => { const tr = el("tr"); tr.appendChild(el("td", null, k)); const td = el("td"); if (v instanceof Node) td.appendChild(v); else td.textContent = v; tr.appendChild(td); tb.appendChild(tr); return td; };
      const valueName = j => { const e = P.nodes.extra[String(j)] || {}; return e.fqn || e.input_path || n.name[j]; };  // arg5_1 -> h.0.ln_1.weight
      const links = list => { const s = el("span"); for (const j of list.slice(0, 30)) { const a = el("span", "jl-link", valueName(j)); a.title = n.name[j]; a.onclick = () => this.select(j, true); s.appendChild(a); } if (list.length > 30) s.appendChild(document.createTextNode(`… ${list.length - 30} more`)); return s; };
      const extra = P.nodes.extra[String(i)] || {};
      row("op", T.target[n.target[i]]); row("phase", T.phase[n.ph[i]]);
      row("module", (P.groups.name[this.g[i]] || "(root)") + " " + (P.groups.mtype[this.g[i]] || ""));
      row("shape", (T.shape[n.shape[i]] || "-") + " " + T.dtype[n.dtype[i]]);
      row("FLOPs", human(n.flops[i], "FLOP")); row("bytes", humanBytes(n.bytes[i]));
      row("category", T.cat[n.cat[i]]);
      row("saved for backward", n.flags[i] & 1 ? "yes" : "no");
      if (n.flags[i] & 2) row("recomputed", "yes (checkpoint)");
      for (const k of ["fqn", "grad_of", "input_path"]) if (extra[k]) row(k, extra[k]);
      row("source", T.source[n.src[i]] || "-");
      for (const [name, L] of Object.entries(P.layers || {})) row(name, this.layerText(L, L.v[i])).className = "jl-layer";
      if (this.detailRows) for (const [k, v] of this.detailRows(i)) row(k, v).className = "jl-value";  // e.g. a Stepper's value stats
      const tw = n.twin[i], back = [];
      for (let j = 0; j < this.N; j++) if (n.twin[j] === i) back.push(j);
      if (tw >= 0) row("forward twin", links([tw])).className = "jl-twin";
      if (back.length) row("backward twins", links(back)).className = "jl-twin";
      row("inputs", links(this.preds[i])); row("users", links(this.succs[i]));
      this.draw();
    }
    showGroup(gid) {
      const P = this.P, G = P.groups, D = this.detail;
      D.textContent = ""; D.style.display = "block";
      D.appendChild(el("b", "jl-detail-name", (G.name[gid] || "(root)") + " " + (G.mtype[gid] || "")));
      const tb = el("table"); D.appendChild(tb);
      for (const [k, v] of [["nodes", `${G.count_f[gid]} forward · ${G.count_b[gid]} backward`],
        ["FLOPs", `fwd ${human(G.flops_f[gid], "FLOP")} · bwd ${human(G.flops_b[gid], "FLOP")}`],
        ["bytes", `fwd ${humanBytes(G.bytes_f[gid])} · bwd ${humanBytes(G.bytes_b[gid])}`]]) {
        const tr = el("tr"); tr.appendChild(el("td", null, k)); tr.appendChild(el("td", null, v)); tb.appendChild(tr);
      }
      const b = el("button", "jl-btn", this.expanded[gid] ? "close group" : "open group");
      b.onclick = () => this.toggle(gid, !this.expanded[gid]); D.appendChild(b);
    }
    // -- drawing ---------------------------------------------------------------
    _radius() { return Math.max(1.5, Math.min(9, 0.3 * this.k)); }
    draw() {
      if (this._raf) return;
      this._raf = requestAnimationFrame(() => { this._raf = 0; this.render(); });
    }
    render() {
      const t0 = performance.now(), c = this.canvas, dpr = window.devicePixelRatio || 1;
      const W = c.clientWidth, H = c.clientHeight;
      if (c.width !== Math.round(W * dpr) || c.height !== Math.round(H * dpr)) { c.width = Math.round(W * dpr); c.height = Math.round(H * dpr); }
      const ctx = c.getContext("2d");
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0); ctx.clearRect(0, 0, W, H);
      const on = (sx, sy, m) => sx > -m && sx < W + m && sy > -m && sy < H + m;
      // band divider
      const [, zy] = this.toScreen(0, 0); ctx.strokeStyle = "rgba(0,0,0,.15)"; ctx.setLineDash([4, 4]);
      ctx.beginPath(); ctx.moveTo(0, zy); ctx.lineTo(W, zy); ctx.stroke(); ctx.setLineDash([]);
      this._occ = new Occupancy();  // text drawn so far this frame
      this._drawTitles(ctx, W, H);
      this._drawEdges(ctx, W, H);
      this._drawBoxes(ctx, W, H, on);
      this._drawNodes(ctx, W, H, on);
      this._drawMiniView();
      const t1 = performance.now();
      this.lastFrameMs = t1 - t0; this.lastFrameEnd = t1;  // frame timing, read by bench/
      if (this.firstFrameEnd === undefined) { this.firstFrameEnd = t1; performance.mark("jl-dag-first-frame"); }
    }
    _drawTitles(ctx, W, H) {  // outlines and titles of open groups (click a title to close)
      this.titles = [];
      ctx.font = FONT;
      for (const key of this.outlineKeys) {  // outer groups first
        const o = key * 4;
        if ((this.ob[o + 2] - this.ob[o]) * this.k < 20) continue;  // too narrow on screen to draw
        const [x0, y0, x1, y1] = this.outlineRect(key), [a, t] = this.toScreen(x0, y1), [z, u] = this.toScreen(x1, y0);
        if (z < 0 || a > W || u < 0 || t > H || z - a < 24) continue;
        const gid = key >> 1;
        ctx.strokeStyle = this.groupColor(gid); ctx.globalAlpha = 0.5; ctx.strokeRect(a, t, z - a, u - t); ctx.globalAlpha = 1;
        const sfx = (key & 1 ? " (bwd)" : "") + " ▾";
        // the title sits at the outline's top left (kept on screen), one line lower if an
        // outer group's title is there already
        const ax = Math.max(a, 0) + 2, cut = fitText(ctx, this.P.groups.name[gid] || "", z - ax - 2 - textWidth(ctx, sfx), true);
        if (!cut) continue;  // the module name is cut (tail kept), never the suffix
        const txt = cut + sfx, w = textWidth(ctx, txt);
        for (const ty of [Math.max(t, 0), Math.max(t, 0) + 13]) {
          if (ty + 13 > u || !this._occ.place(ax, ty, ax + w, ty + 13)) continue;
          ctx.fillStyle = "#333"; ctx.fillText(txt, ax, ty + 11);
          this.titles.push([gid, ax - 2, ty, ax + w + 2, ty + 13, key & 1]);
          break;
        }
      }
    }
    _clip(it, sx, sy, tx, ty) {  // end the edge at the target's outline
      if (it < this.N) { const r = this._radius() + 1, d = Math.hypot(sx - tx, sy - ty) || 1; return [tx + (sx - tx) * r / d, ty + (sy - ty) * r / d]; }
      const [x0, y0, x1, y1] = this.boxRect(it - this.N), [a, t] = this.toScreen(x0, y1), [z, u] = this.toScreen(x1, y0);
      const cx = (a + z) / 2, cy = (t + u) / 2, dx = sx - cx, dy = sy - cy;
      const s = Math.min(Math.abs((z - a) / 2 / (dx || 1e-9)), Math.abs((u - t) / 2 / (dy || 1e-9)), 1);
      return [cx + dx * s, cy + dy * s];
    }
    _drawEdges(ctx, W, H) {
      const es = this.visEdges, arrows = this.k > 4, out = this.outputItem();
      ctx.strokeStyle = "rgba(90,90,90,.35)"; ctx.lineWidth = 1; ctx.beginPath();
      const heads = [], faint = [];
      // level of detail: many edges zoomed out land on the same pixels; each pixel-exact line
      // (both ends on screen) is stroked once, and one inside a single pixel not at all
      const dense = !arrows && es.length > 4000, drawnPx = dense ? new PairCounts(es.length / 2) : null;
      const ix = this.ix, iy = this.iy, vx = this.vx, vy = this.vy, kx = this.k, ky = this.k * this.ay;
      for (let k = 0; k < es.length; k += 2) {
        const p = es[k], q = es[k + 1];
        if (q === out && p !== this.selected) { faint.push(p, q); continue; }
        let sx = (ix[p] - vx) * kx, sy = (vy - iy[p]) * ky, tx = (ix[q] - vx) * kx, ty = (vy - iy[q]) * ky;  // toScreen
        if ((sx < 0 && tx < 0) || (sx > W && tx > W) || (sy < 0 && ty < 0) || (sy > H && ty > H)) continue;
        if (dense && sx >= 0 && sy >= 0 && tx >= 0 && ty >= 0 && sx < 4096 && sy < 4096 && tx < 4096 && ty < 4096) {
          const a = Math.floor(sx) * 4096 + Math.floor(sy), b = Math.floor(tx) * 4096 + Math.floor(ty);
          if (a === b || drawnPx.add(a, b, 1) > 1) continue;
        }
        if (arrows) [tx, ty] = this._clip(es[k + 1], sx, sy, tx, ty);
        if (arrows && es[k] >= this.N) [sx, sy] = this._clip(es[k], tx, ty, sx, sy);  // out of a box's outline
        ctx.moveTo(sx, sy); ctx.lineTo(tx, ty);
        if (arrows && Math.hypot(tx - sx, ty - sy) > 14) heads.push(sx, sy, tx, ty);
      }
      ctx.stroke();
      ctx.strokeStyle = "rgba(148,103,189,.10)"; ctx.beginPath();  // every gradient -> output: faint
      for (let k = 0; k < faint.length; k += 2) {
        const [sx, sy] = this.toScreen(...this.itemXY(faint[k])), [tx, ty] = this.toScreen(...this.itemXY(faint[k + 1]));
        ctx.moveTo(sx, sy); ctx.lineTo(tx, ty);
      }
      ctx.stroke();
      ctx.fillStyle = "rgba(70,70,70,.7)"; ctx.beginPath();
      for (let k = 0; k < heads.length; k += 4) {
        const [sx, sy, tx, ty] = heads.slice(k, k + 4), d = Math.hypot(tx - sx, ty - sy), ux = (tx - sx) / d, uy = (ty - sy) / d, L = 7, w = 3.2;
        ctx.moveTo(tx, ty); ctx.lineTo(tx - ux * L - uy * w, ty - uy * L + ux * w); ctx.lineTo(tx - ux * L + uy * w, ty - uy * L - ux * w); ctx.closePath();
      }
      ctx.fill();
      this.arrowCount = heads.length / 4;
    }
    _drawBoxes(ctx, W, H) {
      const G = this.P.groups;
      ctx.font = FONT; ctx.textBaseline = "alphabetic";
      this.boxLabels = [];
      for (const b of this.visBoxes) {
        const [x0, y0, x1, y1] = this.boxRect(b), [a, t] = this.toScreen(x0, y1), [z, u] = this.toScreen(x1, y0);
        if (z < 0 || a > W || u < 0 || t > H) continue;
        const gid = b >> 1, band = b & 1, col = this.boxColor(b);
        ctx.fillStyle = col; ctx.globalAlpha = 0.28; ctx.fillRect(a, t, Math.max(z - a, 1), Math.max(u - t, 1)); ctx.globalAlpha = 1;
        ctx.strokeStyle = col; ctx.lineWidth = 1.2; ctx.strokeRect(a, t, z - a, u - t);
        if (this.hitBoxes && this.hitBoxes.has(b)) { ctx.strokeStyle = "#111"; ctx.lineWidth = 3; ctx.strokeRect(a - 2, t - 2, z - a + 4, u - t + 4); }
        if (z - a < 34 || u - t < 14) continue;
        const name = G.name[gid] || "(root)", sfx = band ? "_b" : "_f";
        const lines = [name, `${G["count" + sfx][gid]} nodes ${band ? "bwd" : "fwd"}`,
          `${human(G["flops" + sfx][gid], "FLOP")} · ${humanBytes(G["bytes" + sfx][gid])}`];
        const cx = Math.max(a, 0) + 3, maxw = z - Math.max(a, 0) - 6;
        let yy = Math.max(t, 0) + 13;
        ctx.fillStyle = "#111";
        for (const [k, s] of lines.entries()) {
          if (yy > u - 2) break;
          const txt = fitText(ctx, s, maxw, k === 0);
          if (!txt || !this._occ.place(cx, yy - 11, cx + textWidth(ctx, txt), yy + 2)) break;
          ctx.fillText(txt, cx, yy); yy += 13; ctx.fillStyle = "#444";
          if (k === 0) this.boxLabels.push(name);
        }
      }
    }
    _nodeColors() {  // per visible node the index of its colour, once per update and colouring
      const key = this.colorBy + "|" + this._version;
      if (this._colorKey !== key) {
        const idx = this._colorIdx = this._colorIdx || new Int32Array(this.N), seen = new Map();
        for (const i of this.visNodes) {
          const c = this.nodeColor(i);
          let k = seen.get(c);
          if (k === undefined) seen.set(c, k = seen.size);
          idx[i] = k;
        }
        this._colorList = [...seen.keys()]; this._colorKey = key;
      }
      return this._colorIdx;
    }
    _drawNodes(ctx, W, H, on) {
      const r = this._radius(), n = this.P.nodes, T = this.P.tables, colPx = this.k * XS;
      const labels = colPx >= LABEL_MIN_PX, shapes = colPx >= LABEL_MIN_PX * 1.6;
      const drawn = [];
      // level of detail: small squares are batched per colour, one per screen pixel
      const tiny = r < 2.5, px = tiny ? new Uint8Array(W * H) : null;
      const x = this.x, y = this.y, vx = this.vx, vy = this.vy, kx = this.k, ky = this.k * this.ay;
      const color = this._nodeColors(), colors = this._colorList, byColor = colors.map(() => []);
      for (const i of this.visNodes) {
        const sx = (x[i] - vx) * kx, sy = (vy - y[i]) * ky;  // toScreen
        if (sx < -40 || sx > W + 40 || sy < -40 || sy > H + 40) continue;
        if (tiny) {
          const c = Math.floor(sy) * W + Math.floor(sx);
          if (sx >= 0 && sy >= 0 && sx < W && sy < H) { if (px[c]) continue; px[c] = 1; }
          byColor[color[i]].push(sx - r, sy - r); continue;
        }
        ctx.fillStyle = colors[color[i]];
        ctx.beginPath(); ctx.arc(sx, sy, r, 0, 6.2832); ctx.fill();
        if (n.flags[i] & 2) { ctx.strokeStyle = "#e6a100"; ctx.lineWidth = 2; ctx.stroke(); }
        if (labels && drawn.length < MAX_LABELS) drawn.push(i);
      }
      for (const [c, l] of byColor.entries()) {
        if (!l.length) continue;
        ctx.fillStyle = colors[c]; ctx.beginPath();
        for (let k = 0; k < l.length; k += 2) ctx.rect(l[k], l[k + 1], 2 * r, 2 * r);
        ctx.fill();
      }
      // level of detail: op labels once rows and columns are far enough apart on screen, shapes
      // once there is room for a second line; a label that would overlap drawn text is skipped
      ctx.textAlign = "center"; ctx.font = FONT;
      const occ = this._occ, rowPx = this.k * this.ay, shown = [];
      const withShapes = shapes && rowPx >= 28;
      if (rowPx >= 14) for (const i of drawn) {
        const [sx, sy] = this.toScreen(this.x[i], this.y[i]), full = T.label[n.label[i]];
        let lab = "";  // the whole label where there is room (up to two columns), else cut to one
        for (const cand of [fitText(ctx, full, 2 * colPx - 6), fitText(ctx, full, colPx - 6)]) {
          const w = textWidth(ctx, cand) / 2;
          if (cand && occ.place(sx - w, sy - r - 13, sx + w, sy - r - 1)) { lab = cand; break; }
        }
        if (!lab) continue;
        ctx.fillStyle = "#111"; ctx.fillText(lab, sx, sy - r - 3); shown.push(i);
        const sh = withShapes ? fitText(ctx, T.shape[n.shape[i]], colPx - 6) : "", ws = sh ? textWidth(ctx, sh) / 2 : 0;
        if (sh && occ.place(sx - ws, sy + r + 1, sx + ws, sy + r + 13)) { ctx.fillStyle = "#777"; ctx.fillText(sh, sx, sy + r + 11); }
      }
      ctx.textAlign = "start";
      this.drawnLabels = shown.map(i => T.label[n.label[i]]);
      // rings: search hits, the selected node and its twins
      const ring = (i, colr, w) => { const it = this.itemOf[i]; if (it !== i) return; const [sx, sy] = this.toScreen(this.x[i], this.y[i]); if (!on(sx, sy, 20)) return; ctx.strokeStyle = colr; ctx.lineWidth = w; ctx.beginPath(); ctx.arc(sx, sy, r + 4, 0, 6.2832); ctx.stroke(); };
      this.hitBoxes = new Set();
      for (const i of this.hits) { ring(i, "#111", 2.5); if (this.itemOf[i] >= this.N) this.hitBoxes.add(this.itemOf[i] - this.N); }
      if (this.selected >= 0) {
        ring(this.selected, "#ff00aa", 3);
        const tw = n.twin[this.selected]; if (tw >= 0) ring(tw, "#ff00aa", 2);
      }
    }
    _renderMini() {
      const m = this.mini, ctx = m.getContext("2d"), [x0, y0, x1, y1] = this.world;
      const off = this.miniImg = document.createElement("canvas"); off.width = m.width; off.height = m.height;
      const o = off.getContext("2d"); o.fillStyle = "#fff"; o.fillRect(0, 0, m.width, m.height);
      for (const it of this.vis) {  // the visible items, boxes a little larger
        const big = it >= this.N, band = big ? (it - this.N) & 1 : this.band[it], s = big ? 2.5 : 1.5;
        o.fillStyle = band ? "#d62728" : "#1f77b4";
        o.fillRect((this.ix[it] - x0) / (x1 - x0 || 1) * (m.width - 2), (y1 - this.iy[it]) / (y1 - y0 || 1) * (m.height - 2), s, s);
      }
      ctx.drawImage(off, 0, 0);
    }
    _drawMiniView() {
      if (!this.miniImg) return;
      const m = this.mini, ctx = m.getContext("2d"), [x0, y0, x1, y1] = this.world;
      ctx.drawImage(this.miniImg, 0, 0);
      const W = this.canvas.clientWidth, H = this.canvas.clientHeight;
      const [a, b] = this.toWorld(0, 0), [c, d] = this.toWorld(W, H);
      const sx = v => (v - x0) / (x1 - x0 || 1) * m.width, sy = v => (y1 - v) / (y1 - y0 || 1) * m.height;
      ctx.strokeStyle = "#000"; ctx.lineWidth = 1.5;
      ctx.strokeRect(sx(a), sy(b), Math.max(2, sx(c) - sx(a)), Math.max(2, sy(d) - sy(b)));
    }
    state() {
      return {k: this.k, visibleNodes: this.visNodes.length, visibleBoxes: this.visBoxes.length,
              labels: this.drawnLabels.slice(0, 50), labelCount: this.drawnLabels.length,
              boxLabels: (this.boxLabels || []).slice(0, 50), arrows: this.arrowCount,
              colorLevel: this.colorLevel, moduleColors: [...this.keyColor.values()],
              hits: this.hits.size, frameMs: this.lastFrameMs, toggleMs: this.lastToggleMs,
              searchMs: this.lastSearchMs, layoutMs: this.lastLayoutMs};
    }
  }

  window.jointlabDag = function (id) {
    const root = document.getElementById(id);
    const P = JSON.parse(document.getElementById(id + "-data").textContent);
    root.jlView = new DagView(root, P);
    return root.jlView;
  };
})();
