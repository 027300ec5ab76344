// jointlab DAG renderer, part 2 of 5 (layout): the layered layout of the visible items,
// pure functions over integer arrays (no DOM, no view state).
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
    // a sweep can undo what the one before gained: keep the first order with the fewest
    // crossings between neighbouring columns, among the mirror and every sweep
    const gaps = gapEdges(x, src, dst);
    let {y} = bandY(n, band, pos, h), fewest = crossingCount(gaps, y);  // y of the order kept
    for (let s = 0; s < SWEEPS; s++) {
      stackColumns(columns, barycentres(n, band, preds, succs, twin, pos, s % 2 === 0, false), h, pos);
      const placed = bandY(n, band, pos, h).y, count = crossingCount(gaps, placed);
      if (count < fewest) { y = placed; fewest = count; }
    }
    return {x, y, layer, bucket};
  }
  // Each item's y (forward up, backward mirrored down) and the bands' half gap.
  function bandY(n, band, pos, h) {
    let half = 0;
    for (let v = 0; v < n; v++) half = Math.max(half, Math.abs(pos[v]) + h[v] / 2);
    half += BAND_GAP / 2;
    const y = new Float64Array(n);
    for (let v = 0; v < n; v++) y[v] = band[v] ? -(half + pos[v]) : half + pos[v];
    return {y, half};
  }
  // Edges joining neighbouring columns (by distinct x) as [gap, left item, right item], by gap.
  function gapEdges(x, src, dst) {
    const rank = new Map(Array.from(new Set(x)).sort((a, b) => a - b).map((c, i) => [c, i]));
    const out = [];
    for (let k = 0; k < src.length; k++) {
      const a = rank.get(x[src[k]]), b = rank.get(x[dst[k]]);
      if (Math.abs(a - b) === 1) out.push(a < b ? [a, src[k], dst[k]] : [b, dst[k], src[k]]);
    }
    return out.sort((p, q) => p[0] - q[0]);
  }
  // Crossing pairs among those edges, per gap: lo_p < lo_q and hi_p > hi_q (Fenwick tree).
  function crossingCount(gaps, y) {
    let total = 0;
    for (let k = 0; k < gaps.length;) {
      let end = k;
      while (end < gaps.length && gaps[end][0] === gaps[k][0]) end++;
      const ends = gaps.slice(k, end).map(g => [y[g[1]], y[g[2]]]);
      ends.sort((p, q) => p[0] - q[0] || p[1] - q[1]);
      const his = Array.from(new Set(ends.map(e => e[1]))).sort((a, b) => a - b);
      const rank = new Map(his.map((v, i) => [v, i + 1])), tree = new Int32Array(his.length + 1);
      let seen = 0;
      for (let i = 0; i < ends.length;) {
        let g = i;
        while (g < ends.length && ends[g][0] === ends[i][0]) g++;
        for (let j = i; j < g; j++) {  // earlier ends (lower lo) reaching higher
          let at = 0;
          for (let r = rank.get(ends[j][1]); r > 0; r -= r & -r) at += tree[r];
          total += seen - at;
        }
        for (let j = i; j < g; j++) for (let r = rank.get(ends[j][1]); r < tree.length; r += r & -r) tree[r]++;
        seen += g - i; i = g;
      }
      k = end;
    }
    return total;
  }
