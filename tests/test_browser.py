"""The dashboard in a real browser: `infertrace dashboard` serves the prefill-storm sample incident on 127.0.0.1,
headless Chromium (Debian's /usr/bin/chromium, driven over the DevTools protocol) loads every page. It clicks
through to the ITL spike view and follows a deep link to the ground truth's worst stall, and must find the
ground-truth culprit request id on the page; the drawn heatmaps must have cells of many colours (read from the
rendered chart's pixels), the topology must fit the window, and a culprit's waterfall must draw its stages.
Screenshots of every page go to test-artifacts/browser/."""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import ClientConnection, connect

from infertrace.store.ingest import ingest_paths
from tests.incident_stores import SAMPLES, sample_store

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts" / "browser"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1500,2200",
                  "--remote-debugging-port=0", "--remote-allow-origins=*")

pytestmark = pytest.mark.browser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer within {timeout_s} s")
        time.sleep(0.5)


class DevTools:
    """The few Chrome DevTools Protocol calls the test needs, on one page target."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        ident = next(self.ids)
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=60))
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return result.get("result", {}).get("value")

    def text(self) -> str:
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    def wait_for_text(self, pattern: str, timeout_s: float = 180) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            text = self.text()
            running = self.evaluate("!!document.querySelector("
                                    "'[data-testid=\"stStatusWidget\"], [data-testid=\"stSpinner\"]')")
            if re.search(pattern, text) and not running:
                return text
            if time.monotonic() > deadline:
                raise TimeoutError(f"{pattern!r} not on the page after {timeout_s} s; page text:\n{text[:3000]}")
            time.sleep(0.5)

    def wait_until_idle(self, quiet_s: float = 3.0, timeout_s: float = 180) -> None:
        """Until no script run has been under way for `quiet_s` (a rerun may start a moment after another ends:
        the sidebar's watcher, then the page's own)."""
        deadline = time.monotonic() + timeout_s
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < quiet_s:
            if self.evaluate("!!document.querySelector("
                             "'[data-testid=\"stStatusWidget\"], [data-testid=\"stSpinner\"]')"):
                quiet_since = time.monotonic()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the page was still running after {timeout_s} s")
            time.sleep(0.25)

    def screenshot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))

    def chart_colours(self, index: int) -> dict[str, Any]:
        """The distinct colours drawn in the page's `index`-th Vega chart (canvas pixels or SVG fills), with
        how many pixels or marks have each; white, greys and anti-aliasing blends are left out."""
        return self.evaluate(_CHART_COLOURS % index) or {}

    def wait_for_charts(self, count: int, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while self.evaluate("document.querySelectorAll('.vega-embed').length") < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"fewer than {count} charts on the page after {timeout_s} s")
            time.sleep(0.5)
        time.sleep(2)  # let them draw


# Counts colours in a rendered Vega chart, quantised to 4 bits per channel, greys left out: a canvas's pixels
# (kept when seen at least 12 times, so text and edges do not count), or the fills of an SVG's rect and
# symbol marks.
_CHART_COLOURS = """
(() => {
  const chart = document.querySelectorAll('.vega-embed')[%d];
  if (!chart) return null;
  const counts = {};
  const canvas = chart.querySelector('canvas');
  if (canvas) {
    const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
    for (let i = 0; i < data.length; i += 4) {
      const [r, g, b, a] = [data[i], data[i + 1], data[i + 2], data[i + 3]];
      if (a < 250 || Math.max(r, g, b) - Math.min(r, g, b) < 24) continue;
      const key = [r >> 4, g >> 4, b >> 4].join(',');
      counts[key] = (counts[key] || 0) + 1;
    }
    for (const k of Object.keys(counts)) if (counts[k] < 12) delete counts[k];
  } else {
    const probe = document.createElement('canvas').getContext('2d');
    for (const mark of chart.querySelectorAll('svg .mark-rect path, svg .mark-symbol path')) {
      const fill = mark.getAttribute('fill');
      if (!fill || fill === 'none' || fill === 'transparent') continue;
      probe.clearRect(0, 0, 1, 1);
      probe.fillStyle = fill;
      probe.fillRect(0, 0, 1, 1);
      const [r, g, b] = probe.getImageData(0, 0, 1, 1).data;
      if (Math.max(r, g, b) - Math.min(r, g, b) < 24) continue;
      const key = [r >> 4, g >> 4, b >> 4].join(',');
      counts[key] = (counts[key] || 0) + 1;
    }
  }
  return counts;
})()
"""


def _stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()


@pytest.fixture(scope="module")
def served_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the prefill_storm sample's store (the refresh test writes into it)."""
    store = tmp_path_factory.mktemp("browser") / "store"
    shutil.copytree(sample_store("prefill_storm").store / "spans", store / "spans")
    return store


