"""The dashboard in a real browser: `infertrace dashboard` serves the prefill-storm sample incident on 127.0.0.1,
headless Chromium (Debian's /usr/bin/chromium, driven over the DevTools protocol) loads it, clicks through to
the ITL spike view and follows a deep link to the ground truth's worst stall, and must find the ground-truth
culprit request id on the page. Screenshots go to test-artifacts/browser/."""

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

    def screenshot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))


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


def _worst_truth_stall() -> dict[str, Any]:
    truth = sample_store("prefill_storm").truth["itl"]["stalled_steps"]
    return max((s for s in truth if "prefill" in s["causes"]),
               key=lambda s: (s["duration_ns"] - s["decode_only_ns"]) * len(s["victims"]))


def test_the_itl_spike_view_of_the_prefill_storm_sample_shows_the_ground_truth_culprit(
        dashboard_url: str, browser: DevTools) -> None:
    browser.call("Page.navigate", url=dashboard_url + "/")
    browser.wait_for_text(r"Fleet overview[\s\S]*Drill down")
    time.sleep(2)  # let the charts draw before the screenshot
    browser.screenshot(ARTIFACTS / "01-fleet-overview.png")

    clicked = browser.evaluate(
        "(() => { const a = [...document.querySelectorAll('a')].find(e => e.innerText.trim() === 'ITL spikes');"
        " if (a) { a.click(); return true; } return false; })()")
    assert clicked, "the sidebar has a link to the ITL spike view"
    text = browser.wait_for_text(r"Culprit prefill: \S+[\s\S]*Engine steps of")
    time.sleep(2)
    browser.screenshot(ARTIFACTS / "02-itl-spikes-worst.png")
    assert "Stalled steps" in text

    stall = _worst_truth_stall()
    culprits = [c["request"] for c in stall["culprits"]]
    browser.call("Page.navigate", url=f"{dashboard_url}/itl?engine={stall['engine']}&step={stall['step_index']}")
    text = browser.wait_for_text(r"Culprit prefill: \S+[\s\S]*Engine steps of")
    time.sleep(2)
    browser.screenshot(ARTIFACTS / "03-itl-spike-ground-truth.png")
    found = re.findall(r"Culprit prefill: (\S+)", text)
    assert set(found) & set(culprits), f"page names {found}; ground truth culprits {culprits}"
    assert f"Step {stall['step_index']} on {stall['engine']}" in text


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
    time.sleep(2)
    browser.screenshot(ARTIFACTS / "04-fleet-after-new-segments.png")
