"""IREE's probe records, its capability budget and IREE's message naming nodes, with real IREE compiles on a real
model: the head of PP-OCRv4 det (rapidocr-onnxruntime's wheel; its FPN's last adds to the sigmoid, 33 nodes,
dynamic sizes), cut out of the shipped model. Compiled whole, IREE's code generation fails on a Conv and a
ConvTranspose ("failed to resolve workgroup count hint"), as it does for the whole detector. The same test
shapes with stand-in compiles: ``test_iree_probe_cache.py``."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import epctx
from epctx.providers.iree import compile as iree_compile
from epctx.providers.iree import probing, search
from epctx.providers.iree.capability import DYNAMIC_CONVS_ENV
from tests.oracle import run_ort
from tests.requires import requires

pytestmark = [requires("iree.runtime", "iree.compiler", "rapidocr_onnxruntime"), pytest.mark.slow]

EP = "IREEExecutionProvider"


@pytest.fixture(autouse=True)
def _dynamic_convs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The head's convolutions have dynamic spatial sizes: IREE is given them only when asked
    (``capability.losing_conv``); this module checks the search IREE's real compiles drive."""
    monkeypatch.setenv(DYNAMIC_CONVS_ENV, "1")


NAMED = {"p2o.Conv.61", "p2o.ConvTranspose.0"}
INPUTS = ["p2o.Add.259", "p2o.Add.265", "p2o.Add.271", "p2o.Add.277"]  # FPN levels, upsampled x8 x4 x2 x1


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    assert spec is not None and spec.submodule_search_locations
    source = Path(next(iter(spec.submodule_search_locations))) / "models/ch_PP-OCRv4_det_infer.onnx"
    if not source.is_file():
        pytest.skip("rapidocr_onnxruntime ships no PP-OCRv4 det model")
    path = tmp_path_factory.mktemp("det") / "det_head.onnx"
    onnx.utils.extract_model(str(source), str(path), INPUTS, ["sigmoid_0.tmp_0"])
    return path


def _feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {name: rng.standard_normal((1, 24, 10 * 2**k, 10 * 2**k), dtype=np.float32) for k, name in
            enumerate(INPUTS)}  # fmt: skip


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[frozenset[str], bool]]]:
    """The capability compiles run: (node names, whether a flow probe); this process's compile results (the
    per-process cache of ``compile.py``) forgotten first, as in a new process."""
    monkeypatch.setattr(iree_compile, "_CACHE", {})
    seen: list[tuple[frozenset[str], bool]] = []
    real = search.compile_partitions

    def spy(partitions: Sequence[Any], flags: Sequence[str], *args: Any, **kwargs: Any) -> Any:
        seen.extend([(frozenset(n.name for n in p.nodes), probing.PROBE_FLAG in flags) for p in partitions])
        return real(partitions, flags, *args, **kwargs)

    monkeypatch.setattr(search, "compile_partitions", spy)
    yield seen


def _session(path: Path, budget: int = 30, **config: str) -> epctx.InferenceSession:
    so = epctx.SessionOptions()
    for key, value in config.items():
        so.add_session_config_entry(key, value)
    return epctx.InferenceSession(str(path), so, providers=[EP, "CPUExecutionProvider"],
                                  provider_options=[{"capability_budget_s": str(budget)}, {}])  # fmt: skip


def _placement(sess: epctx.InferenceSession) -> list[tuple[str, list[str]]]:
    return [(ep, sorted(nodes)) for ep, nodes in sess.get_partitions()]


def _check_outputs(sess: epctx.InferenceSession, path: Path) -> None:
    ours = sess.run(None, _feeds())
    theirs = run_ort(onnx.load(str(path)), _feeds())
    assert float(np.max(np.abs(ours[0] - theirs[0]))) <= 1e-4


def test_what_iree_names_is_left_out_and_a_second_session_compiles_only_its_groups(
    head: Path, compiles: list[tuple[frozenset[str], bool]]
) -> None:
    first = _session(head)
    reasons = {node: by_ep[EP] for node, by_ep in first.get_fallback_reasons().items() if EP in by_ep}
    assert set(reasons) >= NAMED and all("IREE's message names this node" in reasons[n] for n in NAMED)
    assert "workgroup count hint" in reasons["p2o.Conv.61"]
    iree = [nodes for ep, nodes in first.get_partitions() if ep == EP]
    assert iree and not NAMED & {n for nodes in iree for n in nodes}
    assert not any(probe for _, probe in compiles)  # a code generation failure: no flow-probe bisection
    _check_outputs(first, head)
    claimed = [c for c in compiles if not NAMED & c[0] and c != compiles[0]]  # the whole set failed
    compiles.clear()
    iree_compile._CACHE.clear()
    second = _session(head)  # every outcome from the records, then the groups' code
    assert _placement(second) == _placement(first)
    assert len(compiles) == len(claimed) and set(compiles) == set(claimed)  # no probe, no failed set
    _check_outputs(second, head)


def test_a_budget_of_one_second_holds_and_the_next_session_goes_on(
    head: Path, compiles: list[tuple[frozenset[str], bool]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="epctx")
    first = _session(head, budget=1)
    assert len(compiles) == 1  # the whole set (more than 1 s), nothing after it
    assert {ep for ep, _ in first.get_partitions()} == {"CPUExecutionProvider"}
    reasons = {node: by_ep[EP] for node, by_ep in first.get_fallback_reasons().items() if EP in by_ep}
    assert sum("capability budget of 1 s was spent" in why for why in reasons.values()) >= len(reasons) - 1
    assert "raise the provider option capability_budget_s" in caplog.text and "--dim" in caplog.text
    _check_outputs(first, head)
    compiles.clear()
    second = _session(
        head, budget=1
    )  # reads the whole set's failure, goes on with one step: the named nodes out
    assert len(compiles) >= 1 and all(NAMED.isdisjoint(names) for names, _ in compiles)
    assert any(ep == EP for ep, _ in second.get_partitions())
    compiles.clear()
    iree_compile._CACHE.clear()
    third = _session(head, budget=1)
    assert _placement(third) == _placement(second) and not any(NAMED & n or probe for n, probe in compiles)
    _check_outputs(third, head)


def test_a_context_model_loads_with_no_capability_compile(
    head: Path, tmp_path: Path, compiles: list[tuple[frozenset[str], bool]]
) -> None:
    ctx = tmp_path / "head_ctx.onnx"
    made = _session(head, **{"ep.context_enable": "1", "ep.context_file_path": str(ctx)})
    compiles.clear()
    warm = _session(ctx)
    assert not compiles
    assert {ep for ep, _ in warm.get_partitions()} == {ep for ep, _ in made.get_partitions()}
    _check_outputs(warm, head)
