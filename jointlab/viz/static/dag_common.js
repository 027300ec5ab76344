// jointlab DAG renderer, part 1 of 5 (common): constants, CSS, text and number helpers,
// the occupancy grid and pair counter. jointlab/viz/dagview.py concatenates the parts in
// the order of its JS_PARTS inside one function scope (one inline script, nothing fetched);
// the payload every part reads is described in one place: PAYLOAD_SCHEMA in dagview.py.
  const XS = 3.0;          // a column is this many rows wide (room for labels)
  const LABEL_MIN_PX = 44; // a column this wide on screen shows node shapes too (with 1.6x)
  const LABEL_ROW_PX = 10; // rows this tall on screen (px per row) before node labels show
  const FIRST_K = 12;      // the first view's zoom (px per row) when the whole graph would be
                           // under LABEL_ROW_PX: deeper module levels are closed until the
                           // graph's height fits at this zoom, and its left part is shown
  const MINI_RESERVE = 66; // px at the canvas' bottom a fitted view leaves to the mini view
  const MAX_LABELS = 2500; // labels drawn per frame at most
  const MAX_PINNED = 400;  // whole labels drawn per frame on hits, the ringed node and twins
  const READ_K = 20;       // the zoom (px per row) a search hit or the stepper's node is shown at:
                           // a column is 60 px, past LABEL_MIN_PX, so its label is drawn
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
.jl-dag .jl-detail td{padding:1px 4px;vertical-align:top;border-bottom:1px solid #f0f0f0;overflow-wrap:break-word}
.jl-dag .jl-detail td:first-child{color:#666;white-space:nowrap;word-break:normal}
.jl-dag .jl-link{color:#0645ad;cursor:pointer;text-decoration:underline;margin-right:6px}
.jl-dag .jl-legend{padding:2px 6px;border-top:1px solid #eee;min-height:18px;flex:none;max-height:25%;overflow-y:auto}
.jl-dag .jl-legend span{display:inline-block;margin-right:10px;white-space:nowrap}
.jl-dag .jl-legend span.jl-status{white-space:normal}
.jl-dag .jl-legend i{display:inline-block;width:10px;height:10px;margin-right:3px;vertical-align:-1px}
.jl-dag .jl-status{color:#555}
.jl-dag .jl-searchbox{display:inline-flex;gap:2px;align-items:center}
.jl-dag .jl-count{color:#333;min-width:4em;margin-left:4px;white-space:nowrap}`;

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
  // `s` whole when it fits `maxw` pixels; a dotted name (a module path, a parameter's FQN)
  // else cut in the middle, its head and its last parts kept whole ("transformer.…h.0.attn",
  // "fc1.…weight"); anything else (an op name) is never cut: "". Never squeezed.
  function elide(ctx, s, maxw) {
    if (textWidth(ctx, s) <= maxw) return s;
    const parts = s.split(".");
    if (parts.length < 2) return "";
    for (let keep = Math.min(2, parts.length - 1); keep >= 1; keep--) {
      const tail = "…" + parts.slice(parts.length - keep).join(".");
      for (let n = s.length - tail.length; n >= 2; n--) {
        const c = s.slice(0, n) + tail;
        if (c.length < s.length && textWidth(ctx, c) <= maxw) return c;
      }
    }
    return "";
  }
  // Text with a white halo, readable over edges and outlines.
  function haloText(ctx, s, x, y, color) {
    ctx.lineJoin = "round"; ctx.strokeStyle = "rgba(255,255,255,.9)"; ctx.lineWidth = 3;
    ctx.strokeText(s, x, y); ctx.fillStyle = color; ctx.fillText(s, x, y);
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
  // Methods of `source` (a class used only as a bag of methods) copied onto `target`'s
  // prototype: DagView's methods are written in the part of their concern.
  function mixin(target, source) {
    for (const k of Object.getOwnPropertyNames(source.prototype)) {
      if (k !== "constructor") Object.defineProperty(target.prototype, k, Object.getOwnPropertyDescriptor(source.prototype, k));
    }
  }
