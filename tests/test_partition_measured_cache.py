"""The measured rule's verdicts kept between sessions (``epctx.partition.verdicts``, in ``$EPCTX_CACHE_DIR``, which
tests/conftest.py gives each test a folder of its own): a second session over the same model with the same EPs and
options refuses the nodes handed back before partitioning (reason ``from the measured cache: measured: ...``), so
they are neither compiled nor measured, and compiles what was kept without measuring it; a changed free-dimension
override, EP option or thread count is another key; a corrupt record is ignored with a warning;
``EPCTX_MEASURED_CACHE=0`` turns it off. The slow test EP of tests/test_partition_measured_rule.py stands for a slow
backend (one class for both sessions: the same EP)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import epctx
from epctx.partition.measured import FROM_CACHE, refusal_record
from epctx.partition.verdicts import ENABLE_ENV, FOLDER, graph_digest
from tests.fusing_ep import FusingEP, registered
from tests.oracle import run_ort
from tests.requires import requires
from tests.test_partition_measured_rule import RULE, _model, _slow_ep, _spy_shapes, shifting_ep

# the kernel EP's side 2 ms slower: a test EP that runs the same kernels is "not slower" whatever the load
pytestmark = pytest.mark.usefixtures("kernel_ep_delayed")

EP = "MeasuredRuleTestExecutionProvider"
CPU = "CPUExecutionProvider"


def _open(
    ep: type[FusingEP],
    model: bytes,
    options: dict[str, str] | None = None,
    *,
    threads: int = 1,
    batch: int | None = None,
) -> epctx.InferenceSession:
    so = epctx.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry(RULE, "1")
    if batch is not None:
        so.add_free_dimension_override_by_name("batch", batch)
    with registered(ep):
        return epctx.InferenceSession(model, so, providers=[(ep.name, options or {}), CPU])


def _records() -> list[Path]:
    import os

    return sorted(Path(os.environ["EPCTX_CACHE_DIR"], FOLDER).rglob("*.json"))


def _check(sess: epctx.InferenceSession, model: bytes, rows: int = 2) -> None:
    x = np.random.default_rng(1).standard_normal((rows, 4)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], run_ort(model, {"x": x})[0], rtol=1e-6)


def test_a_second_session_compiles_and_measures_nothing_handed_back(monkeypatch: pytest.MonkeyPatch) -> None:
    shapes = _spy_shapes(monkeypatch)
    ep, model = _slow_ep(), _model()
    first = _open(ep, model)
    assert len(shapes) == 1 and len(ep.compiled) == 1
    why = first.get_fallback_reasons()["matmul"][EP]
    assert why.startswith("measured: ")
    assert len(_records()) == 1
    second = _open(ep, model)
    assert len(shapes) == 1 and len(ep.compiled) == 1  # nothing measured, nothing compiled
    assert second.get_partitions() == [(CPU, [n]) for n in ("matmul", "relu", "neg")]
    reasons = second.get_fallback_reasons()
    assert set(reasons) == {"matmul", "relu", "neg"}
    assert reasons["matmul"][EP] == FROM_CACHE + why
    assert second.get_node_placement()[0].declined == ((EP, FROM_CACHE + why),)
    _check(second, model)


def test_unnamed_nodes_are_found_again_by_their_place_in_the_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes without names (as exporters leave Constant nodes, and nudenet's or ppocr_det's others): recorded by
    their position in the loaded graph, whose digest is in the key; the second session refuses every one."""
    import onnx

    proto = onnx.load_from_string(_model())
    for node in proto.graph.node:
        node.name = ""
    model = proto.SerializeToString()
    shapes = _spy_shapes(monkeypatch)
    ep = _slow_ep()
    _open(ep, model)
    second = _open(ep, model)
    assert len(shapes) == 1 and len(ep.compiled) == 1
    assert {provider for provider, _ in second.get_partitions()} == {CPU}
    placed = second.get_node_placement()
    assert len(placed) == 3 and all(p.declined[0][1].startswith(FROM_CACHE + "measured: ") for p in placed)
    _check(second, model)


