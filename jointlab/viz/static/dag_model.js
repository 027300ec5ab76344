// jointlab DAG renderer, part 3 of 5 (model): DagView's state: which groups are open,
// the visible items and edges, the compound layout of open groups, colours.
// Reads the JSON payload written by jointlab/viz/dagview.py (PAYLOAD_SCHEMA there; no
// positions): forward band on top, backward band mirrored below. Only what is visible is
// laid out (layeredLayout), again on every open or close, as a compound layout: each open
// group's content is one block of its parent's layout, so open-group outlines nest and never
// overlap. `el.jlView` exposes the state for tests.
  class DagView {
    constructor(root, P) {
      this.root = root; this.P = P;
      const N = this.N = P.nodes.name.length, G = this.G = P.groups.name.length;
      this.x = new Float64Array(N); this.y = new Float64Array(N);  // per open node: its position
      this.g = Int32Array.from(P.nodes.g);
      const flags = P.nodes.flags = new Uint8Array(N);  // bit 0 saved for backward, bit 1 recomputed
      for (const i of P.nodes.saved || []) flags[i] |= 1;
      for (const i of P.nodes.recompute || []) flags[i] |= 2;
      this.parent = Int32Array.from(P.groups.parent);
      this.level = Int32Array.from(P.groups.level);
      this.band = new Uint8Array(N);
      const bwd = new Set(P.backward_phases);
      for (let i = 0; i < N; i++) this.band[i] = bwd.has(P.tables.phase[P.nodes.ph[i]]) ? 1 : 0;
      this.expanded = new Uint8Array(G);
      for (const gid of P.expanded) this.expanded[gid] = 1;
      this.expanded[0] = 1;
      this.colorBy = P.color_by;
      this.hits = new Set(); this.hitList = []; this.hitAt = -1; this.current = -1; this.lastQuery = ""; this.selected = -1; this.selectedBox = -1;
      this.drawnLabels = []; this.showLabels = true;  // false: discs only (tests read fills)
      const M = N + 2 * G;  // item ids: node i, or N + gid * 2 + band for a closed group's box
      this.ix = new Float64Array(M); this.iy = new Float64Array(M); this.slot = new Int32Array(M).fill(-1);
      this.vis = [];
      this.M = M; const K = M + 2 * G;  // ... and M + gid * 2 + band for an open group's block
      // per item or block: layer, offset in its group's block, position, block size (compound layout)
      this._loc = new Int32Array(K).fill(-1); this._lay = new Int32Array(K);
      for (const a of ["_px", "_py", "_ax", "_ay", "_sw", "_sh"]) this[a] = new Float64Array(K);
      this._firstMembers(); this._subtrees(); this._adjacency(); this._dom();
      this.update(); this._closeToFit(); this.fit(true);
      if (P.hits && P.hits.length) this.setHits(P.hits);  // e.g. a diff view's changes
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
    // Module colours come with the payload (groups.color: one per module, keyed by its name,
    // computed by viz._style.module_colors), so searching or opening never recolours anything.
    _moduleColors() {  // the visible groups, for the legend and state(): gid -> colour
      const seen = new Map();
      for (const i of this.visNodes) if (!seen.has(this.g[i])) seen.set(this.g[i], this.groupColor(this.g[i]));
      for (const b of this.visBoxes) if (!seen.has(b >> 1)) seen.set(b >> 1, this.groupColor(b >> 1));
      this.keyColor = seen;
    }
    twinsOf(i) {  // a backward node's forward twin, a forward node's backward twins
      if (!this._back) {
        this._back = new Map();
        this.P.nodes.twin.forEach((t, j) => { if (t >= 0) { const l = this._back.get(t); if (l) l.push(j); else this._back.set(t, [j]); } });
      }
      const t = this.P.nodes.twin[i];
      return t >= 0 ? [t] : (this._back.get(i) || []);
    }
    groupColor(gid) { return this.P.palette[this.P.groups.color[gid]] || "#888"; }
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
  }
