"""Open report.html in a real headless Chromium: the page renders and every image decodes."""

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
