"""Check a built leaderboard page in a real browser (headless Chromium) and screenshot it.

    python -m plcql_bench.leaderboard.browser site/index.html [--screenshot artifacts/leaderboard.png]

Three headless runs against ``file://`` (so the page must work offline):

1. the page as built, with Chromium's log on stderr (``--enable-logging=stderr``): the page
   ships no script, so *any* console line it produces (an uncaught error, a resource that
   failed to load, a blocked request) is reported as an error;
2. a probe copy of the page (written next to it, then deleted) with a small script added that
   records ``window.onerror``, ``console.error`` and failed resource loads, and measures, in
   every scoring view with and without the empty columns, the ``table.board`` tables shown
   (size, ``display``/``visibility``), every table wider than its box or the viewport
   (clipped) and the page's width; ``--dump-dom`` returns the probe's findings from the DOM;
3. a screenshot of the page as built;
4. with ``timing`` (the command line always): a copy of the page with a small script that reads,
   once the page has loaded, its own performance timeline: first contentful paint,
   DOMContentLoaded and the load event, top level at the requested window size (median of
   ``timing_runs`` loads; each number is wall time on this machine, so the same page on a busier
   machine reads slower). *First render* is the first contentful paint, or the load event for a
   page small enough to load before Chromium's first frame (headless Chromium then records no
   paint before it reports).

Exit status 0 when the page passes, 1 with the problems listed otherwise, 2 when Chromium is
not installed.
"""

from __future__ import annotations

import argparse
import html as htmlmod
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["find_chromium", "check_page", "PageReport"]

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BASE_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
              "--hide-scrollbars", "--mute-audio", "--disable-background-networking")

PROBE = """<script id="lb-probe">
(function () {
  var errors = [];
  window.addEventListener("error", function (e) {
    var t = e.target;
    if (t && t !== window && (t.src || t.href)) { errors.push("failed to load " + (t.src || t.href)); }
    else { errors.push("uncaught: " + (e.message || e)); }
  }, true);
  window.addEventListener("unhandledrejection", function (e) { errors.push("unhandled rejection: " + e.reason); });
  var origError = console.error;
  console.error = function () { errors.push("console.error: " + Array.prototype.join.call(arguments, " ")); return origError.apply(console, arguments); };
  function visible(el) { return el.getClientRects().length > 0 && getComputedStyle(el).visibility === "visible"; }
  function measure(state) {
    // Board tables shown; tables wider than their box (clipped) or than the viewport; page width.
    var tables = [], clipped = [], vw = document.documentElement.clientWidth;
    document.querySelectorAll("table.board").forEach(function (t) {
      if (!visible(t)) { return; }
      var r = t.getBoundingClientRect(), s = getComputedStyle(t);
      tables.push({id: t.id, width: r.width, height: r.height, rows: t.tBodies.length ? t.tBodies[0].rows.length : 0,
                   display: s.display, visibility: s.visibility, opacity: s.opacity});
    });
    document.querySelectorAll("table").forEach(function (t) {
      if (!visible(t)) { return; }
      var box = t.parentElement;
      var over = Math.max(box.scrollWidth - box.clientWidth, t.getBoundingClientRect().right - vw);
      if (over > 1) { clipped.push({id: t.id || t.className || "table", by: Math.round(over), state: state}); }
    });
    var doc = document.documentElement;
    return {state: state, tables: tables, clipped: clipped, inner_width: doc.clientWidth,
            page_width: Math.max(doc.scrollWidth, document.body.scrollWidth)};
  }
  window.addEventListener("load", function () {
    var states = [measure("default")];
    var scorings = document.querySelectorAll("input[name=scoring]"), norms = document.querySelectorAll("input[name=norm]");
    var hide = document.getElementById("hide-empty");
    [true, false].forEach(function (hidden) {
      if (!hide && !hidden) { return; }
      if (hide) { hide.checked = hidden; }
      scorings.forEach(function (a) { norms.forEach(function (b) {
        a.checked = true; b.checked = true; states.push(measure(a.id + " " + b.id + (hidden ? "" : " all columns")));
      }); });
    });
    if (hide) { hide.checked = true; }
    if (scorings.length) { scorings[0].checked = true; }
    if (norms.length) { norms[0].checked = true; }
    var out = document.createElement("pre");
    var payload = JSON.stringify({errors: errors, states: states, svgs: document.querySelectorAll("figure svg").length,
                                  title: document.title});
    if (window.parent !== window) { window.parent.postMessage(payload, "*"); return; }
    out.id = "lb-probe-result";
    out.textContent = payload;
    document.body.appendChild(out);
  });
})();
</script>"""


