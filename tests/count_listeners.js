// Injected before a page's scripts by tests/test_dagview_browser.py: counts registrations
// made by the page's own scripts (call stack holds the page URL) in window.__jlLive.
(() => {
  const live = window.__jlLive = {window: 0, document: 0, resize: 0, mutation: 0};
  const page = location.href, mine = () => (new Error().stack || "").includes(page);
  for (const [name, target] of [["window", window], ["document", document]]) {
    const add = target.addEventListener.bind(target), rm = target.removeEventListener.bind(target);
    const keys = new Set();
    target.addEventListener = (t, f, o) => { const k = t + "|" + (f && f.__id || (f.__id = Math.random())); if (!keys.has(k) && mine()) { keys.add(k); live[name]++; } return add(t, f, o); };
    target.removeEventListener = (t, f, o) => { const k = t + "|" + (f && f.__id); if (keys.delete(k)) live[name]--; return rm(t, f, o); };
  }
  for (const [name, Cls] of [["resize", "ResizeObserver"], ["mutation", "MutationObserver"]]) {
    const Orig = window[Cls];
    window[Cls] = class extends Orig {
      observe(...a) { if (!this.__on && mine()) { this.__on = true; live[name]++; } return super.observe(...a); }
      disconnect() { if (this.__on) { this.__on = false; live[name]--; } return super.disconnect(); }
    };
  }
})();
