// jointlab DAG renderer, part 5 of 5 (interaction): DOM, view transform, mouse, search,
// detail panel, and the listeners' lifetime; then the entry point window.jointlabDag(id).
  class DagInteract {
    // -- DOM -----------------------------------------------------------------
    _dom() {
      const r = this.root;
      // keys typed in the view stay in it: a notebook never sees them (Shift+Enter in the
      // search box steps back, it does not run the cell). JupyterLab listens on the document
      // in the bubble phase and skips elements marked data-lm-suppress-shortcuts.
      r.setAttribute("data-lm-suppress-shortcuts", "true");
      for (const t of ["keydown", "keypress", "keyup"]) r.addEventListener(t, e => e.stopPropagation());
      if (!document.getElementById("jl-dag-style")) { const s = el("style"); s.id = "jl-dag-style"; s.textContent = CSS; document.head.appendChild(s); }
      const bar = el("div", "jl-bar"); r.appendChild(bar);
      bar.appendChild(el("span", "jl-title", this.P.title));
      // search: Enter finds (again: the next hit), Shift+Enter the previous; "i of N"
      const box = this.searchBox = el("span", "jl-searchbox"); bar.appendChild(box);
      this.search = el("input"); this.search.placeholder = "search name / op / module / /regex/";
      this.search.className = "jl-search"; this.search.style.width = "230px";
      this.search.addEventListener("keydown", e => {
        if (e.key !== "Enter") return;
        if (this.search.value.trim() !== this.lastQuery || !this.hitList.length) this.find(this.search.value);
        else this.step(e.shiftKey ? -1 : 1);
      });
      box.appendChild(this.search);
      for (const [t, d, tip] of [["◀", -1, "previous hit (Shift+Enter)"], ["▶", 1, "next hit (Enter)"]]) {
        const b = el("button", d < 0 ? "jl-prev" : "jl-next", t); b.title = tip; b.onclick = () => this.step(d); box.appendChild(b);
      }
      this.countEl = el("span", "jl-count"); box.appendChild(this.countEl);
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
      this._main = main; this._acquire();
    }
    _legend() {
      const L = this.legendEl; if (!L) return; L.textContent = "";
      let entries = [];
      if (this.colorBy === "phase") entries = Object.entries(this.P.phase_colors);
      else if (this.colorBy === "module") {  // the visible modules, outermost first, a dozen at most
        const all = [...this.keyColor].sort((a, b) => this.level[a[0]] - this.level[b[0]] || a[0] - b[0]);
        entries = all.slice(0, 12).map(([gid, c]) => [this.P.groups.name[gid] || "(root)", c]);
        if (all.length > 12) entries.push([`+${all.length - 12} more modules: click a node or box for its module`, "transparent"]);
      }
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
    viewChanged() {  // a group's popup belongs to the view it was opened in: close it
      this._fitted = "";
      if (this.detailKind === "group" && this.detail.style.display !== "none") { this.detail.style.display = "none"; this.detailKind = ""; }
    }
    // -- view transform --------------------------------------------------------
    // Fit everything; on the first paint of a long graph, its left part at a zoom where labels
    // show (FIRST_K), the mini view's corner left free below it.
    fit(initial) {
      const W = this.canvas.clientWidth || 800, H = this.canvas.clientHeight || 500;
      const [x0, y0, x1, y1] = this.world;  // the visible items' extent (layout())
      let k = Math.min(W / (x1 - x0 + 4), H / (y1 - y0 + 3)), Hc = H;
      if (initial && k < LABEL_ROW_PX) {  // too small for labels: the left part, at FIRST_K
        Hc = Math.max(H - MINI_RESERVE, H / 2);
        k = Math.max(k, Math.min(Hc / (y1 - y0 + 3), FIRST_K));
      }
      this.k = k;
      // a long, flat graph is stretched vertically so closed boxes stay tall enough to read
      this.ay = Math.max(1, Hc * 0.85 / ((y1 - y0 + 3) * k));
      this.vx = k * (x1 - x0 + 4) > W ? x0 - 2 : (x0 + x1) / 2 - W / 2 / k;
      this.vy = (y0 + y1) / 2 + Hc / 2 / (k * this.ay);
      this._fitted = initial ? "first" : "all";  // until the user moves the view: fitted again on a resize
      this._renderMini(); this.draw();
    }
    resized() { if (this._fitted) this.fit(this._fitted === "first"); else this.draw(); }
    // The first view: the deepest open module level is closed while the graph is too tall
    // to show at FIRST_K, so any model opens on labelled nodes and named boxes.
    _closeToFit() {
      const H = this.canvas.clientHeight;
      while (H) {
        const [, y0, , y1] = this.world;
        if (H / (y1 - y0 + 3) >= FIRST_K) return;
        let deep = 0;
        for (let g = 1; g < this.G; g++) if (this.expanded[g]) deep = Math.max(deep, this.level[g]);
        if (!deep) return;
        for (let g = 1; g < this.G; g++) if (this.level[g] === deep) this.expanded[g] = 0;
        this.update();
      }
    }
    toScreen(x, y) { return [(x - this.vx) * this.k, (this.vy - y) * this.k * this.ay]; }
    toWorld(px, py) { return [px / this.k + this.vx, this.vy - py / (this.k * this.ay)]; }
    zoomAt(px, py, f) {
      const [wx, wy] = this.toWorld(px, py);
      this.viewChanged();
      this.k = Math.max(1e-3, Math.min(400, this.k * f));
      if (f > 1) this.ay = Math.max(1, this.ay / f);  // zooming in first widens, then scales
      this.vx = wx - px / this.k; this.vy = wy + py / (this.k * this.ay);
      this.draw();
    }
    zoomTo(x0, y0, x1, y1) {  // the region in view, at one scale for both axes
      const W = this.canvas.clientWidth, H = this.canvas.clientHeight;
      this.k = Math.min(60, W / (x1 - x0 + 6), H / (y1 - y0 + 3)); this.ay = 1;
      this.viewChanged();
      this.vx = (x0 + x1) / 2 - W / 2 / this.k; this.vy = (y0 + y1) / 2 + H / 2 / (this.k * this.ay);
      this.draw();
    }
    // -- events --------------------------------------------------------------
    _events() {
      const c = this.canvas;
      c.addEventListener("wheel", e => { e.preventDefault(); const r = c.getBoundingClientRect(); this.zoomAt(e.clientX - r.left, e.clientY - r.top, Math.exp(-e.deltaY * 0.0015)); }, {passive: false});
      // the window hears a drag only while it lasts: no listener outlives a mouse button
      let drag = null;
      const move = e => {
        const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
        if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
        this.vx = drag.vx - dx / this.k; this.vy = drag.vy + dy / (this.k * this.ay); this.viewChanged(); this.draw();
      };
      const up = e => {
        const moved = drag.moved; this._endDrag(); c.style.cursor = "grab";
        if (!moved) { const r = c.getBoundingClientRect(); this.click(e.clientX - r.left, e.clientY - r.top); }
      };
      this._endDrag = () => { drag = null; window.removeEventListener("mousemove", move); window.removeEventListener("mouseup", up); };
      c.addEventListener("mousedown", e => {
        if (drag) this._endDrag();
        drag = {x: e.clientX, y: e.clientY, vx: this.vx, vy: this.vy, moved: false}; c.style.cursor = "grabbing";
        window.addEventListener("mousemove", move); window.addEventListener("mouseup", up);
      });
      this.mini.addEventListener("click", e => {
        const r = this.mini.getBoundingClientRect(), [x0, y0, x1, y1] = this.world;
        const wx = x0 + (e.clientX - r.left) / this.mini.width * (x1 - x0);
        const wy = y1 - (e.clientY - r.top) / this.mini.height * (y1 - y0);
        this._fitted = "";
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
      this._fitted = "";
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
    _matches(q) {  // node indices matching a query (substring, or /regex/), in graph order
      let test;
      const m = /^\/(.*)\/([a-z]*)$/.exec(q);
      if (m) { let re; try { re = new RegExp(m[1], m[2] || "i"); } catch (err) { this.status.textContent = "bad regex: " + err.message; return null; } test = s => re.test(s); }
      else { const ql = q.toLowerCase(); test = s => s.toLowerCase().includes(ql); }
      const n = this.P.nodes, T = this.P.tables, gn = this.P.groups.name, out = [];
      for (let i = 0; i < this.N; i++) {
        if (test(n.name[i]) || test(T.label[n.label[i]]) || test(T.target[n.target[i]]) || test(gn[this.g[i]])) out.push(i);
      }
      return out;
    }
    find(q) {  // highlight every match (a closed group holding one is outlined); go to the first
      const t0 = performance.now(); q = (q || "").trim(); this.lastQuery = q;
      this.viewChanged();
      const out = q ? this._matches(q) : [];
      if (!out) return [];
      this.setHits(out);
      this.lastSearchMs = performance.now() - t0;
      this.status.textContent = "";
      return out;
    }
    setHits(list) {  // the hits stepped through (search, or a diff's changes), then the first
      this.hitList = list; this.hits = new Set(list); this.hitAt = -1;
      if (list.length) this.goTo(0); else { this._showCount(); this.draw(); }
    }
    step(d) { if (this.hitList.length) this.goTo((this.hitAt + d + this.hitList.length) % this.hitList.length); }
    goTo(k) {  // hit k: its groups opened, centred at a zoom where its label is readable (uniform scale)
      const i = this.hitList[k]; this.hitAt = k; this.current = i;
      this.viewChanged();
      let outer = -1;
      for (let g = this.g[i]; g >= 0; g = this.parent[g]) if (!this.expanded[g]) outer = g;
      if (outer >= 0) { this.reveal(i); if (this.isHidden) this.update(); else this.regroup(outer); }  // isHidden: the widget's update()
      const W = this.canvas.clientWidth || 800, H = this.canvas.clientHeight || 500;
      this.k = Math.max(READ_K, Math.min(this.k, 4 * READ_K)); this.ay = 1;
      const [x, y] = this.itemXY(this.itemOf[i] >= 0 ? this.itemOf[i] : i);
      this.vx = x - W / 2 / this.k; this.vy = y + H / 2 / this.k;
      this._showCount(); this.draw();
    }
    // The stepper's cursor: node i and its twins opened and in view together; at READ_K when
    // they fit, else zoomed out just enough (their labels are drawn whole at any zoom).
    follow(i) {
      const group = [i, ...this.twinsOf(i)];
      let outer = -1;
      for (const j of group) for (let g = this.g[j]; g >= 0; g = this.parent[g]) if (!this.expanded[g]) { this.expanded[g] = 1; outer = 0; }
      if (outer >= 0) this.update();
      const W = this.canvas.clientWidth, H = this.canvas.clientHeight;
      if (!W || !H) return;
      let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity;
      for (const j of group) {
        if (this.itemOf[j] < 0) continue;
        const [x, y] = this.itemXY(this.itemOf[j]);
        x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y);
      }
      if (x0 > x1) return;
      const M = 60, fits = k => (x1 - x0) * k <= W - 2 * M && (y1 - y0) * k <= H - 2 * M;
      const inView = (x, y) => { const [sx, sy] = this.toScreen(x, y); return sx >= M && sy >= M && sx <= W - M && sy <= H - M; };
      if (this.ay === 1 && this.k >= READ_K && inView(x0, y0) && inView(x1, y1)) return;  // already shown
      this.k = Math.min(READ_K, (W - 2 * M) / Math.max(x1 - x0, 1e-9), (H - 2 * M) / Math.max(y1 - y0, 1e-9));
      if (!fits(this.k)) this.k *= 0.99;
      this.ay = 1;
      this.vx = (x0 + x1) / 2 - W / 2 / this.k; this.vy = (y0 + y1) / 2 + H / 2 / this.k;
      this.viewChanged(); this.draw();
    }
    displayName(i) {  // a placeholder by its parameter FQN or input path, anything else by its node name
      const e = this.P.nodes.extra[String(i)] || {};
      return e.fqn || e.input_path || this.P.nodes.name[i];
    }
    _showCount() {
      const n = this.hitList.length;
      this.countEl.textContent = !this.lastQuery && !n ? "" : n ? `${this.hitAt + 1} of ${n}` : "no match";
    }
    // -- detail panel --------------------------------------------------------------
    select(i, centre) {
      this.selected = i; this.selectedBox = -1;
      if (centre) { this.reveal(i); this.update(); const [x, y] = [this.x[i], this.y[i]]; this.zoomTo(x - 6, y - 2, x + 6, y + 2); }
      const P = this.P, n = P.nodes, T = P.tables, D = this.detail;
      D.textContent = ""; D.style.display = "block"; this.detailKind = "node";
      D.style.left = D.style.top = D.style.right = "";
      const close = el("span", "jl-link", "✕"); close.style.float = "right"; close.onclick = () => { D.style.display = "none"; this.selected = -1; this.draw(); };
      D.appendChild(close);
      D.appendChild(el("b", "jl-detail-name", this.displayName(i)));
      if (this.displayName(i) !== n.name[i]) D.appendChild(el("span", "jl-detail-node", " (" + n.name[i] + ")"));
      const tb = el("table"); D.appendChild(tb);
      const row = (k, v) => { const tr = el("tr"); tr.appendChild(el("td", null, k)); const td = el("td"); if (v instanceof Node) td.appendChild(v); else td.textContent = v; tr.appendChild(td); tb.appendChild(tr); return td; };
      const links = list => { const s = el("span"); for (const j of list.slice(0, 30)) { const a = el("span", "jl-link", this.displayName(j)); a.title = this.P.nodes.name[j]; a.onclick = () => this.select(j, true); s.appendChild(a); } if (list.length > 30) s.appendChild(document.createTextNode(`… ${list.length - 30} more`)); return s; };
      const extra = P.nodes.extra[String(i)] || {};
      for (const [k, v] of (n.rows || {})[String(i)] || []) row(k, v).className = "jl-note";  // e.g. what a diff changed
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
      this._placePopup(() => this._nodeScreenRects(i));
      this.draw();
    }
    showGroup(gid) {
      const P = this.P, G = P.groups, D = this.detail;
      D.textContent = ""; D.style.display = "block"; this.detailKind = "group";
      D.appendChild(el("b", "jl-detail-name", (G.name[gid] || "(root)") + " " + (G.mtype[gid] || "")));
      const tb = el("table"); D.appendChild(tb);
      for (const [k, v] of [["nodes", `${G.count_f[gid]} forward · ${G.count_b[gid]} backward`],
        ["FLOPs", `fwd ${human(G.flops_f[gid], "FLOP")} · bwd ${human(G.flops_b[gid], "FLOP")}`],
        ["bytes", `fwd ${humanBytes(G.bytes_f[gid])} · bwd ${humanBytes(G.bytes_b[gid])}`]]) {
        const tr = el("tr"); tr.appendChild(el("td", null, k)); tr.appendChild(el("td", null, v)); tb.appendChild(tr);
      }
      const b = el("button", "jl-btn", this.expanded[gid] ? "close group" : "open group");
      b.onclick = () => this.toggle(gid, !this.expanded[gid]); D.appendChild(b);
      this._placeGroupPopup(gid);
    }
    // A popup never covers what it opened: a node (its disc, ring and label above it, or the
    // closed box holding it) or a group (its box, or its outlines and new children once
    // opened). It takes a corner of the canvas clear of that, else the view pans it to the
    // left of the popup; where even that leaves no room, no popup (a group's title closes it).
    _groupScreenRects(gid) {
      const out = [];
      for (const b of [0, 1]) {
        const q = this.groupRect(gid, b);
        if (!q) continue;
        const [a, t] = this.toScreen(q[0], q[3]), [z, u] = this.toScreen(q[2], q[1]);
        out.push([a, t, z, u]);
      }
      return out;
    }
    _nodeScreenRects(i) {
      const it = this.itemOf[i];
      if (it >= this.N) { const q = this.boxRect(it - this.N), [a, t] = this.toScreen(q[0], q[3]), [z, u] = this.toScreen(q[2], q[1]); return [[a, t, z, u]]; }
      if (it !== i) return [];
      const [sx, sy] = this.toScreen(this.x[i], this.y[i]), r = this._radius() + 6;
      return [[sx - r, sy - r - 14, sx + r, sy + r]];  // the ring, and the pinned label above it
    }
    _placeGroupPopup(gid) { this._placePopup(() => this._groupScreenRects(gid)); }
    _placePopup(rectsNow) {
      const D = this.detail, W = this.canvas.clientWidth, H = this.canvas.clientHeight, m = 6;
      D.style.left = D.style.top = D.style.right = "";
      const w = D.offsetWidth, h = D.offsetHeight;
      const spots = [[W - w - m, m], [m, m], [W - w - m, H - h - m], [m, H - h - m]];
      const clearOf = rects => spots.find(([x, y]) => rects.every(([a, t, z, u]) => x + w <= a || x >= z || y + h <= t || y >= u));
      let rects = rectsNow(), at = clearOf(rects);
      if (!at && rects.length) {
        const left = Math.min(...rects.map(r => r[0])), right = Math.max(...rects.map(r => r[2]));
        if (right - left <= W - w - 3 * m) {
          this.vx += (left - m) / this.k; this._fitted = ""; this.draw();
          rects = rectsNow(); at = clearOf(rects);
        }
      }
      if (!at) { D.style.display = "none"; this.detailKind = ""; return; }
      D.style.left = at[0] + "px"; D.style.top = at[1] + "px"; D.style.right = "auto";
    }
  }
  mixin(DagView, DagInteract);

  // -- lifetime: what a view holds outside its own elements (a ResizeObserver, a pending
  // animation frame, a drag's window listeners) is released once the view leaves the
  // document, so a re-rendered notebook cell does not keep the old view alive. One
  // MutationObserver watches the document while any view is live.
  const LIVE = new Set();
  let watcher = null;
  function sweep() {
    for (const v of LIVE) if (!v.root.isConnected) v.release();
    if (!LIVE.size && watcher) { watcher.disconnect(); watcher = null; }
  }
  class DagLifetime {
    _acquire() {  // hold the page's resources (again, if the view came back into the document)
      if (LIVE.has(this)) return;
      this.released = false; LIVE.add(this);
      this._ro = new ResizeObserver(() => this.resized()); this._ro.observe(this._main);
      if (!watcher) { watcher = new MutationObserver(sweep); watcher.observe(document.documentElement, {childList: true, subtree: true}); }
    }
    release() {  // let go of everything outside the view's elements; a later draw() takes it back
      if (this._raf) { cancelAnimationFrame(this._raf); this._raf = 0; }
      if (this._ro) { this._ro.disconnect(); this._ro = null; }
      if (this._endDrag) this._endDrag();
      LIVE.delete(this); this.released = true;
      if (!LIVE.size && watcher) { watcher.disconnect(); watcher = null; }
    }
  }
  mixin(DagView, DagLifetime);

  window.jointlabDag = function (id) {
    const root = document.getElementById(id);
    const P = JSON.parse(document.getElementById(id + "-data").textContent);
    root.jlView = new DagView(root, P);
    return root.jlView;
  };
  window.jointlabDag.live = () => LIVE.size;  // views holding page resources (tests)
