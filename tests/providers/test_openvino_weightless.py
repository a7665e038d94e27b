"""OpenVINO weightless context binaries: the weights are mapped from the context binary's own file, not copied."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("openvino")

from benchmarks.models import example_inputs, mlp

import epctx
from epctx.ep import CompileContext
from epctx.epcontext import ContextBinary, ContextBinaryWriter
from epctx.providers.openvino import provider as provider_mod
from epctx.providers.openvino.context import read_meta
from epctx.session.compile_guard import no_compile
from tests.oracle import run_ort

EP = "OpenVINOExecutionProvider"
BIN = f"model_{EP}.bin"
WEIGHTLESS = {"weightless": "1"}
ROOT = Path(__file__).resolve().parents[2]


class _SpyCore:
    """Delegates to OpenVINO's core; records, for each import, what file ``WEIGHTS_PATH`` named."""

    def __init__(self, core: Any) -> None:
        self._core = core
        self.imports: list[tuple[os.stat_result, str] | None] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._core, name)

    def import_model(self, model: Any, device: str, config: dict[str, Any]) -> Any:
        path = config.get("WEIGHTS_PATH")
        if path is None:
            self.imports.append(None)
        else:  # stat it while it is valid: a /proc/self/fd path is closed after the import
            target = os.readlink(path) if path.startswith("/proc/self/fd/") else path
            self.imports.append((os.stat(path), target))
        return self._core.import_model(model, device, config)


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> _SpyCore:
    core = _SpyCore(provider_mod.shared_core())
    monkeypatch.setattr(provider_mod, "_CORE", core)
    return core


def _options(**config: str) -> epctx.SessionOptions:
    so = epctx.SessionOptions()
    for key, value in config.items():
        so.add_session_config_entry(key.replace("__", "."), value)
    return so


def _generate(folder: Path, model: onnx.ModelProto, ep_options: dict[str, str], **config: str) -> Path:
    onnx.save(model, folder / "model.onnx")
    epctx.InferenceSession(
        str(folder / "model.onnx"),
        _options(ep__context_enable="1", **config),
        providers=[(EP, ep_options)],
    )
    return folder / "model_ctx.onnx"


def _load(ctx: Path, ep_options: dict[str, str]) -> epctx.InferenceSession:
    with no_compile():
        return epctx.InferenceSession(str(ctx), providers=[(EP, ep_options)])


