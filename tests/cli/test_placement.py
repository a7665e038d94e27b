"""Placement on the command line: ``epctx compile``'s summary (nodes per EP, the largest reasons) and ``epctx
inspect --placement MODEL -p ... [--json] [--html PAGE]``; the page is loaded in a real headless browser
(Debian's chromium; the test skips without it) and checked for what it shows: one box per node coloured by
its EP, the partitions boxed, the reasons in the nodes' hover text."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx import TensorProto

from epctx.partition.placement import NO_REASON
from epctx.partition.placement_page import provider_colors
from tests.cli.helpers import Cli
from tests.epcontext.models import EXAMPLE

CPU = "CPUExecutionProvider"
OV = "OpenVINOExecutionProvider"


def test_compile_prints_nodes_per_ep_and_reasons(cli: Cli, model: Path) -> None:
    result = cli("compile", model, "-p", EXAMPLE, "-q")
    assert result.status == 0, result.err
    assert f"nodes per EP: {EXAMPLE} 5 in 2 partitions, {CPU} 1" in result.out
    assert f"1 nodes  {EXAMPLE}: {NO_REASON}" in result.out
    report = json.loads(cli("compile", model, "-p", EXAMPLE, "--json", "--force").out)
    assert report["placement"]["nodes_per_provider"] == {EXAMPLE: 5, CPU: 1}
    assert report["placement"]["top_reasons"][0]["example"] == "ln"


def test_inspect_placement_text_and_json(cli: Cli, model: Path) -> None:
    result = cli("inspect", "--placement", model, "-p", EXAMPLE)
    assert result.status == 0, result.err
    assert re.search(rf"2 ln \(LayerNormalization\) -> {CPU}\n\s+{EXAMPLE} declined it: ", result.out)
    report = json.loads(cli("inspect", "--placement", model, "-p", EXAMPLE, "--json").out)
    assert [n["provider"] for n in report["nodes"]] == [EXAMPLE, EXAMPLE, CPU, EXAMPLE, EXAMPLE, EXAMPLE]
    assert report["providers"] == [EXAMPLE, CPU]
    assert cli("inspect", model, "--html", "x.html").status == 2  # --html goes with --placement


def _browser() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no chromium here (apt-get install -y chromium)")


def _chromium(page: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args]
    return subprocess.run(
        [*command, page.resolve().as_uri()], capture_output=True, text=True, timeout=120, check=True
    )


def _three_eps_model() -> onnx.ModelProto:
    """OpenVINO takes the Relu / Sigmoid nodes, refuses Pad(mode=wrap) with its reason; CPU runs the Pad."""
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])
    nodes = [
        oh.make_node("Relu", ["x"], ["a"], name="first_relu"),
        oh.make_node("Pad", ["a", "pads"], ["b"], name="wrap_pad", mode="wrap"),
        oh.make_node("Relu", ["b"], ["c"], name="second_relu"),
        oh.make_node("Sigmoid", ["c"], ["y"], name="last_sigmoid"),
    ]
    pads = onnx.numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads")
    out = oh.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = oh.make_graph(nodes, "wrap_pad", [x], [out], [pads])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 19)])


@pytest.fixture
def page(cli: Cli, tmp_path: Path) -> Path:
    pytest.importorskip("openvino")
    source = tmp_path / "pad.onnx"
    onnx.save(_three_eps_model(), source)
    out = tmp_path / "placement.html"
    result = cli("inspect", "--placement", source, "-p", OV, "--html", out)
    assert result.status == 0, result.err
    text = out.read_text()
    assert not re.search(r"(src|href)\s*=|https?://(?!www\.w3\.org/2000/svg)", text)  # self-contained
    return out


@pytest.mark.slow
def test_page_in_headless_chromium_dom(page: Path) -> None:
    dom = _chromium(page, "--virtual-time-budget=5000", "--dump-dom").stdout
    assert 'data-rendered="4"' in dom  # the page's script ran to its end
    nodes = re.findall(
        r'<g class="node( declined)?" data-index="(\d)" data-ep="([^"]+)" [^>]*><rect [^>]*fill="([^"]+)"',
        dom,
    )
    colors = provider_colors([OV, CPU])
    assert sorted((int(i), ep, fill, bool(d)) for d, i, ep, fill in nodes) == [
        (0, OV, colors[OV], False),
        (1, CPU, colors[CPU], True),
        (2, OV, colors[OV], False),
        (3, OV, colors[OV], False),
    ]
    partitions = re.findall(r'<rect class="partition"[^>]*stroke="([^"]+)"', dom)
    assert partitions == [colors[OV], colors[OV]]  # the two OpenVINO partitions, boxed
    pad = re.search(r'data-name="wrap_pad">.*?<title>(.*?)</title>', dom, re.S)
    assert pad is not None and f"{OV} declined it:" in pad.group(1)
    assert "Unsupported padding mode: [wrap]" in pad.group(1)  # OpenVINO's reason, on hover
    assert f"{OV}: 3 nodes" in dom and f"{CPU}: 1 nodes" in dom  # the legend


@pytest.mark.slow
def test_page_in_headless_chromium_pixels(page: Path, tmp_path: Path) -> None:
    """The screenshot shows boxes in both EPs' colours (OpenVINO's three nodes cover more than CPU's one)."""
    image_module = pytest.importorskip("PIL.Image")
    shot = tmp_path / "shot.png"
    _chromium(page, "--window-size=1200,700", "--virtual-time-budget=5000", f"--screenshot={shot}")
    pixels = np.asarray(image_module.open(shot).convert("RGB")).reshape(-1, 3).astype(int)
    colors = provider_colors([OV, CPU])

    def count(hex_color: str) -> int:
        rgb = np.array([int(hex_color[k : k + 2], 16) for k in (1, 3, 5)])
        return int((np.abs(pixels - rgb).sum(axis=1) < 12).sum())

    ov, cpu = count(colors[OV]), count(colors[CPU])
    assert cpu > 1000 and ov > 2 * cpu, (ov, cpu)