def test_a_kept_partition_is_compiled_and_not_measured_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test EP never sleeps, and the verdict is forced to "kept": whether its numpy partition beats the CPU
    EP's kernels on three tiny nodes is a matter of microseconds and load, not of the cache."""
    from epctx.partition import measured

    monkeypatch.setattr(measured.Measurement, "slower", property(lambda self: False))
    shapes = _spy_shapes(monkeypatch)
    ep, model = _slow_ep(from_size=10**9), _model()  # never slow: kept
    assert _open(ep, model).get_partitions() == [(EP, ["matmul", "relu", "neg"])]
    assert len(shapes) == 1 and len(ep.compiled) == 1
    second = _open(ep, model)
    assert len(shapes) == 1 and len(ep.compiled) == 2  # compiled for its code, not measured
    assert second.get_partitions() == [(EP, ["matmul", "relu", "neg"])]
    assert second.get_fallback_reasons() == {}
    _check(second, model)


def test_a_changed_override_option_or_thread_count_misses(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sizes measured come from the overrides: batch=3 and batch=5 are two keys; so are an EP option and the
    thread count."""
    shapes = _spy_shapes(monkeypatch)
    ep, model = _slow_ep(), _model("batch")
    _open(ep, model, batch=3)
    _open(ep, model, batch=5)
    assert shapes == [[(3, 4)], [(5, 4)]]
    _open(ep, model, batch=3)
    assert len(shapes) == 2  # the first key again: a hit
    _open(ep, model, {"level": "2"}, batch=3)
    assert len(shapes) == 3
    _open(ep, model, batch=3, threads=2)
    assert len(shapes) == 4
    assert len(_records()) == 4
    second = _open(ep, model, {"level": "2"}, batch=3)
    assert len(shapes) == 4
    _check(second, model, rows=3)


@pytest.mark.parametrize("damage", ["not json", "another record", "wrong form"])
def test_a_corrupt_record_is_ignored_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    import json

    shapes = _spy_shapes(monkeypatch)
    ep, model = _slow_ep(), _model()
    _open(ep, model)
    (record,) = _records()
    doc = json.loads(record.read_text())
    if damage == "not json":
        record.write_text("{ not json")
    elif damage == "another record":
        record.write_text(json.dumps({"key": "0" * 64, "record": doc["record"]}))
    else:
        wrong = {"format": 2, "reasons": [], "refused": {EP: [[0, 5]]}, "kept": {}}  # no reason 5
        record.write_text(json.dumps({"key": doc["key"], "record": wrong}))
    caplog.set_level("WARNING", logger="epctx")
    sess = _open(ep, model)
    assert len(shapes) == 2  # measured again
    assert caplog.text.count("ignored (measured again)") == 1, caplog.text  # once, though read twice
    assert sess.get_fallback_reasons()["matmul"][EP].startswith("measured: ")
    _check(sess, model)
    assert json.loads(record.read_text())["record"]["reasons"]  # written again
    caplog.clear()
    _open(ep, model)
    assert len(shapes) == 2 and "ignored" not in caplog.text


def test_the_off_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENABLE_ENV, "0")
    shapes = _spy_shapes(monkeypatch)
    ep, model = _slow_ep(), _model()
    _open(ep, model)
    sess = _open(ep, model)
    assert len(shapes) == 2 and len(ep.compiled) == 2
    assert sess.get_fallback_reasons()["matmul"][EP].startswith("measured: ")
    assert _records() == []


def test_nodes_refused_after_a_hand_back_are_kept_too() -> None:
    """An EP that claims {matmul, relu} while matmul is offered, else {neg} (as IREE's capability check may):
    the rule hands {matmul, relu} back and refuses neg, claimed only then; the second session refuses all three
    from the record, so the EP compiles nothing (it would compile neg unmeasured otherwise)."""
    Shifting = shifting_ep()

    model = _model()
    _open(Shifting, model)
    assert [len(p.nodes) for p in Shifting.compiled] == [2]
    second = _open(Shifting, model)
    assert [len(p.nodes) for p in Shifting.compiled] == [2]  # nothing compiled the second time
    reasons = {name: why[EP] for name, why in second.get_fallback_reasons().items()}
    assert reasons["matmul"].startswith(FROM_CACHE + "measured: ")
    assert reasons["neg"].startswith(FROM_CACHE + "measured rule: ") and "only after" in reasons["neg"]
    _check(second, model)


def test_a_context_model_records_a_cached_refusal_without_the_prefix() -> None:
    import onnx_ir as ir

    node = ir.Node("", "Relu", [ir.Value(name="x")], name="relu")
    import json

    text = refusal_record({node: (EP, FROM_CACHE + "measured: slower")})
    assert text is not None and json.loads(text) == {EP: {"relu": "measured: slower"}}


def test_the_graph_digest_follows_the_loaded_graph() -> None:
    """Stable across loads; changed by a free-dimension override and by an initializer's value."""
    from onnx import numpy_helper

    from epctx.model.load import load_model

    model = _model("batch")
    first = graph_digest(load_model(model, infer_types=True).model)
    assert first == graph_digest(load_model(model, infer_types=True).model)
    fixed = load_model(model, infer_types=True, free_dims=({"batch": 3}, {})).model
    assert graph_digest(fixed) != first
    import onnx

    proto = onnx.load_from_string(model)
    w = numpy_helper.to_array(proto.graph.initializer[0]).copy()
    w[0, 0] += 1.0
    proto.graph.initializer[0].CopyFrom(numpy_helper.from_array(w, "w"))
    assert graph_digest(load_model(proto.SerializeToString(), infer_types=True).model) != first


@pytest.mark.slow
@requires("iree.runtime", "iree.compiler")
def test_iree_second_session_compiles_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """IREE itself: ten element-wise ops on a 4x4 tensor, compiled and measured, handed back (the verdict is
    forced: how much slower IREE is on them is tests/providers/test_iree_measured_rule.py's business, and since
    IREE's calls got cheaper the margin is the machine's load); the second session runs under ``no_compile()``:
    IREE is neither asked to compile nor to probe, nothing is measured."""
    from epctx.partition import measured
    from epctx.testing import no_compile
    from tests.providers.test_iree_measured_rule import _elementwise

    monkeypatch.setattr(measured.Measurement, "slower", property(lambda self: True))
    model = _elementwise().SerializeToString()
    so = epctx.SessionOptions()
    so.add_session_config_entry(RULE, "1")
    with caplog.at_level("INFO", logger="epctx"):
        first = epctx.InferenceSession(model, so, providers=["IREEExecutionProvider", CPU])
    assert {ep for ep, _ in first.get_partitions()} == {CPU}, caplog.text
    shapes = _spy_shapes(monkeypatch)
    with no_compile():
        second = epctx.InferenceSession(model, so, providers=["IREEExecutionProvider", CPU])
    assert shapes == []
    placed = second.get_node_placement()  # its nodes have no names: by position
    assert len(placed) == 10 and all(p.provider == CPU for p in placed)
    assert all(p.declined[0][1].startswith(FROM_CACHE + "measured: IREEExecutionProvider ") for p in placed)
    x = np.random.default_rng(1).standard_normal((4, 4)).astype(np.float32)
    np.testing.assert_allclose(second.run(None, {"x": x})[0], run_ort(model, {"x": x})[0], rtol=1e-5)


def test_a_rebuilt_native_library_changes_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An EP's code digest covers the native libraries built into its folder (the CPU EP's kernels): a verdict
    taken against the old kernels is not read back after they change."""
    from epctx.partition import verdicts

    package = tmp_path / "epctx_fake_provider"
    package.mkdir()
    (package / "provider.py").write_text("class FakeEP:\n    pass\n")
    library = package / "_native.cpython-311-x86_64-linux-gnu.so"
    library.write_bytes(b"\x7fELF kernels v1")
    (package / "notes.txt").write_text("not code")
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    module = importlib.import_module("epctx_fake_provider.provider")
    fake = module.FakeEP
    fake.__module__ = "epctx.providers.fake.provider"  # treated as one of epctx's EP folders
    monkeypatch.setitem(sys.modules, fake.__module__, module)
    before = verdicts._code_digest.__wrapped__(fake)
    (package / "notes.txt").write_text("still not code")
    assert verdicts._code_digest.__wrapped__(fake) == before
    library.write_bytes(b"\x7fELF kernels v2")
    assert verdicts._code_digest.__wrapped__(fake) != before
