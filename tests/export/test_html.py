"""`--export FILE.html` rendered in a real headless Chromium (Debian's chromium + chromium-driver,
driven by selenium: its Python package talks to the distribution's chromedriver directly, with no
browser download, and reads Chrome's console and performance logs). The page renders, its charts
are visible, the console has no error and the browser makes no network request.

`make test` installs chromium where it is missing; this test skips, saying why, only when
chromium, chromedriver or selenium cannot be found."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, dict[str, Any]]:
    from click.testing import CliRunner

    from capplan.cli import cli

    d = tmp_path_factory.mktemp("html")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CAPPLAN_HOME", str(d))
        res = CliRunner().invoke(cli, [
            "recommend", "--model", "llama-3.1-8b", "--rate", "20", "--input-len", "1000",
            "--output-len", "200", "--ttft-p99", "1", "--tbt-p99", "0.06", "--gpu", "h100-sxm",
            "--gpu", "l40s", "--tp", "1", "--verify-top", "0", "--no-disagg",
            "--export", str(d / "plan.html"),
            "--format", "json"])
    assert res.exit_code == 0, res.output
    return d / "plan.html", json.loads(res.stdout)


def test_page_is_self_contained(report) -> None:
    path, plan = report
    text = path.read_text()
    for needle in ("http://", "https://", "src=", "@import", "url("):
        # the only URLs are the commands' own localhost ones and the SVG namespace
        rest = text.replace("http://www.w3.org/2000/svg", "").replace("http://localhost", "")
        assert needle not in rest, needle
    assert "Content-Security-Policy" in text
    best = plan["recommendations"][0]
    assert best["engine_flags"]["vllm"].split()[2] in text


def _driver(tmp: Path) -> Any:
    if not (CHROMIUM and DRIVER):
        pytest.skip("chromium/chromedriver not installed (make test installs them: apt-get "
                    "install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium (test extra) missing")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-dev-shm-usage", f"--user-data-dir={tmp / 'profile'}",
                 "--window-size=1200,1600"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(options=opts, service=Service(executable_path=DRIVER))


def test_report_renders_in_headless_chromium(report, tmp_path) -> None:
    path, plan = report
    drv = _driver(tmp_path)
    try:
        drv.get(path.as_uri())
        from selenium.webdriver.common.by import By

        assert drv.find_element(By.TAG_NAME, "h1").text.startswith("capplan:")
        charts = drv.find_elements(By.CSS_SELECTOR, "svg.chart")
        assert len(charts) >= 2
        for c in charts:
            assert c.is_displayed() and c.size["width"] > 100 and c.size["height"] > 100
        # a line is drawn: the series' bounding boxes have an area
        boxes = drv.execute_script(
            "return Array.from(document.querySelectorAll('svg.chart .series'))"
            ".map(e => {const b = e.getBBox(); return b.width * b.height;});")
        assert boxes and max(boxes) > 0
        buttons = drv.find_elements(By.CSS_SELECTOR, "div.cmd button")
        assert len(buttons) >= 4
        rows = drv.find_elements(By.CSS_SELECTOR, "table tr")
        assert len(rows) > len(plan["recommendations"])
        errors = [e for e in drv.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        assert not errors, errors
        urls = []
        for entry in drv.get_log("performance"):
            msg = json.loads(entry["message"])["message"]
            if msg.get("method") == "Network.requestWillBeSent":
                urls.append(msg["params"]["request"]["url"])
        # the page itself was loaded (file://); no request left the machine (chrome:// are the
        # browser's own start-page resources, served from its binary)
        assert path.as_uri() in urls
        net = [u for u in urls if u.split(":", 1)[0] in ("http", "https", "ws", "wss", "ftp")]
        assert not net, net
    finally:
        drv.quit()
