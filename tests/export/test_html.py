"""`--export FILE.html` rendered in a real headless Chromium (Debian's chromium + chromium-driver,
driven by selenium: its Python package talks to the distribution's chromedriver directly, with no
browser download, and reads Chrome's console and performance logs). The page renders, its charts
are visible, the console has no error and the browser makes no network request.

`make test` installs chromium where it is missing; this test skips, saying why, only when
chromium, chromedriver or selenium cannot be found."""

from __future__ import annotations

import json
import shlex
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


PD_ARGS = ["recommend", "--model", "deepseek-v3", "--gpu", "h200", "--engine", "sglang",
           "--rate", "5", "--input-len", "2000", "--output-len", "500", "--ttft-p99", "2",
           "--tbt-p99", "0.1"]
"""Disaggregated wins (16 GPUs against the aggregated 24), its replay confirming it."""


@pytest.fixture(scope="module")
def pd_report(tmp_path_factory) -> tuple[Path, dict[str, Any], list[str]]:
    from click.testing import CliRunner

    from capplan.cli import cli

    d = tmp_path_factory.mktemp("pd-html")
    args = [*PD_ARGS, "--export", str(d / "plan.html"), "--export", str(d / "plan.json")]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CAPPLAN_HOME", str(d))
        res = CliRunner().invoke(cli, args, prog_name="capplan")
    assert res.exit_code == 0, res.output
    return d / "plan.html", json.loads((d / "plan.json").read_text()), args


