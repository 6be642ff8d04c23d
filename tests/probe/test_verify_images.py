"""A plan whose prompts carry images is verified with its images: the exported lanes keep the
text tokens and the images beside them, capplan's dataset and endpoint client send the images,
the engines' benchmark lines make them, and a client that cannot carry them is refused."""

from __future__ import annotations

import base64
import io
import json
import zlib
from pathlib import Path

import pytest

from capplan.plan.bench_cmds import BenchImages, verify_lines
from tests.plan.engine_args import parse_line
from tests.probe.test_endpoint import _url, server  # noqa: F401

# Qwen2.5-VL's smart_resize (docs/features.md, "Image tokens", worked by hand): a 1024 x 1024
# image becomes 1036 x 1036 px, 74 x 74 patches of 14 px, a quarter of them tokens: 1,369.
TOKENS_1024 = 74 * 74 // 4
PLAN_YAML = """\
version: 1
model: qwen2.5-vl-7b
candidates: {gpus: [h100-sxm], tp: [1]}
engine: {max_model_len: 32768, max_num_seqs: [64], max_num_batched_tokens: [1024]}
verify: {top: 0}
workloads:
  - name: vision
    rate_per_s: 5
    input_len: 300
    output_len: 150
    images_per_request: 2
    slo: {ttft_p99_s: 1.0, tbt_p99_s: 50ms}
"""


@pytest.fixture(scope="module")
def vl_plan(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    from capplan.catalog.loader import load_catalog
    from capplan.plan.planner import run_plan
    from capplan.plan.schema import load_plan

    d = tmp_path_factory.mktemp("vl")
    (d / "vl.yaml").write_text(PLAN_YAML)
    res = run_plan(load_catalog(), load_plan(d / "vl.yaml"), None).to_dict()
    (d / "vl.json").write_text(json.dumps(res))
    return d / "vl.json", res


def test_exported_lane_keeps_the_text_tokens_and_its_images(vl_plan) -> None:
    _, d = vl_plan
    (lane,) = d["lanes"]
    assert lane["input_len"] == "300"  # the text, as written; not text + image tokens
    assert (lane["images_per_request"], lane["image_width"], lane["image_height"]) == \
        (2, 1024, 1024)
    assert lane["image_tokens_per_request"] == 2 * TOKENS_1024


def test_vllm_line_makes_the_plans_images(vl_plan) -> None:
    _, d = vl_plan
    fl = d["recommendations"][0]["engine_flags"]
    assert not fl["bench_dataset"]  # random-mm reads no file
    prog, _pos, f, _env = parse_line(fl["bench"])
    assert prog == ("vllm", "bench", "serve") and f["--dataset-name"] == "random-mm"
    assert f["--endpoint"] == "/v1/chat/completions" and f["--backend"] == "openai-chat"
    assert (f["--random-input-len"], f["--random-output-len"]) == ("300", "150")
    assert f["--random-mm-base-items-per-request"] == "2"
    assert json.loads(f["--random-mm-limit-mm-per-prompt"]) == {"image": 2, "video": 0}
    assert f["--random-mm-bucket-config"] == "{(1024, 1024, 1): 1.0}"
    assert "--ignore-eos" in f


def test_sglang_line_and_the_clients_without_images() -> None:
    im = BenchImages(count=3, width=640, height=480, text_tokens=200, output_tokens=90)
    lines = verify_lines("m", 2.0, "sglang", 30000, None, images=im)
    prog, _pos, f, _env = parse_line(lines["bench"])
    assert prog == ("python", "-m", "sglang.bench_serving") and f["--dataset-name"] == "image"
    assert (f["--image-count"], f["--image-resolution"]) == ("3", "480x640")  # height x width
    assert (f["--random-input-len"], f["--random-output-len"]) == ("200", "90")
    assert f["--random-range-ratio"] == "1" and not lines["bench_dataset"]
    for client in ("aiperf", "guidellm"):  # their datasets carry no images: capplan sends them
        line = verify_lines("m", 2.0, "trtllm", 8000, None, client=client, images=im)["bench"]
        prog, pos, f, _env = parse_line(line)
        assert prog == ("capplan", "verify") and f["--endpoint"] == "http://localhost:8000"
        assert "carries no images" in line


@pytest.mark.parametrize("client", ["vllm", "sglang", "aiperf", "guidellm"])
def test_text_only_dataset_of_an_image_plan_is_refused(vl_plan, run_cli, tmp_path,
                                                       client) -> None:
    path, _ = vl_plan
    out = tmp_path / "ds.jsonl"
    res = run_cli("verify", str(path), "--client", client, "--write-dataset", str(out))
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "carry images" in res.stderr and "--client capplan" in res.stderr
    assert not out.exists()


def _png_size(url: str) -> tuple[int, int]:
    """(width, height) of a PNG data URL, decoded by Pillow when installed, else by hand."""
    head, data = url.split(",", 1)
    assert head == "data:image/png;base64"
    raw = base64.b64decode(data)
    try:
        from PIL import Image
    except ImportError:  # the IHDR chunk, and the pixel rows the IDAT stream inflates to
        w, h = int.from_bytes(raw[16:20], "big"), int.from_bytes(raw[20:24], "big")
        idat = raw[raw.index(b"IDAT") + 4:raw.index(b"IEND") - 8]
        assert len(zlib.decompress(idat)) == h * (1 + 3 * w)
        return w, h
    im = Image.open(io.BytesIO(raw))
    im.load()
    return im.size


def test_capplan_dataset_carries_the_images(vl_plan, run_cli, tmp_path) -> None:
    path, _ = vl_plan
    out = tmp_path / "ds.jsonl"
    res = run_cli("verify", str(path), "--write-dataset", str(out), "--requests", "20")
    assert res.exit_code == 0, res.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 20
    urls = [u for r in rows for u in r["images"]]
    for r in rows:
        assert r["input_tokens"] == 300 and len(r["prompt"].split()) == 299
        assert len(r["images"]) == 2 and r["image_tokens"] == 2 * TOKENS_1024
    assert {_png_size(u) for u in urls} == {(1024, 1024)}
    assert len(set(urls)) == len(urls)  # no image repeats: no multimodal cache hit


def test_endpoint_client_sends_the_images_in_a_chat_completion(server, run_cli,  # noqa: F811
                                                               tmp_path) -> None:
    plan = {"model": "qwen2.5-vl-7b", "hf_id": "m",
            "lanes": [{"name": "vl", "rate_per_s": 40.0, "input_len": "12", "output_len": "4",
                       "images_per_request": 3, "image_width": 64, "image_height": 48,
                       "image_tokens_per_request": 6}],
            "recommendations": [{"gpu": "h100-sxm", "tp": 1, "replicas": 2,
                                 "per_replica_rate_per_s": 20.0, "max_model_len": 4096,
                                 "predicted": {}}]}
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(plan))
    res = run_cli("verify", str(p), "--endpoint", _url(server), "--requests", "3",
                  "--format", "json")
    assert res.exit_code == 0, res.stderr
    assert res.json()["measured"]["completed"] == 3
    assert len(server.bodies) == 3
    for path, body in server.bodies:
        assert path == "/v1/chat/completions" and body["max_tokens"] == 4
        (msg,) = body["messages"]
        *images, text = msg["content"]
        assert [i["type"] for i in images] == ["image_url"] * 3 and text["type"] == "text"
        assert len(text["text"].split()) == 11
        assert {_png_size(i["image_url"]["url"]) for i in images} == {(64, 48)}