TIMING = """<script id="lb-timing">
window.addEventListener("load", function () { setTimeout(function () {
  var nav = performance.getEntriesByType("navigation")[0] || {}, paint = {};
  performance.getEntriesByType("paint").forEach(function (p) { paint[p.name] = p.startTime; });
  var pre = document.createElement("pre"); pre.id = "lb-timing-result";
  pre.textContent = JSON.stringify({first_contentful_paint_ms: paint["first-contentful-paint"],
                                    dom_content_loaded_ms: nav.domContentLoadedEventEnd, load_ms: nav.loadEventStart});
  document.body.appendChild(pre);
}, 0); });
</script>"""


FRAME = """<!doctype html><html><head><meta charset="utf-8"><title>probe</title></head>
<body style="margin:0"><script>
window.addEventListener("message", function (e) {{
  var pre = document.createElement("pre"); pre.id = "lb-probe-result"; pre.textContent = e.data; document.body.appendChild(pre);
}});
</script><iframe src="{src}" style="width:{w}px;height:{h}px;border:0;display:block"></iframe></body></html>"""


@dataclass
class PageReport:
    errors: list[str] = field(default_factory=list)
    tables: list[dict] = field(default_factory=list)  # the board tables shown in the default state
    clipped: list[dict] = field(default_factory=list)  # tables wider than their box, any state
    page_width: int = 0  # widest document width over all states
    inner_width: int = 0  # the viewport width the page was laid out in
    svgs: int = 0
    screenshot: Path | None = None
    page_bytes: int = 0  # the HTML file's size
    # ms: first_render_ms, first_contentful_paint_ms, dom_content_loaded_ms, load_ms (module doc, run 4)
    timing: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors


def find_chromium() -> str | None:
    env = os.environ.get("CHROMIUM")
    if env and shutil.which(env):
        return shutil.which(env)
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _run(chromium: str, args: list[str], profile: Path, timeout: float) -> subprocess.CompletedProcess:
    cmd = [chromium, *BASE_FLAGS, f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, errors="replace")


CONSOLE_RE = re.compile(r":CONSOLE[:(]\d*\)?\]\s*(.*)")


def check_page(
    page: Path,
    *,
    screenshot: Path | None = None,
    window: tuple[int, int] = (1440, 900),
    chromium: str | None = None,
    timeout: float = 60.0,
    min_tables: int = 1,
    allow_scroll: bool = False,
    timing: bool = False,
    timing_runs: int = 3,
) -> PageReport:
    """Load ``page`` in headless Chromium at ``window`` (width, height); report console errors,
    invisible or missing ``table.board`` tables, a page wider than the viewport, and (unless
    ``allow_scroll``, for phone widths where tables scroll in their boxes) any table wider than
    its box. Every scoring view and the "all columns" state are measured. Saves a screenshot
    when ``screenshot`` is given; measures the time to first render with ``timing``."""
    page = Path(page).resolve()
    chromium = chromium or find_chromium()
    if chromium is None:
        raise FileNotFoundError("chromium is not installed (Debian: apt-get install chromium)")
    report = PageReport(page_bytes=page.stat().st_size)
    url = page.as_uri()
    size = f"--window-size={window[0]},{window[1]}"
    with tempfile.TemporaryDirectory(prefix="lb-chromium-") as tmp:
        tmp = Path(tmp)
        # 1. console output of the page as built
        r = _run(chromium, ["--enable-logging=stderr", "--v=0", "--virtual-time-budget=3000", "--dump-dom", url], tmp / "p1", timeout)
        for line in r.stderr.splitlines():
            m = CONSOLE_RE.search(line)
            if m:
                report.errors.append(f"console: {m.group(1).strip()}")
        if r.returncode != 0:
            report.errors.append(f"chromium exited with {r.returncode}: {r.stderr.strip()[-300:]}")
        elif "</html>" not in r.stdout and "</body>" not in r.stdout:
            report.errors.append("chromium returned no DOM for the page")

        # 2. probe copy next to the page (same directory, so relative links resolve alike)
        text = page.read_text(encoding="utf-8")
        probed = text.replace("<head>", "<head>\n" + PROBE, 1) if "<head>" in text else PROBE + text
        fd, probe_name = tempfile.mkstemp(prefix=".probe-", suffix=".html", dir=page.parent)
        os.close(fd)
        probe_path = Path(probe_name)
        frame_path = probe_path.with_name(probe_path.stem + "-frame.html")
        try:
            probe_path.write_text(probed, encoding="utf-8")
            # The page is measured inside an iframe of exactly the requested width: headless
            # Chromium lays a top-level window out no narrower than 500 px.
            frame_path.write_text(FRAME.format(src=probe_path.name, w=window[0], h=window[1]), encoding="utf-8")
            outer = f"--window-size={max(window[0], 800) + 40},{window[1] + 40}"
            r = _run(chromium, [outer, "--virtual-time-budget=5000", "--dump-dom", frame_path.as_uri()], tmp / "p2", timeout)
        finally:
            probe_path.unlink(missing_ok=True)
            frame_path.unlink(missing_ok=True)
        m = re.search(r'<pre id="lb-probe-result">(.*?)</pre>', r.stdout, re.S)
        if not m:
            report.errors.append("the probe did not report (page failed to load or scripts could not run)")
        else:
            found = json.loads(htmlmod.unescape(m.group(1)))
            report.errors += found["errors"]
            states = found["states"]
            report.tables = states[0]["tables"]
            report.svgs = found["svgs"]
            report.inner_width = states[0]["inner_width"]
            report.page_width = max(st["page_width"] for st in states)
            report.clipped = [c for st in states for c in st["clipped"]]
            if len(report.tables) < min_tables:
                report.errors.append(f"expected at least {min_tables} leaderboard table(s), found {len(report.tables)}")
            for t in report.tables:
                if t["width"] < 50 or t["height"] < 20 or t["display"] == "none" or t["visibility"] != "visible" or float(t["opacity"]) < 0.5:
                    report.errors.append(f"table {t['id']} is not visible: {t}")
            for st in states:
                if st["page_width"] > st["inner_width"] + 1:
                    report.errors.append(f"page overflow ({st['state']}): {st['page_width']} px wide in a {st['inner_width']} px viewport")
            if not allow_scroll:
                for c in report.clipped:
                    report.errors.append(f"table {c['id']} is clipped by {c['by']} px at {report.inner_width} px ({c['state']})")

        # 3. screenshot of the page as built
        if screenshot is not None:
            screenshot = Path(screenshot).resolve()
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            r = _run(chromium, [size, "--virtual-time-budget=3000", f"--screenshot={screenshot}", url], tmp / "p3", timeout)
            if not screenshot.is_file() or screenshot.stat().st_size == 0:
                report.errors.append(f"no screenshot written: {r.stderr.strip()[-300:]}")
            else:
                report.screenshot = screenshot

        # 4. time to first render, top level
        if timing:
            report.timing = _timing(chromium, page, text, size, tmp, timeout, timing_runs, report.errors)
    return report