def test_disaggregated_report_renders_in_headless_chromium(pd_report, tmp_path) -> None:
    """When disaggregated wins, the page says so where the recommendation is, with the pools'
    table, their GPUs and runnable launch lines; its deploy line is the command that was run.
    Before: "Recommended: 3 x h200 TP 8 (24 GPUs)", no pool table, no GPU count, no verdict,
    P/D lines starting "1 x: ", and a deploy line telling a `recommend` user to run `capplan
    plan PLAN.yaml`."""
    path, plan, args = pd_report
    d = plan["disaggregated"]
    assert d["winner"] == "disaggregated"
    drv = _driver(tmp_path)
    try:
        drv.get(path.as_uri())
        from selenium.webdriver.common.by import By

        head = drv.find_element(By.CSS_SELECTOR, "p.headline")
        assert head.is_displayed()
        assert head.text.startswith(
            "Recommended: the disaggregated prefill/decode layout (its section below): prefill "
            f"1 x h200 TP 8 (8 GPUs, $32.00/h) + decode 1 x h200 TP 8 (8 GPUs, $32.00/h) = "
            f"{d['gpus_total']} GPUs"), head.text
        titles = [h.text for h in drv.find_elements(By.TAG_NAME, "h2")]
        assert "Disaggregated prefill/decode (recommended)" in titles
        assert drv.find_element(By.CSS_SELECTOR, "p.verdict").text == d["verdict"]
        table = drv.find_element(
            By.XPATH, "//h2[starts-with(., 'Disaggregated')]/following-sibling::table[1]")
        cells = [[c.text for c in r.find_elements(By.XPATH, "./th|./td")]
                 for r in table.find_elements(By.TAG_NAME, "tr")]
        rows = {r[0]: dict(zip(cells[0], r, strict=True)) for r in cells[1:]}
        for role in ("prefill", "decode"):
            r, p = rows[f"disaggregated {role}"], d[role]
            assert (r["GPU"], r["GPUs per replica"], r["GPUs"]) == ("h200", "8", "8")
            assert float(r["load per replica (req/s)"]) == pytest.approx(5.0)
            assert float(r["capacity per replica (req/s)"]) == pytest.approx(
                p["rate_per_replica_per_s"], abs=0.01)
            assert float(r["TTFT p99 (ms)"]) == pytest.approx(d["ttft_p99_s"] * 1e3, abs=0.5)
        cmds = {c.find_element(By.TAG_NAME, "b").text: c.find_element(By.TAG_NAME, "pre")
                for c in drv.find_elements(By.CSS_SELECTOR, "div.cmd")}
        for role in ("prefill", "decode"):
            pre = cmds[f"SGLang {role} (1 replica)"]
            assert pre.is_displayed()
            text = drv.execute_script("return arguments[0].textContent;", pre)
            assert text.startswith("CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 python -m "
                                   "sglang.launch_server ")
            assert f"--disaggregation-mode {role}" in text
        assert not [k for k, pre in cmds.items() if pre.text[:1].isdigit()]  # no "1 x: "
        deploy = drv.execute_script("return arguments[0].textContent;", cmds["deploy"])
        assert deploy == (f"{shlex.join(['capplan', *args])} --export plan.k8s.yaml && "
                          "kubectl apply -f plan.k8s.yaml")
        # the verify lines read the JSON this run wrote
        assert drv.execute_script("return arguments[0].textContent;", cmds["P/D measure"]) \
            .startswith(f"capplan verify {path.with_suffix('.json')} --layout disaggregated ")
        errors = [e for e in drv.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        assert not errors, errors
    finally:
        drv.quit()


FAST = ["recommend", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "1",
        "--max-num-seqs", "128", "--max-num-batched-tokens", "2048", "--rate", "5",
        "--verify-top", "0", "--no-disagg"]


def _deploy(page: str) -> str:
    import html
    import re

    (text,) = re.findall(r"<b[^>]*>deploy</b><pre id=\"[^\"]+\">([^<]*)</pre>", page)
    return html.unescape(text)


def test_deploy_line_names_the_command_that_was_run(run_cli, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    res = run_cli(*FAST, "--export", "a b.html")
    assert res.exit_code == 0, res.stderr
    assert _deploy((tmp_path / "a b.html").read_text()) == (
        f"{shlex.join(['capplan', *FAST, '--export', 'a b.html'])} --export plan.k8s.yaml && "
        "kubectl apply -f plan.k8s.yaml")
    # the run exported its manifests: the deploy line applies them
    res = run_cli(*FAST, "--export", "p.html", "--export", "out.k8s.yaml")
    assert res.exit_code == 0, res.stderr
    assert _deploy((tmp_path / "p.html").read_text()) == "kubectl apply -f out.k8s.yaml"
    # a plan file: the plan command, with the file as given
    plan = tmp_path / "chat.yaml"
    plan.write_text((Path(__file__).resolve().parents[2] / "examples" / "chat-8b.yaml")
                    .read_text())
    res = run_cli("plan", "chat.yaml", "--no-verify", "--export", "c.html")
    assert res.exit_code == 0, res.stderr
    assert _deploy((tmp_path / "c.html").read_text()).startswith(
        "capplan plan chat.yaml --no-verify --export c.html --export plan.k8s.yaml && ")


def test_report_without_its_command_names_no_other(tmp_path) -> None:
    """export_plan knows no command: the page says where the manifests come from instead of
    naming `capplan plan PLAN.yaml`, which a `recommend` user never ran."""
    from capplan.export import export_plan
    from tests.export.test_exports import sample_plan

    page = export_plan(sample_plan(), tmp_path / "p.html").read_text()
    assert "PLAN.yaml" not in page
    assert _deploy(page) == "kubectl apply -f plan.k8s.yaml"
    assert "--export plan.k8s.yaml</code> on the command that made it" in page


def test_a_plan_of_several_models_has_one_deploy_line(run_cli, tmp_path):
    """The models' one manifest file is applied once: the report of two models gives its deploy
    line once, after both models' sections."""
    html, k8s = tmp_path / "two.html", tmp_path / "two.k8s.yaml"
    res = run_cli("plan", "examples/day/two-models.yaml", "--export", str(html), "--export",
                  str(k8s))
    assert res.exit_code == 0, res.stderr
    assert html.read_text().count(f"kubectl apply -f {k8s}") == 1


def test_the_markdown_verify_lines_read_the_runs_json(run_cli, tmp_path):
    """Exported beside the plan's JSON, the Markdown report's verify lines read that file, as
    the HTML report's and the terminal's do (not the placeholder PLAN.json)."""
    js, md = tmp_path / "b.json", tmp_path / "b.md"
    res = run_cli("recommend", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "5",
                  "--export", str(js), "--export", str(md))
    assert res.exit_code == 0, res.stderr
    text = md.read_text()
    assert f"capplan verify {js}" in text and "PLAN.json" not in text
