// jointlab DAG renderer, part 4 of 5 (drawing): one frame on the canvas (edges, boxes,
// nodes, labels, rings) and the mini view. Labels follow level of detail.
  class DagDraw {
    // -- drawing ---------------------------------------------------------------
    _radius() { return Math.max(1.5, Math.min(9, 0.3 * this.k)); }
    draw() {
      if (this.released) { if (!this.root.isConnected) return; this._acquire(); }
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
      // the mini view shows only while part of the graph is out of view; no label goes under it
      const mini = this.miniShown = !this.allInView(W, H);
      this.mini.style.display = mini ? "" : "none";
      if (mini) this._occ.take(W - this.mini.width - 8, H - this.mini.height - 8, W, H);
      ctx.font = FONT;
      const pinned = this._placePinned(ctx, W, H);  // first claim: hits, the ringed node and twins
      const titles = this._drawTitles(ctx, W, H);
      this._drawEdges(ctx, W, H);
      ctx.textAlign = "start";
      for (const [txt, x, y] of titles) haloText(ctx, txt, x, y, "#333");  // over the edges
      this._drawBoxes(ctx, W, H, on);
      this._drawNodes(ctx, W, H, on);
      this._drawPinned(ctx, pinned);
      this._drawMiniView();
      const t1 = performance.now();
      this.lastFrameMs = t1 - t0; this.lastFrameEnd = t1;  // frame timing, read by bench/
      if (this.firstFrameEnd === undefined) { this.firstFrameEnd = t1; performance.mark("jl-dag-first-frame"); }
    }
    _drawTitles(ctx, W, H) {  // outlines of open groups; their titles, drawn after the edges
      this.titles = [];
      const texts = [];
      ctx.font = FONT;
      for (const key of this.outlineKeys) {  // outer groups first
        const o = key * 4;
        if ((this.ob[o + 2] - this.ob[o]) * this.k < 20) continue;  // too narrow on screen to draw
        const [x0, y0, x1, y1] = this.outlineRect(key), [a, t] = this.toScreen(x0, y1), [z, u] = this.toScreen(x1, y0);
        if (z < 0 || a > W || u < 0 || t > H || z - a < 24) continue;
        const gid = key >> 1;
        ctx.strokeStyle = this.groupColor(gid); ctx.globalAlpha = 0.5; ctx.strokeRect(a, t, z - a, u - t); ctx.globalAlpha = 1;
        const sfx = (key & 1 ? " (bwd)" : "") + " ▾", name = this.groupTitle(gid);
        // the title sits at the outline's top left (kept on screen), one line lower if an
        // outer group's title is there already; whole where nothing else is drawn (it may run
        // past a narrow outline), else cut in the middle to the outline's width
        const ax = Math.max(a, 0) + 2, whole = name + sfx;
        const cands = [whole, elide(ctx, name, z - ax - 2 - textWidth(ctx, sfx)) + sfx];
        let placed = false;
        for (const txt of cands) {
          if (placed || txt === sfx) continue;
          const w = textWidth(ctx, txt), bx = Math.min(ax, W - w - 3);  // kept inside the canvas
          if (bx < 2) continue;
          for (const ty of [Math.max(t, 0), Math.max(t, 0) + 13]) {
            if (ty + 13 > u || !this._occ.place(bx - 2, ty, bx + w + 2, ty + 13)) continue;
            texts.push([txt, bx, ty + 11]);
            this.titles.push([gid, bx - 2, ty, bx + w + 2, ty + 13, key & 1, txt]);
            placed = true;
            break;
          }
        }
      }
      return texts;
    }
    // A group's name as drawn inside its parent's outline: relative to the parent
    // ("self_attention" inside "transformer.h.0"; a list index keeps its list: "h.0").
    groupTitle(gid) {
      const G = this.P.groups, name = G.name[gid] || "(root)", p = this.parent[gid], pn = p > 0 ? G.name[p] : "";
      if (!pn || !name.startsWith(pn + ".")) return name;
      // a list index keeps the names above it up to the first that is not one ("down.0.1.0")
      const parts = name.split(".");
      let k = pn.split(".").length;
      while (k > 0 && /^\d+$/.test(parts[k])) k--;
      return parts.slice(k).join(".");
    }
    // Pinned nodes: the current hit, the selected (ringed) node and its twins, then the other
    // hits. Each open one on screen gets its whole label, never cut, kept inside the canvas,
    // above the node, else below, else beside it; its node and label are claimed before any
    // group title or other label, so nothing is drawn over them.
    pinnedNodes() {
      const out = [], seen = new Set(), add = i => { if (i >= 0 && !seen.has(i)) { seen.add(i); out.push(i); } };
      add(this.current);
      if (this.selected >= 0) { add(this.selected); for (const j of this.twinsOf(this.selected)) add(j); }
      for (const i of this.hitList.length ? this.hitList : this.hits) { if (out.length >= MAX_PINNED) break; add(i); }
      return out;
    }
    _placePinned(ctx, W, H) {
      const r = this._radius(), T = this.P.tables, n = this.P.nodes, occ = this._occ, out = [];
      for (const i of this.pinnedNodes()) {
        if (this.itemOf[i] !== i) continue;
        const [sx, sy] = this.toScreen(this.x[i], this.y[i]);
        if (sx < 0 || sy < 0 || sx > W || sy > H) continue;
        const text = T.label[n.label[i]], w = textWidth(ctx, text), hw = w / 2 + 2;
        const cx = Math.min(Math.max(sx, hw + 1), W - hw - 1);  // inside the canvas
        const spots = [[cx, sy - r - 15], [cx, sy + r + 2], [sx + r + 4 + hw, sy - 7], [sx - r - 4 - hw, sy - 7]]
          .filter(([x, y]) => y >= 0 && y + 13 <= H && x - hw >= 0 && x + hw <= W);
        const at = spots.find(([x, y]) => occ.free(x - hw, y, x + hw, y + 13)) || spots[0];
        occ.take(sx - r - 5, sy - r - 5, sx + r + 5, sy + r + 5);  // the node and its ring
        if (!at) continue;
        occ.take(at[0] - hw, at[1], at[0] + hw, at[1] + 13);
        out.push({i, text, x: at[0], y: at[1], rect: [at[0] - hw, at[1], at[0] + hw, at[1] + 13]});
      }
      return out;
    }
    _drawPinned(ctx, pinned) {
      ctx.font = FONT; ctx.textAlign = "center";
      for (const p of pinned) {
        const cur = p.i === this.current || p.i === this.selected;
        ctx.fillStyle = "rgba(255,255,255,.85)"; ctx.fillRect(p.rect[0], p.rect[1], p.rect[2] - p.rect[0], 13);
        if (cur) { ctx.strokeStyle = "#111"; ctx.lineWidth = 1; ctx.strokeRect(p.rect[0], p.rect[1], p.rect[2] - p.rect[0], 13); }
        ctx.fillStyle = "#000"; ctx.fillText(p.text, p.x, p.y + 10.5);
      }
      ctx.textAlign = "start";
      this.pinnedLabels = pinned.map(p => ({name: this.P.nodes.name[p.i], text: p.text, rect: p.rect}));
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
        const name = this.groupTitle(gid), sfx = band ? "_b" : "_f";
        const lines = [name, `${G["count" + sfx][gid]} nodes ${band ? "bwd" : "fwd"}`,
          `${human(G["flops" + sfx][gid], "FLOP")} · ${humanBytes(G["bytes" + sfx][gid])}`];
        const cx = Math.max(a, 0) + 3, maxw = z - Math.max(a, 0) - 6;
        let yy = Math.max(t, 0) + 13;
        ctx.fillStyle = "#111";
        for (const [k, s] of lines.entries()) {
          if (yy > u - 2) break;
          const txt = k === 0 ? elide(ctx, s, maxw) : fitText(ctx, s, maxw);
          if (!txt || !this._occ.place(cx, yy - 11, cx + textWidth(ctx, txt), yy + 2)) break;
          ctx.fillText(txt, cx, yy); yy += 13; ctx.fillStyle = "#444";
          if (k === 0) this.boxLabels.push(txt);
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
    _labelOrder() {  // node indices by label priority: tier (payload), then FLOPs, then graph order
      if (!this._prio) {
        const n = this.P.nodes, tier = n.tier || [], key = this._prio = new Float64Array(this.N);
        for (let i = 0; i < this.N; i++) key[i] = (tier[i] ?? 2) * 1e30 - (n.flops[i] || 0);
      }
      return this._prio;
    }
    _drawNodes(ctx, W, H, on) {
      const r = this._radius(), n = this.P.nodes, T = this.P.tables, colPx = this.k * XS;
      const rowPx = this.k * this.ay, labels = rowPx >= LABEL_ROW_PX && this.showLabels !== false, shapes = colPx >= LABEL_MIN_PX * 1.6;
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
      // level of detail: op labels once rows are far enough apart on screen, shapes once there
      // is room for a second line. Labels are placed by priority (key ops first, plumbing
      // last), each whole where it fits, else cut in the middle, above its node or else below;
      // one that would overlap drawn text or a node is skipped, so no two ever collide.
      ctx.textAlign = "center"; ctx.font = FONT;
      const occ = this._occ, shown = [], prio = this._labelOrder(), tier = n.tier || [];
      const withShapes = shapes && rowPx >= 28, pin = new Set(this.pinnedNodes()), at = new Map();
      // every node's disc is claimed before any label, per tier: a label never covers the
      // disc of a node of its own tier or a lower one (a key op's, for every label), but a
      // key op's label may run over a less important node's disc
      const discs = [0, 1, 2, 3].map(() => new Occupancy()), tierOf = i => Math.min(3, Math.max(0, tier[i] ?? 2));
      const clear = (t, x0, y0, x1, y1) => { for (let k = 0; k <= t; k++) if (!discs[k].free(x0, y0, x1, y1)) return false; return true; };
      for (const i of drawn) {
        const [sx, sy] = this.toScreen(this.x[i], this.y[i]);
        at.set(i, [sx, sy]);
        discs[tierOf(i)].take(sx - r, sy - r, sx + r, sy + r);
      }
      drawn.sort((a, b) => prio[a] - prio[b] || a - b);
      const cap = Math.max(4 * colPx, 300), short = Math.max(2 * colPx, 72);
      for (const i of drawn) {
        if (pin.has(i)) continue;  // labelled by _drawPinned
        const [sx, sy] = at.get(i), full = T.label[n.label[i]];
        let lab = "", rect = null;
        for (const cand of new Set([elide(ctx, full, cap), elide(ctx, full, short)])) {
          if (!cand) continue;
          const w = textWidth(ctx, cand) / 2;
          // above, below, right of, left of the node; whole on the canvas, or not at all
          const up = sy - r - 13, down = sy + r + 1, o = w - r - 2;  // o: shifted to one side, still over the node
          const right = sx + r + 3 + w, left = sx - r - 3 - w;
          for (const [cx, top] of [[sx, up], [sx, down], [right, sy - 6], [left, sy - 6], [sx + o, up], [sx - o, up],
            [sx + o, down], [sx - o, down], [right, sy - 2], [left, sy - 2], [right, sy - 10], [left, sy - 10]]) {
            if (cx - w < 0 || cx + w > W || top < 0 || top + 12 > H) continue;
            if (!clear(tierOf(i), cx - w, top, cx + w, top + 12)) continue;
            // 3 px kept clear on each side: neighbouring labels never run together ("unsqueezeunsqueeze")
            if (occ.place(cx - w - 3, top, cx + w + 3, top + 12)) { lab = cand; rect = [cx - w, top, cx + w, top + 12]; break; }
          }
          if (lab) break;
        }
        if (!lab) continue;
        haloText(ctx, lab, (rect[0] + rect[2]) / 2, rect[1] + 10, "#111"); shown.push({i, text: lab, rect});
        const sh = withShapes && rect[3] < sy ? fitText(ctx, T.shape[n.shape[i]], colPx - 6) : "", ws = sh ? textWidth(ctx, sh) / 2 : 0;
        if (sh && occ.place(sx - ws, sy + r + 1, sx + ws, sy + r + 13)) haloText(ctx, sh, sx, sy + r + 11, "#666");
      }
      ctx.textAlign = "start";
      this.drawnLabels = shown.map(l => l.text);
      this.labelRects = shown.map(l => ({name: n.name[l.i], text: l.text, full: T.label[n.label[l.i]], rect: l.rect}));
      // rings: search hits, the selected node and its twins
      const ring = (i, colr, w) => { const it = this.itemOf[i]; if (it !== i) return; const [sx, sy] = this.toScreen(this.x[i], this.y[i]); if (!on(sx, sy, 20)) return; ctx.strokeStyle = colr; ctx.lineWidth = w; ctx.beginPath(); ctx.arc(sx, sy, r + 4, 0, 6.2832); ctx.stroke(); };
      this.hitBoxes = new Set();
      for (const i of this.hits) { ring(i, "#111", 2.5); if (this.itemOf[i] >= this.N) this.hitBoxes.add(this.itemOf[i] - this.N); }
      if (this.current >= 0) ring(this.current, "#ff7f0e", 3.5);
      if (this.selected >= 0) {
        ring(this.selected, "#ff00aa", 3);
        for (const j of this.twinsOf(this.selected)) ring(j, "#ff00aa", 2);
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
    allInView(W, H) {  // every visible item and outline is on screen
      const [x0, y0, x1, y1] = this.world, [a, t] = this.toScreen(x0, y1), [z, u] = this.toScreen(x1, y0);
      return a >= -1 && t >= -1 && z <= W + 1 && u <= H + 1;
    }
    _drawMiniView() {
      if (!this.miniImg || !this.miniShown) return;
      const m = this.mini, ctx = m.getContext("2d"), [x0, y0, x1, y1] = this.world;
      ctx.drawImage(this.miniImg, 0, 0);
      const W = this.canvas.clientWidth, H = this.canvas.clientHeight;
      const [a, b] = this.toWorld(0, 0), [c, d] = this.toWorld(W, H);
      const sx = v => (v - x0) / (x1 - x0 || 1) * m.width, sy = v => (y1 - v) / (y1 - y0 || 1) * m.height;
      ctx.strokeStyle = "#000"; ctx.lineWidth = 1.5;
      ctx.strokeRect(sx(a), sy(b), Math.max(2, sx(c) - sx(a)), Math.max(2, sy(d) - sy(b)));
    }
    state() {
      return {k: this.k, ay: this.ay, pinned: this.pinnedLabels || [], hitAt: this.hitAt, hitCount: this.hitList.length,
              current: this.current >= 0 ? this.P.nodes.name[this.current] : null,
              canvas: [this.canvas.clientWidth, this.canvas.clientHeight], visibleNodes: this.visNodes.length, visibleBoxes: this.visBoxes.length,
              labels: this.drawnLabels.slice(0, 50), labelCount: this.drawnLabels.length,
              boxLabels: (this.boxLabels || []).slice(0, 50), arrows: this.arrowCount,
              labelRects: this.labelRects || [], miniShown: this.miniShown, titleTexts: (this.titles || []).map(t => ({text: t[6], rect: t.slice(1, 5)})),
              moduleColors: Object.fromEntries([...this.keyColor].map(([g, c]) => [this.P.groups.name[g], c])),
              hits: this.hits.size, frameMs: this.lastFrameMs, toggleMs: this.lastToggleMs,
              searchMs: this.lastSearchMs, layoutMs: this.lastLayoutMs};
    }
  }
  mixin(DagView, DagDraw);