def _timing(chromium: str, page: Path, text: str, size: str, tmp: Path, timeout: float, runs: int,
            errors: list[str]) -> dict:
    """The median over ``runs`` loads of each of the page's own timings (see the module doc)."""
    fd, name = tempfile.mkstemp(prefix=".timing-", suffix=".html", dir=page.parent)
    os.close(fd)
    copy = Path(name)
    found: list[dict] = []
    try:
        copy.write_text(text.replace("<head>", "<head>\n" + TIMING, 1) if "<head>" in text else TIMING + text,
                        encoding="utf-8")
        for i in range(runs):
            r = _run(chromium, [size, "--dump-dom", copy.as_uri()], tmp / f"t{i}", timeout)
            m = re.search(r'<pre id="lb-timing-result">(.*?)</pre>', r.stdout, re.S)
            if m:
                found.append(json.loads(htmlmod.unescape(m.group(1))))
    finally:
        copy.unlink(missing_ok=True)
    if not found:
        errors.append("the timing run did not report (page failed to load or scripts could not run)")
        return {}
    for f in found:
        f["first_render_ms"] = f.get("first_contentful_paint_ms") or f.get("load_ms")
    keys = ("first_render_ms", "first_contentful_paint_ms", "dom_content_loaded_ms", "load_ms")
    return {k: round(statistics.median(f[k] for f in found if f.get(k) is not None)) if any(f.get(k) is not None for f in found)
            else None for k in keys}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m plcql_bench.leaderboard.browser", description=__doc__.split("\n\n")[0])
    ap.add_argument("page", type=Path, help="the built index.html")
    ap.add_argument("--screenshot", type=Path, default=None, help="PNG to write (e.g. artifacts/leaderboard.png)")
    ap.add_argument("--window", default="1440,900", help="viewport WIDTH,HEIGHT")
    ap.add_argument("--allow-scroll", action="store_true", help="tables may scroll in their boxes (phone widths)")
    args = ap.parse_args(argv)
    if find_chromium() is None:
        print("error: chromium is not installed (Debian: apt-get install chromium)", file=sys.stderr)
        return 2
    w, h = (int(v) for v in args.window.split(","))
    report = check_page(args.page, screenshot=args.screenshot, window=(w, h), allow_scroll=args.allow_scroll, timing=True)
    for t in report.tables:
        print(f"table {t['id']}: {t['rows']} rows, {t['width']:.0f}x{t['height']:.0f}px")
    print(f"{report.svgs} inline SVG figures; page {report.page_width} px wide in a {report.inner_width} px viewport")
    t = report.timing
    print(f"{report.page_bytes / 1e6:.2f} MB; first render {t.get('first_render_ms')} ms (first contentful paint "
          f"{t.get('first_contentful_paint_ms')} ms), DOMContentLoaded {t.get('dom_content_loaded_ms')} ms, "
          f"load {t.get('load_ms')} ms (median of 3 loads, this machine)")
    if report.screenshot:
        print(f"screenshot: {report.screenshot}")
    for e in report.errors:
        print(f"ERROR {e}", file=sys.stderr)
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