def _two_partitions(hidden: int = 64) -> onnx.ModelProto:
    """MatMul(W) + B -> Relu (left to the CPU EP: disabled_ops) -> MatMul(W) + C: two OpenVINO partitions
    that share the initializer W."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((hidden, hidden)).astype(np.float32) / 8, "W")
    b = numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "B")
    c = numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "C")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h0"]),
        helper.make_node("Add", ["h0", "B"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "W"], ["h3"]),
        helper.make_node("Add", ["h3", "C"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "two_partitions",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, hidden])],
        [w, b, c],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _weights_in_place(path: Path) -> dict[str, list[tuple[int, int]]]:
    """Graph name -> (offset in the file, size) of each weight its blob references, checked to be where the
    blob expects it."""
    found: dict[str, list[tuple[int, int]]] = {}
    with ContextBinary.open(path) as binary:
        for name in binary.names():
            if not name.endswith("/meta"):
                continue
            graph = name[: -len("/meta")]
            meta = read_meta(binary.read(name), graph)
            for key, offset, size in meta.weights:
                info = binary.entry(f"{graph}/{key}")
                assert (info.offset, info.size, info.kind) == (offset, size, "weights")
            found[graph] = [(offset, size) for _, offset, size in meta.weights]
    return found


def _relayout(path: Path) -> None:
    """Rewrite a binary with the same entries packed in order: no weight stays where its blob expects it."""
    with ContextBinary.open(path) as binary:
        writer = ContextBinaryWriter(
            ep_name=binary.ep_name,
            sdk_version=binary.sdk_version,
            hardware=binary.hardware,
            metadata=dict(binary.metadata),
        )
        writer.add_from(binary)
        data = writer.to_bytes()
    path.write_bytes(data)


def test_weights_are_mapped_from_the_binary_file(
    tmp_path: Path, spy: _SpyCore, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _two_partitions()
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)}
    options = dict(WEIGHTLESS, disabled_ops="Relu")
    ctx = _generate(tmp_path, model, options)
    layout = _weights_in_place(tmp_path / BIN)
    assert len(layout) == 2  # two OpenVINO partitions
    (first, second) = layout.values()
    assert set(first) & set(second)  # W, read by both, lies once in the file: both blobs reference it

    def no_memfd(*args: Any) -> int:
        raise AssertionError("the weights were copied into an in-memory file")

    monkeypatch.setattr(os, "memfd_create", no_memfd, raising=False)
    sess = _load(ctx, options)
    assert len(spy.imports) == 2
    for record in spy.imports:
        assert record is not None and os.path.samestat(record[0], os.stat(tmp_path / BIN))
    np.testing.assert_allclose(sess.run(None, feeds)[0], run_ort(model, feeds)[0], atol=1e-4, rtol=1e-4)


def test_weights_not_where_the_blob_expects_are_copied(tmp_path: Path, spy: _SpyCore) -> None:
    model = mlp(batch=2, sizes=(32, 64, 64, 6))
    feeds = example_inputs("mlp", model)
    ctx = _generate(tmp_path, model, WEIGHTLESS)
    expected = _load(ctx, WEIGHTLESS).run(None, feeds)[0]
    _relayout(tmp_path / BIN)
    with pytest.raises(AssertionError):
        _weights_in_place(tmp_path / BIN)
    spy.imports.clear()
    got = _load(ctx, WEIGHTLESS).run(None, feeds)[0]
    np.testing.assert_array_equal(got, expected)
    (record,) = spy.imports
    assert record is not None and not os.path.samestat(record[0], os.stat(tmp_path / BIN))
    assert record[1].startswith("/memfd:") or not record[1].startswith("/proc")


@pytest.mark.parametrize("layout", ["in_place", "moved"])
def test_corrupted_weights_are_detected(tmp_path: Path, layout: str) -> None:
    model = mlp(batch=2, sizes=(32, 64, 64, 6))
    ctx = _generate(tmp_path, model, WEIGHTLESS)
    if layout == "moved":
        _relayout(tmp_path / BIN)
    with ContextBinary.open(tmp_path / BIN) as binary:
        info = max(
            (binary.entry(n) for n in binary.names()), key=lambda e: e.size if e.kind == "weights" else 0
        )
        assert info.kind == "weights"
    raw = bytearray((tmp_path / BIN).read_bytes())
    raw[info.offset + info.size // 2] ^= 0x01
    (tmp_path / BIN).write_bytes(bytes(raw))
    with pytest.raises(epctx.InvalidGraph, match=f"{info.name}.*checksum mismatch"):
        _load(ctx, WEIGHTLESS)


_MEASURE = textwrap.dedent(
    """
    import json, sys

    def status():
        fields = {}
        for line in open("/proc/self/status"):
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssShmem", "RssFile"):
                fields[key] = int(value.split()[0]) * 1024
        return fields

    import epctx, epctx.providers.openvino, epctx.session.inference, openvino  # noqa: F401
    before = status()
    sess = epctx.InferenceSession(sys.argv[1], providers=[("OpenVINOExecutionProvider", {"weightless": "1"})])
    after = status()
    maps = [line.split() for line in open("/proc/self/maps")]
    print(json.dumps({
        "growth": {key: after[key] - before[key] for key in after},
        "binary_maps_at_0": sum(1 for m in maps if len(m) > 5 and m[5] == sys.argv[2] and int(m[2], 16) == 0),
        "memfd": any("memfd:" in " ".join(m[5:]) for m in maps),
    }))
    """
)


def _measure(ctx: Path) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(ctx), str((ctx.parent / BIN).resolve())],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")
def test_loading_100mb_of_weights_copies_none(tmp_path: Path) -> None:
    """In a fresh process: a weightless load maps the binary twice (the container's mapping and OpenVINO's)
    and grows no shared memory; the same binary with its weights moved (copy path) grows it by the weights.
    (Anonymous memory grows alike in both, and with a full blob: OpenVINO's CPU plugin repacks
    FullyConnected weights into its own layout.)"""
    model = mlp(batch=2, sizes=(1024, 4096, 4096, 1024, 6))
    weights = sum(len(t.raw_data) for t in model.graph.initializer)
    assert weights > 95e6
    ctx = _generate(tmp_path, model, WEIGHTLESS)
    del model
    mapped = _measure(ctx)
    assert not mapped["memfd"]
    assert mapped["binary_maps_at_0"] >= 2
    assert mapped["growth"]["RssShmem"] < 0.02 * weights
    _relayout(tmp_path / BIN)
    copied = _measure(ctx)
    assert copied["memfd"]
    assert copied["growth"]["RssShmem"] > 0.9 * weights


@pytest.mark.slow
@pytest.mark.parametrize("group_seen", [True, False])
def test_models_sharing_a_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, group_seen: bool) -> None:
    """ep.share_ep_contexts: every model's blob references the final offsets of its weights in the one shared
    binary (a later model's shared tensors at the offset the first one took, its own past them), so all load
    in place; the weights the models share are stored once. ``group_seen=False``: the EP cannot see the group
    at compile time, and compiles a later model again at save against the binary's layout."""
    if not group_seen:
        monkeypatch.setattr(CompileContext, "target_binary", lambda self: None)
    models = []
    for seed in range(3):
        model = mlp(batch=2, sizes=(32, 64, 64, 6))
        rng = np.random.default_rng(seed)
        for init in model.graph.initializer[1:]:  # the first weight is the same in every model
            array = numpy_helper.to_array(init)
            init.CopyFrom(
                numpy_helper.from_array(rng.standard_normal(array.shape).astype(array.dtype), init.name)
            )
        models.append(model)
        onnx.save(model, tmp_path / f"m{seed}.onnx")
        last = {"ep__stop_share_ep_contexts": "1"} if seed == 2 else {}
        so = _options(ep__context_enable="1", ep__share_ep_contexts="1", **last)
        epctx.InferenceSession(str(tmp_path / f"m{seed}.onnx"), so, providers=[(EP, WEIGHTLESS)])
    shared = numpy_helper.to_array(models[0].graph.initializer[0])
    with ContextBinary.open(tmp_path / f"m0_{EP}.bin") as binary:
        stored = [n for n in binary.names() if bytes(binary.read(n)) == shared.tobytes()]
        assert len({binary.entry(n).offset for n in stored}) == 1 and len(stored) == 3
        in_place = []
        for name in binary.names():
            if name.endswith("/meta"):
                graph = name[: -len("/meta")]
                meta = read_meta(binary.read(name), graph)
                in_place.append(all(binary.entry(f"{graph}/{k}").offset == o for k, o, _ in meta.weights))
    assert in_place == [True, True, True]
    for seed, model in enumerate(models):
        feeds = example_inputs("mlp", model)
        got = _load(tmp_path / f"m{seed}_ctx.onnx", WEIGHTLESS).run(None, feeds)[0]
        np.testing.assert_allclose(got, run_ort(model, feeds)[0], atol=1e-4, rtol=1e-4)


_MEASURE_MANY = _MEASURE.replace(
    'sess = epctx.InferenceSession(sys.argv[1], providers=[("OpenVINOExecutionProvider", {"weightless": "1"})])',
    'sessions = [epctx.InferenceSession(p, providers=[("OpenVINOExecutionProvider", {"weightless": "1"})]) '
    "for p in sys.argv[3:]]",
)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")
def test_sharing_group_of_two_loads_without_copying(tmp_path: Path) -> None:
    """Two models sharing a 50 MB weight (and each with its own), generated as a sharing group with
    weightless=1, load in a fresh process with no copy of their weights (no memfd, no shared-memory growth)."""
    rng = np.random.default_rng(7)
    shared = rng.standard_normal((3584, 3584)).astype(np.float32)  # 51 MB
    assert shared.nbytes > 50e6
    total = shared.nbytes
    for k in range(2):
        own = rng.standard_normal((3584, 64)).astype(np.float32)
        total += own.nbytes
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "S"], ["h"]), helper.make_node("MatMul", ["h", "O"], ["y"])],
            f"g{k}",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3584])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
            [numpy_helper.from_array(shared, "S"), numpy_helper.from_array(own, "O")],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        onnx.save(model, tmp_path / f"m{k}.onnx")
        last = {"ep__stop_share_ep_contexts": "1"} if k == 1 else {}
        so = _options(ep__context_enable="1", ep__share_ep_contexts="1", **last)
        epctx.InferenceSession(str(tmp_path / f"m{k}.onnx"), so, providers=[(EP, WEIGHTLESS)])
    binary = tmp_path / f"m0_{EP}.bin"
    layout = _weights_in_place(binary)
    assert len(layout) == 2 and binary.stat().st_size < shared.nbytes + 2 * (3584 * 64 * 4) + (4 << 20)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE_MANY, "-", str(binary.resolve())]
        + [str(tmp_path / f"m{k}_ctx.onnx") for k in range(2)],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    assert not measured["memfd"]
    assert measured["binary_maps_at_0"] >= 2
    assert measured["growth"]["RssShmem"] < 0.02 * total
