"""The report in a real headless Chromium: the served Streamlit app and the built HTML file.

Chromium is driven over the DevTools protocol (a websocket; ``websockets`` comes with Streamlit).
Each test waits until the plotly charts have drawn their SVG, checks the labels, and saves a full
screenshot (into ``$GPUPOOL_SCREENSHOTS`` when set, else the test's tmp dir) for a person to look at.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.needs("chromium")

FIRST_SCREEN_PX = 900  # a laptop's browser window: the answer must be in it
# The answer an IT manager came for, in the summary of both the app and the HTML.
ANSWER = ("How busy the GPUs really are", "Held but idle", "A pool would need", "and save")
# With it, in view: the cost against what was used, whose price it is, and the catch of the pool size.
USED_COST = "of GPU use cost"
CATCH = ("of requests would have waited", "no request would have waited")


def _answer_on_first_screen(browser, price_flag: str) -> None:
    for label in ANSWER:
        top = browser.top_of(label)
        assert top is not None and top < FIRST_SCREEN_PX, (label, top)
    for text in (USED_COST, price_flag):
        top = browser.top_of(text)
        assert top is not None and top < FIRST_SCREEN_PX, (text, top)
    # The catch beside the claim: in the same line as "N of M GPUs", in the value's own type.
    claim = browser.eval(
        "(() => { const w = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);"
        " while (w.nextNode()) { const t = w.currentNode.textContent;"
        " if (/\\d+ of \\d+ GPUs? — /.test(t)) { const range = document.createRange();"
        " range.selectNodeContents(w.currentNode); const r = range.getBoundingClientRect();"
        # Whole: no ancestor that clips (overflow not visible) ends before the text does.
        " let whole = true; for (let a = w.currentNode.parentElement; a; a = a.parentElement) {"
        " if (getComputedStyle(a).overflowX !== 'visible' && r.right > a.getBoundingClientRect().right + 1)"
        " whole = false; }"
        " return [t, r.top + window.scrollY, whole]; } } return null; })()"
    )
    assert claim is not None and any(c in claim[0] for c in CATCH), claim
    assert claim[1] < FIRST_SCREEN_PX, claim
    assert claim[2], claim  # shown whole, not cut off with an ellipsis


# Counts the plotly charts that have drawn: an SVG and at least one trace of data.
DRAWN_CHARTS = """
(() => Array.from(document.querySelectorAll('.js-plotly-plot')).filter(
    d => d.querySelector('.main-svg') && d._fullData && d._fullData.length > 0
      && d.getBoundingClientRect().height > 100).length)()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(what: str, probe, timeout: float, every: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


class Chromium:
    """One headless Chromium with one page, driven over the DevTools protocol."""

    def __init__(self, profile: Path, width: int = 1400, height: int = 5200):
        from websockets.sync.client import connect

        self.proc = subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
                # Anything that tries to leave this machine hits a dead proxy (loopback is exempt).
                "--proxy-server=127.0.0.1:9",
                f"--user-data-dir={profile}",
                "--remote-debugging-port=0",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = profile / "DevToolsActivePort"
        port = _wait(
            "Chromium's DevTools port", lambda: port_file.exists() and port_file.read_text().split()[0], 30
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        # entered as a context manager (closed in close()): websockets 17.1+ warns about a bare connect()
        self.ws = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=10).__enter__()
        self.ids = itertools.count(1)
        self.call("Page.enable")
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )

    def call(self, method: str, params: dict | None = None, timeout: float = 30) -> dict:
        msg_id = next(self.ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout
        while True:
            reply = json.loads(self.ws.recv(timeout=max(deadline - time.monotonic(), 0.01)))
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def eval(self, expression: str):
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        return result["result"].get("value")

    def open(self, url: str) -> None:
        self.call("Page.navigate", {"url": url})

    def screenshot(self, path: Path, first_screen: bool = False) -> Path:
        """The whole page, or (``first_screen``) what a 1400 x 900 window shows before any scrolling."""
        params: dict = {"format": "png"}
        if first_screen:
            params["clip"] = {"x": 0, "y": 0, "width": 1400, "height": FIRST_SCREEN_PX, "scale": 1}
        data = self.call("Page.captureScreenshot", params, timeout=60)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def top_of(self, text: str) -> float | None:
        """Page y of the first element whose own text contains ``text`` (None when there is none)."""
        return self.eval(
            "(() => { const w = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);"
            f" while (w.nextNode()) {{ if (w.currentNode.textContent.includes({json.dumps(text)})) {{"
            " const r = w.currentNode.parentElement.getBoundingClientRect(); return r.top + window.scrollY; } }"
            " return null; })()"
        )

    def close(self) -> None:
        self.ws.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def browser(tmp_path):
    b = Chromium(tmp_path / "profile")
    yield b
    b.close()


@pytest.fixture(scope="module")
def sim_dir(tmp_path_factory):
    from test_analytics_data import generated_fleet

    return generated_fleet(tmp_path_factory.mktemp("sim"))


def _shot_path(tmp_path: Path, name: str) -> Path:
    folder = Path(os.environ.get("GPUPOOL_SCREENSHOTS", tmp_path))
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture
def served(sim_dir):
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "reports.cli", "serve", str(sim_dir), "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait(
            "the report server",
            lambda: proc.poll() is not None or _healthy(f"http://127.0.0.1:{port}/_stcore/health"),
            60,
        )
        assert proc.poll() is None, proc.stderr.read()
        yield f"http://127.0.0.1:{port}/"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def test_served_app_renders_its_charts(browser, served, tmp_path):
    browser.open(served)
    # Streamlit draws over a websocket after load: wait for the what-if chart, the last to appear.
    _wait(
        "the app's charts",
        lambda: (
            browser.eval(DRAWN_CHARTS) >= 5
            and "GPUs a pool would need" in (browser.eval("document.body.innerText") or "")
        ),
        90,
    )
    time.sleep(1.0)  # let the last chart finish its transition before the picture
    text = browser.eval("document.body.innerText")
    assert "GPU audit: how busy are the GPUs really?" in text
    assert text.count("SIMULATED DATA") >= 7  # banner + every section
    assert "GPUs needed (p95 / p99)" in text
    assert browser.eval("document.querySelectorAll('[data-testid=\"stException\"]').length") == 0
    kinds = browser.eval(
        "Array.from(document.querySelectorAll('.js-plotly-plot')).map(d => d._fullData.map(t => t.type).join('+'))"
    )
    assert {"scatter+scatter", "heatmap"} <= set(kinds)  # both metrics over time; the hour-of-week map
    shot = browser.screenshot(_shot_path(tmp_path, "report-app.png"))
    assert shot.stat().st_size > 50_000
    _answer_on_first_screen(browser, "(default; set it in the sidebar)")
    assert "None" not in browser.eval("document.body.innerText")  # missing values read n/a, as in the HTML
    browser.screenshot(_shot_path(tmp_path, "report-app-first-screen.png"), first_screen=True)


def test_built_html_renders_offline(browser, sim_dir, tmp_path):
    out = tmp_path / "audit.html"
    proc = subprocess.run(
        [sys.executable, "-m", "reports.cli", "build", str(sim_dir), "-o", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    browser.open(out.as_uri())
    drawn = _wait("the HTML report's charts", lambda: (n := browser.eval(DRAWN_CHARTS)) >= 8 and n, 60)
    assert drawn == browser.eval("document.querySelectorAll('.js-plotly-plot').length")  # every chart drew
    fetched = browser.eval("performance.getEntriesByType('resource').map(e => e.name)")
    assert [u for u in fetched if not u.startswith(("file:", "data:", "blob:"))] == []
    text = browser.eval("document.body.innerText")
    assert text.count("SIMULATED DATA") >= 8
    shot = browser.screenshot(_shot_path(tmp_path, "report-html.png"))
    assert shot.stat().st_size > 50_000
    _answer_on_first_screen(browser, "(default; set --price)")
    browser.screenshot(_shot_path(tmp_path, "report-html-first-screen.png"), first_screen=True)