@pytest.fixture(scope="module")
def dashboard_url(served_store: Path) -> Iterator[str]:
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "infertrace.cli", "dashboard", "--store", str(served_store), "--port", str(port)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_http(f"http://127.0.0.1:{port}/_stcore/health", 90)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(process)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevTools]:
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not os.path.exists(chromium):
        pytest.fail("Debian's chromium is not installed: apt-get install -y chromium (.ci/run does)")
    profile = tmp_path_factory.mktemp("chromium-profile")
    process = subprocess.Popen([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        port = None
        deadline = time.monotonic() + 60
        assert process.stderr is not None
        while port is None and time.monotonic() < deadline:
            line = process.stderr.readline()
            match = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            if match:
                port = int(match.group(1))
        assert port is not None, "chromium did not start its DevTools endpoint"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as response:
            targets = json.loads(response.read())
        page = next(t for t in targets if t["type"] == "page")
        with connect(page["webSocketDebuggerUrl"], max_size=64 * 2**20) as ws:
            tools = DevTools(ws)
            tools.call("Page.enable")
            tools.call("Runtime.enable")
            yield tools
    finally:
        _stop(process)
        shutil.rmtree(profile, ignore_errors=True)


def _open_page(browser: DevTools, url: str, pattern: str, charts: int = 0) -> str:
    browser.call("Page.navigate", url=url)
    text = browser.wait_for_text(pattern)
    if charts:
        browser.wait_for_charts(charts)
    else:
        time.sleep(2)
    return text


def _worst_truth_stall() -> dict[str, Any]:
    truth = sample_store("prefill_storm").truth["itl"]["stalled_steps"]
    return max((s for s in truth if "prefill" in s["causes"]),
               key=lambda s: (s["duration_ns"] - s["decode_only_ns"]) * len(s["victims"]))


def test_the_itl_spike_view_of_the_prefill_storm_sample_shows_the_ground_truth_culprit(
        dashboard_url: str, browser: DevTools) -> None:
    browser.call("Page.navigate", url=dashboard_url + "/")
    browser.wait_for_text(r"Fleet overview[\s\S]*Drill down")
    browser.wait_for_charts(1)  # let the chart draw before the screenshot
    browser.screenshot(ARTIFACTS / "01-fleet-overview.png")

    clicked = browser.evaluate(
        "(() => { const a = [...document.querySelectorAll('a')].find(e => e.innerText.trim() === 'ITL spikes');"
        " if (a) { a.click(); return true; } return false; })()")
    assert clicked, "the sidebar has a link to the ITL spike view"
    text = browser.wait_for_text(r"Culprit prefill: \S+[\s\S]*Engine steps of")
    browser.wait_for_charts(5)
    browser.screenshot(ARTIFACTS / "02-itl-spikes-worst.png")
    assert "Stalled steps" in text

    stall = _worst_truth_stall()
    culprits = [c["request"] for c in stall["culprits"]]
    browser.call("Page.navigate", url=f"{dashboard_url}/itl?engine={stall['engine']}&step={stall['step_index']}")
    text = browser.wait_for_text(r"Culprit prefill: \S+[\s\S]*Engine steps of")
    browser.wait_for_charts(5)
    browser.screenshot(ARTIFACTS / "03-itl-spike-ground-truth.png")
    found = re.findall(r"Culprit prefill: (\S+)", text)
    assert set(found) & set(culprits), f"page names {found}; ground truth culprits {culprits}"
    assert f"Step {stall['step_index']} on {stall['engine']}" in text


def test_the_itl_heatmap_draws_cells_of_many_colours_with_the_stalls_marked(dashboard_url: str,
                                                                            browser: DevTools) -> None:
    text = _open_page(browser, dashboard_url + "/itl", r"ITL over time[\s\S]*Culprit prefill", charts=4)
    browser.screenshot(ARTIFACTS / "05-itl-heatmap-and-load.png")
    assert "Click a mark to open that stall below" in text
    colours = browser.chart_colours(0)
    blues = [c for c in colours if _channel(c, 2) > _channel(c, 0)]
    reds = [c for c in colours if _channel(c, 0) > _channel(c, 1) + 4]
    assert len(blues) >= 4, f"the heatmap's cells are not of varying shades: {colours}"
    assert reds, "no stall is marked on the heatmap"


def test_the_incidents_heatmap_has_varying_cells_and_the_topology_fits_the_window(dashboard_url: str,
                                                                                 browser: DevTools) -> None:
    _open_page(browser, dashboard_url + "/incidents", r"Incidents[\s\S]*Topology", charts=1)
    browser.screenshot(ARTIFACTS / "06-incidents.png")
    colours = browser.chart_colours(0)
    assert len(colours) >= 6, f"the incidents heatmap is one band, not cells: {colours}"
    width, height, page = browser.evaluate(
        "(() => { const s = [...document.querySelectorAll('svg')].find(e => e.querySelector('g.graph'));"
        " const main = document.querySelector('[data-testid=\"stMainBlockContainer\"]') || document.body;"
        " const r = s ? s.getBoundingClientRect() : {width: 0, height: 0};"
        " return [r.width, r.height, main.getBoundingClientRect().width]; })()")
    # on one screen beside the rest: no taller than a laptop's viewport, no wider than the page's column
    assert 0 < height <= 700 and width <= page, f"topology {width}×{height} px on a {page} px wide page"


def test_the_prefix_cache_and_runbook_pages_render(dashboard_url: str, browser: DevTools) -> None:
    _open_page(browser, dashboard_url + "/cache", r"Prefix cache[\s\S]*By system prompt", charts=1)
    browser.screenshot(ARTIFACTS / "07-prefix-cache.png")
    _open_page(browser, dashboard_url + "/runbook", r"Runbook[\s\S]*SQL")
    browser.screenshot(ARTIFACTS / "08-runbook.png")


def test_a_culprits_waterfall_draws_its_stages(dashboard_url: str, browser: DevTools) -> None:
    culprit = _worst_truth_stall()["culprits"][0]["request"]
    text = _open_page(browser, f"{dashboard_url}/request?request_id={culprit}", r"Request waterfall[\s\S]*stages over",
                      charts=1)
    browser.screenshot(ARTIFACTS / "09-request-waterfall.png")
    stages = int(re.search(r"(\d+) stages over", text).group(1))
    assert stages >= 7  # gateway, auth, rate limit, route, engine request, queue, prefill, chunk(s), decode
    colours = browser.chart_colours(0)
    assert len(colours) >= 5, f"the waterfall draws fewer stage colours than expected: {colours}"


def test_the_open_dashboard_refreshes_when_new_segments_arrive(dashboard_url: str, browser: DevTools,
                                                              served_store: Path) -> None:
    browser.call("Page.navigate", url=dashboard_url + "/")
    text = browser.wait_for_text(r"Fleet overview[\s\S]*Drill down")
    before = int(re.search(r"· (\d+) segments", text).group(1))
    # what `infertrace collect` does on each export: write new segments into the store
    ingest_paths(served_store, [SAMPLES / "engine_regression" / "traces.jsonl.gz"])
    after_text = browser.wait_for_text(rf"· (?!{before} )\d+ segments[\s\S]*Drill down", timeout_s=120)
    after = int(re.search(r"· (\d+) segments", after_text).group(1))
    assert after > before
    browser.wait_until_idle()  # the page's own rerun over the new snapshot, after the sidebar's
    browser.screenshot(ARTIFACTS / "10-fleet-after-new-segments.png")


def test_a_dashboard_with_an_analysis_window_says_what_it_analyses(tmp_path: Path, browser: DevTools) -> None:
    from tests.test_analysis_window import HOUR_NS, _shifted

    store = tmp_path / "store"  # an incident, and another two hours later
    ingest_paths(store, [SAMPLES / "prefill_storm" / "traces.jsonl.gz"])
    ingest_paths(store, [_shifted(SAMPLES / "cache_busting" / "traces.jsonl.gz", tmp_path / "later.jsonl",
                                  2 * HOUR_NS)])
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "infertrace.cli", "dashboard", "--store", str(store), "--port", str(port),
         "--analysis-window", "1h"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_http(f"http://127.0.0.1:{port}/_stcore/health", 90)
        text = _open_page(browser, f"http://127.0.0.1:{port}/", r"Analysing the last 1 h[\s\S]*Drill down")
        browser.wait_until_idle()
        browser.screenshot(ARTIFACTS / "11-fleet-analysis-window.png")
    finally:
        _stop(process)
    assert re.search(r"Analysing the last 1 h of the store's data: \d+ of its \d+ segments, spans from "
                     r"2026-01-01 02:00:\d\d UTC", text), text[:2000]


def _channel(colour: str, i: int) -> int:
    """Channel i of a colour key from `chart_colours` (`r,g,b` in 4-bit steps)."""
    return int(colour.split(",")[i])
