"""Open report.html in a real headless Chromium at 1280 px: the page renders, every image decodes
and is visible, nothing scrolls sideways (with every folded table opened), no console errors, no
figure series mixes trained and init, and every figure with categories has a legend naming them.

Two pages: the synthetic report of conftest.py (hostile strings, trained and init Jacobian rows,
positions to average) and the real MiniLM report saved in tests/golden/saved/minilm_dense."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)"
)

# The report itself has no script; this probe goes into a copy, after the content.
PROBE = """<script>
window.addEventListener('load', function () {
  var out = [];
  for (var i = 0; i < document.images.length; i++) {
    var im = document.images[i];
    out.push({w: im.naturalWidth, h: im.naturalHeight, complete: im.complete});
  }
  var pre = document.createElement('pre');
  pre.id = 'img-probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def _chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp / "profile"
    profile.mkdir(exist_ok=True)
    cmd = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", "--hide-scrollbars", f"--user-data-dir={profile}", *args,
    ]
    env = {**os.environ, "HOME": str(tmp)}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90, env=env, check=False)


# Goes into <head>: collects load errors (capture phase) and uncaught script errors.
ERRORS = """<script>window.__errors = [];
window.addEventListener('error', function (e) {
  var t = e.target && e.target !== window ? (e.target.tagName + ' ' + String(e.target.src || '').slice(0, 60)) : '';
  window.__errors.push(String(e.message || t));
}, true);
</script>"""

# Goes after the content: opens every <details>, then measures the page, tables and figures.
LAYOUT_PROBE = """<script>
window.addEventListener('load', function () {
  document.querySelectorAll('details').forEach(function (d) { d.open = true; });
  var doc = document.documentElement;
  var out = {inner: window.innerWidth, scroll: doc.scrollWidth, body: document.body.scrollWidth,
             errors: window.__errors, figures: [], wraps: []};
  document.querySelectorAll('figure').forEach(function (f) {
    var im = f.querySelector('img'), r = im.getBoundingClientRect();
    out.figures.push({name: f.dataset.figure, states: f.dataset.states,
      series: JSON.parse(f.dataset.series), categories: JSON.parse(f.dataset.categories),
      legend: JSON.parse(f.dataset.legend), alt: im.alt, w: im.naturalWidth, h: im.naturalHeight,
      rw: r.width, rh: r.height, left: r.left, right: r.right});
  });
  document.querySelectorAll('.table-wrap').forEach(function (w) {
    out.wraps.push({sw: w.scrollWidth, cw: w.clientWidth, right: w.getBoundingClientRect().right,
                    section: (w.querySelector('table') || {dataset: {}}).dataset.section || ''});
  });
  var pre = document.createElement('pre');
  pre.id = 'layout-probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""

GOLDEN_MINILM = Path(__file__).resolve().parents[1] / "golden" / "saved" / "minilm_dense"


@pytest.fixture(scope="module")
def minilm_page() -> str:
    from spectral_hooks.report import Report

    return Report.load(GOLDEN_MINILM).to_html()


def _layout(tmp: Path, html: str) -> tuple[dict, str]:
    page = tmp / "layout.html"
    page.write_text(html.replace("<head>", "<head>" + ERRORS, 1).replace("</body>", LAYOUT_PROBE + "</body>"),
                    encoding="utf-8")
    proc = _chromium(tmp, "--window-size=1280,900", "--enable-logging=stderr", "--v=0",
                     "--virtual-time-budget=15000", "--dump-dom", page.as_uri())
    match = re.search(r'<pre id="layout-probe">(.*?)</pre>', proc.stdout, re.S)
    assert match, f"layout probe output missing; chromium said:\n{proc.stderr[-2000:]}"
    text = match.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    return json.loads(text), proc.stderr


@pytest.mark.parametrize("which", ["synthetic", "minilm"])
def test_layout_at_1280px(which, rendered_page, minilm_page, tmp_path):
    html = rendered_page if which == "synthetic" else minilm_page
    out, stderr = _layout(tmp_path, html)
    assert out["inner"] == 1280
    # no horizontal scroll of the page, nor inside any table (every <details> opened)
    assert out["scroll"] <= out["inner"] and out["body"] <= out["inner"], out
    wide = [w for w in out["wraps"] if w["sw"] > w["cw"] + 1 or w["right"] > out["inner"]]
    assert not wide, wide
    # no console errors: none caught on the page, none logged by Chromium for it
    assert out["errors"] == []
    console = [ln for ln in stderr.splitlines() if "CONSOLE" in ln and "layout.html" in ln]
    assert not console, console
    # every figure decodes, has a size on the page and lies inside the viewport's width
    assert len(out["figures"]) >= 6
    for f in out["figures"]:
        assert f["w"] > 0 and f["h"] > 0 and f["rw"] > 100 and f["rh"] > 100, f["name"]
        assert f["left"] >= 0 and f["right"] <= out["inner"], f["name"]
        # the model states it shows are named in its data attributes and its alt text
        states = f["states"].split()
        assert states and f"Model state shown: {', '.join(states)}" in f["alt"], f["name"]
        # no series mixes model states (trained and init averaged into one line or panel)
        for s in f["series"]:
            assert "+" not in s["state"], (f["name"], s)
            assert s["state"] in states, (f["name"], s)
        # a figure with categories has a legend naming each of them
        if f["categories"]:
            missing = [c for c in f["categories"] if not any(c in label for label in f["legend"])]
            assert f["legend"] and not missing, (f["name"], missing)
        # a figure that overlays several states tells them apart with a legend
        if len(set(states) - {"null"}) > 1 and f.get("layout", "overlay") == "overlay":
            assert f["legend"], f["name"]
    by_name = {f["name"]: f for f in out["figures"]}
    assert {"trained", "init"} <= set(by_name["rotation_symmetry"]["states"].split())
    assert by_name["units"]["categories"] and by_name["units"]["legend"]


@pytest.fixture(scope="module")
def written_report(tmp_path_factory, rendered_page) -> Path:
    path = tmp_path_factory.mktemp("browser") / "report.html"
    path.write_text(rendered_page, encoding="utf-8")  # what write_html writes, rendered once
    return path


def test_screenshot_not_blank(written_report, tmp_path):
    shot = tmp_path / "shot.png"
    proc = _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,3000", written_report.as_uri())
    assert shot.is_file(), f"no screenshot; chromium said:\n{proc.stderr[-2000:]}"
    import matplotlib.image as mpimg

    img = mpimg.imread(shot)[..., :3]
    assert img.shape[:2] == (3000, 1200)
    gray = img.mean(axis=2)
    assert gray.std() > 0.05, "the screenshot is (nearly) uniform"
    non_white = (gray < 0.9).mean()
    assert non_white > 0.02, f"only {non_white:.1%} of the page is drawn"
    # colour from the embedded figures is visible (plots use coloured lines / points)
    saturation = img.max(axis=2) - img.min(axis=2)
    assert (saturation > 0.3).mean() > 0.001


def test_every_embedded_image_decodes(written_report, tmp_path):
    html = written_report.read_text(encoding="utf-8")
    n_images = html.count("<img")
    assert n_images >= 6
    probe_page = tmp_path / "probe.html"
    probe_page.write_text(html.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    proc = _chromium(tmp_path, "--virtual-time-budget=10000", "--dump-dom", probe_page.as_uri())
    match = re.search(r'<pre id="img-probe">(.*?)</pre>', proc.stdout, re.S)
    assert match, f"probe output missing; chromium said:\n{proc.stderr[-2000:]}"
    results = json.loads(match.group(1).replace("&quot;", '"'))
    assert len(results) == n_images
    for i, r in enumerate(results):
        assert r["w"] > 0 and r["h"] > 0, f"image {i} did not decode: {r}"


def test_broken_image_is_detected(tmp_path):
    """The probe itself works: a corrupt data URI gives naturalWidth 0."""
    page = tmp_path / "bad.html"
    page.write_text('<!DOCTYPE html><html><body><img src="data:image/png;base64,AAAA">'
                    + PROBE + "</body></html>", encoding="utf-8")
    proc = _chromium(tmp_path, "--virtual-time-budget=5000", "--dump-dom", page.as_uri())
    match = re.search(r'<pre id="img-probe">(.*?)</pre>', proc.stdout, re.S)
    assert match, proc.stderr[-2000:]
    assert json.loads(match.group(1).replace("&quot;", '"'))[0]["w"] == 0


def test_layout_probe_detects_problems(tmp_path):
    """The probe itself works: a page scrolling sideways, a table too wide for its box, a console
    error and a figure whose series mixes trained and init are all seen."""
    series = '[{&quot;label&quot;: &quot;x&quot;, &quot;state&quot;: &quot;init+trained&quot;}]'
    page = ('<!DOCTYPE html><html><head><title>t</title></head><body>'
            '<div style="width:2000px">wide</div>'
            '<div class="table-wrap" style="width:300px;overflow-x:auto"><table data-section="s">'
            '<tr><td style="white-space:nowrap">' + "x" * 400 + '</td></tr></table></div>'
            f'<figure data-figure="f" data-states="init+trained" data-series="{series}" '
            'data-categories="[]" data-legend="[]"><img alt="a" src="data:image/png;base64,AAAA">'
            '</figure><script>console.error("boom-from-page")</script></body></html>')
    out, stderr = _layout(tmp_path, page)
    assert out["scroll"] > out["inner"]
    assert any(w["sw"] > w["cw"] for w in out["wraps"])
    assert out["figures"][0]["w"] == 0 and out["figures"][0]["series"][0]["state"] == "init+trained"
    assert any("CONSOLE" in ln and "boom-from-page" in ln for ln in stderr.splitlines()), stderr[-2000:]
